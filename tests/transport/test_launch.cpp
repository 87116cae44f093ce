// `baton launch --max-restarts`: a job that keeps failing is restarted N times with
// BATON_RESUME=1, each failure and restart is logged, and then the launcher gives up
// with the list; bad input (exit code 2) is not restarted; a job that succeeds after a
// restart exits 0. The ranks are shell commands: no transport is involved. Also
// `baton bench comm`'s buffers and its refusals of options that measure nothing.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// OpenMP's threads spin briefly between parallel regions unless the user says otherwise:
// baton sets GOMP_SPINCOUNT=3000 and executes itself again (libgomp reads it once, when it
// loads), so the ranks it starts inherit it; the process keeps its name (pgrep baton), and
// the marker of the re-executed process does not reach them.
TEST(Launch, RanksSpinBrieflyBetweenParallelRegionsUnlessTheUserSaysOtherwise) {
  const std::string show =
      " launch -n 1 -- sh -c 'echo \"spin=$GOMP_SPINCOUNT policy=$OMP_WAIT_POLICY "
      "marker=$BATON_REEXEC launcher=$(cat /proc/$PPID/comm)\"'";
  const std::string clean = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ";
  Result r = baton::cli_testing::run_command(clean + BATON_BINARY + show);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] spin=3000 policy= marker= launcher=baton"), std::string::npos)
      << r.output;
  for (const std::string mine : {"OMP_WAIT_POLICY=active", "GOMP_SPINCOUNT=1000"}) {
    r = baton::cli_testing::run_command(clean + mine + " " + BATON_BINARY + show);
    EXPECT_EQ(r.code, 0) << r.output;
    const std::string want = mine == "OMP_WAIT_POLICY=active" ? "spin= policy=active marker="
                                                              : "spin=1000 policy= marker=";
    EXPECT_NE(r.output.find("[rank 0] " + want), std::string::npos) << mine << "\n" << r.output;
  }
}

// Started under another name (a link, `baton-dev`), a process that re-executed itself keeps
// that name: pgrep and killall look for it. A launcher does not re-execute at all.
TEST(Launch, ARelinkedBatonKeepsItsNameAfterItsReexecution) {
  const std::string dir = ::testing::TempDir() + "relinked";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/m.json")
      << R"({"type": "gpt2", "name": "g", "n_layer": 1, "n_head": 1, "n_embd": 8,
             "n_positions": 8, "vocab_size": 256})";
  const std::string link = dir + "/baton-dev";
  std::filesystem::remove(link);
  std::filesystem::create_symlink(BATON_BINARY, link);
  Result r = baton::cli_testing::run_command(
      "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " + link + " train --model " + dir +
      "/m.json --data " + BATON_BINARY +
      " --steps 100000000 --log-every 0 > /dev/null 2>&1 & P=$!; sleep 0.5; cat /proc/$P/comm; "
      "kill $P; wait $P");
  EXPECT_NE(r.output.find("baton-dev\n"), std::string::npos) << r.output;
}

// A launcher started ignoring SIGTSTP (`trap '' TSTP`) keeps ignoring it: the job runs on.
TEST(Launch, AnIgnoredSigtstpStaysIgnored) {
  Result r = baton::cli_testing::run_command(
      "sh -c \"trap '' TSTP; exec " + std::string(BATON_BINARY) +
      " launch -n 1 -- sh -c 'kill -TSTP \\$PPID; sleep 0.3; echo ran on'\"");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] ran on"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("suspended"), std::string::npos) << r.output;
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

