// The compact text form of a schedule (see schedule_io.h and docs/schedules.md).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <optional>

#include "memory/error.h"
#include "memory/utf8.h"
#include "schedule/detail/util.h"
#include "schedule/schedule_io.h"

namespace baton::schedule {

namespace {

// Splits on whitespace and commas, dropping empty pieces.
std::vector<std::string_view> split_tokens(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  auto sep = [](char c) { return c == ',' || std::isspace(static_cast<unsigned char>(c)); };
  while (i < s.size()) {
    while (i < s.size() && sep(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !sep(s[j])) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

int parse_int(std::string_view text, const std::string& where, const std::string& what) {
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size())
    throw InputError(where + ": " + what + ": expected an integer, found '" + std::string(text) +
                     "'");
  return v;
}

// "rank 3" or "3" before a ':'; nullopt when `head` is not a rank prefix.
std::optional<std::string_view> rank_prefix(std::string_view head) {
  head = detail::trim(head);
  if (head.substr(0, 4) == "rank") head = detail::trim(head.substr(4));
  if (head.empty() || !std::all_of(head.begin(), head.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      }))
    return std::nullopt;
  return head;
}

}  // namespace

std::string to_text(const Schedule& s) {
  // The text form has no peers (they come from the placement): a peer given otherwise
  // (kept for the validator to report) had been dropped, the schedule read back valid.
  for (size_t r = 0; r < s.ranks.size(); ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      const int from_placement = transfer_peer(s, a);
      if (a.peer >= 0 && a.peer != from_placement)
        throw InputError("rank " + std::to_string(r) + ", action " + std::to_string(i) + " (" +
                         to_token(a) + "): peer " + std::to_string(a.peer) +
                         ", which the text form cannot hold (its peers come from the placement: " +
                         std::to_string(from_placement) + "); save it as JSON");
    }
  std::string out = "# baton schedule, text form: one line per rank (docs/schedules.md)\n";
  if (!s.name.empty()) {
    std::string name = s.name;
    std::replace(name.begin(), name.end(), '\n', ' ');
    out += "name: " + name + "\n";
  }
  out += "ranks: " + std::to_string(s.num_ranks) + "\n";
  out += "micro_batches: " + std::to_string(s.num_micro_batches) + "\n";
  if (s.num_directions != 1) out += "directions: " + std::to_string(s.num_directions) + "\n";
  out += "placement:";
  for (int r : s.placement) out += " " + std::to_string(r);
  out += "\n";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out += std::to_string(r) + ":";
    const auto& list = s.ranks[r];
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].overlap && i + 1 < list.size()) {
        out += " " + composite_token(list[i], list[i + 1]);
        ++i;
      } else {
        out += " " + to_token(list[i]);
      }
    }
    out += "\n";
  }
  return out;
}

