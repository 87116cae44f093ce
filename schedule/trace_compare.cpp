#include "schedule/trace_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "memory/error.h"
#include "schedule/detail/util.h"

namespace baton::schedule {

namespace {

using Key = std::tuple<int, int, int>;  // kind, micro-batch, stage (STEP: stage = -1 - rank)

bool compared(ActionKind k) {
  return is_compute(k) || k == ActionKind::optimizer_step;
}

Key key_of(const TimelineEvent& e, int rank) {
  return {int(e.kind), e.micro_batch, e.kind == ActionKind::optimizer_step ? -1 - rank : e.stage};
}

// What a timeline says of its plan: pipeline ranks (the ranks with pipeline actions,
// counted once per set of stages: a pipeline rank's tensor- and data-parallel ranks run
// the same), stages and micro-batches.
struct Shape {
  int pipeline_ranks = 0, stages = 0, micro_batches = 0;
};

Shape shape_of(const Timeline& t) {
  std::map<int, std::set<int>> stages_of;  // rank -> its stages
  Shape s;
  for (const TimelineEvent& e : t.events)
    if (is_compute(e.kind)) {
      stages_of[e.rank].insert(e.stage);
      s.stages = std::max(s.stages, e.stage + 1);
      s.micro_batches = std::max(s.micro_batches, e.micro_batch + 1);
    }
  std::set<std::set<int>> groups;
  for (const auto& [rank, stages] : stages_of) groups.insert(stages);
  s.pipeline_ranks = int(groups.size());
  return s;
}

// Timelines of different plans share some actions, and their differences had been
// reported as the prediction's error ("F +1509%").
void check_same_plan(const Timeline& measured, const Timeline& predicted,
                     const std::string& measured_name, const std::string& predicted_name) {
  const Shape m = shape_of(measured), p = shape_of(predicted);
  for (const auto& [what, a, b] : {std::tuple{"pipeline ranks", m.pipeline_ranks, p.pipeline_ranks},
                                   {"stages", m.stages, p.stages},
                                   {"micro-batches", m.micro_batches, p.micro_batches}})
    if (a != b)
      throw InputError(measured_name + " has " + std::to_string(a) + " " + what + " and " +
                       predicted_name + " has " + std::to_string(b) +
                       ": timelines of different plans (expected a run's trace and the "
                       "prediction of the same plan)");
}

// The schedule a timeline names: baton train --trace's "measured: 1f1b (3 steps)", baton
// trace predict's "predicted: 1f1b", the simulator's "1f1b".
std::string schedule_named(std::string name) {
  for (const char* prefix : {"measured: ", "predicted: "})
    if (name.starts_with(prefix)) name = name.substr(std::string_view(prefix).size());
  if (const size_t open = name.rfind(" ("); open != std::string::npos && name.ends_with(")") &&
                                            name.find(" step", open) != std::string::npos)
    name = name.substr(0, open);
  return name;
}

// Given the wrong way round, every difference had come out with the opposite sign. Two
// predictions (under two cost files) or two runs compare as given.
void check_roles(const Timeline& measured, const Timeline& predicted,
                 const std::string& measured_name, const std::string& predicted_name) {
  if (measured.name.starts_with("predicted: ") && predicted.name.starts_with("measured: "))
    throw InputError(measured_name + " is a prediction ('" + printable(measured.name) + "') and " +
                     predicted_name + " a measured run ('" + printable(predicted.name) +
                     "'): the measured timeline goes first, then the prediction (swapped, "
                     "every difference would read with the opposite sign)");
}

}  // namespace

TraceComparison compare_timelines(const Timeline& measured, const Timeline& predicted,
                                  const std::string& measured_name,
                                  const std::string& predicted_name) {
  for (const auto& [t, name] :
       {std::pair{&measured, &measured_name}, {&predicted, &predicted_name}})
    if (std::none_of(t->events.begin(), t->events.end(),
                     [](const TimelineEvent& e) { return is_compute(e.kind); }))
      throw InputError(*name +
                       ": no pipeline action (F, B, W) in it: expected a timeline of baton train "
                       "--trace, baton trace predict or baton simulate --trace");
  check_roles(measured, predicted, measured_name, predicted_name);
  check_same_plan(measured, predicted, measured_name, predicted_name);
  TraceComparison c;
  const std::string ms = schedule_named(measured.name), ps = schedule_named(predicted.name);
  if (!ms.empty() && !ps.empty() && ms != ps)
    c.schedule_note = "the timelines are of different schedules ('" + printable(ms) +
                      "' measured, '" + printable(ps) +
                      "' predicted): the differences below are the schedules', not the "
                      "prediction's error (baton trace predict --schedule FILE, Python's "
                      "predict(..., schedule=), predicts the schedule a run used)";
  // Measured: the first occurrence of each key on the lowest rank that ran it. STEP has
  // no stage: the pipeline rank of a measured STEP is the rank of the stages it ran
  // (measured rank r's first stage's predicted rank).
  std::map<int, int> stage_rank;  // stage -> predicted rank
  for (const TimelineEvent& e : predicted.events)
    if (e.stage >= 0 && is_compute(e.kind)) stage_rank[e.stage] = e.rank;
  std::map<int, int> measured_pp;  // measured rank -> predicted rank
  for (const TimelineEvent& e : measured.events)
    if (e.stage >= 0 && is_compute(e.kind) && !measured_pp.count(e.rank) &&
        stage_rank.count(e.stage))
      measured_pp[e.rank] = stage_rank[e.stage];
  std::vector<TimelineEvent> m = measured.events;
  std::sort(m.begin(), m.end(), [](const TimelineEvent& a, const TimelineEvent& b) {
    return std::tie(a.rank, a.start) < std::tie(b.rank, b.start);
  });
  // A rank's first step is its events up to its first compute action that repeats one of
  // them or follows its STEP (the next step's). A post-validation rollback's redo is a
  // second STEP inside the step: not matched (the simulator does not model rollbacks), but
  // part of the step's makespan and reported apart.
  std::map<Key, TimelineEvent> first;
  std::vector<TimelineEvent> redos, in_step;
  for (size_t b = 0, e_ = 0; b < m.size(); b = e_) {
    for (e_ = b; e_ < m.size() && m[e_].rank == m[b].rank;) ++e_;
    std::set<Key> computed;
    bool stepped = false;
    for (size_t i = b; i < e_; ++i) {
      const TimelineEvent& e = m[i];
      if (!compared(e.kind) || !e.label.empty()) continue;  // labelled: no action
      const int pp = measured_pp.count(e.rank) ? measured_pp[e.rank] : e.rank;
      const Key k = key_of(e, pp);
      if (is_compute(e.kind) && (stepped || !computed.insert(k).second)) break;
      const bool redo = e.kind == ActionKind::optimizer_step && stepped;
      // A rank of STEPs alone (a parameter server's): its second is the next step's.
      if (redo && computed.empty()) break;
      in_step.push_back(e);
      if (redo) {
        redos.push_back(e);
        continue;
      }
      stepped = stepped || e.kind == ActionKind::optimizer_step;
      auto it = first.find(k);
      if (it == first.end() || e.rank < it->second.rank) first[k] = e;
    }
  }
  // The makespan spans every first-step event of the ranks kept (redos included), from
  // the step's first action.
  std::set<int> kept;
  for (const auto& [k, e] : first) kept.insert(e.rank);
  double m0 = 1e300, m1 = -1e300;
  for (const TimelineEvent& e : in_step)
    if (kept.count(e.rank)) {
      m0 = std::min(m0, e.start * measured.seconds_per_unit);
      m1 = std::max(m1, e.end * measured.seconds_per_unit);
    }
  c.measured_makespan = first.empty() ? 0 : m1 - m0;
  for (const TimelineEvent& e : redos)
    if (kept.count(e.rank)) {
      c.redone_steps++;
      c.redo_mean += (e.end - e.start) * measured.seconds_per_unit;
    }
  if (c.redone_steps > 0) c.redo_mean /= c.redone_steps;
  const double pu = predicted.seconds_per_unit, mu = measured.seconds_per_unit;
  std::vector<TimelineEvent> p = predicted.events;
  std::sort(p.begin(), p.end(), [](const TimelineEvent& a, const TimelineEvent& b) {
    return std::tie(a.rank, a.start) < std::tie(b.rank, b.start);
  });
  // A prediction is one step with each action once: a repeated one is a measured trace of
  // several steps or ranks given as the prediction, whose actions would match arbitrarily.
  std::map<Key, const TimelineEvent*> seen;
  double p0 = 1e300, p1 = -1e300;
  for (const TimelineEvent& e : p) {
    if (!compared(e.kind)) continue;
    auto [it, fresh] = seen.emplace(key_of(e, e.rank), &e);
    if (!fresh)
      throw InputError(predicted_name + ": " +
                       to_token(Action{e.kind, e.micro_batch, e.stage, -1}) +
                       " appears twice (rank " + std::to_string(it->second->rank) + " at " +
                       detail::format_number("%g", it->second->start * pu) + " s and rank " +
                       std::to_string(e.rank) + " at " + detail::format_number("%g", e.start * pu) +
                       " s): expected one step with each action once (baton trace predict or "
                       "baton simulate --trace), not a trace of several steps or ranks");
    p0 = std::min(p0, e.start * pu);
    p1 = std::max(p1, e.end * pu);
  }
  // Both sides are measured from their own first action, as the measured side is.
  if (seen.empty()) p0 = p1 = 0;
  std::map<int, KindSummary> kinds;
  double sum_start = 0, sum_dur = 0;
  int n = 0;
  std::map<Key, bool> used;
  for (const TimelineEvent& e : p) {
    if (!compared(e.kind)) continue;
    ActionDiff d;
    d.kind = e.kind;
    d.micro_batch = e.micro_batch;
    d.stage = e.stage;
    d.predicted_rank = e.rank;
    d.predicted_start = e.start * pu - p0;
    d.predicted_end = e.end * pu - p0;
    Key k = key_of(e, e.rank);
    auto it = first.find(k);
    if (it != first.end()) {
      d.matched = true;
      used[k] = true;
      d.measured_rank = it->second.rank;
      d.measured_start = it->second.start * mu - m0;
      d.measured_end = it->second.end * mu - m0;
      KindSummary& ks = kinds[int(e.kind)];
      ks.kind = e.kind;
      ks.count++;
      ks.measured_mean += d.measured_end - d.measured_start;
      ks.predicted_mean += d.predicted_end - d.predicted_start;
      if (is_compute(e.kind)) {
        sum_start += std::abs(d.measured_start - d.predicted_start);
        sum_dur +=
            std::abs((d.measured_end - d.measured_start) - (d.predicted_end - d.predicted_start));
        ++n;
      }
    } else {
      c.unmatched_predicted++;
    }
    c.actions.push_back(d);
  }
  for (const auto& [k, e] : first)
    if (!used.count(k)) c.unmatched_measured++;
  if (n == 0)
    throw InputError(measured_name + " and " + predicted_name +
                     " share no action (kind, micro-batch, stage): timelines of different plans "
                     "or schedules");
  c.predicted_makespan = p1 - p0;
  for (auto& [k, ks] : kinds) {
    ks.measured_mean /= ks.count;
    ks.predicted_mean /= ks.count;
    c.kinds.push_back(ks);
  }
  if (n > 0) {
    c.mean_abs_start_diff = sum_start / n;
    c.mean_abs_duration_diff = sum_dur / n;
  }
  return c;
}

std::string format_comparison(const TraceComparison& c, bool actions) {
  std::string out;
  if (!c.schedule_note.empty()) out += "note: " + c.schedule_note + "\n";
  auto ms = [](double s) { return detail::format_number("%.3f", s * 1e3); };
  const double diff = c.measured_makespan - c.predicted_makespan;
  out += "makespan: measured " + ms(c.measured_makespan) + " ms, predicted " +
         ms(c.predicted_makespan) + " ms, difference " + ms(diff) + " ms (" +
         detail::format_number("%+.1f",
                               c.predicted_makespan > 0 ? 100 * diff / c.predicted_makespan : 0.0) +
         "% of the prediction)\n";
  out += "matched compute actions: mean |start difference| " + ms(c.mean_abs_start_diff) +
         " ms, mean |duration difference| " + ms(c.mean_abs_duration_diff) + " ms";
  if (c.unmatched_measured || c.unmatched_predicted)
    out += "; unmatched: " + std::to_string(c.unmatched_measured) + " measured, " +
           std::to_string(c.unmatched_predicted) + " predicted";
  out += "\n\nkind    count  measured mean ms  predicted mean ms  difference\n";
  for (const KindSummary& k : c.kinds) {
    char line[160];
    std::snprintf(
        line, sizeof line, "%-6s %6d %17.3f %18.3f %10.1f%%\n",
        std::string(kind_code(k.kind)).c_str(), k.count, k.measured_mean * 1e3,
        k.predicted_mean * 1e3,
        k.predicted_mean > 0 ? 100 * (k.measured_mean - k.predicted_mean) / k.predicted_mean : 0.0);
    out += line;
  }
  if (c.redone_steps > 0) {
    char line[160];
    std::snprintf(line, sizeof line, "%-6s %6d %17.3f %18s  (rollbacks: not modelled)\n", "redo",
                  c.redone_steps, c.redo_mean * 1e3, "-");
    out += line;
  }
  if (!actions) return out;
  out +=
      "\naction      rank  measured start..end ms  predicted start..end ms  start diff  duration "
      "diff\n";
  for (const ActionDiff& d : c.actions) {
    Action a{d.kind, d.micro_batch, d.stage, -1};
    char line[200];
    if (!d.matched) {
      std::snprintf(line, sizeof line, "%-10s %5d  %22s  %9.3f..%-9.3f  (not measured)\n",
                    to_token(a).c_str(), d.predicted_rank, "-", d.predicted_start * 1e3,
                    d.predicted_end * 1e3);
    } else {
      std::snprintf(
          line, sizeof line, "%-10s %5d  %10.3f..%-10.3f  %10.3f..%-10.3f  %+10.3f  %+13.3f\n",
          to_token(a).c_str(), d.predicted_rank, d.measured_start * 1e3, d.measured_end * 1e3,
          d.predicted_start * 1e3, d.predicted_end * 1e3,
          (d.measured_start - d.predicted_start) * 1e3,
          ((d.measured_end - d.measured_start) - (d.predicted_end - d.predicted_start)) * 1e3);
    }
    out += line;
  }
  return out;
}

}  // namespace baton::schedule
