// The device factory: the one file of the engine that knows which backends this build has
// (cpu/, and cuda/ when built with it), and the checks of the options that pick one.
#include "engine/factory.h"

#include "core/check.h"
#include "core/thread_pool.h"
#include "cpu/backend.h"
#include "ops/gemm.h"
#ifdef FLASHMAP_WITH_CUDA
#include "cuda/backend.h"
#include "cuda/device.h"
#endif

namespace flashmap {

using engine::Backend;

namespace {

bool is_cuda(const std::string& device) {
  return device == "cuda" || device.starts_with("cuda:");
}

NgramOptions ngram_options(const EngineOptions& o) {
  const NgramOptions n{o.ngram_min, o.ngram_max, o.ngram_block};
  const NgramOptions d;
  if (o.hybrid_ngram != 0) {
    FLASHMAP_CHECK(o.hybrid_ngram >= 1 && o.hybrid_ngram <= NgramOptions::kMaxN,
                   "--hybrid-ngram {}: must be in [1, {}] (0: off)", o.hybrid_ngram,
                   NgramOptions::kMaxN);
    FLASHMAP_CHECK(!o.draft.empty() && o.draft != cpu::kNgramDrafter,
                   "--hybrid-ngram needs a FlashMap or DFlash drafter (--draft DIR)");
    // The shortest match is --hybrid-ngram and the block is the drafter's.
    FLASHMAP_CHECK(n.min_n == d.min_n,
                   "--ngram-min does not apply to --hybrid-ngram (it is the "
                   "shortest match)");
    FLASHMAP_CHECK(n.block == d.block,
                   "--ngram-block does not apply to --hybrid-ngram (the "
                   "block is the drafter's)");
    FLASHMAP_CHECK(n.max_n >= 1 && n.max_n <= NgramOptions::kMaxN,
                   "--ngram-max {}: must be in [1, {}]", n.max_n, NgramOptions::kMaxN);
    return n;
  }
  if (o.draft != cpu::kNgramDrafter) {
    // Options of a drafter that is not asked for would be ignored without a word.
    FLASHMAP_CHECK(n.min_n == d.min_n, "--ngram-min needs --draft ngram");
    FLASHMAP_CHECK(n.max_n == d.max_n, "--ngram-max needs --draft ngram or --hybrid-ngram");
    FLASHMAP_CHECK(n.block == d.block, "--ngram-block needs --draft ngram");
  }
  n.validate();
  return n;
}

// Before any model loads: the window needs a trained drafter, whose cross-attention it narrows.
void check_draft_window(const EngineOptions& o) {
  if (o.draft_window == 0) return;
  FLASHMAP_CHECK(o.draft_window >= 1 && o.draft_window <= cpu::kMaxDraftWindow,
                 "--draft-window {}: must be in [1, {}] (0: off)", o.draft_window,
                 cpu::kMaxDraftWindow);
  FLASHMAP_CHECK(!o.draft.empty() && o.draft != cpu::kNgramDrafter,
                 "--draft-window needs a FlashMap or DFlash drafter (--draft DIR)");
  FLASHMAP_CHECK(!is_cuda(o.device),
                 "--draft-window runs on the CPU backend only, not on {} (use --device cpu)",
                 o.device);
}

}  // namespace

std::unique_ptr<Backend> engine::make_backend(const EngineOptions& o) {
  check_device(o);
  const NgramOptions ngram = ngram_options(o);
  const ops::WeightFormat weights = ops::weight_format(o.weights, o.compute);
  const std::string target = target_folder(o.target);
  if (o.device == "cpu")
    return cpu::CpuBackend::load(target, o.draft, o.steps, o.sampled_vocab, weights, ngram,
                                 o.hybrid_ngram, o.draft_window);
  FLASHMAP_CHECK(weights == ops::WeightFormat::Native,
                 "--weights {}: the CUDA backend runs bf16 weights only (q8 and q4 are CPU formats)",
                 o.weights);
#ifdef FLASHMAP_WITH_CUDA
  return cuda::make_backend(o.device, target, o.draft, o.steps, o.sampled_vocab, o.max_context,
                            o.max_running);
#else
  throw Error("unreachable: check_device accepted a device this build lacks");
#endif
}

int set_cpu_threads(int threads) {
  return ThreadPool::configure_global(threads);
}

int cpu_threads() {
  return ThreadPool::global().size();
}

void check_device(const std::string& device) {
  if (device == "cpu") return;
  FLASHMAP_CHECK(is_cuda(device), "--device: expected cpu, cuda or cuda:N, got '{}'", device);
#ifdef FLASHMAP_WITH_CUDA
  cuda::Context probe(device);  // throws naming why no GPU is usable
#else
  throw Error(
      fmt::format("--device {}: this flashmap binary was built without CUDA (configure "
                  "with -DFLASHMAP_CUDA=ON on a machine with the CUDA toolkit)",
                  device));
#endif
}

void check_device(const EngineOptions& o) {
  (void)ngram_options(o);
  // Before the device itself, so that the answer is the same whether or not a GPU is there.
  FLASHMAP_CHECK(o.draft != cpu::kNgramDrafter || !is_cuda(o.device),
                 "--draft ngram runs on the CPU backend only, not on {} (use --device cpu)",
                 o.device);
  FLASHMAP_CHECK(o.hybrid_ngram == 0 || !is_cuda(o.device),
                 "--hybrid-ngram runs on the CPU backend only, not on {} (use --device cpu)",
                 o.device);
  check_draft_window(o);
  FLASHMAP_CHECK(!is_cuda(o.device) || o.compute == "fp32" || o.compute.empty(),
                 "--compute {}: a CPU option (the CUDA backend multiplies bf16 weights on its "
                 "tensor cores whatever it is)",
                 o.compute);
  check_device(o.device);
}

}  // namespace flashmap
