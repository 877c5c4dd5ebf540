// Micro-benchmarks of the CPU linear kernel at the shapes that decide speculative decoding's cost
// on CPU: one row (a decode step, bandwidth-bound once the weights leave the caches) against the
// K+1 rows of a verify pass (compute-bound). Counters: GFLOP/s (2·M·N·K per call), its share of
// this machine's peak for the mode (fp32 FMA, bf16 or int8 dot products; measured at start-up,
// same threads), and the weight bytes streamed per second.
//
//   ./build/bench/bench_ops --benchmark_filter='Linear|FmaPeak'
//   ./build/bench/bench_ops --benchmark_filter='Qwen3_8B|Bf16|FmaPeak'   (the bf16 compute mode)
//   FLASHMAP_ISA=avx2 ./build/bench/bench_ops ...   (the AVX2 kernel on an AVX-512 CPU)
#include <benchmark/benchmark.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "ops/gemm.h"
#include "ops/gram.h"
#include "ops/ops.h"
#include "ops/roofline.h"

namespace {

using namespace flashmap;

// The fp32 FMA peak of the pool's threads (ops/roofline.h: independent chains of multiply-adds
// on the active kernel's registers).
double fma_peak_gflops() {
  return ops::fma_peak_gflops(ThreadPool::global());
}

double peak() {
  static const double p = fma_peak_gflops();
  return p;
}

void BM_FmaPeak(benchmark::State& state) {
  for (auto _ : state) state.counters["GFLOP/s"] = fma_peak_gflops();
  state.SetLabel(std::to_string(ThreadPool::global().size()) + " threads");
}

// The bf16 compute mode's peak (AMX tile products, else AVX512-BF16 dot products), what its
// products are shares of.
double bf16_peak() {
  static const double p = ops::bf16_dot_peak_gflops(ThreadPool::global());
  return p;
}

void BM_Bf16DotPeak(benchmark::State& state) {
  if (!ops::has_bf16_compute()) return state.SkipWithError("no bf16 compute kernel on this CPU");
  for (auto _ : state) state.counters["GFLOP/s"] = ops::bf16_dot_peak_gflops(ThreadPool::global());
  state.SetLabel(std::to_string(ThreadPool::global().size()) + " threads, " +
                 ops::isa_name(ops::active_isa()));
}

// The int8 dot-product peak of the active kernel's q8/q4 tiles (0 where they widen to fp32).
double int8_peak() {
  static const double p = ops::int8_dot_peak_gops(ThreadPool::global());
  return p;
}

void BM_Int8DotPeak(benchmark::State& state) {
  if (int8_peak() <= 0) return state.SkipWithError("no integer dot products in this kernel");
  for (auto _ : state) state.counters["GOP/s"] = ops::int8_dot_peak_gops(ThreadPool::global());
  state.SetLabel(std::to_string(ThreadPool::global().size()) + " threads " +
                 ops::isa_name(ops::active_isa()));
}

// The q8 tile's instruction mix, built up in steps, so that the share of the int8 peak each part
// costs is measured rather than guessed: the inner loop of a 6-row × 2-vector integer tile
// (gemm_kernel.inc's tile_q_int with AVX512-VNNI) on every thread of the pool. Mix 0: vpdpbusd
// alone, 12 chains, operands in registers (the peak's loop); 1: + the weights' loads and each
// row's 4 activation bytes broadcast from memory (48 broadcasts per 96 dots), cache-resident; 2:
// + each block's end as the kernel has it (int32 → fp32, the row's scale times the columns', a
// multiply-add into the fp32 sums, the next block's sums restarted at −128 · Σ qx); 3: the same
// with the weights read from 4 MiB (L3) instead of 64 KiB. A product at mix 3's share is at the
// ceiling of this format (Q8_0 blocks of 32 on both sides: a float scale per block and row).
#if defined(__GNUC__) && defined(__x86_64__)
// GCC 12 warns that its own intrinsics' undefined pass-through registers are uninitialized
// (_mm512_cvtepi32_ps, _mm512_cvtph_ps) once inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <int Mix>
__attribute__((target("avx512f,avx512vnni"), noinline)) void int8_tile_mix(
    int64_t blocks, const int8_t* x, const uint8_t* w, int64_t w_blocks, const float* dx,
    const int32_t* sx, float* out) {
  constexpr int MR = 6, NV = 2;
  __m512i dot[MR][NV];
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v)
      dot[i][v] = _mm512_set1_epi32(i + v), acc[i][v] = _mm512_setzero_ps();
  const __m512i w_reg[NV] = {_mm512_set1_epi32(0x01020304), _mm512_set1_epi32(0x05060708)};
  const __m512i x_reg = _mm512_set1_epi32(0x0102fffe);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t at = b & 63;                            // x, dx and sx: 64 blocks a row, in L1
    const uint8_t* wb = w + (b % w_blocks) * (NV * 544);  // a block: 2 × 512 bytes of q, scales
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      __m512i wv[NV];
      for (int v = 0; v < NV; ++v)
        wv[v] = Mix == 0 ? w_reg[v] : _mm512_loadu_si512(wb + v * 512 + g * 64);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        float f;
        std::memcpy(&f, x + i * 2048 + at * 32 + g * 4, 4);
        const __m512i xb = Mix == 0 ? x_reg : _mm512_castps_si512(_mm512_set1_ps(f));
        for (int v = 0; v < NV; ++v) dot[i][v] = _mm512_dpbusd_epi32(dot[i][v], wv[v], xb);
      }
    }
    if constexpr (Mix >= 2)
      for (int v = 0; v < NV; ++v) {
        const __m512 s = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + NV * 512 + v * 32)));
