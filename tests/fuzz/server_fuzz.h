// The request harnesses' server side: the default pair's target (2048 ids) in an Engine, its
// tokenizer with the official Qwen3 chat template (tools, reasoning), and the ParamsBuilder the
// server turns parsed requests into engine parameters with. Nothing is generated: the engine
// validates each request's parameters (Engine::validate, what submit checks), and structured
// output is compiled and walked for a few tokens.
#pragma once

#include <flashmap/engine.h>
#include <flashmap/text.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "fuzz_common.h"
#include "server/api.h"
#include "server/params.h"
#include "server/server.h"
#include "text/jinja_value.h"

namespace flashmap::fuzz {

struct ServerSide {
  Engine engine;
  TextCodec text;
  server::ServerOptions options;
  server::ParamsBuilder params;

  ServerSide()
      : engine(
            EngineOptions{.target = source_dir() + "/models/default/target", .max_context = 512}),
        text(TextCodec::from_dir(tokenizer_dir())),
        params(engine, &text, with_defaults(options)) {}

  static server::ServerOptions& with_defaults(server::ServerOptions& o) {
    o.model_name = "m";
    return o;
  }

  // The default pair's tokenizer.json beside the Qwen3 template's tokenizer_config.json.
  static std::string tokenizer_dir() {
    const auto dir = scratch_dir() / "tokenizer";
    std::filesystem::create_directories(dir);
    const auto copy = std::filesystem::copy_options::overwrite_existing;
    std::filesystem::copy_file(source_dir() + "/models/default/target/tokenizer.json",
                               dir / "tokenizer.json", copy);
    std::filesystem::copy_file(source_dir() + "/tests/data/chat/qwen3/tokenizer_config.json",
                               dir / "tokenizer_config.json", copy);
    return dir.string();
  }

  // The parsed request through to the engine's parameters, as Server::Impl::start does it.
  void build_and_check(const server::GenerationRequest& g, Picker& pick) {
    server::ParamsBuilder::Built built;
    if (!expect_clean("ParamsBuilder::build", [&] { built = params.build(g); })) return;
    const RequestParams& p = built.params;
    if (!expect_clean("Engine::validate", [&] { engine.validate(p); })) return;
    for (const auto& [id, bias] : p.controls.logit_bias)
      FUZZ_REQUIRE(id >= 0 && id < engine.target_info().vocab_size, "logit_bias id {} passed", id);
    if (!p.controls.constraint) return;
    // A few tokens through the constraint: masks, advances and a rollback.
    auto c = p.controls.constraint();
    const size_t vocab = size_t(engine.target_info().vocab_size);
    std::vector<uint32_t> mask((vocab + 31) / 32);
    for (int step = 0; step < 8; ++step) {
      std::fill(mask.begin(), mask.end(), 0u);
      c->fill_mask(mask);
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < vocab; ++id)
        if (mask[id / 32] >> (id % 32) & 1) allowed.push_back(int32_t(id));
      if (allowed.empty()) break;
      const int32_t t = allowed[pick.next() % allowed.size()];
      FUZZ_REQUIRE(c->advance(t), "the constraint refused token {}, which its mask allowed", t);
    }
    if (c->checkpoint() > 0) c->rollback(c->checkpoint() - 1);
    (void)c->can_end();
  }
};

inline ServerSide& server_side() {
  static ServerSide* s = new ServerSide;  // kept until exit: the engine's threads may run
  return *s;
}

}  // namespace flashmap::fuzz
