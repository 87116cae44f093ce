// Training data: the samples a step's global batch is made of. A dataset gives, for
// sample i of step s, a window of T tokens and the token after each (the targets); the
// window is a pure function of (seed, s, i), so any split of the batch (micro-batches,
// data-parallel ranks) sees the same samples and resuming at step s needs nothing but s.
// Datasets: token files of any format of stages/token_store.h (windows may cross
// document boundaries, as Megatron's GPT dataset does, or stay inside one document),
// and several of them blended with weights. docs/formats/data.md describes the formats.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "memory/tensor.h"
#include "stages/token_store.h"

namespace baton::stages {

class Graph;
class Dataset;
using DatasetPtr = std::shared_ptr<const Dataset>;

class Dataset {
 public:
  virtual ~Dataset() = default;
  // The window of sample `index` of step `step`: tokens [0, window) and the token after
  // them, window + 1 values in `out`.
  virtual void sample(uint64_t seed, int64_t step, int64_t index, int64_t window,
                      int64_t* out) const = 0;
  virtual int64_t num_tokens() const = 0;
  virtual int64_t num_documents() const = 0;
  // One line for the log: "licenses.txt (text, 153120 tokens)".
  virtual std::string describe() const = 0;
  // What a checkpoint records of the data.
  virtual nlohmann::json to_json() const = 0;
  // The dataset without its held-out part, and the held-out part: the last `fraction` of
  // the documents (of the tokens, for a one-document dataset).
  virtual std::pair<DatasetPtr, DatasetPtr> split(double fraction) const = 0;

  // Fills samples [first, first + n) of step `step`:
  // - tokens [n, T] with the window's tokens;
  // - targets [n, T] with the next token of each position (language modelling), or
  //   targets [n] with the token after the window (next-token prediction from a context).
  // Both are i32 or i64 CPU tensors allocated by the caller.
  void fill(uint64_t seed, int64_t step, int64_t first, int64_t n, memory::Tensor& tokens,
            memory::Tensor& targets) const;
};

// A range of a token store's positions [begin, end) (a split keeps whole documents).
class TokenDataset : public Dataset {
 public:
  // `window`: the model's T. Throws InputError when the range has no window of T + 1
  // tokens (inside one document when !cross_documents). `vocab` > 0: every window read is
  // checked against it (the whole store's check may still be running, VocabularyCheck);
  // a bad token throws the InputError of the store's first bad token.
  TokenDataset(std::shared_ptr<const TokenStore> store, int64_t window, bool cross_documents,
               int64_t vocab = 0);
  // `part`: what the range is, for those errors ("the held-out part made by ...").
  TokenDataset(std::shared_ptr<const TokenStore> store, int64_t begin, int64_t end, int64_t window,
               bool cross_documents, int64_t vocab = 0, const std::string& part = "");

  void sample(uint64_t seed, int64_t step, int64_t index, int64_t window,
              int64_t* out) const override;
  int64_t num_tokens() const override { return end_ - begin_; }
  int64_t num_documents() const override;
  std::string describe() const override;
  nlohmann::json to_json() const override;
  std::pair<DatasetPtr, DatasetPtr> split(double fraction) const override;

  const TokenStore& store() const { return *store_; }
  // First position of sample `index` of step `step`.
  int64_t sample_start(uint64_t seed, int64_t step, int64_t index) const;

 private:
  std::shared_ptr<const TokenStore> store_;
  int64_t begin_, end_, window_;
  bool cross_;
  int64_t vocab_;
  std::vector<int64_t> doc_begin_;   // !cross_: documents with a window, and their first position
  std::vector<int64_t> cum_starts_;  // !cross_: prefix sums of their window counts
};

// Byte-level text: any file, every byte a token (vocabulary 256).
class ByteDataset : public TokenDataset {
 public:
  // Maps the file. Throws InputError when it is missing, unreadable or shorter than one
  // window of `min_window` + 1 bytes.
  ByteDataset(const std::string& path, int64_t min_window);
  ByteDataset(std::string bytes, std::string name, int64_t min_window);
  int64_t size() const { return num_tokens(); }
};

// Several datasets, sample i of a step drawn from dataset k with probability weight_k:
// a low-discrepancy (golden-ratio) sequence with an offset per (seed, step), so any
// 10,000 samples hold each dataset's share within a fraction of a percent.
class BlendedDataset : public Dataset {
 public:
  BlendedDataset(std::vector<double> weights, std::vector<DatasetPtr> parts);
  void sample(uint64_t seed, int64_t step, int64_t index, int64_t window,
              int64_t* out) const override;
  int64_t num_tokens() const override;
  int64_t num_documents() const override;
  std::string describe() const override;
  nlohmann::json to_json() const override;
  std::pair<DatasetPtr, DatasetPtr> split(double fraction) const override;
  // The dataset sample `index` of step `step` comes from.
  size_t choose(uint64_t seed, int64_t step, int64_t index) const;
  const std::vector<double>& weights() const { return weights_; }

