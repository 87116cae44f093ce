// `baton data` from the command line: a SentencePiece tokenizer trained on the shipped
// corpus, the corpus prepared into Megatron's format (text and .jsonl, --append-eod) and
// read back, `inspect` decoding it; bad input gives exit code 2 and a message naming it.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "memory/file_io.h"
#include "stages/token_store.h"
#include "tests/child_report.h"
#include "tests/command_runner.h"
#include "tests/stages/sp_model_bytes.h"

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

// A hand-made unigram SentencePiece model: <unk>, <s>, </s>, then `pieces`; `identity`:
// no normalisation, no dummy prefix, whitespace kept (LLaMA's settings).
std::string handmade_tokenizer(const std::string& name, const std::vector<std::string>& pieces,
                               bool identity) {
  using namespace baton::stages::testing;
  auto piece = [](const std::string& text, int type) {
    return pb_bytes(1, pb_bytes(1, text) + pb_varint(2 << 3 | 5) + le32_bytes(0) +
                           pb_varint(3 << 3 | 0) + pb_varint(uint64_t(type)));
  };
  std::string model = piece("<unk>", 2) + piece("<s>", 3) + piece("</s>", 3);
  for (const std::string& p : pieces) model += piece(p, 1);
  if (identity)
    model += pb_bytes(3, pb_bytes(1, "identity") + pb_varint(3 << 3 | 0) + pb_varint(0) +
                             pb_varint(4 << 3 | 0) + pb_varint(0));
  const std::string path = dir() + "/" + name + ".model";
  std::ofstream(path, std::ios::binary) << model;
  return path;
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
  // --log-level, as every command takes it (it had been an unknown option here).
  r = baton("prepare --log-level warn --tokenizer " + tokenizer() + " --input " + slice() +
            " --out " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("[info]"), std::string::npos) << r.output;
  r = baton("inspect " + out + " --log-level loud");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--log-level: expected trace, debug, info, warn, error or off"),
            std::string::npos)
      << r.output;
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

// generate --tokenizer prints what follows the decoded prompt in the decoded whole: the
// continuation decoded alone had lost its first piece's leading "▁" ("a" + "▁b" printed
// "ab").
TEST(DataCli, GenerateKeepsTheSpaceBeforeTheFirstNewPiece) {
  std::vector<std::string> pieces;
  for (int i = 3; i < 256; ++i) pieces.push_back("\xe2\x96\x81w" + std::to_string(i));
  const std::string model = handmade_tokenizer("spaced", pieces, false);
  Result r = baton::cli_testing::run_command(
      "{ " + kDataCliBaton + " generate --init-from " + std::string(BATON_SOURCE_DIR) +
      "/tests/fixtures/llama_gqa --tokenizer " + model +
      " --prompt w7 --temperature 0 --ignore-eos --max-new-tokens 3 2>/dev/null; }");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(r.output.starts_with(" w")) << r.output;
}

// A corrupt SentencePiece model is refused by every command that loads one, before the
// library reads past it (prepare had written different tokens on every run); a FIFO as
// --tokenizer is refused at once (it had waited for ever for a writer).
TEST(DataCli, CorruptOrFifoTokenizersAreRefused) {
  std::string model;
  {
    std::ifstream in(tokenizer(), std::ios::binary);
    model.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_FALSE(model.empty());
  // Appended fields merge into the model: a normalizer whose charsmap values lie beyond
  // its normalized strings, or a piece with a NUL byte.
  const std::string cut = dir() + "/cut.model", nul = dir() + "/nul.model";
  std::ofstream(cut, std::ios::binary)
      << model + testing::sp_normalizer(testing::sp_charsmap(7, "b"));
  std::ofstream(nul, std::ios::binary) << model + testing::sp_piece(std::string("x\0y", 3));
  const std::string text = dir() + "/sp_in.txt";
  std::ofstream(text) << "the licensee may copy\n";
  Result r = baton("prepare --tokenizer " + cut + " --input " + text + " --out " + dir() + "/cut");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(
      r.output.find(cut + ": not a SentencePiece model: the normalizer's precompiled_charsmap "
                          "is invalid: trie value 7 lies outside its 1 bytes"),
      std::string::npos)
      << r.output;
  r = baton("prepare --tokenizer " + nul + " --input " + text + " --out " + dir() + "/nul");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(nul + ": not a SentencePiece model: piece 300 holds a NUL byte"),
            std::string::npos)
      << r.output;
  r = baton::cli_testing::run_command(
      kDataCliBaton + " generate --init-from " + std::string(BATON_SOURCE_DIR) +
      "/tests/fixtures/llama_gqa --tokenizer " + cut + " --prompt hello");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(cut + ": not a SentencePiece model"), std::string::npos) << r.output;
  const std::string fifo = dir() + "/fifo.model";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // timeout: a run that waits on the FIFO fails the test (124) instead of hanging it.
  r = baton::cli_testing::run_command("timeout 20 " + kDataCliBaton + " data inspect " + text +
                                      " --tokenizer " + fifo);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(fifo + ": cannot open file (not a regular file: a FIFO)"),
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

