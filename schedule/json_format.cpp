// The JSON form of a schedule, file loading and saving (see schedule_io.h).

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/json_object.h"
#include "memory/utf8.h"
#include "schedule/detail/util.h"
#include "schedule/schedule_io.h"
#include "schedule/torch_csv.h"

namespace baton::schedule {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "baton-schedule";
constexpr int kVersion = 1;

using memory::json_brief;

int get_int(const json& j, const std::string& path, int lo, int hi) {
  if (!j.is_number_integer())
    throw InputError(path + ": expected an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "], found " + json_brief(j));
  auto v = j.get<long long>();
  if (v < lo || v > hi)
    throw InputError(path + ": expected an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "], found " + std::to_string(v));
  return static_cast<int>(v);
}

json action_json(const Action& a) {
  json o = json::object();
  o["kind"] = std::string(kind_code(a.kind));
  if (a.kind != ActionKind::optimizer_step) o["stage"] = a.stage;
  if (has_micro_batch(a.kind)) o["micro_batch"] = a.micro_batch;
  if (is_transfer(a.kind)) o["peer"] = a.peer;
  if (a.overlap) o["overlap"] = true;
  return o;
}

Action parse_action(const json& j, const std::string& path) {
  if (!j.is_object())
    throw InputError(path + ": expected an action object, found " + json_brief(j));
  memory::expect_json_object(j, path, {"kind", "stage", "micro_batch", "peer", "overlap"});
  if (!j.contains("kind")) throw InputError(path + ".kind: missing (expected e.g. \"F\")");
  const json& k = j["kind"];
  auto kind = k.is_string() ? kind_from_code(k.get<std::string>()) : std::nullopt;
  if (!kind)
    throw InputError(path +
                     ".kind: expected one of F, B, W, BW, SEND_F, RECV_F, SEND_B, RECV_B, "
                     "REDUCE, STEP; found " +
                     json_brief(k));
  Action a{*kind, -1, -1, -1};
  constexpr int kBig = 1 << 30;
  if (*kind != ActionKind::optimizer_step) {
    if (!j.contains("stage"))
      throw InputError(path + ".stage: missing (a " + std::string(k.get<std::string>()) +
                       " names its stage)");
    a.stage = get_int(j["stage"], path + ".stage", 0, kBig);
  } else if (j.contains("stage")) {
    throw InputError(path + ".stage: STEP takes no stage");
  }
  if (has_micro_batch(*kind)) {
    if (!j.contains("micro_batch")) throw InputError(path + ".micro_batch: missing");
    a.micro_batch = get_int(j["micro_batch"], path + ".micro_batch", 0, kBig);
  } else if (j.contains("micro_batch")) {
    throw InputError(path + ".micro_batch: " + std::string(kind_code(*kind)) +
                     " takes no micro-batch");
  }
  if (j.contains("peer")) {
    if (!is_transfer(*kind)) throw InputError(path + ".peer: only sends and receives have a peer");
    a.peer = get_int(j["peer"], path + ".peer", -1, kBig);
  }
  if (j.contains("overlap")) {
    if (!j["overlap"].is_boolean())
      throw InputError(path + ".overlap: expected true or false, found " +
                       json_brief(j["overlap"]));
    a.overlap = j["overlap"].get<bool>();
  }
  return a;
}

}  // namespace

json to_json(const Schedule& s) {
  json j = json::object();
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["name"] = s.name;
  j["ranks"] = s.num_ranks;
  j["micro_batches"] = s.num_micro_batches;
  j["directions"] = s.num_directions;
  j["placement"] = s.placement;
  json acts = json::array();
  for (const auto& list : s.ranks) {
    json l = json::array();
    for (const Action& a : list) l.push_back(action_json(a));
    acts.push_back(std::move(l));
  }
  j["actions"] = std::move(acts);
  return j;
}

std::string to_json_text(const Schedule& s) {
  std::string out = "{\n";
  out += "  \"format\": \"" + std::string(kFormat) + "\",\n";
  out += "  \"version\": " + std::to_string(kVersion) + ",\n";
  out += "  \"name\": " + json(s.name).dump() + ",\n";
  out += "  \"ranks\": " + std::to_string(s.num_ranks) + ",\n";
  out += "  \"micro_batches\": " + std::to_string(s.num_micro_batches) + ",\n";
  out += "  \"directions\": " + std::to_string(s.num_directions) + ",\n";
  out += "  \"placement\": " + json(s.placement).dump() + ",\n";
  out += "  \"actions\": [\n";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out += "    [";
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      if (i) out += ", ";
      out += action_json(s.ranks[r][i]).dump();
    }
    out += r + 1 < s.ranks.size() ? "],\n" : "]\n";
  }
  out += "  ]\n}\n";
  return out;
}

