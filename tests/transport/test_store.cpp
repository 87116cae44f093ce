// The rendezvous store: set / get / wait / add, timeouts that name the key, the job
// token, and messages that are malformed or too long.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "memory/error.h"
#include "transport/detail/asio.h"
#include "transport/detail/store_protocol.h"
#include "transport/store.h"
#include "transport/world.h"

namespace baton::transport {
namespace {

using namespace std::chrono_literals;

TEST(Store, SetGetBinaryValues) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore a("127.0.0.1", server.port(), "tok");
  TcpStore b("127.0.0.1", server.port(), "tok");
  std::string value("\0\1\2binary\xff", 10);
  a.set("k", value);
  EXPECT_EQ(b.get("k", 1000ms), value);
  a.set("k", "again");
  EXPECT_EQ(b.get("k", 1000ms), "again");
  a.set("empty", "");
  EXPECT_EQ(b.get("empty", 1000ms), "");
}

TEST(Store, GetWaitsForALaterSet) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore a("127.0.0.1", server.port(), "tok");
  std::thread setter([&] {
    TcpStore b("127.0.0.1", server.port(), "tok");
    std::this_thread::sleep_for(100ms);
    b.set("late", "here");
  });
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(a.get("late", 5000ms), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 80ms);
  setter.join();
}

TEST(Store, TimeoutNamesTheMissingKeys) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore a("127.0.0.1", server.port(), "tok");
  a.set("present", "1");
  auto t0 = std::chrono::steady_clock::now();
  try {
    a.wait({"present", "absent/one", "absent/two"}, 200ms);
    FAIL() << "wait returned for a missing key";
  } catch (const RuntimeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("absent/one"), std::string::npos) << m;
    EXPECT_NE(m.find("absent/two"), std::string::npos) << m;
    EXPECT_EQ(m.find("present,"), std::string::npos) << m;
  }
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 3000ms);
  EXPECT_THROW(a.get("nothing", 50ms), RuntimeError);
  // The connection stays usable after a timeout.
  EXPECT_EQ(a.get("present", 50ms), "1");
}

TEST(Store, AddCountsAcrossClients) {
  StoreServer server("127.0.0.1", 0, "tok");
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&] {
      TcpStore c("127.0.0.1", server.port(), "tok");
      for (int k = 0; k < 25; ++k) c.add("n", 1);
    });
  for (auto& t : ts) t.join();
  TcpStore c("127.0.0.1", server.port(), "tok");
  EXPECT_EQ(c.add("n", 0), 100);
  EXPECT_EQ(c.add("n", -100), 0);
}

TEST(Store, WrongTokenIsRefused) {
  StoreServer server("127.0.0.1", 0, "the-right-token");
  try {
    TcpStore bad("127.0.0.1", server.port(), "a-wrong-token");
    FAIL() << "a client with a wrong token was let in";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong job token"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TcpStore("127.0.0.1", server.port(), "the-right-toke"), RuntimeError);
  EXPECT_EQ(server.refused(), 2u);
  TcpStore good("127.0.0.1", server.port(), "the-right-token");
  good.set("x", "y");
  EXPECT_EQ(good.get("x", 100ms), "y");
}

// Raw bytes to the server; returns what it answers before closing (or timing out).
std::string raw_exchange(uint16_t port, const std::string& bytes) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(s, asio::buffer(bytes));
  std::string got;
  char buf[4096];
  boost::system::error_code ec;
  s.non_blocking(false);
  // The server answers and closes: read to EOF.
  while (true) {
    size_t n = s.read_some(asio::buffer(buf), ec);
    if (ec) break;
    got.append(buf, n);
  }
  return got;
}

// The hello's version field of this build's frames.
constexpr uint32_t kProtocol = detail::store::kVersion;

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

