// llama-api-timer: llama.cpp's decode and verify steps timed through its public C API (llama.h),
// for bench/vs_llama_cpp.py. Not part of the flashmap build: the script compiles it against the
// llama.cpp it builds in its cache folder.
//
//   llama-api-timer --model M.gguf --threads 2 --context 512 --reps 5 --rows 1,17
//
// It fills a context of --context random tokens, then for each row count n times llama_decode of
// n new tokens at positions context .. context + n - 1 with logits requested for all n rows (what
// a speculative verify needs; llama-bench's pp asks for the last row only), removing the n new
// KV entries after each call so every rep starts from the same filled context. One warm-up, then
// --reps timed calls; prints one JSON object with the median ms per row count.
#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama-api-timer: error: %s\n", msg.c_str());
  std::exit(1);
}

int to_int(const char* s, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0 || v > 1000000) die(std::string(what) + ": bad value " + s);
  return int(v);
}

// A batch of n tokens for sequence 0 at positions p0 .. p0 + n - 1; rows of logits as asked.
struct Batch {
  llama_batch b;
  explicit Batch(int n) : b(llama_batch_init(n, 0, 1)) {}
  ~Batch() { llama_batch_free(b); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  void fill(const std::vector<llama_token>& toks, int p0, bool all_logits) {
    const int n = int(toks.size());
    b.n_tokens = n;
    for (int i = 0; i < n; ++i) {
      b.token[i] = toks[size_t(i)];
      b.pos[i] = p0 + i;
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = (all_logits || i == n - 1) ? 1 : 0;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int threads = 2, context = 512, reps = 5;
  std::vector<int> rows = {1, 17};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") {
      model_path = value();
    } else if (a == "--threads") {
      threads = to_int(value(), "--threads");
    } else if (a == "--context") {
      context = to_int(value(), "--context");
    } else if (a == "--reps") {
      reps = to_int(value(), "--reps");
    } else if (a == "--rows") {
      rows.clear();
      std::string s = value();
      size_t p = 0;
      while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        rows.push_back(to_int(s.substr(p, q - p).c_str(), "--rows"));
        p = q + 1;
      }
    } else {
      die("unknown argument " + a + " (expected --model, --threads, --context, --reps, --rows)");
    }
  }
  if (model_path.empty()) die("--model is required");
  if (threads < 1 || reps < 1 || context < 1) die("--threads, --reps and --context must be >= 1");
  int max_rows = 0;
  for (int n : rows) {
    if (n < 1) die("--rows entries must be >= 1");
    max_rows = std::max(max_rows, n);
  }

  llama_backend_init();
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);

  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) die("cannot load " + model_path);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(context + max_rows + 64);
  cp.n_batch = uint32_t(std::max(context, max_rows));
  cp.n_ubatch = cp.n_batch;
  cp.n_seq_max = 1;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create a context");
  llama_memory_t mem = llama_get_memory(ctx);

  // Random tokens (their values do not change the cost); a fixed seed for repeatability.
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next_token = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return llama_token((state >> 33) % uint64_t(n_vocab));
  };
  std::vector<llama_token> prompt(static_cast<size_t>(context));
  for (auto& t : prompt) t = next_token();
  {
    Batch fill(context);
    fill.fill(prompt, 0, false);
    if (llama_decode(ctx, fill.b) != 0) die("llama_decode of the context failed");
    llama_synchronize(ctx);
  }

  std::printf("{\"model\": \"%s\", \"threads\": %d, \"context\": %d, \"reps\": %d, \"n_vocab\": %d",
              model_path.c_str(), threads, context, reps, n_vocab);
  std::printf(", \"llama_version\": \"%s\"", llama_version());
  Batch batch(max_rows);
  for (int n : rows) {
    std::vector<llama_token> toks(static_cast<size_t>(n));
    for (auto& t : toks) t = next_token();
    std::vector<double> ms;
    for (int r = 0; r <= reps; ++r) {  // rep 0 is the warm-up
      batch.fill(toks, context, true);
      const auto t0 = std::chrono::steady_clock::now();
      if (llama_decode(ctx, batch.b) != 0) die("llama_decode of " + std::to_string(n) + " failed");
      llama_synchronize(ctx);
      const float* last = llama_get_logits_ith(ctx, n - 1);
      const auto t1 = std::chrono::steady_clock::now();
      if (!last) die("no logits for row " + std::to_string(n - 1));
      if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      // Back to the filled context: drop positions context .. end.
      if (!llama_memory_seq_rm(mem, 0, context, -1)) die("llama_memory_seq_rm failed");
    }
    std::sort(ms.begin(), ms.end());
    std::printf(", \"rows%d_ms\": %.4f, \"rows%d_all_ms\": [", n, ms[ms.size() / 2], n);
    for (size_t i = 0; i < ms.size(); ++i) std::printf("%s%.4f", i ? ", " : "", ms[i]);
    std::printf("]");
  }
  std::printf("}\n");

  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
