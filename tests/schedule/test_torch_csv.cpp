// PyTorch's schedule CSV (both dialects) against files PyTorch wrote
// (tests/fixtures/torch_schedules, made by tests/fixtures/make_torch_schedules.py), and
// the composite OVERLAP_F_B action through the text form, the validator and the
// simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "memory/error.h"
#include "memory/file_io.h"
#include "schedule/costs.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/schedule_io.h"
#include "schedule/simulate.h"
#include "schedule/torch_csv.h"
#include "schedule/validate.h"
#include "tests/input_error.h"

using namespace baton::schedule;
using baton::InputError;

namespace {

using baton::testing_support::input_error_of;

// The fixtures baton reads (PyTorch's compute-only dumps), and the ones it refuses.
bool is_comms(const std::string& path) {
  return path.find("_comms.csv") != std::string::npos;
}
// PyTorch 2.15's Schedule1F1B lists its last rank's forwards as F1..Fm instead of
// F0..F(m-1) (its _get_pipeline_order starts the steady state at forward_mb + 1 when no
// warm-up forward ran): the validator refuses those files.
bool is_torch_1f1b(const std::string& path) {
  return path.find("/1f1b_") != std::string::npos;
}

std::vector<std::string> fixtures(bool readable = true) {
  std::vector<std::string> out;
  for (const auto& e :
       std::filesystem::directory_iterator(BATON_SOURCE_DIR "/tests/fixtures/torch_schedules")) {
    const std::string path = e.path().string();
    if (is_csv_path(path) && (!readable || (!is_comms(path) && !is_torch_1f1b(path))))
      out.push_back(path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

using K = ActionKind;

}  // namespace

TEST(TorchCsv, FixturesValidateSimulateAndRoundTripByteForByte) {
  const auto files = fixtures();
  ASSERT_GE(files.size(), 10u);
  int composites = 0, legacy = 0, lowered = 0;
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const std::string text = baton::memory::read_file(path);
    TorchCsv csv = load_torch_csv(path);
    const ValidationReport rep = validate(csv.schedule);
    ASSERT_TRUE(rep.ok) << rep.to_string();
    SimResult r = simulate(csv.schedule, resolve(CostSpec::unit(), csv.schedule));
    EXPECT_GT(r.makespan, 0.0);
    EXPECT_EQ(to_torch_csv(csv.schedule, csv.dialect, &csv.kept), text);
    // The same schedule through baton's own text form and back.
    EXPECT_EQ(parse_text(to_text(csv.schedule), "t"), csv.schedule);
    for (const auto& list : csv.schedule.ranks)
      for (const Action& a : list) composites += a.overlap;
    legacy += csv.dialect == TorchDialect::legacy;
    lowered += has_transfers(csv.schedule);
  }
  EXPECT_GT(composites, 0) << "no DualPipeV fixture with OVERLAP_F_B";
  (void)legacy;
  (void)lowered;
}

TEST(TorchCsv, FixturesBatonRefuses) {
  int comms = 0, one_f_one_b = 0;
  for (const std::string& path : fixtures(false)) {
    SCOPED_TRACE(path);
    if (is_comms(path)) {
      // The runtime's lowered form names FSDP's UNSHARD first.
      EXPECT_NE(input_error_of([&] {
                  load_torch_csv(path);
                }).find(path + ": row 1 (rank 0), cell 1: '0UNSHARD': UNSHARD/RESHARD"),
                std::string::npos);
      ++comms;
    } else if (is_torch_1f1b(path)) {
      const TorchCsv csv = load_torch_csv(path);
      EXPECT_EQ(to_torch_csv(csv.schedule, csv.dialect, &csv.kept), baton::memory::read_file(path));
      const std::string last = std::to_string(csv.schedule.num_ranks - 1);
      const std::string err = input_error_of([&] { check_torch_csv(csv, path); });
      EXPECT_NE(err.find("invalid schedule (CSV row "), std::string::npos) << err;
      EXPECT_NE(err.find("rank " + last), std::string::npos) << err;
      ++one_f_one_b;
    }
  }
  EXPECT_EQ(comms, 2);
  EXPECT_EQ(one_f_one_b, 2);
}

// Splits a CSV row into cells (the fixtures quote nothing).
std::vector<std::string> cells_of(const std::string& row) {
  std::vector<std::string> out(1);
  for (char ch : row) {
    if (ch == ',')
      out.emplace_back();
    else
      out.back().push_back(ch);
  }
  return out;
}
std::string join(const std::vector<std::string>& cells) {
  std::string out;
  for (size_t i = 0; i < cells.size(); ++i) out += (i ? "," : "") + cells[i];
  return out;
}

TEST(TorchCsv, MutatedFixturesAreRefusedWithThePosition) {
  for (const std::string& path : fixtures()) {
    SCOPED_TRACE(path);
    const std::string text = baton::memory::read_file(path);
    const size_t eol = text.find("\r\n");
    const std::string rest = text.substr(eol);
    const auto cells = cells_of(text.substr(0, eol));
    // An action dropped: rank 0's second non-empty cell.
    {
      auto m = cells;
      auto it =
          std::find_if(m.begin() + 1, m.end(), [](const std::string& c) { return !c.empty(); });
      ASSERT_NE(it, m.end());
      m.erase(it);
      TorchCsv csv = parse_torch_csv(join(m) + rest, "dropped.csv");
      const std::string err = input_error_of([&] { check_torch_csv(csv, "dropped.csv"); });
      EXPECT_NE(err.find("dropped.csv: invalid schedule (CSV row "), std::string::npos) << err;
      EXPECT_NE(err.find("rank "), std::string::npos) << err;
    }
    // Two swapped: rank 0's first forward and the backward of the same pair.
    {
      auto m = cells;
      auto f = std::find_if(m.begin(), m.end(), [](const std::string& c) {
        return c.find('F') != std::string::npos && c.front() != '(' &&
               c.find("SEND") == std::string::npos && c.find("RECV") == std::string::npos;
      });
      ASSERT_NE(f, m.end());
      const std::string stage = f->substr(0, f->find('F')), mb = f->substr(f->find('F') + 1);
      auto b = std::find_if(m.begin(), m.end(), [&](const std::string& c) {
        return c == stage + "B" + mb || c == stage + "I" + mb;
      });
      if (b == m.end()) continue;  // its backward is half of a composite
      const long fi = f - m.begin(), bi = b - m.begin();
      std::iter_swap(f, b);
      TorchCsv csv = parse_torch_csv(join(m) + rest, "swapped.csv");
      const std::string err = input_error_of([&] { check_torch_csv(csv, "swapped.csv"); });
      EXPECT_NE(
          err.find("swapped.csv: invalid schedule (CSV row 1, cell " + std::to_string(fi + 1) +
                   "): backward before its forward: rank 0, action "),
          std::string::npos)
          << err << " (backward moved from cell " << bi + 1 << ")";
    }
  }
}

// What runs a CSV (simulate --file, train --schedule) names its cell when it is invalid;
// blank lines after the rows are no ranks.
TEST(TorchCsv, AScheduleToRunNamesItsCellAndTrailingBlankLinesAreNoRanks) {
  const std::string dir = ::testing::TempDir();
  const std::string bad = dir + "/cellpos.csv", trailing = dir + "/trailing.csv";
  std::ofstream(bad) << "0F0,,,,0B0\n,,1B0,1F0\n";
  EXPECT_NE(input_error_of([&] {
              load_schedule_to_run(bad);
            }).find(bad + ": invalid schedule (CSV row 2, cell 3)"),
            std::string::npos);
  std::ofstream(trailing) << "0F0,0B0\r\n1F0,1B0\r\n\r\n  \n";
  const Schedule s = load_schedule_to_run(trailing);
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(load_schedule(trailing), s);
}

// A CSV's name is its file's: one that is not UTF-8 has U+FFFD for its odd bytes, so the
// JSON writers take it (the JSON form and simulate --trace had failed with nlohmann's raw
// type_error).
TEST(TorchCsv, ANameFromAFileNameThatIsNotUtf8) {
  const std::string path = ::testing::TempDir() + "/odd-\xff.csv";
  std::ofstream(path) << "0F0,0B0\r\n";
  const Schedule s = load_schedule_to_run(path);
  EXPECT_EQ(s.name, "odd-\xef\xbf\xbd");
  EXPECT_EQ(parse_json(to_json_text(s), "s.json"), s);
  std::filesystem::remove(path);
}

// Stage and micro-batch numbers take the text form's range, up to 2^30: the reader had
// stopped at 9 digits, and 0F1000000000 was "not a micro-batch number".
TEST(TorchCsv, NumbersUpToTheJsonBoundAndTooLargeSaysSo) {
  // Read as a number: the schedule it implies is then beyond what baton holds.
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("0F1000000000\r\n", "big.csv");
            }).find("micro_batches = 1000000001 is beyond the supported"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("0F1073741825\r\n", "m.csv");
            }).find("the micro-batch number 1073741825 is too large (at most 1073741824)"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("4294967296F0\r\n", "s.csv");
            }).find("the stage number 4294967296 is too large"),
            std::string::npos);
}

