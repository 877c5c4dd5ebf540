#!/usr/bin/env bash
# Runs the libFuzzer harnesses of tests/fuzz for a bounded time each and reports what they did.
#
# Usage: scripts/fuzz.sh [--build DIR] [--seconds N] [--jobs J] [--merge] [NAME...]
#
#   --build DIR   a build with -DFLASHMAP_FUZZ=ON (default build-asan; scripts/check_sanitizers.sh
#                 makes it)
#   --seconds N   how long each harness runs (default 20); hours for a long run, e.g.
#                 scripts/fuzz.sh --seconds 3600 --jobs 2
#   --jobs J      harnesses run at once (default: the number of CPUs)
#   --merge       afterwards, add the inputs that found new coverage to the committed corpus
#                 (tests/fuzz/corpus/NAME, minimized by libFuzzer's -merge=1)
#   NAME...       some harnesses only (default all: ls tests/fuzz/fuzz_*.cpp)
#
# Each harness starts from a copy of its committed corpus, so a run never changes the tree
# (except with --merge). Per harness it prints the executions, executions per second, the corpus
# it ended with (inputs and bytes) and the coverage. A crash, a sanitizer report, a leak, an input
# that runs past its timeout or out of memory fails the run: the input is kept under
# DIR/fuzz-out/NAME/ (crash-*, leak-*, timeout-*, oom-*) and its report in DIR/fuzz-out/NAME.log;
# fix the bug and commit the input to tests/fuzz/corpus/NAME, where ctest's fuzz.NAME replays it.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build-asan seconds=20 jobs=$(nproc) merge=0 names=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
if [ ${#names[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do names+=("$(basename "$f" .cpp | sed 's/^fuzz_//')"); done
fi

# Per harness: the longest input, the time one input may take (seconds) and a dictionary.
# Inputs are bounded so that each one is quick; the code under test has its own limits too
# (the Jinja renderer's one-second limit in the harness, the grammar compiler's state bound).
options() {
  case $1 in
    safetensors) echo "65536 20 json" ;;
    gguf) echo "65536 20 -" ;;
    shard_index|config) echo "16384 20 json" ;;
    tokenizer_json) echo "262144 30 json" ;;
    tokenizer_codec) echo "4096 20 -" ;;
    jinja) echo "8192 30 jinja" ;;
    json_schema) echo "8192 30 json" ;;
    regex) echo "512 30 regex" ;;
    chat_request|responses|messages) echo "16384 30 json" ;;
    http) echo "8192 20 http" ;;
    *) echo "" ;;
  esac
}

out=$build/fuzz-out
mkdir -p "$out"
# Sanitizer reports are fatal and symbolized; leaks are reported by libFuzzer itself.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export FLASHMAP_SOURCE_DIR=$PWD

run_one() {
  local name=$1 bin=$build/fuzz/fuzz_$1
  read -r max_len timeout dict <<<"$(options "$name")"
  if [ -z "$max_len" ] || [ ! -x "$bin" ]; then
    echo "fuzz.sh: no harness $name ($bin; build with -DFLASHMAP_FUZZ=ON)" >"$out/$name.log"
    return 1
  fi
  local work=$out/$name
  rm -rf "$work" && mkdir -p "$work/corpus"
  cp tests/fuzz/corpus/"$name"/* "$work/corpus/" 2>/dev/null || true
  local args=(-max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=4096
              -max_len="$max_len" -print_final_stats=1 -close_fd_mask=1
              -artifact_prefix="$work/")
  [ "$dict" != - ] && args+=(-dict="tests/fuzz/dict/$dict.dict")
  "$bin" "${args[@]}" "$work/corpus" >"$out/$name.log" 2>&1
}

summary() {
  local name=$1 status=$2 log=$out/$1.log
  local execs rate corp cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-16s %-6s %7ss %11s execs %7s/s  corpus %-14s cov %s\n' "$name" "$status" "$seconds" \
    "${execs:-?}" "${rate:-?}" "${corp:-?}" "${cov:-?}"
}

pids=() running=() failed=()
wait_one() {
  # Waits for the oldest harness still running and reports it.
  local pid=${pids[0]} name=${running[0]}
  pids=("${pids[@]:1}") running=("${running[@]:1}")
  if wait "$pid"; then
    summary "$name" ok
  else
    summary "$name" FAILED
    failed+=("$name")
  fi
}
echo "fuzzing ${#names[@]} harnesses for ${seconds}s each, $jobs at a time (logs: $out)"
for name in "${names[@]}"; do
  [ ${#pids[@]} -ge "$jobs" ] && wait_one
  run_one "$name" &
  pids+=($!) running+=("$name")
done
while [ ${#pids[@]} -gt 0 ]; do wait_one; done

if [ "$merge" = 1 ]; then
  for name in "${names[@]}"; do
    [[ " ${failed[*]} " == *" $name "* ]] && continue
    "$build/fuzz/fuzz_$name" -merge=1 -rss_limit_mb=4096 -timeout=60 \
      "tests/fuzz/corpus/$name" "$out/$name/corpus" >"$out/$name.merge.log" 2>&1
    echo "merged $name: $(ls "tests/fuzz/corpus/$name" | wc -l) inputs in tests/fuzz/corpus/$name"
  done
fi

if [ ${#failed[@]} -gt 0 ]; then
  for name in "${failed[@]}"; do
    echo "---- $name: $out/$name.log"
    grep -E 'ERROR|SUMMARY|fuzz: |Assertion|runtime error|Test unit written' "$out/$name.log" | head -20
  done
  echo "fuzz.sh: ${#failed[@]} harness(es) found a bug: ${failed[*]}" >&2
  exit 1
fi
