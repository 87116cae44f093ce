# Every dependency comes from Debian's packages (scripts/setup.sh installs them), except
# in the GPU-check build, which takes GoogleTest and OpenBLAS from BATON_BUNDLE_DIR.

# baton_find_package(<find_package arguments>): find_package(... REQUIRED) for a
# dependency that baton's libraries link (and so the projects linking the installed
# baton too): the installed batonConfig.cmake repeats the same search with
# find_dependency(). Dependencies of the tests, benchmarks and tools only use a plain
# find_package().
macro(baton_find_package)
  find_package(${ARGN} REQUIRED)
  baton_export_dependency(${ARGN})
endmacro()
# baton_export_dependency(<find_package arguments>): only the find_dependency() line,
# for a dependency found some other way (an optional one that turned out present).
function(baton_export_dependency)
  list(JOIN ARGN " " args)
  set_property(GLOBAL APPEND PROPERTY BATON_EXPORT_DEPENDENCIES "find_dependency(${args})")
endfunction()
# baton_pkg_check_modules(<prefix> <module> ...): a dependency found through pkg-config,
# as the imported target PkgConfig::<prefix> (link that); batonConfig.cmake makes the
# same target again.
macro(baton_pkg_check_modules _baton_prefix)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(${_baton_prefix} REQUIRED IMPORTED_TARGET ${ARGN})
  set(_baton_modules ${ARGN})
  list(JOIN _baton_modules " " _baton_modules)
  set_property(GLOBAL APPEND PROPERTY BATON_EXPORT_DEPENDENCIES "find_dependency(PkgConfig)"
    "pkg_check_modules(${_baton_prefix} REQUIRED IMPORTED_TARGET ${_baton_modules})")
endmacro()

baton_find_package(Threads)
baton_find_package(OpenMP COMPONENTS CXX)
if(BATON_GPU_CHECK)
  include(BatonGpuBundle)
else()
  find_package(PkgConfig REQUIRED)
  baton_find_package(nlohmann_json 3.10)
  baton_find_package(fmt)
  baton_find_package(spdlog)
  baton_find_package(Boost 1.74 COMPONENTS program_options)
  if(BATON_BUILD_TESTS)
    find_package(GTest REQUIRED)
  endif()
  if(BATON_BUILD_BENCH)
    find_package(benchmark REQUIRED)
  endif()
endif()  # not BATON_GPU_CHECK
# OpenBLAS, the OpenMP build by default (FindBatonOpenBLAS.cmake says why).
set(BATON_BLAS_VARIANT openmp CACHE STRING "OpenBLAS build to link: openmp or pthread")
baton_find_package(BatonOpenBLAS)
message(STATUS "baton: OpenBLAS ${BATON_OPENBLAS_LIB}")

# CUDA (optional).
set(BATON_HAVE_CUDA OFF)
set(BATON_HAVE_NCCL OFF)
if(NOT BATON_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Hopper (sm_90, with its PTX for newer chips) unless the user names others, e.g.
    # -DCMAKE_CUDA_ARCHITECTURES="80-real;90". Each extra target adds a full device
    # compile of every .cu file, and CI compiles them on 2 cores.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag; newer CMake does and ignores these.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    baton_export_dependency(CUDAToolkit)
    set(BATON_HAVE_CUDA ON)
    # NCCL (FindBatonNCCL.cmake): NCCL_HOME, the toolkit's folders, the GPU-check bundle.
    find_package(BatonNCCL QUIET)
    if(BatonNCCL_FOUND)
      set(BATON_HAVE_NCCL ON)
      baton_export_dependency(BatonNCCL)
    elseif(BATON_CUDA STREQUAL "ON")
      message(FATAL_ERROR "BATON_CUDA=ON but NCCL (nccl.h, libnccl) was not found; set NCCL_HOME")
    endif()
  elseif(BATON_CUDA STREQUAL "ON")
    message(FATAL_ERROR "BATON_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "baton: CUDA backend ${BATON_HAVE_CUDA} (architectures ${CMAKE_CUDA_ARCHITECTURES}), NCCL ${BATON_HAVE_NCCL}")
