# FindBatonCUDNN: cuDNN's headers (BATON_CUDNN_INCLUDE, with cudnn_graph.h). The library is
# not linked: kernels/cuda opens libcudnn.so.<major> on first use (dynamic_library.h), so
# the build needs only the headers and an installed baton names no cuDNN at all.
# Searched in CUDNN_HOME (a pip wheel's nvidia/cudnn, beside PyTorch), then the CUDA
# toolkit's folders (find CUDAToolkit first).
find_path(BATON_CUDNN_INCLUDE cudnn_graph.h HINTS $ENV{CUDNN_HOME}/include ${CUDAToolkit_INCLUDE_DIRS})

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BatonCUDNN REQUIRED_VARS BATON_CUDNN_INCLUDE)
