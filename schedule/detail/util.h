// Small helpers shared by schedule/'s own sources (not part of its interface).
#pragma once

#include <cctype>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// An integer in an error message.
inline std::string str(long v) {
  return std::to_string(v);
}

// One number through a printf format (the reports' fixed-precision figures).
inline std::string format_number(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace baton::schedule::detail
