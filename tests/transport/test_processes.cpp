// Real processes: ranks started by `baton launch` (or by hand, as mpirun or srun would)
// talking over UCX; a rank killed or stopped in the middle of an all-reduce; the
// launcher's report; a rendezvous with the wrong token.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together
  double secs = 0;
};

// Runs a shell command (killed after `limit` seconds) and collects its output.
Result run(const std::string& cmd, int limit = 60) {
  Result r;
  std::string full = "timeout -s KILL " + std::to_string(limit) + " sh -c '" + cmd + "' 2>&1";
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string launch(int n, const std::string& args, const std::string& extra = "") {
  return std::string("BATON_PEER_TIMEOUT=2 ") + BATON_BINARY + " launch -n " + std::to_string(n) +
         " " + extra + " -- " + COMM_WORKER + " " + args;
}

bool has(const std::string& out, const std::string& s) {
  return out.find(s) != std::string::npos;
}

uint16_t free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(s);
  EXPECT_TRUE(ok) << "no free port on the loopback";
  return ok ? ntohs(a.sin_port) : 0;
}

TEST(Processes, LaunchedRanksRunEveryCollectiveOverUcx) {
  for (int n : {2, 3, 4}) {
    Result r = run(launch(n, "check"));
    EXPECT_EQ(r.code, 0) << r.out;
    for (int k = 0; k < n; ++k)
      EXPECT_TRUE(has(r.out, "[rank " + std::to_string(k) + "] rank " + std::to_string(k) + " of " +
                                 std::to_string(n) + " ok (ucx, baton launch)"))
          << r.out;
    std::printf("%d ranks: %.2f s\n", n, r.secs);
  }
}

// A bad tunable is bad input on every rank (exit code 2, not restarted), found when the
// world is made: read inside the first collective, it had been a runtime failure (exit
// 1, restarted), and "-1" had been read as 2^64 - 1.
TEST(Processes, ABadTunableIsBadInputAndNotRestarted) {
  for (std::string setting :
       {"BATON_SMALL_BYTES=-1", "BATON_RING_CHUNK=1x", "BATON_RING_WINDOW=0"}) {
    Result r = run(setting + " " + launch(2, "check", "--max-restarts 2 --restart-backoff 0"));
    EXPECT_EQ(r.code, 2) << setting << ":\n" << r.out;
    EXPECT_TRUE(has(r.out, "not restarting")) << r.out;
    std::string quoted = setting.substr(0, setting.find('=')) + "='" +
                         setting.substr(setting.find('=') + 1) + "': expected a whole number";
    EXPECT_TRUE(has(r.out, quoted)) << r.out;
  }
}

TEST(Processes, OneRankNeedsNoRendezvous) {
  Result r = run(std::string(COMM_WORKER) + " check");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "rank 0 of 1 ok")) << r.out;
}

