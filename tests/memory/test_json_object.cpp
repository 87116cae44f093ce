// memory/json_object.h: the parse and the strict-object rule the file parsers share.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "memory/error.h"
#include "memory/json_object.h"
#include "memory/utf8.h"

namespace baton::memory {
namespace {

std::string error_of(const nlohmann::json& j, const std::string& where) {
  try {
    expect_json_object(j, where, {"ranks", "placement"});
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonObject, KnownFieldsPass) {
  EXPECT_EQ(error_of(nlohmann::json::parse(R"({"ranks": 2, "placement": [0, 1]})"), "$"), "");
  EXPECT_EQ(error_of(nlohmann::json::object(), ""), "");
}

TEST(JsonObject, UnknownFieldNamesItsPathAndTheAllowedOnes) {
  const auto j = nlohmann::json::parse(R"({"ranks": 2, "rank": 2})");
  EXPECT_EQ(error_of(j, "s.json: $.stages[1]"),
            "s.json: $.stages[1].rank: unknown field 'rank' (allowed here: ranks, placement)");
  EXPECT_EQ(error_of(j, ""), "rank: unknown field 'rank' (allowed here: ranks, placement)");
}

// A long unknown key is cut in the message, at a whole UTF-8 character (a 100 KB key had
// made a 200 KB message; a cut inside a character, one that was no UTF-8).
TEST(JsonObject, LongUnknownFieldIsCutAtACharacter) {
  std::string key;
  for (int i = 0; i < 100; ++i) key += "\xc3\xa9";  // é
  nlohmann::json j = nlohmann::json::object();
  j[key] = 1;
  const std::string msg = error_of(j, "$");
  EXPECT_LT(msg.size(), 200u) << msg;
  EXPECT_NE(msg.find("... (200 bytes)"), std::string::npos) << msg;
  EXPECT_EQ(first_non_utf8(msg), std::string_view::npos) << msg;
  EXPECT_EQ(brief("abc"), "abc");
  EXPECT_EQ(brief(std::string(61, 'x')), std::string(57, 'x') + "... (61 bytes)");
}

TEST(JsonObject, WrongTypeIsAnError) {
  EXPECT_EQ(error_of(nlohmann::json::array({1, 2}), "p2p"), "p2p: expected an object, found array");
  EXPECT_EQ(error_of(nlohmann::json("x"), "$.machine"),
            "$.machine: expected an object, found string");
}

// A syntax error names the source and the position, without nlohmann's exception id.
TEST(JsonObject, ParseErrorNamesTheSource) {
  EXPECT_EQ(parse_json_text(R"({"a": [1, 2]})", "x.json").at("a").size(), 2u);
  try {
    parse_json_text("{\"a\": ", "costs.json");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("costs.json: not valid JSON: parse error at line 1, column 7", 0), 0u)
        << msg;
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
  }
}

// nlohmann's lexer ends the input at a NUL byte: a document followed by "\0 garbage" had
// parsed. A NUL anywhere is refused naming the source and its offset; trailing blanks
// (safetensors pads its header with spaces) are not.
TEST(JsonObject, NulByteIsRefusedWithItsOffset) {
  using namespace std::string_literals;
  auto error = [](const std::string& text) -> std::string {
    try {
      parse_json_text(text, "costs.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error("{\"a\": 1}\0 this is not JSON {{{"s),
            "costs.json: not valid JSON: a NUL byte at byte offset 8 (JSON text has none; in a "
            "string it is written \\u0000)");
  EXPECT_NE(error("{\"a\": \"x\0y\"}"s).find("a NUL byte at byte offset 8"), std::string::npos);
  EXPECT_NE(error("{\"a\": 1}  \0  "s).find("a NUL byte at byte offset 10"), std::string::npos);
  EXPECT_EQ(parse_json_text("{\"a\": 1}    ", "h").at("a"), 1);
  EXPECT_EQ(parse_json_text(R"({"a": "x\u0000y"})", "h").at("a").get<std::string>().size(), 3u);
}

// A key repeated in one object is refused with its path; the same key in two objects is not.
TEST(JsonObject, RepeatedKeyNamesItsPath) {
  auto error = [](const std::string& text) -> std::string {
    try {
      parse_json_text(text, "plan.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(R"({"dp": 2, "dp": 4})"),
            "plan.json: $.dp: the field 'dp' appears twice in one object (readers differ on "
            "which one counts)");
  EXPECT_EQ(error(R"({"stages": [{"a": 1}, [], 3, {"layers": [0], "b": {}, "layers": [1]}]})"),
            "plan.json: $.stages[3].layers: the field 'layers' appears twice in one object "
            "(readers differ on which one counts)");
  EXPECT_EQ(error(R"([{"x": {"y": 1}}, {"x": {"y": 2, "z": [1, {"y": 0, "y": 0}]}}])"),
            "plan.json: $[1].x.z[1].y: the field 'y' appears twice in one object (readers "
            "differ on which one counts)");
  EXPECT_EQ(error(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 3}, {"k": 4}]})"), "");
  const auto j = parse_json_text(R"({"a": {"k": 1}, "b": [1, {"k": [2, 3]}]})", "x.json");
  EXPECT_EQ(j, nlohmann::json::parse(R"({"a": {"k": 1}, "b": [1, {"k": [2, 3]}]})"));
}

// Nesting past 256 levels is refused at its path (a document 200,000 deep had crashed
// the plan reader's recursive copy); 256 levels parse. An array of many objects parses
// in linear time (the callback parser used before rescanned the array after each object:
// a 45 MB plan had taken 185 s); 200,000 objects here, under a second.
TEST(JsonObject, DeepNestingRefusedAndLongArraysLinear) {
  auto nested = [](int depth) {
    return "{\"a\": " + std::string(size_t(depth - 1), '[') + "1" +
           std::string(size_t(depth - 1), ']') + "}";
  };
  EXPECT_NO_THROW(parse_json_text(nested(256), "deep.json"));
  try {
    parse_json_text(nested(100000), "deep.json");
    ADD_FAILURE() << "100000 levels accepted";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("deep.json: $.a[0][0][0]", 0), 0u) << what.substr(0, 200);
    EXPECT_NE(what.find("...: nested deeper than 256 levels"), std::string::npos)
        << what.substr(0, 300);
  }
  std::string many = "[";
  for (int i = 0; i < 200000; ++i)
    many += std::string(i ? "," : "") + "{\"rank\": " + std::to_string(i) + "}";
  many += "]";
  const auto start = std::chrono::steady_clock::now();
  const nlohmann::json j = parse_json_text(many, "ranks.json");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(j.size(), 200000u);
  EXPECT_EQ(j[199999]["rank"], 199999);
  EXPECT_LT(took, 5.0);  // quadratic: minutes
}

// A summary's cut falls between characters and says so: the launcher's one-line failure
// had been cut inside a two-byte character, invalid UTF-8, without a mark.
TEST(Utf8, PrefixCutsBetweenCharacters) {
  std::string text = "x";
  for (int i = 0; i < 10; ++i) text += "\xc3\xa9";  // é
  EXPECT_EQ(utf8_prefix(text, 100), text);
  const std::string cut = utf8_prefix(text, 4);  // x, é, and half of the next: not taken
  EXPECT_EQ(cut, "x\xc3\xa9...");
  EXPECT_EQ(first_non_utf8(cut), std::string::npos);
  EXPECT_EQ(utf8_prefix("abcdef", 3), "abc...");
}

}  // namespace
}  // namespace baton::memory
