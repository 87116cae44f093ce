// The model JSON loader: shapes inferred for both forms, and every kind of bad input is
// an InputError that names the file, the JSON path, what was expected and what was found.
#include <gtest/gtest.h>

#include <fstream>

#include "stages/json_reader.h"
#include "stages/model.h"

namespace baton::stages {
namespace {

using nlohmann::json;

// Loads `text` as a model and returns the InputError's message ("" when it loads).
std::string model_error_of(const std::string& text) {
  try {
    load_model_json(memory::parse_json_text(text, "m.json"), "m.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void model_json_expect_error(const std::string& text, std::initializer_list<std::string> parts) {
  std::string msg = model_error_of(text);
  ASSERT_FALSE(msg.empty()) << "loaded: " << text;
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << msg << "\n  lacks: " << p;
}

// A valid general graph with placeholders for one node's fields.
std::string graph_with(const std::string& node, const std::string& params = "") {
  return R"({"type": "graph", "inputs": [{"name": "x", "shape": [3, 4], "dtype": "f32"},
                                         {"name": "y", "shape": [3], "dtype": "i32"}],
            "params": [{"name": "w", "shape": [5, 4], "init": {"type": "normal", "std": 0.1}})" +
         params + R"(],
            "layers": [{"name": "l", "nodes": [)" +
         node + R"(,
              {"op": "cross_entropy", "inputs": ["h", "y"], "outputs": ["loss"]}]}],
            "loss": "loss"})";
}

TEST(ModelJson, Gpt2ShorthandShapes) {
  Graph g = load_model_json(json{{"type", "gpt2"},
                                 {"n_layer", 3},
                                 {"n_head", 4},
                                 {"n_embd", 64},
                                 {"n_positions", 128},
                                 {"vocab_size", 256},
                                 {"context", 32}},
                            "gpt.json");
  EXPECT_EQ(g.num_layers(), 5);  // embed, 3 blocks, head
  EXPECT_EQ(g.layers[0].name, "embed");
  EXPECT_EQ(g.layers[4].name, "head");
  EXPECT_EQ(g.value("h.0.attn.c_attn").type.shape, (memory::Shape{32, 192}));
  EXPECT_EQ(g.value("lm_head").type.shape, (memory::Shape{32, 256}));
  EXPECT_FALSE(g.values[size_t(g.loss)].type.batched);
  const Param& w = g.params[size_t(g.find_param("h.1.attn.c_attn.weight"))];
  EXPECT_EQ(w.shape, (memory::Shape{64, 192}));  // Conv1D layout [in, out]
  EXPECT_EQ(g.params[size_t(g.find_param("wpe.weight"))].shape, (memory::Shape{128, 64}));
  // GPT-2 parameter count: 12 L C^2 + 13 L C + V C + P C + 2 C.
  int64_t L = 3, C = 64;
  EXPECT_EQ(g.num_parameters(), 12 * L * C * C + 13 * L * C + 256 * C + 128 * C + 2 * C);
  // A buffer (batch norm's running statistics) is state, not a parameter, as PyTorch counts.
  Graph b = g;
  b.params[size_t(b.find_param("wpe.weight"))].trainable = false;
  EXPECT_EQ(b.num_parameters(), g.num_parameters() - 128 * C);
  EXPECT_FALSE(g.params[size_t(g.find_param("h.0.ln_1.weight"))].weight_decay);
  EXPECT_TRUE(w.weight_decay);
}

TEST(ModelJson, HfConfigLoadsAsGpt2) {
  Graph g = load_model_json(json{{"model_type", "gpt2"},
                                 {"n_layer", 1},
                                 {"n_head", 2},
                                 {"n_embd", 8},
                                 {"n_positions", 16},
                                 {"vocab_size", 10},
                                 {"bos_token_id", 0},
                                 {"transformers_version", "5"}},
                            "config.json");
  EXPECT_EQ(g.value("tokens").type.shape, (memory::Shape{16}));
}