// The shown prefix of text data may cut a UTF-8 character, and text may be any bytes:
// shown with U+FFFD (the report had stopped half-way, exit 1).
TEST(DataCli, InspectShowsBytesThatAreNoUtf8) {
  const std::string u8 = dir() + "/u8.txt", b8 = dir() + "/b8.txt";
  std::ofstream(u8, std::ios::binary) << "caf\xc3\xa9 au lait";
  std::ofstream(b8, std::ios::binary) << "bin\xff\xfe data";
  Result r = baton("inspect " + u8 + " --show-tokens 4");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"caf\xef\xbf\xbd\""), std::string::npos) << r.output;
  r = baton("inspect " + b8);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"bin\xef\xbf\xbd\xef\xbf\xbd data\""), std::string::npos) << r.output;
}

TEST(DataCli, InspectRefusesNegativeCountsAndFifos) {
  const std::string text = dir() + "/short.txt";
  std::ofstream(text) << "some text\n";
  for (const std::string flag : {"--show-tokens", "--samples", "--vocab-size"}) {
    Result r = baton("inspect " + text + " " + flag + " -5");
    EXPECT_EQ(r.code, 2) << flag << ": " << r.output;
    EXPECT_NE(r.output.find(flag + ": expected a count >= 0, found -5"), std::string::npos)
        << r.output;
  }
  // A token beyond --vocab-size is named against it, not a model (there is none).
  Result v = baton("inspect " + text + " --vocab-size 100");
  EXPECT_EQ(v.code, 2) << v.output;
  EXPECT_NE(v.output.find("is outside --vocab-size's vocabulary of 100 (ids 0..99)"),
            std::string::npos)
      << v.output;
  const std::string fifo = dir() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result r = baton("inspect " + fifo);  // had waited for ever for a writer
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(fifo + ": cannot open file (not a regular file: a FIFO)"),
            std::string::npos)
      << r.output;
}

// A token the tokenizer cannot decode is the data's fault, named by the data's file.
TEST(DataCli, InspectNamesTheDataForATokenOutsideTheTokenizer) {
  const std::string out = dir() + "/int8";
  {
    IndexedDatasetWriter w(out, TokenType::i8);
    w.add_document({5, -3, 7});
    w.finish();
  }
  Result r = baton("inspect " + out + " --tokenizer " + tokenizer());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(out + ".bin: token -3 at position 1"), std::string::npos) << r.output;
}

// Text data's token ids are its bytes, already shown as text: --tokenizer is refused (it had
// decoded the bytes as piece ids, other text, exit 0). So is --json-key for a text corpus,
// whose lines are the documents (it had been ignored).
TEST(DataCli, TextDataRefusesTokenizerAndJsonKey) {
  Result r = baton("inspect " + slice() + " --tokenizer " + tokenizer());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(slice() + ": text data (every byte a token) takes no --tokenizer"),
            std::string::npos)
      << r.output;
  r = baton("prepare --tokenizer " + tokenizer() + " --input " + slice() + " --out " + dir() +
            "/keyed --json-key body");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--json-key applies to .jsonl or .json input"), std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir() + "/keyed.idx"));
}

