# FindBatonCUDNN: cuDNN as the imported target baton_cudnn (cudnn_graph.h and libcudnn).
# Used by baton's build and, shipped beside batonConfig.cmake, by projects that link an
# installed baton built with cuDNN, so the package names no path of the build machine.
# Searched in CUDNN_HOME (a pip wheel's nvidia/cudnn, beside PyTorch), then the CUDA
# toolkit's folders (find CUDAToolkit first).
find_path(BATON_CUDNN_INCLUDE cudnn_graph.h HINTS $ENV{CUDNN_HOME}/include ${CUDAToolkit_INCLUDE_DIRS})
find_library(BATON_CUDNN_LIB NAMES cudnn libcudnn.so.9 HINTS $ENV{CUDNN_HOME}/lib ${CUDAToolkit_LIBRARY_DIR})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BatonCUDNN REQUIRED_VARS BATON_CUDNN_LIB BATON_CUDNN_INCLUDE)
if(BatonCUDNN_FOUND AND NOT TARGET baton_cudnn)
  add_library(baton_cudnn INTERFACE IMPORTED)
  target_include_directories(baton_cudnn SYSTEM INTERFACE "${BATON_CUDNN_INCLUDE}")
  target_link_libraries(baton_cudnn INTERFACE "${BATON_CUDNN_LIB}")
endif()
