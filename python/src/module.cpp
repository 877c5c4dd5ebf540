// flashmap_engine._core: the public engine API (include/flashmap/engine.h, text.h) for Python.
// flashmap_engine/__init__.py adds the reference-shaped helper (spec_generate).
//
// Threads: the CPU backend computes on one process-wide pool (sized by EngineOptions::threads)
// that runs one parallel loop at a time, so every call that computes (loading, generate, a
// stream's worker) holds one process-wide lock, taken with the GIL released. Nothing that holds the
// lock ever waits for the GIL, so Python threads calling at once are served one after the other.
#include <flashmap/engine.h>
#include <flashmap/text.h>
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

std::mutex& compute_mutex() {
  static std::mutex m;
  return m;
}

std::string py_type_name(nb::handle h) {
  return nb::type_name(h.type()).c_str();
}

// Token ids from a list/tuple of ints or any integer array (buffer protocol or DLPack) of shape
// (n,) or (1, n), the reference's (batch of one, length) layout.
std::vector<int32_t> ids_from(nb::handle obj, const char* what) {
  std::vector<int32_t> out;
  auto check = [&](long long v, size_t i) {
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      throw nb::value_error(
          fmt::format("{}[{}] = {} is not a token id (expected 0 <= id < 2^31)", what, i, v)
              .c_str());
    return int32_t(v);
  };
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
    nb::sequence seq = nb::borrow<nb::sequence>(obj);
    const size_t n = nb::len(seq);
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      nb::object item = seq[i];
      if (PyBool_Check(item.ptr()) || !PyLong_Check(item.ptr()))
        throw nb::type_error(
            fmt::format("{}[{}]: expected an int, got {}", what, i, py_type_name(item)).c_str());
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(item.ptr(), &overflow);
      if (overflow)
        throw nb::value_error(fmt::format("{}[{}] is not a token id (too large)", what, i).c_str());
      out.push_back(check(v, i));
    }
    return out;
  }
  // Text and raw bytes have the buffer protocol but are not ids.
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr()))
    throw nb::type_error(fmt::format("{}: expected a list of ints or an integer array, got {}",
                                     what, py_type_name(obj))
                             .c_str());
  nb::ndarray<nb::ro, nb::device::cpu> a;
  if (!nb::try_cast(obj, a))
    throw nb::type_error(fmt::format("{}: expected a list of ints or an integer array (buffer "
                                     "protocol or DLPack, on the CPU), got {}",
                                     what, py_type_name(obj))
                             .c_str());
  const auto dt = a.dtype();
  const bool is_int = dt.code == uint8_t(nb::dlpack::dtype_code::Int);
  const bool is_uint = dt.code == uint8_t(nb::dlpack::dtype_code::UInt);
  if ((!is_int && !is_uint) || dt.lanes != 1 ||
      (dt.bits != 8 && dt.bits != 16 && dt.bits != 32 && dt.bits != 64))
    throw nb::type_error(fmt::format("{}: expected integer ids, got an array of dtype code {} "
                                     "with {} bits (floats and bools are not token ids)",
                                     what, int(dt.code), int(dt.bits))
                             .c_str());
  size_t n = 0;
  int64_t stride = 0;
  if (a.ndim() == 1) {
    n = a.shape(0);
    stride = a.stride(0);
  } else if (a.ndim() == 2 && a.shape(0) == 1) {
    n = a.shape(1);
    stride = a.stride(1);
  } else {
    std::string shape;
    for (size_t d = 0; d < a.ndim(); ++d) shape += (d ? ", " : "") + std::to_string(a.shape(d));
    if (a.ndim() == 1) shape += ",";
    throw nb::value_error(
        fmt::format("{}: expected shape (n,) or (1, n), got ({})", what, shape).c_str());
  }
  const auto* base = static_cast<const uint8_t*>(a.data());
  const int64_t step = stride * int64_t(dt.bits / 8);  // strides count elements
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = base + int64_t(i) * step;
    long long v = 0;
    switch (dt.bits) {
      case 8:
        v = is_int ? *reinterpret_cast<const int8_t*>(p) : *p;
        break;
      case 16:
        v = is_int ? *reinterpret_cast<const int16_t*>(p) : *reinterpret_cast<const uint16_t*>(p);
        break;
      case 32:
        v = is_int ? *reinterpret_cast<const int32_t*>(p) : *reinterpret_cast<const uint32_t*>(p);
        break;
      default: {
        if (is_uint) {
          const uint64_t u = *reinterpret_cast<const uint64_t*>(p);
          if (u > uint64_t(std::numeric_limits<int32_t>::max()))
            throw nb::value_error(
                fmt::format("{}[{}] = {} is not a token id (expected 0 <= id < 2^31)", what, i, u)
                    .c_str());
          v = (long long)u;
        } else {
          v = *reinterpret_cast<const int64_t*>(p);
        }
      }
    }
    out.push_back(check(v, i));
  }
  return out;
}

