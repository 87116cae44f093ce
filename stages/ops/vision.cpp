// The ops of convolutional networks on per-sample [C, H, W] images (NCHW with the batch):
// conv2d, batchnorm2d (batch statistics while training, running statistics in evaluation,
// the running statistics kept as non-trainable parameters the op updates), maxpool2d,
// avgpool2d and global_avgpool. The residual network's other ops are add, relu, linear.
#include "kernels/vision.h"

#include <array>
#include <cmath>

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
    if (auto a = spec.attrs.get("halo")) {
      if (!a->is_array() || a->size() != 2)
        a->fail("a pair [top, bottom] of halo row counts", json_brief(a->raw()));
      top_ = a->at(size_t(0)).as_int(0, x[1]);
      bottom_ = a->at(size_t(1)).as_int(0, x[1]);
      if (pad[0] != 0)
        spec.attrs.at("padding").fail(
            "no padding along the height with a halo (the halo rows are the padding)",
            std::to_string(pad[0]));
    }
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
    const int64_t oh =
        kernels::conv_output_size(x[1] + top_ + bottom_, w[2], stride[0], pad[0], pad[0], dil[0]);
    const int64_t ow = kernels::conv_output_size(x[2], w[3], stride[1], pad[1], pad[1], dil[1]);
    if (oh < 1 || ow < 1)
      input_json(spec, 0).fail(
          "an image the kernel " + std::to_string(w[2]) + "x" + std::to_string(w[3]) +
              " (dilation " + std::to_string(dil[0]) + "x" + std::to_string(dil[1]) + ", padding " +
              std::to_string(pad[0]) + "x" + std::to_string(pad[1]) + ") fits in",
          type_str(spec.inputs[0]));
    in_ = x;
    out_.push_back({{o_, oh, ow}, dtype_, true});
    if (top_ + bottom_ > 0) plan_halo(x[1], w[2], stride[0], dil[0], oh);
  }

  bool saves_input(size_t) const override { return true; }
  bool weight_needs_input(size_t) const override { return true; }
  bool weight_needs_grad_outputs() const override { return true; }
  bool weight_needs_saved() const override { return top_ + bottom_ > 0; }

  void forward(ForwardCall& c) const override {
    if (top_ + bottom_ > 0) return forward_halo(c);
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    kernels::conv2d_forward(c.inputs[0], c.params[0], c.params[1], opt_, y);
    c.outputs[0] = y;
  }

  void backward_input(BackwardCall& c) const override {
    if (!c.grad_inputs[0].needed() || !c.grad_outputs[0].defined()) return;
    if (top_ + bottom_ > 0) return backward_input_halo(c);
    auto t = c.grad_inputs[0].target();
    kernels::conv2d_backward_input(c.grad_outputs[0], c.params[0], opt_, t.tensor, t.accumulate);
  }

  void backward_weight(WeightCall& c) const override {
    if (!c.grad_outputs[0].defined()) return;
    ParamGrad& gw = c.grad_params[0];
    ParamGrad& gb = c.grad_params[1];
    Tensor none;
    // With a halo: the tile with zero halo rows first (tile_opt_), then the halo rows' part.
    const kernels::Conv2dOptions& o = top_ + bottom_ > 0 ? tile_opt_ : opt_;
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
    if (top_ + bottom_ > 0) {
      // The saved halo rows, and their messages (as halo_exchange's).
      const int64_t row = batch * in_[0] * in_[2];
      k.extra_saved_bytes = (top_ > 0 ? alloc_bytes(row * top_, dtype_) : 0) +
                            (bottom_ > 0 ? alloc_bytes(row * bottom_, dtype_) : 0);
      k.forward_comm_bytes = row * (top_ + bottom_) * dsize(dtype_);
      k.backward_comm_bytes = k.forward_comm_bytes;
    }
    return k;
  }

 private:
  // ---- the spatial split's fused halo (stages/ops/halo.h, docs/partitioner.md) ----
  // Rows of the extended tile: [0, top) the halo from above, [top, top + h) the tile,
  // [top + h, top + h + bottom) the halo from below. Output row i reads extended rows
  // [i s, i s + d (k - 1)]. Rows [0, top_end_) read the top halo, rows [bottom_begin_,
  // oh) the bottom halo (the two may overlap: a tile of one row), the rows between read
  // the tile alone (the interior). `border_` is those ranges, merged when they overlap.
  void plan_halo(int64_t h, int64_t kh, int64_t stride, int64_t dil, int64_t oh) {
    tile_opt_ = opt_;
    tile_opt_.pad_top = top_;
    tile_opt_.pad_bottom = bottom_;
    h_ = h;
    stride_ = stride;
    extent_ = dil * (kh - 1);
    const int64_t top_end = std::min(oh, (top_ + stride - 1) / stride);
    const int64_t last =
        top_ + h - 1 - extent_;  // the last extended row a tile-only window starts at
    const int64_t bottom_begin = bottom_ == 0 ? oh : last < 0 ? 0 : std::min(oh, last / stride + 1);
    if (bottom_begin <= top_end) {
      border_.push_back({0, oh});
    } else {
      if (top_end > 0) border_.push_back({0, top_end});
      if (bottom_begin < oh) border_.push_back({bottom_begin, oh});
    }
  }

  // Output rows [first, last)'s extended input rows.
  std::pair<int64_t, int64_t> ext_rows(std::pair<int64_t, int64_t> out) const {
    return {out.first * stride_, (out.second - 1) * stride_ + extent_ + 1};
  }

  // Extended rows [e0, e1) of the tile x with its halos as one tensor; halo_only: the
  // tile's rows zero (what the zero-padded tile left out).
  Tensor gather_rows(const Tensor& x, const Tensor& above, const Tensor& below, int64_t e0,
                     int64_t e1, bool halo_only) const {
    Shape s = x.shape();
    s[2] = e1 - e0;
    Tensor out =
        halo_only ? Tensor::zeros(s, dtype_, x.device()) : Tensor::empty(s, dtype_, x.device());
    auto put = [&](const Tensor& src, int64_t first) {  // src holds extended rows from `first`
      const int64_t lo = std::max(e0, first), hi = std::min(e1, first + src.shape()[2]);
      if (lo < hi) out.narrow(2, lo - e0, hi - lo).copy_from(src.narrow(2, lo - first, hi - lo));
    };
    if (top_ > 0) put(above, 0);
    if (!halo_only) put(x, top_);
    if (bottom_ > 0) put(below, top_ + h_);
    return out;
  }

  // Posts the halos, computes every output row with zero halo rows (exact for the
  // interior) while they are in flight, then the border rows again from the halos.
  void forward_halo(ForwardCall& c) const {
    const Tensor& x = c.inputs[0];
    HaloTransfer t = HaloTransfer::forward(c.ctx, name_, x, top_, bottom_, 0.0);
    Tensor y = c.alloc(batched(c.ctx, out_[0].shape), dtype_);
    SpatialTracer* tracer = spatial_tracer(c.ctx);
    const double t0 = tracer != nullptr ? tracer->now() : 0.0;
    kernels::conv2d_forward(x, c.params[0], c.params[1], tile_opt_, y);
    if (tracer != nullptr) tracer->record("INTERIOR_F", c.ctx.mb.index, t0, tracer->now());
    t.wait();
    for (const auto& rows : border_) {
      const auto [e0, e1] = ext_rows(rows);
      Tensor strip = gather_rows(x, t.above, t.below, e0, e1, false);
      Shape s = y.shape();
      s[2] = rows.second - rows.first;
      Tensor part = c.alloc(s, dtype_);
      kernels::conv2d_forward(strip, c.params[0], c.params[1], opt_, part);
      y.narrow(2, rows.first, s[2]).copy_from(part);
    }
    if (top_ > 0) c.saved.push_back(t.above);
    if (bottom_ > 0) c.saved.push_back(t.below);
    c.outputs[0] = y;
  }

  // The halo rows' gradients first (from the border rows of dy, small), sent while the
  // tile's gradient is computed (every row of dy, the halo rows dropped as padding); the
  // neighbours' gradients for this tile's rows added when they are there.
  void backward_input_halo(BackwardCall& c) const {
    const Tensor& dy = c.grad_outputs[0];
    Tensor d_above, d_below;
    for (const auto& rows : border_) {
      const auto [e0, e1] = ext_rows(rows);
      Shape s = dy.shape();
      s[2] = rows.second - rows.first;
      Tensor dys = dy.narrow(2, rows.first, s[2]).contiguous();
      Shape xs = dy.shape();
      xs[1] = in_[0];
      xs[2] = e1 - e0;
      xs[3] = in_[2];
      Tensor dxs = c.alloc(xs, dtype_);
      kernels::conv2d_backward_input(dys, c.params[0], opt_, dxs, false);
      if (top_ > 0 && e0 == 0) d_above = dxs.narrow(2, 0, top_);
      if (bottom_ > 0 && e1 == top_ + h_ + bottom_)
        d_below = dxs.narrow(2, top_ + h_ - e0, bottom_);
    }
    Shape tile = dy.shape();
    tile[1] = in_[0];
    tile[2] = h_;
    tile[3] = in_[2];
    HaloTransfer t = HaloTransfer::backward(c.ctx, name_, d_above, d_below, tile, top_, bottom_);
    auto target = c.grad_inputs[0].target();
    SpatialTracer* tracer = spatial_tracer(c.ctx);
    const double t0 = tracer != nullptr ? tracer->now() : 0.0;
    kernels::conv2d_backward_input(dy, c.params[0], tile_opt_, target.tensor, target.accumulate);
    if (tracer != nullptr) tracer->record("INTERIOR_B", c.ctx.mb.index, t0, tracer->now());
    t.wait();
    t.add_received(target.tensor);
  }

  // The weight gradient's part from the halo rows (the zero-padded tile's left them out):
  // the border rows of dy against their windows with the tile's rows zero.
  void weight_halo_part(WeightCall& c, Tensor& gw) const {
    if (top_ + bottom_ == 0) return;
    const Tensor above = top_ > 0 ? c.saved[0] : Tensor();
    const Tensor below = bottom_ > 0 ? c.saved[top_ > 0 ? 1 : 0] : Tensor();
    Tensor none;
    for (const auto& rows : border_) {
      const auto [e0, e1] = ext_rows(rows);
      Tensor strip = gather_rows(c.inputs[0], above, below, e0, e1, true);
      Tensor dys = c.grad_outputs[0].narrow(2, rows.first, rows.second - rows.first).contiguous();
      kernels::conv2d_backward_weight(dys, strip, opt_, gw, none, true);
    }
  }

  kernels::Conv2dOptions opt_;
  kernels::Conv2dOptions tile_opt_;  // with a halo: the halo rows as zero padding
  Shape in_;
  int64_t o_ = 0, c_ = 0, k_ = 0;
  bool has_bias_ = false;
  int64_t top_ = 0, bottom_ = 0, h_ = 0, stride_ = 1, extent_ = 0;
  std::vector<std::pair<int64_t, int64_t>> border_;  // output row ranges that read a halo
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
          .fail("running_mean and running_var together (or neither)");
    elems_ = numel_of(spec.inputs[0].shape);
    out_.push_back(spec.inputs[0]);
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
      const double count = double(g.size()) * double(c.ctx.batch()) * double(elems_ / c_);
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
    const double m = double(c.ctx.batch()) * double(elems_ / c_);
    const double total = m * double(g.size());
    Tensor none1, none2;
    kernels::batchnorm_forward_train(c.inputs[0], c.params[0], c.params[1], eps_, 0.0, y, mean,
                                     rstd, none1, none2);
    const std::vector<double> mu_l = mean.to(DType::f64).to_vector<double>();
    const std::vector<double> rs_l = rstd.to(DType::f64).to_vector<double>();
    const size_t nc = static_cast<size_t>(c_);
    std::vector<double> mu(nc), var(nc);
    for (size_t k = 0; k < size_t(c_); ++k) mu[k] = mu_l[k] / double(g.size());
    Tensor sum = Tensor::from_vector(mu, {c_});
    g.all_reduce(sum, transport::ReduceOp::sum)->wait();
    mu = sum.to_vector<double>();
    for (size_t k = 0; k < size_t(c_); ++k) {
      const double v_l = 1.0 / (rs_l[k] * rs_l[k]) - eps_, d = mu_l[k] - mu[k];
      var[k] = (v_l + d * d) / double(g.size());
    }
    Tensor sq = Tensor::from_vector(var, {c_});
    g.all_reduce(sq, transport::ReduceOp::sum)->wait();
    var = sq.to_vector<double>();
    std::vector<double> rs(nc);
    for (size_t k = 0; k < size_t(c_); ++k) rs[k] = 1.0 / std::sqrt(var[k] + eps_);
    mean.copy_from(Tensor::from_vector(mu, {c_}).to(dtype_));
    rstd.copy_from(Tensor::from_vector(rs, {c_}).to(dtype_));
    Tensor var_t = Tensor::from_vector(var, {c_}).to(dtype_);
    kernels::batchnorm_forward_eval(c.inputs[0], c.params[0], c.params[1], mean, var_t, eps_, y);
    if (rm.defined()) {
      // torch's update with the unbiased variance of the whole image batch.
      std::vector<double> a = rm.to(DType::f64).to_vector<double>();
      std::vector<double> b = rv.to(DType::f64).to_vector<double>();
      for (size_t k = 0; k < size_t(c_); ++k) {
        a[k] = (1 - momentum_) * a[k] + momentum_ * mu[k];
        b[k] = (1 - momentum_) * b[k] + momentum_ * var[k] * total / (total - 1);
      }
      rm.copy_from(Tensor::from_vector(a, {c_}).to(dtype_));
      rv.copy_from(Tensor::from_vector(b, {c_}).to(dtype_));
    }
    c.outputs[0] = y;
    c.saved.push_back(mean);
    c.saved.push_back(rstd);
  }

  double eps_ = 1e-5, momentum_ = 0.1;
  int64_t c_ = 0, elems_ = 0;
  bool running_ = false, spatial_ = false;
};

