// ops::attention, grouped by KV head: the G = n_heads / n_kv_heads query heads of every row that
// share a KV head are computed together, so each key and value row is read once per (KV head, row
// chunk) instead of once per (query row, head).
//
// Batch invariance. Every query (row i, head h) gets the same floating-point operations in the same
// order whatever nq, the other queries and the thread count are:
//   score_j = (hsum(Σ_c q_c·k_jc, FMAs in c order from zero) + Σ_t q_t·k_jt) · scale, where c runs
//             over the 16-lane vectors of the row, hsum is the fixed lane tree below and t over the
//             head_dim % 16 trailing columns, in order (the previous per-(query, head) kernel's
//             scores, bit for bit, for head_dim a multiple of 16);
//   max over j < n (exact, any order); p_j = exp16(score_j − max);
//   sum = hsum(16 lane sums), lane l adding the p_j with j ≡ l (mod 16) in key order;
//   o_d = (Σ_j p_j·v_jd, FMAs in key order from zero) · (1 / sum).
// Blocking changes only which queries share a load: a block of queries never mixes their
// arithmetic, each score is one independent accumulator, and each output element is one
// accumulator that sees its keys in order however the keys are tiled.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/ops.h"
#include "ops/vec16.h"

namespace flashmap {
namespace ops {
namespace {

inline v16f load(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, v16f v) {
  std::memcpy(p, &v, sizeof(v));
}

// Pins v to a register. GCC otherwise folds a loaded vector into each FMA that uses it as a memory
// operand, repeating the load per use: the kernels below would issue 20 loads per 16 FMAs instead
// of 8 and wait on the load ports (Zen 4 loads one 512-bit vector per cycle). Only a scheduling
// hint: the arithmetic is unchanged.
inline void pin(v16f& v) {
#if defined(__AVX512F__) && defined(__GNUC__)
  __asm__("" : "+v"(v));
#else
  (void)v;
#endif
}

// Register blocking by the vectors the build has. AVX-512 (32 registers, a v16f in one): four
// queries per block, whose 16 score sums over four keys plus the four key vectors fit, and four
// vectors of value columns per pass (QB·4 accumulators plus 4 value vectors). AVX2 and narrower
// (16 registers of 8 lanes, kNarrow): one query's 4 scores per pass and one vector of value
// columns for four queries, their sums held as 8-lane halves (8 registers either way). Blocking
// never changes a result's operations (see the top of the file).
#if defined(__AVX512F__)
constexpr bool kNarrow = false;
constexpr int kScoreBlock = 4, kValueCols = 4;
#else
constexpr bool kNarrow = true;
constexpr int kScoreBlock = 1, kValueCols = 1;
#endif
constexpr int kValueBlock = 4;

[[maybe_unused]] inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[maybe_unused]] inline v16f join(v8f lo, v8f hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// hsum() of 4·QB vectors (query b, key r at index 4b + r) at once: each level of hsum's tree
// (lane i + lane i+8, then +4, +2, +1) is applied to two vectors' lanes per shuffle pair, so lane
// 4b + r of the result is bit-identical to hsum(a[b][r]) (which is why a key's score does not
// depend on whether it fell in a group of four), with 30 shuffles per 16 scores instead of 64.
template <int QB>
inline v16f hsum16(const v16f (&a)[QB][4]) {
  auto at = [&](int i) { return i / 4 < QB ? a[i / 4][i % 4] : v16f{}; };
  v16f s8[8], s4[4], ab[2];
  for (int i = 0; i < 8; ++i)  // [s8 of vector 2i | s8 of vector 2i + 1]
    s8[i] = __builtin_shufflevector(at(2 * i), at(2 * i + 1), 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                    19, 20, 21, 22, 23) +
            __builtin_shufflevector(at(2 * i), at(2 * i + 1), 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                    26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)  // s4 of vectors 4i .. 4i + 3
    s4[i] = __builtin_shufflevector(s8[2 * i], s8[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18,
                                    19, 24, 25, 26, 27) +
            __builtin_shufflevector(s8[2 * i], s8[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21,
                                    22, 23, 28, 29, 30, 31);
  // hsum's a = s4[0] + s4[2] and b = s4[1] + s4[3] of vectors 8i .. 8i + 7, then a + b.
  for (int i = 0; i < 2; ++i)
    ab[i] = __builtin_shufflevector(s4[2 * i], s4[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20,
                                    21, 24, 25, 28, 29) +
            __builtin_shufflevector(s4[2 * i], s4[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19,
                                    22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(ab[0], ab[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                 28, 30) +
         __builtin_shufflevector(ab[0], ab[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                 29, 31);
}

inline v16f splat(float f) {
  return v16f{} + f;
}

// e^x in 16 lanes, replacing a call to expf per score (which was a fifth of a verify pass). x =
// n·ln 2 + r with |r| ≤ ln 2 / 2 (Cody-Waite, ln 2 in two parts, fused), e^r by Cephes' expf
// polynomial, times 2^n built in the exponent field in two halves so that results in the
// subnormal range round once. Against exp in double it is within 1.01 ulp on every float in
// [-104, 0] (exp of −∞ is 0, of NaN NaN); it is a fixed sequence of operations per lane, so a
// score's p does not depend on its lane or neighbours.
inline v16f exp16(v16f x) {
  x = x < splat(-104.0f) ? splat(-104.0f) : x;  // e^-104 rounds to 0; keeps n in int range
  x = x > splat(88.5f) ? splat(88.5f) : x;      // e^88.5 overflows to ∞
  const v16f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x·log2 e)
  v16f r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v16f e = splat(1.9875691500e-4f);
  e = e * r + 1.3981999507e-3f;
  e = e * r + 8.3334519073e-3f;
  e = e * r + 4.1665795894e-2f;
  e = e * r + 1.6666665459e-1f;
  e = e * r + 5.0000001201e-1f;
  e = e * (r * r) + r + 1.0f;
  const v16i ni = __builtin_convertvector(n, v16i);
  const v16i n1 = ni >> 1, n2 = ni - n1;
  return e * reinterpret_cast<v16f>((n1 + 127) << 23) * reinterpret_cast<v16f>((n2 + 127) << 23);
}

// The row `ahead` keys past the one being read is requested from memory (below `limit`, the keys
// the job reads): a KV head's rows lie n_kv·head_dim·4 bytes apart, one per 4 KiB page at Qwen3's
// shape, and the hardware prefetchers, which stay within a page, do not fetch the next row. Its
// first line is enough: they stream the rest of the row once it is touched.
struct Prefetch {
  int64_t ahead = 0, limit = 0;
};

// The geometry of one call: head_dim = 16·nv + tail.
struct Geometry {
  int64_t stride;  // between consecutive keys (and values) of one KV head
  int nv, tail;
  float scale;
};

// A score's trailing head_dim % 16 columns, added in column order after the lane tree.
inline float add_tail(float s, const float* q, const float* k, const Geometry& g) {
  for (int t = g.nv * kLanes; t < g.nv * kLanes + g.tail; ++t) s += q[t] * k[t];
  return s;
}

// Scores of QB queries against keys [j0, j1): out[b][j] = score(q[b], k_j). Four keys at a time:
// each key's loads serve the QB queries (this is where grouping saves the reads), and the 4·QB
// sums share one lane tree. Not inlined: GCC then keeps the accumulators in registers.
template <int QB>
__attribute__((noinline)) void scores_block(const float* const* q, const float* k, int64_t j0,
                                            int64_t j1, const Geometry& g, Prefetch pf,
                                            float* const* out) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const float* kj = k + j * g.stride;
    if (pf.ahead > 0 && j + 3 + pf.ahead < pf.limit)
      for (int r = 0; r < 4; ++r) __builtin_prefetch(kj + (r + pf.ahead) * g.stride);
    v16f a[QB][4] = {};
    if constexpr (kNarrow && QB == 1) {
      // One query on 8-lane registers: each 16-lane sum kept as its two halves (GCC spills
      // arrays of 16-lane vectors to the stack on every key when a register holds 8 lanes).
      v8f lo[4] = {}, hi[4] = {};
      for (int c = 0; c < g.nv; ++c) {
        const v8f ql = load8(q[0] + c * kLanes), qh = load8(q[0] + c * kLanes + 8);
        for (int r = 0; r < 4; ++r) {
          lo[r] += ql * load8(kj + r * g.stride + c * kLanes);
          hi[r] += qh * load8(kj + r * g.stride + c * kLanes + 8);
        }
      }
      for (int r = 0; r < 4; ++r) a[0][r] = join(lo[r], hi[r]);
    } else {
      for (int c = 0; c < g.nv; ++c) {
        v16f kv[4];
        for (int r = 0; r < 4; ++r) {
          kv[r] = load(kj + r * g.stride + c * kLanes);
          pin(kv[r]);
        }
        for (int b = 0; b < QB; ++b) {
          v16f qv = load(q[b] + c * kLanes);
          pin(qv);
          for (int r = 0; r < 4; ++r) a[b][r] += qv * kv[r];
        }
      }
    }
    v16f d = hsum16<QB>(a);
    if (g.tail > 0)
      for (int i = 0; i < 4 * QB; ++i) d[i] = add_tail(d[i], q[i / 4], kj + (i % 4) * g.stride, g);
    d *= g.scale;
    float sc[kLanes];
    std::memcpy(sc, &d, sizeof(d));
    for (int b = 0; b < QB; ++b) std::memcpy(out[b] + j, sc + 4 * b, 4 * sizeof(float));
  }
  for (; j < j1; ++j) {
    const float* kj = k + j * g.stride;
    v16f a[QB] = {};
    for (int c = 0; c < g.nv; ++c) {
      const v16f kv = load(kj + c * kLanes);
      for (int b = 0; b < QB; ++b) a[b] += load(q[b] + c * kLanes) * kv;
    }
    for (int b = 0; b < QB; ++b) out[b][j] = add_tail(hsum(a[b]), q[b], kj, g) * g.scale;
  }
}

// acc[b][16·c0 .. 16·(c0 + CW)) += Σ_{j0 ≤ j < j1} p[b][j] · v_j, in key order. The accumulators
// live in registers across the keys and go back to acc between calls (an exact store and
// reload), so splitting a query's keys over calls does not change its sums.
template <int QB, int CW>
__attribute__((noinline)) void values_block(const float* const* p, const float* v, int64_t j0,
                                            int64_t j1, int c0, const Geometry& g, Prefetch pf,
                                            float* const* acc) {
  if constexpr (kNarrow && CW == 1) {
    // On 8-lane registers: each accumulator as its two halves (as in scores_block).
    v8f lo[QB], hi[QB];
    for (int b = 0; b < QB; ++b) {
      lo[b] = load8(acc[b] + c0 * kLanes);
      hi[b] = load8(acc[b] + c0 * kLanes + 8);
    }
    for (int64_t j = j0; j < j1; ++j) {
      const float* vj = v + j * g.stride + c0 * kLanes;
      if (c0 == 0 && pf.ahead > 0 && j + pf.ahead < pf.limit)
        __builtin_prefetch(vj + pf.ahead * g.stride);
      const v8f vl = load8(vj), vh = load8(vj + 8);
      for (int b = 0; b < QB; ++b) {
        const float pj = p[b][j];
        lo[b] += pj * vl;
        hi[b] += pj * vh;
      }
    }
    for (int b = 0; b < QB; ++b) {
      std::memcpy(acc[b] + c0 * kLanes, &lo[b], sizeof(v8f));
      std::memcpy(acc[b] + c0 * kLanes + 8, &hi[b], sizeof(v8f));
    }
    return;
  }
  v16f a[QB][CW];
  for (int b = 0; b < QB; ++b)
    for (int w = 0; w < CW; ++w) a[b][w] = load(acc[b] + (c0 + w) * kLanes);
  for (int64_t j = j0; j < j1; ++j) {
    const float* vj = v + j * g.stride + c0 * kLanes;
    v16f vv[CW];
    if (c0 == 0 && pf.ahead > 0 && j + pf.ahead < pf.limit)
      __builtin_prefetch(vj + pf.ahead * g.stride);
    for (int w = 0; w < CW; ++w) {
      vv[w] = load(vj + w * kLanes);
      pin(vv[w]);
    }
    for (int b = 0; b < QB; ++b) {
      const float pj = p[b][j];
      for (int w = 0; w < CW; ++w) a[b][w] += pj * vv[w];
    }
  }
  for (int b = 0; b < QB; ++b)
    for (int w = 0; w < CW; ++w) store(acc[b] + (c0 + w) * kLanes, a[b][w]);
}

template <int QB>
void values_cols(const float* const* p, const float* v, int64_t j0, int64_t j1, const Geometry& g,
                 Prefetch pf, float* const* acc) {
  // kValueCols vectors of columns per pass; each value load feeds QB FMAs.
  int c0 = 0;
  for (; c0 + kValueCols <= g.nv; c0 += kValueCols)
    values_block<QB, kValueCols>(p, v, j0, j1, c0, g, pf, acc);
  if constexpr (kValueCols == 4) {
    switch (g.nv - c0) {
      case 3:
        values_block<QB, 3>(p, v, j0, j1, c0, g, pf, acc);
        break;
      case 2:
        values_block<QB, 2>(p, v, j0, j1, c0, g, pf, acc);
        break;
      case 1:
        values_block<QB, 1>(p, v, j0, j1, c0, g, pf, acc);
        break;
      default:
        break;
    }
  }
  for (int b = 0; b < QB; ++b)
    for (int64_t j = j0; j < j1; ++j)
      for (int t = g.nv * kLanes; t < g.nv * kLanes + g.tail; ++t)
        acc[b][t] += p[b][j] * v[j * g.stride + t];
}

void scores_any(int qb, const float* const* q, const float* k, int64_t j0, int64_t j1,
                const Geometry& g, Prefetch pf, float* const* out) {
  switch (qb) {
    case 4:
      return scores_block<4>(q, k, j0, j1, g, pf, out);
    case 3:
      return scores_block<3>(q, k, j0, j1, g, pf, out);
    case 2:
      return scores_block<2>(q, k, j0, j1, g, pf, out);
    default:
      return scores_block<1>(q, k, j0, j1, g, pf, out);
  }
}

void values_any(int qb, const float* const* p, const float* v, int64_t j0, int64_t j1,
                const Geometry& g, Prefetch pf, float* const* acc) {
  switch (qb) {
    case 4:
      return values_cols<4>(p, v, j0, j1, g, pf, acc);
    case 3:
      return values_cols<3>(p, v, j0, j1, g, pf, acc);
    case 2:
      return values_cols<2>(p, v, j0, j1, g, pf, acc);
    default:
      return values_cols<1>(p, v, j0, j1, g, pf, acc);
  }
}

// Keys per tile: the tile of keys (then of values) is read from L1 by every query block of the
// group, so it should fit there with room for the queries' rows: 16 KiB (32 keys at head_dim 128,
// half a Zen 4 L1d), a multiple of 16 so that every tile starts a 16-key chunk of the softmax sums.
int64_t tile_keys(int head_dim) {
  return std::clamp<int64_t>(16384 / (int64_t(head_dim) * 4), 16, 128) & ~int64_t(15);
}

struct Call {
  const float* q;
  int n_heads, group, head_dim;
  const float *k, *v;
  const int64_t* key_count;
  float* out;
  Geometry g;
  const KeyMask* mask;  // null: every key below a query's count is visible
};

// max(mx, s[0..n)), skipping NaNs as a chain of std::max(mx, s_j) does. A maximum is exact, so its
// lanes may be combined in any order (the sign of a zero maximum can vary, but exp(s − ±0) does
// not).
float max_of(const float* s, int64_t n, float mx) {
  v16f m = mx - v16f{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const v16f x = load(s + j);
    m = x > m ? x : m;
  }
  for (int l = 0; l < kLanes; ++l) mx = std::max(mx, m[l]);
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  return mx;
}

// Queries of rows [r0, r1) on KV heads [kh0, kh1), in two sweeps over the keys, tile by tile:
// scores (and their running maximum), then the softmax numerators and the values. Several KV heads
// per job read several adjacent head_dim-row segments of each key row: fewer pages touched per
// byte (the rows of one head lie a page apart) and longer runs for the hardware prefetchers.
// Per-thread scratch: every query's scores (overwritten by p = exp(score − max)) and output
// accumulators.
void attend_group(const Call& c, int kh0, int kh1, int64_t r0, int64_t r1) {
  const int per_head = int((r1 - r0) * c.group), nq = per_head * (kh1 - kh0);
  int64_t n_max = 0;
  for (int64_t i = r0; i < r1; ++i) n_max = std::max(n_max, c.key_count[i]);
  const int64_t ld = (n_max + 15) & ~int64_t(15);
  const int64_t hd_pad = (c.head_dim + kLanes - 1) / kLanes * kLanes;
  thread_local std::vector<float> scratch, mx;
  thread_local std::vector<v16f> sum;
  thread_local std::vector<const float*> qs;
  thread_local std::vector<float*> ps, accs, outs;
  thread_local std::vector<int64_t> ns, row_of;
  scratch.resize(size_t(nq) * size_t(ld + hd_pad));
  mx.assign(size_t(nq), -INFINITY);
  sum.assign(size_t(nq), v16f{});
  qs.resize(size_t(nq));
  ps.resize(size_t(nq));
  accs.resize(size_t(nq));
  outs.resize(size_t(nq));
  ns.resize(size_t(nq));
  row_of.resize(size_t(nq));
  for (int kh = kh0; kh < kh1; ++kh)
    for (int64_t i = r0; i < r1; ++i)
      for (int h = kh * c.group; h < (kh + 1) * c.group; ++h) {
        const size_t b = size_t((kh - kh0) * per_head + (i - r0) * c.group + (h - kh * c.group));
        qs[b] = c.q + (i * c.n_heads + h) * c.head_dim;
        outs[b] = c.out + (i * c.n_heads + h) * c.head_dim;
        ps[b] = scratch.data() + b * size_t(ld);
        accs[b] = scratch.data() + size_t(nq) * size_t(ld) + b * size_t(hd_pad);
        std::fill_n(accs[b], c.head_dim, 0.0f);
        ns[b] = c.key_count[i];
        row_of[b] = i;
      }
  const int64_t tile = tile_keys(c.head_dim);

  // Scores. A block runs to the largest key count among its queries: a score past a query's own
  // count is computed from a valid key row (some query of the call attends to it) and never read.
  for (int64_t t0 = 0; t0 < n_max; t0 += tile) {
    const int64_t t1 = std::min(t0 + tile, n_max);
    for (int kh = kh0; kh < kh1; ++kh) {
      const float* k = c.k + int64_t(kh) * c.head_dim;
      const int b0 = (kh - kh0) * per_head;
      for (int b = b0; b < b0 + per_head; b += kScoreBlock) {
        const int qb = std::min(kScoreBlock, b0 + per_head - b);
        const int64_t e = std::min(t1, *std::max_element(&ns[size_t(b)], &ns[size_t(b + qb)]));
        const Prefetch pf{b == b0 ? 2 * tile : 0, n_max};  // a head's first block fetches ahead
        if (e > t0) scores_any(qb, &qs[size_t(b)], k, t0, e, c.g, pf, &ps[size_t(b)]);
      }
    }
    for (int x = 0; x < nq; ++x) {
      const int64_t e = std::min(t1, ns[size_t(x)]);
      // A draft tree's hidden keys score −∞ before the maximum: their p = exp(−∞ − max) = +0
      // adds nothing to the sum, and 0·v nothing to the output (the values are finite).
      if (c.mask && e > std::max(t0, c.mask->first)) {
        const KeyMask& m = *c.mask;
        const uint64_t* bits = m.bits + row_of[size_t(x)] * m.words;
        for (int64_t j = std::max(t0, m.first); j < e; ++j)
          if (!((bits[(j - m.first) >> 6] >> ((j - m.first) & 63)) & 1))
            ps[size_t(x)][j] = -INFINITY;
      }
      if (e > t0) mx[size_t(x)] = max_of(ps[size_t(x)] + t0, e - t0, mx[size_t(x)]);
    }
  }
  // Values. Each query's p_j = exp(score_j − max) are formed 16 keys at a time while its tile of
  // scores is in L1, and summed in 16 lanes: lane l adds the p_j with j ≡ l (mod 16) in key order
  // (tiles start at multiples of 16, so a key's lane is fixed), and one hsum at the end folds them;
  // the lanes past a query's count add exp(−∞) = +0. A block shares the keys all its queries
  // attend to; each query then adds its own last keys of the tile, so no query's sum ever sees a
  // key past its count (not even as 0·v, which would turn an infinite value into NaN and can flip
  // the sign of a zero).
  const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int64_t t0 = 0; t0 < n_max; t0 += tile) {
    const int64_t t1 = std::min(t0 + tile, n_max);
    for (int x = 0; x < nq; ++x) {
      float* p = ps[size_t(x)];
      const v16f m = splat(mx[size_t(x)]);
      v16f s = sum[size_t(x)];
      const int64_t e = std::min(t1, ns[size_t(x)]);
      for (int64_t j = t0; j < e; j += kLanes) {
        // Lanes past e: past the query's count (never read again) or in ld's padding.
        const v16f d = lane < int32_t(e - j) ? load(p + j) - m : splat(-INFINITY);
        const v16f pj = exp16(d);
        store(p + j, pj);
        s += pj;
      }
      sum[size_t(x)] = s;
    }
    for (int kh = kh0; kh < kh1; ++kh) {
      const float* v = c.v + int64_t(kh) * c.head_dim;
      const int b0 = (kh - kh0) * per_head;
      for (int b = b0; b < b0 + per_head; b += kValueBlock) {
        const int qb = std::min(kValueBlock, b0 + per_head - b);
        const int64_t e =
            std::clamp(*std::min_element(&ns[size_t(b)], &ns[size_t(b + qb)]), t0, t1);
        const Prefetch pf{b == b0 ? 2 * tile : 0, n_max};
        if (e > t0) values_any(qb, &ps[size_t(b)], v, t0, e, c.g, pf, &accs[size_t(b)]);
        for (int x = b; x < b + qb; ++x) {
          const int64_t ex = std::min(t1, ns[size_t(x)]);
          if (ex > e) values_any(1, &ps[size_t(x)], v, e, ex, c.g, Prefetch{}, &accs[size_t(x)]);
        }
      }
    }
  }

  for (int x = 0; x < nq; ++x) {
    // A query without keys gets zeros.
    const float inv = ns[size_t(x)] > 0 ? 1.0f / hsum(sum[size_t(x)]) : 0.0f;
    for (int d = 0; d < c.head_dim; ++d) outs[size_t(x)][d] = accs[size_t(x)][d] * inv;
  }
}

}  // namespace

void attention(const float* q, int64_t nq, int n_heads, int n_kv_heads, int head_dim,
               const float* k, const float* v, const int64_t* key_count, float scale, float* out,
               ThreadPool& pool, const KeyMask* mask) {
  if (nq <= 0) return;
  const Call c{
      q,
      n_heads,
      n_heads / n_kv_heads,
      head_dim,
      k,
      v,
      key_count,
      out,
      Geometry{int64_t(n_kv_heads) * head_dim, head_dim / kLanes, head_dim % kLanes, scale},
      mask};
  // Jobs: (run of KV heads, chunk of rows). A run takes an equal share of the KV heads per thread
  // (or half, a quarter...) while its queries' scores stay within 512 KiB (half a Zen 4 L2); rows
  // are split only to give every thread work when there are fewer runs than threads (or a count
  // that does not divide evenly): each chunk rereads its heads' keys and values.
  const int threads = pool.size();
  int64_t n_max = 0, work = 0;
  for (int64_t i = 0; i < nq; ++i) {
    n_max = std::max(n_max, key_count[i]);
    work += key_count[i];
  }
  work *= int64_t(n_heads) * head_dim;
  int run = 1;
  for (int spread = threads; spread < 2 * n_kv_heads; spread *= 2) {
    run = (n_kv_heads + spread - 1) / spread;
    if (run == 1 || nq * c.group * run * n_max * 4 <= (int64_t(512) << 10)) break;
  }
  const int runs = (n_kv_heads + run - 1) / run;
  int64_t chunks = 1;
  while (chunks < nq && (runs * chunks) % threads != 0 && runs * chunks < 4 * threads) ++chunks;
  const int64_t rows = (nq + chunks - 1) / chunks;
  chunks = (nq + rows - 1) / rows;
  const int64_t jobs = runs * chunks;
  pool.parallel_for(jobs, work < (int64_t(1) << 18) ? jobs : 1, [&](int64_t b, int64_t e) {
    for (int64_t job = b; job < e; ++job) {
      const int kh0 = int(job / chunks) * run;
      const int64_t r0 = job % chunks * rows;
      attend_group(c, kh0, std::min(n_kv_heads, kh0 + run), r0, std::min(nq, r0 + rows));
    }
  });
}

}  // namespace ops
}  // namespace flashmap
