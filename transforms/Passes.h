// Constructors of the individual passes; the pipeline (Pass.h) names them.
#pragma once

#include "transforms/Pass.h"

namespace tgc {

std::unique_ptr<Pass> createCommonSubexpressionEliminationPass();
std::unique_ptr<Pass> createDeadCodeEliminationPass();
std::unique_ptr<Pass> createFuseAttentionPass();
std::unique_ptr<Pass> createFuseLayerNormMLPPass();
std::unique_ptr<Pass> createFuseSwigluPass();
std::unique_ptr<Pass> createUnitTransposesPass();
std::unique_ptr<Pass> createPruneLastRowsPass();
std::unique_ptr<Pass> createRequantizeTransposesPass(const TrainConfig &train);
std::unique_ptr<Pass> createFuseLayerNormLinearPass();
std::unique_ptr<Pass> createFuseResidualNormPass();
std::unique_ptr<Pass> createFuseNormGradAddPass();
std::unique_ptr<Pass> createFuseDGeluPass();
std::unique_ptr<Pass> createFuseFp8BiasPass();
std::unique_ptr<Pass> createFuseGeluQuantizePass();
std::unique_ptr<Pass> createFuseQuantizeBiasGradPass();
std::unique_ptr<Pass> createFuseCrossEntropyQuantizePass();
std::unique_ptr<Pass> createFuseNormBiasGradPass();
std::unique_ptr<Pass> createFuseGeluBiasGradPass();
std::unique_ptr<Pass> createFuseCrossEntropyGradPass();
std::unique_ptr<Pass> createKeepAttentionHeadsPass();
std::unique_ptr<Pass> createFuseCacheRopePass();
std::unique_ptr<Pass> createFuseKvWritePass();
std::unique_ptr<Pass> createFuseResidualNormGemvPass();
std::unique_ptr<Pass> createFuseGemvGeluPass();
std::unique_ptr<Pass> createFuseBiasActivationPass();
std::unique_ptr<Pass> createFuseBiasPass();
std::unique_ptr<Pass> createFuseGeluEpiloguePass();
std::unique_ptr<Pass> createFuseCrossEntropyPass();
std::unique_ptr<Pass> createFuseSoftmaxPass();
std::unique_ptr<Pass> createAssignPrecisionPass(const PrecisionConfig &config);
std::unique_ptr<Pass> createFp8UpdatePass(const PrecisionConfig &config);
std::unique_ptr<Pass> createFp8WeightsPass(const PrecisionConfig &precision, const TrainConfig &train);
std::unique_ptr<Pass> createLegalizeFp8GemmPass();
/// One line per linear layer: its shape and the precision the recipe gives it, and why.
std::vector<std::string> explainPrecision(const Graph &graph, const PrecisionConfig &config);
std::unique_ptr<Pass> createAutodiffPass();
std::unique_ptr<Pass> createConcatPadsPass();
/// `recompute`: the gradients recompute the norm and the activation instead of reading the
/// forward's.
std::unique_ptr<Pass> createExpandLayerNormFusedPass(const TrainConfig &train = TrainConfig());
std::unique_ptr<Pass> createDataParallelPass(const DataParallelOptions &options);
std::unique_ptr<Pass> createAdamWPass(const TrainConfig &config, const DataParallelOptions &dataParallel = {});

} // namespace tgc
