// `baton launch -n N [options] -- CMD ...`: runs N ranks of CMD on this host.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

#include "memory/error.h"
#include "tools/command.h"
#include "transport/launch.h"
#include "transport/world.h"

namespace baton::tools {
namespace {

int run_launch(const std::vector<std::string>& args) {
  // Everything after "--" is the command, untouched by our option parser.
  std::vector<std::string> ours, command;
  auto dash = std::find(args.begin(), args.end(), "--");
  ours.assign(args.begin(), dash);
  if (dash != args.end()) command.assign(dash + 1, args.end());

  po::options_description opts("options");
  opts.add_options()("nprocs,n", po::value<int>()->required(), "number of ranks to start")(
      "rendezvous", po::value<std::string>()->default_value("127.0.0.1:0"),
      "host:port the rendezvous listens on (port 0: any free port)")(
      "grace", po::value<double>()->default_value(5.0),
      "seconds the other ranks get to exit by themselves after one fails")(
      "stop-timeout", po::value<double>()->default_value(30.0),
      "seconds the ranks get after SIGTERM or SIGINT to the launcher (baton train finishes "
      "its step and writes a checkpoint) before SIGKILL; a second signal kills at once")(
      "max-restarts", po::value<int>()->default_value(0),
      "after a failure, stop the job and start it again up to N times; the ranks get "
      "BATON_RESUME=1 (baton train resumes from its newest complete checkpoint)")(
      "restart-backoff", po::value<double>()->default_value(1.0),
      "seconds to wait before each restart")(
      "bind", po::value<std::string>()->default_value("cores"),
      "cores: bind each rank to its share of the cores (when there are enough); none")(
      "log-level", po::value<std::string>()->default_value("info"),
      "trace, debug, info, warn, error or off");
  po::variables_map vm;
  if (!parse_args(ours, "baton launch -n N [options] -- CMD [ARGS...]", opts, vm)) return 0;
  apply_log_level(vm["log-level"].as<std::string>());
  if (command.empty()) throw InputError("no command given: baton launch -n N -- CMD [ARGS...]");
  transport::LaunchOptions o;
  o.nprocs = vm["nprocs"].as<int>();
  if (o.nprocs < 1)
    throw InputError("--nprocs: expected at least 1, got " + std::to_string(o.nprocs));
  // As the ranks read BATON_RENDEZVOUS (a bracketed IPv6 address too), port 0 allowed.
  std::tie(o.host, o.port) =
      transport::parse_host_port(vm["rendezvous"].as<std::string>(), "--rendezvous", true);
  double grace = vm["grace"].as<double>();
  if (!(grace >= 0) || grace > 86400) throw InputError("--grace: expected seconds from 0 to 86400");
  o.grace = std::chrono::milliseconds(int64_t(grace * 1000));
  const double stop_timeout = vm["stop-timeout"].as<double>();
  if (!(stop_timeout >= 0) || stop_timeout > 86400)
    throw InputError("--stop-timeout: expected seconds from 0 to 86400");
  o.stop_timeout = std::chrono::milliseconds(int64_t(stop_timeout * 1000));
  std::string bind = vm["bind"].as<std::string>();
  if (bind != "cores" && bind != "none")
    throw InputError("--bind: expected cores or none, got '" + bind + "'");
  o.bind = bind == "cores";
  o.max_restarts = vm["max-restarts"].as<int>();
  if (o.max_restarts < 0)
    throw InputError("--max-restarts: expected a number >= 0, got " +
                     std::to_string(o.max_restarts));
  double backoff = vm["restart-backoff"].as<double>();
  if (!(backoff >= 0) || backoff > 86400)
    throw InputError("--restart-backoff: expected seconds from 0 to 86400");
  o.restart_backoff = std::chrono::milliseconds(int64_t(backoff * 1000));
  o.command = command;
  return transport::launch(o);
}

const RegisterCommand register_launch{
    {"launch", "start N local ranks of a command, with the rendezvous", run_launch}};

}  // namespace
}  // namespace baton::tools
