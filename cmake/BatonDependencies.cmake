# Every dependency comes from Debian's packages (scripts/setup.sh installs them).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
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
add_library(baton_openblas INTERFACE)
target_link_libraries(baton_openblas INTERFACE ${BATON_OPENBLAS_LIB})
target_include_directories(baton_openblas SYSTEM INTERFACE ${BATON_CBLAS_INCLUDE})
message(STATUS "baton: OpenBLAS ${BATON_OPENBLAS_LIB}")

# CUDA (optional).
set(BATON_HAVE_CUDA OFF)
if(NOT BATON_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(BATON_HAVE_CUDA ON)
  elseif(BATON_CUDA STREQUAL "ON")
    message(FATAL_ERROR "BATON_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "baton: CUDA backend ${BATON_HAVE_CUDA}")
