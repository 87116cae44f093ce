# The GPU-check build's dependencies from the bundle tools/make-gpu-bundle.sh makes:
# GoogleTest's sources, OpenBLAS (the OpenMP build) with its runtime libraries and
# headers, spdlog and fmt as headers (header-only mode), and nccl.h for machines whose
# NCCL came without it. Nothing from the system but the compilers, CUDA and OpenMP.
set(_b "${BATON_BUNDLE_DIR}")
if(NOT EXISTS "${_b}/BUNDLE")
  message(FATAL_ERROR "BATON_GPU_CHECK: no bundle at ${_b}; run tools/make-gpu-bundle.sh where the Debian packages are")
endif()
set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
set(gtest_force_shared_crt OFF CACHE BOOL "" FORCE)
add_subdirectory("${_b}/googletest" "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL SYSTEM)
find_library(BATON_OPENBLAS_LIB NAMES libopenblas.so.0 PATHS "${_b}/openblas/lib" NO_DEFAULT_PATH REQUIRED)
find_path(BATON_CBLAS_INCLUDE cblas.h PATHS "${_b}/openblas/include" NO_DEFAULT_PATH REQUIRED)
# The bundled libraries are found at run time through the binaries' RPATH, an old-style
# one (DT_RPATH) so that it also serves OpenBLAS's own needs (libgfortran).
list(APPEND CMAKE_BUILD_RPATH "${_b}/openblas/lib")
add_link_options(-Wl,--disable-new-dtags)

# spdlog::spdlog as headers: spdlog compiles its -inl.h files into each user and takes
# fmt header-only too (Debian's tweakme.h already selects the external fmt).
add_library(baton_spdlog_headers INTERFACE)
target_include_directories(baton_spdlog_headers SYSTEM INTERFACE "${_b}/include")
target_compile_definitions(baton_spdlog_headers INTERFACE FMT_HEADER_ONLY SPDLOG_FMT_EXTERNAL)
add_library(spdlog::spdlog ALIAS baton_spdlog_headers)
