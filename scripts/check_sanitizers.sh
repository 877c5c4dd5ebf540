#!/usr/bin/env bash
# The sanitizer builds and the fuzzers, as CI runs them (docs/TESTING.md):
#
#   asan  clang -O1 with AddressSanitizer + UndefinedBehaviorSanitizer (every report fatal) and
#         libFuzzer's coverage, CPU tree only; the tests of the parsers, the server, the CLI and
#         the hostile-input suite (ASAN_TESTS below), and each fuzzer replaying its corpus.
#   fuzz  every harness of tests/fuzz for --fuzz-seconds (scripts/fuzz.sh), on the asan build.
#   tsan  clang -O1 with ThreadSanitizer: the thread pool, the engine (its thread, admission,
#         cancellation, the prefix cache) and the server (worker, engine and SSE threads, client
#         disconnects, the SIGTERM drain), TSAN_TESTS below.
#
# Usage: scripts/check_sanitizers.sh [--fuzz-seconds N] [--asan-dir DIR] [--tsan-dir DIR]
#                                    [STAGE...]      (default: asan fuzz tsan)
# Each stage prints its time. Builds only the targets its tests need, with the machine's CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."

asan=build-asan tsan=build-tsan fuzz_seconds=20 stages=()
while [ $# -gt 0 ]; do
  case $1 in
    --fuzz-seconds) fuzz_seconds=$2; shift 2 ;;
    --asan-dir) asan=$2; shift 2 ;;
    --tsan-dir) tsan=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    asan|fuzz|tsan) stages+=("$1"); shift ;;
    *) echo "check_sanitizers.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#stages[@]} -eq 0 ] && stages=(asan fuzz tsan)
jobs=$(nproc)

# -O1: the sanitizers' usual level (fast enough to run the tests, frames still readable); -g1:
# line tables for the reports, at a fraction of -g's compile time.
configure() {  # DIR SANITIZERS [more cmake arguments]
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DFLASHMAP_SANITIZE="$2" -DFLASHMAP_CUDA=OFF -DFLASHMAP_BUILD_BENCH=OFF "${@:3}" >/dev/null
}

stage_time() { echo "check_sanitizers.sh: $1 took $(( $(date +%s) - $2 )) s"; }

# The ASan + UBSan subset: everything that parses files, requests or templates (io, text,
# constrain, server and their hostile-input tests), the CLI end to end, the thread pool and the
# engine, and the fuzzers' corpora (test_models is built for its noise-cache tests). Left out:
# the numeric kernels' and models' tests (ops, specdec, paged, models other than conversion and
# the noise cache), which take 20 minutes under the sanitizers and read no untrusted bytes but
# the weights, checked by io's tests.
ASAN_TARGETS=(flashmap test_io test_tokenizer test_jinja test_chat test_utf8 test_codec
              test_constrain test_server_api test_server_translate test_server_health
              test_server_http_front test_robustness_jinja test_robustness_model_files
              test_robustness_file_faults test_core test_engine test_convert test_models test_gguf
              test_gguf_convert)
ASAN_TESTS='^(robustness|server|fuzz|cli|docs)\.|^chat_render_cli|^(Safetensors|Checkpoint|Qwen3Config|FlashMapConfig|GenerationConfig|Tokenizer|TokenizerGolden|TokenizerErrors|TokenizerStream|TokenizerUnicode|Jinja|Jinja2/JinjaGolden|Transformers/ChatGolden|ChatTemplate|TextCodec|Utf8|Constrain|ConstrainSchema|ConstrainJson|ConstrainRegex|ConstrainVocabulary|Constrained|ParseRequest|JsonBody|JsonDepth|Tokenize|Detokenize|UnknownFields|UnsupportedFields|ContentParts|ToolCalls|StopMatcher|ReasoningSplitter|Responses|Messages|Health|HttpFraming|EngineErrors|Metrics|ThreadPool|Engine|PrefixCache|AdaptivePolicy|Convert|NoiseCache|Gguf|GgufConvert|Fp16)\.'
# Left out for time (each minutes under ASan; all run in the release build): cli tests that run
# the models for long (a bench sweep, the bf16 path), the randomized schema properties, and the
# HTTP suites whose bodies are megabytes (the hostile-request, router and agent-API suites; the
# parsers they reach run under ASan in the fuzzers, and the server end to end in server.e2e).
ASAN_EXCLUDE='^cli\.(bench|generate_compute_bf16|parity)|^ConstrainSchema\.Random|^robustness\.server_hostile$|^server\.(router|agent_apis)$'

TSAN_TARGETS=(flashmap test_core test_engine test_server_health test_server_api)
TSAN_TESTS='^(ThreadPool|Engine|PrefixCache|AdaptivePolicy|Health|EngineErrors)\.|^server\.e2e$'

for stage in "${stages[@]}"; do
  t0=$(date +%s)
  case $stage in
    asan)
      configure "$asan" address,undefined -DFLASHMAP_FUZZ=ON
      fuzzers=()
      for f in tests/fuzz/fuzz_*.cpp; do fuzzers+=("$(basename "$f" .cpp)"); done
      cmake --build "$asan" -j"$jobs" --target "${ASAN_TARGETS[@]}" "${fuzzers[@]}"
      stage_time "asan build" "$t0"
      t1=$(date +%s)
      # Leaks are reported (LeakSanitizer); a report of any kind ends the process with an error.
      ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir "$asan" --output-on-failure -j"$jobs" -R "$ASAN_TESTS" -E "$ASAN_EXCLUDE"
      stage_time "asan tests" "$t1"
      ;;
    fuzz)
      scripts/fuzz.sh --build "$asan" --seconds "$fuzz_seconds" --jobs "$jobs"
      stage_time "fuzzing" "$t0"
      ;;
    tsan)
      configure "$tsan" thread
      cmake --build "$tsan" -j"$jobs" --target "${TSAN_TARGETS[@]}"
      stage_time "tsan build" "$t0"
      t1=$(date +%s)
      # halt_on_error: a race fails the test that met it (the server's too, by its exit status;
      # the server tests print its log when it dies). tests/tsan.supp: the system libraries'.
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
        ctest --test-dir "$tsan" --output-on-failure -j"$jobs" -R "$TSAN_TESTS"
      stage_time "tsan tests" "$t1"
      ;;
  esac
done
