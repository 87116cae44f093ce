// JSON documents as every reader of baton's files takes them: parse_json_text, the text parsed
// with a syntax error named by the file, and strict objects, the rule that an object's
// fields are all known (an unknown one is an error, never silently ignored). The schedule,
// cost and trace files (schedule/, below stages/) call them directly; stages::JsonReader,
// which adds typed access with paths for the model, plan and checkpoint files, builds on
// them.
// Header-only: baton_memory itself links no JSON library (the GPU-check build has none).
#pragma once

#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "memory/error.h"
#include "memory/utf8.h"

namespace baton::memory {

namespace detail {

// The DOM parser with where the parse stands, for naming a repeated key and refusing
// nesting too deep: one frame per open object or array. (nlohmann's callback parser,
// used before, rescanned an object's parent after each object: quadratic in an array's
// objects, 185 s for a 45 MB plan; and a deep document later overflowed the stack in
// its recursive copy.) sax_parse calls these by the static type, so hiding the base's
// members is enough.
class TrackingDomParser : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
  using Base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
  using json = nlohmann::json;

 public:
  // Far beyond any of baton's formats (a plan or model nests a few levels).
  static constexpr size_t kMaxDepth = 256;

  TrackingDomParser(json& result, const std::string& source)
      : Base(result, true), source_(source) {}

  bool null() { return scalar(Base::null()); }
  bool boolean(bool v) { return scalar(Base::boolean(v)); }
  bool number_integer(json::number_integer_t v) { return scalar(Base::number_integer(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(Base::number_unsigned(v)); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return scalar(Base::number_float(v, s));
  }
  bool string(json::string_t& v) { return scalar(Base::string(v)); }
  bool binary(json::binary_t& v) { return scalar(Base::binary(v)); }
  bool start_object(std::size_t n) {
    open(false);
    return Base::start_object(n);
  }
  bool key(json::string_t& k) {
    Frame& f = frames_.back();
    f.key = k;
    if (!f.keys.insert(f.key).second)
      throw InputError(source_ + ": " + path() + ": the field '" + f.key +
                       "' appears twice in one object (readers differ on which one counts)");
    return Base::key(k);
  }
  bool end_object() { return close(Base::end_object()); }
  bool start_array(std::size_t n) {
    open(true);
    return Base::start_array(n);
  }
  bool end_array() { return close(Base::end_array()); }
  // A number too large for a double (out_of_range 406) named where it ends: nlohmann's
  // message had no place. The text parser passes its position; other callers, an offset.
  using Base::parse_error;
  template <class Exception>
  bool parse_error(const nlohmann::detail::position_t& at, const std::string& token,
                   const Exception& e) {
    if constexpr (std::is_same_v<Exception, nlohmann::detail::out_of_range>)
      if (e.id == 406)
        throw nlohmann::detail::out_of_range::create(
            406,
            std::string(e.what()).substr(std::string(e.what()).find("] ") + 2) + " at line " +
                std::to_string(at.lines_read + 1) + ", column " +
                std::to_string(at.chars_read_current_line),
            nullptr);
    return Base::parse_error(std::size_t(at), token, e);
  }

 private:
  struct Frame {
    bool array;
    size_t index;
    std::string key;
    std::set<std::string, std::less<>> keys;
  };

  std::string path() const {
    std::string p = "$";
    for (const Frame& g : frames_) p += g.array ? "[" + std::to_string(g.index) + "]" : "." + g.key;
    return p;
  }
  void open(bool array) {
    if (frames_.size() == kMaxDepth) {
      std::string where = path();
      if (where.size() > 120) where = where.substr(0, 120) + "...";
      throw InputError(source_ + ": " + where + ": nested deeper than " +
                       std::to_string(kMaxDepth) + " levels");
    }
    frames_.push_back({array, 0, {}, {}});
  }
  bool close(bool ok) {
    frames_.pop_back();
    return scalar(ok);
  }
  bool scalar(bool ok) {  // an element of an array is done
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return ok;
  }

  const std::string& source_;
  std::vector<Frame> frames_;
};

}  // namespace detail

// How deep the readers let JSON nest (other builders of JSON values, such as the Python
// module's from Python objects, keep the same bound).
inline constexpr size_t kMaxJsonDepth = detail::TrackingDomParser::kMaxDepth;

// `text` parsed as JSON. InputError "<source>: not valid JSON: <nlohmann's message without
// its exception id>" on a syntax error or a number too large, and "<source>: <path>: the
// field 'k' appears twice ..." for a key repeated in one object (which nlohmann, like most
// readers, would take the last of silently, and some others the first), or
// "<source>: <path>: nested deeper than 256 levels", or "<source>: not valid JSON: a NUL
// byte at byte offset N".
inline nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  // nlohmann's lexer takes a NUL byte for the end of the input: whatever followed one was
  // ignored. JSON has no raw NUL (in a string it is written \u0000), so one is refused.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw InputError(source + ": not valid JSON: a NUL byte at byte offset " + std::to_string(nul) +
                     " (JSON text has none; in a string it is written \\u0000)");
  try {
    nlohmann::json j;
    detail::TrackingDomParser sax(j, source);
    nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
    return j;
  } catch (const nlohmann::json::exception& e) {  // parse_error; out_of_range for a large number
    // nlohmann's message starts with "[json.exception.parse_error.101] parse error at ..."
    std::string what = e.what();
    const auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(source + ": not valid JSON: " + what);
  }
}

// A short rendering of a JSON value for messages ("found <brief>"): null, true, 3, "3",
// an object, an array of 2; long values cut. One rendering for every reader.
inline std::string json_brief(const nlohmann::json& j) {
  std::string s;
  if (j.is_object())
    s = "an object";
  else if (j.is_array())
    s = "an array of " + std::to_string(j.size());
  else
    s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = utf8_prefix(s, 57);  // whole characters
  return s;
}

// Requires `j` to be an object whose keys are all in `allowed`. `where` names the node
// in messages: "<file>: $.stages[0]", or a bare path ("p2p"; empty for a document's root).
// InputError "<where>: expected an object, found <type>", or
// "<where>.<key>: unknown field '<key>' (allowed here: <allowed, in order>)".
inline void expect_json_object(const nlohmann::json& j, const std::string& where,
                               std::initializer_list<std::string_view> allowed) {
  if (!j.is_object())
    throw InputError(where + ": expected an object, found " + std::string(j.type_name()));
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (std::string_view a : allowed) known = known || it.key() == a;
    if (known) continue;
    std::string list;
    for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    throw InputError(where + (where.empty() ? "" : ".") + brief(it.key()) + ": unknown field '" +
                     brief(it.key()) + "' (allowed here: " + list + ")");
  }
}

}  // namespace baton::memory
