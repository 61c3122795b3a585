// Data-parallel ranks as processes, on one host or several: each rank connects to rank 0 over
// TCP (torchrun's MASTER_ADDR:MASTER_PORT), and rank 0 does every collective in rank order, as
// LocalGroup does (the same bits), then sends each rank its result. The CPU reference of a run
// across hosts; on GPUs the same rendezvous hands every rank NCCL's unique id (the payload).
#pragma once

#include "backends/Communicator.h"

#include <memory>
#include <string>

namespace tgc {

struct Rendezvous {
  std::string host = "127.0.0.1"; // rank 0's address (it listens on every interface)
  int port = 0;
  int rank = 0, ranks = 1;
  /// How long a rank waits to join (rank 0 for the others to connect, the others for rank 0 to
  /// listen), and in a collective for a peer's data: then the run stops with an error naming it.
  double timeoutSeconds = 300;
  /// Rank 0's bytes for every rank (NCCL's unique id); the others receive them here.
  std::string payload;
};

/// Joins the group `r` describes (every rank calls it with the same ranks, host and port);
/// the returned communicator's collectives go through rank 0. An error names the host and port,
/// the rank that did not come, or the mismatch.
llvm::Expected<std::unique_ptr<Communicator>> joinTcpGroup(Rendezvous &r);

/// Element i of the ranks' inputs reduced in rank order (accumulated in double): the one
/// definition LocalGroup and the TCP group share.
float reduceInRankOrder(const float *const *inputs, size_t ranks, size_t i, ReduceOp op);

} // namespace tgc
