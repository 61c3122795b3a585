// --precision auto on a GPU with FP8 tensor cores: FP8 for the linear layers that train faster
// in FP8 there, as measured, not as a size threshold guesses.
//
// The kinds of layer whose product may run in FP8 (transforms/precision/Precision.h: h0.attn.qkv,
// h0.mlp.fc1, ...) are timed in a probe of the model of at most four blocks (same widths, batch and
// sequence, the head's vocabulary cut to 1024 unless the head itself is probed): the median training step
// with sets of them in FP8, casts, transposes and scaling updates included, in the context the
// model gives them. The kinds interact (whether a neighbour is FP8 decides which casts fuse and
// which BF16 copies are kept: gpt2-350m's kinds gain little alone and much together,
// BENCHMARKS.md), so sets are timed: none and all in FP8, all but each kind, and all but every kind
// whose removal was faster; the fastest is the choice, never slower in the probe than all-BF16
// or all-FP8 (and FP8 only where it beats all-BF16 by more than the probe's noise). The times are kept in the kernel cache folder (fp8-choices.txt, beside the GEMM
// algorithms), keyed by GPU, build and the probe's shape, so a warm start times nothing and the
// same choice is taken every run.
#pragma once

#include "backends/Communicator.h"
#include "backends/Tensor.h"
#include "driver/Program.h"
#include "ir/Graph.h"
#include "models/ModelConfig.h"

#include "llvm/Support/Error.h"

#include <map>
#include <string>
#include <vector>

namespace tgc {

/// The precision `config` trains with on `device`: resolveRecipe's, and under auto on a GPU
/// whose recipe is fp8, with fp8_layers chosen by measurement (and `measured` filled). A
/// recipe set explicitly, or fp8_layers given, is left as the user gave it. With a
/// `communicator` every rank times its own GPU and the ranks take the mean, so all choose
/// alike.
llvm::Expected<PrecisionConfig> choosePrecision(const ModelConfig &config, const Device &device,
                                                Communicator *communicator = nullptr);

/// One line on a measurement: "h*.mlp.fc1 (16384 x 768 x 3072): FP8, probe step 4.05 ms with
/// every kind in FP8, 4.21 with this one in BF16".
std::string describeMeasurement(const GemmMeasurement &m);

/// How many of `program`'s linear layers run in FP8 (those with a weight's scaling state), of
/// how many.
std::pair<int64_t, int64_t> countFp8Layers(const Graph &program, const ModelConfig &config);

/// The layers of `weights` (a checkpoint's tensors) that trained in FP8: the sites with an FP8
/// input scale.
std::vector<std::string> fp8LayersOf(const std::map<std::string, Tensor> &weights);

} // namespace tgc
