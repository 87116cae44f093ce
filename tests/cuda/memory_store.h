// A rendezvous store in memory, standing in for the TCP store (tested in tests/transport)
// so that the NCCL tests run where UCX and Boost are not built (the GPU check's build).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "memory/error.h"
#include "transport/store.h"

namespace baton::test {

class MemoryStore final : public transport::Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    kv_[key] = value;
    cv_.notify_all();
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return kv_.count(key) > 0; }))
      throw ::baton::RuntimeError("MemoryStore: no key " + key);
    return kv_[key];
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    for (const auto& k : keys) get(k, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard lock(mu_);
    int64_t v = (kv_.count(key) ? std::stoll(kv_[key]) : 0) + delta;
    kv_[key] = std::to_string(v);
    cv_.notify_all();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

}  // namespace baton::test
