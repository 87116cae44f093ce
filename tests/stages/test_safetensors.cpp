// safetensors: a round trip, block reads, and every kind of truncated or lying file is an
// InputError with an exact message (never a crash: these also run under ASan).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "stages/safetensors.h"

namespace baton::stages {
namespace {

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t length_override = -1) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t n = length_override >= 0 ? uint64_t(length_override) : header.size();
  for (int i = 0; i < 8; ++i) f.put(char((n >> (8 * i)) & 0xff));
  f << header << data;
}

std::string safetensors_error_of(const std::string& path) {
  try {
    SafetensorsReader r(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void safetensors_expect_error(const std::string& name, const std::string& header,
                              const std::string& data, std::initializer_list<std::string> parts,
                              int64_t length_override = -1) {
  std::string path = temp(name);
  write_raw(path, header, data, length_override);
  std::string msg = safetensors_error_of(path);
  ASSERT_FALSE(msg.empty()) << name << " was accepted";
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << msg << "\n  lacks: " << p;
}

TEST(Safetensors, RoundTrip) {
  std::string path = temp("rt.safetensors");
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<double>({-1.5, 2.25}, {2});
  Tensor c = Tensor::from_vector<int64_t>({7, 8, 9}, {3});
  Tensor d = Tensor::from_vector<float>({0.5f, -2.0f}, {2}).to(DType::bf16);
  Tensor e = Tensor::zeros({0, 4});
  write_safetensors(path, {{"a", a.transpose(0, 1)}, {"b", b}, {"c", c}, {"d", d}, {"e", e}},
                    {{"format", "pt"}});
  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.entries().size(), 5u);
  EXPECT_EQ(r.read("a").shape(), (memory::Shape{3, 2}));
  EXPECT_EQ(r.read("a").to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(r.read("b").to_vector<double>(), (std::vector<double>{-1.5, 2.25}));
  EXPECT_EQ(r.read("c").to_vector<int64_t>(), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(r.read("d").to(DType::f32).to_vector<float>(), (std::vector<float>{0.5f, -2.0f}));
  EXPECT_EQ(r.read("e").numel(), 0);
  EXPECT_THROW(r.read("zzz"), InputError);
  // The data starts 8-byte aligned.
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

TEST(Safetensors, ReadBlock) {
  std::string path = temp("block.safetensors");
  std::vector<float> v(4 * 5 * 6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  write_safetensors(path, {{"t", Tensor::from_vector(v, {4, 5, 6})}});
  SafetensorsReader r(path);
  const SafetensorsEntry& e = *r.find("t");
  Tensor out = Tensor::empty({2, 3, 6});  // rows 1-2, columns 2-4, whole last dimension
  r.read_block(e, {1, 2, 0}, out);
  std::vector<float> got = out.to_vector<float>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 6; ++k)
        EXPECT_EQ(got[size_t((i * 3 + j) * 6 + k)], float(((1 + i) * 5 + 2 + j) * 6 + k));
  Tensor col = Tensor::empty({4, 5, 1});
  r.read_block(e, {0, 0, 5}, col);
  EXPECT_EQ(col.to_vector<float>()[7], float(7 * 6 + 5));
}

TEST(Safetensors, TruncatedFiles) {
  safetensors_expect_error("empty.safetensors", "", "", {"does not start with '{'"});
  {
    std::string path = temp("tiny.safetensors");
    std::ofstream(path, std::ios::binary) << "abc";
    std::string msg = safetensors_error_of(path);
    EXPECT_NE(msg.find("truncated safetensors file: 3 bytes"), std::string::npos) << msg;
  }
  safetensors_expect_error("len.safetensors",
                           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "",
                           {"header length 1000 bytes runs past the end of the file"}, 1000);
  safetensors_expect_error(
      "data.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
      std::string(8, '\0'), {"tensor 'a'", "[0, 16) run past the end of the data (8 bytes)"});
  EXPECT_NE(safetensors_error_of("/nonexistent.safetensors").find("cannot open"),
            std::string::npos);
}

TEST(Safetensors, LyingHeaders) {
  std::string d8(8, '\0');
  safetensors_expect_error("huge.safetensors", "{}", "", {"above the 100 MB limit"},
                           int64_t(1) << 40);
  safetensors_expect_error("notjson.safetensors", "{not json", "", {"not valid JSON"});
  safetensors_expect_error("brace.safetensors", "[1,2]", "", {"does not start with '{'"});
  // The format pads a header with spaces; a NUL (where nlohmann's lexer stopped reading,
  // so the header had been taken) is refused, as the safetensors library refuses it.
  safetensors_expect_error(
      "nul.safetensors",
      std::string(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") +
          std::string("\0  ", 3),
      std::string(4, '\0'), {"(safetensors header): not valid JSON: a NUL byte at byte offset 54"});
  safetensors_expect_error(
      "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      d8, {"overlaps tensor"});
  safetensors_expect_error("gap.safetensors",
                           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8,
                           {"4 bytes before tensor 'a'", "belong to no tensor"});
  safetensors_expect_error("trailing.safetensors",
                           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8,
                           {"4 bytes after the last tensor"});
  safetensors_expect_error("size.safetensors",
                           R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", d8,
                           {"F64 [2] needs 16 bytes but data_offsets span 8"});
  safetensors_expect_error("dtype.safetensors",
                           R"({"a":{"dtype":"F42","shape":[2],"data_offsets":[0,8]}})", d8,
                           {"$.a.dtype", "expected a safetensors dtype", "found \"F42\""});
  safetensors_expect_error("reversed.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8,
                           {"$.a.data_offsets", "begin <= end"});
  safetensors_expect_error("field.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})",
                           d8, {"$.a.extra", "unknown field"});
  safetensors_expect_error("shape.safetensors",
                           R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8,
                           {"$.a.shape[0]"});
  safetensors_expect_error(
      "meta.safetensors",
      R"({"__metadata__":{"k":3},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8,
      {"$.__metadata__.k", "expected a string"});
  safetensors_expect_error("offsets.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8,
                           {"$.a.data_offsets", "[begin, end]"});
}

// Shapes and offsets are integers written in digits: a whole float (256.0, 8e0) had been
// taken, where the safetensors library refuses it ("expected usize").
TEST(Safetensors, WholeFloatsInShapesAndOffsetsAreRefused) {
  std::string d8(8, '\0');
  safetensors_expect_error(
      "shape_float.safetensors", R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8,
      {"$.a.shape[0]: expected an integer >= 0 (no '.' nor exponent), found 2.0"});
  safetensors_expect_error("begin_float.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8]}})", d8,
                           {"$.a.data_offsets[0]: expected an integer >= 0"});
  safetensors_expect_error("end_exp.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8e0]}})", d8,
                           {"$.a.data_offsets[1]: expected an integer >= 0"});
}

TEST(Safetensors, UnsupportedDtypeIsAnErrorOnRead) {
  std::string path = temp("u8.safetensors");
  write_raw(path, R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", std::string(8, '\1'));
  SafetensorsReader r(path);
  try {
    r.read("a");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("dtype U8, which baton cannot load"), std::string::npos);
  }
}

}  // namespace
}  // namespace baton::stages
