// `baton train` from the command line: bad input (missing or malformed files, unknown
// ops, shape mismatches, truncated or lying safetensors, bad flags) gives a clear message
// and exit code 2, never a crash; a good run trains and writes its loss log.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "memory/cuda_device.h"
#include "tests/command_runner.h"

namespace {

const std::string kCliBaton = BATON_BINARY;
const std::string kSrc = BATON_SOURCE_DIR;
const std::string kCliCorpus = kSrc + "/examples/data/licenses.txt";

using Result = baton::cli_testing::CommandResult;

Result cli_run(const std::string& args) {
  return baton::cli_testing::run_command(kCliBaton + " train " + args);
}

std::string temp_file(const std::string& name, const std::string& content) {
  // Per process: /tmp is shared with other runs of the suite.
  std::string path = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

void cli_expect_input_error(const std::string& args, std::initializer_list<std::string> parts) {
  Result r = cli_run(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  for (const std::string& p : parts)
    EXPECT_NE(r.output.find(p), std::string::npos) << r.output << "\n  lacks: " << p;
}

const std::string kTiny =
    R"({"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256})";

// Output that cannot be written to standard output (a full disk: /dev/full) fails the
// command, exit 1 naming it, as coreutils do; it had exited 0 with the output lost.
TEST(Cli, AFailedWriteToStandardOutputIsAFailure) {
  for (const std::string& args :
       {std::string("version"), std::string("--help"), std::string("simulate -s 1f1b -p 2 -m 2")}) {
    Result r = baton::cli_testing::run_command("{ " + kCliBaton + " " + args + " > /dev/full; }");
    EXPECT_EQ(r.code, 1) << args << "\n" << r.output;
    // The device's own reason, asked again where stdio kept none (a write that failed
    // before the final flush leaves the error flag but not its errno: "write error").
    EXPECT_NE(r.output.find("failed: writing standard output: No space left on device"),
              std::string::npos)
        << args << "\n"
        << r.output;
  }
  EXPECT_EQ(baton::cli_testing::run_command(kCliBaton + " version > /dev/null").code, 0);
  // A pipe whose reader has gone, with SIGPIPE ignored (as under nohup or a supervisor):
  // the reason is said even where stdio kept no errno; it had been "write error".
  Result r = baton::cli_testing::run_command(
      "bash -c 'trap \"\" PIPE; { sleep 0.3; " + kCliBaton +
      " simulate -s all -p 8 -m 64; echo \"exit $?\" >&2; } | true'");
  EXPECT_NE(r.output.find("exit 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed: writing standard output: Broken pipe"), std::string::npos)
      << r.output;
}

// A symbolic-link loop given as a checkpoint or a Hugging Face directory is bad input
// naming it (exit 2); it had been "filesystem error: status: Too many levels of symbolic
// links", exit 1.
TEST(Cli, ASymbolicLinkLoopIsBadInput) {
  const std::string a = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-loopA";
  const std::string b = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-loopB";
  std::filesystem::remove(a);
  std::filesystem::remove(b);
  std::filesystem::create_symlink(b, a);
  std::filesystem::create_symlink(a, b);
  for (const std::string& args :
       {" export --checkpoint " + a + " --out " + a + "-out",
        " train --init-from " + a + " --data " + kCliCorpus + " --steps 1",
        " train --resume --checkpoint-dir " + a + " --data " + kCliCorpus + " --steps 1"}) {
    Result r = baton::cli_testing::run_command(kCliBaton + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(a), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Too many levels of symbolic links"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("filesystem error"), std::string::npos) << r.output;
  }
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// A run refused for its model or its data leaves no --checkpoint-dir behind (it had been
// made, empty, before the model was read).
TEST(Cli, ARefusedRunMakesNoCheckpointDirectory) {
  const std::string ckpt = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-new_ckpt";
  std::string bad_model = temp_file("bad_model.json", R"({"type": "gpt2"})");
  cli_expect_input_error(
      "--model " + bad_model + " --data " + kCliCorpus + " --steps 1 --checkpoint-dir " + ckpt,
      {bad_model});
  std::string model = temp_file("ckpt_model.json", kTiny);
  cli_expect_input_error("--model " + model + " --data " + ckpt + "-no-such-data" +
                             " --steps 1 --checkpoint-dir " + ckpt,
                         {ckpt + "-no-such-data"});
  EXPECT_FALSE(std::filesystem::exists(ckpt)) << "made for a refused run";
}

// An image model given no image directory: the path and what it lacks, not the token
// loader's complaint about the model's inputs.
// A plan naming its model by file: the model's fields are named in that file ("tg.json:
// $.inputs"); they had been placed at the plan's $.model, which holds the file's name.
TEST(Cli, APlansModelFileIsNamedInItsMessages) {
  const std::string dir = ::testing::TempDir() + "/plan-model-file";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(BATON_SOURCE_DIR) + "/examples/models/tiny-gpt.json",
                             dir + "/tg.json", std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/p1.json")
      << R"({"version": 1, "model": "tg.json", "devices": 1, "batch": {"micro_batch_size": 2},
             "schedule": {"name": "1f1b", "micro_batches": 1}})";
  cli_expect_input_error("--plan " + dir + "/p1.json --data " + std::string(BATON_SOURCE_DIR) +
                             "/examples/data/digits --steps 1",
                         {"plan-model-file/tg.json: $.inputs: expected exactly the inputs "
                          "'images' and 'labels'"});
}

TEST(Cli, AnImageModelNamesTheMissingImageDirectory) {
  const std::string model = std::string(BATON_SOURCE_DIR) + "/examples/models/resnet-tiny.json";
  const std::string missing = ::testing::TempDir() + "/no-such-images";
  cli_expect_input_error("--model " + model + " --data " + missing + " --steps 1",
                         {missing + ": the model reads images", "images.npy and labels.npy",
                          "found no such file or directory"});
  cli_expect_input_error("--model " + model + " --data " + ::testing::TempDir() + " --steps 1",
                         {"found a directory without images.npy"});
  // A weighted image directory exists: the message names the blend, not a missing path.
  const std::string digits = std::string(BATON_SOURCE_DIR) + "/examples/data/digits";
  cli_expect_input_error(
      "--model " + model + " --data 1:" + digits + " --steps 1",
      {"--data: '1:" + digits + "': weights and blends (WEIGHT:PATH) are for token data"});
  cli_expect_input_error(
      "--model " + model + " --data 0.5:" + digits + " 0.5:" + digits + " --steps 1",
      {"weights and blends (WEIGHT:PATH) are for token data"});
  // --eval-batches on image data, 1 (its default) too: evaluation is for token data, said
  // before the advice to add held-out data, which image data refuses.
  const std::string images = "--model " + model + " --data " + digits + " --steps 1 ";
  for (const char* count : {"2", "1"})
    cli_expect_input_error(images + "--eval-batches " + count,
                           {"--eval-batches: evaluation is for token data"});
  cli_expect_input_error(images + "--eval-batches 2 --eval-data " + digits,
                         {digits + ": an image directory",
                          "--eval-data and --eval-fraction are "
                          "for token data"});
}

TEST(Cli, BadModelFiles) {
  cli_expect_input_error("--model /nonexistent.json --data " + kCliCorpus + " --steps 1",
                         {"/nonexistent.json: cannot open file"});
  std::string bad = temp_file("bad.json", R"({"type": "gpt2", "n_layer": 2,)");
  cli_expect_input_error("--model " + bad + " --data " + kCliCorpus, {bad + ": not valid JSON"});
  std::string op = temp_file(
      "op.json", R"({"type": "graph", "inputs": [{"name": "tokens", "shape": [4], "dtype": "i32"}],
    "params": [], "layers": [{"name": "l", "nodes": [{"op": "conv", "inputs": ["tokens"], "outputs": ["y"]}]}], "loss": "y"})");
  cli_expect_input_error("--model " + op + " --data " + kCliCorpus,
                         {op + ": $.layers[0].nodes[0].op", "found \"conv\""});
  std::string shape = temp_file(
      "shape.json",
      R"({"type": "gpt2", "n_layer": 1, "n_head": 3, "n_embd": 16, "n_positions": 16, "vocab_size": 256})");
  cli_expect_input_error("--model " + shape + " --data " + kCliCorpus,
                         {shape + ": $.n_embd", "multiple of n_head = 3"});
  std::string vocab = temp_file(
      "vocab.json",
      R"({"type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 100})");
  cli_expect_input_error("--model " + vocab + " --data " + kCliCorpus,
                         {"vocabulary of at least 256"});
}

