#include "engine/plan_trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "engine/rank_engine.h"
#include "memory/units.h"
#include "schedule/schedule_io.h"
#include "schedule/timeline.h"
#include "stages/checkpoint.h"
#include "stages/data.h"
#include "stages/json_reader.h"

namespace baton::engine {

using memory::Tensor;
using partitioner::Plan;
using partitioner::ResolvedPlan;
using transport::Communicator;

namespace {

// ---- small collectives over the world ----

// Every rank's string, on every rank.
std::vector<std::string> all_gather_strings(Communicator& c, const std::string& mine) {
  const int n = c.size();
  Tensor len = Tensor::from_vector(std::vector<int64_t>{int64_t(mine.size())}, {1});
  Tensor lens = Tensor::empty({n}, memory::DType::i64);
  c.all_gather(len, lens)->wait();
  std::vector<int64_t> counts = lens.to_vector<int64_t>();
  int64_t total = 0;
  for (int64_t x : counts) total += x;
  std::vector<int32_t> chars(mine.begin(), mine.end());
  Tensor in = Tensor::from_vector(chars, {int64_t(chars.size())});
  Tensor out = Tensor::empty({total}, memory::DType::i32);
  c.all_gather(in, out, counts)->wait();
  std::vector<int32_t> all = out.to_vector<int32_t>();
  std::vector<std::string> res;
  int64_t off = 0;
  for (int64_t k : counts) {
    std::string s;
    for (int64_t i = 0; i < k; ++i) s.push_back(char(all[size_t(off + i)]));
    res.push_back(std::move(s));
    off += k;
  }
  return res;
}

int64_t broadcast_int(Communicator& c, int64_t v) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{v}, {1});
  c.broadcast(t, 0)->wait();
  return t.to_vector<int64_t>()[0];
}

void check_byte_model(const stages::Graph& g, const std::string& source) {
  int tok = g.find_value("tokens"), tgt = g.find_value("targets");
  if (tok < 0 || tgt < 0 || g.inputs.size() != 2)
    throw InputError(source + ": $.inputs: expected exactly the inputs 'tokens' and 'targets' "
                     "(byte-level data)");
}

nlohmann::json model_json_of(const Plan& p) {
  if (!p.model_path.empty()) return stages::read_json_file(p.model_path_resolved);
  return p.model_json;
}

// ---- the loss log: the one-process trainer's format ----

class LossLog {
 public:
  LossLog(const std::string& path, int64_t start) {
    if (path.empty()) return;
    // A resumed run keeps the lines up to its checkpoint and drops any that a crashed
    // run wrote after it, so the log is the loss curve of one uninterrupted run.
    std::vector<std::string> keep;
    if (start > 0) {
      std::ifstream old(path);
      std::string line;
      while (std::getline(old, line)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<int64_t>() <= start)
          keep.push_back(line);
      }
    }
    out_.open(path, std::ios::trunc);
    if (!out_) throw InputError(path + ": cannot open for writing (--loss-log)");
    for (const std::string& line : keep) out_ << line << "\n";
  }
  void write(const StepRecord& r, double lr) {
    if (!out_.is_open()) return;
    char buf[160];
    std::snprintf(buf, sizeof buf, "{\"step\": %lld, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g}\n",
                  static_cast<long long>(r.step), r.loss, r.grad_norm, lr);
    out_ << buf << std::flush;
  }

 private:
  std::ofstream out_;
};

// ---- checkpoints ----