TEST(Store, OversizedAndMalformedMessagesAreRefused) {
  StoreServer server("127.0.0.1", 0, "tok");
  // A length far beyond the limit: refused before anything is read.
  std::string reply = raw_exchange(server.port(), le32(0x7fffffff));
  EXPECT_NE(reply.find("outside"), std::string::npos) << reply;
  // Before the hello a frame may not take what a request may: a stranger's connections
  // would each hold 4 MiB of the rendezvous's memory.
  reply = raw_exchange(server.port(), le32(detail::store::kMaxFrame));
  EXPECT_NE(reply.find("outside 1..65536 before the hello"), std::string::npos) << reply;
  // A hello whose token length runs past the end of the message.
  std::string body = std::string(1, char(1)) + le32(1) + le32(1000) + "tok";
  reply = raw_exchange(server.port(), le32(uint32_t(body.size())) + body);
  EXPECT_NE(reply.find("too short"), std::string::npos) << reply;
  // A request before the hello.
  body = std::string(1, char(2)) + le32(1) + "k" + le32(1) + "v";
  reply = raw_exchange(server.port(), le32(uint32_t(body.size())) + body);
  EXPECT_NE(reply.find("hello"), std::string::npos) << reply;
  EXPECT_EQ(server.refused(), 4u);
  // The server still serves well-behaved clients.
  TcpStore good("127.0.0.1", server.port(), "tok");
  good.set("still", "up");
  EXPECT_EQ(good.get("still", 100ms), "up");
}

TEST(Store, ConnectRetriesUntilTheServerStarts) {
  // Find a free port, then start the server on it a little after the client tries.
  uint16_t port;
  {
    StoreServer probe("127.0.0.1", 0, "tok");
    port = probe.port();
  }
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    server = std::make_unique<StoreServer>("127.0.0.1", port, "tok");
  });
  TcpStore c("127.0.0.1", port, "tok", 5000ms);
  c.set("a", "b");
  starter.join();
  EXPECT_THROW(TcpStore("127.0.0.1", 1, "tok", 100ms), RuntimeError);
}

TEST(Store, ListensOnTheAddressGiven) {
  StoreServer server("127.0.0.1", 0, "tok");
  EXPECT_GT(server.port(), 0);
  EXPECT_THROW(StoreServer("127.0.0.1", 0, ""), InputError);
}

TEST(Store, APortInUseIsAClearError) {
  StoreServer server("127.0.0.1", 0, "tok");
  const std::string port = std::to_string(server.port());
  try {
    StoreServer second("127.0.0.1", server.port(), "tok");
    FAIL() << "two servers listen on one port";
  } catch (const RuntimeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cannot listen on 127.0.0.1:" + port), std::string::npos) << m;
    EXPECT_NE(m.find("in use"), std::string::npos) << m;
    EXPECT_NE(m.find("port 0 for any free one"), std::string::npos) << m;
  }
  // Any process's listener counts, not only ours: a plain socket holding a port.
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::acceptor other(io, {asio::ip::make_address("127.0.0.1"), 0});
  try {
    StoreServer third("127.0.0.1", other.local_endpoint().port(), "tok");
    FAIL() << "listened on a port another socket holds";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  // The first server is unharmed.
  TcpStore c("127.0.0.1", server.port(), "tok");
  c.set("a", "b");
  EXPECT_EQ(c.get("a", 100ms), "b");
}

TEST(Store, SilentClientsBlockNoOneAndAreDropped) {
  // A hello timeout long enough that "at once" below holds on a loaded machine under
  // the sanitizers (the bound was 250 ms of a 300 ms timeout).
  StoreServer server("127.0.0.1", 0, "tok", 1500ms);
  namespace asio = boost::asio;
  asio::io_context io;
  // One connects and says nothing; one sends half a frame header; one authenticates and
  // then sends half a frame.
  asio::ip::tcp::socket silent(io), half(io), stalled(io);
  silent.connect({asio::ip::make_address("127.0.0.1"), server.port()});
  half.connect({asio::ip::make_address("127.0.0.1"), server.port()});
  asio::write(half, asio::buffer(std::string("\x05\x00", 2)));
  {
    std::string hello = std::string(1, char(1)) + le32(kProtocol) + le32(3) + "tok";
    stalled.connect({asio::ip::make_address("127.0.0.1"), server.port()});
    asio::write(stalled, asio::buffer(le32(uint32_t(hello.size())) + hello));
    char ok[5];
    asio::read(stalled, asio::buffer(ok));
    asio::write(stalled, asio::buffer(le32(100) + "abc"));  // 3 of 100 bytes
  }
  // Others are served at once meanwhile.
  auto t0 = std::chrono::steady_clock::now();
  TcpStore a("127.0.0.1", server.port(), "tok");
  TcpStore b("127.0.0.1", server.port(), "tok");
  a.set("k", "v");
  EXPECT_EQ(b.get("k", 1000ms), "v");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);
  // The two that never said hello are closed after the hello timeout.
  for (auto* s : {&silent, &half}) {
    char buf[64];
    boost::system::error_code ec;
    s->read_some(asio::buffer(buf), ec);
    EXPECT_EQ(ec, asio::error::eof) << ec.message();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1000ms);
  EXPECT_EQ(server.refused(), 2u);
  a.set("k", "still");
  EXPECT_EQ(b.get("k", 100ms), "still");
}

