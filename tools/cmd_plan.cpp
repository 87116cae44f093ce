// `baton plan`: asks the partitioner for a plan (search over the degrees, micro-batches,
// schedules and recompute left open) or checks one (`--check plan.json`): per rank its
// layers, parameters, estimated memory and time; what does not fit and by how much.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string_view>

#include "engine/loop.h"
#include "memory/error.h"
#include "memory/json_object.h"
#include "memory/units.h"
#include "partitioner/evaluate.h"
#include "partitioner/search.h"
#include "schedule/generators.h"
#include "stages/model.h"
#include "tools/command.h"
#include "tools/machine_options.h"

namespace baton::tools {
namespace {

namespace pt = baton::partitioner;

// Machine flags that the estimate never reads here had been accepted without a word.
void warn_unused_machine_flags(const po::variables_map& vm, const pt::Machine& machine,
                               const pt::MeasuredCosts* measured, const stages::Graph& g) {
  // Ranks per host pick a cost file's co-located slowdown and its threads' warning, and
  // which ranks share the host's cores: with neither a cost file nor cores, nothing.
  if (!vm["ranks-per-host"].defaulted() && measured == nullptr && machine.cores_per_host == 0)
    spdlog::warn(
        "--ranks-per-host has no effect without --costs or --cores-per-host: it picks the "
        "slowdown of ranks sharing a host from a cost file's colocated table (baton profile "
        "--colocated), and which ranks share a host's cores");
  if (measured != nullptr && !vm["flops"].defaulted()) {
    // --flops times only the ops the cost file lacks.
    const bool all = std::all_of(g.nodes.begin(), g.nodes.end(), [&](const stages::Node& n) {
      auto it = measured->ops.find(n.name);
      return it != measured->ops.end() && it->second.op == n.op;
    });
    if (all)
      spdlog::warn(
          "--flops has no effect: the --costs file times every op of the model, and --flops "
          "times only the ops a cost file lacks");
  }
}

// The --optimizer value, refused naming the flag (the plan field's message says "optimizer").
void check_optimizer_flag(const std::string& optimizer) {
  try {
    pt::optimizer_states(optimizer);
  } catch (const InputError& e) {
    throw InputError(std::string("--") + e.what());
  }
}

int check(const std::string& path, const po::variables_map& vm, const pt::Machine& machine,
          const pt::MeasuredCosts* measured, const std::string& measured_path,
          std::optional<int64_t> device_memory, std::optional<std::string> optimizer) {
  pt::Plan plan = pt::read_plan(path);
  if (device_memory) plan.device_memory = *device_memory;
  // A plan naming no optimizer trains with --optimizer's: checked for that one's state,
  // as baton train --plan estimates it.
  if (optimizer) {
    check_optimizer_flag(*optimizer);
    if (plan.optimizer_stated && plan.optimizer != *optimizer)
      throw InputError("--optimizer " + *optimizer + ": the plan trains with \"" + plan.optimizer +
                       "\" (" + plan.where("$.optimizer") + ")");
    plan.optimizer = *optimizer;
  }
  auto graph = pt::load_plan_model(plan);
  warn_unused_machine_flags(vm, machine, measured, *graph);
  pt::ResolvedPlan r = pt::resolve_plan(plan, graph);
  pt::CostModel model(graph, machine, measured);
  pt::PlanEstimate e = pt::evaluate_plan(r, model);
  // A plan over capacity is well-formed but not runnable: the header must not call it valid.
  std::printf("%s: %s\ntimes from %s\n%s", path.c_str(),
              e.fits() ? "valid plan" : "well-formed plan, over capacity (errors below)",
              pt::cost_source(model, measured_path).c_str(), pt::format_estimate(r, e).c_str());
  // A plan made on another machine, or from a cost file not given here, carries the time it
  // was predicted with: a check that differs says which to trust.
  const nlohmann::json& was = plan.predicted;
  if (was.is_object() && was.contains("step_time_s") && was["step_time_s"].is_number()) {
    const double then = was["step_time_s"].get<double>();
    const std::string how = was.value("time_model", std::string());
    const bool other_model = !how.empty() && (how == "measured") != (measured != nullptr);
    if (other_model || (then > 0 && std::abs(e.step_time - then) > 0.1 * then))
      std::printf(
          "note: the plan's predicted step is %.6g s%s, this check's %.6g s: %s\n", then,
          how.empty() ? "" : (" (" + how + " op times)").c_str(), e.step_time,
          how == "measured" && measured == nullptr
              ? "it was made from a cost file (baton profile); give that file as --costs to "
                "check it as it was made"
          : how == "analytic" && measured != nullptr
              ? "it was made without a cost file (times from FLOPs), this check with one"
              : "the cost file, machine flags or baton's version differ from those it was made "
                "with");
  }
  if (!e.fits()) {
    for (const std::string& p : e.problems)
      std::fprintf(stderr, "baton plan: error: %s: %s\n", path.c_str(), p.c_str());
    return 2;
  }
  return 0;
}

int run_plan(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string model_path, check_path, out, device_memory, schedules, recompute = "auto", layers,
                                                                     costs;
  std::string sharding, dp_sync;
  pt::SearchOptions so;
  pt::Machine machine;
  int64_t batch = 0;
  opts.add_options()("model", po::value(&model_path), "model JSON (as for baton train)")(
      "devices", po::value(&so.devices)->default_value(1), "number of devices (ranks)")(
      "device-memory", po::value(&device_memory),
      "memory of one device, e.g. 4GiB (default: unlimited)")(
      "tp", po::value(&so.tp)->default_value(0), "tensor-parallel degree (0: search)")(
      "pp", po::value(&so.pp)->default_value(0), "pipeline ranks (0: search)")(
      "spatial", po::value(&so.spatial)->default_value(0),
      "spatial split's degree of every stage (0: search, for models with image inputs; 1: "
      "none)")("dp", po::value(&so.dp)->default_value(0), "data-parallel replicas (0: search)")(
      "schedule", po::value(&schedules),
      "schedule name(s), comma-separated (default: every generator)")(
      "micro-batches", po::value(&so.micro_batches)->default_value(0),
      "micro-batches per replica and step (0: search)")(
      "chunks", po::value(&so.chunks)->default_value(0),
      "interleaved-1f1b: model chunks (stages) per pipeline rank, 1 to 64 (0: 2)")(
      "batch", po::value(&batch)->default_value(16),
      "global batch: samples per step over all replicas")("recompute", po::value(&recompute),
                                                          "on, off or auto (search both; default)")(
      "layers-per-stage", po::value(&layers),
      "layer counts per model chunk, e.g. 3,4,3 (default: the cut)")(
      "optimizer", po::value(&so.optimizer)->default_value("adamw"),
      "adamw, sgd or sgd-momentum (its state's memory)")(
      "optimizer-sharding", po::value(&sharding)->default_value("none"),
      "none, zero1 or zero2: shard the state (zero2: and gradients) over replicas")(
      "dp-sync", po::value(&dp_sync),
      "how replicas agree, the plan field's JSON: allreduce (default), "
      "'{\"mode\": \"local-sgd\", \"sync_every\": 8}' or "
      "'{\"mode\": \"parameter-server\", \"max_staleness\": 1}'")(
      "costs", po::value(&costs),
      "measured op times from baton profile (default: FLOPs at --flops)")(
      "top", po::value(&so.keep)->default_value(5),
      "how many plans to list (the best and its runners-up)")(
      "out,o", po::value(&out), "write the best plan here (JSON, docs/formats/plan.md)")(
      "check", po::value(&check_path), "validate this plan file and print its estimate per rank");
  add_machine_options(opts, machine);
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args,
                  "baton plan --model M --devices N [--device-memory 4GiB] [options] | baton plan "
                  "--check plan.json",
                  opts, vm))
    return 0;
  apply_common_options(vm);
  // Each given as "" (an unset shell variable) had read as left out: --check "" searched,
  // --device-memory "" planned for unlimited memory.
  check_path_flags(vm, {"check", "out", "costs"});
  check_path_flags(vm, {"model"}, /*recorded=*/true);  // --out's plan names it
  check_value_flags(vm, {"device-memory", "schedule", "dp-sync"});
  engine::check_output_path(out, "--out");  // before the search, not after it
  // -o over the model or the cost file had replaced it, exit 0.
  engine::check_distinct_files({{"--out", out}, {"--model", model_path}, {"--costs", costs}}, 1);

