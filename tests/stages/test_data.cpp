// Datasets: Megatron-LM indexed datasets written by this test's own writer (every dtype
// code, sequences out of file order, multimodal indices) and by megatron-core itself (the
// committed fixture) read back the same tokens; flat token files and text; windows inside
// documents; blends hold their proportions; held-out splits; every bad file is an
// InputError naming the file and the reason.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "memory/error.h"
#include "stages/data.h"
#include "stages/mapped_file.h"
#include "stages/model.h"
#include "stages/sentencepiece_model.h"
#include "stages/token_store.h"
#include "tests/stages/sp_model_bytes.h"

namespace baton::stages {
namespace {

namespace fs = std::filesystem;

std::string tmp(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/baton_data";
  fs::create_directories(dir);
  return dir + "/" + name;
}

// This test's own writer of Megatron's layout (independent of IndexedDatasetWriter):
// header "MMIDIDX\0\0", u64 version, u8 dtype code, u64 sequence count, u64 document-index
// count, i32 lengths, i64 byte offsets, i64 document indices (sequence numbers, from 0).
struct Doc {
  std::vector<std::vector<double>> sequences;
};
struct WriteOptions {
  uint8_t code = 8;
  uint64_t version = 1;
  bool reverse_order = false;  // sequences stored in the .bin back to front
  bool modes = false;
  std::string magic = std::string("MMIDIDX\0\0", 9);
};

void put_token(std::string& out, uint8_t code, double v) {
  auto put = [&](auto x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); };
  switch (code) {
    case 1:
      put(uint8_t(v));
      break;
    case 2:
      put(int8_t(v));
      break;
    case 3:
      put(int16_t(v));
      break;
    case 4:
      put(int32_t(v));
      break;
    case 5:
      put(int64_t(v));
      break;
    case 6:
      put(double(v));
      break;
    case 7:
      put(float(v));
      break;
    case 8:
      put(uint16_t(v));
      break;
  }
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void write_megatron(const std::string& prefix, const std::vector<Doc>& docs,
                    const WriteOptions& w = {}) {
  std::vector<const std::vector<double>*> seqs;
  std::vector<int64_t> doc_index{0};
  for (const Doc& d : docs) {
    for (const auto& s : d.sequences) seqs.push_back(&s);
    doc_index.push_back(int64_t(seqs.size()));
  }
  std::vector<int64_t> ptr(seqs.size());
  std::string bin;
  std::vector<size_t> order(seqs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = w.reverse_order ? order.size() - 1 - i : i;
  for (size_t i : order) {
    ptr[i] = int64_t(bin.size());
    for (double v : *seqs[i]) put_token(bin, w.code, v);
  }
  std::string idx = w.magic;
  put(idx, w.version);
  put(idx, w.code);
  put(idx, uint64_t(seqs.size()));
  put(idx, uint64_t(doc_index.size()));
  for (auto* s : seqs) put(idx, int32_t(s->size()));
  for (int64_t p : ptr) put(idx, p);
  for (int64_t d : doc_index) put(idx, d);
  if (w.modes)
    for (size_t i = 0; i < seqs.size(); ++i) put(idx, int8_t(0));
  std::ofstream(prefix + ".bin", std::ios::binary) << bin;
  std::ofstream(prefix + ".idx", std::ios::binary) << idx;
}

std::vector<Doc> some_docs(uint32_t seed, int n_docs, int64_t max_token) {
  std::mt19937 rng(seed);
  std::vector<Doc> docs(static_cast<size_t>(n_docs));
  for (Doc& d : docs) {
    int n_seq = 1 + int(rng() % 3);
    for (int s = 0; s < n_seq; ++s) {
      std::vector<double> seq(rng() % 40);  // empty sequences too
      for (double& v : seq) v = double(rng() % uint32_t(max_token));
      d.sequences.push_back(seq);
    }
  }
  return docs;
}

std::vector<int64_t> flatten(const std::vector<Doc>& docs,
                             std::vector<int64_t>* doc_starts = nullptr) {
  std::vector<int64_t> all;
  if (doc_starts) doc_starts->assign(1, 0);
  for (const Doc& d : docs) {
    for (const auto& s : d.sequences)
      for (double v : s) all.push_back(int64_t(v));
    if (doc_starts) doc_starts->push_back(int64_t(all.size()));
  }
  return all;
}

std::vector<int64_t> read_all(const TokenStore& s) {
  std::vector<int64_t> out(size_t(s.num_tokens()));
  s.read(0, s.num_tokens(), out.data());
  return out;
}

void data_expect_input_error(const std::function<void()>& f,
                             std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no InputError; expected one saying " << *parts.begin();
  } catch (const InputError& e) {
    std::string m = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(m.find(p), std::string::npos) << m << "\n  lacks: " << p;
  }
}

TEST(Megatron, EveryDtypeCodeRoundTrips) {
  for (uint8_t code = 1; code <= 8; ++code) {
    SCOPED_TRACE("dtype code " + std::to_string(code));
    const int64_t max_token = code == 1 || code == 2 ? 100 : 30000;
    auto docs = some_docs(code, 12, max_token);
    const std::string prefix = tmp("every_" + std::to_string(code));
    write_megatron(prefix, docs, {.code = code});
    std::vector<int64_t> starts;
    std::vector<int64_t> want = flatten(docs, &starts);
    for (const std::string& path : {prefix, prefix + ".bin", prefix + ".idx"}) {
      auto s = open_token_store(path, "auto", "");
      EXPECT_EQ(s->format(), "megatron");
      EXPECT_EQ(megatron_code(s->type()), code);
      EXPECT_EQ(s->num_documents(), 12);
      EXPECT_EQ(s->document_starts(), starts);
      EXPECT_EQ(read_all(*s), want);
      s->check_vocabulary(max_token);
    }
  }
}

TEST(Megatron, SequencesOutOfFileOrderAndModes) {
  auto docs = some_docs(7, 9, 500);
  const std::string prefix = tmp("reversed");
  write_megatron(prefix, docs, {.code = 4, .reverse_order = true, .modes = true});
  auto s = TokenStore::open_megatron(prefix);
  std::vector<int64_t> want = flatten(docs);
  EXPECT_EQ(read_all(*s), want);
  // Windows that cross sequences read the same tokens in pieces.
  for (int64_t p = 0; p + 10 <= s->num_tokens(); p += 7) {
    std::vector<int64_t> w(10);
    s->read(p, 10, w.data());
    EXPECT_EQ(w, std::vector<int64_t>(want.begin() + p, want.begin() + p + 10)) << p;
  }
}

TEST(Megatron, LibraryWriterRoundTrips) {
  const std::string prefix = tmp("writer");
  fs::remove(prefix + ".bin");
  fs::remove(prefix + ".idx");
  std::vector<std::vector<int64_t>> docs = {{1, 2, 3}, {}, {65000, 7}, {9}};
  {
    IndexedDatasetWriter w(prefix, TokenType::u16);
    for (const auto& d : docs) w.add_document(d);
    EXPECT_FALSE(fs::exists(prefix + ".idx"));  // nothing under the final names before finish
    w.finish();
  }
  auto s = TokenStore::open_megatron(prefix);
  EXPECT_EQ(s->type(), TokenType::u16);
  EXPECT_EQ(s->num_documents(), 4);
  EXPECT_EQ(read_all(*s), (std::vector<int64_t>{1, 2, 3, 65000, 7, 9}));
  EXPECT_EQ(s->document_starts(), (std::vector<int64_t>{0, 3, 3, 5, 6}));
  {
    IndexedDatasetWriter w(tmp("abandoned"), TokenType::i32);
    w.add_document({1, 2});
  }  // no finish: nothing left behind
  EXPECT_FALSE(fs::exists(tmp("abandoned") + ".bin"));
  EXPECT_FALSE(fs::exists(tmp("abandoned") + ".bin.tmp"));
}

// A write that fails (a full disk; here a file-size limit) says why, as a missing
// directory does: both had been "write failed" / "cannot open for writing" alone.
TEST(Megatron, LibraryWriterSaysWhyAWriteFailed) {
  try {
    IndexedDatasetWriter w(tmp("no-such-dir") + "/data", TokenType::i32);
    ADD_FAILURE() << "a writer opened in a missing directory";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  const std::string prefix = tmp("too-large-" + std::to_string(getpid()));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{1000, 1000};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      IndexedDatasetWriter w(prefix, TokenType::i32);
      w.add_document(std::vector<int64_t>(100000, 1));
      w.finish();
    } catch (const RuntimeError& e) {
      _exit(std::string(e.what()).find("write failed: File too large") != std::string::npos ? 0
                                                                                            : 4);
    }
    _exit(3);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// Written by megatron-core's IndexedDatasetBuilder (tests/fixtures/make_megatron_fixture.py).
TEST(Megatron, FixtureWrittenByMegatronCore) {
  const std::string dir = std::string(BATON_SOURCE_DIR) + "/tests/fixtures/megatron_tiny";
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in) << dir << "/expected.json";
  nlohmann::json want = nlohmann::json::parse(in);
  for (const auto& ds : want["datasets"]) {
    SCOPED_TRACE(ds["prefix"].get<std::string>());
    auto s = open_token_store(dir + "/" + ds["prefix"].get<std::string>(), "auto", "");
    EXPECT_EQ(token_type_name(s->type()), ds["dtype"].get<std::string>());
    EXPECT_EQ(s->num_documents(), int64_t(ds["documents"].size()));
    std::vector<int64_t> flat, starts{0};
    for (const auto& d : ds["documents"]) {
      for (int64_t v : d.get<std::vector<int64_t>>()) flat.push_back(v);
      starts.push_back(int64_t(flat.size()));
    }
    EXPECT_EQ(read_all(*s), flat);
    EXPECT_EQ(s->document_starts(), starts);
  }
}

TEST(Megatron, BadFiles) {
  auto docs = some_docs(3, 4, 200);
  const std::string p = tmp("bad");
  auto rewrite_idx = [&](const std::function<void(std::string&)>& edit) {
    write_megatron(p, docs, {.code = 8});
    std::ifstream in(p + ".idx", std::ios::binary);
    std::string idx((std::istreambuf_iterator<char>(in)), {});
    edit(idx);
    std::ofstream(p + ".idx", std::ios::binary | std::ios::trunc) << idx;
  };
  write_megatron(p, docs, {.code = 8, .magic = std::string("MMIDIDY\0\0", 9)});
  data_expect_input_error([&] { TokenStore::open_megatron(p); }, {p + ".idx", "MMIDIDX", "header"});
  write_megatron(p, docs, {.code = 8, .version = 2});
  data_expect_input_error([&] { TokenStore::open_megatron(p); },
                          {p + ".idx", "version 2, expected 1"});
  rewrite_idx([](std::string& s) { s[17] = 9; });
  data_expect_input_error([&] { TokenStore::open_megatron(p); }, {p + ".idx", "dtype code 9"});
  rewrite_idx([](std::string& s) { s.resize(s.size() - 5); });
  data_expect_input_error([&] { TokenStore::open_megatron(p); }, {p + ".idx", "truncated"});
  rewrite_idx([](std::string& s) { s.resize(20); });
  data_expect_input_error([&] { TokenStore::open_megatron(p); }, {p + ".idx", "truncated"});
  // A .bin cut short.
  write_megatron(p, docs, {.code = 8});
  fs::resize_file(p + ".bin", fs::file_size(p + ".bin") - 3);
  data_expect_input_error([&] { TokenStore::open_megatron(p); },
                          {p + ".bin: truncated", "the file has"});
  // An index entry pointing past the .bin (the first sequence's offset).
  rewrite_idx([](std::string& s) {
    int64_t far = 1 << 20;
    uint64_t S;
    std::memcpy(&S, s.data() + 18, 8);
    std::memcpy(s.data() + 34 + 4 * S, &far, 8);
  });
  data_expect_input_error([&] { TokenStore::open_megatron(p); },
                          {p + ".idx", "points past the end of " + p + ".bin"});
  // A negative offset is the index's fault (it had been called a truncated .bin).
  rewrite_idx([](std::string& s) {
    int64_t negative = -2;
    uint64_t S;
    std::memcpy(&S, s.data() + 18, 8);
    std::memcpy(s.data() + 34 + 4 * S, &negative, 8);
  });
  data_expect_input_error([&] { TokenStore::open_megatron(p); },
                          {p + ".idx: sequence 0 starts at byte -2", "corrupt"});
  // A sequence at an odd byte of 2-byte tokens (Megatron's writer aligns them all).
  rewrite_idx([](std::string& s) {
    int64_t odd = 1;
    uint64_t S;
    std::memcpy(&S, s.data() + 18, 8);
    std::memcpy(s.data() + 34 + 4 * S + 8, &odd, 8);
  });
  data_expect_input_error([&] { TokenStore::open_megatron(p); },
                          {p + ".idx: sequence 1 starts at byte 1, not a multiple of its 2-byte"});
  // Document indices that do not end at the sequence count.
  rewrite_idx([](std::string& s) {
    s[s.size() - 8] = 1;
    s[s.size() - 7] = 1;
  });
  data_expect_input_error([&] { TokenStore::open_megatron(p); }, {p + ".idx", "document index"});
  // A missing half.
  write_megatron(p, docs, {.code = 8});
  fs::remove(p + ".bin");
  data_expect_input_error([&] { TokenStore::open_megatron(p); }, {p + ".bin", "cannot open"});
}

TEST(TokenStore, VocabularyCheckNamesFileAndFirstPosition) {
  std::vector<Doc> docs = {{{{1, 2, 3}}}, {{{4, 5}, {6, 99, 7, 100}}}};
  const std::string p = tmp("vocab");
  write_megatron(p, docs, {.code = 4});
  auto s = TokenStore::open_megatron(p);
  s->check_vocabulary(101);
  data_expect_input_error(
      [&] { s->check_vocabulary(99); },
      {p + ".bin: token 99 at document 1, token 3 (position 6)", "vocabulary of 99"});
  write_megatron(p, {{{{1, -2, 3}}}}, {.code = 3});
  data_expect_input_error([&] { TokenStore::open_megatron(p)->check_vocabulary(10); },
                          {"token -2 at position 1"});
  write_megatron(p, {{{{1, 2.5}}}}, {.code = 7});
  data_expect_input_error([&] { TokenStore::open_megatron(p)->check_vocabulary(10); },
                          {"token 2.5 at position 1", "not a whole number"});
  // Reading a float dataset before any vocabulary check (baton data inspect's samples):
  // a value that is no whole number in int64's range is an error, not a conversion
  // (found by fuzz_token_index: 1e46 in a float64 index).
  write_megatron(p, {{{{1, -5.85e46, 3}}}}, {.code = 6});
  data_expect_input_error([&] { read_all(*TokenStore::open_megatron(p)); },
                          {p + ".bin: token", "at position 1", "not a token id"});
  write_megatron(p, {{{{1, 2, 2.5}}}}, {.code = 7});
  data_expect_input_error([&] { read_all(*TokenStore::open_megatron(p)); },
                          {"at position 2", "not a token id"});
  // A long clean run, then one bad token: the block scan finds exactly it.
  std::vector<double> many(100000, 5.0);
  many[77777] = 50;
  write_megatron(p, {{{many}}}, {.code = 8});
  data_expect_input_error([&] { TokenStore::open_megatron(p)->check_vocabulary(50); },
                          {"token 50 at position 77777"});
}

// int64 ids are named exactly: through a double, 9007199254740993 had read
// 9.00719925e+15 and INT64_MAX 9.223372037e+18 (data inspect's token ids too).
TEST(TokenStore, Int64TokensAreNamedExactly) {
  const std::string p = tmp("i64");
  {
    IndexedDatasetWriter w(p, TokenType::i64);
    w.add_document({1, 2});
    w.add_document({3, 9007199254740993, std::numeric_limits<int64_t>::max()});
    w.finish();
  }
  auto s = TokenStore::open_megatron(p);
  data_expect_input_error([&] { s->check_vocabulary(256); },
                          {p + ".bin: token 9007199254740993 at document 1, token 1 (position 3)",
                           "outside the model's vocabulary of 256"});
  const TokenRange r = s->token_range();
  EXPECT_EQ(r.lo_text, "1");
  EXPECT_EQ(r.hi_text, "9223372036854775807");
  EXPECT_EQ(r.lo, 1.0);
  {
    IndexedDatasetWriter w(p, TokenType::i64);
    w.add_document({-9007199254740993, 5});
    w.finish();
  }
  s = TokenStore::open_megatron(p);
  data_expect_input_error([&] { s->check_vocabulary(256); }, {"token -9007199254740993 at"});
  EXPECT_EQ(s->token_range().lo_text, "-9007199254740993");
  // A float store's values as before (whole ones without a fraction).
  write_megatron(p, {{{{1.5, 7}}}}, {.code = 6});
  const TokenRange f = TokenStore::open_megatron(p)->token_range();
  EXPECT_EQ(f.lo_text, "1.5");
  EXPECT_EQ(f.hi_text, "7");
}

// A float store's window check names the file's first bad token too: reading the window
// had thrown its own error at the window's position first.
// The first sample of step 3 whose window (8 tokens and the target) holds `position`;
// -1 when none of the first 100000 does.
int64_t window_holding(const TokenDataset& d, int64_t position) {
  for (int64_t i = 0; i < 100000; ++i) {
    const int64_t s0 = d.sample_start(3, 0, i);
    if (s0 <= position && position <= s0 + 8) return i;
  }
  return -1;
}

TEST(TokenStore, FloatWindowNamesTheFirstBadToken) {
  const std::string p = tmp("float_bad");
  std::vector<double> seq(2000, 7.0);
  seq[100] = 2.5;
  seq[1500] = 3.5;
  write_megatron(p, {{{seq}}}, {.code = 7});
  auto store = TokenStore::open_megatron(p);
  TokenDataset d(store, 8, true, 500);
  const int64_t index = window_holding(d, 1500);
  ASSERT_GE(index, 0);
  std::vector<int64_t> w(9);
  data_expect_input_error([&] { d.sample(3, 0, index, 8, w.data()); },
                          {p + ".bin: token 2.5 at position 100", "not a whole number"});
  // A whole number beyond int64 is not called "not a whole number".
  write_megatron(p, {{{{1, 1e19}}}}, {.code = 6});
  data_expect_input_error(
      [&] { read_all(*TokenStore::open_megatron(p)); },
      {"at position 1", "not a token id (a whole number beyond int64's range)"});
}

// The run's check: every window read is checked as it is read, and the whole store on a
// thread; both give the error of the file's first bad token.
TEST(TokenStore, BackgroundAndWindowChecksNameTheFirstBadToken) {
  const std::string p = tmp("late_bad.bin");
  std::string b;
  for (int i = 0; i < 2000; ++i) put(b, uint16_t(i == 300 || i == 1500 ? 700 + i : i % 500));
  std::ofstream(p, std::ios::binary) << b;
  auto store = TokenStore::open_flat(p, TokenType::u16);
  const std::string first = p + ": token 1000 at position 300";
  {
    VocabularyCheck check({store}, 500);
    EXPECT_EQ(check.tokens(), 2000);
    data_expect_input_error([&] { check.wait(); }, {first, "vocabulary of 500"});
    data_expect_input_error([&] { check.done(); }, {first});  // and on every later look
  }
  VocabularyCheck clean({store}, 5000);
  clean.wait();
  EXPECT_TRUE(clean.done());
  { VocabularyCheck stopped({store, store, store}, 5000); }  // stops without waiting for it

  // A window holding only the later bad token (position 1500) names the first one.
  TokenDataset d(store, 8, true, 500);
  const int64_t index = window_holding(d, 1500);
  ASSERT_GE(index, 0);
  std::vector<int64_t> w(9);
  data_expect_input_error([&] { d.sample(3, 0, index, 8, w.data()); }, {first});
  // A held-out split keeps the check.
  // (Not a structured binding: clang 14 cannot capture one in a lambda.)
  auto halves = d.split(0.5);
  const auto& held_out = halves.second;
  data_expect_input_error(
      [&] {
        for (int64_t i = 0; i < 1000; ++i) held_out->sample(3, 0, i, 8, w.data());
      },
      {first});
  // Without a vocabulary no window is checked.
  TokenDataset unchecked(store, 8, true);
  unchecked.sample(3, 0, index, 8, w.data());
}

TEST(TokenStore, FlatTokensAndText) {
  const std::string u16 = tmp("flat16.bin"), u32 = tmp("flat32.bin"), odd = tmp("odd.bin"),
                    txt = tmp("t.txt");
  {
    std::string b;
    for (uint16_t v : {1, 2, 60000}) put(b, v);
    std::ofstream(u16, std::ios::binary) << b;
    std::string c;
    for (uint32_t v : {1u, 2u, 100000u}) put(c, v);
    std::ofstream(u32, std::ios::binary) << c;
    std::ofstream(odd, std::ios::binary) << "abc";
    std::ofstream(txt, std::ios::binary) << "hello";
  }
  auto a = open_token_store(u16, "auto", "");
  EXPECT_EQ(a->format(), "tokens");
  EXPECT_EQ(read_all(*a), (std::vector<int64_t>{1, 2, 60000}));
  auto b = open_token_store(u32, "auto", "uint32");
  EXPECT_EQ(read_all(*b), (std::vector<int64_t>{1, 2, 100000}));
  data_expect_input_error([&] { open_token_store(odd, "auto", ""); },
                          {odd + ": truncated", "uint16"});
  auto t = open_token_store(txt, "auto", "");
  EXPECT_EQ(t->format(), "text");
  EXPECT_EQ(read_all(*t), (std::vector<int64_t>{'h', 'e', 'l', 'l', 'o'}));
  // A NumPy array is refused (it had been read as text, its header and bytes as tokens),
  // unless text is asked for.
  const std::string npy = tmp("toks.npy");
  std::ofstream(npy, std::ios::binary) << std::string("\x93NUMPY\x01\x00v\x00{'descr': '<u2'", 25);
  data_expect_input_error([&] { open_token_store(npy, "auto", ""); },
                          {npy + ": a NumPy array (.npy)", ".tofile('tokens.bin')"});
  EXPECT_EQ(open_token_store(npy, "text", "")->format(), "text");
  // Forced formats; a text file with a token type is a mistake.
  EXPECT_EQ(open_token_store(u16, "text", "")->num_tokens(), 6);
  data_expect_input_error([&] { open_token_store(txt, "auto", "uint16"); },
                          {"--token-dtype", txt + " is read as text (every byte a token; "
                                                  "--data-format tokens reads it as flat tokens)"});
  data_expect_input_error([&] { open_token_store(u16, "tokens", "float16"); },
                          {"--token-dtype", "float16"});
  data_expect_input_error([&] { open_token_store(txt, "parquet", ""); },
                          {"--data-format", "parquet"});
  data_expect_input_error([&] { open_token_store(tmp("nothing"), "megatron", ""); },
                          {"no Megatron dataset"});
}

TEST(Sampling, PureFunctionOfSeedStepIndex) {
  auto docs = some_docs(11, 30, 1000);
  const std::string p = tmp("pure");
  write_megatron(p, docs, {.code = 8});
  DataOptions o;
  o.window = 8;
  o.vocab = 1000;
  DatasetPtr d = open_dataset({p}, o);
  std::vector<int64_t> flat = flatten(docs);
  // One fill of 12 samples equals fills of 3 + 4 + 5 (micro-batches, data-parallel ranks).
  memory::Tensor all_tok = memory::Tensor::empty({12, 8}, memory::DType::i32);
  memory::Tensor all_tgt = memory::Tensor::empty({12, 8}, memory::DType::i32);
  d->fill(5, 3, 0, 12, all_tok, all_tgt);
  std::vector<int32_t> tok = all_tok.to_vector<int32_t>(), tgt = all_tgt.to_vector<int32_t>();
  int64_t first = 0;
  for (int64_t n : {3, 4, 5}) {
    memory::Tensor a = memory::Tensor::empty({n, 8}, memory::DType::i64);
    memory::Tensor b = memory::Tensor::empty({n}, memory::DType::i64);  // next-token targets
    d->fill(5, 3, first, n, a, b);
    auto av = a.to_vector<int64_t>();
    auto bv = b.to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t t = 0; t < 8; ++t)
        EXPECT_EQ(av[size_t(i * 8 + t)], tok[size_t((first + i) * 8 + t)]);
      EXPECT_EQ(bv[size_t(i)], tgt[size_t((first + i) * 8 + 7)]);
    }
    first += n;
  }
  // Each window is the data at its start, and targets are the tokens shifted by one.
  auto* td = dynamic_cast<const TokenDataset*>(d.get());
  ASSERT_NE(td, nullptr);
  for (int64_t i = 0; i < 12; ++i) {
    int64_t s = td->sample_start(5, 3, i);
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(tok[size_t(i * 8 + t)], flat[size_t(s + t)]);
      EXPECT_EQ(tgt[size_t(i * 8 + t)], flat[size_t(s + t + 1)]);
    }
  }
}

