// The bf16 compute mode's GEMM on AMX tiles (Intel since Sapphire Rapids): tdpbf16ps multiplies a
// tile of up to 16 rows × 32 k of bf16 activations by 32 k × 16 columns of bf16 weights into 16 ×
// 16 fp32 sums, 16 × 16 × 32 multiply-adds per instruction (two cores of an Intel Xeon: 6.9
// TFLOP/s, against 0.23 with vdpbf16ps). The weights' panels (gemm.h's bf16 pairs: per pair of k,
// the 32 columns' pairs side by side, 128 bytes) are already the B operand's layout: 16 pairs of
// one panel, read with a 128-byte stride, are the tile of its first 16 columns, 64 bytes on the
// tile of the other 16. Compiled with -mamx-tile -mamx-bf16 and run only where the CPU has AMX and
// the OS granted the tiles (gemm.cpp checks); nothing here may be an inline function shared with
// other files (see gemm_kernel.h).
//
// The model differs from gemm_avx512bf16's in its sums: the tile instruction adds each tile's
// products to the fp32 sum in an order of its own (its bits differ from a chain of vdpbf16ps).
// It is the same for every row, tile and thread, so rows still do not depend on their batch and
// a verify pass gives the bits of single-token steps; what runs on AMX is lossless with respect
// to itself. Every output is Σ over tiles of k, in order, then + bias.
#include "ops/gemm_kernel.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#include <immintrin.h>

#include <cstring>

// A tile load that tells the compiler it reads memory: GCC 12's _tile_loadd names none, so the
// stores it reads (a zero-padded tail on the stack) could be dropped as dead or moved past it.
#define FLASHMAP_TILE_LOAD(tile, base, stride)                                 \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #tile                          \
                   :                                                           \
                   : "r"(static_cast<const void*>(base)), "r"(int64_t(stride)) \
                   : "memory")