TEST(Processes, SchedulerEnvironmentsWithAGivenRendezvous) {
  // As mpirun (Open MPI), a PMI launcher and srun set them: rank 0 hosts the store.
  struct Style {
    const char* rank;
    const char* size;
    const char* name;
  };
  for (Style s :
       {Style{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
        Style{"PMI_RANK", "PMI_SIZE", "PMI"}, Style{"SLURM_PROCID", "SLURM_NTASKS", "Slurm"}}) {
    std::string common = "BATON_RENDEZVOUS=127.0.0.1:" + std::to_string(free_port()) +
                         " BATON_JOB_TOKEN=t0ken BATON_PEER_TIMEOUT=2 " + s.size + "=2 ";
    std::string cmd = common + s.rank + "=1 " + COMM_WORKER + " check & " + common + s.rank +
                      "=0 " + COMM_WORKER + " check; a=$?; wait $!; b=$?; exit $((a + b))";
    Result r = run(cmd);
    EXPECT_EQ(r.code, 0) << s.name << ":\n" << r.out;
    EXPECT_TRUE(has(r.out, std::string("rank 1 of 2 ok (ucx, ") + s.name + ")")) << r.out;
  }
}

// A rank with another token is bad input there, and rank 0 fails at once naming it (it
// had waited out the connect timeout and then called the rank not started, both exit 1).
TEST(Processes, AWrongTokenIsRefused) {
  std::string at = "BATON_RENDEZVOUS=127.0.0.1:" + std::to_string(free_port()) +
                   " BATON_WORLD_SIZE=2 BATON_CONNECT_TIMEOUT=20 ";
  std::string cmd = at + "BATON_JOB_TOKEN=right BATON_RANK=0 " + COMM_WORKER +
                    " check & sleep 0.3; " + at + "BATON_JOB_TOKEN=wrong BATON_RANK=1 " +
                    COMM_WORKER + " check; a=$?; wait $!; b=$?; echo codes $a $b";
  Result r = run(cmd);
  EXPECT_TRUE(has(r.out, "wrong job token")) << r.out;
  EXPECT_TRUE(has(r.out, "codes 2 2")) << r.out;  // bad input on both
  EXPECT_TRUE(has(r.out, "refused a connection")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 (BATON_RANK) on ")) << r.out;
  EXPECT_LT(r.secs, 10.0) << r.out;  // not the connect timeout
}

// Ranks started as srun would (SLURM_PROCID, SLURM_NTASKS), each with its own
// variables (after `common`), at once; every line of a rank's output is tagged "[name] ",
// and its exit code follows as "[name] code N".
std::string srun_ranks(const std::string& common,
                       const std::vector<std::pair<std::string, std::string>>& ranks) {
  std::string cmd;
  for (const auto& [name, vars] : ranks)
    cmd += "(" + vars + " " + common + " " + COMM_WORKER +
           " check 2>&1; echo code $?) | sed \"s/^/[" + name + "] /\" & ";
  return cmd + "wait";
}

std::string srun_common(int size) {
  return "BATON_RENDEZVOUS=127.0.0.1:" + std::to_string(free_port()) +
         " BATON_JOB_TOKEN=t0ken BATON_PEER_TIMEOUT=2 SLURM_NTASKS=" + std::to_string(size);
}

// Rank 2 of 3 never starts, and rank 0, which hosts the rendezvous, gives up first: rank 1
// names rank 2 too (it had read the store's end of file), with rank 0's exit code.
TEST(Processes, UnderSrunEveryRankNamesARankThatNeverStarted) {
  Result r = run(srun_ranks(srun_common(3) + " BATON_CONNECT_TIMEOUT=2",
                            {{"0", "SLURM_PROCID=0"}, {"1", "sleep 0.5; SLURM_PROCID=1"}}));
  EXPECT_TRUE(has(r.out, "[0] code 1")) << r.out;
  EXPECT_TRUE(has(r.out, "[1] code 1")) << r.out;
  EXPECT_TRUE(has(r.out, ": rank 0: rank 2 of 3 did not reach the rendezvous within 2 s")) << r.out;
  std::regex named(R"(\[1\] .*rank 2 of 3 did not reach the rendezvous within 2 s)");
  EXPECT_TRUE(std::regex_search(r.out, named)) << r.out;
  EXPECT_LT(r.secs, 8.0) << r.out;
}

// SLURM_NTASKS differs between ranks, either way round: bad input on both at once, naming
// both sizes (they had met, then blamed each other as dead after the peer timeout).
TEST(Processes, UnderSrunWorldSizesThatDifferFailEveryRank) {
  for (auto [size0, size1] : {std::pair{3, 2}, std::pair{2, 3}}) {
    const std::string common =
        "BATON_RENDEZVOUS=127.0.0.1:" + std::to_string(free_port()) +
        " BATON_JOB_TOKEN=t0ken BATON_PEER_TIMEOUT=2 BATON_CONNECT_TIMEOUT=20";
    Result r =
        run(srun_ranks(common, {{"0", "SLURM_PROCID=0 SLURM_NTASKS=" + std::to_string(size0)},
                                {"1", "SLURM_PROCID=1 SLURM_NTASKS=" + std::to_string(size1)}}));
    EXPECT_TRUE(has(r.out, "[0] code 2")) << r.out;
    EXPECT_TRUE(has(r.out, "[1] code 2")) << r.out;
    for (const char* rank : {"[0]", "[1]"}) {
      std::regex named(std::string(R"(\)") + rank +
                       R"( .*the ranks' world sizes differ: .*SLURM_NTASKS=\d.*SLURM_NTASKS=\d)");
      EXPECT_TRUE(std::regex_search(r.out, named)) << rank << "\n" << r.out;
    }
    EXPECT_TRUE(has(r.out, "(SLURM_NTASKS=2)")) << r.out;
    EXPECT_TRUE(has(r.out, "(SLURM_NTASKS=3)")) << r.out;
    EXPECT_LT(r.secs, 10.0) << r.out;
  }
}

// Two processes with SLURM_PROCID=1: bad input on all three, naming the rank (one had
// trained with rank 0, the other hung or lost its connection). Rank 2 of the world of 3
// never starts, so the rendezvous cannot be over before both have registered (a
// duplicate that comes after the world has met is refused alone: docs/transport.md).
TEST(Processes, UnderSrunTwoProcessesOfOneRankFailEveryRank) {
  Result r = run(srun_ranks(
      srun_common(3) + " BATON_CONNECT_TIMEOUT=20",
      {{"1", "SLURM_PROCID=1"}, {"1dup", "SLURM_PROCID=1"}, {"0", "sleep 0.3; SLURM_PROCID=0"}}));
  for (const char* name : {"0", "1", "1dup"}) {
    EXPECT_TRUE(has(r.out, std::string("[") + name + "] code 2")) << r.out;
    std::regex named(
        std::string(R"(\[)") + name +
        R"(\] .*rank 1 registered twice: rank 1 \(SLURM_PROCID\) on .* at 127\.0\.0\.1:\d+, and rank 1 \(SLURM_PROCID\) on .* at 127\.0\.0\.1:\d+: two processes were given one rank \(SLURM_PROCID=1\))");
    EXPECT_TRUE(std::regex_search(r.out, named)) << name << "\n" << r.out;
  }
  EXPECT_LT(r.secs, 10.0) << r.out;
}

// Rank 1 has another job token; rank 2 starts a second later, when the rendezvous has
// failed: rank 0, which hosts it, answers for a while, so rank 2 is told why (exit 2 at
// once) where it had found no server and waited out its connect timeout, told only
// "connection refused".
TEST(Processes, UnderSrunARankStartingAfterTheRendezvousFailedIsToldWhy) {
  const std::string common = srun_common(3) + " BATON_CONNECT_TIMEOUT=20";
  std::string cmd;
  for (const auto& [name, vars, after] :
       {std::tuple<std::string, std::string, std::string>{"0", "SLURM_PROCID=0", ""},
        {"1", "SLURM_PROCID=1", "BATON_JOB_TOKEN=another"},
        {"2", "sleep 1; SLURM_PROCID=2", ""}})
    cmd += "(" + vars + " " + common + " " + after + " " + COMM_WORKER +
           " check 2>&1; echo code $?) | sed \"s/^/[" + name + "] /\" & ";
  Result r = run(cmd + "wait");
  for (const char* name : {"0", "1", "2"}) {
    EXPECT_TRUE(has(r.out, std::string("[") + name + "] code 2")) << r.out;
    std::regex named(std::string(R"(\[)") + name +
                     R"(\] .*rank 1 \(SLURM_PROCID\) on .* presented a wrong job token)");
    EXPECT_TRUE(std::regex_search(r.out, named)) << name << "\n" << r.out;
  }
  EXPECT_LT(r.secs, 10.0) << r.out;
}

TEST(Processes, LauncherStopsTheJobWhenARankFailsAndNamesIt) {
  std::string cmd = std::string(BATON_BINARY) +
                    " launch -n 3 --grace 0.5 -- sh -c \"echo up \\$BATON_RANK; "
                    "if [ \\$BATON_RANK = 1 ]; then sleep 0.3; exit 7; fi; sleep 30\"";
  Result r = run(cmd);
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 2] up 2")) << r.out;
  EXPECT_TRUE(has(r.out, "the job failed: rank 1 exited with code 7; stopped rank(s) 0 and 2"))
      << r.out;
  EXPECT_LT(r.secs, 10.0);
}

// Checks that every survivor reported a PeerError naming the victim, soon enough.
void expect_survivors_name(const Result& r, int n, int victim, double kill_at, double bound) {
  std::regex line(R"((?:\[rank \d+\] )?rank (\d+): PeerError peer=(\d+) after ([0-9.]+) s: (.*))");
  int seen = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line);
       it != std::sregex_iterator(); ++it) {
    int who = std::stoi((*it)[1]);
    int peer = std::stoi((*it)[2]);
    double after = std::stod((*it)[3]);
    EXPECT_NE(who, victim);
    EXPECT_EQ(peer, victim) << (*it)[0];
    EXPECT_NE((*it)[4].str().find("rank " + std::to_string(victim)), std::string::npos) << (*it)[0];
    EXPECT_LT(after - kill_at, bound) << (*it)[0];
    ++seen;
  }
  EXPECT_EQ(seen, n - 1) << r.out;
}

