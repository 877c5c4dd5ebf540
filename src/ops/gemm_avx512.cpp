// The GEMM kernel with AVX-512F registers (16 fp32 lanes, 32 registers), and q8 products with
// AVX512-VNNI int8 dot products. Compiled with -mavx512f -mavx512vnni and run only where the CPU
// has AVX-512F (gemm.cpp checks; the VNNI tiles only where it has VNNI too); nothing here may be
// an inline function shared with other files (see gemm_kernel.h).
#include "ops/gemm_kernel.h"

#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>

namespace flashmap::ops::kernel {
namespace {

struct V {
  using R = __m512;
  static constexpr int W = 16;
  // Float tiles: at most 6 rows × 4 vectors = 24 accumulators, 4 weight vectors and a
  // broadcast, 10 loads a k for 24 FMAs (17 rows as 6 + 6 + 5 ran 12–17% faster cache-hot on
  // Zen 4 than as 9 + 8 rows × 2 vectors, 11 loads for 18 FMAs; 12 rows × 2 slower still: the
  // row addresses no longer fit the integer registers).
  static constexpr int kRowsMax = 6, kNvMany = 2;
  // nv_for(a, q): vectors per row for a accumulators per vector column (q: an integer tile's).
  // One row: 8 vectors (4 panels), 8 independent FMA chains, enough to cover two pipes' FMA
  // latency; up to 6 (integer tiles, which hold their scales' temporaries too, up to 5: 3 rows of
  // q4k ran a fifth slower with 4 vectors): 4 vectors (≤ 24 accumulators), which halves the
  // weight widening per FMA.
  static constexpr int kNv1 = 8, kNv2 = 4;
  static constexpr int nv_for(int a, bool q) {
    return a <= 2 ? kNv1 : a <= (q ? 5 : 6) ? kNv2 : kNvMany;
  }

  static R zero() { return _mm512_setzero_ps(); }
  static R bcast(const float* p) { return _mm512_set1_ps(*p); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R f32(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static R bf16(const uint8_t* p) {
    const __m512i u =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static R f16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  using I = __m512i;
  static constexpr int kRowsMaxQ8 = 6;  // 6 × 2 × (dot + acc) = 24 registers
  static I load_i32(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static R q_byte(I raw, int j, int off) {
    const I b = _mm512_and_si512(_mm512_srli_epi32(raw, unsigned(8 * j)), _mm512_set1_epi32(0xff));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(b, _mm512_set1_epi32(off)));
  }
  static R u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static R s8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static I nibbles(I raw, int hi) {
    return _mm512_and_si512(_mm512_srli_epi32(raw, unsigned(4 * hi)),
                            _mm512_set1_epi32(0x0f0f0f0f));
  }
  static I with_high(I low, I raw, int t) {
    const I at4 = t < 2    ? _mm512_slli_epi32(raw, unsigned(4 - 2 * t))
                  : t == 2 ? raw
                           : _mm512_srli_epi32(raw, 2);
    // (at4 & 0x30303030) | low in one instruction.
    return _mm512_ternarylogic_epi32(at4, _mm512_set1_epi32(0x30303030), low, 0xea);
  }
  static I with_bit(I low, I raw, int t) {
    const I at4 = t < 4    ? _mm512_slli_epi32(raw, unsigned(4 - t))
                  : t == 4 ? raw
                           : _mm512_srli_epi32(raw, unsigned(t - 4));
    return _mm512_ternarylogic_epi32(at4, _mm512_set1_epi32(0x10101010), low, 0xea);
  }
  static __mmask16 mask(int n) { return __mmask16((1u << n) - 1); }
  static R load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, R v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
#ifdef __AVX512VNNI__
  // Integer dots by vpdpbusd (on CPUs with AVX512-VNNI: gemm.cpp sets a.vnni): unsigned q +
  // offset times signed x, 4 bytes a lane, the offset taken out by the sums' start.
  static bool int_dot_here(const Args& a) {
    return a.vnni;
  }
  static I set1_i32(int32_t v) {
    return _mm512_set1_epi32(v);
  }
  static R i32_to_f32(I v) {
    return _mm512_cvtepi32_ps(v);
  }
  template <int Q>
  static constexpr int kIntOffset = Q == kQ8    ? 128
                                    : Q == kQ6K ? 32
                                                : 8;
  template <int Q>
  static I int_begin(I start) {
    return start;
  }
  template <int Q>
  static I int_dot(I acc, I w, I x) {
    return _mm512_dpbusd_epi32(acc, w, x);
  }
  template <int Q>
  static I int_end(I sum, I) {
    return sum;
  }
#endif
};

}  // namespace

#define FLASHMAP_GEMM_ENTRY gemm_avx512
#ifdef __AVX512VNNI__
#define FLASHMAP_GEMM_INT_DOT 1
#endif
#include "ops/gemm_kernel.inc"
#define FLASHMAP_GRAM_ENTRY(f) f##_avx512
#define FLASHMAP_GRAM_ISA 5
#include "ops/gram_kernel.inc"

}  // namespace flashmap::ops::kernel

#else
namespace flashmap::ops::kernel {
// Not compiled for AVX-512 (another architecture): gemm.cpp never selects this.
void gemm_avx512(const Args& a, int64_t p0, int64_t p1) {
  gemm_generic(a, p0, p1);
}
#define FLASHMAP_GRAM_ENTRY(f) f##_avx512
#define FLASHMAP_GRAM_FORWARD
#include "ops/gram_kernel.inc"
}  // namespace flashmap::ops::kernel
#endif
