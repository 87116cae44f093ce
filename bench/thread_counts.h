// The benchmarks' --threads flag ("1,2": one run per thread count). The benchmarks link no
// tools/ code, so tools/command.h's parse_int_list (with its InputError) is not theirs.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace baton::bench {

// "1,2,4" -> {1, 2, 4}; std::stoi throws on an item that is no integer.
inline std::vector<int> thread_counts(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace baton::bench
