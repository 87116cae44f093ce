#include "stages/image_data.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>
#include <vector>

#include "memory/error.h"
#include "memory/file_io.h"
#include "stages/data.h"
#include "stages/json_reader.h"

namespace baton::stages {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

// The header dict of a .npy file, as numpy writes it: a Python literal of exactly the
// keys 'descr' (a dtype string), 'fortran_order' (True or False) and 'shape' (a tuple of
// integers), each once (a key found by searching the text had taken the first of two
// 'shape's where numpy takes the last, and ignored keys numpy refuses).
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class NpyHeaderParser {
 public:
  NpyHeaderParser(const std::string& path, const std::string& header)
      : path_(path), h_(header), shown_(header.substr(0, header.find_last_not_of(" \n") + 1)) {}

  NpyHeader parse() {
    NpyHeader out;
    bool seen[3] = {false, false, false};
    expect('{');
    for (;;) {
      skip_space();
      if (eat('}')) break;
      const std::string key = quoted();
      const int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
      if (k < 0)
        bad(path_, "the .npy header has key '" + key +
                       "', expected only 'descr', 'fortran_order' and 'shape': " + shown_);
      if (seen[k]) bad(path_, "the .npy header has '" + key + "' twice: " + shown_);
      seen[k] = true;
      skip_space();
      expect(':');
      skip_space();
      if (k == 0) {
        if (at_ >= h_.size() || (h_[at_] != '\'' && h_[at_] != '"'))
          bad(path_, "expected a simple dtype string in the .npy header, found " + shown_);
        out.descr = quoted();
      } else if (k == 1) {
        if (word("False"))
          out.fortran_order = false;
        else if (word("True"))
          out.fortran_order = true;
        else
          bad(path_, "expected True or False for 'fortran_order' in the .npy header: " + shown_);
      } else {
        out.shape = shape();
      }
      skip_space();
      if (eat('}')) break;
      expect(',');
    }
    skip_space();  // numpy pads with spaces and ends with a newline
    if (at_ != h_.size()) malformed();
    for (int k = 0; k < 3; ++k)
      if (!seen[k])
        bad(path_, std::string("the .npy header has no '") +
                       (k == 0   ? "descr"
                        : k == 1 ? "fortran_order"
                                 : "shape") +
                       "': " + shown_);
    return out;
  }

 private:
  [[noreturn]] void malformed() const { bad(path_, "malformed .npy header: " + shown_); }
  void skip_space() {
    while (at_ < h_.size() && (h_[at_] == ' ' || h_[at_] == '\n' || h_[at_] == '\t')) ++at_;
  }
  bool eat(char c) {
    if (at_ < h_.size() && h_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) malformed();
  }
  bool word(const char* w) {
    const size_t n = std::strlen(w);
    if (h_.compare(at_, n, w) != 0) return false;
    at_ += n;
    return true;
  }
  // A quoted string without escapes (the keys and dtype strings numpy writes).
  std::string quoted() {
    if (at_ >= h_.size() || (h_[at_] != '\'' && h_[at_] != '"')) malformed();
    const char q = h_[at_++];
    const size_t end = h_.find(q, at_);
    if (end == std::string::npos) malformed();
    std::string s = h_.substr(at_, end - at_);
    at_ = end + 1;
    return s;
  }
  // (), (n,) or (n, m, ...) with an optional trailing comma: numpy's tuple of ints.
  std::vector<int64_t> shape() {
    std::vector<int64_t> dims;
    if (!eat('(')) bad(path_, "malformed shape in the .npy header: " + shown_);
    bool comma = false;
    for (;;) {
      skip_space();
      if (eat(')')) break;
      if (!dims.empty() && !comma) bad(path_, "malformed shape in the .npy header: " + shown_);
      const size_t start = at_;
      while (at_ < h_.size() && std::isdigit(static_cast<unsigned char>(h_[at_]))) ++at_;
      if (at_ == start) bad(path_, "malformed shape in the .npy header: " + shown_);
      // std::stoll had thrown a bare "stoll" (exit 1) for a dimension beyond int64.
      int64_t dim = 0;
      if (std::from_chars(h_.data() + start, h_.data() + at_, dim).ec != std::errc()) {
        const size_t close = h_.find(')', start);
        const size_t open = h_.rfind('(', start);
        bad(path_, "dimension " + h_.substr(start, at_ - start) + " of shape (" +
                       h_.substr(open + 1, close == std::string::npos ? std::string::npos
                                                                      : close - open - 1) +
                       ") is beyond int64, expected the shape of an array that fits in memory");
      }
      dims.push_back(dim);
      skip_space();
      comma = eat(',');
    }
    // (20) is the number 20 in Python, not a tuple: numpy refuses it.
    if (dims.size() == 1 && !comma) bad(path_, "malformed shape in the .npy header: " + shown_);
    return dims;
  }

  const std::string& path_;
  const std::string& h_;
  const std::string shown_;  // in messages: without numpy's padding
  size_t at_ = 0;
};

int64_t element_size(const std::string& path, const std::string& descr) {
  // The kind first: an object array ('|O') is no byte-order question.
  const char kind = descr.size() >= 2 ? descr[1] : '\0';
  if (descr.size() < 3 || (kind != 'f' && kind != 'i' && kind != 'u'))
    bad(path, "expected a numeric array (float, int, uint), found dtype '" + descr + "'");
  if (descr[0] != '<' && descr[0] != '|')
    bad(path,
        "expected a little-endian array ('<' or '|' byte order), found dtype '" + descr + "'");
  const int64_t size = std::atoll(descr.c_str() + 2);
  if (size != 1 && size != 2 && size != 4 && size != 8)
    bad(path, "unsupported element size in dtype '" + descr + "'");
  return size;
}

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element k of a numeric .npy array as a double.
double element(const NpyArray& a, int64_t k, int64_t esize) {
  const char* p = a.bytes.data() + k * esize;
  const char kind = a.descr[1];
  auto get = [&]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return double(v);
  };
  if (kind == 'f') return esize == 4 ? get(float{}) : esize == 8 ? get(double{}) : NAN;
  if (kind == 'i') switch (esize) {
      case 1:
        return get(int8_t{});
      case 2:
        return get(int16_t{});
      case 4:
        return get(int32_t{});
      default:
        return get(int64_t{});
    }
  switch (esize) {
    case 1:
      return get(uint8_t{});
    case 2:
      return get(uint16_t{});
    case 4:
      return get(uint32_t{});
    default:
      return get(uint64_t{});
  }
}

