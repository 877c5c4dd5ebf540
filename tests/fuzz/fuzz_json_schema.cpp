// JSON schemas compiled to automata (response_format json_schema, guided_json, tool parameters):
// the input is the schema; compiled with compact and with flexible whitespace, then walked for a
// few dozen tokens of a small vocabulary.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "constrain_walk.h"
#include "server/api.h"

using namespace flashmap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 16)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The server's body checks first (depth, UTF-8), as a schema arrives inside a request.
  nlohmann::ordered_json schema;
  if (!fuzz::expect_clean("parse_json_value", [&] { schema = server::parse_json_value(text); }) ||
      schema.is_discarded())
    return 0;
  fuzz::Picker pick(text);
  for (bool flexible : {false, true}) {
    constrain::JsonOptions o;
    o.flexible_whitespace = flexible;
    std::shared_ptr<const constrain::Grammar> g;
    if (!fuzz::expect_clean("compile_json_schema",
                            [&] { g = constrain::compile_json_schema(schema, o); }))
      return 0;
    fuzz::walk(std::move(g), pick);
  }
  return 0;
}
