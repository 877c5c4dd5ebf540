// Packing (and q8/q4 quantization) of linear weights, the choice of kernel for this CPU, and
// ops::linear, which runs the kernel over column panels on the thread pool.
#include "ops/gemm.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/gemm_kernel.h"
#include "ops/ops.h"

namespace flashmap::ops {

WeightFormat parse_weight_format(const std::string& s) {
  if (s == "native" || s == "auto") return WeightFormat::Native;
  if (s == "q8" || s == "q8_0" || s == "int8") return WeightFormat::Q8;
  if (s == "q4" || s == "q4_0" || s == "int4") return WeightFormat::Q4;
  throw Error(fmt::format("--weights: unknown weight format '{}' (native, q8 or q4)", s));
}

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q8:
      return "q8";
    case WeightFormat::Q4:
      return "q4";
    case WeightFormat::Bf16:
      return "bf16-compute";
    case WeightFormat::Unpacked:
      return "unpacked";
    case WeightFormat::Native:
      break;
  }
  return "native";
}

WeightFormat weight_format(const std::string& weights, const std::string& compute) {
  const WeightFormat w = parse_weight_format(weights);
  if (compute == "fp32" || compute == "f32" || compute.empty()) return w;
  FLASHMAP_CHECK(compute == "bf16", "--compute: unknown compute mode '{}' (fp32 or bf16)", compute);
  FLASHMAP_CHECK(w != WeightFormat::Q8 && w != WeightFormat::Q4,
                 "--compute bf16 with --weights {}: {} products are int8 dot products already "
                 "(use one or the other)",
                 weight_format_name(w), weight_format_name(w));
  FLASHMAP_CHECK(has_bf16_compute(),
                 "--compute bf16 needs a CPU with AVX512-BF16 (vdpbf16ps); this one runs the {} "
                 "kernels (use --compute fp32)",
                 isa_name(active_isa()));
  return WeightFormat::Bf16;
}

