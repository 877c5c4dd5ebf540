// Encode/decode throughput of flashmap::Tokenizer on the committed tokenizer corpus, single
// thread. Compare with bench/bench_tokenizer_hf.py (Hugging Face tokenizers on the same lines);
// see bench/TOKENIZER.md.
//
//   build/bench/bench_tokenizer [--benchmark_repetitions=5]
//   FLASHMAP_TOKENIZER_CORPUS=other.jsonl build/bench/bench_tokenizer   (one JSON string a line)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "flashmap/tokenizer.h"

namespace {

const std::string kRoot = FLASHMAP_SOURCE_DIR;

struct Corpus {
  std::vector<std::string> lines;
  size_t bytes = 0;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus c;
    const char* env = std::getenv("FLASHMAP_TOKENIZER_CORPUS");
    const std::string path = env ? env : kRoot + "/tests/data/tokenizer_corpus.jsonl";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    for (std::string line; std::getline(in, line);) {
      c.lines.push_back(nlohmann::json::parse(line).get<std::string>());
      c.bytes += c.lines.back().size();
    }
    return c;
  }();
  return c;
}

const flashmap::Tokenizer& qwen() {
  static const flashmap::Tokenizer t =
      flashmap::Tokenizer::from_dir(kRoot + "/tests/data/qwen3-tokenizer");
  return t;
}

// Every corpus line, one encode call each (the word cache is warm after the first pass, as HF's
// is in the Python benchmark).
void BM_EncodeCorpus(benchmark::State& state) {
  const Corpus& c = corpus();
  size_t ids = 0;
  for (auto _ : state) {
    for (const auto& line : c.lines) {
      auto out = qwen().encode(line);
      ids += out.size();
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c.bytes));
  state.counters["ids/iter"] = static_cast<double>(ids) / state.iterations();
}
BENCHMARK(BM_EncodeCorpus)->Unit(benchmark::kMillisecond);

// The first pass over the corpus with an empty word cache (a fresh tokenizer each iteration;
// loading is not timed).
void BM_EncodeCorpusColdCache(benchmark::State& state) {
  const Corpus& c = corpus();
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = flashmap::Tokenizer::from_dir(kRoot + "/tests/data/qwen3-tokenizer");
    state.ResumeTiming();
    for (const auto& line : c.lines) benchmark::DoNotOptimize(tok.encode(line).data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c.bytes));
}
BENCHMARK(BM_EncodeCorpusColdCache)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_DecodeCorpus(benchmark::State& state) {
  const Corpus& c = corpus();
  std::vector<std::vector<int32_t>> ids;
  for (const auto& line : c.lines) ids.push_back(qwen().encode(line));
  for (auto _ : state)
    for (const auto& v : ids) benchmark::DoNotOptimize(qwen().decode(v).data());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c.bytes));
}
BENCHMARK(BM_DecodeCorpus)->Unit(benchmark::kMillisecond);

void BM_Load(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(flashmap::Tokenizer::from_dir(kRoot + "/tests/data/qwen3-tokenizer"));
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
