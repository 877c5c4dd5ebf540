// Weights packed for the CPU GEMM micro-kernel, and the instruction sets it runs on.
//
// A linear layer's weight W [N, K] (nn.Linear's [out, in]) is repacked at load into panels of
// 32 output columns stored k-major: panel p holds, for k = 0 … K−1, the 32 values
// W[32p … 32p+31, k] side by side. The kernel broadcasts one x[m, k] and multiplies it into
// the panel's row k, so every output accumulates acc = fma(x[m, k], w[k], acc) over k in order
// (then adds the bias): one fixed sequence of operations per output whatever M, the thread
// count, the row blocking or the vector width (AVX-512, AVX2 and scalar code give the same bits).
// That keeps the target batch-invariant: a 17-row verify pass gives the logits of 17 decode steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/dtype.h"

namespace flashmap {

struct Weight;
class ThreadPool;

namespace ops {

constexpr int kPanel = 32;    // output columns per panel
constexpr int kQ8Block = 32;  // k values per int8 or int4 scale (ggml's Q8_0 and Q4_0)

// How linear weights are held: in their file dtype (fp32, bf16 or f16, widened to fp32 in the
// kernel), or as int8 with one fp16 scale per 32 consecutive k of each output column (ggml's
// Q8_0 block, quantized by its rule). A q8 product is Q8_0 × Q8_0 as llama.cpp forms it: the
// rows of x are quantized the same way, each block's integer dot product is scaled by both
// scales and summed over the blocks in order; the engine is lossless with respect to that model.
// Bf16: the bf16 compute mode (--compute bf16): weights rounded to bf16 (to nearest even) and
// paired along k for AVX512-BF16 dot products, each row of activations rounded to bf16 before a
// product, sums in fp32 — twice the arithmetic rate of the fp32 FMA, a different model from the
// fp32 reference (llama.cpp's bf16 path rounds the same way); the engine is lossless with respect
// to it. Only on CPUs with AVX512-BF16 (has_bf16_compute()).
// Q4: 4-bit weights as ggml's Q4_0 (q in 0…15, weight (q − 8) · d, one fp16 d per 32 k of a
// column, quantized by its rule), multiplied with rows of x quantized as for q8: llama.cpp's
// Q4_0 × Q8_0 product. Half the bytes of q8 for what a step streams; a different model again.
// Unpacked: left as mapped, for a model whose weights are only read from (the CUDA upload).
enum class WeightFormat { Native, Q8, Q4, Bf16, Unpacked };
WeightFormat parse_weight_format(const std::string& s);  // "native" | "q8" | "q4"
const char* weight_format_name(WeightFormat f);
// Whether `f` holds integer weights (q8, q4), whose products quantize the rows of x.
constexpr bool is_integer(WeightFormat f) {
  return f == WeightFormat::Q8 || f == WeightFormat::Q4;
}
// The format of --weights W with --compute C ("fp32" or "bf16"); a one-line error naming the
// option for an unknown value, a combination that does not exist (q8 with bf16) or bf16 on a CPU
// without AVX512-BF16.
WeightFormat weight_format(const std::string& weights, const std::string& compute);

// A packed matrix: dtype F32, BF16 or F16 as the file's. q8: the panel is K/32 blocks, each
// [8 groups of 4 k][32 columns][4 k] bytes q + 128 (VNNI's operand order), then the 32 columns'
// fp16 scales. bf16_dot (dtype BF16): the panel is ceil(K/2) pairs of k, each the 32 columns'
// (w[n, 2kp], w[n, 2kp + 1]) side by side (vdpbf16ps's operand order; 0 past K). q4: the panel
// is K/32 blocks, each [4 pairs of groups of 4 k][32 columns][4 k] bytes holding q of group 2h in
// the low nibble and of group 2h + 1 in the high one (a shift and a mask give q8's group layout),
// then the 32 columns' fp16 scales. q4k (ggml's Q4_K, held exactly as a GGUF file holds it: see
// pack_q4k): the panel is K/256 super-blocks, each a head (per pair of blocks [32 columns]
// [sc, m, sc, m] bytes, then the 32 columns' fp16 d and their fp16 −dmin) and 8 blocks of q4's
// nibble layout (q itself, 0…15). q6k (ggml's Q6_K, held exactly: see pack_q6k): the panel is
// K/256 super-blocks, each a head (the 16 int8 scales of each column, + 128, then the 32 columns'
// fp16 d) and 8 blocks, each q4's nibbles of the low 4 bits of q (0…63) and their high 2 bits.
// q5k (ggml's Q5_K, held exactly: see pack_q5k): q4k's, each block followed by the fifth bits of
// its q (0…31).
struct PackedWeight {
  DType dtype = DType::F32;
  bool q8 = false;
  bool q4 = false;
  bool q4k = false;
  bool q5k = false;
  bool q6k = false;
  bool bf16_dot = false;
  int64_t rows = 0, cols = 0;  // N, K
  int64_t panels = 0;          // ceil(N / 32); the last one zero-padded
  int64_t panel_bytes = 0;
  std::unique_ptr<uint8_t, void (*)(void*)> data{nullptr, nullptr};

