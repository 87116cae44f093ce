// Embedding (vocabulary-split lookups summed over splits, backward) and softmax
// cross-entropy (finite differences, vocabulary split composed by hand, ignored rows,
// in-place gradient; the one-call single-device form and the one-read vocabulary-parallel
// form against the three steps).
#include <gtest/gtest.h>

#include <limits>

#include "kernels/fused.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace baton::kernels::test {
namespace {

Tensor ids_tensor(const std::vector<int64_t>& v, const Shape& shape, DType dt) {
  return Tensor::from_vector(v, shape).to(dt);
}

class EmbeddingTest : public ::testing::TestWithParam<DType> {};

TEST_P(EmbeddingTest, SplitLookupsSumToTheWholeAndBackwardScatters) {
  std::mt19937_64 rng(test_seed(71));
  const int64_t V = 11, C = 6;
  std::vector<int64_t> idv{3, 0, 10, 3, 7, 3, 5, 10};
  const Tensor ids = ids_tensor(idv, {2, 4}, GetParam());
  Tensor table = randn({V, C}, rng);
  Tensor whole = Tensor::full({2, 4, C}, std::nan(""), DType::f64);
  embedding_forward(ids, table, 0, whole, false);
  const auto tv = as_f64(table), wv = as_f64(whole);
  for (size_t n = 0; n < idv.size(); ++n)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(wv[n * C + size_t(c)], tv[size_t(idv[n] * C + c)]);

  // Three vocabulary slices [0, 4), [4, 9), [9, 11): the first overwrites (zeros for ids
  // it does not hold), the others accumulate.
  Tensor sum = Tensor::full({2, 4, C}, std::nan(""), DType::f64);
  const std::vector<std::pair<int64_t, int64_t>> slices{{0, 4}, {4, 5}, {9, 2}};
  for (size_t s = 0; s < slices.size(); ++s) {
    const auto [off, rows] = slices[s];
    embedding_forward(ids, table.narrow(0, off, rows).contiguous(), off, sum, s > 0);
  }
  EXPECT_EQ(as_f64(sum), as_f64(whole));

  // Backward: repeated ids add up; each slice gets exactly its rows of the whole.
  const Tensor g = randn(whole.shape(), rng);
  Tensor dtable = Tensor::zeros({V, C}, DType::f64);
  embedding_backward(ids, g, 0, dtable);
  auto loss = [&] {
    Tensor o = Tensor::empty(whole.shape(), DType::f64);
    embedding_forward(ids, table, 0, o, false);
    return dot(g, o);
  };
  EXPECT_LT(fd_check(table, dtable, loss, rng), 1e-6);
  for (const auto& [off, rows] : slices) {
    Tensor part = Tensor::full({rows, C}, 1.0, DType::f64);  // always accumulates
    embedding_backward(ids, g, off, part);
    auto want = as_f64(dtable.narrow(0, off, rows));
    for (double& v : want) v += 1;
    EXPECT_LT(rel_error(as_f64(part), want), 1e-15);
  }
  Tensor d32 = Tensor::zeros({V, C}, DType::f32);
  embedding_backward(ids, g.to(DType::f32), 0, d32);
  EXPECT_LT(rel_error(d32, dtable), 1e-6);
}

// padding_idx, as torch's nn.Embedding: the positions holding that id add nothing to the
// table (its row keeps what it held: a tied head's gradient), the others add as without it.
// The id is global, so each vocabulary slice skips it when it holds that row, and the
// slices still make up the whole.
TEST_P(EmbeddingTest, BackwardSkipsThePaddingId) {
  std::mt19937_64 rng(test_seed(72));
  const int64_t V = 11, C = 5, pad = 3;
  std::vector<int64_t> idv{3, 0, 10, 3, 7, 3, 5, 10};
  const Tensor ids = ids_tensor(idv, {2, 4}, GetParam());
  const Tensor g = randn({2, 4, C}, rng);
  Tensor plain = Tensor::zeros({V, C}, DType::f64);
  embedding_backward(ids, g, 0, plain);
  Tensor padded = Tensor::full({V, C}, 0.5, DType::f64);  // always accumulates
  embedding_backward(ids, g, 0, padded, pad);
  const auto pv = as_f64(plain), dv = as_f64(padded);
  double pad_row = 0;
  for (int64_t r = 0; r < V; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = size_t(r * C + c);
      EXPECT_NEAR(dv[i], r == pad ? 0.5 : pv[i] + 0.5, 1e-14) << "row " << r << " column " << c;
      if (r == pad) pad_row += std::abs(pv[i]);
    }
  EXPECT_GT(pad_row, 0.0) << "without padding_idx the row gets gradient";
  for (const auto& [off, rows] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 5}, {9, 2}}) {
    Tensor part = Tensor::full({rows, C}, 0.5, DType::f64);
    embedding_backward(ids, g, off, part, pad);
    EXPECT_EQ(as_f64(part), as_f64(padded.narrow(0, off, rows).contiguous())) << "rows " << off;
  }
  // An id no position holds changes nothing.
  Tensor unused = Tensor::zeros({V, C}, DType::f64);
  embedding_backward(ids, g, 0, unused, 9);
  EXPECT_EQ(as_f64(unused), pv);
}

