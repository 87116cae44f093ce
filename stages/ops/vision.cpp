// The ops of convolutional networks on per-sample [C, H, W] images (NCHW with the batch):
// conv2d, batchnorm2d (batch statistics while training, running statistics in evaluation,
// the running statistics kept as non-trainable parameters the op updates), maxpool2d,
// avgpool2d and global_avgpool. The residual network's other ops are add, relu, linear.
#include "kernels/vision.h"

#include <array>
#include <cmath>
#include <limits>

#include "kernels/ops.h"
#include "stages/ops/common.h"
#include "stages/ops/halo.h"
#include "stages/ops/registry.h"
#include "transport/communicator.h"

namespace baton::stages::ops {
namespace {

// An attribute that is one integer for both dimensions or [h, w].
std::array<int64_t, 2> pair_attr(const OpSpec& spec, const char* name, std::array<int64_t, 2> dflt,
                                 int64_t min) {
  auto a = spec.attrs.get(name);
  if (!a) return dflt;
  if (a->is_array()) {
    if (a->size() != 2)
      a->fail("an integer or a pair [h, w] of integers >= " + std::to_string(min),
              json_brief(a->raw()));
    return {a->at(size_t(0)).as_int(min, int64_t(1) << 20),
            a->at(size_t(1)).as_int(min, int64_t(1) << 20)};
  }
  const int64_t v = a->as_int(min, int64_t(1) << 20);
  return {v, v};
}

// The per-sample input must be [C, H, W].
void expect_image(const OpSpec& spec, size_t i) {
  expect_float_input(spec, i, 3);
  if (spec.inputs[i].shape.size() != 3)
    input_json(spec, i).fail("an image [C, H, W] per sample", type_str(spec.inputs[i]));
}

// ---- the spatial split's fused halo (stages/ops/halo.h, docs/partitioner.md) ----

// The "halo": [top, bottom] attribute of a convolution or pooling on a spatial tile of h
// rows ({0, 0} without one).
std::array<int64_t, 2> tile_halo_attr(const OpSpec& spec, int64_t h) {
  auto a = spec.attrs.get("halo");
  if (!a) return {0, 0};
  if (!a->is_array() || a->size() != 2)
    a->fail("a pair [top, bottom] of halo row counts", json_brief(a->raw()));
  return {a->at(size_t(0)).as_int(0, h), a->at(size_t(1)).as_int(0, h)};
}

// Rows of the extended tile: [0, top) the halo from above, [top, top + h) the tile,
// [top + h, top + h + bottom) the halo from below. Output row i reads extended rows
// [i s, i s + extent]. Rows [0, top_end) read the top halo, rows [bottom_begin, oh) the
// bottom halo (the two may overlap: a tile of one row), the rows between read the tile
// alone (the interior). `border` is those ranges, merged when they overlap. The op runs
// on the tile alone with the halo rows as padding while the halo is in flight (exact for
// the interior), then the border rows again from strips of the real rows.
struct TileHaloRows {
  int64_t top = 0, bottom = 0, h = 0, stride = 1, extent = 0;
  std::vector<std::pair<int64_t, int64_t>> border;  // output row ranges that read a halo

  TileHaloRows() = default;
  TileHaloRows(std::array<int64_t, 2> halo, int64_t h_, int64_t stride_, int64_t extent_,
               int64_t oh)
      : top(halo[0]), bottom(halo[1]), h(h_), stride(stride_), extent(extent_) {
    if (!on()) return;
    const int64_t top_end = std::min(oh, (top + stride - 1) / stride);
    const int64_t last =
        top + h - 1 - extent;  // the last extended row a tile-only window starts at
    const int64_t bottom_begin = bottom == 0 ? oh : last < 0 ? 0 : std::min(oh, last / stride + 1);
    if (bottom_begin <= top_end) {
      border.push_back({0, oh});
    } else {
      if (top_end > 0) border.push_back({0, top_end});
      if (bottom_begin < oh) border.push_back({bottom_begin, oh});
    }
  }
  bool on() const { return top + bottom > 0; }

  // Output rows [first, last)'s extended input rows.
  std::pair<int64_t, int64_t> ext_rows(std::pair<int64_t, int64_t> out) const {
    return {out.first * stride, (out.second - 1) * stride + extent + 1};
  }

  // Extended rows [e0, e1) of the tile x with its halos as one tensor; halo_only: the
  // tile's rows zero (what the zero-padded tile left out).
  Tensor strip(const Tensor& x, const Tensor& above, const Tensor& below, int64_t e0, int64_t e1,
               bool halo_only) const {
    Shape s = x.shape();
    s[2] = e1 - e0;
    Tensor out = halo_only ? Tensor::zeros(s, x.dtype(), x.device())
                           : Tensor::empty(s, x.dtype(), x.device());
    auto put = [&](const Tensor& src, int64_t first) {  // src holds extended rows from `first`
      const int64_t lo = std::max(e0, first), hi = std::min(e1, first + src.shape()[2]);
      if (lo < hi) out.narrow(2, lo - e0, hi - lo).copy_from(src.narrow(2, lo - first, hi - lo));
    };
    if (top > 0) put(above, 0);
    if (!halo_only) put(x, top);
    if (bottom > 0) put(below, top + h);
    return out;
  }

