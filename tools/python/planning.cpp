#include "tools/python/planning.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "memory/error.h"
#include "memory/json_object.h"
#include "memory/units.h"
#include "memory/utf8.h"
#include "partitioner/cost_model.h"
#include "partitioner/evaluate.h"
#include "partitioner/plan.h"
#include "partitioner/predict.h"
#include "partitioner/resolved_plan.h"
#include "partitioner/search.h"
#include "stages/model.h"

namespace py = pybind11;
namespace pt = baton::partitioner;

namespace baton::python {

namespace {

using GraphPtr = std::shared_ptr<const stages::Graph>;

// JSON -> Python through the json module (plans are small).
py::object to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

// pybind11 passes None as an empty holder: refused here, not dereferenced (a segfault).
void need_model(const std::shared_ptr<stages::Graph>& g) {
  if (!g) throw InputError("model: expected a model (baton.load_model), found None");
}

}  // namespace

bool is_boolean(const py::handle& h) {
  if (PyBool_Check(h.ptr())) return true;
  // NumPy's bool scalar (np.bool_, "bool" under NumPy 2) and arrays or tensors of bools.
  if (!py::hasattr(h, "dtype")) return false;
  const std::string dtype = py::str(h.attr("dtype"));
  return dtype == "bool" || dtype == "torch.bool";
}

bool is_number(const py::handle& h) {
  if (is_boolean(h) || py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h) ||
      py::isinstance<py::array>(h))  // an array has __float__ too
    return false;
  return py::isinstance<py::int_>(h) || py::isinstance<py::float_>(h) ||
         py::hasattr(h, "__index__") || py::hasattr(h, "__float__");
}

double number(const py::handle& h, const std::string& what) {
  const auto found = [&] { return std::string(py::str(py::repr(h))); };
  if (!is_number(h)) throw InputError(what + ": expected a number, found " + found());
  // __float__ may refuse (a tensor of several values) or overflow (10**400): the argument
  // is named, not Python's bare ValueError or OverflowError.
  try {
    return py::float_(py::reinterpret_borrow<py::object>(h)).cast<double>();
  } catch (py::error_already_set& e) {
    const std::string why = py::str(e.value());
    throw InputError(what + ": expected a number, found " + found() + " (" + why + ")");
  }
}

double finite_number(const py::handle& h, const std::string& what) {
  const double x = number(h, what);
  if (!std::isfinite(x))
    throw InputError(what + ": expected a finite number, found " +
                     std::string(py::str(py::repr(h))));
  return x;
}

int whole_number(const py::handle& h, const std::string& what) {
  const std::string found = py::str(py::repr(h));
  if (!is_number(h) || !py::hasattr(h, "__index__"))
    throw InputError(what + ": expected a whole number, found " + found);
  const py::int_ i(py::reinterpret_borrow<py::object>(h).attr("__index__")());
  int overflow = 0;  // past long long (10**400) too: no conversion error escapes
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    throw InputError(what + ": expected a whole number within an int's range, found " + found);
  return int(v);
}

