// The Python module `baton`: thin pybind11 bindings of the schedule IR, its file forms
// (text, JSON, PyTorch CSV), the generators, the validator, the lowering passes, the
// simulator, the automatic scheduler, timelines and the partitioner's planning
// (docs/schedules.md, "Python"). Long calls release the GIL; the simulator's per-action
// times come back as numpy arrays filled in one pass by the library (no copy after).
#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "memory/error.h"
#include "memory/utf8.h"
#include "schedule/auto_schedule.h"
#include "schedule/costs.h"
#include "schedule/dependencies.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/schedule_io.h"
#include "schedule/simulate.h"
#include "schedule/timeline.h"
#include "schedule/torch_csv.h"
#include "schedule/trace_compare.h"
#include "schedule/validate.h"
#include "tools/cpu_check.h"
#include "tools/python/planning.h"
#include "transport/ucx.h"

namespace py = pybind11;
using namespace baton::schedule;
using baton::InputError;

namespace baton::python {

namespace {

// ---- conversions ----------------------------------------------------------------------

// The costs of a call: a CostSpec from a dict of cost-file fields (values: numbers,
// lists or numpy arrays, one per stage), or None for F = B = W = 1.
CostSpec cost_spec(const py::object& costs) {
  if (costs.is_none()) return CostSpec::unit();
  if (py::isinstance<CostSpec>(costs)) return costs.cast<CostSpec>();
  if (!py::isinstance<py::dict>(costs))
    throw InputError(
        "costs: expected a dict of cost-file fields (forward, backward_input, ...), "
        "a baton.CostSpec or None");
  return parse_costs(to_json(costs, "costs").dump(), "costs");
}

// A number or a list / numpy array of them, each finite (as a number alone is) and at
// most `max`.
std::vector<double> as_vector(const py::object& o, const std::string& what,
                              double max = std::numeric_limits<double>::max(),
                              const char* max_text = "") {
  // A 0-d array is one number, as simulate's cost dicts read it.
  if (py::isinstance<py::array>(o) && py::reinterpret_borrow<py::array>(o).ndim() == 0)
    return as_vector(o.attr("item")(), what, max, max_text);
  std::vector<double> v;
  const bool one = is_number(o);
  if (one) {
    v = {finite_number(o, what)};
  } else {
    // forcecast below would read a bool as 0 or 1, which a number alone is refused for.
    if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
      size_t i = 0;
      for (const py::handle e : o) {
        if (!is_number(e) && !py::isinstance<py::array>(e))
          throw InputError(what + "[" + std::to_string(i) + "]: expected a number, found " +
                           std::string(py::str(py::repr(e))));
        ++i;
      }
    } else if (py::isinstance<py::array>(o) &&
               py::reinterpret_borrow<py::array>(o).dtype().kind() == 'b') {
      throw InputError(what + ": expected numbers, found an array of bools");
    }
    auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(o);
    if (!a || a.ndim() != 1) throw InputError(what + ": expected a number or a list of numbers");
    v.assign(a.data(), a.data() + a.size());
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = one ? what : what + "[" + std::to_string(i) + "]";
    if (!std::isfinite(v[i]))
      throw InputError(at + ": expected a finite number, found " +
                       std::string(py::str(py::float_(v[i]))));
    if (v[i] > max)
      throw InputError(at + ": expected at most " + max_text + ", found " +
                       std::string(py::str(py::float_(v[i]))));
  }
  return v;
}

// Python may rename a Schedule (s.name = ...) whenever it holds the GIL, so a call that
// reads one with the GIL released works on a copy taken while holding it. (The
// Simulator shares the schedule instead: it reads no name but the timeline's, which
// run_simulation makes from a copy.)
template <class F>
auto with_copy(const Schedule& s, F&& f) {
  const Schedule own = s;  // NOLINT(performance-unnecessary-copy-initialization): the point
  py::gil_scoped_release release;
  return f(own);
}

// Raises baton.ScheduleError (a ValueError) with the validator's report, where and what,
// unless `r`, the report on `s`, is valid.
void raise_unless_valid(const Schedule& s, const ValidationReport& r) {
  if (r.ok) return;
  py::object error_type = py::module_::import("baton").attr("ScheduleError");
  py::object e = error_type(r.message + "\n" + r.grid);
  e.attr("rank") = r.rank;
  e.attr("index") = r.index;
  const bool has = r.rank >= 0 && r.index >= 0 && size_t(r.rank) < s.ranks.size() &&
                   size_t(r.index) < s.ranks[size_t(r.rank)].size();
  e.attr("action") =
      has ? py::cast(to_token(s.ranks[size_t(r.rank)][size_t(r.index)])) : py::none();
  e.attr("message") = r.message;
  e.attr("grid") = r.grid;
  PyErr_SetObject(error_type.ptr(), e.ptr());
  throw py::error_already_set();
}

// An invalid schedule refused by the simulator raises baton.ScheduleError with where and
// what, as validate() does (it had been a plain InputError without rank or action).
template <class F>
auto as_schedule_error(const Schedule& s, F&& f) {
  try {
    return f();
  } catch (const InputError&) {
    raise_unless_valid(s, with_copy(s, [](const Schedule& c) { return validate(c); }));
    throw;
  }
}

// pybind11 passes None as an empty holder: refused here, not dereferenced.
void need_schedule(const std::shared_ptr<Schedule>& s) {
  if (!s) throw InputError("schedule: expected a baton.Schedule, found None");
}

// A numpy array that owns `v` (moved, not copied).
py::array_t<double> owned_array(std::vector<double>&& v) {
  auto* heap = new std::vector<double>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<double>*>(p); });
  return py::array_t<double>({py::ssize_t(heap->size())}, {sizeof(double)}, heap->data(), owner);
}

