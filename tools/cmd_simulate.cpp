// `baton simulate`: generate, load, validate, lower and simulate pipeline schedules;
// print makespan, bubble and peak memory per rank, compare schedules on the same
// costs, build an automatic schedule, export timelines (Chrome trace, SVG).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "engine/loop.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/units.h"
#include "schedule/auto_schedule.h"
#include "schedule/costs.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/schedule_io.h"
#include "schedule/simulate.h"
#include "schedule/timeline.h"
#include "schedule/torch_csv.h"
#include "schedule/validate.h"
#include "tools/command.h"

namespace baton::tools {
namespace {

namespace sc = baton::schedule;

struct SimulateOptions {
  std::vector<std::string> names;
  std::string file, costs_file, svg, trace, output, memory_limit, dialect = "detect";
  std::string objective = "makespan";
  int ranks = 0, micro_batches = 0, chunks = 0, repeat = 0;
  bool lower = false, show = false;
};

std::string pct(double v) {
  // A share that rounds to zero prints 0.00%: a span's rounding error (-1e-17) had
  // printed -0.00%.
  if (std::fabs(100 * v) < 0.005) v = 0;
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", 100 * v);
  return b;
}
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}
std::string bytes_or_dash(double v, bool have) {
  return have ? memory::format_bytes(v) : "-";
}

// The memory limit: a plain number is in micro-batches, one with a unit in bytes.
struct Limit {
  double value = std::numeric_limits<double>::infinity();
  bool bytes = false;
  bool given = false;
};
Limit parse_limit(const std::string& text) {
  Limit l;
  if (text.empty()) return l;
  l.given = true;
  // A unit ends the text ("512KiB", "1e6B"): "1e3" is a count, whose e had read as a unit.
  const bool has_unit = std::isalpha(static_cast<unsigned char>(text.back())) != 0;
  if (has_unit) {
    l.bytes = true;
    l.value = double(parse_bytes_option("--memory-limit", text));
  } else {
    char* end = nullptr;
    l.value = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(l.value > 0) || !std::isfinite(l.value))
      throw InputError(
          "--memory-limit: expected micro-batches (a number > 0) or a size such as 2GiB, found '" +
          text + "'");
  }
  if (!(l.value > 0))
    throw InputError("--memory-limit: expected a value > 0, found '" + text + "'");
  return l;
}

bool fits(const sc::SimResult& r, const Limit& l) {
  if (!l.given) return true;
  return (l.bytes ? r.peak_bytes : r.peak_micro_batches) <= l.value * (1 + 1e-9);
}

void print_ranks(const sc::SimResult& r, bool have_bytes) {
  std::fprintf(report(), "%-6s %12s %12s %9s %12s %9s %12s\n", "rank", "busy", "idle", "bubble",
               "span-bubble", "peak-mb", "peak-bytes");
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const sc::RankStats& s = r.ranks[i];
    std::fprintf(report(), "%-6zu %12s %12s %9s %12s %9.2f %12s\n", i, num(s.busy).c_str(),
                 num(r.makespan - s.busy).c_str(), pct(s.bubble).c_str(),
                 pct(s.span_bubble).c_str(), s.peak_micro_batches,
                 bytes_or_dash(s.peak_bytes, have_bytes).c_str());
  }
}

void print_summary(const sc::SimResult& r, bool have_bytes) {
  std::fprintf(report(),
               "makespan %s   bubble %s (mean of ranks)   span bubble %s (largest)   peak %.2f "
               "micro-batches, %s\n",
               num(r.makespan).c_str(), pct(r.bubble).c_str(), pct(r.span_bubble).c_str(),
               r.peak_micro_batches, bytes_or_dash(r.peak_bytes, have_bytes).c_str());
}

sc::Schedule make_schedule(const std::string& name, const SimulateOptions& o) {
  if (o.ranks <= 0 || o.micro_batches <= 0)
    throw InputError("--schedule needs --stages (pipeline ranks) and --micro-batches, both >= 1");
  return sc::generate(name, o.ranks, o.micro_batches, o.chunks);
}

struct Row {
  std::string name, note;
  bool ok = false, fit = true;
  sc::SimResult r;
};