// Ctrl-Z (SIGTSTP to the launcher alone: the ranks have process groups of their own)
// suspends the whole job, as a shell's job, and SIGCONT to the launcher continues it: the
// ranks had run on without it. Rank 1 ticks every 0.05 s; the launcher is suspended for
// about 1 s (a helper of its own session continues it).
TEST(Launch, CtrlZSuspendsTheWholeJobAndFgContinuesIt) {
  Result r = run(
      "-n 2 -- sh -c 'if [ $BATON_RANK = 0 ]; then setsid sh -c \"sleep 1.3; kill -CONT $PPID\" "
      "& sleep 0.3; kill -TSTP $PPID; else i=0; while [ $i -lt 40 ]; do date +%s%N; sleep 0.05; "
      "i=$((i+1)); done; fi'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("baton launch: suspended by SIGTSTP, every rank with it"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("was stopped by"), std::string::npos) << r.output;
  std::istringstream lines(r.output);
  std::vector<int64_t> ticks;
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("[rank 1] ", 0) == 0) ticks.push_back(std::stoll(line.substr(9)));
  ASSERT_EQ(ticks.size(), 40u) << r.output;
  int64_t gap = 0;
  for (size_t i = 1; i < ticks.size(); ++i) gap = std::max(gap, ticks[i] - ticks[i - 1]);
  EXPECT_GT(gap, 700'000'000) << "rank 1 did not stop with the launcher";
}

// A stop signal sent to the ranks themselves (a scheduler signalling every process): each
// ending by it, during set-up (killed by the signal) or after its step (`baton train`'s
// 128 + the signal), is a stop, not a failure: no restart. A rank that failed otherwise
// beside one that stopped is the cause, its code the job's.
TEST(Launch, RanksStoppedBySignalsSentToThemAreAStop) {
  Result killed = run(
      "-n 2 --max-restarts 1 --restart-backoff 0 -- sh -c 'echo attempt; kill -TERM $$; sleep 5'");
  EXPECT_EQ(killed.code, 128 + SIGTERM) << killed.output;
  EXPECT_NE(killed.output.find("the job was stopped by SIGTERM sent to its ranks"),
            std::string::npos)
      << killed.output;
  EXPECT_EQ(count(killed.output, "attempt"), 2u) << killed.output;  // one per rank, once
  Result exited = run("-n 2 --max-restarts 1 --restart-backoff 0 -- sh -c 'exit 130'");
  EXPECT_EQ(exited.code, 128 + SIGINT) << exited.output;
  EXPECT_NE(exited.output.find("the job was stopped by SIGINT sent to its ranks"),
            std::string::npos)
      << exited.output;
  EXPECT_EQ(exited.output.find("restart 1"), std::string::npos) << exited.output;
  Result mixed =
      run("-n 2 -- sh -c 'if [ $BATON_RANK = 0 ]; then exit 143; else sleep 0.3; exit 1; fi'");
  EXPECT_EQ(mixed.code, 1) << mixed.output;
  EXPECT_NE(mixed.output.find("the job failed: rank 1 exited with code 1"), std::string::npos)
      << mixed.output;
}

// A hangup (a closed terminal) stops the job as SIGTERM does: UCX's handler for its debug
// signal had swallowed it (the job outlived its terminal). A reader that goes away (`|
// head`) stops the job too, in order: the ranks get SIGTERM (the launcher had died of
// SIGPIPE, its ranks SIGKILLed by PDEATHSIG) and the reports' directory is removed.
TEST(Launch, AHangupOrAClosedOutputStopsTheJobInOrder) {
  // env --default-signal: SIGHUP as a terminal's job has it, even if the suite's is ignored.
  Result r = baton::cli_testing::run_command(
      "env --default-signal=HUP " + std::string(BATON_BINARY) +
      " launch -n 2 -- sh -c '[ $BATON_RANK = 0 ] && sleep 0.3 && kill -HUP $PPID; sleep 5'");
  EXPECT_EQ(r.code, 128 + SIGHUP) << r.output;
  EXPECT_NE(r.output.find("baton launch: the job was stopped by SIGHUP"), std::string::npos)
      << r.output;
  // Started under nohup, a hangup is ignored.
  r = baton::cli_testing::run_command(
      "nohup " + std::string(BATON_BINARY) +
      " launch -n 1 -- sh -c 'sleep 0.3; kill -HUP $PPID; sleep 0.3; echo survived' 2>&1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] survived"), std::string::npos) << r.output;

  const std::string dir =
      ::testing::TempDir() + "/launch_closed_output." + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/tmp");
  r = baton::cli_testing::run_command(
      "cd " + dir + " && (TMPDIR=" + dir + "/tmp timeout 60 " + std::string(BATON_BINARY) +
      " launch -n 2 -- sh -c 'trap \"touch term.$BATON_RANK; exit 0\" TERM; "
      "touch up.$BATON_RANK; until [ -e up.0 ] && [ -e up.1 ]; do sleep 0.01; done; "
      "while :; do echo line; sleep 0.01; done' 2>launcher.err; echo $? >code) | head -n 1");
  EXPECT_EQ(baton::cli_testing::run_command("cat " + dir + "/code").output,
            std::to_string(128 + SIGPIPE) + "\n");
  const std::string err = baton::cli_testing::run_command("cat " + dir + "/launcher.err").output;
  EXPECT_NE(err.find("its output was closed; stopping every rank"), std::string::npos) << err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/term.0") && std::filesystem::exists(dir + "/term.1"))
      << "the ranks were not stopped by SIGTERM: " << err;
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/tmp")) << "the reports' directory was left";
  std::filesystem::remove_all(dir);
}

