#include "schedule/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "memory/error.h"
#include "memory/json_object.h"
#include "schedule/detail/util.h"

namespace baton::schedule {

namespace {

using nlohmann::json;
using K = ActionKind;

std::string event_token(const TimelineEvent& e) {
  return to_token(Action{e.kind, e.micro_batch, e.stage, e.peer});
}

// One colour per kind (ColorBrewer-like, readable on white).
const char* kind_colour(K k) {
  switch (k) {
    case K::forward:
      return "#4c78a8";
    case K::backward_input:
      return "#54a24b";
    case K::backward_weight:
      return "#f58518";
    case K::full_backward:
      return "#72b7b2";
    case K::reduce_gradients:
      return "#b279a2";
    case K::optimizer_step:
      return "#e45756";
    default:
      return "#9d9d9d";  // transfers
  }
}

// `hex` mixed with white: later chunks of a rank are drawn lighter.
std::string lighter(const char* hex, double amount) {
  unsigned r = 0, g = 0, b = 0;
  std::sscanf(hex + 1, "%02x%02x%02x", &r, &g, &b);
  auto mix = [&](unsigned c) { return unsigned(std::lround(c + (255.0 - c) * amount)); };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", mix(r), mix(g), mix(b));
  return buf;
}

// Also U+FFFD for what XML 1.0 has no character for, not even as a reference: C0 controls
// but tab, newline and carriage return, and U+FFFE, U+FFFF (a name read from a trace may
// hold them; the SVG had then been refused by XML parsers).
std::string xml_escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') ||
        (s.compare(i, 2, "\xEF\xBF") == 0 && i + 2 < s.size() &&
         (s[i + 2] == '\xBE' || s[i + 2] == '\xBF'))) {
      out += "\xEF\xBF\xBD";
      if (c == '\xEF') i += 2;
    } else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string unit_name(double seconds_per_unit) {
  if (seconds_per_unit == 1.0) return "s";
  if (seconds_per_unit == 1e-3) return "ms";
  if (seconds_per_unit == 1e-6) return "us";
  if (seconds_per_unit == 1e-9) return "ns";
  return "units";
}

// A labelled event's trace category: HALO, INTERIOR or INPUT.
std::string event_category(const TimelineEvent& e) {
  if (e.label.starts_with("HALO")) return "HALO";
  if (e.label.starts_with("INTERIOR")) return "INTERIOR";
  if (e.label == "PUSH" || e.label == "PULL") return "SERVER";
  return "INPUT";
}

// A trace event's name: the action's token ("1F3"), or the label and micro-batch.
std::string event_name(const TimelineEvent& e) {
  return e.label.empty() ? event_token(e) : e.label + std::to_string(e.micro_batch);
}

}  // namespace

// Appended labels keep the earlier indices. "PUSH" and "PULL": an extra parameter-server
// rank's push (the gradients' reduce-scatters received) and pull (the parameters'
// all-gathers sent) of one served group on lane 1, category SERVER, the group's index as
// the micro-batch number (engine/detail/param_server.h).
const std::vector<std::string>& event_labels() {
  static const std::vector<std::string> labels = {"HALO_F",     "HALO_B",     "LOAD", "INPUT_WAIT",
                                                  "INTERIOR_F", "INTERIOR_B", "PUSH", "PULL"};
  return labels;
}

double Timeline::end_time() const {
  double t = 0.0;
  for (const auto& e : events) t = std::max(t, e.end);
  return t;
}

