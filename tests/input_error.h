// The message of the baton::InputError a callable throws: the bad-input tests of every
// folder compare it with what the user must be told.
#pragma once

#include <string>

#include "memory/error.h"

namespace baton::testing_support {

// "" when `f` returns normally; any other exception propagates (the test then fails).
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace baton::testing_support