// Open files: the launcher raises its soft limit to the hard one (64 ranks at a soft limit
// of 100 had left the rendezvous's accept spinning on EMFILE while ranks timed out, nothing
// saying why), and refuses a job the hard limit cannot hold, before starting any rank.
TEST(Launch, OpenFilesLimitIsRaisedOrTheJobRefused) {
  const std::string launch = std::string(BATON_BINARY) + " launch -n 64 -- true";
  Result r =
      baton::cli_testing::run_command("ulimit -Sn 100 && ulimit -Hn 4096 && timeout 120 " + launch);
  EXPECT_EQ(r.code, 0) << r.output;
  r = baton::cli_testing::run_command("ulimit -n 100 && timeout 60 " + launch);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("launch: -n 64 needs about 256 open files (3 per rank), and this "
                          "process may open 100 (ulimit -n; hard limit 100)"),
            std::string::npos)
      << r.output;
}

// A launcher killed with SIGKILL leaves its reports' directory: the next launch of the
// user in the same pid space (host boot and pid namespace, named in the directory) removes
// those whose launcher is gone, and keeps a live one's and another space's.
TEST(Launch, DirectoriesOfKilledLaunchersAreRemovedByTheNext) {
  const std::string dir = ::testing::TempDir() + "/launch_dead_dirs." + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/tmp");
  const std::string launch =
      "TMPDIR=" + dir + "/tmp timeout 60 " + std::string(BATON_BINARY) + " launch -n 1 -- ";
  // This host's space, from a rank's report path: <tmp>/baton-launch-<space>-<pid>.XXXXXX/...
  Result r = baton::cli_testing::run_command(launch + "sh -c 'echo \"$BATON_FAILURE_REPORT\"'");
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("/baton-launch-");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string space = r.output.substr(at + 14, 16);
  ASSERT_EQ(r.output[at + 30], '-') << r.output;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const std::string tmp = dir + "/tmp/baton-launch-";
  const std::string dead = tmp + space + "-" + std::to_string(child) + ".AbC123";
  const std::string alive = tmp + space + "-" + std::to_string(::getpid()) + ".XyZ789";
  const std::string elsewhere = tmp + "0123456789abcdef-" + std::to_string(child) + ".QrS456";
  for (const std::string& d : {dead, alive, elsewhere}) std::filesystem::create_directories(d);
  std::ofstream(dead + "/rank-0.json") << "{}";
  r = baton::cli_testing::run_command(launch + "true");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(alive));
  EXPECT_TRUE(std::filesystem::exists(elsewhere));
  size_t left = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/tmp"))
    left += e.path() != alive && e.path() != elsewhere;
  EXPECT_EQ(left, 0u) << "a launch left its own directory";
  std::filesystem::remove_all(dir);
}