TEST(ModelJson, ExampleModelsLoad) {
  for (const char* name : {"tiny-gpt", "gpt-config-a", "gpt-config-b", "mlp"}) {
    std::string path = std::string(BATON_SOURCE_DIR) + "/examples/models/" + name + ".json";
    EXPECT_NO_THROW(load_model(path)) << path;
  }
}

// A source that is a place inside a file (a model in a plan or a manifest) continues its
// JSON path; a file, or a source with words after its path, is followed by the path.
TEST(ModelJson, WhereContinuesAnEmbeddedSourcesPath) {
  EXPECT_EQ(json_where("plan.json", "$.n_head"), "plan.json: $.n_head");
  EXPECT_EQ(json_where("plan.json: $.model", "$.n_head"), "plan.json: $.model.n_head");
  EXPECT_EQ(json_where("ck/manifest.json: $.model", "$"), "ck/manifest.json: $.model");
  EXPECT_EQ(json_where("plan.json: $.model", "$.layers[2]"), "plan.json: $.model.layers[2]");
  EXPECT_EQ(json_where("plan.json: $.model (expanded gpt2 shorthand)", "$.nodes[0]"),
            "plan.json: $.model (expanded gpt2 shorthand): $.nodes[0]");
  try {
    load_model_json(json::parse(R"({"type": "gpt2", "n_layer": 0})"), "p.json: $.model");
    ADD_FAILURE() << "n_layer 0 loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("p.json: $.model.n_layer: ", 0), 0u) << e.what();
  }
}

TEST(ModelJson, MalformedJson) {
  model_json_expect_error(R"({"type": "gpt2", "n_layer": )", {"m.json", "not valid JSON"});
}

// nlohmann reports a number beyond double's range as out_of_range, not parse_error (found
// by fuzz_costs): still bad input, exit code 2.
TEST(ModelJson, NumberBeyondDoubleIsAnInputError) {
  model_json_expect_error(R"({"type": "gpt2", "n_layer": 1.14e406})",
                          {"m.json", "not valid JSON", "number overflow"});
}

TEST(ModelJson, MissingFile) {
  try {
    load_model("/nonexistent/model.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.json: cannot open"),
              std::string::npos);
  }
}

TEST(ModelJson, ShorthandErrors) {
  std::string base = R"("n_head": 4, "n_embd": 64, "n_positions": 32, "vocab_size": 256)";
  model_json_expect_error(R"({"type": "gpt2", "n_layers": 2, )" + base + "}",
                          {"m.json: $.n_layers", "unknown field 'n_layers'"});
  model_json_expect_error(R"({"type": "gpt2", "n_layer": "two", )" + base + "}",
                          {"$.n_layer", "expected an integer", "found \"two\""});
  model_json_expect_error(R"({"type": "gpt2", "n_layer": 0, )" + base + "}",
                          {"$.n_layer", "expected an integer in [1, ", "found 0"});
  model_json_expect_error(
      R"({"type": "gpt2", "n_layer": 2, "n_head": 5, "n_embd": 64, "n_positions": 32, "vocab_size": 256})",
      {"$.n_embd", "expected a multiple of n_head = 5", "found 64"});
  model_json_expect_error(R"({"type": "gpt2", "n_layer": 2, "context": 64, )" + base + "}",
                          {"$.context", "at most n_positions = 32"});
  model_json_expect_error(
      R"({"type": "gpt2", "n_layer": 2, "activation_function": "relu", )" + base + "}",
      {"$.activation_function", "gelu_new"});
  model_json_expect_error(
      R"({"type": "gpt3"})",
      {"$.type", "\"graph\", \"gpt2\", \"llama\", \"mlp\" or \"resnet\"", "found \"gpt3\""});
  model_json_expect_error(R"([1, 2])", {"m.json: $: expected an object"});
  model_json_expect_error(
      R"({"type": "mlp", "context": 4, "vocab_size": 10, "n_embd": 4, "hidden": [8, -1]})",
      {"$.hidden[1]", "expected an integer in [1, ", "found -1"});
  // n_inner null is the default, as a Hugging Face config.json writes it.
  EXPECT_EQ(model_error_of(R"({"type": "gpt2", "n_layer": 1, "n_inner": null, )" + base + "}"), "");
}