std::string save(RankEngine& e, const PlanTrainOptions& o, const stages::Manifest& base, int64_t step) {
  Communicator& world = e.world();
  const std::string dir = stages::checkpoint_dir(o.checkpoint_dir, step);
  if (world.rank() == 0) stages::begin_checkpoint(dir);
  world.barrier()->wait();
  std::vector<const stages::Stage*> list;
  std::vector<int> ids;
  bool any = false;
  for (const auto& [s, st] : e.stages()) {
    list.push_back(st.get());
    ids.push_back(s);
    for (int p : st->param_ids()) any |= e.writes(s, p);
  }
  std::vector<stages::ShardFile> files;
  if (any)
    files = stages::write_rank_shards(dir, list, world.rank(),
                                      [&](size_t k, int p) { return e.writes(ids[k], p); });
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& f : files)
    mine.push_back({{"file", f.file}, {"kind", f.kind}, {"rank", f.rank}, {"bytes", f.bytes}, {"hash", f.hash}});
  // Each rank's files are durable (fsynced, renamed) before it reports them, so the
  // manifest written after the exchange names only complete files.
  std::vector<std::string> all = all_gather_strings(world, mine.dump());
  if (world.rank() == 0) {
    stages::Manifest m = base;
    m.step = step;
    m.data["position"] = step;
    const stages::Stage& any_stage = *e.stages().begin()->second;
    m.optimizer = any_stage.optimizer();
    m.optimizer_steps = any_stage.optimizer_steps();
    for (const std::string& s : all)
      for (const auto& f : nlohmann::json::parse(s)) {
        stages::ShardFile sf;
        sf.file = f["file"];
        sf.kind = f["kind"];
        sf.rank = f["rank"];
        sf.bytes = f["bytes"];
        sf.hash = f["hash"];
        m.shards.push_back(sf);
      }
    stages::write_manifest(dir, m);
    stages::prune_checkpoints(o.checkpoint_dir, o.keep_checkpoints);
  }
  return dir;
}

// The newest complete checkpoint as rank 0 sees it (every rank then loads the same one).
int64_t agree_on_checkpoint(Communicator& world, const std::string& root) {
  int64_t step = -1;
  if (world.rank() == 0)
    if (auto dir = stages::latest_checkpoint(root)) step = stages::read_manifest(*dir).step;
  return world.size() > 1 ? broadcast_int(world, step) : step;
}

// ---- timelines ----

void write_trace(Communicator& world, const std::vector<schedule::TimelineEvent>& events, double origin,
                 int64_t steps, const ResolvedPlan& r, const std::string& path) {
  std::vector<double> flat;
  for (const auto& e : events) {
    flat.insert(flat.end(), {double(e.rank), double(e.lane), double(int(e.kind)), double(e.micro_batch),
                             double(e.stage), double(e.peer), e.start - origin, e.end - origin});
  }
  const int n = world.size();
  Tensor cnt = Tensor::from_vector(std::vector<int64_t>{int64_t(flat.size())}, {1});
  Tensor cnts = Tensor::empty({n}, memory::DType::i64);
  world.all_gather(cnt, cnts)->wait();
  std::vector<int64_t> counts = cnts.to_vector<int64_t>();
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Tensor in = Tensor::from_vector(flat, {int64_t(flat.size())});
  Tensor out = Tensor::empty({std::max<int64_t>(total, 1)}, memory::DType::f64);
  Tensor out_view = out.narrow(0, 0, total);
  world.gather(in, out_view, 0, counts)->wait();
  if (world.rank() != 0) return;
  std::vector<double> all = out_view.to_vector<double>();
  schedule::Timeline t;
  t.name = "measured: " + r.schedule.name + " (" + std::to_string(steps) + " step" + (steps > 1 ? "s" : "") + ")";
  t.num_ranks = n;
  t.seconds_per_unit = 1.0;
  for (size_t i = 0; i + 8 <= all.size(); i += 8) {
    schedule::TimelineEvent e;
    e.rank = int(all[i]);
    e.lane = int(all[i + 1]);
    e.kind = schedule::ActionKind(int(all[i + 2]));
    e.micro_batch = int(all[i + 3]);
    e.stage = int(all[i + 4]);
    e.peer = int(all[i + 5]);
    e.start = all[i + 6];
    e.end = all[i + 7];
    t.events.push_back(e);
  }
  schedule::write_file_atomically(path, schedule::to_chrome_trace(t));
  spdlog::info("timeline of {} step(s) written to {}", steps, path);
}

}  // namespace

TrainSummary train_plan(const PlanTrainOptions& o, transport::CommPtr world,
                        const std::function<void(const StepRecord&)>& on_step) {
  Plan plan = partitioner::read_plan(o.plan_path);
  auto graph = partitioner::load_plan_model(plan);
  auto r = std::make_shared<ResolvedPlan>(partitioner::resolve_plan(plan, graph));
  if (!o.schedule_path.empty()) partitioner::use_schedule(*r, schedule::load_schedule(o.schedule_path), o.schedule_path);
  return train_plan(r, o, std::move(world), on_step);
}