namespace {

static_assert(kernel::kCols == kPanel && kernel::kBlockK == kQ8Block &&
              kernel::kQ4KBlocks * kernel::kBlockK == kQ4KBlock);
constexpr int64_t kQ8BlockBytes = kernel::kQ8Bytes + kernel::kScaleBytes;
constexpr int64_t kQ4BlockBytes = kernel::kQ4Bytes + kernel::kScaleBytes;

uint8_t* alloc_panels(int64_t bytes) {
  // 2 MiB alignment lets transparent huge pages back the buffer (set to "madvise" on Debian):
  // a decode step streams every weight once, and 4 KiB pages would cost a TLB miss per page.
  // Whole huge pages when that wastes at most an eighth (Qwen3's matrices are multiples of 2 MiB).
  const int64_t huge = int64_t(2) << 20, padded = (bytes + huge - 1) / huge * huge;
  const size_t align = bytes >= huge && padded - bytes <= bytes / 8 ? size_t(huge) : 64;
  const size_t size = (size_t(bytes) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size == 0 ? align : size);
  if (!p) throw Error(fmt::format("out of memory packing {} bytes of weights", bytes));
#ifdef MADV_HUGEPAGE
  if (align > 64) ::madvise(p, size, MADV_HUGEPAGE);
#endif
  return static_cast<uint8_t*>(p);
}

// Panels [p0, p1) of W in its own dtype: element (k, j) of panel p is W[32p + j, k]. T: an
// integer type of the element's size (a plain copy of its bits). Rows are copied 64 values at a
// time into a small tile first: reading the 32 rows in step (k by k) would map them, rows a power
// of two of bytes apart, onto a few L1 sets that evict each other.
template <class T>
void pack_native(const Weight& W, PackedWeight& P, int64_t p0, int64_t p1) {
  constexpr int64_t kStep = 64;
  const auto* src = static_cast<const T*>(W.data);
  const int64_t K = W.cols;
  T tile[kPanel][kStep];
  for (int64_t p = p0; p < p1; ++p) {
    T* dst = reinterpret_cast<T*>(P.data.get() + p * P.panel_bytes);
    const int live = int(std::min<int64_t>(kPanel, W.rows - p * kPanel));
    for (int64_t k0 = 0; k0 < K; k0 += kStep) {
      const int64_t n = std::min(kStep, K - k0);
      for (int j = 0; j < kPanel; ++j)
        if (j < live)
          std::memcpy(tile[j], src + (p * kPanel + j) * K + k0, size_t(n) * sizeof(T));
        else
          std::memset(tile[j], 0, sizeof(tile[j]));
      for (int64_t k = 0; k < n; ++k)
        for (int j = 0; j < kPanel; ++j) dst[(k0 + k) * kPanel + j] = tile[j][k];
    }
  }
}

// ggml's Q8_0 rule, so that a q8 model here is the model llama.cpp's Q8_0 file holds: d =
// max|w| / 127 and q = roundf(w · (1/d)) (half away from zero) in fp32, then d stored as fp16;
// the weight run is q · fp16(d). q[i] gets q + 128.
struct Q8Rule {
  static constexpr const char* kName = "q8";
  static constexpr int64_t kQBytes = kernel::kQ8Bytes;
  static uint16_t quantize(const float* w, float amax, float, uint8_t* q) {
    const float d = amax / 127.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    for (int i = 0; i < kQ8Block; ++i) {
      // Clamped first (to integers, so rounding after gives the same), NaN (0 · ∞ past a
      // subnormal d, whose fp16 scale is 0 anyway) to 0; then roundf as truncation plus a step
      // away from zero where the dropped fraction, exact, is at least a half. No libm call: it
      // vectorizes.
      float v = std::clamp(w[i] * id, -127.0f, 127.0f);
      v = v == v ? v : 0.0f;
      const int t = int(v);
      const float f = v - float(t);
      q[i] = uint8_t(t + (f >= 0.5f) - (f <= -0.5f) + 128);
    }
    return f32_to_f16(d);
  }
  // Value i of column j: group i / 4 of 4 k, byte i % 4 of the column's 4 (gemm.h).
  static void store(const uint8_t* q, uint8_t* blk, int j) {
    for (int g = 0; g < kQ8Block / 4; ++g) std::memcpy(blk + g * kPanel * 4 + j * 4, q + 4 * g, 4);
  }
};

// ggml's Q4_0 rule, so that a q4 model here is the model llama.cpp's Q4_0 file holds: with m the
// first value of largest magnitude, d = m / −8 and q = min(15, trunc(w · (1/d) + 8.5)) in fp32
// (stored as the nibble q), then d as fp16; the weight run is (q − 8) · fp16(d).
struct Q4Rule {
  static constexpr const char* kName = "q4";
  static constexpr int64_t kQBytes = kernel::kQ4Bytes;
  static uint16_t quantize(const float* w, float, float m, uint8_t* q) {
    const float d = m / -8.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    for (int i = 0; i < kQ8Block; ++i) {
      // w · id + 8.5 lies in [0.5, 16.5] up to rounding: truncation is floor there. Clamped
      // first (to integers, so truncating after gives the same), NaN to 8 (0).
      float v = std::clamp(w[i] * id + 8.5f, 0.0f, 15.0f);
      v = v == v ? v : 8.0f;
      q[i] = uint8_t(int(v));
    }
    return f32_to_f16(d);
  }
  // Groups 2h and 2h + 1 share the bytes of pair h, low nibble first (the low 4 bits of each q:
  // the K formats keep their higher bits apart).
  static void store(const uint8_t* q, uint8_t* blk, int j) {
    for (int h = 0; h < kQ8Block / 8; ++h)
      for (int k = 0; k < 4; ++k)
        blk[h * kPanel * 4 + j * 4 + k] =
            uint8_t((q[8 * h + k] & 15) | (q[8 * h + 4 + k] & 15) << 4);
  }
};

// Panels [p0, p1) of an integer format, column by column and block of 32 k: every weight must be
// finite; Rule::quantize(w, amax, m, q) quantizes the block's 32 values w (amax: their largest
// magnitude, m: the first value of that magnitude) into q and returns the scale as fp16, which
// must be finite too; Rule::store lays q out in the block, the scale after its kQBytes.
template <class Rule>
void pack_blocks(const Weight& W, PackedWeight& P, const std::string& what, int64_t p0,
                 int64_t p1) {
  std::vector<float> row(static_cast<size_t>(W.cols));
  for (int64_t p = p0; p < p1; ++p) {
    uint8_t* panel = P.data.get() + p * P.panel_bytes;
    for (int j = 0; j < kPanel; ++j) {
      const int64_t n = p * kPanel + j;
      if (n < W.rows)
        W.row_f32(n, row.data());
      else
        std::fill(row.begin(), row.end(), 0.0f);
      for (int64_t b = 0; b < W.cols / kQ8Block; ++b) {
        const float* w = row.data() + b * kQ8Block;
        float amax = 0, m = 0;
        bool finite = true;
        for (int i = 0; i < kQ8Block; ++i) {
          finite &= std::isfinite(w[i]);
          if (amax < std::fabs(w[i])) {
            amax = std::fabs(w[i]);
            m = w[i];
          }
        }
        if (!finite)
          for (int i = 0; i < kQ8Block; ++i)
            FLASHMAP_CHECK(std::isfinite(w[i]),
                           "{}: row {} holds {} at column {}; {} needs finite weights", what, n,
                           w[i], b * kQ8Block + i, Rule::kName);
        uint8_t* blk = panel + b * (Rule::kQBytes + kernel::kScaleBytes);
        uint8_t q[kQ8Block];
        const uint16_t dh = Rule::quantize(w, amax, m, q);
        FLASHMAP_CHECK(std::isfinite(f16_to_f32(dh)),
                       "{}: row {} has a block of magnitude {}, past what a {} scale (fp16) holds",
                       what, n, amax, Rule::kName);
        Rule::store(q, blk, j);
        std::memcpy(blk + Rule::kQBytes + j * 2, &dh, 2);
      }
    }
  }
}

// Panels [p0, p1) for the bf16 compute mode: element (kp, j) of panel p is the uint32 pair
// (bf16(W[32p + j, 2kp]), bf16(W[32p + j, 2kp + 1])), even k in the low half; bf16 files keep
// their bits, f32/f16 are rounded to nearest even (f32_to_bf16, as the activations are).
void pack_bf16_pairs(const Weight& W, PackedWeight& P, int64_t p0, int64_t p1) {
  const int64_t K = W.cols, pairs = (K + 1) / 2;
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<uint16_t> h(static_cast<size_t>(2 * pairs));
  for (int64_t p = p0; p < p1; ++p) {
    auto* dst = reinterpret_cast<uint32_t*>(P.data.get() + p * P.panel_bytes);
    for (int j = 0; j < kPanel; ++j) {
      const int64_t n = p * kPanel + j;
      std::fill(h.begin(), h.end(), uint16_t(0));
      if (n < W.rows) {
        if (W.dtype == DType::BF16) {
          std::memcpy(h.data(), static_cast<const uint16_t*>(W.data) + n * K, size_t(K) * 2);
        } else {
          W.row_f32(n, row.data());
          for (int64_t k = 0; k < K; ++k) h[size_t(k)] = f32_to_bf16(row[size_t(k)]);
        }
      }
      for (int64_t kp = 0; kp < pairs; ++kp)
        dst[kp * kPanel + j] = uint32_t(h[size_t(2 * kp)]) | uint32_t(h[size_t(2 * kp + 1)]) << 16;
    }
  }
}

}  // namespace

