// The Gram matrix and the Cholesky factor behind the one-step noise factor (ops/gram.h): packing
// into panels, the choice of kernel (active_isa(), as ops::linear chooses), and the threads.
//
// Precision. The reference (target_constants) forms EᵀE in fp32 and factors it in float64. Here
// the products are fp32 fused multiply-adds (a bf16 × bf16 product is exact in fp32, so only the
// sums round), summed in fp32 over at most 256 rows (one pass of gram_accumulate) and then in
// float64 across those runs and across calls: no more rounding than the reference's own fp32 sum
// over the whole vocabulary, so the factor agrees with the reference's within its tolerance.
//
// Threads. The factor is formed on a background thread while the engine decodes, so it may not
// use the engine's ThreadPool (one parallel loop at a time, for the engine). Each call starts its
// own std::threads and joins them. The caller picks how many: FlashMapModel uses every core, as
// the Gram scales with them (Qwen3-8B's 151,936 × 4096 embedding: ~26 s on two Zen 3 cores, twice
// that on one) and drafts draw vocabulary-sized noise until it is ready, so the sooner the better;
// a load followed by an idle server, the common case, loses nothing to it.
#include "ops/gram.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "ops/gemm.h"
#include "ops/gram_kernel.h"
#include "ops/ops.h"

namespace flashmap::ops {

namespace {

using kernel::GramArgs;
using kernel::kGramPanel;
using KernelFn = void (*)(const GramArgs&, int64_t, int64_t);

KernelFn gram_kernel() {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512Bf16:
    case Isa::Avx512Vnni:
    case Isa::Avx512:
      return kernel::gram_f32_avx512;
    case Isa::Avx2Vnni:
    case Isa::Avx2:
      return kernel::gram_f32_avx2;
    case Isa::Generic:
      break;
  }
  return kernel::gram_f32_generic;
}

KernelFn syrk_kernel() {
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512Bf16:
    case Isa::Avx512Vnni:
    case Isa::Avx512:
      return kernel::syrk_f64_avx512;
    case Isa::Avx2Vnni:
    case Isa::Avx2:
      return kernel::syrk_f64_avx2;
    case Isa::Generic:
      break;
  }
  return kernel::syrk_f64_generic;
}

// fn(u) for u in [0, units) on `threads` threads (the caller one of them), each taking the next
// unit as it finishes one: the Gram's row blocks shrink along the triangle, so handing them out
// in order balances the threads to within one block.
template <class Fn>
void for_units(int threads, int64_t units, const Fn& fn) {
  std::atomic<int64_t> next{0};
  const auto work = [&] {
    for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) fn(u);
  };
  std::vector<std::thread> extra;
  const int64_t t = std::min<int64_t>(std::max(threads, 1), units);
  for (int64_t i = 1; i < t; ++i) extra.emplace_back(work);
  work();
  for (auto& th : extra) th.join();
}

// Rows [r0, r1) of E into fp32 panels of 32 columns, k-major, n rows each (kernel::GramArgs):
// E's row r is row r − base of every panel. bf16 widens by a shift, as row_f32 does; f16 goes
// through row_f32.
void pack_rows(const Weight& E, int64_t r0, int64_t r1, int64_t base, int64_t n, float* panels) {
  const int64_t H = E.cols, panels_n = (H + kGramPanel - 1) / kGramPanel;
  std::vector<float> row(static_cast<size_t>(panels_n * kGramPanel), 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    if (E.dtype == DType::BF16) {
      const uint16_t* src = static_cast<const uint16_t*>(E.data) + r * H;
      for (int64_t c = 0; c < H; ++c) row[size_t(c)] = bf16_to_f32(src[c]);
    } else {
      E.row_f32(r, row.data());
    }
    for (int64_t q = 0; q < panels_n; ++q)
      std::memcpy(panels + (q * n + (r - base)) * kGramPanel, row.data() + q * kGramPanel,
                  kGramPanel * sizeof(float));
  }
}

}  // namespace

