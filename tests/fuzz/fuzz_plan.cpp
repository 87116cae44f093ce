// Plan JSON (docs/formats/plan.md), as `baton train --plan` and `baton plan` read it: the
// form of every field, and, for a plan with its model embedded, the checks against the
// model (resolve_plan: stages, splits, tensor-parallel degrees, schedule).
#include "partitioner/evaluate.h"
#include "partitioner/plan.h"
#include "stages/json_reader.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::partitioner;
  baton::fuzz::expect_only_input_errors([&] {
    nlohmann::json j =
        baton::memory::parse_json_text(std::string(baton::fuzz::as_text(data, size)), "plan.json");
    Plan p = parse_plan(j, "plan.json", "/nonexistent-fuzz-dir");
    (void)plan_to_json(p);
    if (p.model_json.is_null()) return;
    auto graph = load_plan_model(p);
    if (graph->num_layers() > 64) return;  // keep each input fast
    (void)resolve_plan(p, graph);
  });
  return 0;
}
