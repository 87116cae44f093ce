// The rendezvous server: Boost.Asio on one thread, so the table and the parked
// requests need no locks.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "transport/detail/asio.h"
#include "transport/detail/store_protocol.h"
#include "transport/store.h"

namespace baton::transport {

namespace asio = boost::asio;
using asio::ip::tcp;
namespace proto = detail::store;

namespace {

// Compares without an early exit, so that timing says nothing about the token.
bool same_token(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= uint8_t(expected[i]) ^ uint8_t(i < given.size() ? given[i] : 0);
  return diff == 0;
}

// "rank 1 (SLURM_PROCID) on node3 (10.0.0.3) at 10.0.0.3:40112": a rank in messages.
std::string describe_rank(const proto::Member& m, const std::string& address) {
  std::string d = "rank " + std::to_string(m.rank);
  if (!m.rank_from.empty()) d += " (" + m.rank_from + ")";
  if (!m.host.empty()) d += " on " + m.host;
  return d + " at " + address;
}

}  // namespace

struct StoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer retry_accept{io};  // after running out of descriptors
  bool out_of_descriptors_said = false;
  std::string token;
  std::chrono::milliseconds hello_timeout{10'000};
  std::thread thread;
  std::map<std::string, std::string> table;
  // Only the io thread writes the table; peek() reads it from other threads.
  std::mutex table_mu;
  std::atomic<size_t> refused{0};
  // Frames written before a close that are not written yet (fail() waits for them).
  std::atomic<int> closing_writes{0};

  // Set once, when the rendezvous failed for the whole job: every request is answered
  // with it from then on.
  struct Failure {
    bool input = false;
    std::string message;
  };
  std::optional<Failure> failure;
  // A copy for other threads (the launcher's), under table_mu.
  std::optional<Failure> failure_seen;
  std::set<int> registered_seen;  // the members' ranks, for other threads, under table_mu
  std::set<int> heard_seen;       // every rank hello's rank (StoreServer::heard_from)

  class Session;
  // The ranks that said who they are: a second hello with a rank still connected, or
  // another world size than the first rank's, fails the rendezvous.
  struct Registered {
    proto::Member member;
    std::string address;
    std::weak_ptr<Session> session;
  };
  std::map<int, Registered> members;
  std::optional<Registered> first;  // whose world size the others must have

  // A get or wait that waits for keys to appear.
  struct Parked {
    std::shared_ptr<Session> session;
    std::vector<std::string> keys;
    bool want_value = false;  // get: answer with the value
    std::shared_ptr<asio::steady_timer> timer;
  };
  std::list<Parked> parked;

  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl& server, tcp::socket socket)
        : s_(server), socket_(std::move(socket)), hello_timer_(server.io) {}