namespace flashmap::ops::kernel {
namespace {

constexpr int64_t kPairBytes = kCols * 4;  // a panel's k pair: 32 columns × 2 bf16
constexpr int kTileRows = 16;              // rows of an A or C tile
constexpr int kTilePairs = 16;             // k pairs of a tile (64 bytes of a row of A)
// Pairs a streaming block fetches ahead into L2: 16 KiB of the panel (Qwen3-8B's 4096² streamed:
// 2 KiB ahead was slower at 1 and 17 rows, 8 to 64 KiB the same, into L1 no better). Where the
// weights are cache-resident (the shipped pair) the prefetches cost more than they save.
constexpr int64_t kPrefetchPairs = 8 * kTilePairs;

// Tiles of a block of R = 2 row tiles: 0, 1 the sums of rows [0, r0) × the panel's two halves, 2,
// 3 those of rows [16, 16 + r1); 4, 5 those rows' activations; 6, 7 the panel's halves. Of one
// row tile (r1 = 0): 0, 1 its sums, and two sets of operands taken in turn, 4 with 6, 7 and 5
// with 2, 3, so that loading the next pairs need not wait for the last product to have read its
// tiles (tiles are not renamed: over cache-resident tiles one set ran at a sixth of the speed).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Loads the tile shapes of a block of r0 + r1 rows, unless this thread has them loaded already.
void configure(int r0, int r1) {
  const bool one = r1 == 0;
  thread_local int have = -1;
  if ((r0 | r1 << 8) == have) return;
  TileConfig c;
  const auto set = [&](int t, int rows) {
    c.rows[t] = uint8_t(rows);
    c.colsb[t] = rows > 0 ? 64 : 0;
  };
  set(0, r0);
  set(1, r0);
  set(4, r0);
  set(2, one ? kTilePairs : r1);
  set(3, one ? kTilePairs : r1);
  set(5, one ? r0 : r1);
  set(6, kTilePairs);
  set(7, kTilePairs);
  // Not _tile_loadconfig: GCC 12's tells the compiler it reads 8 bytes, and the stores of the
  // shapes past them were dropped as dead.
  __asm__ volatile("ldtilecfg %0" : : "m"(c));
  have = r0 | r1 << 8;
}

// 16 pairs of the panel from w (128 bytes apart) into the B tiles, and their products with the
// row tiles' activations from x (rows ldx bytes apart; each tile 1 KiB, the second right after the
// first); SET: which operand set of a one-row-tile block.
template <int R, int SET = 0>
inline void step(const uint8_t* w, const uint32_t* x, int64_t ldx = 64) {
  if constexpr (SET == 1) {
    FLASHMAP_TILE_LOAD(2, w, kPairBytes);
    FLASHMAP_TILE_LOAD(3, w + 64, kPairBytes);
    FLASHMAP_TILE_LOAD(5, x, ldx);
    _tile_dpbf16ps(0, 5, 2);
    _tile_dpbf16ps(1, 5, 3);
    return;
  }
  FLASHMAP_TILE_LOAD(6, w, kPairBytes);
  FLASHMAP_TILE_LOAD(7, w + 64, kPairBytes);
  FLASHMAP_TILE_LOAD(4, x, ldx);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  if constexpr (R == 2) {
    FLASHMAP_TILE_LOAD(5, x + kTileRows * kTilePairs, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// Rows [0, r0 + r1) of x (gemm.cpp's bf16_tiles: 16 pairs of each of the M rows, then the next
// 16, …; zeros past the K's pairs) by the panel at w (`pairs` pairs) into y's first ncols
// columns (+ bias). prefetch: fetch the panel ahead into L2 (the first row block streams it from
// memory; ahead into L1, the fetches wait on the few line fill buffers and the tiles with them).
template <int R>
void block(const uint32_t* xp, int64_t M, int r0, int r1, const uint8_t* w, int64_t pairs, float* y,
           int64_t ldy, const float* bias, int64_t ncols, bool prefetch) {
  configure(r0, r1);
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (R == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t whole = pairs / kTilePairs * kTilePairs;
  for (int64_t kp = 0; kp < whole; kp += kTilePairs) {
    if (prefetch)
      for (int64_t at = (kp + kPrefetchPairs) * kPairBytes, i = 0; i < kTilePairs * 2; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(w + at + i * 64), _MM_HINT_T1);
    if (R == 1 && (kp / kTilePairs) % 2)
      step<R, 1>(w + kp * kPairBytes, xp + kp * M);
    else
      step<R>(w + kp * kPairBytes, xp + kp * M);
  }
  if (const int64_t left = pairs - whole) {
    // The last pairs of the panel, zero past them (the activations are zero there too).
    alignas(64) uint8_t tail[kTilePairs * kPairBytes];
    std::memcpy(tail, w + whole * kPairBytes, size_t(left * kPairBytes));
    std::memset(tail + left * kPairBytes, 0, size_t((kTilePairs - left) * kPairBytes));
    step<R>(tail, xp + whole * M);
  }
  alignas(64) float out[R * kTileRows][kCols];
  _tile_stored(0, &out[0][0], kCols * 4);
  _tile_stored(1, &out[0][16], kCols * 4);
  if constexpr (R == 2) {
    _tile_stored(2, &out[kTileRows][0], kCols * 4);
    _tile_stored(3, &out[kTileRows][16], kCols * 4);
  }
  for (int v = 0; v < 2; ++v) {
    const int64_t left = ncols - v * 16;
    if (left <= 0) break;
    const __mmask16 m = __mmask16(left >= 16 ? 0xffff : (1u << left) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + v * 16) : _mm512_setzero_ps();
    for (int i = 0; i < r0 + r1; ++i) {
      __m512 r = _mm512_load_ps(&out[i][v * 16]);
      if (bias) r = _mm512_add_ps(r, b);
      _mm512_mask_storeu_ps(y + i * ldy + v * 16, m, r);
    }
  }
}

}  // namespace

double amx_bf16_loop(int64_t iters, float* sink) {
  configure(kTileRows, kTileRows);
  alignas(64) static const uint8_t zeros[kTileRows * 64] = {};
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  FLASHMAP_TILE_LOAD(4, zeros, 64);
  FLASHMAP_TILE_LOAD(5, zeros, 64);
  FLASHMAP_TILE_LOAD(6, zeros, 64);
  FLASHMAP_TILE_LOAD(7, zeros, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[kTileRows][16];
  _tile_stored(0, &out[0][0], 64);
  *sink = out[0][0];
  return double(iters) * 4 * kTileRows * 16 * 2 * kTilePairs * 2;
}

// Panels [p0, p1), panel-outer so that every row block after the first finds the panel in L2;
// rows in as few blocks of at most 32 (two row tiles) as possible, of sizes differing by at most
// one.
void gemm_amx_bf16(const Args& a, int64_t p0, int64_t p1) {
  const int64_t pairs = (a.K + 1) / 2, rows_max = 2 * kTileRows;
  const int64_t blocks = (a.M + rows_max - 1) / rows_max, base = a.M / blocks, extra = a.M % blocks;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n = p * kCols;
    int64_t m = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int mr = int(base + (b < extra ? 1 : 0));
      const int r0 = mr < kTileRows ? mr : kTileRows, r1 = mr - r0;
      const auto run = r1 > 0 ? block<2> : block<1>;
      run(a.xp + m * kTilePairs, a.M, r0, r1, a.panels + p * a.panel_bytes, pairs,
          a.y + m * a.ldy + n, a.ldy, a.bias ? a.bias + n : nullptr, a.N - n, b == 0);
      m += mr;
    }
  }
}

// --- matmul_rows -------------------------------------------------------------------------------

// The embedding product's strip (matmul_rows_avx512bf16 builds it: np pairs of 32 columns, a
// panel's layout) times x's rows (pairs, row stride ldp, from pair q0), continuing y's sums.
void strip_product_amx(const uint32_t* xp, int64_t ldp, int64_t M, const uint32_t* strip,
                       int64_t q0, int64_t np, float* y, int64_t H, int valid, bool first) {
  const auto* w = reinterpret_cast<const uint8_t*>(strip);
  const int64_t whole = np / kTilePairs * kTilePairs, left = np - whole;
  for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
    const int r = int(M - m0 < kTileRows ? M - m0 : kTileRows);
    configure(r, 0);
    // The sums stay in y where its 32 columns are whole; a last narrower strip goes through out.
    const bool whole_cols = valid == kCols;
    float* c = y + m0 * H;
    alignas(64) float out[kTileRows][kCols];
    if (whole_cols && first) {
      _tile_zero(0);
      _tile_zero(1);
    } else if (whole_cols) {
      FLASHMAP_TILE_LOAD(0, c, H * 4);
      FLASHMAP_TILE_LOAD(1, c + 16, H * 4);
    } else {
      std::memset(out, 0, sizeof(out));
      if (!first)
        for (int i = 0; i < r; ++i) std::memcpy(out[i], c + i * H, size_t(valid) * 4);
      FLASHMAP_TILE_LOAD(0, &out[0][0], kCols * 4);
      FLASHMAP_TILE_LOAD(1, &out[0][16], kCols * 4);
    }
    const uint32_t* x = xp + m0 * ldp + q0;
    for (int64_t kp = 0; kp < whole; kp += kTilePairs) {
      if ((kp / kTilePairs) % 2)
        step<1, 1>(w + kp * kPairBytes, x + kp, ldp * 4);
      else
        step<1>(w + kp * kPairBytes, x + kp, ldp * 4);
    }
    if (left) {
      // The chunk's last pairs, zero past them in both operands.
      alignas(64) uint8_t tail[kTilePairs * kPairBytes] = {};
      alignas(64) uint32_t xt[kTileRows][kTilePairs] = {};
      std::memcpy(tail, w + whole * kPairBytes, size_t(left * kPairBytes));
      for (int i = 0; i < r; ++i) std::memcpy(xt[i], x + i * ldp + whole, size_t(left) * 4);
      step<1>(tail, &xt[0][0], kTilePairs * 4);
    }
    if (whole_cols) {
      _tile_stored(0, c, H * 4);
      _tile_stored(1, c + 16, H * 4);
      continue;
    }
    _tile_stored(0, &out[0][0], kCols * 4);
    _tile_stored(1, &out[0][16], kCols * 4);
    for (int i = 0; i < r; ++i) std::memcpy(c + i * H, out[i], size_t(valid) * 4);
  }
}

}  // namespace flashmap::ops::kernel

#else
#include "core/check.h"

namespace flashmap::ops::kernel {
// Not compiled for AMX: gemm.cpp never selects it (Isa::Amx is not detected).
void gemm_amx_bf16(const Args&, int64_t, int64_t) {
  throw InternalError("the AMX kernel was not compiled into this build");
}
double amx_bf16_loop(int64_t, float*) {
  throw InternalError("the AMX kernel was not compiled into this build");
}
void strip_product_amx(const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, int64_t, float*,
                       int64_t, int, bool) {
  throw InternalError("the AMX kernel was not compiled into this build");
}
}  // namespace flashmap::ops::kernel
#endif