std::shared_ptr<const PackedWeight> pack(const Weight& W, WeightFormat format,
                                         const std::string& what, ThreadPool& pool) {
  FLASHMAP_CHECK(is_float(W.dtype), "{}: cannot pack a {} matrix as weights", what,
                 dtype_name(W.dtype));
  FLASHMAP_ASSERT(format != WeightFormat::Unpacked);
  FLASHMAP_CHECK(format != WeightFormat::Bf16 || has_bf16_compute(),
                 "{}: the bf16 compute mode needs a CPU with AVX512-BF16", what);
  auto P = std::make_shared<PackedWeight>();
  P->dtype = format == WeightFormat::Bf16 ? DType::BF16 : W.dtype;
  P->q8 = format == WeightFormat::Q8;
  P->q4 = format == WeightFormat::Q4;
  P->bf16_dot = format == WeightFormat::Bf16;
  P->rows = W.rows;
  P->cols = W.cols;
  P->panels = (W.rows + kPanel - 1) / kPanel;
  if (P->integer()) {
    FLASHMAP_CHECK(W.cols % kQ8Block == 0,
                   "{}: --weights {} needs the input size to be a multiple of {} (one scale per "
                   "{} weights), but it is {} — run this model with --weights native",
                   what, weight_format_name(format), kQ8Block, kQ8Block, W.cols);
    P->panel_bytes = W.cols / kQ8Block * (P->q8 ? kQ8BlockBytes : kQ4BlockBytes);
  } else if (P->bf16_dot) {
    P->panel_bytes = (W.cols + 1) / 2 * kPanel * 4;
  } else {
    P->panel_bytes = W.cols * kPanel * int64_t(dtype_size(W.dtype));
  }
  P->data = {alloc_panels(P->bytes()), std::free};
  // Packs of a model's weights run once at load, on the pool; small ones (a test's unpacked
  // weight packed per call) stay on the calling thread.
  const int64_t grain = P->bytes() < (int64_t(1) << 20) ? std::max<int64_t>(P->panels, 1) : 8;
  auto body = [&](int64_t p0, int64_t p1) {
    // The rules are checked byte for byte against the gguf package's quantizer
    // (tests/ops/test_gemm.cpp).
    if (P->q8)
      pack_blocks<Q8Rule>(W, *P, what, p0, p1);
    else if (P->q4)
      pack_blocks<Q4Rule>(W, *P, what, p0, p1);
    else if (P->bf16_dot)
      pack_bf16_pairs(W, *P, p0, p1);
    else if (dtype_size(W.dtype) == 4)
      pack_native<uint32_t>(W, *P, p0, p1);
    else
      pack_native<uint16_t>(W, *P, p0, p1);
  };
  if (grain >= P->panels)
    body(0, P->panels);
  else
    pool.parallel_for(P->panels, grain, body);
  return P;
}

namespace {

// A super-block format's panels (q4k, q6k): `block(n, s, b)` gives row n's super-block s (k from
// 256 s), whose d (and dmin) `finite(b)` checks, and `store(b, sb, j)` writes it into the panel's
// super-block at sb as column j; rows past the matrix stay zero.
template <class Block, class Finite, class Store>
std::shared_ptr<PackedWeight> pack_super(int64_t rows, int64_t cols, int64_t super_bytes,
                                         const char* type,
                                         const std::function<void(int64_t, int64_t, Block&)>& block,
                                         const Finite& finite, const Store& store,
                                         const std::string& what, ThreadPool& pool) {
  FLASHMAP_CHECK(cols % kQ4KBlock == 0,
                 "{}: a {} matrix needs the input size to be a multiple of {}, but it is {}", what,
                 type, kQ4KBlock, cols);
  auto P = std::make_shared<PackedWeight>();
  P->dtype = DType::F32;
  P->rows = rows;
  P->cols = cols;
  P->panels = (rows + kPanel - 1) / kPanel;
  P->panel_bytes = cols / kQ4KBlock * super_bytes;
  P->data = {alloc_panels(P->bytes()), std::free};
  // Each thread zeroes the panels it fills: the first touch of fresh pages (the kernel's page
  // faults and zeroing, slow on a VM) spread over the pool rather than on one thread.
  auto body = [&](int64_t p0, int64_t p1) {
    std::memset(P->data.get() + p0 * P->panel_bytes, 0, size_t((p1 - p0) * P->panel_bytes));
    Block b;
    for (int64_t p = p0; p < p1; ++p)
      for (int j = 0; j < kPanel && p * kPanel + j < rows; ++j) {
        const int64_t n = p * kPanel + j;
        for (int64_t s = 0; s < cols / kQ4KBlock; ++s) {
          block(n, s, b);
          FLASHMAP_CHECK(finite(b), "{}: row {} has a {} block (k from {}) whose {} not finite",
                         what, n, type, s * kQ4KBlock,
                         std::is_same_v<Block, Q4KBlock> ? "d or dmin is" : "d is");
          store(b, P->data.get() + p * P->panel_bytes + s * super_bytes, j);
        }
      }
  };
  if (P->bytes() < (int64_t(1) << 20))
    body(0, P->panels);
  else
    pool.parallel_for(P->panels, 8, body);
  return P;
}

}  // namespace