// A numpy array that takes over `v`'s buffer (no copy); the capsule frees it with the array.
template <typename T>
nb::object numpy_of(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const size_t shape[1] = {heap->size()};
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), 1, shape, owner));
}

// GenerateResult as Python sees it: the id vectors become numpy arrays once, without copies.
struct Result {
  nb::object ids, acceptance_lengths, accepted_at;
  int rounds = 0;
  std::string finish_reason;
  double acceptance_length = 0;
  flashmap::PhaseTimes times;

  explicit Result(flashmap::GenerateResult&& r)
      : rounds(r.rounds),
        finish_reason(std::move(r.finish_reason)),
        acceptance_length(r.acceptance_length()),
        times(r.times) {
    ids = numpy_of(std::move(r.ids));
    std::vector<int32_t> acc(r.acceptance_lengths.begin(), r.acceptance_lengths.end());
    acceptance_lengths = numpy_of(std::move(acc));
    accepted_at = numpy_of(std::move(r.accepted_at));
  }
  nb::dict timings() const {
    nb::dict d;
    d["prefill"] = times.prefill_ms;
    d["draft"] = times.draft_ms;
    d["verify"] = times.verify_ms;
    d["accept"] = times.accept_ms;
    d["total"] = times.total_ms;
    return d;
  }
};

// A tokenizer folder: tokenizer.json and, when it has one, its chat template.
class PyTokenizer {
 public:
  explicit PyTokenizer(const std::string& dir) : text_(flashmap::TextCodec::from_dir(dir)) {}

  std::vector<int32_t> encode(const std::string& text) const { return text_.encode(text); }
  std::string decode(nb::handle ids, bool skip_special) const {
    const auto v = ids_from(ids, "ids");
    return text_.decode(v, skip_special);
  }
  size_t vocab_size() const { return text_.vocab_size(); }
  std::optional<int32_t> token_to_id(const std::string& t) const {
    return text_.tokenizer().token_to_id(t);
  }
  std::string id_to_token(int32_t id) const { return text_.tokenizer().id_to_token(id); }

  // The request object ChatTemplate::render takes, written by Python's json module (any
  // JSON-able messages and tools; the rest is the template's business).
  nb::object apply_chat_template(nb::handle messages, bool add_generation_prompt,
                                 nb::handle enable_thinking, nb::handle tools, bool tokenize,
                                 nb::kwargs kwargs) {
    nb::dict req;
    for (auto [k, v] : kwargs) req[k] = v;
    req["messages"] = messages;
    req["add_generation_prompt"] = add_generation_prompt;
    if (!enable_thinking.is_none()) req["enable_thinking"] = enable_thinking;
    if (!tools.is_none()) req["tools"] = tools;
    const std::string text = nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(req));
    std::string prompt;
    {
      nb::gil_scoped_release unlocked;
      prompt = text_.render_chat(nlohmann::ordered_json::parse(text));
    }
    if (!tokenize) return nb::cast(prompt);
    return nb::cast(text_.encode(prompt));
  }

 private:
  flashmap::TextCodec text_;
};

// What the worker thread of a stream hands to the iterating thread.
struct StreamState {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::vector<int32_t>> chunks;
  bool done = false;
  std::exception_ptr error;
  std::optional<flashmap::GenerateResult> result;
  std::atomic<bool> cancel{false};
};

