#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "ops/vec16.h"

namespace flashmap {

Weight Weight::of(const TensorView& t) {
  FLASHMAP_CHECK(t.shape.size() == 2 && is_float(t.dtype),
                 "{}: tensor '{}' must be a 2-D float matrix, got {} {}", t.file, t.name,
                 dtype_name(t.dtype), shape_str(t.shape));
  return Weight{t.dtype, t.data, t.shape[0], t.shape[1]};
}

std::shared_ptr<BlockRows> BlockRows::of_ggml(GgmlType type, int64_t cols,
                                              std::vector<uint8_t> bytes) {
  const int64_t block = ggml_block_elems(type), block_bytes = ggml_block_bytes(type);
  FLASHMAP_ASSERT(cols % block == 0 && bytes.size() % size_t(cols / block * block_bytes) == 0);
  auto b = std::make_shared<BlockRows>();
  b->bytes = std::move(bytes);
  b->row_bytes = cols / block * block_bytes;
  b->block = block;
  b->tag = uint64_t(type);
  b->decode = [type, block, block_bytes](const uint8_t* row, int64_t c0, int64_t n, float* out) {
    dequantize_row(type, row + c0 / block * block_bytes, out, n);
  };
  return b;
}

float Weight::at(int64_t r, int64_t c) const {
  if (!is_float(dtype)) throw InternalError("Weight::at on an integer tensor");
  if (blocks) {
    thread_local std::vector<float> row;
    row.resize(size_t(cols));
    row_f32(r, row.data());
    return row[size_t(c)];
  }
  return float_element(data, dtype, r * cols + c);
}

void Weight::row_f32(int64_t r, float* out) const {
  if (blocks) {
    blocks->decode(blocks->bytes.data() + r * blocks->row_bytes, 0, cols, out);
    return;
  }
  if (dtype == DType::F32) {
    std::memcpy(out, static_cast<const float*>(data) + r * cols, size_t(cols) * 4);
    return;
  }
  for (int64_t c = 0; c < cols; ++c) out[c] = at(r, c);
}

namespace ops {
namespace {

typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
#ifdef __FLT16_MANT_DIG__  // a compiler with _Float16 on this target
typedef _Float16 v16x __attribute__((vector_size(32)));
#endif

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
#ifdef __FLT16_MANT_DIG__
    v16x h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + i, sizeof(h));
    return __builtin_convertvector(h, v16f);
#else
    const auto* h = static_cast<const uint16_t*>(base) + i;
    v16f v;
    for (int j = 0; j < kLanes; ++j) v[j] = f16_to_f32(h[j]);
    return v;
#endif
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

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  v16f acc = {};
  const int64_t nv = n / kLanes * kLanes;
  for (int64_t k = 0; k < nv; k += kLanes)
    acc += load16<DType::F32>(a, k) * load16<DType::F32>(b, k);
  if (nv < n) acc += load_tail<DType::F32>(a, nv, n - nv) * load_tail<DType::F32>(b, nv, n - nv);
  return hsum(acc);
}

void for_decoded_rows(const Weight& E, ThreadPool& pool,
                      const std::function<void(int64_t, int64_t, const float*)>& fn) {
  const int64_t V = E.rows, H = E.cols;
  // The calling thread's, kept for its next call (16 MB at H = 4096: allocating it per call
  // faulted in its pages every time).
  thread_local std::vector<float> buf;
  buf.resize(size_t(std::min(kDecodedRows, V) * H));
  float* rows = buf.data();  // the pool's threads write into this thread's buffer
  for (int64_t v_lo = 0; v_lo < V; v_lo += kDecodedRows) {
    const int64_t n = std::min(kDecodedRows, V - v_lo);
    pool.parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) E.row_f32(v_lo + r, rows + r * H);
    });
    fn(v_lo, n, rows);
  }
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