// An action without the numbers its token needs had been written as "-1F0", a file that
// does not read back, and refused by the validator only later as "stage -1".
void check_complete(const Action& a, const std::string& where) {
  if (a.kind == ActionKind::optimizer_step) return;
  const std::string k(kind_code(a.kind));
  if (a.stage < 0)
    throw InputError(where + ": a '" + k + "' action needs its stage, >= 0 (found " +
                     std::to_string(a.stage) + "): (kind, micro_batch, stage)");
  if (has_micro_batch(a.kind) && a.micro_batch < 0)
    throw InputError(where + ": a '" + k + "' action needs its micro-batch, >= 0 (found " +
                     std::to_string(a.micro_batch) + ")");
}

Action action_from(const py::handle& h, const std::string& where) {
  if (py::isinstance<Action>(h)) return h.cast<Action>();
  if (py::isinstance<py::str>(h)) return parse_token(h.cast<std::string>(), where);
  if (py::isinstance<py::tuple>(h) || py::isinstance<py::list>(h)) {
    auto t = h.cast<py::sequence>();
    if (t.size() < 2 || t.size() > 3)
      throw InputError(where + ": expected (kind, micro_batch, stage) or a token such as '1F3'");
    auto kind = kind_from_code(py::str(t[0]).cast<std::string>());
    if (!kind)
      throw InputError(where + ": unknown kind '" + py::str(t[0]).cast<std::string>() + "'");
    Action a;
    a.kind = *kind;
    a.micro_batch = t[1].is_none() ? -1 : whole_number(t[1], where + ": micro_batch");
    a.stage = t.size() > 2 && !t[2].is_none() ? whole_number(t[2], where + ": stage") : -1;
    check_complete(a, where);
    return a;
  }
  throw InputError(where + ": expected a baton.Action, a token such as '1F3' or a tuple");
}

// baton.Simulator: run() writes the simulator's per-run state with the GIL released, so
// Python threads sharing one take turns.
struct SharedSimulator {
  explicit SharedSimulator(std::shared_ptr<const Schedule> s) : sim(std::move(s), "schedule") {}
  Simulator sim;
  std::mutex mutex;
};

// ---- the result of a simulation, as Python sees it -------------------------------------

// The start and end arrays are built on first read, from the Simulator the result keeps
// until then: the call costs what the C++ call does (build + run), and a sweep that
// reads only the makespan never pays for 2 x 8 bytes per action.
struct PySimResult {
  SimResult sim;
  std::vector<int> offsets;            // per rank, its first action in start/end; then the count
  std::shared_ptr<Timeline> timeline;  // when asked for
  std::shared_ptr<const Simulator> simulator;  // until the arrays are built
  py::object start, end;

  // Called with the GIL held; two threads may both get here before either is done.
  void build_arrays() {
    if (!simulator) return;
    const std::shared_ptr<const Simulator> own = simulator;  // alive while the GIL is off
    const auto n = py::ssize_t(own->schedule().num_actions());
    // Shape and strides given: pybind11 2.10 computes default strides from the dtype's
    // item size, which it reads at NumPy 1's offset, 0 under NumPy 2.
    const std::vector<py::ssize_t> shape = {n}, strides = {py::ssize_t(sizeof(double))};
    py::array_t<double> s(shape, strides), e(shape, strides);
    double* sd = s.mutable_data();
    double* ed = e.mutable_data();
    {
      py::gil_scoped_release release;
      own->action_times(sd, ed);
    }
    if (!simulator) return;  // another thread built them meanwhile
    start = std::move(s);
    end = std::move(e);
    simulator.reset();
  }
};

// The simulator shares the Python-owned schedule rather than copying it (36 MB of fresh
// memory at p = 128, m = 1024, where the C++ caller moves its own in).
std::shared_ptr<PySimResult> run_simulation(std::shared_ptr<const Schedule> s, const CostSpec& spec,
                                            bool keep_timeline) {
  auto out = std::make_shared<PySimResult>();
  // The timeline reads the name, which Python may change meanwhile: a copy then (the
  // timeline is as large).
  if (keep_timeline) s = std::make_shared<const Schedule>(*s);
  py::gil_scoped_release release;
  auto sim = std::make_shared<Simulator>(s, "schedule");
  out->sim = sim->run(resolve(spec, *s));
  out->offsets.reserve(s->ranks.size() + 1);
  int k = 0;
  for (const auto& list : s->ranks) {
    out->offsets.push_back(k);
    k += int(list.size());
  }
  out->offsets.push_back(k);
  if (keep_timeline)
    out->timeline = std::make_shared<Timeline>(sim->timeline(spec.seconds_per_unit));
  out->simulator = std::move(sim);
  return out;
}

py::array_t<double> per_rank(const SimResult& r, double RankStats::*field) {
  std::vector<double> v;
  v.reserve(r.ranks.size());
  for (const RankStats& s : r.ranks) v.push_back(s.*field);
  return owned_array(std::move(v));
}

py::dict auto_candidate(const AutoCandidate& c) {
  py::dict d;
  d["name"] = c.name;
  d["defined"] = c.defined;
  d["fits"] = c.fits;
  d["note"] = c.note;
  d["makespan"] = c.makespan;
  d["bubble"] = c.bubble;
  d["span_bubble"] = c.span_bubble;
  d["peak_micro_batches"] = c.peak_micro_batches;
  d["peak_bytes"] = c.peak_bytes;
  return d;
}