namespace {

// Q4_K or Q5_K (fifth: whether q has a fifth bit) blocks as q4k or q5k panels.
std::shared_ptr<const PackedWeight> pack_k_min(
    int64_t rows, int64_t cols, bool fifth,
    const std::function<void(int64_t, int64_t, Q4KBlock&)>& block, const std::string& what,
    ThreadPool& pool) {
  constexpr int64_t kQ = kernel::kQ4Bytes, kHead = kernel::kQ4KHeadBytes;
  const int64_t block_bytes = kQ + (fifth ? kernel::kQ5HighBytes : 0);
  const auto finite = [](const Q4KBlock& b) {
    return std::isfinite(f16_to_f32(b.d)) && std::isfinite(f16_to_f32(b.dmin));
  };
  const auto store = [&](const Q4KBlock& qb, uint8_t* sb, int j) {
    for (int b = 0; b < kernel::kQ4KBlocks; ++b) {
      const uint8_t* q = qb.q + b * kQ8Block;
      uint8_t* blk = sb + kHead + b * block_bytes;
      Q4Rule::store(q, blk, j);
      if (fifth)  // group g's fifth bits at bit g of its 4 bytes
        for (int k = 0; k < 4; ++k) {
          uint8_t v = 0;
          for (int g = 0; g < kQ8Block / 4; ++g) v |= uint8_t((q[g * 4 + k] >> 4 & 1) << g);
          blk[kQ + j * 4 + k] = v;
        }
      sb[2 * b * kPanel + j] = qb.sc[b] & 63;
      sb[(2 * b + 1) * kPanel + j] = qb.m[b] & 63;
    }
    const uint16_t neg_dmin = qb.dmin ^ 0x8000;
    std::memcpy(sb + 4 * kPanel * 4 + j * 2, &qb.d, 2);
    std::memcpy(sb + 4 * kPanel * 4 + kPanel * 2 + j * 2, &neg_dmin, 2);
  };
  auto P = pack_super<Q4KBlock>(rows, cols, kHead + kernel::kQ4KBlocks * block_bytes,
                                fifth ? "Q5_K" : "Q4_K", block, finite, store, what, pool);
  (fifth ? P->q5k : P->q4k) = true;
  return P;
}

}  // namespace

std::shared_ptr<const PackedWeight> pack_q4k(
    int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t, Q4KBlock&)>& block,
    const std::string& what, ThreadPool& pool) {
  return pack_k_min(rows, cols, false, block, what, pool);
}

std::shared_ptr<const PackedWeight> pack_q5k(
    int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t, Q4KBlock&)>& block,
    const std::string& what, ThreadPool& pool) {
  return pack_k_min(rows, cols, true, block, what, pool);
}

std::shared_ptr<const PackedWeight> pack_q6k(
    int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t, Q6KBlock&)>& block,
    const std::string& what, ThreadPool& pool) {
  constexpr int64_t kLow = kernel::kQ4Bytes, kHead = kernel::kQ6KHeadBytes;
  constexpr int64_t kBlock = kLow + kernel::kQ6HighBytes;
  const auto finite = [](const Q6KBlock& b) { return std::isfinite(f16_to_f32(b.d)); };
  const auto store = [](const Q6KBlock& qb, uint8_t* sb, int j) {
    for (int h = 0; h < 16; ++h) sb[h * kPanel + j] = uint8_t(qb.sc[h]);
    std::memcpy(sb + 4 * kPanel * 4 + j * 2, &qb.d, 2);
    for (int b = 0; b < kernel::kQ4KBlocks; ++b) {
      const uint8_t* q = qb.q + b * kQ8Block;
      uint8_t* blk = sb + kHead + b * kBlock;
      Q4Rule::store(q, blk, j);
      // Group g's high bits in quad g / 4, at bits 2 (g % 4) of each of its 4 bytes.
      for (int quad = 0; quad < 2; ++quad)
        for (int k = 0; k < 4; ++k) {
          uint8_t v = 0;
          for (int t = 0; t < 4; ++t) v |= uint8_t((q[(4 * quad + t) * 4 + k] >> 4 & 3) << (2 * t));
          blk[kLow + quad * kPanel * 4 + j * 4 + k] = v;
        }
    }
  };
  auto P = pack_super<Q6KBlock>(rows, cols, kernel::kQ6KSuperBytes, "Q6_K", block, finite, store,
                                what, pool);
  P->q6k = true;
  return P;
}

std::shared_ptr<const PackedWeight> stack_rows(std::span<const PackedWeight* const> parts,
                                               ThreadPool& pool) {
  FLASHMAP_ASSERT(!parts.empty());
  const PackedWeight& first = *parts[0];
  auto P = std::make_shared<PackedWeight>();
  P->dtype = first.dtype;
  P->q8 = first.q8;
  P->q4 = first.q4;
  P->q4k = first.q4k;
  P->q5k = first.q5k;
  P->q6k = first.q6k;
  P->bf16_dot = first.bf16_dot;
  P->cols = first.cols;
  P->panel_bytes = first.panel_bytes;
  for (size_t i = 0; i < parts.size(); ++i) {
    const PackedWeight& w = *parts[i];
    FLASHMAP_ASSERT(w.same_layout(first));
    FLASHMAP_ASSERT(i + 1 == parts.size() || w.rows % kPanel == 0);
    P->rows += w.rows;
    P->panels += w.panels;
  }
  P->data = {alloc_panels(P->bytes()), std::free};
  // Panel by panel over the pool (the parts' panels are consecutive in the stack), so that the
  // fresh pages' first touch is spread over the threads.
  std::vector<const uint8_t*> from(size_t(P->panels));
  for (int64_t i = 0; const PackedWeight* w : parts)
    for (int64_t p = 0; p < w->panels; ++p) from[size_t(i++)] = w->data.get() + p * w->panel_bytes;
  pool.parallel_for(P->panels, 8, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      std::memcpy(P->data.get() + p * P->panel_bytes, from[size_t(p)], size_t(P->panel_bytes));
  });
  return P;
}

// --- instruction sets -------------------------------------------------------------------------

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Amx:
      return "amx";
    case Isa::Avx512Bf16:
      return "avx512-bf16";
    case Isa::Avx512Vnni:
      return "avx512-vnni";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2Vnni:
      return "avx2-vnni";
    case Isa::Avx2:
      return "avx2";
    case Isa::Generic:
      break;
  }
  return "generic";
}