class TokenStream {
 public:
  TokenStream(std::shared_ptr<flashmap::Engine> engine, flashmap::RequestParams params)
      : st_(std::make_shared<StreamState>()) {
    // The worker owns what it uses (the engine and the state), so closing the engine or
    // dropping the iterator never pulls anything from under it.
    worker_ = std::thread([st = st_, engine = std::move(engine), params = std::move(params)] {
      try {
        std::lock_guard compute(compute_mutex());
        // Dropped while it waited for the lock: not even the prefill is worth running.
        if (st->cancel.load()) {
          std::lock_guard lk(st->m);
          st->done = true;
          st->cv.notify_all();
          return;
        }
        auto r = engine->generate(
            params,
            [&](std::span<const int32_t> t) {
              std::lock_guard lk(st->m);
              st->chunks.emplace_back(t.begin(), t.end());
              st->cv.notify_all();
            },
            &st->cancel);
        std::lock_guard lk(st->m);
        st->result = std::move(r);
      } catch (...) {
        std::lock_guard lk(st->m);
        st->error = std::current_exception();
      }
      std::lock_guard lk(st->m);
      st->done = true;
      st->cv.notify_all();
    });
  }
  // A stream dropped before its end (a `break`) cancels its request at the next round boundary
  // and waits for that: the worker never needs the GIL, so waiting while holding it is safe.
  ~TokenStream() { close(); }

  void close() {
    st_->cancel.store(true);
    if (worker_.joinable()) worker_.join();
  }

  std::vector<int32_t> next() {
    for (;;) {
      {
        nb::gil_scoped_release unlocked;
        std::unique_lock lk(st_->m);
        // Short waits, so that Ctrl-C reaches Python between them.
        st_->cv.wait_for(lk, std::chrono::milliseconds(50),
                         [&] { return !st_->chunks.empty() || st_->done; });
        if (!st_->chunks.empty()) {
          auto c = std::move(st_->chunks.front());
          st_->chunks.pop_front();
          return c;
        }
        if (st_->done) break;
      }
      if (PyErr_CheckSignals() != 0) {
        st_->cancel.store(true);
        throw nb::python_error();
      }
    }
    if (worker_.joinable()) worker_.join();
    if (st_->error) std::rethrow_exception(st_->error);
    if (!result_ && st_->result) result_.emplace(std::move(*st_->result));
    throw nb::stop_iteration();
  }

  // The whole generation's result once the iterator is exhausted; None before.
  nb::object result() {
    if (!result_) {
      std::lock_guard lk(st_->m);
      if (!st_->done || !st_->result) return nb::none();
      result_.emplace(std::move(*st_->result));
      st_->result.reset();
    }
    return nb::cast(&*result_, nb::rv_policy::reference_internal, nb::find(this));
  }

 private:
  std::shared_ptr<StreamState> st_;
  std::thread worker_;
  std::optional<Result> result_;
};