TEST(TorchCsv, Dialects) {
  // Legacy: B of a pair with a W is the input gradient; without one, the full backward.
  TorchCsv a = parse_torch_csv("0F0,0F1,0B0,0W0,0B1\r\n", "a.csv");
  EXPECT_EQ(a.dialect, TorchDialect::legacy);
  EXPECT_EQ(a.schedule.ranks[0][2].kind, K::backward_input);
  EXPECT_EQ(a.schedule.ranks[0][4].kind, K::full_backward);
  EXPECT_TRUE(validate(a.schedule).ok) << validate(a.schedule).to_string();
  EXPECT_EQ(to_torch_csv(a.schedule, TorchDialect::legacy), "0F0,0F1,0B0,0W0,0B1\r\n");
  EXPECT_EQ(to_torch_csv(a.schedule), "0F0,0F1,0I0,0W0,0B1\r\n");
  // Current: I input gradient, B full backward; detected from the I.
  TorchCsv c = parse_torch_csv("0F0,1F0,1I0,0I0,1W0,0W0\n", "c.csv");
  EXPECT_EQ(c.dialect, TorchDialect::current);
  EXPECT_EQ(c.schedule.num_ranks, 1);
  EXPECT_EQ(c.schedule.ranks[0][2].kind, K::backward_input);
  // F and B only: the same either way.
  TorchCsv fb = parse_torch_csv("0F0,,0B0\r\n1F0,1B0\r\n", "fb.csv");
  EXPECT_EQ(fb.schedule.ranks[0][1].kind, K::full_backward);
  EXPECT_EQ(fb.schedule.placement, (std::vector<int>{0, 1}));
  EXPECT_EQ(fb.kept[0], (std::vector<KeptCell>{{1, ""}}));
  EXPECT_EQ(to_torch_csv(fb.schedule, fb.dialect, &fb.kept), "0F0,,0B0\r\n1F0,1B0\r\n");
  // PyTorch 2.15's waits are kept aside and put back.
  const std::string waits =
      "0F0,0SEND_F0,0WAIT_SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\r\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD\r\n";
  TorchCsv w = parse_torch_csv(waits, "w.csv");
  EXPECT_TRUE(validate(w.schedule).ok) << validate(w.schedule).to_string();
  EXPECT_EQ(w.schedule.ranks[0].size(), 5u);
  EXPECT_EQ(to_torch_csv(w.schedule, w.dialect, &w.kept), waits);
  EXPECT_EQ(torch_cell(w, 0, 2), 3);  // 0RECV_B0, after the wait
  // Given, not detected: "B" with a W in the current dialect is a full backward, and
  // then the W is one too many.
  TorchCsv forced = parse_torch_csv("0F0,0B0,0W0\r\n", "f.csv", TorchDialect::current);
  EXPECT_NE(validate(forced.schedule).message.find("both a full backward"), std::string::npos);
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("0F0,0I0,0W0\r\n", "l.csv", TorchDialect::legacy);
            }).find("l.csv: row 1 (rank 0), cell 2: 'I' (input gradient) is current"),
            std::string::npos);
  // Transfers and REDUCE_GRAD.
  TorchCsv t = parse_torch_csv(
      "0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD\r\n1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD\r\n",
      "t.csv");
  EXPECT_TRUE(validate(t.schedule).ok) << validate(t.schedule).to_string();
  EXPECT_EQ(t.schedule.ranks[0][1].peer, 1);
  EXPECT_EQ(t.schedule.ranks[1][4].kind, K::reduce_gradients);
}

