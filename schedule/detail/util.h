// Small helpers shared by schedule/'s own sources (not part of its interface).
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memory/error.h"
#include "schedule/schedule.h"

namespace baton::schedule::detail {

// A generator's starting point: p ranks with empty action lists.
inline Schedule skeleton(const std::string& name, int p, int m, std::vector<int> placement,
                         int directions = 1) {
  Schedule s;
  s.name = name;
  s.num_ranks = p;
  s.num_micro_batches = m;
  s.num_directions = directions;
  s.placement = std::move(placement);
  s.ranks.resize(size_t(p));
  return s;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// True when `path` ends in `ext` (".csv"), in any case: x.CSV is a CSV as x.csv is.
inline bool has_extension(std::string_view path, std::string_view ext) {
  if (path.size() < ext.size()) return false;
  const std::string_view tail = path.substr(path.size() - ext.size());
  for (size_t i = 0; i < ext.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(tail[i])) !=
        std::tolower(static_cast<unsigned char>(ext[i])))
      return false;
  return true;
}

// An integer in an error message.
inline std::string str(long v) {
  return std::to_string(v);
}

// One number through a printf format (the reports' fixed-precision figures), whole:
// "%.6f" of the largest double is 316 characters, and a fixed buffer had cut it short.
inline std::string format_number(const char* format, double v) {
  const int n = std::snprintf(nullptr, 0, format, v);
  if (n <= 0) return {};
  std::string out(size_t(n), '\0');
  std::snprintf(out.data(), out.size() + 1, format, v);  // its '\0' lands on out's own
  return out;
}

// A number in an error message: the shortest text that reads back as it, as fmt's "{}"
// writes it (-1, 0.5, nan; std::to_string's %f had printed -1.000000 and 1e-9 as 0.000000).
inline std::string number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// The largest stage or micro-batch number a token takes: the JSON form's bound.
inline constexpr int64_t kMaxIndex = int64_t(1) << 30;

// The non-negative decimal integer that fills `text`, or nullopt when it is none; one
// beyond kMaxIndex reads as kMaxIndex + 1, for the caller to call too large.
inline std::optional<int64_t> parse_index(std::string_view text) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      }))
    return std::nullopt;
  const size_t first = std::min(text.find_first_not_of('0'), text.size() - 1);
  if (text.size() - first > 10) return kMaxIndex + 1;  // 2^30 has 10 digits
  int64_t v = 0;
  std::from_chars(text.data() + first, text.data() + text.size(), v);
  return std::min(v, kMaxIndex + 1);
}

inline std::string too_large(std::string_view what, std::string_view text) {
  return "the " + std::string(what) + " number " + brief(text) + " is too large (at most " +
         std::to_string(kMaxIndex) + ")";
}

}  // namespace baton::schedule::detail