class PyEngine {
 public:
  PyEngine(const std::string& target, std::optional<std::string> draft, const std::string& device,
           std::optional<int> threads, std::optional<int> steps, const std::string& draft_tree,
           std::optional<int> ngram_min, std::optional<int> ngram_max,
           std::optional<int> ngram_block, int hybrid_ngram, int draft_window,
           const std::string& weights, const std::string& compute_mode,
           const std::string& draft_cut) {
    std::error_code ec;
    const std::string folder = flashmap::target_folder(target);
    if (std::filesystem::exists(std::filesystem::path(folder) / "tokenizer.json", ec))
      tokenizer_ = std::make_shared<PyTokenizer>(folder);
    flashmap::EngineOptions o;
    o.target = target;
    o.draft = draft.value_or("");
    o.device = device;
    o.steps = steps.value_or(0);
    o.draft_tree = draft_tree;  // checked by the engine (one-line errors)
    o.draft_cut = draft_cut;    // "auto" verifies every draft here (the Always policy): "on" cuts
    // draft_dir "ngram": the n-gram drafter; None: its defaults (ranges checked by the engine).
    o.ngram_min = ngram_min.value_or(o.ngram_min);
    o.ngram_max = ngram_max.value_or(o.ngram_max);
    o.ngram_block = ngram_block.value_or(o.ngram_block);
    o.hybrid_ngram = hybrid_ngram;  // 0: off
    o.draft_window = draft_window;  // 0: off; range and drafter checked by the engine
    o.weights = weights;            // "native" | "q8" | "q4"; checked by the engine
    o.compute = compute_mode;       // "fp32" | "bf16"; checked by the engine (and the CPU)
    if (steps && *steps < 1)
      throw flashmap::Error(fmt::format("steps must be >= 1, got {}", *steps));
    if (steps && o.draft.empty()) throw flashmap::Error("steps needs a drafter (draft_dir)");
    o.sampled_vocab = tokenizer_ ? int64_t(tokenizer_->vocab_size()) : 0;
    o.spec_policy = flashmap::SpecPolicyKind::Always;  // one sequence: every round drafts
    // None: the pool's default size; a number is the pool's size, never the default (0).
    if (threads && *threads < 1)
      throw flashmap::Error(fmt::format("threads must be in [1, 1024], got {}", *threads));
    o.threads = threads.value_or(0);
    nb::gil_scoped_release unlocked;
    std::lock_guard compute(compute_mutex());
    flashmap::check_device(o);
    engine_ = std::make_shared<flashmap::Engine>(std::move(o));
    eos_ = engine_->defaults().eos_token_ids;
  }

  std::shared_ptr<flashmap::Engine> get() const {
    std::lock_guard lk(m_);
    if (!engine_) throw std::runtime_error("the engine is closed");
    return engine_;
  }
  // Drops the models now; a generation still running on another thread keeps them until it ends.
  void close() {
    std::shared_ptr<flashmap::Engine> e;
    {
      std::lock_guard lk(m_);
      e.swap(engine_);
    }
    nb::gil_scoped_release unlocked;
    e.reset();
  }
  bool closed() const {
    std::lock_guard lk(m_);
    return !engine_;
  }

  // Sampling values left None come from the engine's defaults (the target's
  // generation_config.json), as in `flashmap generate` and serve.
  flashmap::RequestParams params(nb::handle input_ids, int max_new_tokens,
                                 std::optional<double> temperature, std::optional<int> top_k,
                                 std::optional<double> top_p, std::optional<double> min_p,
                                 std::optional<int64_t> seed, nb::handle stop_token_ids) const {
    flashmap::RequestParams p = get()->defaults().request();
    p.prompt = ids_from(input_ids, "input_ids");
    p.max_tokens = max_new_tokens;
    if (temperature) p.sampling.temperature = float(*temperature);
    if (top_k) p.sampling.top_k = *top_k;
    if (top_p) p.sampling.top_p = float(*top_p);
    if (min_p) p.sampling.min_p = float(*min_p);
    if (seed) {
      if (*seed < 0) throw flashmap::Error(fmt::format("seed must be >= 0, got {}", *seed));
      p.seed = uint64_t(*seed);
      p.seeded = true;
    } else {
      p.seed = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
    }
    if (!stop_token_ids.is_none()) p.stop_ids = ids_from(stop_token_ids, "stop_token_ids");
    p.sampling.validate();
    get()->validate(p);
    return p;
  }

