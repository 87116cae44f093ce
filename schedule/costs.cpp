#include "schedule/costs.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/json_object.h"
#include "memory/units.h"
#include "schedule/detail/util.h"
#include "schedule/schedule_io.h"

namespace baton::schedule {

namespace {

using nlohmann::json;

using memory::json_brief;

// A number >= 0; for byte fields also a size string such as "64MiB".
double number(const json& j, const std::string& path, bool bytes) {
  if (bytes && j.is_string()) {
    try {
      return double(memory::parse_bytes(j.get<std::string>()));
    } catch (const InputError& e) {
      throw InputError(path + ": " + e.what());
    }
  }
  if (!j.is_number())
    throw InputError(path + ": expected a number >= 0" +
                     std::string(bytes ? " or a size such as \"64MiB\"" : "") + ", found " +
                     json_brief(j));
  double v = j.get<double>();
  if (!std::isfinite(v) || v < 0)
    throw InputError(path + ": expected a number >= 0, found " + json_brief(j));
  return v;
}

CostSpec::Field field(const json& j, const std::string& path, bool bytes) {
  CostSpec::Field f;
  f.given = true;
  if (j.is_array()) {
    if (j.empty()) throw InputError(path + ": expected one value per stage, found an empty array");
    f.per_stage = true;
    for (size_t i = 0; i < j.size(); ++i)
      f.values.push_back(number(j[i], path + "[" + std::to_string(i) + "]", bytes));
  } else {
    f.values.push_back(number(j, path, bytes));
  }
  return f;
}

void check_vector(const std::vector<double>& v, const std::string& name, int count, bool optional,
                  const char* per = "stage") {
  if (optional && v.empty()) return;
  if (int(v.size()) != count)
    throw InputError("costs: " + name + ": expected " + std::to_string(count) +
                     " values (one per " + per + "), found " + std::to_string(v.size()));
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || v[i] < 0)
      throw InputError("costs: " + name + "[" + std::to_string(i) +
                       "]: expected a number >= 0, found " + detail::number(v[i]));
}

// Times up to kMaxCostSeconds and sizes up to 2^63 bytes: the simulator's sums of them
// stay finite. Checked once the file's time_unit is known.
constexpr double kMaxCostBytes = 0x1p63;

void check_cost_limits(const CostSpec& c) {
  const double max_time = kMaxCostSeconds / c.seconds_per_unit;
  const std::string time_limit =
      c.seconds_per_unit == 1.0
          ? std::string("1e9 s")
          : "1e9 s (" + detail::format_number("%g", max_time) + " in this file's time_unit)";
  auto limit = [](const std::vector<double>& values, bool per_stage, const std::string& name,
                  double max, const std::string& what) {
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i] > max)
        throw InputError("$." + name + (per_stage ? "[" + std::to_string(i) + "]" : "") +
                         ": expected at most " + what + ", found " +
                         detail::format_number("%g", values[i]));
  };
  for (auto [f, name] : {std::pair{&c.forward, "forward"},
                         {&c.backward_input, "backward_input"},
                         {&c.backward_weight, "backward_weight"},
                         {&c.reduce, "reduce"},
                         {&c.overlap_f_b, "overlap_f_b"}})
    limit(f->values, f->per_stage, name, max_time, time_limit);
  limit({c.optimizer_step}, false, "optimizer_step", max_time, time_limit);
  limit({c.latency}, false, "p2p.latency", max_time, time_limit);
  for (auto [f, name] : {std::pair{&c.activation_bytes, "activation_bytes"},
                         {&c.activation_bytes_after_b, "activation_bytes_after_b"},
                         {&c.message_bytes, "message_bytes"}})
    limit(f->values, f->per_stage, name, kMaxCostBytes, "2^63 bytes");
  limit({c.bandwidth}, false, "p2p.bandwidth", kMaxCostBytes, "2^63 bytes per time unit");
  // A message's time on the link (bytes / bandwidth) is a time too.
  if (c.bandwidth > 0)
    for (double bytes : c.message_bytes.values)
      if (bytes / c.bandwidth > max_time)
        throw InputError("$.p2p.bandwidth: expected a bandwidth that moves message_bytes (" +
                         detail::format_number("%.17g", bytes) + ") within " + time_limit +
                         ", found " + detail::format_number("%g", c.bandwidth) +
                         " bytes per time unit");
}

}  // namespace

Costs Costs::uniform(int stages, double f, double b, double w) {
  Costs c;
  c.forward.assign(size_t(stages), f);
  c.backward_input.assign(size_t(stages), b);
  c.backward_weight.assign(size_t(stages), w);
  return c;
}

