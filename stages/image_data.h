// Image classification data: a directory holding two NumPy arrays (docs/formats/images.md),
//   images.npy  [N, C, H, W] or [N, H, W] (C = 1): float32, float64 or uint8 (scaled by 1/255)
//   labels.npy  [N]: integer class indices (int32, int64, uint8, ...; all in [0, classes))
// As for token data, a step's global batch is a deterministic function of (seed, step,
// sample index): sample i of step s is image hash(seed, s, i) mod N, so any split of the
// batch (micro-batches, data-parallel ranks) sees the same samples and resuming at step s
// needs nothing but s.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memory/tensor.h"
#include "stages/graph.h"

namespace baton::stages {

// A whole .npy file (format versions 1 to 3, little-endian, C order) as raw bytes.
struct NpyArray {
  std::string descr;  // NumPy's type string: "<f4", "|u1", "<i8", ...
  memory::Shape shape;
  std::string bytes;  // the data, shape's product times the element size
};
// InputError naming the file for anything else (missing, truncated, Fortran order,
// big-endian, an object array).
NpyArray read_npy(const std::string& path);
// Writes a C-order little-endian .npy (version 1) of f32, f64, i32 or i64 (tests, tools).
void write_npy(const std::string& path, const memory::Tensor& t);

class ImageDataset {
 public:
  // Reads dir/images.npy and dir/labels.npy; InputError when they are missing, malformed,
  // disagree in length or hold a negative label.
  explicit ImageDataset(const std::string& dir);

  const std::string& path() const { return dir_; }
  int64_t size() const { return n_; }
  const memory::Shape& image_shape() const { return shape_; }  // [C, H, W]
  int64_t classes() const { return classes_; }                 // the largest label + 1
  // What a checkpoint's manifest records of the data ($.data.train): the directory, the
  // image count, the image shape and the classes, compared when a run resumes.
  nlohmann::json to_json() const;

  // The image index of sample `index` of step `step`.
  int64_t sample_index(uint64_t seed, int64_t step, int64_t index) const;
  // Fills samples [first, first + n) of step `step`: images [n, C, H, W] (f32 or f64) and
  // labels [n] (i32 or i64), CPU tensors allocated by the caller.
  void fill(uint64_t seed, int64_t step, int64_t first, int64_t n, memory::Tensor& images,
            memory::Tensor& labels) const;
  // The same samples' images alone, rows [first_row, first_row + R) of their height:
  // images [n, C, R, W] (a spatial tile reads its rows, not whole images to cut)...
  void fill_images(uint64_t seed, int64_t step, int64_t first, int64_t n, memory::Tensor& images,
                   int64_t first_row = 0) const;
  // ... or their labels alone (a last stage reads nothing else).
  void fill_labels(uint64_t seed, int64_t step, int64_t first, int64_t n,
                   memory::Tensor& labels) const;

  // The model must read "images" [C, H, W] (floating) and "labels" [] (integer), with
  // as many classes in its loss as the data has; InputError naming `source` otherwise.
  void check_model(const Graph& g, const std::string& source) const;

 private:
  std::string dir_;
  int64_t n_ = 0, classes_ = 0;
  memory::Shape shape_;
  std::vector<float> images_;  // [N, C, H, W]
  std::vector<int64_t> labels_;
};

// True when `path` is a directory with an images.npy: image data, not a byte file.
bool is_image_dataset(const std::string& path);

}  // namespace baton::stages