#pragma GCC unroll 6
        for (int i = 0; i < MR; ++i) {
          const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(dx[i * 64 + at]));
          acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][v]), sd, acc[i][v]);
          dot[i][v] = _mm512_set1_epi32(-128 * sx[i * 64 + at]);
        }
      }
  }
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v)
      sum = _mm512_add_ps(sum, _mm512_add_ps(acc[i][v], _mm512_cvtepi32_ps(dot[i][v])));
  _mm512_storeu_ps(out, sum);
}
#pragma GCC diagnostic pop

void BM_Int8TileMix(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512vnni")) return state.SkipWithError("no AVX512-VNNI");
  const int mix = int(state.range(0));
  constexpr int64_t kBlocks = 1 << 18;
  const int64_t w_blocks = mix == 3 ? (int64_t(4) << 20) / 1088 : 64;
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  std::vector<int8_t> x(6 * 2048, 3);
  std::vector<uint8_t> w(size_t(w_blocks * 1088), 1);
  std::vector<float> dx(6 * 64, 0.5f), out(size_t(16 * threads));
  std::vector<int32_t> sx(6 * 64, 7);
  using Fn = void (*)(int64_t, const int8_t*, const uint8_t*, int64_t, const float*, const int32_t*,
                      float*);
  const Fn fn = mix == 0 ? int8_tile_mix<0> : mix == 1 ? int8_tile_mix<1> : int8_tile_mix<2>;
  for (auto _ : state)
    pool.parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        fn(kBlocks, x.data(), w.data(), w_blocks, dx.data(), sx.data(), out.data() + 16 * t);
    });
  benchmark::DoNotOptimize(out.data());
  // 96 vpdpbusd a block, 64 byte products each.
  const double ops = double(state.iterations()) * threads * kBlocks * 96 * 64 * 2;
  state.counters["GOP/s"] = benchmark::Counter(ops / 1e9, benchmark::Counter::kIsRate);
  state.counters["peak_share"] =
      benchmark::Counter(ops / 1e9 / int8_peak(), benchmark::Counter::kIsRate);
  state.SetLabel(mix == 0   ? "dots alone"
                 : mix == 1 ? "+ loads and broadcasts"
                 : mix == 2 ? "+ block ends"
                            : "+ block ends, weights from L3");
}
#endif

struct Problem {
  std::vector<uint8_t> bytes;  // `copies` weight matrices back to back
  std::vector<Weight> w;
  std::vector<float> x, y;
};