  // Forward, after the halo arrived: each border range's output rows from its strip of
  // real rows (`op(k, strip, part)` writes `part`, the range's rows), copied over y's.
  template <class F>
  void forward_border(ForwardCall& c, const Tensor& x, const HaloTransfer& t, Tensor& y,
                      F&& op) const {
    for (size_t k = 0; k < border.size(); ++k) {
      const auto [e0, e1] = ext_rows(border[k]);
      Tensor strip_k = strip(x, t.above, t.below, e0, e1, false);
      Shape s = y.shape();
      s[2] = border[k].second - border[k].first;
      Tensor part = c.alloc(s, y.dtype());
      op(k, strip_k, part);
      y.narrow(2, border[k].first, s[2]).copy_from(part);
    }
  }

  // Backward: each border range's strip's gradient from its rows of dy
  // (`grad(k, dy_rows, dstrip)` writes dstrip), first; the halo rows' parts of them go to
  // the neighbours (views of the strips). `in` the op's per-sample input [C, h, W].
  template <class F>
  void halo_grads(const Tensor& dy, const Shape& in, BackwardCall& c, Tensor& d_above,
                  Tensor& d_below, F&& grad) const {
    for (size_t k = 0; k < border.size(); ++k) {
      const auto [e0, e1] = ext_rows(border[k]);
      Tensor dys = dy.narrow(2, border[k].first, border[k].second - border[k].first).contiguous();
      Tensor dxs = c.alloc({dy.shape()[0], in[0], e1 - e0, in[2]}, dy.dtype());
      grad(k, dys, dxs);
      if (top > 0 && e0 == 0) d_above = dxs.narrow(2, 0, top);
      if (bottom > 0 && e1 == top + h + bottom) d_below = dxs.narrow(2, top + h - e0, bottom);
    }
  }

  // The bytes of the halo messages each way for a micro-batch of `batch`.
  int64_t comm_bytes(int64_t batch, const Shape& in, DType dtype) const {
    return batch * in[0] * in[2] * (top + bottom) * dsize(dtype);
  }

  // The tile's shape [N, C, h, W] for a gradient dy of this op.
  Shape tile(const Tensor& dy, const Shape& in) const { return {dy.shape()[0], in[0], h, in[2]}; }
};

// Times `f` as INTERIOR_<dir> of the micro-batch on the measured timeline (when one is
// recorded): the rows computed while the halo is in flight.
template <class F>
void time_interior(const OpContext& ctx, const char* label, F&& f) {
  SpatialTracer* tracer = spatial_tracer(ctx);
  const double t0 = tracer != nullptr ? tracer->now() : 0.0;
  f();
  if (tracer != nullptr) tracer->record(label, ctx.mb.index, t0, tracer->now());
}

// ---- conv2d ----

const OpSchema& conv2d_schema() {
  static const OpSchema s{"conv2d",
                          {"x"},
                          {"y"},
                          {{"weight", false}, {"bias", true}},
                          {"stride", "padding", "dilation", "groups", "halo"},
                          "2-D convolution of x [C, H, W] with weight [O, C / groups, KH, KW] "
                          "(+ bias [O]); stride, padding, dilation: an integer or [h, w]; "
                          "halo [top, bottom]: x is a spatial tile, the rows above and below "
                          "it come from the neighbouring tiles (no padding along the height)"};
  return s;
}

class Conv2d final : public OpBase {
 public:
  explicit Conv2d(const OpSpec& spec) : OpBase(conv2d_schema(), spec) {
    expect_image(spec, 0);
    const auto stride = pair_attr(spec, "stride", {1, 1}, 1);
    const auto pad = pair_attr(spec, "padding", {0, 0}, 0);
    const auto dil = pair_attr(spec, "dilation", {1, 1}, 1);
    const int64_t groups = spec.attrs.get_int("groups", 1, 1, int64_t(1) << 20);
    opt_ = kernels::Conv2dOptions::symmetric(stride[0], stride[1], pad[0], pad[1], dil[0], dil[1],
                                             groups);
    const Shape& x = spec.inputs[0].shape;
    const auto halo = tile_halo_attr(spec, x[1]);
    if (halo[0] + halo[1] > 0 && pad[0] != 0)
      spec.attrs.at("padding").fail(
          "no padding along the height with a halo (the halo rows are the padding)",
          std::to_string(pad[0]));
    const Shape& w = *spec.params[0];
    if (w.size() != 4)
      param_json(spec, "weight")
          .fail("a weight [O, C / groups, KH, KW]", "one of shape " + memory::shape_str(w));
    if (x[0] % groups != 0 || w[0] % groups != 0)
      spec.attrs.at("groups").fail("a divisor of the input channels " + std::to_string(x[0]) +
                                       " and the output channels " + std::to_string(w[0]),
                                   std::to_string(groups));
    if (w[1] != x[0] / groups)
      param_json(spec, "weight")
          .fail("a weight with C / groups = " + std::to_string(x[0] / groups) +
                    " input channels (the input is " + type_str(spec.inputs[0]) + ")",
                "one of shape " + memory::shape_str(w));
    o_ = w[0];
    c_ = x[0];
    k_ = w[2] * w[3] * w[1];
    expect_param_shape(spec, schema_, 1, {o_});
    has_bias_ = spec.params[1].has_value();
    const int64_t oh = kernels::conv_output_size(x[1] + halo[0] + halo[1], w[2], stride[0], pad[0],
                                                 pad[0], dil[0]);
    const int64_t ow = kernels::conv_output_size(x[2], w[3], stride[1], pad[1], pad[1], dil[1]);
    if (oh < 1 || ow < 1)
      input_json(spec, 0).fail(
          "an image the kernel " + std::to_string(w[2]) + "x" + std::to_string(w[3]) +
              " (dilation " + std::to_string(dil[0]) + "x" + std::to_string(dil[1]) + ", padding " +
              std::to_string(pad[0]) + "x" + std::to_string(pad[1]) + ") fits in",
          type_str(spec.inputs[0]));
    in_ = x;
    out_.push_back({{o_, oh, ow}, dtype_, true});
    halo_ = TileHaloRows(halo, x[1], stride[0], dil[0] * (w[2] - 1), oh);
    tile_opt_ = opt_;
    tile_opt_.pad_top = halo_.top;
    tile_opt_.pad_bottom = halo_.bottom;
  }

