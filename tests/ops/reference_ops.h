// Plain float64 references for the CPU ops of src/ops/ops.h and the CUDA kernels that mirror them
// (src/cuda/kernels.h), in the spirit of ggml's test-backend-ops: each function is the textbook
// formula of the reference it names, one loop per sum in index order, in double, with no SIMD, no
// threads and no blocking, so that it can be checked by reading it. tests/ops compares the CPU
// kernels with these under bounds on fp32 rounding, tests/cuda the device kernels by NMSE.
//
// Inputs are the values an op reads, widened to double (exact); weights stored as bf16 or f16 are
// decoded from their bits here (bf16_value, f16_value), not by src/core, so that a wrong
// conversion in the kernels shows up as a mismatch.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

namespace flashmap::reference {

using Vec = std::vector<double>;
using In = std::span<const double>;

inline Vec of(std::span<const float> x) {
  return Vec(x.begin(), x.end());
}

inline Vec abs(In x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = std::fabs(x[i]);
  return y;
}

// torch.bfloat16: the upper 16 bits of an IEEE 754 binary32.
inline double bf16_value(uint16_t bits) {
  return double(std::bit_cast<float>(uint32_t(bits) << 16));
}

// IEEE 754 binary16 from its fields s | e (5 bits, bias 15) | m (10 bits): (−1)^s · 2^(e−15) ·
// (1 + m/2¹⁰); subnormal (e = 0) (−1)^s · 2^−14 · m/2¹⁰; e = 31 is ±inf (m = 0) or NaN.
inline double f16_value(uint16_t bits) {
  const int s = bits >> 15, e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m) / 1024.0, -14);
  return sign * std::ldexp(1.0 + double(m) / 1024.0, e - 15);
}

// Σ_i a[i] · b[i].
inline double dot(In a, In b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// F.linear (nn.Linear): y[m, n] = Σ_k x[m, k] · W[n, k] + bias[n], with W [N, K] and bias [N] or
// empty.
inline Vec linear(In x, int64_t M, In W, int64_t N, int64_t K, In bias = {}) {
  Vec y(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias.empty() ? 0.0 : bias[size_t(n)];
      for (int64_t k = 0; k < K; ++k) s += x[size_t(m * K + k)] * W[size_t(n * K + k)];
      y[size_t(m * N + n)] = s;
    }
  return y;
}

// x @ E: y[m, h] = Σ_v x[m, v] · E[v, h], with x [M, V] and E [V, H].
inline Vec matmul_rows(In x, int64_t M, In E, int64_t V, int64_t H) {
  Vec y(size_t(M * H));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += x[size_t(m * V + v)] * E[size_t(v * H + h)];
      y[size_t(m * H + h)] = s;
    }
  return y;
}

// Qwen3RMSNorm (transformers' modeling_qwen3.py): y = w · x / sqrt(mean(x²) + eps) per row.
// FlashMapRMSNorm computes the same function (it only forms w · rsqrt first), so ops::rms_norm and
// ops::rms_norm_scale_first are both checked against this one.
inline Vec rms_norm(In x, In w, double eps, int64_t rows, int64_t dim) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += x[size_t(r * dim + i)] * x[size_t(r * dim + i)];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i)
      y[size_t(r * dim + i)] = w[size_t(i)] * x[size_t(r * dim + i)] * inv;
  }
  return y;
}

// F.layer_norm without affine parameters: (x − mean) / sqrt(var + eps) per row, var biased (÷ dim).
// With scale and shift ([dim] each) also the drafter's AdaLN modulation y · (1 + scale) + shift
// (FlashMap's modulate; cuda::layer_norm_modulate).
inline Vec layer_norm(In x, double eps, int64_t rows, int64_t dim, In scale = {}, In shift = {}) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * dim;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= double(dim);
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(dim);
    for (int64_t i = 0; i < dim; ++i) {
      double v = (xr[i] - mean) / std::sqrt(var + eps);
      if (!scale.empty()) v = v * (1.0 + scale[size_t(i)]) + shift[size_t(i)];
      y[size_t(r * dim + i)] = v;
    }
  }
  return y;
}

// The rotation angle of channel pair i at `position`, formed as transformers forms it, in fp32:
// inv_freq = 1 / base^(2i/d) (_compute_default_rope_parameters: base ** (arange(0, d, 2).float()
// / d)) and freqs = inv_freq · position (Qwen3RotaryEmbedding.forward, float32 with autocast off);
// FlashMap's apply_rope forms them the same way. These roundings define the model (checkpoints are
// trained with them): at position 10⁵ the fp32 angle is up to ~4e-3 rad from the exact one, so an
// angle in double would be a different function, not a more precise one. cos, sin and the
// rotation below are in double.
inline double rope_angle(int64_t position, int i, int head_dim, double theta) {
  const float inv_freq = 1.0f / std::pow(float(theta), float(2 * i) / float(head_dim));
  return double(float(position) * inv_freq);
}

