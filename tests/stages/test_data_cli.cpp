// `baton data` from the command line: a SentencePiece tokenizer trained on the shipped
// corpus, the corpus prepared into Megatron's format (text and .jsonl, --append-eod) and
// read back, `inspect` decoding it; bad input gives exit code 2 and a message naming it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "stages/token_store.h"
#include "tests/command_runner.h"

namespace baton::stages {
namespace {

const std::string kDataCliBaton = BATON_BINARY;
const std::string kDataCliCorpus = std::string(BATON_SOURCE_DIR) + "/examples/data/licenses.txt";

using Result = baton::cli_testing::CommandResult;

Result baton(const std::string& args) {
  return baton::cli_testing::run_command(kDataCliBaton + " data " + args);
}

std::string dir() {
  // One directory per process: ctest runs each test case as its own process, in parallel.
  std::string d = ::testing::TempDir() + "/baton_data_cli_" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  return d;
}

// The first 20 KB of the corpus (the GPL's start): fast to train on.
std::string slice() {
  const std::string path = dir() + "/slice.txt";
  std::ifstream in(kDataCliCorpus, std::ios::binary);
  std::string text(20000, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(text.rfind('\n') + 1);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

const std::string& tokenizer() {
  static const std::string model = [] {
    const std::string prefix = dir() + "/sp";
    Result r =
        baton("train-tokenizer --input " + slice() + " --out " + prefix + " --vocab-size 300");
    EXPECT_EQ(r.code, 0) << r.output;
    return prefix + ".model";
  }();
  return model;
}

TEST(DataCli, PrepareTextAndInspect) {
  const std::string out = dir() + "/text";
  Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + slice() + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(slice());
  std::string line;
  int64_t docs = 0;
  while (std::getline(in, line)) docs += !line.empty();
  auto s = TokenStore::open_megatron(out);
  EXPECT_EQ(s->num_documents(), docs);
  EXPECT_EQ(s->type(), TokenType::u16);
  s->check_vocabulary(300);
  r = baton("inspect " + out + " --tokenizer " + tokenizer());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("format     megatron"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("documents  " + std::to_string(docs)), std::string::npos) << r.output;
  // The first document decodes to the first line (SentencePiece drops the leading blanks).
  EXPECT_NE(r.output.find("\"GNU GENERAL PUBLIC LICENSE\""), std::string::npos) << r.output;
}

TEST(DataCli, PrepareJsonlWithEndOfDocument) {
  const std::string jsonl = dir() + "/c.jsonl", out = dir() + "/jsonl";
  std::ofstream(jsonl)
      << "{\"text\": \"the licensee may copy\"}\n\n{\"text\": \"and distribute\", \"id\": 2}\n";
  Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + jsonl + " --out " + out +
                   " --append-eod");
  ASSERT_EQ(r.code, 0) << r.output;
  auto s = TokenStore::open_megatron(out);
  ASSERT_EQ(s->num_documents(), 2);
  for (int64_t d = 0; d < 2; ++d)
    EXPECT_EQ(s->token(s->document_start(d + 1) - 1), 2) << "</s> ends document " << d;
}

// A dataset prepared again under the same name is the new pair, .bin and .idx alike.
TEST(DataCli, PreparedAgainReplacesThePair) {
  const std::string a = dir() + "/a.txt", b = dir() + "/b.txt", out = dir() + "/again";
  std::ofstream(a) << "one document\nand another\nand a third\n";
  std::ofstream(b) << "a single, longer document than any of the three before it\n";
  ASSERT_EQ(baton("prepare --tokenizer " + tokenizer() + " --input " + a + " --out " + out).code,
            0);
  Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + b + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  auto s = TokenStore::open_megatron(out);
  EXPECT_EQ(s->num_documents(), 1);
  EXPECT_EQ(uint64_t(s->num_tokens()) * 2, std::filesystem::file_size(out + ".bin"));
  EXPECT_FALSE(std::filesystem::exists(out + ".idx.tmp"));
}

// A tokenizer with more pieces than the model's vocabulary is not the model's: generation
// refuses it before sampling.
TEST(DataCli, GenerateRefusesATokenizerLargerThanTheVocabulary) {
  Result r = baton::cli_testing::run_command(
      kDataCliBaton + " generate --init-from " + std::string(BATON_SOURCE_DIR) +
      "/tests/fixtures/llama_gqa --tokenizer " + tokenizer() + " --prompt hello");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(
      r.output.find(tokenizer() + ": has 300 pieces, more than the model's vocabulary of 256"),
      std::string::npos)
      << r.output;
}

TEST(DataCli, BadInput) {
  const std::string jsonl = dir() + "/bad.jsonl";
  std::ofstream(jsonl) << "{\"text\": \"fine\"}\n[1, 2]\n";
  Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + jsonl + " --out " + dir() +
                   "/bad");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(jsonl + ":2: expected a JSON object"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir() + "/bad.idx"));
  EXPECT_FALSE(std::filesystem::exists(dir() + "/bad.bin.tmp"));
  r = baton("prepare --tokenizer " + kDataCliCorpus + " --input " + jsonl + " --out " + dir() +
            "/bad");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("not a SentencePiece model"), std::string::npos) << r.output;
  r = baton("inspect " + dir() + "/nothing.bin");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot open"), std::string::npos) << r.output;
  r = baton("frobnicate");
  EXPECT_EQ(r.code, 2) << r.output;
}

}  // namespace
}  // namespace baton::stages
