// Per-request random numbers: xoshiro256++ seeded through SplitMix64. Each request owns one, so
// a run is reproducible from its seed whatever else the engine is doing.
#pragma once

#include <cmath>
#include <cstdint>

namespace flashmap {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) {
    for (auto& s : state_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[0] + state_[3], 23) + state_[0];
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1;
    do u1 = uniform();
    while (u1 <= 0.0);
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = float(r * std::sin(2.0 * M_PI * u2));
    has_spare_ = true;
    return float(r * std::cos(2.0 * M_PI * u2));
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
  float spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace flashmap
