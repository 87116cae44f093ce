// The command line's comma-separated lists (tools/command.h): one parser for every flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(CommaList, ItemsInOrderEmptyOnesSkipped) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_comma_list("gpipe,1f1b,zb-v"), (V{"gpipe", "1f1b", "zb-v"}));
  EXPECT_EQ(split_comma_list("a,,b,"), (V{"a", "b"}));
  EXPECT_EQ(split_comma_list(""), V{});
  EXPECT_EQ(split_comma_list("one"), V{"one"});
}

TEST(CommaList, IntegersInRange) {
  EXPECT_EQ(parse_int_list("3,4,1", "--layers", 1, 8, "counts"), (std::vector<int64_t>{3, 4, 1}));
  EXPECT_EQ(parse_int_list("", "--layers", 1, 8, "counts"), std::vector<int64_t>{});
  EXPECT_EQ(error_of("3,9"), "--layers: expected counts 1 to 8 like 3,4, found '9'");
  EXPECT_EQ(error_of("0"), "--layers: expected counts 1 to 8 like 3,4, found '0'");
  EXPECT_EQ(error_of("3,x"), "--layers: expected counts 1 to 8 like 3,4, found 'x'");
  EXPECT_EQ(error_of("2.5"), "--layers: expected counts 1 to 8 like 3,4, found '2.5'");
  EXPECT_EQ(error_of("99999999999999999999"),
            "--layers: expected counts 1 to 8 like 3,4, found '99999999999999999999'");
}

}  // namespace
}  // namespace baton::tools
