#include "memory/units.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "memory/error.h"

namespace baton::memory {

namespace {

struct Unit {
  std::string_view name;
  uint64_t scale;
};
// K, M, G and T are the binary units' short forms (as `ls -h` and `free -h` print them).
constexpr Unit kUnits[] = {{"", 1},
                           {"B", 1},
                           {"KiB", uint64_t(1) << 10},
                           {"MiB", uint64_t(1) << 20},
                           {"GiB", uint64_t(1) << 30},
                           {"TiB", uint64_t(1) << 40},
                           {"K", uint64_t(1) << 10},
                           {"M", uint64_t(1) << 20},
                           {"G", uint64_t(1) << 30},
                           {"T", uint64_t(1) << 40},
                           {"KB", 1000},
                           {"MB", 1000 * 1000},
                           {"GB", 1000 * 1000 * 1000},
                           {"TB", uint64_t(1000) * 1000 * 1000 * 1000}};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

size_t parse_bytes(std::string_view text) {
  const std::string s(text);
  const auto invalid = [&](const std::string& why) {
    return InputError("invalid size '" + brief(s) + "': " + why);
  };
  // The number is scanned here, not by strtod, which also takes leading spaces, a sign,
  // hex, inf and nan: digits, an optional fraction, an optional exponent.
  size_t i = 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && is_digit(s[i])) ++i;
    return i - from;
  };
  size_t mantissa_digits = digits();
  bool plain_integer = true;
  if (i < s.size() && s[i] == '.') {
    ++i;
    mantissa_digits += digits();
    plain_integer = false;
  }
  if (mantissa_digits == 0) throw invalid("expected a number with an optional unit, e.g. 512MiB");
  const bool literal_zero =
      std::all_of(s.begin(), s.begin() + long(i), [](char c) { return c == '0' || c == '.'; });
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (j < s.size() && is_digit(s[j])) {  // else "1EiB": a unit, not an exponent
      i = j;
      digits();
      plain_integer = false;
    }
  }
  const std::string number = s.substr(0, i);
  std::string_view suffix = std::string_view(s).substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  const Unit* unit = nullptr;
  for (const Unit& u : kUnits)
    if (suffix == u.name) unit = &u;
  if (!unit)
    throw invalid("unknown unit '" + std::string(suffix) +
                  "' (expected B; KiB, MiB, GiB, TiB or K, M, G, T: powers of 1024; KB, MB, GB, "
                  "TB: powers of 1000)");
  // 2^63 and more do not fit the int64 sizes callers keep.
  const std::string too_big = "expected at most 2^63 - 1 bytes (8 EiB)";
  if (plain_integer) {
    // Exact: a double has rounded 2^63 - 1 up to 2^63.
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || value > uint64_t(INT64_MAX) / unit->scale) throw invalid(too_big);
    return size_t(value * unit->scale);
  }
  const double bytes = std::strtod(number.c_str(), nullptr) * double(unit->scale);
  if (!std::isfinite(bytes) || bytes >= 0x1p63) throw invalid(too_big);
  // Only a literal 0 means 0 (unlimited to callers): a size under one byte, or one whose
  // exponent underflowed to 0 (1e-400), is refused.
  if (!literal_zero && bytes < 1) throw invalid("expected 0 or at least 1 byte");
  return size_t(std::llround(bytes));
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
