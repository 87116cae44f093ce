// Helpers shared by the stages tests: tiny models, random inputs, finite differences.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "stages/model.h"
#include "stages/shorthands.h"
#include "stages/stage.h"

namespace baton::stages::testing {

inline std::shared_ptr<Graph> tiny_gpt(DType dtype, int64_t n_layer = 2, int64_t n_head = 2,
                                       int64_t n_embd = 8, int64_t context = 5, int64_t vocab = 11,
                                       double pdrop = 0.0) {
  Gpt2Config c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.n_positions = context + 2;
  c.context = context;
  c.vocab_size = vocab;
  c.embd_pdrop = c.resid_pdrop = c.attn_pdrop = pdrop;
  LoadOptions opt;
  opt.float_dtype = dtype;
  return std::make_shared<Graph>(load_model_json(c.to_json(), "tiny-gpt", opt));
}

// A JSON array of equal-length rows of integers (a fixture's token ids) as an i32 tensor
// [rows, columns].
inline Tensor int_rows(const nlohmann::json& rows) {
  std::vector<int32_t> v;
  for (const auto& r : rows)
    for (const auto& x : r) v.push_back(x.get<int32_t>());
  return Tensor::from_vector(v, {int64_t(rows.size()), int64_t(rows[0].size())});
}

// Token ids in [0, vocab) for `samples` samples of `t` tokens, from a printed seed.
inline Tensor random_tokens(int64_t samples, int64_t t, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(size_t(samples * t));
  for (auto& x : v) x = int32_t(rng() % uint64_t(vocab));
  return Tensor::from_vector(v, {samples, t});
}

inline Tensor random_like(const memory::Shape& shape, DType dtype, double std, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  kernels::random_normal(t, 0.0, std, seed, 7, kernels::Block{});
  return t;
}

// Rows [first, first + n) of a [B, ...] tensor, as a new contiguous tensor.
inline Tensor rows(const Tensor& t, int64_t first, int64_t n) {
  return t.narrow(0, first, n).clone();
}

inline double value_of(const Tensor& scalar) {
  return scalar.to(DType::f64).to_vector<double>()[0];
}

// One micro-batch's gradients into `st` (finished), and the loss at the current
// parameters as a function: what a finite-difference check compares them with.
inline std::function<double()> gradients_and_loss(Stage& st, const MicroBatch& mb,
                                                  const TensorMap& inputs) {
  st.zero_grad();
  st.forward(mb, inputs);
  st.backward(mb.index);
  st.finish_grads();
  return [&st, mb, inputs] {
    TensorMap out = st.forward(mb, inputs, true);
    st.discard(mb.index);
    return value_of(out.at("loss"));
  };
}

}  // namespace baton::stages::testing

namespace baton::stages::testing {
// These tests run tiny models: one thread is faster than a parallel region per tiny op,
// and CI runs two test programs at once on two cores.
inline const bool kOneThread = (kernels::set_num_threads(1), true);
}  // namespace baton::stages::testing
