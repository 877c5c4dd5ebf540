// Chat-template rendering cost: what a server pays per request before tokenizing the prompt.
// Renders committed requests with the two Qwen3 templates (tests/data/chat), single thread.
//
//   build/bench/bench_chat [--benchmark_filter=Render]
#include <benchmark/benchmark.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "flashmap/chat.h"

namespace {

const std::string kData = std::string(FLASHMAP_SOURCE_DIR) + "/tests/data/chat";

nlohmann::ordered_json request(const std::string& name) {
  std::ifstream in(kData + "/requests/" + name + ".json");
  if (!in) throw std::runtime_error("cannot open request " + name);
  return nlohmann::ordered_json::parse(in);
}

const flashmap::ChatTemplate& chat(const std::string& variant) {
  static std::map<std::string, flashmap::ChatTemplate> cache;
  auto it = cache.find(variant);
  if (it == cache.end())
    it = cache.emplace(variant, flashmap::ChatTemplate::from_dir(kData + "/" + variant)).first;
  return it->second;
}

// args: template variant, request name.
void render(benchmark::State& state, const std::string& variant, const std::string& name) {
  const flashmap::ChatTemplate& c = chat(variant);
  const nlohmann::ordered_json req = request(name);
  size_t bytes = 0;
  for (auto _ : state) {
    std::string prompt = c.render(req);
    bytes += prompt.size();
    benchmark::DoNotOptimize(prompt);
  }
  state.SetBytesProcessed(int64_t(bytes));
  state.counters["messages"] = double(req["messages"].size());
}

// A six-message conversation with a system prompt, two tool definitions, two tool calls and
// their results: the typical agentic request.
void BM_RenderToolConversation_Qwen3Official(benchmark::State& s) {
  render(s, "qwen3-official", "tool_calls_dict_arguments");
}
void BM_RenderToolConversation_Qwen3(benchmark::State& s) {
  render(s, "qwen3", "tool_calls_dict_arguments");
}
// Plain multi-turn chat: system + three user turns.
void BM_RenderMultiTurn_Qwen3Official(benchmark::State& s) {
  render(s, "qwen3-official", "multi_turn");
}
void BM_RenderReasoningHistory_Qwen3Official(benchmark::State& s) {
  render(s, "qwen3-official", "reasoning_content_history");
}
BENCHMARK(BM_RenderToolConversation_Qwen3Official);
BENCHMARK(BM_RenderToolConversation_Qwen3);
BENCHMARK(BM_RenderMultiTurn_Qwen3Official);
BENCHMARK(BM_RenderReasoningHistory_Qwen3Official);

// Loading parses the template once; shown for scale against a render.
void BM_LoadAndParse_Qwen3Official(benchmark::State& state) {
  for (auto _ : state) {
    auto c = flashmap::ChatTemplate::from_dir(kData + "/qwen3-official");
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK(BM_LoadAndParse_Qwen3Official);

}  // namespace

BENCHMARK_MAIN();
