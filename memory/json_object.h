// Strict JSON objects: the one rule every parser of baton's files follows, that an object's
// fields are all known (an unknown one is an error, never silently ignored). The schedule
// and cost files (schedule/, below stages/) call it directly; stages::JsonReader, which
// adds typed access with paths for the model, plan and checkpoint files, builds on it.
// Header-only: baton_memory itself links no JSON library (the GPU-check build has none).
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "memory/error.h"

namespace baton::memory {

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