 private:
  std::vector<double> weights_;  // normalised
  std::vector<double> cum_;
  std::vector<DatasetPtr> parts_;
};

struct DataOptions {
  std::string format = "auto";  // auto, megatron, tokens, text
  std::string token_dtype;      // flat token files: uint16 (default) or uint32
  bool cross_documents = true;
  int64_t window = 0;  // the model's T
  int64_t vocab = 0;   // every token must be below it; 0: not checked
};

// One dataset argument: "PATH" or "WEIGHT:PATH".
struct DataSpec {
  double weight = 1;
  std::string path;
  bool weighted = false;
};
std::vector<DataSpec> parse_data_specs(const std::vector<std::string>& args,
                                       const std::string& flag);

// Opens a file in its format: `format` auto detects a Megatron dataset (PATH is its
// prefix, PREFIX.bin or PREFIX.idx), a flat token file (.bin without an index) or text.
std::shared_ptr<const TokenStore> open_token_store(const std::string& path,
                                                   const std::string& format,
                                                   const std::string& token_dtype);
// The dataset of `--data` arguments (one, or several weighted ones blended), every token
// checked against options.vocab.
DatasetPtr open_dataset(const std::vector<std::string>& args, const DataOptions& options,
                        const std::string& flag = "--data");

// The check of every token of a run's token stores against the model's vocabulary, on a
// thread of its own: opening a dataset then costs its memory map, not a scan of the whole
// file (seconds for a gigabyte from a cold disk), and the first steps do not wait for it.
// The windows the steps read are checked as they are read (TokenDataset), so no step
// uses a bad token; the training loop polls this check after every step and waits for
// it before any checkpoint, so a run whose data holds a bad token writes none.
class VocabularyCheck {
 public:
  // Starts scanning `stores`, in order.
  VocabularyCheck(std::vector<std::shared_ptr<const TokenStore>> stores, int64_t vocab);
  ~VocabularyCheck();  // stops the scan (between blocks) and joins it
  VocabularyCheck(const VocabularyCheck&) = delete;
  VocabularyCheck& operator=(const VocabularyCheck&) = delete;

  // Whether the scan has finished; then throws its InputError (naming the file, the first
  // bad token's position and value) when it found one. One thread calls done() and wait().
  bool done();
  // Waits for the scan to finish, then as done().
  void wait();
  int64_t vocab() const { return vocab_; }
  int64_t tokens() const { return tokens_; }  // every store's
  double seconds() const;                     // the scan's duration, once done

 private:
  void run();
  std::vector<std::shared_ptr<const TokenStore>> stores_;
  int64_t vocab_, tokens_ = 0;
  std::atomic<bool> stop_{false}, done_{false};
  std::exception_ptr error_;  // written before done_
  double seconds_ = 0;        // written before done_
  std::thread thread_;
};

// What the training loops take from the command line (--data, --eval-data, ...).
struct DataFlags {
  std::vector<std::string> data;       // PATH, or WEIGHT:PATH ... (a blend)
  std::vector<std::string> eval_data;  // held-out data; empty: none, or eval_fraction
  std::string format = "auto";
  std::string token_dtype;
  bool cross_documents = true;
  double eval_fraction = 0;  // > 0: hold out this share of --data's documents; 0: none
};
// Throws InputError unless `fraction` is 0 (none) or a share in (0, 1): a negative or NaN
// --eval-fraction had run without held-out data.
void check_eval_fraction(double fraction);
struct TrainData {
  DatasetPtr train;
  DatasetPtr eval;  // null without --eval-data or --eval-fraction
  // The background check of every token against the model's vocabulary (null: nothing to
  // scan, byte-level text).
  std::shared_ptr<VocabularyCheck> check;
  double open_seconds = 0;  // the time open_train_data took
};
// Opens the training (and held-out) data for a model whose logical graph is `g`: the
// window is its T; every token is checked against its vocabulary, as each window is read
// and by `check` in the background.
TrainData open_train_data(const DataFlags& flags, const Graph& g, const std::string& model_source);

// Evaluation batch k is "step" k of the held-out data under this seed, the same batches
// at every evaluation (and under every plan).
uint64_t evaluation_seed(uint64_t seed);

// The held-out data with the windows a run evaluates read into memory once: samples
// [0, batch) of evaluation batches [0, batches) of a run seeded `seed`, `window` tokens
// each (and the token after). The evaluations then read no file: a held-out file
// rewritten or truncated in place under the run (a tool that opens it "wb") had killed the
// run with SIGBUS through its memory map, with no message. Costs batches x batch x
// (window + 1) 4-byte tokens; any other window is read from `eval` as before. More than
// kMaxHeldEvaluationTokens (4 GiB) is an InputError naming --eval-batches.
inline constexpr int64_t kMaxHeldEvaluationTokens = int64_t(1) << 30;
DatasetPtr hold_evaluation_windows(DatasetPtr eval, uint64_t seed, int64_t batches, int64_t batch,
                                   int64_t window);

// The model's vocabulary as its token inputs see it: the end of every embedding reading
// `tokens` (vocab_offset + rows: the ids it covers end there) and the classes of its
// cross-entropy (the smallest). Throws InputError (naming `source`) unless the model's
// inputs are exactly integer `tokens` [T] and `targets` [T] or [].
int64_t token_vocabulary(const Graph& g, const std::string& source);

// A model's inputs for messages: "2 inputs: 'images' f32[batch, 1, 8, 8], 'labels' i64[batch]".
std::string inputs_str(const Graph& g);

}  // namespace baton::stages
