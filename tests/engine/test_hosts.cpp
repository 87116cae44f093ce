// Faults between hosts: `baton train --plan` on the two-host test bed of
// scripts/two-hosts.sh (two network namespaces, the link between them shaped like a
// slow data-centre link, UCX over TCP, one pipeline replica per host). A link cut in the
// middle of a step makes every rank fail within 10 s naming a peer on the other host, and
// the launcher's summary name which rank lost which peer, on which host; a
// link with delay and packet loss slows training but leaves the losses bit for bit those
// of the unshaped link; with `baton launch --max-restarts` a job whose link comes back
// resumes from its newest checkpoint and ends with the uninterrupted run's loss curve.
// Needs root (skipped with the reason otherwise).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include "engine_harness.h"
#include "process_helpers.h"

namespace baton::engine_testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string two_hosts_script() {
  return source_dir() + "/scripts/two-hosts.sh";
}

size_t hosts_count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A pair of hosts (`two-hosts.sh up`), gone with the test.
class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    ws_ = std::make_unique<Workspace>("hosts");
    const int code = run(two_hosts_script() + " up", ws_->path("up.out"));
    const std::string out = slurp(ws_->path("up.out"));
    if (code == 3) GTEST_SKIP() << out;  // not root, or no network namespaces here
    ASSERT_EQ(code, 0) << out;
    std::string last = out.substr(0, out.find_last_not_of('\n') + 1);
    id_ = last.substr(last.find_last_of('\n') + 1);
    ASSERT_FALSE(id_.empty()) << out;
    plan_ = ws_->path("plan.json");
  }
  void TearDown() override {
    if (!id_.empty()) run(hosts("down"), ws_->path("down.out"));
  }

  std::string hosts(const std::string& what) const {
    return "BATON=" + baton() + " " + two_hosts_script() + " " + what + " --id " + id_;
  }
  void shape(const std::string& args) {
    ASSERT_EQ(run(hosts("shape") + " " + args, ws_->path("shape.out")), 0)
        << slurp(ws_->path("shape.out"));
  }

  // Writes the plan: DP=2 of the tiny GPT (one replica, one rank, per host), or PP=2
  // (a stage per host).
  int write_plan(bool pipeline) {
    PlanSpec p;
    p.model = tiny_gpt_json(2);
    p.tp = pipeline ? std::vector<int>{1, 1} : std::vector<int>{1};
    p.dp = pipeline ? 1 : 2;
    std::ofstream(plan_) << plan_json(p, *ws_).dump(2);
    return 2;
  }

  // `baton train --plan` of `steps` steps; `launch` are baton launch's options, `train`
  // more of baton train's.
  std::vector<std::string> train_argv(int n, int64_t steps, const std::string& log,
                                      const std::vector<std::string>& launch,
                                      const std::vector<std::string>& train, bool two_hosts,
                                      const std::vector<std::string>& env = {}) {
    std::vector<std::string> a = {"/usr/bin/env", "BATON=" + baton()};
    a.insert(a.end(), env.begin(), env.end());
    if (two_hosts) {
      for (const std::string& s : {two_hosts_script(), std::string("launch"), std::string("--id"),
                                   id_, std::string("-n"), std::to_string(n)})
        a.push_back(s);
    } else {
      for (const std::string& s :
           {baton(), std::string("launch"), std::string("-n"), std::to_string(n)})
        a.push_back(s);
    }
    a.insert(a.end(), launch.begin(), launch.end());
    for (const std::string& s :
         {std::string("--"), baton(), std::string("train"), std::string("--plan"), plan_,
          std::string("--data"), data_file(), std::string("--steps"), std::to_string(steps),
          std::string("--seed"), std::string("3"), std::string("--lr"), std::string("3e-3"),
          std::string("--threads"), std::string("1"), std::string("--loss-log"), log})
      a.push_back(s);
    a.insert(a.end(), train.begin(), train.end());
    return a;
  }

  // Runs to the end; returns the exit code (128 + signal when killed).
  int finish(const std::vector<std::string>& argv, const std::string& out) {
    pid_t pid = spawn(argv, out);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  void cut_mid_step(const std::string& how, bool pipeline);

  std::unique_ptr<Workspace> ws_;
  std::string id_, plan_;
};

void expect_hosts_losses_equal(const std::string& got_path, const std::string& want_path,
                               int64_t steps) {
  expect_loss_logs_match(got_path, want_path, true, steps);
}