  check_machine_options(machine);
  pt::MeasuredCosts measured;
  if (!costs.empty()) measured = pt::read_measured_costs(costs);
  const pt::MeasuredCosts* mp = costs.empty() ? nullptr : &measured;
  if (!check_path.empty()) {
    // A check evaluates the plan as written: the search's options would change nothing,
    // so giving them is a mistake said as such. --device-memory overrides the plan's cap
    // (as baton train --plan's does).
    std::vector<std::string> given;
    for (const char* flag :
         {"model", "devices", "tp", "pp", "spatial", "dp", "schedule", "micro-batches", "chunks",
          "batch", "recompute", "layers-per-stage", "optimizer-sharding", "dp-sync", "top", "out"})
      if (vm.count(flag) && !vm[flag].defaulted()) given.push_back(std::string("--") + flag);
    if (!given.empty()) {
      std::string list;
      for (const std::string& f : given) list += (list.empty() ? "" : ", ") + f;
      throw InputError("--check: " + list + (given.size() > 1 ? " are" : " is") +
                       " for the search and the plan file says its own; expected with --check "
                       "only --device-memory, --optimizer (a plan naming none), --costs and the "
                       "machine options");
    }
    std::optional<int64_t> cap;
    if (!device_memory.empty()) cap = int64_t(parse_bytes_option("--device-memory", device_memory));
    std::optional<std::string> opt;
    if (vm.count("optimizer") && !vm["optimizer"].defaulted()) opt = so.optimizer;
    return check(check_path, vm, machine, mp, costs, cap, opt);
  }
  if (model_path.empty()) throw InputError("give --model M (or --check plan.json); see --help");