// Blank lines (a CRLF file's empty line is "\r") are skipped with --append-eod too, not
// documents of only the end-of-document token.
TEST(DataCli, PrepareSkipsBlankLinesWithEndOfDocument) {
  const std::string in = dir() + "/crlf.txt", out = dir() + "/crlf";
  std::ofstream(in, std::ios::binary) << "the licensee may copy\r\n\r\n   \r\nand distribute\r\n";
  Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + in + " --out " + out +
                   " --append-eod");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 empty or blank lines skipped"), std::string::npos) << r.output;
  auto s = TokenStore::open_megatron(out);
  ASSERT_EQ(s->num_documents(), 2);
  for (int64_t d = 0; d < 2; ++d)
    EXPECT_GT(s->document_start(d + 1) - s->document_start(d), 1) << "document " << d;
}

// A CRLF line's "\r" is dropped and a line of only whitespace (Python's str.isspace:
// U+0085 too) skipped, as tools/hf_tokenize.py does, also with a model that keeps them:
// an identity-normalising one had ended "hi\r" with a token for "\r" and made documents
// of the others.
TEST(DataCli, PrepareDropsCarriageReturnsAndWhitespaceLinesAsHfTokenize) {
  const std::string model = handmade_tokenizer("identity", {"h", "i"}, true);
  const std::string in = dir() + "/ws.txt", out = dir() + "/ws";
  std::ofstream(in, std::ios::binary)
      << "hi\r\n\r\n \t\r\n\xc2\x85\n\xe2\x80\xa8\xe3\x80\x80\nih\n";
  Result r = baton("prepare --tokenizer " + model + " --input " + in + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("4 empty or blank lines skipped"), std::string::npos) << r.output;
  auto s = TokenStore::open_megatron(out);
  ASSERT_EQ(s->num_documents(), 2);
  EXPECT_EQ(s->num_tokens(), 4);
  for (int64_t t = 0; t < 4; ++t) EXPECT_EQ(s->token(t), (t == 0 || t == 3) ? 3 : 4) << t;
}

// An output name that is a directory is refused before any work, and leaves nothing
// behind (it had failed at the end, exit 1, with PREFIX.idx.tmp left).
TEST(DataCli, PrepareRefusesADirectoryAsOutput) {
  const std::string in = dir() + "/one.txt", out = dir() + "/dirout";
  std::ofstream(in) << "one document\n";
  std::filesystem::create_directories(out + ".bin");
  Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + in + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(out + ".bin: a directory"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out + ".idx.tmp"));
  EXPECT_FALSE(std::filesystem::exists(out + ".bin.tmp"));
  r = baton("prepare --tokenizer " + tokenizer() + " --input " + in + " --out " + dir() +
            "/nodir/x");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no directory " + dir() + "/nodir"), std::string::npos) << r.output;
}

// An empty path (an unset shell variable) and a prefix that names a directory had written
// hidden files with no name (.bin, .idx; dir/.bin), exit 0; a pipe given to train-tokenizer,
// which reads its input twice, had left SentencePiece an empty input and its internal check.
TEST(DataCli, EmptyPathsDirectoryPrefixesAndPipesAreRefused) {
  const std::string in = dir() + "/one.txt";
  std::ofstream(in) << "one document\n";
  Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + in + " --out ''");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--out: expected a path, found an empty value"), std::string::npos)
      << r.output;
  r = baton("inspect ''");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--path: expected a path, found an empty value"), std::string::npos)
      << r.output;
  std::filesystem::create_directories(dir() + "/prefixdir");
  r = baton("prepare --tokenizer " + tokenizer() + " --input " + in + " --out " + dir() +
            "/prefixdir/");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("expected a prefix ending in a file name"), std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir() + "/prefixdir/.bin"));
  const std::string fifo = dir() + "/corpus.fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = baton("train-tokenizer --input " + fifo + " --out " + dir() + "/fifo-tk --vocab-size 50");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("expected a regular file: train-tokenizer reads its input twice"),
            std::string::npos)
      << r.output;
}

