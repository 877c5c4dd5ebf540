#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstring>
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
typedef _Float16 v16x __attribute__((vector_size(32)));

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

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
float gelu(float x) {
  return 0.5f * x * (1.0f + std::erf(x * float(M_SQRT1_2)));
}

}  // namespace ops
}  // namespace flashmap