TEST(Cli, BadDataAndFlags) {
  std::string model = temp_file("tiny.json", kTiny);
  // A flag's prefix is no flag (Boost had taken --seq 3 as --seed 3).
  cli_expect_input_error("--model " + model + " --data " + kCliCorpus + " --steps 1 --seq 3",
                         {"unrecognised option '--seq'"});
  cli_expect_input_error("--model " + model + " --data /nonexistent.txt",
                         {"/nonexistent.txt: cannot open file"});
  std::string small = temp_file("small.txt", "short");
  cli_expect_input_error("--model " + model + " --data " + small,
                         {small + ": 5 bytes of data", "at least 17"});
  cli_expect_input_error(
      "--model " + model + " --data " + kCliCorpus + " --batch 6 --micro-batches 4",
      {"--batch 6 must be a positive multiple of --micro-batches 4"});
  // An output naming an input: --loss-log over the training data had replaced it, exit 0.
  {
    const std::string data = temp_file("own-data.txt", std::string(4096, 'a'));
    cli_expect_input_error("--model " + model + " --data " + data + " --loss-log " + data,
                           {"--loss-log " + data + " is the same file as --data " + data +
                            ": writing it would replace that input"});
    // The model under --summary, and both outputs to a redirected /dev/stdout: that is
    // written in place, one after the other (it had been refused as one file).
    const std::string own_model = temp_file("own-model.json", kTiny);
    cli_expect_input_error(
        "--model " + own_model + " --data " + kCliCorpus + " --summary " + own_model,
        {"--summary " + own_model + " is the same file as --model"});
    const Result both = baton::cli_testing::run_command(
        kCliBaton + " train --model " + model + " --data " + kCliCorpus +
        " --steps 2 --batch 2 --loss-log /dev/stdout --summary /dev/stdout > " +
        temp_file("stdout.txt", "") + " 2>&1; echo rc=$?");
    EXPECT_NE(both.output.find("rc=0"), std::string::npos) << both.output;
    const std::string log = temp_file("log-and-summary.json", "");
    cli_expect_input_error(
        "--model " + model + " --data " + kCliCorpus + " --summary " + log + " --loss-log " + log,
        {"--summary " + log + " is the same file as --loss-log " + log});
  }
  // A name past the file system's limit, before the work (it had failed at its rename after
  // every step).
  cli_expect_input_error(
      "--model " + model + " --data " + kCliCorpus + " --summary " + std::string(256, 's'),
      {"is 256 bytes, over the file system's limit of 255"});
  cli_expect_input_error("--model " + model + " --data " + kCliCorpus +
                             " --batch 144115188075855872 --micro-batches 2",
                         {"makes micro-batches of 72057594037927936 samples: expected at most "
                          "16777216"});
  cli_expect_input_error("--model " + model + " --data " + kCliCorpus + " --optimizer lion",
                         {"--optimizer", "lion"});
  cli_expect_input_error("--model " + model + " --data " + kCliCorpus + " --device-memory 12XB",
                         {"invalid size '12XB'"});
  cli_expect_input_error("--model " + model + " --data " + kCliCorpus + " --recompute 7",
                         {"--recompute: layer 7"});
  // A stray comma or space had been skipped: "1,,2", "1," and " 1" read as 1,2 / 1 / 1.
  for (const auto& [flag, message] :
       {std::pair<std::string, std::string>{"1,,2", "--recompute '1,,2': an empty item"},
        {"1,", "--recompute '1,': an empty item"},
        {"' 1'", "--recompute: expected layer indices like 1,2,3, found ' 1'"},
        {"''", "--recompute: expected layer indices like 1,2,3, found ''"}})
    cli_expect_input_error("--model " + model + " --data " + kCliCorpus + " --recompute " + flag,
                           {message});
  cli_expect_input_error("--model " + model + " --data " + kCliCorpus + " --frobnicate",
                         {"frobnicate"});
  cli_expect_input_error("--model " + model + " --data " + kCliCorpus + " --resume",
                         {"--resume needs --checkpoint-dir"});
  const Result sgemm = baton::cli_testing::run_command(
      "BATON_SGEMM=mkl " + kCliBaton + " train --model " + model + " --data " + kCliCorpus);
  EXPECT_EQ(sgemm.code, 2) << sgemm.output;
  EXPECT_NE(sgemm.output.find(R"(BATON_SGEMM: expected "openblas" or "onednn", found "mkl")"),
            std::string::npos)
      << sgemm.output;  // A bad GPU attention choice is read where attention runs on a GPU: a CPU
                        // run and
  // `baton version` go on (it had aborted every process as the library loaded, exit 134).
  const Result attention =
      baton::cli_testing::run_command("BATON_CUDA_ATTENTION=bogus " + kCliBaton + " version");
  EXPECT_EQ(attention.code, 0) << attention.output;
}