INSTANTIATE_TEST_SUITE_P(IdTypes, EmbeddingTest, ::testing::Values(DType::i32, DType::i64),
                         [](const auto& param_info) {
                           return std::string(memory::dtype_name(param_info.param));
                         });

// The three steps on one device.
struct CeResult {
  Tensor losses, dlogits;
};
CeResult ce_whole(const Tensor& logits, const Tensor& targets, double grad_scale) {
  const int64_t n = logits.size(0);
  const DType f = logits.dtype();
  Tensor mx = Tensor::empty({n}, f), se = Tensor::empty({n}, f), tl = Tensor::empty({n}, f),
         losses = Tensor::empty({n}, f), d = Tensor::empty(logits.shape(), f);
  ce_row_max(logits, mx);
  ce_sum_exp(logits, targets, 0, mx, se, tl);
  ce_finish(logits, targets, 0, mx, se, tl, grad_scale, losses, d);
  return {losses, d};
}

TEST(CrossEntropy, MatchesLogSumExpAndFiniteDifferences) {
  std::mt19937_64 rng(test_seed(72));
  const int64_t N = 7, V = 13;
  Tensor logits = randn({N, V}, rng, 3.0);
  const std::vector<int64_t> tv{0, 12, 5, -100, 5, 3, 11};
  const Tensor targets = ids_tensor(tv, {N}, DType::i64);
  const auto r = ce_whole(logits, targets, 1.0);
  const auto lv = as_f64(logits), losses = as_f64(r.losses);
  for (int64_t n = 0; n < N; ++n) {
    if (tv[size_t(n)] < 0) {
      EXPECT_EQ(losses[size_t(n)], 0.0);
      for (int64_t j = 0; j < V; ++j) EXPECT_EQ(as_f64(r.dlogits)[size_t(n * V + j)], 0.0);
      continue;
    }
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(lv[size_t(n * V + j)]);
    EXPECT_NEAR(losses[size_t(n)], std::log(s) - lv[size_t(n * V + tv[size_t(n)])], 1e-13);
  }
  auto loss = [&] {
    const auto rr = ce_whole(logits, targets, 1.0);
    double s = 0;
    for (double v : as_f64(rr.losses)) s += v;
    return s;
  };
  EXPECT_LT(fd_check(logits, r.dlogits, loss, rng), 1e-6);

  // grad_scale scales the gradient only; float32 against float64; in place.
  const auto half = ce_whole(logits, targets, 0.5);
  EXPECT_EQ(as_f64(half.losses), losses);
  auto want = as_f64(r.dlogits);
  for (double& v : want) v *= 0.5;
  EXPECT_LT(rel_error(as_f64(half.dlogits), want), 1e-15);
  const auto r32 = ce_whole(logits.to(DType::f32), targets.to(DType::i32), 1.0);
  EXPECT_LT(rel_error(r32.losses, r.losses), 1e-4);
  EXPECT_LT(rel_error(r32.dlogits, r.dlogits), 1e-4);

  Tensor inplace = logits.clone(), mx = Tensor::empty({N}, DType::f64),
         se = Tensor::empty({N}, DType::f64), tl = Tensor::empty({N}, DType::f64),
         ls = Tensor::empty({N}, DType::f64);
  ce_row_max(inplace, mx);
  ce_sum_exp(inplace, targets, 0, mx, se, tl);
  ce_finish(inplace, targets, 0, mx, se, tl, 1.0, ls, inplace);
  EXPECT_EQ(as_f64(ls), losses);
  EXPECT_EQ(as_f64(inplace), as_f64(r.dlogits));
  // No gradient wanted.
  Tensor none;
  ce_finish(logits, targets, 0, mx, se, tl, 1.0, ls, none);
  EXPECT_EQ(as_f64(ls), losses);
}

