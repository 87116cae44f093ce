#include "stages/data.h"

#include "memory/error.h"
#include "stages/json_reader.h"

namespace baton::stages {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <class T>
void fill_typed(const std::string& bytes, const std::vector<int64_t>& starts, int64_t window,
                memory::Tensor& tokens, memory::Tensor& targets) {
  T* tok = tokens.data<T>();
  T* tgt = targets.data<T>();
  bool per_position = targets.dim() == 2;
  for (size_t s = 0; s < starts.size(); ++s) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data()) + starts[s];
    for (int64_t t = 0; t < window; ++t) tok[int64_t(s) * window + t] = T(p[t]);
    if (per_position)
      for (int64_t t = 0; t < window; ++t) tgt[int64_t(s) * window + t] = T(p[t + 1]);
    else
      tgt[s] = T(p[window]);
  }
}

}  // namespace

ByteDataset::ByteDataset(const std::string& path, int64_t min_window)
    : path_(path), bytes_(read_text_file(path)) {
  if (int64_t(bytes_.size()) < min_window + 1)
    throw InputError(path + ": " + std::to_string(bytes_.size()) +
                     " bytes of data, expected at least " + std::to_string(min_window + 1) +
                     " (one window of " + std::to_string(min_window) + " tokens and its target)");
}

ByteDataset::ByteDataset(std::string bytes, std::string name)
    : path_(std::move(name)), bytes_(std::move(bytes)) {}

int64_t ByteDataset::sample_start(uint64_t seed, int64_t step, int64_t index,
                                  int64_t window) const {
  int64_t positions = size() - window;  // starts leaving room for the window and its target
  BATON_CHECK(positions > 0, "dataset shorter than a window");
  uint64_t h = mix(mix(seed ^ 0x5DEECE66Dull) ^ mix(uint64_t(step) + 0x9E3779B97F4A7C15ull) ^
                   (uint64_t(index) * 0xD1B54A32D192ED03ull));
  return int64_t(h % uint64_t(positions));
}

void ByteDataset::fill(uint64_t seed, int64_t step, int64_t first, int64_t n,
                       memory::Tensor& tokens, memory::Tensor& targets) const {
  BATON_CHECK(tokens.dim() == 2 && tokens.size(0) == n, "tokens must be [n, T]");
  int64_t window = tokens.size(1);
  BATON_CHECK((targets.dim() == 2 && targets.size(0) == n && targets.size(1) == window) ||
                  (targets.dim() == 1 && targets.size(0) == n),
              "targets must be [n, T] or [n]");
  BATON_CHECK(tokens.dtype() == targets.dtype(), "tokens and targets of one dtype");
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < n; ++i) starts.push_back(sample_start(seed, step, first + i, window));
  if (tokens.dtype() == memory::DType::i32)
    fill_typed<int32_t>(bytes_, starts, window, tokens, targets);
  else if (tokens.dtype() == memory::DType::i64)
    fill_typed<int64_t>(bytes_, starts, window, tokens, targets);
  else
    BATON_CHECK(false, "token ids must be i32 or i64");
}

}  // namespace baton::stages
