// The collectives' executor (transport/detail/executor.h): a job nobody waits for runs on
// the background thread, a caller that waits runs it itself, and an idle thread sleeps
// without waking: with several communicators per rank and more ranks than cores, a
// thread that woke every millisecond to look for work took the cores from the compute.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "memory/error.h"
#include "transport/detail/executor.h"

namespace baton::transport::detail {
namespace {

struct TidJob final : Job {
  std::atomic<pid_t> tid{0};
  void run() override { tid.store(gettid()); }
};

// The thread's voluntary context switches: each sleep it wakes from is one.
long voluntary_switches(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string key;
  long value = -1;
  while (in >> key) {
    if (key == "voluntary_ctxt_switches:") {
      in >> value;
      break;
    }
  }
  return value;
}

// Waits (up to 10 s, generous for sanitizers on a loaded machine) for the job to be done.
bool done_soon(Executor& ex, Job& job) {
  for (int i = 0; i < 10'000; ++i) {
    if (ex.test(job)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST(Executor, AJobNobodyWaitsForRunsOnTheBackgroundThread) {
  Executor ex;
  for (bool urgent : {false, true}) {
    auto job = std::make_shared<TidJob>();
    ex.submit(job, urgent);
    ASSERT_TRUE(done_soon(ex, *job)) << "urgent " << urgent;
    EXPECT_NE(job->tid.load(), gettid()) << "urgent " << urgent;
  }
}

TEST(Executor, ACallerThatWaitsGetsItsJobDone) {
  Executor ex;
  for (int i = 0; i < 100; ++i) {
    auto job = std::make_shared<TidJob>();
    ex.submit(job, false);
    ex.wait(*job);
    EXPECT_NE(job->tid.load(), 0);
  }
}

TEST(Executor, AnIdleThreadSleepsWithoutWaking) {
  Executor ex;
  auto job = std::make_shared<TidJob>();
  ex.submit(job, false);
  ASSERT_TRUE(done_soon(ex, *job));
  const pid_t tid = job->tid.load();
  ASSERT_NE(tid, gettid());
  // Right after its work, when the old thread still woke every millisecond for a second.
  const long before = voluntary_switches(tid);
  ASSERT_GE(before, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long woke = voluntary_switches(tid) - before;
  EXPECT_LE(woke, 3) << "the idle executor thread woke " << woke << " times in 300 ms";
}

TEST(Executor, ShutdownFailsTheJobsNotStarted) {
  auto ex = std::make_unique<Executor>();
  auto first = std::make_shared<TidJob>();
  ex->submit(first, false);
  ex->wait(*first);
  auto late = std::make_shared<TidJob>();
  ex->submit(late, false);  // not due for kPickup: shutdown comes first
  ex->shutdown();
  const int state = late->state.load();
  EXPECT_TRUE(state == Job::kFailed || state == Job::kDone) << state;
  if (state == Job::kFailed) {
    EXPECT_NE(late->error.what.find("closed"), std::string::npos) << late->error.what;
  }
}

// A collective's error crosses threads as data: bad input stays an InputError (exit code
// 2, not restarted), not a RuntimeError.
TEST(Executor, AnInputErrorStaysOne) {
  Executor ex;
  struct Bad final : Job {
    void run() override { throw InputError("BATON_SMALL_BYTES='-1': expected a whole number"); }
  };
  auto job = std::make_shared<Bad>();
  ex.submit(job, false);
  EXPECT_THROW(ex.wait(*job), InputError);
  auto later = std::make_shared<TidJob>();  // the executor is broken now: the same error
  ex.submit(later, false);
  EXPECT_THROW(ex.wait(*later), InputError);
}

}  // namespace
}  // namespace baton::transport::detail