void print_comparison(std::vector<Row>& rows, bool have_bytes, const Limit& limit) {
  double best = std::numeric_limits<double>::infinity();
  for (const Row& row : rows)
    if (row.ok && row.fit) best = std::min(best, row.r.makespan);
  std::fprintf(report(), "%-20s %12s %8s %9s %12s %9s %12s  %s\n", "schedule", "makespan",
               "vs best", "bubble", "span-bubble", "peak-mb", "peak-bytes",
               limit.given ? "fits limit" : "");
  for (const Row& row : rows) {
    if (!row.ok) {
      std::fprintf(report(), "%-20s not defined: %s\n", row.name.c_str(), row.note.c_str());
      continue;
    }
    std::fprintf(report(), "%-20s %12s %8.3f %9s %12s %9.2f %12s  %s\n", row.name.c_str(),
                 num(row.r.makespan).c_str(),
                 std::isfinite(best) && best > 0 ? row.r.makespan / best : 1.0,
                 pct(row.r.bubble).c_str(), pct(row.r.span_bubble).c_str(),
                 row.r.peak_micro_batches, bytes_or_dash(row.r.peak_bytes, have_bytes).c_str(),
                 limit.given ? (row.fit ? "yes" : "no") : "");
  }
}

// `csv`: the PyTorch CSV the schedule was read from (null when it was not, or was lowered
// since): a CSV written keeps its dialect, idle steps and waits.
void write_outputs(const SimulateOptions& o, const sc::Simulator& sim, const sc::CostSpec& spec,
                   const sc::TorchCsv* csv) {
  // The trace first: it refuses times a trace cannot hold, before anything is written.
  sc::Timeline t;
  if (!o.trace.empty() || !o.svg.empty()) t = sim.timeline(spec.seconds_per_unit);
  const std::string trace = o.trace.empty() ? "" : sc::to_chrome_trace(t);
  if (!o.output.empty()) {
    if (csv)
      sc::save_schedule(sim.schedule(), o.output, csv->dialect, &csv->kept);
    else
      sc::save_schedule(sim.schedule(), o.output);
    std::fprintf(report(), "wrote %s\n", o.output.c_str());
  }
  if (o.trace.empty() && o.svg.empty()) return;
  if (!o.trace.empty()) {
    memory::write_file_durably(o.trace, trace);
    std::fprintf(report(), "wrote %s (Chrome trace; open in https://ui.perfetto.dev)\n",
                 o.trace.c_str());
  }
  if (!o.svg.empty()) {
    memory::write_file_durably(o.svg, sc::to_svg(t));
    std::fprintf(report(), "wrote %s\n", o.svg.c_str());
  }
}