py::dict comparison_dict(const TraceComparison& c) {
  py::dict d;
  d["measured_makespan"] = c.measured_makespan;
  d["predicted_makespan"] = c.predicted_makespan;
  d["unmatched_measured"] = c.unmatched_measured;
  d["unmatched_predicted"] = c.unmatched_predicted;
  d["mean_abs_start_diff"] = c.mean_abs_start_diff;
  d["mean_abs_duration_diff"] = c.mean_abs_duration_diff;
  d["redone_steps"] = c.redone_steps;
  d["redo_mean"] = c.redo_mean;
  d["schedule_note"] = c.schedule_note;
  py::list kinds;
  for (const KindSummary& k : c.kinds) {
    py::dict e;
    e["kind"] = std::string(kind_code(k.kind));
    e["count"] = k.count;
    e["measured_mean"] = k.measured_mean;
    e["predicted_mean"] = k.predicted_mean;
    kinds.append(e);
  }
  d["kinds"] = kinds;
  py::list actions;
  for (const ActionDiff& a : c.actions) {
    py::dict e;
    e["action"] = to_token(make_action(a.kind, a.micro_batch, a.stage));
    e["matched"] = a.matched;
    e["measured_rank"] = a.measured_rank;
    e["predicted_rank"] = a.predicted_rank;
    e["measured_start"] = a.measured_start;
    e["measured_end"] = a.measured_end;
    e["predicted_start"] = a.predicted_start;
    e["predicted_end"] = a.predicted_end;
    actions.append(e);
  }
  d["actions"] = actions;
  d["report"] = format_comparison(c, false);
  return d;
}

// The module's log lines (a cost file's warnings) go to standard error, "baton: warning:
// ...": spdlog's default logger had written them to standard output, into a script's
// data. The sink's mutex is held across fork(): a child forked while another thread
// logged had waited for ever on spdlog's console mutex, locked in the parent at the fork.
class ForkSafeStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    // write(2), not stdio: no stdio lock to be held at a fork either.
    for (size_t done = 0; done < line.size();) {
      const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
      if (n <= 0) return;  // a closed standard error: nothing to tell
      done += size_t(n);
    }
  }
  void flush_() override {}
};

void log_to_stderr() {
  static auto* sink = new std::shared_ptr<ForkSafeStderrSink>(nullptr);
  if (*sink) return;  // once a process
  *sink = std::make_shared<ForkSafeStderrSink>();
  auto logger = std::make_shared<spdlog::logger>("baton", *sink);
  logger->set_pattern("baton: %l: %v");
  logger->set_level(spdlog::default_logger()->level());
  spdlog::set_default_logger(std::move(logger));
  ::pthread_atfork([] { (*sink)->lock_for_fork(); }, [] { (*sink)->unlock_after_fork(); },
                   [] { (*sink)->unlock_after_fork(); });
}

}  // namespace

}  // namespace baton::python

