// Byte sizes as people write them: "512MiB", "4GiB", "1.5GB", "4096".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace baton::memory {

// Parses a size; binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) suffixes, a
// bare number is bytes. Throws InputError naming the text, also for 2^63 bytes or more
// and for sizes between 0 and 1 byte (0 itself is a size: callers read it as unlimited).
size_t parse_bytes(std::string_view text);
// 1536 -> "1.50 KiB"; used in messages and tables.
std::string format_bytes(double bytes);

}  // namespace baton::memory
