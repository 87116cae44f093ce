#include "transport/launch.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/utf8.h"
#include "transport/communicator.h"
#include "transport/detail/asio.h"
#include "transport/options.h"
#include "transport/store.h"
#include "transport/world.h"

extern char** environ;

namespace baton::transport {

namespace asio = boost::asio;

namespace {

// A rank whose command cannot be run (not found, not executable) exits with this: bad
// input, which a restart would meet again (2, as baton's own bad input).
constexpr int kCannotRunCode = 2;
// The most of one line without a newline held before it is passed on.
constexpr size_t kLongestHeldLine = size_t(1) << 20;

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool suspended_with_job = false;  // stopped by the launcher with itself (Ctrl-Z)
  int status = 0;                   // waitpid status once exited
  int stop_signal = 0;              // the signal that stopped (suspended) it, 0 while it runs
  std::chrono::steady_clock::time_point stopped_since;
  std::unique_ptr<asio::steady_timer> stopped_timer;  // when it has been stopped too long
  std::unique_ptr<asio::posix::stream_descriptor> out, err;
  std::string out_partial, err_partial;
};

std::string describe_signal(int sig) {
  const char* name = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
}

// "1 s", "0.5 s": a duration as the environment variables give it.
std::string describe_seconds(std::chrono::milliseconds d) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g s", double(d.count()) / 1000.0);
  return secs;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + describe_signal(WTERMSIG(status));
  return "ended with status " + std::to_string(status);
}

// "a", "a and b", "a, b and c".
std::string launch_join_words(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i)
    out += (i == 0 ? "" : i + 1 == words.size() ? " and " : ", ") + words[i];
  return out;
}

// "0 and 2", "0-39 and 41-63": runs of three or more as ranges (a 1000-rank job's list of
// stopped ranks had been 5 kB long).
std::string rank_list(const std::set<int>& ranks) {
  std::vector<std::string> parts;
  for (auto it = ranks.begin(); it != ranks.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != ranks.end() && *it == last + 1; ++it) ++last;
    if (last - first >= 2) {
      parts.push_back(std::to_string(first) + "-" + std::to_string(last));
    } else {
      for (int r = first; r <= last; ++r) parts.push_back(std::to_string(r));
    }
  }
  return launch_join_words(parts);
}

bool failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Writes all of a buffer to fd (a line at a time keeps ranks' lines whole); false, with
// errno, when it cannot.
bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += size_t(n);
  }
  return true;
}

// "SIGTERM": the launcher's messages name the signals that stop a job.
std::string signal_name(int sig) {
  const char* name = sigabbrev_np(sig);
  return name ? std::string("SIG") + name : "signal " + std::to_string(sig);
}

// The signals this process was started ignoring (nohup's SIGHUP, a shell's `trap ''`),
// read on the first call, before the launcher ignores SIGPIPE: the ranks inherit them as
// any exec'd command would.
const sigset_t& inherited_ignored() {
  static const sigset_t ignored = [] {
    sigset_t set;
    sigemptyset(&set);
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa {};
      if (::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) sigaddset(&set, sig);
    }
    return set;
  }();
  return ignored;
}

// The signals that stop a job: SIGINT, SIGTERM and SIGHUP (a closed terminal), each unless
// the launcher was started ignoring it (nohup; a script's `baton launch &`, which a shell
// starts ignoring SIGINT, as baton train keeps it ignored: a Ctrl-C meant for the script
// had stopped the job).
std::vector<int> stop_signals() {
  std::vector<int> sigs;
  for (int sig : {SIGINT, SIGTERM, SIGHUP})
    if (!sigismember(&inherited_ignored(), sig)) sigs.push_back(sig);
  return sigs;
}

class Launcher {
 public:
  Launcher(const LaunchOptions& o, int attempt)
      : o_(o),
        attempt_(attempt),
        signals_(io_, SIGCHLD),
        stop_signals_(io_),
        suspend_signals_(io_),
        grace_(io_) {}

  bool interrupted() const { return interrupted_; }
  // The failure, for the restart log: "rank 2 was killed by signal 9 (SIGKILL) at step 12".
  const std::string& failure() const { return failure_; }
  int failed_rank_code() const { return failed_code_; }

  ~Launcher() {
    std::error_code ignored;
    if (!reports_dir_.empty()) std::filesystem::remove_all(reports_dir_, ignored);
  }

  int run() {
    for (int sig : stop_signals()) stop_signals_.add(sig);
    reports_dir_ = make_reports_dir();
    token_ = make_job_token();
    server_ = std::make_unique<StoreServer>(o_.host, o_.port, token_);
    rendezvous_ = (o_.host.find(':') != std::string::npos ? "[" + o_.host + "]" : o_.host) + ":" +
                  std::to_string(server_->port());
    watch_children();
    watch_stop_signals();
    // Not where the launcher was started ignoring it (`trap '' TSTP`): it stays ignored.
    if (!sigismember(&inherited_ignored(), SIGTSTP)) {
      suspend_signals_.add(SIGTSTP);
      watch_suspend();
    }
    ranks_.resize(size_t(o_.nprocs));
    for (int r = 0; r < o_.nprocs; ++r) spawn(r);
    io_.run();
    return finish();
  }

