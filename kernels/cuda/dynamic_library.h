// CUDA libraries opened on first use (dlopen) instead of linked: cuBLASLt's static
// initializers cost every process that loads it 84 MB and 65 ms, and a loaded cuDNN's
// soname is what another library's copy then resolves to (PyTorch's wheel refused to run:
// "found runtime version 9.19"). A process that never needs them (a CPU rank, the
// launcher, the Python module) loads neither.
#pragma once

#include <dlfcn.h>

#include <string>

#include "memory/error.h"

// A macro's value as a string literal: a library's name from its headers' major version
// ("libcudnn.so." BATON_CUDA_STR(CUDNN_MAJOR)).
#define BATON_CUDA_STR2(x) #x
#define BATON_CUDA_STR(x) BATON_CUDA_STR2(x)

namespace baton::kernels::cuda {

// dlopen(name) or a RuntimeError naming it, `what` (the library and what needs it) and
// the loader's reason. RTLD_GLOBAL: cuBLAS resolves cuBLASLt's symbols through it.
inline void* open_cuda_library(const char* name, const std::string& what) {
  void* h = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    const char* why = ::dlerror();
    throw RuntimeError(std::string("CUDA backend: cannot open ") + name + " (" + what +
                       "): " + (why ? why : "unknown error"));
  }
  return h;
}

// The function `symbol` of an opened library, or a RuntimeError saying the library is
// another version than `expected` (the build's headers).
template <class F>
void find_cuda_symbol(void* lib, const char* lib_name, const char* symbol, F& out,
                      const std::string& expected) {
  void* f = ::dlsym(lib, symbol);
  if (f == nullptr)
    throw RuntimeError(std::string("CUDA backend: ") + lib_name + " has no " + symbol +
                       " (another version than the build's " + expected + ")");
  out = reinterpret_cast<F>(f);
}

}  // namespace baton::kernels::cuda
