// Data-parallel sync modes (plan field dp_sync). local-sgd with sync_every 1 and the
// `average` outer optimizer is allreduce (with SGD, whose update is linear in the
// gradient; no clipping, which each replica does by its own norm); with sync_every 4 the
// replicas' parameters differ between syncs and are bit for bit the same after each;
// the Nesterov outer step (DiLoCo) against a hand computation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "engine/detail/gossip.h"
#include "engine/detail/grad_reducer.h"
#include "engine/detail/local_sgd.h"
#include "engine/detail/param_server.h"
#include "engine/rank_engine.h"
#include "engine_harness.h"
#include "partitioner/resolved_plan.h"
#include "stages/checkpoint.h"
#include "stages/data.h"
#include "stages/evaluation.h"
#include "stages/hf.h"
#include "stages/safetensors.h"
#include "transport/local.h"

namespace baton::engine_testing {
namespace {

using memory::Tensor;

PlanSpec dp2_plan(json dp_sync) {
  PlanSpec p;
  p.model = tiny_gpt_json(4);
  p.dp = 2;
  p.tp = {1, 1};  // a two-stage pipeline per replica (the tied wte summed inside it)
  p.micro_batches = 2;
  p.micro_batch_size = 2;
  p.dp_sync = std::move(dp_sync);
  return p;
}

RunSettings sgd_settings(int64_t steps) {
  RunSettings s;
  s.steps = steps;
  s.grad_clip = 0;
  s.configure = [](engine::LoopOptions& o) {
    o.optimizer.kind = stages::OptimizerConfig::Kind::sgd;
    o.optimizer.sgd = kernels::Sgd{0.05, 0.9, 0.01, false};
  };
  return s;
}

TEST(DpSync, LocalSgdEveryStepAveragedIsAllreduce) {
  const RunSettings s = sgd_settings(4);
  Workspace ws("dp-sync");
  auto want = run_threads(resolve(dp2_plan(json()), ws), train_options(ws, s));
  auto got = run_threads(
      resolve(dp2_plan({{"mode", "local-sgd"}, {"sync_every", 1}, {"outer_optimizer", "average"}}),
              ws),
      train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-6 * want[i].loss) << "step " << i + 1;
    worst = std::max(worst, std::abs(got[i].loss - want[i].loss) / want[i].loss);
  }
  // Not trivially the same: the last steps' losses differ from the first.
  EXPECT_NE(want.front().loss, want.back().loss);
  std::printf("  local-sgd H=1 against allreduce: worst relative loss difference %.2e\n", worst);
}

// Every rank's parameters after each step, by (stage, name).
using Params = std::map<std::pair<int, std::string>, std::vector<float>>;

// With `master`, the stages keep master copies of that dtype (and extra servers their
// parts in it): mixed precision's path, f64 masters beside f32 working copies standing in
// for f32 beside bf16 on the CPU. `losses`: each step's loss (rank 0's).
std::vector<std::vector<Params>> run_recording(
    std::shared_ptr<const partitioner::ResolvedPlan> plan, int64_t steps,
    std::optional<memory::DType> master = std::nullopt, std::vector<double>* losses = nullptr) {
  kernels::set_num_threads(1);
  const int n = plan->world();
  auto world = transport::make_local_world(n);
  const stages::ValueType tok = plan->graph->value("tokens").type;
  const stages::ValueType tgt = plan->graph->value("targets").type;
  // Deterministic token ids by sample and step (the data's content does not matter here).
  engine::InputFn inputs = [tok, tgt](const stages::MicroBatch& mb,
                                      const std::vector<std::string>& names,
                                      stages::TensorMap& out) {
    const int64_t T = tok.shape[0];
    std::vector<int64_t> a, b;
    for (int64_t i = 0; i < mb.samples; ++i)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t x = (mb.sample_offset + i) * 31 + t * 7 + mb.step * 13;
        a.push_back(x % 251);
        b.push_back((x + 5) % 251);
      }
    for (const std::string& name : names)
      out[name] = Tensor::from_vector(name == "tokens" ? a : b, {mb.samples, T})
                      .to(name == "tokens" ? tok.dtype : tgt.dtype);
  };
  std::vector<std::vector<Params>> seen(size_t(steps), std::vector<Params>(static_cast<size_t>(n)));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      if (plan->is_server(r)) {  // an extra parameter-server rank: no stage to record
        engine::detail::ParamServer::Options so;
        if (master) so.master_dtype = *master;
        engine::detail::ParamServer server(*plan, world[size_t(r)], so);
        for (int64_t k = 0; k < steps; ++k) server.step(k);
        return;
      }
      engine::RankEngineOptions o;
      o.inputs = inputs;
      o.grad_clip = 1.0;
      o.master_dtype = master;
      engine::RankEngine e(plan, world[size_t(r)], o);
      for (int64_t k = 0; k < steps; ++k) {
        const engine::StepStats st = e.step(k);
        if (losses && r == 0) losses->push_back(st.loss);
        for (const auto& [s, stage] : e.stages())
          for (int id : stage->param_ids())
            seen[size_t(k)][size_t(r)][{s, e.graph().params[size_t(id)].name}] =
                stage->working_param(id).to_vector<float>();
      }
    });
  for (auto& t : threads) t.join();
  return seen;
}

TEST(DpSync, LocalSgdReplicasAgreeAfterEachSync) {
  Workspace ws("dp-sync-h4");
  auto plan = resolve(dp2_plan({{"mode", "local-sgd"},
                                {"sync_every", 4},
                                {"outer_optimizer", "nesterov"},
                                {"outer_lr", 0.7},
                                {"outer_momentum", 0.9}}),
                      ws);
  auto seen = run_recording(plan, 8);
  // Ranks 0, 1 are replica 0's pipeline, ranks 2, 3 replica 1's (rank = dp * PP + pp).
  for (size_t k = 0; k < seen.size(); ++k) {
    const bool synced = (k + 1) % 4 == 0;
    for (int pp = 0; pp < 2; ++pp) {
      const Params &a = seen[k][size_t(pp)], &b = seen[k][size_t(2 + pp)];
      ASSERT_EQ(a.size(), b.size());
      int differ = 0;
      for (const auto& [key, v] : a) differ += v != b.at(key);
      if (synced)
        EXPECT_EQ(differ, 0) << "step " << k + 1 << " pipeline rank " << pp;
      else
        EXPECT_EQ(differ, int(a.size())) << "step " << k + 1 << " pipeline rank " << pp;
    }
  }
  // The sync moved the parameters: step 4's are not step 3's on either replica.
  EXPECT_NE(seen[3][0].begin()->second, seen[2][0].begin()->second);
}

