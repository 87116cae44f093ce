#include "tools/command.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>
#include <string_view>
#include <thread>

#include "kernels/ops.h"
#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/units.h"
#include "memory/utf8.h"
#include "transport/world.h"

namespace baton::tools {

namespace {
std::vector<Command>& command_table() {
  static std::vector<Command> r;
  return r;
}
}  // namespace

RegisterCommand::RegisterCommand(Command c) {
  command_table().push_back(std::move(c));
}

const std::vector<Command>& commands() {
  return command_table();
}

namespace {
constexpr int kStyle =
    po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
}  // namespace

bool parse_args(const std::vector<std::string>& args, const std::string& usage,
                po::options_description& opts, po::variables_map& vm,
                const po::positional_options_description* positional) {
  opts.add_options()("help,h", "print this help");
  try {
    // Without a description Boost keeps stray words and store() drops them: an empty one
    // makes them an error, named below.
    const po::positional_options_description none;
    po::command_line_parser parser(args);
    // Whole names only: Boost's guessing had read `launch --restart 2` as
    // --restart-backoff and run without restarts, and a flag added later would have broken
    // a script that relied on a prefix.
    parser.options(opts).positional(positional ? *positional : none).style(kStyle);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage << "\n\n" << opts << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::required_option& e) {
    // A positional argument by its place, not by the internal option behind it.
    std::string name = e.get_option_name();
    name.erase(0, name.find_first_not_of('-'));
    for (unsigned i = 0; positional && i < positional->max_total_count() && i < 16; ++i)
      if (positional->name_for_position(i) == name) {
        for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
        throw InputError("missing argument " + std::to_string(i + 1) + " (" + name +
                         "): usage: " + usage);
      }
    throw InputError(std::string(e.what()) + " (see --help)");
  } catch (const po::multiple_occurrences& e) {
    // A positional argument given by name as well (`--measured m.json p.json`): Boost's
    // "cannot be specified more than once" named neither the argument nor the fix.
    std::string name = e.get_option_name();
    name.erase(0, name.find_first_not_of('-'));
    for (unsigned i = 0; positional && i < positional->max_total_count() && i < 16; ++i)
      if (positional->name_for_position(i) == name) {
        std::string upper = name;
        for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
        throw InputError("--" + name + " given twice: by name and as argument " +
                         std::to_string(i + 1) + " (" + upper +
                         "); give each argument by its place or by its name: usage: " + usage);
      }
    throw InputError(std::string(e.what()) + " (see --help)");
  } catch (const po::too_many_positional_options_error&) {
    const auto words = po::collect_unrecognized(po::command_line_parser(args)
                                                    .options(opts)
                                                    .style(kStyle)
                                                    .allow_unregistered()
                                                    .run()
                                                    .options,
                                                po::include_positional);
    std::string extra;
    const unsigned expected = positional ? positional->max_total_count() : 0;
    for (size_t i = expected; i < words.size(); ++i)
      extra += (extra.empty() ? "'" : " '") + words[i] + "'";
    throw InputError("unexpected argument " + extra + ": usage: " + usage);
  } catch (const po::error& e) {
    throw InputError(std::string(e.what()) + " (see --help)");
  }
  return true;
}

namespace {
std::FILE*& report_file() {
  static std::FILE* f = stdout;
  return f;
}
}  // namespace

std::FILE* report() {
  return report_file();
}

void reports_beside(const std::vector<std::string>& outputs) {
  for (const std::string& o : outputs)
    if (!o.empty() && memory::descriptor_of(o) == STDOUT_FILENO) report_file() = stderr;
}

namespace {
std::string& running_subcommand() {
  static std::string r;
  return r;
}
}  // namespace

int run_subcommand(const std::string& group, const std::vector<std::string>& args,
                   const std::vector<SubCommand>& subs, const std::string& usage) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("%s", usage.c_str());
    return 0;
  }
  std::string names;
  for (size_t i = 0; i < subs.size(); ++i) {
    if (!args.empty() && subs[i].name == args[0]) {
      running_subcommand() = subs[i].name;
      return subs[i].run({args.begin() + 1, args.end()});
    }
    names += (i == 0 ? "" : i + 1 == subs.size() ? " or " : ", ") + subs[i].name;
  }
  const std::string found = args.empty() ? "none" : "'" + brief(args[0]) + "'";
  throw InputError("expected a sub-command of " + group + " (" + names + "), found " + found +
                   "\n" + usage);
}

std::string command_label(const std::string& name) {
  return running_subcommand().empty() ? name : name + " " + running_subcommand();
}

std::vector<std::string> split_comma_list(const std::string& text, const std::string& flag) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    if (comma == pos)
      throw InputError(flag + " '" + text +
                       "': an empty item (expected items separated by single commas)");
    out.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

uint64_t parse_bytes_option(const std::string& flag, const std::string& text) {
  try {
    return memory::parse_bytes(text);
  } catch (const InputError& e) {
    throw InputError(flag + ": " + e.what());
  }
}

