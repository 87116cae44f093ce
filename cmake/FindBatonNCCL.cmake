# FindBatonNCCL: NCCL as the imported target baton_nccl (nccl.h and libnccl). Used by
# baton's build and, shipped beside batonConfig.cmake, by projects that link an installed
# baton built with NCCL. Searched in NCCL_HOME (a pip wheel's nvidia/nccl, say), then the
# CUDA toolkit's folders (find CUDAToolkit first), then BATON_BUNDLE_DIR/nccl for a
# header missing from an NCCL installed without it.
find_path(BATON_NCCL_INCLUDE nccl.h
  HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS}
  PATHS ${BATON_BUNDLE_DIR}/nccl/include)
find_library(BATON_NCCL_LIB NAMES nccl libnccl.so.2
  HINTS $ENV{NCCL_HOME}/lib ${CUDAToolkit_LIBRARY_DIR})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BatonNCCL REQUIRED_VARS BATON_NCCL_LIB BATON_NCCL_INCLUDE)
if(BatonNCCL_FOUND AND NOT TARGET baton_nccl)
  add_library(baton_nccl INTERFACE IMPORTED)
  target_include_directories(baton_nccl SYSTEM INTERFACE "${BATON_NCCL_INCLUDE}")
  target_link_libraries(baton_nccl INTERFACE "${BATON_NCCL_LIB}")
endif()