// `baton train` ends on a hangup as any program does (129): UCX, loaded with baton, had
// taken SIGHUP for its debug handler, which swallowed it and, not being
// async-signal-safe, corrupted the heap when hangups came in a row.
TEST(Signals, AHangupEndsBatonTrain) {
  const std::string dir = ::testing::TempDir() + "/train_hangup." + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Result r = baton::cli_testing::run_command(
      "cd " + dir +
      " && echo '{\"type\": \"mlp\", \"name\": \"m\", \"vocab_size\": 256, \"context\": "
      "8, \"n_embd\": 8, \"hidden\": [16]}' > m.json && seq 1 5000 > d.txt && env "
      "--default-signal=HUP sh -c '" +
      std::string(BATON_BINARY) +
      " train --model m.json --data d.txt --steps 100000000 --threads 1 --log-every 0 & "
      "p=$!; sleep 1; for i in 1 2 3; do kill -HUP $p; done; wait $p; echo rc=$?'");
  EXPECT_NE(r.output.find("rc=129"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// A rank of another baton build (a hello of protocol version 1, as builds before the
// rank's fields were versioned sent) that reads the refusal as an error of its own and
// exits 1: the launcher names the rendezvous's reason and does not restart into it.
TEST(Launch, ARankOfAnotherBuildIsNamedAndNotRestarted) {
  const std::string script = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-old-rank.sh";
  {
    std::ofstream f(script);
    f << R"(#!/bin/bash
le32() { printf "\\x$(printf %02x $(($1 & 255)))\\x$(printf %02x $((($1 >> 8) & 255)))\\x00\\x00"; }
tok=$BATON_JOB_TOKEN
exec 3<>"/dev/tcp/${BATON_RENDEZVOUS%:*}/${BATON_RENDEZVOUS##*:}"
{ le32 $((9 + ${#tok})); printf '\x01'; le32 1; le32 ${#tok}; printf %s "$tok"; } >&3
head -c 1 <&3 >/dev/null
exit 1
)";
  }
  Result r = run("-n 2 --max-restarts 3 --restart-backoff 0 -- bash " + script);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the rendezvous refused the job: a process at 127.0.0.1:"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("runs another baton build (protocol version 1"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restart 1 of"), std::string::npos) << r.output;
  std::filesystem::remove(script);
}

// UCX variables UCX cannot use are bad input naming them, not restarted: a value it
// refuses to read, and one it reads but finds no transport under (UCX_TLS=bogus had been
// "UCX call st failed: No such device", exit 1, restarted into again).
TEST(Launch, UcxVariablesUcxCannotUseAreBadInput) {
  const std::string b = BATON_BINARY;
  const std::string job = " launch -n 2 --max-restarts 1 --restart-backoff 0 -- " + b +
                          " bench comm --op all_reduce --min-bytes 8 --max-bytes 8 --reps 1";
  for (const auto& [var, says] :
       {std::pair<std::string, std::string>{"UCX_TLS=bogus", "UCX found no usable transport"},
        {"UCX_RNDV_THRESH=abc", "UCX refused its configuration"}}) {
    Result r = baton::cli_testing::run_command("env " + var + " " + b + job);
    EXPECT_EQ(r.code, 2) << var << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("the UCX_ variables set: " + var), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("restart 1 of"), std::string::npos) << r.output;
  }
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

// What a rank left running (a background process holding its output) is stopped with
// its process group, and the job ends: the launcher had waited for it, deaf to signals.
// Nothing of the launcher's is inherited: no socket (the rendezvous's had stayed open in
// every rank, and a restart could not listen again).
TEST(Launch, WhatARankLeavesIsStoppedAndNothingOfOursIsInherited) {
  const auto start = std::chrono::steady_clock::now();
  Result r =
      run("-n 2 --grace 0.2 -- sh -c 'sleep 67 & ls -l /proc/$$/fd | grep -c socket; "
          "[ $BATON_RANK = 1 ] && exit 3; sleep 67'");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(took, 15.0) << r.output;
  EXPECT_EQ(count(r.output, "] 0\n"), 2u) << r.output;  // no socket in either rank
  Result left = baton::cli_testing::run_command("pgrep -fx 'sleep 67' | wc -l");
  EXPECT_EQ(left.output, "0\n") << "a rank's background process outlived the job";
  // Every rank done, one's background process still writing: it is given kill_after (3 s),
  // then stopped, and the job ends with the ranks' code.
  r = run("-n 1 -- sh -c '(sleep 60; echo late) & echo done'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] done"), std::string::npos) << r.output;
}

// A signal the launcher was started ignoring (nohup's SIGHUP) stays ignored in the ranks,
// as in any exec'd command: they had been reset to the default, so a hangup killed a
// nohup'd job's ranks.
TEST(Launch, RanksInheritTheSignalsTheLauncherWasStartedIgnoring) {
  Result r = baton::cli_testing::run_command("trap '' HUP; " + std::string(BATON_BINARY) +
                                             " launch -n 1 -- grep SigIgn /proc/self/status");
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("SigIgn:");
  ASSERT_NE(at, std::string::npos) << r.output;
  const unsigned long long ignored = std::stoull(r.output.substr(at + 7), nullptr, 16);
  EXPECT_EQ(ignored & (1ULL << (SIGHUP - 1)), 1ULL << (SIGHUP - 1)) << r.output;
}

// A second SIGINT or SIGTERM a second or more after the first kills at once (it had
// re-armed the wait, so a rank that ignores SIGTERM outlived any number of them), and the
// end says the ranks were killed mid-step, with no checkpoint of that stop (it had read as
// a clean stop); a command that cannot be run is bad input, named, and not restarted.
TEST(Launch, ASecondStopSignalKillsAndAMissingCommandIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  Result r = run(
      "-n 2 -- sh -c 'trap \"\" TERM; [ $BATON_RANK = 0 ] && "
      "(sleep 0.5; kill -INT $PPID; sleep 1.2; kill -INT $PPID) & while :; do sleep 0.1; done'");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.code, 128 + SIGINT) << r.output;
  EXPECT_LT(took, 3.2) << r.output;  // not after the 3 s that a first signal waits
  EXPECT_NE(r.output.find("got SIGINT again; killing every rank now"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank(s) 0 and 1 killed (SIGKILL) before finishing their step: this "
                          "stop wrote no checkpoint"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("stopped rank(s)"), std::string::npos) << r.output;  // not both
  r = run("-n 2 --max-restarts 2 -- no-such-command-baton-test --flag");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot run the command 'no-such-command-baton-test': No such file"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restart 1 of"), std::string::npos) << r.output;
  r = run("-n 1 --grace nan -- true");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--grace: expected seconds from 0 to 86400"), std::string::npos)
      << r.output;
  r = run("-n 1 --rendezvous :0 -- true");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--rendezvous=':0': expected host:port"), std::string::npos) << r.output;
}

// One signal sent twice at once (to the launcher and again, as `timeout` forwards a
// Ctrl-C) is one stop: the ranks finish in order (it had killed them mid-step). A launcher
// started ignoring SIGINT (a script's `baton launch &`) keeps ignoring it, as baton train
// does. Ranks read end of input, not the terminal (a rank that read it was stopped, and the
// job waited as paused), and output the launcher cannot write is exit 1, said.
TEST(Launch, SignalsTwiceAtOnceAreOneAndIgnoredOnesStayIgnored) {
  Result r =
      run("-n 2 -- sh -c 'trap \"sleep 0.5; exit 143\" TERM; [ $BATON_RANK = 0 ] && "
          "(sleep 0.5; kill -TERM $PPID; sleep 0.1; kill -TERM $PPID) & while :; do sleep 0.1; "
          "done'");
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.output;
  EXPECT_EQ(count(r.output, "baton launch: got SIGTERM"), 1u) << r.output;
  EXPECT_EQ(r.output.find("killed (SIGKILL)"), std::string::npos) << r.output;
  r = baton::cli_testing::run_command(
      "trap '' INT; " + std::string(BATON_BINARY) +
      " launch -n 1 -- sh -c 'kill -INT $PPID; sleep 0.3; read x; echo \"read [$x] $?\"'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] read [] 1"), std::string::npos) << r.output;
  r = baton::cli_testing::run_command("{ " + std::string(BATON_BINARY) +
                                      " launch -n 1 -- echo hello > /dev/full; }");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("baton launch: failed: writing the ranks' output: standard output: No "
                          "space left on device"),
            std::string::npos)
      << r.output;
}

