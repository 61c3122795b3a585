// The generation programs' setup, shared by plain (Generate.cpp) and speculative decoding
// (Speculative.cpp).
#pragma once

#include "app/Generate.h"
#include "models/GPTBuilder.h"

#include <chrono>

namespace tgc {

/// Binds `options` to the sample op's inputs of a prefill, decode or verify program.
llvm::Error bindSampling(Executor &executor, const SamplingOptions &options);

/// The first `count` values of a generation program's %next after its last step: each
/// sequence's (or a verify step's each token's) next token, chosen on the device.
llvm::Expected<std::vector<int32_t>> nextTokens(Executor &executor, size_t count);

/// Seconds since `start`, for GenerationStats.
double secondsSince(std::chrono::steady_clock::time_point start);

/// Starts a step of a decode program (Executor::launch) and queues the copy of its %next: the
/// ticket to collect each sequence's token with.
llvm::Expected<unsigned> launchAndReadNext(Executor &executor);

/// Compiles `output`'s program of `config` for `batch` sequences (`length` positions for a
/// prefill, tokens a sequence for a verify step) and binds the weights (and FP8 scaling state)
/// from `weights`; KV caches start at zero. With `regionsOf` (the decode step's program), the
/// GPU's program holds the weights, states and caches in that program's memory where laid out
/// alike, and those are not bound again.
llvm::Expected<CompiledProgram> compileInference(const ModelConfig &config,
                                                 const std::map<std::string, Tensor> &weights, int64_t batch,
                                                 Device device, GPTOutput output, int64_t length = 0,
                                                 Executor *regionsOf = nullptr);

} // namespace tgc