namespace {
// `where` names the value as the file readers do: "costs: $.forward[0]". Nesting is
// bounded as the file readers bound it: a list holding itself had recursed until the
// stack overflowed.
nlohmann::json to_json_at(const py::handle& h, const std::string& root, const std::string& at,
                          int depth = 0) {
  const std::string where = root + ": " + at;
  constexpr size_t kMaxDepth = memory::kMaxJsonDepth;
  if (size_t(depth) > kMaxDepth)
    throw InputError(root + ": " + at.substr(0, 120) + "...: nested deeper than " +
                     std::to_string(kMaxDepth) + " levels (a list or dict that holds itself?)");
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::int_>(h)) {
    const py::int_ i = h.cast<py::int_>();
    // Past a double (10**400) the cast itself fails: named here, not pybind11's cast error.
    const double d = PyLong_AsDouble(i.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      const std::string digits = py::repr(i);
      throw InputError(where + ": expected a number, found an integer of " +
                       std::to_string(digits.size() - (digits[0] == '-')) +
                       " digits, beyond a double");
    }
    if (d < -9.2e18 || d > 9.2e18) return d;  // beyond long long: the check says too large
    return i.cast<long long>();
  }
  if (py::isinstance<py::float_>(h)) return finite_number(h, where);
  // numpy's arrays and scalars as the Python values they hold: through doubles, an int64
  // beyond 2^53 had been rounded and a group id had read 0.0.
  if (py::hasattr(h, "dtype") && py::hasattr(h, "tolist"))
    return to_json_at(h.attr("tolist")(), root, at, depth);
  if (py::isinstance<py::dict>(h)) {
    nlohmann::json j = nlohmann::json::object();
    for (auto [k, v] : h.cast<py::dict>()) {
      const std::string key = py::str(k);
      j[key] = to_json_at(v, root, at + "." + key, depth + 1);
    }
    return j;
  }
  if (py::isinstance<py::sequence>(h) && !py::isinstance<py::bytes>(h)) {
    nlohmann::json j = nlohmann::json::array();
    size_t i = 0;
    for (auto v : h.cast<py::sequence>())
      j.push_back(to_json_at(v, root, at + "[" + std::to_string(i++) + "]", depth + 1));
    return j;
  }
  if (py::hasattr(h, "__index__"))
    return to_json_at(py::int_(py::reinterpret_borrow<py::object>(h)), root, at, depth);
  if (py::hasattr(h, "__float__")) return finite_number(h, where);
  throw InputError(where + ": cannot use a " + std::string(py::str(h.get_type().attr("__name__"))) +
                   " here");
}
}  // namespace

nlohmann::json to_json(const py::handle& h, const std::string& path) {
  return to_json_at(h, path, "$");
}

void need_path(const std::filesystem::path& path) {
  if (path.empty()) throw InputError("path: expected a file's path, found an empty string");
}

std::optional<std::string> path_string(const py::handle& h) {
  if (!py::isinstance<py::str>(h) && !py::hasattr(h, "__fspath__")) return std::nullopt;
  const py::object os = py::module_::import("os");
  const py::object p = os.attr("fspath")(h);
  if (!py::isinstance<py::str>(p)) return std::nullopt;  // a bytes path
  // The file system's bytes, as os.fsencode gives them: a name that is not UTF-8 arrives
  // with surrogates, which a cast to UTF-8 refuses ("Unable to cast").
  return std::string(py::bytes(os.attr("fsencode")(p)));
}

