// Optional libraries that tgc opens at run time (dlopen): NCCL for the collectives, cuDNN for
// the fused attention. tgc builds and runs without them; each is searched where it is found in
// practice, and the search's order is the same for all of them.
#pragma once

#include <string>
#include <vector>

namespace tgc {

/// Where `library` (a soname such as libnccl.so.2) is looked for, in order: $`environment` (when
/// set, alone: a path the user gives is not silently replaced), the CUDA toolkit's library
/// folders ($CUDA_HOME, the one tgc was built with, /usr/local/cuda), the system's search
/// (LD_LIBRARY_PATH, ld.so.cache), then PyTorch's copy in Python's site-packages
/// (nvidia/`package`/lib), where the GPU machines have it.
std::vector<std::string> libraryCandidates(const char *environment, const char *package, const char *library);

/// The candidates tried and why each failed, as the lines of one error message.
std::string listTried(const std::vector<std::string> &tried);

} // namespace tgc
