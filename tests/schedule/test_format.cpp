// The schedule's file forms: tokens, text and JSON round trips, and the errors for
// malformed input (file:line, JSON paths).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "memory/error.h"
#include "schedule/costs.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/schedule_io.h"
#include "tests/input_error.h"

using namespace baton::schedule;
using baton::InputError;

namespace {

using baton::testing_support::input_error_of;

std::vector<Schedule> sample_schedules() {
  std::vector<Schedule> out;
  for (const auto& name : schedule_names()) {
    Schedule s = generate(name, 4, 8);
    out.push_back(s);
    out.push_back(lower(s));
  }
  out.push_back(generate("interleaved-1f1b", 3, 7, 3));
  out.push_back(lower(generate("dualpipe", 2, 6)));
  out.back().name = "  odd # name: with spaces ";
  return out;
}

}  // namespace

TEST(ScheduleToken, RoundTripsEveryKind) {
  for (int k = 0; k < kNumActionKinds; ++k) {
    auto kind = static_cast<ActionKind>(k);
    Action a{kind, has_micro_batch(kind) ? 17 : -1, kind == ActionKind::optimizer_step ? -1 : 3,
             -1};
    EXPECT_EQ(parse_token(to_token(a), "t"), a) << to_token(a);
  }
  EXPECT_EQ(to_token(make_action(ActionKind::forward, 1, 0)), "0F1");
  EXPECT_EQ(to_token(make_action(ActionKind::backward_input, 0, 1)), "1B0");
  EXPECT_EQ(to_token(make_action(ActionKind::backward_weight, 3, 2)), "2W3");
  EXPECT_EQ(to_token(make_action(ActionKind::full_backward, 4, 1)), "1BW4");
  EXPECT_EQ(to_token(make_action(ActionKind::send_activation, 3, 0)), "0SEND_F3");
  EXPECT_EQ(to_token(make_action(ActionKind::reduce_gradients, -1, 2)), "2REDUCE");
}