void Costs::check(int stages, int ranks) const {
  check_vector(forward, "forward", stages, false);
  check_vector(backward_input, "backward_input", stages, false);
  check_vector(backward_weight, "backward_weight", stages, false);
  check_vector(activation_bytes, "activation_bytes", stages, true);
  check_vector(activation_bytes_after_b, "activation_bytes_after_b", stages, true);
  check_vector(message_bytes, "message_bytes", stages, true);
  check_vector(reduce, "reduce", stages, true);
  check_vector(overlap_f_b, "overlap_f_b", stages, true);
  if (!reduce_group.empty() && int(reduce_group.size()) != stages)
    throw InputError("costs: reduce_group: expected " + std::to_string(stages) +
                     " values (one per stage), found " + std::to_string(reduce_group.size()));
  for (size_t i = 0; i < reduce_group.size(); ++i)
    if (reduce_group[i] < -1 || reduce_group[i] >= stages)
      throw InputError("costs: reduce_group[" + std::to_string(i) +
                       "]: expected -1 or a group id in [0, " + std::to_string(stages) +
                       "), found " + std::to_string(reduce_group[i]));
  for (size_t c = 0; c < core_ranks.size(); ++c)
    check_vector(core_ranks[c], "core_ranks[" + std::to_string(c) + "]", ranks, false, "rank");
  check_vector(optimizer_step_rank, "optimizer_step_rank", ranks, true, "rank");
  for (auto [v, name] : {std::pair{latency, "latency"},
                         {bandwidth, "bandwidth"},
                         {optimizer_step, "optimizer_step"}})
    if (!std::isfinite(v) || v < 0)
      throw InputError(std::string("costs: ") + name + ": expected a number >= 0, found " +
                       std::to_string(v));
}

CostSpec CostSpec::unit() {
  CostSpec c;
  for (Field* f : {&c.forward, &c.backward_input, &c.backward_weight}) {
    f->values = {1.0};
    f->given = true;
  }
  return c;
}

CostSpec parse_costs(std::string_view text, const std::string& source) {
  const json j = memory::parse_json_text(text, source);
  try {
    if (!j.is_object()) throw InputError("$: expected a JSON object, found " + json_brief(j));
    // The other cost file: its unknown fields had been named one by one.
    if (j.contains("kind") && j["kind"] == "op_times")
      throw InputError(
          "$.kind: this is a `baton profile` file of op times (\"kind\": \"op_times\"), "
          "which `baton plan`, `baton trace predict` and Python's predict() read; a schedule "
          "takes a cost file of per-stage action times (docs/schedules.md, \"Costs\"): "
          "`baton trace predict --plan P --costs FILE [--schedule S]` simulates a schedule "
          "with a profile's times");
    memory::expect_json_object(
        j, "$",
        {"forward", "backward_input", "backward_weight", "activation_bytes",
         "activation_bytes_after_b", "message_bytes", "reduce", "reduce_group", "overlap_f_b",
         "optimizer_step", "optimizer_step_mode", "p2p", "time_unit", "comment"});
    CostSpec c;
    struct Slot {
      const char* name;
      CostSpec::Field* field;
      bool bytes;
    };
    const Slot slots[] = {{"forward", &c.forward, false},
                          {"backward_input", &c.backward_input, false},
                          {"backward_weight", &c.backward_weight, false},
                          {"activation_bytes", &c.activation_bytes, true},
                          {"activation_bytes_after_b", &c.activation_bytes_after_b, true},
                          {"message_bytes", &c.message_bytes, true},
                          {"reduce", &c.reduce, false},
                          {"overlap_f_b", &c.overlap_f_b, false}};
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& key = it.key();
      bool done = false;
      for (const Slot& s : slots)
        if (key == s.name) {
          *s.field = field(*it, "$." + key, s.bytes);
          done = true;
        }
      if (done) continue;
      if (key == "optimizer_step") {
        c.optimizer_step = number(*it, "$." + key, false);
      } else if (key == "reduce_group") {
        if (!it->is_array() || it->empty())
          throw InputError(
              "$.reduce_group: expected an array of group ids (one per stage), found " +
              json_brief(*it));
        for (size_t i = 0; i < it->size(); ++i) {
          const json& g = (*it)[i];
          if (!g.is_number_integer() || g.get<long long>() < -1 || g.get<long long>() > 1 << 20)
            throw InputError("$.reduce_group[" + std::to_string(i) +
                             "]: expected -1 or a group id >= 0, found " + json_brief(g));
          c.reduce_group.push_back(g.get<int>());
        }
      } else if (key == "optimizer_step_mode") {
        const std::string m = it->is_string() ? it->get<std::string>() : "";
        if (m != "synchronous" && m != "post-validated")
          throw InputError(
              "$.optimizer_step_mode: expected \"synchronous\" or \"post-validated\", found " +
              json_brief(*it));
        c.post_validated_step = m == "post-validated";
      } else if (key == "comment") {
        if (!it->is_string())
          throw InputError("$.comment: expected a string, found " + json_brief(*it));
        c.comment = it->get<std::string>();
      } else if (key == "time_unit") {
        const std::string u = it->is_string() ? it->get<std::string>() : "";
        if (u == "s")
          c.seconds_per_unit = 1.0;
        else if (u == "ms")
          c.seconds_per_unit = 1e-3;
        else if (u == "us")
          c.seconds_per_unit = 1e-6;
        else if (u == "ns")
          c.seconds_per_unit = 1e-9;
        else
          throw InputError("$.time_unit: expected \"s\", \"ms\", \"us\" or \"ns\", found " +
                           json_brief(*it));
      } else if (key == "p2p") {
        if (!it->is_object())
          throw InputError("$.p2p: expected an object {\"latency\", \"bandwidth\"}, found " +
                           json_brief(*it));
        memory::expect_json_object(*it, "$.p2p", {"latency", "bandwidth"});
        if (it->contains("latency")) c.latency = number(it->at("latency"), "$.p2p.latency", false);
        if (it->contains("bandwidth"))
          c.bandwidth = number(it->at("bandwidth"), "$.p2p.bandwidth", true);
      }
    }
    for (const char* k : {"forward", "backward_input", "backward_weight"})
      if (!j.contains(k)) throw InputError("$." + std::string(k) + ": missing (required)");
    check_cost_limits(c);
    return c;
  } catch (const InputError& e) {
    throw InputError(source + ": " + e.what());
  }
}