  Result generate(const flashmap::RequestParams& p) {
    auto engine = get();
    flashmap::GenerateResult r;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard compute(compute_mutex());
      r = engine->generate(p);
    }
    return Result(std::move(r));
  }

  TokenStream* stream(flashmap::RequestParams p) { return new TokenStream(get(), std::move(p)); }

  std::shared_ptr<PyTokenizer> tokenizer() const { return tokenizer_; }
  const std::vector<int32_t>& eos() const { return eos_; }

 private:
  mutable std::mutex m_;
  std::shared_ptr<flashmap::Engine> engine_;
  std::shared_ptr<PyTokenizer> tokenizer_;
  std::vector<int32_t> eos_;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "The flashmap C++ engine (include/flashmap/engine.h) for Python.";
  // Every engine error is about a value it was given (ids, options, folders, files): ValueError.
  nb::exception<flashmap::Error>(m, "Error", PyExc_ValueError);

  m.def("cpu_threads", &flashmap::cpu_threads,
        "The size of the process-wide CPU thread pool (made with the default size when it does "
        "not exist yet).");

  nb::class_<Result>(m, "GenerateResult",
                     "The result of Engine.generate (and of a finished Engine.stream).")
      .def_ro("ids", &Result::ids, "generated ids (numpy int32), without the prompt")
      .def_ro("acceptance_lengths", &Result::acceptance_lengths,
              "tokens committed by each verify pass (numpy int32), as the reference counts them")
      .def_ro("accepted_at", &Result::accepted_at,
              "rounds in which draft slot k was accepted (numpy int64, one per slot)")
      .def_ro("rounds", &Result::rounds)
      .def_ro("finish_reason", &Result::finish_reason, "'stop', 'length' or 'cancelled'")
      .def_ro("acceptance_length", &Result::acceptance_length,
              "tau: mean tokens per target forward pass (0 without rounds)")
      .def_prop_ro("tau", [](const Result& r) { return r.acceptance_length; })
      .def_prop_ro("timings_ms", &Result::timings,
                   "per-phase wall time in ms: prefill, draft, verify, accept, total")
      .def("__repr__", [](const Result& r) {
        return fmt::format(
            "GenerateResult(ids=<{} tokens>, rounds={}, acceptance_length={:.3f}, "
            "finish_reason='{}', total_ms={:.2f})",
            nb::len(r.ids), r.rounds, r.acceptance_length, r.finish_reason, r.times.total_ms);
      });

  nb::class_<PyTokenizer>(m, "Tokenizer",
                          "A Hugging Face tokenizer folder (tokenizer.json, and the chat template "
                          "of chat_template.jinja or tokenizer_config.json)")
      .def(nb::init<const std::string&>(), "dir"_a)
      .def("encode", &PyTokenizer::encode, "text"_a,
           "ids of `text` (no special tokens added, as a chat-templated prompt needs)")
      .def("decode", &PyTokenizer::decode, "ids"_a.none(), "skip_special_tokens"_a = false)
      .def_prop_ro("vocab_size", &PyTokenizer::vocab_size)
      .def("token_to_id", &PyTokenizer::token_to_id, "token"_a)
      .def("id_to_token", &PyTokenizer::id_to_token, "id"_a)
      .def("apply_chat_template", &PyTokenizer::apply_chat_template, "messages"_a,
           "add_generation_prompt"_a = true, "enable_thinking"_a = nb::none(),
           "tools"_a = nb::none(), "tokenize"_a = true, "kwargs"_a,
           "The prompt the folder's chat template renders for `messages` (byte-exact with "
           "transformers' apply_chat_template); its ids when tokenize is true (the default, as "
           "in transformers), else the text. Other keyword arguments become template variables.");

  nb::class_<TokenStream>(m, "TokenStream",
                          "Iterator over the tokens each round accepts (one list per round). "
                          "Dropping it early (break) cancels the generation.")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &TokenStream::next)
      .def_prop_ro("result", &TokenStream::result,
                   "the GenerateResult once the iterator is exhausted, else None")
      .def("close", &TokenStream::close, nb::call_guard<nb::gil_scoped_release>(),
           "cancel the generation (at the next round boundary) and wait for it to stop")
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](TokenStream& s, nb::args) {
        nb::gil_scoped_release unlocked;
        s.close();
      });

  nb::class_<PyEngine>(
      m, "Engine",
      "A Qwen3 target folder (or Qwen3 GGUF file, read in place), an optional "
      "FlashMap or DFlash drafter folder (or "
      "\"ngram\": prompt lookup, with ngram_min, ngram_max, ngram_block; "
      "hybrid_ngram=N: prompt lookup beside the drafter where N tokens match; "
      "draft_window=N: the drafter attends to the last N context positions), "
      "a device (cpu, cuda, cuda:N) and, on the CPU, weights (native, q8 or q4) and "
      "compute (fp32, or bf16: AVX512-BF16 dot products).")
      .def(nb::init<const std::string&, std::optional<std::string>, const std::string&,
                    std::optional<int>, std::optional<int>, const std::string&, std::optional<int>,
                    std::optional<int>, std::optional<int>, int, int, const std::string&,
                    const std::string&, const std::string&>(),
           "target_dir"_a, "draft_dir"_a = nb::none(), "device"_a = "cpu", "threads"_a = nb::none(),
           "steps"_a = nb::none(), "draft_tree"_a = "off", "ngram_min"_a = nb::none(),
           "ngram_max"_a = nb::none(), "ngram_block"_a = nb::none(), "hybrid_ngram"_a = 0,
           "draft_window"_a = 0, "weights"_a = "native", "compute"_a = "fp32",
           "draft_cut"_a = "auto")
      .def(
          "generate",
          [](PyEngine& e, nb::handle input_ids, int max_new_tokens,
             std::optional<double> temperature, std::optional<int> top_k,
             std::optional<double> top_p, std::optional<double> min_p, std::optional<int64_t> seed,
             nb::handle stop_token_ids) {
            return e.generate(e.params(input_ids, max_new_tokens, temperature, top_k, top_p, min_p,
                                       seed, stop_token_ids));
          },
          "input_ids"_a.none(), "max_new_tokens"_a, "temperature"_a = nb::none(),
          "top_k"_a = nb::none(), "top_p"_a = nb::none(), "min_p"_a = nb::none(),
          "seed"_a = nb::none(), "stop_token_ids"_a = nb::none(),
          "Decodes one prompt; the GIL is released while it runs. temperature, top_k, top_p, "
          "min_p None: the target's generation_config values (none there: greedy). "
          "stop_token_ids None: the target's generation_config eos ids. seed None: random "
          "(rejection sampling); an int: reproducible and equal to the target alone with that "
          "seed.")
      .def(
          "stream",
          [](PyEngine& e, nb::handle input_ids, int max_new_tokens,
             std::optional<double> temperature, std::optional<int> top_k,
             std::optional<double> top_p, std::optional<double> min_p, std::optional<int64_t> seed,
             nb::handle stop_token_ids) {
            return e.stream(e.params(input_ids, max_new_tokens, temperature, top_k, top_p, min_p,
                                     seed, stop_token_ids));
          },
          "input_ids"_a.none(), "max_new_tokens"_a, "temperature"_a = nb::none(),
          "top_k"_a = nb::none(), "top_p"_a = nb::none(), "min_p"_a = nb::none(),
          "seed"_a = nb::none(), "stop_token_ids"_a = nb::none(), nb::rv_policy::take_ownership,
          "As generate, but returns an iterator over the tokens of each round as it is accepted "
          "(decoding runs on a thread of its own); its .result holds the GenerateResult.")
      .def_prop_ro("tokenizer", &PyEngine::tokenizer,
                   "the target folder's Tokenizer, or None when it has no tokenizer.json")
      .def_prop_ro("eos_token_ids", &PyEngine::eos)
      .def_prop_ro("device", [](const PyEngine& e) { return e.get()->device(); })
      .def_prop_ro(
          "block_size", [](const PyEngine& e) { return e.get()->block_size(); },
          "drafts per round (0 without a drafter)")
      .def_prop_ro("max_context", [](const PyEngine& e) { return e.get()->max_context(); })
      .def_prop_ro("vocab_size",
                   [](const PyEngine& e) { return e.get()->target_info().vocab_size; })
      .def_prop_ro("target_dir", [](const PyEngine& e) { return e.get()->options().target; })
      .def_prop_ro("draft_dir",
                   [](const PyEngine& e) -> std::optional<std::string> {
                     const auto& d = e.get()->options().draft;
                     return d.empty() ? std::nullopt : std::optional<std::string>(d);
                   })
      .def_prop_ro("steps",
                   [](const PyEngine& e) -> std::optional<int> {
                     const int s = e.get()->options().steps;
                     return s > 0 ? std::optional<int>(s) : std::nullopt;
                   })
      .def_prop_ro("draft_tree", [](const PyEngine& e) { return e.get()->options().draft_tree; })
      .def_prop_ro("closed", &PyEngine::closed)
      .def("close", &PyEngine::close,
           "frees the models (a generation running on another thread keeps them until it ends); "
           "later calls raise RuntimeError")
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](PyEngine& e, nb::args) { e.close(); });
}
