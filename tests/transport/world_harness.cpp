#include "tests/transport/world_harness.h"

#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "transport/local.h"
#include "transport/store.h"
#include "transport/ucx.h"

namespace baton::transport::testing {

std::string backend_name(Backend b) {
  return b == Backend::local ? "local" : "ucx";
}

CommOptions test_options() {
  CommOptions o;
  o.peer_timeout = std::chrono::milliseconds(2000);
  o.spin = std::chrono::microseconds(20);
  return o;
}

void run_world(Backend b, int n, const std::function<void(Communicator&)>& fn,
               const CommOptions& options, bool leave_together) {
  std::mutex mu;
  std::exception_ptr first;
  std::string where;
  auto record = [&](int r) {
    std::lock_guard lock(mu);
    if (!first) {
      first = std::current_exception();
      where = "rank " + std::to_string(r);
    }
  };
  std::vector<std::thread> threads;
  if (b == Backend::local) {
    auto world = make_local_world(n, options);
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(*world[size_t(r)]);
        } catch (...) {
          record(r);
        }
      });
    for (auto& t : threads) t.join();
  } else {
    StoreServer server("127.0.0.1", 0, "test-token");
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), "test-token");
          CommPtr comm = make_ucx_world(r, n, store, options);
          fn(*comm);
          // Leave together, so that no rank's exit looks like a failure to a rank
          // still finishing.
          if (leave_together) comm->barrier()->wait();
        } catch (...) {
          record(r);
        }
      });
    for (auto& t : threads) t.join();
  }
  if (first) {
    try {
      std::rethrow_exception(first);
    } catch (const std::exception& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
  }
}

}  // namespace baton::transport::testing