  const uint8_t* panel(int64_t p) const { return data.get() + p * panel_bytes; }
  // Products with integer weights (q8, q4) quantize the rows of x first.
  bool integer() const { return q8 || q4 || q4k || q5k || q6k; }
  int64_t bytes() const { return panels * panel_bytes; }
  // Whether `o` is held in the same format with the same input size (stack_rows can join them).
  bool same_layout(const PackedWeight& o) const {
    return dtype == o.dtype && q8 == o.q8 && q4 == o.q4 && q4k == o.q4k && q5k == o.q5k &&
           q6k == o.q6k && bf16_dot == o.bf16_dot && cols == o.cols && panel_bytes == o.panel_bytes;
  }
};

// Packs W (any float dtype) as `format`, on `pool`. `what` names the tensor in errors (a q8 or
// q4 weight needs K divisible by 32).
std::shared_ptr<const PackedWeight> pack(const Weight& W, WeightFormat format,
                                         const std::string& what, ThreadPool& pool);

// One super-block of ggml's Q4_K or Q5_K (256 k of one output row), unpacked: weight k is
// d · sc[k / 32] · q[k] − dmin · m[k / 32] with d, dmin fp16 (their bits), sc, m 6-bit, q 4-bit
// (Q5_K: 5-bit).
struct Q4KBlock {
  uint16_t d = 0, dmin = 0;
  uint8_t sc[8] = {}, m[8] = {};
  uint8_t q[256] = {};
};
constexpr int kQ4KBlock = 256;  // k per Q4_K super-block
// Packs the [rows, cols] matrix whose super-block s (k from 256 s) of row n `block(n, s, out)`
// gives, as q4k: every weight exactly as ggml's dequantization gives it, at 4.625 bits per
// weight, multiplied with rows of x quantized as for q8. cols must be a multiple of 256; d and
// dmin must be finite (`what` names the tensor in errors).
std::shared_ptr<const PackedWeight> pack_q4k(
    int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t, Q4KBlock&)>& block,
    const std::string& what, ThreadPool& pool);

// As pack_q4k, for Q5_K blocks (q 5-bit), at 5.625 bits per weight.
std::shared_ptr<const PackedWeight> pack_q5k(
    int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t, Q4KBlock&)>& block,
    const std::string& what, ThreadPool& pool);

// One super-block of ggml's Q6_K, unpacked: weight k is d · sc[k / 16] · (q[k] − 32) with d fp16
// (its bits), sc int8, q 6-bit.
struct Q6KBlock {
  uint16_t d = 0;
  int8_t sc[16] = {};
  uint8_t q[256] = {};
};
// As pack_q4k, for Q6_K blocks: every weight d · sc · (q − 32) exactly (ggml's dequantization
// rounds it to fp32), at 6.5625 bits per weight; d must be finite.
std::shared_ptr<const PackedWeight> pack_q6k(
    int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t, Q6KBlock&)>& block,
    const std::string& what, ThreadPool& pool);

// Matrices packed alike (same format and input size), stacked along their output rows: one
// product instead of several over the same input (a layer's q, k and v; its gate and up). Every
// part but the last fills its panels (rows a multiple of kPanel). Each output is computed as in
// its own matrix, bit for bit.
std::shared_ptr<const PackedWeight> stack_rows(std::span<const PackedWeight* const> parts,
                                               ThreadPool& pool);

// The instruction sets the kernel is compiled for; the best one the CPU has is picked at run
// time (FLASHMAP_ISA=generic|avx2|avx2-vnni|avx512|avx512-vnni|avx512-bf16|amx caps it), so a
// binary built for x86-64-v3 runs on a CPU without AVX-512 and one built with AVX-512 kernels
// never executes them where they would SIGILL. Avx2Vnni is AVX2 with AVX-VNNI's int8 dot
// products for q8 and q4 (VEX-encoded; Intel since Alder Lake, AMD since Zen 5); a CPU with
// AVX-512 need not have it, so a cap there lands on Avx2 where it is missing. Avx512Bf16
// (AVX512-BF16 on top of VNNI) runs the fp32 formats as Avx512Vnni does and adds the bf16
// compute mode's kernel. Amx (AMX-BF16 tiles, where the OS grants them, on top of Avx512Bf16)
// runs the bf16 compute mode's products on tiles (its sums in another order: other bits than
// Avx512Bf16's, the same for every batch) and everything else as Avx512Bf16.
enum class Isa { Generic, Avx2, Avx2Vnni, Avx512, Avx512Vnni, Avx512Bf16, Amx };
const char* isa_name(Isa isa);
Isa best_isa();               // what this CPU supports (and was compiled in)
bool isa_supported(Isa isa);  // whether this CPU can run `isa`'s kernels
Isa active_isa();             // what linear() uses now
void set_isa(Isa isa);        // tests: run every kernel variant; capped at what the CPU has
// Whether the bf16 compute mode can run here (active_isa() is Avx512Bf16 or Amx).
bool has_bf16_compute();

}  // namespace ops
}  // namespace flashmap