// SentencePiece's limits are checked first, naming the flag or the file (its own errors
// named neither, and a negative --max-lines had meant every line).
TEST(DataCli, TrainTokenizerChecksItsFlags) {
  const std::string base = "train-tokenizer --input " + slice() + " --out " + dir() + "/tk";
  const std::pair<std::string, std::string> cases[] = {
      {" --max-lines 100", "--max-lines: expected 0 (every line) or more than 100"},
      {" --max-lines -5", "--max-lines: expected 0 (every line) or more than 100"},
      {" --character-coverage 0.9", "--character-coverage: expected a share in [0.98, 1]"},
      {" --model-type words", "--model-type: expected bpe, unigram, char or word"},
      // Past SentencePiece's int: its own "cannot parse" had named no flag.
      {" --vocab-size 5000000000",
       "--vocab-size: expected at most 2147483647 (SentencePiece's limit), found 5000000000"},
  };
  for (const auto& [flag, message] : cases) {
    Result r = baton(base + flag);
    EXPECT_EQ(r.code, 2) << flag << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  Result r = baton("train-tokenizer --input " + slice() + " --out " + dir() + "/nodir/tk");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--out " + dir() + "/nodir/tk: no directory"), std::string::npos)
      << r.output;
  const std::string blank = dir() + "/blank.txt";
  std::ofstream(blank) << "\n  \n\n";
  r = baton("train-tokenizer --input " + blank + " --out " + dir() + "/tk");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(blank + ": no text to train on"), std::string::npos) << r.output;
}

// SentencePiece's "Vocabulary size too high" is said as baton's own: a corpus with no text
// once normalised (U+3000 passes the check for text above) and a --vocab-size beyond a
// unigram corpus's limit are exit 2 naming the file and the flag.
TEST(DataCli, TrainTokenizerNamesTheLimitsSentencePieceFinds) {
  const std::string ideo = dir() + "/ideo.txt";
  {
    std::ofstream f(ideo, std::ios::binary);
    for (int i = 0; i < 200; ++i) f << "\xe3\x80\x80\n";
  }
  Result r = baton("train-tokenizer --input " + ideo + " --out " + dir() + "/ti --vocab-size 8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(ideo + ": no text to train on after SentencePiece's normalisation"),
            std::string::npos)
      << r.output;
  r = baton("train-tokenizer --input " + slice() + " --out " + dir() +
            "/tu --vocab-size 30000 --model-type unigram");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--vocab-size: expected at most "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" for " + slice() +
                          " (unigram: SentencePiece's limit for this corpus), "
                          "found 30000"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir() + "/tu.model"));
  // Fewer pieces than the corpus's characters: the least size, in baton's flags (it had
  // passed SentencePiece's "required_chars" error on, naming --character_coverage).
  r = baton("train-tokenizer --input " + slice() + " --out " + dir() + "/tc --vocab-size 20");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--vocab-size: expected at least "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is a piece), found 20; or a lower --character-coverage"),
            std::string::npos)
      << r.output;
  // A limit below the least --vocab-size: the corpus is named, not a value the flag then
  // refuses (it had said "expected at most 6", then "expected at least 8"). NULs alike.
  const std::string tiny = dir() + "/tiny.txt", nul = dir() + "/nul.txt";
  std::ofstream(tiny) << "a\n";
  std::ofstream(nul, std::ios::binary) << std::string("\0\0\n\0\n", 5);
  for (const std::string& corpus : {tiny, nul}) {
    r = baton("train-tokenizer --input " + corpus + " --out " + dir() + "/tt --vocab-size 8");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(corpus + ": too little text for a tokenizer: SentencePiece's bpe model "
                                     "of this corpus has at most "),
              std::string::npos)
        << r.output;
  }
}

// prepare reads JSON Lines under .ndjson and upper-case names too (corpus.JSONL had been
// read as text, a document per raw line), and takes --out tok.bin as the prefix tok (it
// had written tok.bin.bin, which --data tok.bin did not find).
TEST(DataCli, PrepareTakesJsonLinesNamesAndABinOut) {
  for (const std::string name : {"c.JSONL", "c.ndjson"}) {
    const std::string jsonl = dir() + "/" + name, out = dir() + "/named.bin";
    std::ofstream(jsonl) << "{\"text\": \"the licensee may copy\"}\n\n{\"text\": \"and "
                            "distribute\"}\n";
    Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + jsonl + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    auto s = TokenStore::open_megatron(dir() + "/named");
    EXPECT_EQ(s->num_documents(), 2) << name;
    EXPECT_FALSE(std::filesystem::exists(out + ".bin"));
  }
  // "dir/.bin" names no prefix: refused as given (it had said "--out dir/").
  const Result r = baton("prepare --tokenizer " + tokenizer() + " --input " + slice() + " --out " +
                         dir() + "/.bin");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--out " + dir() + "/.bin: "), std::string::npos) << r.output;
  // A corpus named PREFIX.bin is an input --out would replace (it had been, exit 0).
  const std::string corpus = dir() + "/corpus.bin";
  std::ofstream(corpus) << "the licensee may copy\n";
  const Result own = baton("prepare --tokenizer " + tokenizer() + " --input " + corpus + " -o " +
                           dir() + "/corpus");
  EXPECT_EQ(own.code, 2) << own.output;
  EXPECT_NE(own.output.find("--out " + corpus + " is the same file as --input " + corpus +
                            ": writing it would replace that input"),
            std::string::npos)
      << own.output;
  EXPECT_EQ(baton::memory::read_file(corpus), "the licensee may copy\n");
}

