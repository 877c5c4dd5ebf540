// Cost of constrained decoding with the Qwen3 vocabulary (151,936 ids), single thread: building the
// vocabulary trie, compiling grammars, one token mask (cold: a trie walk; warm: the per-state
// cache), advance, and a whole document decoded step by step (fill_mask + advance per token, fresh
// Matcher each time, as a request would). See docs/STRUCTURED_OUTPUT.md for figures.
//
//   build/bench/bench_constrain
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include "constrain/constrain.h"
#include "flashmap/tokenizer.h"

namespace {

using namespace flashmap::constrain;
using ojson = nlohmann::ordered_json;

const std::string kRoot = FLASHMAP_SOURCE_DIR;

const flashmap::Tokenizer& qwen() {
  static const auto t =
      flashmap::Tokenizer::from_file(kRoot + "/tests/data/qwen3-tokenizer/tokenizer.json");
  return t;
}
std::shared_ptr<const Vocabulary> vocab() {
  static const auto v = Vocabulary::from_tokenizer(qwen(), 151936);
  return v;
}

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":64},"age":{"type":"integer"},
  "email":{"type":"string","format":"uuid"},
  "tags":{"type":"array","items":{"type":"string","maxLength":16},"maxItems":8},
  "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
     "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","city"]},
  "kind":{"enum":["person","company","other"]},"score":{"type":["number","null"]}},
  "required":["name","age","kind"]})";
const char* kDoc = R"({"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"],
  "address": {"street": "12 St James's Square", "city": "London", "zip": "12345"},
  "kind": "person", "score": 9.75})";

void BM_VocabularyBuild(benchmark::State& state) {
  qwen();  // loaded outside the timing
  for (auto _ : state) benchmark::DoNotOptimize(Vocabulary::from_tokenizer(qwen(), 151936));
  state.counters["trie_nodes"] = double(vocab()->trie().byte.size());
  state.counters["tokens"] = double(vocab()->trie().ids.size());
}
BENCHMARK(BM_VocabularyBuild)->Unit(benchmark::kMillisecond);

void BM_CompileJsonObject(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(compile_json_object());
  state.counters["states"] = double(compile_json_object()->num_states());
}
BENCHMARK(BM_CompileJsonObject)->Unit(benchmark::kMillisecond);

void BM_CompileSchema(benchmark::State& state) {
  ojson schema = ojson::parse(kSchema);
  int i = 0;
  for (auto _ : state) {
    schema["$comment"] = i++;  // a new text each time: no cache hit
    benchmark::DoNotOptimize(compile_json_schema(schema));
  }
  state.counters["states"] = double(compile_json_schema(schema)->num_states());
}
BENCHMARK(BM_CompileSchema)->Unit(benchmark::kMillisecond);

// One mask in a fresh Matcher (cold cache) after `prefix`.
void fill_cold(benchmark::State& state, std::shared_ptr<const Grammar> g, const char* prefix) {
  std::vector<uint32_t> mask(vocab()->mask_words());
  for (auto _ : state) {
    Matcher m(g, vocab());
    m.advance_bytes(prefix);
    m.fill_mask(mask);
    benchmark::DoNotOptimize(mask.data());
  }
}
void BM_MaskColdObjectStart(benchmark::State& s) {
  fill_cold(s, compile_json_object(), "{");
}
void BM_MaskColdInString(benchmark::State& s) {
  fill_cold(s, compile_json_object(), "{\"a\": \"x");
}
void BM_MaskColdInNumber(benchmark::State& s) {
  fill_cold(s, compile_json_object(), "{\"a\": 1");
}
void BM_MaskColdSchemaKey(benchmark::State& s) {
  fill_cold(s, compile_json_schema(ojson::parse(kSchema)), "{\"name\": \"Ada\", ");
}
BENCHMARK(BM_MaskColdObjectStart)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskColdInString)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskColdInNumber)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskColdSchemaKey)->Unit(benchmark::kMillisecond);

void BM_MaskWarm(benchmark::State& state) {
  Matcher m(compile_json_object(), vocab());
  m.advance_bytes("{\"a\": \"x");
  std::vector<uint32_t> mask(vocab()->mask_words());
  for (auto _ : state) {
    m.fill_mask(mask);
    benchmark::DoNotOptimize(mask.data());
  }
}
BENCHMARK(BM_MaskWarm)->Unit(benchmark::kMicrosecond);

void BM_Advance(benchmark::State& state) {
  const auto ids = qwen().encode(kDoc);
  const auto g = compile_json_schema(ojson::parse(kSchema));
  for (auto _ : state) {
    Matcher m(g, vocab());
    for (int32_t id : ids) m.advance(id);
    benchmark::DoNotOptimize(m.can_end());
  }
  state.SetItemsProcessed(int64_t(state.iterations() * ids.size()));
}
BENCHMARK(BM_Advance)->Unit(benchmark::kMicrosecond);

// A request: fill_mask + advance for each token of a document; the counter is time per token.
void decode_doc(benchmark::State& state, std::shared_ptr<const Grammar> g) {
  const auto ids = qwen().encode(kDoc);
  std::vector<uint32_t> mask(vocab()->mask_words());
  for (auto _ : state) {
    Matcher m(g, vocab());
    for (int32_t id : ids) {
      m.fill_mask(mask);
      m.advance(id);
    }
    benchmark::DoNotOptimize(mask.data());
  }
  state.counters["tokens"] = double(ids.size());
  state.counters["per_token"] =
      benchmark::Counter(double(state.iterations() * ids.size()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
void BM_DecodeDocSchema(benchmark::State& s) {
  decode_doc(s, compile_json_schema(ojson::parse(kSchema)));
}
void BM_DecodeDocJsonObject(benchmark::State& s) {
  decode_doc(s, compile_json_object());
}
BENCHMARK(BM_DecodeDocSchema)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeDocJsonObject)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