namespace {

bool cpu_has_avx_vnni() {
#if FLASHMAP_HAS_AVX_VNNI_KERNEL
  // CPUID leaf 7, subleaf 1, EAX bit 4 (not every compiler's __builtin_cpu_supports knows the
  // name); its registers are AVX's, whose saving by the OS the AVX2 check has covered.
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1u);
#else
  return false;
#endif
}

// Whether the CPU has AMX's tiles with bf16 products and the OS saves their state (XCR0's
// XTILECFG and XTILEDATA) and grants this process the tile data (Linux asks each process to
// request it, ARCH_REQ_XCOMP_PERM, before its first tile instruction).
bool amx_granted() {
#if FLASHMAP_HAS_AMX_KERNEL && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  // Leaf 7's EDX: AMX-BF16 (bit 22), AMX-TILE (24); leaf 1's ECX: OSXSAVE (27), for xgetbv.
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1u) || !(d >> 24 & 1u)) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1u)) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo >> 17 & 3u) != 3u) return false;
  constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
#else
  return false;
#endif
}

// The highest set at or below `want` that the CPU runs: Avx2Vnni is not implied by AVX-512.
Isa clamp(Isa want, Isa best) {
  Isa isa = std::min(want, best);
  if (isa == Isa::Avx2Vnni && !cpu_has_avx_vnni()) isa = Isa::Avx2;
  return isa;
}

Isa detect() {
  Isa best = Isa::Generic;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc also checks (XGETBV) that the OS saves the wider registers.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::Avx2;
  if (best == Isa::Avx2 && cpu_has_avx_vnni()) best = Isa::Avx2Vnni;
  if (best >= Isa::Avx2 && __builtin_cpu_supports("avx512f")) best = Isa::Avx512;
  if (best == Isa::Avx512 && __builtin_cpu_supports("avx512vnni")) best = Isa::Avx512Vnni;
  if (best == Isa::Avx512Vnni && __builtin_cpu_supports("avx512bf16")) best = Isa::Avx512Bf16;
  if (best == Isa::Avx512Bf16 && amx_granted()) best = Isa::Amx;
#endif
  if (const char* cap = std::getenv("FLASHMAP_ISA")) {
    const std::string c = cap;
    const Isa* want = nullptr;
    static const Isa kAll[] = {Isa::Generic,    Isa::Avx2,       Isa::Avx2Vnni, Isa::Avx512,
                               Isa::Avx512Vnni, Isa::Avx512Bf16, Isa::Amx};
    for (const Isa& isa : kAll)
      if (c == isa_name(isa)) want = &isa;
    // A misspelt cap must not quietly run everything on the scalar kernel.
    if (want)
      best = clamp(*want, best);
    else
      fmt::print(stderr,
                 "flashmap: FLASHMAP_ISA={} is not one of generic, avx2, avx2-vnni, avx512, "
                 "avx512-vnni, avx512-bf16, amx; ignored\n",
                 c);
  }
  return best;
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa{best_isa()};
  return isa;
}

}  // namespace

Isa best_isa() {
  static const Isa best = detect();
  return best;
}

Isa active_isa() {
  return active().load(std::memory_order_relaxed);
}

bool isa_supported(Isa isa) {
  return clamp(isa, best_isa()) == isa;
}

void set_isa(Isa isa) {
  active().store(clamp(isa, best_isa()), std::memory_order_relaxed);
}

bool has_bf16_compute() {
  return active_isa() >= Isa::Avx512Bf16;
}

// --- linear -----------------------------------------------------------------------------------

namespace {

// x quantized as ggml quantizes the activations it multiplies with Q8_0 and Q4_0 weights: per row
// and block of 32, q = roundf(x / (max|x| / 127)) in fp32, and the block's scale dx is that
// max|x| / 127 rounded to fp16 (a block_q8_0 holds it so; the product then equals llama.cpp's
// on the same weights). Where ggml's fp16 would overflow (max|x| > 65504 · 127), dx saturates at
// 65504. Each row is quantized alone, so rows do not depend on their batch. A non-finite block
// gets dx = NaN (the outputs become NaN, as fp32 arithmetic would make them) and q = 0. The
// buffers are the calling thread's, valid until its next call; qf (q as fp32) is filled only for
// the kernels whose tiles multiply in fp32 (with_qf).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> qf, d;
  std::vector<int32_t> sum, half_sum;  // Σ q of each block, and of each half of one

  static constexpr int64_t kQuantizeGrain = 256;

  static QuantizedRows& of_thread(const float* x, int64_t M, int64_t K, int64_t ldx, bool with_qf,
                                  ThreadPool& pool) {
    thread_local QuantizedRows rows;
    const int64_t KB = K / kQ8Block;
    rows.q.resize(size_t(M * K));
    rows.qf.resize(with_qf ? size_t(M * K) : 0);
    rows.d.resize(size_t(M * KB));
    rows.sum.resize(size_t(M * KB));
    rows.half_sum.resize(size_t(2 * M * KB));
    // Through plain pointers: a byte stored through q could alias the vectors' own fields.
    int8_t* q = rows.q.data();
    float *qf = rows.qf.data(), *d = rows.d.data();
    int32_t *sum = rows.sum.data(), *half_sum = rows.half_sum.data();
    // Over the pool in runs of kQuantizeGrain blocks (a few microseconds each); a product with
    // fewer blocks quantizes them on the calling thread.
    pool.parallel_for(M * KB, kQuantizeGrain, [&](int64_t b0, int64_t b1) {
      for (int64_t bi = b0; bi < b1; ++bi) {
        const int64_t m = bi / KB, b = bi % KB, at = m * K + b * kQ8Block;
        block(x + m * ldx + b * kQ8Block, q + at, with_qf ? qf + at : nullptr, d[bi], sum[bi],
              half_sum + 2 * bi);
      }
    });
    return rows;
  }

