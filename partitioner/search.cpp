#include "partitioner/search.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "memory/error.h"
#include "memory/units.h"
#include "partitioner/cut.h"
#include "partitioner/evaluate.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "transport/collective_memory.h"

namespace baton::partitioner {

using stages::Graph;

std::string Candidate::describe() const {
  std::string tp = std::to_string(plan.tp.front());
  if (!plan.uniform_tp()) {
    tp.clear();
    for (size_t i = 0; i < plan.tp.size(); ++i) tp += (i ? "," : "") + std::to_string(plan.tp[i]);
  }
  bool rc = false;
  for (const PlanStage& s : plan.stages) rc = rc || s.recompute_all;
  char b[256];
  const std::string sp =
      plan.has_spatial() ? " spatial " + std::to_string(plan.stages.front().spatial) : "";
  std::snprintf(b, sizeof b, "tp %s%s pp %d dp %d, %s, %d x %lld samples, recompute %s", tp.c_str(),
                sp.c_str(), plan.pp, plan.dp, plan.schedule.c_str(), plan.micro_batches,
                (long long)plan.micro_batch_size, rc ? "on" : "off");
  // Extra parameter-server ranks run beside the devices' replicas.
  if (plan.dp > 1 && plan.dp_sync.parameter_server() && plan.dp_sync.ps_ranks > 0)
    return b + (", + " + std::to_string(plan.dp_sync.ps_ranks) + " parameter-server ranks");
  return b;
}

PersistentCopies persistent_copies(int optimizer_states, OptimizerSharding sharding,
                                   const DpSync& sync, int dp, bool shardable) {
  PersistentCopies c;
  c.sharded = optimizer_states;
  if (dp <= 1) return c;
  const bool ps = sync.parameter_server();
  const bool servers = ps && sync.ps_ranks > 0 && shardable;
  if ((sharding != OptimizerSharding::none || ps) && shardable) {
    c.shard_over = dp;
    if (sharding == OptimizerSharding::zero2) {
      c.whole = 0;  // a part-sized gradient accumulator
      c.sharded += 1;
    }
  }
  if (servers) {
    // Extra server ranks hold the served parameters' state: the replicas none of it (a
    // tied parameter, not served, keeps its whole state).
    c.shared_extra += c.sharded;
    c.sharded = 0;
  }
  if (sync.local()) {
    const int copies = sync.outer == DpSync::Outer::nesterov ? 2 : 1;  // anchor, momentum
    c.whole += copies;
    c.shared_extra += copies;
  }
  // The s pulls in flight, and after the step one more: the next is posted before the
  // oldest completes (GradReducer::gather_params), as the exact estimate counts it.
  const int pulls = sync.max_staleness > 0 ? sync.max_staleness + 1 : 0;
  if (servers && pulls > 0) {
    // Each pull in flight: a parameter-sized buffer (the part is the servers').
    c.whole += pulls;
    c.shared_extra += pulls;
  } else if (ps && pulls > 0) {
    // Each pull in flight: a parameter-sized buffer and the rank's part (the one posted
    // early holds its buffer; its part is the one being stepped).
    c.whole += pulls;
    c.sharded += pulls - 1;
    c.shared_extra += 2 * pulls - 1;
  }
  return c;
}

LayerCosts layer_costs(const CostTable& t, bool rc, const PersistentCopies& copies) {
  LayerCosts c;
  c.optimizer_states = copies.sharded;
  c.shared_extra = copies.shared_extra;
  double total = std::max(t.total_time(rc), 1e-30);
  double ticks = double(int64_t(1) << 50) / total;
  c.own_bytes.assign(t.layers.size(), 0);
  for (size_t l = 0; l < t.layers.size(); ++l) {
    const LayerCost& lc = t.layers[l];
    c.time.push_back(to_ticks(lc.f + lc.b + lc.w + (rc ? lc.f : 0), ticks));
    c.mem.push_back(rc ? lc.mem_recompute : lc.mem);
  }
  c.input_bytes = t.input_bytes;
  const int64_t over = std::max(1, copies.shard_over);
  for (size_t l = 0; l < t.layers.size(); ++l)
    c.own_bytes[l] = t.own_param_bytes[l] * (1 + copies.whole) +
                     (t.own_param_bytes[l] * copies.sharded + over - 1) / over;
  for (const ParamUse& u : t.shared_params) c.shared.push_back({u.bytes, u.layers});
  return c;
}

LayerCosts layer_costs(const CostTable& t, bool rc, int optimizer_states) {
  PersistentCopies c;
  c.sharded = optimizer_states;
  return layer_costs(t, rc, c);
}

namespace {

// The divisors of n up to `at_most`, ascending: O(min(sqrt n, at_most)) divisions (a
// batch of 2^63 - 1 samples is not walked to its end).
std::vector<int64_t> divisors(int64_t n, int64_t at_most = INT64_MAX) {
  std::vector<int64_t> low, high;
  for (int64_t i = 1; i <= n / i && i <= at_most; ++i)
    if (n % i == 0) {
      low.push_back(i);
      if (n / i != i && n / i <= at_most) high.push_back(n / i);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// Degrees: divisors of a device count (at most kMaxWorld).
std::vector<int> degrees(int n) {
  std::vector<int> d;
  for (int64_t x : divisors(n)) d.push_back(int(x));
  return d;
}

// Micro-batch counts the search tries when --micro-batches leaves them open: each one's
// schedule is generated, walked and simulated action by action, so beyond a few thousand
// a search would take minutes and gigabytes (--micro-batches asks for more, up to the
// generators' schedule::kMaxGeneratedMicroBatches).
constexpr int64_t kMaxSearchedMicroBatches = 4096;

// A total order, so that equally fast plans (the same step to the nanosecond) rank the
// same whatever --top: the lower peak first, then by description.
bool faster(const Candidate& a, const Candidate& b) {
  const int64_t ta = std::llround(a.step_time * 1e9), tb = std::llround(b.step_time * 1e9);
  if (ta != tb) return ta < tb;
  if (a.peak != b.peak) return a.peak < b.peak;
  return a.describe() < b.describe();
}

class Search {
 public:
  Search(std::shared_ptr<const Graph> g, CostModel& model, const SearchOptions& o)
      : g_(std::move(g)),
        model_(model),
        o_(o),
        opt_states_(optimizer_states(o.optimizer)),
        exact_limit_(exact_allowance()) {}

  SearchResult run() {
    auto t0 = std::chrono::steady_clock::now();
    if (o_.global_batch <= 0)
      throw InputError("--batch: expected a global batch of at least 1 sample");
    std::vector<std::string> names = o_.schedules;
    if (names.empty()) names = schedule::all_schedule_names();
    for (auto& n : names) n = schedule::canonical_training_schedule_name(n);
    const int N = o_.devices, L = g_->num_layers();
    check_fixed(N, L);
    for (int tp : degrees(N)) {
      if (o_.tp > 0 && tp != o_.tp) continue;
      try {
        model_.sharding(tp, 1, o_.splits, "--tp");
      } catch (const InputError& e) {
        skip("tp " + std::to_string(tp) + ": " + e.what());
        continue;
      }
      for (int sp : degrees(N / tp)) {
        if (o_.spatial > 0 && sp != o_.spatial) continue;
        if (sp > 1 && !spatial_split(sp)) continue;
        for (int pp : degrees(N / tp / sp)) {
          if (o_.pp > 0 && pp != o_.pp) continue;
          if (pp > L) continue;
          int dp = N / tp / sp / pp;
          if (o_.dp > 0 && dp != o_.dp) continue;
          if (o_.global_batch % dp != 0) {
            skip("dp " + std::to_string(dp) + ": does not divide the batch of " +
                 std::to_string(o_.global_batch));
            continue;
          }
          const int64_t replica_batch = o_.global_batch / dp;
          for (int m : micro_batch_counts(dp, replica_batch)) {
            const int64_t b = replica_batch / m;
            // A batch norm over one value per channel (one sample of a 1 x 1 map) trains
            // nothing before it: the op refuses it, so no plan may ask for it.
            const int64_t plane = smallest_batchnorm_plane(*g_).second;
            if (plane > 0 && b * plane < 2) {
              skip(std::to_string(m) + " micro-batches: " + std::to_string(b) +
                   " sample(s) a micro-batch would leave a batch norm one value per channel");
              continue;
            }
            for (const std::string& name : names) {
              // One pipeline rank: every one-chunk schedule runs the same F, B, W in order.
              // Two chunks split the rank into two stages, so with replicas the later
              // chunk's reduction overlaps the earlier one's backward.
              if (pp == 1 && name != "1f1b" && o_.schedules.empty() &&
                  (dp == 1 || !several_chunks(name, m)))
                continue;
              // What a plan file would refuse (gossip's peers beyond the replicas, a
              // parameter server under DualPipe, ...) is no candidate either.
              if (dp > 1 && !dp_sync_allowed(dp, name)) continue;
              if (name == "dualpipe" && !running_statistics_node(*g_).empty()) {
                skip(
                    "dualpipe: the model's batch-norm running statistics (its two copies of "
                    "a chunk would not agree)");
                continue;
              }
              for (int rc : {0, 1}) {
                if (o_.recompute >= 0 && rc != o_.recompute) continue;
                enumerate(tp, sp, pp, dp, m, b, name, rc == 1);
              }
            }
          }
        }
      }
    }
    // Cheapest lower bound first; stop once it passes the keep-th best step time found.
    std::stable_sort(pending_.begin(), pending_.end(), [](const Pending& a, const Pending& b) {
      return a.lower_bound < b.lower_bound;
    });
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].lower_bound >= entry_time()) {
        // Sorted by the bound: none of the rest can enter the list either.
        result_.pruned = int(pending_.size() - i);
        break;
      }
      evaluate(pending_[i]);
    }
    retry_starved();
    polish_and_rank();
    if (fitting_.empty() && closest_) result_.closest = closest_;
    result_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spdlog::debug(
        "search: {:.3f} s; cost tables {:.3f} s, time cuts {:.3f} s, {} memory cuts and {} cuts "
        "with layers moved between a rank's stages {:.3f} s, memory and simulation {:.3f} s",
        result_.seconds, phase_[0], phase_[1], memory_cuts_, moved_cuts_, phase_[2], phase_[3]);
    return result_;
  }

