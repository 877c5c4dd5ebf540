// The interface between the GEMM driver (gemm.cpp) and its per-instruction-set kernels
// (gemm_avx512.cpp, gemm_avx2.cpp, gemm_generic.cpp, each compiled with its own flags from
// gemm_kernel.inc). Plain data only: those files must not instantiate any inline function or
// template shared with the rest of the program, or the linker could keep an AVX-512 copy of it
// for code that runs on any CPU.
#pragma once

#include <cstdint>

namespace flashmap::ops::kernel {

// kBF16Dot: the bf16 compute mode's panels (gemm.h), run by gemm_avx512bf16 or gemm_amx_bf16. kQ4K,
// kQ5K, kQ6K: ggml's Q4_K, Q5_K and Q6_K super-blocks held exactly (gemm.h).
enum Format : int {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kQ8 = 3,
  kBF16Dot = 4,
  kQ4 = 5,
  kQ4K = 6,
  kQ6K = 7,
  kQ5K = 8
};

// The integer formats' bytes, as gemm_kernel.inc lays them out: the packers (gemm.cpp) and the
// kernels read these sizes from here.
constexpr int kCols = 32;                                   // output columns per panel
constexpr int kBlockK = 32;                                 // k per q8 or q4 scale
constexpr int64_t kQ8Bytes = int64_t(kBlockK) * kCols;      // a q8 block's q
constexpr int64_t kQ4Bytes = int64_t(kBlockK) * kCols / 2;  // a q4 or q4k block's nibbles
constexpr int64_t kScaleBytes = int64_t(kCols) * 2;         // a block's fp16 scales (q8, q4)
constexpr int kQ4KBlocks = 8;  // blocks per q4k, q5k or q6k super-block
constexpr int64_t kQ4KHeadBytes = 4 * kCols * 4 + 2 * kCols * 2;  // sc, m; d; −dmin (q4k, q5k)
constexpr int64_t kQ4KSuperBytes = kQ4KHeadBytes + kQ4KBlocks * kQ4Bytes;
constexpr int64_t kQ5HighBytes = int64_t(kBlockK) * kCols / 8;  // a q5k block's fifth bits
constexpr int64_t kQ5KSuperBytes = kQ4KHeadBytes + kQ4KBlocks * (kQ4Bytes + kQ5HighBytes);
constexpr int64_t kQ6HighBytes = int64_t(kBlockK) * kCols / 4;  // a q6k block's high bit pairs
constexpr int64_t kQ6KHeadBytes = 4 * kCols * 4 + kCols * 2;    // 16 scales; d
constexpr int64_t kQ6KSuperBytes = kQ6KHeadBytes + kQ4KBlocks * (kQ4Bytes + kQ6HighBytes);

// y[m, n] = Σ_k x[m, k] · W[n, k] (+ bias[n]) for m < M and the columns of panels [p0, p1).
struct Args {
  const float* x;
  int64_t M, ldx;
  const uint8_t* panels;  // PackedWeight::data
  int64_t panel_bytes, N, K;
  Format format;
  const float* bias;  // may be null
  float* y;
  int64_t ldy;
  // kQ8, kQ4 and the K formats: x quantized per row and block of 32 k (gemm.cpp): qx int8 [M, K],
  // the same values as fp32 in qxf, dx the blocks' fp32 scales and sx the sums of their qx [M,
  // K/32]; sx16 the sums of each half block's qx [M, K/16] (q6k's scales are per 16 k).
  const int8_t* qx;
  const float* qxf;
  const float* dx;
  const int32_t* sx;
  bool vnni;  // AVX-512 kernel: int8 dot products (AVX512-VNNI) for the integer formats
  // kBF16Dot: x rounded to bf16 and paired along k (gemm.cpp): xp [M, ceil(K/2)] with row stride
  // ldp, each uint32 holding x[m, 2kp] in its low half and x[m, 2kp + 1] (0 past K) in its high.
  const uint32_t* xp;
  int64_t ldp;
  bool accumulate = false;  // kF32, kBF16, kF16: continue the sums y holds (a later slice of k)
  const int32_t* sx16 = nullptr;
  // The calling core's L2 bytes: kQ8 and kQ4 fetch as much of the next tile's panels into it as
  // fits beside the panels being read and the rows of x (gemm_kernel.inc's q_prefetch).
  int64_t l2_bytes = 0;
};

void gemm_generic(const Args& a, int64_t p0, int64_t p1);
void gemm_avx2(const Args& a, int64_t p0, int64_t p1);
// gemm_avx2.cpp compiled again with -mavxvnni (x86-64 builds: FLASHMAP_HAS_AVX_VNNI_KERNEL).
void gemm_avx2vnni(const Args& a, int64_t p0, int64_t p1);
void gemm_avx512(const Args& a, int64_t p0, int64_t p1);
void gemm_avx512bf16(const Args& a, int64_t p0, int64_t p1);  // kBF16Dot only
// kBF16Dot on AMX tiles (gemm_amx.cpp). xp holds the same pairs tile by tile: 16 pairs of each
// of the M rows, then their next 16, … (zeros past the K's pairs; ldp unused).
void gemm_amx_bf16(const Args& a, int64_t p0, int64_t p1);
// `iters` times four tile products on one thread (the tiles' peak); returns the flops.
double amx_bf16_loop(int64_t iters, float* sink);
// The bf16 compute mode's ops::matmul_rows: y[m, h] = Σ_v x[m, v] · E[v, h] for h in [h0, h1),
// x given as bf16 pairs along v (xp [M, ceil(V/2)], row stride ldp, as Args::xp), E [V, H] in
// `format` (kF32, kBF16 or kF16; rounded to bf16 to nearest even), sums in fp32 in order of v,
// from zero or (accumulate) from what y holds.
// strips: the thread's scratch (strip_words words, 64-byte aligned, best about half its core's L2),
// where it lays out the rows of E it reads.
// strip_product: what multiplies x's rows by each strip of E it builds (np pairs of 32 columns,
// the panels' layout, from pair q0 on), continuing y's sums (first: from zero); null: its own
// vdpbf16ps tiles.
using StripProduct = void (*)(const uint32_t* xp, int64_t ldp, int64_t M, const uint32_t* strip,
                              int64_t q0, int64_t np, float* y, int64_t H, int valid, bool first);
void matmul_rows_avx512bf16(const uint32_t* xp, int64_t ldp, int64_t M, const void* E,
                            Format format, int64_t V, int64_t H, float* y, int64_t h0, int64_t h1,
                            uint32_t* strips, int64_t strip_words, bool accumulate = false,
                            StripProduct strip_product = nullptr);
// The strip product on AMX tiles (gemm_amx.cpp): sums tile by tile of 16 pairs, in the tiles'
// own order within one.
void strip_product_amx(const uint32_t* xp, int64_t ldp, int64_t M, const uint32_t* strip,
                       int64_t q0, int64_t np, float* y, int64_t H, int valid, bool first);

// Panels each kernel wants per thread chunk (its widest one-row tile), so that chunks split on
// tile boundaries.
constexpr int kPanelsPerUnit = 4;

}  // namespace flashmap::ops::kernel

#include "ops/gram_kernel.h"  // the Gram kernels, compiled into the same files