// The Nesterov outer optimizer on real stages of two replicas, every parameter moved by a
// chosen delta, against the formula computed in double: g = -(mean delta),
// m = mu m + g, param = anchor - lr (g + mu m), twice (the second with momentum).
TEST(DpSync, NesterovOuterStepByHand) {
  Workspace ws("dp-sync-nesterov");
  PlanSpec p;
  p.model = tiny_mlp_json({8});
  p.dp = 2;
  auto plan = resolve(p, ws);
  const double lr = 0.7, mu = 0.9;
  auto world = transport::make_local_world(2);
  auto outer = transport::make_local_world(2);
  // Per replica, the parameters after each sync.
  std::vector<std::vector<Params>> after(2, std::vector<Params>(2));
  Params start;
  std::mutex m;
  std::vector<std::thread> threads;
  auto delta = [](int round, int r, size_t i) {
    return round == 0 ? 0.01 * (r + 1) * std::sin(double(i) + 1)
                      : 0.02 * std::cos(double(i) * (r + 2));
  };
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      engine::RankEngineOptions o;
      o.inputs = [](const stages::MicroBatch&, const std::vector<std::string>&,
                    stages::TensorMap&) {};
      engine::RankEngine e(plan, world[size_t(r)], o);
      std::map<int, stages::Stage*> st;
      for (const auto& [s, x] : e.stages()) st[s] = x.get();
      engine::DpSyncConfig c;
      c.local = true;
      c.sync_every = 2;
      c.nesterov = true;
      c.outer_lr = lr;
      c.outer_momentum = mu;
      c.replica_comm = outer[size_t(r)].get();
      c.replicas = 2;
      c.replica = r;
      engine::detail::LocalSgd sync(c, st);
      sync.begin_step();
      if (r == 0) {
        std::lock_guard<std::mutex> lock(m);
        for (const auto& [s, x] : st)
          for (int id : x->param_ids())
            start[{s, x->graph().params[size_t(id)].name}] = x->param(id).to_vector<float>();
      }
      for (int round = 0; round < 2; ++round) {
        for (const auto& [s, x] : st)
          for (int id : x->param_ids()) {
            Tensor& t = x->param(id);
            std::vector<float> v = t.to_vector<float>();
            for (size_t i = 0; i < v.size(); ++i) v[i] += float(delta(round, r, i));
            t.copy_from(Tensor::from_vector(v, t.shape()));
          }
        EXPECT_FALSE(sync.after_step(2 * round));  // not a sync step: nothing moves
        EXPECT_TRUE(sync.after_step(2 * round + 1));
        for (const auto& [s, x] : st)
          for (int id : x->param_ids())
            after[size_t(r)][size_t(round)][{s, x->graph().params[size_t(id)].name}] =
                x->param(id).to_vector<float>();
      }
    });
  for (auto& t : threads) t.join();
  ASSERT_FALSE(start.empty());
  double worst = 0;
  for (const auto& [key, p0] : start) {
    std::vector<double> anchor(p0.begin(), p0.end()), mom(p0.size(), 0.0);
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < p0.size(); ++i) {
        // Replica r's parameter is its anchor (float) plus its delta, in float.
        double mean = 0;
        for (int r = 0; r < 2; ++r)
          mean += double(float(float(anchor[i]) + float(delta(round, r, i)))) - anchor[i];
        const double g = -mean / 2;
        mom[i] = mu * mom[i] + g;
        anchor[i] = anchor[i] - lr * (g + mu * mom[i]);
        const float got0 = after[0][size_t(round)].at(key)[i];
        const float got1 = after[1][size_t(round)].at(key)[i];
        EXPECT_EQ(got0, got1) << key.second << "[" << i << "] round " << round;
        worst = std::max(worst, std::abs(double(got0) - anchor[i]));
        ASSERT_NEAR(got0, anchor[i], 1e-6) << key.second << "[" << i << "] round " << round;
        anchor[i] = double(got0);  // the next round starts from the stored float
      }
    }
  }
  std::printf("  nesterov outer step: worst absolute difference from the formula %.2e\n", worst);
}

// A checkpoint between two syncs (step 3 of H = 2) carries each replica's parameters and
// optimizer state, the anchors and the outer momentum: resuming gives the uninterrupted
// run's losses bit for bit.
// Gossip's replicas differ after every step as well: their own parameters and optimizer
// state are in the checkpoint too. A parameter server with staleness 2 has two pulls in
// flight at the checkpoint: their parts are in it and posted again on resume.
class DpSyncResume : public ::testing::TestWithParam<json> {};

TEST_P(DpSyncResume, ResumesBetweenSyncs) {
  Workspace ws("dp-sync-ckpt");
  auto plan = resolve(dp2_plan(GetParam()), ws);
  auto run = [&](const std::string& dir, int64_t to, bool resume) {
    RunSettings s;
    s.steps = to;
    engine::PlanTrainOptions o = train_options(ws, s);
    o.checkpoint_dir = dir;
    o.checkpoint_every = 3;
    o.resume = resume;
    return run_threads(plan, o);
  };
  auto want = run(ws.path("whole"), 6, false);
  auto a = run(ws.path("ckpt"), 3, false);
  // The mode's own files carry per-tensor checksums, as the shards do.
  const stages::Manifest m = stages::read_manifest(stages::checkpoint_dir(ws.path("ckpt"), 3));
  int own = 0;
  for (const stages::ShardFile& f : m.shards) {
    if (f.kind == "model" || f.kind == "optimizer") continue;
    ++own;
    stages::SafetensorsReader r(stages::checkpoint_dir(ws.path("ckpt"), 3) + "/" + f.file);
    EXPECT_TRUE(r.metadata().count("baton.crc32")) << f.file;
  }
  if (GetParam()["mode"] != "parameter-server" || GetParam()["max_staleness"] != 0) {
    EXPECT_GT(own, 0);
  }
  auto b = run(ws.path("ckpt"), 6, true);
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a[i].loss, want[i].loss) << "step " << i + 1;
    EXPECT_EQ(b[i].step, int64_t(i + 4));
    EXPECT_EQ(b[i].loss, want[i + 3].loss) << "step " << i + 4;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, DpSyncResume,
    ::testing::Values(json{{"mode", "local-sgd"},
                           {"sync_every", 2},
                           {"outer_optimizer", "nesterov"},
                           {"outer_lr", 0.7},
                           {"outer_momentum", 0.9}},
                      json{{"mode", "gossip"}, {"peers", 1}},
                      json{{"mode", "parameter-server"}, {"max_staleness", 2}},
                      json{{"mode", "parameter-server"}, {"max_staleness", 2}, {"ps_ranks", 1}},
                      json{{"mode", "parameter-server"}, {"max_staleness", 0}, {"ps_ranks", 2}}),
    [](const ::testing::TestParamInfo<json>& mode) {
      const std::string m = mode.param["mode"];
      if (m != "parameter-server")
        return m == "gossip" ? std::string("gossip") : std::string("diloco");
      std::string name = "ps_stale" + std::to_string(mode.param["max_staleness"].get<int>());
      if (mode.param.contains("ps_ranks"))
        name += "_servers" + std::to_string(mode.param["ps_ranks"].get<int>());
      return name;
    });

