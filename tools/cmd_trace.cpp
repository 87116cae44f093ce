// `baton trace`: timelines. `predict` writes the simulator's timeline of one step of a
// plan (from measured op costs when given); `compare` sets a measured timeline (baton
// train --plan --trace) beside a predicted one (baton trace predict, baton simulate
// --trace) and prints the per-action differences and the makespans; `svg` draws one.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "engine/loop.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "partitioner/cost_model.h"
#include "partitioner/evaluate.h"
#include "partitioner/predict.h"
#include "partitioner/resolved_plan.h"
#include "schedule/schedule_io.h"
#include "schedule/timeline.h"
#include "schedule/trace_compare.h"
#include "tools/command.h"
#include "tools/machine_options.h"

namespace baton::tools {
namespace {

namespace pt = baton::partitioner;

int predict(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string plan_path, costs, schedule_file, out, svg;
  pt::Machine machine;
  opts.add_options()("plan", po::value(&plan_path)->required(), "the plan")(
      "costs", po::value(&costs),
      "measured op times from baton profile (default: FLOPs at --flops)")(
      "schedule", po::value(&schedule_file), "a schedule file instead of the plan's generator")(
      "out,o", po::value(&out), "write the timeline here (Chrome trace JSON)")(
      "svg", po::value(&svg), "draw it here (SVG)");
  add_machine_options(opts, machine);
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args,
                  "baton trace predict --plan plan.json [--costs profile.json] -o predicted.json",
                  opts, vm))
    return 0;
  apply_common_options(vm);
  // -o "" (an unset shell variable) had written nothing, --costs "" used FLOPs.
  check_path_flags(vm, {"plan", "costs", "schedule", "out", "svg"});
  check_machine_options(machine);
  // Both outputs checked before anything is written: one written and the other refused
  // had left a file behind an exit code of 2.
  engine::check_output_path(out, "--out");
  engine::check_output_path(svg, "--svg");
  engine::check_distinct_files({{"--out", out},
                                {"--svg", svg},
                                {"--plan", plan_path},
                                {"--costs", costs},
                                {"--schedule", schedule_file}},
                               2);
  reports_beside({out, svg});
  pt::Plan plan = pt::read_plan(plan_path);
  auto graph = pt::load_plan_model(plan);
  std::optional<schedule::Schedule> own;
  if (!schedule_file.empty()) own = schedule::load_schedule_to_run(schedule_file);
  pt::ResolvedPlan r = pt::resolve_plan(plan, graph, own ? &*own : nullptr, schedule_file);
  pt::MeasuredCosts measured;
  if (!costs.empty()) measured = pt::read_measured_costs(costs);
  pt::CostModel model(graph, machine, costs.empty() ? nullptr : &measured);
  // Refuses a step a trace cannot hold, naming the cost file, before anything is printed.
  pt::Prediction p = pt::predict_step(r, model, costs);
  std::fprintf(
      report(),
      "predicted step time %.3f ms (bubble %.1f%%) for %s on %d pipeline ranks, times from %s\n",
      p.step_time * 1e3, p.bubble * 100, r.schedule.name.c_str(), r.plan.pp,
      pt::cost_source(model, costs).c_str());
  if (const pt::Machine& m = model.machine(); !pt::core_ranks(r.layout, m).empty())
    std::fputs(
        pt::time_sliced_line(
            r.world(), m.ranks_per_host > 0 ? std::min(m.ranks_per_host, r.world()) : r.world(),
            m.cores_per_host)
            .c_str(),
        report());
  std::fputs(pt::collective_extras_line(r, model.machine()).c_str(), report());
  // Both made before either is written (to_chrome_trace refuses times a trace cannot
  // hold); each file said, as baton simulate says its outputs.
  const std::string trace_text = out.empty() ? "" : schedule::to_chrome_trace(p.timeline);
  const std::string svg_text = svg.empty() ? "" : schedule::to_svg(p.timeline);
  if (!out.empty()) {
    memory::write_file_durably(out, trace_text);
    std::fprintf(report(), "wrote %s\n", out.c_str());
  }
  if (!svg.empty()) {
    memory::write_file_durably(svg, svg_text);
    std::fprintf(report(), "wrote %s\n", svg.c_str());
  }
  return 0;
}

int compare(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string measured, predicted;
  opts.add_options()("measured", po::value(&measured)->required(),
                     "measured timeline (baton train --plan ... --trace)")(
      "predicted", po::value(&predicted)->required(),
      "predicted timeline (baton trace predict, baton simulate --trace)")(
      "actions", po::bool_switch(), "one line per action");
  add_log_level_option(opts);
  po::positional_options_description pos;
  pos.add("measured", 1).add("predicted", 1);
  po::variables_map vm;
  if (!parse_args(args, "baton trace compare MEASURED.json PREDICTED.json [--actions]", opts, vm,
                  &pos))
    return 0;
  apply_log_level(vm["log-level"].as<std::string>());
  check_path_flags(vm, {"measured", "predicted"});
  schedule::Timeline m = schedule::from_chrome_trace(memory::read_file(measured), measured);
  schedule::Timeline p = schedule::from_chrome_trace(memory::read_file(predicted), predicted);
  schedule::TraceComparison c = schedule::compare_timelines(m, p, measured, predicted);
  std::printf("%s: %s\n%s: %s\n%s", measured.c_str(), printable(m.name).c_str(), predicted.c_str(),
              printable(p.name).c_str(),
              schedule::format_comparison(c, vm["actions"].as<bool>()).c_str());
  return 0;
}

int svg(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string in, out;
  opts.add_options()("trace", po::value(&in)->required(), "a timeline (Chrome trace JSON)")(
      "out,o", po::value(&out)->required(), "the SVG to write");
  add_log_level_option(opts);
  po::positional_options_description pos;
  pos.add("trace", 1);
  po::variables_map vm;
  if (!parse_args(args, "baton trace svg TRACE.json -o out.svg", opts, vm, &pos)) return 0;
  apply_log_level(vm["log-level"].as<std::string>());
  check_path_flags(vm, {"trace", "out"});
  engine::check_output_path(out, "--out");
  engine::check_distinct_files({{"--out", out}, {"TRACE", in}}, 1);
  schedule::Timeline t = schedule::from_chrome_trace(memory::read_file(in), in);
  memory::write_file_durably(out, schedule::to_svg(t));
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

int run_trace(const std::vector<std::string>& args) {
  const std::string usage =
      "usage: baton trace predict --plan plan.json [--costs profile.json] -o predicted.json\n"
      "       baton trace compare MEASURED.json PREDICTED.json [--actions]\n"
      "       baton trace svg TRACE.json -o out.svg\n";
  return run_subcommand("trace", args, {{"predict", predict}, {"compare", compare}, {"svg", svg}},
                        usage);
}

const RegisterCommand register_trace{
    {"trace", "predict, compare and draw timelines (measured vs simulated)", run_trace}};

}  // namespace
}  // namespace baton::tools
