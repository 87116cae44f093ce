#include "transport/detail/nccl_rendezvous.h"

#include <stdexcept>

namespace baton::transport::detail {

std::string nccl_init_key(Store& store, const std::string& key, int size) {
  if (size < 1) throw std::logic_error("nccl_init_key: a group of " + std::to_string(size));
  const int64_t arrivals = store.add(key + "/arrivals", 1);
  return key + "/" + std::to_string((arrivals - 1) / size);
}

void mark_joined(Store& store, const std::string& init_key, int rank) {
  store.set(init_key + "/joined/" + std::to_string(rank), "1");
}

std::vector<int> missing_ranks(Store& store, const std::string& init_key, int size) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    try {
      (void)store.get(init_key + "/joined/" + std::to_string(r), std::chrono::milliseconds(1));
    } catch (const std::exception&) {
      missing.push_back(r);
    }
  }
  return missing;
}

std::string describe_missing(const std::vector<int>& missing, const std::vector<int>& global) {
  if (missing.empty())
    return "every rank reached the rendezvous, so NCCL's own connection set-up hung";
  std::string ranks, globals;
  for (size_t i = 0; i < missing.size(); ++i) {
    const int r = missing[i];
    ranks += (i ? ", " : "") + std::to_string(r);
    globals += (i ? ", " : "") + std::to_string(size_t(r) < global.size() ? global[size_t(r)] : r);
  }
  return std::string(missing.size() == 1 ? "rank " : "ranks ") + ranks + " (global " + globals +
         ") never joined";
}

}  // namespace baton::transport::detail
