// Strict reading of JSON documents with exact error locations: a JsonReader is a view of
// one JSON node that knows its file and its path ($.layers[3].nodes[0].attrs.n_head), so
// every error says where it is, what was expected and what was found. Unknown fields
// are errors (expect_only), never silently ignored.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memory/error.h"
#include "memory/json_object.h"

namespace baton::stages {

using nlohmann::json;

// Reads and parses a file (memory::parse_json_text parses text); a missing or unreadable
// file is an InputError.
json read_json_file(const std::string& path);
// The same for a file found inside a directory baton was given (a Hugging Face model's
// config.json, a checkpoint's manifest): it must be a regular file, a FIFO is refused
// rather than waited on (memory::read_regular_file).
json read_json_regular_file(const std::string& path);

using memory::json_brief;

// "source: path" for a message. A source that is itself a place inside a file ("plan.json:
// $.model", a model embedded in a plan or a manifest) is continued: "plan.json: $.model.n_head",
// where "plan.json: $.model: $.n_head" had read as two documents.
std::string json_where(const std::string& source, const std::string& path);

class JsonReader {
 public:
  JsonReader(const json& j, std::string file, std::string path = "$")
      : j_(&j), file_(std::make_shared<std::string>(std::move(file))), path_(std::move(path)) {}

  const json& raw() const { return *j_; }
  const std::string& path() const { return path_; }
  const std::string& file() const { return *file_; }

  bool is_object() const { return j_->is_object(); }
  bool is_array() const { return j_->is_array(); }
  bool is_string() const { return j_->is_string(); }
  bool has(std::string_view key) const;

  // Object access: at() requires the key, get() returns nullopt when it is absent.
  JsonReader at(std::string_view key) const;
  std::optional<JsonReader> get(std::string_view key) const;
  // Array access.
  size_t size() const;
  JsonReader at(size_t index) const;
  std::vector<JsonReader> items() const;  // requires an array
  // The keys of an object in document order of nlohmann's map (sorted).
  std::vector<std::string> keys() const;

  // Requires an object whose keys are all in `allowed`.
  void expect_only(std::initializer_list<std::string_view> allowed) const;
  void expect_object() const;
  void expect_array() const;

  std::string as_string() const;
  bool as_bool() const;
  int64_t as_int() const;
  int64_t as_int(int64_t min, int64_t max) const;  // inclusive range
  uint64_t as_uint64() const;                      // [0, 2^64): seeds
  double as_double() const;
  double as_double(double min, double max) const;
  std::vector<int64_t> as_int_list() const;

  // Typed optional fields with defaults.
  std::string get_string(std::string_view key, const std::string& dflt) const;
  int64_t get_int(std::string_view key, int64_t dflt, int64_t min = INT64_MIN,
                  int64_t max = INT64_MAX) const;
  double get_double(std::string_view key, double dflt, double min, double max) const;
  bool get_bool(std::string_view key, bool dflt) const;

  // The object's required "version", checked before its other fields (a newer writer's
  // fields are then not called unknown): above max it says the file is from a newer baton
  // (`what`: "the checkpoint", "the plan"); below min, what is read. Returns it.
  int64_t check_version(std::string_view what, int64_t min, int64_t max) const;

  // Throws InputError "<file>: <path>: expected <expected>, found <found>".
  [[noreturn]] void fail(const std::string& expected) const;
  [[noreturn]] void fail(const std::string& expected, const std::string& found) const;
  // Throws InputError "<file>: <path>: <message>".
  [[noreturn]] void fail_message(const std::string& message) const;
  // "<file>: <path>" for messages built elsewhere.
  std::string where() const;

 private:
  JsonReader(const json& j, std::shared_ptr<std::string> file, std::string path)
      : j_(&j), file_(std::move(file)), path_(std::move(path)) {}
  const json* j_;
  std::shared_ptr<std::string> file_;
  std::string path_;
};

}  // namespace baton::stages