// Times building and running the simulator (`--repeat N`).
void timing(const sc::Schedule& s, const sc::Costs& c, int repeat) {
  using clk = std::chrono::steady_clock;
  auto ms = [](clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  auto t0 = clk::now();
  sc::Simulator sim(s);
  auto t1 = clk::now();
  sim.run(c);  // warm-up
  std::vector<double> runs;
  for (int i = 0; i < repeat; ++i) {
    auto a = clk::now();
    sim.run(c);
    runs.push_back(ms(a, clk::now()));
  }
  std::sort(runs.begin(), runs.end());
  std::fprintf(
      report(),
      "timing: %zu actions; build (validate + index) %.2f ms; run median %.3f ms, min %.3f, max "
      "%.3f over %d\n",
      s.num_actions(), ms(t0, t1), runs[runs.size() / 2], runs.front(), runs.back(), repeat);
}

int run_simulate(const std::vector<std::string>& args) {
  po::options_description opts("options");
  SimulateOptions o;
  std::string names;
  opts.add_options()(
      "schedule,s", po::value(&names),
      "schedule name(s), comma-separated: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, "
      "dualpipev, dualpipe, v-min, v-half, v-zb, forward-only (evaluation), auto, or all (the "
      "training schedules); more than one compares them")(
      "file,f", po::value(&o.file),
      "a schedule file (text, JSON or PyTorch CSV form) instead of --schedule")(
      "dialect", po::value(&o.dialect),
      "PyTorch CSV dialect of --file: legacy, current or detect (default)")(
      "stages,p", po::value(&o.ranks), "pipeline ranks (p)")(
      "micro-batches,m", po::value(&o.micro_batches), "micro-batches per iteration (m)")(
      "chunks,v", po::value(&o.chunks), "stages per rank for interleaved-1f1b (default 2)")(
      "costs,c", po::value(&o.costs_file),
      "cost file (JSON, docs/schedules.md); default F = B = W = 1")(
      "memory-limit", po::value(&o.memory_limit),
      "activation memory limit per rank, in micro-batches (4) or bytes (2GiB): auto schedules "
      "under it; a fixed schedule is said to fit it or not")(
      "objective", po::value(&o.objective),
      "what auto minimises: makespan (default) or span (the longest rank span)")(
      "lower", po::bool_switch(&o.lower),
      "insert transfers, REDUCE and STEP before simulating and saving")(
      "show", po::bool_switch(&o.show), "print the schedule in text form")(
      "out,o", po::value(&o.output),
      "save the schedule (.json: JSON form, .csv: PyTorch CSV, else text)")(
      "svg", po::value(&o.svg), "write the timeline as SVG")(
      "trace", po::value(&o.trace), "write the timeline as Chrome trace JSON")(
      "repeat", po::value(&o.repeat), "timing mode: run the simulator N times and print the times");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(
          args,
          "baton simulate (--schedule NAME --stages P --micro-batches M | --file PATH) [options]",
          opts, vm))
    return 0;
  apply_common_options(vm);
  // Each given as "" (an unset shell variable) had read as left out: -o "" saved nothing,
  // --memory-limit "" set no limit.
  check_path_flags(vm, {"file", "costs", "out", "svg", "trace"});
  // Every output's directory before anything is simulated or written (a missing one for
  // --svg had come after --out and --trace were written).
  engine::check_output_path(o.output, "--out");
  engine::check_output_path(o.trace, "--trace");
  engine::check_output_path(o.svg, "--svg");
  engine::check_distinct_files({{"--out", o.output},
                                {"--trace", o.trace},
                                {"--svg", o.svg},
                                {"--file", o.file},
                                {"--costs", o.costs_file}},
                               3);
  reports_beside({o.output, o.trace, o.svg});
  check_value_flags(vm, {"schedule", "dialect", "memory-limit", "objective"});
  o.names = split_comma_list(names, "--schedule");
  if (o.names.empty() == o.file.empty())
    throw InputError("give either --schedule NAME[,NAME...] or --file PATH (see --help)");
  if (o.repeat < 0)
    throw InputError("--repeat: expected a count >= 0, found " + std::to_string(o.repeat));
  if (!o.file.empty() && (vm.count("stages") || vm.count("micro-batches") || vm.count("chunks")))
    throw InputError(
        "--stages, --micro-batches and --chunks go with --schedule; a --file says its own");
  const Limit limit = parse_limit(o.memory_limit);
  // Checked even where the schedule does not use them: a typo is never ignored.
  const auto objective = sc::parse_objective(o.objective, "--objective");
  const auto dialect = sc::parse_dialect(o.dialect);
  const sc::CostSpec spec =
      o.costs_file.empty() ? sc::CostSpec::unit() : sc::load_costs(o.costs_file);
  const bool have_bytes = spec.activation_bytes.given;
  if (limit.bytes && !have_bytes)
    throw InputError(
        "--memory-limit in bytes needs activation_bytes in the cost file (or give it in "
        "micro-batches)");

  // A cost file that does not fit the schedule (values for another rank count) is named.
  auto resolved = [&](const sc::Schedule& s) {
    try {
      return sc::resolve(spec, s);
    } catch (const InputError& e) {
      if (o.costs_file.empty()) throw;
      throw InputError(o.costs_file + ": " + e.what());
    }
  };

  // "all" stands for the training schedules, also in a list ("all,auto"; it had been an
  // unknown schedule there).
  const bool with_all = std::find(o.names.begin(), o.names.end(), "all") != o.names.end();
  if (with_all) {
    std::vector<std::string> expanded;
    for (const std::string& name : o.names)
      if (name == "all")
        expanded.insert(expanded.end(), sc::all_schedule_names().begin(),
                        sc::all_schedule_names().end());
      else
        expanded.push_back(name);
    o.names = std::move(expanded);
  }
  // Unknown names are errors even when comparing; a name twice (or an alias beside its
  // name) had compared a schedule with itself.
  std::vector<std::string> canonical;
  for (const std::string& name : o.names) {
    try {
      canonical.push_back(name == "auto" ? name : sc::canonical_schedule_name(name));
    } catch (const InputError& e) {
      throw InputError(std::string(e.what()) + "; or auto, or all (the training schedules)");
    }
    if (std::count(canonical.begin(), canonical.end(), canonical.back()) > 1)
      throw InputError("--schedule " + names + ": " + canonical.back() + " is listed twice" +
                       (with_all ? " (all holds every training schedule)" : "") +
                       " (expected each schedule once)");
  }
  // 0 had read as the default (2), and a schedule with a fixed count ignored it (auto) or
  // took its own: --chunks is interleaved-1f1b's, as --objective is auto's.
  if (vm.count("chunks")) {
    if (o.chunks < 1 || o.chunks > 64)
      throw InputError("--chunks: expected 1 to 64 stages per rank, found " +
                       std::to_string(o.chunks));
    if (std::find(canonical.begin(), canonical.end(), "interleaved-1f1b") == canonical.end())
      throw InputError(
          "--chunks is the stages per rank of interleaved-1f1b (the other schedules have "
          "their own); it needs --schedule interleaved-1f1b (alone or in a comparison), found "
          "--schedule " +
          names);
  }
  if (vm.count("objective") && std::find(o.names.begin(), o.names.end(), "auto") == o.names.end())
    throw InputError(
        "--objective is what the auto schedule minimises; it needs --schedule auto "
        "(alone or in a comparison), found " +
        (o.file.empty() ? "--schedule " + names : "--file " + o.file));
  if (vm.count("dialect") && (o.file.empty() || !sc::is_csv_path(o.file)))
    throw InputError(
        "--dialect is the PyTorch CSV dialect of --file; it needs a --file ending in .csv, "
        "found " +
        (o.file.empty() ? "--schedule " + names : "--file " + o.file));
  const bool compare = o.names.size() > 1;
  if (compare && (!o.svg.empty() || !o.trace.empty() || !o.output.empty() || o.show || o.repeat))
    throw InputError("--svg, --trace, --out, --show and --repeat need a single schedule");

  auto run_auto = [&]() {
    if (o.ranks <= 0 || o.micro_batches <= 0)
      throw InputError("auto needs --stages and --micro-batches");
    sc::AutoOptions ao;
    ao.num_ranks = o.ranks;
    ao.num_micro_batches = o.micro_batches;
    ao.memory_limit = {limit.value};
    ao.limit_in_bytes = limit.bytes;
    ao.objective = objective;
    ao.costs_source = o.costs_file;
    return sc::auto_schedule(spec, ao);
  };

  if (compare) {
    // Every row's own "not defined" had been printed, exit 0, for a comparison without them.
    if (o.ranks <= 0 || o.micro_batches <= 0)
      throw InputError("--schedule " + names + ": a comparison needs --stages and --micro-batches");
    std::vector<Row> rows;
    for (const std::string& name : o.names) {
      Row row;
      row.name = name;
      try {
        sc::Schedule s = name == "auto" ? run_auto().schedule : make_schedule(name, o);
        if (o.lower) s = sc::lower(s);
        sc::Simulator sim(s, name);
        row.r = sim.run(resolved(s));
        row.ok = true;
        row.fit = fits(row.r, limit);
      } catch (const InputError& e) {
        row.note = e.what();  // not defined for these ranks and micro-batches
      }
      rows.push_back(row);
    }
    std::fprintf(report(), "%d ranks, %d micro-batches, costs %s%s\n\n", o.ranks, o.micro_batches,
                 o.costs_file.empty() ? "F = B = W = 1 per rank share" : o.costs_file.c_str(),
                 o.lower ? "; lowered (transfers, REDUCE, STEP)"
                         : "; compute only (add --lower for REDUCE and STEP)");
    print_comparison(rows, have_bytes, limit);
    return 0;
  }

  sc::Schedule s;
  std::string source;
  std::optional<sc::TorchCsv> csv;  // the CSV read, for writing it back
  if (!o.file.empty() && sc::is_csv_path(o.file)) {
    csv = sc::load_torch_csv(o.file, dialect);
    sc::check_torch_csv(*csv, o.file);
    s = csv->schedule;
    source = o.file;
  } else if (!o.file.empty()) {
    s = sc::load_schedule(o.file);
    source = o.file;
  } else if (o.names[0] == "auto") {
    sc::AutoResult ar = run_auto();
    std::fprintf(
        report(),
        "automatic schedule for %d ranks, %d micro-batches, memory limit %s per rank\n"
        "(the fixed schedules with their backward split into B and W, on the same costs)\n\n",
        o.ranks, o.micro_batches,
        limit.given ? (limit.bytes ? memory::format_bytes(limit.value)
                                   : num(limit.value) + " micro-batches")
                          .c_str()
                    : "none");
    std::vector<Row> rows;
    for (const sc::AutoCandidate& c : ar.fixed) {
      Row row;
      row.name = c.name;
      row.ok = c.defined;
      row.note = c.note;
      row.fit = c.fits;
      row.r.makespan = c.makespan;
      row.r.bubble = c.bubble;
      row.r.peak_micro_batches = c.peak_micro_batches;
      row.r.peak_bytes = c.peak_bytes;
      row.r.span_bubble = c.span_bubble;
      rows.push_back(row);
    }
    Row mine;
    mine.name = "auto";
    mine.ok = true;
    mine.r = ar.sim;
    rows.push_back(mine);
    print_comparison(rows, have_bytes, limit);
    std::fprintf(report(), "\nchosen: %s (%d list-scheduler runs)\n\n", ar.chosen.c_str(),
                 ar.greedy_runs);
    s = std::move(ar.schedule);
    source = "auto";
  } else {
    s = make_schedule(o.names[0], o);
    source = o.names[0];
  }
  if (o.lower) {
    // What the user wrote is checked as written: lowering would hide some of its faults
    // (a STEP on some ranks only was taken out and put back on every rank). A CSV is
    // checked already, a generated schedule is valid.
    if (!o.file.empty() && !csv) sc::check_valid(s, source);
    s = sc::lower(s);
    csv.reset();  // its kept cells sit between the actions it had
  }
  bool has_reduce = false, has_step = false;
  for (const auto& list : s.ranks)
    for (const sc::Action& a : list) {
      has_reduce = has_reduce || a.kind == sc::ActionKind::reduce_gradients;
      has_step = has_step || a.kind == sc::ActionKind::optimizer_step;
    }
  // Only what is missing: a schedule with REDUCE and no STEP had been told it lacked both.
  const bool reduce_unused = spec.reduce.given && !has_reduce;
  const bool step_unused = spec.optimizer_step > 0 && !has_step;
  if (reduce_unused || step_unused)
    std::fprintf(report(),
                 "note: the %s %s to %s actions, which this schedule lacks; --lower inserts them\n",
                 reduce_unused && step_unused ? "reduce and optimizer_step costs"
                 : reduce_unused              ? "reduce cost"
                                              : "optimizer_step cost",
                 reduce_unused && step_unused ? "apply" : "applies",
                 reduce_unused && step_unused ? "REDUCE and STEP"
                 : reduce_unused              ? "REDUCE"
                                              : "STEP");
  sc::Simulator sim(s, source);
  const sc::Costs costs = resolved(sim.schedule());
  const sc::SimResult& r = sim.run(costs);
  std::fprintf(report(),
               "%s: %d ranks, %d micro-batches, %d stages, %d direction%s, %zu actions%s; valid\n",
               s.name.empty() ? source.c_str() : s.name.c_str(), s.num_ranks, s.num_micro_batches,
               s.num_stages(), s.num_directions, s.num_directions > 1 ? "s" : "", s.num_actions(),
               sc::has_transfers(s)     ? " (with transfers)"
               : has_reduce || has_step ? " (no transfers)"
                                        : " (compute only)");
  print_summary(r, have_bytes);
  if (limit.given)
    std::fprintf(report(), "memory limit %s per rank: %s\n",
                 limit.bytes ? memory::format_bytes(limit.value).c_str()
                             : (num(limit.value) + " micro-batches").c_str(),
                 fits(r, limit) ? "fits" : "exceeded");
  std::fprintf(report(), "\n");
  print_ranks(r, have_bytes);
  if (o.show) std::fprintf(report(), "\n%s", sc::to_text(sim.schedule()).c_str());
  if (o.repeat > 0) timing(sim.schedule(), costs, o.repeat);
  write_outputs(o, sim, spec, csv ? &*csv : nullptr);
  return 0;
}

const RegisterCommand register_simulate{
    {"simulate", "generate, validate and simulate pipeline schedules", run_simulate}};

}  // namespace
}  // namespace baton::tools