 private:
  // Layer moves (polish) may lift a candidate past faster ones, so which are polished
  // decides the best plan, not --top: every fitting candidate whose lower bound on its
  // step could still beat the best polished so far is polished, fastest first (a pruned
  // one's bound was at least the keep-th step, so it could not either), then the listed
  // ones not yet polished.
  void polish_and_rank() {
    std::vector<size_t> order(fitting_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return faster(fitting_[a], fitting_[b]); });
    std::vector<bool> polished(fitting_.size(), false);
    double best = std::numeric_limits<double>::infinity();
    for (size_t i : order) {
      if (fitting_bound_[i] >= best) continue;
      polish(fitting_[i]);
      polished[i] = true;
      best = std::min(best, fitting_[i].step_time);
    }
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return faster(fitting_[a], fitting_[b]); });
    const size_t listed = std::min(fitting_.size(), size_t(std::max(1, o_.keep)));
    for (size_t k = 0; k < listed; ++k)
      if (!polished[order[k]]) polish(fitting_[order[k]]);
    // Those polished now could not beat the first (their bound): it stays first.
    std::sort(order.begin() + long(std::min<size_t>(1, listed)), order.begin() + long(listed),
              [&](size_t a, size_t b) { return faster(fitting_[a], fitting_[b]); });
    for (size_t k = 0; k < listed; ++k) result_.ranked.push_back(fitting_[order[k]]);
  }

  // Notes why a degree or schedule does not apply (once per reason).
  void skip(const std::string& reason) {
    if (std::find(result_.skipped.begin(), result_.skipped.end(), reason) == result_.skipped.end())
      result_.skipped.push_back(reason);
  }

  // The micro-batch counts m of a replica's batch n to try: the one given or its divisors
  // up to kMaxSearchedMicroBatches, each with m and n / m samples within the plan
  // format's limit (a plan read_plan would refuse is no candidate); those left out noted.
  std::vector<int> micro_batch_counts(int dp, int64_t n) {
    const std::string replica =
        "dp " + std::to_string(dp) + ": a replica's batch of " + std::to_string(n) + " samples";
    const int64_t fewest = (n + kMaxPlanCount - 1) / kMaxPlanCount;  // at most 2^24 samples each
    const std::string limit = "micro-batches of at most " + std::to_string(kMaxPlanCount) +
                              " samples (the plan format's limit)";
    if (o_.micro_batches > 0) {
      const int64_t m = o_.micro_batches;
      if (n % m != 0) {
        skip("dp " + std::to_string(dp) + ": " + std::to_string(m) +
             " micro-batches do not divide a replica's batch of " + std::to_string(n));
        return {};
      }
      if (m < fewest) {
        skip(replica + " in " + std::to_string(m) + " micro-batches: expected " + limit +
             ", found " + std::to_string(n / m) + " (more micro-batches or replicas)");
        return {};
      }
      return {int(m)};
    }
    if (fewest > schedule::kMaxGeneratedMicroBatches) {
      skip(replica + ": more than " + std::to_string(schedule::kMaxGeneratedMicroBatches) +
           " (the schedules' limit) " + limit +
           " cannot hold it (more replicas or a smaller --batch)");
      return {};
    }
    std::vector<int> out;
    for (int64_t m : divisors(n, kMaxSearchedMicroBatches))
      if (m >= fewest) out.push_back(int(m));
    if (out.empty())
      skip(replica + ": in " + limit + " it needs more than the " +
           std::to_string(kMaxSearchedMicroBatches) +
           " micro-batches the search tries (--micro-batches asks for more)");
    return out;
  }

  // check_dp_sync on what a candidate with `dp` replicas and schedule `name` would write.
  bool dp_sync_allowed(int dp, const std::string& name) {
    Plan p;
    p.source = "--dp-sync";
    p.dp = dp;
    p.schedule = name;
    p.optimizer_sharding = o_.optimizer_sharding;
    p.dp_sync = o_.dp_sync;
    try {
      check_dp_sync(p);
    } catch (const InputError& e) {
      skip("dp " + std::to_string(dp) + ", " + name + ": " + e.what());
      return false;
    }
    return true;
  }

  // What the user fixed must fit the devices and the model: said as such rather than as
  // "no plan fits".
  void check_fixed(int N, int L) const {
    int64_t product = 1;
    // Ranks per host beyond the plan's processes would only say "one host", which 0 says.
    const int ps = o_.dp_sync.parameter_server() ? std::max(0, o_.dp_sync.ps_ranks) : 0;
    const int per_host = model_.machine().ranks_per_host;
    if (per_host > N + ps)
      throw InputError("--ranks-per-host: expected at most the plan's " + std::to_string(N + ps) +
                       " ranks (" + std::to_string(N) + " devices" +
                       (ps > 0 ? " and " + std::to_string(ps) + " parameter-server ranks" : "") +
                       "; 0, the default, puts them all on one host), found " +
                       std::to_string(per_host));
    for (auto [value, flag] :
         {std::pair{o_.tp, "--tp"}, std::pair{o_.pp, "--pp"}, std::pair{o_.dp, "--dp"},
          std::pair{o_.spatial, "--spatial"}, std::pair{o_.micro_batches, "--micro-batches"}})
      if (value < 0)
        throw InputError(std::string(flag) +
                         ": expected at least 1 (0 or absent: searched), found " +
                         std::to_string(value));
    // The synchronisation asked for against the sharding and the replicas fixed.
    const std::string mode = "\"" + std::string(dp_sync_name(o_.dp_sync.mode)) + "\"";
    const std::string sharding = std::string(sharding_name(o_.optimizer_sharding));
    if (o_.dp_sync.parameter_server() && o_.optimizer_sharding != OptimizerSharding::none)
      throw InputError(
          "--dp-sync: \"parameter-server\" shards the optimizer state over its servers itself; "
          "expected --optimizer-sharding none, found " +
          sharding);
    if (o_.dp_sync.independent() && o_.optimizer_sharding != OptimizerSharding::none)
      throw InputError("--dp-sync: " + mode +
                       " keeps a whole optimizer per replica; expected --optimizer-sharding none, "
                       "found " +
                       sharding);
    if (o_.dp == 1 && o_.dp_sync.mode != DpSync::Mode::allreduce)
      throw InputError("--dp-sync: " + mode +
                       " synchronises data-parallel replicas, and --dp 1 has none");
    // As --dp-sync: a dp-1 plan is written without sharding, so the flag had been dropped.
    if (o_.dp == 1 && o_.optimizer_sharding != OptimizerSharding::none)
      throw InputError("--optimizer-sharding: " + sharding +
                       " shards the optimizer state over data-parallel replicas, and --dp 1 has "
                       "none");
    if (o_.micro_batches > schedule::kMaxGeneratedMicroBatches)
      throw InputError("--micro-batches: expected at most " +
                       std::to_string(schedule::kMaxGeneratedMicroBatches) +
                       " (the schedules' limit), found " + std::to_string(o_.micro_batches));
    if (o_.keep < 1)
      throw InputError("--top: expected at least 1 plan to list, found " + std::to_string(o_.keep));
    for (auto [value, flag] : {std::pair{o_.tp, "--tp"}, std::pair{o_.pp, "--pp"},
                               std::pair{o_.dp, "--dp"}, std::pair{o_.spatial, "--spatial"}}) {
      if (value <= 0) continue;
      if (N % value != 0)
        throw InputError(std::string(flag) + ": expected a divisor of the " + std::to_string(N) +
                         " devices, found " + std::to_string(value));
      product *= value;
    }
    if (N % product != 0)
      throw InputError("--tp, --pp, --dp and --spatial: the degrees given multiply to " +
                       std::to_string(product) + ", which does not divide the " +
                       std::to_string(N) + " devices");
    if (o_.tp > 0 && o_.pp > 0 && o_.dp > 0 && o_.spatial > 0 && product != N)
      throw InputError("--tp, --pp, --dp and --spatial: expected degrees that multiply to the " +
                       std::to_string(N) + " devices, found " + std::to_string(product));
    if (o_.pp > L)
      throw InputError("--pp: expected at most the model's " + std::to_string(L) +
                       " layers (a pipeline rank holds at least one), found " +
                       std::to_string(o_.pp));
    if (!o_.layers_per_stage.empty()) {
      int64_t sum = 0;
      for (int n : o_.layers_per_stage) sum += n;
      if (sum != L)
        throw InputError("--layers-per-stage: expected counts that add up to the model's " +
                         std::to_string(L) + " layers, found " + std::to_string(sum));
    }
  }

  // Whether `name` on one pipeline rank with m micro-batches splits it into several
  // stages (a generator refusing one rank is no candidate there; nothing noted).
  bool several_chunks(const std::string& name, int m) {
    const schedule::Schedule* s = schedule_for(name, 1, m, false);
    return s != nullptr && s->num_stages() > 1;
  }

  const schedule::Schedule* schedule_for(const std::string& name, int pp, int m, bool note = true) {
    std::string key = name + "/" + std::to_string(pp) + "/" + std::to_string(m);
    auto it = schedules_.find(key);
    if (it != schedules_.end()) return it->second.get();
    std::unique_ptr<schedule::Schedule> s;
    try {
      s = std::make_unique<schedule::Schedule>(
          schedule::generate(name, pp, m, name == "interleaved-1f1b" ? o_.chunks : 0));
    } catch (const InputError& e) {
      if (note && !noted_.count(key))
        skip(name + " with " + std::to_string(pp) + " ranks and " + std::to_string(m) +
             " micro-batches: " + e.what());
      noted_.insert(key);
    }
    return schedules_.emplace(key, std::move(s)).first->second.get();
  }

  schedule::Simulator& simulator_for(const std::string& name, int pp, int m,
                                     const schedule::Schedule& s) {
    std::string key = name + "/" + std::to_string(pp) + "/" + std::to_string(m);
    auto it = sims_.find(key);
    if (it != sims_.end()) return *it->second;
    schedule::LowerOptions lo;
    lo.transfers = false;
    auto sim = std::make_unique<schedule::Simulator>(schedule::lower(s, lo), name);
    return *sims_.emplace(key, std::move(sim)).first->second;
  }

  // What a candidate's ranks hold per parameter byte (DualPipe holds each chunk on two
  // pipeline ranks, whose parameters keep their whole state), and its caches' key.
  PersistentCopies copies_of(int dp, const std::string& schedule) const {
    return persistent_copies(opt_states_, o_.optimizer_sharding, o_.dp_sync, dp,
                             schedule != "dualpipe");
  }
  static std::string copies_key(const PersistentCopies& c) {
    return "/z" + std::to_string(c.whole) + "." + std::to_string(c.sharded) + "." +
           std::to_string(c.shard_over) + "." + std::to_string(c.shared_extra);
  }

  // The spatial split at degree sp (cached; null, with the reason noted, when the model
  // cannot be tiled so: no image input, strides or halos that do not fit the tiles).
  const SpatialSplit* spatial_split(int sp) {
    auto it = splits_.find(sp);
    if (it != splits_.end()) return it->second.get();
    std::unique_ptr<SpatialSplit> split;
    try {
      split = std::make_unique<SpatialSplit>(plan_spatial(*g_, sp, "--spatial"));
      bool any = false;
      for (bool t : split->tiled) any = any || t;
      if (!any) {  // nothing to tile (no image input): not a candidate
        split.reset();
        if (o_.spatial > 0)
          skip("spatial " + std::to_string(sp) + ": the model has no image input to tile");
      }
    } catch (const InputError& e) {
      if (o_.spatial > 0) skip("spatial " + std::to_string(sp) + ": " + e.what());
    }
    return splits_.emplace(sp, std::move(split)).first->second.get();
  }

  // The table of a degree: tensor-parallel tp, and with sp > 1 the table of a tile of
  // the channel shard: 1/sp of every layer's time (its collectives' too) and activations,
  // its halos' transfers (C / tp rows where the input is split by channels) and its
  // exchanges with the group at what the profile measured (schedule_costs' spatial stage,
  // whose co-location slowdown the candidate's costs apply) added to F and B.
  const CostTable& table_of(int tp, int sp, int64_t b) {
    if (sp <= 1) return model_.table(tp, b, o_.splits, "--tp");
    const std::string key = std::to_string(tp) + "/" + std::to_string(sp) + "/" + std::to_string(b);
    auto it = spatial_tables_.find(key);
    if (it != spatial_tables_.end()) return it->second;
    CostTable t = model_.table(tp, b, o_.splits, "--tp");
    const Sharding& sharding = model_.sharding(tp, b, o_.splits, "--tp");
    const SpatialSplit& split = *spatial_split(sp);
    const double d = double(sp);
    const Machine& machine = model_.machine();
    const int host =
        machine.ranks_per_host > 0 ? std::min(machine.ranks_per_host, o_.devices) : o_.devices;
    for (size_t l = 0; l < t.layers.size(); ++l) {
      LayerCost& lc = t.layers[l];
      const double halo_bytes = spatial_halo_bytes(*g_, split, int(l), int(l) + 1, b, &sharding);
      const SpatialLayerExtra e =
          spatial_layer_extra(*g_, split, int(l), b, &sharding, machine, host);
      lc.f = lc.f / d + e.forward;
      lc.b = lc.b / d + e.backward;
      lc.w /= d;
      // A tile's tensors are 1/sp of the layer's and its convolutions' inputs carry the
      // halo rows besides (stashed for B and W; their gradients come back in B).
      const int64_t h = int64_t(std::ceil(halo_bytes));
      for (MicroBatchMemory* m : {&lc.mem, &lc.mem_recompute}) {
        for (int64_t* x : {&m->stash, &m->w_stash, &m->forward_peak, &m->backward_peak,
                           &m->weight_peak, &m->held_through_backward, &m->fused_peak})
          *x = (*x + sp - 1) / sp + h;
        m->forward_peak += h;
        m->backward_peak += h;
        m->fused_peak += h;
      }
    }
    for (double& x : t.cut_bytes) x /= d;
    for (int64_t& x : t.input_bytes) x = (x + sp - 1) / sp;
    for (size_t l = 0; l < t.layers.size(); ++l) {
      t.pf[l + 1] = t.pf[l] + t.layers[l].f;
      t.pb[l + 1] = t.pb[l] + t.layers[l].b;
      t.pw[l + 1] = t.pw[l] + t.layers[l].w;
    }
    return spatial_tables_.emplace(key, std::move(t)).first->second;
  }

  // Per-layer costs for the cut (times in ticks), shared by every cut at (tp, b, rc) and
  // the same persistent copies.
  std::shared_ptr<const PreparedCosts> prepared(int tp, int64_t b, bool rc, const CostTable& t,
                                                const PersistentCopies& copies) {
    std::string key = std::to_string(tp) + "/" + std::to_string(b) + "/" + std::to_string(rc) +
                      copies_key(copies);
    auto it = prepared_.find(key);
    if (it != prepared_.end()) return it->second;
    LayerCosts c = layer_costs(t, rc, copies);
    auto p = std::make_shared<const PreparedCosts>(std::move(c));
    prepared_[key] = p;
    return p;
  }

  struct Pending {
    int tp, sp, pp, dp, m;
    int64_t b;
    std::string name;
    bool rc;
    double lower_bound;
  };

  // The time-optimal cut (shared by every schedule with K stages at the same degree,
  // micro-batch size and recompute choice): a bound for the candidate and the cut itself
  // when it fits the memory.
  const CutResult& time_cut(int tp, int64_t b, bool rc, int K,
                            const std::shared_ptr<const PreparedCosts>& costs,
                            const PersistentCopies& copies) {
    std::string key = std::to_string(tp) + "/" + std::to_string(b) + "/" + std::to_string(rc) +
                      "/" + std::to_string(K) + copies_key(copies);
    auto it = time_cuts_.find(key);
    if (it != time_cuts_.end()) return it->second;
    std::vector<CutStage> st(static_cast<size_t>(K));
    for (int k = 0; k < K && !o_.layers_per_stage.empty(); ++k)
      st[size_t(k)].fixed_layers = o_.layers_per_stage[size_t(k)];
    return time_cuts_.emplace(key, Cutter({costs}, st).solve()).first->second;
  }

  // The caches' degree: tp, or -(sp, tp) for a spatial split (tp < 2^16).
  static int degree_key(int tp, int sp) { return sp > 1 ? -(sp * 65536 + tp) : tp; }

  void enumerate(int tp, int sp, int pp, int dp, int m, int64_t b, const std::string& name,
                 bool rc) {
    const schedule::Schedule* s = schedule_for(name, pp, m);
    if (s == nullptr) return;
    const int K = s->stages_per_direction();
    if (K > g_->num_layers()) {
      skip(name + " on " + std::to_string(pp) + " ranks: " + std::to_string(K) +
           " stages, but the model has " + std::to_string(g_->num_layers()) +
           " layers (a stage holds at least one)");
      return;
    }
    if (!o_.layers_per_stage.empty() && int(o_.layers_per_stage.size()) != K) {
      std::string key = "layers/" + name + std::to_string(K);
      if (!noted_.count(key))
        skip(name + " on " + std::to_string(pp) + " ranks: " + std::to_string(K) + " stages, but " +
             std::to_string(o_.layers_per_stage.size()) + " layer counts were given" +
             (name == "interleaved-1f1b" && o_.layers_per_stage.size() % size_t(pp) == 0
                  ? " (--chunks " + std::to_string(o_.layers_per_stage.size() / size_t(pp)) +
                        " gives each rank that many)"
                  : ""));
      noted_.insert(key);
      return;
    }
    // Micro-batches too large for the estimate's int64 bytes fit no device either.
    auto [bytes, fresh] = batch_bytes_.try_emplace(b, 0.0);
    if (fresh) bytes->second = micro_batch_bytes_bound(*g_, b);
    if (bytes->second * double(m + 1) > kCountableBytes) {
      skip(std::to_string(m) + " micro-batches of " + std::to_string(b) +
           " samples: more than the 2^62 bytes the memory estimate counts");
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    const CostTable& table = table_of(tp, sp, b);
    const int key = degree_key(tp, sp);
    const PersistentCopies copies = copies_of(dp, name);
    auto costs = prepared(key, b, rc, table, copies);
    auto t1 = std::chrono::steady_clock::now();
    const CutResult& cut = time_cut(key, b, rc, K, costs, copies);
    auto t2 = std::chrono::steady_clock::now();
    phase_[0] += std::chrono::duration<double>(t1 - t0).count();
    phase_[1] += std::chrono::duration<double>(t2 - t1).count();
    if (!cut.feasible) return;
    // Every rank runs its stages' micro-batches one after another: the slowest stage's
    // work over the step bounds the step from below (whatever the memory cut does).
    double ticks = double(int64_t(1) << 50) / std::max(table.total_time(rc), 1e-30);
    const int per_direction = m / s->num_directions;  // whole micro-batches
    double bound = double(per_direction) * double(cut.bottleneck) / ticks;
    pending_.push_back({tp, sp, pp, dp, m, b, name, rc, bound});
  }

  void evaluate(const Pending& p) {
    const int tp = p.tp, sp = p.sp, pp = p.pp, dp = p.dp, m = p.m;
    const int64_t b = p.b;
    const std::string& name = p.name;
    const bool rc = p.rc;
    const schedule::Schedule* s = schedule_for(name, pp, m);
    // enumerate() queued only the candidates whose stage count matches the layer counts.
    const int K = s->stages_per_direction();
    const CostTable& table = table_of(tp, sp, b);
    const int key = degree_key(tp, sp);
    const PersistentCopies copies = copies_of(dp, name);
    auto costs = prepared(key, b, rc, table, copies);

    // Stage constraints: one stage per rank and direction gives the rank's exact peak
    // terms; several stages per rank (interleaved, V, DualPipe) split the capacity
    // evenly and count each stage alone (an upper bound of the rank's peak).
    std::vector<CutStage> stages(static_cast<size_t>(K));
    std::vector<std::vector<int>> holders(static_cast<size_t>(K));
    for (int st = 0; st < s->num_stages(); ++st)
      holders[size_t(schedule::stage_chunk(*s, st))].push_back(st);
    for (int k = 0; k < K; ++k) {
      CutStage& cs = stages[size_t(k)];
      cs.costs = 0;
      if (!o_.layers_per_stage.empty()) cs.fixed_layers = o_.layers_per_stage[size_t(k)];
      for (int st : holders[size_t(k)]) {
        int rank = s->placement[size_t(st)];
        int n_on_rank = int(schedule::stages_of_rank(*s, rank).size());
        std::vector<PeakTerm> terms =
            n_on_rank == 1 ? peak_terms(*s, rank) : peak_terms_of_stage(*s, rank, st);
        cs.terms.insert(cs.terms.end(), terms.begin(), terms.end());
        if (o_.device_memory > 0) {
          int64_t cap = o_.device_memory / n_on_rank;
          cs.capacity = cs.capacity == 0 ? cap : std::min(cs.capacity, cap);
        }
      }
    }
    // The time-optimal cut first; when it fits the capacity it is also the optimum under it.
    CutResult cut = time_cut(key, b, rc, K, costs, copies);
    Cutter cutter({costs}, stages);
    bool fits = true;
    for (int k = 0; k < K; ++k)
      fits = fits && cutter.fits_memory(k, cut.bounds[size_t(k)], cut.bounds[size_t(k + 1)]);
    CutResult time_only = cut;
    auto t0 = std::chrono::steady_clock::now();
    if (!fits) {
      cut = cutter.solve(time_only.bottleneck);
      ++memory_cuts_;
    }
    phase_[2] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    result_.evaluated++;
    // The cut splits a rank's capacity evenly between its stages, where the candidate's
    // peak is the rank's whole: that peak decides. So the time-optimal cut comes first
    // even when the split refused it, then the cut made under the split.
    bool starved = false;  // over by the bound alone where the exact budget was spent
    // The cut least over the capacity of those tried (its peak exact where checked): the
    // descent follows the composed bound, which may rise where the exact peak falls.
    int64_t least_peak = INT64_MAX;
    int least_rank = 0;
    std::vector<int> least_at;
    std::vector<int64_t> least_peaks;
    auto fits_capacity = [&](Candidate& c, const std::vector<int>& at) {
      if (o_.device_memory <= 0 || c.peak <= o_.device_memory) return true;
      bool ok = false;
      if (could_enter(c.step_time) && !exact_check_left())
        starved = true;
      else if (could_enter(c.step_time))
        ok = fits_exactly(c);
      if (!ok && c.peak < least_peak) {
        least_peak = c.peak;
        least_rank = c.peak_rank;
        least_at = at;
        least_peaks = c.rank_peaks;
      }
      return ok;
    };
    Candidate c = make_candidate(tp, sp, pp, dp, m, b, name, rc, *s, time_only, table, *costs);
    int64_t bound = c.peak;  // the composed peak, before an exact check replaces it
    std::vector<int> bounds = time_only.bounds;
    bool fits_memory = fits_capacity(c, bounds);
    std::set<std::vector<int>> tried = {time_only.bounds};
    // Makes the cut `at` the candidate when it fits or lowers the bound.
    std::vector<int64_t> tried_peaks = c.rank_peaks;  // the last cut tried's, per rank
    auto try_cut = [&](const std::vector<int>& at) {
      CutResult other{.feasible = true, .bounds = at, .bottleneck = cutter.bottleneck(at)};
      Candidate under = make_candidate(tp, sp, pp, dp, m, b, name, rc, *s, other, table, *costs);
      const int64_t under_bound = under.peak;
      fits_memory = fits_capacity(under, at);
      tried_peaks = under.rank_peaks;
      if (!fits_memory && under_bound >= bound) return false;
      c = std::move(under);
      bound = under_bound;
      return true;
    };
    std::vector<int> last_tried = bounds;
    if (!fits_memory && cut.feasible && tried.insert(cut.bounds).second) {
      last_tried = cut.bounds;
      if (try_cut(cut.bounds)) bounds = cut.bounds;
    }
    // The cut counts the stages' tensors, not the executor's buffers nor a W's transients,
    // so a cut within its capacities may still leave a rank over. Each stage of a rank
    // over is cut again with room for what the cut left out: its capacity lowered to what
    // the cut counted of it less the rank's overshoot (shared by the rank's stages),
    // learnt from the last cut tried (exactly where it was checked so), a few times.
    if (!fits_memory && o_.device_memory > 0 && o_.layers_per_stage.empty() &&
        fits_capacity_some_cut(costs->persistent(0, g_->num_layers()), holders, pp)) {
      std::vector<CutStage> lowered = stages;
      for (int round = 0; round < kRecuts && !fits_memory; ++round) {
        bool over = false, room = true;
        for (int k = 0; k < K; ++k)
          for (int st : holders[size_t(k)]) {
            const int rank = s->placement[size_t(st)];
            const int64_t excess = tried_peaks[size_t(rank)] - o_.device_memory;
            if (excess <= 0) continue;
            const int64_t n = int64_t(schedule::stages_of_rank(*s, rank).size());
            const int64_t counted =
                cutter.memory(k, last_tried[size_t(k)], last_tried[size_t(k + 1)]);
            CutStage& cs = lowered[size_t(k)];
            cs.capacity = std::min(cs.capacity, counted - (excess + n - 1) / n);
            room = room && cs.capacity > 0;  // (a capacity of 0 would mean unlimited)
            over = true;
          }
        if (!over || !room) break;  // only a parameter-server rank over, or no room left
        const CutResult again = Cutter({costs}, lowered).solve(time_only.bottleneck);
        ++memory_cuts_;
        if (!again.feasible || !tried.insert(again.bounds).second) break;
        last_tried = again.bounds;
        if (try_cut(again.bounds)) bounds = again.bounds;
      }
    }
    // Where a rank holds several stages, the cut under the split above counts each stage
    // at its own peak, as if a rank's stages peaked together, and may refuse every cut
    // that fits the rank as a whole (DualPipe's embedding alone in one chunk, say); and
    // where it holds one, the cuts again with room for the buffers may still miss (the
    // overshoot differs from cut to cut, or only the exact check fits). So layers move
    // from one stage to another, to the neighbouring cut of the least rank peak, until a
    // cut fits or no move lowers the peak: the first fitting cut met on the way down from
    // the fastest. Moves start at L / 64 layers and halve down to one when none helps.
    // Skipped when no cut can fit (fits_capacity_some_cut).
    const int L = g_->num_layers();
    if (!fits_memory && o_.device_memory > 0 && o_.layers_per_stage.empty() &&
        fits_capacity_some_cut(costs->persistent(0, L), holders, pp) && could_enter(c.step_time)) {
      const auto t_descent = std::chrono::steady_clock::now();
      int step = std::max(1, L / 64);
      while (!fits_memory && descent_work_ < kDescentWork) {
        std::vector<int> next = bounds;
        // `step` layers from stage a to stage z, the stages between keeping their sizes.
        for (int a = 0; a < K && !fits_memory; ++a)
          for (int z = 0; z < K && !fits_memory; ++z) {
            if (a == z || bounds[size_t(a) + 1] - bounds[size_t(a)] <= step) continue;
            std::vector<int> at = bounds;
            for (int t = std::min(a, z) + 1; t <= std::max(a, z); ++t)
              at[size_t(t)] += a < z ? -step : step;
            if (!tried.insert(at).second) continue;
            descent_work_ += L;
            ++moved_cuts_;
            if (try_cut(at)) next = std::move(at);
          }
        if (next != bounds) {
          bounds = std::move(next);
          continue;
        }
        if (step == 1) break;
        step /= 2;
      }
      phase_[2] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_descent).count();
    }
    phase_[3] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!fits_memory) {
      if (least_peak < c.peak) {
        const CutResult at{.feasible = true, .bounds = least_at};
        c = make_candidate(tp, sp, pp, dp, m, b, name, rc, *s, at, table, *costs);
        c.peak = least_peak;
        c.peak_rank = least_rank;
        c.rank_peaks = least_peaks;
      }
      c.fits = false;
      c.over = o_.device_memory > 0 ? double(c.peak) / double(o_.device_memory) : 0;
      result_.rejected++;
      if (starved) starved_.push_back(p);
      if (!closest_ || c.over < closest_->over) closest_ = c;
      return;
    }
    fitting_.push_back(std::move(c));
    fitting_bound_.push_back(p.lower_bound);
  }

  // Whether some cut may fit: a rank holds at least the average of the ranks' parameters,
  // gradients and state (`persistent` in all), each chunk on `least holders` ranks.
  bool fits_capacity_some_cut(int64_t persistent, const std::vector<std::vector<int>>& holders,
                              int pp) const {
    size_t least_holders = holders.front().size();
    for (const std::vector<int>& h : holders) least_holders = std::min(least_holders, h.size());
    return double(persistent) * double(least_holders) / pp <= double(o_.device_memory);
  }
  static constexpr int kRecuts = 4;

 public:
  // The list is at least this long whatever --top (entry_time).
  static constexpr int kKept = 8;

 private:
  // The step time a candidate must beat to enter the list (infinite while it is short).
  // At least kKept long whatever --top: which candidates over the composed bound are
  // checked exactly (and so fit) then does not hang on how many plans a user lists.
  double entry_time() const {
    const size_t keep = size_t(std::max(kKept, o_.keep));
    if (fitting_.size() < keep) return std::numeric_limits<double>::infinity();
    std::vector<double> times;
    for (const Candidate& f : fitting_) times.push_back(f.step_time);
    std::nth_element(times.begin(), times.begin() + long(keep - 1), times.end());
    return times[keep - 1];
  }
  bool could_enter(double step_time) const { return step_time < entry_time(); }

  // The composed peak bounds the exact one from above, loosely where the executor's
  // buffers and a W's transients stack on the activations: a candidate over the capacity
  // by that bound which could still enter the list is evaluated as `baton plan --check`
  // evaluates it before it is turned away. That builds every rank's physical graph, so a
  // search does it for at most kExactWork layers times devices in all (a 10-layer model
  // on 4 devices gets 1638 checks of a few milliseconds; a 10,000-layer one, seconds a
  // check, gets none), the candidates with the lowest bound on their time first. Sets
  // c's peak to the exact one.
  static constexpr int64_t kExactWork = int64_t(1) << 16;
  bool fits_exactly(Candidate& c) {
    ++result_.exact_checks;
    const ResolvedPlan r = resolve_plan(c.plan, g_);
    const PlanEstimate e = evaluate_plan(r, model_);
    c.peak = 0;
    c.rank_peaks.assign(size_t(c.plan.pp), 0);
    for (const RankEstimate& re : e.ranks) {
      if (re.peak > c.peak) {
        c.peak = re.peak;
        c.peak_rank = re.rank < r.layout.world() ? re.coord.pp : -1;
      }
      if (re.rank < r.layout.world())
        c.rank_peaks[size_t(re.coord.pp)] = std::max(c.rank_peaks[size_t(re.coord.pp)], re.peak);
    }
    return e.fits();
  }

  bool exact_check_left() const { return result_.exact_checks < exact_limit_; }
  // The checks a search's budget pays for: kExactWork (or the options' exact_work) over
  // layers times devices.
  int64_t exact_allowance() const {
    const int64_t work = o_.exact_work > 0 ? o_.exact_work : kExactWork;
    return work / (std::max(1, g_->num_layers()) * int64_t(std::max(1, o_.devices)));
  }

  // The faster candidates' moves between stages may spend every exact check, and a slower
  // one (recompute on, say) that fits exactly is then turned away on its loose composed
  // bound. So when nothing fits, the candidates the budget cut short are evaluated again,
  // the lowest bound on their time first, each with an equal share of a fresh budget;
  // those still cut short are counted (`bound_only`) for the message.
  void retry_starved() {
    if (fitting_.empty() && !starved_.empty()) {
      const std::vector<Pending> again = std::move(starved_);
      starved_.clear();
      const int64_t share = std::max<int64_t>(1, exact_allowance() / int64_t(again.size()));
      for (const Pending& p : again) {
        if (p.lower_bound >= entry_time()) break;
        exact_limit_ = result_.exact_checks + share;
        --result_.evaluated;  // counted once, as it ends now
        --result_.rejected;
        evaluate(p);
      }
      exact_limit_ = result_.exact_checks + share;  // the polish of what it found
    }
    result_.bound_only = fitting_.empty() ? int(starved_.size()) : 0;
  }

  // The cut minimises the slowest stage, but the step is the schedule's: under 1F1B the
  // last stage's work also sits in the fill and the drain, so a cut a layer off may run
  // faster. A listed candidate moves one layer from one stage to another (the stages
  // between shifting by one), the move that lowers the simulated step time most, while
  // one does and the cut still fits (its composed peak, or the exact check), up to
  // kPolishMoves moves and kPolishCuts cuts tried in a search.
  static constexpr int kPolishMoves = 16, kPolishCuts = 4096;
  void polish(Candidate& c) {
    if (!o_.layers_per_stage.empty()) return;
    const Plan& p = c.plan;
    const int tp = p.tp.front(), pp = p.pp, dp = p.dp, m = p.micro_batches;
    const int sp = p.has_spatial() ? p.stages.front().spatial : 1;
    const int64_t b = p.micro_batch_size;
    const bool rc = p.stages.front().recompute_all;
    const std::string name = p.schedule;
    const schedule::Schedule* s = schedule_for(name, pp, m);
    const CostTable& table = table_of(tp, sp, b);
    const auto costs = prepared(degree_key(tp, sp), b, rc, table, copies_of(dp, name));
    std::vector<int> bounds;
    for (const PlanStage& st : p.stages) bounds.push_back(st.first_layer);
    bounds.push_back(p.stages.back().last_layer);
    const int K = int(p.stages.size());
    for (int move = 0; move < kPolishMoves; ++move) {
      std::optional<Candidate> best;
      std::vector<int> best_at;
      for (int a = 0; a < K; ++a)
        for (int z = 0; z < K; ++z) {
          if (a == z || bounds[size_t(a) + 1] - bounds[size_t(a)] <= 1 ||
              polish_cuts_ >= kPolishCuts)
            continue;
          std::vector<int> at = bounds;
          for (int t = std::min(a, z) + 1; t <= std::max(a, z); ++t)
            at[size_t(t)] += a < z ? -1 : 1;
          ++polish_cuts_;
          const CutResult cut{.feasible = true, .bounds = at};
          Candidate n = make_candidate(tp, sp, pp, dp, m, b, name, rc, *s, cut, table, *costs);
          // Faster by more than rounding, and within the capacity.
          if (n.step_time >= (best ? best->step_time : c.step_time) * (1 - 1e-9)) continue;
          if (o_.device_memory > 0 && n.peak > o_.device_memory &&
              !(exact_check_left() && fits_exactly(n)))
            continue;
          best = std::move(n);
          best_at = std::move(at);
        }
      if (!best) break;
      c = std::move(*best);
      bounds = std::move(best_at);
    }
  }

  Candidate make_candidate(int tp, int sp, int pp, int dp, int m, int64_t b,
                           const std::string& name, bool rc, const schedule::Schedule& s,
                           const CutResult& cut, const CostTable& table,
                           const PreparedCosts& costs) {
    Candidate c;
    Plan& p = c.plan;
    p.model_path = o_.model_path;
    p.model_path_resolved = o_.model_path;
    p.model_json = o_.model_json;
    p.devices = o_.devices;
    p.device_memory = o_.device_memory;
    p.dp = dp;
    p.pp = pp;
    p.tp.assign(size_t(pp), tp);
    p.schedule = name;
    p.micro_batches = m;
    if (name == "interleaved-1f1b") p.chunks = o_.chunks;
    p.micro_batch_size = b;
    p.global_batch = o_.global_batch;
    p.optimizer = o_.optimizer;
    p.optimizer_sharding = dp > 1 ? o_.optimizer_sharding : OptimizerSharding::none;
    p.dp_sync = dp > 1 ? o_.dp_sync : DpSync{};
    p.splits = o_.splits.kinds;
    const int K = s.stages_per_direction();
    ResolvedPlan r;
    r.graph = g_;
    r.schedule = s;
    // Its tiles are ranks too: the ranks sharing a host (the co-located slowdown, the
    // cores time-sliced) count them.
    r.layout = Layout(dp, p.tp, std::vector<int>(size_t(pp), sp));
    for (int k = 0; k < K; ++k) {
      PlanStage st;
      st.first_layer = cut.bounds[size_t(k)];
      st.last_layer = cut.bounds[size_t(k + 1)];
      st.recompute_all = rc;
      p.stages.push_back(st);
      r.chunk_first.push_back(st.first_layer);
      r.chunk_last.push_back(st.last_layer);
      // Recompute is added to the times below from prefix sums: a set of every layer of
      // a 10,000-layer model per candidate costs more than the rest of the candidate.
      r.recompute.emplace_back();
    }
    for (int st = 0; st < s.num_stages(); ++st)
      r.chunk_of_stage.push_back(schedule::stage_chunk(s, st));
    for (int k = 0; k < K; ++k) {
      std::set<int> ranks;
      for (int st = 0; st < s.num_stages(); ++st)
        if (r.chunk_of_stage[size_t(st)] == k) ranks.insert(s.placement[size_t(st)]);
      p.stages[size_t(k)].pipeline_ranks.assign(ranks.begin(), ranks.end());
    }
    r.plan = p;
    // Memory per rank: each chunk composed from its layers, walked over the rank's actions.
    std::vector<StageMemory> chunk_mem(static_cast<size_t>(K)), mem;
    for (int k = 0; k < K; ++k) {
      int a = r.chunk_first[size_t(k)], e = r.chunk_last[size_t(k)];
      StageMemory& sm = chunk_mem[size_t(k)];
      sm.params = costs.persistent(a, e);  // parameters, gradients and state together
      sm.mb = costs.micro_batch(a, e);
    }
    for (int st = 0; st < s.num_stages(); ++st)
      mem.push_back(chunk_mem[size_t(r.chunk_of_stage[size_t(st)])]);
    // The executor's buffers (evaluate.h's rank_buffers), bounded from the table without
    // a physical graph, so that a candidate's peak still bounds its exact evaluation:
    // - throughout: the staged inputs;
    // - at each compute action: the receives posted ahead, two sends not yet taken (an
    //   overlapped F and B), the TP collectives' scratch, and at a W where gradients
    //   leave during the backward (zero2's reduce-scatters, the all-reduces of tied
    //   parameters that the last W starts) their buckets;
    // - at the step's end, once the activations are gone: the reduced gradients' flat
    //   copies (all of the rank's across replicas or DualPipe's two directions, else the
    //   tied ones) and the reductions' scratch, STEP's vector, or ZeRO's all-gather.
    const EvaluateOptions eo;
    int64_t inputs = 0, max_cut = 0;
    for (int64_t x : table.input_bytes) inputs += x + 128;
    for (double x : table.cut_bytes) max_cut = std::max(max_cut, int64_t(x) + 256);
    auto scratch = [](int64_t bytes, size_t esize) {
      return int64_t(transport::all_reduce_scratch_bound(size_t(bytes) / esize + 1, esize));
    };
    const bool tied = pp > 1 && !table.shared_params.empty();
    const bool all_reduced = dp > 1 || s.num_directions > 1 || sp > 1;
    const bool zero2 = dp > 1 && p.optimizer_sharding == OptimizerSharding::zero2;
    const int64_t slots = int64_t(g_->num_layers()) + int64_t(dp) * m;
    // A value between stages: between ranks, or between one rank's chunks at pp 1.
    const bool boundary = s.num_stages() > 1;
    const int64_t sends = boundary ? 2 * max_cut : 0,
                  recvs = boundary ? eo.recv_ahead * max_cut : 0;
    const int64_t tp_scratch = tp > 1 || sp > 1 ? scratch(max_cut, 4) : 0;
    int64_t largest_bucket = int64_t(eo.bucket_bytes);  // or the largest layer's parameters
    for (int64_t x : table.own_param_bytes) largest_bucket = std::max(largest_bucket, x);
    for (const ParamUse& u : table.shared_params)
      largest_bucket = std::max(largest_bucket, u.bytes);
    auto buffers = [&](int rank) {
      int64_t grads = 0, shared = 0;
      std::set<int> used;
      for (int st : schedule::stages_of_rank(s, rank)) {
        int k = r.chunk_of_stage[size_t(st)];
        const int a = r.chunk_first[size_t(k)], e = r.chunk_last[size_t(k)];
        grads += table.param_bytes(a, e);
        for (const ParamUse& u : table.shared_params)
          for (int l : u.layers)
            if (l >= a && l < e && used.insert(u.param).second) shared += u.bytes;
      }
      auto held = [&](int64_t bytes) {  // flat copies (rounded per bucket) and two scratches
        return bytes > 0 ? bytes + bytes / 64 + 4096 + 2 * scratch(bytes, 4) : 0;
      };
      const int64_t reduced = held(all_reduced ? grads : tied ? shared : 0);
      // zero2: a bucket's gradients while it fills and its flat copy, each at most the
      // largest bucket.
      const int64_t in_w =
          held((zero2 ? std::min(grads, 2 * largest_bucket) : 0) + (tied ? shared : 0));
      RankBuffers rb;
      // The loader's micro-batches; the step's losses (evaluate.h's rank_buffers counts
      // them on the rank computing the loss).
      std::vector<bool> reads(size_t(s.num_stages()), false);
      for (int st : schedule::stages_of_rank(s, rank)) {
        const int k = r.chunk_of_stage[size_t(st)];
        for (int l = r.chunk_first[size_t(k)]; l < r.chunk_last[size_t(k)]; ++l)
          if (table.input_bytes[size_t(l)] > 0) reads[size_t(st)] = true;
      }
      rb.loader =
          loader_micro_batches(s, rank, reads, eo.input_ahead, p.device == "cuda") * inputs +
          int64_t(m) * 64;
      for (const schedule::Action& a : s.ranks[size_t(rank)]) {
        const bool w = a.kind == schedule::ActionKind::backward_weight ||
                       a.kind == schedule::ActionKind::full_backward;
        rb.posted.push_back(recvs + sends + tp_scratch + (w ? in_w : 0));
      }
      rb.reduction = sends + reduced;
      rb.step = sends + 2 * (slots * 8 + 64) + scratch(slots * 8, 8);
      rb.gather = reduced;
      return rb;
    };
    c.rank_peaks.assign(size_t(pp), 0);
    for (int rank = 0; rank < pp; ++rank) {
      const int64_t peak = rank_peak(s, rank, mem, buffers(rank));
      c.rank_peaks[size_t(rank)] = peak;
      if (peak > c.peak) {
        c.peak = peak;
        c.peak_rank = rank;
      }
    }
    // Extra parameter-server ranks hold their part of every served parameter, whatever
    // the cut: a candidate whose servers exceed the capacity does not fit either.
    if (const int64_t server = ps_server_peak_bound(r, table, opt_states_, eo.bucket_bytes);
        server > c.peak) {
      c.peak = server;
      c.peak_rank = -1;
    }
    schedule::Costs sc = schedule_costs(r, table, model_.machine(), mem);
    // Recompute runs F again in B, its measured collectives' extra too (tp_collective),
    // slowed as schedule_costs slows the ops.
    if (rc) {
      const Machine& machine = model_.machine();
      const double slow = compute_slowdown(r, machine);
      const int host =
          machine.ranks_per_host > 0 ? std::min(machine.ranks_per_host, r.world()) : r.world();
      const bool measured = !machine.tp_collective.empty();
      for (int st = 0; st < s.num_stages(); ++st) {
        const int k = r.chunk_of_stage[size_t(st)];
        const int a = r.chunk_first[size_t(k)], e = r.chunk_last[size_t(k)];
        double collectives = 0;
        for (int l = a; measured && l < e; ++l) {
          const LayerCost& lc = table.layers[size_t(l)];
          collectives += lc.tp_forward_collectives * tp_collective_extra(machine, lc.tp, host);
        }
        sc.backward_input[size_t(st)] +=
            slow * (table.pf[size_t(e)] - table.pf[size_t(a)] + collectives);
      }
    }
    const schedule::SimResult& sim = simulator_for(name, pp, m, s).run(sc);
    c.step_time = sim.makespan;
    c.bubble = sim.bubble;
    // The spatial degree goes into the plan only now: the tile's table already holds its
    // 1/sp (schedule_costs would divide again).
    if (sp > 1) {
      c.plan.spatial.assign(size_t(pp), sp);
      for (PlanStage& st : c.plan.stages) st.spatial = sp;
    }
    const double tokens_per_step = double(o_.global_batch) * double(rate_units_per_sample(*g_));
    c.tokens_per_second = c.step_time > 0 ? tokens_per_step / c.step_time : 0;
    c.plan.predicted = {{"step_time_s", c.step_time},
                        {"bubble", c.bubble},
                        {"tokens_per_s", c.tokens_per_second},
                        {"time_model", model_.measured() ? "measured" : "analytic"}};
    return c;
  }

  std::shared_ptr<const Graph> g_;
  CostModel& model_;
  const SearchOptions& o_;
  int opt_states_;
  SearchResult result_;
  std::vector<Candidate> fitting_;
  std::vector<double> fitting_bound_;  // each one's Pending::lower_bound
  std::optional<Candidate> closest_;
  std::map<std::string, std::unique_ptr<schedule::Schedule>> schedules_;
  std::map<std::string, std::unique_ptr<schedule::Simulator>> sims_;
  std::map<std::string, std::shared_ptr<const PreparedCosts>> prepared_;
  std::map<std::string, CutResult> time_cuts_;
  std::map<int, std::unique_ptr<SpatialSplit>> splits_;
  std::map<std::string, CostTable> spatial_tables_;
  std::map<int64_t, double> batch_bytes_;  // micro_batch_bytes_bound per micro-batch size
  std::vector<Pending> pending_;
  std::vector<Pending> starved_;    // turned away with the exact budget spent, in bound order
  int64_t exact_limit_;             // exact_checks at which the budget is spent
  double phase_[4] = {0, 0, 0, 0};  // tables, time cuts, memory cuts, memory + simulation
  int memory_cuts_ = 0;
  // Layers times candidates the descent over cuts of several stages per rank may cost in
  // one search (each candidate a walk of its ranks' actions over the cut's layers).
  static constexpr int64_t kDescentWork = int64_t(1) << 22;
  int64_t descent_work_ = 0;
  int moved_cuts_ = 0;
  int polish_cuts_ = 0;
  std::set<std::string> noted_;
};

}  // namespace