// Random weights of N x K in `dtype` (packed as `format`), in enough copies to fill `total_bytes`
// (cycling through copies that overflow the 32 MiB L3 streams every weight from memory, as a decode
// step does). k_quant 4, 5 or 6: random Q4_K, Q5_K or Q6_K blocks held as q4k, q5k or q6k
// instead.
Problem make_problem(int64_t M, int64_t N, int64_t K, DType dtype, ops::WeightFormat format,
                     size_t total_bytes, int k_quant = 0) {
  Problem p;
  Rng rng(7);
  const size_t one = size_t(N * K) * dtype_size(dtype);
  const size_t copies = std::max<size_t>(1, total_bytes / one);
  p.bytes.resize(one * copies);
  for (size_t i = 0; i < size_t(N * K) * copies; ++i) {
    const float v = float(rng.uniform()) - 0.5f;
    if (dtype == DType::F32)
      reinterpret_cast<float*>(p.bytes.data())[i] = v;
    else
      reinterpret_cast<uint16_t*>(p.bytes.data())[i] = f32_to_bf16(v);
  }
  for (size_t c = 0; c < copies; ++c) {
    p.w.push_back(Weight{dtype, p.bytes.data() + c * one, N, K});
    if (k_quant == 6) {
      // Random Q6_K blocks (the values do not change the cost).
      p.w.back().packed = ops::pack_q6k(
          N, K,
          [&](int64_t n, int64_t s, ops::Q6KBlock& b) {
            Rng r(uint64_t(c * N + n) * 64 + uint64_t(s));
            b.d = f32_to_f16(0.001f);
            for (auto& sc : b.sc) sc = int8_t(r.next() & 63);
            for (auto& q : b.q) q = uint8_t(r.next() & 63);
          },
          "bench", ThreadPool::global());
      continue;
    }
    if (k_quant == 4 || k_quant == 5) {
      // Random Q4_K or Q5_K blocks (the values do not change the cost).
      p.w.back().packed = (k_quant == 4 ? ops::pack_q4k : ops::pack_q5k)(
          N, K,
          [&](int64_t n, int64_t s, ops::Q4KBlock& b) {
            Rng r(uint64_t(c * N + n) * 64 + uint64_t(s));
            b.d = f32_to_f16(0.01f);
            b.dmin = f32_to_f16(0.005f);
            for (int j = 0; j < 8; ++j)
              b.sc[j] = uint8_t(r.next() & 63), b.m[j] = uint8_t(r.next() & 63);
            for (auto& q : b.q) q = uint8_t(r.next() & (k_quant == 4 ? 15 : 31));
          },
          "bench", ThreadPool::global());
      continue;
    }
    p.w.back().packed = ops::pack(p.w.back(), format, "bench", ThreadPool::global());
  }
  p.x.resize(size_t(M * K));
  for (auto& v : p.x) v = float(rng.uniform()) - 0.5f;
  p.y.resize(size_t(M * N));
  return p;
}