// The token dataset flags, the learning-rate schedule and evaluation: each bad value is
// exit 2 naming the flag (or the file and the first offending token).
TEST(Cli, BadScheduleEvaluationAndTokenDataFlags) {
  std::string model = temp_file("tiny_flags.json", kTiny);
  const std::string base = "--model " + model + " --data " + kCliCorpus + " --steps 10 ";
  cli_expect_input_error(base + "--lr-schedule step",
                         {"--lr-schedule: expected constant, cosine, linear or wsd", "'step'"});
  cli_expect_input_error(base + "--lr-schedule cosine --warmup-steps -1",
                         {"--warmup-steps: expected >= 0"});
  cli_expect_input_error(base + "--lr-schedule linear --decay-steps -2",
                         {"--decay-steps: expected >= 0"});
  cli_expect_input_error(base + "--lr-schedule cosine --lr 1e-3 --min-lr 0.01",
                         {"--min-lr: expected a rate in [0, --lr]"});
  cli_expect_input_error(base + "--lr-schedule wsd --decay-fraction 1.5",
                         {"--decay-fraction: expected a fraction in (0, 1]"});
  cli_expect_input_error(base + "--lr-schedule wsd --warmup-steps 8 --decay-steps 5",
                         {"--lr-schedule wsd", "exceed the run's 10 steps"});
  // Near INT64_MAX: warm-up + decay had overflowed and the run had been accepted.
  cli_expect_input_error(
      base + "--lr-schedule wsd --warmup-steps 1 --decay-steps 9223372036854775807",
      {"--lr-schedule wsd", "exceed the run's 10 steps"});
  // Values shown in full (%f had shown 1e-7 as 0.000000), and --lr's beside --min-lr.
  cli_expect_input_error(base + "--lr-schedule cosine --lr 1e-8 --min-lr 1e-7",
                         {"--min-lr: expected a rate in [0, --lr] = [0, 1e-08], found 1e-07"});
  cli_expect_input_error(base + "--lr-schedule wsd --decay-fraction 1.0000001",
                         {"--decay-fraction: expected a fraction in (0, 1], found 1.0000001"});
  // Flags that had been accepted without effect.
  cli_expect_input_error(base + "--lr-schedule cosine --warmup-steps 10",
                         {"--warmup-steps 10: expected fewer than --steps 10, for the cosine "
                          "decay to follow the warm-up"});
  cli_expect_input_error(base + "--lr-schedule linear --warmup-steps 12 --min-lr 0.0005",
                         {"--warmup-steps 12: expected fewer than --steps 10"});
  cli_expect_input_error(base + "--lr-schedule cosine --decay-fraction 0.5",
                         {"--decay-fraction is wsd's, but --lr-schedule is cosine"});
  cli_expect_input_error(base + "--decay-fraction 0.1",
                         {"--decay-fraction is wsd's, but --lr-schedule is constant (no decay)"});
  cli_expect_input_error(base + "--lr-schedule wsd --decay-fraction 0.2 --decay-steps 3",
                         {"--decay-fraction and --decay-steps: expected one of them, found both"});
  // Under a constant rate: the decay's flags and a warm-up past the run had been accepted
  // without effect.
  cli_expect_input_error(base + "--decay-steps 5",
                         {"--decay-steps sets the decay of cosine, linear and wsd, but "
                          "--lr-schedule is constant (no decay)"});
  cli_expect_input_error(base + "--lr-schedule constant --min-lr 0.0001",
                         {"--min-lr sets the decay", "--lr-schedule is constant"});
  cli_expect_input_error(base + "--lr-schedule constant --warmup-steps 12",
                         {"--warmup-steps 12: expected fewer than --steps 10, for the constant "
                          "rate --lr to follow the warm-up"});
  cli_expect_input_error(base + "--eval-batches 5", {"--eval-batches needs held-out data"});
  // Its default value given explicitly had been accepted without held-out data.
  cli_expect_input_error(base + "--eval-batches 1", {"--eval-batches needs held-out data"});
  // More held-out windows than memory holds: the count had wrapped (heap corruption,
  // SIGABRT) or been std::bad_alloc, exit 1.
  cli_expect_input_error(base + "--eval-fraction 0.1 --eval-batches 144115188075855873",
                         {"--eval-batches 144115188075855873: expected at most 1073741824 "
                          "held-out tokens in memory"});
  cli_expect_input_error(base + "--eval-fraction 0.1 --eval-batches 2000000000",
                         {"--eval-batches 2000000000", "samples (the global batch)", "bytes"});
  cli_expect_input_error(base + "--eval-every 5", {"--eval-every needs held-out data"});
  cli_expect_input_error(base + "--eval-fraction 0.1 --eval-batches 0",
                         {"--eval-batches: expected >= 1"});
  cli_expect_input_error(base + "--eval-fraction 1.5",
                         {"--eval-fraction: expected a share in (0, 1)"});
  // Negative and NaN had run without held-out data, exit 0.
  cli_expect_input_error(base + "--eval-fraction -0.1",
                         {"--eval-fraction: expected a share in (0, 1)", "-0.1"});
  cli_expect_input_error(base + "--eval-fraction nan",
                         {"--eval-fraction: expected a share in (0, 1)", "nan"});
  cli_expect_input_error(base + "--eval-fraction 0.1 --eval-data " + kCliCorpus,
                         {"--eval-data and --eval-fraction"});
  cli_expect_input_error(base + "--eval-data /nonexistent.bin", {"/nonexistent.bin"});
  cli_expect_input_error(base + "--data-format parquet",
                         {"--data-format: expected auto, megatron, tokens or text", "parquet"});
  cli_expect_input_error(base + "--token-dtype uint32", {"--token-dtype: only flat token files"});
  cli_expect_input_error(
      "--model " + model + " --steps 1 --data 0.7:" + kCliCorpus + " " + kCliCorpus,
      {"--data: several datasets need a weight each"});
  // A flat uint16 token file with a token beyond the model's vocabulary of 256.
  std::string tokens(128, '\0');  // 64 tokens
  tokens[2 * 40] = char(0x2c);    // token 40: 0x012c = 300
  tokens[2 * 40 + 1] = char(0x01);
  std::string bad = temp_file("oov.bin", tokens);
  cli_expect_input_error("--model " + model + " --steps 1 --data " + bad, {bad, "position 40"});
  // The whole file's check runs beside the first steps: it stops the run, one process or
  // a plan's ranks, before any checkpoint is written.
  const std::string ckpt = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-oov_ckpt";
  cli_expect_input_error("--model " + model + " --steps 2 --checkpoint-every 1 --checkpoint-dir " +
                             ckpt + " --data " + bad,
                         {bad, "token 300 at position 40", "vocabulary of 256"});
  std::string pp2 = temp_file("oov_pp2.json", R"({"version": 1, "model": ")" + model +
                                                  R"(", "devices": 2,
      "parallel": {"dp": 1, "pp": 2, "tp": 1}, "batch": {"micro_batch_size": 1, "global": 2},
      "schedule": {"name": "1f1b", "micro_batches": 2}, "stages": [{"layers": [0, 1]}, {"layers": [1, 3]}]})");
  Result plan = baton::cli_testing::run_command(
      kCliBaton + " launch -n 2 -- " + kCliBaton + " train --plan " + pp2 + " --data " + bad +
      " --steps 2 --threads 1 --checkpoint-every 1 --checkpoint-dir " + ckpt);
  EXPECT_EQ(plan.code, 2) << plan.output;
  EXPECT_NE(plan.output.find(bad + ": token 300 at position 40"), std::string::npos) << plan.output;
  // The directory is made at the start (a path that cannot hold checkpoints stops the run
  // before any step); nothing is written in it.
  std::error_code ec;
  EXPECT_TRUE(!std::filesystem::exists(ckpt, ec) || std::filesystem::is_empty(ckpt, ec))
      << "a checkpoint of a run with a bad token";
  // A truncated flat file (an odd number of bytes for uint16).
  std::string odd = temp_file("odd.bin", std::string(65, 'a'));
  cli_expect_input_error("--model " + model + " --steps 1 --data " + odd, {odd});
}

