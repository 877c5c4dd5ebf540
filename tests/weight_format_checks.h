// Checks shared by the tests of the CPU's other weight formats (q8, q4, the bf16 compute mode):
// each is a model of its own, so the engine's losslessness rests on its target being
// batch-invariant (a verify pass gives the bits of single-token steps), and its distance from the
// native model is measured on teacher-forced logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <span>
#include <vector>

#include "models/qwen3.h"
#include "ops/gemm.h"

namespace flashmap::test {

// A deterministic token stream of `len` ids below `vocab`.
inline std::vector<int32_t> prompt_of(int len, int salt, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 5) % vocab));
  return p;
}

// Every row's logits of one forward over `toks` from an empty cache.
inline std::vector<float> all_logits(const Qwen3Model& m, std::span<const int32_t> toks) {
  KVCache c = m.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, toks};
  m.forward({&s, 1}, Qwen3Model::Logits::All, {}, out);
  return out.logits;
}

// A 9-token verify pass after a prompt gives, row by row, the bits of the same tokens fed one at
// a time.
inline void expect_verify_pass_equals_steps(const Qwen3Model& m) {
  const int64_t V = m.config().vocab_size;
  const auto prompt = prompt_of(9, 1, int(V));
  const std::vector<int32_t> block = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  KVCache a = m.new_cache(), b = m.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput pa{&a, prompt}, pb{&b, prompt};
  m.forward({&pa, 1}, Qwen3Model::Logits::None, {}, out);
  m.forward({&pb, 1}, Qwen3Model::Logits::None, {}, out);
  Qwen3Model::SeqInput blk{&a, block};
  m.forward({&blk, 1}, Qwen3Model::Logits::All, {}, out);
  const auto all = out.logits;
  for (size_t i = 0; i < block.size(); ++i) {
    Qwen3Model::SeqInput one{&b, std::span(block).subspan(i, 1)};
    m.forward({&one, 1}, Qwen3Model::Logits::All, {}, out);
    ASSERT_EQ(0, std::memcmp(out.logits.data(), all.data() + int64_t(i) * V, size_t(V) * 4))
        << "row " << i;
  }
}

// Teacher-forced logits of a 64-token stream, `other` against `ref`: NMSE (against the logits'
// variance about each row's mean) and the share of positions with the same argmax.
struct LogitAgreement {
  double nmse = 0, argmax = 0;
  int positions = 0;
  bool identical = false;
};
inline LogitAgreement logit_agreement(const Qwen3Model& ref, const Qwen3Model& other) {
  const int64_t V = ref.config().vocab_size;
  const auto toks = prompt_of(64, 7, int(V));
  const auto a = all_logits(ref, toks), b = all_logits(other, toks);
  double err = 0, var = 0;
  int agree = 0;
  for (size_t r = 0; r < toks.size(); ++r) {
    const float* x = a.data() + r * size_t(V);
    const float* y = b.data() + r * size_t(V);
    agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
    double mean = 0;
    for (int64_t v = 0; v < V; ++v) mean += x[v];
    mean /= double(V);
    for (int64_t v = 0; v < V; ++v) {
      err += (double(x[v]) - y[v]) * (double(x[v]) - y[v]);
      var += (x[v] - mean) * (x[v] - mean);
    }
  }
  return {err / var, double(agree) / double(toks.size()), int(toks.size()),
          std::memcmp(a.data(), b.data(), a.size() * 4) == 0};
}

// The format's teacher-forced logits against the native model on the fixture targets and the
// shipped one, printed (for the README) and bounded. q8 puts weights and activations on int8 grids
// of 255 steps per 32 values (~0.3% relative error each), bf16 compute rounds them to 8
// significant bits (~0.2%), q4 puts weights on 16 steps per 32 values (~3%: the bounds are the
// caller's); the tiny fixtures' random logits are near-ties at a few positions. A wrong scale,
// index or sign gives NMSE of order 1 and chance agreement (1 in 1024).
inline void expect_logits_close_to_native(ops::WeightFormat format, const char* name,
                                          double nmse_max = 2e-3, double argmax_min = 0.8) {
  for (const char* dir : {"tests/fixtures/tiny-a/target", "tests/fixtures/tiny-a/target_bf16",
                          "models/default/target"}) {
    const Qwen3Model native(dir), other(dir, nullptr, format);
    const auto a = logit_agreement(native, other);
    std::cout << "[ info ] " << dir << ": " << name << " vs native logit NMSE " << a.nmse
              << ", argmax agreement " << a.argmax * 100 << "% over " << a.positions
              << " positions\n";
    EXPECT_LT(a.nmse, nmse_max) << dir;
    EXPECT_GE(a.argmax, argmax_min) << dir;
    EXPECT_FALSE(a.identical) << dir << ": " << name << " changed nothing";
  }
}

}  // namespace flashmap::test