TEST(Sampling, WindowsStayInsideDocumentsWhenAsked) {
  auto docs = some_docs(13, 40, 1000);
  const std::string p = tmp("docs");
  write_megatron(p, docs, {.code = 8});
  std::vector<int64_t> starts;
  flatten(docs, &starts);
  auto store = TokenStore::open_megatron(p);
  auto crosses = [&](int64_t s, int64_t len) {
    auto it = std::upper_bound(starts.begin(), starts.end(), s);
    return *it < s + len;  // the next document starts inside [s, s + len)
  };
  TokenDataset inside(store, 10, false), across(store, 10, true);
  int crossing = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    EXPECT_FALSE(crosses(inside.sample_start(1, 0, i), 11)) << i;
    crossing += crosses(across.sample_start(1, 0, i), 11);
  }
  EXPECT_GT(crossing, 100);  // crossing windows are common when allowed
  data_expect_input_error([&] { TokenDataset(store, 100, false); },
                          {p + ".bin", "no document has more than 100"});
}

TEST(Sampling, BlendHoldsItsProportions) {
  // Three flat files of disjoint token ranges, so each window tells where it came from.
  std::vector<std::string> paths;
  for (int k = 0; k < 3; ++k) {
    std::string b;
    for (int i = 0; i < 5000; ++i) put(b, uint16_t(1000 * k + i % 1000));
    paths.push_back(tmp("part" + std::to_string(k) + ".bin"));
    std::ofstream(paths.back(), std::ios::binary) << b;
  }
  DataOptions o;
  o.window = 4;
  o.vocab = 3000;
  for (auto weights : std::vector<std::vector<double>>{{0.7, 0.3}, {0.5, 0.3, 0.2}, {0.95, 0.05}}) {
    std::vector<std::string> args;
    for (size_t k = 0; k < weights.size(); ++k)
      args.push_back(std::to_string(weights[k]) + ":" + paths[k]);
    DatasetPtr d = open_dataset(args, o);
    std::vector<int> count(weights.size(), 0);
    std::vector<int64_t> w(5);
    for (int64_t step = 0; step < 625; ++step)  // 10,000 samples in steps of 16
      for (int64_t i = 0; i < 16; ++i) {
        d->sample(9, step, i, 4, w.data());
        size_t k = size_t(w[0] / 1000);
        EXPECT_EQ(k, size_t(w[4] / 1000));
        ++count[k];
      }
    for (size_t k = 0; k < weights.size(); ++k)
      EXPECT_NEAR(count[k] / 10000.0, weights[k], 0.01) << "dataset " << k;
  }
  // Deterministic: the same (seed, step, index) gives the same window.
  DatasetPtr d = open_dataset({"0.7:" + paths[0], "0.3:" + paths[1]}, o);
  std::vector<int64_t> a(5), b(5);
  d->sample(2, 17, 5, 4, a.data());
  d->sample(2, 17, 5, 4, b.data());
  EXPECT_EQ(a, b);
  data_expect_input_error([&] { open_dataset({paths[0], paths[1]}, o); }, {"--data", "weight"});
  data_expect_input_error([&] { open_dataset({"-1:" + paths[0]}, o); },
                          {"--data", "positive weight"});
}