Schedule from_json(const json& j, const std::string& source) {
  const std::string at = source + ": ";
  if (!j.is_object()) throw InputError(at + "expected a JSON object, found " + json_brief(j));
  try {
    // The version first: a newer baton's fields are then not called unknown.
    if (j.contains("version") && j["version"].is_number_integer() &&
        j["version"].get<long long>() > kVersion)
      throw InputError("version: the schedule is in format version " +
                       std::to_string(j["version"].get<long long>()) +
                       ", written by a newer baton; this one reads version " +
                       std::to_string(kVersion));
    memory::expect_json_object(j, "",
                               {"format", "version", "name", "ranks", "micro_batches", "directions",
                                "placement", "actions"});
    if (j.contains("format") && j["format"] != kFormat)
      throw InputError("format: expected \"" + std::string(kFormat) + "\", found " +
                       json_brief(j["format"]));
    if (j.contains("version")) get_int(j["version"], "version", kVersion, kVersion);
    Schedule s;
    if (j.contains("name")) {
      if (!j["name"].is_string())
        throw InputError("name: expected a string, found " + json_brief(j["name"]));
      s.name = j["name"].get<std::string>();
      check_name(s.name, "name");
    }
    for (const char* k : {"ranks", "micro_batches", "placement", "actions"})
      if (!j.contains(k)) throw InputError(std::string(k) + ": missing (required)");
    s.num_ranks = get_int(j["ranks"], "ranks", 1, 1 << 16);
    s.num_micro_batches = get_int(j["micro_batches"], "micro_batches", 1, 1 << 22);
    s.num_directions = j.contains("directions") ? get_int(j["directions"], "directions", 1, 2) : 1;
    const json& pl = j["placement"];
    if (!pl.is_array())
      throw InputError("placement: expected an array of ranks, found " + json_brief(pl));
    for (size_t i = 0; i < pl.size(); ++i)
      s.placement.push_back(
          get_int(pl[i], "placement[" + std::to_string(i) + "]", 0, s.num_ranks - 1));
    const json& acts = j["actions"];
    if (!acts.is_array())
      throw InputError("actions: expected an array with one action list per rank, found " +
                       json_brief(acts));
    if (acts.size() != size_t(s.num_ranks))
      throw InputError("actions: expected " + std::to_string(s.num_ranks) +
                       " action lists (one per rank), found " + std::to_string(acts.size()));
    for (size_t r = 0; r < acts.size(); ++r) {
      const std::string rp = "actions[" + std::to_string(r) + "]";
      if (!acts[r].is_array())
        throw InputError(rp + ": expected an array of actions, found " + json_brief(acts[r]));
      std::vector<Action> list;
      list.reserve(acts[r].size());
      for (size_t i = 0; i < acts[r].size(); ++i) {
        list.push_back(parse_action(acts[r][i], rp + "[" + std::to_string(i) + "]"));
      }
      s.ranks.push_back(std::move(list));
    }
    check_header(s, source);
    // Peers written in the file are kept (the validator checks them against the
    // placement); missing ones come from the placement.
    for (auto& list : s.ranks)
      for (Action& a : list)
        if (is_transfer(a.kind) && a.peer < 0) a.peer = transfer_peer(s, a);
    return s;
  } catch (const InputError& e) {
    std::string msg = e.what();
    if (msg.rfind(source, 0) == 0) throw;  // already names the source
    throw InputError(at + msg);
  }
}

Schedule parse_json(std::string_view text, const std::string& source) {
  const json j = memory::parse_json_text(text, source);
  return from_json(j, source);
}

Schedule load_schedule(const std::string& path) {
  if (is_csv_path(path)) return load_torch_csv(path).schedule;
  const std::string file = memory::read_file(path);
  const std::string_view text = memory::skip_utf8_bom(file);
  size_t first = text.find_first_not_of(" \t\r\n");
  // A .json file is JSON whatever it holds: "[1,2]" had been read as a text schedule's
  // actions, an empty file as one without rank lines.
  if ((first != std::string::npos && text[first] == '{') || detail::has_extension(path, ".json"))
    return parse_json(text, path);
  return parse_text(text, path);
}

Schedule load_schedule_to_run(const std::string& path, TorchDialect dialect) {
  if (!is_csv_path(path)) return load_schedule(path);
  TorchCsv csv = load_torch_csv(path, dialect);
  check_torch_csv(csv, path);
  return std::move(csv.schedule);
}

void save_schedule(const Schedule& s, const std::string& path, TorchDialect dialect,
                   const KeptCells* kept) {
  const bool is_json = detail::has_extension(path, ".json");
  if (is_csv_path(path)) {
    std::string csv;
    try {
      csv = to_torch_csv(s, dialect, kept);
    } catch (const InputError& e) {
      throw InputError(path + ": " + e.what());
    }
    return memory::write_file_durably(path, csv);
  }
  memory::write_file_durably(path, is_json ? to_json_text(s) : to_text(s));
}

}  // namespace baton::schedule