Schedule parse_text(std::string_view text, const std::string& source) {
  text = memory::skip_utf8_bom(text);
  Schedule s;
  std::optional<int> ranks, micro_batches, directions;
  bool have_placement = false, have_name = false;
  std::map<std::string, std::string> fields;  // header field -> its line ("s.txt:3")
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    const std::string where = source + ":" + std::to_string(line_no);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t colon = line.find(':');
    std::string_view key =
        colon == std::string_view::npos ? std::string_view() : detail::trim(line.substr(0, colon));
    if (key == "name") {  // the rest of the line verbatim: names may hold '#'
      if (!s.ranks.empty()) throw InputError(where + ": header line 'name:' after the rank lines");
      if (have_name) throw InputError(where + ": name given twice");
      have_name = true;
      std::string_view rest = line.substr(colon + 1);  // verbatim after "name: "
      if (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      // The name goes into JSON (traces, summaries, the JSON form), which holds only UTF-8:
      // refused here rather than by the first JSON writer, after the run.
      if (const size_t bad = memory::first_non_utf8(rest); bad != std::string_view::npos) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(rest[bad]));
        throw InputError(where + ": name: not valid UTF-8 (byte " + hex + " at byte offset " +
                         std::to_string(size_t(rest.data() - line.data()) + bad) +
                         " of the line); the name is written into JSON, which holds only UTF-8");
      }
      s.name = std::string(rest);
      check_name(s.name, where + ": name");
      continue;
    }
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = detail::trim(line);
    if (line.empty()) continue;
    colon = line.find(':');
    key =
        colon == std::string_view::npos ? std::string_view() : detail::trim(line.substr(0, colon));
    std::string_view rest = colon == std::string_view::npos ? line : line.substr(colon + 1);

    if (key == "ranks" || key == "micro_batches" || key == "micro-batches" || key == "directions" ||
        key == "placement") {
      if (!s.ranks.empty())
        throw InputError(where + ": header line '" + std::string(key) + ":' after the rank lines");
      auto values = split_tokens(rest);
      fields[key == "micro-batches" ? "micro_batches" : std::string(key)] = where;
      if (key == "placement") {
        if (have_placement) throw InputError(where + ": placement given twice");
        have_placement = true;
        for (size_t i = 0; i < values.size(); ++i)
          s.placement.push_back(
              parse_int(values[i], where, "placement[" + std::to_string(i) + "]"));
        continue;
      }
      if (values.size() != 1)
        throw InputError(where + ": " + std::string(key) + ": expected one integer, found " +
                         std::to_string(values.size()) + " values");
      int v = parse_int(values[0], where, std::string(key));
      auto& slot = key == "ranks" ? ranks : key == "directions" ? directions : micro_batches;
      if (slot) throw InputError(where + ": " + std::string(key) + " given twice");
      slot = v;
      continue;
    }
    if (!key.empty()) {
      auto prefix = rank_prefix(key);
      if (!prefix)
        throw InputError(where + ": unknown header '" + brief(key) +
                         ":' (expected name, ranks, micro_batches, directions, placement, or a "
                         "rank line 'r: actions')");
      const std::optional<int64_t> r = detail::parse_index(*prefix);  // digits: rank_prefix
      if (*r > detail::kMaxIndex)
        throw InputError(where + ": " + detail::too_large("rank", *prefix));
      if (*r != static_cast<int64_t>(s.ranks.size()))
        throw InputError(where + ": expected the line of rank " + std::to_string(s.ranks.size()) +
                         ", found rank " + std::to_string(*r) + " (rank lines go in order from 0)");
    }
    auto tokens = split_tokens(rest);
    std::vector<Action> list;
    list.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string at = where + " (rank " + std::to_string(s.ranks.size()) + ", action " +
                             std::to_string(list.size()) + ")";
      if (!tokens[i].empty() && tokens[i].front() == '(') {
        // A composite "(0F7;7BW3)": the forward, overlapped with the backward after it.
        auto [f, b] = parse_composite(tokens[i], at);
        list.push_back(f);
        list.push_back(b);
        continue;
      }
      list.push_back(parse_token(tokens[i], at));
    }
    s.ranks.push_back(std::move(list));
  }

  const std::string& where = source;
  if (s.ranks.empty())
    throw InputError(where + ": no rank lines (expected one line of actions per rank)");
  s.num_ranks = ranks.value_or(static_cast<int>(s.ranks.size()));
  if (s.num_ranks != static_cast<int>(s.ranks.size()))
    throw InputError(fields.at("ranks") + ": ranks: " + std::to_string(s.num_ranks) + " but " +
                     std::to_string(s.ranks.size()) + " rank lines");
  s.num_directions = directions.value_or(1);
  int max_stage = -1, max_mb = -1;
  for (const auto& list : s.ranks)
    for (const Action& a : list) {
      max_stage = std::max(max_stage, a.stage);
      max_mb = std::max(max_mb, a.micro_batch);
    }
  if (!have_placement) {
    // Stage s on rank s % p over the smallest multiple of p that covers every stage named.
    int p = std::max(s.num_ranks, 1), v = std::max(1, (max_stage + p) / p);
    s.placement = loop_placement(p, v);
  }
  if (micro_batches) {
    s.num_micro_batches = *micro_batches;
  } else {
    int d = std::max(1, s.num_directions);
    s.num_micro_batches = std::max(1, (max_mb + d) / d * d);
  }
  check_header(s, where, fields);
  assign_peers(s);
  return s;
}

}  // namespace baton::schedule