 private:
  // One block of 32 in two 16-lane vectors (GCC lowers them to what the build targets).
  typedef float v16f __attribute__((vector_size(64)));
  typedef int32_t v16i __attribute__((vector_size(64)));
  typedef int8_t v16b __attribute__((vector_size(16)));

  // roundf (half away from zero) for |v| < 2³¹: truncate, then step away from zero where the
  // dropped fraction (exact) is at least a half.
  static v16i round_away(v16f v) {
    const v16i t = __builtin_convertvector(v, v16i);
    const v16f frac = v - __builtin_convertvector(t, v16f);
    return t - (frac >= 0.5f) + (frac <= -0.5f);  // comparisons give −1 where true
  }

  // v with lane i taken from lane i ^ S: one step of a reduction that halves the vector.
  template <int S, class T, size_t... I>
  static T swapped(T v, std::index_sequence<I...>) {
    return __builtin_shufflevector(v, v, (int(I) ^ S)...);
  }
  template <int S, class T>
  static T swapped(T v) {
    return swapped<S>(v, std::make_index_sequence<16>{});
  }

  // The largest lane and the sum of the lanes, halving the vector each step.
  static float max_lane(v16f v) {
    v = v > swapped<8>(v) ? v : swapped<8>(v);
    v = v > swapped<4>(v) ? v : swapped<4>(v);
    v = v > swapped<2>(v) ? v : swapped<2>(v);
    return std::max(v[0], v[1]);
  }
  static int32_t sum_lanes(v16i v) {
    v += swapped<8>(v);
    v += swapped<4>(v);
    v += swapped<2>(v);
    return v[0] + v[1];
  }

  // One block's q (and qf, where not null), scale, sum and half sums.
  static void block(const float* xb, int8_t* q, float* qf, float& d, int32_t& sum,
                    int32_t* half_sum) {
    v16f x[2];
    std::memcpy(x, xb, sizeof(x));
    const v16i abs_mask = v16i{} + 0x7fffffff;
    const v16f a0 = (v16f)((v16i)x[0] & abs_mask), a1 = (v16f)((v16i)x[1] & abs_mask);
    // Finite: every |x| ≤ the largest float (false for ±inf and NaN). Only then is amax used.
    const v16i ok = (a0 <= FLT_MAX) & (a1 <= FLT_MAX);
    const bool finite = sum_lanes(ok) == -16;
    const float amax = max_lane(a0 > a1 ? a0 : a1);
    const float dx = amax / 127.0f, id = dx == 0.0f ? 0.0f : 1.0f / dx;
    int32_t s = 0;
    for (int h = 0; h < 2; ++h) {
      const v16i qi = finite ? round_away(x[h] * id) : v16i{};
      if (qf) {
        const v16f qv = __builtin_convertvector(qi, v16f);
        std::memcpy(qf + h * 16, &qv, sizeof(qv));
      }
      const v16b qb = __builtin_convertvector(qi, v16b);
      std::memcpy(q + h * 16, &qb, sizeof(qb));
      half_sum[h] = sum_lanes(qi);
      s += half_sum[h];
    }
    d = finite ? f16_to_f32(f32_to_f16(std::min(dx, 65504.0f))) : NAN;
    sum = s;
  }
};

using Kernel = void (*)(const kernel::Args&, int64_t, int64_t);

// A core's L2 bytes as the C library reports them (512 KiB, the smallest of the CPUs this runs on,
// where it reports none).
int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long n = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return n > 0 ? int64_t(n) : int64_t(512) << 10;
  }();
  return bytes;
}

// The active instruction set's kernel for every format but kBF16Dot; vnni: whether its integer
// tiles take VNNI dot products.
Kernel active_kernel(bool& vnni) {
  vnni = false;
  switch (active_isa()) {
    case Isa::Amx:
    case Isa::Avx512Bf16:
    case Isa::Avx512Vnni:
      vnni = true;
      return kernel::gemm_avx512;
    case Isa::Avx512:
      return kernel::gemm_avx512;
    case Isa::Avx2Vnni:  // active only where the kernel was built (clamp)
#if FLASHMAP_HAS_AVX_VNNI_KERNEL
      return kernel::gemm_avx2vnni;
#else
      return kernel::gemm_avx2;
#endif
    case Isa::Avx2:
      return kernel::gemm_avx2;
    case Isa::Generic:
      break;
  }
  return kernel::gemm_generic;
}

// The rows of x rounded to bf16 (to nearest even, f32_to_bf16) and paired along k, as the bf16
// compute kernel reads them; each row alone, so rows do not depend on their batch. In a buffer of
// the calling thread's, valid until its next call.
const uint32_t* bf16_pairs(const float* x, int64_t M, int64_t K, int64_t ldx) {
  thread_local std::vector<uint32_t> buf;
  const int64_t pairs = (K + 1) / 2;
  buf.resize(size_t(M * pairs));
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * ldx;
    uint32_t* d = buf.data() + m * pairs;
    for (int64_t kp = 0; kp < K / 2; ++kp)
      d[kp] = uint32_t(f32_to_bf16(r[2 * kp])) | uint32_t(f32_to_bf16(r[2 * kp + 1])) << 16;
    if (K % 2) d[pairs - 1] = f32_to_bf16(r[K - 1]);
  }
  return buf.data();
}