SearchResult search_plans(std::shared_ptr<const Graph> graph, CostModel& model,
                          const SearchOptions& options) {
  // A plan of more ranks would be refused when read (layout.h).
  if (options.devices < 1 || options.devices > kMaxWorld)
    throw InputError("--devices: expected from 1 to " + std::to_string(kMaxWorld) +
                     " devices, found " + std::to_string(options.devices));
  // Here for every front end (baton plan, Python's plan()): the generator's own refusal had
  // come once per candidate, deep in the search.
  if (options.chunks < 0 || options.chunks > 64)
    throw InputError("--chunks: expected 1 to 64 model chunks per pipeline rank (0: 2), found " +
                     std::to_string(options.chunks));
  if (options.chunks > 0 && !options.schedules.empty() &&
      std::none_of(options.schedules.begin(), options.schedules.end(), [](const std::string& n) {
        return schedule::canonical_training_schedule_name(n) == "interleaved-1f1b";
      })) {
    std::string list;
    for (const std::string& n : options.schedules) list += (list.empty() ? "" : ",") + n;
    throw InputError("--chunks: only interleaved-1f1b takes a chunk count, and --schedule " + list +
                     " does not list it");
  }
  if (options.keep <= Search::kKept) return Search(std::move(graph), model, options).run();
  // A longer list spends the search's budgets (exact memory checks, layer moves) on its
  // runners-up, and had missed the best plan's cut that a shorter list found (--top 50
  // wrote a plan 3% slower than --top 1's): the plans of a search of the default length,
  // with those of the asked length where they add a plan or a faster cut of one.
  SearchOptions core = options;
  core.keep = Search::kKept;
  SearchResult best = Search(graph, model, core).run();
  SearchResult wide = Search(std::move(graph), model, options).run();
  std::map<std::string, Candidate> by_plan;
  for (std::vector<Candidate>* list : {&best.ranked, &wide.ranked})
    for (Candidate& c : *list) {
      auto [it, fresh] = by_plan.try_emplace(c.describe(), c);
      if (!fresh && faster(c, it->second)) it->second = std::move(c);
    }
  wide.ranked.clear();
  for (auto& [name, c] : by_plan) wide.ranked.push_back(std::move(c));
  std::sort(wide.ranked.begin(), wide.ranked.end(), faster);
  if (wide.ranked.size() > size_t(options.keep)) wide.ranked.resize(size_t(options.keep));
  // The work of both searches (a candidate evaluated in each counts twice).
  wide.seconds += best.seconds;
  wide.evaluated += best.evaluated;
  wide.pruned += best.pruned;
  wide.rejected += best.rejected;
  wide.exact_checks += best.exact_checks;
  return wide;
}

