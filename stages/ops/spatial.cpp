// Ops of the spatial split (partitioner/spatial.h): a rank of a spatial group holds rows
// [r h, (r + 1) h) of every image [C, H, W] of its micro-batch (h = H / s). They talk
// through OpContext::spatial, the group's communicator, in tile order:
//   HaloTransfer   the halo messages of conv2d's and pooling's "halo" (stages/ops/halo.h):
//                  the `top` rows above the tile from the rank before, the `bottom` rows
//                  below it from the rank after; backward the halo rows' gradients back
//                  to the ranks that own them.
//   spatial_mean   [C] -> [C]: the mean over the group (the tiles' global_avgpool means
//                  give the image's); backward dy / s, the value replicated afterwards.
#include <functional>

#include "kernels/ops.h"
#include "stages/ops/common.h"
#include "stages/ops/halo.h"
#include "stages/ops/registry.h"
#include "transport/communicator.h"

namespace baton::stages::ops {
namespace {

// Tags of one node's messages for one micro-batch, within the 27 bits every transport
// takes: 20 of the node name's hash, 5 of the micro-batch, 2 of the direction (messages
// of one tag between two ranks arrive in order, so the wrap-around is harmless).
uint64_t halo_tag(const std::string& node, const MicroBatch& mb, int what) {
  const uint64_t h = std::hash<std::string>{}(node) & ((uint64_t(1) << 20) - 1);
  return (h << 7) | (uint64_t(mb.index & 0x1f) << 2) | uint64_t(what);
}

Shape with_rows(Shape s, int64_t rows) {
  s[2] = rows;
  return s;
}

}  // namespace

transport::Communicator& spatial_comm(const OpContext& ctx, const std::string& node) {
  if (ctx.spatial == nullptr)
    throw RuntimeError("node '" + node +
                       "' is a spatial-split op but the stage has no spatial communicator");
  return *ctx.spatial;
}

SpatialTracer* spatial_tracer(const OpContext& ctx) {
  return dynamic_cast<SpatialTracer*>(ctx.spatial);
}

HaloTransfer HaloTransfer::forward(const OpContext& ctx, const std::string& node, const Tensor& x,
                                   int64_t top, int64_t bottom, double fill) {
  transport::Communicator& g = spatial_comm(ctx, node);
  const int r = g.rank(), s = g.size();
  const int64_t h = x.shape()[2];
  HaloTransfer t;
  t.top_ = top;
  t.bottom_ = bottom;
  // My first `bottom` rows are the bottom halo of the rank above; my last `top` rows the
  // top halo of the rank below.
  if (r > 0 && bottom > 0) {
    t.send_up_ = x.narrow(2, 0, bottom).contiguous();
    t.work_.push_back(g.isend(t.send_up_, r - 1, halo_tag(node, ctx.mb, 0)));
  }
  if (r + 1 < s && top > 0) {
    t.send_down_ = x.narrow(2, h - top, top).contiguous();
    t.work_.push_back(g.isend(t.send_down_, r + 1, halo_tag(node, ctx.mb, 1)));
  }
  if (top > 0) {
    t.above = Tensor::empty(with_rows(x.shape(), top), x.dtype(), ctx.device);
    t.above_received = r > 0;
    if (t.above_received)
      t.work_.push_back(g.irecv(t.above, r - 1, halo_tag(node, ctx.mb, 1)));
    else
      t.above.fill_(fill);
  }
  if (bottom > 0) {
    t.below = Tensor::empty(with_rows(x.shape(), bottom), x.dtype(), ctx.device);
    t.below_received = r + 1 < s;
    if (t.below_received)
      t.work_.push_back(g.irecv(t.below, r + 1, halo_tag(node, ctx.mb, 0)));
    else
      t.below.fill_(fill);
  }
  return t;
}

HaloTransfer HaloTransfer::backward(const OpContext& ctx, const std::string& node,
                                    const Tensor& d_above, const Tensor& d_below, const Shape& tile,
                                    int64_t top, int64_t bottom) {
  transport::Communicator& g = spatial_comm(ctx, node);
  const int r = g.rank(), s = g.size();
  const DType dtype = d_above.defined() ? d_above.dtype() : d_below.dtype();
  HaloTransfer t;
  t.top_ = top;
  t.bottom_ = bottom;
  if (r > 0 && top > 0) {  // my top halo came from the rank above
    t.send_up_ = d_above.contiguous();
    t.work_.push_back(g.isend(t.send_up_, r - 1, halo_tag(node, ctx.mb, 2)));
  }
  if (r + 1 < s && bottom > 0) {
    t.send_down_ = d_below.contiguous();
    t.work_.push_back(g.isend(t.send_down_, r + 1, halo_tag(node, ctx.mb, 3)));
  }
  if (r + 1 < s && top > 0) {  // my last rows were the top halo of the rank below
    t.below = Tensor::empty(with_rows(tile, top), dtype, ctx.device);
    t.below_received = true;
    t.work_.push_back(g.irecv(t.below, r + 1, halo_tag(node, ctx.mb, 2)));
  }
  if (r > 0 && bottom > 0) {  // my first rows were the bottom halo of the rank above
    t.above = Tensor::empty(with_rows(tile, bottom), dtype, ctx.device);
    t.above_received = true;
    t.work_.push_back(g.irecv(t.above, r - 1, halo_tag(node, ctx.mb, 3)));
  }
  return t;
}

void HaloTransfer::wait() {
  for (auto& w : work_) w->wait();
  work_.clear();
  send_up_ = Tensor();
  send_down_ = Tensor();
}

void HaloTransfer::add_received(Tensor& dx) const {
  const int64_t h = dx.shape()[2];
  auto add_rows = [&](int64_t first, const Tensor& rows) {
    Tensor part = dx.narrow(2, first, rows.shape()[2]).contiguous();
    kernels::add_inplace(part, rows);
    dx.narrow(2, first, rows.shape()[2]).copy_from(part);
  };
  if (below_received) add_rows(h - top_, below);
  if (above_received) add_rows(0, above);
}

namespace {

const OpSchema& mean_schema() {
  static const OpSchema s{"spatial_mean",
                          {"x"},
                          {"y"},
                          {},
                          {},
                          "the mean over the spatial group (of the tiles' global_avgpool "
                          "outputs); backward dy / group size"};
  return s;
}

class SpatialMean final : public OpBase {
 public:
  explicit SpatialMean(const OpSpec& spec) : OpBase(mean_schema(), spec) {
    expect_float_input(spec, 0, 1);
    out_.push_back(spec.inputs[0]);
    elems_ = numel_of(spec.inputs[0].shape);
  }

  void forward(ForwardCall& c) const override {
    transport::Communicator& g = spatial_comm(c.ctx, name_);
    Tensor y = c.inputs[0].clone();
    g.all_reduce(y, transport::ReduceOp::sum)->wait();
    kernels::scale_inplace(y, 1.0 / double(g.size()));
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    Tensor g = c.grad_outputs[0].clone();
    kernels::scale_inplace(g, 1.0 / double(spatial_comm(c.ctx, name_).size()));
    c.grad_inputs[0].give(g);
  }

  OpCost cost(int64_t batch) const override {
    OpCost k;
    k.forward_comm_bytes = batch * elems_ * dsize(dtype_);
    return k;
  }

 private:
  int64_t elems_ = 0;
};

}  // namespace

void add_spatial_ops(std::vector<OpType>& table) {
  table.push_back(
      {mean_schema(), [](const OpSpec& s) { return std::make_unique<SpatialMean>(s); }});
}

}  // namespace baton::stages::ops
