// Errors are exceptions inside the engine and messages at its edges: the CLI prints what() and
// exits non-zero, the server turns it into an OpenAI-style error body.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace flashmap {

// Bad input from a user or a file (config, weights, request, text): the message names the file,
// field or parameter.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A fault after which a device cannot compute again (on CUDA: an illegal address, a kernel
// trap, an uncorrectable ECC error; every later call on the context fails the same way). The
// engine stops taking requests and fails the ones it holds; a supervisor restarts the process.
class DeviceFault : public Error {
 public:
  using Error::Error;
};

// A broken internal invariant (a bug in flashmap, not in the input).
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace flashmap

#define FLASHMAP_CHECK(cond, ...)                                   \
  do {                                                              \
    if (!(cond)) throw ::flashmap::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

#define FLASHMAP_ASSERT(cond)                                                    \
  do {                                                                           \
    if (!(cond))                                                                 \
      throw ::flashmap::InternalError(                                           \
          fmt::format("internal error: {} ({}:{})", #cond, __FILE__, __LINE__)); \
  } while (0)
