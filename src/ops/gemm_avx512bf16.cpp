// The GEMM kernel of the bf16 compute mode: AVX512-BF16 dot products (vdpbf16ps), each taking two
// k of bf16 weights and bf16 activations into an fp32 sum, 32 multiply-adds per instruction where
// the fp32 kernel's FMA does 16. Compiled with -mavx512bf16 and run only where the CPU has it
// (gemm.cpp checks); nothing here may be an inline function shared with other files (see
// gemm_kernel.h).
//
// The mode's model: weights rounded to bf16 at load, each row of activations rounded to bf16 (to
// nearest even, gemm.cpp) before a product, sums in fp32. Every output is
// acc = dpbf16(acc, x pair kp, w pair kp) for kp = 0 … ceil(K/2)−1 in order, then acc + bias,
// whatever M, the tile or the thread: a verify pass gives the bits of single-token steps, so
// speculative decoding in this mode reproduces this mode's own target-alone output.
#include "ops/gemm_kernel.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

namespace flashmap::ops::kernel {
namespace {

constexpr int kW = 16;  // columns per vector
// A panel's k pair: 32 columns × (w[2kp], w[2kp+1]), 128 bytes; a vector holds 16 columns' pairs.
constexpr int64_t kPairBytes = kCols * 4;
// Pairs a streaming tile prefetches ahead (16 × 128 B per panel).
constexpr int64_t kPrefetchPairs = 16;
// Rows of a tile of one panel: 12 × 2 accumulators, 2 weight vectors and a broadcast.
constexpr int kRowsMax = 12;
// Pairs per slice when several row blocks share a panel, as the fp32 kernel's kSliceK: each row
// block's pass must find the panel's slice (64 KiB) still in L2.
constexpr int64_t kSlicePairs = 512;

__mmask16 mask(int n) {
  return __mmask16((1u << n) - 1);
}
// Columns of vector v (16 wide) among the first `ncols` of a tile: 0 … 16.
int lanes(int64_t ncols, int v) {
  const int64_t left = ncols - int64_t(v) * kW;
  return left <= 0 ? 0 : left >= kW ? kW : int(left);
}

// MR rows × NV vectors (NV / 2 whole panels from the panel at w): x pairs of the tile's first row
// (row stride ldp), pairs [0, np) of this slice.
template <int MR, int NV>
void tile(const uint32_t* xp, int64_t ldp, const uint8_t* w, int64_t panel_bytes, int64_t np,
          float* y, int64_t ldy, const float* bias, int64_t ncols, bool first, bool prefetch) {
  int valid[NV];
  const uint8_t* col[NV];
  for (int v = 0; v < NV; ++v) {
    valid[v] = lanes(ncols, v);
    col[v] = w + (v / 2) * panel_bytes + (v % 2) * 64;
  }
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v)
      acc[i][v] = first || valid[v] == 0
                      ? _mm512_setzero_ps()
                      : _mm512_maskz_loadu_ps(mask(valid[v]), y + i * ldy + v * kW);
  for (int64_t kp = 0; kp < np; ++kp) {
    if (prefetch)
      for (int q = 0; q < NV / 2; ++q) {
        const uint8_t* line = w + q * panel_bytes + (kp + kPrefetchPairs) * kPairBytes;
        __builtin_prefetch(line);
        __builtin_prefetch(line + 64);
      }
    __m512bh wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(col[v] + kp * kPairBytes);
    for (int i = 0; i < MR; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[i * ldp + kp]));
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], xb, wv[v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      if (valid[v] == 0) continue;
      __m512 r = acc[i][v];
      if (bias) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask(valid[v]), bias + v * kW));
      _mm512_mask_storeu_ps(y + i * ldy + v * kW, mask(valid[v]), r);
    }
}

// tile<mr, NV> for a run-time mr in 1 … MAX.
template <int NV, int MAX, int MR = 1>
void tile_rows(int mr, const uint32_t* xp, int64_t ldp, const uint8_t* w, int64_t panel_bytes,
               int64_t np, float* y, int64_t ldy, const float* bias, int64_t ncols, bool first,
               bool prefetch) {
  if constexpr (MR <= MAX) {
    if (mr == MR)
      tile<MR, NV>(xp, ldp, w, panel_bytes, np, y, ldy, bias, ncols, first, prefetch);
    else
      tile_rows<NV, MAX, MR + 1>(mr, xp, ldp, w, panel_bytes, np, y, ldy, bias, ncols, first,
                                 prefetch);
  }
}