 private:
  std::vector<std::string> environment(int r) const {
    std::map<std::string, std::string> add = {
        {"BATON_RANK", std::to_string(r)},
        {"BATON_WORLD_SIZE", std::to_string(o_.nprocs)},
        {"BATON_LOCAL_RANK", std::to_string(r)},
        {"BATON_LOCAL_SIZE", std::to_string(o_.nprocs)},
        {"BATON_RENDEZVOUS", rendezvous_},
        {"BATON_JOB_TOKEN", token_},
        {"BATON_STORE_HOSTED", "1"},
        {"BATON_BIND", bind_mode()},
        {"BATON_RESUME", attempt_ > 0 ? "1" : "0"},
        {"BATON_RESTART", std::to_string(attempt_)},
    };
    if (!reports_dir_.empty()) add[kFailureReportVariable] = report_path(r);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      if (!add.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    for (auto& [k, v] : add) env.push_back(k + "=" + v);
    return env;
  }

  void spawn(int r) {
    Rank& rk = ranks_[size_t(r)];
    rk.rank = r;
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
      throw RuntimeError(std::string("launch: pipe failed: ") + std::strerror(errno));
    // Everything the child needs is built before fork: after it, only exec-safe calls.
    auto env = environment(r);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = o_.command;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    cpu_set_t cores;
    bool bind = core_share(r, cores);
    pid_t parent = getpid();
    // Signals wait until the child has put our handlers away (below): one that came
    // between fork and that had run them there.
    sigset_t all, before;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &before);
    pid_t pid = fork();
    if (pid != 0) sigprocmask(SIG_SETMASK, &before, nullptr);
    if (pid < 0) throw RuntimeError(std::string("launch: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      // The child: its own process group (so that stopping a rank stops what it
      // started), killed if the launcher dies, output into the pipes.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (bind) sched_setaffinity(0, sizeof cores, &cores);
      if (getppid() != parent) _exit(125);
      dup2(out[1], 1);
      dup2(err[1], 2);
      // Not the terminal: in a process group of its own a rank that read it was stopped
      // (SIGTTIN), and the job waited as paused. A rank reads end of input, as mpirun's
      // ranks but the first do.
      if (const int null = ::open("/dev/null", O_RDONLY); null >= 0) dup2(null, 0);
      // Nothing else of ours: the rendezvous's listening socket had stayed open in every
      // rank (and in what a rank left behind), so a restart could not listen again.
      ::close_range(3, ~0U, 0);
      // Our handlers (Asio's, which write to our self-pipe) and our ignored SIGPIPE are not
      // the command's: a SIGTERM we sent a rank before its exec had run them and read as one
      // sent to us. What we were started ignoring, the command is too.
      const sigset_t& started_ignoring = inherited_ignored();
      for (int sig = 1; sig < NSIG; ++sig)
        ::signal(sig, sigismember(&started_ignoring, sig) == 1 ? SIG_IGN : SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execvpe(argv[0], argv.data(), envp.data());
      const int why = errno;
      auto say = [](const char* text) {
        ssize_t ignored = ::write(2, text, std::strlen(text));
        (void)ignored;
      };
      say("baton launch: cannot run the command '");
      say(argv[0]);
      say("': ");
      say(std::strerror(why));
      say("\n");
      _exit(why == ENOENT || why == EACCES || why == ENOEXEC ? kCannotRunCode : 127);
    }
    setpgid(pid, pid);  // also from here, so that it holds before we may signal it
    ::close(out[1]);
    ::close(err[1]);
    rk.pid = pid;
    rk.running = true;
    ++running_;
    rk.out = std::make_unique<asio::posix::stream_descriptor>(io_, out[0]);
    rk.err = std::make_unique<asio::posix::stream_descriptor>(io_, err[0]);
    rk.stopped_timer = std::make_unique<asio::steady_timer>(io_);
    ++open_pipes_;
    ++open_pipes_;
    read_pipe(rk, *rk.out, rk.out_partial, 1);
    read_pipe(rk, *rk.err, rk.err_partial, 2);
  }

  // BATON_BIND: "cores" when every rank gets its share of the cores (core_share), "self"
  // when there are more ranks than cores (a rank that knows its place binds itself:
  // bind_dealt), "none" with --bind none.
  const char* bind_mode() const {
    const int cores = int(allowed_cores().size());
    if (!o_.bind || cores == 0) return "none";
    return o_.nprocs > cores ? "self" : "cores";
  }

  // Rank r's share of the cores we may run on; false when not binding.
  bool core_share(int r, cpu_set_t& out) const {
    CPU_ZERO(&out);
    if (!o_.bind) return false;
    const std::vector<int> ids = allowed_cores();
    const int n = o_.nprocs, cores = int(ids.size());
    if (cores == 0 || n > cores) return false;
    for (int i = r * cores / n; i < (r + 1) * cores / n; ++i) CPU_SET(ids[size_t(i)], &out);
    return true;
  }

  // Copies a child's output to ours line by line, each line prefixed with its rank.
  void read_pipe(Rank& rk, asio::posix::stream_descriptor& pipe, std::string& partial, int fd) {
    auto buf = std::make_shared<std::array<char, 65536>>();
    pipe.async_read_some(asio::buffer(*buf), [this, &rk, &pipe, &partial, fd, buf](
                                                 boost::system::error_code ec, size_t n) {
      std::string prefix = "[rank " + std::to_string(rk.rank) + "] ";
      if (ec) {
        if (!partial.empty()) write_all(fd, prefix + partial + "\n");
        partial.clear();
        --open_pipes_;
        maybe_done();
        return;
      }
      // Only the new bytes are searched: a long line without a newline (a \r progress
      // bar) had been rescanned whole at every read, in quadratic time.
      const size_t searched = partial.size();
      partial.append(buf->data(), n);
      size_t start = 0, nl, from = searched;
      std::string lines;
      while ((nl = partial.find('\n', from)) != std::string::npos) {
        lines += prefix + partial.substr(start, nl - start + 1);
        start = from = nl + 1;
      }
      partial.erase(0, start);
      // A line that never ends is passed on in pieces rather than held whole.
      if (partial.size() >= kLongestHeldLine) {
        lines += prefix + partial + "\n";
        partial.clear();
      }
      // A reader that went away (`| head`) stops the job as SIGPIPE would have stopped
      // us, but in order: the ranks get SIGTERM and the reports are cleaned up.
      // Each descriptor on its own: after standard output's reader went, the ranks' standard
      // error (where they say where to resume) had been dropped too.
      if (!lines.empty() && !output_closed_[fd == 1 ? 0 : 1] && !write_all(fd, lines)) {
        if (errno == EPIPE) {
          output_closed_[fd == 1 ? 0 : 1] = true;
          if (!interrupted_) stop_job(SIGPIPE, "its output was closed");
        } else if (output_error_.empty()) {
          // A full disk, a closed descriptor: said once, and the launch ends with exit 1
          // (it had ended with 0, the ranks' output lost without a word).
          output_error_ = std::string(fd == 1 ? "standard output" : "standard error") + ": " +
                          std::strerror(errno);
          write_all(2, "baton launch: writing the ranks' output failed: " + output_error_ +
                           "; the job goes on, its output lost\n");
        }
      }
      read_pipe(rk, pipe, partial, fd);
    });
  }

  void watch_children() {
    signals_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      reap();
      if (running_ > 0) watch_children();
      maybe_done();
    });
  }