namespace {

// erf on [0, 4) in four pieces of degree 8, fitted by least squares in float64 and rounded to
// float32 (tools/fit_activations.py): [0, 1) as u·P(u²), which keeps the relative error near 0
// small; [1, 2), [2, 3), [3, 4) as P(u − centre). Evaluated in float32: within 1.5e-7 of erf (2.5
// units in the last place near 1; 1.8e-7 relative below 1); erf(u ≥ 4) = 1 in float32.
constexpr float kErf[4][9] = {
    {1.128379226e+00f, -3.761263788e-01f, 1.128379107e-01f, -2.686613798e-02f, 5.223801360e-03f,
     -8.543002186e-04f, 1.196067824e-04f, -1.393377079e-05f, 1.064868115e-06f},
    {9.661051631e-01f, 1.189300716e-01f, -1.783954203e-01f, 1.387634873e-01f, -4.459944740e-02f,
     -1.503330749e-02f, 1.933342963e-02f, -3.834682051e-03f, -2.401930280e-03f},
    {9.995930195e-01f, 2.178318100e-03f, -5.445736926e-03f, 8.348285221e-03f, -8.621518500e-03f,
     6.143381353e-03f, -2.808212070e-03f, 4.030424752e-04f, 3.063119075e-04f},
    {9.999992847e-01f, 5.397294444e-06f, -1.889634405e-05f, 4.240916678e-05f, -6.777083036e-05f,
     8.048143354e-05f, -7.714571257e-05f, 6.689068687e-05f, -3.703743278e-05f}};

// erf of each lane (NaN stays NaN, ±inf gives ±1).
v16f erf16(v16f x) {
  const v16i bits = std::bit_cast<v16i>(x);
  const v16i sign = bits & int32_t(0x80000000u);
  const v16f u = std::bit_cast<v16f>(bits & 0x7fffffff);
  const v16i piece = -((u >= 1.0f) + (u >= 2.0f) + (u >= 3.0f));  // 0 … 3; 0 for NaN
  const v16f centre = __builtin_convertvector(piece, v16f) + 0.5f;
  const v16f t = piece == 0 ? u * u : u - centre;
  const auto coef = [&](int j) {
    const v16f c0 = v16f{} + kErf[0][j], c1 = v16f{} + kErf[1][j], c2 = v16f{} + kErf[2][j],
               c3 = v16f{} + kErf[3][j];
    return piece == 0 ? c0 : piece == 1 ? c1 : piece == 2 ? c2 : c3;
  };
  v16f p = coef(8);
  for (int j = 7; j >= 0; --j) p = p * t + coef(j);
  v16f e = piece == 0 ? u * p : p;
  e = u >= 4.0f ? v16f{} + 1.0f : e;
  return std::bit_cast<v16f>(std::bit_cast<v16i>(e) | sign);
}

v16f gelu16(v16f x) {
  return 0.5f * x * (1.0f + erf16(x * float(M_SQRT1_2)));
}

// e^t of each lane, within 1.3 units in the last place: t = n·ln 2 + r (ln 2 in two parts, the
// first exact in 9 bits so n·ln2_hi is exact), e^r by a degree-6 polynomial on |r| ≤ ln 2 / 2
// fitted as erf's are (tools/fit_activations.py), times 2^n by the exponent's bits. t is clamped to
// [−86, 88.72] (e^t < 2^-124 then counts as that; silu adds it to 1) and e^t above that is inf.
v16f exp16(v16f t) {
  constexpr float kExp[7] = {1.000000000e+00f, 1.000000000e+00f, 5.000000000e-01f, 1.666641533e-01f,
                             4.166621715e-02f, 8.375128731e-03f, 1.394858118e-03f};
  const v16f tc = t < -86.0f   ? v16f{} - 86.0f
                  : t > 88.72f ? v16f{} + 88.72f
                  : t == t     ? t
                               : v16f{};  // NaN: converted as 0, returned as itself
  const v16f n = __builtin_convertvector(
      __builtin_convertvector(tc * 1.44269504f + (tc < 0.0f ? v16f{} - 0.5f : v16f{} + 0.5f), v16i),
      v16f);
  const v16f r = (tc - n * 0.693359375f) - n * -2.12194440e-4f;
  v16f p = v16f{} + kExp[6];
  for (int j = 5; j >= 0; --j) p = p * r + kExp[j];
  // 2^(n − 1) · 2: n reaches 128 at t = 88.72, whose 2^n has no float32 exponent.
  const v16i scale = (__builtin_convertvector(n, v16i) + 126) << 23;
  const v16f e = p * std::bit_cast<v16f>(scale) * 2.0f;
  const v16f inf = v16f{} + std::numeric_limits<float>::infinity();
  return t > 88.72f ? inf : t != t ? t : e;
}

v16f silu16(v16f x) {
  return x / (1.0f + exp16(-x));
}

// −2 ln u of each lane, for u in (0, 1): u = m · 2^e with m in [√½, √2), ln m = 2 atanh(s) with
// s = (m − 1)/(m + 1), |s| ≤ 0.172, by its series to s^11 (truncation below 2e-11), plus e · ln 2
// (in two parts, the first exact in 9 bits).
v16f minus_two_ln16(v16f u) {
  const v16i bits = std::bit_cast<v16i>(u);
  v16i e = ((bits >> 23) & 0xff) - 127;
  v16f m = std::bit_cast<v16f>((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
  const v16i big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e -= big;  // the comparison is −1 where true
  const v16f s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  const v16f series =
      1.0f +
      s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9 + s2 * (1.0f / 11)))));
  const v16f ef = __builtin_convertvector(e, v16f);
  const v16f ln = (ef * 0.693359375f + 2.0f * s * series) + ef * -2.12194440e-4f;
  return -2.0f * ln;
}