void BM_Linear(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  // range(3): 0 f32, 1 bf16, 2 bf16 packed as q8, 3 bf16 in the bf16 compute mode, 4 bf16
  // packed as q4, 5 Q4_K blocks held as q4k (a GGUF's), 6 Q6_K blocks held as q6k, 7 Q5_K
  // blocks held as q5k
  const DType dtype = state.range(3) ? DType::BF16 : DType::F32;
  const bool bf16_compute = state.range(3) == 3;
  if (bf16_compute && !ops::has_bf16_compute())
    return state.SkipWithError("no bf16 compute kernel on this CPU");
  const auto format = state.range(3) == 2   ? ops::WeightFormat::Q8
                      : state.range(3) == 4 ? ops::WeightFormat::Q4
                      : bf16_compute        ? ops::WeightFormat::Bf16
                                            : ops::WeightFormat::Native;
  const bool cold = state.range(4) != 0;
  // Cold: enough copies that the packed matrices cycled through take 256 MiB, 8 times a 32 MiB
  // L3 (every weight streamed from memory, as a decode step's are: a set that only just
  // overflows the L3 still finds part of itself there). The copies are counted in the bytes
  // of the matrix as made (fp32 or bf16), which the formats pack to their bits per weight.
  const bool q4k = state.range(3) == 5, q6k = state.range(3) == 6, q5k = state.range(3) == 7;
  const double packed_bits = state.range(3) == 2   ? 8.5
                             : state.range(3) == 4 ? 4.5
                             : q4k                 ? 4.625
                             : q5k                 ? 5.625
                             : q6k                 ? 6.5625
                                                   : 8.0 * double(dtype_size(dtype));
  const size_t cold_bytes =
      size_t(double(256 << 20) * 8.0 * double(dtype_size(dtype)) / packed_bits);
  Problem p = make_problem(M, N, K, dtype, format, cold ? cold_bytes : 0,
                           q4k   ? 4
                           : q5k ? 5
                           : q6k ? 6
                                 : 0);
  ThreadPool& pool = ThreadPool::global();
  size_t next = 0;
  for (auto _ : state) {
    ops::linear(p.x.data(), M, p.w[next], nullptr, p.y.data(), pool);
    next = next + 1 == p.w.size() ? 0 : next + 1;
    benchmark::DoNotOptimize(p.y.data());
  }
  const double calls = double(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * M * N * K * calls, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  // A share of the mode's own peak: fp32 FMAs, bf16 dot products, or int8 dot products (q8 and
  // q4 where the kernel takes them).
  const bool integer = p.w[0].packed->integer();
  const double mode_peak = bf16_compute                 ? bf16_peak()
                           : integer && int8_peak() > 0 ? int8_peak()
                                                        : peak();
  state.counters["peak_share"] =
      benchmark::Counter(2.0 * M * N * K * calls / 1e9 / mode_peak, benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(double(p.w[0].packed->bytes()) * calls, benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
  state.SetLabel(std::string(state.range(3) == 2   ? "q8"
                             : state.range(3) == 4 ? "q4"
                             : q4k                 ? "q4k"
                             : q5k                 ? "q5k"
                             : q6k                 ? "q6k"
                             : bf16_compute        ? "bf16-compute"
                             : dtype == DType::F32 ? "f32"
                                                   : "bf16") +
                 (cold ? " cold " : " hot ") + ops::isa_name(ops::active_isa()));
}

// An MLP projection of the default target (hidden 512, MLP 1536, f32) and Qwen3-0.6B's layers
// (hidden 1024, q 2048, MLP 3072; bf16, the bf16 compute mode, q8, q4, q4k, q5k and q6k) at 1 row
// and at the verify rows of blocks 8 and 16; "hot" reuses one cache-resident matrix (pure compute),
// "cold" cycles through copies that overflow the L3 (memory-bound).
void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "fmt", "cold"});
  for (const int64_t cold : {0, 1})
    for (const int64_t m : {1, 9, 17}) {
      b->Args({m, 1536, 512, 0, cold});
      b->Args({m, 1536, 512, 2, cold});
      for (const int64_t fmt : {1, 3, 2, 4, 5, 7, 6}) {
        b->Args({m, 3072, 1024, fmt, cold});
        b->Args({m, 1024, 3072, fmt, cold});
        b->Args({m, 2048, 1024, fmt, cold});
      }
    }
}

// Row counts around the tile edges (12 rows fit one AVX-512 tile; 13+ take the widened path).
void Rows(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "fmt", "cold"});
  for (const int64_t m : {4, 8, 12, 13, 17, 24, 33, 64}) b->Args({m, 3072, 1024, 1, 0});
}

// Qwen3-0.6B's lm_head (151,936 × 1024, 311 MB in bf16): part of every verify pass.
void LmHead(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "fmt", "cold"});
  for (const int64_t m : {1, 17})
    for (const int64_t fmt : {1, 3, 2}) b->Args({m, 151936, 1024, fmt, 1});
}

// Qwen3-8B's layer products (q+k+v 6144 × 4096 as three, o 4096², gate and up 12288 × 4096, down
// 4096 × 12288) and its lm_head, streamed from memory, at a decode step's row and a verify pass's
// 17: bf16 weights multiplied in fp32 (fmt 1), the bf16 compute mode (fmt 3), q8 (2), q4 (4) and
// a GGUF's Q4_K, Q5_K and Q6_K held as q4k (5), q5k (7) and q6k (6).
void Qwen3_8B(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "fmt", "cold"});
  for (const int64_t m : {1, 17})
    for (const int64_t fmt : {1, 3, 2, 4, 5, 7, 6}) {
      b->Args({m, 4096, 4096, fmt, 1});
      b->Args({m, 12288, 4096, fmt, 1});
      b->Args({m, 4096, 12288, fmt, 1});
    }
}
void Bf16Rows(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "fmt", "cold"});
  for (const int64_t m : {1, 2, 4, 5, 8, 12, 13, 17, 24, 33, 64}) b->Args({m, 4096, 4096, 3, 0});
}

}  // namespace

