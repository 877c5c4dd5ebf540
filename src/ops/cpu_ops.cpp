#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "io/safetensors.h"
#include "ops/ops.h"

namespace flashmap {

Weight Weight::of(const TensorView& t) {
  FLASHMAP_CHECK(t.shape.size() == 2 && is_float(t.dtype),
                 "{}: tensor '{}' must be a 2-D float matrix, got {} {}", t.file, t.name,
                 dtype_name(t.dtype), shape_str(t.shape));
  return Weight{t.dtype, t.data, t.shape[0], t.shape[1]};
}

float Weight::at(int64_t r, int64_t c) const {
  const int64_t i = r * cols + c;
  uint16_t h;
  switch (dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, static_cast<const float*>(data) + i, 4);
      return f;
    }
    case DType::BF16:
      std::memcpy(&h, static_cast<const uint16_t*>(data) + i, 2);
      return bf16_to_f32(h);
    case DType::F16:
      std::memcpy(&h, static_cast<const uint16_t*>(data) + i, 2);
      return f16_to_f32(h);
    default:
      throw InternalError("Weight::at on an integer tensor");
  }
}

void Weight::row_f32(int64_t r, float* out) const {
  if (dtype == DType::F32) {
    std::memcpy(out, static_cast<const float*>(data) + r * cols, size_t(cols) * 4);
    return;
  }
  for (int64_t c = 0; c < cols; ++c) out[c] = at(r, c);
}

namespace ops {
namespace {

// 16 fp32 lanes; GCC lowers this to one AVX-512 register, two AVX2 ones, or scalar code.
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef _Float16 v16x __attribute__((vector_size(32)));
constexpr int kLanes = 16;

template <DType D>
inline v16f load16(const void* base, int64_t i) {
  if constexpr (D == DType::F32) {
    v16f v;
    std::memcpy(&v, static_cast<const float*>(base) + i, sizeof(v));
    return v;
  } else if constexpr (D == DType::BF16) {
    v16h h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + i, sizeof(h));
    return reinterpret_cast<v16f>(__builtin_convertvector(h, v16u) << 16);
  } else {
    v16x h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + i, sizeof(h));
    return __builtin_convertvector(h, v16f);
  }
}

// The last n < 16 elements, zero-padded (zeros add nothing to the sums).
template <DType D>
inline v16f load_tail(const void* base, int64_t i, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (D == DType::F32) {
    // A masked load: the lanes past n read nothing and are zero.
    return reinterpret_cast<v16f>(
        _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), static_cast<const float*>(base) + i));
  }
#endif
  if constexpr (D == DType::F32) {
    float buf[kLanes] = {};
    std::memcpy(buf, static_cast<const float*>(base) + i, size_t(n) * 4);
    v16f v;
    std::memcpy(&v, buf, sizeof(v));
    return v;
  } else {
    uint16_t buf[kLanes] = {};
    std::memcpy(buf, static_cast<const uint16_t*>(base) + i, size_t(n) * 2);
    return load16<D>(buf, 0);
  }
}

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

inline float hsum(v16f v) {
  // A fixed pairwise tree (lane i + lane i+8, then +4, +2, +1), so every dot product reduces its
  // lanes in the same order; shuffles keep it in registers.
  const v8f s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4f s4 =
      __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const float a = s4[0] + s4[2], b = s4[1] + s4[3];
  return a + b;
}

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  v16f acc = {};
  const int64_t nv = n / kLanes * kLanes;
  for (int64_t k = 0; k < nv; k += kLanes)
    acc += load16<DType::F32>(a, k) * load16<DType::F32>(b, k);
  if (nv < n) acc += load_tail<DType::F32>(a, nv, n - nv) * load_tail<DType::F32>(b, nv, n - nv);
  return hsum(acc);
}

namespace {

// MB rows of y[:, h0:h0+16) = x · E[:, h0:h0+16), accumulated in registers over the vocabulary in
// order (each output is the same sequential sum as a scalar loop over v would give).
template <DType D, int MB>
void matmul_rows_tile(const float* x, int64_t V, int64_t H, const void* E, float* y, int64_t h) {
  v16f acc[MB] = {};
  for (int64_t v = 0; v < V; ++v) {
    const v16f e = load16<D>(E, v * H + h);
    for (int i = 0; i < MB; ++i) acc[i] += x[i * V + v] * e;
  }
  for (int i = 0; i < MB; ++i) std::memcpy(y + i * H + h, &acc[i], sizeof(acc[i]));
}

template <DType D>
void matmul_rows_range(const float* x, int64_t M, const Weight& E, float* y, int64_t h0,
                       int64_t h1) {
  const int64_t V = E.rows, H = E.cols;
  constexpr int MB = 8;
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    int64_t m = 0;
    for (; m + MB <= M; m += MB) matmul_rows_tile<D, MB>(x + m * V, V, H, E.data, y + m * H, h);
    for (; m < M; ++m) matmul_rows_tile<D, 1>(x + m * V, V, H, E.data, y + m * H, h);
  }
  for (; h < h1; ++h)  // columns past the last multiple of 16
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0;
      for (int64_t v = 0; v < V; ++v) acc += x[m * V + v] * E.at(v, h);
      y[m * H + h] = acc;
    }
}

}  // namespace