TEST(Processes, AKilledRankIsNamedByEveryOther) {
  // Rank 2 of 4 is SIGKILLed 1.5 s into a loop of 16 MiB all-reduces. With a 2 s peer
  // timeout, the others must fail within 2.5 s of it, naming rank 2.
  Result r = run(launch(4, "kill 2 1500", "--grace 10"));
  EXPECT_EQ(r.code, 128 + 9) << r.out;
  // The survivors' reports name it; the launcher names it the cause and says who lost it
  // (not the survivors, which exited first, as the cause).
  EXPECT_TRUE(has(r.out,
                  "the job failed: rank 2 was killed by signal 9 (SIGKILL); ranks 0, 1 "
                  "and 3 lost it\n"))
      << r.out;
  expect_survivors_name(r, 4, 2, 1.5, 2.5 + 1.0);
  EXPECT_LT(r.secs, 15.0) << r.out;
  std::printf("%s", r.out.c_str());
}

// A message the dead peer sent by rendezvous (1 MiB), still queued at the receiver when it
// asks for it: a PeerError naming the peer, not a hang or a crash. Receiving it would need
// the peer's endpoint, closed when the peer was found dead; UCX 1.13 once asserted inside
// that receive in CI (AKilledRankIsNamedByEveryOther). This run does not reproduce that
// crash without the fix (it also passes without it: the assertion needs the closed
// endpoint's memory reused meanwhile); it checks the outcome.
TEST(Processes, ADeadPeersRendezvousMessageIsAPeerError) {
  Result r = run(launch(2, "late", "--grace 10"));
  EXPECT_TRUE(has(r.out, "late: PeerError peer=1\n")) << r.out;
  EXPECT_FALSE(has(r.out, "Assertion")) << r.out;
  EXPECT_LT(r.secs, 15.0) << r.out;
}

