// Rendezvous: a small key-value store the ranks of a job meet at (gloo's idea). Ranks
// publish what the others need (UCX worker addresses, later NCCL ids) and wait for it.
// TcpStore is the client, StoreServer the server (Boost.Asio, one thread); the wire
// protocol is in detail/store_protocol.h and docs/transport.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace baton::transport {

using std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  // Values are bytes. A key once set may be set again (the last value wins).
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of key, waiting up to `timeout` for someone to set it; throws
  // RuntimeError naming the key when the time runs out.
  virtual std::string get(const std::string& key, milliseconds timeout) = 0;
  // Waits until every key is set; throws RuntimeError naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, milliseconds timeout) = 0;
  // Adds delta to the integer counter at key (absent: 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // The IP address this process reaches the store from (empty: not known): the address
  // the ranks of other hosts can most likely reach it at too.
  virtual std::string local_address() const { return {}; }
};

// Who a client is when it is a rank of a world (init_world's connection): the server
// registers it, and fails the whole rendezvous for every rank when a rank registers
// twice, when world sizes differ, or when a rank presents another job token. The
// variables the numbers came from and the host label are for the messages. Once every
// rank of the world has registered, such a late hello is refused alone (the job runs on).
struct StoreMember {
  int rank = -1;  // -1: a plain client, not registered
  std::string rank_from;
  int size = 0;
  std::string size_from;
  std::string host;
};

// The client. Connects (retrying until connect_timeout, since the server may start
// after the client) and introduces itself with the job token (and, for a rank, as
// `member`); a server that refuses the token makes the constructor throw. Once the
// server says the rendezvous failed, every call throws that failure: an InputError when
// it was bad input (a rank twice, world sizes that differ, another job's token), else a
// RuntimeError. Safe to share between threads.
class TcpStore final : public Store {
 public:
  TcpStore(const std::string& host, uint16_t port, const std::string& token,
           milliseconds connect_timeout = milliseconds(30'000), const StoreMember& member = {});
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string local_address() const override;

  struct Impl;

 private:
  std::string call(const std::string& request, milliseconds timeout);
  std::unique_ptr<Impl> impl_;
  std::mutex mu_;
};

// The server: listens on bind_host:port (port 0 picks a free one) and serves until
// destroyed; a port already in use is a RuntimeError naming it. Connections must present
// `token` first, within `hello_timeout`; others are refused and closed. One thread
// serves every connection without blocking, so a client that stalls holds up no one.
class StoreServer {
 public:
  StoreServer(const std::string& bind_host, uint16_t port, const std::string& token,
              milliseconds hello_timeout = milliseconds(10'000));
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  size_t refused() const;  // connections refused so far (bad token, bad message, silent)
  // Fails the rendezvous for every client: waiting requests, later ones and later hellos
  // are answered with `message` (a runtime failure, or bad input when `input`), so that
  // ranks waiting here learn why the host gives up instead of reading an end of file.
  // Returns once the answers are written (at most about a second); the first failure
  // stays.
  void fail(const std::string& message, bool input);
  // Whether the rendezvous has failed (by fail() or by what a client sent): bad input or
  // not, and the message every client is told.
  std::optional<std::pair<bool, std::string>> failure() const;
  // The value at key now, if set (the launcher reads the job's progress this way).
  std::optional<std::string> peek(const std::string& key) const;
  // The ranks that have said who they are (a hello with their rank) so far.
  std::set<int> registered() const;
  // The ranks whose hello came, admitted or answered with the failure or refused: after a
  // failure, the ranks told why.
  std::set<int> heard_from() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A fresh random token (32 hex digits) for a job.
std::string make_job_token();

}  // namespace baton::transport