TEST(Sampling, HeldOutSplitKeepsWholeDocuments) {
  auto docs = some_docs(17, 20, 1000);
  const std::string p = tmp("split");
  write_megatron(p, docs, {.code = 8});
  std::vector<int64_t> starts;
  flatten(docs, &starts);
  DataOptions o;
  o.window = 4;
  DatasetPtr d = open_dataset({p}, o);
  auto [train, eval] = d->split(0.1);
  EXPECT_EQ(eval->num_documents(), 2);
  EXPECT_EQ(train->num_documents(), 18);
  EXPECT_EQ(train->num_tokens() + eval->num_tokens(), d->num_tokens());
  EXPECT_EQ(train->num_tokens(), starts[18]);
  auto* te = dynamic_cast<const TokenDataset*>(eval.get());
  for (int64_t i = 0; i < 200; ++i) EXPECT_GE(te->sample_start(1, 0, i), starts[18]);
  // A one-document file splits its tokens.
  auto text = std::make_shared<ByteDataset>(std::string(1000, 'x'), "x.txt", 4);
  auto [a, b] = text->split(0.25);
  EXPECT_EQ(a->num_tokens(), 750);
  EXPECT_EQ(b->num_tokens(), 250);
}

// A held-out or training part too small for a window is named as the part, with its
// size and the file's (the message had blamed the whole file's "10 bytes of data").
TEST(Sampling, TooSmallSplitPartNamesThePart) {
  ByteDataset text(std::string(100, 'x'), "small.txt", 16);
  data_expect_input_error(
      [&] { text.split(0.1); },
      {"small.txt: the held-out part made by --eval-fraction 0.1",
       "positions 90..100 of the file's 100 bytes", "10 bytes of data", "at least 17"});
  const std::string p = tmp("tail_short");
  std::vector<Doc> docs;
  for (int i = 0; i < 7; ++i) docs.push_back({{std::vector<double>(i < 5 ? 50 : 10, 1.0)}});
  write_megatron(p, docs, {.code = 8});
  DataOptions o;
  o.window = 16;
  o.cross_documents = false;
  DatasetPtr d = open_dataset({p}, o);
  data_expect_input_error([&] { d->split(0.2); },
                          {p + ".bin: the held-out part made by --eval-fraction 0.2 (document "
                               "6, positions 260..270 of the file's 270 tokens)",
                           "no document has more than 16 tokens"});
}

