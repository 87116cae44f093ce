// The `baton` command's sub-commands register themselves here; main() dispatches.
#pragma once

#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace baton::tools {

struct Command {
  std::string name;
  std::string summary;  // one line for `baton help`
  // args excludes the program and the command name. Returns the exit code.
  int (*run)(const std::vector<std::string>& args);
};

struct RegisterCommand {
  explicit RegisterCommand(Command c);
};

const std::vector<Command>& commands();

namespace po = boost::program_options;

// Parses args against opts (and positional), printing usage on --help. Returns false
// when --help was asked (the caller returns 0). Unknown options throw InputError.
bool parse_args(const std::vector<std::string>& args, const std::string& usage,
                po::options_description& opts, po::variables_map& vm,
                const po::positional_options_description* positional = nullptr);

// Options every command that computes shares: --threads, --log-level.
void add_common_options(po::options_description& opts);
// Applies them: sets the kernel thread count and the spdlog level.
void apply_common_options(const po::variables_map& vm);

}  // namespace baton::tools
