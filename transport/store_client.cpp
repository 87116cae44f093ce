// The rendezvous client: blocking calls over Boost.Asio with a deadline on each.
#include <algorithm>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "transport/detail/asio.h"
#include "transport/detail/store_protocol.h"
#include "transport/store.h"

namespace baton::transport {

namespace asio = boost::asio;
using asio::ip::tcp;
namespace proto = detail::store;

struct TcpStore::Impl {
  asio::io_context io;
  tcp::socket socket{io};
  std::string where;  // host:port, for messages
  // The rendezvous's failure once the server said it (thrown again by every call).
  std::optional<std::pair<bool, std::string>> failure;  // input?, message
};

namespace {

// Runs the io_context until `done` or the deadline; on a timeout the socket is closed
// and RuntimeError thrown.
void run_until(TcpStore::Impl& s, const bool& done, std::chrono::milliseconds timeout,
               const std::string& what) {
  s.io.restart();
  s.io.run_for(timeout);
  if (!done) {
    boost::system::error_code ignored;
    s.socket.close(ignored);
    s.io.restart();
    s.io.poll();  // let the aborted handlers run
    throw RuntimeError("rendezvous at " + s.where + ": " + what + " timed out after " +
                       std::to_string(timeout.count()) + " ms");
  }
}

// Keys and values the server would refuse are refused here, with the numbers.
void check_key(const std::string& where, const std::string& key) {
  if (key.size() > proto::kMaxKey)
    throw RuntimeError("rendezvous at " + where + ": a key of " + std::to_string(key.size()) +
                       " bytes; keys are at most " + std::to_string(proto::kMaxKey));
}

// Connects s.socket to one of `endpoints` by the deadline. The server may not be up yet
// (under mpirun, rank 0 starts it): a refused attempt is tried again after 50 ms. The
// network may not be either (a link cut that is coming back, a host still starting): an
// attempt that hears nothing is not left to TCP's backoff alone, which sends its SYN
// again after 1, 2, 4, 8 ... s, so a link that returned would wait seconds for the next
// one; a fresh attempt starts every 500 ms beside the earlier ones (at most 8 at once),
// so a link that comes back is used within half a second, and a slow link's handshake,
// longer than that, still completes in the attempt that started it.
void connect_retrying(TcpStore::Impl& s, const tcp::resolver::results_type& endpoints,
                      std::chrono::steady_clock::time_point deadline, milliseconds timeout) {
  constexpr auto kAgain = milliseconds(50), kBeside = milliseconds(500);
  constexpr size_t kMaxAttempts = 8;
  // A socket lives until its connect's handler has run: asio's connect operation still
  // reads the socket when it completes, even when aborted by a close.
  struct Attempt {
    explicit Attempt(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    bool finished = false;
  };
  std::vector<std::unique_ptr<Attempt>> attempts;
  asio::steady_timer next(s.io);
  bool connected = false;
  boost::system::error_code last = asio::error::timed_out;
  std::function<void()> attempt;
  auto schedule = [&](milliseconds after) {
    next.expires_after(after);  // cancels the wait pending, if any
    next.async_wait([&](boost::system::error_code ec) {
      if (!ec && !connected) attempt();
    });
  };
  attempt = [&] {
    std::erase_if(attempts, [](const auto& a) { return a->finished; });
    if (attempts.size() == kMaxAttempts) {
      boost::system::error_code ignored;
      attempts.front()->socket.close(ignored);  // its handler runs, aborted, and finishes it
    }
    attempts.push_back(std::make_unique<Attempt>(s.io));
    Attempt* a = attempts.back().get();
    asio::async_connect(a->socket, endpoints,
                        [&, a](boost::system::error_code ec, const tcp::endpoint&) {
                          a->finished = true;
                          if (connected || ec == asio::error::operation_aborted) return;
                          if (!ec) {
                            connected = true;
                            s.socket = std::move(a->socket);
                            next.cancel();
                            return;
                          }
                          last = ec;
                          // Refused or unreachable at once: again soon, and this attempt
                          // is over.
                          if (next.expiry() - std::chrono::steady_clock::now() > kAgain)
                            schedule(kAgain);
                        });
    schedule(kBeside);
  };
  attempt();
  s.io.restart();
  while (!connected && std::chrono::steady_clock::now() < deadline) s.io.run_one_until(deadline);
  next.cancel();
  for (auto& a : attempts) {  // closes the others; their handlers run below, and do nothing
    boost::system::error_code ignored;
    if (!a->finished) a->socket.close(ignored);
  }
  s.io.restart();
  while (std::any_of(attempts.begin(), attempts.end(), [](const auto& a) { return !a->finished; }))
    if (s.io.run_one() == 0) break;
  s.io.restart();
  s.io.poll();
  attempts.clear();
  if (!connected)
    throw RuntimeError("rendezvous: cannot connect to " + s.where + " within " +
                       std::to_string(timeout.count()) + " ms: " + last.message());
}

}  // namespace

TcpStore::TcpStore(const std::string& host, uint16_t port, const std::string& token,
                   milliseconds connect_timeout, const StoreMember& member)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = host + ":" + std::to_string(port);
  auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  tcp::resolver resolver(impl_->io);
  boost::system::error_code ec;
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) throw InputError("rendezvous: cannot resolve '" + host + "': " + ec.message());
  connect_retrying(*impl_, endpoints, deadline, connect_timeout);
  impl_->socket.set_option(tcp::no_delay(true), ec);
  call(proto::hello_frame(token, member), milliseconds(10'000));
}

std::string TcpStore::local_address() const {
  boost::system::error_code ec;
  auto at = impl_->socket.local_endpoint(ec);
  return ec ? std::string() : at.address().to_string();
}

TcpStore::~TcpStore() {
  boost::system::error_code ignored;
  impl_->socket.close(ignored);
}

std::string TcpStore::call(const std::string& request, milliseconds timeout) {
  Impl& s = *impl_;
  auto fail = [&s] {
    const std::string m = "rendezvous at " + s.where + ": " + s.failure->second;
    if (s.failure->first) throw InputError(m);
    throw RuntimeError(m);
  };
  if (s.failure) fail();
  if (!s.socket.is_open()) throw RuntimeError("rendezvous at " + s.where + ": connection closed");
  bool done = false;
  boost::system::error_code error;
  std::array<char, 4> header{};
  std::string body;
  asio::async_write(s.socket, asio::buffer(request), [&](boost::system::error_code ec, size_t) {
    if (ec) {
      error = ec;
      done = true;
      return;
    }
    asio::async_read(s.socket, asio::buffer(header), [&](boost::system::error_code ec2, size_t) {
      if (ec2) {
        error = ec2;
        done = true;
        return;
      }
      uint32_t n = proto::frame_length(header.data());
      if (n == 0 || n > proto::kMaxFrame) {
        error = asio::error::message_size;
        done = true;
        return;
      }
      body.resize(n);
      asio::async_read(s.socket, asio::buffer(body), [&](boost::system::error_code ec3, size_t) {
        error = ec3;
        done = true;
      });
    });
  });
  run_until(s, done, timeout, "a request");
  if (error) {
    boost::system::error_code ignored;
    s.socket.close(ignored);
    throw RuntimeError("rendezvous at " + s.where + ": " + error.message());
  }
  proto::Reader in(body);
  uint8_t op = in.op();
  if (op == proto::kError) throw RuntimeError("rendezvous at " + s.where + ": " + in.str());
  if (op == proto::kFailed) {
    const bool input = in.u8() != 0;
    s.failure.emplace(input, in.str());
    boost::system::error_code ignored;
    s.socket.close(ignored);  // the server closes it too
    fail();
  }
  if (op != proto::kOk) throw RuntimeError("rendezvous at " + s.where + ": unexpected reply");
  return body.substr(1);
}

void TcpStore::set(const std::string& key, const std::string& value) {
  check_key(impl_->where, key);
  if (value.size() > proto::kMaxFrame - proto::kMaxKey - 16)
    throw RuntimeError("rendezvous at " + impl_->where + ": the value for key '" +
                       key.substr(0, 200) + "' is " + std::to_string(value.size()) +
                       " bytes; values are at most " +
                       std::to_string(proto::kMaxFrame - proto::kMaxKey - 16));
  std::lock_guard lock(mu_);
  call(proto::Writer(proto::kSet).str(key).str(value).frame(), milliseconds(30'000));
}

std::string TcpStore::get(const std::string& key, milliseconds timeout) {
  check_key(impl_->where, key);
  std::lock_guard lock(mu_);
  std::string reply =
      call(proto::Writer(proto::kGet).str(key).u32(uint32_t(timeout.count())).frame(),
           timeout + milliseconds(10'000));
  proto::Reader in(reply);
  std::string value = in.str();
  in.end();
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  for (const auto& k : keys) check_key(impl_->where, k);
  std::lock_guard lock(mu_);
  proto::Writer w(proto::kWait);
  w.u32(uint32_t(keys.size()));
  for (auto& k : keys) w.str(k);
  w.u32(uint32_t(timeout.count()));
  call(w.frame(), timeout + milliseconds(10'000));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  check_key(impl_->where, key);
  std::lock_guard lock(mu_);
  std::string reply =
      call(proto::Writer(proto::kAdd).str(key).i64(delta).frame(), milliseconds(30'000));
  proto::Reader in(reply);
  int64_t v = in.i64();
  in.end();
  return v;
}

}  // namespace baton::transport