// The evaluation's windows are read into memory at the start: the held-out file truncated
// in place afterwards (a tool rewriting it with "wb") had killed the run with SIGBUS at the
// next evaluation; the held windows are the file's as they were, and others are still read.
TEST(Sampling, HeldEvaluationWindowsOutliveTheFile) {
  auto docs = some_docs(5, 20, 1000);
  const std::string p = tmp("held");
  write_megatron(p, docs, {.code = 8});
  DataOptions o;
  o.window = 8;
  o.vocab = 1000;
  DatasetPtr d = open_dataset({p}, o);
  auto fill = [](const Dataset& data, uint64_t seed, int64_t step, int64_t first, int64_t n) {
    memory::Tensor tok = memory::Tensor::empty({n, 8}, memory::DType::i64);
    memory::Tensor tgt = memory::Tensor::empty({n, 8}, memory::DType::i64);
    data.fill(seed, step, first, n, tok, tgt);
    std::vector<int64_t> v = tok.to_vector<int64_t>(), t = tgt.to_vector<int64_t>();
    v.insert(v.end(), t.begin(), t.end());
    return v;
  };
  const uint64_t seed = evaluation_seed(3);
  // Each held batch whole, and samples 2..4 alone (a replica's or micro-batch's share).
  std::vector<std::vector<int64_t>> want, part;
  for (int64_t k = 0; k < 2; ++k) {
    want.push_back(fill(*d, seed, k, 0, 6));
    part.push_back(fill(*d, seed, k, 2, 3));
  }
  const std::vector<int64_t> other = fill(*d, seed, 2, 0, 6);  // batch 2: not held
  DatasetPtr held = hold_evaluation_windows(d, 3, 2, 6, 8);
  EXPECT_EQ(held->describe(), d->describe());
  EXPECT_EQ(held->to_json(), d->to_json());
  EXPECT_EQ(fill(*held, seed, 2, 0, 6), other);
  std::filesystem::resize_file(p + ".bin", 0);
  for (int64_t k = 0; k < 2; ++k) {
    EXPECT_EQ(fill(*held, seed, k, 0, 6), want[size_t(k)]) << "batch " << k;
    EXPECT_EQ(fill(*held, seed, k, 2, 3), part[size_t(k)]) << "batch " << k;
  }
}

