// f32 2-D convolutions through oneDNN (Debian's libdnnl, the library PyTorch's CPU
// convolutions use). Callers hold NCHW tensors; each primitive is created with
// format_tag::any so oneDNN picks its fastest layout (blocked nChw16c on AVX-512), and the
// arguments are reordered from and to NCHW around it when that layout differs.
//
// Creating a primitive costs far more than running a small one, so each (direction,
// geometry) is built once per thread and cached with its memory objects, reorders and
// accumulation scratch: a thread-local cache needs no locks, and memory objects whose data
// handles are swapped per call are not shared between threads. oneDNN runs on the same
// OpenMP runtime as baton's loops, with the thread count of kernels::set_num_threads.
#include <unordered_map>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vision_cpu.h"
#include "memory/error.h"

#ifdef BATON_HAVE_DNNL
#include <dnnl.hpp>
#endif

namespace baton::kernels::cpu {

#ifdef BATON_HAVE_DNNL

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

enum class Dir { forward, backward_data, backward_weights };

struct Key {
  Dir dir;
  ConvGeometry g;
  bool bias;
  bool operator==(const Key& k) const {
    const ConvGeometry& a = g;
    const ConvGeometry& b = k.g;
    return dir == k.dir && bias == k.bias && a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w &&
           a.o == b.o && a.kh == b.kh && a.kw == b.kw && a.oh == b.oh && a.ow == b.ow &&
           a.sh == b.sh && a.sw == b.sw && a.pt == b.pt && a.pb == b.pb && a.pl == b.pl &&
           a.pr == b.pr && a.dh == b.dh && a.dw == b.dw && a.groups == b.groups;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    const ConvGeometry& g = k.g;
    uint64_t h = uint64_t(k.dir) * 31 + uint64_t(k.bias);
    for (int64_t v : {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.pt, g.pb, g.pl,
                      g.pr, g.dh, g.dw, g.groups})
      h = (h ^ uint64_t(v)) * 0x100000001B3ull;
    return size_t(h);
  }
};

// One argument of a primitive: the caller's NCHW memory (its data handle set per call)
// and, when the primitive chose another layout, the primitive's own memory and the
// reorder between the two.
struct Arg {
  int id = 0;
  memory user, internal;
  bool reordered = false;
  dnnl::reorder reorder;  // user -> internal for inputs, internal -> user for outputs
};

struct Entry {
  dnnl::primitive prim;
  std::vector<Arg> ins, outs;
  std::unordered_map<int, memory> args;
  std::vector<std::vector<float>> scratch;  // per output, for accumulate = true
};

Arg make_arg(int id, const memory::desc& user_md, const memory::desc& chosen, bool output) {
  const auto& eng = cpu_engine();
  Arg a;
  a.id = id;
  a.user = memory(user_md, eng, DNNL_MEMORY_NONE);
  if (chosen == user_md) {
    a.internal = a.user;
  } else {
    a.internal = memory(chosen, eng);
    a.reordered = true;
    a.reorder = output ? dnnl::reorder(a.internal, a.user) : dnnl::reorder(a.user, a.internal);
  }
  return a;
}

memory::dims dims_of(std::initializer_list<int64_t> v) {
  return memory::dims(v.begin(), v.end());
}

memory::desc src_md(const ConvGeometry& g, Tag t = Tag::nchw) {
  return memory::desc(dims_of({g.n, g.c, g.h, g.w}), kF32, t);
}
memory::desc dst_md(const ConvGeometry& g, Tag t = Tag::nchw) {
  return memory::desc(dims_of({g.n, g.o, g.oh, g.ow}), kF32, t);
}
memory::desc weights_md(const ConvGeometry& g, bool any = false) {
  if (g.groups == 1)
    return memory::desc(dims_of({g.o, g.c, g.kh, g.kw}), kF32, any ? Tag::any : Tag::oihw);
  return memory::desc(dims_of({g.groups, g.o / g.groups, g.c / g.groups, g.kh, g.kw}), kF32,
                      any ? Tag::any : Tag::goihw);
}
memory::desc bias_md(const ConvGeometry& g) {
  return memory::desc(dims_of({g.o}), kF32, Tag::x);
}

struct ConvParams {
  memory::dims strides, dilates, pad_l, pad_r;
};
ConvParams params_of(const ConvGeometry& g) {
  // oneDNN counts dilation from 0 (no gaps).
  return {dims_of({g.sh, g.sw}), dims_of({g.dh - 1, g.dw - 1}), dims_of({g.pt, g.pl}),
          dims_of({g.pb, g.pr})};
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvGeometry& g, bool bias) {
  const ConvParams p = params_of(g);
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto prop = dnnl::prop_kind::forward_training;
  auto d = bias ? dnnl::convolution_forward::desc(
                      prop, algo, src_md(g, Tag::any), weights_md(g, true), bias_md(g),
                      dst_md(g, Tag::any), p.strides, p.dilates, p.pad_l, p.pad_r)
                : dnnl::convolution_forward::desc(prop, algo, src_md(g, Tag::any),
                                                  weights_md(g, true), dst_md(g, Tag::any),
                                                  p.strides, p.dilates, p.pad_l, p.pad_r);
  return dnnl::convolution_forward::primitive_desc(d, cpu_engine());
}

Entry build(const Key& k) {
  const ConvGeometry& g = k.g;
  const ConvParams p = params_of(g);
  const auto algo = dnnl::algorithm::convolution_direct;
  Entry e;
  auto fwd = forward_pd(g, k.bias);
  if (k.dir == Dir::forward) {
    e.prim = dnnl::convolution_forward(fwd);
    e.ins.push_back(make_arg(DNNL_ARG_SRC, src_md(g), fwd.src_desc(), false));
    e.ins.push_back(make_arg(DNNL_ARG_WEIGHTS, weights_md(g), fwd.weights_desc(), false));
    if (k.bias) e.ins.push_back(make_arg(DNNL_ARG_BIAS, bias_md(g), fwd.bias_desc(), false));
    e.outs.push_back(make_arg(DNNL_ARG_DST, dst_md(g), fwd.dst_desc(), true));
  } else if (k.dir == Dir::backward_data) {
    dnnl::convolution_backward_data::desc d(algo, src_md(g, Tag::any), weights_md(g, true),
                                            dst_md(g, Tag::any), p.strides, p.dilates, p.pad_l,
                                            p.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, cpu_engine(), fwd);
    e.prim = dnnl::convolution_backward_data(pd);
    e.ins.push_back(make_arg(DNNL_ARG_DIFF_DST, dst_md(g), pd.diff_dst_desc(), false));
    e.ins.push_back(make_arg(DNNL_ARG_WEIGHTS, weights_md(g), pd.weights_desc(), false));
    e.outs.push_back(make_arg(DNNL_ARG_DIFF_SRC, src_md(g), pd.diff_src_desc(), true));
  } else {
    auto d = k.bias ? dnnl::convolution_backward_weights::desc(
                          algo, src_md(g, Tag::any), weights_md(g, true), bias_md(g),
                          dst_md(g, Tag::any), p.strides, p.dilates, p.pad_l, p.pad_r)
                    : dnnl::convolution_backward_weights::desc(
                          algo, src_md(g, Tag::any), weights_md(g, true), dst_md(g, Tag::any),
                          p.strides, p.dilates, p.pad_l, p.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, cpu_engine(), fwd);
    e.prim = dnnl::convolution_backward_weights(pd);
    e.ins.push_back(make_arg(DNNL_ARG_SRC, src_md(g), pd.src_desc(), false));
    e.ins.push_back(make_arg(DNNL_ARG_DIFF_DST, dst_md(g), pd.diff_dst_desc(), false));
    e.outs.push_back(make_arg(DNNL_ARG_DIFF_WEIGHTS, weights_md(g), pd.diff_weights_desc(), true));
    if (k.bias)
      e.outs.push_back(make_arg(DNNL_ARG_DIFF_BIAS, bias_md(g), pd.diff_bias_desc(), true));
  }
  for (const Arg& a : e.ins) e.args[a.id] = a.internal;
  for (const Arg& a : e.outs) e.args[a.id] = a.internal;
  e.scratch.resize(e.outs.size());
  return e;
}

// Geometries a run uses are few (one per conv layer and micro-batch size); a cache grown
// past this is cleared rather than grown without bound.
constexpr size_t kMaxEntries = 512;

Entry& entry_for(const Key& k) {
  thread_local std::unordered_map<Key, Entry, KeyHash> cache;
  auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxEntries) cache.clear();
  return cache.emplace(k, build(k)).first->second;
}

