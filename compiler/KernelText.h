// What the per-op kernel templates (CudaSource.cpp) share with the program-level rewrites of
// the lowering (OptimizerGroups.cpp): pieces of generated text and launch shapes that must be
// the same on both sides for the grouped kernels to give the bits of the per-op ones.
#pragma once

#include "compiler/CudaSource.h"

#include <string>
#include <vector>

namespace tgc {

constexpr int kThreads = 256; // threads per block of every generated kernel

/// The attention kernels' templates (AttentionKernels.cpp), in a program that has attention.
extern const char *const kAttentionPrelude;

/// AdamW's kernel parameters: operands, then results.
extern const char *const kAdamWParams;
/// The body of an AdamW kernel over `count` elements: the bias corrections once per thread,
/// then each element; the weight decay an expression of i (a literal, or the grouped kernel's
/// choice by offset).
std::string adamwBody(const AttrMap &attrs, int64_t count, const std::string &weightDecay);
/// Blocks of an elementwise launch over `count` elements (a grid-stride loop past 8192).
int64_t elementwiseBlocks(int64_t count);
/// How many blocks sum_squares' first launch splits `count` elements into (a contiguous range
/// each); the grouped gradient norm splits each gradient the same way.
int64_t sumSquaresBlocks(int64_t count);

/// Rewrites the optimizer's lowering over the contiguous parameter layout: every AdamW op as
/// one launch, and the gradient norm's sum_squares and adds as one pair of launches, where
/// their conditions hold (the same bits as one kernel per op). `sources` holds each op's
/// kernel text; the replaced ops' text goes and the grouped kernels' comes in.
void groupOptimizer(const std::vector<Op *> &ops, CudaProgram &program, std::vector<std::string> &sources);

} // namespace tgc
