// A vocabulary for grammar tests: token i spells i in base 4 over "abcd" (1 to `max_letters`
// letters); the last id has no bytes (the stop token, which a grammar never allows itself).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "constrain/constrain.h"

namespace flashmap::test {

inline std::shared_ptr<const constrain::Vocabulary> letters(int64_t V, size_t max_letters) {
  std::vector<std::string> t(static_cast<size_t>(V));
  for (int64_t i = 0; i + 1 < V; ++i) {
    int64_t x = i;
    std::string s;
    do {
      s += char('a' + x % 4);
      x /= 4;
    } while (x > 0 && s.size() < max_letters);
    t[size_t(i)] = s;
  }
  return constrain::Vocabulary::from_bytes(std::move(t));
}

}  // namespace flashmap::test