std::string no_plan_message(const SearchResult& res, int64_t device_memory,
                            const std::string& more) {
  const bool searched = res.evaluated > 0 || res.pruned > 0;
  // Nothing to evaluate: the options (schedule, micro-batches, degrees) rule every plan out.
  std::string msg = searched ? "no plan fits" : "no plan matches the options";
  if (device_memory > 0 && searched)
    msg += " in " + memory::format_bytes(double(device_memory)) + " per device";
  if (res.closest) {
    const Candidate& c = *res.closest;
    msg += "; the closest is " + c.describe() + ": " +
           (c.peak_rank < 0 ? "each parameter-server rank"
                            : "pipeline rank " + std::to_string(c.peak_rank)) +
           " needs " + memory::format_bytes(double(c.peak)) + ", " +
           memory::format_bytes(double(c.peak - device_memory)) + " (" +
           std::to_string(int(std::lround(100 * (c.over - 1)))) + "%) over its capacity";
  } else if (!res.skipped.empty()) {
    msg += " (" + res.skipped.front();
    if (more.empty())
      for (size_t i = 1; i < res.skipped.size(); ++i) msg += "; " + res.skipped[i];
    else if (res.skipped.size() > 1)
      msg += "; " + std::to_string(res.skipped.size() - 1) +
             (res.skipped.size() == 2 ? " more reason" : " more reasons") + more;
    msg += ")";
  }
  // Such a candidate may still fit: a narrower search gives each more exact checks.
  if (res.bound_only > 0)
    msg += "; " + std::to_string(res.bound_only) +
           (res.bound_only == 1 ? " candidate was" : " candidates were") +
           " turned away on the search's memory bound alone, its budget of exact checks spent "
           "(narrow the search with --recompute, --schedule or --pp, or check a plan with "
           "`baton plan --check`)";
  return msg;
}

}  // namespace baton::partitioner
