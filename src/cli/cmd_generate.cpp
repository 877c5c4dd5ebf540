// `flashmap generate`: speculative (or target-alone) decoding of one prompt.
#include <flashmap/engine.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/text_io.h"
#include "core/check.h"

namespace flashmap::cli {
namespace {

struct GenerateArgs {
  ModelOptions model;
  SamplingOptions sampling;
  PromptOptions prompt;
  int max_new_tokens = 64;
  std::string stop_ids;
  bool json = false;
};

void run_generate(GenerateArgs& a) {
  a.model.resolve();
  FLASHMAP_CHECK(a.max_new_tokens > 0, "--max-new-tokens must be > 0, got {}", a.max_new_tokens);
  // A machine without the device (or a binary without its backend) fails here, before loading.
  check_device(a.model.engine_options(0));

  auto text = open_text(a.model.tokenizer);
  EngineOptions eo = a.model.engine_options(text ? text->vocab_size() : 0);
  eo.spec_policy = SpecPolicyKind::Always;  // one sequence: every round drafts
  Engine engine(eo);
  // What the flags leave out comes from the target's generation_config.json (as in serve and
  // Python); the engine checks the request.
  RequestParams p = engine.defaults().request();
  p.max_tokens = a.max_new_tokens;
  p.sampling = a.sampling.params(p.sampling);
  p.seed = a.sampling.resolved_seed();
  p.seeded = a.sampling.seed >= 0;
  p.prompt = a.prompt.ids_of(text.get());
  if (a.stop_ids == "none") {
    p.stop_ids.clear();
  } else if (!a.stop_ids.empty()) {
    p.stop_ids = parse_ids(a.stop_ids, "--stop-ids");
  }
  // Without --json, text (or ids) is streamed as each round is accepted.
  std::unique_ptr<TextStream> stream;
  std::function<void(std::span<const int32_t>)> on_tokens;
  if (!a.json) {
    stream = std::make_unique<TextStream>(text.get());
    on_tokens = [&](std::span<const int32_t> ids) { stream->write(ids); };
  }
  const GenerateResult r = engine.generate(p, on_tokens);
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
  j["prompt_ids"] = p.prompt;
  if (text) j["text"] = text->decode_shown(r.ids);
  j["acceptance_lengths"] = r.acceptance_lengths;
  j["acceptance_length"] = r.acceptance_length();
  j["accepted_at"] = r.accepted_at;
  j["rounds"] = r.rounds;
  j["finish_reason"] = r.finish_reason;
  j["seed"] = p.seed;
  j["device"] = engine.device();
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
  sub->callback([args] { run_generate(*args); });
}

}  // namespace

FLASHMAP_COMMAND(register_cmd);

}  // namespace flashmap::cli