// `baton launch` with an environment variable set for it and its ranks; the seconds it took.
Result run_with(const std::string& env, const std::string& args, double& took) {
  const auto start = std::chrono::steady_clock::now();
  Result r =
      baton::cli_testing::run_command(env + " " + std::string(BATON_BINARY) + " launch " + args);
  took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// A rank that exits 0 without reaching the rendezvous, while the others reached it, fails
// the job at once, named as the cause (the others had waited the connect timeout, 120 s,
// and the summary had blamed one of them).
TEST(Launch, ARankThatEndsBeforeTheRendezvousIsTheCause) {
  double took = 0;
  const Result r = run_with("BATON_CONNECT_TIMEOUT=60 timeout 100",
                            "-n 3 -- sh -c 'if [ $BATON_RANK = 1 ]; then exit 0; fi; exec " +
                                std::string(BATON_BINARY) + " bench comm --max-bytes 64 --reps 1'",
                            took);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(took, 45) << r.output;
  // Those that had reached it when the launcher looked (ranks 0 and 2, or one of them).
  EXPECT_NE(r.output.find("the job failed: rank 1 exited with code 0 before it reached the "
                          "rendezvous, where rank"),
            std::string::npos)
      << r.output;
  // Ranks that never rendezvous end as they like.
  EXPECT_EQ(run_with("", "-n 3 -- true", took).code, 0);
}

// A rank stopped after the others finished had kept the launcher waiting for ever (its
// peers, gone, could not time out on it): not continued within the peer timeout, it is the
// job's failure, named, with its stop's code (128 + SIGSTOP), alone too.
TEST(Launch, ARankThatStaysStoppedFailsTheJobAfterThePeerTimeout) {
  double took = 0;
  Result r = run_with("BATON_PEER_TIMEOUT=1",
                      "-n 2 -- sh -c 'sleep 0.3; [ $BATON_RANK = 0 ] && kill -STOP $$; "
                      "echo rank $BATON_RANK done'",
                      took);
  EXPECT_EQ(r.code, 128 + SIGSTOP) << r.output;
  EXPECT_LT(took, 15.0) << r.output;
  EXPECT_NE(r.output.find("[rank 1] rank 1 done"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the job failed: rank 0 stayed stopped by SIGSTOP for more than the "
                          "peer timeout of 1 s"),
            std::string::npos)
      << r.output;
  // Alone, every rank is stopped: a job paused whole gets the stall timeout.
  r = run_with("BATON_STALL_TIMEOUT=0.5", "-n 1 -- sh -c 'kill -STOP $$'", took);
  EXPECT_EQ(r.code, 128 + SIGSTOP) << r.output;
  EXPECT_LT(took, 15.0) << r.output;
  EXPECT_NE(r.output.find("rank 0 stayed stopped by SIGSTOP for more than the stall timeout of "
                          "0.5 s with every rank stopped"),
            std::string::npos)
      << r.output;
  // Every rank stopped longer than the peer timeout (a job paused whole), then continued:
  // the ranks ride that out, and so does the launcher.
  r = run_with("BATON_PEER_TIMEOUT=0.5",
               "-n 2 -- sh -c 'sleep 0.2; (sleep 2; kill -CONT $$) & kill -STOP $$; echo went on'",
               took);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "went on"), 2u) << r.output;
  // Continued in time, it is no failure.
  r = run_with("BATON_PEER_TIMEOUT=2",
               "-n 1 -- sh -c '(sleep 0.5; kill -CONT $$) & kill -STOP $$; echo went on'", took);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] went on"), std::string::npos) << r.output;
  r = run_with("BATON_PEER_TIMEOUT=soon", "-n 1 -- true", took);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("BATON_PEER_TIMEOUT='soon'"), std::string::npos) << r.output;
}