  bool saves_input(size_t) const override { return true; }
  bool weight_needs_input(size_t) const override { return true; }
  bool weight_needs_grad_outputs() const override { return true; }
  bool weight_needs_saved() const override { return halo_.on(); }

  void forward(ForwardCall& c) const override {
    if (halo_.on()) return forward_halo(c);
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::conv2d_forward(c.inputs[0], c.params[0], c.params[1], opt_, y);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    if (halo_.on()) return backward_input_halo(c);
    auto t = c.grad_inputs[0].target();
    kernels::conv2d_backward_input(c.grad_outputs[0], c.params[0], opt_, t.tensor, t.accumulate);
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& gw = c.grad_params[0];
    ParamGrad& gb = c.grad_params[1];
    Tensor none;
    // With a halo: the tile with zero halo rows first (tile_opt_), then the halo rows' part.
    const kernels::Conv2dOptions& o = halo_.on() ? tile_opt_ : opt_;
    if (gw.tensor.defined() && gb.tensor.defined() && gw.accumulate == gb.accumulate) {
      kernels::conv2d_backward_weight(c.grad_outputs[0], c.inputs[0], o, gw.tensor, gb.tensor,
                                      gw.accumulate);
      weight_halo_part(c, gw.tensor);
      return;
    }
    if (gw.tensor.defined()) {
      kernels::conv2d_backward_weight(c.grad_outputs[0], c.inputs[0], o, gw.tensor, none,
                                      gw.accumulate);
      weight_halo_part(c, gw.tensor);
    }
    if (gb.tensor.defined()) {
      // The bias alone: the sum of dy over the output plane (mean times its size), then
      // over the batch.
      const Shape& y = out_[0].shape;
      Tensor sums = Tensor::empty({c.ctx.batch(), o_}, dtype_, c.ctx.device);
      kernels::global_avgpool_forward(c.grad_outputs[0], sums);
      kernels::scale_inplace(sums, double(y[1] * y[2]));
      kernels::bias_backward(sums, gb.tensor, gb.accumulate);
    }
  }

  OpCost cost(int64_t batch) const override {
    const Shape& y = out_[0].shape;
    const double outs = double(batch * o_ * y[1] * y[2]);
    const double mm = 2.0 * outs * double(k_);
    OpCost k;
    k.forward_flops = mm + (has_bias_ ? outs : 0);
    k.backward_input_flops = mm;
    k.backward_weight_flops = mm + (has_bias_ ? outs : 0);
    if (halo_.on()) {
      // The saved halo rows, and their messages.
      const int64_t row = batch * in_[0] * in_[2];
      k.extra_saved_bytes = (halo_.top > 0 ? alloc_bytes(row * halo_.top, dtype_) : 0) +
                            (halo_.bottom > 0 ? alloc_bytes(row * halo_.bottom, dtype_) : 0);
      k.forward_comm_bytes = halo_.comm_bytes(batch, in_, dtype_);
      k.backward_comm_bytes = k.forward_comm_bytes;
    }
    return k;
  }

