// What the standalone GPU measurements (tests/bench/*.cu) share: stopping at the first CUDA
// error with its place, and the time of a launch replayed from a CUDA graph.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CK(x)                                                                                                          \
  do {                                                                                                                 \
    auto s_ = (x);                                                                                                     \
    if ((int)s_) {                                                                                                     \
      printf("error %d (%s) at %s:%d\n", (int)s_, cudaGetErrorString((cudaError_t)s_), __FILE__, __LINE__);           \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

// The mean microseconds of each launch `record(i, stream)` makes, i < count, captured into a
// graph and replayed five times after a warm-up replay.
template <typename Record>
float timeGraph(int count, Record record) {
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < count; ++i) record(i, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(exec, stream));
  CK(cudaEventRecord(e0, stream));
  for (int r = 0; r < 5; ++r) CK(cudaGraphLaunch(exec, stream));
  CK(cudaEventRecord(e1, stream));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return 1000 * ms / (5 * count);
}
