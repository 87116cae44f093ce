// `baton profile`: times each op of a model on this machine (F, B, W; warm-up, median
// of repeats) and writes the cost file `baton plan --costs` uses instead of FLOPs at a
// nominal rate (docs/formats/costs.md). With --colocated k it times them again beside
// k - 1 copies of itself, as k ranks of `baton launch` share the host, and records the
// slowdown.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/loop.h"
#include "kernels/precision.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "partitioner/profile.h"
#include "partitioner/spatial.h"
#include "stages/json_reader.h"
#include "stages/model.h"
#include "tools/command.h"
#include "transport/launch.h"
#include "transport/world.h"

namespace baton::tools {
namespace {

// Times taken beside other processes hold the slices those took, and the planner's
// figures move with them: on a host at load 4-10 of 2 cores, back-to-back profiles of one
// model measured whole passes at 0.32x to 2.9x the ops' times and 2 ranks at 1.4x to
// 5.0x alone, and the plan chosen changed with them. Said, with the load.
void warn_if_busy(const char* when, int cores) {
  double load = 0;
  if (getloadavg(&load, 1) != 1 || load < std::max(1.0, 0.5 * cores)) return;
  spdlog::warn(
      "{} the host's load average was {:.1f} on the {} core(s) baton may use: other processes "
      "share them, and the times (so the plans' predictions) include their share; profile on "
      "a quiet host",
      when, load, cores);
}

namespace pt = baton::partitioner;

extern "C" char** environ;

// Pins the calling thread (0: this process) to share `i` of `k` of the cores we may run
// on, as `baton launch` binds its ranks; with more shares than cores, to core i mod C,
// as ranks that many bind themselves (transport::bind_dealt).
bool pin_share(pid_t pid, int i, int k, const std::vector<int>& ids) {
  const int cores = int(ids.size());
  if (cores == 0) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (k > cores)
    CPU_SET(ids[size_t(i % cores)], &set);
  else
    for (int c = i * cores / k; c < (i + 1) * cores / k; ++c) CPU_SET(ids[size_t(c)], &set);
  return sched_setaffinity(pid, sizeof set, &set) == 0;
}

// A whole pass's time with k - 1 copies running passes beside it (the same model, batch
// and threads, `baton profile --hold`).
pt::PassTimes colocated_pass(int k, const std::vector<std::string>& hold_args,
                             const stages::Graph& g, const pt::ProfileOptions& o) {
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  const std::vector<int> ids = transport::allowed_cores();
  std::vector<pid_t> copies;
  auto stop = [&] {
    for (pid_t p : copies) kill(p, SIGKILL);
    for (pid_t p : copies) waitpid(p, nullptr, 0);
    sched_setaffinity(0, sizeof allowed, &allowed);
  };
  try {
    std::vector<std::string> args = {"baton", "profile"};
    args.insert(args.end(), hold_args.begin(), hold_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t quiet;
    posix_spawn_file_actions_init(&quiet);
    posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
    for (int i = 1; i < k; ++i) {
      pid_t pid = 0;
      const int err = posix_spawn(&pid, "/proc/self/exe", &quiet, nullptr, argv.data(), environ);
      if (err != 0) {
        posix_spawn_file_actions_destroy(&quiet);
        throw RuntimeError(std::string("profile --colocated: cannot start a copy: ") +
                           std::strerror(err));
      }
      copies.push_back(pid);
      pin_share(pid, i, k, ids);
    }
    posix_spawn_file_actions_destroy(&quiet);
    pin_share(0, 0, k, ids);
    // The copies load the model and reach their ops (a small model loads in well under this).
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const pt::PassTimes t = pt::time_passes(g, o, pt::kPassMicroBatches);
    for (pid_t p : copies)
      if (waitpid(p, nullptr, WNOHANG) != 0)
        throw RuntimeError("profile --colocated: a copy of the profile ended early");
    stop();
    return t;
  } catch (...) {
    stop();
    throw;
  }
}

// What a probe job splits the model by: tensor parallelism (its collectives) or a
// spatial split (its halos and tiled batch norms).
enum class Split { tp, spatial };
const char* probe_flag(Split s) {
  return s == Split::tp ? "--tp-probe" : "--spatial-probe";
}

// `--tp-probe t` or `--spatial-probe t`, a rank of the job group_passes launches: whole
// passes of the whole model, then of its degree-t part (a tensor-parallel shard, a tile)
// with its communication over the job's transport (rank r is index r mod t of the group of
// ranks [r - r mod t, ... + t)), twice, bound as baton train binds ranks; rank 0 writes the
// two kinds' compute time to `out`.
void probe_rank(const stages::Graph& g, pt::ProfileOptions o, Split kind, int t,
                const std::string& out) {
  const transport::LaunchEnv env = transport::read_launch_env();
  if (env.size % t != 0)
    throw InputError(std::string(probe_flag(kind)) + ": " + std::to_string(env.size) +
                     " ranks do not form groups of " + std::to_string(t));
  // Partners on different cores, as a plan's tensor-parallel ranks and tiles are dealt
  // (Layout::core_deal_order puts a group's ranks side by side).
  transport::bind_dealt(env.rank, env);
  transport::World world = transport::init_world();
  const int first = env.rank - env.rank % t;
  std::vector<int> members;
  for (int i = 0; i < t; ++i) members.push_back(first + i);
  const transport::CommPtr group = world.comm->split(members);
  const std::shared_ptr<stages::Graph> shard =
      kind == Split::tp ? pt::tensor_parallel_shard(g, t, env.rank % t) : pt::spatial_tile(g, t);
  o.mean = env.bind_self;  // more ranks than cores, as --colocated times them
  o.pass_seconds = pt::kPassSeconds;
  o.pass_group = world.comm.get();
  pt::ProfileOptions split = o;
  (kind == Split::tp ? split.tp : split.spatial) = group.get();
  double whole = 0, sharded = 0;
  for (int round = 0; round < 2; ++round) {
    world.comm->barrier()->wait();
    whole += pt::time_passes(g, o, pt::kPassMicroBatches).compute;
    world.comm->barrier()->wait();
    sharded += pt::time_passes(*shard, split, pt::kPassMicroBatches).compute;
  }
  if (env.rank == 0)
    memory::write_file_durably(
        out, nlohmann::json{{"whole", whole / 2}, {"shard", sharded / 2}}.dump() + "\n");
  world.comm->barrier()->wait();
}

// Whole passes (compute) of the whole model and of a degree-t part with its communication
// while k ranks in groups of t run them over `baton launch`'s transport (the ranks are
// copies of this program, probe_rank): {whole, part}.
std::pair<double, double> group_passes(int k, Split kind, int t,
                                       std::vector<std::string> probe_args,
                                       const std::string& scratch) {
  transport::LaunchOptions lo;
  lo.nprocs = k;
  lo.command = {"/proc/self/exe", "profile"};
  probe_args.insert(probe_args.end(), {probe_flag(kind), std::to_string(t), "-o", scratch});
  lo.command.insert(lo.command.end(), probe_args.begin(), probe_args.end());
  if (const int rc = transport::launch(lo); rc != 0)
    throw RuntimeError(std::string("profile ") + (kind == Split::tp ? "--tp" : "--spatial") +
                       ": the job of " + std::to_string(k) + " ranks timing the " +
                       (kind == Split::tp ? "collectives" : "exchanges") + " failed (exit code " +
                       std::to_string(rc) + ")");
  nlohmann::json j = stages::read_json_file(scratch);
  std::remove(scratch.c_str());
  const stages::JsonReader r(j, scratch);
  return {r.at("whole").as_double(0, 1e9), r.at("shard").as_double(0, 1e9)};
}

int run_profile(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string model_path, out, device, precision;
  pt::ProfileOptions o;
  opts.add_options()("model", po::value(&model_path)->required(),
                     "model JSON (as for baton train)")(
      "batch", po::value<std::vector<int64_t>>()->multitoken(),
      "B [B ...]: samples per micro-batch to time the ops at (default 1); with several, "
      "the planner interpolates between them, and --colocated and --tp's collectives are "
      "timed at the first")("repeats", po::value(&o.repeats)->default_value(5),
                            "timed runs per op (the median is kept)")(
      "warmup", po::value(&o.warmup)->default_value(2), "untimed runs per op first")(
      "device", po::value(&device)->default_value("cpu"), "cpu, cuda or cuda:N: where the ops run")(
      "precision", po::value(&precision)->default_value("f32"),
      "f32, tf32, bf16 or fp16: the model's float type as baton train --precision runs it")(
      "colocated", po::value<std::vector<int>>()->multitoken(),
      "K [K ...]: also time the ops beside K - 1 copies of this profile (K ranks on one host, "
      "bound to cores as baton launch binds them) and record the slowdown")(
      "tp", po::value<std::vector<int>>()->multitoken(),
      "T [T ...]: also time one rank's shard of every op at tensor-parallel degree T (the "
      "split GEMMs' own rate, where the planner would otherwise take the whole op's by its "
      "FLOP share); with --colocated K, also what a collective costs among K ranks in groups "
      "of T")("spatial", po::value<std::vector<int>>()->multitoken(),
              "S [S ...]: with --colocated K (K a multiple of S), what an exchange of a spatial "
              "split (a halo, a tiled batch norm's statistics) costs among K ranks in groups of "
              "S, the tiles' own rate included")(
      "tp-probe", po::value<int>()->default_value(0),
      "(internal) a rank of --tp's job timing the collectives (refused outside it)")(
      "spatial-probe", po::value<int>()->default_value(0),
      "(internal) a rank of --spatial's job timing the exchanges (refused outside it)")(
      "hold", po::bool_switch(), "(internal) profile until killed: --colocated's copies")(
      "out,o", po::value(&out)->required(), "the cost file to write (JSON)");
  // 0 is baton train's default (default_threads): the file records the
  // count, and plan and trace predict warn when a plan's ranks compute with another
  // (CostModel::warn_threads).
  add_common_options(opts,
                     "kernel threads to time the ops with (0: the cores divided among local "
                     "ranks, or OMP_NUM_THREADS up to that, as baton train's default; give the "
                     "threads each rank of the plans trains with)");
  po::variables_map vm;
  if (!parse_args(
          args,
          "baton profile --model M [--batch b ...] [--threads t] [--device cuda --precision "
          "bf16] --out costs.json",
          opts, vm))
    return 0;
  // A --colocated copy ends with the profile that started it: killed, that profile had
  // left its copies spinning for ever.
  const pid_t parent = ::getppid();
  if (vm["hold"].as<bool>()) ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  apply_common_options(vm);
  check_path_flags(vm, {"model", "out"});
  // The probes are group_passes' ranks, started by baton launch and writing a scratch
  // fragment: run by hand they had replaced --out (a cost file) with that fragment.
  for (Split kind : {Split::tp, Split::spatial}) {
    const std::string flag = probe_flag(kind);
    if (vm[flag.substr(2)].as<int>() == 0) continue;
    const std::string suffix = "." + flag.substr(2);
    const bool launched = transport::read_launch_env().source == "baton launch";
    if (!launched || !out.ends_with(suffix))
      throw InputError(
          flag + " is internal: a rank of the job that `baton profile " +
          (kind == Split::tp ? "--tp" : "--spatial") +
          " S --colocated K` starts under baton launch, writing OUT" + suffix + "; found " +
          (launched ? "--out " + out : std::string("a run outside baton launch")) + " (give " +
          (kind == Split::tp ? "--tp" : "--spatial") + " with --colocated instead)");
  }
  // The file is written once every timing has run (minutes for a large model): a path
  // that cannot be written is said now. Not for the internal jobs (-o /dev/null, scratch).
  if (!vm["hold"].as<bool>() && vm["tp-probe"].as<int>() == 0 && vm["spatial-probe"].as<int>() == 0)
    engine::check_output_path(out, "--out");
  // -o over the model had replaced it with the cost file, exit 0.
  engine::check_distinct_files({{"--out", out}, {"--model", model_path}}, 1);
  // A count given twice had been timed twice (--batch refused it already).
  auto refuse_repeats = [](const char* flag, const auto& values) {
    for (size_t i = 0; i < values.size(); ++i)
      if (std::find(values.begin(), values.begin() + ptrdiff_t(i), values[i]) !=
          values.begin() + ptrdiff_t(i))
        throw InputError(std::string(flag) + ": " + std::to_string(values[i]) + " is listed twice");
  };
  const std::vector<int64_t> batches =
      vm.count("batch") ? vm["batch"].as<std::vector<int64_t>>() : std::vector<int64_t>{1};
  for (int64_t b : batches)
    if (b < 1 || b > (int64_t(1) << 24))
      throw InputError("--batch: expected samples per micro-batch from 1 to 16777216, found " +
                       std::to_string(b));
  refuse_repeats("--batch", batches);
  o.batch = batches.front();
  o.threads = vm["threads"].as<int>();
  if (o.threads == 0) o.threads = default_threads();
  pt::check_profile_options(o);  // before the model loads and the first line is printed
  engine::LoopOptions run;       // the device and precision as baton train sets them up
  run.device = o.device = memory::parse_device(device, "--device");
  run.precision = kernels::parse_precision(precision);
  engine::prepare_device(run);
  stages::LoadOptions lo;
  lo.float_dtype = kernels::compute_dtype(run.precision);
  stages::Graph g = stages::load_model(model_path, lo);
  if (vm["hold"].as<bool>()) {
    // Orphaned before PR_SET_PDEATHSIG took effect, init or a subreaper is the parent.
    while (::getppid() == parent) pt::time_passes(g, o, pt::kPassMicroBatches);
    return 0;
  }
  if (const int t = vm["tp-probe"].as<int>(); t > 0) {
    probe_rank(g, o, Split::tp, t, out);
    return 0;
  }
  if (const int s = vm["spatial-probe"].as<int>(); s > 0) {
    probe_rank(g, o, Split::spatial, s, out);
    return 0;
  }
  const std::vector<int> colocated =
      vm.count("colocated") ? vm["colocated"].as<std::vector<int>>() : std::vector<int>{};
  for (int k : colocated)
    if (k < 2 || k > 256)
      throw InputError("--colocated: expected ranks per host from 2 to 256, found " +
                       std::to_string(k));
  refuse_repeats("--colocated", colocated);
  const std::vector<int> tp = vm.count("tp") ? vm["tp"].as<std::vector<int>>() : std::vector<int>{};
  for (int t : tp)
    if (t < 2 || t > 65536)
      throw InputError("--tp: expected tensor-parallel degrees from 2 to 65536, found " +
                       std::to_string(t));
  refuse_repeats("--tp", tp);
  // InputError now, not after the op timings (minutes for a large model), if the model's
  // heads or widths do not split so.
  for (int t : tp) (void)pt::tensor_parallel_shard(g, t, 0);
  const std::vector<int> spatial =
      vm.count("spatial") ? vm["spatial"].as<std::vector<int>>() : std::vector<int>{};
  for (int s : spatial) {
    if (s < 2 || s > 65536)
      throw InputError("--spatial: expected spatial degrees from 2 to 65536, found " +
                       std::to_string(s));
    if (std::none_of(colocated.begin(), colocated.end(), [&](int k) { return k % s == 0; }))
      throw InputError("--spatial " + std::to_string(s) +
                       ": give --colocated K with K a multiple of " + std::to_string(s) +
                       " (the ranks per host the plans run)");
    pt::spatial_tile(g, s);  // InputError now, not after the op timings, if it cannot tile
    // A model with nothing to exchange had got spatial_exchange 0, measured of nothing.
    const std::string flag = "--spatial " + std::to_string(s);
    const pt::SpatialExchanges ex =
        pt::spatial_exchanges(g, pt::plan_spatial(g, s, flag), 0, g.num_layers());
    if (ex.forward + ex.backward == 0)
      throw InputError(flag + ": model " + g.name +
                       " has no spatially splittable op (a convolution, pooling or batch norm "
                       "over an image input [C, H, W]): a spatial split would exchange nothing");
  }
  refuse_repeats("--spatial", spatial);
  // A large model's profile takes minutes (GPT-2 124M's, --colocated 4: 6): each phase
  // says it has begun, line by line even into a file or a pipe.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int host_cores = int(transport::allowed_cores().size());
  warn_if_busy("at the start,", host_cores);
  std::printf("timing %zu ops of %s one by one (%d warm-up and %d timed calls each)%s\n",
              g.nodes.size(), g.name.c_str(), o.warmup, o.repeats,
              o.warmup > 0 ? ", then whole training passes" : "");
  pt::ProfileSummary summary;
  pt::MeasuredCosts costs = pt::profile_model(g, o, &summary);
  for (int t : tp) {
    pt::profile_tensor_parallel(g, o, t, costs);
    std::printf("tensor-parallel degree %d: %zu ops of a rank's shard timed\n", t,
                costs.tp_ops[t].size());
  }
  for (size_t i = 1; i < batches.size(); ++i) {
    pt::ProfileOptions at = o;
    at.batch = batches[i];
    std::printf("timing the ops again at batch %lld%s\n", (long long)at.batch,
                o.warmup > 0 ? ", then whole training passes" : "");
    pt::ProfileSummary more;
    pt::MeasuredCosts c = pt::profile_model(g, at, &more);
    for (int t : tp) pt::profile_tensor_parallel(g, at, t, c);
    summary.distinct_ops += more.distinct_ops;
    summary.seconds += more.seconds;
    costs.more_batches.push_back({at.batch, c.in_step, std::move(c.ops), std::move(c.tp_ops)});
  }
  std::sort(costs.more_batches.begin(), costs.more_batches.end(),
            [](const auto& a, const auto& b) { return a.batch < b.batch; });
  if (o.warmup > 0) {
    std::printf("in whole training passes the ops take %.3fx their time one by one", costs.in_step);
    for (const pt::MeasuredCosts::AtBatch& at : costs.more_batches)
      std::printf(" (%.3fx at batch %lld)", at.in_step, (long long)at.batch);
    std::printf("\n");
    if (costs.memory_bandwidth > 0)
      std::printf("the optimizer step streams its state at %.1f GB/s\n",
                  costs.memory_bandwidth / 1e9);
    // On a quiet CPU the two agree within 20% (docs/benchmarks.md, "Step-time prediction").
    std::vector<std::pair<int64_t, double>> factors = {{o.batch, costs.in_step}};
    for (const pt::MeasuredCosts::AtBatch& at : costs.more_batches)
      factors.emplace_back(at.batch, at.in_step);
    for (auto [batch, f] : factors)
      if (!o.device.is_cuda() && (f < 0.75 || f > 1.5))
        spdlog::warn(
            "at batch {} whole passes took {:.3f}x the ops' times one by one, far from 1: a "
            "load that changed between the two timings (other processes) is the likely "
            "cause; the planner scales every op of that batch by it",
            batch, f);
  } else {
    std::printf(
        "in whole training passes: not measured (--warmup 0: the ops' times include "
        "their first calls' one-time costs)\n");
  }
  if (!colocated.empty()) {
    const std::vector<std::string> hold = {"--model",     model_path,
                                           "--batch",     std::to_string(o.batch),
                                           "--threads",   std::to_string(o.threads),
                                           "--device",    device,
                                           "--precision", precision,
                                           "--repeats",   std::to_string(o.repeats),
                                           "--warmup",    std::to_string(o.warmup),
                                           "--hold",      "-o",
                                           "/dev/null"};
    const int cores = host_cores;
    costs.cores = cores;
    for (int k : colocated) {
      // Whole passes (forward, backward and weight gradients of a few micro-batches, the
      // activations stashed between), as ranks run them: timing the ops one by one on
      // fresh inputs, each op's data stayed in its core's cache, and two ranks of config A
      // measured 0.97x alone where their F and B ran 5-17% above the profile in training
      // (docs/benchmarks.md, "Step-time prediction"). Alone and beside the copies in turn, twice: a
      // load that changes meanwhile (other users of the host) weighs on both sides alike. With a
      // core per rank, the median: a pass's own time under the shared caches and memory, without
      // the preemptions by other users of the host, which a rank's idle time (its
      // bubble, its waits) mostly absorbs and the busy copies do not. With more ranks
      // than cores, the mean: each rank pays for the time slices the others take.
      std::printf("timing whole passes alone and beside %d %s, twice\n", k - 1,
                  k == 2 ? "copy" : "copies");
      pt::ProfileOptions through = o;
      through.mean = k > cores;
      through.warmup = 1;
      through.pass_seconds = pt::kPassSeconds;
      pt::PassTimes alone, together;
      for (int round = 0; round < 2; ++round) {
        const pt::PassTimes a = pt::time_passes(g, through, pt::kPassMicroBatches);
        const pt::PassTimes t = colocated_pass(k, hold, g, through);
        for (auto [sum, x] : {std::pair{&alone, &a}, {&together, &t}}) {
          sum->pass += x->pass;
          sum->compute += x->compute;
          sum->forward += x->forward;
        }
      }
      costs.colocated[k] = together.pass / alone.pass;
      // F and B + W apart, to tell whether one kind suffers more (one factor is stored).
      std::printf(
          "%d ranks on the host: the ops take %.3fx their time alone (F %.3fx, B+W %.3fx)\n", k,
          costs.colocated[k], together.forward / alone.forward,
          (together.compute - together.forward) / (alone.compute - alone.forward));
      // Ranks sharing cores take at least their share of them, k / cores.
      const double share = std::max(1.0, double(k) / cores);
      if (costs.colocated[k] < 0.9 * share)
        spdlog::warn(
            "{} ranks on {} core(s) measured {:.3f}x their time alone, below the {:.3f}x their "
            "share of the cores alone costs: the host was busier while one ran alone (other "
            "processes); profile on a quiet host",
            k, cores, costs.colocated[k], share);
    }
  }
  // The collectives and spatial exchanges among co-located ranks: a shard's or a tile's
  // passes with them, k ranks in groups of t, against what the cost model makes of the
  // same passes. Not on a GPU (its ranks would share the one device), nor against op
  // times that include their first calls (--warmup 0): what the probe's passes leave over
  // the cost model's would be that.
  const bool probes = !o.device.is_cuda() && o.warmup > 0;
  if ((!tp.empty() || !spatial.empty()) && !colocated.empty() && o.warmup == 0)
    std::printf(
        "collectives among co-located ranks: not measured (--warmup 0: the ops' times include "
        "their first calls' one-time costs)\n");
  const std::vector<std::string> probe = {"--model",   model_path,
                                          "--batch",   std::to_string(o.batch),
                                          "--threads", std::to_string(o.threads),
                                          "--repeats", std::to_string(o.repeats),
                                          "--warmup",  "1"};
  // k ranks in groups of t for each pair the flags give, a shard's or a tile's passes.
  auto run_probes = [&](Split kind, const std::vector<int>& degrees) {
    const bool tp_kind = kind == Split::tp;
    const char* groups = tp_kind ? "tensor-parallel" : "spatial";
    for (int t : probes ? degrees : std::vector<int>{})
      for (int k : colocated) {
        if (k % t != 0) continue;
        std::printf("timing %d ranks' passes in %s groups of %d, twice\n", k, groups, t);
        const auto [whole, part] =
            group_passes(k, kind, t, probe, out + (tp_kind ? ".tp-probe" : ".spatial-probe"));
        const double extra = tp_kind ? pt::tp_collective_from_pass(g, costs, t, part, whole)
                                     : pt::spatial_exchange_from_pass(g, costs, t, part, whole);
        (tp_kind ? costs.tp_collective : costs.spatial_exchange)[t][k] = extra;
        // The part's passes at or below the model's share of the whole's: nothing left for
        // the collectives, which a load that changed between the timings explains better
        // than free collectives (0 is recorded; it had been printed as 0.0 us unremarked).
        if (extra == 0)
          spdlog::warn(
              "{} ranks in {} groups of {}: the {}'s passes took no more than the model "
              "predicts without {}: recorded as 0; a busy host is the likely cause, profile "
              "on a quiet one",
              k, groups, t, tp_kind ? "shard" : "tile",
              tp_kind ? "the collectives' extra" : "the exchanges");
        std::printf("%d ranks on the host in %s groups of %d: %s takes %.1f us beyond %s\n", k,
                    groups, t, tp_kind ? "a collective" : "an exchange", 1e6 * extra,
                    tp_kind ? "its analytic time" : "the link model");
      }
  };
  run_probes(Split::tp, tp);
  run_probes(Split::spatial, spatial);
  warn_if_busy("at the end,", host_cores);
  pt::write_measured_costs(costs, out);

  struct Row {
    int count = 0;
    double f = 0, b = 0, w = 0, flops = 0;
  };
  auto rows = [&](const std::map<std::string, pt::MeasuredCosts::Op>& ops, Row& total) {
    std::map<std::string, Row> by_type;
    for (const stages::Node& n : g.nodes) {
      const pt::MeasuredCosts::Op& m = ops.at(n.name);
      for (Row* r : {&by_type[n.op], &total}) {
        r->count++;
        r->f += m.forward;
        r->b += m.backward_input;
        r->w += m.backward_weight;
        r->flops += m.flops;
      }
    }
    return by_type;
  };
  std::printf("%s: %zu ops (%d distinct timed) at batch %lld on %s, %.2f s\n", g.name.c_str(),
              g.nodes.size(), summary.distinct_ops, (long long)o.batch,
              o.device.is_cuda() ? (o.device.str() + ", " + precision).c_str()
                                 : (std::to_string(costs.threads) + " thread(s)").c_str(),
              summary.seconds);
  std::printf("%-30s %6s %12s %12s %12s %10s\n", "op", "count", "F ms", "B ms", "W ms", "GFLOP/s");
  auto line = [](const std::string& name, const Row& r) {
    double t = r.f + r.b + r.w;
    std::printf("%-30s %6d %12.3f %12.3f %12.3f %10.1f\n", name.c_str(), r.count, 1e3 * r.f,
                1e3 * r.b, 1e3 * r.w, t > 0 ? r.flops / t / 1e9 : 0.0);
  };
  Row total;
  for (const auto& [name, r] : rows(costs.ops, total)) line(name, r);
  line("total (one micro-batch)", total);
  for (const pt::MeasuredCosts::AtBatch& at : costs.more_batches) {
    Row more;
    rows(at.ops, more);
    line("total at batch " + std::to_string(at.batch), more);
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

const RegisterCommand register_profile(
    {"profile", "time each op of a model on this machine; write the cost file baton plan uses",
     run_profile});

}  // namespace
}  // namespace baton::tools