 private:
  // Posts the halos, computes every output row with zero halo rows (exact for the
  // interior) while they are in flight, then the border rows again from the halos.
  void forward_halo(ForwardCall& c) const {
    const Tensor& x = c.inputs[0];
    HaloTransfer t = HaloTransfer::forward(c.ctx, name_, x, halo_.top, halo_.bottom, 0.0);
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    time_interior(c.ctx, "INTERIOR_F",
                  [&] { kernels::conv2d_forward(x, c.params[0], c.params[1], tile_opt_, y); });
    t.wait();
    halo_.forward_border(c, x, t, y, [&](size_t, const Tensor& strip, Tensor& part) {
      kernels::conv2d_forward(strip, c.params[0], c.params[1], opt_, part);
    });
    if (halo_.top > 0) c.saved.push_back(t.above);
    if (halo_.bottom > 0) c.saved.push_back(t.below);
    c.outputs[0] = y;
  }

  // The halo rows' gradients first (from the border rows of dy, small), sent while the
  // tile's gradient is computed (every row of dy, the halo rows dropped as padding); the
  // neighbours' gradients for this tile's rows added when they are there.
  void backward_input_halo(BackwardCall& c) const {
    const Tensor& dy = c.grad_outputs[0];
    Tensor d_above, d_below;
    halo_.halo_grads(dy, in_, c, d_above, d_below, [&](size_t, const Tensor& dys, Tensor& dxs) {
      kernels::conv2d_backward_input(dys, c.params[0], opt_, dxs, false);
    });
    HaloTransfer t = HaloTransfer::backward(c.ctx, name_, d_above, d_below, halo_.tile(dy, in_),
                                            halo_.top, halo_.bottom);
    auto target = c.grad_inputs[0].target();
    time_interior(c.ctx, "INTERIOR_B", [&] {
      kernels::conv2d_backward_input(dy, c.params[0], tile_opt_, target.tensor, target.accumulate);
    });
    t.wait();
    t.add_received(target.tensor);
  }

  // The weight gradient's part from the halo rows (the zero-padded tile's left them out):
  // the border rows of dy against their windows with the tile's rows zero.
  void weight_halo_part(WeightCall& c, Tensor& gw) const {
    if (!halo_.on()) return;
    const Tensor above = halo_.top > 0 ? c.saved[0] : Tensor();
    const Tensor below = halo_.bottom > 0 ? c.saved[halo_.top > 0 ? 1 : 0] : Tensor();
    Tensor none;
    for (const auto& rows : halo_.border) {
      const auto [e0, e1] = halo_.ext_rows(rows);
      Tensor strip = halo_.strip(c.inputs[0], above, below, e0, e1, true);
      Tensor dys = c.grad_outputs[0].narrow(2, rows.first, rows.second - rows.first).contiguous();
      kernels::conv2d_backward_weight(dys, strip, opt_, gw, none, true);
    }
  }

  kernels::Conv2dOptions opt_;
  kernels::Conv2dOptions tile_opt_;  // with a halo: the halo rows as zero padding
  Shape in_;
  int64_t o_ = 0, c_ = 0, k_ = 0;
  bool has_bias_ = false;
  TileHaloRows halo_;
};

// ---- batchnorm2d ----

const OpSchema& batchnorm_schema() {
  static const OpSchema s{
      "batchnorm2d",
      {"x"},
      {"y"},
      {{"weight", false}, {"bias", false}, {"running_mean", true}, {"running_var", true}},
      {"eps", "momentum", "spatial"},
      "batch normalisation of x [C, H, W] per channel over the micro-batch "
      "and the plane while training (the running statistics, parameters "
      "with \"trainable\": false, move by momentum); in evaluation the "
      "running statistics normalise; spatial (false): x is a tile of the image and the "
      "statistics are reduced over the spatial group"};
  return s;
}

class BatchNorm2d final : public OpBase {
 public:
  explicit BatchNorm2d(const OpSpec& spec) : OpBase(batchnorm_schema(), spec) {
    expect_image(spec, 0);
    eps_ = spec.attrs.get_double("eps", 1e-5, 1e-12, 1.0);
    momentum_ = spec.attrs.get_double("momentum", 0.1, 0.0, 1.0);
    spatial_ = spec.attrs.get_bool("spatial", false);
    c_ = spec.inputs[0].shape[0];
    for (size_t k = 0; k < 4; ++k) expect_param_shape(spec, schema_, k, {c_});
    running_ = spec.params[2].has_value();
    if (running_ != spec.params[3].has_value())
      param_json(spec, running_ ? "running_var" : "running_mean")
          .fail("running_mean and running_var together (or neither)",
                running_ ? "running_mean without running_var" : "running_var without running_mean");
    elems_ = numel_of(spec.inputs[0].shape);
    plane_ = elems_ / c_;  // H x W: exact
    out_.push_back(spec.inputs[0]);
    // The node in its file, for the refusal of a micro-batch found only at run time (a
    // physical node's JSON is its own, under its logical node's path).
    where_ = spec.node.path() == "$" ? spec.node.file() : spec.node.where();
  }