  void reap() {
    while (true) {
      int status = 0;
      // Stops too: a suspended rank is a hung one, and its peers' timeouts will make them
      // exit first; it, not they, is why the job fails. With no peer left to time out on
      // it, watch_stopped fails it. Continues end that wait.
      pid_t pid = waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (pid <= 0) break;
      const bool was_paused = job_paused();
      for (auto& rk : ranks_) {
        if (rk.pid != pid || !rk.running) continue;
        if (WIFSTOPPED(status) || WIFCONTINUED(status)) {
          rk.stop_signal = WIFSTOPPED(status) ? WSTOPSIG(status) : 0;
          rk.stopped_since = std::chrono::steady_clock::now();
          if (!rk.stop_signal) {
            rk.stopped_timer->cancel();
            rk.suspended_with_job = false;
          } else if (stopping_) {
            kill_stopped(rk);  // it cannot exit on its own, nor see a SIGTERM
          } else if (!rk.suspended_with_job) {
            write_all(2, "baton launch: rank " + std::to_string(rk.rank) + " was stopped by " +
                             describe_signal(rk.stop_signal) + "\n");
          }
          continue;
        }
        rk.stopped_timer->cancel();
        rk.running = false;
        rk.status = status;
        --running_;
        if (!failed(status)) {
          if (!server_->registered().count(rk.rank)) {
            unjoined_.push_back(rk.rank);
            watch_unjoined();
          }
          continue;
        }
        failures_.push_back(rk.rank);
        if (!reports_dir_.empty())
          if (auto report = read_failure_report(report_path(rk.rank))) reports_[rk.rank] = *report;
        if (failures_.size() == 1) {
          step_ = server_->peek(kProgressKey);
          for (const Rank& other : ranks_)
            if (other.running && other.stop_signal && !hung_)
              hung_ = std::pair(other.rank, other.stop_signal);
        }
        if (failures_.size() == 1 && !stopping_) {
          write_all(2, "baton launch: rank " + std::to_string(rk.rank) + " " +
                           describe_exit(status) + "; stopping the other ranks\n");
          begin_stop(o_.grace);
        }
      }
      if (was_paused && !job_paused()) paused_until_ = std::chrono::steady_clock::now();
    }
    watch_stopped();
  }