PYBIND11_MODULE(baton, m) {
  baton::tools::require_cpu_features();  // an ImportError naming them, not SIGILL later
  // UCX, loaded with the module, had taken SIGHUP from the interpreter.
  baton::transport::release_ucx_debug_signal();
  baton::python::log_to_stderr();
  // pybind11 sets NumPy's C API up in a function-local static on the first array, and
  // that imports numpy.core.multiarray, which may hand the GIL to another thread that
  // then waits on the static's guard holding it: two threads' first arrays deadlocked.
  // Set it up now, while the import lock keeps the module to one thread.
  try {
    (void)py::array_t<double>(py::ssize_t(0));
  } catch (const py::error_already_set&) {
    // Without NumPy the calls that return arrays say so when called.
  }
  using namespace baton::python;
  m.doc() =
      "baton's pipeline schedules from Python: the IR, its file forms (text, JSON, PyTorch "
      "CSV), generators, validator, lowering, simulator, automatic scheduler, timelines and "
      "planning. See docs/schedules.md.";

  // InputError (bad input anywhere) -> baton.InputError (a ValueError); an invalid
  // schedule -> baton.ScheduleError, a subclass carrying where and what.
  // numpy is needed throughout (results are arrays, any argument may be one): said at
  // import, not as "No module named 'numpy'" from inside a first simulate().
  try {
    py::module_::import("numpy");
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ImportError)) throw;
    throw py::import_error("baton needs numpy (pip install numpy): " +
                           std::string(py::str(e.value())));
  }
  auto input_error = py::register_exception<InputError>(m, "InputError", PyExc_ValueError);
  // Messages quote paths, which Linux lets hold any bytes: pybind11's own translation
  // decodes the message as UTF-8 and, failing, raised an InputError with no message.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      const std::string text = baton::memory::with_utf8_replacements(e.what());
      PyErr_SetString(py::module_::import("baton").attr("InputError").ptr(), text.c_str());
    }
  });
  py::object schedule_error =
      py::module_::import("builtins")
          .attr("type")("ScheduleError", py::make_tuple(py::handle(input_error.ptr())), py::dict());
  schedule_error.attr("__module__") = "baton";
  schedule_error.attr("__doc__") =
      "An invalid schedule. Attributes: rank, index (the action's position, -1: none), "
      "action (its token, or None), message, grid (the actions around it, one column per "
      "rank).";
  m.attr("ScheduleError") = schedule_error;

  // ---- actions ---------------------------------------------------------------------------
  py::class_<Action>(m, "Action", "One action of one rank: kind code, micro-batch, stage, peer.")
      .def(py::init([](const std::string& kind, Count micro_batch, Count stage, Flag overlap,
                       Count peer) {
             auto k = kind_from_code(kind);
             if (!k) throw InputError("Action: unknown kind '" + kind + "'");
             Action a;
             a.kind = *k;
             a.micro_batch = micro_batch;
             a.stage = stage;
             a.overlap = overlap;
             a.peer = peer;
             check_complete(a, "Action");
             return a;
           }),
           py::arg("kind"), py::arg("micro_batch") = -1, py::arg("stage") = -1,
           py::arg("overlap") = false, py::arg("peer") = -1,
           "peer: a transfer's other rank, as lower() sets it (-1: none; a token has none)")
      .def_static(
          "parse", [](const std::string& t) { return parse_token(t, "token"); }, py::arg("token"))
      .def_property_readonly("kind", [](const Action& a) { return std::string(kind_code(a.kind)); })
      .def_readonly("micro_batch", &Action::micro_batch)
      .def_readonly("stage", &Action::stage)
      .def_readonly("peer", &Action::peer)
      .def_readonly("overlap", &Action::overlap,
                    "an F that starts together with the next action (OVERLAP_F_B)")
      .def_property_readonly("token", [](const Action& a) { return to_token(a); })
      // is_operator: another type compares unequal (NotImplemented) instead of raising.
      .def(
          "__eq__", [](const Action& a, const Action& b) { return a == b; }, py::is_operator())
      .def(
          "__hash__",
          [](const Action& a) {
            return py::hash(py::make_tuple(int(a.kind), a.micro_batch, a.stage, a.peer, a.overlap));
          })
      .def("__repr__", [](const Action& a) { return "Action('" + to_token(a) + "')"; })
      // Pickled by its fields (a token has no peer): process pools pass actions and
      // schedules between processes, and copy.copy and deepcopy go through this too.
      .def(py::pickle(
          [](const Action& a) {
            return py::make_tuple(std::string(kind_code(a.kind)), a.micro_batch, a.stage, a.overlap,
                                  a.peer);
          },
          [](const py::tuple& t) {
            if (t.size() != 5) throw InputError("Action: a pickled state of 5 fields expected");
            const std::string code = py::str(t[0]);
            auto k = kind_from_code(code);
            if (!k) throw InputError("Action: unknown kind '" + code + "'");
            if (!is_boolean(t[3]))
              throw InputError("Action: overlap: expected a bool, found " +
                               std::string(py::str(py::repr(t[3]))));
            Action a;
            a.kind = *k;
            a.micro_batch = whole_number(t[1], "Action: micro_batch");
            a.stage = whole_number(t[2], "Action: stage");
            a.overlap = PyObject_IsTrue(t[3].ptr()) == 1;
            a.peer = whole_number(t[4], "Action: peer");
            return a;
          }));

  // ---- schedules -------------------------------------------------------------------------
  // Held by shared_ptr so that simulate() can share it with its Simulator.
  py::class_<Schedule, std::shared_ptr<Schedule>>(
      m, "Schedule",
      "A schedule: per rank an ordered list of actions, and the placement "
      "of stages on ranks.")
      .def(py::init([](const py::sequence& ranks, std::optional<std::vector<int>> placement,
                       std::optional<Count> micro_batches, Count directions,
                       const std::string& name) {
             // A str is a sequence too: "0F0 0B0" had been read as ranks of one letter each.
             if (py::isinstance<py::str>(ranks))
               throw InputError("ranks: expected a list of per-rank action lists, found " +
                                std::string(py::str(py::repr(ranks))) +
                                " (parse_text reads the text form)");
             Schedule s;
             check_name(name, "Schedule: name");
             s.name = name;
             s.num_directions = directions;
             int max_stage = -1, max_mb = -1;
             for (size_t r = 0; r < ranks.size(); ++r) {
               std::vector<Action> list;
               size_t i = 0;
               // A str is a sequence too: "0F0 0B0" had been read letter by letter.
               const py::object row = ranks[r];
               if (!py::isinstance<py::sequence>(row) || py::isinstance<py::str>(row))
                 throw InputError("rank " + std::to_string(r) +
                                  ": expected a list of actions, found " +
                                  std::string(py::str(py::repr(row))));
               for (auto h : row.cast<py::sequence>()) {
                 const std::string where =
                     "rank " + std::to_string(r) + ", action " + std::to_string(i++);
                 if (py::isinstance<py::str>(h) && !h.cast<std::string>().empty() &&
                     h.cast<std::string>().front() == '(') {
                   auto [f, b] = parse_composite(h.cast<std::string>(), where);
                   list.push_back(f);
                   list.push_back(b);
                   continue;
                 }
                 list.push_back(action_from(h, where));
                 // As the JSON reader: a given peer is kept (the validator checks it
                 // against the placement), and only transfers have one.
                 const Action& a = list.back();
                 if (a.peer != -1 && !is_transfer(a.kind))
                   throw InputError(where + ".peer: only sends and receives have a peer");
                 if (a.peer < -1)
                   throw InputError(where + ".peer: expected a rank or -1 (none), found " +
                                    std::to_string(a.peer));
               }
               for (const Action& a : list) {
                 max_stage = std::max(max_stage, a.stage);
                 max_mb = std::max(max_mb, a.micro_batch);
               }
               s.ranks.push_back(std::move(list));
             }
             s.num_ranks = int(s.ranks.size());
             const int p = std::max(1, s.num_ranks);
             s.placement =
                 placement ? *placement : loop_placement(p, std::max(1, (max_stage + p) / p));
             const int d = std::max(1, int(directions));
             s.num_micro_batches =
                 micro_batches ? int(*micro_batches) : std::max(1, (max_mb + d) / d * d);
             check_header(s, "Schedule");
             for (auto& list : s.ranks)
               for (Action& a : list)
                 if (is_transfer(a.kind) && a.peer < 0) a.peer = transfer_peer(s, a);
             return s;
           }),
           py::arg("ranks"), py::arg("placement") = py::none(),
           py::arg("micro_batches") = py::none(), py::arg("directions") = 1, py::arg("name") = "",
           "Builds a schedule from per-rank lists of tokens ('1F3', '(0F7;7BW3)'), "
           "baton.Action objects or (kind, micro_batch, stage) tuples.")
      .def_property(
          "name", [](const Schedule& s) { return s.name; },
          [](Schedule& s, const std::string& name) {
            check_name(name, "name");
            s.name = name;
          })
      .def_readonly("num_ranks", &Schedule::num_ranks)
      .def_readonly("num_micro_batches", &Schedule::num_micro_batches)
      .def_readonly("num_directions", &Schedule::num_directions)
      .def_readonly("placement", &Schedule::placement)
      .def_property_readonly("num_stages", &Schedule::num_stages)
      .def_property_readonly("num_actions", &Schedule::num_actions)
      .def_property_readonly(
          "ranks", [](const Schedule& s) { return s.ranks; }, "per rank, its actions (a copy)")
      .def(
          "actions",
          [](const Schedule& s, Count r) {
            if (r < 0 || r >= s.num_ranks)
              throw py::index_error("rank " + std::to_string(r) + " outside 0.." +
                                    std::to_string(s.num_ranks - 1));
            return s.ranks[size_t(r)];
          },
          py::arg("rank"), "rank r's actions, in order (a list of baton.Action)")
      .def(
          "tokens",
          [](const Schedule& s) {
            std::vector<std::vector<std::string>> out;
            for (const auto& list : s.ranks) {
              out.emplace_back();
              // An overlapped pair is one token, "(0F7;7BW3)", as Schedule() reads it back.
              for (size_t i = 0; i < list.size(); ++i) {
                if (!is_composite(list, i)) {
                  out.back().push_back(to_token(list[i]));
                  continue;
                }
                out.back().push_back(composite_token(list[i], list[i + 1]));
                ++i;
              }
            }
            return out;
          },
          "per rank, its actions' tokens (an overlapped pair as one)")
      .def("__iter__",
           [](const Schedule& s) {
             py::list items;
             for (size_t r = 0; r < s.ranks.size(); ++r)
               for (size_t i = 0; i < s.ranks[r].size(); ++i)
                 items.append(py::make_tuple(r, i, s.ranks[r][i]));
             return py::iter(items);
           })
      .def("__len__", &Schedule::num_actions)
      .def(
          "__eq__", [](const Schedule& a, const Schedule& b) { return a == b; }, py::is_operator())
      .def("__repr__",
           [](const Schedule& s) {
             return "<baton.Schedule '" + s.name + "' ranks=" + std::to_string(s.num_ranks) +
                    " micro_batches=" + std::to_string(s.num_micro_batches) +
                    " stages=" + std::to_string(s.num_stages()) + ">";
           })
      .def(
          "to_text",
          [](const Schedule& s) {
            return with_copy(s, [](const Schedule& c) { return to_text(c); });
          },
          "the text form: one line per rank, 'r: ' and its tokens (1F3 0BW2 STEP ...); "
          "parse_text reads it")
      .def(
          "to_json",
          [](const Schedule& s) {
            return with_copy(s, [](const Schedule& c) { return to_json_text(c); });
          },
          "the JSON form, which keeps everything (placement, directions, a lowered "
          "schedule's transfers and peers); parse_json reads it")
      .def(
          "to_csv",
          [](const Schedule& s, const std::string& dialect) {
            const TorchDialect d = parse_dialect(dialect);
            return with_copy(s, [&](const Schedule& c) { return to_torch_csv(c, d); });
          },
          py::arg("dialect") = "current", "PyTorch's CSV ('current' or 'legacy' dialect)")
      .def(
          "save",
          [](const Schedule& s, const std::filesystem::path& path) {
            need_path(path);
            with_copy(s, [&](const Schedule& c) { save_schedule(c, path.string()); });
          },
          py::arg("path"), "JSON for .json, PyTorch CSV for .csv, text otherwise")
      // Pickled as its JSON form, which keeps everything (placement, directions, a lowered
      // schedule's transfers and peers).
      .def(py::pickle(
          [](const Schedule& s) {
            return py::make_tuple(with_copy(s, [](const Schedule& c) { return to_json_text(c); }));
          },
          [](const py::tuple& t) {
            if (t.size() != 1) throw InputError("Schedule: a pickled state of 1 field expected");
            return std::make_shared<Schedule>(parse_json(t[0].cast<std::string>(), "pickle"));
          }));

  m.def(
      "parse_text", [](const std::string& t, const std::string& src) { return parse_text(t, src); },
      py::arg("text"), py::arg("source") = "text", py::call_guard<py::gil_scoped_release>(),
      "a Schedule from its text form (Schedule.to_text); `source` names it in errors "
      "(InputError with the line and token)");
  m.def(
      "parse_json", [](const std::string& t, const std::string& src) { return parse_json(t, src); },
      py::arg("text"), py::arg("source") = "json", py::call_guard<py::gil_scoped_release>(),
      "a Schedule from its JSON form (Schedule.to_json); `source` names it in errors");
  m.def(
      "parse_csv",
      [](const std::string& t, const std::string& dialect, const std::string& src) {
        TorchCsv csv;
        {
          py::gil_scoped_release release;
          csv = parse_torch_csv(t, src, parse_dialect(dialect));
        }
        py::list kept;
        for (const auto& row : csv.kept) {
          py::list cells;
          for (const KeptCell& k : row) cells.append(py::make_tuple(k.cell, k.text));
          kept.append(cells);
        }
        return py::make_tuple(csv.schedule, std::string(dialect_name(csv.dialect)), kept);
      },
      py::arg("text"), py::arg("dialect") = "detect", py::arg("source") = "csv",
      "PyTorch's CSV: returns (schedule, dialect read, kept cells: per rank the (cell, text) "
      "of the idle steps and waits, for to_csv to put back)");
  m.def(
      "to_csv",
      [](const Schedule& s, const std::string& dialect,
         std::optional<std::vector<std::vector<std::pair<int, std::string>>>> kept) {
        KeptCells k;
        if (kept)
          for (size_t r = 0; r < kept->size(); ++r) {
            k.emplace_back();
            for (const auto& [cell, text] : (*kept)[r]) k.back().push_back({cell, text});
          }
        const TorchDialect d = parse_dialect(dialect);
        return with_copy(
            s, [&](const Schedule& c) { return to_torch_csv(c, d, kept ? &k : nullptr); });
      },
      py::arg("schedule"), py::arg("dialect") = "current", py::arg("kept") = py::none());
  m.def(
      "load",
      [](const std::filesystem::path& path) {
        need_path(path);
        return load_schedule(path.string());
      },
      py::arg("path"), py::call_guard<py::gil_scoped_release>(),
      "text, JSON or PyTorch CSV (by the name)");
  m.def("schedule_names", &all_schedule_names,
        "the names generate() takes (every generator of schedule/)");
  m.def(
      "generate",
      [](const std::string& name, Count p, Count mb, Count v) {
        py::gil_scoped_release release;
        return generate(name, p, mb, v);
      },
      py::arg("name"), py::arg("ranks"), py::arg("micro_batches"), py::arg("chunks") = 0,
      "one of schedule_names() for p ranks and m micro-batches (chunks: stages per rank)");
  m.def(
      "v_block",
      [](const std::string& kind, Count p) {
        const BuildingBlock b = v_block(kind, p);
        py::dict d;
        d["period"] = b.period;
        d["chunk_stage"] = b.chunk_stage;
        d["forward"] = b.forward;
        d["backward"] = b.backward;
        d["memory_limit"] = b.memory_limit;
        return d;
      },
      py::arg("kind"), py::arg("ranks"),
      "the named building block (v-min, v-half, v-zb) as a dict block_schedule takes");
  m.def(
      "block_schedule",
      [](const std::string& name, Count p, Count mb, Count period,
         std::vector<std::vector<int>> chunk_stage, std::vector<std::vector<int>> forward,
         std::vector<std::vector<int>> backward, std::vector<std::vector<int>> weight,
         double memory_limit) {
        BuildingBlock b;
        b.period = period;
        b.chunk_stage = std::move(chunk_stage);
        b.forward = std::move(forward);
        b.backward = std::move(backward);
        b.weight = std::move(weight);
        b.memory_limit = memory_limit;
        py::gil_scoped_release release;
        return block_schedule(name, p, mb, b);
      },
      py::arg("name"), py::arg("ranks"), py::arg("micro_batches"), py::arg("period"),
      py::arg("chunk_stage"), py::arg("forward"), py::arg("backward"),
      py::arg("weight") = std::vector<std::vector<int>>{}, py::arg("memory_limit") = 0.0,
      "a schedule from a repeated building block: per rank and chunk the stage and the slots "
      "of F, B (and W) within the period; memory_limit > 0 lays it out by the reorder pass");

  // ---- validation and lowering -----------------------------------------------------------
  m.def(
      "validate",
      [](const Schedule& s) {
        raise_unless_valid(s, with_copy(s, [](const Schedule& c) { return validate(c); }));
      },
      py::arg("schedule"), "raises baton.ScheduleError unless the schedule is valid");
  m.def(
      "is_valid",
      [](const Schedule& s) {
        return with_copy(s, [](const Schedule& c) { return validate(c).ok; });
      },
      py::arg("schedule"), "whether validate() would pass, without raising");
  m.def(
      "lower",
      [](const Schedule& s, Flag merge, Flag transfers, Flag reduce, Flag step) {
        LowerOptions o;
        o.merge_backward = merge;
        o.transfers = transfers;
        o.reduce = reduce;
        o.step = step;
        // Checked as written first, as `baton simulate --lower` checks a file: lowering
        // would hide some faults (a STEP on some ranks only was taken out and put back on
        // every rank).
        ValidationReport r;
        Schedule lowered = with_copy(s, [&](const Schedule& c) {
          r = validate(c);
          return r.ok ? lower(c, o) : Schedule{};
        });
        raise_unless_valid(s, r);
        return lowered;
      },
      py::arg("schedule"), py::arg("merge_backward") = false, py::arg("transfers") = true,
      py::arg("reduce") = true, py::arg("step") = true,
      "the schedule lowered (transfers, REDUCE, STEP); raises baton.ScheduleError unless it "
      "is valid as given");
  m.def(
      "split_backward",
      [](const Schedule& s) {
        return with_copy(s, [](const Schedule& c) { return split_backward(c); });
      },
      py::arg("schedule"), "each BW (a whole backward) split into B then W in its place");
  m.def(
      "merge_backward",
      [](const Schedule& s) {
        return with_copy(s, [](const Schedule& c) { return merge_backward(c); });
      },
      py::arg("schedule"), "each B followed by its own W merged into one BW");
  m.def(
      "compute_only",
      [](const Schedule& s) {
        return with_copy(s, [](const Schedule& c) { return compute_only(c); });
      },
      py::arg("schedule"));

  // ---- costs and simulation --------------------------------------------------------------
  py::class_<CostSpec>(m, "CostSpec", "A parsed cost file (see docs/schedules.md, Costs).")
      .def(py::init([](const py::dict& d) { return cost_spec(d); }), py::arg("fields"))
      .def_static(
          "load",
          [](const std::filesystem::path& path) {
            need_path(path);
            return load_costs(path.string());
          },
          py::arg("path"))
      .def_static(
          "parse", [](const std::string& t) { return parse_costs(t, "costs"); }, py::arg("json"))
      .def_static("unit", &CostSpec::unit)
      .def_readonly("seconds_per_unit", &CostSpec::seconds_per_unit);

  py::class_<PySimResult, std::shared_ptr<PySimResult>>(
      m, "SimResult",
      "A simulation: makespan, bubble, span_bubble, peaks; per rank (numpy arrays) busy, "
      "idle, bubbles, peak memory; per action start and end (rank by rank: "
      "start[offsets[r]:offsets[r+1]] are rank r's).")
      .def_property_readonly("makespan", [](const PySimResult& r) { return r.sim.makespan; })
      .def_property_readonly("bubble", [](const PySimResult& r) { return r.sim.bubble; })
      .def_property_readonly("span_bubble", [](const PySimResult& r) { return r.sim.span_bubble; })
      .def_property_readonly("peak_micro_batches",
                             [](const PySimResult& r) { return r.sim.peak_micro_batches; })
      .def_property_readonly("peak_bytes", [](const PySimResult& r) { return r.sim.peak_bytes; })
      .def_property_readonly("busy",
                             [](const PySimResult& r) { return per_rank(r.sim, &RankStats::busy); })
      .def_property_readonly("idle",
                             [](const PySimResult& r) {
                               std::vector<double> v;
                               for (const RankStats& s : r.sim.ranks)
                                 v.push_back(r.sim.makespan - s.busy);
                               return owned_array(std::move(v));
                             })
      .def_property_readonly(
          "rank_start", [](const PySimResult& r) { return per_rank(r.sim, &RankStats::start); })
      .def_property_readonly("rank_end",
                             [](const PySimResult& r) { return per_rank(r.sim, &RankStats::end); })
      .def_property_readonly(
          "rank_bubble", [](const PySimResult& r) { return per_rank(r.sim, &RankStats::bubble); })
      .def_property_readonly(
          "rank_span_bubble",
          [](const PySimResult& r) { return per_rank(r.sim, &RankStats::span_bubble); })
      .def_property_readonly(
          "peak_memory",
          [](const PySimResult& r) { return per_rank(r.sim, &RankStats::peak_micro_batches); },
          "per rank, peak live micro-batches")
      .def_property_readonly(
          "peak_memory_bytes",
          [](const PySimResult& r) { return per_rank(r.sim, &RankStats::peak_bytes); })
      .def_property_readonly("start",
                             [](PySimResult& r) {
                               r.build_arrays();
                               return r.start;
                             })
      .def_property_readonly("end",
                             [](PySimResult& r) {
                               r.build_arrays();
                               return r.end;
                             })
      .def_readonly("offsets", &PySimResult::offsets)
      .def_readonly("timeline", &PySimResult::timeline,
                    "the timeline (simulate(..., timeline=True); else None)")
      .def("__repr__", [](const PySimResult& r) {
        return "<baton.SimResult makespan=" + std::to_string(r.sim.makespan) +
               " bubble=" + std::to_string(r.sim.bubble) +
               " span_bubble=" + std::to_string(r.sim.span_bubble) + ">";
      });

  m.def(
      "simulate",
      [](const std::shared_ptr<Schedule>& s, const py::object& costs, Flag timeline) {
        need_schedule(s);
        const CostSpec spec = cost_spec(costs);
        return as_schedule_error(*s, [&] { return run_simulation(s, spec, timeline); });
      },
      py::arg("schedule"), py::arg("costs") = py::none(), py::arg("timeline") = false,
      "costs: a dict of cost-file fields (numbers, or per-stage lists / numpy arrays), a "
      "baton.CostSpec, or None for F = B = W = 1 per rank's share");

  // The search-loop form: a simulator built once, run on many costs.
  py::class_<SharedSimulator, std::shared_ptr<SharedSimulator>>(
      m, "Simulator",
      "Validates and indexes a schedule once; run() it on many costs (threads sharing one "
      "take turns: a run writes the simulator's state).")
      .def(py::init([](const std::shared_ptr<Schedule>& s) {
             need_schedule(s);
             return as_schedule_error(*s, [&] {
               py::gil_scoped_release release;
               return std::make_shared<SharedSimulator>(std::shared_ptr<const Schedule>(s));
             });
           }),
           py::arg("schedule"))
      .def(
          "run",
          [](SharedSimulator& self, const py::object& costs) {
            CostSpec spec = cost_spec(costs);
            py::gil_scoped_release release;  // before the lock: its holder may want the GIL
            const std::lock_guard<std::mutex> lock(self.mutex);
            Simulator& sim = self.sim;
            const SimResult& r = sim.run(resolve(spec, sim.schedule()));
            return std::make_tuple(r.makespan, r.bubble, r.span_bubble, r.peak_micro_batches);
          },
          py::arg("costs") = py::none(),
          "returns (makespan, bubble, span_bubble, peak_micro_batches)")
      .def(
          "run_stages",
          [](SharedSimulator& self, const py::object& f, const py::object& b, const py::object& w) {
            const int S = self.sim.schedule().num_stages();
            Costs c;
            auto fill = [&](const py::object& o, std::vector<double>& v, const char* what) {
              v = as_vector(o, what, kMaxCostSeconds, "1e9 (a cost file's bound: 1e9 s)");
              if (v.size() == 1) v.assign(size_t(S), v[0]);
            };
            // "costs: " as the cost checks' own messages (a negative one) begin.
            fill(f, c.forward, "costs: forward");
            fill(b, c.backward_input, "costs: backward_input");
            fill(w, c.backward_weight, "costs: backward_weight");
            py::gil_scoped_release release;
            const std::lock_guard<std::mutex> lock(self.mutex);
            const SimResult& r = self.sim.run(c);
            return std::make_tuple(r.makespan, r.bubble, r.span_bubble, r.peak_micro_batches);
          },
          py::arg("forward"), py::arg("backward_input"), py::arg("backward_weight"),
          "per-stage F, B, W (numbers, lists or numpy arrays; no cost-file scaling)");

  m.def(
      "auto_schedule",
      [](Count p, Count mb, const py::object& costs, const py::object& memory_limit, Flag in_bytes,
         const std::string& objective) {
        AutoOptions o;
        o.num_ranks = p;
        o.num_micro_batches = mb;
        if (!memory_limit.is_none()) o.memory_limit = as_vector(memory_limit, "memory_limit");
        o.limit_in_bytes = in_bytes;
        o.objective = parse_objective(objective, "objective");
        CostSpec spec = cost_spec(costs);
        // As simulate's --memory-limit in bytes: without the bytes the limit had been ignored
        // and any schedule said to fit.
        if (in_bytes && !memory_limit.is_none() && !spec.activation_bytes.given)
          throw InputError(
              "limit_in_bytes=True needs activation_bytes in costs (or give memory_limit in "
              "micro-batches)");
        // Ctrl-C (or another signal's handler raising) stops the search between candidates:
        // its Python error stays set while the search unwinds, and is raised after.
        struct Interrupted {};
        o.poll = [last = std::chrono::steady_clock::now()]() mutable {
          const auto now = std::chrono::steady_clock::now();
          if (now - last < std::chrono::milliseconds(50)) return;
          last = now;
          const py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) throw Interrupted{};
        };
        AutoResult r;
        try {
          py::gil_scoped_release release;
          r = auto_schedule(spec, o);
        } catch (const Interrupted&) {
          throw py::error_already_set();
        }
        py::dict info;
        info["chosen"] = r.chosen;
        info["makespan"] = r.sim.makespan;
        info["span"] = objective_value(r.sim, AutoOptions::Objective::span);
        info["bubble"] = r.sim.bubble;
        info["span_bubble"] = r.sim.span_bubble;
        info["peak_micro_batches"] = r.sim.peak_micro_batches;
        info["peak_bytes"] = r.sim.peak_bytes;
        info["greedy_runs"] = r.greedy_runs;
        info["best_greedy"] = auto_candidate(r.best_greedy);
        py::list fixed;
        for (const AutoCandidate& c : r.fixed) fixed.append(auto_candidate(c));
        info["fixed"] = fixed;
        return py::make_tuple(r.schedule, info);
      },
      py::arg("ranks"), py::arg("micro_batches"), py::arg("costs") = py::none(),
      py::arg("memory_limit") = py::none(), py::arg("limit_in_bytes") = false,
      py::arg("objective") = "makespan",
      "the fastest schedule found within the memory limit (micro-batches, or bytes), by "
      "makespan or by the longest rank span (objective='span'): returns (schedule, info)");

  // ---- timelines -------------------------------------------------------------------------
  py::class_<Timeline, std::shared_ptr<Timeline>>(m, "Timeline",
                                                  "What ran where and when, one row per rank.")
      .def_readonly("name", &Timeline::name)
      .def_readonly("num_ranks", &Timeline::num_ranks)
      .def_readonly("seconds_per_unit", &Timeline::seconds_per_unit)
      .def_property_readonly("end_time", &Timeline::end_time)
      .def(
          "svg",
          [](const Timeline& t, Count width) {
            if (width < 100 || width > 1000000)
              throw InputError("width: expected 100 to 1000000 pixels, found " +
                               std::to_string(width));
            SvgOptions o;
            o.width = width;
            return to_svg(t, o);
          },
          py::arg("width") = 1400, py::call_guard<py::gil_scoped_release>())
      .def("chrome_trace", &to_chrome_trace, py::call_guard<py::gil_scoped_release>())
      .def(
          "events",
          [](const Timeline& t) {
            py::list out;
            for (const TimelineEvent& e : t.events) {
              py::dict d;
              d["rank"] = e.rank;
              d["lane"] = e.lane;
              d["kind"] = std::string(kind_code(e.kind));
              d["micro_batch"] = e.micro_batch;
              d["stage"] = e.stage;
              d["peer"] = e.peer;
              d["start"] = e.start;
              d["end"] = e.end;
              out.append(d);
            }
            return out;
          },
          "the events as dicts: rank, lane, kind (F, B, W, SEND_F, ...), micro_batch, stage, "
          "peer (-1: none), start and end (seconds)");
  m.def(
      "read_chrome_trace",
      [](const std::string& text) {
        return std::make_shared<Timeline>(from_chrome_trace(text, "trace"));
      },
      py::arg("text"), py::call_guard<py::gil_scoped_release>(),
      "a timeline from Chrome trace JSON (the executor's or the simulator's)");
  m.def(
      "compare_traces",
      [](const Timeline& measured, const Timeline& predicted) {
        TraceComparison c;
        {
          py::gil_scoped_release release;
          c = compare_timelines(measured, predicted);
        }
        return comparison_dict(c);
      },
      py::arg("measured"), py::arg("predicted"),
      "per action and per kind, the measured timeline's times (first: baton train --trace) "
      "against the predicted one's (baton trace predict, predict(), simulate()); a dict with "
      "the makespans, 'kinds', 'actions', 'schedule_note' (set when the timelines name "
      "different schedules) and 'report'. A measured trace of several steps is compared by its "
      "first; given the wrong way round (by their names), InputError");

  // ---- planning (partitioner/) -----------------------------------------------------------
  register_planning(m);
}