// Trains `p` 3 steps with held-out data and checkpoints: its last held-out loss is that of
// the checkpointed model (the first replica's) on the whole evaluation batch, as one
// process evaluating the checkpoint's weights finds it.
void expect_held_out_loss_of_the_checkpoint(const PlanSpec& p, double lr) {
  const std::string data = std::string(BATON_SOURCE_DIR) + "/examples/data/licenses.txt";
  Workspace ws("dp-sync-eval");
  RunSettings s;
  s.steps = 3;
  s.lr = lr;
  s.configure = [&](engine::LoopOptions& o) { o.data.eval_data = {data}; };
  engine::PlanTrainOptions o = train_options(ws, s);
  o.checkpoint_dir = ws.path("ckpt");
  const std::vector<engine::StepRecord> got = run_threads(resolve(p, ws), o);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(got.back().eval_loss.has_value());
  stages::WholeModel trained =
      stages::load_whole_checkpoint(stages::resolve_checkpoint(ws.path("ckpt")));
  stages::DataFlags flags;
  flags.data = {data};
  flags.eval_data = {data};
  stages::TrainData d = stages::open_train_data(flags, *trained.graph, "dp-sync-eval");
  const int64_t batch = int64_t(p.dp) * p.micro_batches * p.micro_batch_size;
  const double want =
      stages::evaluate_loss(*trained.stage, *d.eval, {1, batch, p.dp * p.micro_batches, s.seed});
  std::printf("  held-out loss %.8f under the plan, %.8f of the checkpoint\n",
              *got.back().eval_loss, want);
  EXPECT_NEAR(*got.back().eval_loss, want, 1e-6 * want);
}

// Under local SGD and gossip the replicas' parameters differ between syncs: the held-out
// loss is the first replica's model's (the one checkpoints write and export reads) on the
// whole evaluation batch, as one process evaluating the checkpoint's weights finds it. It
// had been the mean of each replica's loss on its share of the batch: no model's. Gossip
// at DP 4 (two replicas' gossip is their mean after every step).
TEST(DpSync, HeldOutLossIsTheCheckpointedModels) {
  for (const json& sync :
       {json{{"mode", "local-sgd"}, {"sync_every", 10}}, json{{"mode", "gossip"}, {"peers", 1}}}) {
    SCOPED_TRACE(sync.dump());
    PlanSpec p = dp2_plan(sync);
    if (sync["mode"] == "gossip") {
      p.dp = 4;
      p.tp = {1};
    }
    expect_held_out_loss_of_the_checkpoint(p, 1e-2);  // the replicas well apart
  }
}

// Under allreduce and parameter-server syncs the replicas share their trainable
// parameters but not their buffers: batch norm's running statistics (without
// sync_batchnorm) are each replica's. The held-out loss is the first replica's model's,
// the checkpointed one; it had mixed the replicas' statistics.
TEST(DpSync, HeldOutLossUsesTheFirstReplicasBuffers) {
  // A token model with a batchnorm2d over an [8, 4, 4] reshape of the embeddings.
  const json model = json::parse(R"({"type": "graph", "name": "tok-bn",
    "inputs": [{"name": "tokens", "shape": [8], "dtype": "i32"},
               {"name": "targets", "shape": [], "dtype": "i32"}],
    "params": [{"name": "wte", "shape": [256, 16], "init": {"type": "normal", "std": 0.5}},
               {"name": "bn_w", "shape": [8], "init": {"type": "ones"}},
               {"name": "bn_b", "shape": [8], "init": {"type": "zeros"}},
               {"name": "bn_rm", "shape": [8], "init": {"type": "zeros"}, "trainable": false},
               {"name": "bn_rv", "shape": [8], "init": {"type": "ones"}, "trainable": false},
               {"name": "w2", "shape": [256, 8], "init": {"type": "normal", "std": 0.5}}],
    "layers": [{"name": "embed", "nodes": [
        {"name": "emb", "op": "embedding", "inputs": ["tokens"], "outputs": ["e"],
         "params": {"weight": "wte"}},
        {"name": "rs", "op": "reshape", "inputs": ["e"], "outputs": ["e3"],
         "attrs": {"shape": [8, 4, 4]}}]},
      {"name": "norm", "nodes": [
        {"name": "bn", "op": "batchnorm2d", "inputs": ["e3"], "outputs": ["n"],
         "params": {"weight": "bn_w", "bias": "bn_b", "running_mean": "bn_rm",
                    "running_var": "bn_rv"}, "attrs": {"momentum": 0.5}},
        {"name": "gap", "op": "global_avgpool", "inputs": ["n"], "outputs": ["g"]}]},
      {"name": "head", "nodes": [
        {"name": "fc", "op": "linear", "inputs": ["g"], "outputs": ["logits"],
         "params": {"weight": "w2"}},
        {"name": "ce", "op": "cross_entropy", "inputs": ["logits", "targets"],
         "outputs": ["loss"]}]}],
    "loss": "loss"})");
  for (const json& sync : {json(), json{{"mode", "parameter-server"}, {"max_staleness", 0}}}) {
    SCOPED_TRACE(sync.dump());
    PlanSpec p = dp2_plan(sync);
    p.model = model;
    p.tp = {1};
    expect_held_out_loss_of_the_checkpoint(p, 5e-2);
  }
}