// Panels [p0, p1) in tiles of NV / 2 panels (one panel at a time where fewer remain), panel-outer
// so that every row block reads a panel while it is in cache; the first row block streams it and
// prefetches ahead. Rows in as few blocks of at most kRowsMax as possible, of sizes differing by at
// most one; MAX: the most rows a block of this call has (NV > 2 only for M <= MAX).
template <int NV, int MAX>
void run_nv(const Args& a, int64_t p0, int64_t p1) {
  const int64_t pairs = (a.K + 1) / 2;
  const int64_t blocks = (a.M + kRowsMax - 1) / kRowsMax, base = a.M / blocks, extra = a.M % blocks;
  const bool sliced = blocks > 1 && pairs > kSlicePairs;
  for (int64_t k0 = 0; k0 < pairs; k0 += sliced ? kSlicePairs : pairs) {
    const int64_t np = sliced && k0 + kSlicePairs < pairs ? kSlicePairs : pairs - k0;
    const bool first = k0 == 0, last = k0 + np == pairs;
    auto rows = [&]<int TNV>(int64_t p) {
      const int64_t n = p * kCols;
      int64_t m = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int mr = int(base + (b < extra ? 1 : 0));
        tile_rows<TNV, MAX>(mr, a.xp + m * a.ldp + k0, a.ldp,
                            a.panels + p * a.panel_bytes + k0 * kPairBytes, a.panel_bytes, np,
                            a.y + m * a.ldy + n, a.ldy, a.bias && last ? a.bias + n : nullptr,
                            a.N - n, first, b == 0);
        m += mr;
      }
    };
    int64_t p = p0;
    if constexpr (NV > 2)
      for (; p + NV / 2 <= p1; p += NV / 2) rows.template operator()<NV>(p);
    for (; p < p1; ++p) rows.template operator()<2>(p);
  }
}

// --- matmul_rows ------------------------------------------------------------------------------

// 16 floats to bf16 by this file's own rounding (an inline function shared with other files could
// be linked from here into code that runs on any CPU): to nearest even, NaN kept NaN, as
// core/dtype.h's f32_to_bf16 rounds.
__m256i round_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan,
                            _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

// Row v of E's 32 columns from `at` (the first `valid` of them; zeros past) as 32 bf16.
template <Format F>
[[gnu::always_inline]] inline __m512i row_bf16(const void* E, int64_t at, int valid) {
  const __mmask32 m = valid >= 32 ? 0xffffffffu : (1u << valid) - 1;
  if constexpr (F == kBF16) {
    return _mm512_maskz_loadu_epi16(m, static_cast<const uint16_t*>(E) + at);
  } else {
    const __mmask16 m0 = __mmask16(m & 0xffff), m1 = __mmask16(m >> 16);
    __m512 lo, hi;
    if constexpr (F == kF32) {
      lo = _mm512_maskz_loadu_ps(m0, static_cast<const float*>(E) + at);
      hi = _mm512_maskz_loadu_ps(m1, static_cast<const float*>(E) + at + 16);
    } else {  // f16 widens exactly
      lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, static_cast<const uint16_t*>(E) + at));
      hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, static_cast<const uint16_t*>(E) + at + 16));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(round_bf16(lo)), round_bf16(hi), 1);
  }
}

