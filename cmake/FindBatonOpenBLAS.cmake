# FindBatonOpenBLAS: OpenBLAS as the imported target baton_openblas (CBLAS header and
# library). Used by baton's build and, shipped beside batonConfig.cmake, by projects that
# link the installed baton, so that both find the same OpenBLAS build.
#
# BATON_BLAS_VARIANT selects the build: openmp (default: GEMM threads and baton's own
# parallel loops share one OpenMP pool and never oversubscribe the cores; the pthread
# build keeps its own spinning threads) or pthread (Debian's default build). Preset
# BATON_OPENBLAS_LIB / BATON_CBLAS_INCLUDE (the GPU-check bundle does) skip the search.
if(NOT BATON_BLAS_VARIANT)
  set(BATON_BLAS_VARIANT openmp)
endif()
find_library(BATON_OPENBLAS_LIB openblas
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-${BATON_BLAS_VARIANT}
        /usr/lib/x86_64-linux-gnu/openblas-${BATON_BLAS_VARIANT}
        /usr/lib/aarch64-linux-gnu/openblas-${BATON_BLAS_VARIANT}
  NO_DEFAULT_PATH)
if(NOT BATON_OPENBLAS_LIB)
  find_library(BATON_OPENBLAS_LIB openblas)
endif()
find_path(BATON_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BatonOpenBLAS REQUIRED_VARS BATON_OPENBLAS_LIB BATON_CBLAS_INCLUDE)
if(BatonOpenBLAS_FOUND AND NOT TARGET baton_openblas)
  add_library(baton_openblas INTERFACE IMPORTED)
  target_link_libraries(baton_openblas INTERFACE "${BATON_OPENBLAS_LIB}")
  target_include_directories(baton_openblas SYSTEM INTERFACE "${BATON_CBLAS_INCLUDE}")
endif()