// The step times rank 0 logged ("... | 12.3 ms/step | ..."), the first step left out.
std::vector<double> hosts_step_ms(const std::string& out) {
  std::vector<double> ms;
  std::regex re(R"(\[rank 0\] .*step +\d+/\d+ .*\| ([0-9.]+) ms/step)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    ms.push_back(std::stod((*it)[1]));
  if (!ms.empty()) ms.erase(ms.begin());
  return ms;
}

double hosts_median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST_F(TwoHosts, DelayAndLossSlowTrainingButLeaveTheLossesBitForBit) {
  const int n = write_plan(false);
  const int64_t steps = 8;
  const std::vector<std::string> log_steps = {"--log-every", "1"};
  ASSERT_EQ(finish(train_argv(n, steps, ws_->path("plain.jsonl"), {}, log_steps, true),
                   ws_->path("plain.out")),
            0)
      << slurp(ws_->path("plain.out"));
  // 20 ms each way and 2% of the packets lost (TCP resends them after its timeout).
  shape("--delay 20 --loss 2");
  ASSERT_EQ(finish(train_argv(n, steps, ws_->path("shaped.jsonl"), {}, log_steps, true),
                   ws_->path("shaped.out")),
            0)
      << slurp(ws_->path("shaped.out"));
  const std::vector<double> plain = hosts_step_ms(slurp(ws_->path("plain.out")));
  const std::vector<double> shaped = hosts_step_ms(slurp(ws_->path("shaped.out")));
  ASSERT_EQ(int64_t(plain.size()), steps - 1) << slurp(ws_->path("plain.out"));
  ASSERT_EQ(int64_t(shaped.size()), steps - 1) << slurp(ws_->path("shaped.out"));
  std::printf("median step: %.1f ms unshaped, %.1f ms with 20 ms delay and 2%% loss\n",
              hosts_median(plain), hosts_median(shaped));
  // A step's gradient all-reduce needs at least one crossing each way: 40 ms more.
  EXPECT_GT(hosts_median(shaped), hosts_median(plain) + 30.0);
  expect_hosts_losses_equal(ws_->path("shaped.jsonl"), ws_->path("plain.jsonl"), steps);
}

// Waits until the loss log has `lines` lines (false after 60 s).
bool hosts_wait_for_steps(const std::string& log, size_t lines) {
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    if (read_loss_log(log).size() >= lines) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// Cuts the link (`how`: down, the device set down; loss, every packet lost) after a
// random number of steps plus a random part of one, with a 2 s peer timeout. Every rank
// must exit by itself (the launcher's grace is longer) within 10 s, its error naming a
// rank on the other host.
void TwoHosts::cut_mid_step(const std::string& how, bool pipeline) {
  const uint64_t seed = std::random_device{}();
  std::printf("link cut test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int n = write_plan(pipeline);
  const std::string log = ws_->path("loss.jsonl"), out = ws_->path("job.out");
  pid_t pid = spawn(train_argv(n, 1000000, log, {"--grace", "15"}, {"--log-every", "0"}, true,
                               {"BATON_PEER_TIMEOUT=2"}),
                    out);
  const size_t after = std::uniform_int_distribution<size_t>(2, 5)(rng);
  ASSERT_TRUE(hosts_wait_for_steps(log, after)) << slurp(out);
  std::this_thread::sleep_for(
      std::chrono::microseconds(std::uniform_int_distribution<int>(0, 20000)(rng)));
  const auto t0 = Clock::now();
  ASSERT_EQ(run(hosts("cut --how " + how), ws_->path("cut.out")), 0) << slurp(ws_->path("cut.out"));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string text = slurp(out);
  std::printf("link cut (%s) after step %zu; the job ended %.2f s later\n%s", how.c_str(), after,
              seconds, text.c_str());
  EXPECT_LT(seconds, 10.0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_EQ(hosts_count(text, "stopped rank(s)"), 0u) << "the launcher had to stop ranks";
  for (int r = 0; r < n; ++r) {
    const std::string prefix = "[rank " + std::to_string(r) + "] baton train: failed: ";
    const size_t at = text.find(prefix);
    ASSERT_NE(at, std::string::npos) << "rank " << r << " reported no error";
    const std::string line = text.substr(at, text.find('\n', at) - at);
    bool names_the_other_host = false;
    for (int o = r < n / 2 ? n / 2 : 0; o < (r < n / 2 ? n : n / 2); ++o)
      names_the_other_host |= line.find("rank " + std::to_string(o) + " ") != std::string::npos;
    EXPECT_TRUE(names_the_other_host) << line;
  }
  // The launcher's summary names what the ranks reported: each lost the other, by host
  // (10.233.K.1 is host a, .2 host b), and no rank died: the link between them.
  const size_t at = text.find("baton launch: the job failed: ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string summary = text.substr(at, text.find('\n', at) - at);
  const std::string host_a = R"([^ ]+ \(10\.233\.)" + id_ + R"(\.1\))";
  const std::string host_b = R"([^ ]+ \(10\.233\.)" + id_ + R"(\.2\))";
  EXPECT_NE(summary.find("every rank that failed lost a peer"), std::string::npos) << summary;
  EXPECT_TRUE(
      std::regex_search(summary, std::regex("rank 0 on " + host_a + " lost rank 1 on " + host_b)))
      << summary;
  EXPECT_TRUE(
      std::regex_search(summary, std::regex("rank 1 on " + host_b + " lost rank 0 on " + host_a)))
      << summary;
  EXPECT_NE(summary.find("no rank died or hung: the network between"), std::string::npos)
      << summary;
}

// One replica per host: the cut hits the gradient all-reduce (or the step's).
TEST_F(TwoHosts, LinkDownMidStepEveryRankNamesThePeerItLost) {
  cut_mid_step("down", false);
}

// A stage per host: the cut hits the pipeline's sends and receives.
TEST_F(TwoHosts, AllPacketsLostMidStepEveryRankNamesThePeerItLost) {
  cut_mid_step("loss", true);
}

// The link goes down in the middle of a run that checkpoints every 3 steps, under
// --max-restarts; it comes back only after the restarted ranks have started. The job must
// restart by itself, once, resume from the newest complete checkpoint, and end with the loss
// curve of a run that was never interrupted, bit for bit.
TEST_F(TwoHosts, AJobWhoseLinkComesBackResumesByItselfWithMaxRestarts) {
  const uint64_t seed = std::random_device{}();
  std::printf("link restart test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int n = write_plan(false);
  const int64_t steps = 20;
  auto train = [&](const std::string& dir) {
    return std::vector<std::string>{"--log-every",        "0", "--checkpoint-dir",   dir,
                                    "--checkpoint-every", "3", "--keep-checkpoints", "2"};
  };
  // The uninterrupted run (on this host: the same plan's losses, whatever the link).
  ASSERT_EQ(
      finish(train_argv(n, steps, ws_->path("full.jsonl"), {}, train(ws_->path("full")), false),
             ws_->path("full.out")),
      0)
      << slurp(ws_->path("full.out"));
  const std::string log = ws_->path("cut.jsonl"), out = ws_->path("job.out");
  pid_t pid = spawn(
      train_argv(n, steps, log, {"--max-restarts", "3", "--restart-backoff", "0.5", "--grace", "5"},
                 train(ws_->path("ckpt")), true, {"BATON_PEER_TIMEOUT=2"}),
      out);
  const size_t after = std::uniform_int_distribution<size_t>(4, 10)(rng);
  ASSERT_TRUE(hosts_wait_for_steps(log, after)) << slurp(out);
  ASSERT_EQ(run(hosts("cut --how down"), ws_->path("cut.out")), 0) << slurp(ws_->path("cut.out"));
  std::printf("link down after step %zu\n", read_loss_log(log).size());
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && hosts_count(slurp(out), "baton launch: restart 1 of 3") == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Back only after the restarted ranks have started (0.5 s after the message): they meet
  // a dead link and must wait for it, not fail again (host a's rank waits for its network
  // device to come up, host b's keeps trying the rendezvous), and resume as soon as it
  // is back.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ASSERT_EQ(run(hosts("restore"), ws_->path("restore.out")), 0) << slurp(ws_->path("restore.out"));
  const auto restored = Clock::now();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const double seconds = std::chrono::duration<double>(Clock::now() - restored).count();
  const std::string text = slurp(out);
  std::printf("%s", text.c_str());
  std::printf("the job ended %.2f s after the link came back\n", seconds);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  EXPECT_EQ(hosts_count(text, "baton launch: restart 1 of 3"), 1u) << text;
  EXPECT_EQ(hosts_count(text, "baton launch: restart 2 of 3"), 0u) << text;
  EXPECT_GE(hosts_count(text, "resumed from"), 1u) << text;
  EXPECT_EQ(hosts_count(text, "giving up"), 0u) << text;
  expect_hosts_losses_equal(log, ws_->path("full.jsonl"), steps);
}

}  // namespace
}  // namespace baton::engine_testing
