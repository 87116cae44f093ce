// Error types shared by every folder. The command line maps InputError (bad user input:
// files, JSON, flags) to exit code 2 and every other exception to exit code 1.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

namespace baton {

// Text as a terminal should show it: control characters (C0, DEL, C1) as \xNN or
// \uNNNN, not sent raw (text read from a file could move the cursor or recolour the
// terminal, and a NUL ends a C string early). `keep_lines` keeps newlines and tabs.
inline std::string printable(std::string_view s, bool keep_lines = false) {
  std::string out;
  out.reserve(s.size());
  char buf[16];
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const auto next = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
    if ((c < 0x20 && !(keep_lines && (c == '\n' || c == '\t'))) || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c == 0xc2 && next >= 0x80 && next <= 0x9f) {  // U+0080 to U+009F
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(next));
      out += buf;
      ++i;
    } else {
      out += char(c);
    }
  }
  return out;
}

// A value echoed in a message, cut to `max` bytes: a 10 MB field or token had made a
// 10 MB message.
inline std::string brief(std::string_view s, size_t max = 60) {
  if (s.size() <= max) return std::string(s);
  size_t cut = max - 3;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8
  return std::string(s.substr(0, cut)) + "... (" + std::to_string(s.size()) + " bytes)";
}

// Something the user gave us is wrong: a file, a JSON field, a flag. The message says
// where (file, JSON path), what was expected and what was found. Messages echo what was
// found, so they are kept printable: a NUL in a token had cut the message short.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(printable(what, true)) {}
  explicit InputError(const char* what) : InputError(std::string(what)) {}
};

// A failure at run time that is not the user's input: a peer died, a device ran out of
// memory, a system call failed.
class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& what) : std::runtime_error(printable(what, true)) {}
  explicit RuntimeError(const char* what) : RuntimeError(std::string(what)) {}
};

// Internal invariant violated: a bug in baton.
#define BATON_CHECK(cond, msg)                                                          \
  do {                                                                                  \
    if (!(cond))                                                                        \
      throw ::std::logic_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": check failed: " #cond ": " + (msg));                  \
  } while (0)

}  // namespace baton
