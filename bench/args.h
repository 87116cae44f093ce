// The benchmarks' command-line helpers: integers and the --threads list ("1,2": one run
// per thread count) checked, and main's errors turned into a message and an exit code (2
// for bad input, 1 for any other failure), as the `baton` command does. The benchmarks
// link no tools/ code, so tools/command.h's parse_int_list is not theirs.
#pragma once

#include <charconv>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "memory/error.h"

namespace baton::bench {

// `text` as an integer of at least `min`; InputError naming `what` (the flag or argument)
// otherwise. atoi and stoi had taken "x" as 0, or thrown past main.
inline int parse_int(const std::string& what, const std::string& text, int min) {
  int v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc::result_out_of_range && p == end)
    throw InputError(what + ": expected an integer of at most 2147483647, found " + text);
  if (text.empty() || ec != std::errc() || p != end)
    throw InputError(what + ": expected an integer, found '" + text + "'");
  if (v < min)
    throw InputError(what + ": expected at least " + std::to_string(min) + ", found " + text);
  return v;
}

// "1,2,4" -> {1, 2, 4}, each at least 1 (0 is no thread count here).
inline std::vector<int> thread_counts(const std::string& s, const std::string& what = "--threads") {
  std::vector<int> out;
  size_t from = 0;
  while (true) {
    const size_t comma = s.find(',', from);
    out.push_back(parse_int(what, s.substr(from, comma - from), 1));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

// Runs a benchmark's main: InputError is "<name>: <message>" and exit 2, any other
// exception the same with exit 1 (an uncaught one had aborted with a core dump).
template <class F>
int run_main(const char* name, F&& body) {
  try {
    return body();
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace baton::bench
