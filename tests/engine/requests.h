// Helpers the engine tests share: deterministic prompts, waiting for a request's whole output, and
// the reference a request's output must equal.
#pragma once

#include <flashmap/engine.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/generate.h"

namespace flashmap::engine::test {

// `len` ids below 1024 (the fixtures' vocabulary), different for each salt.
inline std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 5) % 1024));
  return p;
}

// The request's tokens once it finished (a failure when it ends with an error or does not end
// within 60 s); its finish reason in *reason.
inline std::vector<int32_t> wait_all(Request& r, std::string* reason = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    auto u = r.wait(0, std::chrono::milliseconds(1000));
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "request " << r.id << " did not finish in 60 s";
      r.cancel();
      return u.tokens;
    }
    if (u.finished) {
      if (reason) *reason = u.finish_reason;
      EXPECT_TRUE(u.error.empty()) << u.error;
      return u.tokens;
    }
  }
}

// What an engine's output for `p` must equal: generate() with the request's options, drafting
// with `drafter` (null: the target alone).
inline GenerateResult generate_alone(const Qwen3Model& target, const BlockProposer* drafter,
                                     const RequestParams& p) {
  GenerateOptions o;
  o.max_new_tokens = p.max_tokens;
  o.sampling = p.sampling;
  o.seed = p.seed;
  o.seeded = p.seeded;
  o.stop_ids = p.stop_ids;
  return generate(target, drafter, p.prompt, o);
}

}  // namespace flashmap::engine::test
