// The GEMM kernel with AVX2 + FMA registers (8 fp32 lanes, 16 registers), for x86-64-v3 CPUs
// without AVX-512. Compiled with -mavx2 -mfma -mf16c -mno-avx512f (16 registers, even in a
// native build on an AVX-512 CPU), and once more with -mavxvnni as gemm_avx2vnni, whose q8 and
// q4 tiles take AVX-VNNI's vpdpbusd (the fp32 formats are the same code in both); nothing here
// may be an inline function shared with other files (see gemm_kernel.h).
#include "ops/gemm_kernel.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace flashmap::ops::kernel {
namespace {

struct V {
  using R = __m256;
  static constexpr int W = 8;
  // 5 rows × 2 vectors = 10 accumulators, 2 weight vectors and a broadcast. Six rows (15 of 16
  // registers) left GCC short of registers for the addresses and prefetch: a 17-row product ran
  // at 57 GFLOP/s cache-hot against 104 with five (bench_ops BM_LinearRows, AMD Zen 3).
  static constexpr int kRowsMax = 5, kNvMany = 2;
  // nv_for(a), a accumulators per vector column: one: 8 vectors (2 panels), 8 independent FMA
  // chains; two: 4 vectors (8 chains).
  static constexpr int kNv1 = 8, kNv2 = 4;
  static constexpr int nv_for(int a, bool) { return a == 1 ? kNv1 : a == 2 ? kNv2 : kNvMany; }

  static R zero() { return _mm256_setzero_ps(); }
  static R bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static R bf16(const uint8_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static R f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  using I = __m256i;
  static constexpr int kRowsMaxQ8 = 3;  // 3 × 2 × (dot + acc) = 12 registers
  static I load_i32(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static R q_byte(I raw, int j, int off) {
    const I b = _mm256_and_si256(_mm256_srli_epi32(raw, 8 * j), _mm256_set1_epi32(0xff));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(off)));
  }
  static R u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static R s8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static I nibbles(I raw, int hi) {
    return _mm256_and_si256(_mm256_srli_epi32(raw, 4 * hi), _mm256_set1_epi32(0x0f0f0f0f));
  }
  static I with_high(I low, I raw, int t) {
    const I at4 = t < 2 ? _mm256_slli_epi32(raw, 4 - 2 * t) : _mm256_srli_epi32(raw, 2 * t - 4);
    return _mm256_or_si256(low, _mm256_and_si256(at4, _mm256_set1_epi32(0x30303030)));
  }
  static I with_bit(I low, I raw, int t) {
    const I at4 = t < 4 ? _mm256_slli_epi32(raw, 4 - t) : _mm256_srli_epi32(raw, t - 4);
    return _mm256_or_si256(low, _mm256_and_si256(at4, _mm256_set1_epi32(0x10101010)));
  }
  static bool int_dot_here(const Args&) { return true; }
  static I set1_i32(int32_t v) { return _mm256_set1_epi32(v); }
  static R i32_to_f32(I v) { return _mm256_cvtepi32_ps(v); }
#if FLASHMAP_AVX2_VNNI
  // vpdpbusd: unsigned q + offset times signed x, 4 bytes a lane into int32, the offset taken
  // out by the sums' start (as the AVX512-VNNI tiles).
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
    return _mm256_dpbusd_avx_epi32(acc, w, x);
  }
  template <int Q>
  static I int_end(I sum, I) {
    return sum;
  }
#else
  // Integer dots by vpmaddubsw (u8 × s8, adjacent pairs summed in int16) and vpmaddwd (pairs of
  // those in int32): exact where no int16 sum passes its range. q8's q + 128 (≤ 255) against x
  // (≤ 127 in magnitude) would, so q8 takes q signed (the offset's bit flipped) times x through
  // |x| and q · sign(x), pairs of at most 2 · 127² widened each group, with no offset in the sums
  // (kIntOffset 0). q4's nibbles (≤ 15) give pairs of at most 2 · 15 · 127 = 3810: a block's 8
  // groups sum in int16 (≤ 30480) and widen once, at its end. q6k's q + 32 (≤ 63) and q5k's q
  // (≤ 31) give pairs of at most 16002 and 7874, widened every group.
  template <int Q>
  static constexpr int kIntOffset = Q == kQ8    ? 0
                                    : Q == kQ6K ? 32
                                                : 8;
  static I widen(I pairs) {
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
  template <int Q>
  static I int_begin(I start) {
    return Q == kQ8 || Q == kQ6K || Q == kQ5K ? start : _mm256_setzero_si256();
  }
  template <int Q>
  static I int_dot(I acc, I w, I x) {
    if constexpr (Q == kQ8) {
      const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80)));
      return _mm256_add_epi32(
          acc, widen(_mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(q, x))));
    } else if constexpr (Q == kQ6K || Q == kQ5K) {
      return _mm256_add_epi32(acc, widen(_mm256_maddubs_epi16(w, x)));
    } else {
      return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x));
    }
  }
  template <int Q>
  static I int_end(I sum, I start) {
    return Q == kQ8 || Q == kQ6K || Q == kQ5K ? sum : _mm256_add_epi32(widen(sum), start);
  }
#endif
  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R load_n(const float* p, int n) {
    return _mm256_maskload_ps(p, mask(n));
  }
  static void store(float* p, R v) {
    _mm256_storeu_ps(p, v);
  }
  static void store_n(float* p, R v, int n) {
    _mm256_maskstore_ps(p, mask(n), v);
  }
};

}  // namespace

#define FLASHMAP_GEMM_INT_DOT 1
#if FLASHMAP_AVX2_VNNI
#define FLASHMAP_GEMM_ENTRY gemm_avx2vnni
#include "ops/gemm_kernel.inc"
#else
#define FLASHMAP_GEMM_ENTRY gemm_avx2
#include "ops/gemm_kernel.inc"
#define FLASHMAP_GRAM_ENTRY(f) f##_avx2
#define FLASHMAP_GRAM_ISA 2
#include "ops/gram_kernel.inc"
#endif

}  // namespace flashmap::ops::kernel

#else
namespace flashmap::ops::kernel {
void gemm_avx2(const Args& a, int64_t p0, int64_t p1) {
  gemm_generic(a, p0, p1);
}
#define FLASHMAP_GRAM_ENTRY(f) f##_avx2
#define FLASHMAP_GRAM_FORWARD
#include "ops/gram_kernel.inc"
}  // namespace flashmap::ops::kernel
#endif