// Runs the primitive of `k` on the caller's buffers: `ins` and `outs` (pointer, elements)
// in the order build() listed them. accumulate adds into the outputs.
void run(const char* op, const Key& k, std::initializer_list<const float*> ins,
         std::initializer_list<std::pair<float*, int64_t>> outs, bool accumulate) {
  try {
    sync_blas_threads();  // oneDNN reads the calling thread's OpenMP thread count
    Entry& e = entry_for(k);
    thread_local dnnl::stream stream(cpu_engine());
    size_t i = 0;
    for (const float* p : ins) {
      Arg& a = e.ins[i++];
      a.user.set_data_handle(const_cast<float*>(p));
      if (a.reordered) a.reorder.execute(stream, a.user, a.internal);
    }
    // Where each output lands in NCHW: the caller's buffer, or scratch to add from.
    std::vector<float*> land;
    i = 0;
    for (auto [p, n] : outs) {
      float* t = p;
      if (accumulate) {
        e.scratch[i].resize(size_t(n));
        t = e.scratch[i].data();
      }
      // Without a reorder the primitive writes the NCHW memory itself (user == internal).
      e.outs[i].user.set_data_handle(t);
      land.push_back(t);
      ++i;
    }
    e.prim.execute(stream, e.args);
    for (Arg& a : e.outs)
      if (a.reordered) a.reorder.execute(stream, a.internal, a.user);
    stream.wait();
    if (!accumulate) return;
    i = 0;
    for (auto [out, n] : outs) {
      float* p = out;  // clang 14: a lambda cannot capture a structured binding
      const float* t = land[i++];
      parallel_for(n, kElementwiseGrain, [&](int64_t s, int64_t u) {
        for (int64_t j = s; j < u; ++j) p[j] += t[j];
      });
    }
  } catch (const dnnl::error& err) {
    throw RuntimeError(std::string("kernels::") + op + ": oneDNN failed: " + err.what());
  }
}

}  // namespace