// Element k of an integer .npy array, exactly (a double rounds beyond 2^53): passed to
// `use` as int64_t for a signed dtype, as uint64_t for an unsigned one.
template <class F>
void integer_element(const NpyArray& a, int64_t k, int64_t esize, F&& use) {
  const char* p = a.bytes.data() + k * esize;
  auto get = [&]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  if (a.descr[1] == 'i') {
    use(esize == 1   ? int64_t(get(int8_t{}))
        : esize == 2 ? int64_t(get(int16_t{}))
        : esize == 4 ? int64_t(get(int32_t{}))
                     : get(int64_t{}));
  } else {
    use(esize == 1   ? uint64_t(get(uint8_t{}))
        : esize == 2 ? uint64_t(get(uint16_t{}))
        : esize == 4 ? uint64_t(get(uint32_t{}))
                     : get(uint64_t{}));
  }
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  const std::string data = memory::read_regular_file(path);
  if (data.size() < 10 || std::memcmp(data.data(), "\x93NUMPY", 6) != 0)
    bad(path, "not a NumPy .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(data[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = size_t(static_cast<unsigned char>(data[8])) |
                 size_t(static_cast<unsigned char>(data[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) bad(path, "truncated .npy header");
    for (int i = 0; i < 4; ++i)
      header_len |= size_t(static_cast<unsigned char>(data[8 + size_t(i)])) << (8 * i);
    start = 12;
  } else {
    bad(path, "expected .npy format version 1, 2 or 3, found " + std::to_string(major));
  }
  if (data.size() < start + header_len) bad(path, "truncated .npy header");
  const std::string header = data.substr(start, header_len);
  NpyArray a;
  NpyHeader h = NpyHeaderParser(path, header).parse();
  a.descr = h.descr;
  if (h.fortran_order)
    bad(path, "expected a C-order array (fortran_order False); save it with np.ascontiguousarray");
  a.shape = std::move(h.shape);
  const int64_t esize = element_size(path, a.descr);
  // Counted with overflow checks: a count that had wrapped (2^61 x 8 elements: 0) passed
  // the size check below.
  const auto numel = memory::checked_shape_numel(a.shape);
  int64_t want = 0;
  if (!numel || __builtin_mul_overflow(*numel, esize, &want))
    bad(path, "shape " + memory::shape_str(a.shape) + " of '" + a.descr +
                  "' holds more than 2^63 bytes, expected the shape of the data that follows");
  const size_t have = data.size() - start - header_len;
  if (have != size_t(want))
    bad(path, "expected " + std::to_string(want) + " bytes of data for shape " +
                  memory::shape_str(a.shape) + " of '" + a.descr + "', found " +
                  std::to_string(have));
  a.bytes = data.substr(start + header_len);
  return a;
}

void write_npy(const std::string& path, const memory::Tensor& t) {
  const char* descr = nullptr;
  switch (t.dtype()) {
    case DType::f32:
      descr = "<f4";
      break;
    case DType::f64:
      descr = "<f8";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    default:
      throw RuntimeError("write_npy: unsupported dtype " +
                         std::string(memory::dtype_name(t.dtype())));
  }
  std::string shape = "(";
  for (int64_t d = 0; d < t.dim(); ++d)
    shape += std::to_string(t.size(d)) + (t.dim() == 1 ? "," : d + 1 < t.dim() ? ", " : "");
  shape += ")";
  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Magic, version, length, then the header padded with spaces to a multiple of 64 bytes.
  const size_t total = ((10 + header.size() + 1 + 63) / 64) * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  const uint16_t len = uint16_t(header.size());
  const char le[2] = {char(len & 0xff), char(len >> 8)};
  memory::Tensor c = t.to(memory::Device::cpu());
  memory::write_file_durably(path, [&](memory::FileSink& f) {
    f.write("\x93NUMPY\x01\x00", 8);
    f.write(le, 2);
    f.write(header);
    f.write(c.raw_data(), c.nbytes());
  });
}

bool is_image_dataset(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         std::filesystem::exists(std::filesystem::path(path) / "images.npy", ec);
}

ImageDataset::ImageDataset(const std::string& dir) : dir_(dir) {
  const std::string ip = (std::filesystem::path(dir) / "images.npy").string();
  const std::string lp = (std::filesystem::path(dir) / "labels.npy").string();
  NpyArray im = read_npy(ip);
  NpyArray lb = read_npy(lp);
  if (im.shape.size() == 3) im.shape.insert(im.shape.begin() + 1, 1);  // [N, H, W]: one channel
  if (im.shape.size() != 4)
    bad(ip,
        "expected images of shape [N, C, H, W] or [N, H, W], found " + memory::shape_str(im.shape));
  const bool float_images = im.descr == "<f4" || im.descr == "<f8";
  if (!float_images && im.descr != "|u1" && im.descr != "<u1")
    bad(ip, "expected float32, float64 or uint8 images, found dtype '" + im.descr + "'");
  if (lb.descr[1] == 'f') bad(lp, "expected integer labels, found dtype '" + lb.descr + "'");
  if (lb.shape.size() != 1 || lb.shape[0] != im.shape[0])
    bad(lp, "expected labels of shape [" + std::to_string(im.shape[0]) + "] (one per image of " +
                ip + "), found " + memory::shape_str(lb.shape));
  n_ = im.shape[0];
  if (n_ == 0) bad(ip, "no images");
  shape_ = {im.shape[1], im.shape[2], im.shape[3]};
  const int64_t ie = element_size(ip, im.descr), le = element_size(lp, lb.descr);
  const double scale = im.descr[1] == 'u' ? 1.0 / 255.0 : 1.0;
  const int64_t total = memory::shape_numel(im.shape);
  images_.resize(size_t(total));
  const int64_t per_image = total / n_;
  for (int64_t k = 0; k < total; ++k) {
    const double v = element(im, k, ie) * scale;
    // A NaN or infinite pixel trains nothing and can pass unseen (a ReLU's max maps it).
    // A finite float64 beyond float32's range would become infinite when read.
    if (!std::isfinite(float(v))) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", v);
      bad(ip, "image " + std::to_string(k / per_image) + " holds " + text + " at element " +
                  std::to_string(k % per_image) +
                  (std::isfinite(v) ? ", outside float32's range (expected finite values within "
                                      "+-3.4e38, as baton reads them as float32)"
                                    : " (expected finite values)"));
    }
    images_[size_t(k)] = float(v);
  }
  labels_.resize(size_t(n_));
  for (int64_t k = 0; k < n_; ++k) {
    integer_element(lb, k, le, [&]<class T>(T v) {
      // Named as the file holds it, in its own type.
      if constexpr (std::is_signed_v<T>)
        if (v < 0)
          bad(lp, "labels[" + std::to_string(k) + "] is negative (" + std::to_string(v) + ")");
      // Class ids are small; a huge one (an unsigned 64-bit beyond int64) would wrap.
      if (v > T(2147483647))
        bad(lp, "labels[" + std::to_string(k) + "] is " + std::to_string(v) +
                    ", beyond any class id (expected at most 2^31 - 1)");
      labels_[size_t(k)] = int64_t(v);
    });
    classes_ = std::max(classes_, labels_[size_t(k)] + 1);
  }
}

nlohmann::json ImageDataset::to_json() const {
  return {{"dir", dir_}, {"images", n_}, {"shape", shape_}, {"classes", classes_}};
}

int64_t ImageDataset::sample_index(uint64_t seed, int64_t step, int64_t index) const {
  const uint64_t h = mix(mix(seed ^ 0x1B873593ull) ^ mix(uint64_t(step) + 0x9E3779B97F4A7C15ull) ^
                         (uint64_t(index) * 0xD1B54A32D192ED03ull));
  return int64_t(h % uint64_t(n_));
}

void ImageDataset::fill(uint64_t seed, int64_t step, int64_t first, int64_t n,
                        memory::Tensor& images, memory::Tensor& labels) const {
  fill_images(seed, step, first, n, images);
  fill_labels(seed, step, first, n, labels);
}

void ImageDataset::fill_images(uint64_t seed, int64_t step, int64_t first, int64_t n,
                               memory::Tensor& images, int64_t first_row) const {
  const int64_t C = shape_[0], H = shape_[1], W = shape_[2];
  BATON_CHECK(images.dim() == 4 && images.size(0) == n && images.size(1) == C &&
                  images.size(3) == W && first_row >= 0 && first_row + images.size(2) <= H,
              "images must be [n, C, rows, W] within " + memory::shape_str(shape_));
  BATON_CHECK(images.dtype() == DType::f32 || images.dtype() == DType::f64,
              "images must be f32 or f64");
  // Each channel's rows are contiguous in the dataset and in the tensor.
  const int64_t rows = images.size(2), run = rows * W, per = C * H * W;
  for (int64_t i = 0; i < n; ++i) {
    const float* src = images_.data() + sample_index(seed, step, first + i) * per + first_row * W;
    for (int64_t c = 0; c < C; ++c) {
      const float* from = src + c * H * W;
      const int64_t to = (i * C + c) * run;
      if (images.dtype() == DType::f32)
        std::memcpy(images.data<float>() + to, from, size_t(run) * sizeof(float));
      else
        for (int64_t e = 0; e < run; ++e) images.data<double>()[to + e] = double(from[e]);
    }
  }
}

void ImageDataset::fill_labels(uint64_t seed, int64_t step, int64_t first, int64_t n,
                               memory::Tensor& labels) const {
  BATON_CHECK(labels.dim() == 1 && labels.size(0) == n, "labels must be [n]");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = labels_[size_t(sample_index(seed, step, first + i))];
    if (labels.dtype() == DType::i32)
      labels.data<int32_t>()[i] = int32_t(label);
    else if (labels.dtype() == DType::i64)
      labels.data<int64_t>()[i] = label;
    else
      BATON_CHECK(false, "labels must be i32 or i64");
  }
}

