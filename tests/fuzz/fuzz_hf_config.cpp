// A Hugging Face GPT-2 config.json (--init-from DIR), read as the model.
#include "stages/json_reader.h"
#include "stages/model.h"
#include "stages/shorthands.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::stages;
  baton::fuzz::expect_only_input_errors([&] {
    nlohmann::json j = baton::memory::parse_json_text(std::string(baton::fuzz::as_text(data, size)),
                                                      "config.json");
    Gpt2Config c = parse_hf_gpt2_config(JsonReader(j, "config.json"));
    (void)gpt2_graph_json(c);
    // What --init-from does with it: the config is the model.
    Graph g = load_model_json(j, "config.json");
    (void)g.num_parameters();
  });
  return 0;
}
