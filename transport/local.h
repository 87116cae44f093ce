// The local backend: a world whose ranks are threads of this process, sharing an
// in-process mailbox. Fast to start and exact, for tests and single-process runs.
#pragma once

#include <vector>

#include "transport/communicator.h"
#include "transport/options.h"

namespace baton::transport {

// Returns the world communicators of `size` ranks; element i is rank i's. Hand each to
// its own thread. Destroying one tells the others that rank is gone: their operations
// that involve it fail with PeerError.
std::vector<CommPtr> make_local_world(int size, const CommOptions& options = {});

}  // namespace baton::transport
