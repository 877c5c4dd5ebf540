// The GEMM kernel in scalar C++ (one lane): the fallback for CPUs without AVX2 and FMA, and the
// proof that the vector kernels do nothing but reorder instructions: fmaf is the same correctly
// rounded fused multiply-add, so all three give the same bits (tests/ops/test_gemm.cpp).
#include <cstring>

#include "core/dtype.h"
#include "ops/gemm_kernel.h"

namespace flashmap::ops::kernel {
namespace {

struct V {
  using R = float;
  static constexpr int W = 1;
  static constexpr int kRowsMax = 4, kNvMany = 32;  // a whole panel per tile
  static constexpr int kNv1 = 32, kNv2 = 32;
  static constexpr int nv_for(int, bool) { return kNvMany; }

  static R zero() { return 0.0f; }
  static R bcast(const float* p) { return *p; }
  static R fma(R a, R b, R c) { return __builtin_fmaf(a, b, c); }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
  static R f32(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  static R bf16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return bf16_to_f32(h);
  }
  static R f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
  }
  using I = uint32_t;
  static constexpr int kRowsMaxQ8 = 4;
  static I load_i32(const uint8_t* p) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return u;
  }
  static R q_byte(I raw, int j, int off) { return float(int((raw >> (8 * j)) & 0xff) - off); }
  static R u8(const uint8_t* p) { return float(*p); }
  static R s8(const uint8_t* p) { return float(int8_t(*p)); }
  static I nibbles(I raw, int hi) { return (raw >> (4 * hi)) & 0x0f0f0f0fu; }
  static I with_high(I low, I raw, int t) { return low | (((raw >> (2 * t)) & 0x03030303u) << 4); }
  static I with_bit(I low, I raw, int t) { return low | (((raw >> t) & 0x01010101u) << 4); }
  static R load_n(const float* p, int n) { return n > 0 ? *p : 0.0f; }
  static void store(float* p, R v) { *p = v; }
  static void store_n(float* p, R v, int n) {
    if (n > 0) *p = v;
  }
};

}  // namespace

#define FLASHMAP_GEMM_ENTRY gemm_generic
#include "ops/gemm_kernel.inc"
#define FLASHMAP_GRAM_ENTRY(f) f##_generic
#define FLASHMAP_GRAM_ISA 0
#include "ops/gram_kernel.inc"

}  // namespace flashmap::ops::kernel