// More held windows than memory sensibly holds are refused naming --eval-batches: the count
// had wrapped past 2^64 (a few tokens allocated, the loop writing past them: heap
// corruption) or had been std::bad_alloc, exit 1.
TEST(Sampling, TooManyHeldEvaluationWindowsAreRefused) {
  auto d = std::make_shared<ByteDataset>(std::string(100, 'a'), "a.txt", 63);
  data_expect_input_error([&] { hold_evaluation_windows(d, 3, 144115188075855873, 2, 63); },
                          {"--eval-batches 144115188075855873: expected at most 1073741824 "
                           "held-out tokens",
                           "144115188075855873 batches x 2 samples (the global batch) x 64 "
                           "tokens (the context 63 + 1), 7.38e+19 bytes"});
  data_expect_input_error([&] { hold_evaluation_windows(d, 3, 2000000000, 2, 63); },
                          {"--eval-batches 2000000000", "1.02e+12 bytes"});
  data_expect_input_error(
      [&] { hold_evaluation_windows(d, 3, 1, int64_t(1) << 40, int64_t(1) << 40); },
      {"--eval-batches 1", "the global batch"});
  // A set within the bound is held.
  EXPECT_EQ(hold_evaluation_windows(d, 3, 1, 2, 63)->describe(), d->describe());
}

