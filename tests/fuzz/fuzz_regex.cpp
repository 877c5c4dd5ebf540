// Regexes compiled to automata (guided_regex; a JSON schema's "pattern" goes through the same
// parser, and the json_schema harness): the input is the pattern, compiled and walked for a few
// dozen tokens of a small vocabulary.
#include <cstddef>
#include <cstdint>

#include "constrain_walk.h"

using namespace flashmap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string pattern(reinterpret_cast<const char*>(data), size);
  fuzz::Picker pick(pattern);
  std::shared_ptr<const constrain::Grammar> g;
  if (fuzz::expect_clean("compile_regex", [&] { g = constrain::compile_regex(pattern); }))
    fuzz::walk(std::move(g), pick);
  return 0;
}