// A graph's inputs are i32, i64, f32 or f64, as the message says (f16 had been taken).
TEST(ModelJson, InputDtypesAreTheFourTheMessageNames) {
  const std::string ok = graph_with(
      R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})");
  for (const char* bad : {"f16", "bf16", "u8"}) {
    std::string text = ok;
    const std::string f32 = R"("dtype": "f32")";
    text.replace(text.find(f32), f32.size(), std::string(R"("dtype": ")") + bad + "\"");
    model_json_expect_error(text, {"$.inputs[0].dtype", "expected one of i32, i64, f32, f64",
                                   std::string("found '") + bad + "'"});
  }
}

TEST(ModelJson, GeneralGraphLoads) {
  std::string ok = graph_with(
      R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})");
  ASSERT_EQ(model_error_of(ok), "");
  Graph g = load_model_json(memory::parse_json_text(ok, "m.json"), "m.json");
  EXPECT_EQ(g.value("h").type.shape, (memory::Shape{3, 5}));
}

TEST(ModelJson, UnknownOp) {
  model_json_expect_error(
      graph_with(R"({"op": "convolution", "inputs": ["x"], "outputs": ["h"]})"),
      {"$.layers[0].nodes[0].op", "expected a known op (", "linear", "found \"convolution\""});
}

TEST(ModelJson, ShapeMismatch) {
  // w is [5, 4]: torch layout [out, in] takes x [..., 4]; in_out layout wants x [..., 5].
  model_json_expect_error(
      graph_with(R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"},
                              "attrs": {"layout": "in_out"}})"),
      {"$.layers[0].nodes[0].inputs[0]", "input size 5", "found f32[batch, 3, 4]"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w", "bias": "b"}})",
          R"(, {"name": "b", "shape": [4], "init": {"type": "zeros"}})"),
      {"$.layers[0].nodes[0].params.bias", "expected a parameter of shape [5]",
       "found one of shape [4]"});
  model_json_expect_error(
      graph_with(R"({"op": "add", "inputs": ["x", "y"], "outputs": ["h"]})"),
      {"$.layers[0].nodes[0].inputs[1]", "f32[batch, 3, 4]", "found i32[batch, 3]"});
}

TEST(ModelJson, InconsistentGraphs) {
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["z"], "outputs": ["h"], "params": {"weight": "w"}})"),
      {"$.layers[0].nodes[0].inputs[0]", "found 'z'"});
  model_json_expect_error(graph_with(R"({"op": "linear", "inputs": ["x"], "outputs": ["h"]})"),
                          {"$.layers[0].nodes[0]", "needs parameter slot 'weight'"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "nope"}})"),
      {"$.layers[0].nodes[0].params.weight", "found 'nope'"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w", "scale": "w"}})"),
      {"$.layers[0].nodes[0].params.scale", "unknown parameter slot 'scale'"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["x"], "params": {"weight": "w"}})"),
      {"$.layers[0].nodes[0].outputs[0]", "expected a new value name"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x", "x"], "outputs": ["h"], "params": {"weight": "w"}})"),
      {"$.layers[0].nodes[0].inputs", "expected 1 input(s) for op linear", "found 2"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}, "attrs": {"layot": "in_out"}})"),
      {"$.layers[0].nodes[0].attrs.layot", "unknown attribute 'layot'", "allowed: layout"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}, "colour": 1})"),
      {"$.layers[0].nodes[0].colour", "unknown field"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})",
          R"(, {"name": "unused", "shape": [2], "init": {"type": "zeros"}})"),
      {"$.params[1]", "'unused' is not used by any node"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})",
          R"(, {"name": "w", "shape": [2], "init": {"type": "zeros"}})"),
      {"$.params[1].name", "found 'w' again"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})",
          R"(, {"name": "v", "shape": [2, 0], "init": {"type": "zeros"}})"),
      {"$.params[1].shape[1]", "expected a positive dimension"});
  model_json_expect_error(
      graph_with(
          R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})",
          R"(, {"name": "v", "shape": [2], "init": {"type": "xavier"}})"),
      {"$.params[1].init.type", "\"normal\", \"zeros\", \"ones\" or \"constant\""});
  // The loss must be a scalar.
  std::string bad_loss = graph_with(
      R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})");
  bad_loss.replace(bad_loss.find(R"("loss": "loss")"), 14, R"("loss": "h")");
  model_json_expect_error(bad_loss, {"$.loss", "expected a scalar loss", "f32[batch, 3, 5]"});
}

