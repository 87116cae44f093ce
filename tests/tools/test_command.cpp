// The command line's comma-separated lists (tools/command.h): one parser for every flag.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "memory/error.h"
#include "tools/command.h"

namespace baton::tools {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_int_list(text, "--layers", 1, 8, "counts 1 to 8 like 3,4");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// An empty item is refused: skipped, a stray comma had silently shortened the list.
TEST(CommaList, ItemsInOrderEmptyOnesRefused) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_comma_list("gpipe,1f1b,zb-v", "--schedule"), (V{"gpipe", "1f1b", "zb-v"}));
  EXPECT_EQ(split_comma_list("", "--schedule"), V{});
  EXPECT_EQ(split_comma_list("one", "--schedule"), V{"one"});
  for (const char* bad : {"a,,b", "a,", ",a", ","}) {
    try {
      split_comma_list(bad, "--schedule");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--schedule '") + bad +
                                           "': an empty item (expected items separated by "
                                           "single commas)");
    }
  }
}

TEST(CommaList, IntegersInRange) {
  EXPECT_EQ(parse_int_list("3,4,1", "--layers", 1, 8, "counts"), (std::vector<int64_t>{3, 4, 1}));
  EXPECT_EQ(parse_int_list("-2,3", "--offsets", -4, 4, "offsets"), (std::vector<int64_t>{-2, 3}));
  EXPECT_EQ(error_of(""), "--layers: expected counts 1 to 8 like 3,4, found ''");
  EXPECT_EQ(error_of("3,9"), "--layers: expected counts 1 to 8 like 3,4, found '9'");
  EXPECT_EQ(error_of("0"), "--layers: expected counts 1 to 8 like 3,4, found '0'");
  EXPECT_EQ(error_of("3,x"), "--layers: expected counts 1 to 8 like 3,4, found 'x'");
  EXPECT_EQ(error_of("2.5"), "--layers: expected counts 1 to 8 like 3,4, found '2.5'");
  EXPECT_EQ(error_of(" 3"), "--layers: expected counts 1 to 8 like 3,4, found ' 3'");
  EXPECT_EQ(error_of("+3"), "--layers: expected counts 1 to 8 like 3,4, found '+3'");
  EXPECT_EQ(error_of("-3"), "--layers: expected counts 1 to 8 like 3,4, found '-3'");
  EXPECT_EQ(error_of("99999999999999999999"),
            "--layers: expected counts 1 to 8 like 3,4, found '99999999999999999999'");
}

// A missing positional argument is named by its place and the usage, not by the option
// behind it; a size flag's error names the flag.
TEST(CommandLine, MissingPositionalAndBadSizeNameWhatTheUserTyped) {
  auto error_of_args = [](const std::vector<std::string>& args) {
    po::options_description opts("options");
    std::string measured, predicted;
    opts.add_options()("measured", po::value(&measured)->required(), "")(
        "predicted", po::value(&predicted)->required(), "");
    po::positional_options_description pos;
    pos.add("measured", 1).add("predicted", 1);
    po::variables_map vm;
    try {
      parse_args(args, "baton trace compare MEASURED.json PREDICTED.json", opts, vm, &pos);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of_args({"m.json"}),
            "missing argument 2 (PREDICTED): usage: baton trace compare MEASURED.json "
            "PREDICTED.json");
  EXPECT_EQ(error_of_args({"m.json", "p.json"}), "");
  // A word past the last positional is refused by name (Boost had dropped it).
  EXPECT_EQ(error_of_args({"m.json", "p.json", "x.json", "--predicted=q", "y"}),
            "unexpected argument 'x.json' 'y': usage: baton trace compare MEASURED.json "
            "PREDICTED.json");
  // A positional given by name as well: Boost had said only "option '--measured' cannot
  // be specified more than once".
  EXPECT_EQ(error_of_args({"--measured", "m.json", "p.json"}),
            "--measured given twice: by name and as argument 1 (MEASURED); give each argument "
            "by its place or by its name: usage: baton trace compare MEASURED.json "
            "PREDICTED.json");
  EXPECT_EQ(error_of_args({"--measured", "m.json", "--predicted", "p.json"}), "");
  EXPECT_EQ(parse_bytes_option("--device-memory", "2MiB"), uint64_t(2) << 20);
  try {
    parse_bytes_option("--device-memory", "1Mib");
    ADD_FAILURE() << "1Mib accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, 40), "--device-memory: invalid size '1Mib': un");
  }
}

// A command without positional arguments refuses a stray word (`baton plan --check a b`
// had checked a and exited 0).
TEST(CommandLine, StrayWordWithoutPositionalsRefused) {
  po::options_description opts("options");
  std::string check;
  opts.add_options()("check", po::value(&check), "");
  po::variables_map vm;
  try {
    parse_args({"--check", "a.json", "b.json"}, "baton plan --check plan.json", opts, vm);
    ADD_FAILURE() << "b.json accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unexpected argument 'b.json': usage: baton plan --check plan.json");
  }
}

// A path or value flag given as "" (an unset shell variable) is refused naming it; one left
// out, at its default "", is not (check_path_flags had refused a default "" too, so the
// commands with such defaults could not call it).
TEST(CommandLine, EmptyGivenValuesRefusedDefaultsNot) {
  auto error = [](const std::vector<std::string>& args) -> std::string {
    po::options_description opts("options");
    opts.add_options()("out", po::value<std::string>(), "")(
        "size", po::value<std::string>()->default_value(""), "")(
        "data", po::value<std::vector<std::string>>()->multitoken(), "");
    po::variables_map vm;
    parse_args(args, "baton x", opts, vm);
    try {
      check_path_flags(vm, {"out", "data"});
      check_value_flags(vm, {"size"});
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error({}), "");
  EXPECT_EQ(error({"--out", "a", "--size", "5MB", "--data", "b", "c"}), "");
  EXPECT_EQ(error({"--out", ""}),
            "--out: expected a path, found an empty value (an unset shell variable?)");
  EXPECT_EQ(error({"--data", "b", ""}),
            "--data: expected a path, found an empty value (an unset shell variable?)");
  EXPECT_EQ(error({"--size", ""}),
            "--size: expected a value, found an empty value (an unset shell variable?)");
}

// --threads 0: OMP_NUM_THREADS at most the process's share of its cores (it had run 4
// threads on 2 cores in each rank of a plan); the count given is the kernels' in every
// command (generate and the others had read the flag and run at the library's default).
TEST(CommandLine, ThreadsAreAppliedAndOmpNumThreadsCappedByTheCores) {
  const char* was = std::getenv("OMP_NUM_THREADS");
  const std::string saved = was != nullptr ? was : "";
  ::unsetenv("OMP_NUM_THREADS");
  const int share = default_threads();
  ::setenv("OMP_NUM_THREADS", std::to_string(share + 3).c_str(), 1);
  EXPECT_EQ(default_threads(), share);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  EXPECT_EQ(default_threads(), 1);
  po::options_description opts("options");
  add_common_options(opts);
  po::variables_map vm;
  const char* argv[] = {"x", "--threads", "1"};
  po::store(po::parse_command_line(3, argv, opts), vm);
  po::notify(vm);
  const int before = kernels::num_threads();
  kernels::set_num_threads(before + 1);
  apply_common_options(vm);
  EXPECT_EQ(kernels::num_threads(), 1);
  kernels::set_num_threads(before);
  if (was != nullptr)
    ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    ::unsetenv("OMP_NUM_THREADS");
}

}  // namespace
}  // namespace baton::tools