// inspect checks --tokenizer before printing anything (a bad one had come after the
// header on stdout); prepare's --token-dtype lists exactly the types it takes.
TEST(DataCli, InspectChecksTheTokenizerFirstAndPrepareListsItsTypes) {
  const std::string out = dir() + "/early", bad = dir() + "/bad.model";
  std::ofstream(bad) << "{\"model\": {}}\n";
  ASSERT_EQ(
      baton("prepare --tokenizer " + tokenizer() + " --input " + slice() + " --out " + out).code,
      0);
  Result r = baton::cli_testing::run_command("{ " + kDataCliBaton + " data inspect " + out +
                                             " --tokenizer " + bad + " 2>/dev/null; }");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output, "");
  for (const std::string dtype : {"bogus", "uint32", "float32"}) {
    r = baton("prepare --tokenizer " + tokenizer() + " --input " + slice() + " --out " + out +
              " --token-dtype " + dtype);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(
        r.output.find("--token-dtype: expected auto, uint8, int8, int16, uint16, int32 or int64 "
                      "(the integer types of Megatron's format), found '" +
                      dtype + "'"),
        std::string::npos)
        << r.output;
  }
}

// Lines longer than SentencePiece's max_sentence_length (4192 bytes) had been skipped with
// only a log line, the vocabulary made from the short lines alone, and a corpus without
// a newline had failed ("!sentences_.empty()"): every line is trained on.
TEST(DataCli, TrainTokenizerTrainsOnLongLines) {
  const std::string in = dir() + "/long.txt", one = dir() + "/oneline.txt";
  {
    std::ofstream f(in);
    for (int i = 0; i < 20; ++i) {
      for (int w = 0; w < 800; ++w) f << (w % 3 ? "quokka " : "wombat ");
      f << "\n";
    }
    f << "the cat sat\n";
    std::ofstream g(one);
    for (int w = 0; w < 3000; ++w) g << (w % 2 ? "alpha " : "beta ");
  }
  Result r = baton("train-tokenizer --input " + in + " --out " + dir() + "/long --vocab-size 40");
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream vocab(dir() + "/long.vocab");
  const std::string pieces((std::istreambuf_iterator<char>(vocab)), {});
  for (const char* piece : {"q\t", "k\t", "w\t", "b\t"})
    EXPECT_NE(pieces.find(std::string("\n") + piece), std::string::npos)
        << "the long lines' character " << piece[0] << " is a piece:\n"
        << pieces;
  r = baton("train-tokenizer --input " + one + " --out " + dir() + "/one --vocab-size 16");
  EXPECT_EQ(r.code, 0) << r.output;
}

// Output names up to the system's limit (255 bytes) are written: the temporary names
// beside them (PREFIX.tmp.model, PREFIX.bin.tmp, PREFIX.idx.tmp) had passed it, and a
// legal PREFIX.model or PREFIX.idx failed after the work.
TEST(DataCli, LongOutputNamesAreWritten) {
  const std::string prefix = dir() + "/" + std::string(248, 'n');  // + ".model": 254 bytes
  Result r = baton("train-tokenizer --input " + slice() + " --out " + prefix + " --vocab-size 200");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(prefix + ".model"));
  r = baton("prepare --tokenizer " + prefix + ".model --input " + slice() + " --out " + prefix);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_GT(TokenStore::open_megatron(prefix)->num_documents(), 0);
  for (const auto& e : std::filesystem::directory_iterator(dir()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos)
        << "left behind: " << e.path();
  // One byte more than the limit allows is refused before the work, naming --out.
  const std::string too_long = dir() + "/" + std::string(250, 'n');  // + ".model": 256 bytes
  r = baton("train-tokenizer --input " + slice() + " --out " + too_long + " --vocab-size 200");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("over the file system's limit of 255"), std::string::npos) << r.output;
  r = baton("prepare --tokenizer " + prefix + ".model --input " + slice() + " --out " + dir() +
            "/" + std::string(252, 'n'));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--out "), std::string::npos) << r.output;
}