// A blend of the corpus as a flat token file and as text, with warm-up, cosine decay and
// evaluation every 2 steps: the progress line and the loss log carry the rate and the
// held-out loss.
TEST(Cli, TrainsOnABlendWithScheduleAndEvaluation) {
  std::ifstream in(kCliCorpus, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string flat;
  for (char c : text.substr(0, 20000)) {
    flat.push_back(c);
    flat.push_back('\0');
  }
  std::string bin = temp_file("corpus_u16.bin", flat);
  std::string model = temp_file("tiny_blend.json", kTiny);
  std::string log = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-blend_loss.jsonl";
  Result r =
      cli_run("--model " + model + " --data 0.7:" + bin + " 0.3:" + kCliCorpus +
              " --eval-fraction 0.1 --eval-every 2 --eval-batches 2 --steps 4 --batch 4 --threads 1"
              " --lr-schedule cosine --warmup-steps 2 --min-lr 1e-5 --loss-log " +
              log + " --summary " + log + ".summary.json");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("val loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| lr 5.000e-04 |"), std::string::npos) << r.output;  // step 1: lr/2
  std::ifstream lf(log);
  std::string line;
  int lines = 0, evals = 0;
  while (std::getline(lf, line)) {
    ++lines;
    EXPECT_NE(line.find("\"lr\": "), std::string::npos) << line;
    evals += line.find("\"eval_loss\": ") != std::string::npos;
  }
  EXPECT_EQ(lines, 4);
  EXPECT_EQ(evals, 2);
  std::ifstream sf(log + ".summary.json");
  nlohmann::json summary = nlohmann::json::parse(sf);
  EXPECT_EQ(summary["lr_schedule"]["kind"], "cosine");
  EXPECT_EQ(summary["lr_schedule"]["warmup"], 2);
  EXPECT_DOUBLE_EQ(summary["last_lr"].get<double>(), 1e-5);  // the decay's end
  ASSERT_EQ(summary["evaluations"].size(), 2u);
  EXPECT_EQ(summary["evaluations"][1]["step"], 4);
  EXPECT_EQ(summary["last_eval_loss"], summary["evaluations"][1]["loss"]);
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
  cli_expect_input_error("--init-from " + dir + " --data " + kCliCorpus + " --steps 1",
                         {dir + "/model.safetensors", "run past the end of the data"});
  std::string lying = bytes;
  lying[0] = char(0xff);  // header length beyond the file
  lying[1] = char(0xff);
  lying[2] = char(0x0f);
  std::ofstream(dir + "/model.safetensors", std::ios::binary | std::ios::trunc) << lying;
  cli_expect_input_error("--init-from " + dir + " --data " + kCliCorpus + " --steps 1",
                         {dir + "/model.safetensors", "header length", "past the end of the file"});
}

TEST(Cli, TrainsAndWritesTheLossLog) {
  std::string model = temp_file("tiny_ok.json", kTiny);
  std::string log = ::testing::TempDir() + "/loss.jsonl";
  Result r = cli_run("--model " + model + " --data " + kCliCorpus +
                     " --steps 3 --batch 4 --micro-batches 2 "
                     "--threads 1 --device-memory 256MiB --loss-log " +
                     log);
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

// A cap below the run's estimated peak is refused before the weights are allocated (it had
// failed in the first step with the allocator's message, exit 1).
TEST(Cli, DeviceMemoryCapBelowTheEstimateIsRefused) {
  std::string model = temp_file("tiny_cap.json", kTiny);
  Result r =
      cli_run("--model " + model + " --data " + kCliCorpus + " --steps 1 --device-memory 64KiB");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--device-memory 64.00 KiB: the run's estimated peak is "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("out of memory"), std::string::npos) << r.output;
}

// --device and --precision: a bad value is exit 2 naming the flag; a precision the
// device cannot run is exit 2 naming both; a CUDA device this machine lacks is exit 1
// with "no CUDA device" and the driver's reason (on a machine with a GPU that part
// checks a device index beyond the ones present instead).
TEST(Cli, DeviceAndPrecisionFlags) {
  std::string model = temp_file("tiny_dev.json", kTiny);
  const std::string base = "--model " + model + " --data " + kCliCorpus + " --steps 1 ";
  cli_expect_input_error(base + "--device gpu",
                         {"--device: expected cpu, cuda or cuda:N, found 'gpu'"});
  cli_expect_input_error(base + "--device cuda:x",
                         {"--device: expected cpu, cuda or cuda:N, found 'cuda:x'"});
  cli_expect_input_error(base + "--precision f8",
                         {"--precision: expected f32, tf32, bf16 or fp16, found 'f8'"});
  for (const char* p : {"tf32", "bf16", "fp16"})
    cli_expect_input_error(
        base + "--precision " + p,
        {std::string("--precision ") + p + ": needs a CUDA device", "cpu computes in f32 only"});
  const int n = baton::memory::cuda::device_count();
  if (n == 0) {
    const std::string reason = baton::memory::cuda::unavailable_reason();
    ASSERT_FALSE(reason.empty());
    for (const char* d : {"cuda", "cuda:1"}) {
      // The device is checked before the precision and before any file is read.
      Result r = cli_run(base + "--device " + d + " --precision bf16");
      EXPECT_EQ(r.code, 1) << r.output;
      EXPECT_NE(r.output.find("no CUDA device for cuda:"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find(reason), std::string::npos) << r.output << "\n  lacks: " << reason;
    }
  } else {
    Result r = cli_run(base + "--device cuda:" + std::to_string(n));
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("no such CUDA device"), std::string::npos) << r.output;
  }
  // One process on the CPU in f32, said explicitly: trains as without the flags.
  Result ok = cli_run(base + "--device cpu --precision f32 --threads 1");
  EXPECT_EQ(ok.code, 0) << ok.output;
  // A plan names its device itself.
  std::string plan = temp_file("dev_plan.json", R"({"version": 1, "model": ")" + model +
                                                    R"(", "devices": 1, "device": "cuda",
      "schedule": {"name": "1f1b", "micro_batches": 1}, "stages": [{"layers": [0, 3]}]})");
  cli_expect_input_error("--plan " + plan + " --data " + kCliCorpus + " --device cuda",
                         {"--device does not go with --plan", "\"device\" field"});
  // A CPU plan's 16-bit precision: the hint is the plan's field, not the refused flag.
  std::string cpu_plan = temp_file("cpu_plan.json", R"({"version": 1, "model": ")" + model +
                                                        R"(", "devices": 1,
      "schedule": {"name": "1f1b", "micro_batches": 1}, "stages": [{"layers": [0, 3]}]})");
  Result bf16 = cli_run("--plan " + cpu_plan + " --data " + kCliCorpus + " --precision bf16");
  EXPECT_EQ(bf16.code, 2) << bf16.output;
  EXPECT_NE(bf16.output.find("--precision bf16: needs a CUDA device"), std::string::npos)
      << bf16.output;
  EXPECT_NE(bf16.output.find("the plan's \"device\": \"cuda\", " + cpu_plan + ": $.device"),
            std::string::npos)
      << bf16.output;
  EXPECT_EQ(bf16.output.find("--device cuda"), std::string::npos) << bf16.output;
  if (n == 0) {
    Result r = cli_run("--plan " + plan + " --data " + kCliCorpus + " --steps 1");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("no CUDA device for cuda:0"), std::string::npos) << r.output;
  }
  std::string ucx = temp_file("ucx_plan.json", R"({"version": 1, "model": ")" + model +
                                                   R"(", "devices": 1, "device": "cuda",
      "transport": "ucx", "schedule": {"name": "1f1b", "micro_batches": 1},
      "stages": [{"layers": [0, 3]}]})");
  // UCX carries the device tensors staged through host buffers (transport/staged.h), so
  // the plan is taken; without a GPU the device check stops it.
  if (n == 0) {
    Result r = cli_run("--plan " + ucx + " --data " + kCliCorpus + " --steps 1");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("no CUDA device for cuda:0"), std::string::npos) << r.output;
  }
}

