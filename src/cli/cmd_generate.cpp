// `flashmap generate`: speculative (or target-alone) decoding of one prompt.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/text_io.h"
#include "core/check.h"
#include "io/hf_config.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "spec/decoder.h"

#ifdef FLASHMAP_WITH_CUDA
#include "cuda/decoder_cuda.h"
#include "cuda/device.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/qwen3_cuda.h"
#endif

namespace flashmap::cli {
namespace {

struct GenerateArgs {
  ModelOptions model;
  SamplingOptions sampling;
  PromptOptions prompt;
  int max_new_tokens = 64;
  std::string stop_ids;
  bool json = false;
  std::string device = "cpu";  // cpu, cuda or cuda:N
};

#ifdef FLASHMAP_WITH_CUDA
using DeviceContext = cuda::Context;
#else
struct DeviceContext {};  // never made: --device cuda fails first
#endif

// Checks --device and, for cuda[:N], opens the GPU before any model is loaded, so that a machine
// without one (or a binary without the CUDA backend) fails at once with a clear error. Null for
// cpu.
std::unique_ptr<DeviceContext> open_device(const std::string& device) {
  if (device == "cpu") return nullptr;
  FLASHMAP_CHECK(device == "cuda" || device.starts_with("cuda:"),
                 "--device: expected cpu, cuda or cuda:N, got '{}'", device);
#ifdef FLASHMAP_WITH_CUDA
  return std::make_unique<cuda::Context>(device);  // throws naming why no GPU is usable
#else
  throw Error(
      fmt::format("--device {}: this flashmap binary was built without CUDA (configure "
                  "with -DFLASHMAP_CUDA=ON on a machine with the CUDA toolkit)",
                  device));
#endif
}

#ifdef FLASHMAP_WITH_CUDA
// generate() on the GPU: the models loaded on the host are uploaded once (bf16 weights), the KV
// cache sized for this request's longest verify pass.
GenerateResult generate_on_device(cuda::Context& ctx, const Models& models, int steps,
                                  std::span<const int32_t> prompt, const GenerateOptions& opt) {
  const Qwen3Model& cpu_target = *models.target;
  const Qwen3Config& tc = cpu_target.config();
  const int K = models.drafter ? models.drafter->block_size() : 0;
  // Clamped by Qwen3Device to max_position_embeddings; DeviceDecoder::validate says when a
  // request does not fit.
  const int64_t positions = std::max<int64_t>(int64_t(prompt.size()) + opt.max_new_tokens + K, 1);
  cuda::Qwen3Device target(ctx, cpu_target, positions);
  std::unique_ptr<cuda::FlashMapDevice> fm;
  std::unique_ptr<cuda::FlashMapDeviceDrafter> drafter;
  if (models.draft_model) {
    fm = std::make_unique<cuda::FlashMapDevice>(ctx, *models.draft_model, target.embedding(),
                                                target.lm_head(), tc.vocab_size, tc.hidden_size);
    drafter = std::make_unique<cuda::FlashMapDeviceDrafter>(*fm, steps);
  }
  cuda::DeviceDecoder decoder(target, drafter.get());
  return decoder.generate(prompt, opt);
}
#endif

void run_generate(GenerateArgs& a) {
  a.model.resolve();
  GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.sampling = a.sampling.params();
  opt.seed = a.sampling.resolved_seed();
  opt.seeded = a.sampling.seed >= 0;
  opt.sampling.validate();
  FLASHMAP_CHECK(a.max_new_tokens > 0, "--max-new-tokens must be > 0, got {}", a.max_new_tokens);
  const std::unique_ptr<DeviceContext> gpu = open_device(a.device);

  const Models models = load_models(a.model);
  const Qwen3Model& target = *models.target;
  const Drafter* drafter = models.drafter.get();

  auto text = TextIO::open(a.model.tokenizer);
  // Ids past the tokenizer's are the embedding's padding: never sampled.
  if (text) models.target->set_sampled_vocab(text->vocab_size());
  const std::vector<int32_t> prompt = a.prompt.ids_of(text.get());
  if (a.stop_ids.empty()) {
    // Stop on the generation config's eos ids, as spec_generate does by default.
    opt.stop_ids = GenerationConfig::from_dir(a.model.target).eos_token_ids;
  } else if (a.stop_ids != "none") {
    opt.stop_ids = parse_ids(a.stop_ids, "--stop-ids");
  }
  // Without --json, text (or ids) is streamed as each round is accepted.
  std::unique_ptr<TextStream> stream;
  if (!a.json) {
    stream = std::make_unique<TextStream>(text.get());
    opt.on_tokens = [&](std::span<const int32_t> ids) { stream->write(ids); };
  }
  GenerateResult r;
  if (!gpu) {
    r = generate(target, drafter, prompt, opt);
  } else {
#ifdef FLASHMAP_WITH_CUDA
    r = generate_on_device(*gpu, models, a.model.steps, prompt, opt);
#endif
  }
  if (stream) {
    stream->finish();
    std::cerr << fmt::format(
        "[{} tokens, {} rounds, acceptance length {:.2f}, {:.1f} tokens/s, finish: {}]\n",
        r.ids.size(), r.rounds, r.acceptance_length(),
        1000.0 * double(r.ids.size()) / std::max(r.times.total_ms, 1e-9), r.finish_reason);
    return;
  }
  nlohmann::json j;
  j["ids"] = r.ids;
  j["prompt_ids"] = prompt;
  if (text) j["text"] = text->decode(r.ids);
  j["acceptance_lengths"] = r.acceptance_lengths;
  j["acceptance_length"] = r.acceptance_length();
  j["accepted_at"] = r.accepted_at;
  j["rounds"] = r.rounds;
  j["finish_reason"] = r.finish_reason;
  j["seed"] = opt.seed;
  j["device"] = a.device;
  j["timings_ms"] = {{"prefill", r.times.prefill_ms},
                     {"draft", r.times.draft_ms},
                     {"verify", r.times.verify_ms},
                     {"accept", r.times.accept_ms},
                     {"total", r.times.total_ms}};
  j["tokens_per_second"] = 1000.0 * double(r.ids.size()) / std::max(r.times.total_ms, 1e-9);
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* sub =
      app.add_subcommand("generate", "Decode a prompt speculatively with a FlashMap drafter");
  add_model_options(*sub, args->model);
  add_prompt_options(*sub, args->prompt);
  add_sampling_options(*sub, args->sampling);
  sub->add_option("--max-new-tokens", args->max_new_tokens, "tokens to generate (default 64)");
  sub->add_option("--stop-ids", args->stop_ids,
                  "comma-separated stop token ids (default: the target's generation_config eos "
                  "ids; 'none' for none)")
      ->check(non_empty("give ids, or 'none' for no stop ids"));
  sub->add_flag("--json", args->json, "print one JSON object (ids, text, acceptance, timings)");
  sub->add_option("--device", args->device,
                  "cpu (default) or cuda[:N]: decode on that GPU (needs a build with the CUDA "
                  "backend)");
  sub->callback([args] { run_generate(*args); });
}

}  // namespace

FLASHMAP_COMMAND(register_cmd);

}  // namespace flashmap::cli
