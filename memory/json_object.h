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
#include <utility>
#include <vector>

#include "memory/error.h"

namespace baton::memory {

namespace detail {

// Where the parse stands, for naming a repeated key: one frame per open object or array.
class JsonKeyTracker {
 public:
  explicit JsonKeyTracker(const std::string& source) : source_(source) {}

  bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& value) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
        frames_.push_back({false, 0, {}, {}});
        break;
      case E::array_start:
        frames_.push_back({true, 0, {}, {}});
        break;
      case E::key:
        key(value.get<std::string>());
        break;
      case E::object_end:
      case E::array_end:
        frames_.pop_back();
        element_done();
        break;
      case E::value:
        element_done();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool array;
    size_t index;
    std::string key;
    std::set<std::string, std::less<>> keys;
  };

  void key(std::string k) {
    Frame& f = frames_.back();
    f.key = std::move(k);
    if (f.keys.insert(f.key).second) return;
    std::string path = "$";
    for (const Frame& g : frames_)
      path += g.array ? "[" + std::to_string(g.index) + "]" : "." + g.key;
    throw InputError(source_ + ": " + path + ": the field '" + f.key +
                     "' appears twice in one object (readers differ on which one counts)");
  }

  void element_done() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }

  const std::string& source_;
  std::vector<Frame> frames_;
};

}  // namespace detail

// `text` parsed as JSON. InputError "<source>: not valid JSON: <nlohmann's message without
// its exception id>" on a syntax error or a number too large, and "<source>: <path>: the
// field 'k' appears twice ..." for a key repeated in one object (which nlohmann, like most
// readers, would take the last of silently, and some others the first).
inline nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  detail::JsonKeyTracker tracker(source);
  try {
    return nlohmann::json::parse(text.begin(), text.end(), std::ref(tracker));
  } catch (const nlohmann::json::exception& e) {  // parse_error; out_of_range for a large number
    // nlohmann's message starts with "[json.exception.parse_error.101] parse error at ..."
    std::string what = e.what();
    const auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(source + ": not valid JSON: " + what);
  }
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
    throw InputError(where + (where.empty() ? "" : ".") + it.key() + ": unknown field '" +
                     it.key() + "' (allowed here: " + list + ")");
  }
}

}  // namespace baton::memory