// PyTorch 2.15's runtime refuses a REDUCE_GRAD that no WAIT_REDUCE_GRAD follows: its own
// GPipe dump (a fixture torch wrote) keeps its waits through the CLI's path
// (load_schedule_to_run's kind of read, save_schedule with the kept cells), and a
// schedule baton made gets one after each REDUCE_GRAD.
TEST(TorchCsv, ReduceGradKeepsItsWait) {
  const std::string path = BATON_SOURCE_DIR "/tests/fixtures/torch_schedules/gpipe_p4_m8.csv";
  const std::string text = baton::memory::read_file(path);
  ASSERT_NE(text.find(",0REDUCE_GRAD,0WAIT_REDUCE_GRAD\r\n"), std::string::npos);
  const TorchCsv csv = load_torch_csv(path);
  const std::string out = ::testing::TempDir() + "/gpipe_back.csv";
  save_schedule(csv.schedule, out, csv.dialect, &csv.kept);
  EXPECT_EQ(baton::memory::read_file(out), text);
  // Without the kept cells (a schedule from anywhere), each REDUCE_GRAD gets its wait.
  EXPECT_EQ(to_torch_csv(csv.schedule), text);
  Schedule s = add_gradient_reduction(generate("interleaved-1f1b", 2, 4, 2), /*step=*/false);
  const std::string written = to_torch_csv(s);
  for (int stage = 0; stage < 4; ++stage) {
    const std::string st = std::to_string(stage);
    EXPECT_NE(written.find(st + "REDUCE_GRAD," + st + "WAIT_REDUCE_GRAD"), std::string::npos)
        << written;
  }
  // ... and reads back to the same schedule; a kept wait is not written twice.
  TorchCsv back = parse_torch_csv(written, "w.csv");
  EXPECT_EQ(back.schedule.ranks, s.ranks);
  EXPECT_EQ(to_torch_csv(back.schedule, back.dialect, &back.kept), written);
  // The kept cells after a written wait keep their places.
  TorchCsv idle = parse_torch_csv("0F0,0B0,0REDUCE_GRAD,,0F1\r\n", "i.csv");
  EXPECT_EQ(to_torch_csv(idle.schedule, idle.dialect, &idle.kept),
            "0F0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,,0F1\r\n");
}

