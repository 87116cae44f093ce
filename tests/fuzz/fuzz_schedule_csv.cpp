// PyTorch's schedule CSV (torch_csv.h), both dialects detected, then the validator on
// what parses. What parses must write back (in the dialect read, with its idle and wait
// cells) and read back to the same schedule and the same kept cells.
#include <cstdlib>

#include "schedule/torch_csv.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::schedule;
  baton::fuzz::expect_only_input_errors([&] {
    TorchCsv csv = parse_torch_csv(baton::fuzz::as_text(data, size), "fuzz.csv");
    std::string text = to_torch_csv(csv.schedule, csv.dialect, &csv.kept);
    TorchCsv back = parse_torch_csv(text, "written", csv.dialect);
    if (!(back.schedule == csv.schedule) || back.dialect != csv.dialect)
      std::abort();  // round trip broken
    if (csv.schedule.num_actions() < 4096 && csv.schedule.num_micro_batches <= 4096)
      check_torch_csv(csv, "fuzz.csv");
  });
  return 0;
}
