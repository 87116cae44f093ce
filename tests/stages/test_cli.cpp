// `baton train` from the command line: bad input (missing or malformed files, unknown
// ops, shape mismatches, truncated or lying safetensors, bad flags) gives a clear message
// and exit code 2, never a crash; a good run trains and writes its loss log.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/command_runner.h"

namespace {

const std::string kBaton = BATON_BINARY;
const std::string kSrc = BATON_SOURCE_DIR;
const std::string kCorpus = kSrc + "/examples/data/licenses.txt";

using Result = baton::cli_testing::CommandResult;

Result run(const std::string& args) {
  return baton::cli_testing::run_command(kBaton + " train " + args);
}

std::string temp_file(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

void expect_input_error(const std::string& args, std::initializer_list<std::string> parts) {
  Result r = run(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  for (const std::string& p : parts)
    EXPECT_NE(r.output.find(p), std::string::npos) << r.output << "\n  lacks: " << p;
}

const std::string kTiny =
    R"({"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256})";

TEST(Cli, BadModelFiles) {
  expect_input_error("--model /nonexistent.json --data " + kCorpus + " --steps 1",
                     {"/nonexistent.json: cannot open file"});
  std::string bad = temp_file("bad.json", R"({"type": "gpt2", "n_layer": 2,)");
  expect_input_error("--model " + bad + " --data " + kCorpus, {bad + ": not valid JSON"});
  std::string op = temp_file("op.json", R"({"type": "graph", "inputs": [{"name": "tokens", "shape": [4], "dtype": "i32"}],
    "params": [], "layers": [{"name": "l", "nodes": [{"op": "conv", "inputs": ["tokens"], "outputs": ["y"]}]}], "loss": "y"})");
  expect_input_error("--model " + op + " --data " + kCorpus, {op + ": $.layers[0].nodes[0].op", "found \"conv\""});
  std::string shape = temp_file("shape.json", R"({"type": "gpt2", "n_layer": 1, "n_head": 3, "n_embd": 16, "n_positions": 16, "vocab_size": 256})");
  expect_input_error("--model " + shape + " --data " + kCorpus, {shape + ": $.n_embd", "multiple of n_head = 3"});
  std::string vocab = temp_file("vocab.json", R"({"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 100})");
  expect_input_error("--model " + vocab + " --data " + kCorpus, {"vocabulary of at least 256"});
}

TEST(Cli, BadDataAndFlags) {
  std::string model = temp_file("tiny.json", kTiny);
  expect_input_error("--model " + model + " --data /nonexistent.txt", {"/nonexistent.txt: cannot open file"});
  std::string small = temp_file("small.txt", "short");
  expect_input_error("--model " + model + " --data " + small, {small + ": 5 bytes of data", "at least 17"});
  expect_input_error("--model " + model + " --data " + kCorpus + " --batch 6 --micro-batches 4",
                     {"--batch 6 must be a positive multiple of --micro-batches 4"});
  expect_input_error("--model " + model + " --data " + kCorpus + " --optimizer lion", {"--optimizer", "lion"});
  expect_input_error("--model " + model + " --data " + kCorpus + " --device-memory 12XB", {"invalid size '12XB'"});
  expect_input_error("--model " + model + " --data " + kCorpus + " --recompute 7", {"--recompute: layer 7"});
  expect_input_error("--model " + model + " --data " + kCorpus + " --frobnicate", {"frobnicate"});
  expect_input_error("--model " + model + " --data " + kCorpus + " --resume", {"--resume needs --checkpoint-dir"});
}

TEST(Cli, TruncatedAndLyingSafetensors) {
  namespace fs = std::filesystem;
  std::string src = kSrc + "/tests/fixtures/gpt2_tiny";
  std::string dir = ::testing::TempDir() + "/hf_truncated";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(src + "/config.json", dir + "/config.json");
  std::string bytes;
  {
    std::ifstream in(src + "/model.safetensors", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_input_error("--init-from " + dir + " --data " + kCorpus + " --steps 1",
                     {dir + "/model.safetensors", "run past the end of the data"});
  std::string lying = bytes;
  lying[0] = char(0xff);  // header length beyond the file
  lying[1] = char(0xff);
  lying[2] = char(0x0f);
  std::ofstream(dir + "/model.safetensors", std::ios::binary | std::ios::trunc) << lying;
  expect_input_error("--init-from " + dir + " --data " + kCorpus + " --steps 1",
                     {dir + "/model.safetensors", "header length", "past the end of the file"});
}

TEST(Cli, TrainsAndWritesTheLossLog) {
  std::string model = temp_file("tiny_ok.json", kTiny);
  std::string log = ::testing::TempDir() + "/loss.jsonl";
  Result r = run("--model " + model + " --data " + kCorpus + " --steps 3 --batch 4 --micro-batches 2 "
              "--threads 1 --device-memory 256MiB --loss-log " + log);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step      3/3 | loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tok/s"), std::string::npos) << r.output;
  std::ifstream in(log);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_EQ(line.rfind("{\"step\": " + std::to_string(lines) + ", \"loss\": ", 0), 0u) << line;
  }
  EXPECT_EQ(lines, 3);
}

TEST(Cli, DeviceMemoryCapIsARuntimeFailure) {
  std::string model = temp_file("tiny_cap.json", kTiny);
  Result r = run("--model " + model + " --data " + kCorpus + " --steps 1 --device-memory 64KiB");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("out of memory on cpu"), std::string::npos) << r.output;
}

}  // namespace