  bool saves_input(size_t) const override { return true; }
  bool weight_needs_input(size_t) const override { return true; }
  bool weight_needs_grad_outputs() const override { return true; }
  bool weight_needs_saved() const override { return true; }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    if (!c.ctx.training && running_) {
      kernels::batchnorm_forward_eval(c.inputs[0], c.params[0], c.params[1], c.params[2],
                                      c.params[3], eps_, y);
      c.outputs[0] = y;
      return;
    }
    // One value per channel has variance 0: the output is the bias alone and nothing
    // before the norm gets a gradient (PyTorch refuses it too). A micro-batch of one
    // sample over a 1 x 1 map does it; the statistics of a tiled image span its tiles.
    const int64_t per_channel =
        c.ctx.batch() * plane_ * (spatial_ ? spatial_group(c.ctx).size() : 1);
    if (c.ctx.training && per_channel < 2)
      throw InputError(where_ + ": node '" + name_ + "' (batchnorm2d) normalises " +
                       std::to_string(per_channel) +
                       " value per channel in training (a micro-batch of " +
                       std::to_string(c.ctx.batch()) + " sample(s) over " + std::to_string(plane_) +
                       " position(s)): its variance is 0 and the layers before it would learn "
                       "nothing; use micro-batches of at least 2 samples");
    Tensor mean = c.alloc({c_}, dtype_), rstd = c.alloc({c_}, dtype_);
    // The running statistics move once per training forward (not again when a recomputed
    // layer runs its forward a second time, nor in evaluation without them).
    Tensor rm, rv;
    if (running_ && c.ctx.training && !c.ctx.recompute) {
      rm = c.params[2];
      rv = c.params[3];
    }
    if (spatial_) {
      forward_tiled(c, y, mean, rstd, rm, rv);
      return;
    }
    kernels::batchnorm_forward_train(c.inputs[0], c.params[0], c.params[1], eps_, momentum_, y,
                                     mean, rstd, rm, rv);
    c.outputs[0] = y;
    c.saved.push_back(mean);
    c.saved.push_back(rstd);
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    if (spatial_) {
      // The whole image's sums of dy and dy * xhat, then the gradient of this tile.
      transport::Communicator& g = spatial_group(c.ctx);
      Tensor sums = Tensor::empty({2, c_}, dtype_, c.ctx.device);
      Tensor sdyx = sums.select(0, 0), sdy = sums.select(0, 1);
      kernels::batchnorm_backward_weight(c.grad_outputs[0], c.inputs[0], c.saved[0], c.saved[1],
                                         sdyx, sdy, false);
      g.all_reduce(sums, transport::ReduceOp::sum)->wait();
      const double count = double(g.size()) * double(c.ctx.batch()) * double(plane_);
      kernels::batchnorm_backward_input_sums(c.grad_outputs[0], c.inputs[0], c.params[0],
                                             c.saved[0], c.saved[1], sdy, sdyx, count, t.tensor,
                                             t.accumulate);
      return;
    }
    kernels::batchnorm_backward_input(c.grad_outputs[0], c.inputs[0], c.params[0], c.saved[0],
                                      c.saved[1], t.tensor, t.accumulate);
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& gw = c.grad_params[0];
    ParamGrad& gb = c.grad_params[1];
    // Running statistics declared trainable get a zero gradient (they are not a function
    // the loss differentiates); the Stage gives buffers none.
    for (size_t k = 2; k < 4; ++k)
      if (c.grad_params[k].tensor.defined() && !c.grad_params[k].accumulate)
        c.grad_params[k].tensor.fill_(0.0);
    Tensor none;
    if (gw.tensor.defined() && gb.tensor.defined() && gw.accumulate == gb.accumulate) {
      kernels::batchnorm_backward_weight(c.grad_outputs[0], c.inputs[0], c.saved[0], c.saved[1],
                                         gw.tensor, gb.tensor, gw.accumulate);
      return;
    }
    if (gw.tensor.defined())
      kernels::batchnorm_backward_weight(c.grad_outputs[0], c.inputs[0], c.saved[0], c.saved[1],
                                         gw.tensor, none, gw.accumulate);
    if (gb.tensor.defined())
      kernels::batchnorm_backward_weight(c.grad_outputs[0], c.inputs[0], c.saved[0], c.saved[1],
                                         none, gb.tensor, gb.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    const double e = double(batch * elems_);
    OpCost k;
    k.forward_flops = 7 * e;  // mean, centred variance, normalise, scale and shift
    k.backward_input_flops = 9 * e;
    k.backward_weight_flops = 4 * e;
    k.extra_saved_bytes = 2 * alloc_bytes(c_, dtype_);
    return k;
  }

 private:
  transport::Communicator& spatial_group(const OpContext& ctx) const {
    if (ctx.batchnorm != nullptr) return *ctx.batchnorm;
    if (ctx.spatial == nullptr)
      throw RuntimeError("node '" + name_ +
                         "' normalises a spatial tile but the stage has no spatial communicator");
    return *ctx.spatial;
  }