// The mode's own state is read back under another spelling of the same schedule (a
// --schedule file's name is its path as typed: ./x.txt where the checkpoint had x.txt, or
// another name: header): its keys depend on the stages' placement, not the name. It had
// been dropped with a warning, and the replicas resumed from the first one's parameters.
TEST(DpSync, ResumesUnderAnotherScheduleName) {
  for (const json& mode : {json{{"mode", "local-sgd"}, {"sync_every", 2}},
                           json{{"mode", "parameter-server"}, {"max_staleness", 1}}}) {
    SCOPED_TRACE(mode.dump());
    Workspace ws("dp-sync-rename");
    auto plan = resolve(dp2_plan(mode), ws);
    auto renamed = std::make_shared<partitioner::ResolvedPlan>(*plan);
    schedule::Schedule s = plan->schedule;
    s.name = "";
    partitioner::use_schedule(*renamed, s, "./my-1f1b.txt");
    ASSERT_EQ(renamed->schedule.name, "./my-1f1b.txt");
    auto run = [&](std::shared_ptr<const partitioner::ResolvedPlan> p, const std::string& dir,
                   int64_t to, bool resume) {
      RunSettings rs;
      rs.steps = to;
      engine::PlanTrainOptions o = train_options(ws, rs);
      o.checkpoint_dir = dir;
      o.checkpoint_every = 3;
      o.resume = resume;
      return run_threads(p, o);
    };
    auto want = run(plan, ws.path("whole"), 5, false);
    run(plan, ws.path("ckpt"), 3, false);
    auto b = run(renamed, ws.path("ckpt"), 5, true);
    ASSERT_EQ(b.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(b[i].loss, want[i + 3].loss) << "step " << i + 4;
  }
}

// The pulls in flight are in zero1's parts, which the gradient buckets fix: under another
// --bucket-mib they are not this plan's. Resumed with the documented fallback (none in
// flight, a warning); it had been "pull/0/0/... has the wrong size for this plan", exit
// 2, for a run flag. The same bucket size still resumes bit for bit.
TEST(DpSync, ParameterServerResumesUnderAnotherBucketSize) {
  Workspace ws("dp-sync-bucket");
  auto plan = resolve(dp2_plan({{"mode", "parameter-server"}, {"max_staleness", 1}}), ws);
  auto run = [&](size_t bucket, const std::string& dir, int64_t to, bool resume) {
    RunSettings rs;
    rs.steps = to;
    engine::PlanTrainOptions o = train_options(ws, rs);
    o.bucket_bytes = bucket;
    o.checkpoint_dir = dir;
    o.checkpoint_every = 3;
    o.resume = resume;
    return run_threads(plan, o);
  };
  auto want = run(256, ws.path("whole"), 5, false);
  run(256, ws.path("ckpt"), 3, false);
  std::vector<engine::StepRecord> other;
  ASSERT_NO_THROW(other = run(size_t(4) << 20, ws.path("ckpt"), 5, true));
  ASSERT_EQ(other.size(), 2u);
  for (const auto& rec : other) EXPECT_TRUE(std::isfinite(rec.loss));
  std::filesystem::remove_all(stages::checkpoint_dir(ws.path("ckpt"), 5));
  auto same = run(256, ws.path("ckpt"), 5, true);
  ASSERT_EQ(same.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(same[i].loss, want[i + 3].loss) << "step " << i + 4;
}

// ---- gossip ----

// Two replicas, one partner each step: the pair's average every step, so with SGD and no
// clipping the losses are allreduce's.
TEST(DpSync, GossipOfTwoReplicasIsAllreduce) {
  const RunSettings s = sgd_settings(4);
  Workspace ws("dp-sync-gossip2");
  auto want = run_threads(resolve(dp2_plan(json()), ws), train_options(ws, s));
  auto got =
      run_threads(resolve(dp2_plan({{"mode", "gossip"}, {"peers", 1}}), ws), train_options(ws, s));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-6 * want[i].loss) << "step " << i + 1;
}

// The pairings: a perfect matching of the replicas (an odd one out when their number is
// odd), a function of (seed, step, round) alone, not the same every step.
TEST(DpSync, GossipPairings) {
  std::set<std::vector<int>> seen;
  for (int64_t step = 0; step < 20; ++step)
    for (int n : {2, 4, 5}) {
      std::vector<int> p = engine::detail::Gossip::pairing(9, step, 0, n);
      EXPECT_EQ(p, engine::detail::Gossip::pairing(9, step, 0, n));
      int idle = 0;
      for (int r = 0; r < n; ++r) {
        if (p[size_t(r)] < 0) {
          ++idle;
          continue;
        }
        EXPECT_NE(p[size_t(r)], r);
        EXPECT_EQ(p[size_t(p[size_t(r)])], r);
      }
      EXPECT_EQ(idle, n % 2);
      if (n == 4) seen.insert(p);
    }
  EXPECT_EQ(seen.size(), 3u);  // every matching of four replicas occurs in 20 steps
}

// Four replicas, one partner per step: after each step each replica holds exactly its
// partner's parameters, and the replicas stay closer to their mean than replicas that
// never meet (local-sgd that does not sync within the run).
TEST(DpSync, GossipReplicasStayNearTheirMean) {
  Workspace ws("dp-sync-gossip4");
  auto spec = [](json sync) {
    PlanSpec p = dp2_plan(std::move(sync));
    p.dp = 4;
    p.tp = {1};
    return p;
  };
  const int64_t steps = 6;
  auto gossip =
      run_recording(resolve(spec({{"mode", "gossip"}, {"peers", 1}, {"seed", 5}}), ws), steps);
  auto apart =
      run_recording(resolve(spec({{"mode", "local-sgd"}, {"sync_every", 1000}}), ws), steps);
  auto spread = [](const std::vector<Params>& ranks) {
    double worst = 0;
    for (const auto& [key, v] : ranks[0])
      for (size_t i = 0; i < v.size(); ++i) {
        double mean = 0;
        for (const Params& r : ranks) mean += r.at(key)[i] / double(ranks.size());
        for (const Params& r : ranks) worst = std::max(worst, std::abs(r.at(key)[i] - mean));
      }
    return worst;
  };
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<int> partner = engine::detail::Gossip::pairing(5, k, 0, 4);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(gossip[size_t(k)][size_t(r)], gossip[size_t(k)][size_t(partner[size_t(r)])])
          << "step " << k + 1 << " replica " << r;
    EXPECT_NE(gossip[size_t(k)][0], gossip[size_t(k)][size_t(partner[0] == 1 ? 2 : 1)]);
  }
  const double g = spread(gossip.back()), a = spread(apart.back());
  std::printf("  spread from the mean after %lld steps: gossip %.3g, never synced %.3g\n",
              (long long)steps, g, a);
  EXPECT_LT(g, 0.75 * a);
}