// A PyTorch RECV posts the receive; its runtime waits at the action using the data. The
// reader moves each RECV to just before that action, so the lowered form PyTorch wrote
// of Interleaved1F1B (p=2, v=2, m=4; FSDP's actions dropped) runs like its compute-only
// form: the same makespan (it had been 20 against 13.5), and each wait where PyTorch's is.
TEST(TorchCsv, AReceiveWaitsAtItsConsumer) {
  const std::string dir = BATON_SOURCE_DIR "/tests/fixtures/torch_schedules/";
  const std::string comms_path = dir + "comms_without_fsdp/interleaved1f1b_p2_m4.csv";
  const TorchCsv compute = load_torch_csv(dir + "interleaved1f1b_p2_m4.csv");
  const TorchCsv comms = load_torch_csv(comms_path);
  check_torch_csv(comms, comms_path);
  ASSERT_TRUE(has_transfers(comms.schedule));
  const Costs c = resolve(CostSpec::unit(), compute.schedule);
  const double plain = simulate(compute.schedule, c).makespan;
  EXPECT_DOUBLE_EQ(plain, 13.5);
  EXPECT_DOUBLE_EQ(simulate(comms.schedule, resolve(CostSpec::unit(), comms.schedule)).makespan,
                   plain);
  // Each receive is right before its consumer (both of a composite's before it); the
  // sends stay in their order.
  for (const auto& list : comms.schedule.ranks)
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind != K::recv_activation && list[i].kind != K::recv_gradient) continue;
      size_t j = i + 1;
      while (j < list.size() &&
             (list[j].kind == K::recv_activation || list[j].kind == K::recv_gradient))
        ++j;
      ASSERT_LT(j, list.size());
      EXPECT_EQ(list[j].stage, list[i].stage);
      EXPECT_EQ(list[j].micro_batch, list[i].micro_batch);
      EXPECT_EQ(list[j].kind, list[i].kind == K::recv_activation ? K::forward : K::full_backward);
    }
  // A validation error names the cell the action was written in: 1B0 is action 0 once
  // 1RECV_F0 moved to 1F0, and cell 2 of the file.
  TorchCsv bad =
      parse_torch_csv("0F0,0SEND_F0,0RECV_B0,0B0\r\n1RECV_F0,1B0,1F0,1SEND_B0\r\n", "bad.csv");
  EXPECT_NE(input_error_of([&] {
              check_torch_csv(bad, "bad.csv");
            }).find("bad.csv: invalid schedule (CSV row 2, cell 2): backward before its forward"),
            std::string::npos);
  // Each receive goes to just before its own consumer.
  TorchCsv moved =
      parse_torch_csv("0F0,0SEND_F0,,0F1,0SEND_F1\r\n1RECV_F0,1RECV_F1,1F1,1F0\r\n", "m.csv");
  ASSERT_EQ(to_token(moved.schedule.ranks[1][0]), "1RECV_F1");
  EXPECT_EQ(to_token(moved.schedule.ranks[1][1]), "1F1");
  EXPECT_EQ(to_token(moved.schedule.ranks[1][2]), "1RECV_F0");
  EXPECT_EQ(torch_cell(moved, 1, 2), 0);  // 1RECV_F0 was written in cell 1
  EXPECT_EQ(torch_cell(moved, 1, 0), 1);
  EXPECT_EQ(torch_cell(moved, 0, 2), 3);  // after the empty cell
  // Written back in the moved order, with the kept cells in their places.
  EXPECT_EQ(to_torch_csv(moved.schedule, moved.dialect, &moved.kept),
            "0F0,0SEND_F0,,0F1,0SEND_F1\r\n1RECV_F1,1F1,1RECV_F0,1F0\r\n");
  // A receive after its consumer is not moved: the validator names the consumer.
  TorchCsv late = parse_torch_csv("0F0,0SEND_F0\r\n1F0,1RECV_F0\r\n", "late.csv");
  EXPECT_NE(input_error_of([&] {
              check_torch_csv(late, "late.csv");
            }).find("late.csv: invalid schedule (CSV row 2, cell 1): receive after use"),
            std::string::npos);
  // A composite's receives go before it.
  TorchCsv ov =
      parse_torch_csv("0F0\r\n1RECV_F1,1RECV_B0,1F0,(1F1;1B0)OVERLAP_F_B\r\n2F0\r\n", "o.csv");
  EXPECT_EQ(to_token(ov.schedule.ranks[1][0]), "1F0");
  EXPECT_EQ(to_token(ov.schedule.ranks[1][1]), "1RECV_F1");
  EXPECT_EQ(to_token(ov.schedule.ranks[1][2]), "1RECV_B0");
  EXPECT_TRUE(ov.schedule.ranks[1][3].overlap);
}

