// `baton launch --max-restarts` with `baton train --plan` over UCX: random ranks are
// SIGKILLed at random moments three times during a run that checkpoints every 3 steps.
// Each time the job stops as a whole, the launcher logs the failure (rank, signal, step)
// and starts it again, the ranks resume from the newest complete checkpoint
// (BATON_RESUME=1), and in the end the loss curve equals the uninterrupted run's, bit for
// bit. For a GPT and for a LLaMA-family model (grouped-query attention, rotary, SwiGLU,
// RMSNorm, untied head).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "engine_harness.h"
#include "process_helpers.h"

namespace baton::engine_testing {
namespace {

using Clock = std::chrono::steady_clock;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The run of `model` under PP2 (1F1B) for `steps` steps, its ranks killed three times.
void killed_three_times(const json& model, int64_t steps) {
  const uint64_t seed = std::random_device{}();
  std::printf("restart test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  setenv("BATON_PEER_TIMEOUT", "1", 1);  // the survivors notice within ~1 s
  Workspace ws("restart");
  PlanSpec p;
  p.model = model;
  p.tp = {1, 1};
  p.schedule = "1f1b";
  std::ofstream(ws.path("plan.json")) << plan_json(p, ws).dump(2);
  auto argv = [&](const std::string& ckpt, const std::string& log) {
    return launch_train_argv(
        {"-n", "2", "--max-restarts", "3", "--restart-backoff", "0.1", "--grace", "3"},
        ws.path("plan.json"), log,
        {"--steps", std::to_string(steps), "--seed", "3", "--lr", "3e-3", "--checkpoint-dir", ckpt,
         "--checkpoint-every", "3", "--keep-checkpoints", "2"});
  };
  auto t0 = Clock::now();
  pid_t pid = spawn(argv(ws.path("full"), ws.path("full.jsonl")), ws.path("full.out"));
  int status = 0;
  // A step's time from the first logged step to the exit: the start-up (once 87 s on a
  // loaded machine) counted in had made the kills' random delays outlast the run.
  std::optional<Clock::time_point> first_step;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (!first_step && !read_loss_log(ws.path("full.jsonl")).empty()) first_step = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(ws.path("full.out"));
  ASSERT_TRUE(first_step.has_value());
  const double step_seconds =
      std::chrono::duration<double>(Clock::now() - *first_step).count() / double(steps - 1);
  std::printf("uninterrupted run: %.2f s, %.4f s a step\n",
              std::chrono::duration<double>(Clock::now() - t0).count(), step_seconds);

  // Three kills, each after a random step (increasing) plus a random part of a step.
  std::vector<int64_t> after;
  for (int k = 0; k < 3; ++k)
    after.push_back(std::uniform_int_distribution<int64_t>(1, steps - 6)(rng));
  std::sort(after.begin(), after.end());
  t0 = Clock::now();
  const std::string out = ws.path("killed.out"), log = ws.path("killed.jsonl");
  pid = spawn(argv(ws.path("ckpt"), log), out);
  std::vector<int> victims;
  for (int k = 0; k < 3; ++k) {
    // Wait for attempt k to have resumed (or started over), then for its step.
    auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline &&
           int(count(slurp(out), "resumed from") + count(slurp(out), "no complete checkpoint")) < k)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    while (Clock::now() < deadline) {
      auto lines = read_loss_log(log);
      if (!lines.empty() && lines.back().step >= after[size_t(k)]) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::uniform_real_distribution<double>(0, 1)(rng) * step_seconds));
    std::vector<pid_t> ranks;
    while (Clock::now() < deadline && (ranks = children_of(pid)).size() < 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(ranks.size(), 2u) << slurp(out);
    pid_t victim = ranks[std::uniform_int_distribution<size_t>(0, 1)(rng)];
    int rank = rank_of_process(victim);
    victims.push_back(rank);
    auto lines = read_loss_log(log);
    std::printf("kill %d: rank %d, the loss log at step %lld\n", k + 1, rank,
                static_cast<long long>(lines.empty() ? 0 : lines.back().step));
    kill(victim, SIGKILL);
    // The next kill goes to the next attempt's ranks.
    while (Clock::now() < deadline &&
           count(slurp(out), "restart " + std::to_string(k + 1) + " of 3") == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::string text = slurp(out);
  std::printf("run with 3 kills: %.2f s\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  // Each failure and restart is logged, naming the rank that was killed.
  for (int k = 1; k <= 3; ++k)
    EXPECT_EQ(count(text, "restart " + std::to_string(k) + " of 3 in 0.1 s after: rank " +
                              std::to_string(victims[size_t(k - 1)]) +
                              " was killed by signal 9 (SIGKILL)"),
              1u)
        << text;
  EXPECT_EQ(count(text, "giving up"), 0u) << text;
  SCOPED_TRACE(text);
  expect_loss_logs_match(log, ws.path("full.jsonl"), true, steps);
}

TEST(Restart, RanksKilledThreeTimesTheLossCurveIsTheUninterruptedOne) {
  killed_three_times(tiny_gpt_json(2), 40);
}

TEST(Restart, LlamaRanksKilledThreeTimesTheLossCurveIsTheUninterruptedOne) {
  killed_three_times({{"type", "llama"},
                      {"name", "restart-llama"},
                      {"hidden_size", 32},
                      {"intermediate_size", 48},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 256},
                      {"max_position_embeddings", 16}},
                     30);
}

}  // namespace
}  // namespace baton::engine_testing