namespace {

pt::Machine machine_from(const py::dict& d) {
  pt::Machine m;
  for (auto [k, v] : d) {
    const std::string key = py::str(k);
    double x = number(v, "machine." + key);  // check_machine names what each field takes
    if (key == "flops")
      m.flops = x;
    else if (key == "memory_bandwidth")
      m.memory_bandwidth = x;
    else if (key == "tp_bandwidth")
      m.tp_bandwidth = x;
    else if (key == "tp_latency")
      m.tp_latency = x;
    else if (key == "p2p_bandwidth")
      m.p2p_bandwidth = x;
    else if (key == "p2p_latency")
      m.p2p_latency = x;
    else if (key == "dp_bandwidth")
      m.dp_bandwidth = x;
    else if (key == "dp_latency")
      m.dp_latency = x;
    else if (key == "ranks_per_host" || key == "cores_per_host") {
      if (!(x >= 0 && x <= 1 << 20 && x == double(int(x))))
        throw InputError("machine." + key + ": expected a whole number from 0 to 1048576, found " +
                         std::string(py::str(v)));
      (key == "ranks_per_host" ? m.ranks_per_host : m.cores_per_host) = int(x);
    } else
      throw InputError("machine." + key +
                       ": unknown field (expected flops, memory_bandwidth, tp_bandwidth, "
                       "tp_latency, p2p_bandwidth, p2p_latency, dp_bandwidth, dp_latency, "
                       "ranks_per_host, cores_per_host)");
  }
  pt::check_machine(m, [](const char* field) { return std::string("machine.") + field; });
  return m;
}

// The search and the cost model name `baton plan`'s flags in their messages; a Python
// caller gave keywords ("--micro-batches: expected ..." reads "micro_batches: ...").
std::string keywords(const std::string& what, const std::map<std::string, std::string>& names) {
  std::string out;
  size_t i = 0;
  while (i < what.size()) {
    if (what.compare(i, 2, "--") == 0) {
      size_t j = i + 2;
      while (j < what.size() &&
             (std::islower(static_cast<unsigned char>(what[j])) != 0 || what[j] == '-'))
        ++j;
      if (auto it = names.find(what.substr(i + 2, j - i - 2)); it != names.end()) {
        out += it->second;
        i = j;
        continue;
      }
    }
    out += what[i++];
  }
  return out;
}

// A plan dict (as plan() returns) or a plan file's path.
pt::Plan plan_of(const py::object& plan, const std::string& base_dir) {
  if (auto path = path_string(plan)) return pt::read_plan(*path);
  if (!py::isinstance<py::dict>(plan))
    throw InputError(
        "plan: expected a plan dict (as plan() returns) or a plan file's path (str or "
        "os.PathLike), found " +
        std::string(py::str(py::repr(plan))));
  return pt::parse_plan(to_json(plan, "plan"), "plan", base_dir);
}

// A cost file of `baton profile` (the path, as --costs), or none: FLOPs at machine.flops.
struct Costs {
  std::optional<pt::MeasuredCosts> measured;
  std::string path;
  explicit Costs(const py::object& costs) {
    if (costs.is_none()) return;
    auto given = path_string(costs);
    if (!given)
      throw InputError("costs: expected the path of a baton profile cost file, found " +
                       std::string(py::str(py::repr(costs))));
    path = *given;
    measured = pt::read_measured_costs(path);
  }
  const pt::MeasuredCosts* get() const { return measured ? &*measured : nullptr; }
};

int64_t bytes_of(const py::object& o, const char* what) {
  if (o.is_none()) return 0;
  if (py::isinstance<py::str>(o)) {
    try {
      return int64_t(memory::parse_bytes(o.cast<std::string>()));
    } catch (const InputError& e) {
      throw InputError(std::string(what) + ": " + e.what());
    }
  }
  const double v = finite_number(o, what);
  // 2^63 itself does not convert: a size below it.
  if (v < 0 || v >= 9.2e18)
    throw InputError(std::string(what) + ": expected a size from 0 to 9.2e18 bytes, found " +
                     std::string(py::str(py::repr(o))));
  // A number is bytes: 0.5 (meaning half a GiB?) had been truncated to 0, no cap at all.
  if (v != std::floor(v))
    throw InputError(std::string(what) +
                     ": expected a whole number of bytes or a size such as "
                     "'512MiB', found " +
                     std::string(py::str(py::repr(o))));
  return int64_t(v);
}

py::dict estimate_dict(const pt::ResolvedPlan& r, const pt::PlanEstimate& e) {
  py::dict d;
  d["step_time"] = e.step_time;
  d["bubble"] = e.bubble;
  d["tokens_per_second"] = e.tokens_per_second;
  d["tokens_per_step"] = e.tokens_per_step;
  d["fits"] = e.fits();
  d["problems"] = e.problems;
  d["max_peak"] = e.max_peak();
  py::list ranks;
  for (const pt::RankEstimate& re : e.ranks) {
    py::dict x;
    x["rank"] = re.rank;
    x["dp"] = re.coord.dp;
    x["pp"] = re.coord.pp;
    x["tp"] = re.coord.tp;
    x["stages"] = re.stages;
    x["layers"] = re.layers;
    x["parameters"] = re.parameters;
    x["param_bytes"] = re.param_bytes;
    x["grad_bytes"] = re.grad_bytes;
    x["optimizer_bytes"] = re.optimizer_bytes;
    x["activation_peak"] = re.activation_peak;
    x["peak"] = re.peak;
    x["compute_time"] = re.compute_time;
    x["busy_fraction"] = re.busy_fraction;
    ranks.append(x);
  }
  d["ranks"] = ranks;
  d["table"] = pt::format_estimate(r, e);
  return d;
}

}  // namespace