// A chunk's strips (one per 32 columns of a group, its pairs in a panel's layout) fill the
// scratch: they stay in L2 while x's rows run over them, and each row of E is read once per
// group, in one run over its columns (a pair of rows as two sequential streams), which the
// hardware prefetchers follow. Slicing rows by 32 columns instead, 512 rows at a time, touched
// one cache line per row and page: 4× under the read bandwidth at Qwen3-8B's table. Fewer pairs
// per chunk cost more in the products' sums carried from chunk to chunk.
// Strips lie `chunk` pairs and 64 bytes apart: the stores of one pair's strips, a strip apart, fall
// into different L1 sets (a stride of whole pages put them all into one).
constexpr int64_t kStripPad = 16;
// Pairs per chunk: a whole number of AMX tiles (16 pairs), so that chunking leaves the sums' order
// one run over the vocabulary.
constexpr int64_t kChunkPairsMin = 16, kChunkPairsMax = 256;
// Pairs of rows of E fetched ahead of the one being laid out: the prefetchers stop at page
// boundaries, and a thread's part of a row is about a page at Qwen3-8B's width.
constexpr int64_t kAheadPairs = 2;

// The chunk's strips: strip s holds, for each pair p of the chunk (pairs q0 …), the 32 columns'
// (E[2p, h + c], E[2p + 1, h + c]) with h = h0 + 32 s, two rows of E interleaved 16 bits at a time
// (the even v in the low half), strip after strip `chunk` pairs and kStripPad words apart.
template <Format F>
void lay_out_rows(const void* E, int64_t V, int64_t H, int64_t h0, int64_t h1, int64_t q0,
                  int64_t np, int64_t chunk, uint32_t* strips) {
  constexpr int64_t elem = F == kF32 ? 4 : 2;
  // Word j of the pair vectors: column j / 2 (+ 16 for the second) of row a (even j) or b (odd).
  alignas(64) uint16_t lo_idx[32], hi_idx[32];
  for (int j = 0; j < 32; ++j) {
    lo_idx[j] = uint16_t(j / 2 + (j % 2 ? 32 : 0));
    hi_idx[j] = uint16_t(16 + j / 2 + (j % 2 ? 32 : 0));
  }
  const __m512i interleave_lo = _mm512_load_si512(lo_idx),
                interleave_hi = _mm512_load_si512(hi_idx);
  const auto* bytes = static_cast<const char*>(E);
  for (int64_t p = 0; p < np; ++p) {
    const int64_t v = 2 * (q0 + p), ahead = v + 2 * kAheadPairs;
    const bool fetch = ahead + 1 < V;
    uint32_t* dst = strips + p * kCols;
    for (int64_t h = h0; h < h1; h += kCols, dst += chunk * kCols + kStripPad) {
      if (fetch)
        for (int64_t b = 0; b < kCols * elem; b += 64) {
          _mm_prefetch(bytes + (ahead * H + h) * elem + b, _MM_HINT_T1);
          _mm_prefetch(bytes + ((ahead + 1) * H + h) * elem + b, _MM_HINT_T1);
        }
      const int valid = int(h1 - h < kCols ? h1 - h : kCols);
      const __m512i a = row_bf16<F>(E, v * H + h, valid);
      const __m512i b = v + 1 < V ? row_bf16<F>(E, (v + 1) * H + h, valid) : _mm512_setzero_si512();
      _mm512_store_si512(dst, _mm512_permutex2var_epi16(a, interleave_lo, b));
      _mm512_store_si512(dst + 16, _mm512_permutex2var_epi16(a, interleave_hi, b));
    }
  }
}

void lay_out(const void* E, Format f, int64_t V, int64_t H, int64_t h0, int64_t h1, int64_t q0,
             int64_t np, int64_t chunk, uint32_t* strips) {
  if (f == kBF16) return lay_out_rows<kBF16>(E, V, H, h0, h1, q0, np, chunk, strips);
  if (f == kF32) return lay_out_rows<kF32>(E, V, H, h0, h1, q0, np, chunk, strips);
  lay_out_rows<kF16>(E, V, H, h0, h1, q0, np, chunk, strips);
}

template <int MR>
void strip_tile(const uint32_t* xp, int64_t ldp, const uint32_t* strip, int64_t p0, int64_t np,
                float* y, int64_t H, int valid, bool first) {
  const int n[2] = {lanes(valid, 0), lanes(valid, 1)};
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < 2; ++v)
      acc[i][v] = first || n[v] == 0 ? _mm512_setzero_ps()
                                     : _mm512_maskz_loadu_ps(mask(n[v]), y + i * H + kW * v);
  for (int64_t p = 0; p < np; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(strip + p * kCols);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(strip + p * kCols + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[i * ldp + p0 + p]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xb, w0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xb, w1);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < 2; ++v)
      if (n[v]) _mm512_mask_storeu_ps(y + i * H + kW * v, mask(n[v]), acc[i][v]);
}

