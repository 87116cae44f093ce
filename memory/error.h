// Error types shared by every folder. The command line maps InputError (bad user input:
// files, JSON, flags) to exit code 2 and every other exception to exit code 1.
#pragma once

#include <stdexcept>
#include <string>

namespace baton {

// Something the user gave us is wrong: a file, a JSON field, a flag. The message says
// where (file, JSON path), what was expected and what was found.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure at run time that is not the user's input: a peer died, a device ran out of
// memory, a system call failed.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Internal invariant violated: a bug in baton.
#define BATON_CHECK(cond, msg)                                                          \
  do {                                                                                  \
    if (!(cond))                                                                        \
      throw ::std::logic_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": check failed: " #cond ": " + (msg));                  \
  } while (0)

}  // namespace baton