void matmul_rows(const float* x, int64_t M, const Weight& E, float* y, ThreadPool& pool) {
  // Each thread owns a range of output columns (whole 16-lane groups) and sums over the
  // vocabulary in order.
  pool.parallel_for(E.cols, 64, [&](int64_t h0, int64_t h1) {
    switch (E.dtype) {
      case DType::F32:
        matmul_rows_range<DType::F32>(x, M, E, y, h0, h1);
        break;
      case DType::BF16:
        matmul_rows_range<DType::BF16>(x, M, E, y, h0, h1);
        break;
      case DType::F16:
        matmul_rows_range<DType::F16>(x, M, E, y, h0, h1);
        break;
      default:
        throw InternalError("matmul_rows on an integer table");
    }
  });
}

void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t dim, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float var = dot(xr, xr, dim) / float(dim);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = w[i] * (xr[i] * inv);
  }
}

void rms_norm_scale_first(const float* x, const float* w, float eps, int64_t rows, int64_t dim,
                          float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float var = dot(xr, xr, dim) / float(dim);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = xr[i] * (w[i] * inv);
  }
}

void layer_norm(const float* x, float eps, int64_t rows, int64_t dim, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double mean = 0;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= double(dim);
    double var = 0;
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(dim);
    const float inv = float(1.0 / std::sqrt(var + double(eps)));
    const float mu = float(mean);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = (xr[i] - mu) * inv;
  }
}

// inv_freq as transformers and FlashMap form it in fp32: 1 / theta^(2i / d).
static std::vector<float> inv_freq(int head_dim, double theta) {
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i)
    f[size_t(i)] = 1.0f / std::pow(float(theta), float(2 * i) / float(head_dim));
  return f;
}

// Rotates channel pairs (i, i + half) for rotate_half, (2i, 2i + 1) for interleaved pairs, by the
// angles position · inv_freq[i] (fp32, as both references form them).
static void rope(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
                 double theta, bool interleaved) {
  const auto freq = inv_freq(head_dim, theta);
  const int half = head_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < half; ++i) {
      const float a = float(positions[r]) * freq[size_t(i)];
      c[size_t(i)] = std::cos(a);
      s[size_t(i)] = std::sin(a);
    }
    for (int h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        float& x1 = interleaved ? v[2 * i] : v[i];
        float& x2 = interleaved ? v[2 * i + 1] : v[i + half];
        const float a = x1, b = x2;
        x1 = a * c[size_t(i)] - b * s[size_t(i)];
        x2 = b * c[size_t(i)] + a * s[size_t(i)];
      }
    }
  }
}

void rope_half(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
               double theta) {
  rope(x, rows, heads, head_dim, positions, theta, false);
}

void rope_interleaved(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
                      double theta) {
  rope(x, rows, heads, head_dim, positions, theta, true);
}