// Optimizer hyper-parameters outside their range, a flag of the optimizer the run does
// not train with, a negative seed or progress interval, --trace-steps without --trace:
// exit 2 naming the flag, what it takes and what it got, before any step (they had
// trained: NaN from step 2 for --beta1 1, "lr": inf in the loss log; or failed at the
// first step: a negative --momentum), on one process and on every rank of a plan.
// A reader that goes away (`--loss-log /dev/stdout | head -1`) stops the run after its step
// with a checkpoint, as baton launch stops a job whose output was closed: SIGPIPE had
// killed it at once, without a word, its steps since the last checkpoint lost.
TEST(Cli, AClosedOutputStopsTheRunWithACheckpoint) {
  const std::string model = temp_file("tiny_pipe.json", kTiny);
  const std::string ckpt = temp_file("pipe-ckpt", ""), err = temp_file("pipe.err", "");
  const std::string rc = temp_file("pipe.rc", "");
  std::filesystem::remove(ckpt);
  const Result r = baton::cli_testing::run_command(
      "{ " + kCliBaton + " train --model " + model + " --data " + kCliCorpus +
      " --steps 2000 --batch 2 --threads 1 --log-every 0 --checkpoint-dir " + ckpt +
      " --checkpoint-every 2000 --loss-log /dev/stdout 2>" + err + "; echo $? > " + rc +
      "; } | head -1");
  EXPECT_EQ(r.output.rfind("{\"step\": 1, ", 0), 0u) << r.output;
  std::string code, said;
  std::getline(std::ifstream(rc), code);
  EXPECT_EQ(code, "141");
  said.assign(std::istreambuf_iterator<char>(std::ifstream(err).rdbuf()), {});
  EXPECT_NE(said.find("stopped by SIGPIPE (its output was closed) after step "), std::string::npos)
      << said;
  size_t checkpoints = 0;
  for (const auto& e : std::filesystem::directory_iterator(ckpt))
    checkpoints += e.path().filename().string().rfind("step-", 0) == 0 ? 1 : 0;
  EXPECT_EQ(checkpoints, 1u);
  std::filesystem::remove_all(ckpt);
}

// A loss log that is standard output, with that file named by another output or closed,
// is refused before any step; a FIFO loss log without a reader does not keep a stopped run
// from its checkpoint (it had hung in the open).
TEST(Cli, LossLogDescriptorsAndFifos) {
  const std::string model = temp_file("tiny_fd.json", kTiny);
  const std::string base = kCliBaton + " train --model " + model + " --data " + kCliCorpus +
                           " --batch 2 --threads 1 --log-level warn";
  const std::string same = temp_file("fd-same.json", "");
  Result r = baton::cli_testing::run_command("{ " + base + " --steps 2 --summary " + same +
                                             " --loss-log /dev/stdout > " + same + "; }");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--summary " + same +
                          " is the same file as --loss-log /dev/stdout: writing it would "
                          "replace the other output"),
            std::string::npos)
      << r.output;
  r = baton::cli_testing::run_command("{ " + base +
                                      " --steps 2 --loss-log /dev/stdout >&-; } 2>&1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--loss-log /dev/stdout: cannot write: descriptor 1 is closed"),
            std::string::npos)
      << r.output;
  const std::string fifo = temp_file("fd-fifo", ""), ckpt = temp_file("fd-ckpt", "");
  std::filesystem::remove(fifo);
  std::filesystem::remove(ckpt);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = baton::cli_testing::run_command(base + " --steps 100000 --loss-log " + fifo +
                                      " --checkpoint-dir " + ckpt +
                                      " 2>&1 & P=$!; sleep 1; kill -TERM $P; wait $P; echo rc=$?");
  EXPECT_NE(r.output.find("rc=143"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fifo + ": no reader of the loss log (a FIFO) before the stop"),
            std::string::npos)
      << r.output;
  size_t checkpoints = 0;
  for (const auto& e : std::filesystem::directory_iterator(ckpt))
    checkpoints += e.path().filename().string().rfind("step-", 0) == 0 ? 1 : 0;
  EXPECT_EQ(checkpoints, 1u);
  std::filesystem::remove_all(ckpt);
  std::filesystem::remove(fifo);
}