    void start() {
      // A connection that does not introduce itself soon is dropped.
      hello_timer_.expires_after(s_.hello_timeout);
      hello_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        if (!ec && !self->authed_) {
          self->s_.refused++;
          spdlog::warn("rendezvous: dropped a connection from {} that sent no hello within {} ms",
                       self->peer(), self->s_.hello_timeout.count());
          self->close();
        }
      });
      read_header();
    }

    // Frames go out one at a time, in order.
    void send(const std::string& frame, bool then_close = false) {
      if (then_close) s_.closing_writes++;
      outbox_.push_back({frame, then_close});
      if (outbox_.size() == 1) write_next();
    }
    void write_next() {
      asio::async_write(socket_, asio::buffer(outbox_.front().first),
                        [self = shared_from_this()](boost::system::error_code ec, size_t) {
                          bool then_close = self->outbox_.front().second;
                          if (then_close) self->s_.closing_writes--;
                          self->outbox_.pop_front();
                          if (ec || then_close) return self->close();
                          if (!self->outbox_.empty()) self->write_next();
                        });
    }
    void ok() { send(proto::Writer(proto::kOk).frame()); }
    void error(const std::string& msg, bool then_close = false) {
      send(proto::Writer(proto::kError).str(msg).frame(), then_close);
    }
    // The rendezvous's failure, then the end of this connection.
    void failed() { failed_alone(s_.failure->message, s_.failure->input); }
    // A failure of this connection's process alone (the rendezvous serves on): it fails as
    // the same mistake fails every rank before they met, bad input when `input`.
    void failed_alone(const std::string& message, bool input) {
      send(proto::Writer(proto::kFailed).u8(input ? 1 : 0).str(message).frame(), true);
    }
    void close() {
      boost::system::error_code ignored;
      hello_timer_.cancel();
      socket_.shutdown(tcp::socket::shutdown_both, ignored);
      socket_.close(ignored);
    }
    bool open() const { return socket_.is_open(); }

   private:
    void read_header() {
      asio::async_read(socket_, asio::buffer(header_),
                       [self = shared_from_this()](boost::system::error_code ec, size_t) {
                         if (ec) return self->close();
                         uint32_t n = proto::frame_length(self->header_.data());
                         const uint32_t most =
                             self->authed_ ? proto::kMaxFrame : proto::kMaxHelloFrame;
                         if (n == 0 || n > most) {
                           self->s_.refused++;
                           return self->error("message length " + std::to_string(n) +
                                                  " is outside 1.." + std::to_string(most) +
                                                  (self->authed_ ? "" : " before the hello"),
                                              true);
                         }
                         self->body_.resize(n);
                         self->read_body();
                       });
    }
    void read_body() {
      asio::async_read(socket_, asio::buffer(body_),
                       [self = shared_from_this()](boost::system::error_code ec, size_t) {
                         if (ec) return self->close();
                         bool keep = self->handle();
                         if (keep) self->read_header();
                       });
    }

    // A hello of another version with this job's token comes from one of its processes
    // built from other sources (a binary replaced during a run, hosts upgraded apart): the
    // job cannot start, so it fails as bad input (not retried) naming the versions. With
    // another token it is a stranger's, refused alone.
    proto::Request parse_hello_or_request() {
      try {
        return proto::parse_request(body_, authed_);
      } catch (const proto::VersionMismatch& e) {
        if (!same_token(e.token, s_.token)) throw;
        std::string problem = "a process at " + peer() + " runs another baton build (" + e.what() +
                              "): the launcher and every rank must run the same baton";
        spdlog::warn("rendezvous: refused a connection from {}: {}", peer(), problem);
        if (!s_.failure) s_.fail_all(problem, true);
        return proto::Request{};  // a hello: answered with the failure below
      }
    }

    // Returns whether to keep reading from this connection.
    bool handle() {
      try {
        proto::Request q = parse_hello_or_request();
        if (q.op == proto::kHello && q.member.rank >= 0) {
          std::lock_guard lock(s_.table_mu);
          s_.heard_seen.insert(q.member.rank);
        }
        if (!s_.failure && q.op == proto::kHello) {
          const bool right = same_token(q.token, s_.token);
          // A plain client with a wrong token is a stranger: refused alone. A rank of a
          // world with one is this job's rank started with another token (or another
          // job's rank sent here): the job cannot start, and waiting for it is no use.
          if (!right && q.member.rank < 0) throw proto::ProtocolError("wrong job token");
          std::string problem =
              right ? s_.admit(q.member, peer(), shared_from_this())
                    : describe_rank(q.member, peer()) +
                          " presented a wrong job token: every rank of a job needs the same "
                          "BATON_JOB_TOKEN (without it, the scheduler's job id)";
          // Once every rank has met, the job runs: a late hello (another job's rank sent
          // to this port, a duplicate started by mistake, anyone who can reach the port)
          // is refused alone. It had failed the running job, token or not.
          if (!problem.empty() && s_.all_met()) {
            s_.refused++;
            const std::string alone = problem + " (refused alone: the job's " +
                                      std::to_string(s_.members.size()) +
                                      " ranks had all met and run on)";
            spdlog::warn("rendezvous: refused a connection from {}: {}", peer(), alone);
            failed_alone(alone, true);
            return false;
          }
          if (!problem.empty()) {
            if (!right) s_.refused++;
            spdlog::warn("rendezvous: refused a connection from {}: {}", peer(), problem);
            s_.fail_all(problem, true);
          }
        }
        if (s_.failure) {
          failed();
          return false;
        }
        switch (q.op) {
          case proto::kHello:
            authed_ = true;
            hello_timer_.cancel();
            ok();
            return true;
          case proto::kSet: {
            std::lock_guard lock(s_.table_mu);
            s_.table[q.keys[0]] = std::move(q.value);
          }
            ok();
            s_.release_parked();
            return true;
          case proto::kGet:
            s_.park(shared_from_this(), std::move(q.keys), true, q.timeout_ms);
            return true;
          case proto::kWait:
            s_.park(shared_from_this(), std::move(q.keys), false, q.timeout_ms);
            return true;
          case proto::kAdd: {
            auto it = s_.table.find(q.keys[0]);
            int64_t v = proto::add_to_counter(
                q.keys[0], it == s_.table.end() ? nullptr : &it->second, q.delta);
            {
              std::lock_guard lock(s_.table_mu);
              s_.table[q.keys[0]] = std::to_string(v);
            }
            send(proto::Writer(proto::kOk).i64(v).frame());
            s_.release_parked();
            return true;
          }
          default:
            throw proto::ProtocolError("unknown operation " + std::to_string(int(q.op)));
        }
      } catch (const std::exception& e) {
        if (!authed_) {
          s_.refused++;
          spdlog::warn("rendezvous: refused a connection from {}: {}", peer(), e.what());
        } else {
          spdlog::warn("rendezvous: bad message from {}: {}", peer(), e.what());
        }
        error(e.what(), true);
        return false;
      }
    }

    std::string peer() const {
      boost::system::error_code ec;
      auto ep = socket_.remote_endpoint(ec);
      return ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    }

    Impl& s_;
    tcp::socket socket_;
    asio::steady_timer hello_timer_;
    std::array<char, 4> header_{};
    std::string body_;
    std::deque<std::pair<std::string, bool>> outbox_;  // frame, close after it
    bool authed_ = false;
  };

  // Whether every rank of the world has registered (the job has begun).
  bool all_met() const { return first && int64_t(members.size()) >= int64_t(first->member.size); }

  // Registers a rank; returns why the rendezvous must fail (empty: admitted).
  std::string admit(const proto::Member& m, const std::string& address,
                    const std::shared_ptr<Session>& session) {
    if (m.rank < 0) return {};
    auto it = members.find(m.rank);
    if (it != members.end()) {
      auto earlier = it->second.session.lock();
      if (earlier && earlier->open())
        return "rank " + std::to_string(m.rank) +
               " registered twice: " + describe_rank(it->second.member, it->second.address) +
               ", and " + describe_rank(m, address) + ": two processes were given one rank (" +
               (m.rank_from.empty() ? std::string("the rank") : m.rank_from) + "=" +
               std::to_string(m.rank) + ")";
    }
    if (first && first->member.size != m.size)
      return "the ranks' world sizes differ: " + describe_rank(m, address) + " has a world of " +
             std::to_string(m.size) + " (" + m.size_from + "=" + std::to_string(m.size) + "), " +
             describe_rank(first->member, first->address) + " one of " +
             std::to_string(first->member.size) + " (" + first->member.size_from + "=" +
             std::to_string(first->member.size) +
             "): every rank must be started with the same world size";
    Registered r{m, address, session};
    if (!first) first = r;
    members[m.rank] = std::move(r);
    std::lock_guard lock(table_mu);
    registered_seen.insert(m.rank);
    return {};
  }

  // Fails the rendezvous: the waiting requests are answered now, the others as they come.
  void fail_all(const std::string& message, bool input) {
    if (failure) return;
    failure = Failure{input, message};
    {
      std::lock_guard lock(table_mu);
      failure_seen = failure;
    }
    std::set<const Session*> told;
    for (auto& p : parked) {
      p.timer->cancel();
      if (p.session->open()) p.session->failed();
      told.insert(p.session.get());
    }
    parked.clear();
    // A rank between two requests would otherwise find the socket closed when this
    // server's process exits: its answer is written now, read as its next reply.
    for (auto& [rank, r] : members) {
      auto session = r.session.lock();
      if (session && session->open() && !told.count(session.get())) session->failed();
    }
  }

  void park(std::shared_ptr<Session> session, std::vector<std::string> keys, bool want_value,
            uint32_t ms) {
    Parked p{std::move(session), std::move(keys), want_value,
             std::make_shared<asio::steady_timer>(io)};
    if (try_answer(p)) return;
    p.timer->expires_after(std::chrono::milliseconds(ms));
    auto timer = p.timer;
    parked.push_back(std::move(p));
    timer->async_wait([this, timer](boost::system::error_code ec) {
      if (ec) return;  // answered and cancelled
      // Answered (or failed) after the timer expired but before this ran: gone.
      auto it = std::find_if(parked.begin(), parked.end(),
                             [&](const Parked& q) { return q.timer == timer; });
      if (it == parked.end()) return;
      std::string missing;
      for (auto& k : it->keys)
        if (!table.count(k)) missing += (missing.empty() ? "" : ", ") + k;
      it->session->error("timed out waiting for " + missing);
      parked.erase(it);
    });
  }

  bool try_answer(Parked& p) {
    for (auto& k : p.keys)
      if (!table.count(k)) return false;
    if (p.session->open()) {
      if (p.want_value)
        p.session->send(proto::Writer(proto::kOk).str(table[p.keys[0]]).frame());
      else
        p.session->ok();
    }
    return true;
  }

  void release_parked() {
    for (auto it = parked.begin(); it != parked.end();) {
      if (try_answer(*it)) {
        it->timer->cancel();
        it = parked.erase(it);
      } else {
        ++it;
      }
    }
  }

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::no_descriptors || ec.value() == ENFILE ||
          ec == asio::error::no_buffer_space || ec == asio::error::no_memory) {
        // Out of descriptors: the connection stays queued, so accepting again at once
        // spins. Said once, then tried again every 50 ms (a rank's exit frees some).
        if (!out_of_descriptors_said) {
          spdlog::error("rendezvous: cannot accept a connection: {} (ulimit -n)", ec.message());
          out_of_descriptors_said = true;
        }
        retry_accept.expires_after(std::chrono::milliseconds(50));
        retry_accept.async_wait([this](boost::system::error_code e) {
          if (!e) accept();
        });
        return;
      }
      if (ec) {
        if (ec != asio::error::operation_aborted) accept();
        return;
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(*this, std::move(socket))->start();
      accept();
    });
  }
};

