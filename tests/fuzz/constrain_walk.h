// The walk the structured-output harnesses take through a compiled grammar: a vocabulary of
// every single byte and common multi-byte JSON and UTF-8 pieces, and a path of allowed tokens
// picked from the input, with the properties the matcher promises checked at each step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "constrain/constrain.h"
#include "fuzz_common.h"

namespace flashmap::fuzz {

inline std::shared_ptr<const constrain::Vocabulary> walk_vocabulary() {
  static const auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    for (const char* s : {"{\"", "\":", "\": ", "\",", "\", \"", "}", "]}", "[{", "true", "false",
                          "null", "0.", "1e", "-1", "\\u00", "\\n", "\\\"", "é", "日本", "🙂",
                          "  ", "\n", "abc", "name", "parameters", "\"name\"", "123", "[]", "{}"})
      t.push_back(s);
    t.push_back("");  // an id with no bytes: never allowed
    return constrain::Vocabulary::from_bytes(std::move(t));
  }();
  return v;
}

inline void walk(std::shared_ptr<const constrain::Grammar> grammar, Picker& pick) {
  const auto vocab = walk_vocabulary();
  constrain::Matcher m(std::move(grammar), vocab);
  // masks[k]: the mask after k tokens, to compare with after a rollback to k.
  std::vector<std::vector<uint32_t>> masks;
  for (int step = 0; step < 48; ++step) {
    std::vector<uint32_t> mask(m.mask_words());
    m.fill_mask(mask);
    FUZZ_REQUIRE(m.checkpoint() == masks.size(), "checkpoint {} after {} tokens", m.checkpoint(),
                 masks.size());
    masks.push_back(mask);
    std::vector<int32_t> allowed;
    for (size_t id = 0; id < vocab->size(); ++id)
      if (mask[id / 32] >> (id % 32) & 1) allowed.push_back(int32_t(id));
    FUZZ_REQUIRE(allowed.empty() || !m.done(), "done() with tokens still allowed");
    if (allowed.empty()) break;
    const int32_t t = allowed[pick.next() % allowed.size()];
    FUZZ_REQUIRE(m.is_allowed(t), "token {} in the mask but not is_allowed()", t);
    FUZZ_REQUIRE(m.advance(t), "the matcher refused token {}, which its mask allowed", t);
    if (pick.next() % 8 == 0) {
      // Back to an earlier state, as a rejected draft goes: the same mask as then.
      const size_t back = pick.next() % masks.size();
      m.rollback(back);
      std::vector<uint32_t> again(m.mask_words());
      m.fill_mask(again);
      FUZZ_REQUIRE(again == masks[back], "the mask after a rollback to {} differs", back);
      masks.resize(back);
    }
  }
  (void)m.can_end();
}

}  // namespace flashmap::fuzz