// bf16_pairs' values in the AMX kernel's order: the rows' first 16 pairs, then their next 16, …
// (zeros past the K's pairs), so that a tile of rows is one contiguous KiB.
const uint32_t* bf16_tiles(const float* x, int64_t M, int64_t K, int64_t ldx) {
  thread_local std::vector<uint32_t> buf;
  const int64_t chunks = (K + 31) / 32;
  buf.resize(size_t(chunks * M * 16));
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * ldx;
    for (int64_t c = 0; c < chunks; ++c) {
      uint32_t* d = buf.data() + (c * M + m) * 16;
      const int64_t k0 = c * 32, n = std::min<int64_t>(32, K - k0);
      if (n == 32) {
        for (int j = 0; j < 16; ++j)
          d[j] = uint32_t(f32_to_bf16(r[k0 + 2 * j])) | uint32_t(f32_to_bf16(r[k0 + 2 * j + 1]))
                                                            << 16;
        continue;
      }
      std::fill_n(d, 16, 0u);
      for (int64_t k = 0; k < n; ++k) d[k / 2] |= uint32_t(f32_to_bf16(r[k0 + k])) << (k % 2 * 16);
    }
  }
  return buf.data();
}

}  // namespace

void linear(const float* x, int64_t M, const Weight& W, const float* bias, float* y,
            ThreadPool& pool, int64_t ldx, int64_t ldy) {
  if (ldx < 0) ldx = W.cols;
  if (ldy < 0) ldy = W.rows;
  if (M <= 0 || W.rows <= 0) return;
  std::shared_ptr<const PackedWeight> once;
  const PackedWeight* P = W.packed.get();
  if (!P) {
    once = pack(W, WeightFormat::Native, "weight", pool);
    P = once.get();
  }
  FLASHMAP_ASSERT(P->rows == W.rows && P->cols == W.cols);
  const kernel::Format format = P->q8                     ? kernel::kQ8
                                : P->q4                   ? kernel::kQ4
                                : P->q4k                  ? kernel::kQ4K
                                : P->q5k                  ? kernel::kQ5K
                                : P->q6k                  ? kernel::kQ6K
                                : P->bf16_dot             ? kernel::kBF16Dot
                                : P->dtype == DType::BF16 ? kernel::kBF16
                                : P->dtype == DType::F16  ? kernel::kF16
                                                          : kernel::kF32;
  kernel::Args a{x, M,   ldx,     P->data.get(), P->panel_bytes, P->rows, P->cols, format,  bias,
                 y, ldy, nullptr, nullptr,       nullptr,        nullptr, false,   nullptr, 0};
  a.l2_bytes = l2_bytes();
  Kernel fn = active_kernel(a.vnni);
  if (P->integer()) {
    // The tiles that multiply in fp32 (the generic kernel's, AVX-512's without VNNI) read qxf.
    const bool fp32_tiles = fn == kernel::gemm_generic || (fn == kernel::gemm_avx512 && !a.vnni);
    const QuantizedRows& xq = QuantizedRows::of_thread(x, M, W.cols, ldx, fp32_tiles, pool);
    a.qx = xq.q.data();
    a.qxf = fp32_tiles ? xq.qf.data() : nullptr;
    a.dx = xq.d.data();
    a.sx = xq.sum.data();
    a.sx16 = xq.half_sum.data();
  }
  if (P->bf16_dot) {
    // A weight packed for the mode on a CPU that has it, then run with the cap lowered (tests).
    FLASHMAP_CHECK(has_bf16_compute(),
                   "a bf16-compute weight needs the avx512-bf16 kernel, but {} is active",
                   isa_name(active_isa()));
    a.vnni = false;
    if (active_isa() == Isa::Amx) {
      a.xp = bf16_tiles(x, M, W.cols, ldx);
      fn = kernel::gemm_amx_bf16;
    } else {
      a.ldp = (W.cols + 1) / 2;
      a.xp = bf16_pairs(x, M, W.cols, ldx);
      fn = kernel::gemm_avx512bf16;
    }
  }
  // Threads split the panels in whole one-row tiles; products under ~64k multiply-adds (a few
  // microseconds) stay on the calling thread, where waking the pool would cost as much.
  const bool tiny = M * W.rows * W.cols < (int64_t(1) << 16);
  const int64_t grain = tiny ? P->panels : kernel::kPanelsPerUnit;
  pool.parallel_for(P->panels, grain, [&](int64_t p0, int64_t p1) { fn(a, p0, p1); });
}

namespace {

// Rows of E a thread packs at a time in matmul_rows: its columns of them (1 MiB of fp32 at
// 2,048 columns) stay in L2 while every row block of x reads them.
constexpr int64_t kTableSlice = 128;

// y[:, columns of panels [p0, p1)] = x · E[:, those columns], row(v, c0) giving E's row v from
// column c0 on (dtype d): slices of kTableSlice rows are copied into the GEMM kernel's panel
// layout (the columns past H zero) and multiplied as a linear layer's K slices are, each
// continuing the sums the last one left in y.
template <class Row>
void table_product(Kernel fn, const float* x, int64_t M, int64_t V, DType d, const Row& row,
                   int64_t H, float* y, int64_t p0, int64_t p1) {
  const int64_t es = int64_t(dtype_size(d)), c0 = p0 * kPanel,
                width = std::min(H, p1 * kPanel) - c0, full = width / kPanel;
  // 64 bytes more than the slice, so that the rows written together are not a power of two of
  // bytes apart (they would share a few L1 sets).
  const int64_t panel_bytes = kTableSlice * kPanel * es + 64;
  thread_local std::vector<uint8_t> buf;
  buf.resize(size_t(panel_bytes * (p1 - p0)));
  kernel::Args a{};
  a.M = M;
  a.ldx = V;
  a.panels = buf.data();
  a.panel_bytes = panel_bytes;
  a.N = width;
  a.format = d == DType::BF16 ? kernel::kBF16 : d == DType::F16 ? kernel::kF16 : kernel::kF32;
  a.y = y + c0;
  a.ldy = H;
  for (int64_t v0 = 0; v0 < V; v0 += kTableSlice) {
    const int64_t n = std::min(kTableSlice, V - v0);
    for (int64_t v = 0; v < n; ++v) {
      const uint8_t* src = row(v0 + v, c0);
      uint8_t* dst = buf.data() + v * kPanel * es;
      for (int64_t p = 0; p < full; ++p) {
        if (es == 4)
          std::memcpy(dst + p * panel_bytes, src + p * kPanel * 4, kPanel * 4);
        else
          std::memcpy(dst + p * panel_bytes, src + p * kPanel * 2, kPanel * 2);
      }
      if (const int64_t cols = width - full * kPanel) {
        std::memcpy(dst + full * panel_bytes, src + full * kPanel * es, size_t(cols * es));
        std::memset(dst + full * panel_bytes + cols * es, 0, size_t((kPanel - cols) * es));
      }
    }
    a.x = x + v0;
    a.K = n;
    a.accumulate = v0 > 0;
    fn(a, 0, p1 - p0);
  }
}

}  // namespace