// ---- parameter server ----

PlanSpec ps_plan(int pp, json dp_sync) {
  PlanSpec p = dp2_plan(std::move(dp_sync));
  p.tp.assign(size_t(pp), 1);
  return p;
}

json ps_sync(int s, int ps_ranks = 0) {
  json j = {{"mode", "parameter-server"}, {"max_staleness", s}};
  if (ps_ranks > 0) j["ps_ranks"] = ps_ranks;
  return j;
}

// A parameter server at staleness 0 against allreduce: losses bit for bit and equal
// held-out losses; norms within 1e-6 (their pieces are summed in another grouping).
void expect_synchronous_parameter_server(const std::vector<engine::StepRecord>& got,
                                         const std::vector<engine::StepRecord>& want, int pp) {
  ASSERT_EQ(got.size(), want.size());
  int same = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-6 * want[i].loss) << "pp " << pp << " step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-6 * want[i].grad_norm)
        << "pp " << pp << " step " << i + 1;
    same += got[i].loss == want[i].loss;
    EXPECT_EQ(got[i].eval_loss, want[i].eval_loss) << "pp " << pp << " step " << i + 1;
  }
  EXPECT_EQ(same, int(want.size())) << "pp " << pp << ": losses not bit for bit";
  ASSERT_TRUE(want[1].eval_loss.has_value());
  EXPECT_NE(want.front().loss, want.back().loss);
}

// Staleness 0 is synchronous: allreduce's losses and gradient norms on a DP 2 and a
// PP 2 x DP 2 plan (AdamW, clipping), within 1e-6; two members' reduce-scatter gives
// the all-reduce's sums, so the losses agree bit for bit.
TEST(DpSync, ParameterServerStalenessZeroIsAllreduce) {
  RunSettings s;
  s.steps = 5;
  s.configure = [](engine::LoopOptions& o) {  // held-out losses every other step
    o.data.eval_fraction = 0.1;
    o.eval_every = 2;
    o.eval_batches = 1;
  };
  for (int pp : {1, 2}) {
    Workspace ws("dp-sync-ps0");
    auto want = run_threads(resolve(ps_plan(pp, json()), ws), train_options(ws, s));
    auto got = run_threads(resolve(ps_plan(pp, ps_sync(0)), ws), train_options(ws, s));
    expect_synchronous_parameter_server(got, want, pp);
  }
}

// Extra server ranks (ps_ranks 1 and 2, after the replicas' ranks) with staleness 0 are
// synchronous too: allreduce's losses and norms within 1e-6 (the servers add zeros to the
// replicas' sums; the norm's pieces are summed in another grouping, so clipping may
// differ in the last bits), and every rank, servers included, reports them; so are the
// held-out losses (the servers join the evaluations' sums).
TEST(DpSync, ParameterServerExtraRanksStalenessZeroIsAllreduce) {
  RunSettings s;
  s.steps = 5;
  s.configure = [](engine::LoopOptions& o) {
    o.data.eval_fraction = 0.1;
    o.eval_every = 2;
    o.eval_batches = 1;
  };
  for (auto [pp, servers] : {std::pair{1, 2}, std::pair{2, 1}}) {
    Workspace ws("dp-sync-ps-extra");
    auto want = run_threads(resolve(ps_plan(pp, json()), ws), train_options(ws, s));
    auto plan = resolve(ps_plan(pp, ps_sync(0, servers)), ws);
    ASSERT_EQ(plan->world(), 2 * pp + servers);
    auto got = run_threads(plan, train_options(ws, s));
    expect_synchronous_parameter_server(got, want, pp);
  }
}

// A communicator that counts the bytes its point-to-point calls move and the collectives
// it is asked for (the transport counts no bytes itself), forwarding all to `inner`.
class PsPullCountingComm final : public transport::Communicator {
 public:
  explicit PsPullCountingComm(transport::CommPtr inner) : c_(std::move(inner)) {}
  int64_t sent = 0, received = 0, collectives = 0;
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  int global_rank(int r) const override { return c_->global_rank(r); }
  std::string backend() const override { return c_->backend(); }
  transport::WorkPtr isend(const Tensor& t, int dst, uint64_t tag) override {
    sent += int64_t(t.nbytes());
    return c_->isend(t, dst, tag);
  }
  transport::WorkPtr irecv(Tensor& t, int src, uint64_t tag) override {
    received += int64_t(t.nbytes());
    return c_->irecv(t, src, tag);
  }
  transport::WorkPtr broadcast(Tensor& t, int root) override {
    ++collectives;
    return c_->broadcast(t, root);
  }
  transport::WorkPtr all_reduce(Tensor& t, transport::ReduceOp op) override {
    ++collectives;
    return c_->all_reduce(t, op);
  }
  transport::WorkPtr all_gather(const Tensor& in, Tensor& out,
                                std::span<const int64_t> counts) override {
    ++collectives;
    return c_->all_gather(in, out, counts);
  }
  transport::WorkPtr reduce_scatter(const Tensor& in, Tensor& out, transport::ReduceOp op,
                                    std::span<const int64_t> counts) override {
    ++collectives;
    return c_->reduce_scatter(in, out, op, counts);
  }
  transport::WorkPtr scatter(const Tensor& in, Tensor& out, int root,
                             std::span<const int64_t> counts) override {
    ++collectives;
    return c_->scatter(in, out, root, counts);
  }
  transport::WorkPtr gather(const Tensor& in, Tensor& out, int root,
                            std::span<const int64_t> counts) override {
    ++collectives;
    return c_->gather(in, out, root, counts);
  }
  transport::WorkPtr barrier() override { return c_->barrier(); }
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    return c_->split(ranks);
  }

 private:
  transport::CommPtr c_;
};

