// The `baton` command: dispatches to a sub-command and turns errors into exit codes
// (2: bad input, 1: failure at run time).
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "memory/error.h"
#include "tools/command.h"
#include "tools/cpu_check.h"
#include "transport/launch.h"
#include "transport/ucx.h"

namespace {

void print_usage() {
  std::printf("usage: baton <command> [options]   (baton <command> --help for its options)\n\n");
  std::printf("commands:\n");
  for (const auto& c : baton::tools::commands())
    std::printf("  %-12s %s\n", c.name.c_str(), c.summary.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  baton::transport::release_ucx_debug_signal();  // a hangup ends baton, or nohup ignores it
  try {
    baton::tools::require_cpu_features();  // before any kernel's instructions run
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton: failed: %s\n", e.what());
    return 1;
  }
  baton::kernels::select_blas_kernels(argv);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  for (const auto& c : baton::tools::commands()) {
    if (c.name != name) continue;
    std::vector<std::string> args(argv + 2, argv + argc);
    try {
      baton::kernels::cpu_sgemm();  // a bad BATON_SGEMM is exit 2 before any work
      return c.run(args);
    } catch (const baton::InputError& e) {
      baton::transport::report_failure(e);
      std::fprintf(stderr, "baton %s: error: %s\n", name.c_str(), e.what());
      return 2;
    } catch (const std::exception& e) {
      // For `baton launch`'s summary: what failed (and which peer was lost, where).
      baton::transport::report_failure(e);
      std::fprintf(stderr, "baton %s: failed: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "baton: unknown command '%s'\n\n", name.c_str());
  print_usage();
  return 2;
}