CostSpec load_costs(const std::string& path) {
  return parse_costs(memory::read_file(path), path);
}

Costs resolve(const CostSpec& spec, int num_ranks, int num_stages, int num_directions) {
  const double v =
      double(num_stages) / num_directions / num_ranks;  // stages per rank and direction
  auto expand = [&](const CostSpec::Field& f, const char* name,
                    bool divide) -> std::vector<double> {
    if (!f.given) return {};
    if (f.per_stage) {
      if (int(f.values.size()) != num_stages)
        throw InputError(std::string("costs: ") + name + ": has " +
                         std::to_string(f.values.size()) + " values but the schedule has " +
                         std::to_string(num_stages) +
                         " stages (give one value per stage, or one number for a rank's share)");
      return f.values;
    }
    return std::vector<double>(size_t(num_stages), divide ? f.values[0] / v : f.values[0]);
  };
  Costs c;
  c.forward = expand(spec.forward, "forward", true);
  c.backward_input = expand(spec.backward_input, "backward_input", true);
  c.backward_weight = expand(spec.backward_weight, "backward_weight", true);
  c.activation_bytes = expand(spec.activation_bytes, "activation_bytes", true);
  c.activation_bytes_after_b =
      expand(spec.activation_bytes_after_b, "activation_bytes_after_b", true);
  c.message_bytes = expand(spec.message_bytes, "message_bytes", false);
  c.reduce = expand(spec.reduce, "reduce", true);
  c.overlap_f_b = expand(spec.overlap_f_b, "overlap_f_b", true);
  c.latency = spec.latency;
  c.bandwidth = spec.bandwidth;
  c.optimizer_step = spec.optimizer_step;
  c.post_validated_step = spec.post_validated_step;
  if (!spec.reduce_group.empty() && int(spec.reduce_group.size()) != num_stages)
    throw InputError("costs: reduce_group: has " + std::to_string(spec.reduce_group.size()) +
                     " values but the schedule has " + std::to_string(num_stages) + " stages");
  c.reduce_group = spec.reduce_group;
  c.check(num_stages, num_ranks);
  // The cost file's activation_bytes_after_b is the part of activation_bytes still held
  // between B and W (the partitioner's own figures may differ: recompute keeps less
  // before B than W needs after it).
  if (spec.activation_bytes_after_b.given)
    for (size_t i = 0; i < c.activation_bytes_after_b.size(); ++i) {
      const double whole = c.activation_bytes.empty() ? 0.0 : c.activation_bytes[i];
      if (c.activation_bytes_after_b[i] > whole)
        throw InputError("costs: activation_bytes_after_b" +
                         (spec.activation_bytes_after_b.per_stage ? "[" + std::to_string(i) + "]"
                                                                  : std::string()) +
                         ": expected at most activation_bytes (" +
                         (spec.activation_bytes.given ? detail::format_number("%.17g", whole)
                                                      : std::string("0: not given")) +
                         ", of which it is the part held between B and W), found " +
                         detail::format_number("%.17g", c.activation_bytes_after_b[i]));
    }
  return c;
}

Costs resolve(const CostSpec& spec, const Schedule& s) {
  return resolve(spec, s.num_ranks, s.num_stages(), s.num_directions);
}

}  // namespace baton::schedule
