#include "backends/cuda/libraries/Nccl.h"

#include "backends/cuda/libraries/Libraries.h"

#include "support/Error.h"

#include <dlfcn.h>
#ifdef TGC_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace tgc {

namespace {

constexpr const char *kNcclLibrary = "libnccl.so.2", *kNcclEnvironment = "TGC_NCCL_LIBRARY";

} // namespace

std::string NcclApi::versionText() const { return versionFromCode(size_t(version)); } // NCCL_VERSION_CODE

std::vector<std::string> ncclCandidates() { return libraryCandidates(kNcclEnvironment, "nccl", kNcclLibrary); }

llvm::Expected<NcclApi> loadNcclFrom(const std::vector<std::string> &candidates) {
  return openLibrary<NcclApi>("NCCL", kNcclLibrary, kNcclEnvironment, candidates, [](void *library, NcclApi &api) {
    SymbolBinder need(library);
    need("ncclGetVersion", api.getVersion);
    need("ncclGetUniqueId", api.getUniqueId);
    need("ncclCommInitRank", api.commInitRank);
    need("ncclCommDestroy", api.commDestroy);
    need("ncclAllReduce", api.allReduce);
    need("ncclReduceScatter", api.reduceScatter);
    need("ncclAllGather", api.allGather);
    need("ncclGroupStart", api.groupStart);
    need("ncclGroupEnd", api.groupEnd);
    need("ncclGetErrorString", api.errorString);
    if (need.missing())
      return fmt::format("not NCCL: no {}", need.missing());
    // ncclGetVersion needs no GPU: the code compiled into the library.
    if (api.getVersion(&api.version) != 0 || api.version < 20000)
      return fmt::format("ncclGetVersion gave {}: NCCL 2 is needed", api.version);
    return std::string();
  });
}

llvm::Expected<const NcclApi *> loadNccl() {
  return loadOnce<NcclApi>([] {
    // Every connection between the ranks made when a communicator is created, not at a
    // collective's first call (NCCL's default since 2.22): that first call is inside the
    // captured step, where connecting fails with NCCL's "internal error". The user's setting
    // stays.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    return loadNcclFrom(ncclCandidates());
  });
}

std::string uniqueIdToHex(const NcclUniqueId &id) {
  std::string hex;
  for (char c : id.internal)
    hex += fmt::format("{:02x}", uint8_t(c));
  return hex;
}

llvm::Expected<NcclUniqueId> uniqueIdFromHex(llvm::StringRef hex) {
  NcclUniqueId id{};
  if (hex.size() != 2 * sizeof(id.internal))
    return stringError(fmt::format("error: an NCCL unique id is {} hex digits, got {}", 2 * sizeof(id.internal),
                                   hex.size()));
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    unsigned byte = 0;
    if (hex.substr(2 * i, 2).getAsInteger(16, byte))
      return stringError(fmt::format("error: the NCCL unique id has a non-hex digit at {}", 2 * i));
    id.internal[i] = char(byte);
  }
  return id;
}

llvm::Expected<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(const NcclUniqueId &id, int rank,
                                                                           int ranks, int device) {
#ifdef TGC_HAVE_CUDA
  auto api = loadNccl();
  if (!api)
    return api.takeError();
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return stringError(fmt::format("error: rank {}: cudaSetDevice({}) failed: {}", rank, device,
                                   cudaGetErrorString(e)));
  auto communicator = std::unique_ptr<NcclCommunicator>(new NcclCommunicator());
  communicator->api_ = *api;
  communicator->rank_ = rank;
  communicator->ranks_ = ranks;
  if (int result = (*api)->commInitRank(&communicator->comm_, ranks, id, rank); result != 0)
    return stringError(fmt::format("error: rank {} of {}: ncclCommInitRank failed: {} (NCCL {})", rank, ranks,
                                   (*api)->errorString(result), result));
  return std::move(communicator);
#else
  (void)id, (void)rank, (void)ranks, (void)device;
  return stringError("error: this tgc was built without CUDA: no NCCL ranks");
#endif
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_)
    api_->commDestroy(comm_);
}

llvm::Error NcclCommunicator::allReduceHost(float *, size_t, ReduceOp) {
  return stringError("error: NCCL ranks reduce device buffers (the GPU executor), not host memory");
}

llvm::Error NcclCommunicator::reduceScatterHost(const float *, float *, size_t, ReduceOp) {
  return allReduceHost(nullptr, 0, ReduceOp::Sum);
}

llvm::Error NcclCommunicator::allGatherHost(const float *, float *, size_t) {
  return allReduceHost(nullptr, 0, ReduceOp::Sum);
}

} // namespace tgc
