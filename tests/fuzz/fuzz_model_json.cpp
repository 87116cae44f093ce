// Model JSON (docs/formats/model.md): the general graph form and the gpt2 / mlp
// shorthands, expanded and loaded into a graph.
#include "stages/json_reader.h"
#include "stages/model.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::fuzz::expect_only_input_errors([&] {
    nlohmann::json j =
        baton::memory::parse_json_text(std::string(baton::fuzz::as_text(data, size)), "fuzz.json");
    baton::stages::Graph g = baton::stages::load_model_json(j, "fuzz.json");
    (void)g.num_parameters();
  });
  return 0;
}