  if (!device_memory.empty())
    so.device_memory = int64_t(parse_bytes_option("--device-memory", device_memory));
  so.global_batch = batch;
  so.schedules = split_comma_list(schedules, "--schedule");
  for (const std::string& name : so.schedules) {
    try {
      schedule::canonical_training_schedule_name(name);
    } catch (const InputError& e) {
      throw InputError(std::string("--schedule: ") + e.what());
    }
  }
  if (recompute == "on")
    so.recompute = 1;
  else if (recompute == "off")
    so.recompute = 0;
  else if (recompute == "auto")
    so.recompute = -1;
  else
    throw InputError("--recompute: expected on, off or auto, found '" + recompute + "'");
  if (vm.count("layers-per-stage"))
    for (int64_t n :
         parse_int_list(layers, "--layers-per-stage", 1, INT32_MAX, "counts >= 1 like 3,4,3"))
      so.layers_per_stage.push_back(int(n));
  check_optimizer_flag(so.optimizer);
  if (sharding == "none")
    so.optimizer_sharding = pt::OptimizerSharding::none;
  else if (sharding == "zero1")
    so.optimizer_sharding = pt::OptimizerSharding::zero1;
  else if (sharding == "zero2")
    so.optimizer_sharding = pt::OptimizerSharding::zero2;
  else
    throw InputError("--optimizer-sharding: expected none, zero1 or zero2, found '" + sharding +
                     "'");
  if (!dp_sync.empty()) {
    // A bare mode name or the field's JSON form, read as strictly as the plan file reads
    // it: a repeated key or a syntax error is reported as such (the text had been taken
    // for a mode name).
    const size_t first = dp_sync.find_first_not_of(" \t\n");
    const bool json = first != std::string::npos &&
                      std::string_view("{[\"").find(dp_sync[first]) != std::string_view::npos;
    const nlohmann::json j =
        json ? memory::parse_json_text(dp_sync, "--dp-sync") : nlohmann::json(dp_sync);
    so.dp_sync = pt::parse_dp_sync(j, "--dp-sync");
  }
  so.model_path = model_path;