namespace {

// A whole number of picoseconds as microseconds with six decimals, exactly (its quotient
// by 1e6 through "%.6f" can be off in the last place).
std::string microseconds_text(double picoseconds) {
  std::string d = detail::format_number("%.0f", std::abs(picoseconds));
  if (d.size() < 7) d.insert(0, 7 - d.size(), '0');
  d.insert(d.size() - 6, 1, '.');
  return picoseconds < 0 ? "-" + d : d;
}

// Each event's start and end in whole picoseconds (the trace's six decimals of a
// microsecond), refusing what from_chrome_trace would refuse.
std::vector<std::pair<double, double>> trace_times(const Timeline& t) {
  const std::string what = "timeline " + json(t.name).dump();
  if (t.num_ranks < 1 || t.num_ranks > kMaxTraceRanks)
    throw InputError(what + ": " + std::to_string(t.num_ranks) +
                     " ranks, a Chrome trace holds 1 to " + std::to_string(kMaxTraceRanks) +
                     "; no trace written");
  if (!(t.seconds_per_unit >= kMinTraceSecondsPerUnit &&
        t.seconds_per_unit <= kMaxTraceSecondsPerUnit))
    throw InputError(what + ": a time unit of " + detail::format_number("%g", t.seconds_per_unit) +
                     " s, a Chrome trace holds 1e-15 to 1e6 s; no trace written");
  const double per_unit = t.seconds_per_unit * 1e12;
  const double limit = kMaxTraceMicroseconds * 1e6;
  std::vector<std::pair<double, double>> at;
  at.reserve(t.events.size());
  for (const TimelineEvent& e : t.events) {
    auto refuse = [&](const std::string& why) {
      throw InputError(what + ": " + event_name(e) + " on rank " + std::to_string(e.rank) + " " +
                       why + " (start " + detail::format_number("%g", e.start) + ", end " +
                       detail::format_number("%g", e.end) + " " + unit_name(t.seconds_per_unit) +
                       "); no trace written");
    };
    if (e.rank < 0 || e.rank >= t.num_ranks || e.lane < 0 || e.lane > 2)
      refuse("is on no rank or lane of the timeline");
    // JSON has no infinity or NaN: such a time would make the whole trace unreadable.
    if (!std::isfinite(e.start) || !std::isfinite(e.end))
      refuse("has no finite time: costs too large to simulate");
    const double start = std::nearbyint(e.start * per_unit), end = std::nearbyint(e.end * per_unit);
    if (!(std::abs(start) <= limit) || !(end - start <= limit))
      refuse(std::string(!(std::abs(start) <= limit) ? "starts" : "lasts") +
             " beyond 1e15 us (about 31 years), the most a Chrome trace holds (Perfetto keeps "
             "times as 64-bit nanoseconds): costs too large");
    if (end < start) refuse("ends before it starts");
    at.emplace_back(start, end);
  }
  return at;
}

// Each event's thread: its lane, but a rank's transfers in flight at once (a send leaving
// before the previous one arrived) on threads 3, 4, ... as events on one thread must nest
// (Perfetto). `extra[r]`: how many such threads rank r has.
std::vector<int> trace_threads(const Timeline& t, const std::vector<std::pair<double, double>>& at,
                               std::vector<int>& extra) {
  std::vector<int> tid(t.events.size());
  std::vector<size_t> order;
  for (size_t i = 0; i < t.events.size(); ++i) {
    tid[i] = t.events[i].lane;
    if (t.events[i].lane == 1) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(t.events[a].rank, at[a].first) < std::tie(t.events[b].rank, at[b].first);
  });
  extra.assign(size_t(t.num_ranks), 0);
  std::vector<double> free_at;  // the rank's communication threads: when each is free
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const int r = t.events[i].rank;
    if (k == 0 || t.events[order[k - 1]].rank != r) free_at.clear();
    size_t j = 0;
    while (j < free_at.size() && free_at[j] > at[i].first) ++j;
    if (j == free_at.size()) free_at.push_back(0);
    free_at[j] = at[i].second;
    tid[i] = j == 0 ? 1 : 2 + int(j);
    extra[size_t(r)] = std::max(extra[size_t(r)], int(j));
  }
  return tid;
}

}  // namespace

