// Byte sizes as people write them: "512MiB", "4GiB", "1.5GB", "4096".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace baton::memory {

// Parses a size: a plain number (digits, an optional fraction and exponent; no sign, hex or
// leading space), then an optional unit: binary KiB, MiB, GiB, TiB (or K, M, G, T), decimal
// KB, MB, GB, TB; none (or B) is bytes. Integers are exact. Throws InputError naming the
// text, also for 2^63 bytes or more and for a nonzero size under 1 byte (only a literal 0
// is 0, which callers read as unlimited).
size_t parse_bytes(std::string_view text);
// 1536 -> "1.50 KiB"; used in messages and tables.
std::string format_bytes(double bytes);

}  // namespace baton::memory
