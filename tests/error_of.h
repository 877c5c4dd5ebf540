// The message of the flashmap::Error that `f` throws, or "<no error>": tests assert on what a user
// would read.
#pragma once

#include <functional>
#include <string>

#include "core/check.h"

namespace flashmap::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace flashmap::testing
