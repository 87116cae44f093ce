// Sub-groups split from the world, as tensor-, pipeline- and data-parallel groups are:
// collectives on each, concurrently, with the world's in flight, and nested splits.
#include <gtest/gtest.h>

#include "memory/tensor.h"
#include "tests/transport/world_harness.h"

namespace baton::transport::testing {
namespace {

using memory::DType;

// All-reduces x(global rank) over the group and checks the sum of its members' values.
WorkPtr start_sum(Communicator& g, Tensor& t, int global, int64_t n) {
  t = Tensor::full({n}, double(global + 1));
  return g.all_reduce(t, ReduceOp::sum);
}

void expect_sum(const Tensor& t, const std::vector<int>& globals, const std::string& what) {
  double want = 0;
  for (int g : globals) want += g + 1;
  auto v = t.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != float(want)) {
      ADD_FAILURE() << what << ": element " << i << " is " << v[i] << ", expected " << want;
      return;
    }
}

class Groups : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(Groups, ParallelismGroups) {
  // Not a structured binding: clang 14 cannot capture those in lambdas.
  const auto backend = std::get<0>(GetParam());
  const auto n = std::get<1>(GetParam());
  run_world(backend, n, [&](Communicator& world) {
    const int r = world.rank();
    // rank = dp * TP + tp with TP = 2: tensor-parallel pairs, data-parallel strides.
    std::vector<int> tp_members{r - r % 2, r - r % 2 + 1};
    std::vector<int> dp_members;
    for (int q = r % 2; q < n; q += 2) dp_members.push_back(q);
    auto tp = world.split(tp_members);
    auto dp = world.split(dp_members);
    // The same members in reverse order: group ranks follow the list.
    std::vector<int> rev(dp_members.rbegin(), dp_members.rend());
    auto dp_rev = world.split(rev);
    auto solo = world.split({r});
    EXPECT_EQ(tp->size(), 2);
    EXPECT_EQ(dp->size(), int(dp_members.size()));
    EXPECT_EQ(dp_rev->rank(), int(dp_members.size()) - 1 - dp->rank());
    EXPECT_EQ(dp_rev->global_rank(0), dp_members.back());
    EXPECT_EQ(solo->size(), 1);

    for (int64_t count : {int64_t(3), int64_t(200'003)}) {
      Tensor tw, tt, td, tr, ts;
      // Everything in flight at once, waited in another order.
      auto ww = start_sum(world, tw, r, count);
      auto wt = start_sum(*tp, tt, r, count);
      auto wd = start_sum(*dp, td, r, count);
      auto wr = start_sum(*dp_rev, tr, r, count);
      auto ws = start_sum(*solo, ts, r, count);
      ws->wait();
      wr->wait();
      wd->wait();
      wt->wait();
      ww->wait();
      std::vector<int> all(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) all[size_t(q)] = q;
      expect_sum(tw, all, "world");
      expect_sum(tt, tp_members, "tp");
      expect_sum(td, dp_members, "dp");
      expect_sum(tr, dp_members, "dp reversed");
      expect_sum(ts, {r}, "solo");
    }

    // A split of a split: the first half of the data-parallel group.
    if (dp->size() >= 2) {
      int half = dp->size() / 2;
      std::vector<int> sub, sub_globals;
      bool in_first = dp->rank() < half;
      for (int q = in_first ? 0 : half; q < (in_first ? half : dp->size()); ++q) {
        sub.push_back(q);
        sub_globals.push_back(dp->global_rank(q));
      }
      auto nested = dp->split(sub);
      Tensor t;
      start_sum(*nested, t, r, 1000)->wait();
      expect_sum(t, sub_globals, "nested");
      nested->barrier()->wait();
    }
    world.barrier()->wait();
  });
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return backend_name(std::get<0>(info.param)) + "_" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, Groups,
                         ::testing::Combine(::testing::ValuesIn(tested_backends()),
                                            ::testing::Values(2, 6, 8)),
                         name_of);

}  // namespace
}  // namespace baton::transport::testing