// Ranks of `baton train --plan` take 4 s as their peer timeout when BATON_PEER_TIMEOUT is
// unset; the launcher's stopped limit had said (and waited) the transport's 20 s. A
// stand-in named baton, its rank 0 stopping, shows the limit the launcher takes.
TEST(Launch, StoppedLimitOfPlanTrainingRanksIsTheirPeerTimeout) {
  const std::string dir = ::testing::TempDir() + "/launch_fake_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/baton") << "#!/bin/sh\nsleep 0.3; [ $BATON_RANK = 0 ] && kill -STOP $$\n"
                                   "echo rank $BATON_RANK done\n";
  std::filesystem::permissions(dir + "/baton", std::filesystem::perms::owner_all);
  double took = 0;
  Result r = run_with("env -u BATON_PEER_TIMEOUT",
                      "-n 2 -- " + dir + "/baton train --plan plan.json --data x", took);
  EXPECT_EQ(r.code, 128 + SIGSTOP) << r.output;
  EXPECT_LT(took, 15.0) << r.output;
  EXPECT_NE(r.output.find("rank 0 stayed stopped by SIGSTOP for more than the peer timeout of 4 s"),
            std::string::npos)
      << r.output;
  std::filesystem::remove_all(dir);
}

// A rank that stays stopped is a failure that --max-restarts restarts, as a crash.
TEST(Launch, ARankThatStaysStoppedIsRestarted) {
  std::string marker = ::testing::TempDir() + "/launch_stop_marker";
  std::filesystem::remove(marker);
  double took = 0;
  Result r = run_with("BATON_PEER_TIMEOUT=1",
                      "-n 2 --max-restarts 1 --restart-backoff 0 -- sh -c '"
                      "if [ $BATON_RANK = 0 ] && [ ! -e " +
                          marker + " ]; then touch " + marker +
                          "; kill -STOP $$; fi; echo done resume=$BATON_RESUME'",
                      took);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_LT(took, 15.0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 in 0 s after: rank 0 stayed stopped by SIGSTOP for "
                          "more than the peer timeout of 1 s"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, "done resume=1"), 2u) << r.output;
}