// cos and sin of 2π·u for each lane, u in [0, 1): u·4 = q + f with q the nearest integer and
// |f| ≤ 1/2 (exact), φ = f·π/2 in [−π/4, π/4] by the Taylor series to φ^9 and φ^10 (truncation
// below 2e-9), then turned by q quarter turns.
void cos_sin_2pi16(v16f u, v16f& c, v16f& s) {
  const v16f t = u * 4.0f;
  const v16i q = __builtin_convertvector(t + 0.5f, v16i);  // t ≥ 0: truncation rounds
  const v16f phi = (t - __builtin_convertvector(q, v16f)) * 1.57079632679f, p2 = phi * phi;
  const v16f sp =
      phi *
      (1.0f + p2 * (-1.0f / 6 + p2 * (1.0f / 120 + p2 * (-1.0f / 5040 + p2 * (1.0f / 362880)))));
  const v16f cp =
      1.0f + p2 * (-0.5f + p2 * (1.0f / 24 + p2 * (-1.0f / 720 +
                                                   p2 * (1.0f / 40320 + p2 * (-1.0f / 3628800)))));
  const v16i quarter = q & 3;
  c = quarter == 0 ? cp : quarter == 1 ? -sp : quarter == 2 ? -cp : sp;
  s = quarter == 0 ? sp : quarter == 1 ? cp : quarter == 2 ? -sp : -cp;
}

// y[0, n) by 16 lanes at a time: f(i, m) gives the lanes of elements i … i + m − 1 (m < 16 only
// for the tail, which goes through the same lanes, so no value depends on where it lies).
template <class F>
void by_lanes(int64_t n, float* y, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const v16f v = f(i, kLanes);
    std::memcpy(y + i, &v, sizeof v);
  }
  if (i < n) {
    const v16f v = f(i, int(n - i));
    std::memcpy(y + i, &v, size_t(n - i) * sizeof(float));
  }
}

v16f load16(const float* p, int n) {
  v16f v{};
  std::memcpy(&v, p, size_t(n) * sizeof(float));
  return v;
}

}  // namespace

void silu(const float* x, int64_t n, float* y) {
  by_lanes(n, y, [&](int64_t i, int m) { return silu16(load16(x + i, m)); });
}

void swiglu(const float* gate, const float* up, int64_t n, float* y) {
  by_lanes(n, y, [&](int64_t i, int m) { return silu16(load16(gate + i, m)) * load16(up + i, m); });
}

float silu(float x) {
  float y;
  silu(&x, 1, &y);
  return y;
}

void gelu(const float* x, int64_t n, float* y) {
  by_lanes(n, y, [&](int64_t i, int m) { return gelu16(load16(x + i, m)); });
}

float gelu(float x) {
  float y;
  gelu(&x, 1, &y);
  return y;
}

void normals(Rng& rng, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 2 * kLanes) {
    v16f u1, u2;
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t w = rng.next();
      u1[l] = (float(w >> 41) + 0.5f) * 0x1.0p-23f;  // exact
      u2[l] = float((w >> 16) & 0xffffff) * 0x1.0p-24f;
    }
    v16f c, s;
    cos_sin_2pi16(u2, c, s);
    const v16f r2 = minus_two_ln16(u1);
    v16f r;
    for (int l = 0; l < kLanes; ++l) r[l] = std::sqrt(r2[l]);
    const v16f z[2] = {r * c, r * s};
    std::memcpy(y + i, z, size_t(std::min<int64_t>(n - i, 2 * kLanes)) * sizeof(float));
  }
}

}  // namespace ops
}  // namespace flashmap