TEST(Store, OversizedKeysAndValuesAreRefusedWithTheNumbers) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore c("127.0.0.1", server.port(), "tok");
  try {
    c.set(std::string(5000, 'k'), "v");
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("a key of 5000 bytes; keys are at most 4096"),
              std::string::npos)
        << e.what();
  }
  try {
    c.set("big", std::string(5u << 20, 'v'));
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("the value for key 'big' is 5242880 bytes"),
              std::string::npos)
        << e.what();
  }
  c.set("small", "fine");  // the connection is still good
  EXPECT_EQ(c.get("small", 100ms), "fine");
  // The server checks too: a raw key above the limit after a proper hello.
  std::string hello = std::string(1, char(1)) + le32(kProtocol) + le32(3) + "tok";
  std::string set = std::string(1, char(2)) + le32(5000) + std::string(5000, 'k') + le32(1) + "v";
  std::string reply = raw_exchange(
      server.port(), le32(uint32_t(hello.size())) + hello + le32(uint32_t(set.size())) + set);
  EXPECT_NE(reply.find("string of 5000 bytes exceeds 4096"), std::string::npos) << reply;
}

TEST(Store, MalformedRequestsAfterTheHelloAreRefused) {
  StoreServer server("127.0.0.1", 0, "tok");
  std::string hello = std::string(1, char(1)) + le32(kProtocol) + le32(3) + "tok";
  auto after_hello = [&](const std::string& body) {
    return raw_exchange(server.port(),
                        le32(uint32_t(hello.size())) + hello + le32(uint32_t(body.size())) + body);
  };
  EXPECT_NE(after_hello(std::string(1, char(77))).find("unknown operation 77"), std::string::npos);
  EXPECT_NE(after_hello(std::string(1, char(2)) + le32(1) + "k" + le32(1) + "vX")
                .find("1 unexpected trailing bytes"),
            std::string::npos);
  EXPECT_NE(after_hello(std::string(1, char(4)) + le32(0x10000000)).find("too many keys"),
            std::string::npos);
  EXPECT_NE(after_hello(hello).find("a second hello"), std::string::npos);
  EXPECT_EQ(server.refused(), 0u);  // all of them had said hello
  // A counter over a value that is not an integer, and one that would overflow.
  TcpStore c("127.0.0.1", server.port(), "tok");
  c.set("text", "twelve");
  try {
    c.add("text", 1);
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("the value at key 'text' is not a 64-bit decimal integer"),
              std::string::npos)
        << e.what();
  }
  TcpStore d("127.0.0.1", server.port(), "tok");
  d.add("n", INT64_MAX);
  try {
    d.add("n", 1);
    FAIL();
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
  }
  TcpStore e("127.0.0.1", server.port(), "tok");
  EXPECT_EQ(e.add("n", -1), INT64_MAX - 1);
}

// What a call threw: its message, and whether it was bad input (empty: nothing thrown).
struct Outcome {
  std::string what;
  bool input = false;
};
template <class F>
Outcome outcome(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return {e.what(), true};
  } catch (const std::exception& e) {
    return {e.what(), false};
  }
  return {};
}