// A stopped rank cannot exit on its own: it is killed at once, not after the --grace (then
// ended by the launcher's SIGTERM, exit 143), and the job's code is its stop's. Found by the
// launcher, the others (here waiting as at a rendezvous) get no grace either.
TEST(Launch, AStoppedRankIsKilledAtOnceNotAfterTheGrace) {
  double took = 0;
  Result r = run_with("BATON_PEER_TIMEOUT=60",
                      "-n 2 --grace 30 -- sh -c 'if [ $BATON_RANK = 0 ]; then kill -STOP $$; "
                      "else sleep 0.5; exit 3; fi'",
                      took);
  EXPECT_EQ(r.code, 128 + SIGSTOP) << r.output;
  EXPECT_LT(took, 15.0) << r.output;
  EXPECT_NE(r.output.find("the job failed: rank 0 was stopped by signal 19 (SIGSTOP) and its "
                          "peers timed out on it"),
            std::string::npos)
      << r.output;
  r = run_with("BATON_PEER_TIMEOUT=1",
               "-n 2 --grace 30 -- sh -c 'if [ $BATON_RANK = 1 ]; then kill -STOP $$; fi; "
               "sleep 60'",
               took);
  EXPECT_EQ(r.code, 128 + SIGSTOP) << r.output;
  EXPECT_LT(took, 15.0) << r.output;
  EXPECT_NE(r.output.find("the job failed: rank 1 stayed stopped by SIGSTOP for more than the "
                          "peer timeout of 1 s"),
            std::string::npos)
      << r.output;
}

// A line without a newline is passed on in pieces as it grows, in linear time (a long
// progress line had been held whole and rescanned at every read).
TEST(Launch, ALongLineWithoutANewlineIsPassedOn) {
  Result r = run("-n 1 -- sh -c 'head -c 3000000 /dev/zero | tr \"\\0\" x'");
  EXPECT_EQ(r.code, 0) << r.output.substr(0, 200);
  EXPECT_EQ(count(r.output, "x"), 3000000u);
  EXPECT_GE(count(r.output, "[rank 0] "), 3u);  // 1 MiB pieces
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

// ---- baton bench comm ----

Result bench(const std::string& args) {
  return baton::cli_testing::run_command("env -u BATON_WORLD_SIZE " + std::string(BATON_BINARY) +
                                         " bench comm " + args);
}

// Each op's buffers at --max-bytes, not n times them: all-gather's output and
// reduce-scatter's input are the whole message (4 ranks had held 2 x 4 x 1 MiB each).
TEST(BenchComm, BuffersAreWhatTheOpsNeed) {
  struct Case {
    std::string ops, buffers;
  };
  for (const Case& c : {Case{"all_gather", "1.25 MiB"}, Case{"reduce_scatter", "1.25 MiB"},
                        Case{"all_reduce,broadcast", "1.00 MiB"}, Case{"sendrecv", "2.00 MiB"}}) {
    Result r = bench("--ranks 4 --op " + c.ops + " --min-bytes 1MiB --max-bytes 1MiB --reps 1");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("buffers " + c.buffers + " per rank"), std::string::npos)
        << c.ops << ":\n"
        << r.output;
  }
}