// Rotary embedding of rows [heads, head_dim] at positions[row]: each channel pair (a, b) becomes
// (a·cos θ − b·sin θ, b·cos θ + a·sin θ), θ = rope_angle(position, i). Pairs are (i, i + d/2) for
// rotate_half (transformers' apply_rotary_pos_emb: q·cos + rotate_half(q)·sin, Qwen3) or
// (2i, 2i + 1) when interleaved (FlashMap's apply_rope).
inline Vec rope(In x, int64_t rows, int heads, int head_dim, std::span<const int64_t> positions,
                double theta, bool interleaved) {
  Vec y(x.begin(), x.end());
  const int half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h) {
      const size_t base = size_t((r * heads + h) * head_dim);
      for (int i = 0; i < half; ++i) {
        const double t = rope_angle(positions[size_t(r)], i, head_dim, theta);
        const size_t ia = base + size_t(interleaved ? 2 * i : i);
        const size_t ib = base + size_t(interleaved ? 2 * i + 1 : i + half);
        const double a = x[ia], b = x[ib];
        y[ia] = a * std::cos(t) - b * std::sin(t);
        y[ib] = b * std::cos(t) + a * std::sin(t);
      }
    }
  return y;
}

// Scaled dot-product attention with grouped KV heads (transformers' eager_attention_forward after
// repeat_kv: query head h reads KV head h / (n_heads / n_kv_heads)), query i over keys
// [0, key_count[i]) — causal over a KV cache when key_count[i] = past + i + 1:
//   out[i, h] = Σ_j p_j · v[j, kv],  p = softmax_j(scale · q[i, h] · k[j, kv]).
// q [nq, n_heads, head_dim]; k, v [n_keys, n_kv_heads, head_dim].
// visible(i, j): whether query i sees key j < key_count[i] (a draft tree hides the keys of
// nodes that are not its ancestors); null: all of them.
inline Vec attention(In q, int64_t nq, int n_heads, int n_kv_heads, int head_dim, In k, In v,
                     std::span<const int64_t> key_count, double scale,
                     const std::function<bool(int64_t, int64_t)>& visible = nullptr) {
  Vec out(size_t(nq * n_heads * head_dim));
  const int group = n_heads / n_kv_heads;
  for (int64_t i = 0; i < nq; ++i)
    for (int h = 0; h < n_heads; ++h) {
      const int kv = h / group;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < key_count[size_t(i)]; ++j)
        if (!visible || visible(i, j)) keys.push_back(j);
      const double* qi = q.data() + (i * n_heads + h) * head_dim;
      Vec s(keys.size());
      for (size_t t = 0; t < keys.size(); ++t)
        s[t] = scale * dot({qi, size_t(head_dim)},
                           {k.data() + (keys[t] * n_kv_heads + kv) * head_dim, size_t(head_dim)});
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int c = 0; c < head_dim; ++c) {
        double o = 0;
        for (size_t t = 0; t < keys.size(); ++t)
          o += s[t] * v[size_t((keys[t] * n_kv_heads + kv) * head_dim + c)];
        out[size_t((i * n_heads + h) * head_dim + c)] = o / sum;
      }
    }
  return out;
}

// softmax per row: exp(x_i) / Σ_j exp(x_j), evaluated as exp(x_i − max) / Σ_j exp(x_j − max) (the
// same number; the shift only keeps exp in range).
inline Vec softmax_rows(In x, int64_t rows, int64_t dim) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double mx = *std::max_element(x.begin() + r * dim, x.begin() + (r + 1) * dim);
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i)
      sum += (y[size_t(r * dim + i)] = std::exp(x[size_t(r * dim + i)] - mx));
    for (int64_t i = 0; i < dim; ++i) y[size_t(r * dim + i)] /= sum;
  }
  return y;
}

// F.silu: x · σ(x) = x / (1 + e^−x).
inline double silu(double x) {
  return x / (1.0 + std::exp(-x));
}
// Qwen3MLP's activation product: silu(gate) · up (down_proj(act_fn(gate_proj(x)) * up_proj(x))).
inline double swiglu(double gate, double up) {
  return silu(gate) * up;
}
// F.gelu (approximate='none'): x/2 · (1 + erf(x / √2)).
inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

// torch.argmax of a row: the lowest index among equal maxima.
inline int64_t argmax(std::span<const float> x) {
  int64_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[size_t(best)]) best = int64_t(i);
  return best;
}

}  // namespace flashmap::reference
