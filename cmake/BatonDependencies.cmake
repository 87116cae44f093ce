# Every dependency comes from Debian's packages (scripts/setup.sh installs them), except
# in the GPU-check build, which takes GoogleTest and OpenBLAS from BATON_BUNDLE_DIR.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
if(BATON_GPU_CHECK)
  include(BatonGpuBundle)
else()
  find_package(PkgConfig REQUIRED)
  find_package(nlohmann_json 3.10 REQUIRED)
  find_package(spdlog REQUIRED)
  find_package(fmt REQUIRED)
  find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
  if(BATON_BUILD_TESTS)
    find_package(GTest REQUIRED)
  endif()
  if(BATON_BUILD_BENCH)
    find_package(benchmark REQUIRED)
  endif()

  # OpenBLAS: the OpenMP build, so that GEMM threads and baton's own parallel loops share
  # one OpenMP pool and never oversubscribe the cores (the pthread build keeps its own
  # spinning threads). BATON_BLAS_VARIANT=pthread selects Debian's default build instead.
  set(BATON_BLAS_VARIANT openmp CACHE STRING "OpenBLAS build to link: openmp or pthread")
  find_library(BATON_OPENBLAS_LIB openblas
    PATHS /usr/lib/x86_64-linux-gnu/openblas-${BATON_BLAS_VARIANT}
          /usr/lib/aarch64-linux-gnu/openblas-${BATON_BLAS_VARIANT}
    NO_DEFAULT_PATH)
  if(NOT BATON_OPENBLAS_LIB)
    find_library(BATON_OPENBLAS_LIB openblas REQUIRED)
  endif()
  find_path(BATON_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas REQUIRED)
endif()  # not BATON_GPU_CHECK
add_library(baton_openblas INTERFACE)
target_link_libraries(baton_openblas INTERFACE ${BATON_OPENBLAS_LIB})
target_include_directories(baton_openblas SYSTEM INTERFACE ${BATON_CBLAS_INCLUDE})
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
    set(BATON_HAVE_CUDA ON)
    # NCCL: the toolkit's folders first, then NCCL_HOME (a pip wheel's nvidia/nccl, say).
    # The GPU-check bundle carries nccl.h for an NCCL installed without its header.
    find_path(BATON_NCCL_INCLUDE nccl.h
      HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS}
      PATHS ${BATON_BUNDLE_DIR}/nccl/include)
    find_library(BATON_NCCL_LIB NAMES nccl libnccl.so.2
      HINTS $ENV{NCCL_HOME}/lib ${CUDAToolkit_LIBRARY_DIR})
    if(BATON_NCCL_INCLUDE AND BATON_NCCL_LIB)
      set(BATON_HAVE_NCCL ON)
      add_library(baton_nccl INTERFACE)
      target_include_directories(baton_nccl SYSTEM INTERFACE ${BATON_NCCL_INCLUDE})
      target_link_libraries(baton_nccl INTERFACE ${BATON_NCCL_LIB})
    elseif(BATON_CUDA STREQUAL "ON")
      message(FATAL_ERROR "BATON_CUDA=ON but NCCL (nccl.h, libnccl) was not found; set NCCL_HOME")
    endif()
  elseif(BATON_CUDA STREQUAL "ON")
    message(FATAL_ERROR "BATON_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "baton: CUDA backend ${BATON_HAVE_CUDA} (architectures ${CMAKE_CUDA_ARCHITECTURES}), NCCL ${BATON_HAVE_NCCL}")