  auto graph = std::make_shared<const stages::Graph>(stages::load_model(model_path));
  warn_unused_machine_flags(vm, machine, mp, *graph);
  pt::CostModel model(graph, machine, mp);
  reports_beside({out});
  pt::SearchResult res = pt::search_plans(graph, model, so);
  std::fprintf(report(),
               "searched %d candidate plans for %s on %d devices in %.3f s (%d over capacity, %d "
               "checked exactly)\ntimes from %s\n",
               res.evaluated, graph->name.c_str(), so.devices, res.seconds, res.rejected,
               res.exact_checks, pt::cost_source(model, costs).c_str());
  for (const std::string& s : res.skipped) spdlog::debug("skipped: {}", s);
  if (res.ranked.empty())
    throw InputError(pt::no_plan_message(res, so.device_memory, " with --log-level debug"));
  // The winner, checked as `baton plan --check` would check it.
  const pt::Candidate& best = res.ranked.front();
  pt::ResolvedPlan r = pt::resolve_plan(best.plan, graph);
  pt::PlanEstimate e = pt::evaluate_plan(r, model);
  std::fprintf(report(), "\nbest plan:\n%s", pt::format_estimate(r, e).c_str());
  std::fprintf(report(), "\n%-4s %-60s %12s %9s %12s\n", "", "candidate", "step time", "bubble",
               "peak memory");
  // The winner's peak as its check above gives it; the runners-up's as the search bounds
  // them (exact where the bound alone would have turned them away).
  for (size_t i = 0; i < res.ranked.size(); ++i) {
    const pt::Candidate& c = res.ranked[i];
    const int64_t peak = i == 0 ? e.max_peak() : c.peak;
    std::fprintf(report(), "%-4zu %-60s %10.3fms %8.1f%% %12s\n", i + 1, c.describe().c_str(),
                 1e3 * c.step_time, 100 * c.bubble, memory::format_bytes(double(peak)).c_str());
  }
  if (res.ranked.size() > 1)
    std::fprintf(report(),
                 "(the runners-up's peaks are the search's upper bounds; `baton plan --check` "
                 "estimates a plan exactly)\n");
  // Batch norm normalises each micro-batch by its own statistics (and each replica's,
  // without sync_batchnorm): the search's split is part of what the model computes.
  if (const auto [bn, plane] = pt::smallest_batchnorm_plane(*graph); plane > 0) {
    const pt::Plan& p = r.plan;
    const int64_t over = p.micro_batch_size * (p.dp > 1 && p.sync_batchnorm ? p.dp : 1);
    if (over < so.global_batch)
      spdlog::warn(
          "the model has batch norm ('{}'): under the best plan its statistics are over {} "
          "sample(s), not the batch of {} (micro-batches of {}{}), which changes the training; "
          "fix the split with --micro-batches and --dp if that matters",
          bn, over, so.global_batch, p.micro_batch_size,
          p.dp > 1 && !p.sync_batchnorm ? ", each replica its own: no sync_batchnorm" : "");
  }
  if (!out.empty()) {
    pt::Plan p = r.plan;
    p.predicted["memory_bytes"] = [&] {
      std::vector<int64_t> v;
      for (const pt::RankEstimate& re : e.ranks) v.push_back(re.peak);
      return v;
    }();
    pt::write_plan(p, out);
    std::fprintf(report(), "wrote %s\n", out.c_str());
  }
  if (!e.fits()) {
    for (const std::string& p : e.problems)
      std::fprintf(stderr, "baton plan: error: %s\n", p.c_str());
    return 2;
  }
  return 0;
}

const RegisterCommand register_plan(
    {"plan", "search for a partition plan (or --check one): degrees, cut, schedule, memory",
     run_plan});

}  // namespace
}  // namespace baton::tools