void gram_accumulate(const Weight& E, int64_t r0, int64_t n, double* G, int threads) {
  FLASHMAP_CHECK(is_float(E.dtype), "gram_accumulate: the embedding is {}, not a float matrix",
                 dtype_name(E.dtype));
  FLASHMAP_CHECK(r0 >= 0 && n >= 0 && r0 + n <= E.rows,
                 "gram_accumulate: rows [{}, {}) are outside the embedding's {} rows", r0, r0 + n,
                 E.rows);
  const int64_t H = E.cols;
  if (n == 0 || H == 0) return;
  const int64_t panels_n = (H + kGramPanel - 1) / kGramPanel;
  // kRowsPerPass rows at a time: their panels (4 MiB at H = 4096) stay in the L3 cache while every
  // thread's row blocks read them, where a whole 2048-row chunk (32 MiB) would stream from memory
  // once per row block.
  constexpr int64_t kRowsPerPass = 256, kPackRows = 64;
  std::vector<float> panels(static_cast<size_t>(panels_n * std::min(n, kRowsPerPass) * kGramPanel));
  const KernelFn fn = gram_kernel();
  for (int64_t p0 = r0; p0 < r0 + n; p0 += kRowsPerPass) {
    const int64_t pn = std::min(kRowsPerPass, r0 + n - p0);
    // Packing on the same threads (~1/H of the arithmetic, but one thread would leave the
    // others idle for it).
    for_units(threads, (pn + kPackRows - 1) / kPackRows, [&](int64_t u) {
      const int64_t a = p0 + u * kPackRows, b = std::min(p0 + pn, a + kPackRows);
      pack_rows(E, a, b, p0, pn, panels.data());
    });
    const GramArgs args{panels.data(), pn, H, G, H};
    for_units(threads, (H + kernel::kGramRows - 1) / kernel::kGramRows, [&](int64_t u) {
      fn(args, u * kernel::kGramRows, std::min<int64_t>(H, (u + 1) * kernel::kGramRows));
    });
  }
}

// Right-looking blocked Cholesky (LAPACK dpotrf's algorithm, lower): per block column of kNb,
// the diagonal block is factored unblocked, the rows below it solved against it, and the trailing
// matrix updated by the float64 kernel, which holds nearly all of the n³/3 multiply-adds.
int64_t cholesky_lower(double* A, int64_t n, int threads) {
  FLASHMAP_CHECK(n >= 0, "cholesky_lower: n = {}", n);
  constexpr int64_t kNb = 128;
  const KernelFn syrk = syrk_kernel();
  std::vector<double> lt(static_cast<size_t>(kNb * kNb)), panels;
  auto at = [&](int64_t i, int64_t j) -> double& { return A[i * n + j]; };
  for (int64_t k0 = 0; k0 < n; k0 += kNb) {
    const int64_t kb = std::min(kNb, n - k0), k1 = k0 + kb;
    // The diagonal block.
    for (int64_t j = k0; j < k1; ++j) {
      double d = at(j, j);
      for (int64_t l = k0; l < j; ++l) d -= at(j, l) * at(j, l);
      if (!(d > 0.0)) return j;
      const double s = std::sqrt(d);
      at(j, j) = s;
      for (int64_t i = j + 1; i < k1; ++i) {
        double x = at(i, j);
        for (int64_t l = k0; l < j; ++l) x -= at(i, l) * at(j, l);
        at(i, j) = x / s;
      }
    }
    if (k1 == n) break;
    // lt = L11ᵀ, so that each row's forward substitution below runs along contiguous memory.
    for (int64_t j = 0; j < kb; ++j)
      for (int64_t l = 0; l <= j; ++l) lt[size_t(l * kb + j)] = at(k0 + j, k0 + l);
    // Rows below: x L11ᵀ = a for each row (x = L21's row), by rows on the threads.
    const int64_t m = n - k1;
    constexpr int64_t kSolveRows = 64;
    for_units(threads, (m + kSolveRows - 1) / kSolveRows, [&](int64_t u) {
      for (int64_t i = k1 + u * kSolveRows; i < std::min(n, k1 + (u + 1) * kSolveRows); ++i) {
        double* x = A + i * n + k0;
        for (int64_t l = 0; l < kb; ++l) {
          const double v = x[l] / lt[size_t(l * kb + l)];
          x[l] = v;
          const double* t = lt.data() + l * kb;
          for (int64_t j = l + 1; j < kb; ++j) x[j] -= v * t[j];
        }
      }
    });
    // A22 −= L21 L21ᵀ: the Gram of L21ᵀ [kb, m], packed as its panels.
    const int64_t panels_n = (m + kGramPanel - 1) / kGramPanel;
    panels.assign(static_cast<size_t>(panels_n * kb * kGramPanel), 0.0);
    for (int64_t i = 0; i < m; ++i) {
      const double* row = A + (k1 + i) * n + k0;
      double* dst = panels.data() + ((i / kGramPanel) * kb) * kGramPanel + i % kGramPanel;
      for (int64_t l = 0; l < kb; ++l) dst[l * kGramPanel] = row[l];
    }
    const GramArgs args{panels.data(), kb, m, A + k1 * n + k1, n};
    // The rows' costs grow along the lower triangle: the last (largest) blocks go first.
    const int64_t units = (m + kernel::kGramRows - 1) / kernel::kGramRows;
    for_units(threads, units, [&](int64_t u) {
      const int64_t b = units - 1 - u;
      syrk(args, b * kernel::kGramRows, std::min<int64_t>(m, (b + 1) * kernel::kGramRows));
    });
  }
  return -1;
}

}  // namespace flashmap::ops