std::string to_chrome_trace(const Timeline& t) {
  const std::vector<std::pair<double, double>> at = trace_times(t);
  std::vector<int> extra;
  const std::vector<int> tid = trace_threads(t, at, extra);
  std::string out;
  out.reserve(t.events.size() * 120 + 1024);
  out += "{\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"baton\": \"timeline\", \"name\": " +
         json(t.name).dump() + ", \"ranks\": " + std::to_string(t.num_ranks) +
         ", \"seconds_per_unit\": " + detail::format_number("%.17g", t.seconds_per_unit) +
         "},\n\"traceEvents\": [\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (int r = 0; r < t.num_ranks; ++r) {
    const std::string pid = std::to_string(r);
    sep();
    out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + pid +
           ", \"args\": {\"name\": \"rank " + pid + "\"}},\n";
    out += "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + pid +
           ", \"args\": {\"sort_index\": " + pid + "}},\n";
    out += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid +
           ", \"tid\": 0, \"args\": {\"name\": \"compute\"}},\n";
    out += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid +
           ", \"tid\": 1, \"args\": {\"name\": \"communication\"}},\n";
    out += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid +
           ", \"tid\": 2, \"args\": {\"name\": \"input\"}}";
    for (int k = 1; k <= extra[size_t(r)]; ++k)
      out += ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid +
             ", \"tid\": " + std::to_string(2 + k) + ", \"args\": {\"name\": \"communication " +
             std::to_string(k + 1) + "\"}}";
  }
  for (size_t i = 0; i < t.events.size(); ++i) {
    const TimelineEvent& e = t.events[i];
    sep();
    const std::string name = event_name(e);
    const std::string cat = e.label.empty() ? std::string(kind_code(e.kind)) : event_category(e);
    out += "{\"name\": \"" + name + "\", \"cat\": \"" + cat +
           "\", \"ph\": \"X\", \"pid\": " + std::to_string(e.rank) +
           ", \"tid\": " + std::to_string(tid[i]) + ", \"ts\": " + microseconds_text(at[i].first) +
           ", \"dur\": " + microseconds_text(at[i].second - at[i].first) +
           ", \"args\": {\"stage\": " + std::to_string(e.stage) +
           ", \"micro_batch\": " + std::to_string(e.micro_batch);
    if (e.peer >= 0) out += ", \"peer\": " + std::to_string(e.peer);
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

namespace {

// Stage and micro-batch numbers, as schedule files bound them.
constexpr int64_t kMaxTraceIndex = int64_t(1) << 30;
// Threads: 0-2 the lanes, 3 and up more communication (to_chrome_trace).
constexpr int64_t kMaxTraceThread = int64_t(1) << 20;

std::string trace_brief(const json& j) {
  std::string s = j.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// An integer in [lo, hi] (unsigned JSON integers included), else InputError at `path`.
int trace_integer(const json& j, const std::string& path, int64_t lo, int64_t hi,
                  const std::string& expected) {
  const bool ok = j.is_number_unsigned()
                      ? hi >= 0 && j.get<uint64_t>() <= uint64_t(hi) && j.get<int64_t>() >= lo
                  : j.is_number_integer() ? j.get<int64_t>() >= lo && j.get<int64_t>() <= hi
                                          : false;
  if (!ok) throw InputError(path + ": expected " + expected + ", found " + trace_brief(j));
  return int(j.get<int64_t>());
}

// A finite number of microseconds in [lo, kMaxTraceMicroseconds].
double trace_time(const json& j, const std::string& path, double lo, const std::string& expected) {
  if (!j.is_number() || !std::isfinite(j.get<double>()) || j.get<double>() < lo ||
      j.get<double>() > kMaxTraceMicroseconds)
    throw InputError(path + ": expected " + expected + ", found " + trace_brief(j));
  return j.get<double>();
}

}  // namespace

Timeline from_chrome_trace(std::string_view text, const std::string& source) {
  const json j = memory::parse_json_text(text, source);
  const json* events = &j;
  Timeline t;
  t.seconds_per_unit = 1e-6;  // a trace without baton's header: keep microseconds
  bool ranks_given = false;
  if (j.is_object()) {
    if (!j.contains("traceEvents") || !j["traceEvents"].is_array())
      throw InputError(source + ": traceEvents: expected an array of trace events");
    events = &j["traceEvents"];
    if (j.contains("otherData") && j["otherData"].is_object()) {
      const json& o = j["otherData"];
      if (o.contains("name") && o["name"].is_string()) t.name = o["name"].get<std::string>();
      if (o.contains("seconds_per_unit")) {
        const json& u = o["seconds_per_unit"];
        if (!u.is_number() || !(u.get<double>() >= kMinTraceSecondsPerUnit &&
                                u.get<double>() <= kMaxTraceSecondsPerUnit))
          throw InputError(source +
                           ": otherData.seconds_per_unit: expected a number from 1e-15 "
                           "to 1e6 (seconds per time unit), found " +
                           trace_brief(u));
        t.seconds_per_unit = u.get<double>();
      }
      if (o.contains("ranks")) {
        t.num_ranks =
            trace_integer(o["ranks"], source + ": otherData.ranks", 1, kMaxTraceRanks,
                          "a number of ranks from 1 to " + std::to_string(kMaxTraceRanks));
        ranks_given = true;
      }
    }
  } else if (!j.is_array()) {
    throw InputError(source + ": expected a trace object or an array of trace events");
  }
  const double per_us = 1.0 / (t.seconds_per_unit * 1e6);
  // With the header's rank count, ranks and peers are checked against it.
  const int64_t rank_limit = ranks_given ? t.num_ranks : kMaxTraceRanks;
  const std::string ranks_expected =
      "a rank from 0 to " + std::to_string(rank_limit - 1) +
      (ranks_given ? " (otherData.ranks is " + std::to_string(t.num_ranks) + ")" : "");
  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    const std::string path = source + ": traceEvents[" + std::to_string(i) + "]";
    if (!e.is_object())
      throw InputError(path + ": expected a trace event object, found " + trace_brief(e));
    if (!e.contains("ph") || !e["ph"].is_string() ||
        (e["ph"].get<std::string>() != "X" && e["ph"].get<std::string>() != "M"))
      throw InputError(path + ".ph: expected \"X\" (a complete event) or \"M\" (metadata), found " +
                       (e.contains("ph") ? trace_brief(e["ph"]) : std::string("nothing")));
    if (e["ph"].get<std::string>() == "M") continue;  // process and thread names
    // The action's kind code, or a labelled event's category (halos, loads, ...: no
    // schedule action, so not read).
    const std::string cat =
        e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
    auto kind = kind_from_code(cat);
    const bool labelled = cat == "HALO" || cat == "INTERIOR" || cat == "INPUT" || cat == "SERVER";
    if (!kind && !labelled)
      throw InputError(path +
                       ".cat: expected an action kind (F, B, W, BW, SEND_F, RECV_F, SEND_B, "
                       "RECV_B, REDUCE, STEP) or HALO, INTERIOR, INPUT, SERVER, found " +
                       (e.contains("cat") ? trace_brief(e["cat"]) : std::string("nothing")));
    for (const char* k : {"pid", "ts", "dur"})
      if (!e.contains(k)) throw InputError(path + "." + k + ": missing (required)");
    TimelineEvent ev;
    ev.rank = trace_integer(e["pid"], path + ".pid", 0, rank_limit - 1, ranks_expected);
    ev.lane = e.contains("tid")
                  ? trace_integer(e["tid"], path + ".tid", 0, kMaxTraceThread,
                                  "a thread: 0 (compute), 2 (input), 1 or 3 to " +
                                      std::to_string(kMaxTraceThread) + " (communication)")
                  : 0;
    if (ev.lane > 2) ev.lane = 1;
    const double ts = trace_time(e["ts"], path + ".ts", -kMaxTraceMicroseconds,
                                 "a finite time of at most 1e15 microseconds");
    const double dur =
        trace_time(e["dur"], path + ".dur", 0.0, "a duration from 0 to 1e15 microseconds");
    ev.start = ts * per_us;
    ev.end = (ts + dur) * per_us;
    if (e.contains("args")) {
      const json& a = e["args"];
      if (!a.is_object())
        throw InputError(path + ".args: expected an object, found " + trace_brief(a));
      // Compute actions have a stage and micro-batch; REDUCE and STEP may say -1.
      const int64_t least = kind && is_compute(*kind) ? 0 : -1;
      const std::string from = "an integer from " + std::to_string(least) + " to ";
      if (a.contains("stage"))
        ev.stage = trace_integer(a["stage"], path + ".args.stage", least, kMaxTraceIndex,
                                 from + std::to_string(kMaxTraceIndex));
      if (a.contains("micro_batch"))
        ev.micro_batch = trace_integer(a["micro_batch"], path + ".args.micro_batch", least,
                                       kMaxTraceIndex, from + std::to_string(kMaxTraceIndex));
      if (a.contains("peer"))
        ev.peer = trace_integer(a["peer"], path + ".args.peer", -1, rank_limit - 1,
                                "-1 or " + ranks_expected);
    }
    if (labelled) continue;
    if (is_compute(*kind) && (ev.stage < 0 || ev.micro_batch < 0))
      throw InputError(path + ".args: expected the stage and micro_batch of the " +
                       std::string(kind_words(*kind)) + ", found " +
                       (e.contains("args") ? trace_brief(e["args"]) : std::string("none")));
    ev.kind = *kind;
    t.num_ranks = std::max(t.num_ranks, ev.rank + 1);
    t.events.push_back(ev);
  }
  return t;
}

std::string to_svg(const Timeline& t, const SvgOptions& o) {
  const double end = std::max(t.end_time(), 1e-300);
  const int left = 70, top = 34, row = std::max(12, o.row_height), strip = o.communication ? 7 : 0;
  const int pitch = row + strip + 4;
  const int height = top + t.num_ranks * pitch + 64;
  const double scale = o.width / end;
  const int font = std::clamp(row - 12, 7, 12);
  std::string out;
  out.reserve(t.events.size() * 140 + 4096);
  // The viewBox lets a page or notebook scale it (width: 100%), as the sizes alone do not.
  const std::string svg_w = std::to_string(left + o.width + 20);
  const std::string svg_h = std::to_string(height);
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + svg_w + "\" height=\"" + svg_h +
         "\" viewBox=\"0 0 " + svg_w + " " + svg_h + "\" font-family=\"sans-serif\" font-size=\"" +
         std::to_string(font) + "\">\n";
  out += "<title>" + xml_escape(t.name) +
         "</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"" + std::to_string(left) + "\" y=\"18\" font-size=\"13\">" +
         xml_escape(t.name) + (t.name.empty() ? "" : ": ") + "makespan " +
         detail::format_number("%.6g", end) + " " + unit_name(t.seconds_per_unit) + "</text>\n";
  for (int r = 0; r < t.num_ranks; ++r)
    out += "<text x=\"4\" y=\"" + std::to_string(top + r * pitch + row / 2 + font / 2 - 1) +
           "\">rank " + std::to_string(r) + "</text>\n";
  for (const TimelineEvent& e : t.events) {
    if (e.lane > 1 || (e.lane != 0 && !o.communication)) continue;
    if (e.lane == 0 && !e.label.empty() && e.label != "INPUT_WAIT") continue;  // inside an F/B
    const double x = left + e.start * scale, w = std::max(0.5, (e.end - e.start) * scale);
    const int y = top + e.rank * pitch + (e.lane == 0 ? 0 : row + 2);
    const int h = e.lane == 0 ? row : strip;
    const bool later_chunk = t.num_ranks > 0 && e.stage >= 0 && (e.stage / t.num_ranks) % 2 == 1;
    const std::string colour = !e.label.empty() && e.lane == 0 ? "#9e9e9e"  // INPUT_WAIT
                               : later_chunk && e.lane == 0    ? lighter(kind_colour(e.kind), 0.45)
                                                               : kind_colour(e.kind);
    out += "<rect x=\"" + detail::format_number("%.2f", x) + "\" y=\"" + std::to_string(y) +
           "\" width=\"" + detail::format_number("%.2f", w) + "\" height=\"" + std::to_string(h) +
           "\" fill=\"" + colour + "\" stroke=\"white\" stroke-width=\"0.5\"><title>" +
           event_name(e) + " " + detail::format_number("%.6g", e.start) + "-" +
           detail::format_number("%.6g", e.end) + "</title></rect>\n";
    const std::string label = e.micro_batch >= 0            ? std::to_string(e.micro_batch)
                              : e.kind == K::optimizer_step ? "S"
                                                            : "";
    if (e.lane == 0 && !label.empty() && w >= 0.62 * font * double(label.size()) + 2)
      out += "<text x=\"" + detail::format_number("%.2f", x + w / 2) + "\" y=\"" +
             std::to_string(y + row / 2 + font / 2 - 1) +
             "\" text-anchor=\"middle\" fill=\"white\">" + label + "</text>\n";
  }
  // Time axis: about ten ticks at 1, 2 or 5 times a power of ten.
  const int axis_y = top + t.num_ranks * pitch + 4;
  double step = std::pow(10.0, std::floor(std::log10(end / 10)));
  for (double f : {2.0, 5.0, 10.0})
    if (end / step > 12) step = std::pow(10.0, std::floor(std::log10(end / 10))) * f;
  out += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + std::to_string(axis_y) + "\" x2=\"" +
         std::to_string(left + o.width) + "\" y2=\"" + std::to_string(axis_y) +
         "\" stroke=\"black\"/>\n";
  for (int i = 0; i * step <= end * (1 + 1e-9) && i < 1000; ++i) {
    const double x = left + i * step * scale;
    out += "<line x1=\"" + detail::format_number("%.2f", x) + "\" y1=\"" + std::to_string(axis_y) +
           "\" x2=\"" + detail::format_number("%.2f", x) + "\" y2=\"" + std::to_string(axis_y + 4) +
           "\" stroke=\"black\"/><text x=\"" + detail::format_number("%.2f", x) + "\" y=\"" +
           std::to_string(axis_y + 15) + "\" text-anchor=\"middle\">" +
           detail::format_number("%.6g", i * step) + "</text>\n";
  }
  // Legend.
  const int ly = axis_y + 34;
  int lx = left;
  for (K k : {K::forward, K::backward_input, K::backward_weight, K::full_backward,
              K::optimizer_step, K::reduce_gradients, K::send_activation}) {
    const std::string label = k == K::send_activation
                                  ? "transfer"
                                  : std::string(kind_code(k)) + " " + std::string(kind_words(k));
    out += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly - 10) +
           "\" width=\"12\" height=\"12\" fill=\"" + kind_colour(k) + "\"/><text x=\"" +
           std::to_string(lx + 16) + "\" y=\"" + std::to_string(ly) + "\">" + label + "</text>\n";
    lx += 24 + int(label.size()) * 7;
  }
  out += "<text x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly) + "\">(time in " +
         unit_name(t.seconds_per_unit) + "; lighter: a rank's later chunk)</text>\n";
  out += "</svg>\n";
  return out;
}

}  // namespace baton::schedule