StoreServer::StoreServer(const std::string& bind_host, uint16_t port, const std::string& token,
                         std::chrono::milliseconds hello_timeout)
    : impl_(std::make_unique<Impl>()) {
  if (token.empty()) throw InputError("rendezvous: the job token is empty");
  impl_->token = token;
  impl_->hello_timeout = hello_timeout;
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(bind_host, ec);
  if (ec) {
    // A host name: resolve it to the first address.
    tcp::resolver resolver(impl_->io);
    auto results = resolver.resolve(bind_host, std::to_string(port), ec);
    if (ec || results.empty())
      throw InputError("rendezvous: cannot resolve the address '" + bind_host +
                       "': " + ec.message());
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(addr, port);
  const std::string where =
      (addr.is_v6() ? "[" + bind_host + "]" : bind_host) + ":" + std::to_string(port);
  auto fail = [&](const char* step) {
    std::string hint;
    if (ec == asio::error::address_in_use)
      hint =
          " (another process, perhaps another job's rendezvous, holds the port: choose "
          "another one, or port 0 for any free one)";
    else if (ec == asio::error::access_denied)
      hint = " (ports below 1024 need privileges)";
    else if (ec == boost::system::errc::address_not_available)
      hint = " (the address is not one of this host's)";
    throw RuntimeError("rendezvous: cannot listen on " + where + ": " + step + ": " + ec.message() +
                       hint);
  };
  impl_->acceptor.open(ep.protocol(), ec);
  if (ec) fail("socket");
  // SO_REUSEADDR lets a restarted job take its port back from connections in TIME_WAIT;
  // on Linux it never lets two listeners share a port.
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) fail("setsockopt");
  impl_->acceptor.bind(ep, ec);
  if (ec) fail("bind");
  impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail("listen");
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

StoreServer::~StoreServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t StoreServer::port() const {
  return impl_->acceptor.local_endpoint().port();
}
size_t StoreServer::refused() const {
  return impl_->refused.load();
}
void StoreServer::fail(const std::string& message, bool input) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> posted = done->get_future();
  asio::post(impl_->io, [impl = impl_.get(), message, input, done] {
    impl->fail_all(message, input);
    done->set_value();
  });
  // The caller is about to exit, taking the server with it: give the answers a moment
  // to be written (a peer that does not read may not get its answer).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  if (posted.wait_until(deadline) != std::future_status::ready) return;
  while (impl_->closing_writes.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}
std::optional<std::pair<bool, std::string>> StoreServer::failure() const {
  std::lock_guard lock(impl_->table_mu);
  if (!impl_->failure_seen) return std::nullopt;
  return std::pair{impl_->failure_seen->input, impl_->failure_seen->message};
}
std::optional<std::string> StoreServer::peek(const std::string& key) const {
  std::lock_guard lock(impl_->table_mu);
  auto it = impl_->table.find(key);
  if (it == impl_->table.end()) return std::nullopt;
  return it->second;
}

std::set<int> StoreServer::heard_from() const {
  std::lock_guard lock(impl_->table_mu);
  return impl_->heard_seen;
}

std::set<int> StoreServer::registered() const {
  std::lock_guard lock(impl_->table_mu);
  return impl_->registered_seen;
}

std::string make_job_token() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 8; ++i) {
    uint32_t x = rd();
    for (int j = 0; j < 4; ++j)
      t.push_back(hex[(x >> (8 * j + 4)) & 0xf]), t.push_back(hex[(x >> (8 * j)) & 0xf]);
  }
  return t.substr(0, 32);
}

}  // namespace baton::transport
