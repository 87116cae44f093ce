#include "stages/data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <tuple>

#include "memory/error.h"
#include "stages/graph.h"
#include "stages/json_reader.h"
#include "stages/op.h"

namespace baton::stages {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The hash every sample position comes from (the byte-level loader's since the start, so
// a text file's samples are unchanged).
uint64_t sample_hash(uint64_t seed, int64_t step, int64_t index) {
  return mix(mix(seed ^ 0x5DEECE66Dull) ^ mix(uint64_t(step) + 0x9E3779B97F4A7C15ull) ^
             (uint64_t(index) * 0xD1B54A32D192ED03ull));
}

template <class T>
void fill_typed(const std::vector<int64_t>& w, int64_t n, int64_t window, memory::Tensor& tokens,
                memory::Tensor& targets) {
  T* tok = tokens.data<T>();
  T* tgt = targets.data<T>();
  const bool per_position = targets.dim() == 2;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t* p = w.data() + s * (window + 1);
    for (int64_t t = 0; t < window; ++t) tok[s * window + t] = T(p[t]);
    if (per_position)
      for (int64_t t = 0; t < window; ++t) tgt[s * window + t] = T(p[t + 1]);
    else
      tgt[s] = T(p[window]);
  }
}

std::string count_str(int64_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

// ---- Dataset ----

void Dataset::fill(uint64_t seed, int64_t step, int64_t first, int64_t n, memory::Tensor& tokens,
                   memory::Tensor& targets) const {
  BATON_CHECK(tokens.dim() == 2 && tokens.size(0) == n, "tokens must be [n, T]");
  const int64_t window = tokens.size(1);
  BATON_CHECK((targets.dim() == 2 && targets.size(0) == n && targets.size(1) == window) ||
                  (targets.dim() == 1 && targets.size(0) == n),
              "targets must be [n, T] or [n]");
  BATON_CHECK(tokens.dtype() == targets.dtype(), "tokens and targets of one dtype");
  std::vector<int64_t> w(size_t(n * (window + 1)));
  for (int64_t i = 0; i < n; ++i)
    sample(seed, step, first + i, window, w.data() + i * (window + 1));
  if (tokens.dtype() == memory::DType::i32)
    fill_typed<int32_t>(w, n, window, tokens, targets);
  else if (tokens.dtype() == memory::DType::i64)
    fill_typed<int64_t>(w, n, window, tokens, targets);
  else
    BATON_CHECK(false, "token ids must be i32 or i64");
}

// ---- TokenDataset ----

TokenDataset::TokenDataset(std::shared_ptr<const TokenStore> store, int64_t window,
                           bool cross_documents, int64_t vocab)
    : TokenDataset(store, 0, store->num_tokens(), window, cross_documents, vocab) {}

TokenDataset::TokenDataset(std::shared_ptr<const TokenStore> store, int64_t begin, int64_t end,
                           int64_t window, bool cross_documents, int64_t vocab,
                           const std::string& part)
    : store_(std::move(store)),
      begin_(begin),
      end_(end),
      window_(window),
      cross_(cross_documents),
      vocab_(vocab) {
  BATON_CHECK(0 <= begin_ && begin_ <= end_ && end_ <= store_->num_tokens(), "range of the store");
  const std::string unit = store_->format() == "text" ? "byte" : "token";
  const std::string subject = store_->name() + (part.empty() ? "" : ": " + part);
  if (cross_) {
    if (end_ - begin_ < window_ + 1)
      throw InputError(subject + ": " + count_str(end_ - begin_, unit) +
                       " of data, expected at least " + std::to_string(window_ + 1) +
                       " (one window of " + std::to_string(window_) + " tokens and its target)");
    return;
  }
  // Windows inside one document: each document of more than T tokens offers len - T
  // starts; a sample draws one of all of them uniformly.
  const auto& ds = store_->document_starts();
  int64_t total = 0;
  cum_starts_.push_back(0);
  for (size_t d = 0; d + 1 < ds.size(); ++d) {
    const int64_t lo = std::max(begin_, ds[d]), hi = std::min(end_, ds[d + 1]);
    if (hi - lo <= window_) continue;
    total += hi - lo - window_;
    doc_begin_.push_back(lo);
    cum_starts_.push_back(total);
  }
  if (total == 0)
    throw InputError(subject + ": no document has more than " + std::to_string(window_) +
                     " tokens (one window and its target) and --no-cross-documents keeps windows "
                     "inside one document");
}

int64_t TokenDataset::num_documents() const {
  const auto& ds = store_->document_starts();
  auto lo = std::upper_bound(ds.begin(), ds.end(), begin_) - 1;
  auto hi = std::lower_bound(ds.begin(), ds.end(), end_);
  return std::max<int64_t>(1, int64_t(hi - lo));
}

int64_t TokenDataset::sample_start(uint64_t seed, int64_t step, int64_t index) const {
  const uint64_t h = sample_hash(seed, step, index);
  if (cross_) return begin_ + int64_t(h % uint64_t(end_ - begin_ - window_));
  const int64_t r = int64_t(h % uint64_t(cum_starts_.back()));
  const size_t d =
      size_t(std::upper_bound(cum_starts_.begin(), cum_starts_.end(), r) - cum_starts_.begin()) - 1;
  return doc_begin_[d] + (r - cum_starts_[d]);
}

void TokenDataset::sample(uint64_t seed, int64_t step, int64_t index, int64_t window,
                          int64_t* out) const {
  BATON_CHECK(window == window_, "a window other than the dataset's");
  try {
    store_->read(sample_start(seed, step, index), window + 1, out);
  } catch (const InputError&) {
    // A float store's value that is no token id: under a vocabulary, the error is the
    // whole scan's too (the file's first bad token), not this window's.
    if (vocab_ > 0) store_->check_vocabulary(vocab_);
    throw;
  }
  if (vocab_ <= 0) return;
  for (int64_t t = 0; t <= window; ++t)
    if (out[t] < 0 || out[t] >= vocab_) {
      // The error the whole scan gives (the file's first bad token), whichever finds it
      // first: a rare path, worth one scan.
      store_->check_vocabulary(vocab_);
      BATON_CHECK(false, "a token outside the vocabulary that the scan did not find");
    }
}

std::string TokenDataset::describe() const {
  std::string s = store_->name() + " (" + store_->format();
  if (store_->format() != "text") s += " " + token_type_name(store_->type());
  s += ", " + count_str(num_tokens(), "token");
  if (store_->num_documents() > 1) s += " in " + count_str(num_documents(), "document");
  if (begin_ != 0 || end_ != store_->num_tokens())
    s += ", positions " + std::to_string(begin_) + ".." + std::to_string(end_);
  return s + ")";
}

nlohmann::json TokenDataset::to_json() const {
  return {{"file", store_->name()},
          {"format", store_->format()},
          {"dtype", token_type_name(store_->type())},
          {"tokens", num_tokens()},
          {"begin", begin_},
          {"end", end_},
          {"cross_documents", cross_}};
}

std::pair<DatasetPtr, DatasetPtr> TokenDataset::split(double fraction) const {
  BATON_CHECK(fraction > 0 && fraction < 1, "split fraction in (0, 1)");
  const auto& ds = store_->document_starts();
  std::vector<int64_t> inner;  // document starts strictly inside the range
  for (int64_t s : ds)
    if (s > begin_ && s < end_) inner.push_back(s);
  int64_t cut;
  if (inner.empty()) {
    cut = end_ - std::max<int64_t>(1, int64_t(std::llround(fraction * double(end_ - begin_))));
  } else {
    const int64_t docs = int64_t(inner.size()) + 1;
    const int64_t held =
        std::clamp<int64_t>(int64_t(std::llround(fraction * double(docs))), 1, docs - 1);
    cut = inner[size_t(docs - 1 - held)];
  }
  // Errors about a part too small for a window name the part, not the whole file.
  const std::string unit = store_->format() == "text" ? "byte" : "token";
  char f[32];
  std::snprintf(f, sizeof f, "%g", fraction);
  auto part = [&](const char* which, int64_t b, int64_t e) {
    std::string s = std::string("the ") + which + " part made by --eval-fraction " + f + " (";
    if (!inner.empty()) {
      const int64_t first = store_->document_of(b), last = store_->document_of(e - 1);
      s += first == last
               ? "document " + std::to_string(first) + ", "
               : "documents " + std::to_string(first) + " to " + std::to_string(last) + ", ";
    }
    return s + "positions " + std::to_string(b) + ".." + std::to_string(e) + " of the file's " +
           count_str(store_->num_tokens(), unit) + ")";
  };
  return {std::make_shared<TokenDataset>(store_, begin_, cut, window_, cross_, vocab_,
                                         part("training", begin_, cut)),
          std::make_shared<TokenDataset>(store_, cut, end_, window_, cross_, vocab_,
                                         part("held-out", cut, end_))};
}

// ---- ByteDataset ----

ByteDataset::ByteDataset(const std::string& path, int64_t min_window)
    : TokenDataset(TokenStore::open_text(path), min_window, true) {}

ByteDataset::ByteDataset(std::string bytes, std::string name, int64_t min_window)
    : TokenDataset(TokenStore::from_bytes(std::move(bytes), std::move(name)), min_window, true) {}

// ---- BlendedDataset ----

BlendedDataset::BlendedDataset(std::vector<double> weights, std::vector<DatasetPtr> parts)
    : parts_(std::move(parts)) {
  BATON_CHECK(weights.size() == parts_.size() && !parts_.empty(), "one weight per dataset");
  // Scaled by the largest first: the sum of weights near DBL_MAX overflows to inf, which
  // had made every share 0 (all samples from the last dataset).
  const double top = *std::max_element(weights.begin(), weights.end());
  BATON_CHECK(top > 0 && std::isfinite(top), "positive finite weights");
  double sum = 0;
  for (double w : weights) sum += w / top;
  for (double w : weights) weights_.push_back(w / top / sum);
  double c = 0;
  for (double w : weights_) cum_.push_back(c += w);
  cum_.back() = 1.0;
}

size_t BlendedDataset::choose(uint64_t seed, int64_t step, int64_t index) const {
  constexpr double kGolden = 0.61803398874989484820;  // frac of the golden ratio
  const double offset = double(mix(mix(seed ^ 0xB1E9D) ^ uint64_t(step)) >> 11) * 0x1.0p-53;
  double u = offset + double(index) * kGolden;
  u -= std::floor(u);
  return std::min(size_t(std::upper_bound(cum_.begin(), cum_.end(), u) - cum_.begin()),
                  parts_.size() - 1);
}

void BlendedDataset::sample(uint64_t seed, int64_t step, int64_t index, int64_t window,
                            int64_t* out) const {
  const size_t k = choose(seed, step, index);
  // Each part draws its windows from its own stream of (seed, step, index).
  parts_[k]->sample(mix(seed + 0x632BE59BD9B4E019ull * (k + 1)), step, index, window, out);
}

int64_t BlendedDataset::num_tokens() const {
  int64_t n = 0;
  for (const auto& p : parts_) n += p->num_tokens();
  return n;
}

int64_t BlendedDataset::num_documents() const {
  int64_t n = 0;
  for (const auto& p : parts_) n += p->num_documents();
  return n;
}

std::string BlendedDataset::describe() const {
  std::string s = "a blend of";
  for (size_t k = 0; k < parts_.size(); ++k) {
    char w[32];
    std::snprintf(w, sizeof w, "%.3g", weights_[k]);
    s += std::string(k ? "," : "") + " " + w + " x " + parts_[k]->describe();
  }
  return s;
}

nlohmann::json BlendedDataset::to_json() const {
  nlohmann::json parts = nlohmann::json::array();
  for (size_t k = 0; k < parts_.size(); ++k)
    parts.push_back({{"weight", weights_[k]}, {"data", parts_[k]->to_json()}});
  return {{"blend", parts}};
}

std::pair<DatasetPtr, DatasetPtr> BlendedDataset::split(double fraction) const {
  std::vector<DatasetPtr> a, b;
  for (const auto& p : parts_) {
    auto [x, y] = p->split(fraction);
    a.push_back(x);
    b.push_back(y);
  }
  return {std::make_shared<BlendedDataset>(weights_, a),
          std::make_shared<BlendedDataset>(weights_, b)};
}

// ---- opening ----

std::vector<DataSpec> parse_data_specs(const std::vector<std::string>& args,
                                       const std::string& flag) {
  std::vector<DataSpec> out;
  for (const std::string& a : args) {
    DataSpec s;
    s.path = a;
    const size_t colon = a.find(':');
    if (colon != std::string::npos && colon > 0) {
      const std::string w = a.substr(0, colon);
      char* end = nullptr;
      const double v = std::strtod(w.c_str(), &end);
      if (end == w.c_str() + w.size()) {
        if (!(v > 0) || !std::isfinite(v))
          throw InputError(flag + ": '" + a + "': expected a positive weight before ':', found '" +
                           w + "'");
        s.weight = v;
        s.weighted = true;
        s.path = a.substr(colon + 1);
      }
    }
    if (s.path.empty()) throw InputError(flag + ": '" + a + "': no path");
    out.push_back(s);
  }
  if (out.empty()) throw InputError(flag + ": expected a dataset");
  if (out.size() > 1)
    for (const auto& s : out)
      if (!s.weighted)
        throw InputError(flag +
                         ": several datasets need a weight each (WEIGHT:PATH, e.g. 0.7:a 0.3:b), "
                         "found '" +
                         s.path + "' without one");
  return out;
}

namespace {
bool is_file(const std::string& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}
bool has_magic(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  char m[9] = {};
  in.read(m, 9);
  return in.gcount() == 9 && std::string(m, 9) == std::string("MMIDIDX\0\0", 9);
}
bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}
// NumPy's .npy magic: an array file, which read as text had trained on its header and
// its bytes.
bool is_npy(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  char m[6] = {};
  in.read(m, 6);
  return in.gcount() == 6 && std::string(m, 6) == "\x93NUMPY";
}
}  // namespace

std::shared_ptr<const TokenStore> open_token_store(const std::string& path,
                                                   const std::string& format,
                                                   const std::string& token_dtype) {
  std::string prefix = path;
  if (ends_with(path, ".bin") || ends_with(path, ".idx")) prefix = path.substr(0, path.size() - 4);
  std::string f = format;
  // A write of the pair (baton data prepare, hf_tokenize.py) interrupted between its
  // renames leaves PREFIX.bin without PREFIX.idx: read as flat tokens, it had trained on
  // a Megatron .bin's tokens without their documents, or on a half-replaced pair.
  if ((f == "auto" || f == "megatron") && !is_file(prefix + ".idx") &&
      (path == prefix || ends_with(path, ".bin") || ends_with(path, ".idx")))
    for (const std::string& left :
         {pair_temp_names(prefix).idx_tmp, pair_temp_names(prefix).idx_old}) {
      std::error_code ec;
      if (std::filesystem::exists(left, ec))
        throw InputError(path + ": " + left + " is there but " + prefix +
                         ".idx is not: the write of a Megatron dataset was interrupted (its "
                         "index is being replaced); write it again (baton data prepare), or "
                         "--data-format tokens to read " +
                         prefix + ".bin as flat tokens after all");
    }
  if (f == "auto") {
    if (is_file(prefix + ".idx") && (is_file(prefix + ".bin") || has_magic(prefix + ".idx")) &&
        (path == prefix || ends_with(path, ".bin") || ends_with(path, ".idx")))
      f = "megatron";
    else if (ends_with(path, ".bin"))
      f = "tokens";
    else
      f = "text";
    if (f != "megatron" && is_file(path) && is_npy(path))  // a FIFO's open would wait
      throw InputError(path +
                       ": a NumPy array (.npy), which token data is not (docs/formats/data.md: "
                       "flat tokens, a Megatron dataset or text): write its tokens raw, "
                       "`np.asarray(a, np.uint16).tofile('tokens.bin')`, and give --data "
                       "tokens.bin (--token-dtype uint32 for ids of 65536 and over); images go "
                       "in a directory with images.npy and labels.npy");
  }
  if (!token_dtype.empty() && f != "tokens")
    throw InputError("--token-dtype: only flat token files take a token type; " + path +
                     " is read as " + f +
                     (f == "megatron" ? " (its own header names the type of a Megatron dataset)"
                                      : " (every byte a token; --data-format tokens reads it as "
                                        "flat tokens)"));
  if (f == "megatron") {
    if (!is_file(prefix + ".idx") && !is_file(prefix + ".bin"))
      throw InputError(path + ": no Megatron dataset there (expected " + prefix + ".bin and " +
                       prefix + ".idx)");
    return TokenStore::open_megatron(prefix);
  }
  if (f == "tokens")
    return TokenStore::open_flat(path, token_dtype.empty()
                                           ? TokenType::u16
                                           : parse_token_type(token_dtype, "--token-dtype"));
  if (f == "text") return TokenStore::open_text(path);
  throw InputError("--data-format: expected auto, megatron, tokens or text, found '" + format +
                   "'");
}

namespace {
// open_dataset, leaving the scan of every token to the caller: the stores to scan (not
// byte-level text, whose bytes are all below a vocabulary of 256 or more) are appended
// to `to_scan`.
DatasetPtr open_unscanned(const std::vector<std::string>& args, const DataOptions& o,
                          const std::string& flag,
                          std::vector<std::shared_ptr<const TokenStore>>& to_scan) {
  std::vector<DataSpec> specs = parse_data_specs(args, flag);
  std::vector<DatasetPtr> parts;
  std::vector<double> weights;
  for (const DataSpec& s : specs) {
    auto store = open_token_store(s.path, o.format, o.token_dtype);
    if (o.vocab > 0 && o.vocab < 256 && store->format() == "text")
      throw InputError(s.path +
                       ": byte-level data needs a vocabulary of at least 256 (every byte a "
                       "token), the model's is " +
                       std::to_string(o.vocab));
    if (o.vocab > 0 && store->format() != "text") to_scan.push_back(store);
    parts.push_back(std::make_shared<TokenDataset>(store, o.window, o.cross_documents, o.vocab));
    weights.push_back(s.weight);
  }
  if (parts.size() == 1) return parts[0];
  return std::make_shared<BlendedDataset>(weights, parts);
}
}  // namespace

DatasetPtr open_dataset(const std::vector<std::string>& args, const DataOptions& o,
                        const std::string& flag) {
  std::vector<std::shared_ptr<const TokenStore>> to_scan;
  DatasetPtr d = open_unscanned(args, o, flag, to_scan);
  for (const auto& store : to_scan) store->check_vocabulary(o.vocab);
  return d;
}

// ---- VocabularyCheck ----

VocabularyCheck::VocabularyCheck(std::vector<std::shared_ptr<const TokenStore>> stores,
                                 int64_t vocab)
    : stores_(std::move(stores)), vocab_(vocab) {
  for (const auto& s : stores_) tokens_ += s->num_tokens();
  thread_ = std::thread([this] { run(); });
}

VocabularyCheck::~VocabularyCheck() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void VocabularyCheck::run() {
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int64_t kBlock = int64_t(1) << 22;  // tokens between looks at stop_
  try {
    for (const auto& s : stores_)
      for (int64_t pos = 0; pos < s->num_tokens() && !stop_; pos += kBlock)
        s->check_vocabulary(vocab_, pos, std::min(kBlock, s->num_tokens() - pos));
  } catch (...) {
    error_ = std::current_exception();
  }
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done_.store(true, std::memory_order_release);
}

bool VocabularyCheck::done() {
  if (!done_.load(std::memory_order_acquire)) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

void VocabularyCheck::wait() {
  if (thread_.joinable()) thread_.join();
  done();
}

double VocabularyCheck::seconds() const {
  return done_.load(std::memory_order_acquire) ? seconds_ : 0;
}

void check_eval_fraction(double fraction) {
  if (fraction == 0 || (fraction > 0 && fraction < 1)) return;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", fraction);
  throw InputError(std::string("--eval-fraction: expected a share in (0, 1) (or 0: none), found ") +
                   buf);
}

TrainData open_train_data(const DataFlags& f, const Graph& g, const std::string& model_source) {
  const auto t0 = std::chrono::steady_clock::now();
  DataOptions o;
  o.vocab = token_vocabulary(g, model_source);
  o.window = g.value("tokens").type.shape[0];
  o.format = f.format;
  o.token_dtype = f.token_dtype;
  o.cross_documents = f.cross_documents;
  TrainData d;
  check_eval_fraction(f.eval_fraction);
  std::vector<std::shared_ptr<const TokenStore>> to_scan;
  d.train = open_unscanned(f.data, o, "--data", to_scan);
  if (!f.eval_data.empty() && f.eval_fraction > 0)
    throw InputError("--eval-data and --eval-fraction: expected one of them, found both");
  if (!f.eval_data.empty()) d.eval = open_unscanned(f.eval_data, o, "--eval-data", to_scan);
  if (f.eval_fraction > 0) std::tie(d.train, d.eval) = d.train->split(f.eval_fraction);
  if (!to_scan.empty()) d.check = std::make_shared<VocabularyCheck>(std::move(to_scan), o.vocab);
  d.open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

uint64_t evaluation_seed(uint64_t seed) {
  return mix(seed ^ 0xE7A1E7A1ull);
}

namespace {

// hold_evaluation_windows' dataset: the held windows from memory, the rest (and what
// describes the data) from the dataset it wraps.
class HeldWindows : public Dataset {
 public:
  HeldWindows(DatasetPtr inner, uint64_t seed, int64_t batches, int64_t batch, int64_t window,
              std::vector<int32_t> tokens)
      : inner_(std::move(inner)),
        seed_(seed),
        batches_(batches),
        batch_(batch),
        window_(window),
        tokens_(std::move(tokens)) {}

  void sample(uint64_t seed, int64_t step, int64_t index, int64_t window,
              int64_t* out) const override {
    if (seed != seed_ || window != window_ || step < 0 || step >= batches_ || index < 0 ||
        index >= batch_)
      return inner_->sample(seed, step, index, window, out);
    const int32_t* p = tokens_.data() + (step * batch_ + index) * (window + 1);
    std::copy(p, p + window + 1, out);
  }
  int64_t num_tokens() const override { return inner_->num_tokens(); }
  int64_t num_documents() const override { return inner_->num_documents(); }
  std::string describe() const override { return inner_->describe(); }
  nlohmann::json to_json() const override { return inner_->to_json(); }
  std::pair<DatasetPtr, DatasetPtr> split(double fraction) const override {
    return inner_->split(fraction);
  }

 private:
  DatasetPtr inner_;
  uint64_t seed_;
  int64_t batches_, batch_, window_;
  std::vector<int32_t> tokens_;  // [batches, batch, window + 1]
};

}  // namespace

DatasetPtr hold_evaluation_windows(DatasetPtr eval, uint64_t seed, int64_t batches, int64_t batch,
                                   int64_t window) {
  BATON_CHECK(eval != nullptr && batches > 0 && batch > 0 && window > 0,
              "hold_evaluation_windows: a dataset and positive sizes");
  // Checked before the product is formed: it had wrapped (a few tokens allocated, the loop
  // writing far past them) or asked for more memory than any machine has (std::bad_alloc).
  if (batch > kMaxHeldEvaluationTokens / (window + 1) ||
      batches > kMaxHeldEvaluationTokens / (batch * (window + 1))) {  // formed once in range
    const long double n = (long double)batches * (long double)batch * (long double)(window + 1);
    char bytes[32];
    std::snprintf(bytes, sizeof bytes, "%.3Lg", n * 4);
    throw InputError("--eval-batches " + std::to_string(batches) + ": expected at most " +
                     std::to_string(kMaxHeldEvaluationTokens) +
                     " held-out tokens in memory (4 bytes each), found " + std::to_string(batches) +
                     " batches x " + std::to_string(batch) + " samples (the global batch) x " +
                     std::to_string(window + 1) + " tokens (the context " + std::to_string(window) +
                     " + 1), " + bytes + " bytes");
  }
  const uint64_t s = evaluation_seed(seed);
  std::vector<int32_t> tokens(size_t(batches * batch * (window + 1)));
  std::vector<int64_t> w(size_t(window + 1));
  for (int64_t k = 0; k < batches; ++k)
    for (int64_t i = 0; i < batch; ++i) {
      eval->sample(s, k, i, window, w.data());
      int32_t* out = tokens.data() + (k * batch + i) * (window + 1);
      for (int64_t t = 0; t <= window; ++t) {
        // Every token is below the model's vocabulary (checked as read): one past int32 is
        // left to the file.
        if (w[size_t(t)] < 0 || w[size_t(t)] > std::numeric_limits<int32_t>::max()) return eval;
        out[t] = int32_t(w[size_t(t)]);
      }
    }
  return std::make_shared<HeldWindows>(std::move(eval), s, batches, batch, window,
                                       std::move(tokens));
}

std::string inputs_str(const Graph& g) {
  std::string s = std::to_string(g.inputs.size()) + (g.inputs.size() == 1 ? " input" : " inputs");
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const Value& v = g.values[size_t(g.inputs[i])];
    s += (i ? ", '" : ": '") + v.name + "' " + type_str(v.type);
  }
  return s;
}

int64_t token_vocabulary(const Graph& g, const std::string& source) {
  int tok = g.find_value("tokens"), tgt = g.find_value("targets");
  if (tok < 0 || tgt < 0 || g.inputs.size() != 2)
    throw InputError(json_where(source, "$.inputs") +
                     ": expected exactly the inputs 'tokens' and 'targets' "
                     "(token data), found " +
                     inputs_str(g));
  const ValueType& t = g.values[size_t(tok)].type;
  const ValueType& y = g.values[size_t(tgt)].type;
  const bool ints = !memory::is_floating(t.dtype) && !memory::is_floating(y.dtype);
  // One dtype: a window's tokens and its next tokens are cut from one buffer.
  if (!ints || t.dtype != y.dtype || t.shape.size() != 1 ||
      !(y.shape == t.shape || y.shape.empty()))
    throw InputError(json_where(source, "$.inputs") +
                     ": expected tokens [T] and targets [T] or [] of one integer "
                     "type, found tokens " +
                     type_str(t) + " and targets " + type_str(y));
  // The loss is averaged over the targets the data fills (T or 1 per sample), so they must
  // be what the loss's cross_entropy reads.
  if (g.loss >= 0) {
    const Node& ce = g.nodes[size_t(g.values[size_t(g.loss)].producer)];
    if (ce.op == "cross_entropy" && ce.inputs[1] != tgt)
      throw InputError(ce.json_path +
                       ".inputs[1]: expected the model input 'targets' (the token data's next "
                       "tokens, which the loss is averaged over), found '" +
                       g.values[size_t(ce.inputs[1])].name + "'");
  }
  int64_t vocab = 0;
  auto narrow = [&](int64_t v) { vocab = vocab == 0 ? v : std::min(vocab, v); };
  for (const Node& n : g.nodes) {
    // An embedding with a vocab_offset covers ids [offset, offset + rows).
    if (n.op == "embedding" && n.inputs[0] == tok)
      narrow((n.attrs.contains("vocab_offset") ? n.attrs.at("vocab_offset").get<int64_t>() : 0) +
             g.params[size_t(n.params[0])].logical_shape[0]);
    if (n.op == "cross_entropy") narrow(g.values[size_t(n.inputs[0])].type.shape.back());
  }
  return vocab;
}

}  // namespace baton::stages