// A failed run leaves an earlier model as it was: PREFIX.vocab a directory had been found
// after SentencePiece had replaced PREFIX.model.
TEST(DataCli, TrainTokenizerChecksBothOutputsFirst) {
  const std::string prefix = dir() + "/both";
  Result r = baton("train-tokenizer --input " + slice() + " --out " + prefix + " --vocab-size 200");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto size = std::filesystem::file_size(prefix + ".model");
  std::filesystem::remove(prefix + ".vocab");
  std::filesystem::create_directories(prefix + ".vocab");
  r = baton("train-tokenizer --input " + slice() + " --out " + prefix + " --vocab-size 150");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--out " + prefix + ": " + prefix + ".vocab is a directory"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(std::filesystem::file_size(prefix + ".model"), size) << "the earlier model";
  std::filesystem::remove(prefix + ".vocab");
  r = baton("train-tokenizer --input " + slice() + " --out " + prefix + " --vocab-size 150");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(std::filesystem::file_size(prefix + ".model"), size) << "the new model";
  EXPECT_TRUE(std::filesystem::is_regular_file(prefix + ".vocab"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".tmp.model"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".tmp.vocab"));
}

// train-tokenizer on a disk that fills: SentencePiece does not check its writes, so an
// empty .vocab had replaced an earlier one (exit 0), or a cut .model was blamed on
// --tokenizer (exit 2). A run that fails is exit 1 naming the output, with the earlier
// pair as it was; one that succeeds wrote a whole pair. The disk is a small tmpfs in a
// child's own mount namespace (root only; skipped otherwise), filled to leave less and
// less room.
TEST(DataCli, TrainTokenizerOnAFullDiskKeepsTheEarlierPair) {
  const std::string corpus = slice();
  const std::string d = dir() + "/small";
  std::filesystem::create_directories(d);
  const std::string prefix = d + "/tok";
  const std::string report = testing_support::report_from_child([&]() -> std::string {
    std::string said = "skip";
    if (::unshare(CLONE_NEWNS) == 0 &&
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
        ::mount("tmpfs", d.c_str(), "tmpfs", 0, "size=256k") == 0) {
      said = "";
      int failed = 0;
      for (int room_kb : {128, 96, 64, 48, 32, 24, 16, 12, 8, 4, 0}) {
        std::ofstream(prefix + ".model") << "EARLIER MODEL";
        std::ofstream(prefix + ".vocab") << "EARLIER VOCAB";
        struct statvfs vfs;
        ::statvfs(d.c_str(), &vfs);
        const int64_t avail = int64_t(vfs.f_bavail) * int64_t(vfs.f_frsize);
        std::ofstream(d + "/fill")
            << std::string(size_t(std::max<int64_t>(0, avail - room_kb * 1024)), 'x');
        Result r =
            baton("train-tokenizer --input " + corpus + " --out " + prefix + " --vocab-size 400");
        const std::string at = "room " + std::to_string(room_kb) + "k: ";
        if (r.code == 0) {
          std::ifstream v(prefix + ".vocab");
          std::string line;
          int lines = 0;
          while (std::getline(v, line)) ++lines;
          if (lines < 100)
            said += at + "exit 0 with a .vocab of " + std::to_string(lines) + " lines\n";
        } else {
          ++failed;
          if (r.code != 1 || r.output.find(prefix + ".") == std::string::npos)
            said += at + "exit " + std::to_string(r.code) + ": " + r.output + "\n";
          std::ifstream m(prefix + ".model"), v(prefix + ".vocab");
          std::string model, vocab;
          std::getline(m, model);
          std::getline(v, vocab);
          if (model != "EARLIER MODEL" || vocab != "EARLIER VOCAB")
            said += at + "the earlier pair was replaced\n";
        }
        std::filesystem::remove(d + "/fill");
      }
      if (failed == 0) said += "no run ran out of room\n";
      ::umount(d.c_str());
    }
    return said;
  });
  if (report == "skip") GTEST_SKIP() << "cannot mount a tmpfs (not root)";
  EXPECT_EQ(report, "");
}

