// The `baton` command's sub-commands register themselves here; main() dispatches.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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

// A command made of sub-commands (baton data, trace, bench).
struct SubCommand {
  std::string name;
  int (*run)(const std::vector<std::string>& args);  // args after the sub-command's name
};
// Runs the sub-command args[0] names under `group`. --help (-h): `usage` to standard output,
// exit 0. None given, or one not in `subs`: InputError listing them, with `usage` (exit 2,
// all of it on standard error: a script had read the usage from standard output as the
// command's output).
int run_subcommand(const std::string& group, const std::vector<std::string>& args,
                   const std::vector<SubCommand>& subs, const std::string& usage);
// What `baton` names in an error: "data prepare" once run_subcommand has started prepare,
// else `name` (errors had named the group alone: "baton data: error: ...").
std::string command_label(const std::string& name);

// Where a command prints its report (what it did, tables): standard output, or standard
// error once reports_beside() is told of an output flag naming standard output (`-o
// /dev/stdout`), so that standard output holds that file alone (the report had followed the
// JSON there, which no reader could then parse).
std::FILE* report();
void reports_beside(const std::vector<std::string>& outputs);

// Comma-separated lists on the command line ("gpipe,1f1b", "3,4,3"), one parser for every
// flag: the items in order; "" is no item. An empty item ("a,,b", a trailing comma) is an
// InputError naming `flag`: a typo there must not silently shorten the list.
std::vector<std::string> split_comma_list(const std::string& text, const std::string& flag);
// The integers of such a list (decimal digits, a '-' where min < 0), each in [min, max];
// InputError "<flag>: expected <expected>, found '<item>'" for any other item or none.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag, int64_t min,
                                    int64_t max, const std::string& expected);
// An unsigned 64-bit value (a seed) read as text: Boost reads "-1" into an unsigned
// option as 2^64 - 1 without a word. InputError "<flag>: expected an integer in
// [0, 2^64 - 1], found '<text>'" for a sign, a fraction or an out-of-range value.
uint64_t parse_uint64_option(const std::string& flag, const std::string& text);
// memory::parse_bytes with the flag named in its error ("--device-memory: invalid size ...").
uint64_t parse_bytes_option(const std::string& flag, const std::string& text);

// Path flags (each value given on the command line, not a default; a flag may take
// several): an empty one is refused, naming the flag (an unset shell variable had read as
// the flag's absence: --checkpoint-dir "" ran without checkpoints). With `recorded`, the
// path is one baton writes into JSON (a checkpoint's manifest, the summary, a plan's
// shared flags), which holds only UTF-8: a path that is not UTF-8 (Linux allows any bytes)
// is refused before any work, shown with its odd bytes as \xNN (the run had failed at its
// first checkpoint).
void check_path_flags(const po::variables_map& vm, const std::vector<std::string>& flags,
                      bool recorded = false);
// The same for flags that take a value other than a path (a size, a name, JSON): "--<flag>:
// expected a value, found an empty value (an unset shell variable?)". --device-memory ""
// had read as unlimited, --schedule "" as every schedule.
void check_value_flags(const po::variables_map& vm, const std::vector<std::string>& flags);

// Options every command that computes shares: --threads, --log-level. `threads_help`
// replaces --threads' text for a command that says more of it (baton profile).
void add_common_options(po::options_description& opts, const char* threads_help = nullptr);
// --log-level alone (every command takes it: scripts pass it to each baton call); read
// with apply_log_level(vm["log-level"].as<std::string>()).
void add_log_level_option(po::options_description& opts);
// The compute threads --threads 0 stands for: the host's cores divided among its local
// ranks (the launch's; one process alone has them all), at least 1; OMP_NUM_THREADS where
// set, up to that share.
int default_threads();
// Applies them: sets the kernel thread count and the spdlog level.
void apply_common_options(const po::variables_map& vm);
// Sets spdlog's level from --log-level's value; InputError for a name it does not know.
void apply_log_level(const std::string& name);

}  // namespace baton::tools