TEST(Cli, OutOfRangeAndUnusedTrainingFlags) {
  std::string model = temp_file("tiny_range.json", kTiny);
  const std::string base = "--model " + model + " --data " + kCliCorpus + " --steps 2 --threads 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--optimizer sgd --momentum -0.5", "--momentum: expected a value in [0, 1), found -0.5"},
      {"--optimizer sgd --momentum 1", "--momentum: expected a value in [0, 1), found 1"},
      {"--beta1 1", "--beta1: expected a value in [0, 1), found 1"},
      {"--beta1 -0.1", "--beta1: expected a value in [0, 1), found -0.1"},
      {"--beta2 1", "--beta2: expected a value in [0, 1), found 1"},
      // Shown to the digit that makes it wrong (it had read "found 1").
      {"--beta2 1.0000001", "--beta2: expected a value in [0, 1), found 1.0000001"},
      {"--beta2 nan", "--beta2: expected a value in [0, 1), found nan"},
      {"--weight-decay -1", "--weight-decay: expected a value in [0, 1e6], found -1"},
      {"--weight-decay nan", "--weight-decay: expected a value in [0, 1e6], found nan"},
      // Beyond what a checkpoint's manifest holds: the run's checkpoints had been unreadable.
      {"--weight-decay 2e6", "--weight-decay: expected a value in [0, 1e6], found 2000000"},
      {"--lr inf", "--lr: expected a rate in (0, 1e6], found inf"},
      {"--lr 1e20", "--lr: expected a rate in (0, 1e6], found 1e+20"},
      {"--lr 0", "--lr: expected a rate in (0, 1e6], found 0"},
      {"--grad-clip -1", "--grad-clip: expected a finite norm >= 0 (0: off), found -1"},
      {"--grad-clip nan", "--grad-clip: expected a finite norm >= 0 (0: off), found nan"},
      {"--momentum 0.9", "--momentum is sgd's, but this run trains with adamw"},
      {"--momentum 0", "--momentum is sgd's, but this run trains with adamw"},
      {"--optimizer sgd --beta1 0.5", "--beta1 is adamw's, but this run trains with sgd"},
      {"--optimizer sgd --beta2 0.9", "--beta2 is adamw's, but this run trains with sgd"},
      {"--eps 0", "--eps: expected a value in (0, 1], found 0"},
      {"--eps 2", "--eps: expected a value in (0, 1], found 2"},
      {"--optimizer sgd --eps 1e-6", "--eps is adamw's, but this run trains with sgd"},
      {"--nesterov", "--nesterov is sgd's, but this run trains with adamw"},
      {"--optimizer sgd --nesterov", "--nesterov: needs a momentum (--momentum > 0), found none"},
      {"--seed -1", "--seed: expected an integer in [0, 18446744073709551615], found '-1'"},
      {"--seed 18446744073709551616", "--seed: expected an integer in [0, 18446744073709551615]"},
      {"--seed 1.5", "--seed: expected an integer in [0, 18446744073709551615], found '1.5'"},
      {"--log-every -1", "--log-every: expected a step count >= 0"},
      {"--trace-steps 3", "--trace-steps needs --trace"},
  };
  for (const auto& [flags, message] : cases) cli_expect_input_error(base + flags, {message});
  // At the edges: trains; --log-every 0 prints no progress line.
  Result ok = cli_run(base +
                      "--optimizer sgd --momentum 0.99 --weight-decay 0 --grad-clip 0 "
                      "--seed 18446744073709551615 --log-every 0");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_EQ(ok.output.find("step "), std::string::npos) << ok.output;
  // --eps and --nesterov reach the optimizer: the second step's loss moves with each (the
  // first is before any update).
  const auto second_loss = [&](const std::string& flags) {
    const std::string log = ::testing::TempDir() + "/eps_nesterov_" + std::to_string(getpid());
    const Result r = cli_run(base + flags + " --loss-log " + log);
    EXPECT_EQ(r.code, 0) << r.output;
    std::ifstream in(log);
    std::string line;
    std::getline(in, line);
    std::getline(in, line);
    return nlohmann::json::parse(line).at("loss").get<double>();
  };
  EXPECT_NE(second_loss("--eps 1e-8"), second_loss("--eps 0.5"));
  EXPECT_NE(second_loss("--optimizer sgd --momentum 0.9 --lr 0.1"),
            second_loss("--optimizer sgd --momentum 0.9 --lr 0.1 --nesterov"));
  // --weight-decay's help names both rules (it had said decoupled, which sgd's is not).
  std::string help;
  for (char c : cli_run("--help").output)
    if (!(std::isspace(static_cast<unsigned char>(c)) && !help.empty() && help.back() == ' '))
      help.push_back(std::isspace(static_cast<unsigned char>(c)) ? ' ' : c);
  EXPECT_NE(help.find("decoupled for adamw (torch.optim.AdamW), an L2 term added to the gradient "
                      "before the momentum for sgd (torch.optim.SGD)"),
            std::string::npos)
      << help;

  // Under a plan: the same refusals, on every rank before the job starts.
  std::string plan = temp_file("range_plan.json", R"({"version": 1, "model": ")" + model +
                                                      R"(", "devices": 1,
      "batch": {"micro_batch_size": 2}, "schedule": {"name": "1f1b", "micro_batches": 2},
      "stages": [{"layers": [0, 3]}]})");
  const std::string planned = "--plan " + plan + " --data " + kCliCorpus + " --steps 2 ";
  for (const auto& [flags, message] : cases) cli_expect_input_error(planned + flags, {message});
  // In bytes a size_t: 1e20 and inf had cast to per-parameter buckets, 1e-9 to 0 bytes.
  for (const char* mib : {"1e20", "inf", "nan", "1e-9", "0", "-4"})
    cli_expect_input_error(
        planned + "--bucket-mib " + mib,
        {"--bucket-mib: expected a size in MiB of at least one byte and at most 1048576 (1 TiB)"});
  std::string pp2 = temp_file("range_pp2.json", R"({"version": 1, "model": ")" + model +
                                                    R"(", "devices": 2,
      "parallel": {"dp": 1, "pp": 2, "tp": 1}, "batch": {"micro_batch_size": 1, "global": 2},
      "schedule": {"name": "1f1b", "micro_batches": 2}, "stages": [{"layers": [0, 1]}, {"layers": [1, 3]}]})");
  const std::string launch = kCliBaton + " launch -n 2 -- ";
  const std::string ranks =
      " train --plan " + pp2 + " --data " + kCliCorpus + " --steps 1 --threads 1";
  Result r = baton::cli_testing::run_command(launch + kCliBaton + ranks + " --beta2 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--beta2: expected a value in [0, 1), found 1"), std::string::npos)
      << r.output;
  // Ranks started with other buckets: named in MiB, as the flag takes them (the bytes had
  // stood under the MiB flag's name).
  r = baton::cli_testing::run_command(launch + "sh -c 'exec " + kCliBaton + ranks +
                                      " --bucket-mib $((1 + 3 * BATON_RANK))'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("rank 1 was started with --bucket-mib 4.0 where rank 0 has 1.0"),
            std::string::npos)
      << r.output;
}