// Weights whose sum overflows: each share is still its weight's (all had been 0, every
// sample from the last dataset).
TEST(Sampling, HugeBlendWeightsKeepTheirShares) {
  auto a = std::make_shared<ByteDataset>(std::string(100, 'a'), "a.txt", 4);
  auto b = std::make_shared<ByteDataset>(std::string(100, 'b'), "b.txt", 4);
  BlendedDataset blend({1e308, 1e308}, {a, b});
  EXPECT_DOUBLE_EQ(blend.weights()[0], 0.5);
  EXPECT_DOUBLE_EQ(blend.weights()[1], 0.5);
  int from_a = 0;
  for (int64_t i = 0; i < 1000; ++i) from_a += blend.choose(1, 0, i) == 0;
  EXPECT_NEAR(from_a, 500, 10);
}

TEST(TextData, FifoAndDirectoryAreRefused) {
  // Opening a FIFO had blocked for ever, waiting for a writer.
  const std::string fifo = tmp("fifo");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  data_expect_input_error([&] { open_token_store(fifo, "auto", ""); },
                          {fifo + ": cannot open file (not a regular file: a FIFO)"});
  data_expect_input_error([&] { open_token_store(::testing::TempDir(), "text", ""); },
                          {"not a regular file: a directory"});
}

TEST(Megatron, WriterRefusesADirectoryAndKeepsTheEarlierPair) {
  const std::string p = tmp("dir_out");
  fs::remove_all(p + ".bin");
  fs::remove_all(p + ".idx");
  fs::create_directories(p + ".bin");
  data_expect_input_error([&] { IndexedDatasetWriter w(p, TokenType::u16); },
                          {p + ".bin: a directory"});
  fs::remove_all(p + ".bin");
  {
    IndexedDatasetWriter w(p, TokenType::u16);
    w.add_document({1, 2, 3});
    w.finish();
  }
  // The .bin becomes a directory after the writer checked: the rename fails, and the
  // earlier index stays (it had been removed first).
  IndexedDatasetWriter w(p, TokenType::u16);
  w.add_document({4, 5});
  fs::remove(p + ".bin");
  fs::create_directories(p + ".bin/x");
  EXPECT_THROW(w.finish(), RuntimeError);
  EXPECT_TRUE(fs::is_regular_file(p + ".idx"));
  EXPECT_FALSE(fs::exists(p + ".idx.tmp"));
  EXPECT_FALSE(fs::exists(p + ".idx.old"));
  fs::remove_all(p + ".bin");
}

// A PREFIX.idx.old that is a directory had been found after all the work, by the rename
// that sets the earlier index aside (exit 1): refused up front, as the other names are.
TEST(Megatron, WriterRefusesADirectoryAsTheSetAsideIndex) {
  const std::string p = tmp("old_dir");
  fs::remove_all(p + ".idx.old");
  fs::create_directories(p + ".idx.old/sub");
  data_expect_input_error([&] { IndexedDatasetWriter w(p, TokenType::u16); },
                          {p + ".idx.old: a directory"});
  fs::remove_all(p + ".idx.old");
}

// A write interrupted between its renames leaves PREFIX.bin with PREFIX.idx.old and
// PREFIX.idx.tmp but no PREFIX.idx: it had been read as flat uint16 tokens. Refused,
// saying what happened; the next write completes the pair and leaves no .idx.old.
TEST(Megatron, AnInterruptedWriteIsRefusedAndTheNextOneCleansUp) {
  const std::string p = tmp("interrupted");
  for (const char* ext : {".bin", ".idx", ".idx.tmp", ".idx.old"}) fs::remove(p + ext);
  {
    IndexedDatasetWriter w(p, TokenType::u16);
    w.add_document({1, 2, 3});
    w.finish();
  }
  // The state between the second and the third rename.
  fs::rename(p + ".idx", p + ".idx.old");
  fs::copy_file(p + ".idx.old", p + ".idx.tmp");
  for (const std::string& path : {p, p + ".bin"})
    for (const char* format : {"auto", "megatron"})
      data_expect_input_error([&] { open_token_store(path, format, ""); },
                              {path + ": " + p + ".idx.tmp is there but " + p + ".idx is not",
                               "interrupted", "--data-format tokens"});
  fs::remove(p + ".idx.tmp");  // only the set-aside index: the same
  data_expect_input_error([&] { open_token_store(p + ".bin", "auto", ""); },
                          {p + ".idx.old is there but " + p + ".idx is not"});
  EXPECT_EQ(open_token_store(p + ".bin", "tokens", "")->num_tokens(), 3);  // when asked
  {
    IndexedDatasetWriter w(p, TokenType::u16);
    w.add_document({4, 5});
    w.finish();
  }
  EXPECT_FALSE(fs::exists(p + ".idx.old"));
  EXPECT_EQ(read_all(*open_token_store(p, "auto", "")), (std::vector<int64_t>{4, 5}));
}