// The one-call form: the three steps' losses and gradient bit for bit on rows that run in
// the pipeline (V <= 1024), separate, in place and without a gradient, f64 and f32.
TEST(CrossEntropy, OneCallEqualsTheThreeSteps) {
  std::mt19937_64 rng(test_seed(75));
  const int64_t N = 9, V = 13;
  const std::vector<int64_t> tv{0, 12, 5, -100, 5, 3, 11, -1, 7};
  for (DType f : {DType::f64, DType::f32}) {
    const Tensor logits = randn({N, V}, rng, 3.0, f);
    const Tensor targets = ids_tensor(tv, {N}, DType::i32);
    const auto want = ce_whole(logits, targets, 0.5);
    Tensor losses = Tensor::empty({N}, f), d = Tensor::empty({N, V}, f), none;
    cross_entropy_forward(logits, targets, 0.5, losses, d);
    EXPECT_EQ(as_f64(losses), as_f64(want.losses));
    EXPECT_EQ(as_f64(d), as_f64(want.dlogits));
    Tensor inplace = logits.clone();
    cross_entropy_forward(inplace, targets, 0.5, losses, inplace);
    EXPECT_EQ(as_f64(losses), as_f64(want.losses));
    EXPECT_EQ(as_f64(inplace), as_f64(want.dlogits));
    Tensor only = Tensor::empty({N}, f);
    cross_entropy_forward(logits, targets, 0.5, only, none);
    EXPECT_EQ(as_f64(only), as_f64(want.losses));
  }
}

// Rows longer than the pipeline's run in chunks with a running max: logits that rise
// along the row make later chunks raise it (the running sum rescaled).
TEST(CrossEntropy, OneCallLongRowsInChunks) {
  std::mt19937_64 rng(test_seed(76));
  const int64_t N = 6, V = 5000;
  Tensor logits = randn({N, V}, rng, 2.0);
  auto lv = logits.span<double>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < V; ++j) lv[size_t(n * V + j)] += 0.004 * double(j);
  std::vector<int64_t> tv(N);
  for (int64_t n = 0; n < N; ++n) tv[size_t(n)] = int64_t(rng() % V);
  tv[1] = -100;
  const Tensor targets = ids_tensor(tv, {N}, DType::i64);
  const auto want = ce_whole(logits, targets, 1.0);
  for (DType f : {DType::f64, DType::f32}) {
    Tensor losses = Tensor::empty({N}, f), d = Tensor::empty({N, V}, f), none;
    cross_entropy_forward(logits.to(f), targets, 1.0, losses, d);
    const double bar = f == DType::f64 ? 1e-14 : 1e-5;
    EXPECT_LT(rel_error(losses, want.losses), bar);
    EXPECT_LT(rel_error(d, want.dlogits), bar);
    Tensor only = Tensor::empty({N}, f);
    cross_entropy_forward(logits.to(f), targets, 1.0, only, none);
    EXPECT_EQ(as_f64(only), as_f64(losses));
  }
}

class CeSplit : public ::testing::TestWithParam<int> {};