StoreMember slurm_rank(int rank, int size, const std::string& host) {
  return {rank, "SLURM_PROCID", size, "SLURM_NTASKS", host};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A rank waiting at the rendezvous (as start-up waits for its peers' addresses) while
// something else happens; what its wait threw, and how long it took.
struct Waiting {
  explicit Waiting(TcpStore& store)
      : thread([&store, this] {
          auto t0 = std::chrono::steady_clock::now();
          got = outcome([&] { store.wait({"never"}, 20'000ms); });
          took = std::chrono::steady_clock::now() - t0;
        }) {
    std::this_thread::sleep_for(100ms);  // parked at the server
  }
  ~Waiting() {
    if (thread.joinable()) thread.join();
  }
  Outcome join() {
    thread.join();
    return got;
  }
  // Before the thread, which writes them.
  Outcome got;
  std::chrono::steady_clock::duration took{};
  std::thread thread;
};

// Two processes given one rank (two with SLURM_PROCID=1): the second registration fails
// the rendezvous for every rank, as bad input naming the rank and both processes. It had
// been let in: one of the two trained, the other hung.
TEST(Store, ARankRegisteredTwiceFailsEveryRank) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore r0("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(0, 3, "hosta"));
  TcpStore r1("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(1, 3, "hostb"));
  Waiting waiting(r0);
  Outcome dup = outcome(
      [&] { TcpStore("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(1, 3, "hostc")); });
  Outcome at0 = waiting.join();
  EXPECT_TRUE(dup.input) << dup.what;
  EXPECT_TRUE(
      has(dup.what, "rank 1 registered twice: rank 1 (SLURM_PROCID) on hostb at 127.0.0.1:"))
      << dup.what;
  EXPECT_TRUE(has(dup.what, ", and rank 1 (SLURM_PROCID) on hostc at 127.0.0.1:")) << dup.what;
  EXPECT_TRUE(has(dup.what, "two processes were given one rank (SLURM_PROCID=1)")) << dup.what;
  EXPECT_TRUE(at0.input) << at0.what;
  EXPECT_TRUE(has(at0.what, "rank 1 registered twice")) << at0.what;
  EXPECT_LT(waiting.took, 5000ms);  // at once, not at the end of its wait
  Outcome at1 = outcome([&] { r1.set("k", "v"); });
  EXPECT_TRUE(at1.input && has(at1.what, "rank 1 registered twice")) << at1.what;
  // Plain clients (no rank) are not registered: any number of them.
  StoreServer plain("127.0.0.1", 0, "tok");
  TcpStore a("127.0.0.1", plain.port(), "tok"), b("127.0.0.1", plain.port(), "tok");
  a.set("k", "v");
  EXPECT_EQ(b.get("k", 100ms), "v");
}

// Once every rank has met, the job runs: a late hello is refused alone, whether a duplicate
// of a rank, another job's rank sent to this port or a rank of another world size, and the
// ranks' requests are served on. Each had failed the running job (exit 2 on every rank).
TEST(Store, LateHellosAfterEveryRankMetAreRefusedAlone) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore r0("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(0, 2, "hosta"));
  TcpStore r1("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(1, 2, "hostb"));
  Outcome dup = outcome(
      [&] { TcpStore("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(1, 2, "hostc")); });
  EXPECT_TRUE(has(dup.what, "rank 1 registered twice")) << dup.what;
  EXPECT_TRUE(has(dup.what, "refused alone: the job's 2 ranks had all met and run on")) << dup.what;
  Outcome stranger = outcome(
      [&] { TcpStore("127.0.0.1", server.port(), "other", 5000ms, slurm_rank(1, 2, "hostd")); });
  EXPECT_TRUE(has(stranger.what, "presented a wrong job token")) << stranger.what;
  EXPECT_TRUE(has(stranger.what, "refused alone")) << stranger.what;
  Outcome wider = outcome(
      [&] { TcpStore("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(2, 3, "hoste")); });
  EXPECT_TRUE(has(wider.what, "the ranks' world sizes differ")) << wider.what;
  EXPECT_TRUE(has(wider.what, "refused alone")) << wider.what;
  // Bad input (exit 2) for the process refused, as before the ranks met; it had read as a
  // runtime failure (exit 1).
  for (const Outcome& o : {dup, stranger, wider}) EXPECT_TRUE(o.input) << o.what;
  EXPECT_EQ(server.failure(), std::nullopt);
  r1.set("k", "v");
  EXPECT_EQ(r0.get("k", 1000ms), "v");
  EXPECT_EQ(server.refused(), 3u);
}

// Ranks started with different world sizes (SLURM_NTASKS=3 on one, 2 on another): bad
// input on every rank, naming both sizes and their variables. They had met and then
// blamed each other as dead after the peer timeout.
TEST(Store, WorldSizesThatDifferFailEveryRank) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore r0("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(0, 3, "hosta"));
  Waiting waiting(r0);
  Outcome at1 = outcome(
      [&] { TcpStore("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(1, 2, "hostb")); });
  Outcome at0 = waiting.join();
  for (const Outcome& o : {at0, at1}) {
    EXPECT_TRUE(o.input) << o.what;
    EXPECT_TRUE(has(o.what,
                    "the ranks' world sizes differ: rank 1 (SLURM_PROCID) on hostb at "
                    "127.0.0.1:"))
        << o.what;
    EXPECT_TRUE(has(o.what,
                    "has a world of 2 (SLURM_NTASKS=2), rank 0 (SLURM_PROCID) on hosta "
                    "at 127.0.0.1:"))
        << o.what;
    EXPECT_TRUE(has(o.what, "one of 3 (SLURM_NTASKS=3)")) << o.what;
  }
  EXPECT_LT(waiting.took, 5000ms);
}

// A rank with another job token: bad input there, and every rank waiting fails at once
// naming the rank and its address. Rank 0 had waited out the whole connect timeout and
// then called the rank "not started"; the rank itself had exited 1.
TEST(Store, ARankWithAnotherTokenFailsTheRendezvousAtOnce) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore r0("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(0, 2, "hosta"));
  Waiting waiting(r0);
  Outcome bad = outcome(
      [&] { TcpStore("127.0.0.1", server.port(), "other", 5000ms, slurm_rank(1, 2, "hostb")); });
  Outcome at0 = waiting.join();
  for (const Outcome& o : {bad, at0}) {
    EXPECT_TRUE(o.input) << o.what;
    EXPECT_TRUE(has(o.what, "rank 1 (SLURM_PROCID) on hostb at 127.0.0.1:")) << o.what;
    EXPECT_TRUE(has(o.what,
                    "presented a wrong job token: every rank of a job needs the same "
                    "BATON_JOB_TOKEN"))
        << o.what;
  }
  EXPECT_LT(waiting.took, 5000ms);
  EXPECT_EQ(server.refused(), 1u);
}

// A rank of another baton build (its binary replaced during a run) sends a hello of
// another version, whose fields after the token may be laid out otherwise: the job fails
// at once as bad input naming the versions, not "unexpected trailing bytes". The same
// hello with another token is a stranger's: refused alone.
TEST(Store, ARankOfAnotherBuildFailsTheRendezvousNamingTheVersions) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore r0("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(0, 2, "hosta"));
  Waiting waiting(r0);
  const std::string fields = le32(1) + le32(0) + le32(2) + le32(0) + le32(5) + "hostb" + "extra";
  std::string body = std::string(1, char(1)) + le32(1) + le32(5) + "other" + fields;
  std::string reply = raw_exchange(server.port(), le32(uint32_t(body.size())) + body);
  EXPECT_TRUE(has(reply, "protocol version 1")) << reply;
  EXPECT_FALSE(has(reply, "another baton build")) << reply;
  EXPECT_EQ(server.refused(), 1u);
  body = std::string(1, char(1)) + le32(1) + le32(3) + "tok" + fields;
  reply = raw_exchange(server.port(), le32(uint32_t(body.size())) + body);
  EXPECT_TRUE(has(reply, "runs another baton build (protocol version 1, this build's is " +
                             std::to_string(kProtocol) + ")"))
      << reply;
  EXPECT_FALSE(has(reply, "trailing")) << reply;
  Outcome at0 = waiting.join();
  EXPECT_TRUE(at0.input) << at0.what;
  EXPECT_TRUE(has(at0.what, "the launcher and every rank must run the same baton")) << at0.what;
  EXPECT_LT(waiting.took, 5000ms);
}

// The hosting rank gives up (ranks that never came): the ranks waiting at its
// rendezvous get its reason, a runtime failure as on the host, not an end of file; so do
// their later calls and ranks that come later.
TEST(Store, FailTellsEveryRankWhyTheRendezvousCloses) {
  StoreServer server("127.0.0.1", 0, "tok");
  TcpStore r1("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(1, 4, "hostb"));
  Waiting waiting(r1);
  const std::string why = "rank 0: rank 3 of 4 did not reach the rendezvous within 3 s";
  server.fail(why, false);
  Outcome at1 = waiting.join();
  EXPECT_FALSE(at1.input) << at1.what;
  EXPECT_EQ(at1.what, "rendezvous at 127.0.0.1:" + std::to_string(server.port()) + ": " + why);
  EXPECT_LT(waiting.took, 5000ms);
  Outcome again = outcome([&] { r1.get("k", 0ms); });
  EXPECT_EQ(again.what, at1.what);
  Outcome late = outcome(
      [&] { TcpStore("127.0.0.1", server.port(), "tok", 5000ms, slurm_rank(2, 4, "hostc")); });
  EXPECT_FALSE(late.input);
  EXPECT_TRUE(has(late.what, why)) << late.what;
  server.fail("a second reason", true);  // the first stays
  EXPECT_TRUE(has(outcome([&] { TcpStore("127.0.0.1", server.port(), "tok"); }).what, why));
}

// srun's environment: the local size from this node's entry of Slurm's tasks-per-node
// list (SLURM_NTASKS_PER_NODE exists only with --ntasks-per-node: every rank but 0 had
// been refused); the rendezvous's host:port forms, a bracketed IPv6 address included.
TEST(World, SlurmLocalSizeAndHostPorts) {
  for (const char* v : {"BATON_RANK", "BATON_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "BATON_RENDEZVOUS"})
    ::unsetenv(v);
  ::setenv("BATON_RENDEZVOUS", "127.0.0.1:29500", 1);
  ::setenv("BATON_JOB_TOKEN", "t0ken", 1);
  ::setenv("SLURM_PROCID", "4", 1);
  ::setenv("SLURM_NTASKS", "7", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_NODEID", "2", 1);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "2,3(x2)", 1);  // nodes 0..2: 2, 3, 3 tasks
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "Slurm");
  EXPECT_EQ(e.rank, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 3);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "2,3(x", 1);
  try {
    read_launch_env();
    ADD_FAILURE() << "a malformed list was accepted";
  } catch (const InputError& err) {
    EXPECT_EQ(std::string(err.what()),
              "SLURM_STEP_TASKS_PER_NODE='2,3(x': expected counts such as 2(x3),1 (Slurm's "
              "tasks per node)");
  }
  ::unsetenv("SLURM_STEP_TASKS_PER_NODE");
  e = read_launch_env();  // unknown: at least this task's place
  EXPECT_EQ(e.local_size, 2);
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
                        "BATON_RENDEZVOUS", "BATON_JOB_TOKEN"})
    ::unsetenv(v);

  EXPECT_EQ(parse_host_port("[::1]:0", "--rendezvous", true),
            std::make_pair(std::string("::1"), uint16_t(0)));
  EXPECT_EQ(parse_host_port("node7:29500", "X"),
            std::make_pair(std::string("node7"), uint16_t(29500)));
  for (const char* bad : {":0", "host:", "host", "host:70000", "host:x"})
    EXPECT_THROW(parse_host_port(bad, "--rendezvous", true), InputError) << bad;
  EXPECT_THROW(parse_host_port("host:0", "BATON_RENDEZVOUS"), InputError);
}

// Clears every launcher's variables, so that a test sees only what it sets.
void clear_launch_env() {
  for (const char* v : {"BATON_RANK",
                        "BATON_WORLD_SIZE",
                        "BATON_LOCAL_RANK",
                        "BATON_LOCAL_SIZE",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "PMI_RANK",
                        "PMI_SIZE",
                        "MPI_LOCALRANKID",
                        "MPI_LOCALNRANKS",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "SLURM_LOCALID",
                        "SLURM_NODEID",
                        "SLURM_TASKS_PER_NODE",
                        "SLURM_STEP_TASKS_PER_NODE",
                        "SLURM_JOB_ID",
                        "BATON_RENDEZVOUS",
                        "BATON_JOB_TOKEN"})
    ::unsetenv(v);
}

// Slurm's tasks-per-node list is read whole, digits only: std::stoi had taken "2(x3),",
// " 2" and "+2".
TEST(World, SlurmTasksPerNodeIsReadWhole) {
  clear_launch_env();
  ::setenv("BATON_RENDEZVOUS", "127.0.0.1:29500", 1);
  ::setenv("BATON_JOB_TOKEN", "t0ken", 1);
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_NODEID", "2", 1);
  ::setenv("SLURM_TASKS_PER_NODE", "2(x3),1", 1);
  EXPECT_EQ(read_launch_env().local_size, 2);
  ::setenv("SLURM_NODEID", "3", 1);
  EXPECT_EQ(read_launch_env().local_size, 1);
  ::setenv("SLURM_NODEID", "0", 1);
  for (const char* bad : {"2(x3),", " 2", "2 ", "+2", "2, 1", "2(x3)x", "2(x 3)", "2(x+3)", "2,,1",
                          ",2", "0", "2(x0)", "2(x3", "3x", "99999999999"}) {
    ::setenv("SLURM_TASKS_PER_NODE", bad, 1);
    Outcome o = outcome([] { read_launch_env(); });
    EXPECT_TRUE(o.input) << bad << ": " << o.what;
    EXPECT_EQ(o.what, std::string("SLURM_TASKS_PER_NODE='") + bad +
                          "': expected counts such as 2(x3),1 (Slurm's tasks per node)");
  }
  clear_launch_env();
}

// A local rank without the local size (or the reverse) names the variable missing, for
// every launcher that has both; it had said "expected an integer from 0 to 0".
TEST(World, ALocalRankWithoutItsSizeNamesTheMissingVariable) {
  struct Launcher {
    const char *name, *rank, *size, *local_rank, *local_size;
  };
  for (Launcher l :
       {Launcher{"baton launch", "BATON_RANK", "BATON_WORLD_SIZE", "BATON_LOCAL_RANK",
                 "BATON_LOCAL_SIZE"},
        Launcher{"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        Launcher{"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}}) {
    for (bool rank_given : {true, false}) {
      clear_launch_env();
      ::setenv("BATON_RENDEZVOUS", "127.0.0.1:29500", 1);
      ::setenv("BATON_JOB_TOKEN", "t0ken", 1);
      ::setenv(l.rank, "1", 1);
      ::setenv(l.size, "4", 1);
      ::setenv(rank_given ? l.local_rank : l.local_size, rank_given ? "1" : "2", 1);
      Outcome o = outcome([] { read_launch_env(); });
      EXPECT_TRUE(o.input) << o.what;
      const char* given = rank_given ? l.local_rank : l.local_size;
      const char* missing = rank_given ? l.local_size : l.local_rank;
      EXPECT_EQ(o.what, std::string(l.name) + ": " + missing + " is not set but " + given + " is");
      ::setenv(missing, rank_given ? "2" : "1", 1);
      LaunchEnv e = read_launch_env();
      EXPECT_EQ(e.local_rank, 1);
      EXPECT_EQ(e.local_size, 2);
      EXPECT_EQ(e.rank_from, l.rank);
      EXPECT_EQ(e.size_from, l.size);
    }
  }
  clear_launch_env();
}

// The warning that the job id serves as the token: once per process, though the
// environment is read several times (baton train read it twice and warned twice).
TEST(World, TheJobIdTokenWarningIsPrintedOnce) {
  clear_launch_env();
  ::setenv("BATON_RENDEZVOUS", "127.0.0.1:29500", 1);
  ::setenv("SLURM_PROCID", "1", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_JOB_ID", "4242", 1);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(read_launch_env().token, "job-4242");
  spdlog::default_logger()->sinks().pop_back();
  const std::string text = log.str();
  size_t count = 0;
  for (size_t at = text.find("BATON_JOB_TOKEN is not set"); at != std::string::npos;
       at = text.find("BATON_JOB_TOKEN is not set", at + 1))
    ++count;
  EXPECT_EQ(count, 1u) << text;
  clear_launch_env();
}

}  // namespace
}  // namespace baton::transport