// The pull from several extra servers (pull_bucket): each server sends its part of the
// bucket to every replica and receives nothing, each replica receives exactly the
// servers' parts, into their places, and no collective runs (the all-gather's ring would
// have passed each server's part through the other server too); with one server it is
// the all-gather. Over 2 replicas and 2 or 1 servers, a bucket of 1001 elements.
TEST(DpSync, ParameterServerPullSendsEachPartToTheReplicasOnly) {
  const int64_t elements = 1001;
  for (int servers : {2, 1}) {
    const int replicas = 2, n = replicas + servers;
    const std::vector<int64_t> counts = engine::detail::bucket_parts(elements, n, servers);
    auto world = transport::make_local_world(n);
    std::vector<std::unique_ptr<PsPullCountingComm>> comms;
    for (int r = 0; r < n; ++r)
      comms.push_back(std::make_unique<PsPullCountingComm>(world[size_t(r)]));
    std::vector<Tensor> out(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        int64_t begin = 0;
        for (int k = 0; k < r; ++k) begin += counts[size_t(k)];
        out[size_t(r)] = Tensor::zeros({elements}, memory::DType::f32);
        Tensor in = out[size_t(r)].narrow(0, begin, counts[size_t(r)]);
        for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = float(begin + i + 1);
        engine::detail::pull_bucket(*comms[size_t(r)], in, out[size_t(r)], counts, servers, 3)
            ->wait();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      const PsPullCountingComm& c = *comms[size_t(r)];
      const int64_t part = counts[size_t(r)] * 4;
      if (servers == 1) {
        EXPECT_EQ(c.collectives, 1) << "rank " << r;
        EXPECT_EQ(c.sent + c.received, 0) << "rank " << r;
      } else if (r >= replicas) {
        EXPECT_EQ(c.collectives, 0) << "server " << r;
        EXPECT_EQ(c.sent, replicas * part) << "server " << r;
        EXPECT_EQ(c.received, 0) << "server " << r;
      } else {
        EXPECT_EQ(c.collectives, 0) << "replica " << r;
        EXPECT_EQ(c.sent, 0) << "replica " << r;
        EXPECT_EQ(c.received, elements * 4) << "replica " << r;
      }
      if (r >= replicas && servers > 1) continue;  // a server's output is not written
      for (int64_t i = 0; i < elements; ++i)
        ASSERT_EQ(out[size_t(r)].data<float>()[i], float(i + 1))
            << "rank " << r << " element " << i << " with " << servers << " servers";
    }
  }
}

// The replicas hold no optimizer state for the served parameters (their shard empty);
// the servers hold the parameters' parts and AdamW's two moments for them, all of it
// once over the servers: 12 bytes per served element. (The tied wte is not served.)
TEST(DpSync, ParameterServerExtraRanksHoldTheState) {
  Workspace ws("dp-sync-ps-extra-state");
  auto plan = resolve(ps_plan(2, ps_sync(0, 2)), ws);
  auto world = transport::make_local_world(plan->world());
  std::vector<int64_t> server_bytes(size_t(plan->world()), 0), served(size_t(plan->world()), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < plan->world(); ++r)
    threads.emplace_back([&, r] {
      if (plan->is_server(r)) {
        server_bytes[size_t(r)] =
            engine::detail::ParamServer(*plan, world[size_t(r)], {}).state_bytes();
        return;
      }
      engine::RankEngineOptions o;
      o.inputs = [](const stages::MicroBatch&, const std::vector<std::string>&,
                    stages::TensorMap&) {};  // no step runs
      engine::RankEngine e(plan, world[size_t(r)], o);
      for (const auto& [s, st] : e.stages())
        for (int id : st->param_ids()) {
          const std::string& name = e.graph().params[size_t(id)].name;
          const auto [lo, hi] = st->optimizer_shard(id);
          if (name == "wte.weight") {
            EXPECT_FALSE(st->optimizer_state(id).empty()) << "rank " << r;
            continue;
          }
          EXPECT_EQ(hi, lo) << "rank " << r << " " << name;
          EXPECT_TRUE(st->optimizer_state(id).empty()) << "rank " << r << " " << name;
          if (plan->layout.coord(r).dp == 0) served[size_t(r)] += st->param(id).numel();
        }
    });
  for (auto& t : threads) t.join();
  int64_t held = 0, elements = 0;
  for (int r = 0; r < plan->world(); ++r) {
    held += server_bytes[size_t(r)];
    elements += served[size_t(r)];
    if (plan->is_server(r)) {
      EXPECT_GT(server_bytes[size_t(r)], 0) << "server " << r;
    }
  }
  EXPECT_GT(elements, 0);
  EXPECT_EQ(held, 12 * elements);
}

// A checkpoint of extra server ranks resumes under other plans and the other way round:
// the servers write their parts' optimizer state as the blocks of the logical tensors
// (as zero1's ranks do) and read theirs from any plan's; their masters are replica 0's
// parameters (s = 0). Three steps under one plan, three more under the other, against
// six under allreduce: the losses agree within 1e-6 (the synchronous server is allreduce
// but for the norm's grouping) and, in this run, bit for bit.
TEST(DpSync, ParameterServerExtraRanksResumeAcrossPlans) {
  struct Case {
    const char* name;
    PlanSpec first, second;
  };
  PlanSpec zero1 = ps_plan(2, json());
  zero1.optimizer_sharding = "zero1";
  const std::vector<Case> cases = {
      {"servers 1 -> allreduce", ps_plan(2, ps_sync(0, 1)), ps_plan(2, json())},
      {"servers 2 -> zero1", ps_plan(2, ps_sync(0, 2)), zero1},
      {"allreduce -> servers 2", ps_plan(2, json()), ps_plan(2, ps_sync(0, 2))},
      {"zero1 -> servers 1", zero1, ps_plan(2, ps_sync(0, 1))}};
  Workspace ws("dp-sync-ps-across");
  RunSettings s;
  s.steps = 6;
  auto want = run_threads(resolve(ps_plan(2, json()), ws), train_options(ws, s));
  ASSERT_EQ(want.size(), 6u);
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string dir = ws.path("ckpt" + std::to_string(c));
    auto run = [&](const PlanSpec& p, int64_t to, bool resume) {
      RunSettings rs;
      rs.steps = to;
      engine::PlanTrainOptions o = train_options(ws, rs);
      o.checkpoint_dir = dir;
      o.resume = resume;
      return run_threads(resolve(p, ws), o);
    };
    auto a = run(cases[c].first, 3, false);
    auto b = run(cases[c].second, 6, true);
    ASSERT_EQ(a.size(), 3u) << cases[c].name;
    ASSERT_EQ(b.size(), 3u) << cases[c].name;
    int same = 0;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(a[i].loss, want[i].loss, 1e-6 * want[i].loss)
          << cases[c].name << " step " << i + 1;
      EXPECT_EQ(b[i].step, int64_t(i + 4)) << cases[c].name;
      EXPECT_NEAR(b[i].loss, want[i + 3].loss, 1e-6 * want[i + 3].loss)
          << cases[c].name << " step " << i + 4;
      same += (a[i].loss == want[i].loss) + (b[i].loss == want[i + 3].loss);
    }
    std::printf("  %s: %d of 6 losses bit for bit\n", cases[c].name, same);
  }
}