// ---- pooling ----

const OpSchema& maxpool_schema() {
  static const OpSchema s{"maxpool2d",
                          {"x"},
                          {"y"},
                          {},
                          {"kernel", "stride", "padding"},
                          "max pooling of x [C, H, W]; kernel (required), stride (default: "
                          "the kernel), padding (0, counts as -inf): an integer or [h, w]"};
  return s;
}
const OpSchema& avgpool_schema() {
  static const OpSchema s{"avgpool2d",
                          {"x"},
                          {"y"},
                          {},
                          {"kernel", "stride", "padding", "count_include_pad"},
                          "average pooling of x [C, H, W]; kernel (required), stride (default: "
                          "the kernel), padding (0); count_include_pad (true) divides by the "
                          "whole window as torch does"};
  return s;
}

template <bool kMax>
class Pool2d final : public OpBase {
 public:
  explicit Pool2d(const OpSpec& spec) : OpBase(kMax ? maxpool_schema() : avgpool_schema(), spec) {
    expect_image(spec, 0);
    if (!spec.attrs.has("kernel")) spec.attrs.fail("an object with \"kernel\"");
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
    const int64_t oh = kernels::conv_output_size(x[1], k[0], s[0], p[0], p[0], 1);
    const int64_t ow = kernels::conv_output_size(x[2], k[1], s[1], p[1], p[1], 1);
    if (oh < 1 || ow < 1)
      input_json(spec, 0).fail(
          "an image a window of " + std::to_string(k[0]) + "x" + std::to_string(k[1]) + " fits in",
          type_str(spec.inputs[0]));
    out_.push_back({{x[0], oh, ow}, dtype_, true});
    in_ = x;
    window_ = k[0] * k[1];
  }

  void forward(ForwardCall& c) const override {
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
    auto t = c.grad_inputs[0].target();
    if (kMax)
      kernels::maxpool2d_backward(c.grad_outputs[0], c.saved[0], t.tensor, t.accumulate);
    else
      kernels::avgpool2d_backward(c.grad_outputs[0], opt_, t.tensor, t.accumulate);
  }

  OpCost cost(int64_t batch) const override {
    const double outs = double(batch * numel_of(out_[0].shape));
    OpCost k;
    k.forward_flops = outs * double(window_);
    k.backward_input_flops = kMax ? outs : outs * double(window_);
    if (kMax) k.extra_saved_bytes = alloc_bytes(batch * numel_of(out_[0].shape), DType::i32);
    return k;
  }

 private:
  kernels::Pool2dOptions opt_;
  Shape in_;
  int64_t window_ = 1;
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
