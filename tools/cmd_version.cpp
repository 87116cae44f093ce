// `baton version`: the version, the git commit it was built from and the backends this
// build has.
#include <cstdio>

#include "tools/command.h"
#include "tools/version.h"  // generated at build time (cmake/BatonVersion.cmake)

namespace baton::tools {
namespace {

int run_version(const std::vector<std::string>& args) {
  po::options_description opts("options");
  add_log_level_option(opts);  // every command takes it: scripts pass it to each call
  po::variables_map vm;
  if (!parse_args(args, "baton version", opts, vm)) return 0;
  apply_log_level(vm["log-level"].as<std::string>());
#ifdef BATON_HAVE_CUDA
  const char* cuda = "built";
#else
  const char* cuda = "not built";
#endif
  std::printf("baton %s (commit %s; CPU backend; CUDA backend %s)\n", BATON_VERSION,
              BATON_GIT_COMMIT, cuda);
  return 0;
}

const RegisterCommand register_version{
    {"version", "print the version, the git commit and the backends built", run_version}};

}  // namespace
}  // namespace baton::tools
