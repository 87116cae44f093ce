// Cost files: the simulator's cost JSON (schedule/costs.h, `baton simulate --costs`) and
// the measured op times `baton profile` writes (`baton plan --costs`). The first byte
// picks the parser.
#include "partitioner/cost_model.h"
#include "schedule/costs.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  baton::fuzz::expect_only_input_errors([&] {
    if (data[0] & 1) {
      baton::schedule::CostSpec c =
          baton::schedule::parse_costs(baton::fuzz::as_text(data + 1, size - 1), "costs.json");
      for (int ranks : {1, 2, 4})
        baton::fuzz::expect_only_input_errors(
            [&] { (void)baton::schedule::resolve(c, ranks, ranks, 1); });
    } else {
      baton::fuzz::MemFile f(data + 1, size - 1);
      (void)baton::partitioner::read_measured_costs(f.path());
    }
  });
  return 0;
}