template <int MR = 1>
void strip_rows(int mr, const uint32_t* xp, int64_t ldp, const uint32_t* strip, int64_t p0,
                int64_t np, float* y, int64_t H, int valid, bool first) {
  if constexpr (MR <= kRowsMax) {
    if (mr == MR)
      strip_tile<MR>(xp, ldp, strip, p0, np, y, H, valid, first);
    else
      strip_rows<MR + 1>(mr, xp, ldp, strip, p0, np, y, H, valid, first);
  }
}

}  // namespace

void matmul_rows_avx512bf16(const uint32_t* xp, int64_t ldp, int64_t M, const void* E,
                            Format format, int64_t V, int64_t H, float* y, int64_t h0, int64_t h1,
                            uint32_t* strips, int64_t strip_words, bool accumulate,
                            StripProduct strip_product) {
  // Columns of a group: 16 pairs of each strip at least.
  const int64_t group = strip_words / (kChunkPairsMin * kCols + kStripPad) * kCols;
  if (h1 - h0 > group) {
    for (int64_t g = h0; g < h1; g += group)
      matmul_rows_avx512bf16(xp, ldp, M, E, format, V, H, y, g, h1 - g < group ? h1 : g + group,
                             strips, strip_words, accumulate, strip_product);
    return;
  }
  if (h1 <= h0) return;
  const int64_t pairs = (V + 1) / 2, slices = (h1 - h0 + kCols - 1) / kCols;
  int64_t chunk = (strip_words / slices - kStripPad) / kCols / kChunkPairsMin * kChunkPairsMin;
  chunk = chunk > kChunkPairsMax ? kChunkPairsMax : chunk;
  for (int64_t q0 = 0; q0 < pairs; q0 += chunk) {
    const int64_t np = pairs - q0 < chunk ? pairs - q0 : chunk;
    lay_out(E, format, V, H, h0, h1, q0, np, chunk, strips);
    const bool first = q0 == 0 && !accumulate;
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t h = h0 + s * kCols;
      const int valid = int(h1 - h < kCols ? h1 - h : kCols);
      const uint32_t* strip = strips + s * (chunk * kCols + kStripPad);
      if (strip_product) {
        strip_product(xp, ldp, M, strip, q0, np, y + h, H, valid, first);
        continue;
      }
      for (int64_t m = 0; m < M; m += kRowsMax) {
        const int mr = int(M - m < kRowsMax ? M - m : kRowsMax);
        strip_rows(mr, xp + m * ldp, ldp, strip, q0, np, y + m * H + h, H, valid, first);
      }
    }
  }
}

// Widest tile the row count allows, as the fp32 kernel: one or two rows keep 8 vectors of
// accumulators (4 panels) in flight, up to five 4 vectors, more rows one panel each.
void gemm_avx512bf16(const Args& a, int64_t p0, int64_t p1) {
  if (a.M <= 2) return run_nv<8, 2>(a, p0, p1);
  if (a.M <= 5) return run_nv<4, 5>(a, p0, p1);
  run_nv<2, kRowsMax>(a, p0, p1);
}

}  // namespace flashmap::ops::kernel

#else
#include "core/check.h"

namespace flashmap::ops::kernel {
// Not compiled for AVX512-BF16: gemm.cpp never selects these (the mode is refused at load).
void gemm_avx512bf16(const Args&, int64_t, int64_t) {
  throw InternalError("the bf16 compute kernel was not compiled into this build");
}
void matmul_rows_avx512bf16(const uint32_t*, int64_t, int64_t, const void*, Format, int64_t,
                            int64_t, float*, int64_t, int64_t, uint32_t*, int64_t, bool,
                            StripProduct) {
  throw InternalError("the bf16 compute kernel was not compiled into this build");
}
}  // namespace flashmap::ops::kernel
#endif
