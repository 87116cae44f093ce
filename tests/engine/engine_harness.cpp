#include "engine_harness.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "kernels/ops.h"
#include "partitioner/plan.h"
#include "transport/local.h"

namespace baton::engine_testing {

namespace fs = std::filesystem;

json tiny_gpt_json(int n_layer, double dropout) {
  json j = {{"type", "gpt2"}, {"name", "tiny-gpt"}, {"n_layer", n_layer}, {"n_head", 4},
            {"n_embd", 32},   {"n_positions", 16},  {"vocab_size", 256}};
  if (dropout > 0) {
    j["resid_pdrop"] = dropout;
    j["attn_pdrop"] = dropout;
    j["embd_pdrop"] = dropout;
  }
  return j;
}

json tiny_mlp_json(std::vector<int> hidden) {
  return {{"type", "mlp"}, {"name", "tiny-mlp"}, {"context", 8},        {"vocab_size", 256},
          {"n_embd", 16},  {"hidden", hidden},   {"activation", "relu"}};
}

Workspace::Workspace(const std::string& name) {
  std::string tmpl = (fs::temp_directory_path() / ("baton-" + name + "-XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  dir = buf.data();
}

Workspace::~Workspace() {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

std::string PlanSpec::describe() const {
  std::string t;
  for (int x : tp) t += (t.empty() ? "" : ",") + std::to_string(x);
  return std::string(model.value("type", "?")) + " dp" + std::to_string(dp) + " pp" +
         std::to_string(tp.size()) + " tp[" + t + "] " + schedule +
         (chunks ? " v" + std::to_string(chunks) : "") + " m" + std::to_string(micro_batches) +
         " b" + std::to_string(micro_batch_size);
}

namespace {

int num_layers_of(const json& model) {
  if (model.at("type") == "gpt2") return model.at("n_layer").get<int>() + 2;
  if (model.at("type") == "llama") return model.at("num_hidden_layers").get<int>() + 2;
  if (model.at("type") == "resnet") {  // stem, one layer per block, head
    int blocks = 0;
    for (const auto& d : model.at("depths")) blocks += d.get<int>();
    return blocks + 2;
  }
  if (model.at("type") == "graph") return int(model.at("layers").size());
  return int(model.at("hidden").size()) + 2;  // embedding, hidden layers, head
}

}  // namespace

json plan_json(const PlanSpec& p, const Workspace& ws) {
  std::ofstream(ws.path("model.json")) << p.model.dump(2);
  const int pp = int(p.tp.size());
  int replica = 0;
  for (int t : p.tp) replica += t;
  // The number of model chunks: what the schedule's generator makes.
  int chunks = p.chunks;
  if (chunks == 0)
    chunks =
        (p.schedule == "interleaved-1f1b" || p.schedule == "zb-v" || p.schedule == "dualpipev" ||
         p.schedule == "dualpipe" || p.schedule.rfind("v-", 0) == 0)
            ? 2
            : 1;
  int S = p.schedule == "dualpipe" ? pp : pp * chunks;
  const int L = num_layers_of(p.model);
  std::vector<int> counts = p.layers_per_stage;
  if (counts.empty())
    for (int s = 0; s < S; ++s) counts.push_back(L * (s + 1) / S - L * s / S);
  json stages = json::array();
  int first = 0;
  for (int c : counts) {
    stages.push_back({{"layers", {first, first + c}}});
    first += c;
  }
  json j = {{"version", 1},
            {"model", "model.json"},
            {"devices", p.dp * replica},
            {"parallel", {{"dp", p.dp}, {"pp", pp}, {"tp", p.tp}}},
            {"batch", {{"micro_batch_size", p.micro_batch_size}}},
            {"schedule", {{"name", p.schedule}, {"micro_batches", p.micro_batches}}},
            {"stages", stages}};
  if (p.chunks > 0) j["schedule"]["chunks"] = p.chunks;
  if (!p.optimizer_sharding.empty()) j["optimizer_sharding"] = p.optimizer_sharding;
  if (!p.dp_sync.is_null()) j["dp_sync"] = p.dp_sync;
  return j;
}

std::shared_ptr<const partitioner::ResolvedPlan> resolve(const PlanSpec& p, const Workspace& ws) {
  json j = plan_json(p, ws);
  partitioner::Plan plan = partitioner::parse_plan(j, ws.path("plan.json"), ws.dir);
  auto graph = partitioner::load_plan_model(plan);
  return std::make_shared<const partitioner::ResolvedPlan>(partitioner::resolve_plan(plan, graph));
}

namespace {

std::string default_data() {
  return std::string(BATON_SOURCE_DIR) + "/examples/data/licenses.txt";
}

stages::OptimizerConfig optimizer(const RunSettings& s) {
  stages::OptimizerConfig c;
  c.kind = stages::OptimizerConfig::Kind::adamw;
  c.adamw = kernels::AdamW{s.lr, 0.9, 0.999, 1e-8, 0.01};
  return c;
}

}  // namespace

engine::LoopOptions loop_options(const RunSettings& s) {
  engine::LoopOptions o;
  o.data_path = s.data.empty() ? default_data() : s.data;
  o.steps = s.steps;
  o.optimizer = optimizer(s);
  o.grad_clip = s.grad_clip;
  o.seed = s.seed;
  o.log_every = 0;
  if (s.configure) s.configure(o);
  return o;
}

engine::PlanTrainOptions train_options(const Workspace&, const RunSettings& s) {
  engine::PlanTrainOptions o;
  static_cast<engine::LoopOptions&>(o) = loop_options(s);
  return o;
}

engine::TrainOptions one_process_options(const Workspace& ws, const RunSettings& s, int64_t batch,
                                         int64_t micro_batches) {
  engine::TrainOptions o;
  static_cast<engine::LoopOptions&>(o) = loop_options(s);
  o.model_path = ws.path("model.json");
  o.batch = batch;
  o.micro_batches = micro_batches;
  return o;
}

std::vector<engine::StepRecord> run_reference(const PlanSpec& p, const Workspace& ws,
                                              const RunSettings& s) {
  kernels::set_num_threads(1);
  plan_json(p, ws);  // writes model.json
  return engine::run_training(
             one_process_options(ws, s, int64_t(p.dp) * p.micro_batches * p.micro_batch_size,
                                 int64_t(p.dp) * p.micro_batches))
      .records;
}

void expect_steps_match(const std::vector<engine::StepRecord>& got,
                        const std::vector<engine::StepRecord>& want, bool bitwise) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (bitwise) {
      EXPECT_EQ(got[i].loss, want[i].loss) << "step " << i + 1;
      EXPECT_EQ(got[i].grad_norm, want[i].grad_norm) << "step " << i + 1;
    } else {
      EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
      EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * std::abs(want[i].grad_norm))
          << "step " << i + 1;
    }
  }
}

void inspect_rank_engines(const std::shared_ptr<const partitioner::ResolvedPlan>& plan,
                          const std::function<void(int, engine::RankEngine&)>& f) {
  const int n = plan->layout.world();
  std::vector<transport::CommPtr> world = transport::make_local_world(n);
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      engine::RankEngineOptions o;
      o.inputs = [](const stages::MicroBatch&, const std::vector<std::string>&,
                    stages::TensorMap&) {};
      engine::RankEngine e(plan, world[size_t(r)], o);
      std::lock_guard<std::mutex> lock(mu);
      f(r, e);
    });
  for (auto& t : threads) t.join();
}

