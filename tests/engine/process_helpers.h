// Running the baton binary from tests: commands with their output captured in a file.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

namespace baton::engine_testing {

inline std::string baton() { return BATON_BINARY; }
inline std::string source_dir() { return BATON_SOURCE_DIR; }
inline std::string data_file() { return source_dir() + "/examples/data/licenses.txt"; }
// Settings every process test shares (both sides of a comparison).
inline std::string common_flags() { return " --seed 3 --lr 3e-3 --weight-decay 0.01 --threads 1 --log-every 0"; }

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `cmd` through the shell with stdout and stderr into `out`; returns the exit code
// (128 + signal when killed).
inline int run(const std::string& cmd, const std::string& out) {
  int status = std::system((cmd + " > " + out + " 2>&1").c_str());
  if (status == -1) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace baton::engine_testing