// A JSON line that nlohmann refuses keeps its reason and column (it had been "expected a
// JSON object per line" alone); a field of another type says what it is; .json is read as
// JSON Lines, as docs/formats/data.md says.
TEST(DataCli, PrepareSaysWhatIsWrongWithAJsonLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"{\"text\": \"ok\"}\n{\"text\": \"bad\\ud800x\"}\n",
       ":2: expected a JSON object per line, found invalid JSON: parse error at column "},
      {"{\"text\": \"ok\"}\n{\"text\": \"bad \xff byte\"}\n",
       ":2: expected a JSON object per line, found invalid JSON: parse error at column "},
      {"{\"text\": 3}\n", ":1: $.text: expected a string (--json-key), found a number (3)"},
      {"[1, 2]\n", ":1: expected a JSON object per line, found an array ([1,2])"},
      // nlohmann had skipped a byte order mark on every line; Python's json refuses it.
      {"{\"text\": \"ok\"}\n\xEF\xBB\xBF{\"text\": \"b\"}\n",
       ":2: expected a JSON object per line, found invalid JSON: a UTF-8 byte order mark at "
       "column 1"},
      {"{\"text\": \"ok\", \"n\": 1e999}\n",
       ":1: expected a JSON object per line, found invalid JSON: number overflow parsing '1e999' "
       "at column 2"},
      {"{\"text\": \"ok\", \"x\": " + std::string(300, '[') + std::string(300, ']') + "}\n",
       ":1: " +
           [] {
             std::string p = "$.x";
             for (int i = 0; i < 255; ++i) p += "[0]";
             return p.substr(0, 120) + "...";
           }() +
           ": nested deeper than 256 levels"},
  };
  const std::string in = dir() + "/e.jsonl";
  for (const auto& [text, message] : cases) {
    std::ofstream(in, std::ios::binary) << text;
    Result r =
        baton("prepare --tokenizer " + tokenizer() + " --input " + in + " --out " + dir() + "/e");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(in + message), std::string::npos) << r.output;
  }
  std::ofstream(in, std::ios::binary) << "{\"text\": \"ok\"}\n{\"text\": \"bad\\ud800x\"}\n";
  Result r =
      baton("prepare --tokenizer " + tokenizer() + " --input " + in + " --out " + dir() + "/e");
  EXPECT_NE(r.output.find("surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"),
            std::string::npos)
      << r.output;
  const std::string json = dir() + "/records.json";
  // A byte order mark may start the file.
  std::ofstream(json) << "\xEF\xBB\xBF{\"text\": \"the licensee may copy\"}\n{\"text\": \"and "
                         "distribute\"}\n";
  r = baton("prepare --tokenizer " + tokenizer() + " --input " + json + " --out " + dir() + "/js");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(TokenStore::open_megatron(dir() + "/js")->num_documents(), 2);
}

// A directory as --input is said to be one (it had been "read error" for prepare and "no
// text to train on" for train-tokenizer).
TEST(DataCli, InputThatIsADirectoryIsSaidToBeOne) {
  Result r =
      baton("prepare --tokenizer " + tokenizer() + " --input " + dir() + " --out " + dir() + "/d");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--input " + dir() + ": a directory, expected a text or JSON Lines file"),
            std::string::npos)
      << r.output;
  r = baton("train-tokenizer --input " + dir() + " --out " + dir() + "/d");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--input " + dir() + ": a directory, expected a text file"),
            std::string::npos)
      << r.output;
}

