#include "transport/options.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "memory/error.h"

namespace baton::transport {

namespace {

double env_number(const char* name, double fallback, double lo, double hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  // strtod also reads hexadecimal ("0x10" had been 16 s) and leading blanks.
  const bool decimal = std::string(v).find_first_of("xX \t\n") == std::string::npos;
  if (!decimal || end == v || *end != '\0' || !std::isfinite(x) || x < lo || x > hi)
    throw InputError(std::string(name) + "='" + v + "': expected a number from " +
                     fmt::format("{} to {}", lo, hi));
  return x;
}

}  // namespace

bool env_is_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

CommOptions CommOptions::from_env() {
  CommOptions o;
  double secs =
      env_number("BATON_PEER_TIMEOUT", double(o.peer_timeout.count()) / 1000.0, 0.05, 86400);
  o.peer_timeout = std::chrono::milliseconds(int64_t(secs * 1000.0));
  double connect =
      env_number("BATON_CONNECT_TIMEOUT", double(o.connect_timeout.count()) / 1000.0, 0.1, 86400);
  o.connect_timeout = std::chrono::milliseconds(int64_t(connect * 1000.0));
  double stall =
      env_number("BATON_STALL_TIMEOUT", double(o.stall_timeout.count()) / 1000.0, 0, 1e7);
  // Kept in whole milliseconds, where 0 is "forever": a shorter one had become that.
  if (stall > 0 && stall < 0.001)
    throw InputError("BATON_STALL_TIMEOUT='" + std::string(std::getenv("BATON_STALL_TIMEOUT")) +
                     "': expected 0 (no limit) or at least 0.001 s");
  o.stall_timeout = std::chrono::milliseconds(int64_t(stall * 1000.0));
  double spin = env_number("BATON_SPIN_US", double(o.spin.count()), 0, 1e6);
  o.spin = std::chrono::microseconds(int64_t(spin));
  return o;
}

}  // namespace baton::transport