// A rank killed half-way through writing into another's shared-memory FIFO leaves it
// deaf to every message through that FIFO, for good. The liveness protocol does not go
// through it: the deafened rank still answers pings, finds the dead one and tells the
// others. Before it went by UDP, rank 2 named the live rank 1 (CI saw this with killed
// engine ranks).
TEST(Processes, ARankDeafenedByAPeerKilledMidMessageStillAnswersAndNamesIt) {
  Result r = run(launch(3, "wedge", "--grace 10"));
  EXPECT_TRUE(has(r.out, "victim: dying inside a send now")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "the job failed: rank 0 was killed by signal 9 (SIGKILL); ranks 1 and 2 "
                  "lost it\n"))
      << r.out;
  // Rank 1 waits on rank 0 from 1.3 s: found within 1.125 timeouts of that.
  expect_survivors_name(r, 3, 0, 0.3, 1.0 + 2.25 + 1.0);
  EXPECT_LT(r.secs, 15.0) << r.out;
}

TEST(Processes, RanksThatNeverArriveAreNamedByTheOthersAndTheLauncher) {
  // Ranks 0 and 1 of a world of 4 start; 2 and 3 never do (their host's launcher never
  // came). Both fail within the connect timeout naming the missing ranks, and the
  // launcher's summary says it.
  std::string cmd = std::string("BATON_CONNECT_TIMEOUT=1 ") + BATON_BINARY +
                    " launch -n 2 --grace 5 -- sh -c \"BATON_WORLD_SIZE=4 exec " + COMM_WORKER +
                    " check\"";
  Result r = run(cmd);
  EXPECT_EQ(r.code, 1) << r.out;
  for (int rank : {0, 1})
    EXPECT_TRUE(has(r.out, "rank " + std::to_string(rank) +
                               ": ranks 2 and 3 of 4 did not reach the rendezvous within 1 s"))
        << r.out;
  EXPECT_TRUE(has(r.out,
                  "the job failed: rank 0 exited with code 1: rank 0: ranks 2 and 3 of 4 "
                  "did not reach the rendezvous within 1 s (BATON_CONNECT_TIMEOUT)") ||
              has(r.out,
                  "the job failed: rank 1 exited with code 1: rank 1: ranks 2 and 3 of 4 "
                  "did not reach the rendezvous within 1 s (BATON_CONNECT_TIMEOUT)"))
      << r.out;
  EXPECT_LT(r.secs, 5.0) << r.out;
}