bool have_onednn() {
  return true;
}

void conv2d_forward_onednn(const float* x, const float* w, const float* bias, float* y,
                           const ConvGeometry& g) {
  Key k{Dir::forward, g, bias != nullptr};
  if (bias != nullptr)
    run("conv2d_forward", k, {x, w, bias}, {{y, g.n * g.o * g.oh * g.ow}}, false);
  else
    run("conv2d_forward", k, {x, w}, {{y, g.n * g.o * g.oh * g.ow}}, false);
}

void conv2d_backward_input_onednn(const float* dy, const float* w, float* dx, const ConvGeometry& g,
                                  bool accumulate) {
  run("conv2d_backward_input", Key{Dir::backward_data, g, false}, {dy, w},
      {{dx, g.n * g.c * g.h * g.w}}, accumulate);
}

void conv2d_backward_weight_onednn(const float* dy, const float* x, float* dw, float* dbias,
                                   const ConvGeometry& g, bool accumulate) {
  Key k{Dir::backward_weights, g, dbias != nullptr};
  const int64_t wn = g.o * (g.c / g.groups) * g.kh * g.kw;
  if (dbias != nullptr)
    run("conv2d_backward_weight", k, {x, dy}, {{dw, wn}, {dbias, g.o}}, accumulate);
  else
    run("conv2d_backward_weight", k, {x, dy}, {{dw, wn}}, accumulate);
}

#else  // no oneDNN (the GPU-check build): f32 on the reference loops

bool have_onednn() {
  return false;
}

void conv2d_forward_onednn(const float* x, const float* w, const float* bias, float* y,
                           const ConvGeometry& g) {
  conv2d_forward_ref<float>(x, w, bias, y, g);
}
void conv2d_backward_input_onednn(const float* dy, const float* w, float* dx, const ConvGeometry& g,
                                  bool accumulate) {
  conv2d_backward_input_ref<float>(dy, w, dx, g, accumulate);
}
void conv2d_backward_weight_onednn(const float* dy, const float* x, float* dw, float* dbias,
                                   const ConvGeometry& g, bool accumulate) {
  conv2d_backward_weight_ref<float>(dy, x, dw, dbias, g, accumulate);
}

#endif

}  // namespace baton::kernels::cpu