// A cross_entropy's backward starts from gradient 1 whatever reads its output: a second one
// (a dead branch's) would add its gradient to the loss's.
TEST(ModelJson, TheLossIsTheOneCrossEntropy) {
  const std::string linear =
      R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})";
  model_json_expect_error(
      graph_with(linear +
                 R"(, {"op": "cross_entropy", "inputs": ["h", "y"], "outputs": ["dead"]})"),
      {"m.json: $.layers[0].nodes[1].outputs[0]", "expected the loss 'loss'", "one cross_entropy",
       "found 'dead'"});
}

// The loss's layer is the last: a layer after it reaches nothing the loss depends on, and
// a plan cutting after the loss's layer had logged a loss of 0.
TEST(ModelJson, TheLossIsInTheLastLayer) {
  std::string after = graph_with(
      R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})");
  const std::string end = R"(]}],)";
  const size_t at = after.find(end);
  ASSERT_NE(at, std::string::npos);
  after.insert(at + 2, R"(, {"name": "dead", "nodes": [{"op": "relu", "inputs": ["h"],
                                                        "outputs": ["r"]}]})");
  model_json_expect_error(after, {"m.json: $.layers[1].name", "layer 'dead' comes after layer 'l'",
                                  "which computes the loss 'loss'"});
}

// A loss that depends on no trainable parameter trains nothing: baton train refuses it (a
// loss reading the raw input had left every layer dead without a word); it still loads.
TEST(ModelJson, ALossThatDependsOnNoParameterIsRefused) {
  std::string dead = graph_with(
      R"({"op": "linear", "inputs": ["x"], "outputs": ["z"], "params": {"weight": "w"}},
         {"op": "relu", "inputs": ["x"], "outputs": ["h"]})");
  const Graph g = load_model_json(json::parse(dead), "m.json");  // loads: nothing to train
  try {
    check_loss_trains(g, "m.json");
    FAIL() << "a loss without trainable parameters";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "m.json: $.loss: the loss 'loss' depends on no trainable parameter (no node on its "
              "way uses one): training would change nothing");
  }
  EXPECT_NO_THROW(check_loss_trains(load_model_json(json::parse(graph_with(
                                                        R"({"op": "linear", "inputs": ["x"],
                                                            "outputs": ["h"],
                                                            "params": {"weight": "w"}})")),
                                                    "m.json"),
                                    "m.json"));
}

// A parameter or input whose elements overflow (or near) int64 had been taken (an embedding
// [2^61, 6]: a negative parameter count, then heap corruption).
TEST(ModelJson, ShapesBeyond2To40ElementsAreRefused) {
  const std::string linear =
      R"({"op": "linear", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"}})";
  model_json_expect_error(
      graph_with(linear, R"(, {"name": "e", "shape": [2305843009213693952, 6],
                                "init": {"type": "zeros"}})"),
      {"m.json: $.params[1].shape", "expected a shape of at most 2^40 (1099511627776) elements",
       "found [2305843009213693952, 6]"});
  model_json_expect_error(graph_with(linear, R"(, {"name": "e", "shape": [1048576, 1048577],
                                "init": {"type": "zeros"}})"),
                          {"m.json: $.params[1].shape", "found [1048576, 1048577]"});
  std::string big_input = graph_with(linear);
  big_input.replace(big_input.find(R"("shape": [3, 4])"), 15,
                    R"("shape": [3, 4611686018427387904])");
  model_json_expect_error(big_input, {"m.json: $.inputs[0].shape", "at most 2^40"});
  // 2^40 itself is a shape (its memory is the allocator's business).
  EXPECT_EQ(model_error_of(graph_with(linear, R"(, {"name": "e", "shape": [1048576, 1048576],
                                                    "init": {"type": "zeros"}})")),
            "m.json: $.params[1]: parameter 'e' is not used by any node");
}