// A compressed corpus is refused naming its format (a .txt.gz had been tokenized as text:
// 37% <unk>, exit 0); text that merely starts with such bytes' neighbours is not.
TEST(DataCli, CompressedInputIsRefused) {
  const std::string gz = dir() + "/corpus.txt.gz";
  ASSERT_EQ(std::system(("printf 'one line\\n' | gzip -c > " + gz).c_str()), 0);
  Result r =
      baton("prepare --tokenizer " + tokenizer() + " --input " + gz + " --out " + dir() + "/gz");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--input " + gz +
                          ": gzip-compressed data, expected a text or JSON Lines file: decompress "
                          "it first (gunzip -k)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir() + "/gz.bin"));
  r = baton("train-tokenizer --input " + gz + " --out " + dir() + "/gz");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("gzip-compressed data, expected a text file"), std::string::npos)
      << r.output;
}

// SIGTERM (or Ctrl-C) stops a prepare between lines, exit 143, its temporary .bin removed
// (it had been left behind, of any size) and nothing written. (A shell's background job
// ignores SIGINT, and an ignored signal stays ignored.)
// train-tokenizer stopped while its temporaries exist (SentencePiece writes them at the
// end of its training, then they are checked, synced and renamed) removes them and says
// so: they had been left behind without a word. The signal comes as soon as they appear;
// where it comes after the rename the pair is complete, and either way no temporary stays.
TEST(DataCli, AStoppedTrainTokenizerLeavesNoTemporaries) {
  const std::string sub = dir() + "/stopped-tokenizer";
  std::filesystem::create_directories(sub);
  {
    std::ofstream big(sub + "/big.txt");
    for (int i = 0; i < 60000; ++i)
      big << "word" << i % 5003 << " the quick brown fox " << i << "\n";
  }
  Result r = baton::cli_testing::run_command(
      kDataCliBaton + " data train-tokenizer --input " + sub + "/big.txt --out " + sub +
      "/spc --vocab-size 2000 2>&1 & P=$!; while [ ! -e " + sub +
      "/spc.tmp.vocab ] && kill -0 $P 2>/dev/null; do sleep 0.002; done; kill -TERM $P; wait "
      "$P; echo rc=$?");
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(sub))
    if (e.path().filename() != "big.txt") left.push_back(e.path().filename());
  if (r.output.find("rc=143") != std::string::npos) {
    EXPECT_TRUE(left.empty()) << left.front();
    EXPECT_NE(r.output.find("got SIGTERM: ending now; removed what was being written: " + sub +
                            "/spc.tmp.model, " + sub + "/spc.tmp.vocab"),
              std::string::npos)
        << r.output;
  } else {
    EXPECT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
    std::sort(left.begin(), left.end());
    EXPECT_EQ(left, (std::vector<std::string>{"spc.model", "spc.vocab"}));
  }
}

TEST(DataCli, AnInterruptedPrepareLeavesNothing) {
  const std::string sub = dir() + "/interrupted";
  std::filesystem::create_directories(sub);
  {
    std::ofstream big(sub + "/big.txt");
    for (int i = 0; i < 3000000; ++i) big << "the quick brown fox " << i % 97 << "\n";
  }
  Result r =
      baton::cli_testing::run_command(kDataCliBaton + " data prepare --tokenizer " + tokenizer() +
                                      " --input " + sub + "/big.txt --out " + sub +
                                      "/tok 2>&1 & P=$!; sleep 0.5; "
                                      "kill -TERM $P; wait $P; echo rc=$?");
  EXPECT_NE(r.output.find("rc=143"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped by SIGTERM at line "), std::string::npos) << r.output;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(sub))
    if (e.path().filename() != "big.txt") left.push_back(e.path().filename());
  EXPECT_TRUE(left.empty()) << left.front();
}

// inspect reads what baton train --data reads: image directories too (they had been "not a
// regular file"); --show-tokens 0 shows the documents' headers (it had shown nothing).
TEST(DataCli, InspectImagesAndHeadersAlone) {
  const std::string digits = std::string(BATON_SOURCE_DIR) + "/examples/data/digits";
  Result r = baton("inspect " + digits);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("format     images"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("images     1797"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("shape      [1, 8, 8]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("classes    10 (labels 0..9)"), std::string::npos) << r.output;
  const std::string text = dir() + "/few.txt";
  std::ofstream(text) << "some text\n";
  r = baton("inspect " + text + " --show-tokens 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("document 0 (10 tokens): ...\n"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace baton::stages