// `baton generate`: an empty --prompt is named as one (it had been told to give one of
// --prompt and --prompt-ids); a negative --seed is refused, where Boost had read it as
// 2^64 - 1. Both before any model is read.
TEST(Cli, GenerateEmptyPromptAndNegativeSeed) {
  const std::string gen = kCliBaton + " generate --checkpoint " + ::testing::TempDir() + "/none ";
  auto expect = [&](const std::string& args, const std::string& message) {
    Result r = baton::cli_testing::run_command(gen + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output << "\n  lacks: " << message;
  };
  expect("--prompt ''", "--prompt: the prompt is empty, nothing to continue from");
  expect("--prompt '' --prompt-ids 1", "give exactly one of --prompt and --prompt-ids");
  expect("--prompt-ids ''", "--prompt-ids: no token ids");
  expect("--prompt-ids 1 --seed -1",
         "--seed: expected an integer in [0, 18446744073709551615], found '-1'");
}

// Flags that change nothing are refused as --top-k is at temperature 0: --seed when greedy
// (accepted, no effect), --bos with --prompt-ids, with --tokenizer too (ignored: --bos
// applied to text prompts only). --ignore-eos with no end-of-sequence id known warns.
TEST(Cli, GenerateRefusesFlagsThatChangeNothing) {
  const std::string root = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-gen";
  const std::string gen = kCliBaton + " generate --checkpoint " + root + "/none ";
  auto expect = [&](const std::string& args, const std::string& message) {
    Result r = baton::cli_testing::run_command(gen + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output << "\n  lacks: " << message;
  };
  expect("--prompt-ids 1,2 --seed 5",
         "--seed only acts when sampling: give --temperature above 0 (0 is greedy)");
  expect("--prompt-ids 1,2 --seed 0 --temperature 0", "--seed only acts when sampling");
  for (const std::string bos : {"yes", "no"}) {
    expect("--prompt-ids 1,2 --bos " + bos,
           "--bos " + bos + " applies to a --prompt text: ids given by --prompt-ids");
    expect("--prompt-ids 1,2 --tokenizer " + root + "/sp.model --bos " + bos,
           "--bos " + bos + " applies to a --prompt text");
  }
  const std::string model = temp_file("gen-tiny.json", kTiny), ckpt = root + "-ck";
  Result r = cli_run("--model " + model + " --data " + kCliCorpus +
                     " --steps 1 --batch 2 --threads 1 --log-every 0 --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string run = kCliBaton + " generate --checkpoint " + ckpt +
                          " --prompt-ids 1,2 --max-new-tokens 2 --threads 1";
  const std::string warning = "--ignore-eos: no end-of-sequence id is known";
  r = baton::cli_testing::run_command(run + " --ignore-eos");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(warning), std::string::npos) << r.output;
  r = baton::cli_testing::run_command(run + " --temperature 1 --seed 3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find(warning), std::string::npos) << r.output;
}

// An empty path value is refused naming its flag (an unset shell variable had read as the
// flag's absence: --checkpoint-dir "" trained without checkpoints, and with --resume said
// "--resume needs --checkpoint-dir"); a path baton records in JSON that is not UTF-8 is
// refused before any work, shown with its odd byte (the run had failed at its first
// checkpoint with nlohmann's raw "invalid UTF-8 byte", exit 1, leaving a manifest-less step).
TEST(Cli, EmptyAndNonUtf8PathFlagsAreRefusedUpFront) {
  const std::string model = temp_file("paths_model.json", kTiny);
  const std::string base = "--model " + model + " --steps 2 --batch 2 --threads 1 ";
  const std::string data = " --data " + kCliCorpus;
  for (const std::string flag : {"data", "eval-data", "checkpoint-dir", "loss-log", "summary",
                                 "init-from", "plan", "schedule"})
    cli_expect_input_error(base + (flag == "data" ? "" : data) + " --" + flag + " ''",
                           {"--" + flag + ": expected a path, found an empty value"});
  cli_expect_input_error(base + data + " --checkpoint-dir '' --resume",
                         {"--checkpoint-dir: expected a path"});
  const std::string root = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-utf8";
  std::filesystem::create_directories(root);
  const std::string odd = root + "/data-\xff.txt";
  std::filesystem::copy_file(kCliCorpus, odd);
  const std::string ckpt = root + "/ck";
  cli_expect_input_error(base + "--data '" + odd + "' --checkpoint-dir " + ckpt,
                         {"--data " + root + "/data-\\xff.txt: the path is not valid UTF-8"});
  EXPECT_FALSE(std::filesystem::exists(ckpt)) << "made for a refused run";
  cli_expect_input_error(base + data + " --loss-log '" + root + "/log-\xc3(.jsonl'",
                         {"--loss-log " + root + "/log-\\xc3(.jsonl: the path is not valid UTF-8"});
  // --schedule goes into the plan's shared flags (JSON): it had failed with nlohmann's raw
  // type_error, exit 1.
  cli_expect_input_error(base + data + " --schedule '" + root + "/sch-\xff.txt'",
                         {"--schedule " + root + "/sch-\\xff.txt: the path is not valid UTF-8"});
  cli_expect_input_error(base + data + " --checkpoint-dir '" + root + "/ck-\xed\xa0\x80'",
                         {"--checkpoint-dir " + root + "/ck-\\xed\\xa0\\x80: the path"});
  // Valid UTF-8 beyond ASCII is a path like any other.
  Result r = cli_run(base + "--data '" + kCliCorpus + "' --loss-log '" + root +
                     "/log-\xc3\xa9.jsonl' --summary '" + root + "/s\xe2\x82\xac.json'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(root + "/s\xe2\x82\xac.json")) << r.output;
  // export and generate.
  auto expect = [&](const std::string& command, const std::string& message) {
    Result e = baton::cli_testing::run_command(kCliBaton + " " + command);
    EXPECT_EQ(e.code, 2) << command << "\n" << e.output;
    EXPECT_NE(e.output.find(message), std::string::npos) << e.output << "\n  lacks: " << message;
  };
  expect("export --checkpoint '' --out " + root + "/x", "--checkpoint: expected a path");
  expect("export --checkpoint " + ckpt + " --out ''", "--out: expected a path");
  expect("generate --checkpoint '' --prompt-ids 1", "--checkpoint: expected a path");
  expect("generate --init-from '' --prompt-ids 1", "--init-from: expected a path");
  // Value flags read as unset when empty: --device-memory "" trained uncapped, and
  // --token-dtype "" on a text file was taken where any type is refused.
  for (const std::string flag : {"device-memory", "token-dtype"})
    cli_expect_input_error(base + data + " --" + flag + " ''",
                           {"--" + flag + ": expected a value, found an empty value"});
  expect("export --checkpoint " + ckpt + " --out " + root + "/x --max-shard-size ''",
         "--max-shard-size: expected a value, found an empty value");
}

// `baton export --max-shard-size` is read as --device-memory is (memory::parse_bytes):
// its own parser (std::stod) had read 0.4 and 1e-300 as 0 bytes (no sharding), 0x10 as
// hex, " 5MB" with its space, and inf or 1e30 into an overflowing conversion. Each is
// refused before the checkpoint is read, naming the flag.
TEST(Cli, ExportMaxShardSizeIsReadStrictly) {
  const std::string out = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-shard-out";
  const std::string run =
      kCliBaton + " export --checkpoint " + ::testing::TempDir() + "/no-such-ckpt --out " + out;
  for (const std::string bad :
       {"0", "0.4", "1e-300", "0.0GiB", "0x10", "inf", "1e30", " 5MB", "5 parsecs"}) {
    Result r = baton::cli_testing::run_command(run + " --max-shard-size '" + bad + "'");
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find("--max-shard-size: "), std::string::npos) << bad << "\n" << r.output;
  }
  // A good size passes the flag and reaches the checkpoint (absent here).
  for (const std::string good : {"5GB", "200MB", "4GiB", "1000"}) {
    Result r = baton::cli_testing::run_command(run + " --max-shard-size " + good);
    EXPECT_EQ(r.code, 2) << good << "\n" << r.output;
    EXPECT_EQ(r.output.find("--max-shard-size"), std::string::npos) << good << "\n" << r.output;
    EXPECT_NE(r.output.find("no-such-ckpt"), std::string::npos) << good << "\n" << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

// The step-3 loss a run printed ("" when none).
std::string loss_at_step_3(const std::string& output) {
  const size_t at = output.find("step      3/3 | loss ");
  return at == std::string::npos ? "" : output.substr(at + 21, 6);
}

// A plan that names its optimizer trains with it (its memory check held that optimizer's
// state): the same losses as one process with the flag; a disagreeing --optimizer, or a
// momentum that does not match "sgd" / "sgd-momentum", is exit 2 naming $.optimizer.
TEST(Cli, APlanTrainsWithTheOptimizerItNames) {
  std::string model = temp_file("tiny_opt.json", kTiny);
  const std::string plan_text = R"({"version": 1, "model": ")" + model +
                                R"(", "devices": 1, "optimizer": "OPT",
      "batch": {"micro_batch_size": 2}, "schedule": {"name": "1f1b", "micro_batches": 2},
      "stages": [{"layers": [0, 3]}]})";
  auto plan_with = [&](const std::string& opt) {
    std::string text = plan_text;
    text.replace(text.find("OPT"), 3, opt);
    return temp_file("opt_" + opt + ".json", text);
  };
  const std::string run = " --data " + kCliCorpus + " --steps 3 --threads 1 --lr 0.1 ";
  Result one = cli_run("--model " + model + run + "--batch 4 --micro-batches 2 --optimizer sgd");
  ASSERT_EQ(one.code, 0) << one.output;
  Result adamw = cli_run("--model " + model + run + "--batch 4 --micro-batches 2");
  ASSERT_EQ(adamw.code, 0) << adamw.output;
  const std::string sgd = plan_with("sgd");
  Result planned = cli_run("--plan " + sgd + run);
  ASSERT_EQ(planned.code, 0) << planned.output;
  EXPECT_EQ(loss_at_step_3(planned.output), loss_at_step_3(one.output)) << planned.output;
  EXPECT_NE(loss_at_step_3(planned.output), loss_at_step_3(adamw.output));
  cli_expect_input_error("--plan " + sgd + run + "--optimizer adamw",
                         {"--optimizer adamw: the plan trains with \"sgd\"", "$.optimizer"});
  cli_expect_input_error("--plan " + sgd + run + "--momentum 0.9",
                         {"--momentum: the plan's optimizer is \"sgd\"", "$.optimizer"});
  cli_expect_input_error("--plan " + sgd + run + "--beta1 0.5",
                         {"--beta1 is adamw's, but the plan trains with \"sgd\"", "$.optimizer"});
  cli_expect_input_error(
      "--plan " + plan_with("adamw") + run + "--momentum 0.9",
      {"--momentum is sgd's, but the plan trains with \"adamw\"", "$.optimizer"});
  cli_expect_input_error(
      "--plan " + plan_with("sgd-momentum") + run,
      {"--momentum: the plan's optimizer is \"sgd-momentum\"", "--momentum 0.9"});
  Result momentum = cli_run("--plan " + plan_with("sgd-momentum") + run + "--momentum 0.9");
  EXPECT_EQ(momentum.code, 0) << momentum.output;
  // The plan field's value is not a value of the flag: said as such, not as a disagreement.
  cli_expect_input_error(
      "--plan " + plan_with("sgd-momentum") + run + "--optimizer sgd-momentum --momentum 0.9",
      {"--optimizer: expected adamw or sgd, found 'sgd-momentum' (sgd with --momentum is the "
       "plan field's \"sgd-momentum\")"});
  // Resumed from an AdamW checkpoint, the plan would train AdamW, over its memory check.
  const std::string ckpt = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-opt-ckpt";
  std::filesystem::remove_all(ckpt);
  ASSERT_EQ(
      cli_run("--model " + model + run + "--batch 4 --micro-batches 2 --checkpoint-dir " + ckpt)
          .code,
      0);
  const std::string more = " --data " + kCliCorpus + " --steps 4 --threads 1 --lr 0.1 --resume " +
                           "--checkpoint-dir " + ckpt;
  cli_expect_input_error(
      "--plan " + sgd + more,
      {"$.optimizer: the checkpoint continues with \"adamw\"", "the plan trains with \"sgd\""});
  Result same = cli_run("--plan " + plan_with("adamw") + more);
  EXPECT_EQ(same.code, 0) << same.output;
}

// baton profile takes --device and --precision as baton train does: a 16-bit precision
// on the CPU is exit 2; without a GPU, cuda is exit 1 naming the driver's reason; on the
// CPU it writes a cost row for every op.
TEST(Cli, ProfileDeviceAndPrecision) {
  std::string model = temp_file("tiny_prof.json", kTiny);
  std::string out = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-costs.json";
  const std::string base = kCliBaton + " profile --model " + model + " --out " + out + " ";
  Result r = baton::cli_testing::run_command(base + "--precision bf16");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--precision bf16: needs a CUDA device"), std::string::npos) << r.output;
  if (baton::memory::cuda::device_count() == 0) {
    r = baton::cli_testing::run_command(base + "--device cuda --precision bf16");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("no CUDA device for cuda:0"), std::string::npos) << r.output;
  }
  r = baton::cli_testing::run_command(base + "--device cpu --threads 1 --repeats 1 --warmup 0");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json costs = nlohmann::json::parse(std::ifstream(out));
  EXPECT_GT(costs.at("ops").size(), 5u) << costs.dump();
  for (const auto& [name, op] : costs.at("ops").items())
    EXPECT_GE(op.at("forward").get<double>(), 0.0) << name;
}

// baton profile's --threads 0 is the cores divided among local ranks, as baton train's
// (it had been 1 thread): one process alone times with every core, the count a one-rank
// plan trains with, and plan --check still warns of a plan whose ranks each compute with
// fewer (two ranks on the host: half the cores).
TEST(Cli, ProfileThreadsZeroDividesTheCores) {
  const std::string model = temp_file("tiny_threads.json", kTiny);
  const std::string out = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-threads.json";
  // Every core beside the suite's other test can trip the profile's load check, which asks
  // to profile again: so it is asked, up to three times.
  Result r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = baton::cli_testing::run_command(kCliBaton + " profile --model " + model + " --out " + out +
                                        " --threads 0 --repeats 1 --warmup 1");
    if (r.output.find("the machine's load changed while profiling") == std::string::npos) break;
  }
  ASSERT_EQ(r.code, 0) << r.output;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(out)).at("threads"), cores);
  const std::string plan = temp_file("threads_plan.json", R"({"version": 1,
    "model": ")" + model + R"(", "devices": 2, "parallel": {"pp": 2},
    "batch": {"micro_batch_size": 1}, "schedule": {"name": "1f1b", "micro_batches": 2},
    "stages": [{"layers": [0, 1]}, {"layers": [1, 3]}]})");
  const std::string check = kCliBaton + " plan --check " + plan + " --costs " + out;
  r = baton::cli_testing::run_command(check + " --ranks-per-host 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("the cost file timed the ops at"), std::string::npos) << r.output;
  if (cores < 2) return;  // half the cores is the same one
  r = baton::cli_testing::run_command(check);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the cost file timed the ops at " + std::to_string(cores) +
                          " thread(s), and each of the plan's 2 rank(s) per host computes with " +
                          std::to_string(cores / 2)),
            std::string::npos)
      << r.output;
}