  // A rank that exited 0 without reaching the rendezvous, while others reached it: they
  // wait for it in vain (BATON_CONNECT_TIMEOUT, 120 s, then each blamed it, and the job's
  // summary another rank). Checked every 100 ms while ranks run: one may register later.
  void watch_unjoined() {
    unjoined_timer_.expires_after(std::chrono::milliseconds(100));
    unjoined_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || stopping_ || running_ == 0 || unjoined_cause_) return;
      const std::set<int> joined = server_->registered();
      if (joined.empty()) return watch_unjoined();
      for (int r : unjoined_) {
        if (joined.count(r)) continue;
        unjoined_cause_ = r;
        failures_.insert(failures_.begin(), r);
        unjoined_waiters_ = std::string(joined.size() > 1 ? "ranks " : "rank ") + rank_list(joined);
        write_all(2, "baton launch: rank " + std::to_string(r) +
                         " exited with code 0 before it reached the rendezvous, where " +
                         unjoined_waiters_ + " wait for it; stopping the other ranks\n");
        // The launcher found the cause: the waiting ranks get no grace to find it.
        begin_stop(std::chrono::milliseconds(0));
        return;
      }
    });
  }

  // Every rank stopped at once: the job paused as a whole (a user's or a scheduler's
  // SIGSTOP to all of it), which the ranks ride out, none timing out on another.
  bool job_paused() const {
    return std::all_of(ranks_.begin(), ranks_.end(),
                       [](const Rank& rk) { return rk.running && rk.stop_signal; });
  }

  // A stopped rank not continued within stopped_limit (counted while not every rank was
  // stopped) has failed: nothing else ends it when its peers had finished. It is given a
  // quarter more, past the 1.125 timeouts within which a peer waiting on it fails naming
  // it (their messages, not ours, first). A job paused whole gets the stall timeout (0:
  // forever). The launcher found the cause, so the others get no grace to find it.
  void watch_stopped() {
    if (stopping_) return;
    const bool paused = job_paused();
    for (Rank& rk : ranks_) {
      if (!rk.running || !rk.stop_signal) continue;
      if (paused && o_.paused_limit->count() == 0) {
        rk.stopped_timer->cancel();
        continue;
      }
      std::string limit = paused ? "the stall timeout of " + describe_seconds(*o_.paused_limit) +
                                       " with every rank stopped"
                                 : "the peer timeout of " + describe_seconds(*o_.stopped_limit);
      rk.stopped_timer->expires_at(paused ? rk.stopped_since + *o_.paused_limit
                                          : std::max(rk.stopped_since, paused_until_) +
                                                *o_.stopped_limit * 5 / 4);
      rk.stopped_timer->async_wait([this, &rk, limit](boost::system::error_code ec) {
        if (ec || !rk.running || !rk.stop_signal || stopping_) return;
        hung_limit_ = limit;
        write_all(2, "baton launch: rank " + std::to_string(rk.rank) + " stayed stopped by " +
                         signal_name(rk.stop_signal) + " for more than " + limit +
                         "; stopping the job\n");
        hung_ = std::pair(rk.rank, rk.stop_signal);
        step_ = server_->peek(kProgressKey);
        begin_stop(std::chrono::milliseconds(0));
      });
    }
  }

  // SIGKILL to a stopped rank's group: it cannot exit on its own, and a SIGTERM (with
  // SIGCONT) would end it as the launcher's signal rather than as the stop it failed of.
  void kill_stopped(Rank& rk) {
    ::kill(-rk.pid, SIGKILL);
    ::kill(rk.pid, SIGKILL);
    stopped_.insert(rk.rank);
  }

  // Gives the others `grace` to exit on their own, then SIGTERM, then SIGKILL; a stopped
  // rank, which cannot, is killed at once.
  void begin_stop(std::chrono::milliseconds grace) {
    if (stopping_ || running_ == 0) return;
    stopping_ = true;
    for (Rank& rk : ranks_)
      if (rk.running && rk.stop_signal) kill_stopped(rk);
    grace_.expires_after(grace);
    grace_.async_wait([this](boost::system::error_code ec) {
      if (ec || running_ == 0) return;
      signal_all(SIGTERM);
      grace_.expires_after(o_.kill_after);
      grace_.async_wait([this](boost::system::error_code ec2) {
        if (!ec2 && running_ > 0) signal_all(SIGKILL);
      });
    });
  }

  // Every rank's process group, also of ranks that exited: what they started and left
  // running (it holds their output pipes) had kept the launcher waiting. A group whose
  // leader was reaped keeps its id while a member lives, and is gone (ESRCH) after.
  void signal_all(int sig) {
    for (auto& rk : ranks_) {
      if (rk.pid < 0) continue;
      ::kill(-rk.pid, sig);
      if (!rk.running) continue;
      stopped_.insert(rk.rank);
      ::kill(rk.pid, sig);
      if (sig == SIGTERM) ::kill(-rk.pid, SIGCONT);  // a stopped rank must run to see it
    }
  }

  void watch_stop_signals() {
    stop_signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      stop_job(sig, "got " + signal_name(sig));
      watch_stop_signals();
    });
  }

  // Ctrl-Z reaches the launcher alone (each rank has a process group of its own): the job
  // is suspended whole, as a shell's job is, and continues with the launcher (`fg`, `bg`).
  // The ranks had run on without it, rank 0 soon blocked telling it its step, and with a
  // stall timeout the others then failed blaming one another.
  void watch_suspend() {
    suspend_signals_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      if (!stopping_) {
        write_all(2,
                  "baton launch: suspended by SIGTSTP, every rank with it (fg or bg continues "
                  "the job)\n");
        for (Rank& rk : ranks_)
          if (rk.running) {
            rk.suspended_with_job = true;
            ::kill(-rk.pid, SIGSTOP);
          }
        ::raise(SIGSTOP);  // until SIGCONT
        for (const Rank& rk : ranks_)
          if (rk.running && rk.suspended_with_job) ::kill(-rk.pid, SIGCONT);
      } else {
        write_all(2, "baton launch: SIGTSTP: not suspended, the job is stopping\n");
      }
      watch_suspend();
    });
  }

  // The user stopped the job (`why`, reported with `sig`'s exit code 128 + sig): SIGTERM
  // to every rank, SIGKILL after the stop timeout or when asked again.
  void stop_job(int sig, const std::string& why) {
    const auto now = std::chrono::steady_clock::now();
    if (interrupted_) {
      // One signal sent twice at once (to the group and to us: `timeout` forwarding a
      // Ctrl-C) is one, as for baton train: it had killed the ranks mid-step.
      if (now - first_stop_ < std::chrono::seconds(1)) return;
      // Asked again: now (it had re-armed the wait, so SIGKILL never came).
      write_all(2, "baton launch: " + why + " again; killing every rank now\n");
      signal_all(SIGKILL);
      return;
    }
    write_all(2, "baton launch: " + why + "; stopping every rank\n");
    first_stop_ = now;
    interrupted_ = true;
    interrupt_signal_ = sig;
    signal_all(SIGTERM);
    stopping_ = true;
    grace_.cancel();
    grace_.expires_after(o_.stop_timeout);
    grace_.async_wait([this](boost::system::error_code ec2) {
      if (!ec2) signal_all(SIGKILL);
    });
  }

  void maybe_done() {
    if (running_ == 0 && open_pipes_ == 0) {
      grace_.cancel();
      drain_.cancel();
      io_.stop();
      return;
    }
    // Every rank has exited, and something one started still holds its output: it gets
    // kill_after to finish writing, then its group is stopped and we stop reading.
    if (running_ == 0 && !draining_) {
      draining_ = true;
      drain_.expires_after(o_.kill_after);
      drain_.async_wait([this](boost::system::error_code ec) {
        if (ec) return;
        signal_all(SIGKILL);
        for (auto& rk : ranks_) {
          boost::system::error_code ignored;
          if (rk.out) rk.out->close(ignored);
          if (rk.err) rk.err->close(ignored);
        }
      });
    }
  }

  // The rank the job failed because of. The first exit seen is not always it: when a rank
  // is killed, its peers see the broken connections and exit (non-zero, naming it) while
  // the kernel is still tearing the victim down, so their exits can be reaped first. A
  // rank that died of a signal we did not send is the cause ahead of any that exited, and
  // then one that was suspended when the first failure came (the others timed out on it).
  //
  // Then a rank that failed of its own error (its report names no lost peer, or it left
  // none: not a baton command, or one that crashed) ahead of the ranks whose reports say
  // they lost a peer; -1 when every rank that failed lost a peer (none died or hung: the
  // connections between them broke, a network fault).
  // The stop signal a rank ended on, by its exit code (`baton train` stopped after a step,
  // 128 + the signal) or by the signal itself (one outside the loop, during set-up); 0 for
  // anything else.
  static int stop_signal_of(int status) {
    for (int sig : {SIGTERM, SIGINT})
      if ((WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig) ||
          (WIFSIGNALED(status) && WTERMSIG(status) == sig))
        return sig;
    return 0;
  }

  int root_cause() const {
    if (unjoined_cause_) return *unjoined_cause_;
    for (int r : failures_)
      if (WIFSIGNALED(ranks_[size_t(r)].status) && !stopped_.count(r) &&
          stop_signal_of(ranks_[size_t(r)].status) == 0)
        return r;
    if (hung_) return hung_->first;
    // A rank that crashed ahead of one that stopped on a signal (which says only that it
    // stopped): the crash is the cause.
    for (int r : failures_)
      if (!stopped_.count(r) && lost_peer(r) < 0 && stop_signal_of(ranks_[size_t(r)].status) == 0)
        return r;
    for (int r : failures_)
      if (WIFSIGNALED(ranks_[size_t(r)].status) && !stopped_.count(r)) return r;
    for (int r : failures_)
      if (!stopped_.count(r) && lost_peer(r) < 0) return r;
    return -1;
  }

  int lost_peer(int r) const {
    auto it = reports_.find(r);
    return it == reports_.end() ? -1 : it->second.peer;
  }

  // The host a rank ran on, as its report or a report of one that lost it says.
  std::string host_of(int r) const {
    if (auto it = reports_.find(r); it != reports_.end() && !it->second.host.empty())
      return it->second.host;
    for (auto& [_, rep] : reports_)
      if (rep.peer == r && !rep.peer_host.empty()) return rep.peer_host;
    return {};
  }

  // Whether the reports name more than one host (on one host, naming it adds nothing).
  bool several_hosts() const {
    std::set<std::string> hosts;
    for (auto& [r, rep] : reports_) {
      if (!rep.host.empty()) hosts.insert(rep.host);
      if (rep.peer >= 0 && !rep.peer_host.empty()) hosts.insert(rep.peer_host);
    }
    return hosts.size() > 1;
  }

  std::string who(int r) const {
    std::string host = several_hosts() ? host_of(r) : std::string();
    return "rank " + std::to_string(r) + (host.empty() ? "" : " on " + host);
  }

  // "rank 0 on a lost rank 2 on b, ranks 1 and 3 lost rank 4": the reports of ranks that
  // lost a peer, grouped by the peer, except those that lost `except`.
  std::string losses(int except) const {
    std::map<int, std::set<int>> by_peer;
    for (int r : failures_)
      if (int p = lost_peer(r); p >= 0 && p != except) by_peer[p].insert(r);
    std::string out;
    for (auto& [peer, ranks] : by_peer) {
      std::vector<std::string> names;
      for (int r : ranks) names.push_back(who(r));
      out += (out.empty() ? "" : ", ") + launch_join_words(names) + " lost " + who(peer);
    }
    return out;
  }

  // The hosts whose ranks lost each other ("a and b"), when every loss crossed hosts.
  std::string hosts_apart() const {
    std::set<std::string> hosts;
    for (auto& [r, rep] : reports_) {
      if (rep.peer < 0) continue;
      std::string mine = host_of(r), theirs = host_of(rep.peer);
      if (mine.empty() || theirs.empty() || mine == theirs) return {};
      hosts.insert(mine);
      hosts.insert(theirs);
    }
    return launch_join_words({hosts.begin(), hosts.end()});
  }

  // The cause, in words: "rank 2 was killed by signal 9 (SIGKILL) after step 12; ranks 0,
  // 1 and 3 lost it".
  std::string describe_cause(int cause) const {
    const std::string step = step_ ? " after step " + *step_ : std::string();
    if (cause < 0) {
      std::string apart = hosts_apart();
      return "every rank that failed lost a peer" + step + ": " + losses(-1) +
             (apart.empty() ? std::string()
                            : " (no rank died or hung: the network between " + apart + "?)");
    }
    const Rank& rk = ranks_[size_t(cause)];
    std::string how = describe_exit(rk.status);
    if (unjoined_cause_ == cause)
      how += " before it reached the rendezvous, where " + unjoined_waiters_ + " waited for it";
    if (hung_ && hung_->first == rk.rank)
      how = !hung_limit_.empty() ? "stayed stopped by " + signal_name(hung_->second) +
                                       " for more than " + hung_limit_
                                 : "was stopped by " + describe_signal(hung_->second) +
                                       " and its peers timed out on it";
    std::string s = who(cause) + " " + how + step;
    if (auto it = reports_.find(cause); it != reports_.end() && it->second.peer < 0) {
      // Cut on a character, and said to be cut (the rank's own line, above, is whole).
      std::string error = memory::utf8_prefix(it->second.error, 400);
      std::replace(error.begin(), error.end(), '\n', ' ');  // the summary is one line
      s += ": " + error;
    }
    std::set<int> lost_it;
    for (int r : failures_)
      if (lost_peer(r) == cause) lost_it.insert(r);
    if (!lost_it.empty()) {
      s += std::string("; rank") + (lost_it.size() > 1 ? "s " : " ") + rank_list(lost_it) +
           " lost it";
    }
    std::string others = losses(cause);
    if (!others.empty()) s += "; " + others;
    return s;
  }

  int finish() {
    // Stopped by the user: the ranks' failures are the launcher's own SIGTERM, not a cause.
    if (interrupted_) {
      // Ranks the stop had to kill (a second signal, or --stop-timeout run out) ended
      // mid-step: that stop wrote no checkpoint. It had been reported as a clean stop.
      std::set<int> killed, ended = stopped_;
      for (const Rank& rk : ranks_)
        if (WIFSIGNALED(rk.status) && WTERMSIG(rk.status) == SIGKILL) {
          killed.insert(rk.rank);
          ended.erase(rk.rank);  // said below, not as stopped too
        }
      write_all(2, "baton launch: the job was stopped by " + signal_name(interrupt_signal_) +
                       (step_ ? " after step " + *step_ : std::string()) +
                       (ended.empty() ? std::string() : "; stopped rank(s) " + rank_list(ended)) +
                       (killed.empty() ? std::string()
                                       : "; rank(s) " + rank_list(killed) +
                                             " killed (SIGKILL) before finishing their step: "
                                             "this stop wrote no checkpoint") +
                       "\n");
      return 128 + interrupt_signal_;
    }
    // Every rank that ended ended on a stop signal sent to it rather than to us (a
    // scheduler signalling each process, a kill of one rank): `baton train` finished its
    // step and wrote its checkpoint, every rank after the same step, and exits 128 + the
    // signal. A stop, as when we are signalled: not a failure, and no restart.
    if (!failures_.empty() && std::all_of(failures_.begin(), failures_.end(), [&](int r) {
          return stop_signal_of(ranks_[size_t(r)].status) != 0;
        })) {
      interrupted_ = true;
      interrupt_signal_ = stop_signal_of(ranks_[size_t(failures_.front())].status);
      write_all(2, "baton launch: the job was stopped by " + signal_name(interrupt_signal_) +
                       " sent to its ranks" + (step_ ? " after step " + *step_ : std::string()) +
                       "\n");
      return 128 + interrupt_signal_;
    }
    // The rendezvous refused the job as bad input (a rank of another baton build, another
    // job token): that is the cause, whatever the ranks made of it (an older rank reads the
    // refusal as "unexpected reply", exit 1, and would be restarted into it again).
    if (!failures_.empty()) {
      if (auto refused = server_->failure(); refused && refused->first) {
        failure_ = "the rendezvous refused the job: " + refused->second;
        write_all(2, "baton launch: the job failed: " + failure_ + "\n");
        failed_code_ = 2;
        return 2;
      }
    }
    if (!failures_.empty()) {
      const int cause = root_cause();
      const Rank& rk = ranks_[size_t(cause >= 0 ? cause : failures_.front())];
      const std::string stopped = rank_list(stopped_);
      failure_ = describe_cause(cause);
      write_all(2, "baton launch: the job failed: " + failure_ +
                       (stopped.empty() ? std::string() : "; stopped rank(s) " + stopped) + "\n");
      // A stopped rank's code is its stop's (128 + SIGSTOP), not that of the SIGKILL that
      // ended it.
      int code = hung_ && hung_->first == cause ? 128 + hung_->second : exit_code_of(rk.status);
      failed_code_ = code;
      return code == 0 ? 1 : code;
    }
    if (!output_error_.empty()) {
      write_all(2, "baton launch: failed: writing the ranks' output: " + output_error_ + "\n");
      return 1;
    }
    return 0;
  }

  // The processes this launcher can see: a hash of the host's boot id and its pid
  // namespace, "" when either is unreadable. A pid means a process only within one such
  // space (another container's, another host's sharing $TMPDIR, is not ours to judge).
  static std::string pid_space() {
    std::string key;
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char boot[64] = {};
      if (std::fgets(boot, sizeof boot, f)) key = boot;
      std::fclose(f);
    }
    char ns[128] = {};
    const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (key.empty() || n <= 0) return {};
    key.append(ns, size_t(n));
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return hex;
  }

  // "baton-launch-<space>-<pid>.XXXXXX" directories of this user, in this pid space, whose
  // launcher is gone.
  static void remove_dead_launchers_dirs(const std::string& dir, const std::string& space) {
    if (space.empty()) return;
    const std::string prefix = "baton-launch-" + space + "-";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      const size_t dot = name.find('.');
      if (name.rfind(prefix, 0) != 0 || dot == std::string::npos || dot == prefix.size()) continue;
      const std::string digits = name.substr(prefix.size(), dot - prefix.size());
      if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9)
        continue;
      struct stat st {};
      if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
          st.st_uid != ::getuid())
        continue;
      // Alive (or not ours to signal): kept. A pid taken since by another process keeps
      // the directory until that one ends too.
      if (::kill(pid_t(std::stol(digits)), 0) == 0 || errno != ESRCH) continue;
      std::error_code ignored;
      std::filesystem::remove_all(entry.path(), ignored);
    }
  }

  std::string report_path(int r) const {
    return reports_dir_ + "/rank-" + std::to_string(r) + ".json";
  }

  // A fresh directory for the ranks' failure reports ($TMPDIR, else /tmp); empty (no
  // reports) when it cannot be made. Its name carries the launcher's pid space and pid, so
  // the directories of launchers that were killed (SIGKILL, the OOM killer: no destructor
  // ran) are removed here, by the next launch of the same user in the same space.
  static std::string make_reports_dir() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = tmp && *tmp ? tmp : "/tmp";
    const std::string space = pid_space();
    remove_dead_launchers_dirs(dir, space);
    std::string tmpl = dir + "/baton-launch-" + (space.empty() ? "" : space + "-") +
                       std::to_string(::getpid()) + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      spdlog::warn("launch: cannot make a directory for the ranks' failure reports ({}): {}", tmpl,
                   std::strerror(errno));
      return {};
    }
    return tmpl;
  }

  const LaunchOptions& o_;
  const int attempt_;  // 0, then 1 for the first restart, ...
  asio::io_context io_;
  asio::signal_set signals_;
  asio::signal_set stop_signals_;
  asio::signal_set suspend_signals_;  // SIGTSTP
  asio::steady_timer grace_;
  asio::steady_timer drain_{io_};  // after the ranks: for what they left holding a pipe
  bool draining_ = false;
  std::string token_;
  std::string rendezvous_;
  std::unique_ptr<StoreServer> server_;
  std::vector<Rank> ranks_;
  int running_ = 0;
  int open_pipes_ = 0;
  bool stopping_ = false;
  bool interrupted_ = false;
  std::chrono::steady_clock::time_point first_stop_;  // when the first stop signal came
  std::string output_error_;  // why writing the ranks' output failed (not EPIPE), or ""
  bool output_closed_[2] = {false, false};  // our stdout, stderr: its reader went away
  int interrupt_signal_ = SIGTERM;
  std::vector<int> failures_;  // failed ranks in the order their exits were seen
  std::set<int> stopped_;
  std::optional<std::pair<int, int>> hung_;  // a rank suspended at the first failure, its signal
  std::string hung_limit_;  // the limit hung_ stayed stopped past, when that was the failure
  std::chrono::steady_clock::time_point paused_until_;  // the job's last pause as a whole ended
  std::optional<std::string> step_;    // the job's progress when the first rank failed
  std::vector<int> unjoined_;          // ranks that exited 0 unregistered
  std::optional<int> unjoined_cause_;  // the one the others waited for in vain
  std::string unjoined_waiters_;       // "ranks 0, 1 and 3"
  asio::steady_timer unjoined_timer_{io_};
  std::string failure_;
  int failed_code_ = 0;
  std::string reports_dir_;
  std::map<int, FailureReport> reports_;  // the reports of the ranks that failed
};

