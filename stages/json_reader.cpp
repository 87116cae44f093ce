#include "stages/json_reader.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "memory/file_io.h"
#include "memory/json_object.h"

namespace baton::stages {

json read_json_file(const std::string& path) {
  // A Hugging Face directory where its config.json was meant (--model beside --init-from).
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) &&
      std::filesystem::is_regular_file(std::filesystem::path(path) / "config.json", ec))
    throw InputError(path + ": a directory, expected a JSON file; a Hugging Face model's is " +
                     (std::filesystem::path(path) / "config.json").string());
  return memory::parse_json_text(memory::read_file(path), path);
}

json read_json_regular_file(const std::string& path) {
  return memory::parse_json_text(memory::read_regular_file(path), path);
}

bool JsonReader::has(std::string_view key) const {
  return j_->is_object() && j_->contains(std::string(key));
}

JsonReader JsonReader::at(std::string_view key) const {
  expect_object();
  auto it = j_->find(std::string(key));
  if (it == j_->end()) fail_message("missing required field '" + std::string(key) + "'");
  return JsonReader(*it, file_, path_ + "." + brief(key));
}

std::optional<JsonReader> JsonReader::get(std::string_view key) const {
  expect_object();
  auto it = j_->find(std::string(key));
  if (it == j_->end()) return std::nullopt;
  return JsonReader(*it, file_, path_ + "." + brief(key));
}

size_t JsonReader::size() const {
  expect_array();
  return j_->size();
}

JsonReader JsonReader::at(size_t index) const {
  expect_array();
  if (index >= j_->size())
    fail("an array with at least " + std::to_string(index + 1) + " elements");
  return JsonReader((*j_)[index], file_, path_ + "[" + std::to_string(index) + "]");
}

std::vector<JsonReader> JsonReader::items() const {
  expect_array();
  std::vector<JsonReader> out;
  for (size_t i = 0; i < j_->size(); ++i)
    out.push_back(JsonReader((*j_)[i], file_, path_ + "[" + std::to_string(i) + "]"));
  return out;
}

std::vector<std::string> JsonReader::keys() const {
  expect_object();
  std::vector<std::string> out;
  for (auto it = j_->begin(); it != j_->end(); ++it) out.push_back(it.key());
  return out;
}

void JsonReader::expect_only(std::initializer_list<std::string_view> allowed) const {
  expect_object();
  memory::expect_json_object(*j_, where(), allowed);
}

void JsonReader::expect_object() const {
  if (!j_->is_object()) fail("an object");
}

void JsonReader::expect_array() const {
  if (!j_->is_array()) fail("an array");
}

std::string JsonReader::as_string() const {
  if (!j_->is_string()) fail("a string");
  return j_->get<std::string>();
}

bool JsonReader::as_bool() const {
  if (!j_->is_boolean()) fail("true or false");
  return j_->get<bool>();
}

int64_t JsonReader::as_int() const {
  return as_int(INT64_MIN, INT64_MAX);
}

int64_t JsonReader::as_int(int64_t min, int64_t max) const {
  // nlohmann keeps non-negative integers unsigned, and is_number_integer() is true for
  // them too: from 2^63 up they do not fit int64_t (which would wrap them negative).
  const std::string range =
      "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  int64_t v = 0;
  if (j_->is_number_unsigned()) {
    const uint64_t u = j_->get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) fail(range);
    v = int64_t(u);
  } else if (j_->is_number_integer()) {
    v = j_->get<int64_t>();
  } else {
    const double d = j_->is_number_float() ? j_->get<double>() : 0.5;
    if (!(std::isfinite(d) && d == std::floor(d))) fail("an integer");
    // A whole float out of range is a range error, not "not an integer" (1e19 is whole).
    if (d < double(min) || d > double(max)) fail(range);
    if (std::fabs(d) >= 9e15)
      fail("an integer written in digits (a float this large is not exact)");
    v = int64_t(d);
  }
  if (v < min || v > max) fail(max == INT64_MAX ? "an integer >= " + std::to_string(min) : range);
  return v;
}

uint64_t JsonReader::as_uint64() const {
  // Seeds take all of uint64_t (--seed), past as_int's INT64_MAX.
  const std::string range = "an integer in [0, 2^64)";
  if (j_->is_number_unsigned()) return j_->get<uint64_t>();
  if (j_->is_number_integer()) {
    const int64_t v = j_->get<int64_t>();
    if (v < 0) fail(range);
    return uint64_t(v);
  }
  const double d = j_->is_number_float() ? j_->get<double>() : 0.5;
  if (!(std::isfinite(d) && d == std::floor(d))) fail("an integer");
  if (d < 0 || d >= 18446744073709551616.0) fail(range);
  if (d >= 9e15) fail("an integer written in digits (a float this large is not exact)");
  return uint64_t(d);
}

double JsonReader::as_double() const {
  if (!j_->is_number()) fail("a number");
  double d = j_->get<double>();
  if (!std::isfinite(d)) fail("a finite number");
  return d;
}

double JsonReader::as_double(double min, double max) const {
  double v = as_double();
  if (v < min || v > max) {
    std::ostringstream ss;
    ss << "a number in [" << min << ", " << max << "]";
    fail(ss.str());
  }
  return v;
}

std::vector<int64_t> JsonReader::as_int_list() const {
  if (!j_->is_array()) fail("an array of integers");
  std::vector<int64_t> out;
  for (const JsonReader& r : items()) out.push_back(r.as_int());
  return out;
}

std::string JsonReader::get_string(std::string_view key, const std::string& dflt) const {
  auto r = get(key);
  return r ? r->as_string() : dflt;
}

int64_t JsonReader::get_int(std::string_view key, int64_t dflt, int64_t min, int64_t max) const {
  auto r = get(key);
  return r ? r->as_int(min, max) : dflt;
}

double JsonReader::get_double(std::string_view key, double dflt, double min, double max) const {
  auto r = get(key);
  return r ? r->as_double(min, max) : dflt;
}

bool JsonReader::get_bool(std::string_view key, bool dflt) const {
  auto r = get(key);
  return r ? r->as_bool() : dflt;
}

std::string json_where(const std::string& source, const std::string& path) {
  const size_t colon = source.rfind(": $");
  const bool inside =
      colon != std::string::npos && source.find_first_of(" :", colon + 3) == std::string::npos;
  if (inside && !path.empty() && path[0] == '$') return source + path.substr(1);
  return source + ": " + path;
}

std::string JsonReader::where() const {
  return json_where(*file_, path_);
}

void JsonReader::fail(const std::string& expected) const {
  fail(expected, json_brief(*j_));
}

void JsonReader::fail(const std::string& expected, const std::string& found) const {
  throw InputError(where() + ": expected " + expected + ", found " + brief(found, 200));
}

namespace {
std::string versions(int64_t min, int64_t max) {
  return min == max ? "version " + std::to_string(min)
                    : "versions " + std::to_string(min) + " to " + std::to_string(max);
}
}  // namespace

int64_t JsonReader::check_version(std::string_view what, int64_t min, int64_t max) const {
  const JsonReader at_version = at("version");
  const int64_t v = at_version.as_int();
  if (v > max)
    at_version.fail_message(std::string(what) + " is in format version " + std::to_string(v) +
                            ", written by a newer baton; this one reads " + versions(min, max));
  if (v < min) at_version.fail("format " + versions(min, max), std::to_string(v));
  return v;
}

void JsonReader::fail_message(const std::string& message) const {
  throw InputError(where() + ": " + message);
}

}  // namespace baton::stages