// Flags of plan and profile that would change nothing are said: --optimizer-sharding with
// --dp 1 is refused as --dp-sync is (it had been dropped from the plan), --ranks-per-host
// with neither a cost file nor cores and --flops beside a cost file of every op warn, and
// the internal --tp-probe / --spatial-probe run by hand are refused (they had replaced
// --out, a cost file, with a probe's fragment).
TEST(Cli, PlanAndProfileFlagsThatChangeNothing) {
  const std::string model = temp_file("tiny_unused.json", kTiny);
  const std::string plan = kCliBaton + " plan --model " + model + " --devices 2 --top 1 ";
  Result r = baton::cli_testing::run_command(plan + "--dp 1 --optimizer-sharding zero2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--optimizer-sharding: zero2 shards the optimizer state over "
                          "data-parallel replicas, and --dp 1 has none"),
            std::string::npos)
      << r.output;
  const std::string rph = "--ranks-per-host has no effect without --costs or --cores-per-host";
  r = baton::cli_testing::run_command(plan + "--ranks-per-host 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(rph), std::string::npos) << r.output;
  r = baton::cli_testing::run_command(plan + "--ranks-per-host 1 --cores-per-host 2");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find(rph), std::string::npos) << r.output;

  const std::string out = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-unused.json";
  const std::string profile = kCliBaton + " profile --model " + model + " --threads 1 -o " + out;
  std::ofstream(out) << "{}\n";
  for (const std::string probe : {"tp-probe", "spatial-probe"}) {
    r = baton::cli_testing::run_command(profile + " --" + probe + " 1");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("--" + probe + " is internal"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("found a run outside baton launch"), std::string::npos) << r.output;
    std::ifstream in(out);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "{}\n") << probe;
  }
  r = baton::cli_testing::run_command(profile + " --repeats 1 --warmup 0");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string flops = "--flops has no effect: the --costs file times every op";
  r = baton::cli_testing::run_command(plan + "--costs " + out + " --ranks-per-host 2 --flops 1e12");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(flops), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(rph), std::string::npos) << r.output;
  r = baton::cli_testing::run_command(plan + "--costs " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find(flops), std::string::npos) << r.output;
}

}  // namespace
