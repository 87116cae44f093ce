#include "memory/units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "memory/error.h"

namespace baton::memory {

size_t parse_bytes(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  double value = std::strtod(s.c_str(), &end);
  std::string_view suffix(end, s.c_str() + s.size() - end);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  struct Unit {
    std::string_view name;
    double scale;
  };
  static constexpr Unit units[] = {{"", 1},
                                   {"B", 1},
                                   {"KiB", 1024.0},
                                   {"MiB", 1048576.0},
                                   {"GiB", 1073741824.0},
                                   {"TiB", 1099511627776.0},
                                   {"KB", 1e3},
                                   {"MB", 1e6},
                                   {"GB", 1e9},
                                   {"TB", 1e12},
                                   {"K", 1024.0},
                                   {"M", 1048576.0},
                                   {"G", 1073741824.0}};
  if (end == s.c_str() || !std::isfinite(value) || value < 0)
    throw InputError("invalid size '" + s +
                     "': expected a number with an optional unit, e.g. 512MiB");
  for (const Unit& u : units) {
    if (suffix != u.name) continue;
    const double bytes = value * u.scale;
    // 2^63 and more would wrap (llround); a size under one byte would round to 0, which
    // callers read as "unlimited".
    if (bytes >= 0x1p63)
      throw InputError("invalid size '" + s + "': expected at most 2^63 - 1 bytes (8 EiB)");
    if (bytes > 0 && bytes < 1)
      throw InputError("invalid size '" + s + "': expected 0 or at least 1 byte");
    return static_cast<size_t>(std::llround(bytes));
  }
  throw InputError("invalid size '" + s + "': unknown unit '" + std::string(suffix) +
                   "' (expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
}

std::string format_bytes(double bytes) {
  static constexpr const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::fabs(bytes) >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  char buf[48];
  if (i == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, names[i]);
  return buf;
}

}  // namespace baton::memory