  // The statistics of the whole image from its tiles: each tile's mean and variance
  // (the kernel's), combined over the group as Chan et al.'s parallel variance (the sum
  // of the tiles' squared deviations plus each tile's count times its mean's squared
  // distance to the global mean: no cancellation), then the eval kernel normalises with
  // them. Every tile has the same element count.
  void forward_tiled(ForwardCall& c, Tensor& y, Tensor& mean, Tensor& rstd, Tensor& rm,
                     Tensor& rv) const {
    transport::Communicator& g = spatial_group(c.ctx);
    const double m = double(c.ctx.batch()) * double(plane_);
    const double total = m * double(g.size());
    // The tile's own variance from the kernel as a running variance at momentum 1 (its
    // unbiased variance, rescaled below): rebuilt from rstd as 1 / rstd^2 - eps it lost
    // eps / var of float's precision, percents of running_var where var << eps.
    Tensor tile_mean = Tensor::zeros({c_}, dtype_, c.ctx.device),
           tile_var = Tensor::zeros({c_}, dtype_, c.ctx.device);
    kernels::batchnorm_forward_train(c.inputs[0], c.params[0], c.params[1], eps_, 1.0, y, mean,
                                     rstd, tile_mean, tile_var);
    // Host copies for the arithmetic, the sums on the stage's device (NCCL's communicator
    // reduces device tensors): to_staging reads a tensor of any device.
    const memory::Device dev = c.ctx.device;
    auto host = [](const Tensor& t) { return t.to_staging(DType::f64).to_vector<double>(); };
    auto summed = [&](const std::vector<double>& v) {
      Tensor t = Tensor::from_vector(v, {c_}).to(dev);
      g.all_reduce(t, transport::ReduceOp::sum)->wait();
      return host(t);
    };
    auto put = [&](Tensor& to, const std::vector<double>& v) {
      to.copy_from(Tensor::from_vector(v, {c_}).to(dtype_));
    };
    const std::vector<double> mu_l = host(mean), rs_l = host(rstd), uv_l = host(tile_var);
    const size_t nc = static_cast<size_t>(c_);
    std::vector<double> mu(nc), var(nc);
    for (size_t k = 0; k < size_t(c_); ++k) mu[k] = mu_l[k] / double(g.size());
    mu = summed(mu);
    for (size_t k = 0; k < size_t(c_); ++k) {
      // One element a tile has no unbiased variance: its biased one is 0 (as rstd says).
      const double v_l = m > 1 ? uv_l[k] * (m - 1) / m : 1.0 / (rs_l[k] * rs_l[k]) - eps_;
      const double d = mu_l[k] - mu[k];
      var[k] = (v_l + d * d) / double(g.size());
    }
    var = summed(var);
    std::vector<double> rs(nc);
    for (size_t k = 0; k < size_t(c_); ++k) rs[k] = 1.0 / std::sqrt(var[k] + eps_);
    put(mean, mu);
    put(rstd, rs);
    Tensor var_t = Tensor::empty({c_}, dtype_, dev);
    put(var_t, var);
    kernels::batchnorm_forward_eval(c.inputs[0], c.params[0], c.params[1], mean, var_t, eps_, y);
    if (rm.defined()) {
      // torch's update with the unbiased variance of the whole image batch.
      std::vector<double> a = host(rm), b = host(rv);
      for (size_t k = 0; k < size_t(c_); ++k) {
        a[k] = (1 - momentum_) * a[k] + momentum_ * mu[k];
        b[k] = (1 - momentum_) * b[k] + momentum_ * var[k] * total / (total - 1);
      }
      put(rm, a);
      put(rv, b);
    }
    c.outputs[0] = y;
    c.saved.push_back(mean);
    c.saved.push_back(rstd);
  }

