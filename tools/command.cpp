#include "tools/command.h"

#include <spdlog/spdlog.h>

#include <iostream>

#include "memory/error.h"

namespace baton::tools {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace

RegisterCommand::RegisterCommand(Command c) { registry().push_back(std::move(c)); }

const std::vector<Command>& commands() { return registry(); }

bool parse_args(const std::vector<std::string>& args, const std::string& usage,
                po::options_description& opts, po::variables_map& vm,
                const po::positional_options_description* positional) {
  opts.add_options()("help,h", "print this help");
  try {
    po::command_line_parser parser(args);
    parser.options(opts);
    if (positional) parser.positional(*positional);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage << "\n\n" << opts << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(std::string(e.what()) + " (see --help)");
  }
  return true;
}

void add_common_options(po::options_description& opts) {
  opts.add_options()("threads", po::value<int>()->default_value(0),
                     "compute threads of this process (0: the cores divided among local ranks)")(
      "log-level", po::value<std::string>()->default_value("info"),
      "trace, debug, info, warn, error or off");
}

void apply_common_options(const po::variables_map& vm) {
  auto level = spdlog::level::from_str(vm["log-level"].as<std::string>());
  spdlog::set_level(level);
}

}  // namespace baton::tools