// A reshape's product had overflowed: [2^62, 2^62, -1] divided by zero, [4, 2^62 + 12]
// wrapped to 48 and loaded.
TEST(ModelJson, ReshapeProductOverflowIsRefused) {
  for (const char* shape : {"[4611686018427387904, 4611686018427387904, -1]",
                            "[4, 4611686018427387916]", "[-1, 9223372036854775807]"}) {
    SCOPED_TRACE(shape);
    model_json_expect_error(
        graph_with(
            R"({"op": "linear", "inputs": ["x"], "outputs": ["h0"], "params": {"weight": "w"}},
                      {"op": "reshape", "inputs": ["h0"], "outputs": ["h"], "attrs": {"shape": )" +
            std::string(shape) + "}}"),
        {"m.json: $.layers[0].nodes[1].attrs.shape",
         "expected a shape of 15 elements (the input is f32[batch, 3, 5])"});
  }
}

// The partitioner's communication ops and a spatial tile's attributes need a stage's
// communicators, which a model does not have: they had failed at run time (exit 1).
TEST(ModelJson, PhysicalGraphOpsAreRefused) {
  for (const char* op : {"tp_copy", "tp_reduce", "spatial_mean"})
    model_json_expect_error(
        graph_with(std::string(R"({"op": ")") + op + R"(", "inputs": ["x"], "outputs": ["h0"]},
          {"op": "linear", "inputs": ["h0"], "outputs": ["h"], "params": {"weight": "w"}})"),
        {"m.json: $.layers[0].nodes[0].op", "a communication op the partitioner puts in"});
  model_json_expect_error(
      graph_with(
          R"({"op": "conv2d", "inputs": ["x"], "outputs": ["h"], "params": {"weight": "w"},
              "attrs": {"halo": [1, 1]}})"),
      {"m.json: $.layers[0].nodes[0].attrs.halo", "set by the spatial split"});
  model_json_expect_error(
      graph_with(
          R"({"op": "batchnorm2d", "inputs": ["x"], "outputs": ["h"],
              "params": {"weight": "w", "bias": "w"}, "attrs": {"spatial": true}})"),
      {"m.json: $.layers[0].nodes[0].attrs.spatial", "set by the spatial split"});
  // Nor does an unknown op's message offer them.
  EXPECT_EQ(
      model_error_of(graph_with(R"({"op": "convolution", "inputs": ["x"], "outputs": ["h"]})"))
          .find("tp_copy"),
      std::string::npos);
}

TEST(ModelJson, AttentionHeadsMustDivide) {
  std::string text = R"({"type": "graph", "inputs": [{"name": "x", "shape": [4, 9], "dtype": "f32"},
      {"name": "y", "shape": [4], "dtype": "i32"}], "params": [],
      "layers": [{"name": "l", "nodes": [
        {"op": "attention", "inputs": ["x"], "outputs": ["h"], "attrs": {"n_head": 2}},
        {"op": "cross_entropy", "inputs": ["h", "y"], "outputs": ["loss"]}]}], "loss": "loss"})";
  model_json_expect_error(text, {"$.layers[0].nodes[0].inputs[0]", "(n_head + 2 * n_kv_head) * D",
                                 "n_head = 2", "f32[batch, 4, 9]"});
}

}  // namespace
}  // namespace baton::stages
