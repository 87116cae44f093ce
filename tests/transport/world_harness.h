// Test harness: runs a function on every rank of a world, one thread per rank, for the
// local backend and for UCX (each thread its own UCX worker, rendezvous over a loopback
// store), and rethrows the first failure.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "transport/communicator.h"
#include "transport/options.h"

namespace baton::transport::testing {

enum class Backend { local, ucx };
std::string backend_name(Backend b);

// The backends a test runs on: under ThreadSanitizer only the local one (UCX's threads
// and shared memory are not instrumented, so TSan would report races that are not).
inline std::vector<Backend> tested_backends() {
#if defined(__SANITIZE_THREAD__)
  return {Backend::local};
#else
  return {Backend::local, Backend::ucx};
#endif
}

CommOptions test_options();  // a short peer timeout (2 s) so that failures show fast

// Runs fn(comm) on n threads; throws the first exception a rank threw (naming the rank).
// The UCX ranks leave together (a barrier) unless `leave_together` is false: a world in
// which a rank was declared failed cannot meet again.
void run_world(Backend b, int n, const std::function<void(Communicator&)>& fn,
               const CommOptions& options = test_options(), bool leave_together = true);

// Deterministic small integers: sums over up to 64 ranks stay exact in every dtype.
inline double test_value(int rank, int64_t i, uint32_t seed) {
  return double(int64_t((uint64_t(i) * 7 + uint64_t(rank) * 13 + seed) % 17) - 8);
}

}  // namespace baton::transport::testing