void matmul_rows(const float* x, int64_t M, const Weight& E, float* y, ThreadPool& pool) {
  FLASHMAP_CHECK(is_float(E.dtype), "matmul_rows on an integer table");
  const int64_t V = E.rows, H = E.cols, panels = (H + kPanel - 1) / kPanel;
  if (M <= 0 || H <= 0) return;
  if (V <= 0) {
    std::fill_n(y, M * H, 0.0f);
    return;
  }
  bool vnni = false;  // the float tiles take no integer dots
  const Kernel fn = active_kernel(vnni);
  // A part per thread: each streams its columns of every row in one run.
  const int64_t grain = (panels + pool.size() - 1) / pool.size();
  if (const BlockRows* b = E.blocks.get()) {
    // Each thread decodes the blocks that hold its columns, row by row (the fp32 values the
    // decoded matrix holds).
    pool.parallel_for(panels, grain, [&](int64_t p0, int64_t p1) {
      const int64_t lo = p0 * kPanel / b->block * b->block;
      const int64_t hi =
          std::min(H, (std::min(H, p1 * kPanel) + b->block - 1) / b->block * b->block);
      thread_local std::vector<float> dec;
      dec.resize(size_t(hi - lo));
      const auto row = [&](int64_t v, int64_t c0) {
        b->decode(b->bytes.data() + v * b->row_bytes, lo, hi - lo, dec.data());
        return reinterpret_cast<const uint8_t*>(dec.data() + (c0 - lo));
      };
      table_product(fn, x, M, V, DType::F32, row, H, y, p0, p1);
    });
    return;
  }
  const auto* e = static_cast<const uint8_t*>(E.data);
  const int64_t es = int64_t(dtype_size(E.dtype)), row_bytes = H * es;
  pool.parallel_for(panels, grain, [&](int64_t p0, int64_t p1) {
    const auto row = [&](int64_t v, int64_t c0) { return e + v * row_bytes + c0 * es; };
    table_product(fn, x, M, V, E.dtype, row, H, y, p0, p1);
  });
}

namespace {
// Words of the embedding product's scratch: half a core's L2, within [128 KiB, 1 MiB]. Larger
// chunks of the table carry the sums from chunk to chunk less often: at Qwen3-8B's table on 2
// cores of a Xeon with 2 MiB of L2 (bench_ops, AMX) 256 KiB took 129–136 ms, 512 KiB 93–102 ms,
// 1 MiB 73–85 ms, the table's layout alone 62 ms.
int64_t strip_words() {
  return std::clamp<int64_t>(l2_bytes() / 2, 128 << 10, 1 << 20) / 4;
}
// The calling thread's scratch for the embedding product's strips, 64-byte aligned.
uint32_t* strip_scratch() {
  thread_local std::vector<uint32_t> buf(size_t(strip_words() + 16));
  const auto at = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + (64 - at % 64) % 64 / 4;
}
}  // namespace

void matmul_rows_bf16(const float* x, int64_t M, const Weight& E, float* y, ThreadPool& pool) {
  FLASHMAP_CHECK(has_bf16_compute(),
                 "the bf16 compute mode's embedding product needs the avx512-bf16 kernel, but {} "
                 "is active",
                 isa_name(active_isa()));
  FLASHMAP_CHECK(is_float(E.dtype), "matmul_rows on an integer table");
  if (M <= 0) return;
  const int64_t V = E.rows, H = E.cols;
  const kernel::Format f = E.dtype == DType::BF16  ? kernel::kBF16
                           : E.dtype == DType::F16 ? kernel::kF16
                                                   : kernel::kF32;
  const uint32_t* xp = bf16_pairs(x, M, V, V);  // this thread's buffer, read by the pool's
  const kernel::StripProduct product =
      active_isa() == Isa::Amx ? kernel::strip_product_amx : nullptr;
  if (E.blocks) {
    // The sums continued from y chunk by chunk (whole pairs of rows): the same operations as
    // over the decoded matrix.
    for_decoded_rows(E, pool, [&](int64_t v_lo, int64_t n, const float* rows) {
      pool.parallel_for(H, 64, [&](int64_t h0, int64_t h1) {
        kernel::matmul_rows_avx512bf16(xp + v_lo / 2, (V + 1) / 2, M, rows, kernel::kF32, n, H, y,
                                       h0, h1, strip_scratch(), strip_words(), v_lo > 0, product);
      });
    });
    return;
  }
  // A part per thread, in whole strips: each reads its columns of every row of E in one run.
  const int64_t grain = ((H + pool.size() - 1) / pool.size() + kPanel - 1) / kPanel * kPanel;
  pool.parallel_for(H, grain, [&](int64_t h0, int64_t h1) {
    kernel::matmul_rows_avx512bf16(xp, (V + 1) / 2, M, E.data, f, V, H, y, h0, h1, strip_scratch(),
                                   strip_words(), false, product);
  });
}

}  // namespace flashmap::ops