TEST(Processes, AStoppedRankIsNamedByEveryOther) {
  // Alive but silent (SIGSTOP): found by the liveness pings, not by a broken connection.
  Result r = run(launch(3, "hang 1 1500", "--grace 1"));
  EXPECT_NE(r.code, 0) << r.out;
  expect_survivors_name(r, 3, 1, 1.5, 2.5 + 1.0);
  EXPECT_LT(r.secs, 20.0) << r.out;
  std::printf("%s", r.out.c_str());
}

// The whole job stopped for longer than the peer timeout (SIGSTOP to every rank, as a
// host that gives the job's cores to others for seconds), each rank waiting on another:
// once continued, nobody is declared failed. Every rank's progress thread had been held
// too, so the silence was no answer to a ping; before, each rank's first liveness tick
// after the pause declared its peer dead (both at the same instant, seen under load with
// 2 and 8 ranks), and now silence counts only while the rank itself could listen.
TEST(Processes, AJobStoppedWholeLongerThanThePeerTimeoutGoesOn) {
  const std::string dir = ::testing::TempDir() + "pause." + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cmd = std::string("BATON_PEER_TIMEOUT=1 ") + BATON_BINARY +
                          " launch -n 2 --grace 5 -- " + COMM_WORKER + " pause " + dir +
                          " & L=$!; for i in $(seq 600); do [ -e " + dir + "/ready.0 ] && [ -e " +
                          dir + "/ready.1 ] && break; sleep 0.05; done; P=$(pgrep -P $L); " +
                          "kill -STOP $P; sleep 2.5; kill -CONT $P; touch " + dir + "/go; wait $L";
  Result r = run(cmd);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "rank 0: resumed ok")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1: resumed ok")) << r.out;
  EXPECT_FALSE(has(r.out, "no answer")) << r.out;
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// Two hosts made of two network namespaces joined by a veth pair: one rank in each,
// UCX over TCP between them, the rendezvous on the first one's veth address.
class NetnsHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (CAP_NET_ADMIN) to create network namespaces";
    tag_ = std::to_string(getpid() % 100000);
    a_ = "btn" + tag_ + "a";
    b_ = "btn" + tag_ + "b";
    Result probe = run("ip netns add " + a_);
    if (probe.code != 0) GTEST_SKIP() << "cannot create a network namespace here: " << probe.out;
    created_ = true;
    std::string va = "vbt" + tag_ + "a", vb = "vbt" + tag_ + "b";
    std::string setup = "set -e; ip netns add " + b_ + "; ip link add " + va +
                        " type veth peer name " + vb + "; ip link set " + va + " netns " + a_ +
                        "; ip link set " + vb + " netns " + b_ + "; ip -n " + a_ +
                        " addr add 10.231.7.1/24 dev " + va + "; ip -n " + b_ +
                        " addr add 10.231.7.2/24 dev " + vb + "; ip -n " + a_ + " link set " + va +
                        " up; ip -n " + b_ + " link set " + vb + " up; ip -n " + a_ +
                        " link set lo up; ip -n " + b_ + " link set lo up";
    Result r = run(setup);
    ASSERT_EQ(r.code, 0) << r.out;
    va_ = va;
    vb_ = vb;
  }
  // The namespaces go even when the test failed; deleting them deletes the veth pair.
  void TearDown() override {
    if (created_) run("ip netns del " + a_ + "; ip netns del " + b_ + " 2>/dev/null; true");
  }

  std::string tag_, a_, b_, va_, vb_;
  bool created_ = false;
};

