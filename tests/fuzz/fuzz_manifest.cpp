// Checkpoint manifests (docs/formats/checkpoint.md), as --resume reads them.
#include "stages/checkpoint.h"
#include "stages/json_reader.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::stages;
  baton::fuzz::expect_only_input_errors([&] {
    nlohmann::json j = baton::memory::parse_json_text(std::string(baton::fuzz::as_text(data, size)),
                                                      "manifest.json");
    Manifest m = Manifest::from_json(j, "manifest.json");
    // What is written back must read back the same.
    Manifest again = Manifest::from_json(m.to_json(), "written");
    if (again.to_json() != m.to_json()) std::abort();
  });
  return 0;
}