std::vector<engine::StepRecord> run_threads(std::shared_ptr<const partitioner::ResolvedPlan> plan,
                                            const engine::PlanTrainOptions& o) {
  kernels::set_num_threads(1);
  const int n = plan->world();
  std::vector<transport::CommPtr> world = transport::make_local_world(n);
  std::vector<std::vector<engine::StepRecord>> records(static_cast<size_t>(n),
                                                       std::vector<engine::StepRecord>{});
  std::mutex mu;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        records[size_t(r)] = engine::train_plan(plan, o, world[size_t(r)]).records;
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      world[size_t(r)].reset();  // a failed rank leaves: the others' waits fail too
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(records[size_t(r)].size(), records[0].size()) << "rank " << r;
    for (size_t i = 0; i < std::min(records[0].size(), records[size_t(r)].size()); ++i) {
      EXPECT_EQ(records[size_t(r)][i].loss, records[0][i].loss)
          << "rank " << r << " step " << i + 1;
      EXPECT_EQ(records[size_t(r)][i].grad_norm, records[0][i].grad_norm)
          << "rank " << r << " step " << i + 1;
    }
  }
  return records[0];
}

bool same_accumulation_order(const schedule::Schedule& s) {
  if (s.num_directions != 1) return false;
  for (const auto& actions : s.ranks) {
    std::map<int, int> last;
    for (const schedule::Action& a : actions)
      if (a.kind == schedule::ActionKind::backward_weight ||
          a.kind == schedule::ActionKind::full_backward) {
        auto it = last.find(a.stage);
        if (it != last.end() && it->second > a.micro_batch) return false;
        last[a.stage] = a.micro_batch;
      }
  }
  return true;
}

std::string grid_case_name(const GridCase& c) {
  std::string s = c.model + "_pp" + std::to_string(c.pp) + "_tp" + std::to_string(c.tp) + "_dp" +
                  std::to_string(c.dp) + "_" + c.schedule;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

PlanSpec grid_plan(const GridCase& c) {
  PlanSpec p;
  p.model = c.model == "gpt" ? tiny_gpt_json() : tiny_mlp_json();
  p.tp.assign(size_t(c.pp), c.tp);
  p.dp = c.dp;
  p.schedule = c.schedule;
  p.micro_batches = c.pp == 4 ? 8 : 4;
  p.micro_batch_size = 8 / p.micro_batches;
  return p;
}

}  // namespace baton::engine_testing