TEST_F(NetnsHosts, RanksOnTwoHostsTalkOverTcp) {
  std::string common =
      "BATON_WORLD_SIZE=2 BATON_RENDEZVOUS=10.231.7.1:29517 BATON_JOB_TOKEN=netns-" + tag_ +
      " BATON_PEER_TIMEOUT=5 UCX_TLS=tcp ";
  std::string cmd = "ip netns exec " + a_ + " env " + common + "UCX_NET_DEVICES=" + va_ +
                    " BATON_RANK=0 " + COMM_WORKER + " check & ip netns exec " + b_ + " env " +
                    common + "UCX_NET_DEVICES=" + vb_ + " BATON_RANK=1 " + COMM_WORKER +
                    " check; a=$?; wait $!; b=$?; echo codes $a $b";
  Result r = run(cmd, 90);
  EXPECT_TRUE(has(r.out, "codes 0 0")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 0 of 2 ok (ucx, baton launch)")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 1 of 2 ok (ucx, baton launch)")) << r.out;
  std::printf("two namespaces over TCP: %.2f s\n", r.secs);
}

}  // namespace

namespace {

TEST_F(NetnsHosts, AKilledRankOnTheOtherHostIsNamed) {
  std::string common =
      "BATON_WORLD_SIZE=2 BATON_RENDEZVOUS=10.231.7.1:29518 BATON_JOB_TOKEN=netns-" + tag_ +
      " BATON_PEER_TIMEOUT=2 UCX_TLS=tcp ";
  std::string cmd = "ip netns exec " + a_ + " env " + common + "UCX_NET_DEVICES=" + va_ +
                    " BATON_RANK=0 " + COMM_WORKER + " kill 1 1000 & ip netns exec " + b_ +
                    " env " + common + "UCX_NET_DEVICES=" + vb_ + " BATON_RANK=1 " + COMM_WORKER +
                    " kill 1 1000; wait $!; echo code0 $?";
  Result r = run(cmd, 90);
  EXPECT_TRUE(has(r.out, "code0 3")) << r.out;
  expect_survivors_name(r, 2, 1, 1.0, 2.5 + 1.0);
}

}  // namespace
