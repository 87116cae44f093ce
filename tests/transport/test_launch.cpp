// `baton launch --max-restarts`: a job that keeps failing is restarted N times with
// BATON_RESUME=1, each failure and restart is logged, and then the launcher gives up
// with the list; bad input (exit code 2) is not restarted; a job that succeeds after a
// restart exits 0. The ranks are shell commands: no transport is involved.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/command_runner.h"

namespace {

using Result = baton::cli_testing::CommandResult;

Result run(const std::string& args) {
  return baton::cli_testing::run_command(std::string(BATON_BINARY) + " launch " + args);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Launch, RestartsUpToTheLimitThenGivesUpWithTheList) {
  Result r =
      run("-n 2 --max-restarts 2 --restart-backoff 0.05 -- "
          "sh -c 'echo \"attempt resume=$BATON_RESUME restart=$BATON_RESTART\"; "
          "[ $BATON_RANK = 1 ] && exit 3; sleep 0.2'");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_EQ(count(r.output, "[rank 0] attempt resume=0 restart=0"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "[rank 1] attempt resume=1 restart=1"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "[rank 1] attempt resume=1 restart=2"), 1u) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 2 in 0.05 s after: rank 1 exited with code 3"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("restart 2 of 2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 3 of"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("giving up after 2 restart(s); the failures:\n"
                          "  1. rank 1 exited with code 3\n"
                          "  2. rank 1 exited with code 3\n"
                          "  3. rank 1 exited with code 3\n"),
            std::string::npos)
      << r.output;
}

TEST(Launch, ARestartedJobThatSucceedsExitsZero) {
  std::string marker = ::testing::TempDir() + "/launch_restart_marker";
  std::filesystem::remove(marker);
  // Rank 0 is killed by a signal in the first attempt only.
  Result r = run(
      "-n 2 --max-restarts 1 --restart-backoff 0 -- sh -c '"
      "if [ $BATON_RANK = 0 ] && [ ! -e " +
      marker + " ]; then touch " + marker + "; kill -9 $$; fi; echo done resume=$BATON_RESUME'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 in 0 s after: rank 0 was killed by signal 9 (SIGKILL)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, "done resume=1"), 2u) << r.output;
}

// The launcher stopped by SIGTERM (here from a rank): the job ends with 128 + 15 saying so,
// not as a failure of ranks that lost a peer, and is not restarted.
TEST(Launch, AStopSignalEndsTheJobSayingSo) {
  Result r =
      run("-n 2 --max-restarts 2 --restart-backoff 0 -- sh -c '"
          "[ $BATON_RANK = 0 ] && sleep 0.3 && kill -TERM $PPID; sleep 5'");
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.output;
  EXPECT_NE(r.output.find("baton launch: the job was stopped by SIGTERM"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("lost a peer"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 1"), std::string::npos) << r.output;
}

TEST(Launch, BadInputIsNotRestarted) {
  Result r = run("-n 1 --max-restarts 5 --restart-backoff 0 -- sh -c 'exit 2'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("not restarting: exit code 2 is bad input"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restart 1 of"), std::string::npos) << r.output;
  r = run("-n 1 --max-restarts -1 -- true");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--max-restarts: expected a number >= 0, got -1"), std::string::npos)
      << r.output;
  r = run("-n 1 --restart-backoff -3 -- true");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--restart-backoff"), std::string::npos) << r.output;
}

// The failure reports the ranks leave (BATON_FAILURE_REPORT, written here by the shell
// ranks as baton's commands write them): the launcher's summary names the cause they saw.
std::string launch_report(const std::string& peer, const std::string& host,
                          const std::string& peer_host, const std::string& error) {
  // Inside the single-quoted script of sh -c: printf "{\"rank\": %s, ...}" $BATON_RANK.
  std::string json =
      R"({\"rank\": %s, \"host\": \")" + host + R"(\", \"error\": \")" + error + R"(\")";
  if (!peer.empty())
    json += R"(, \"peer\": )" + peer + R"(, \"peer_host\": \")" + peer_host + R"(\")";
  return "printf \"" + json + "}\" $BATON_RANK > \"$BATON_FAILURE_REPORT\"; exit 1";
}

TEST(Launch, TheSummaryNamesWhatTheRanksReported) {
  // Rank 2 is killed; the others report losing it (and exit first): the killed rank is the
  // cause, and the summary says who lost it.
  Result r = run("-n 3 --grace 5 -- sh -c '[ $BATON_RANK = 2 ] && { sleep 0.3; kill -9 $$; }; " +
                 launch_report("2", "h", "h", "rank 2 failed: connection lost") + "'");
  EXPECT_EQ(r.code, 137) << r.output;
  EXPECT_NE(r.output.find("the job failed: rank 2 was killed by signal 9 (SIGKILL); ranks 0 and "
                          "1 lost it\n"),
            std::string::npos)
      << r.output;
  // Rank 1 fails of its own error, rank 0 then loses it: rank 1 is the cause, with its
  // error, whichever exit the launcher saw first.
  r = run("-n 2 --grace 5 -- sh -c 'if [ $BATON_RANK = 1 ]; then sleep 0.3; " +
          launch_report("", "h", "", "out of memory") + "; fi; " +
          launch_report("1", "h", "h", "rank 1 left the job") + "'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("the job failed: rank 1 exited with code 1: out of memory; rank 0 lost "
                          "it\n"),
            std::string::npos)
      << r.output;
  // baton's own commands write the report: bad input, named in the summary.
  r = run("-n 1 -- " + std::string(BATON_BINARY) + " train --plan /nonexistent/plan.json --data x");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the job failed: rank 0 exited with code 2: /nonexistent/plan.json"),
            std::string::npos)
      << r.output;
  // Both lost the other, on two hosts, and nobody died: the link between them, named.
  r = run("-n 2 --grace 5 -- sh -c 'if [ $BATON_RANK = 0 ]; then " +
          launch_report("1", "a", "b", "no answer") + "; fi; sleep 0.2; " +
          launch_report("0", "b", "a", "no answer") + "'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("the job failed: every rank that failed lost a peer: rank 1 on b lost "
                          "rank 0 on a, rank 0 on a lost rank 1 on b (no rank died or hung: the "
                          "network between a and b?)\n"),
            std::string::npos)
      << r.output;
}

TEST(Launch, ARendezvousPortInUseIsAClearError) {
  // Another process's listener on the port (here: this test's socket).
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  Result r = run("-n 1 --rendezvous 127.0.0.1:" + port + " -- true");
  close(fd);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("rendezvous: cannot listen on 127.0.0.1:" + port +
                          ": bind: Address already in use"),
            std::string::npos)
      << r.output;
}

}  // namespace