TEST_P(CeSplit, VocabularySplitComposedByHandEqualsTheWhole) {
  const int parts = GetParam();
  std::mt19937_64 rng(test_seed(73));
  const int64_t N = 9, V = 50;
  const Tensor logits = randn({N, V}, rng, 2.0);
  const std::vector<int64_t> tv{0, 49, 17, -100, 33, 16, 34, 8, 25};
  const Tensor targets = ids_tensor(tv, {N}, DType::i32);
  const auto whole = ce_whole(logits, targets, 1.0 / N);

  std::vector<std::pair<int64_t, int64_t>> cols;  // [offset, width) of each part
  for (int p = 0; p < parts; ++p)
    cols.push_back({V * p / parts, V * (p + 1) / parts - V * p / parts});
  std::vector<Tensor> slice, mx;
  for (auto [off, w] : cols) {
    slice.push_back(logits.narrow(1, off, w).contiguous());
    mx.push_back(Tensor::empty({N}, DType::f64));
    ce_row_max(slice.back(), mx.back());
  }
  // "All-reduce" max, then sums.
  Tensor gmax = mx[0].clone();
  for (int p = 1; p < parts; ++p)
    for (int64_t n = 0; n < N; ++n)
      gmax.data<double>()[n] = std::max(gmax.data<double>()[n], mx[size_t(p)].data<double>()[n]);
  Tensor gse = Tensor::zeros({N}, DType::f64), gtl = Tensor::zeros({N}, DType::f64);
  for (int p = 0; p < parts; ++p) {
    Tensor se = Tensor::empty({N}, DType::f64), tl = Tensor::empty({N}, DType::f64);
    ce_sum_exp(slice[size_t(p)], targets, cols[size_t(p)].first, gmax, se, tl);
    add_inplace(gse, se);
    add_inplace(gtl, tl);
  }
  for (int p = 0; p < parts; ++p) {
    Tensor ls = Tensor::empty({N}, DType::f64),
           d = Tensor::empty(slice[size_t(p)].shape(), DType::f64);
    ce_finish(slice[size_t(p)], targets, cols[size_t(p)].first, gmax, gse, gtl, 1.0 / N, ls, d);
    EXPECT_LT(rel_error(as_f64(ls), as_f64(whole.losses)), 1e-14) << "part " << p;
    const Tensor want =
        whole.dlogits.narrow(1, cols[size_t(p)].first, cols[size_t(p)].second).contiguous();
    EXPECT_LT(rel_error(as_f64(d), as_f64(want)), 1e-14) << "part " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Parts, CeSplit, ::testing::Values(2, 3));

// The vocabulary-parallel form with one read of the local logits (ce_local_*), the
// all-reduces done by hand: against the three steps on the whole vocabulary, f64 and
// f32, short rows (the pipelined row loop) and long ones (chunks), gradient in place,
// beside it and none; one part must give cross_entropy_forward's bits.
struct CeLocalCase {
  int parts;
  int64_t vocab;
};

class CeLocal : public ::testing::TestWithParam<CeLocalCase> {};

TEST_P(CeLocal, OneReadPerRankEqualsTheThreeSteps) {
  const auto [parts, V] = GetParam();
  std::mt19937_64 rng(test_seed(77));
  const int64_t N = 9;
  Tensor logits64 = randn({N, V}, rng, 2.0);
  // Row 2's largest logits in the last part, row 5's in the first: the global max comes
  // from different ranks.
  for (int64_t j = 0; j < V; ++j) {
    logits64.data<double>()[2 * V + j] += 6.0 * double(j) / double(V);
    logits64.data<double>()[5 * V + j] -= 6.0 * double(j) / double(V);
  }
  std::vector<int64_t> tv{0, V - 1, V / 3, -100, V / 2, V / 2 - 1, 1, V - 2, 2 * V / 3};
  const Tensor targets = ids_tensor(tv, {N}, DType::i64);
  const double grad_scale = 1.0 / N;
  for (DType f : {DType::f64, DType::f32}) {
    const Tensor logits = logits64.to(f);
    const auto whole = ce_whole(logits, targets, grad_scale);
    std::vector<std::pair<int64_t, int64_t>> cols;  // [offset, width) of each part
    for (int p = 0; p < parts; ++p)
      cols.push_back({V * p / parts, V * (p + 1) / parts - V * p / parts});
    for (int mode = 0; mode < 3; ++mode) {  // gradient beside the logits, in place, none
      std::vector<Tensor> slice, lmax, lsum, tl, d;
      for (auto [off, w] : cols) {
        slice.push_back(logits.narrow(1, off, w).contiguous().clone());  // own memory: mode 1
        lmax.push_back(Tensor::empty({N}, f));
        lsum.push_back(Tensor::empty({N}, f));
        tl.push_back(Tensor::empty({N}, f));
        d.push_back(mode == 0 ? Tensor::empty({N, w}, f) : mode == 1 ? slice.back() : Tensor());
        ce_local_forward(slice.back(), targets, off, grad_scale, lmax.back(), lsum.back(),
                         tl.back(), d.back());
      }
      // "All-reduce" max, then the shares and target logits.
      Tensor gmax = lmax[0].clone();
      for (int p = 1; p < parts; ++p) {
        Tensor a = gmax.to(DType::f64), b = lmax[size_t(p)].to(DType::f64);
        for (int64_t n = 0; n < N; ++n)
          a.data<double>()[n] = std::max(a.data<double>()[n], b.data<double>()[n]);
        gmax = a.to(f);
      }
      Tensor gse = Tensor::zeros({N}, f), gtl = Tensor::zeros({N}, f);
      for (int p = 0; p < parts; ++p) {
        Tensor share = Tensor::empty({N}, f);
        ce_local_share(lmax[size_t(p)], lsum[size_t(p)], gmax, share);
        add_inplace(gse, share);
        add_inplace(gtl, tl[size_t(p)]);
      }
      const double bar = f == DType::f64 ? 1e-14 : 1e-6;
      for (int p = 0; p < parts; ++p) {
        Tensor ls = Tensor::empty({N}, f);
        ce_local_finish(targets, cols[size_t(p)].first, lmax[size_t(p)], lsum[size_t(p)], gmax, gse,
                        gtl, grad_scale, ls, d[size_t(p)]);
        EXPECT_LT(rel_error(as_f64(ls), as_f64(whole.losses)), bar) << "part " << p;
        if (mode == 2) continue;
        const Tensor want =
            whole.dlogits.narrow(1, cols[size_t(p)].first, cols[size_t(p)].second).contiguous();
        EXPECT_LT(rel_error(as_f64(d[size_t(p)]), as_f64(want)), bar)
            << "part " << p << " mode " << mode;
        const std::vector<double> dv = as_f64(d[size_t(p)]);
        for (int64_t j = 0; j < cols[size_t(p)].second; ++j)  // the ignored row
          ASSERT_EQ(dv[size_t(3 * cols[size_t(p)].second + j)], 0.0);
        if (parts == 1) {  // one rank: cross_entropy_forward's bits
          Tensor l1 = Tensor::empty({N}, f), d1 = Tensor::empty({N, V}, f);
          cross_entropy_forward(logits, targets, grad_scale, l1, d1);
          EXPECT_EQ(as_f64(ls), as_f64(l1));
          EXPECT_EQ(as_f64(d[0]), as_f64(d1));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Parts, CeLocal,
                         ::testing::Values(CeLocalCase{1, 50}, CeLocalCase{2, 50},
                                           CeLocalCase{3, 50}, CeLocalCase{1, 3000},
                                           CeLocalCase{2, 5000}),
                         [](const auto& param_info) {
                           return std::to_string(param_info.param.parts) + "x" +
                                  std::to_string(param_info.param.vocab);
                         });

TEST(CrossEntropy, LocalKernelsRejectBadShapes) {
  const Tensor logits = Tensor::zeros({4, 10}), targets = Tensor::zeros({4}, DType::i64);
  Tensor m = Tensor::empty({4}), s = Tensor::empty({4}), t = Tensor::empty({3}), none;
  EXPECT_THROW(ce_local_forward(logits, targets, 0, 1.0, m, s, t, none), std::invalid_argument);
  Tensor d = Tensor::empty({4, 9}), t4 = Tensor::empty({4});
  EXPECT_THROW(ce_local_forward(logits, targets, 0, 1.0, m, s, t4, d), std::invalid_argument);
  Tensor l = Tensor::empty({4});
  EXPECT_THROW(ce_local_finish(targets, 0, m, s, m, s, t, 1.0, l, none), std::invalid_argument);
  EXPECT_THROW(ce_local_share(m, s, t, l), std::invalid_argument);
}

TEST(CrossEntropy, LargeVocabularyFloat32) {
  std::mt19937_64 rng(test_seed(74));
  const int64_t N = 64, V = 5000;
  const Tensor logits = randn({N, V}, rng, 4.0);
  std::vector<int64_t> tv(N);
  for (int64_t n = 0; n < N; ++n) tv[size_t(n)] = int64_t(rng() % V);
  const Tensor targets = ids_tensor(tv, {N}, DType::i64);
  const auto r = ce_whole(logits, targets, 1.0);
  const auto r32 = ce_whole(logits.to(DType::f32), targets, 1.0);
  EXPECT_LT(rel_error(r32.losses, r.losses), 1e-5);
  EXPECT_LT(rel_error(r32.dlogits, r.dlogits), 1e-5);
}

// Logits far from zero: the loss is log S + (M - target), as torch computes it, so equal
// logits of -1e4 give log V in f32 (log S + M first had rounded log 8 to 1e4's spacing:
// 2.07910 for 2.07944). And on one device a target past the vocabulary is refused: it
// would have been taken as another rank's column, a loss of about -1e4.
TEST(CrossEntropy, LogitsFarFromZeroAndTargetsPastTheVocabulary) {
  const int64_t N = 2, V = 8;
  const Tensor logits = Tensor::full({N, V}, -1e4, DType::f32);
  const Tensor targets = ids_tensor({3, 5}, {N}, DType::i64);
  Tensor losses = Tensor::empty({N}), d = Tensor::empty({N, V});
  cross_entropy_forward(logits, targets, 1.0, losses, d);
  for (double v : as_f64(losses)) EXPECT_NEAR(v, std::log(8.0), 1e-6);
  for (double v : as_f64(ce_whole(logits, targets, 1.0).losses))
    EXPECT_NEAR(v, std::log(8.0), 1e-6);
  try {
    cross_entropy_forward(logits, ids_tensor({3, 8}, {N}, DType::i32), 1.0, losses, d);
    ADD_FAILURE() << "a target of 8 with 8 logits was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("targets must be below the vocabulary size 8 (negative: "
                                         "ignored), found 8 at row 1"),
              std::string::npos)
        << e.what();
  }
}

// A NaN logit reaches every probability and the loss wherever it sits, as in torch: in a
// vector or a row's scalar tail, a short row or a long one (chunked), one call or three
// steps. The max reductions drop a NaN (maxps); the exp keeps it.
TEST(CrossEntropy, NanLogitsReachEveryOutput) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType f : {DType::f32, DType::f64})
    for (auto [V, at] : {std::pair<int64_t, int64_t>{17, 5}, {17, 16}, {3000, 5}, {3000, 2999}}) {
      SCOPED_TRACE(std::to_string(V) + " " + std::to_string(at));
      Tensor logits = Tensor::zeros({1, V}, DType::f64);
      logits.span<double>()[size_t(at)] = nan;
      logits = logits.to(f);
      Tensor y = Tensor::empty({1, V}, f);
      softmax_forward(logits, y);
      for (double v : as_f64(y)) ASSERT_TRUE(std::isnan(v)) << v;
      const Tensor targets = ids_tensor({1}, {1}, DType::i32);
      Tensor losses = Tensor::empty({1}, f), d = Tensor::empty({1, V}, f);
      cross_entropy_forward(logits, targets, 1.0, losses, d);
      EXPECT_TRUE(std::isnan(as_f64(losses)[0])) << as_f64(losses)[0];
      EXPECT_TRUE(std::isnan(as_f64(ce_whole(logits, targets, 1.0).losses)[0]));
    }
}

// Columns of -inf (masked) before the first finite one: a long row's leading chunks, or a
// vocabulary shard that is all -inf, subtract a maximum of -inf from -inf. That NaN is kept
// by the exp since it keeps NaN logits (above): the shift is 0 there, so their exps are 0,
// as torch gives them.
TEST(CrossEntropy, MaskedLeadingColumnsAndShardsStayFinite) {
  const double ninf = -std::numeric_limits<double>::infinity();
  for (DType f : {DType::f32, DType::f64}) {
    const int64_t V = 4096;
    Tensor l64 = Tensor::zeros({1, V}, DType::f64);
    auto lv = l64.span<double>();
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) {
      lv[size_t(j)] = j < V / 2 ? ninf : 0.1 * double(j % 7);
      if (j >= V / 2) sum += std::exp(lv[size_t(j)]);
    }
    const Tensor logits = l64.to(f);
    Tensor y = Tensor::empty({1, V}, f);
    softmax_forward(logits, y);
    const auto yv = as_f64(y);
    for (int64_t j = 0; j < V; ++j)
      ASSERT_NEAR(yv[size_t(j)], j < V / 2 ? 0.0 : std::exp(lv[size_t(j)]) / sum, 1e-6) << j;
    const Tensor targets = ids_tensor({3000}, {1}, DType::i32);
    Tensor losses = Tensor::empty({1}, f), d = Tensor::empty({1, V}, f);
    cross_entropy_forward(logits, targets, 1.0, losses, d);
    const double want = std::log(sum) - lv[3000];
    EXPECT_NEAR(as_f64(losses)[0], want, 1e-5);
    EXPECT_NEAR(as_f64(ce_whole(logits, targets, 1.0).losses)[0], want, 1e-5);
    // One rank's shard all -inf: its share of the sum is 0, not NaN.
    const Tensor shard = logits.narrow(1, 0, 64).contiguous();
    Tensor lmax = Tensor::empty({1}, f), lsum = Tensor::empty({1}, f), tl = Tensor::empty({1}, f),
           none, share = Tensor::empty({1}, f);
    ce_local_forward(shard, targets, 0, 1.0, lmax, lsum, tl, none);
    EXPECT_EQ(as_f64(lsum)[0], 0.0);
    ce_local_share(lmax, lsum, Tensor::full({1}, 0.6, f), share);
    EXPECT_EQ(as_f64(share)[0], 0.0);
  }
}

}  // namespace
}  // namespace baton::kernels::test
