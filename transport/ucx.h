// The UCX backend: ranks are processes (on one host or many) that talk through UCX's
// tag interface; they meet at a Store to exchange worker addresses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/communicator.h"
#include "transport/options.h"
#include "transport/store.h"

namespace baton::transport {

// This process's world communicator: rank `rank` of `size`. Every rank calls it with
// the same store and prefix (keys go under "<prefix>/ucx/"); it returns once every
// rank's address is known. Threads of one process may each build their own (tests do).
CommPtr make_ucx_world(int rank, int size, const std::shared_ptr<Store>& store,
                       const CommOptions& options = CommOptions::from_env(),
                       const std::string& prefix = "baton");

// Where the ranks of a UCX world run, for messages and failure reports: `mine` names this
// rank's host to its peers (empty: the host name); make_ucx_world fills `of` with every
// rank's, as each announced it.
struct HostLabels {
  std::string mine;
  std::vector<std::string> of;
};
CommPtr make_ucx_world(int rank, int size, const std::shared_ptr<Store>& store,
                       const CommOptions& options, const std::string& prefix, HostLabels& hosts);

// UCX handles its debug signal (UCX_DEBUG_SIGNO, SIGHUP by default) from the moment its
// library loads: a hangup was swallowed (a job outlived its terminal) and repeated ones
// corrupted the heap (the handler is not async-signal-safe). This gives the signal back
// its earlier disposition: the default (the process ends), or nohup's (ignored). `baton`
// and the Python module call it first; a no-op without UCX.
void release_ucx_debug_signal();

}  // namespace baton::transport
