// The schedule JSON form (docs/schedules.md), then the validator on what parses; JSON
// and text round trips must give the same schedule back.
#include <cstdlib>

#include "schedule/schedule_io.h"
#include "schedule/validate.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::schedule;
  baton::fuzz::expect_only_input_errors([&] {
    Schedule s = parse_json(baton::fuzz::as_text(data, size), "fuzz.json");
    if (!(parse_json(to_json_text(s), "printed") == s)) std::abort();
    if (s.num_actions() < 4096) (void)validate(s);
  });
  return 0;
}