BENCHMARK(BM_FmaPeak)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Bf16DotPeak)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Int8DotPeak)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
#if defined(__GNUC__) && defined(__x86_64__)
BENCHMARK(BM_Int8TileMix)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif
BENCHMARK(BM_Linear)
    ->Name("BM_LinearQwen3_8B")
    ->Apply(Qwen3_8B)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Linear)
    ->Name("BM_LinearBf16Rows")
    ->Apply(Bf16Rows)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_Linear)->Apply(Shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Linear)
    ->Name("BM_LinearRows")
    ->Apply(Rows)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_Linear)
    ->Name("BM_LinearLmHead")
    ->Apply(LmHead)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Attention at Qwen3-0.6B's shape (16 query heads, 8 KV heads, head_dim 128, f32 KV cache): a
// decode step (1 row) and a verify pass (17 rows, block 16), causal over a cache of `context`
// positions plus the pass's own rows. kv_GB/s counts the K and V bytes of the rows attended to
// once (what a kernel that reads each of them once streams); "cold" cycles through copies of the
// cache that overflow the 32 MiB L3, as a forward pass through 28 layers does, "hot" reuses one.
//
//   ./build/bench/bench_ops --benchmark_filter=Attention
namespace {

void BM_Attention(benchmark::State& state) {
  const int64_t nq = state.range(0), context = state.range(1);
  const bool cold = state.range(2) != 0;
  const int heads = 16, kv_heads = 8, hd = 128;
  const int64_t n_keys = context + nq;
  const size_t kv = size_t(n_keys * kv_heads * hd);
  const size_t copies = cold ? std::max<size_t>(1, (size_t(96) << 20) / (2 * kv * 4)) + 1 : 1;
  Rng rng(11);
  std::vector<float> q(size_t(nq * heads * hd)), k(kv * copies), v(kv * copies), out(q.size());
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = float(rng.normal());
  std::vector<int64_t> counts(static_cast<size_t>(nq));
  for (int64_t i = 0; i < nq; ++i) counts[size_t(i)] = context + i + 1;
  ThreadPool& pool = ThreadPool::global();
  size_t next = 0;
  for (auto _ : state) {
    ops::attention(q.data(), nq, heads, kv_heads, hd, k.data() + next * kv, v.data() + next * kv,
                   counts.data(), 0.08838834764f, out.data(), pool);
    next = next + 1 == copies ? 0 : next + 1;
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["kv_GB/s"] =
      benchmark::Counter(double(2 * kv * 4) * double(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(cold ? "cold" : "hot");
}

void AttentionShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"nq", "context", "cold"});
  for (const int64_t cold : {0, 1})
    for (const int64_t context : {512, 2048, 8192})
      for (const int64_t nq : {1, 17}) b->Args({nq, context, cold});
}

}  // namespace

BENCHMARK(BM_Attention)->Apply(AttentionShapes)->Unit(benchmark::kMillisecond)->UseRealTime();