void register_planning(py::module_& m) {
  py::class_<stages::Graph, std::shared_ptr<stages::Graph>>(m, "Model",
                                                            "A model graph (baton's model JSON).")
      .def_readonly("name", &stages::Graph::name)
      .def_property_readonly("num_layers", &stages::Graph::num_layers)
      .def_property_readonly("layers",
                             [](const stages::Graph& g) {
                               std::vector<std::string> out;
                               for (const auto& l : g.layers) out.push_back(l.name);
                               return out;
                             })
      .def("__repr__", [](const stages::Graph& g) {
        return "<baton.Model '" + g.name + "' layers=" + std::to_string(g.num_layers()) + ">";
      });

  m.def(
      "load_model",
      [](const std::filesystem::path& path) {
        need_path(path);
        py::gil_scoped_release release;
        auto g = std::make_shared<stages::Graph>(stages::load_model(path.string()));
        // The plans plan() writes name this file: absolute, they read from any folder
        // (a plan file's relative model path is relative to the plan file).
        g->source = std::filesystem::absolute(path).lexically_normal().string();
        // JSON holds only UTF-8: plan() had failed with nlohmann's bare type_error.
        if (memory::first_non_utf8(g->source) != std::string::npos)
          throw InputError("path " + memory::with_utf8_replacements(g->source) +
                           ": the path is not valid UTF-8; the plans plan() writes record "
                           "it in JSON, which holds only UTF-8: rename it");
        return g;
      },
      py::arg("path"),
      "a model JSON (docs/formats/model.md: a shorthand, a Hugging Face config.json or a "
      "general graph) for plan(), check() and layer_costs(); InputError names the file and "
      "the JSON path");

  m.def(
      "layer_costs",
      [](const std::shared_ptr<stages::Graph>& g, Count tp, Count64 batch, const py::dict& machine,
         const py::object& costs) {
        need_model(g);
        if (tp < 1)
          throw InputError("tp: expected a tensor-parallel degree of at least 1, found " +
                           std::to_string(tp));
        // The plan format's bound on a micro-batch: far beyond it a tensor's element count
        // had overflowed in the cost model, an internal check for an error.
        if (batch < 1 || batch > pt::kMaxPlanCount)
          throw InputError("batch: expected 1 to " + std::to_string(pt::kMaxPlanCount) +
                           " samples per micro-batch, found " + std::to_string(batch));
        const Costs c(costs);
        pt::CostModel model(g, machine_from(machine), c.get());
        const pt::CostTable& t = [&]() -> const pt::CostTable& {
          try {
            return model.table(tp, batch);
          } catch (const InputError& e) {
            throw InputError(keywords(e.what(), {{"tp", "tp"}, {"batch", "batch"}}));
          }
        }();
        py::list out;
        for (size_t i = 0; i < t.layers.size(); ++i) {
          const pt::LayerCost& l = t.layers[i];
          py::dict d;
          d["layer"] = g->layers[i].name;
          d["forward"] = l.f;
          d["backward_input"] = l.b;
          d["backward_weight"] = l.w;
          d["forward_flops"] = l.f_flops;
          d["backward_input_flops"] = l.b_flops;
          d["backward_weight_flops"] = l.w_flops;
          d["param_bytes"] = t.own_param_bytes[i];
          d["stash_bytes"] = l.mem.stash;
          d["w_stash_bytes"] = l.mem.w_stash;
          d["stash_bytes_recompute"] = l.mem_recompute.stash;
          d["cut_bytes"] = t.cut_bytes[i + 1];
          out.append(d);
        }
        return out;
      },
      py::arg("model"), py::arg("tp") = 1, py::arg("batch") = 1, py::arg("machine") = py::dict(),
      py::arg("costs") = py::none(),
      "the cost model's numbers per layer at a tensor-parallel degree and micro-batch size "
      "(seconds, FLOPs, bytes); costs: a cost file of baton profile, as --costs");

  m.def(
      "plan",
      [](const std::shared_ptr<stages::Graph>& g, Count devices, const py::object& device_memory,
         Count64 batch, Count tp, Count pp, Count dp, std::vector<std::string> schedules,
         Count micro_batches, std::optional<Flag> recompute, const std::string& optimizer,
         Count top, const std::filesystem::path& model_path, const py::dict& machine,
         const py::object& costs, Count chunks) {
        need_model(g);
        const Costs measured(costs);
        pt::SearchOptions so;
        so.devices = devices;
        so.device_memory = bytes_of(device_memory, "device_memory");
        so.global_batch = batch;
        so.tp = tp;
        so.pp = pp;
        so.dp = dp;
        so.schedules = std::move(schedules);
        so.micro_batches = micro_batches;
        so.chunks = chunks;
        so.recompute = recompute ? int(*recompute) : -1;
        so.optimizer = optimizer;
        so.keep = top;
        so.model_path = model_path.empty() ? g->source : model_path.string();
        if (so.model_path.empty()) so.model_json = g->config;
        pt::optimizer_states(so.optimizer);
        const pt::Machine mach = machine_from(machine);
        pt::SearchResult res;
        std::string source;
        {
          py::gil_scoped_release release;
          pt::CostModel model(g, mach, measured.get());
          try {
            res = pt::search_plans(g, model, so);
          } catch (const InputError& e) {
            throw InputError(keywords(e.what(), {{"devices", "devices"},
                                                 {"device-memory", "device_memory"},
                                                 {"batch", "batch"},
                                                 {"tp", "tp"},
                                                 {"pp", "pp"},
                                                 {"dp", "dp"},
                                                 {"schedule", "schedules"},
                                                 {"micro-batches", "micro_batches"},
                                                 {"recompute", "recompute"},
                                                 {"optimizer", "optimizer"},
                                                 {"top", "top"},
                                                 {"chunks", "chunks"},
                                                 {"costs", "costs"}}));
          }
          source = pt::cost_source(model, measured.path);
          // The winner checked exactly, as `baton plan` checks it: its peak and the
          // per-rank estimate its --out file records (predicted.memory_bytes).
          if (!res.ranked.empty()) {
            pt::Candidate& best = res.ranked.front();
            const pt::ResolvedPlan r = pt::resolve_plan(best.plan, g);
            const pt::PlanEstimate e = pt::evaluate_plan(r, model);
            best.peak = 0;
            std::vector<int64_t> peaks;
            for (const pt::RankEstimate& re : e.ranks) {
              peaks.push_back(re.peak);
              if (re.peak <= best.peak) continue;
              best.peak = re.peak;
              best.peak_rank = re.rank < r.layout.world() ? re.coord.pp : -1;
            }
            best.plan.predicted["memory_bytes"] = peaks;
          }
        }
        // As `baton plan` exits 2: nothing fits, with the closest plan or why none.
        if (res.ranked.empty()) throw InputError(pt::no_plan_message(res, so.device_memory, ""));
        py::dict out;
        out["time_source"] = source;
        py::list ranked;
        for (const pt::Candidate& c : res.ranked) {
          py::dict d;
          d["plan"] = to_python(pt::plan_to_json(c.plan));
          d["describe"] = c.describe();
          d["step_time"] = c.step_time;
          d["bubble"] = c.bubble;
          d["tokens_per_second"] = c.tokens_per_second;
          d["peak"] = c.peak;  // the runners-up's: the search's bound, as `baton plan` prints
          d["peak_rank"] = c.peak_rank;
          ranked.append(d);
        }
        out["plans"] = ranked;
        out["best"] = ranked[0]["plan"];
        out["evaluated"] = res.evaluated;
        out["rejected"] = res.rejected;
        out["exact_checks"] = res.exact_checks;
        out["seconds"] = res.seconds;
        out["skipped"] = res.skipped;
        return out;
      },
      py::arg("model"), py::arg("devices"), py::arg("device_memory") = py::none(),
      py::arg("batch") = 16, py::arg("tp") = 0, py::arg("pp") = 0, py::arg("dp") = 0,
      py::arg("schedules") = std::vector<std::string>{}, py::arg("micro_batches") = 0,
      py::arg("recompute") = py::none(), py::arg("optimizer") = "adamw", py::arg("top") = 5,
      py::arg("model_path") = "", py::arg("machine") = py::dict(), py::arg("costs") = py::none(),
      py::arg("chunks") = 0,
      "searches partition plans: returns {'best': plan dict, 'plans': [...], ...}; costs: a "
      "cost file of baton profile, as --costs");

  m.def(
      "check",
      [](const py::object& plan, const std::filesystem::path& base_dir, const py::dict& machine,
         const py::object& costs) {
        const Costs measured(costs);
        pt::Plan p = plan_of(plan, base_dir.string());
        const pt::Machine mach = machine_from(machine);
        std::unique_ptr<pt::ResolvedPlan> r;
        pt::PlanEstimate e;
        std::string source;
        {
          py::gil_scoped_release release;
          auto graph = pt::load_plan_model(p);
          r = std::make_unique<pt::ResolvedPlan>(pt::resolve_plan(p, graph));
          pt::CostModel model(graph, mach, measured.get());
          e = pt::evaluate_plan(*r, model);
          source = pt::cost_source(model, measured.path);
        }
        py::dict d = estimate_dict(*r, e);
        d["time_source"] = source;
        return d;
      },
      py::arg("plan"), py::arg("base_dir") = ".", py::arg("machine") = py::dict(),
      py::arg("costs") = py::none(),
      "checks a plan (a dict as plan() returns, or a plan file's path): its estimate, with "
      "one dict per rank and the text table `baton plan --check` prints; costs: a cost file "
      "of baton profile, as --costs");

  m.def(
      "predict",
      [](const py::object& plan, const std::filesystem::path& base_dir, const py::dict& machine,
         const py::object& costs, const py::object& schedule) {
        const Costs measured(costs);
        pt::Plan p = plan_of(plan, base_dir.string());
        const pt::Machine mach = machine_from(machine);
        std::optional<schedule::Schedule> own;
        if (!schedule.is_none()) {
          if (!py::isinstance<schedule::Schedule>(schedule))
            throw InputError("schedule: expected a baton.Schedule, found " +
                             std::string(py::str(py::repr(schedule))));
          own = schedule.cast<schedule::Schedule>();
        }
        pt::Prediction pr;
        std::string source;
        {
          py::gil_scoped_release release;
          auto graph = pt::load_plan_model(p);
          pt::ResolvedPlan r = pt::resolve_plan(p, graph, own ? &*own : nullptr, "schedule");
          pt::CostModel model(graph, mach, measured.get());
          pr = pt::predict_step(r, model, measured.path);
          source = pt::cost_source(model, measured.path);
        }
        py::dict d;
        d["step_time"] = pr.step_time;
        d["bubble"] = pr.bubble;
        d["timeline"] = std::make_shared<schedule::Timeline>(std::move(pr.timeline));
        d["time_source"] = source;
        return d;
      },
      py::arg("plan"), py::arg("base_dir") = ".", py::arg("machine") = py::dict(),
      py::arg("costs") = py::none(), py::arg("schedule") = py::none(),
      "baton trace predict: one step of a plan (a dict or a plan file's path) simulated, "
      "{'step_time', 'bubble', 'timeline': Timeline, 'time_source'}; schedule: a Schedule "
      "to run instead of the plan's generator");
}

}  // namespace baton::python
