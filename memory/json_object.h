// JSON documents as every reader of baton's files takes them: parse_json_text, the text parsed
// with a syntax error named by the file, and strict objects, the rule that an object's
// fields are all known (an unknown one is an error, never silently ignored). The schedule,
// cost and trace files (schedule/, below stages/) call them directly; stages::JsonReader,
// which adds typed access with paths for the model, plan and checkpoint files, builds on
// them.
// Header-only: baton_memory itself links no JSON library (the GPU-check build has none).
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "memory/error.h"

namespace baton::memory {

// `text` parsed as JSON. InputError "<source>: not valid JSON: <nlohmann's message without
// its exception id>" on a syntax error or a number too large.
inline nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
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