// --trace with an extra server rank (PP 2 x DP 2 + 1 server, s = 1): one file, every
// rank's timeline; the server's has, for each traced step and served group, its push
// (PUSH<g>) and pull (PULL<g>) on the communication lane and the update (a STEP) on the
// compute lane, in that order, inside the replicas' time span.
TEST(DpSync, ParameterServerExtraRanksTrace) {
  Workspace ws("dp-sync-ps-trace");
  auto plan = resolve(ps_plan(2, ps_sync(1, 1)), ws);
  RunSettings s;
  s.steps = 3;
  engine::PlanTrainOptions o = train_options(ws, s);
  o.trace_path = ws.path("trace.json");
  o.trace_steps = 2;
  run_threads(plan, o);
  const json trace = json::parse(std::ifstream(o.trace_path));
  EXPECT_EQ(trace["otherData"]["ranks"], 5);
  const int server = 4;
  std::map<std::string, std::vector<std::pair<double, double>>> mine;  // name -> spans
  std::set<int> ranks;
  double replica_end = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ranks.insert(e["pid"].get<int>());
    const double a = e["ts"], b = a + e["dur"].get<double>();
    if (e["pid"] != server) {
      replica_end = std::max(replica_end, b);
      continue;
    }
    const std::string name = e["name"];
    mine[e["cat"] == "S" ? std::string("STEP") : name].push_back({a, b});
    if (name.rfind("PUSH", 0) == 0 || name.rfind("PULL", 0) == 0) {
      EXPECT_EQ(e["cat"], "SERVER") << name;
      // A communication thread: 1, or 3 and up for transfers in flight at once.
      EXPECT_TRUE(e["tid"] == 1 || e["tid"] >= 3) << name << " on thread " << e["tid"];
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, server}));
  ASSERT_EQ(mine["STEP"].size(), 2u);
  // PP 2: the servers serve one group per pipeline rank (wte stays all-reduced).
  for (const char* g : {"0", "1"}) {
    const auto& push = mine[std::string("PUSH") + g];
    const auto& pull = mine[std::string("PULL") + g];
    ASSERT_EQ(push.size(), 2u) << g;
    ASSERT_EQ(pull.size(), 2u) << g;
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_LE(push[k].second, mine["STEP"][k].first) << g << " step " << k;
      EXPECT_LE(mine["STEP"][k].second, pull[k].first) << g << " step " << k;
      EXPECT_GE(push[k].first, 0) << g;
      EXPECT_LE(pull[k].second, replica_end + 1e6) << g;
    }
  }
}

// Mixed precision's path with extra servers: the replicas keep master copies (f64 here,
// beside f32 working copies: the CPU's stand-in for f32 masters beside bf16), push their
// gradients in the working dtype as zero1 reduces them, and pull the masters; the
// servers keep their parts and state in the masters' dtype and update them with the
// gradients widened, as Stage::step does. At s = 0 that is allreduce's run under the
// same masters (losses within 1e-6, bit for bit in this run), not the f32 run's.
TEST(DpSync, ParameterServerExtraRanksMixedPrecision) {
  Workspace ws("dp-sync-ps-mixed");
  const int64_t steps = 4;
  std::vector<double> want, got, plain;
  run_recording(resolve(ps_plan(2, json()), ws), steps, memory::DType::f64, &want);
  auto seen =
      run_recording(resolve(ps_plan(2, ps_sync(0, 2)), ws), steps, memory::DType::f64, &got);
  run_recording(resolve(ps_plan(2, ps_sync(0, 2)), ws), steps, std::nullopt, &plain);
  ASSERT_EQ(got.size(), size_t(steps));
  ASSERT_EQ(want.size(), got.size());
  int same = 0, from_plain = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << "step " << i + 1;
    same += got[i] == want[i];
    from_plain += got[i] != plain[i];
  }
  EXPECT_GE(from_plain, 1);  // the f64 masters change the run
  std::printf("  f64 masters with extra servers: %d of %zu losses bit for bit with allreduce\n",
              same, got.size());
  // The servers' parts and AdamW state are in the masters' dtype: 24 bytes per element.
  auto plan = resolve(ps_plan(2, ps_sync(0, 1)), ws);
  auto world = transport::make_local_world(plan->world());
  int64_t f32 = 0, f64 = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < plan->world(); ++r)
    threads.emplace_back([&, r] {
      if (!plan->is_server(r)) {
        engine::RankEngineOptions o;
        o.inputs = [](const stages::MicroBatch&, const std::vector<std::string>&,
                      stages::TensorMap&) {};
        engine::RankEngine e(plan, world[size_t(r)], o);  // the groups' split only
        return;
      }
      f32 = engine::detail::ParamServer(*plan, world[size_t(r)], {}).state_bytes();
    });
  for (auto& t : threads) t.join();
  threads.clear();
  world = transport::make_local_world(plan->world());
  for (int r = 0; r < plan->world(); ++r)
    threads.emplace_back([&, r] {
      if (!plan->is_server(r)) {
        engine::RankEngineOptions o;
        o.inputs = [](const stages::MicroBatch&, const std::vector<std::string>&,
                      stages::TensorMap&) {};
        o.master_dtype = memory::DType::f64;
        engine::RankEngine e(plan, world[size_t(r)], o);
        return;
      }
      engine::detail::ParamServer::Options so;
      so.master_dtype = memory::DType::f64;
      f64 = engine::detail::ParamServer(*plan, world[size_t(r)], so).state_bytes();
    });
  for (auto& t : threads) t.join();
  EXPECT_GT(f32, 0);
  EXPECT_EQ(f64, 2 * f32);
  EXPECT_EQ(seen.size(), size_t(steps));
}