TEST(TorchCsv, RefusesWhatBatonCannotSay) {
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("0UNSHARD,0F0,0B0,0RESHARD\r\n", "u.csv");
            }).find("u.csv: row 1 (rank 0), cell 1: '0UNSHARD': UNSHARD/RESHARD (FSDP's"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("0F0,0X0\r\n", "x.csv");
            }).find("x.csv: row 1 (rank 0), cell 2: bad action '0X0': unknown type 'X'"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("0F0\r\n0B0\r\n", "two.csv");
            }).find("stage 0 is on rank 1 here but on rank 0"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              parse_torch_csv("(0F1;0W0)OVERLAP_F_B\r\n", "o.csv");
            }).find("expected a forward then a backward"),
            std::string::npos);
  Schedule s = lower(generate("1f1b", 2, 2));
  EXPECT_NE(input_error_of([&] { to_torch_csv(s); }).find("STEP has no PyTorch form"),
            std::string::npos);
  Schedule d = generate("dualpipe", 2, 4);
  EXPECT_NE(input_error_of([&] { to_torch_csv(d); }).find("2 directions"), std::string::npos);
}

// DualPipeV's composite on two ranks, written in baton's text form.
TEST(OverlapFB, TextJsonValidateSimulate) {
  // Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (V placement). Micro-batch 1's
  // forward on stage 0 runs beside micro-batch 0's backward on stage 3... of rank 0.
  const std::string text =
      "placement: 0 1 1 0\n"
      "0: 0F0 3F0 (0F1;3BW0) 3F1 3BW1 0BW0 0BW1\n"
      "1: 1F0 2F0 1F1 2BW0 2F1 2BW1 1BW0 1BW1\n";
  Schedule s = parse_text(text, "ov.txt");
  ASSERT_TRUE(s.ranks[0][2].overlap);
  EXPECT_EQ(s.ranks[0][3], make_action(K::full_backward, 0, 3));
  EXPECT_EQ(parse_text(to_text(s), "t"), s);
  EXPECT_NE(to_text(s).find(" (0F1;3BW0) "), std::string::npos);
  EXPECT_EQ(parse_json(to_json_text(s), "j"), s);
  ASSERT_TRUE(validate(s).ok) << validate(s).to_string();
  EXPECT_EQ(parse_torch_csv(to_torch_csv(s), "c").schedule.ranks, s.ranks);
  EXPECT_NE(to_torch_csv(s).find(",(0F1;3B0)OVERLAP_F_B,"), std::string::npos);

  // Default: the composite costs F + BW; both halves' results leave when it ends, so
  // it is no faster than the two one after the other (here: 11 against 10.5, rank 1's
  // 1F1 waiting for the composite's end).
  CostSpec unit = CostSpec::unit();
  Costs c = resolve(unit, s);
  Simulator sim(s);
  const double plain = sim.run(c).makespan;
  EXPECT_DOUBLE_EQ(sim.end_time(0, 2) - sim.start_time(0, 2), 1.5);
  Schedule flat = s;
  flat.ranks[0][2].overlap = false;
  EXPECT_DOUBLE_EQ(simulate(flat, c).makespan, 10.5);
  EXPECT_DOUBLE_EQ(plain, 11.0);
  EXPECT_DOUBLE_EQ(sim.end_time(0, 2), sim.end_time(0, 3));
  EXPECT_DOUBLE_EQ(sim.start_time(0, 2), sim.start_time(0, 3));
  // With overlap_f_b = 1.2 (against F + BW = 0.5 + 1), both halves end together, sooner.
  c.overlap_f_b.assign(4, 1.2);
  const SimResult& r = sim.run(c);
  EXPECT_DOUBLE_EQ(sim.end_time(0, 2) - sim.start_time(0, 2), 1.2);
  EXPECT_DOUBLE_EQ(sim.end_time(0, 3), sim.end_time(0, 2));
  EXPECT_LT(r.makespan, plain);
  // The composite's time counts once in the rank's busy time.
  EXPECT_NEAR(r.ranks[0].busy, 3 * 0.5 + 3 * 1.0 + 1.2, 1e-12);
  // Lowering keeps the halves adjacent (receives before, sends after).
  Schedule low = lower(s);
  ASSERT_TRUE(validate(low).ok) << validate(low).to_string();
  EXPECT_EQ(parse_text(to_text(low), "t"), low);
  EXPECT_GT(Simulator(low).run(c).makespan, 0.0);
}

TEST(OverlapFB, ValidatorChecksBothHalves) {
  auto err = [](const std::string& text) {
    return validate(parse_text(text, "v.txt")).to_string();
  };
  // The backward half needs the forward half: they cannot start together.
  EXPECT_NE(err("0: (0F0;0BW0)\n").find("composite (0F0;0BW0) at rank 0, action 0: 0BW0 needs 0F0"),
            std::string::npos);
  // A composite's second half must be a backward.
  Schedule s = parse_text("0: 0F0 0F1 0BW0 0BW1\n", "s");
  s.ranks[0][0].overlap = true;
  EXPECT_NE(validate(s).message.find("is overlapped (OVERLAP_F_B) with '0F1'"), std::string::npos);
  // Each half is checked as an action: a wrong stage in the second half.
  EXPECT_NE(err("placement: 0 1\n0: (0F0;1BW0) 0BW0\n1: 1F0\n").find("stage 1 lives on rank 1"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { parse_text("0: (0F0 0BW0)\n", "p.txt"); }).find("bad composite"),
            std::string::npos);
}