TEST(Data, EvalFractionOutsideTheShareIsRefused) {
  for (double f : {-0.1, 1.0, 1.5, std::nan("")})
    data_expect_input_error([&] { check_eval_fraction(f); }, {"--eval-fraction"});
  check_eval_fraction(0);  // the default: none
  check_eval_fraction(0.25);
}

// A token model's inputs as the token data fills them: tokens and targets of one dtype
// (i32 tokens with i64 targets had failed an internal check at the first step), and the
// targets what the loss reads (a cross_entropy reading the tokens, with targets [] unread,
// had been scaled by the targets' count: its loss T times too large).
TEST(Data, TokenModelInputsMatchTheData) {
  auto model = [](const std::string& targets, const std::string& ce_targets) {
    return load_model_json(memory::parse_json_text(R"({"type": "graph",
      "inputs": [{"name": "tokens", "shape": [4], "dtype": "i32"},
                 {"name": "targets", )" + targets + R"(}],
      "params": [{"name": "emb", "shape": [8, 6], "init": {"type": "normal", "std": 0.5}}],
      "layers": [{"name": "l", "nodes": [
        {"op": "embedding", "inputs": ["tokens"], "outputs": ["e"], "params": {"weight": "emb"}},
        {"op": "cross_entropy", "inputs": ["e", ")" + ce_targets +
                                                       R"("], "outputs": ["loss"]}]}],
      "loss": "loss"})",
                                                   "m.json"),
                           "m.json");
  };
  EXPECT_EQ(token_vocabulary(model(R"("shape": [4], "dtype": "i32")", "targets"), "m.json"), 6);
  data_expect_input_error(
      [&] { token_vocabulary(model(R"("shape": [4], "dtype": "i64")", "targets"), "m.json"); },
      {"m.json: $.inputs", "of one integer type",
       "found tokens i32[batch, 4] and targets "
       "i64[batch, 4]"});
  data_expect_input_error(
      [&] { token_vocabulary(model(R"("shape": [], "dtype": "i32")", "tokens"), "m.json"); },
      {"m.json: $.layers[0].nodes[1].inputs[1]", "expected the model input 'targets'",
       "found 'tokens'"});
}

// Other inputs than the token data's are named with their types (the message had given
// only their count, "found 2 input(s)").
TEST(Data, TokenDataNamesAModelsOtherInputs) {
  Graph g = load_model_json(memory::parse_json_text(R"({"type": "graph",
      "inputs": [{"name": "tokens", "shape": [4], "dtype": "i32"},
                 {"name": "labels", "shape": [4], "dtype": "i32"}],
      "params": [{"name": "emb", "shape": [8, 6], "init": {"type": "normal", "std": 0.5}}],
      "layers": [{"name": "l", "nodes": [
        {"op": "embedding", "inputs": ["tokens"], "outputs": ["e"], "params": {"weight": "emb"}},
        {"op": "cross_entropy", "inputs": ["e", "labels"], "outputs": ["loss"]}]}],
      "loss": "loss"})",
                                                    "m.json"),
                            "m.json");
  data_expect_input_error([&] { token_vocabulary(g, "m.json"); },
                          {"m.json: $.inputs: expected exactly the inputs 'tokens' and 'targets'",
                           "found 2 inputs: 'tokens' i32[batch, 4], 'labels' i32[batch, 4]"});
}

// An embedding with a vocab_offset covers ids [offset, offset + rows): the vocabulary is
// where it ends (its rows alone had refused the ids past them, under a whole table beside).
TEST(Data, VocabularyCountsAnEmbeddingsOffset) {
  Graph g = load_model_json(memory::parse_json_text(R"({"type": "graph",
      "inputs": [{"name": "tokens", "shape": [4], "dtype": "i32"},
                 {"name": "targets", "shape": [4], "dtype": "i32"}],
      "params": [{"name": "a", "shape": [240, 6], "init": {"type": "normal", "std": 0.5}},
                 {"name": "b", "shape": [60, 6], "init": {"type": "normal", "std": 0.5}},
                 {"name": "w", "shape": [240, 6], "init": {"type": "normal", "std": 0.5}}],
      "layers": [{"name": "l", "nodes": [
        {"op": "embedding", "inputs": ["tokens"], "outputs": ["ea"], "params": {"weight": "a"}},
        {"op": "embedding", "inputs": ["tokens"], "outputs": ["eb"], "params": {"weight": "b"},
         "attrs": {"vocab_offset": 30}},
        {"op": "add", "inputs": ["ea", "eb"], "outputs": ["x"]},
        {"op": "linear", "inputs": ["x"], "outputs": ["logits"], "params": {"weight": "w"}},
        {"op": "cross_entropy", "inputs": ["logits", "targets"], "outputs": ["loss"]}]}],
      "loss": "loss"})",
                                                    "m.json"),
                            "m.json");
  EXPECT_EQ(token_vocabulary(g, "m.json"), 90);
}

TEST(TextData, TooShortNamesTheFile) {
  data_expect_input_error([] { ByteDataset(std::string("short"), "small.txt", 16); },
                          {"small.txt: 5 bytes of data", "at least 17"});
}

// ---- a mapped file truncated while the run reads it ----

// Three pages of bytes, so a read near the end lies pages past a truncation to 0.
std::string three_pages(const std::string& name) {
  const std::string path = tmp(name);
  std::ofstream(path, std::ios::binary) << std::string(size_t(3 * ::sysconf(_SC_PAGESIZE)), 'x');
  return path;
}

// A path inside a POSIX extended regular expression, as gtest's death tests read one.
std::string ere_quote(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (std::strchr(".[]()*+?{}|^$\\", c) != nullptr) r += '\\';
    r += c;
  }
  return r;
}

