#include "kernels/cuda/common.cuh"