  double eps_ = 1e-5, momentum_ = 0.1;
  int64_t c_ = 0, elems_ = 0, plane_ = 0;  // plane_: the elements of one channel
  bool running_ = false, spatial_ = false;
  std::string where_;
};

// ---- pooling ----

const OpSchema& maxpool_schema() {
  static const OpSchema s{"maxpool2d",
                          {"x"},
                          {"y"},
                          {},
                          {"kernel", "stride", "padding", "halo"},
                          "max pooling of x [C, H, W]; kernel (required), stride (default: "
                          "the kernel), padding (0, counts as -inf): an integer or [h, w]; "
                          "halo [top, bottom]: x is a spatial tile, as conv2d's"};
  return s;
}
const OpSchema& avgpool_schema() {
  static const OpSchema s{"avgpool2d",
                          {"x"},
                          {"y"},
                          {},
                          {"kernel", "stride", "padding", "count_include_pad", "halo"},
                          "average pooling of x [C, H, W]; kernel (required), stride (default: "
                          "the kernel), padding (0); count_include_pad (true) divides by the "
                          "whole window as torch does; halo [top, bottom]: x is a spatial "
                          "tile, as conv2d's"};
  return s;
}

template <bool kMax>
class Pool2d final : public OpBase {
 public:
  explicit Pool2d(const OpSpec& spec) : OpBase(kMax ? maxpool_schema() : avgpool_schema(), spec) {
    expect_image(spec, 0);
    if (!spec.attrs.has("kernel")) spec.attrs.fail("an object with \"kernel\"", "no \"kernel\"");
    const auto k = pair_attr(spec, "kernel", {1, 1}, 1);
    const auto s = pair_attr(spec, "stride", k, 1);
    const auto p = pair_attr(spec, "padding", {0, 0}, 0);
    if (2 * p[0] > k[0] || 2 * p[1] > k[1])
      spec.attrs.at("padding").fail(
          "at most half the kernel " + std::to_string(k[0]) + "x" + std::to_string(k[1]),
          json_brief(spec.attrs.at("padding").raw()));
    opt_ = kernels::Pool2dOptions{k[0], k[1], s[0], s[1], p[0], p[1], true};
    if (!kMax) opt_.count_include_pad = spec.attrs.get_bool("count_include_pad", true);
    const Shape& x = spec.inputs[0].shape;
    const auto halo = tile_halo_attr(spec, x[1]);
    const int64_t oh =
        kernels::conv_output_size(x[1] + halo[0] + halo[1], k[0], s[0], p[0], p[0], 1);
    const int64_t ow = kernels::conv_output_size(x[2], k[1], s[1], p[1], p[1], 1);
    if (oh < 1 || ow < 1)
      input_json(spec, 0).fail(
          "an image a window of " + std::to_string(k[0]) + "x" + std::to_string(k[1]) + " fits in",
          type_str(spec.inputs[0]));
    out_.push_back({{x[0], oh, ow}, dtype_, true});
    in_ = x;
    window_ = k[0] * k[1];
    if (halo[0] + halo[1] > 0) {
      // The tile alone runs with `top` rows of padding on both sides (the pooling kernels'
      // padding is symmetric): that must give the same output rows, the extra bottom
      // padding (bottom <= top) reaching no further window.
      tile_opt_ = opt_;
      tile_opt_.pad_h = halo[0];
      auto fail = [&](const std::string& want, const std::string& got) {
        spec.attrs.at("halo").fail(want, got);
      };
      if (p[0] != 0)
        fail("no padding along the height with a halo (the halo rows are the padding)",
             "padding " + std::to_string(p[0]));
      if (!opt_.count_include_pad)
        fail("count_include_pad true with a halo (the tile cannot tell padding from halo)",
             "false");
      if (halo[1] > halo[0] || 2 * halo[0] > k[0] ||
          kernels::conv_output_size(x[1], k[0], s[0], halo[0], halo[0], 1) != oh)
        fail("a halo [top, bottom] with bottom <= top <= kernel / 2 whose tile gives " +
                 std::to_string(oh) + " output rows",
             json_brief(spec.attrs.at("halo").raw()));
      halo_ = TileHaloRows(halo, x[1], s[0], k[0] - 1, oh);
    }
  }

