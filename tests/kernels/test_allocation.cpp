// Kernels allocate nothing in the steady state: after a first call (which may size
// thread-local scratch), calling every op again makes no C++ heap allocation. Counted by
// replacing the global operator new of this test program.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "kernels/fused.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};

void* counted_alloc(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) {
  return counted_alloc(n);
}
void* operator new[](std::size_t n) {
  return counted_alloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

namespace baton::kernels::test {
namespace {

TEST(Allocation, SteadyStateCallsAllocateNothing) {
  std::mt19937_64 rng(test_seed(101));
  const int before = num_threads();
  set_num_threads(1);
  const DType f = DType::f32;
  const int64_t B = 2, T = 70, H = 2, D = 32, C = H * D, V = 50, N = B * T;
  const Tensor x = randn({B, T, C}, rng, 1.0, f), w = randn({C, 3 * C}, rng, 0.1, f),
               bias = randn({3 * C}, rng, 1.0, f), g3 = randn({B, T, 3 * C}, rng, 1.0, f),
               lw = randn({C}, rng, 1.0, f), lb = randn({C}, rng, 1.0, f),
               gC = randn({B, T, C}, rng, 1.0, f), logits = randn({N, V}, rng, 1.0, f),
               table = randn({V, C}, rng, 1.0, f);
  const Tensor ids = Tensor::from_vector(std::vector<int32_t>(size_t(N), 7), {B, T});
  Tensor qkv = Tensor::empty({B, T, 3 * C}, f), dqkv = Tensor::empty(qkv.shape(), f),
         dx = Tensor::empty(x.shape(), f), dw = Tensor::empty(w.shape(), f),
         db = Tensor::empty(bias.shape(), f), out = Tensor::empty({B, T, C}, f),
         lse = Tensor::empty({B, H, T}, f), y = Tensor::empty({B, T, C}, f),
         mean = Tensor::empty({B, T}, f), rstd = Tensor::empty({B, T}, f),
         dlw = Tensor::empty({C}, f), dlb = Tensor::empty({C}, f), sm = Tensor::empty({N, V}, f),
         mx = Tensor::empty({N}, f), se = Tensor::empty({N}, f), tl = Tensor::empty({N}, f),
         losses = Tensor::empty({N}, f), dl = Tensor::empty({N, V}, f),
         emb = Tensor::empty({B, T, C}, f), dtable = Tensor::zeros({V, C}, f), p = w.clone(),
         m = Tensor::zeros(w.shape(), f), v = Tensor::zeros(w.shape(), f),
         blk = Tensor::empty({B, 5, C}, f), mm = Tensor::empty({3 * C, 3 * C}, f);
  AttentionOptions o;
  o.heads = H;
  o.dropout = 0.1;
  const Block block{{B, T, C}, {0, 3, 0}};
  Sgd sgd;
  sgd.momentum = 0.9;
  const Tensor xb = x.narrow(1, 3, 5).contiguous(), flat_ids = ids.view({N});
  auto all_ops = [&] {
    linear_forward(x, w, bias, WeightLayout::in_out, qkv);
    linear_backward_input(g3, w, WeightLayout::in_out, dx, false);
    linear_backward_weight(g3, x, WeightLayout::in_out, dw, db, true);
    matmul(w, true, w, false, mm);
    attention_forward(qkv, o, out, lse);
    attention_backward(qkv, out, lse, gC, o, dqkv, false);
    add(x, gC, y);
    add_inplace(y, x);
    scale_inplace(y, 0.5);
    bias_add_inplace(qkv, bias);
    bias_backward(g3, db, true);
    gelu_forward(x, y);
    gelu_backward(x, gC, y, true);
    relu_forward(x, y);
    relu_backward(x, gC, y, false);
    dropout_forward(x, y, 0.1, 1, 2, {});
    dropout_backward(gC, y, 0.1, 1, 2, {}, true);
    dropout_forward(xb, blk, 0.1, 1, 2, block);
    layernorm_forward(x, lw, lb, 1e-5, y, mean, rstd);
    layernorm_backward_input(gC, x, lw, mean, rstd, dx, false);
    layernorm_backward_weight(gC, x, mean, rstd, dlw, dlb, false);
    softmax_forward(logits, sm);
    softmax_backward(sm, logits, dl, false);
    ce_row_max(logits, mx);
    ce_sum_exp(logits, flat_ids, 0, mx, se, tl);
    ce_finish(logits, flat_ids, 0, mx, se, tl, 1.0 / double(N), losses, dl);
    cross_entropy_forward(logits, flat_ids, 1.0 / double(N), losses, dl);
    embedding_forward(ids, table, 0, emb, false);
    embedding_backward(ids, gC, 0, dtable);
    random_normal(p, 0, 0.02, 3, stream_of("w"), {});
    adamw_step(p, dw, m, v, AdamW{}, 1, 1.0);
    sgd_step(p, dw, m, sgd, 1.0);
    (void)sum_squares(dw);
  };
  all_ops();  // sizes thread-local scratch
  // The counter counts (a vector allocated while counting is seen).
  g_allocations = 0;
  g_counting = true;
  { std::vector<int> probe(3); }
  g_counting = false;
  ASSERT_EQ(g_allocations.load(), 1);
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 3; ++i) all_ops();
  g_counting = false;
  set_num_threads(before);
  EXPECT_EQ(g_allocations.load(), 0);
}

}  // namespace
}  // namespace baton::kernels::test
