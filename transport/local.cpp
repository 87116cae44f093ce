#include "transport/local.h"

#include <numeric>

#include "transport/detail/collectives.h"
#include "transport/detail/group_comm.h"
#include "transport/detail/local_fabric.h"
#include "transport/detail/tag.h"

namespace baton::transport {

std::vector<CommPtr> make_local_world(int size, const CommOptions& options) {
  // A bad tunable is the caller's InputError here, not the first collective's failure.
  detail::AlgoTuning::get();
  auto hub = std::make_shared<detail::LocalHub>(size);
  std::vector<int> all(static_cast<size_t>(size));
  std::iota(all.begin(), all.end(), 0);
  std::vector<CommPtr> world;
  for (int r = 0; r < size; ++r) {
    auto fabric = std::make_shared<detail::LocalFabric>(hub, r, options);
    world.push_back(std::make_shared<detail::GroupComm>(fabric, detail::kWorldContext, all));
  }
  return world;
}

}  // namespace baton::transport