TEST(BenchComm, OptionsThatMeasureNothingAreBadInput) {
  struct Case {
    std::string args, message;
  };
  for (const Case& c :
       {Case{"--min-bytes 3 --max-bytes 3", "no size holds a 4-byte f32 element for all_reduce"},
        Case{"--op all_gather --ranks 4 --min-bytes 8 --max-bytes 12",
             "no size holds a 4-byte f32 element per rank for all_gather over 4 ranks"},
        Case{"--op ''", "--op: expected one or more of"}, Case{"--op ,", "--op ',': an empty item"},
        Case{"--backend ucx", "--backend ucx: the ranks are processes started by a launcher"},
        // An empty item had been skipped, a repeated one run twice.
        Case{"--op all_reduce,,broadcast", "--op 'all_reduce,,broadcast': an empty item"},
        Case{"--op all_reduce,", "--op 'all_reduce,': an empty item"},
        Case{"--op all_reduce,broadcast,all_reduce", "--op: all_reduce is listed twice"},
        // A terabyte had ended in a bare "std::bad_alloc" (exit 1).
        Case{"--max-bytes 1TiB", "--max-bytes 1TiB: expected at most 16.00 GiB per message"},
        Case{"--ranks 1024 --max-bytes 16GiB", "1024 rank(s) on this host need"}}) {
    Result r = bench(c.args + " --reps 1");
    EXPECT_EQ(r.code, 2) << c.args << ":\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << ":\n" << r.output;
  }
}

// The sizes of the rows: a size rounds down to whole f32 elements, and one that falls below
// --min-bytes is no row (--min-bytes 6 had printed a 4-byte row); a range where every size
// does is refused.
TEST(BenchComm, NoRowBelowMinBytes) {
  Result r = bench("--op all_reduce --min-bytes 6 --max-bytes 24 --reps 1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<size_t> sizes;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    char op[32];
    size_t size = 0;
    if (std::sscanf(line.c_str(), "%31s %zu", op, &size) == 2 && std::string(op) == "all_reduce")
      sizes.push_back(size);
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{12, 24})) << r.output;
  r = bench("--op all_reduce --min-bytes 6 --max-bytes 7 --reps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("none is at least --min-bytes"), std::string::npos) << r.output;
}

// The median of an even count of batches is the mean of the middle two (it had been the
// upper one: with --reps 2 the time column equalled the max).
TEST(BenchComm, MedianOfTwoBatchesIsTheirMean) {
  Result r = bench("--op all_reduce --min-bytes 1MiB --max-bytes 1MiB --reps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t at = r.output.find("\nall_reduce ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double time = 0, min = 0, max = 0;
  ASSERT_EQ(
      std::sscanf(r.output.c_str() + at + 1, "all_reduce %*u %*u %lf %lf %lf", &time, &min, &max),
      3)
      << r.output;
  // Each printed to 0.01 us.
  EXPECT_NEAR(time, (min + max) / 2, 0.011) << r.output;
}

// Under a launcher the ranks are the launched ones: a -n that differs had been ignored.
TEST(BenchComm, RanksUnderALauncherMustBeTheLaunchedWorld) {
  const std::string b = BATON_BINARY;
  Result r = baton::cli_testing::run_command(
      b + " launch -n 2 -- " + b +
      " bench comm -n 3 --threads 1 --reps 1 --op broadcast --max-bytes 8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--ranks 3: the launcher started 2 ranks"), std::string::npos)
      << r.output;
  r = baton::cli_testing::run_command(
      b + " launch -n 2 -- " + b +
      " bench comm -n 2 --threads 1 --reps 1 --op broadcast --max-bytes 8");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("backend ucx, 2 ranks,"), std::string::npos) << r.output;
}

}  // namespace