namespace {

// hsum() of four vectors at once: the same pairwise tree per vector (lane i + lane i+8, then +4,
// +2, +1), so each result is bit-identical to hsum() of that vector, with a quarter of the
// shuffles.
inline v4f hsum4(v16f a0, v16f a1, v16f a2, v16f a3) {
  const v16f t0 =
      __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(a0, a1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const v16f t1 =
      __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(a2, a3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // Lanes 4v..4v+3 hold vector v's s4 (its lanes 0-3 plus 4-7 after the first fold).
  const v16f u =
      __builtin_shufflevector(t0, t1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
      __builtin_shufflevector(t0, t1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  // hsum's a = s4[0] + s4[2], b = s4[1] + s4[3], then a + b.
  const v8f w = __builtin_shufflevector(u, u, 0, 1, 4, 5, 8, 9, 12, 13) +
                __builtin_shufflevector(u, u, 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(w, w, 0, 2, 4, 6) + __builtin_shufflevector(w, w, 1, 3, 5, 7);
}

// One (query, head) of attention with head_dim = 16·NV: q and the output accumulator stay in
// registers; scores of four keys share one reduction (hsum4). The arithmetic per score and the
// order of the value sum are those of the generic path below, so both give the same bits.
template <int NV>
void attend_one(const float* qi, const float* k, const float* v, int64_t kv_stride, int64_t n,
                float scale, float* scores, float* o) {
  v16f qv[NV];
  for (int c = 0; c < NV; ++c) qv[c] = load16<DType::F32>(qi, c * kLanes);
  float mx = -INFINITY;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    v16f a[4] = {};
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < NV; ++c)
        a[r] += qv[c] * load16<DType::F32>(k + (j + r) * kv_stride, c * kLanes);
    const v4f d = hsum4(a[0], a[1], a[2], a[3]);
    for (int r = 0; r < 4; ++r) {
      scores[j + r] = d[r] * scale;
      mx = std::max(mx, scores[j + r]);
    }
  }
  for (; j < n; ++j) {
    v16f a = {};
    for (int c = 0; c < NV; ++c) a += qv[c] * load16<DType::F32>(k + j * kv_stride, c * kLanes);
    scores[j] = hsum(a) * scale;
    mx = std::max(mx, scores[j]);
  }
  float sum = 0;
  for (j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  v16f acc[NV] = {};
  for (j = 0; j < n; ++j) {
    const float p = scores[j];
    for (int c = 0; c < NV; ++c) acc[c] += p * load16<DType::F32>(v + j * kv_stride, c * kLanes);
  }
  const float inv = 1.0f / sum;
  for (int c = 0; c < NV; ++c) {
    const v16f r = acc[c] * inv;
    std::memcpy(o + c * kLanes, &r, sizeof(r));
  }
}

}  // namespace

void attention(const float* q, int64_t nq, int n_heads, int n_kv_heads, int head_dim,
               const float* k, const float* v, const int64_t* key_count, float scale, float* out,
               ThreadPool& pool) {
  const int group = n_heads / n_kv_heads;
  const int64_t kv_stride = int64_t(n_kv_heads) * head_dim;
  if (nq <= 0) return;
  const int64_t work = nq * n_heads * key_count[nq - 1] * head_dim;
  pool.parallel_for(nq * n_heads, work < (int64_t(1) << 18) ? nq * n_heads : 1,
                    [&](int64_t b, int64_t e) {
                      std::vector<float> scores;
                      std::vector<float> acc(static_cast<size_t>(head_dim));
                      for (int64_t job = b; job < e; ++job) {
                        const int64_t i = job / n_heads;
                        const int h = int(job % n_heads), kh = h / group;
                        const float* qi = q + (i * n_heads + h) * head_dim;
                        const int64_t n = key_count[i];
                        scores.resize(size_t(n));
                        float* o = out + (i * n_heads + h) * head_dim;
                        const float* kh0 = k + kh * head_dim;
                        const float* vh0 = v + kh * head_dim;
                        switch (head_dim) {
                          case 32:
                            attend_one<2>(qi, kh0, vh0, kv_stride, n, scale, scores.data(), o);
                            continue;
                          case 64:
                            attend_one<4>(qi, kh0, vh0, kv_stride, n, scale, scores.data(), o);
                            continue;
                          case 128:
                            attend_one<8>(qi, kh0, vh0, kv_stride, n, scale, scores.data(), o);
                            continue;
                          default:
                            break;
                        }
                        float mx = -INFINITY;
                        for (int64_t j = 0; j < n; ++j) {
                          scores[size_t(j)] = dot(qi, kh0 + j * kv_stride, head_dim) * scale;
                          mx = std::max(mx, scores[size_t(j)]);
                        }
                        float sum = 0;
                        for (int64_t j = 0; j < n; ++j) {
                          scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
                          sum += scores[size_t(j)];
                        }
                        std::fill(acc.begin(), acc.end(), 0.0f);
                        for (int64_t j = 0; j < n; ++j) {
                          const float p = scores[size_t(j)];
                          const float* vj = vh0 + j * kv_stride;
                          float* a = acc.data();
                          int d = 0;
                          for (; d + kLanes <= head_dim; d += kLanes) {
                            v16f av = load16<DType::F32>(a, d);
                            av += p * load16<DType::F32>(vj, d);
                            std::memcpy(a + d, &av, sizeof(av));
                          }
                          for (; d < head_dim; ++d) a[d] += p * vj[d];
                        }
                        const float inv = 1.0f / sum;
                        for (int d = 0; d < head_dim; ++d) o[d] = acc[size_t(d)] * inv;
                      }
                    });
}

void softmax_rows(float* x, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * dim;
    const float mx = *std::max_element(xr, xr + dim);
    float sum = 0;
    for (int64_t i = 0; i < dim; ++i) {
      xr[i] = std::exp(xr[i] - mx);
      sum += xr[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < dim; ++i) xr[i] *= inv;
  }
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
float gelu(float x) {
  return 0.5f * x * (1.0f + std::erf(x * float(M_SQRT1_2)));
}

}  // namespace ops
}  // namespace flashmap