namespace {
TrainSummary train(std::shared_ptr<const ResolvedPlan> rp, const PlanTrainOptions& o, transport::CommPtr world,
                   const std::function<void(const StepRecord&)>& on_step);
}

TrainSummary train_plan(std::shared_ptr<const ResolvedPlan> rp, const PlanTrainOptions& o,
                        transport::CommPtr world, const std::function<void(const StepRecord&)>& on_step) {
  try {
    return train(std::move(rp), o, world, on_step);
  } catch (const transport::PeerError& e) {
    // This rank's operation names the peer in its own scope (often one that gave up
    // because of an earlier failure); name the first failure the process learnt of.
    auto first = world->first_failure();
    if (first && first->first != e.peer())
      throw transport::PeerError(first->first, "rank " + std::to_string(first->first) + " failed: " + first->second +
                                                   "; this rank stopped at: " + e.what());
    throw;
  }
}

namespace {

TrainSummary train(std::shared_ptr<const ResolvedPlan> rp, const PlanTrainOptions& o, transport::CommPtr world,
                   const std::function<void(const StepRecord&)>& on_step) {
  using Clock = std::chrono::steady_clock;
  const ResolvedPlan& r = *rp;
  if (o.steps < 0) throw InputError("--steps must be >= 0");
  if (o.resume && o.checkpoint_dir.empty()) throw InputError("--resume needs --checkpoint-dir");
  const stages::Graph& lg = *r.graph;
  const std::string model_source = r.plan.where("$.model");
  check_byte_model(lg, model_source);
  const stages::ValueType& tok_type = lg.value("tokens").type;
  const stages::ValueType& tgt_type = lg.value("targets").type;
  const int64_t T = tok_type.shape[0];
  const bool per_position = !tgt_type.shape.empty();
  auto data = std::make_shared<stages::ByteDataset>(o.data_path, T);
  const bool lead = world->rank() == 0;
  auto& alloc = memory::allocator_for(memory::Device::cpu());
  alloc.reset_peak();

  RankEngineOptions eo;
  eo.seed = o.seed;
  eo.optimizer = o.optimizer;
  eo.grad_clip = o.grad_clip;
  eo.bucket_bytes = o.bucket_bytes;
  eo.recv_ahead = o.recv_ahead;
  eo.profile = o.profile;
  const uint64_t seed = o.seed;
  eo.inputs = [data, seed, T, per_position, tok_type, tgt_type](const stages::MicroBatch& mb,
                                                                  const std::vector<std::string>& names,
                                                                  stages::TensorMap& out) {
    Tensor tokens = Tensor::empty({mb.samples, T}, tok_type.dtype);
    Tensor targets = per_position ? Tensor::empty({mb.samples, T}, tgt_type.dtype)
                                  : Tensor::empty({mb.samples}, tgt_type.dtype);
    data->fill(seed, mb.step, mb.sample_offset, mb.samples, tokens, targets);
    for (const std::string& n : names) out[n] = n == "tokens" ? tokens : targets;
  };
  RankEngine engine(rp, world, eo);

  // ---- resume
  const nlohmann::json model_json = model_json_of(r.plan);
  int64_t start = 0;
  if (o.resume) {
    int64_t found = agree_on_checkpoint(*world, o.checkpoint_dir);
    if (found >= 0) {
      const std::string dir = stages::checkpoint_dir(o.checkpoint_dir, found);
      stages::Manifest m = stages::read_manifest(dir);
      if (m.model != model_json)
        throw InputError(dir + "/manifest.json: $.model: the checkpoint was written for another model than " +
                         model_source);
      if (m.seed != o.seed)
        throw InputError(dir + "/manifest.json: $.seed: expected the run's --seed " + std::to_string(o.seed) +
                         ", found " + std::to_string(m.seed));
      for (const auto& [s, st] : engine.stages()) {
        stages::load_stage(dir, m, *st, true);
        st->optimizer().set_lr(o.optimizer.lr());  // a resumed run may change the rate
      }
      start = m.step;
      if (lead) spdlog::info("resumed from {} (step {})", dir, start);
    } else if (lead) {
      spdlog::info("no complete checkpoint in {}; starting from step 0", o.checkpoint_dir);
    }
  }

  TrainSummary summary;
  summary.first_step = start;
  LossLog loss_log(lead ? o.loss_log : std::string(), start);
  if (lead)
    spdlog::info("plan {}: {} ranks (dp {} x pp {} x tp {}), schedule {}, {} micro-batches of {}; model {} "
                 "({:.3f} M parameters); {} steps",
                 r.plan.source.empty() ? "<memory>" : r.plan.source, r.layout.world(), r.plan.dp, r.plan.pp,
                 r.plan.uniform_tp() ? std::to_string(r.plan.tp[0]) : std::string("mixed"), r.schedule.name,
                 r.plan.micro_batches, r.plan.micro_batch_size, lg.name, double(lg.num_parameters()) / 1e6, o.steps);

  stages::Manifest base;
  base.seed = o.seed;
  base.model = model_json;
  base.data = {{"position", 0}, {"file", o.data_path}, {"bytes", data->size()}};
  base.train = {{"batch", engine.executor().config().global_batch},
                {"micro_batches", int64_t(r.plan.dp) * r.plan.micro_batches},
                {"grad_clip", o.grad_clip},
                {"steps", o.steps},
                {"plan", r.plan.source}};

  const int64_t trace_from = o.trace_path.empty() ? o.steps : std::max(start, o.steps - std::max<int64_t>(1, o.trace_steps));
  double trace_origin = 0;
  const int64_t tokens_per_step = engine.executor().config().global_batch * T;
  for (int64_t step = start; step < o.steps; ++step) {
    if (step == trace_from) {
      world->barrier()->wait();  // a common time origin for every rank's events
      trace_origin = engine.executor().now();
      engine.executor().clear_events();
      engine.executor().set_recording(true);
    }
    auto t0 = Clock::now();
    StepStats st = engine.step(step, step + 1 < o.steps ? step + 1 : -1);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    StepRecord rec{step + 1, st.loss, st.grad_norm, secs};
    summary.records.push_back(rec);
    if (!std::isfinite(st.loss))
      throw RuntimeError("loss is " + std::to_string(st.loss) + " at step " + std::to_string(step + 1));
    loss_log.write(rec, o.optimizer.lr());
    if (lead && o.log_every > 0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps || step == start))
      spdlog::info("step {:>6}/{} | loss {:.4f} | grad norm {:.3f} | {:>8.0f} tok/s | {:.1f} ms/step", step + 1,
                   o.steps, st.loss, st.grad_norm, double(tokens_per_step) / secs, secs * 1e3);
    if (on_step) on_step(rec);
    const bool last = step + 1 == o.steps;
    if (!o.checkpoint_dir.empty() && (last || (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0))) {
      summary.last_checkpoint = save(engine, o, base, step + 1);
      if (lead) spdlog::info("checkpoint {}", summary.last_checkpoint);
    }
  }
  if (!o.trace_path.empty() && trace_from < o.steps) {
    engine.executor().set_recording(false);
    write_trace(*world, engine.executor().events(), trace_origin, o.steps - trace_from, r, o.trace_path);
  }
  summary.peak_bytes = alloc.stats().peak;
  // Every rank's peak (one process per rank: its allocator's), for comparison with the
  // partitioner's estimate (`baton plan --check`).
  Tensor peak = Tensor::from_vector(std::vector<int64_t>{int64_t(summary.peak_bytes)}, {1});
  Tensor peaks = Tensor::empty({world->size()}, memory::DType::i64);
  world->all_gather(peak, peaks)->wait();
  if (lead) {
    std::string list;
    for (int64_t b : peaks.to_vector<int64_t>()) list += (list.empty() ? "" : " ") + std::to_string(b);
    spdlog::info("peak device memory of rank 0: {}; every rank's peak in bytes: {}",
                 memory::format_bytes(double(summary.peak_bytes)), list);
  }
  return summary;
}

}  // namespace

}  // namespace baton::engine