void ImageDataset::check_model(const Graph& g, const std::string& source) const {
  const int im = g.find_value("images"), lb = g.find_value("labels");
  if (im < 0 || lb < 0 || g.inputs.size() != 2)
    throw InputError(json_where(source, "$.inputs") +
                     ": expected exactly the inputs 'images' and 'labels' "
                     "(image data " +
                     dir_ + "), found " + inputs_str(g));
  const ValueType& it = g.values[size_t(im)].type;
  const ValueType& lt = g.values[size_t(lb)].type;
  if (!memory::is_floating(it.dtype) || it.shape != shape_) {
    // Which input, where the shape comes from, and the layout baton reads: NHWC data (PIL's,
    // TensorFlow's) is the same numbers in another order.
    size_t at = 0;
    while (at < g.inputs.size() && g.inputs[at] != im) ++at;
    const bool shorthand = g.config.is_object() && g.config.value("type", "") == "resnet";
    std::string hint =
        shorthand ? " (of the resnet shorthand: its in_channels and image_size give that shape)"
                  : "";
    const std::vector<int64_t>& d = shape_;
    if (d.size() == 3 && it.shape.size() == 3 && d[0] == it.shape[1] && d[1] == it.shape[2] &&
        d[2] == it.shape[0])
      hint +=
          "; the images look channels-last [N, H, W, C]: baton reads [N, C, H, W], as "
          "torch does (np.transpose(images, (0, 3, 1, 2)))";
    throw InputError(json_where(source, "$.inputs[" + std::to_string(at) + "]") +
                     ": expected images of type " + type_str({shape_, g.float_dtype}) +
                     " (the data " + dir_ + "), found " + type_str(it) + hint);
  }
  if (memory::is_floating(lt.dtype) || !lt.shape.empty())
    throw InputError(json_where(source, "$.inputs") +
                     ": expected integer labels [] (one class per image), found " + type_str(lt));
  for (const Node& n : g.nodes)
    if (n.op == "cross_entropy" && n.inputs[1] == lb) {
      const int64_t v = g.values[size_t(n.inputs[0])].type.shape.back();
      if (v < classes_) {
        // The first label past the logits: the one to look at in labels.npy.
        size_t k = 0;
        while (labels_[k] < v) ++k;
        throw InputError(n.json_path + ": the data " + dir_ + " has " +  // names the file
                         std::to_string(classes_) + " classes, the logits " + std::to_string(v) +
                         " (" + dir_ + "/labels.npy: label " + std::to_string(k) + " is " +
                         std::to_string(labels_[k]) + ", expected below " + std::to_string(v) +
                         ")");
      }
    }
}

}  // namespace baton::stages
