// BATON_UCX_CHECK: every UCX call that returns a status goes through it; a failure
// throws RuntimeError naming the file, the line, the call and UCX's reason.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

#include "memory/error.h"

namespace baton::transport::detail {

[[noreturn]] inline void ucx_fail(const char* call, ucs_status_t status, const char* file,
                                  int line) {
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": UCX call " + call +
                     " failed: " + ucs_status_string(status));
}

// For calls that return a status pointer (a request, NULL, or an error).
inline ucs_status_ptr_t ucx_check_ptr(ucs_status_ptr_t p, const char* call, const char* file,
                                      int line) {
  if (UCS_PTR_IS_ERR(p)) ucx_fail(call, UCS_PTR_STATUS(p), file, line);
  return p;
}

}  // namespace baton::transport::detail

#define BATON_UCX_CHECK(call)                                                             \
  do {                                                                                    \
    ucs_status_t baton_ucx_status_ = (call);                                              \
    if (baton_ucx_status_ != UCS_OK)                                                      \
      ::baton::transport::detail::ucx_fail(#call, baton_ucx_status_, __FILE__, __LINE__); \
  } while (0)

#define BATON_UCX_CHECK_PTR(call) \
  ::baton::transport::detail::ucx_check_ptr((call), #call, __FILE__, __LINE__)