  void forward(ForwardCall& c) const override {
    if (halo_.on()) return forward_halo(c);
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    if (kMax) {
      Tensor idx = c.alloc(y.shape(), DType::i32);
      kernels::maxpool2d_forward(c.inputs[0], opt_, y, idx);
      c.saved.push_back(idx);
    } else {
      kernels::avgpool2d_forward(c.inputs[0], opt_, y);
    }
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    if (halo_.on()) return backward_input_halo(c);
    auto t = c.grad_inputs[0].target();
    tile_backward(c.grad_outputs[0], c.saved.empty() ? Tensor() : c.saved[0], opt_, t.tensor,
                  t.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    const double outs = double(batch * numel_of(out_[0].shape));
    OpCost k;
    k.forward_flops = outs * double(window_);
    k.backward_input_flops = kMax ? outs : outs * double(window_);
    if (kMax) k.extra_saved_bytes = alloc_bytes(batch * numel_of(out_[0].shape), DType::i32);
    if (halo_.on()) {
      // Max pooling also keeps each border range's argmax over its strip.
      if (kMax)
        for (const auto& rows : halo_.border)
          k.extra_saved_bytes += alloc_bytes(
              batch * in_[0] * (rows.second - rows.first) * out_[0].shape[2], DType::i32);
      k.forward_comm_bytes = halo_.comm_bytes(batch, in_, dtype_);
      k.backward_comm_bytes = k.forward_comm_bytes;
    }
    return k;
  }

 private:
  void tile_backward(const Tensor& dy, const Tensor& argmax, const kernels::Pool2dOptions& o,
                     Tensor& dx, bool accumulate) const {
    if (kMax)
      kernels::maxpool2d_backward(dy, argmax, dx, accumulate);
    else
      kernels::avgpool2d_backward(dy, o, dx, accumulate);
  }

  // The spatial split's halo, as the convolution's (TileHaloRows): the tile pooled alone
  // with the halo rows as padding (-inf or 0) while the halo is in flight, then the
  // border rows again from strips of the real rows. Max pooling's argmax of a border row
  // points into its strip: saved for the halo rows' gradients, and re-based onto the tile
  // (-1 where the maximum is a halo row) in the tile's argmax.
  void forward_halo(ForwardCall& c) const {
    const Tensor& x = c.inputs[0];
    const double fill = kMax ? -std::numeric_limits<double>::infinity() : 0.0;
    HaloTransfer t = HaloTransfer::forward(c.ctx, name_, x, halo_.top, halo_.bottom, fill);
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    Tensor idx = kMax ? c.alloc(y.shape(), DType::i32) : Tensor();
    time_interior(c.ctx, "INTERIOR_F", [&] {
      if (kMax)
        kernels::maxpool2d_forward(x, tile_opt_, y, idx);
      else
        kernels::avgpool2d_forward(x, tile_opt_, y);
    });
    t.wait();
    if (kMax) c.saved.push_back(idx);
    halo_.forward_border(c, x, t, y, [&](size_t k, const Tensor& strip, Tensor& part) {
      if (!kMax) return kernels::avgpool2d_forward(strip, opt_, part);
      Tensor strip_idx = c.alloc(part.shape(), DType::i32);
      kernels::maxpool2d_forward(strip, opt_, part, strip_idx);
      Tensor tile_idx = c.alloc(part.shape(), DType::i32);
      const int64_t e0 = halo_.ext_rows(halo_.border[k]).first;
      kernels::maxpool2d_argmax_rows(strip_idx, in_[2], halo_.top - e0, halo_.h, tile_idx);
      idx.narrow(2, halo_.border[k].first, part.shape()[2]).copy_from(tile_idx);
      c.saved.push_back(strip_idx);
    });
    c.outputs[0] = y;
  }

  // The halo rows' gradients from the border rows of dy first, sent while the tile's
  // gradient is computed from every row of dy (average: the halo rows dropped as
  // padding; max: the re-based argmax skips maxima in the halo).
  void backward_input_halo(BackwardCall& c) const {
    const Tensor& dy = c.grad_outputs[0];
    Tensor d_above, d_below;
    halo_.halo_grads(dy, in_, c, d_above, d_below, [&](size_t k, const Tensor& dys, Tensor& dxs) {
      tile_backward(dys, kMax ? c.saved[1 + k] : Tensor(), opt_, dxs, false);
    });
    HaloTransfer t = HaloTransfer::backward(c.ctx, name_, d_above, d_below, halo_.tile(dy, in_),
                                            halo_.top, halo_.bottom);
    auto target = c.grad_inputs[0].target();
    time_interior(c.ctx, "INTERIOR_B", [&] {
      tile_backward(dy, kMax ? c.saved[0] : Tensor(), tile_opt_, target.tensor, target.accumulate);
    });
    t.wait();
    t.add_received(target.tensor);
  }

  kernels::Pool2dOptions opt_;
  kernels::Pool2dOptions tile_opt_;  // with a halo: the halo rows as padding
  Shape in_;
  int64_t window_ = 1;
  TileHaloRows halo_;
};

const OpSchema& global_avgpool_schema() {
  static const OpSchema s{
      "global_avgpool", {"x"}, {"y"}, {}, {}, "the mean of x [C, H, W] over H and W: y [C]"};
  return s;
}

class GlobalAvgPool final : public OpBase {
 public:
  explicit GlobalAvgPool(const OpSpec& spec) : OpBase(global_avgpool_schema(), spec) {
    expect_image(spec, 0);
    in_ = spec.inputs[0].shape;
    out_.push_back({{in_[0]}, dtype_, true});
  }

  void forward(ForwardCall& c) const override {
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::global_avgpool_forward(c.inputs[0], y);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    auto t = c.grad_inputs[0].target();
    kernels::global_avgpool_backward(c.grad_outputs[0], t.tensor, t.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    OpCost k;
    k.forward_flops = double(batch * numel_of(in_));
    k.backward_input_flops = k.forward_flops;
    return k;
  }

 private:
  Shape in_;
};

}  // namespace

void add_vision_ops(std::vector<OpType>& table) {
  table.push_back({conv2d_schema(), [](const OpSpec& s) { return std::make_unique<Conv2d>(s); }});
  table.push_back(
      {batchnorm_schema(), [](const OpSpec& s) { return std::make_unique<BatchNorm2d>(s); }});
  table.push_back(
      {maxpool_schema(), [](const OpSpec& s) { return std::make_unique<Pool2d<true>>(s); }});
  table.push_back(
      {avgpool_schema(), [](const OpSpec& s) { return std::make_unique<Pool2d<false>>(s); }});
  table.push_back({global_avgpool_schema(),
                   [](const OpSpec& s) { return std::make_unique<GlobalAvgPool>(s); }});
}

}  // namespace baton::stages::ops
