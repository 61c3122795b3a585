// NCCL, loaded at run time (dlopen): the collectives of data-parallel training ([dist]). tgc
// builds and runs without it; the library is searched where it is found in practice, and an
// absent one is one error that lists every place tried and why each failed.
#pragma once

#include "backends/Communicator.h"

#include "llvm/Support/Error.h"

#include <cstddef>
#include <string>
#include <vector>

namespace tgc {

/// NCCL's C API (nccl.h, ABI of 2.x), declared here so that no NCCL header is needed to build:
/// the calls tgc makes. Results are ncclResult_t (0: ncclSuccess); comm is ncclComm_t, stream a
/// cudaStream_t.
struct NcclUniqueId {
  char internal[128]; // NCCL_UNIQUE_ID_BYTES
};
enum NcclDataType : int { kNcclUint8 = 1, kNcclFloat32 = 7, kNcclBfloat16 = 9 }; // ncclDataType_t
enum NcclReduceOp : int { kNcclSum = 0, kNcclMax = 2, kNcclAvg = 4 }; // ncclRedOp_t

struct NcclApi {
  std::string path; // the file loaded
  int version = 0;  // ncclGetVersion's code: 22809 is 2.28.9
  int (*getVersion)(int *version) = nullptr;
  int (*getUniqueId)(NcclUniqueId *id) = nullptr;
  int (*commInitRank)(void **comm, int ranks, NcclUniqueId id, int rank) = nullptr;
  int (*commDestroy)(void *comm) = nullptr;
  int (*allReduce)(const void *send, void *receive, size_t count, int type, int op, void *comm, void *stream) = nullptr;
  /// count: the elements each rank receives (its part); send holds ranks x count.
  int (*reduceScatter)(const void *send, void *receive, size_t count, int type, int op, void *comm,
                       void *stream) = nullptr;
  /// count: the elements each rank sends; receive holds ranks x count, in rank order.
  int (*allGather)(const void *send, void *receive, size_t count, int type, void *comm, void *stream) = nullptr;
  int (*groupStart)() = nullptr;
  int (*groupEnd)() = nullptr;
  const char *(*errorString)(int result) = nullptr;

  /// "2.28.9".
  std::string versionText() const;
};

/// Where NCCL (libnccl.so.2) is looked for: Libraries.h's order, $TGC_NCCL_LIBRARY first.
std::vector<std::string> ncclCandidates();

/// Loads the first of `candidates` that opens and has NCCL's symbols; the error names each one
/// tried and why it failed.
llvm::Expected<NcclApi> loadNcclFrom(const std::vector<std::string> &candidates);

/// loadNcclFrom(ncclCandidates()), once a process.
llvm::Expected<const NcclApi *> loadNccl();

/// The unique id as 256 hex digits (how tgc's launcher hands it to the ranks it starts), and
/// back; anything else is an error.
std::string uniqueIdToHex(const NcclUniqueId &id);
llvm::Expected<NcclUniqueId> uniqueIdFromHex(llvm::StringRef hex);

/// One rank of a run through NCCL: GPU `device` of this process, in the communicator that
/// `ranks` processes create from one unique id (ncclCommInitRank, which waits for all of them).
class NcclCommunicator : public Communicator {
public:
  static llvm::Expected<std::unique_ptr<NcclCommunicator>> create(const NcclUniqueId &id, int rank, int ranks,
                                                                  int device);
  ~NcclCommunicator() override;
  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  /// Not here: the GPU executor reduces device buffers through ncclComm().
  llvm::Error allReduceHost(float *data, size_t count, ReduceOp op) override;
  llvm::Error reduceScatterHost(const float *in, float *out, size_t count, ReduceOp op) override;
  llvm::Error allGatherHost(const float *in, float *out, size_t count) override;
  void *ncclComm() const override { return comm_; }

private:
  const NcclApi *api_ = nullptr;
  void *comm_ = nullptr;
  int rank_ = 0, ranks_ = 1;
};

} // namespace tgc