// Truncated in place (as a tool that rewrites it with "wb" does), the mapping's pages past
// the new end raise SIGBUS on a read: the run ends with exit 1 and a line naming the file,
// not a bus error. The registration follows the mapping through a move.
TEST(MappedFileDeathTest, ATruncatedFileIsNamedAndExitsOne) {
  const std::string path = three_pages("shrinks.bin");
  const std::string size = std::to_string(3 * ::sysconf(_SC_PAGESIZE));
  EXPECT_EXIT(
      {
        MappedFile held(path);
        MappedFile f = std::move(held);
        if (::truncate(path.c_str(), 0) != 0) std::_Exit(5);
        volatile unsigned char c = f.data()[f.size() - 1];
        (void)c;
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(1),
      "^baton: failed: " + ere_quote(path) + " shrank while it was mapped \\(was " + size +
          " bytes, now 0\\): a file given to baton must not be rewritten while the run reads "
          "it; resume from the last checkpoint");
}

// The same through the token store `baton train --data` reads.
TEST(MappedFileDeathTest, ATruncatedDatasetIsNamed) {
  const std::string path = three_pages("shrinks.txt");
  EXPECT_EXIT(
      {
        auto store = open_token_store(path, "text", "");
        if (::truncate(path.c_str(), 0) != 0) std::_Exit(5);
        int64_t token = 0;
        store->read(store->num_tokens() - 1, 1, &token);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(1), ere_quote(path) + " shrank while it was mapped");
}

void previous_bus_handler(int, siginfo_t*, void*) {
  const char msg[] = "the previous SIGBUS handler ran\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
  ::_exit(3);
}

// A SIGBUS outside baton's mappings (here a mapping of its own, at an address a released
// MappedFile may have held) goes on to the handler installed before baton's (UCX's, in
// the command). A fresh process ("threadsafe"), so that handler comes first.
TEST(MappedFileDeathTest, AFaultOutsideTheMappingsGoesToThePreviousHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string mine = three_pages("mapped.bin"), other = three_pages("unregistered.bin");
  EXPECT_EXIT(
      {
        struct sigaction sa {};
        sa.sa_sigaction = previous_bus_handler;
        sa.sa_flags = SA_SIGINFO;
        ::sigemptyset(&sa.sa_mask);
        ::sigaction(SIGBUS, &sa, nullptr);
        MappedFile held(mine);
        { MappedFile released(other); }
        struct sigaction now {};
        ::sigaction(SIGBUS, nullptr, &now);
        if (now.sa_sigaction == previous_bus_handler) std::_Exit(4);  // baton's is not installed
        const size_t size = held.size();
        const int fd = ::open(other.c_str(), O_RDONLY);
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED || ::truncate(other.c_str(), 0) != 0) std::_Exit(5);
        volatile unsigned char c = static_cast<const unsigned char*>(p)[size - 1];
        (void)c;
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3), "the previous SIGBUS handler ran");
  GTEST_FLAG_SET(death_test_style, "fast");
}

// A SentencePiece model is checked before the library (0.1.x) reads it, as 0.2.x checks
// it: a precompiled_charsmap whose trie leads outside itself or whose values lie outside
// its normalized strings (the library had read past the model: a tokenization that
// differed from run to run), and a piece with a NUL byte, are refused naming the file.
TEST(SentencePieceModel, CorruptModelsAreRefused) {
  using namespace testing;
  const std::string path = "sp.model";
  const std::string pieces = sp_piece("<unk>") + sp_piece("A") + sp_piece("b");
  auto error_of = [&](const std::string& bytes) {
    try {
      check_sentencepiece_model(bytes, path);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string good = sp_normalizer(sp_charsmap(0, std::string("b\0", 2)));
  EXPECT_EQ(error_of(pieces + good), "");
  EXPECT_EQ(error_of(pieces), "");  // no charsmap: the identity normalizer
  EXPECT_EQ(error_of(pieces + sp_normalizer(sp_charsmap(0, std::string("b\0", 2)), 5)), "");
  const std::string prefix = path + ": not a SentencePiece model: ";
  // The normalized strings cut (to none, or before the value's string ends).
  EXPECT_EQ(error_of(pieces + sp_normalizer(sp_charsmap(0, ""))),
            prefix +
                "the normalizer's precompiled_charsmap is invalid: trie value 0 lies "
                "outside its 0 bytes of normalized strings");
  EXPECT_NE(error_of(pieces + sp_normalizer(sp_charsmap(0, "b"))).find("trie value 0 lies outside"),
            std::string::npos);
  EXPECT_NE(error_of(pieces + sp_normalizer(sp_charsmap(5, std::string("b\0", 2))))
                .find("trie value 5 lies outside its 2 bytes"),
            std::string::npos);
  // The denormalizer's map is read as well.
  EXPECT_EQ(error_of(pieces + sp_normalizer(sp_charsmap(0, ""), 5)),
            prefix +
                "the denormalizer's precompiled_charsmap is invalid: trie value 0 lies "
                "outside its 0 bytes of normalized strings");
  // The trie itself leads outside: the root's children beyond its 512 units.
  EXPECT_EQ(error_of(pieces + sp_normalizer(sp_charsmap(0, std::string("b\0", 2), 4096))),
            prefix +
                "the normalizer's precompiled_charsmap is invalid: trie unit 0 leads to "
                "unit 4096, outside its 512 units");
  // A trie size beyond the map, and a map too short for one.
  EXPECT_EQ(error_of(pieces + sp_normalizer(le32_bytes(4000) + std::string(8, '\0'))),
            prefix +
                "the normalizer's precompiled_charsmap: its trie of 4000 bytes runs past "
                "its 12 bytes");
  EXPECT_EQ(error_of(pieces + sp_normalizer("abc")),
            prefix +
                "the normalizer's precompiled_charsmap is 3 bytes, expected a 4-byte trie "
                "size and the trie");
  // A message given twice is merged: the last charsmap is the one the library uses.
  EXPECT_NE(error_of(pieces + good + sp_normalizer(sp_charsmap(0, ""))), "");
  EXPECT_EQ(error_of(pieces + sp_normalizer(sp_charsmap(0, "")) + good), "");
  // Pieces: none empty, none with a NUL byte.
  EXPECT_EQ(error_of(pieces + sp_piece(std::string("a\0b", 3)) + good),
            prefix + "piece 3 holds a NUL byte");
  EXPECT_EQ(error_of(sp_piece("") + good), prefix + "piece 0 is empty");
  // Not protobuf at all: a cut field.
  EXPECT_EQ(error_of(pieces.substr(0, pieces.size() - 2)),
            prefix + "malformed protobuf encoding at byte " + std::to_string(pieces.size() - 10));
}

}  // namespace
}  // namespace baton::stages
