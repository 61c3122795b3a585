#include "backends/cuda/libraries/Nvrtc.h"
#include "support/Error.h"

#include "backends/cuda/libraries/KernelHeaders.h"
#include "support/Files.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SHA1.h"

#include <cstdlib>
#include <fmt/format.h>
#include <mutex>
#include <vector>

#ifdef TGC_HAVE_CUDA
#include <nvrtc.h>
#endif

namespace tgc {

std::string archName(int major, int minor) { return fmt::format("sm_{}{}", major, minor); }

std::string kernelCacheDir() {
  if (const char *dir = std::getenv("TGC_CACHE_DIR"); dir && *dir)
    return dir;
  llvm::SmallString<256> path;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    path = xdg;
  } else {
    const char *home = std::getenv("HOME");
    path = home && *home ? home : "/tmp";
    llvm::sys::path::append(path, ".cache");
  }
  llvm::sys::path::append(path, "tgc", "kernels");
  return path.str().str();
}

std::string cudaIncludeDir() {
  std::vector<std::string> candidates;
  for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *dir = std::getenv(env); dir && *dir)
      candidates.push_back(std::string(dir) + "/include");
  candidates.push_back("/usr/local/cuda/include");
#ifdef TGC_CUDA_INCLUDE_DIR
  candidates.push_back(TGC_CUDA_INCLUDE_DIR);
#endif
  for (const std::string &dir : candidates)
    if (llvm::sys::fs::exists(dir + "/cuda_fp8.h"))
      return dir;
  return "";
}

llvm::Expected<CompiledModule> compileCuda(llvm::StringRef source, llvm::StringRef arch) {
  auto fail = [](const std::string &message) { return stringError(message); };
#ifndef TGC_HAVE_CUDA
  (void)source;
  (void)arch;
  return fail("error: tgc was built without CUDA: NVRTC is not available");
#else
  if (!llvm::StringRef(arch).startswith("sm_") || arch.size() < 5)
    return fail(fmt::format("error: --arch must look like sm_90, got '{}'", arch.str()));
  std::vector<std::string> options = {"--gpu-architecture=" + arch.str(), "-std=c++17",
                                      "-default-device"};
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  // The FP8 kernels include a toolkit header (cuda_fp8.h), which NVRTC needs at run time. The
  // folder is not part of the cache key: the NVRTC version stands for the headers.
  std::string includeDir = cudaIncludeDir();
  if (source.contains("#include \"fp8.cuh\"") && includeDir.empty())
    return fail("error: NVRTC needs the CUDA toolkit's headers (cuda_fp8.h) to compile the FP8 "
                "kernels, and none were found: set CUDA_HOME to the toolkit that matches NVRTC " +
                fmt::format("{}.{}", major, minor));
  llvm::SHA1 hash;
  hash.update(source);
  std::vector<const char *> headerNames, headerTexts; // tgc's kernel headers, which the source includes
  for (const KernelHeader &header : kernelHeaders()) {
    headerNames.push_back(header.name);
    headerTexts.push_back(header.text);
    hash.update(llvm::StringRef(header.name));
    hash.update(llvm::StringRef(header.text));
  }
  for (const std::string &o : options)
    hash.update(o + "\n");
  hash.update(fmt::format("nvrtc {}.{}", major, minor));
  std::string key = llvm::toHex(hash.final(), /*LowerCase=*/true);
  CompiledModule module;
  llvm::SmallString<256> cachePath(kernelCacheDir());
  llvm::sys::path::append(cachePath, key + "-" + arch.str() + ".cubin");
  module.cachePath = cachePath.str().str();
  if (auto cached = llvm::MemoryBuffer::getFile(cachePath, false, false); cached && (*cached)->getBufferSize()) {
    module.cubin = (*cached)->getBuffer().str();
    module.fromCache = true;
    return module;
  }
  nvrtcProgram program;
  if (nvrtcCreateProgram(&program, source.str().c_str(), "tgc_kernels.cu", int(headerNames.size()),
                         headerTexts.data(), headerNames.data()) !=
      NVRTC_SUCCESS)
    return fail("error: nvrtcCreateProgram failed");
  if (!includeDir.empty())
    options.push_back("--include-path=" + includeDir);
  std::vector<const char *> argv;
  for (const std::string &o : options)
    argv.push_back(o.c_str());
  nvrtcResult result = nvrtcCompileProgram(program, int(argv.size()), argv.data());
  size_t logSize = 0;
  nvrtcGetProgramLogSize(program, &logSize);
  std::string log(logSize, '\0');
  if (logSize)
    nvrtcGetProgramLog(program, log.data());
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n'))
    log.pop_back();
  module.log = log;
  if (result != NVRTC_SUCCESS) {
    nvrtcDestroyProgram(&program);
    return fail(fmt::format("error: NVRTC could not compile the generated kernels for {}: {}\n{}",
                            arch.str(), nvrtcGetErrorString(result), log));
  }
  size_t size = 0;
  nvrtcGetCUBINSize(program, &size);
  module.cubin.resize(size);
  nvrtcGetCUBIN(program, module.cubin.data());
  nvrtcDestroyProgram(&program);
  // The cache is an optimisation: a folder that cannot be written costs a recompile, nothing
  // else, and is said once a process (a run would otherwise compile every kernel each time).
  llvm::Error written = llvm::errorCodeToError(llvm::sys::fs::create_directories(kernelCacheDir()));
  if (!written)
    written = writeFileAtomically(cachePath, module.cubin);
  if (written) {
    static std::once_flag said;
    std::string why = llvm::toString(std::move(written));
    std::call_once(said, [&] {
      llvm::errs() << fmt::format("tgc: warning: the kernel cache {} cannot be written ({}): kernels are compiled "
                                  "again each run; set TGC_CACHE_DIR to a folder tgc can write\n",
                                  escapeForMessage(kernelCacheDir()), escapeForMessage(why));
    });
  }
  return module;
#endif
}

} // namespace tgc