uint64_t parse_uint64_option(const std::string& flag, const std::string& text) {
  // Digits only: std::stoull itself takes a sign (and negates) and leading spaces.
  size_t used = 0;
  unsigned long long v = 0;
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    try {
      v = std::stoull(text, &used);
    } catch (const std::exception&) {
      used = 0;  // beyond 2^64 - 1
    }
  }
  if (used == 0 || used != text.size())
    throw InputError(flag + ": expected an integer in [0, 18446744073709551615], found '" + text +
                     "'");
  return v;
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag, int64_t min,
                                    int64_t max, const std::string& expected) {
  std::vector<int64_t> out;
  for (const std::string& item : split_comma_list(text, flag)) {
    // Digits only: stoll would also take leading spaces and a '+'.
    const size_t digits = min < 0 && item.size() > 1 && item[0] == '-' ? 1 : 0;
    bool ok = item.size() > digits &&
              std::all_of(item.begin() + long(digits), item.end(),
                          [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    long long v = 0;
    if (ok) {
      try {
        v = std::stoll(item);
      } catch (const std::exception&) {
        ok = false;  // out of long long's range
      }
    }
    if (!ok || v < min || v > max)
      throw InputError(flag + ": expected " + expected + ", found '" + item + "'");
    out.push_back(v);
  }
  if (out.empty()) throw InputError(flag + ": expected " + expected + ", found ''");
  return out;
}

namespace {
// A flag's values as given on the command line: none when it is absent or at its default.
std::vector<std::string> given_values(const po::variables_map& vm, const std::string& flag) {
  std::vector<std::string> values;
  if (!vm.count(flag) || vm[flag].defaulted()) return values;
  const boost::any& v = vm[flag].value();
  if (const auto* one = boost::any_cast<std::string>(&v))
    values.push_back(*one);
  else if (const auto* many = boost::any_cast<std::vector<std::string>>(&v))
    values = *many;
  return values;
}

InputError empty_value(const std::string& flag, const char* what) {
  return InputError("--" + flag + ": expected " + what +
                    ", found an empty value (an unset shell variable?)");
}
}  // namespace

void check_value_flags(const po::variables_map& vm, const std::vector<std::string>& flags) {
  for (const std::string& flag : flags)
    for (const std::string& value : given_values(vm, flag))
      if (value.empty()) throw empty_value(flag, "a value");
}

void check_path_flags(const po::variables_map& vm, const std::vector<std::string>& flags,
                      bool recorded) {
  for (const std::string& flag : flags) {
    for (const std::string& path : given_values(vm, flag)) {
      if (path.empty()) throw empty_value(flag, "a path");
      if (!recorded) continue;
      std::string shown;
      bool bad = false;
      for (size_t i = 0; i < path.size();) {
        if (const size_t n = memory::utf8_sequence(path, i)) {
          shown.append(path, i, n);
          i += n;
          continue;
        }
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(path[i++]));
        shown += hex;
        bad = true;
      }
      if (bad)
        throw InputError("--" + flag + " " + shown +
                         ": the path is not valid UTF-8; baton records it in JSON (checkpoint "
                         "manifests, the summary), which holds only UTF-8: rename it");
    }
  }
}

void add_log_level_option(po::options_description& opts) {
  opts.add_options()("log-level", po::value<std::string>()->default_value("info"),
                     "trace, debug, info, warn, error or off");
}

void add_common_options(po::options_description& opts, const char* threads_help) {
  opts.add_options()("threads", po::value<int>()->default_value(0),
                     threads_help != nullptr
                         ? threads_help
                         : "compute threads of this process (0: the cores it may run on "
                           "divided among local ranks, or OMP_NUM_THREADS up to that)");
  add_log_level_option(opts);
}

int default_threads() {
  // The cores this process may run on (its affinity: taskset, a cpuset, Slurm's
  // --cpus-per-task), not the machine's, shared among the host's ranks; OMP_NUM_THREADS
  // at most that share: OMP_NUM_THREADS=4 on 2 cores had run 4 threads in
  // each rank of a plan (8 on 2 cores) and in profile, 2 in a lone train.
  const int cores = std::max(1, int(transport::allowed_cores().size()));
  const int share = std::max(1, cores / std::max(1, transport::read_launch_env().local_size));
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && n >= 1 && n <= 4096) return std::min(int(n), share);
  }
  return share;
}

void apply_log_level(const std::string& name) {
  // spdlog reads a name it does not know as "off": a typo would silence the run.
  for (const char* known : {"trace", "debug", "info", "warn", "error", "off"})
    if (name == known) return spdlog::set_level(spdlog::level::from_str(name));
  throw InputError("--log-level: expected trace, debug, info, warn, error or off, found '" + name +
                   "'");
}

void apply_common_options(const po::variables_map& vm) {
  apply_log_level(vm["log-level"].as<std::string>());
  // A negative count had read as 0 (train) or 1 (profile) without a word.
  const int t = vm["threads"].as<int>();
  // At most OMP_NUM_THREADS' bound: 100000 had crashed inside libgomp (exit 139).
  if (t < 0 || t > 4096)
    throw InputError(
        "--threads: expected 0 (the cores divided among local ranks, or OMP_NUM_THREADS up to "
        "that) or a count in [1, 4096], found " +
        std::to_string(t));
  // Every command's: generate, export, plan and simulate had read the flag and run at the
  // default count (the benchmarks' "1 thread" generation rows among them).
  kernels::set_num_threads(t > 0 ? t : default_threads());
}

}  // namespace baton::tools