// Sleeps; the stop signal (SIGINT, SIGTERM, SIGHUP) that cut it short, or 0.
int sleep_unless_stopped(std::chrono::milliseconds how_long) {
  asio::io_context io;
  asio::signal_set stop(io);
  for (int sig : stop_signals()) stop.add(sig);
  asio::steady_timer timer(io);
  int stopped_by = 0;
  stop.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    stopped_by = sig;
    timer.cancel();
  });
  timer.expires_after(how_long);
  timer.async_wait([&](boost::system::error_code) { stop.cancel(); });
  io.run();
  return stopped_by;
}

}  // namespace

namespace {
// The launcher holds two pipes and a rendezvous connection per rank, so a job of N ranks
// needs about 3N + 64 descriptors. The soft limit is raised to the hard one first (what
// the ranks inherit too): at a soft limit of 200, 64 ranks had left the store's accept
// spinning on EMFILE while ranks timed out at the rendezvous, and nothing said why.
void require_open_files(int nprocs) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  const uint64_t need = 3 * uint64_t(nprocs) + 64;
  if (lim.rlim_cur != RLIM_INFINITY && need > lim.rlim_cur)
    throw InputError("launch: -n " + std::to_string(nprocs) + " needs about " +
                     std::to_string(need) +
                     " open files (3 per rank), and this process may "
                     "open " +
                     std::to_string(lim.rlim_cur) + " (ulimit -n; hard limit " +
                     std::to_string(lim.rlim_max) + "): raise the limit or start fewer ranks");
}
}  // namespace