TEST(ScheduleToken, RejectsMalformedTokensWithWhereAndExpected) {
  for (const char* bad :
       {"F1", "0X1", "0F", "0Fx", "0F-1", "0REDUCE3", "3STEP", "0f1", "0F99999999999"}) {
    std::string msg = input_error_of([&] { parse_token(bad, "plan.txt:3"); });
    EXPECT_NE(msg.find("plan.txt:3"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(ScheduleToken, NamesALowerCaseKind) {
  // The kind had been read as upper-case letters only: "0f0" named kind ''.
  const std::string msg = input_error_of([] { parse_token("0f0", "t"); });
  EXPECT_NE(msg.find("unknown kind 'f' (kinds are upper case: 'F')"), std::string::npos) << msg;
  EXPECT_NE(input_error_of([] { parse_token("0q0", "t"); }).find("unknown kind 'q' (expected"),
            std::string::npos);
}

// Error messages echo what was found: a NUL had ended the message there (what() is a C
// string), and an escape sequence had reached the terminal raw.
TEST(ScheduleToken, ControlCharactersInAMessageAreShownNotSent) {
  const std::string msg =
      input_error_of([] { parse_token(std::string_view("0F\0\x1b[31m", 8), "t"); });
  EXPECT_NE(msg.find("bad action '0F\\x00\\x1b[31m'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(expected <stage><kind>"), std::string::npos) << msg;
  // Lines and tabs of a message stay; C1 controls are named.
  EXPECT_EQ(std::string(InputError("a\n\tb\xc2\x9b").what()), "a\n\tb\\u009b");
  EXPECT_EQ(std::string(baton::RuntimeError(std::string("x\0y", 3)).what()), "x\\x00y");
  EXPECT_EQ(baton::printable("a\nb"), "a\\x0ab");
}

// Numbers take the JSON form's range, up to 2^30: the text form had stopped at 9 digits,
// so 1073741823F0 "does not start with a stage number"; beyond 2^30 the message says so.
TEST(ScheduleToken, NumbersUpToTheJsonBoundAndTooLargeSaysSo) {
  EXPECT_EQ(parse_token("1073741823F0", "t"), make_action(ActionKind::forward, 0, 1073741823));
  EXPECT_EQ(parse_token("1BW1073741824", "t"),
            make_action(ActionKind::full_backward, 1073741824, 1));
  EXPECT_EQ(parse_token("0F0000000000007", "t"), make_action(ActionKind::forward, 7, 0));
  EXPECT_NE(input_error_of([] {
              parse_token("1073741825F0", "t");
            }).find("the stage number 1073741825 is too large (at most 1073741824)"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { parse_token("1BW99999999999999999999", "t"); })
                .find("the micro-batch number 99999999999999999999 is too large (at most "
                      "1073741824)"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              parse_token("4294967296REDUCE", "t");
            }).find("the stage number 4294967296 is too large"),
            std::string::npos);
}

TEST(ScheduleToken, ParsesACompositeAtOnePosition) {
  auto [f, b] = parse_composite("(0F7;3BW2)", "rank 0, action 1");
  EXPECT_TRUE(f.overlap);
  EXPECT_EQ(composite_token(f, b), "(0F7;3BW2)");
  for (const char* bad : {"(0F1; 0BW0)", "(0F1;0BW0", "0F1;0BW0)", "(0F1)", "(0F1;0BW0)x"}) {
    const std::string msg = input_error_of([&] { parse_composite(bad, "rank 0, action 1"); });
    EXPECT_EQ(msg.rfind("rank 0, action 1: bad composite '", 0), 0u) << bad << ": " << msg;
  }
}

TEST(ScheduleText, RoundTripsExactly) {
  for (const Schedule& s : sample_schedules()) {
    const std::string text = to_text(s);
    Schedule back = parse_text(text, "mem");
    EXPECT_EQ(back, s) << s.name;
    EXPECT_EQ(to_text(back), text) << s.name;
  }
}

TEST(ScheduleJson, RoundTripsExactly) {
  for (const Schedule& s : sample_schedules()) {
    const std::string text = to_json_text(s);
    Schedule back = parse_json(text, "mem.json");
    EXPECT_EQ(back, s) << s.name;
    EXPECT_EQ(to_json_text(back), text) << s.name;
    EXPECT_EQ(from_json(to_json(s), "j"), s);
  }
}

// A schedule file's errors say what was found once, as the cost file's do (they had put
// the type first: "found null null", "found string \"x\"").
TEST(ScheduleJson, ErrorsSayWhatWasFoundOnce) {
  auto error_of = [](const std::string& text) {
    return input_error_of([&] { parse_json(text, "s.json"); });
  };
  EXPECT_NE(error_of(R"({"name": null})").find("found null"), std::string::npos);
  EXPECT_EQ(error_of(R"({"name": null})").find("null null"), std::string::npos);
  EXPECT_NE(error_of(R"({"ranks": 1, "micro_batches": 1, "placement": "ab", "actions": []})")
                .find("expected an array of ranks, found \"ab\""),
            std::string::npos)
      << error_of(R"({"ranks": 1, "micro_batches": 1, "placement": "ab", "actions": []})");
}

TEST(ScheduleFormats, TextAndJsonAreInterchangeable) {
  for (const Schedule& s : sample_schedules()) {
    EXPECT_EQ(parse_json(to_json_text(parse_text(to_text(s), "a")), "b"), s);
    EXPECT_EQ(to_text(parse_json(to_json_text(s), "c")), to_text(s));
  }
}

TEST(ScheduleText, ReadsResearcherShorthand) {
  // No header, commas or spaces, comments, optional "rank r:" prefixes.
  Schedule s = parse_text(
      "# 1F1B for two ranks\n"
      "0F0, 0F1, 0BW0, 0BW1   # rank 0\n"
      "rank 1: 1F0 1BW0 1F1 1BW1\n",
      "short.txt");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.num_micro_batches, 2);
  EXPECT_EQ(s.placement, (std::vector<int>{0, 1}));
  ASSERT_EQ(s.ranks[1].size(), 4u);
  EXPECT_EQ(s.ranks[1][2], make_action(ActionKind::forward, 1, 1));
  // Stages beyond p: the loop placement over the next multiple of p.
  Schedule t = parse_text("0F0 2F0\n1F0 3F0\n", "x");
  EXPECT_EQ(t.placement, (std::vector<int>{0, 1, 0, 1}));
  // Peers come from the placement.
  Schedule u = parse_text("placement: 0 1\n0: 0F0 0SEND_F0\n1: 1RECV_F0 1F0\n", "y");
  EXPECT_EQ(u.ranks[0][1].peer, 1);
  EXPECT_EQ(u.ranks[1][0].peer, 0);
}

TEST(ScheduleText, ErrorsNameFileLineAndExpectation) {
  struct Case {
    std::string text;
    const char* where;
    const char* what;
  };
  const Case cases[] = {
      {"ranks: 2\n0: 0F0\n1: 1F0 1Q0\n", "bad.txt:3", "unknown kind 'Q'"},
      {"0: 0F0\n2: 1F0\n", "bad.txt:2", "expected the line of rank 1"},
      {"0: 0F0\n2147483648: 1F0\n", "bad.txt:2", "the rank number 2147483648 is too large"},
      {"ranks: x\n0: 0F0\n", "bad.txt:1", "expected an integer"},
      {"ranks: 3\n0: 0F0\n1: 1F0\n", "bad.txt:1", "3 but 2 rank lines"},
      {"0: 0F0\nranks: 1\n", "bad.txt:2", "after the rank lines"},
      {"colour: red\n0: 0F0\n", "bad.txt:1", "unknown header 'colour:'"},
      // A header field's own line, where it has one (the range checks had named the file).
      {"placement: 0 5\n0: 0F0\n1: 1F0\n", "bad.txt:1", "placement[1]: expected a rank in [0, 2)"},
      {"directions: 2\nmicro_batches: 3\nplacement: 0 0\n0: 0F0\n", "bad.txt:2",
       "micro_batches: a bidirectional schedule needs an even number"},
      {"# nothing\n\n", "bad.txt", "no rank lines"},
      {"# m\nmicro_batches: 0\n0: 0F0\n", "bad.txt:2", "micro_batches: expected at least 1"},
      {"ranks: -1\n0: 0F0\n", "bad.txt:1", "ranks: -1 but 1 rank lines"},
      // A long token is cut in the message (a 10 MB one had made a 20 MB message).
      {"0: 0F0 0F" + std::string(5000, '7') + "\n", "bad.txt:1 (rank 0, action 1)",
       "... (5002 bytes)"},
  };
  for (const Case& c : cases) {
    std::string msg = input_error_of([&] { parse_text(c.text, "bad.txt"); });
    EXPECT_NE(msg.find(c.where), std::string::npos) << c.text << " -> " << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.text << " -> " << msg;
    EXPECT_LT(msg.size(), 600u) << msg;
  }
}

// A name that is not UTF-8 is refused where it is read, naming the line and the byte: it
// had been accepted and then failed every JSON writer (a trace, the JSON form, a
// summary) with nlohmann's raw type_error after the run.
TEST(ScheduleText, NameThatIsNotUtf8IsRefused) {
  const std::string msg =
      input_error_of([] { parse_text("# mine\nname: bad\xff\n0: 0F0 0BW0\n", "bad.txt"); });
  EXPECT_EQ(
      msg.rfind("bad.txt:2: name: not valid UTF-8 (byte 0xff at byte offset 9 of the line)", 0), 0u)
      << msg;
  EXPECT_NE(input_error_of([] {
              parse_text("name: \xed\xa0\x80\n0: 0F0\n", "s");
            }).find("byte 0xed at byte offset 6"),
            std::string::npos);
  // UTF-8 beyond ASCII is a name like any other, and goes into JSON.
  const Schedule s = parse_text("name: caf\xc3\xa9 \xe2\x82\xac\n0: 0F0 0BW0\n", "s");
  EXPECT_EQ(s.name, "caf\xc3\xa9 \xe2\x82\xac");
  EXPECT_EQ(parse_json(to_json_text(s), "s.json"), s);
}

TEST(ScheduleJson, ErrorsNameJsonPathAndExpectation) {
  const std::string good = to_json_text(generate("1f1b", 2, 2));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  struct Case {
    std::string text;
    const char* what;
  };
  const Case cases[] = {
      {"{", "not valid JSON"},
      {"[]", "expected a JSON object"},
      {with("\"ranks\": 2", "\"ranks\": \"two\""), "ranks: expected an integer"},
      {with("\"ranks\": 2", "\"rank\": 2"), "rank: unknown field"},
      {with("\"micro_batches\": 2", "\"micro_batches\": 0"),
       "micro_batches: expected an integer in [1"},
      {with("{\"kind\":\"F\",\"micro_batch\":1,\"stage\":1}",
            "{\"kind\":\"X\",\"micro_batch\":1,\"stage\":1}"),
       "actions[1][2].kind: expected one of F, B"},
      {with("{\"kind\":\"F\",\"micro_batch\":1,\"stage\":1}", "{\"kind\":\"F\",\"stage\":1}"),
       "actions[1][2].micro_batch: missing"},
      {with("{\"kind\":\"F\",\"micro_batch\":1,\"stage\":1}",
            "{\"kind\":\"F\",\"micro_batch\":1,\"stage\":1,\"x\":0}"),
       "actions[1][2].x: unknown field"},
      {with("{\"kind\":\"F\",\"micro_batch\":1,\"stage\":1}",
            "{\"kind\":\"F\",\"micro_batch\":-1,\"stage\":1}"),
       "actions[1][2].micro_batch: expected an integer in [0"},
      {with("\"placement\": [0,1]", "\"placement\": [0,2]"),
       "placement[1]: expected an integer in [0, 1]"},
      {with("\"format\": \"baton-schedule\"", "\"format\": \"other\""),
       "format: expected \"baton-schedule\""},
      // A newer baton's schedule, with a field this one does not know, is named by its
      // version.
      {with("\"version\": 1,", "\"version\": 2, \"later\": 0,"),
       "version: the schedule is in format version 2, written by a newer baton; this one "
       "reads version 1"},
  };
  for (const Case& c : cases) {
    std::string msg = input_error_of([&] { parse_json(c.text, "s.json"); });
    EXPECT_EQ(msg.rfind("s.json: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.text << "\n-> " << msg;
  }
}

TEST(ScheduleFiles, SaveAndLoadEitherFormByName) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("baton_sched_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Schedule s = lower(generate("zb-v", 3, 5));
  for (const char* name : {"s.txt", "s.json"}) {
    const std::string path = (dir / name).string();
    save_schedule(s, path);
    EXPECT_EQ(load_schedule(path), s) << name;
  }
  std::ifstream json_file(dir / "s.json");
  EXPECT_EQ(json_file.get(), '{');
  EXPECT_NE(
      input_error_of([&] { load_schedule((dir / "missing.txt").string()); }).find("cannot open"),
      std::string::npos);
  EXPECT_NE(input_error_of([&] {
              save_schedule(s, (dir / "no" / "such" / "dir.txt").string());
            }).find("cannot"),
            std::string::npos);
  // A .json file is JSON whatever it starts with ("[1,2]" had been read as text actions,
  // an empty file as a text schedule without rank lines).
  const std::string array = (dir / "a.json").string(), empty = (dir / "e.json").string();
  std::ofstream(array) << "[1,2]";
  std::ofstream(empty).flush();
  EXPECT_EQ(input_error_of([&] { load_schedule(array); }),
            array + ": expected a JSON object, found an array of 2");
  EXPECT_EQ(input_error_of([&] { load_schedule(empty); }).rfind(empty + ": not valid JSON", 0), 0u)
      << input_error_of([&] { load_schedule(empty); });
  std::filesystem::remove_all(dir);
}

// The form follows the extension in any case: x.CSV had been read (and written) as text,
// failing on its first comma-separated cell.
TEST(ScheduleFiles, ExtensionsInAnyCase) {
  const std::string dir = ::testing::TempDir() + "/sched_case_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const Schedule s = generate("1f1b", 2, 4);
  for (const char* name : {"s.CSV", "s.Csv", "s.csv"}) {
    const std::string path = dir + "/" + name;
    save_schedule(s, path);
    EXPECT_EQ(std::ifstream(path).get(), '0') << name << ": not the CSV form";
    const Schedule back = load_schedule(path);
    EXPECT_EQ(back.ranks, s.ranks) << name;
    EXPECT_EQ(back.name, "s") << name;
  }
  save_schedule(s, dir + "/s.JSON");
  EXPECT_EQ(std::ifstream(dir + "/s.JSON").get(), '{');
  EXPECT_EQ(load_schedule(dir + "/s.JSON"), s);
  EXPECT_FALSE(is_csv_path("s.csvx"));
  EXPECT_FALSE(is_csv_path("csv"));
  std::filesystem::remove_all(dir);
}

// A byte-order mark (Windows editors write one) is skipped in every form: a JSON schedule
// with one had been read as the text form ("unknown header"), and text and CSV had taken
// it as part of their first word.
TEST(ScheduleFiles, AByteOrderMarkIsSkippedInEveryForm) {
  const std::string dir = ::testing::TempDir() + "/sched_bom_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const Schedule s = generate("1f1b", 2, 4);
  for (const char* name : {"s.txt", "s.json", "s.csv"}) {
    const std::string path = dir + "/" + name;
    save_schedule(s, path);
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary) << "\xEF\xBB\xBF" << text;
    EXPECT_EQ(load_schedule(path).ranks, s.ranks) << name;
  }
  std::filesystem::remove_all(dir);
}

// interleaved-1f1b's limits apply to the micro-batches asked, not to the whole groups of p
// it builds and cuts back: 3 ranks at 2^20 micro-batches (the generators' bound) had been
// refused as 1048578, a number nobody typed.
TEST(Generators, InterleavedLimitsApplyToTheMicroBatchesAsked) {
  const Schedule s = interleaved_1f1b(3, 1 << 20, 1);
  EXPECT_EQ(s.num_micro_batches, 1 << 20);
  EXPECT_EQ(s.num_actions(), size_t(3) * 2 * (1 << 20));
  const std::string e = input_error_of([] { interleaved_1f1b(3, (1 << 20) + 1, 1); });
  EXPECT_NE(e.find("found 1048577"), std::string::npos) << e;
}

TEST(CostFile, ParsesScalarsArraysAndUnits) {
  CostSpec c = parse_costs(R"({"forward": 2, "backward_input": [1, 2, 3, 4], "backward_weight": 1,
      "activation_bytes": "1MiB", "message_bytes": 4096, "p2p": {"latency": 0.5, "bandwidth": "1KiB"},
      "optimizer_step": 3, "time_unit": "ms", "comment": "test"})",
                           "c.json");
  EXPECT_DOUBLE_EQ(c.seconds_per_unit, 1e-3);
  Costs r = resolve(c, 2, 4, 1);  // two stages per rank: a rank's share is split in two
  EXPECT_EQ(r.forward, (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(r.backward_input, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(r.activation_bytes, (std::vector<double>(4, 524288.0)));
  EXPECT_EQ(r.message_bytes, (std::vector<double>(4, 4096.0)));  // message sizes are not divided
  EXPECT_DOUBLE_EQ(r.bandwidth, 1024.0);
  EXPECT_DOUBLE_EQ(r.latency, 0.5);
  EXPECT_NE(input_error_of([&] {
              resolve(c, 2, 6, 1);
            }).find("backward_input: has 4 values but the schedule has 6"),
            std::string::npos);
}

// Times beyond 1e9 s (as profile cost files) and sizes beyond 2^63 bytes are refused: a
// cost file of 1e308 had simulated to makespan inf, bubble NaN and a trace with "dur": inf.
// A profile's op-time file given for a schedule's costs says which file it is and what
// reads it (its fields had been refused one by one: "unknown field 'batch'").
TEST(CostFile, AProfilesOpTimesSayWhatTheyAre) {
  EXPECT_EQ(input_error_of([&] {
              parse_costs(R"({"version": 2, "kind": "op_times", "batch": 2, "ops": {}})", "c.json");
            }).rfind("c.json: $.kind: this is a `baton profile` file of op times", 0),
            0u);
}

// The limit is in seconds, whatever the file's time_unit.
TEST(CostFile, RefusesValuesWhoseSumsWouldOverflow) {
  const std::string fbw = R"("backward_input": 1, "backward_weight": 1)";
  auto error_of = [&](const std::string& fields) {
    return input_error_of([&] { parse_costs("{" + fields + "}", "c.json"); });
  };
  EXPECT_EQ(error_of(R"("forward": 1e308, )" + fbw),
            "c.json: $.forward: expected at most 1e9 s, found 1e+308");
  EXPECT_EQ(error_of(R"("forward": [1, 2e9], )" + fbw),
            "c.json: $.forward[1]: expected at most 1e9 s, found 2e+09");
  EXPECT_EQ(
      error_of(R"("forward": 1, "time_unit": "ms", )" + fbw + R"(, "reduce": 1e13)"),
      "c.json: $.reduce: expected at most 1e9 s (1e+12 in this file's time_unit), found 1e+13");
  EXPECT_EQ(error_of(R"("forward": 2e9, "time_unit": "ns", )" + fbw), "");  // 2 s
  EXPECT_NE(error_of(R"("forward": 1, "optimizer_step": 1e300, )" + fbw).find("$.optimizer_step: "),
            std::string::npos);
  EXPECT_NE(error_of(R"("forward": 1, "p2p": {"latency": 1e300}, )" + fbw).find("$.p2p.latency: "),
            std::string::npos);
  EXPECT_NE(error_of(R"("forward": 1, "message_bytes": 1e300, )" + fbw)
                .find("$.message_bytes: expected at most 2^63 bytes"),
            std::string::npos);
  EXPECT_NE(error_of(R"("forward": 1, "message_bytes": 1e6, "p2p": {"bandwidth": 1e-300}, )" + fbw)
                .find("$.p2p.bandwidth: expected a bandwidth that moves message_bytes (1000000)"),
            std::string::npos);
}

// activation_bytes_after_b is the part of activation_bytes held between B and W: more
// than the whole is refused, per stage, whether given as one number or per stage.
TEST(CostFile, ActivationBytesAfterBIsAPartOfActivationBytes) {
  const std::string fbw = R"("forward": 1, "backward_input": 1, "backward_weight": 1, )";
  auto error_of = [&](const std::string& fields) {
    return input_error_of(
        [&] { resolve(parse_costs("{" + fbw + fields + "}", "c.json"), 2, 2, 1); });
  };
  EXPECT_EQ(error_of(R"("activation_bytes": 100, "activation_bytes_after_b": 100)"), "");
  EXPECT_EQ(error_of(R"("activation_bytes": 100, "activation_bytes_after_b": 101)"),
            "costs: activation_bytes_after_b: expected at most activation_bytes (100, of which it "
            "is the part held between B and W), found 101");
  EXPECT_NE(error_of(R"("activation_bytes": 100, "activation_bytes_after_b": [50, 150])")
                .find("activation_bytes_after_b[1]: expected at most activation_bytes (100"),
            std::string::npos);
  EXPECT_NE(error_of(R"("activation_bytes_after_b": 1)").find("(0: not given"), std::string::npos);
}

TEST(CostFile, ErrorsNameJsonPath) {
  struct Case {
    const char* text;
    const char* what;
  };
  const Case cases[] = {
      {R"({"forward": 1, "backward_input": 1})", "$.backward_weight: missing"},
      {R"({"forward": -1, "backward_input": 1, "backward_weight": 1})",
       "$.forward: expected a number >= 0, found -1"},
      {R"({"forward": [1, "x"], "backward_input": 1, "backward_weight": 1})",
       "$.forward[1]: expected a number >= 0, found \"x\""},
      {R"({"forward": 1, "backward_input": 1, "backward_weight": 1, "fwd": 2})",
       "$.fwd: unknown field"},
      {R"({"forward": 1, "backward_input": 1, "backward_weight": 1, "p2p": {"lat": 1}})",
       "$.p2p.lat: unknown field"},
      {R"({"forward": 1, "backward_input": 1, "backward_weight": 1, "time_unit": "h"})",
       "$.time_unit: expected \"s\", \"ms\", \"us\" or \"ns\", found \"h\""},
      {R"({"forward": 1, "backward_input": 1, "backward_weight": 1, "activation_bytes": "3 parsecs"})",
       "$.activation_bytes: invalid size"},
      {R"({"forward": [], "backward_input": 1, "backward_weight": 1})",
       "$.forward: expected one value per stage"},
  };
  for (const Case& c : cases) {
    std::string msg = input_error_of([&] { parse_costs(c.text, "c.json"); });
    EXPECT_EQ(msg.rfind("c.json: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.text << " -> " << msg;
  }
}

// What a field held is said once ("found null", not "found null null" with its type
// before it), whole for the messages a user most often sees.
TEST(CostFile, ErrorsSayWhatWasFoundOnce) {
  const std::string bw = R"("backward_input": 1, "backward_weight": 1)";
  auto error_of = [&](const std::string& fields) {
    return input_error_of([&] { parse_costs("{" + fields + "}", "c.json"); });
  };
  EXPECT_EQ(error_of(R"("forward": null, )" + bw),
            "c.json: $.forward: expected a number >= 0, found null");
  EXPECT_EQ(error_of(R"("forward": 1, "optimizer_step_mode": null, )" + bw),
            "c.json: $.optimizer_step_mode: expected \"synchronous\" or \"post-validated\", "
            "found null");
  EXPECT_EQ(error_of(R"("forward": 1, "optimizer_step": true, )" + bw),
            "c.json: $.optimizer_step: expected a number >= 0, found true");
  EXPECT_EQ(error_of(R"("forward": {"a": 1}, )" + bw),
            "c.json: $.forward: expected a number >= 0, found an object");
  EXPECT_EQ(error_of(R"("forward": 1, "reduce_group": [[0]], )" + bw),
            "c.json: $.reduce_group[0]: expected -1 or a group id >= 0, found an array of 1");
  EXPECT_EQ(input_error_of([&] { parse_costs("[1, 2]", "c.json"); }),
            "c.json: $: expected a JSON object, found an array of 2");
}
