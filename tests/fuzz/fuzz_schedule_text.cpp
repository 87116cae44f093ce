// The schedule text form (docs/schedules.md), then the validator on what parses. The
// writer is canonical: what parses must print and parse back to the same schedule.
#include <cstdlib>

#include "schedule/schedule_io.h"
#include "schedule/validate.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::schedule;
  baton::fuzz::expect_only_input_errors([&] {
    Schedule s = parse_text(baton::fuzz::as_text(data, size), "fuzz.txt");
    std::string text = to_text(s);
    if (!(parse_text(text, "printed") == s)) std::abort();  // round trip broken
    if (s.num_actions() < 4096) (void)validate(s);
  });
  return 0;
}
