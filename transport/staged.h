// A communicator that carries CUDA tensors over one that moves host memory only (UCX
// without its CUDA transports): each device tensor is copied to a host buffer before the
// operation, and what the operation writes is copied back once it completes (in the
// Work's test() or wait(), on the calling thread's current stream, as every copy of
// memory::Tensor). Host tensors pass through untouched. So ranks that share a GPU, or
// hosts without NCCL, train on GPUs through the same engine (plan field "transport":
// "ucx" with "device": "cuda").
#pragma once

#include "transport/communicator.h"

namespace baton::transport {

// inner's groups and ranks; its splits are staged too.
CommPtr make_staged(CommPtr inner);

}  // namespace baton::transport