int launch(const LaunchOptions& options) {
  if (options.nprocs < 1)
    throw InputError("launch: -n must be at least 1, got " + std::to_string(options.nprocs));
  if (options.command.empty())
    throw InputError("launch: no command given (baton launch -n N -- CMD ...)");
  if (options.max_restarts < 0)
    throw InputError("launch: --max-restarts must be >= 0, got " +
                     std::to_string(options.max_restarts));
  inherited_ignored();  // before the line below changes what it reads
  // A reader that goes away (`| head`) must not kill us mid-job, leaving the ranks to
  // PDEATHSIG's SIGKILL and the reports behind: the write's EPIPE stops the job in order.
  ::signal(SIGPIPE, SIG_IGN);
  require_open_files(options.nprocs);
  LaunchOptions resolved = options;
  if (!resolved.stopped_limit || !resolved.paused_limit) {
    const CommOptions comm = CommOptions::from_env();
    if (!resolved.stopped_limit) resolved.stopped_limit = comm.peer_timeout;
    // Ranks of `baton train --plan` take their own default (tools/cmd_train.cpp): the
    // stopped limit had said 20 s where their peers gave up after 4.
    const auto& cmd = resolved.command;
    const bool plan_training =
        cmd.size() >= 2 && std::filesystem::path(cmd[0]).filename() == "baton" &&
        cmd[1] == "train" && std::any_of(cmd.begin(), cmd.end(), [](const std::string& a) {
          return a == "--plan" || a.rfind("--plan=", 0) == 0;
        });
    if (plan_training && !env_is_set("BATON_PEER_TIMEOUT"))
      resolved.stopped_limit = kTrainingPeerTimeout;
    if (!resolved.paused_limit) resolved.paused_limit = comm.stall_timeout;
  }
  std::vector<std::string> failures;
  for (int attempt = 0;; ++attempt) {
    int code = 0;
    std::string failure;
    bool interrupted = false;
    int rank_code = 0;
    {
      Launcher launcher(resolved,
                        attempt);  // its own rendezvous: no key of a failed attempt survives
      code = launcher.run();
      failure = launcher.failure();
      interrupted = launcher.interrupted();
      rank_code = launcher.failed_rank_code();
    }
    if (code == 0 || interrupted || options.max_restarts == 0) return code;
    failures.push_back(failure);
    auto list = [&] {
      std::string s;
      for (size_t i = 0; i < failures.size(); ++i)
        s += "  " + std::to_string(i + 1) + ". " + failures[i] + "\n";
      return s;
    };
    if (rank_code == 2) {
      write_all(2,
                "baton launch: not restarting: exit code 2 is bad input, which a restart would "
                "meet again; the failures:\n" +
                    list());
      return code;
    }
    if (attempt == options.max_restarts) {
      write_all(2, "baton launch: giving up after " + std::to_string(attempt) +
                       " restart(s); the failures:\n" + list());
      return code;
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3g", double(options.restart_backoff.count()) / 1000.0);
    write_all(2, "baton launch: restart " + std::to_string(attempt + 1) + " of " +
                     std::to_string(options.max_restarts) + " in " + secs + " s after: " + failure +
                     "; the ranks resume from the newest complete checkpoint (BATON_RESUME=1)\n");
    if (const int sig = sleep_unless_stopped(options.restart_backoff)) {
      write_all(2,
                "baton launch: stopped by " + describe_signal(sig) + " while waiting to restart\n");
      return 128 + sig;
    }
  }
}

namespace {

struct WorldHosts {
  std::mutex mu;
  int rank = -1;
  std::vector<std::string> hosts;
};

WorldHosts& world_hosts() {
  static WorldHosts w;
  return w;
}

std::string launch_host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

void note_world_hosts(int rank, std::vector<std::string> hosts) {
  WorldHosts& w = world_hosts();
  std::lock_guard lock(w.mu);
  w.rank = rank;
  w.hosts = std::move(hosts);
}

std::string own_host_label() {
  WorldHosts& w = world_hosts();
  std::lock_guard lock(w.mu);
  if (w.rank >= 0 && size_t(w.rank) < w.hosts.size() && !w.hosts[size_t(w.rank)].empty())
    return w.hosts[size_t(w.rank)];
  return launch_host_name();
}

void report_failure(const std::exception& error) noexcept {
  const char* path = std::getenv(kFailureReportVariable);
  if (path == nullptr || *path == '\0') return;
  try {
    nlohmann::json j;
    {
      WorldHosts& w = world_hosts();
      std::lock_guard lock(w.mu);
      int rank = w.rank;
      if (rank < 0)
        if (const char* r = std::getenv("BATON_RANK")) rank = std::atoi(r);
      auto host = [&](int r) {
        return r >= 0 && size_t(r) < w.hosts.size() && !w.hosts[size_t(r)].empty()
                   ? w.hosts[size_t(r)]
                   : std::string();
      };
      j["rank"] = rank;
      j["host"] = host(rank).empty() ? launch_host_name() : host(rank);
      j["error"] = error.what();
      if (auto* peer = dynamic_cast<const PeerError*>(&error); peer && peer->peer() >= 0) {
        j["peer"] = peer->peer();
        j["peer_host"] = host(peer->peer());
      }
    }
    memory::write_file_durably(path, j.dump() + "\n");
  } catch (const std::exception& e) {
    spdlog::warn("cannot write the failure report {}: {}", path, e.what());
  }
}

std::optional<FailureReport> read_failure_report(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    nlohmann::json j = nlohmann::json::parse(memory::read_file(path));
    FailureReport r;
    r.rank = j.at("rank").get<int>();
    r.host = j.value("host", std::string());
    r.error = j.value("error", std::string());
    r.peer = j.value("peer", -1);
    r.peer_host = j.value("peer_host", std::string());
    return r;
  } catch (const std::exception& e) {
    spdlog::warn("launch: ignoring the failure report {}: {}", path, e.what());
    return std::nullopt;
  }
}

bool resume_requested() {
  const char* v = std::getenv("BATON_RESUME");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace baton::transport
