# Writes OUTPUT, a C++ source holding each kernel header of KERNEL_DIR (*.cuh, by file name) as
# a string, so that the binary carries its CUDA kernels and NVRTC compiles them at run time.
# support/BoxMuller.h, Sampling.h and ScalarMath.h (SHARED_HEADERS), which host and device compile alike, go with them.
# Run as: cmake -DOUTPUT=... -DKERNEL_DIR=... "-DSHARED_HEADERS=a,b" -P EmbedKernels.cmake
file(GLOB HEADERS ${KERNEL_DIR}/*.cuh)
list(SORT HEADERS)
string(REPLACE "," ";" SHARED_HEADERS "${SHARED_HEADERS}")
list(APPEND HEADERS ${SHARED_HEADERS})
set(text "// Generated at build time from backends/cuda/kernels/*.cuh and support/{BoxMuller,Sampling,ScalarMath}.h by cmake/EmbedKernels.cmake.\n")
string(APPEND text "#include \"backends/cuda/libraries/KernelHeaders.h\"\n\nnamespace tgc {\n\n")
string(APPEND text "llvm::ArrayRef<KernelHeader> kernelHeaders() {\n  static const KernelHeader headers[] = {\n")
foreach(header ${HEADERS})
  get_filename_component(name ${header} NAME)
  file(READ ${header} content)
  string(FIND "${content}" ")tgc_cuh\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${header} contains the raw-string delimiter )tgc_cuh\"")
  endif()
  string(APPEND text "    {\"${name}\", R\"tgc_cuh(${content})tgc_cuh\"},\n")
endforeach()
string(APPEND text "  };\n  return headers;\n}\n\n} // namespace tgc\n")
# Rewritten only when different, so that an unchanged header rebuilds nothing.
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUTPUT} "${text}")
endif()