// The one-step noise factor (ops/gram.h) at Qwen3-8B's hidden size 4096: the Gram EᵀE of a
// bf16 embedding of `rows` rows in the 2048-row chunks FlashMapModel uses (rows · H · (H + 1)
// flops: the upper triangle), and the Cholesky factor of a 4096 × 4096 matrix (n³/3 flops), on
// `threads` threads of their own. peak_share: against the fp32 FMA peak of that many of the
// pool's threads (the Cholesky runs in float64, whose peak is half of it).
//
//   ./build/bench/bench_ops --benchmark_filter='Gram|Cholesky|FmaPeak'
namespace {

void BM_Gram(benchmark::State& state) {
  const int64_t rows = state.range(0), H = 4096, chunk = 2048;
  const int threads = int(state.range(1));
  std::vector<uint16_t> e(size_t(rows * H));
  Rng rng(3);
  for (auto& x : e) x = f32_to_bf16(0.02f * float(rng.normal()));
  const Weight E{DType::BF16, e.data(), rows, H};
  std::vector<double> G(size_t(H * H), 0.0);
  for (auto _ : state) {
    for (int64_t r0 = 0; r0 < rows; r0 += chunk)
      ops::gram_accumulate(E, r0, std::min(chunk, rows - r0), G.data(), threads);
    benchmark::DoNotOptimize(G.data());
  }
  const double flops = double(rows) * double(H) * double(H + 1) * double(state.iterations());
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["peak_share"] = benchmark::Counter(
      flops / 1e9 / (peak() * threads / ThreadPool::global().size()), benchmark::Counter::kIsRate);
  state.SetLabel(std::to_string(threads) + " threads " + ops::isa_name(ops::active_isa()));
}

void BM_Cholesky(benchmark::State& state) {
  const int64_t n = 4096;
  const int threads = int(state.range(0));
  // Symmetric and diagonally dominant, so positive definite.
  Rng rng(5);
  std::vector<double> A(size_t(n * n)), L(A.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j)
      A[size_t(i * n + j)] = A[size_t(j * n + i)] = i == j ? double(n) : rng.uniform() - 0.5;
  for (auto _ : state) {
    state.PauseTiming();
    L = A;
    state.ResumeTiming();
    if (ops::cholesky_lower(L.data(), n, threads) != -1) state.SkipWithError("not factored");
    benchmark::DoNotOptimize(L.data());
  }
  const double flops = double(n) * double(n) * double(n) / 3.0 * double(state.iterations());
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["peak_share"] =
      benchmark::Counter(flops / 1e9 / (peak() / 2 * threads / ThreadPool::global().size()),
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::to_string(threads) + " threads " + ops::isa_name(ops::active_isa()));
}

// A FlashMap draft's product with the whole embedding (ops::matmul_rows: 16 rows of x times the
// [V, H] table) with the table held as fp32, bf16 (the released checkpoints) or in a GGUF's blocks
// (Weight::blocks: Q8_0 or Q4_K, each thread decoding the blocks of its columns); a bf16 table
// also in the bf16 compute mode (ops::matmul_rows_bf16, "compute" 1). Counters: the table's bytes
// read per second, the decoded values per second (the blocks' cost is the decoding) and the share
// of the limit.
//
//   ./build/bench/bench_ops --benchmark_filter=EmbeddingProduct
void BM_EmbeddingProduct(benchmark::State& state) {
  const int64_t V = 151936, H = state.range(0), M = 16;
  const auto type = GgmlType(state.range(1));
  const bool bf16_compute = state.range(2) != 0;
  if (bf16_compute && !ops::has_bf16_compute())
    return state.SkipWithError("no bf16 compute kernel on this CPU");
  Rng rng(7);
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  Weight E{DType::F32, nullptr, V, H};
  if (type == GgmlType::F32) {
    f32.resize(size_t(V * H));
    for (auto& v : f32) v = 0.02f * float(rng.normal());
    E.data = f32.data();
  } else if (type == GgmlType::BF16) {
    bf16.resize(size_t(V * H));
    for (auto& v : bf16) v = f32_to_bf16(0.02f * float(rng.normal()));
    E = Weight{DType::BF16, bf16.data(), V, H};
  } else {
    std::vector<uint8_t> bytes(size_t(V * (H / ggml_block_elems(type)) * ggml_block_bytes(type)));
    for (auto& x : bytes) x = uint8_t(rng.next());
    // Finite scales: each block's leading fp16 d (and Q4_K's dmin after it).
    const int64_t bb = ggml_block_bytes(type), scales = type == GgmlType::Q4_K ? 2 : 1;
    for (size_t o = 0; o < bytes.size(); o += size_t(bb))
      for (int64_t i = 0; i < scales; ++i) {
        const uint16_t d = f32_to_f16(1e-3f);
        std::memcpy(bytes.data() + o + 2 * i, &d, 2);
      }
    auto b = BlockRows::of_ggml(type, H, std::move(bytes));
    E.blocks = std::move(b);
  }
  std::vector<float> x(size_t(M * V), 1.0f / float(V)), y(size_t(M * H));
  for (auto _ : state) {
    if (bf16_compute)
      ops::matmul_rows_bf16(x.data(), M, E, y.data(), ThreadPool::global());
    else
      ops::matmul_rows(x.data(), M, E, y.data(), ThreadPool::global());
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes =
      E.blocks ? double(E.blocks->bytes.size()) : double(V * H) * double(dtype_size(E.dtype));
  state.counters["GB/s"] = benchmark::Counter(
      bytes * double(state.iterations()), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["Gvalues/s"] =
      benchmark::Counter(double(V * H) * double(state.iterations()), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
  state.SetLabel((type == GgmlType::F32 ? std::string("fp32") : ggml_type_name(uint32_t(type))) +
                 (bf16_compute ? " bf16-compute " : " ") + ops::isa_name(ops::active_isa()));
  // The limit: the multiply-adds at the mode's peak or the table read once at the read
  // bandwidth, whichever takes longer.
  static const double gbps = ops::read_bandwidth_gbps(ThreadPool::global());
  const double flops_peak = bf16_compute ? bf16_peak() : peak();
  const double limit_s = std::max(2.0 * double(M * V * H) / 1e9 / flops_peak, bytes / 1e9 / gbps);
  state.counters["limit_share"] =
      benchmark::Counter(limit_s * double(state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_EmbeddingProduct)
    ->ArgNames({"H", "type", "compute"})
    ->ArgsProduct({{1024, 4096},
                   {int64_t(GgmlType::F32), int64_t(GgmlType::BF16), int64_t(GgmlType::Q8_0),
                    int64_t(GgmlType::Q4_K)},
                   {0}})
    ->ArgsProduct({{1024, 4096}, {int64_t(GgmlType::BF16)}, {1}})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Gram)
    ->ArgNames({"rows", "threads"})
    ->Args({16384, 1})
    ->Args({16384, 2})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// The whole Qwen3-8B vocabulary (1.2 GB of bf16): only when asked for by name.
BENCHMARK(BM_Gram)
    ->Name("BM_GramFullVocab")
    ->ArgNames({"rows", "threads"})
    ->Args({151936, 2})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Cholesky)
    ->ArgNames({"threads"})
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The pointwise activations of a verify pass and a draft: SwiGLU over 17 rows of Qwen3-8B's MLP
// (17 × 12288) and of the shipped target's (9 × 1536), GELU over the shipped FlashMap drafter's 8
// slots × 512. libm 0: ops (16 lanes, polynomial e^x and erf); 1: the C library's expf / erff one
// value at a time (what they replaced, for the ratio). One thread.
void BM_Activation(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool gelu = state.range(1) != 0, libm = state.range(2) != 0;
  Rng rng(7);
  std::vector<float> x(static_cast<size_t>(n)), up(x.size()), y(x.size());
  for (auto& v : x) v = 3.0f * float(rng.normal());
  for (auto& v : up) v = float(rng.normal());
  for (auto _ : state) {
    if (gelu && libm)
      for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678f));
    else if (gelu)
      ops::gelu(x.data(), n, y.data());
    else if (libm)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i])) * up[i];
    else
      ops::swiglu(x.data(), up.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["ns/value"] = benchmark::Counter(
      double(n) * double(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert, benchmark::Counter::kIs1000);
  state.SetLabel(std::string(gelu ? "gelu" : "swiglu") + (libm ? " libm" : " ops"));
}
BENCHMARK(BM_Activation)
    ->ArgNames({"n", "gelu", "libm"})
    ->ArgsProduct({{17 * 12288, 9 * 1536}, {0}, {0, 1}})
    ->ArgsProduct({{8 * 512}, {1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

// A FlashMap draft's noise: K · hidden standard normals per sequence (16 × 512 for the shipped
// drafter, 16 × 4096 at 8B), by 16 lanes against the scalar float64 Box-Muller (Rng::normal) it
// replaced. One thread.
void BM_Normals(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool scalar = state.range(1) != 0;
  Rng rng(11);
  std::vector<float> y(static_cast<size_t>(n));
  for (auto _ : state) {
    if (scalar)
      for (auto& v : y) v = rng.normal();
    else
      ops::normals(rng, n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["ns/value"] = benchmark::Counter(
      double(n) * double(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert, benchmark::Counter::kIs1000);
  state.SetLabel(scalar ? "Rng::normal" : "ops::normals");
}
BENCHMARK(BM_Normals)
    ->ArgNames({"n", "scalar"})
    ->ArgsProduct({{16 * 512, 16 * 4096}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
