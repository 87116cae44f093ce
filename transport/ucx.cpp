#include "transport/ucx.h"

#include <numeric>

#include "memory/error.h"
#include "transport/detail/collectives.h"
#include "transport/detail/group_comm.h"
#include "transport/detail/tag.h"
#ifdef BATON_HAVE_UCX
#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>

#include "transport/detail/ucx_fabric.h"
#endif

namespace baton::transport {

void release_ucx_debug_signal() {
#ifdef BATON_HAVE_UCX
  if (ucs_global_opts.debug_signo > 0) ucs_debug_disable_signal(int(ucs_global_opts.debug_signo));
#endif
}

CommPtr make_ucx_world(int rank, int size, const std::shared_ptr<Store>& store,
                       const CommOptions& options, const std::string& prefix) {
  HostLabels hosts;
  return make_ucx_world(rank, size, store, options, prefix, hosts);
}

CommPtr make_ucx_world(int rank, int size, const std::shared_ptr<Store>& store,
                       const CommOptions& options, const std::string& prefix, HostLabels& hosts) {
#ifndef BATON_HAVE_UCX
  (void)rank, (void)size, (void)store, (void)options, (void)prefix, (void)hosts;
  throw RuntimeError("this build has no UCX backend (ThreadSanitizer builds leave it out)");
#else
  // A bad tunable is the caller's InputError here, before connecting, not the first
  // collective's failure on the background thread.
  detail::AlgoTuning::get();
  auto fabric =
      std::make_shared<detail::UcxFabric>(rank, size, *store, prefix, options, hosts.mine);
  hosts.of.clear();
  for (int r = 0; r < size; ++r) hosts.of.push_back(fabric->host_of(r));
  std::vector<int> all(static_cast<size_t>(size));
  std::iota(all.begin(), all.end(), 0);
  return std::make_shared<detail::GroupComm>(fabric, detail::kWorldContext, std::move(all));
#endif
}

}  // namespace baton::transport