// The staleness bound with an extra server rank: the replicas' working parameters stay
// the initial ones for the first s steps and are the synchronous run's first update after
// step s + 1, as with the replicas' own ranks serving.
TEST(DpSync, ParameterServerExtraRanksStalenessPattern) {
  Workspace ws("dp-sync-ps-extra-pattern");
  const int64_t steps = 3;
  auto sync = run_recording(resolve(ps_plan(2, ps_sync(0, 1)), ws), steps);
  const int s = 2;
  auto stale = run_recording(resolve(ps_plan(2, ps_sync(s, 1)), ws), steps);
  auto served = [](Params p) {
    EXPECT_EQ(p.erase({0, "wte.weight"}) + p.erase({1, "wte.weight"}), 1u);
    return p;
  };
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(stale[size_t(s)][size_t(r)], stale[size_t(s)][size_t(r % 2)]) << "rank " << r;
    if (r >= 2) continue;
    EXPECT_EQ(served(stale[size_t(s)][size_t(r)]), served(sync[0][size_t(r)])) << "rank " << r;
    EXPECT_NE(served(stale[size_t(s - 1)][size_t(r)]), served(sync[0][size_t(r)])) << "rank " << r;
  }
}

// Staleness 1 with one and two extra server ranks (two: the point-to-point pull, a pull
// in flight across steps) trains, is reproducible and differs from the synchronous run
// (its first step the same: the initial parameters).
TEST(DpSync, ParameterServerExtraRanksStaleTrains) {
  RunSettings st;
  st.steps = 10;
  for (int servers : {1, 2}) {
    Workspace ws("dp-sync-ps-extra-stale");
    auto sync = run_threads(resolve(ps_plan(2, ps_sync(0, servers)), ws), train_options(ws, st));
    auto plan = resolve(ps_plan(2, ps_sync(1, servers)), ws);
    auto a = run_threads(plan, train_options(ws, st));
    auto b = run_threads(plan, train_options(ws, st));
    ASSERT_EQ(a.size(), size_t(st.steps));
    ASSERT_EQ(b.size(), a.size());
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1 << ", " << servers << " servers";
      differ += a[i].loss != sync[i].loss;
    }
    EXPECT_EQ(a[0].loss, sync[0].loss);
    EXPECT_GE(differ, int(a.size()) - 2);
    EXPECT_LT(a.back().loss, 0.97 * a.front().loss);
    std::printf("  %d extra server(s), s=1: loss %.4f -> %.4f (synchronous %.4f)\n", servers,
                a[0].loss, a.back().loss, sync.back().loss);
  }
}

// The staleness pattern on the parameters each step ran on: with staleness s the working
// parameters stay the initial ones for the first s steps and become the synchronous
// run's first update after step s + 1 (bit for bit: update 0 is computed from the same
// gradients); every replica holds the same ones. (A GPT-2 whose pipeline ranks share
// wte: two pipeline ranks per replica.)
TEST(DpSync, ParameterServerStalenessPattern) {
  Workspace ws("dp-sync-ps-pattern");
  const int64_t steps = 4;
  auto sync = run_recording(resolve(ps_plan(2, ps_sync(0)), ws), steps);
  for (int s : {1, 2}) {
    auto stale = run_recording(resolve(ps_plan(2, ps_sync(s)), ws), steps);
    for (int64_t k = 0; k < steps; ++k)
      for (int r = 0; r < 4; ++r)
        EXPECT_EQ(stale[size_t(k)][size_t(r)], stale[size_t(k)][size_t(r % 2)])
            << "s " << s << " step " << k + 1 << " rank " << r;
    // After step s (0-based s - 1) nothing has arrived; after step s + 1, update 0 has.
    // (The tied wte, summed over both pipeline ranks too, is not served: zero1 does not
    // shard it, so it is updated synchronously.)
    auto served = [](Params p) {
      EXPECT_EQ(p.erase({0, "wte.weight"}) + p.erase({1, "wte.weight"}), 1u);
      return p;
    };
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(served(stale[size_t(s)][size_t(r)]), served(sync[0][size_t(r)])) << "s " << s;
      EXPECT_NE(served(stale[size_t(s - 1)][size_t(r)]), served(sync[0][size_t(r)])) << "s " << s;
      EXPECT_NE(served(stale[size_t(s)][size_t(r)]), served(sync[size_t(s)][size_t(r)]))
          << "s " << s;
    }
  }
}

// Staleness 1 and 2 train (the loss falls), are reproducible run to run and differ from
// the synchronous run.
TEST(DpSync, ParameterServerStaleTrains) {
  RunSettings st;
  st.steps = 12;
  Workspace ws("dp-sync-ps-stale");
  auto sync = run_threads(resolve(ps_plan(2, ps_sync(0)), ws), train_options(ws, st));
  for (int s : {1, 2}) {
    auto plan = resolve(ps_plan(2, ps_sync(s)), ws);
    auto a = run_threads(plan, train_options(ws, st));
    auto b = run_threads(plan, train_options(ws, st));
    ASSERT_EQ(a.size(), size_t(st.steps));
    ASSERT_EQ(b.size(), a.size());
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].loss, b[i].loss) << "s " << s << " step " << i + 1;
      differ += a[i].loss != sync[i].loss;
    }
    EXPECT_EQ(a[0].loss, sync[0].loss);  // the first step runs on the initial parameters
    EXPECT_GE(differ, int(a.size()) - 2) << "s " << s;
    double first = 0, last = 0;
    for (size_t i = 0; i < 3; ++i) {
      first += a[i].loss;
      last += a[a.size() - 1 - i].loss;
    }
    EXPECT_LT(last, 0.97 * first) << "s " << s;
    std::printf("  parameter server s=%d: loss %.4f -> %.4f (synchronous %.4f)\n", s, a[0].loss,
                a.back().loss, sync.back().loss);
  }
}

}  // namespace
}  // namespace baton::engine_testing
