// What flashmap throws. Errors are exceptions inside the engine and messages at its edges: the
// CLI prints what() and exits non-zero, the server turns it into an OpenAI-style error body.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace flashmap {

// Bad input from a user or a file (config, weights, request, text): the message names the file,
// field or parameter.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request parameter out of range or inconsistent with the engine: `param` is its name as the
// request spells it (the server reports it as the error's "param"); the message names it too.
// `code`: a machine-readable reason where OpenAI's API has one ("context_length_exceeded").
class ParamError : public Error {
 public:
  ParamError(std::string param, const std::string& message, std::string code = {})
      : Error(message), param(std::move(param)), code(std::move(code)) {}
  std::string param, code;
};

// A fault after which a device cannot compute again (on CUDA: an illegal address, a kernel
// trap, an uncorrectable ECC error; every later call on the context fails the same way). The
// engine stops taking requests and fails the ones it holds; a supervisor restarts the process.
class DeviceFault : public Error {
 public:
  using Error::Error;
};

// A request the engine refuses to take now: `status` is the HTTP status it maps to (429 queue
// full, 503 shutting down). Bad requests are plain flashmap::Error (400).
class AdmissionError : public Error {
 public:
  AdmissionError(int status, const std::string& message) : Error(message), status(status) {}
  int status;
};

// A broken internal invariant (a bug in flashmap, not in the input).
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace flashmap
