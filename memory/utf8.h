// UTF-8 validity, checked in one place: JSON holds only UTF-8 (nlohmann's dump throws on
// anything else), so text baton writes into JSON (paths recorded in manifests, a
// schedule's name in traces) is checked where it comes in.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace baton::memory {

// `text` without a leading byte-order mark (Windows editors write one; JSON parsers skip
// it, where line-oriented readers had taken it as part of the first word).
inline std::string_view skip_utf8_bom(std::string_view text) {
  return text.starts_with("\xEF\xBB\xBF") ? text.substr(3) : text;
}

// The length of the UTF-8 sequence at s[i] (1 to 4), or 0 where none starts (a stray
// continuation, an overlong form, a surrogate, beyond U+10FFFF, cut short).
inline size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf   ? 2
             : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && b(1) < 0xa0) || (c == 0xed && b(1) > 0x9f) || (c == 0xf0 && b(1) < 0x90) ||
      (c == 0xf4 && b(1) > 0x8f))
    return 0;
  return n;
}

// The byte offset of the first byte of `s` that starts no UTF-8 sequence, or npos when
// `s` is valid UTF-8.
inline size_t first_non_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

// `s` with each byte that starts no UTF-8 sequence replaced by U+FFFD, as nlohmann's
// error_handler_t::replace writes it: for a label taken from a path (Linux allows any
// bytes) that goes into JSON.
inline std::string with_utf8_replacements(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (const size_t n = utf8_sequence(s, i)) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

// At most `limit` bytes of `s`, cut before a sequence that would not fit (not inside
// one), with "..." added where anything was cut: for one-line summaries of longer text.
inline std::string utf8_prefix(std::string_view s, size_t limit) {
  if (s.size() <= limit) return std::string(s);
  size_t end = 0;
  while (end < limit) {
    const size_t n = std::max<size_t>(1, utf8_sequence(s, end));
    if (end + n > limit) break;
    end += n;
  }
  return std::string(s.substr(0, end)) + "...";
}

}  // namespace baton::memory
