#!/usr/bin/env bash
# The prepared device check for an H200 (sized for 15 minutes of device time in all, the machine's
# start included, and at most ~560 s per call). On this machine first, then one call on the GPU:
#
#   scripts/make_gpu_bundle.sh          # here: build-gpu/gpu-bundle.tar.gz (binaries + libraries)
#   scripts/run_on_gpu.sh --dry-run     # here, no GPU needed: every binary, test filter, fixture,
#                                       # flag and script the stages use, and the plan
#   scripts/run_on_gpu.sh               # on the GPU, with build-gpu/gpu-bundle.tar.gz copied into
#                                       # the checkout (a 540 s limit)
#
# Rerun one stage (or a few) on the GPU, same bundle:
#   scripts/run_on_gpu.sh --only models  # (a 200 s limit)
#
# Usage: scripts/run_on_gpu.sh [--dry-run] [--only STAGE[,STAGE...]] [--list] [--payload DIR]
#
# Stages, in order of value, each under `timeout -k 5` with its own budget (total <= 480 s, so one
# rerun still fits in 15 minutes); a failing stage does not stop the later ones:
#   device  15 s  nvidia-smi (name, memory, driver, clocks), nvidia-smi -L, flashmap starts
#   ops     70 s  test_cuda_ops (every kernel against its CPU op), then test_cuda_controls (logit
#                 controls and logprobs on the device against their host rules)
#   models 110 s  test_cuda_qwen3, test_cuda_paged (the batched step over a paged KV cache: its
#                 attention, batch invariance, whole steps, batched serving = each request alone),
#                 then test_cuda_flashmap (the drafter)
#   engine  90 s  test_cuda_sampling, then test_cuda_engine (the round loop on the device)
#   bench  100 s  flashmap bench --device cuda --shape tiny (smoke), then --shape qwen3-8b --json
#                 (per-sequence steps, then batched steps of 1/8/32/64 sequences)
#   serve   85 s  bench/bench_server.py against flashmap serve --device cuda on models/default,
#                 concurrency 1, 8, 32, 64, speculative and not
# Two binaries in one stage share its budget: the first gets the budget minus the second's share,
# the second whatever is left (so it always gets at least its share).
#
# Results in $OUT (default gpu-out/; a remote runner may set its own), at most 6 files so that
# all of them come back: run.log (everything printed), summary.json (rewritten at the start and end
# of every stage, so it exists however the call ends: per stage name, command, budget_s, seconds,
# status passed|failed|timeout|skipped|planned (running|pending while the run is in progress),
# exit_code, figures, rerun), bench_cuda.json, serve.jsonl (one JSON line per concurrency level and
# speculation on/off), gtest-xml.tar.gz (xml/NAME.xml per test binary, repacked after each stage),
# build.log (only if it had to build on the device). Exit status: 0 when every selected stage
# passed (or, with --dry-run, when everything it checks is in place), 1 otherwise, 2 on bad usage.
# On the GPU a stage whose tests skipped (no usable GPU) counts as failed.
#
# --payload DIR (a runner with a transfer cap: scripts/gpu_checkout.sh): DIR/bundle.tar.xz is the
# bundle, and DIR/files/ holds repo paths a slim checkout lacks (the default target in bf16), copied
# into the checkout first where nothing is there yet.
#
# Binaries, first found: the bundle ${FLASHMAP_GPU_BUILD:-build-gpu}/gpu-bundle.tar.gz (or
# FLASHMAP_GPU_BUNDLE=FILE), unpacked to a temporary folder, its lib/ on LD_LIBRARY_PATH and its
# lib-fallback/ (libstdc++, libgcc_s) only if the binaries do not start without it; else
# FLASHMAP_GPU_BIN=DIR (prebuilt flashmap and test_cuda_* in one folder); else the binaries of the
# build folder ${FLASHMAP_GPU_BUILD:-build-gpu} (flashmap, tests/cuda/test_cuda_*); else, on the
# GPU only, a build into build-cuda with -j$(nproc) (the fallback: it needs the engine's build
# dependencies, which the GPU image lacks, and spends device minutes; --dry-run never builds).
#
# Knobs (environment): FLASHMAP_GTEST_FILTER (passed to every test binary; a binary it matches no
# test of is not run, and a filter that matches no test at all is an error), FLASHMAP_SANITIZE=1
# (tests under compute-sanitizer memcheck: much slower; raise the budgets), FLASHMAP_BUDGET_<STAGE>=S
# (another budget for one stage, e.g. FLASHMAP_BUDGET_models=200 for a rerun), FLASHMAP_SERVE_REQUESTS
# (64) and FLASHMAP_SERVE_MAX_TOKENS (32) per concurrency level of the serve stage, and
# FLASHMAP_SERVE_ARGS (`flashmap serve` arguments, default "--device cuda --max-running 64"), and
# FLASHMAP_CUDA_DRAFT=lanes (the backend's FlashMap drafter drafts per lane, not in one batched
# pass: a rerun of the bench and serve stages when the batched drafter fails).
# shellcheck disable=SC2317  # cleanup and on_signal run from traps
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)" || exit 1
cd "$ROOT" || exit 1

STAGES=(device ops models engine bench serve)
declare -A BUDGET=([device]=15 [ops]=70 [models]=110 [engine]=90 [bench]=100 [serve]=85)
declare -A WHAT=(
  [device]="nvidia-smi (GPU, memory, driver, clocks), nvidia-smi -L, flashmap starts"
  [ops]="test_cuda_ops (52 s share): every kernel against its CPU op, test_cuda_controls (18 s share)"
  [models]="test_cuda_qwen3 (40 s share), test_cuda_paged (40 s share), test_cuda_flashmap (30 s share)"
  [engine]="test_cuda_sampling (30 s share), test_cuda_engine (60 s share)"
  [bench]="flashmap bench --device cuda --shape tiny (smoke), --shape qwen3-8b --json bench_cuda.json"
  [serve]="bench/bench_server.py: flashmap serve --device cuda on models/default, concurrency 1,8,32,64")
MAX_TOTAL=480
SERVE_LEVELS="1,8,32,64"
SERVE_REQUESTS="${FLASHMAP_SERVE_REQUESTS:-64}"
SERVE_MAX_TOKENS="${FLASHMAP_SERVE_MAX_TOKENS:-32}"
SERVE_ARGS="${FLASHMAP_SERVE_ARGS:---device cuda --max-running 64}"
for s in "${STAGES[@]}"; do
  v="FLASHMAP_BUDGET_$s"
  if [[ -n "${!v:-}" ]]; then
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "run_on_gpu.sh: $v=${!v} is not a number of seconds" >&2; exit 2; }
    BUDGET[$s]=${!v}
  fi
done

usage() { sed -n 's/^# Usage: //p' "$0"; }
DRY=0 LIST=0 ONLY="" PAYLOAD=""
while (($#)); do
  case "$1" in
    --dry-run) DRY=1 ;;
    --payload) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; PAYLOAD="$2"; shift ;;
    --payload=*) PAYLOAD="${1#--payload=}" ;;
    --list) LIST=1 ;;
    --only) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; ONLY="$2"; shift ;;
    --only=*) ONLY="${1#--only=}" ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run_on_gpu.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
SELECTED=()
if [[ -n "$ONLY" ]]; then
  IFS=',' read -r -a want <<<"$ONLY"
  for w in "${want[@]}"; do
    [[ -n "$w" ]] || continue
    [[ -n "${BUDGET[$w]:-}" ]] || { echo "run_on_gpu.sh: --only: unknown stage '$w' (stages: ${STAGES[*]})" >&2; exit 2; }
  done
  for s in "${STAGES[@]}"; do [[ ",$ONLY," == *",$s,"* ]] && SELECTED+=("$s"); done
else
  SELECTED=("${STAGES[@]}")
fi
is_selected() { [[ " ${SELECTED[*]} " == *" $1 "* ]]; }
TOTAL=0
for s in "${SELECTED[@]}"; do TOTAL=$((TOTAL + BUDGET[$s])); done

if ((LIST)); then
  for s in "${STAGES[@]}"; do printf '%-7s %4d s  %s\n' "$s" "${BUDGET[$s]}" "${WHAT[$s]}"; done
  all=0
  for s in "${STAGES[@]}"; do all=$((all + BUDGET[$s])); done
  printf '%-7s %4d s  (at most %d; rerun one: scripts/run_on_gpu.sh --only NAME)\n' total "$all" "$MAX_TOTAL"
  exit 0
fi

OUT="${OUT:-$ROOT/gpu-out}"
if ! mkdir -p "$OUT" 2>/dev/null || ! touch "$OUT/.writable" 2>/dev/null; then
  echo "FAILED: \$OUT=$OUT is not writable" >&2
  exit 1
fi
rm -f "$OUT/.writable"
OUT="$(cd "$OUT" && pwd)"
exec > >(tee -a "$OUT/run.log") 2>&1
TEE_PID=$!
STATE="$(mktemp -d "${TMPDIR:-/tmp}/fm-gpu-state.XXXXXX")" || exit 1
UNPACK=""
cleanup() {
  rm -rf "$STATE"
  [[ -n "$UNPACK" ]] && rm -rf "$UNPACK"
}
trap cleanup EXIT
T0=$SECONDS
now() { date +%s.%N; }
log() { echo "== [$((SECONDS - T0)) s] $*"; }
# q ARG: ARG as a shell word (unquoted when safe), for commands that are printed and eval'ed.
q() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
qcmd() {
  local s="" a
  for a in "$@"; do s+="${s:+ }$(q "$a")"; done
  printf '%s' "$s"
}
put() { mkdir -p "$(dirname "$1")" && printf '%s' "$2" >"$1"; }

mkdir -p "$STATE/meta" "$STATE/xml"
printf '%s\n' "${STAGES[@]}" >"$STATE/stages"
put "$STATE/meta/mode" "$( ((DRY)) && echo dry-run || echo run)"
put "$STATE/meta/started" "$(date -u +%FT%TZ)"
put "$STATE/meta/total_budget" "$TOTAL"
put "$STATE/meta/max_total" "$MAX_TOTAL"
put "$STATE/meta/commit" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
put "$STATE/meta/gtest_filter" "${FLASHMAP_GTEST_FILTER:-}"
put "$STATE/meta/sanitize" "${FLASHMAP_SANITIZE:-0}"
put "$STATE/meta/cuda_draft" "${FLASHMAP_CUDA_DRAFT:-batched}"
put "$STATE/meta/t0" "$(now)"

log "$(date -u +%FT%TZ) flashmap CUDA device check$( ((DRY)) && echo ' (dry run: no device code runs)'), commit $(cat "$STATE/meta/commit"), stages: ${SELECTED[*]}"
export PATH="$PATH:/usr/local/cuda/bin"

# --- the binaries ---------------------------------------------------------------------------------
BIN="" BIN_ERR="" BIN_SOURCE="" FALLBACK=""
# link_bins DIR: $STATE/bin with links to DIR/flashmap and DIR/tests/cuda/test_* (a build folder).
link_bins() {
  local d="$1" t
  mkdir -p "$STATE/bin"
  [[ -x "$d/flashmap" ]] && ln -sf "$(cd "$d" && pwd)/flashmap" "$STATE/bin/flashmap"
  for t in "$d"/tests/cuda/test_*; do
    [[ -f "$t" && -x "$t" && "$(basename "$t")" =~ ^test_[A-Za-z0-9_]+$ ]] &&
      ln -sf "$(cd "$(dirname "$t")" && pwd)/$(basename "$t")" "$STATE/bin/"
  done
  BIN="$STATE/bin"
}
build_on_device() {
  local b=build-cuda targets=(flashmap) src
  for src in tests/cuda/test_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
  log "no bundle, FLASHMAP_GPU_BIN or built binaries: building in $b (log: build.log; bring a bundle from scripts/make_gpu_bundle.sh instead)"
  timeout -k 5 120 cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DFLASHMAP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHMAP_NATIVE=OFF -DFLASHMAP_BUILD_BENCH=OFF >"$OUT/build.log" 2>&1 || {
    tail -20 "$OUT/build.log"
    BIN_ERR="configuring $b on the device failed (see build.log; bring build-gpu/gpu-bundle.tar.gz from scripts/make_gpu_bundle.sh)"
    return 1
  }
  timeout -k 5 "${FLASHMAP_GPU_BUILD_LIMIT:-300}" cmake --build "$b" -j"$(nproc)" --target "${targets[@]}" >>"$OUT/build.log" 2>&1 || {
    grep -E "error|Error" "$OUT/build.log" | head -30
    BIN_ERR="building in $b on the device failed (see build.log)"
    return 1
  }
  link_bins "$b"
  BIN_SOURCE="built on the device in $b"
}
BUNDLE="${FLASHMAP_GPU_BUNDLE:-$ROOT/${FLASHMAP_GPU_BUILD:-build-gpu}/gpu-bundle.tar.gz}"
BUILD_DIR="${FLASHMAP_GPU_BUILD:-build-gpu}"
if [[ -n "$PAYLOAD" ]]; then
  if [[ ! -f "$PAYLOAD/bundle.tar.xz" ]]; then
    BIN_ERR="--payload $PAYLOAD has no bundle.tar.xz (scripts/make_gpu_bundle.sh makes it)"
    BUNDLE=""
  else
    BUNDLE="$PAYLOAD/bundle.tar.xz"
  fi
  # The payload's files where the checkout lacks them (never over a file that is there).
  if [[ -d "$PAYLOAD/files" ]]; then
    while IFS= read -r -d '' f; do
      rel="${f#"$PAYLOAD/files/"}"
      if [[ ! -e "$rel" ]]; then
        mkdir -p "$(dirname "$rel")" && cp "$f" "$rel" && echo "from the payload: $rel"
      fi
    done < <(find "$PAYLOAD/files" -type f -print0)
  fi
fi
# unpack_bundle FILE DIR: a .tar.gz, or a .tar.xz through Python's lzma (xz may not be installed).
unpack_bundle() {
  if [[ "$1" == *.xz ]]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1" |
      tar -C "$2" -xf -
  else
    tar -C "$2" -xzf "$1"
  fi
}
if [[ -n "$BUNDLE" && -f "$BUNDLE" ]]; then
  UNPACK="$(mktemp -d "${TMPDIR:-/tmp}/fm-bundle.XXXXXX")"
  if unpack_bundle "$BUNDLE" "$UNPACK" && [[ -d "$UNPACK/bundle/bin" ]]; then
    BIN="$UNPACK/bundle/bin"
    FALLBACK="$UNPACK/bundle/lib-fallback"
    export LD_LIBRARY_PATH="$UNPACK/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    put "$STATE/meta/bundle_commit" "$(head -1 "$UNPACK/bundle/COMMIT" 2>/dev/null)"
    BIN_SOURCE="bundle $BUNDLE, built from $(head -1 "$UNPACK/bundle/COMMIT" 2>/dev/null || echo '?')"
    if [[ $(wc -l <"$UNPACK/bundle/COMMIT" 2>/dev/null || echo 0) -gt 1 ]]; then
      echo "the bundle was built with uncommitted changes:"
      sed -n '2,21p' "$UNPACK/bundle/COMMIT"
    fi
    here="$(cat "$STATE/meta/commit")" built="$(head -1 "$UNPACK/bundle/COMMIT" 2>/dev/null)"
    if [[ "$here" != unknown && -n "$built" && "$built" != "$here" ]]; then
      echo "WARNING: the bundle was built from $built, this tree is at $here: rebuild it (scripts/make_gpu_bundle.sh)"
    fi
  else
    BIN_ERR="cannot unpack $BUNDLE"
  fi
elif [[ -n "$PAYLOAD" ]]; then
  :  # BIN_ERR says why
elif [[ -n "${FLASHMAP_GPU_BIN:-}" ]]; then
  if [[ -d "$FLASHMAP_GPU_BIN" ]]; then
    BIN="$(cd "$FLASHMAP_GPU_BIN" && pwd)"
    BIN_SOURCE="FLASHMAP_GPU_BIN=$BIN"
  else
    BIN_ERR="FLASHMAP_GPU_BIN=$FLASHMAP_GPU_BIN is not a folder"
  fi
elif [[ -x "$BUILD_DIR/flashmap" ]]; then
  link_bins "$BUILD_DIR"
  BIN_SOURCE="the build folder $BUILD_DIR"
elif ((DRY)); then
  BIN_ERR="no binaries: no bundle $BUNDLE, no FLASHMAP_GPU_BIN, no $BUILD_DIR/flashmap (run scripts/make_gpu_bundle.sh)"
else
  build_on_device
fi
put "$STATE/meta/binaries" "${BIN_SOURCE:-none: $BIN_ERR}"
[[ -n "$BIN_SOURCE" ]] && log "binaries: $BIN_SOURCE"

if [[ -n "$BIN" && -x "$BIN/flashmap" ]]; then
  # cuBLASLt / cudart of the device's toolkit: on the loader path, or found where CUDA or pip put it.
  if ldd "$BIN/flashmap" 2>/dev/null | grep -q "not found"; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
      $(find /usr /opt -name 'libcublasLt.so.13' -printf '%h\n' 2>/dev/null | head -3); do
      [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
    done
    export LD_LIBRARY_PATH
  fi
  # The bundle's libstdc++/libgcc_s only if the device's are too old for the binaries.
  if [[ -d "$FALLBACK" ]] && ! "$BIN/flashmap" --help >/dev/null 2>&1; then
    echo "using the bundle's libstdc++/libgcc_s (lib-fallback)"
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$FALLBACK"
  fi
  ldd "$BIN/flashmap" 2>/dev/null | grep -E "not found|cudart|cublas" | sed 's/^\s*/  /'
fi
# A bundle must hold every library its binaries load but glibc's, CUDA's and libstdc++/libgcc_s
# (those the device has): one resolved from elsewhere here would be missing on the GPU machine.
GLOBAL_FAIL=()
if [[ -n "$UNPACK" && -n "$BIN" ]]; then
  while read -r name path; do
    case "$name" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so* | \
        libcudart.so* | libcublas* | libnvidia* | libstdc++.so* | libgcc_s.so*) ;;
      *) [[ "$path" == "$UNPACK/bundle/lib/"* ]] || GLOBAL_FAIL+=("the bundle lacks $name (loaded from $path here; rebuild it with scripts/make_gpu_bundle.sh)") ;;
    esac
  done < <(for b in "$BIN"/*; do ldd "$b" 2>/dev/null; done | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u)
  for m in "${GLOBAL_FAIL[@]}"; do echo "WARNING: $m"; done
fi

# --- the plan: every stage's commands, and what they need ------------------------------------------
declare -A S_REASON S_NOTE S_NPARTS
P_STAGE=() P_SHARE=() P_CMD=() P_LABEL=() P_KIND=() P_WHEN=()
declare -A STARTS
WRAP=()
reason() {  # reason STAGE TEXT: something the stage needs is missing (one line per item)
  [[ $'\n'"${S_REASON[$1]:-}"$'\n' == *$'\n'"$2"$'\n'* ]] && return
  S_REASON[$1]="${S_REASON[$1]:+${S_REASON[$1]}$'\n'}$2"
}
reasons_of() { printf '%s' "${S_REASON[$1]//$'\n'/; }"; }
add_part() {  # add_part STAGE SHARE KIND LABEL WHEN CMD_STRING
  local s=$1 i=${S_NPARTS[$1]:-0}
  P_STAGE+=("$s") P_SHARE+=("$2") P_KIND+=("$3") P_LABEL+=("$4") P_WHEN+=("$5") P_CMD+=("$6")
  local d="$STATE/s/$s/p/$i"
  put "$d/share" "$2"
  put "$d/kind" "$3"
  put "$d/label" "$4"
  put "$d/when" "$5"
  put "$d/cmd" "$6"
  S_NPARTS[$s]=$((i + 1))
}
# need_bin STAGE NAME: BIN/NAME exists and starts (--help, or --gtest_list_tests for a test).
need_bin() {
  local s=$1 n=$2
  if [[ -z "$BIN" ]]; then reason "$s" "$BIN_ERR"; return 1; fi
  if [[ ! -x "$BIN/$n" ]]; then reason "$s" "$n is not among the binaries ($BIN_SOURCE)"; return 1; fi
  if [[ -z "${STARTS[$n]:-}" ]]; then
    local arg=--help
    [[ "$n" == test_* ]] && arg=--gtest_list_tests
    if timeout -k 2 20 "$BIN/$n" "$arg" >"$STATE/start.$n" 2>&1; then STARTS[$n]=ok; else STARTS[$n]=fail; fi
  fi
  if [[ "${STARTS[$n]}" != ok ]]; then
    reason "$s" "$n does not start ($n --help/--gtest_list_tests: $(grep -m1 -v '^Running main' "$STATE/start.$n" | cut -c1-200))"
    return 1
  fi
}
need_model() {  # need_model STAGE DIR: a model folder with config.json and real (not LFS pointer) weights
  local s=$1 d=$2 w
  if [[ ! -f "$d/config.json" ]]; then reason "$s" "$d/config.json is missing"; return 1; fi
  w=$(find "$d" -maxdepth 1 -name '*.safetensors' -size +1k | head -1)
  [[ -n "$w" ]] || { reason "$s" "$d has no weights (*.safetensors over 1 KiB; a Git LFS pointer?)"; return 1; }
}
need_file() { [[ -f "$2" ]] || { reason "$1" "$2 is missing"; return 1; }; }
# need_flags STAGE WHAT HELPFILE FLAG...: every FLAG appears in the --help text of WHAT.
need_flags() {
  local s=$1 what=$2 help=$3 f
  shift 3
  for f in "$@"; do
    grep -qE -- "(^|[ ,\[])$f([] =,]|$)" "$help" || reason "$s" "$what --help has no $f"
  done
}
GTEST_PARTS=0
gtest_part() {  # gtest_part STAGE NAME SHARE
  local s=$1 n=$2 share=$3 listed
  need_bin "$s" "$n" || return
  listed=$(timeout -k 2 20 "$BIN/$n" --gtest_list_tests ${FLASHMAP_GTEST_FILTER:+"--gtest_filter=$FLASHMAP_GTEST_FILTER"} 2>/dev/null | grep -c '^  ')
  if ((listed == 0)); then
    if [[ -n "${FLASHMAP_GTEST_FILTER:-}" ]]; then
      S_NOTE[$s]="${S_NOTE[$s]:+${S_NOTE[$s]}; }FLASHMAP_GTEST_FILTER matches no test of $n"
    else
      reason "$s" "$n lists no tests"
    fi
    return
  fi
  add_part "$s" "$share" gtest "$n" always \
    "$(qcmd "${WRAP[@]}" "$BIN/$n" --gtest_color=no "--gtest_output=xml:$OUT/xml/$n.xml" ${FLASHMAP_GTEST_FILTER:+"--gtest_filter=$FLASHMAP_GTEST_FILTER"})"
  put "$STATE/s/$s/p/$((S_NPARTS[$s] - 1))/listed" "$listed"
  GTEST_PARTS=$((GTEST_PARTS + 1))
}

for t in timeout tar python3; do
  command -v "$t" >/dev/null || { echo "FAILED: $t is not installed"; exit 1; }
done
if [[ "${FLASHMAP_SANITIZE:-0}" == 1 ]]; then
  CS=$(command -v compute-sanitizer)
  for c in /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda/bin/compute-sanitizer; do
    [[ -z "$CS" && -x "$c" ]] && CS=$c
  done
  if [[ -n "$CS" ]]; then
    WRAP=("$CS" --tool memcheck --error-exitcode 99)
  else
    for s in ops models engine; do reason "$s" "FLASHMAP_SANITIZE=1 but compute-sanitizer is not installed"; done
  fi
fi
FIXTURES=()
for f in tiny-a tiny-b tiny-c; do FIXTURES+=("tests/fixtures/$f/target" "tests/fixtures/$f/draft"); done
# Tests that no stage names go to the engine stage (20 s share each), so every tests/cuda test runs.
NAMED=" test_cuda_ops test_cuda_controls test_cuda_qwen3 test_cuda_paged test_cuda_flashmap test_cuda_sampling test_cuda_engine "
EXTRA=()
for src in tests/cuda/test_*.cpp; do
  n=$(basename "$src" .cpp)
  [[ "$NAMED" == *" $n "* ]] || EXTRA+=("$n")
done
((${#EXTRA[@]})) && echo "WARNING: tests/cuda tests in no stage, run in the engine stage: ${EXTRA[*]}"

for s in "${SELECTED[@]}"; do
  case "$s" in
    device)
      add_part device 9 plain nvidia-smi always \
        "nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.max.sm,clocks.max.mem --format=csv"
      add_part device 3 plain "nvidia-smi -L" always "nvidia-smi -L"
      if need_bin device flashmap; then
        # One simple command per part: each is exec'ed under its timeout.
        add_part device 3 plain "flashmap starts" always "$(qcmd "$BIN/flashmap" --version)"
      fi
      ;;
    ops)
      gtest_part ops test_cuda_ops 52
      gtest_part ops test_cuda_controls 18
      ;;
    models)
      for d in "${FIXTURES[@]}" tests/fixtures/tiny-a/target_bf16 models/default/target models/default/draft; do
        need_model models "$d"
      done
      for f in tiny-a tiny-b tiny-c; do need_file models "tests/fixtures/$f/expected.safetensors"; done
      gtest_part models test_cuda_qwen3 40
      gtest_part models test_cuda_paged 40
      gtest_part models test_cuda_flashmap 30
      ;;
    engine)
      for d in "${FIXTURES[@]}" tests/fixtures/dflash/zlab models/default/target models/default/dflash; do
        need_model engine "$d"
      done
      gtest_part engine test_cuda_sampling 30
      gtest_part engine test_cuda_engine 60
      for n in "${EXTRA[@]}"; do gtest_part engine "$n" 20; done
      ;;
    bench)
      if need_bin bench flashmap; then
        timeout -k 2 20 "$BIN/flashmap" bench --help >"$STATE/bench.help" 2>&1 || reason bench "flashmap bench --help fails"
        need_flags bench "flashmap bench" "$STATE/bench.help" --device --shape --context --block --reps --json
        add_part bench 15 plain "bench tiny" always \
          "$(qcmd "$BIN/flashmap" bench --device cuda --shape tiny --context 64 --block 4 --reps 1)"
        add_part bench 85 plain "bench qwen3-8b" always \
          "$(qcmd "$BIN/flashmap" bench --device cuda --shape qwen3-8b --json "$OUT/bench_cuda.json")"
      fi
      ;;
    serve)
      need_model serve models/default/target
      need_model serve models/default/draft
      if need_file serve bench/bench_server.py; then
        if timeout -k 2 20 python3 bench/bench_server.py --help >"$STATE/bs.help" 2>&1; then
          need_flags serve bench/bench_server.py "$STATE/bs.help" --flashmap --fixture --serve-args \
            --concurrency --requests --max-tokens --timeout --json
        else
          reason serve "python3 bench/bench_server.py --help fails: $(tail -1 "$STATE/bs.help")"
        fi
      fi
      if need_bin serve flashmap; then
        timeout -k 2 20 "$BIN/flashmap" serve --help >"$STATE/serve.help" 2>&1 || reason serve "flashmap serve --help fails"
        need_flags serve "flashmap serve" "$STATE/serve.help" --target --draft --port --device --max-running
        # The per-level JSON lines go to serve.jsonl as they come (-u), so a killed run keeps the
        # finished levels; the server's own log is read by bench_server.py, hence the short
        # stand-alone start below when it fails.
        add_part serve 73 plain bench_server always \
          "$(qcmd python3 -u bench/bench_server.py --flashmap "$BIN/flashmap" --fixture models/default \
            --serve-args "$SERVE_ARGS" --concurrency "$SERVE_LEVELS" --requests "$SERVE_REQUESTS" \
            --max-tokens "$SERVE_MAX_TOKENS" --timeout 30 --json) >$(q "$OUT/serve.jsonl")"
        # shellcheck disable=SC2086  # SERVE_ARGS is a list of words
        add_part serve 12 diag "serve start (log, on failure)" onfail \
          "$(qcmd "$BIN/flashmap" serve --target models/default/target --draft models/default/draft --port 0 $SERVE_ARGS)"
        IFS=',' read -r -a lv <<<"$SERVE_LEVELS"
        put "$STATE/s/serve/expected_lines" "$((2 * ${#lv[@]}))"
      fi
      ;;
  esac
done
if [[ -n "${FLASHMAP_GTEST_FILTER:-}" ]] && ((GTEST_PARTS == 0)); then
  sel_gtest=0
  for s in ops models engine; do is_selected "$s" && sel_gtest=1; done
  if ((sel_gtest)); then
    for s in ops models engine; do
      is_selected "$s" && reason "$s" "FLASHMAP_GTEST_FILTER='$FLASHMAP_GTEST_FILTER' matches no test of any binary"
    done
  fi
fi
for s in "${STAGES[@]}"; do
  d="$STATE/s/$s"
  mkdir -p "$d"
  put "$d/budget" "${BUDGET[$s]}"
  if ! is_selected "$s"; then
    put "$d/status" skipped
    put "$d/reason" "not selected (--only $ONLY)"
  elif [[ -n "${S_REASON[$s]:-}" ]]; then
    put "$d/status" failed
    put "$d/reason" "$(reasons_of "$s")"
  elif ((${S_NPARTS[$s]:-0} == 0)); then
    put "$d/status" skipped
    put "$d/reason" "${S_NOTE[$s]:-nothing to run}"
  else
    put "$d/status" "$( ((DRY)) && echo planned || echo pending)"
    [[ -n "${S_NOTE[$s]:-}" ]] && put "$d/note" "${S_NOTE[$s]}"
  fi
done

# --- summary.json: written from $STATE by python3 (standard library only) --------------------------
summarize() {  # summarize [complete]
  put "$STATE/meta/complete" "${1:-}"
  put "$STATE/meta/t_now" "$(now)"
  python3 - "$STATE" "$OUT" <<'PY' || echo "WARNING: summary.json not written"
import json, math, os, re, socket, sys
import xml.etree.ElementTree as ET

state, out = sys.argv[1], sys.argv[2]


def rd(path, default=None):
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def num(s):
    try:
        return float(str(s).rstrip("s")) if s not in (None, "") else None
    except ValueError:
        return None


def integer(s):
    try:
        return int(s)
    except (TypeError, ValueError):
        return None


def clean(x):  # strict JSON: NaN / inf (bench_server's drafted_share, ...) become null
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x


def one_line(s):
    return " ".join((s or "").split())


def meta(k, default=None):
    return rd(f"{state}/meta/{k}", default)


def tail(path, n=15):
    text = rd(path, "") or ""
    return [line[:300] for line in text.splitlines()[-n:]]


mode = meta("mode")
stages = (rd(f"{state}/stages", "") or "").split()


def parts_of(name):
    base = f"{state}/s/{name}/p"
    res = []
    if os.path.isdir(base):
        for i in sorted(os.listdir(base), key=int):
            d = f"{base}/{i}"
            p = {k: rd(f"{d}/{k}") for k in
                 ("label", "kind", "cmd", "share", "limit", "rc", "seconds", "listed", "when")}
            p["out"] = f"{d}/out"
            res.append(p)
    return res


def gtest_figures(p):
    n = p["label"]
    xml = next((x for x in (f"{out}/xml/{n}.xml", f"{state}/xml/{n}.xml") if os.path.exists(x)), None)
    fig = {}
    if p.get("listed"):
        fig["tests_listed"] = integer(p["listed"])
    if p.get("rc") is None:
        return fig
    if xml:
        try:
            root = ET.parse(xml).getroot()
            tests = failures = skipped = 0
            failed, messages, skips = [], [], []
            for tc in root.iter("testcase"):
                if tc.get("status") == "notrun":
                    continue
                tests += 1
                full = f'{tc.get("classname")}.{tc.get("name")}'
                fl = tc.findall("failure")
                if fl:
                    failures += 1
                    failed.append(full)
                    if len(messages) < 5:
                        messages.append(full + ": " + one_line(fl[0].get("message"))[:500])
                elif tc.get("result") == "skipped" or tc.find("skipped") is not None:
                    skipped += 1
                    sk = tc.find("skipped")
                    if not skips and sk is not None:
                        skips.append(full + ": " + one_line(sk.get("message"))[:300])
                    elif len(skips) < 1:
                        skips.append(full)
            fig.update(tests=tests, failures=failures, skipped=skipped,
                       seconds=num(root.get("time")), failed=failed)
            if messages:
                fig["failure_messages"] = messages
            if skips:
                fig["first_skipped"] = skips[0]
            return fig
        except ET.ParseError as e:
            fig["xml"] = f"unreadable: {e}"
    else:
        fig["xml"] = "missing (the binary was killed or crashed)"
    text = rd(p["out"], "") or ""
    ran = re.findall(r"^\[ RUN      \] (\S+)", text, re.M)
    ok = re.findall(r"^\[       OK \] (\S+)", text, re.M)
    bad = list(dict.fromkeys(m for m in re.findall(r"^\[  FAILED  \] (\S+)", text, re.M) if "." in m))
    fig.update(passed_before_stop=len(ok), failed=bad)
    if ran and ran[-1] not in ok and ran[-1] not in bad:
        fig["last_started"] = ran[-1]
    return fig


def device_figures(parts):
    fig = {}
    for p in parts:
        text = rd(p["out"], "") or ""
        if p["label"] == "nvidia-smi" and p.get("rc") == "0":
            lines = [l for l in text.splitlines() if l.strip()]
            if len(lines) >= 2:
                keys = [k.strip() for k in lines[0].split(",")]
                gpus = [dict(zip(keys, (v.strip() for v in l.split(",")))) for l in lines[1:]]
                fig["gpus"] = gpus
                g = gpus[0]
                pick = lambda pre: next((v for k, v in g.items() if k.startswith(pre)), None)
                fig.update(gpu=pick("name"), memory_total=pick("memory.total"),
                           memory_used=pick("memory.used"), driver=pick("driver_version"),
                           clock_max_sm=pick("clocks.max.sm"), clock_max_mem=pick("clocks.max.mem"))
        elif p["label"] == "nvidia-smi -L" and p.get("rc") == "0":
            fig["devices"] = [l.strip() for l in text.splitlines() if l.strip()]
        elif p["label"] == "flashmap starts" and p.get("rc") is not None:
            fig["flashmap_starts"] = p["rc"] == "0"
            fig["flashmap_version"] = (text.splitlines() or [""])[0][:200]
    return fig


records, failed_names = [], []
for name in stages:
    d = f"{state}/s/{name}"
    status = rd(f"{d}/status", "skipped")
    reason = rd(f"{d}/reason")
    parts = parts_of(name)
    ran = [p for p in parts if p.get("rc") is not None]
    codes = [integer(p["rc"]) for p in ran if p["kind"] != "diag"]
    exit_code = next((c for c in codes if c != 0), 0 if codes else None)
    figures = {}
    if name == "device":
        figures = device_figures(parts)
    elif name in ("ops", "models", "engine") or any(p["kind"] == "gtest" for p in parts):
        per = {p["label"]: gtest_figures(p) for p in parts if p["kind"] == "gtest"}
        for k in ("tests", "failures", "skipped"):
            vals = [f[k] for f in per.values() if isinstance(f.get(k), int)]
            if vals:
                figures[k] = sum(vals)
        figures["binaries"] = per
        if mode == "run" and status == "passed":
            missing = [n for n, f in per.items() if "xml" in f]
            if missing:
                status, reason = "failed", "no gtest XML from " + ", ".join(missing)
            elif figures.get("skipped"):
                first = next((f["first_skipped"] for f in per.values() if f.get("first_skipped")), "")
                status = "failed"
                reason = f"{figures['skipped']} tests skipped on the GPU machine (no usable GPU?): {first}"
    elif name == "bench":
        bj = f"{out}/bench_cuda.json"
        if os.path.exists(bj):
            try:
                with open(bj) as f:
                    figures.update(json.load(f))
            except ValueError as e:
                figures["bench_json_error"] = str(e)
        for p in ran:
            if p["label"] == "bench tiny":
                figures["tiny_smoke_exit_code"] = integer(p["rc"])
        if mode == "run" and status == "passed" and "decode_ms" not in figures:
            status, reason = "failed", "bench_cuda.json has no decode_ms"
    elif name == "serve" and ran:
        levels, bad = [], 0
        for line in (rd(f"{out}/serve.jsonl", "") or "").splitlines():
            try:
                levels.append(json.loads(line))
            except ValueError:
                bad += 1
        errors = sum(int(l.get("errors", 0)) for l in levels if isinstance(l, dict))
        figures = {"levels": levels, "lines": len(levels), "errors": errors}
        if bad:
            figures["unparsed_lines"] = bad
        expected = integer(rd(f"{d}/expected_lines"))
        if mode == "run" and status == "passed":
            if errors:
                status, reason = "failed", f"{errors} requests failed"
            elif expected and len(levels) < expected:
                status, reason = "failed", f"{len(levels)} of {expected} result lines"
    if status == "timeout" and not reason and ran:
        late = []
        for p in ran:
            if p["rc"] in ("124", "137") and p["kind"] != "diag":
                t = f'{p["label"]} ran past its {p["limit"]} s limit'
                last = figures.get("binaries", {}).get(p["label"], {}).get("last_started")
                late.append(t + (f" (last test started: {last})" if last else ""))
        reason = "; ".join(late) or None
    if status in ("failed", "timeout") and not reason and ran:
        bad = []
        for p in ran:
            if p["rc"] == "0" or p["kind"] == "diag":
                continue
            f = figures.get("binaries", {}).get(p["label"], {})
            names = f.get("failed") or []
            bad.append(f'{p["label"]} exited {p["rc"]}' +
                       (f' ({len(names)} failed: {", ".join(names[:8])})' if names else ""))
        reason = "; ".join(bad) or None
    part_records = []
    for p in parts:
        r = {"label": p["label"], "command": p["cmd"], "share_s": integer(p["share"]),
             "limit_s": integer(p["limit"]), "exit_code": integer(p["rc"]),
             "seconds": num(p["seconds"])}
        if p["when"] == "onfail":
            r["runs"] = "only when the part before it failed"
        if p.get("rc") not in (None, "0") and p["kind"] != "diag":
            r["output_tail"] = tail(p["out"])
        elif p["kind"] == "diag" and p.get("rc") is not None:
            r["output_tail"] = tail(p["out"], 30)
        part_records.append(r)
    rec = {"name": name,
           "command": " ; ".join(("[on failure] " if p["when"] == "onfail" else "") + (p["cmd"] or "")
                                 for p in parts),
           "budget_s": integer(rd(f"{d}/budget")), "seconds": num(rd(f"{d}/seconds")),
           "status": status, "exit_code": exit_code, "figures": figures,
           "rerun": f"scripts/run_on_gpu.sh --only {name}"}
    if reason:
        rec["reason"] = reason
    note = rd(f"{d}/note")
    if note:
        rec["note"] = note
    rec["parts"] = part_records
    records.append(rec)
    with open(f"{d}/final", "w") as f:
        f.write(status)
    with open(f"{d}/final_reason", "w") as f:
        f.write(reason or "")
    if status in ("failed", "timeout"):
        failed_names.append(name)

t0, tn = num(meta("t0")), num(meta("t_now"))
summary = {
    "what": "flashmap CUDA device check (scripts/run_on_gpu.sh)",
    "mode": mode,
    "commit": meta("commit"),
    "bundle_commit": meta("bundle_commit"),
    "binaries": meta("binaries"),
    "host": socket.gethostname(),
    "started": meta("started"),
    "elapsed_s": round(tn - t0, 1) if t0 and tn else None,
    "complete": meta("complete") == "1",
    "total_budget_s": integer(meta("total_budget")),
    "max_total_s": integer(meta("max_total")),
    "gtest_filter": meta("gtest_filter") or None,
    "sanitize": meta("sanitize") == "1",
    "gpu": next((r["figures"].get("gpu") for r in records if r["name"] == "device"), None),
    "failed": failed_names,
    "stages": records,
}
tmp = f"{out}/.summary.json.tmp"
with open(tmp, "w") as f:
    json.dump(clean(summary), f, indent=2)
    f.write("\n")
os.replace(tmp, f"{out}/summary.json")
PY
}
pack_xml() {  # gtest XML: $OUT/xml -> $STATE/xml, all of it packed as $OUT/gtest-xml.tar.gz
  if compgen -G "$OUT/xml/*.xml" >/dev/null; then
    mv -f "$OUT"/xml/*.xml "$STATE/xml/"
  fi
  rmdir "$OUT/xml" 2>/dev/null
  if compgen -G "$STATE/xml/*.xml" >/dev/null; then
    tar -C "$STATE" -czf "$OUT/gtest-xml.tar.gz" xml
  fi
}
finish() {  # finish RC
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit "$1"
}

# --- print the plan --------------------------------------------------------------------------------
echo
echo "plan ($( ((DRY)) && echo 'dry run' || echo 'run'); binaries: ${BIN_SOURCE:-none}; results in $OUT):"
printf '  %-7s %6s  %s\n' stage budget "command (share of the stage's budget)"
for s in "${STAGES[@]}"; do
  st=$(cat "$STATE/s/$s/status")
  if [[ "$st" == skipped || "$st" == failed ]]; then
    printf '  %-7s %4d s  [%s: %s]\n' "$s" "${BUDGET[$s]}" "$st" "$(cat "$STATE/s/$s/reason")"
    continue
  fi
  first=1
  for i in "${!P_STAGE[@]}"; do
    [[ "${P_STAGE[$i]}" == "$s" ]] || continue
    extra=""
    [[ "${P_WHEN[$i]}" == onfail ]] && extra=" [only if the part before failed]"
    if ((first)); then
      printf '  %-7s %4d s  (%s s) %s%s\n' "$s" "${BUDGET[$s]}" "${P_SHARE[$i]}" "${P_CMD[$i]}" "$extra"
    else
      printf '  %-7s %6s  (%s s) %s%s\n' "" "" "${P_SHARE[$i]}" "${P_CMD[$i]}" "$extra"
    fi
    first=0
  done
  [[ -n "${S_NOTE[$s]:-}" ]] && printf '  %-7s %6s  note: %s\n' "" "" "${S_NOTE[$s]}"
done
printf '  %-7s %4d s  (at most %d; each stage under timeout -k 5 on top)\n' total "$TOTAL" "$MAX_TOTAL"
echo

if ((DRY)); then
  rc=0
  if ((TOTAL > MAX_TOTAL)); then
    echo "FAILED: the stages' budgets add up to $TOTAL s, over $MAX_TOTAL s"
    rc=1
  fi
  for m in "${GLOBAL_FAIL[@]}"; do
    echo "FAILED: $m"
    rc=1
  done
  # One line per missing piece, naming the stages that need it.
  declare -A WHO=()
  ITEMS=()
  for s in "${SELECTED[@]}"; do
    [[ -n "${S_REASON[$s]:-}" ]] || continue
    while IFS= read -r r; do
      [[ -n "${WHO[$r]:-}" ]] || ITEMS+=("$r")
      WHO[$r]="${WHO[$r]:+${WHO[$r]}, }$s"
    done <<<"${S_REASON[$s]}"
  done
  for r in "${ITEMS[@]}"; do
    [[ "${WHO[$r]}" == *,* ]] && w=stages || w=stage
    echo "FAILED ($w ${WHO[$r]}): $r"
    rc=1
  done
  summarize 1
  planned=0
  for s in "${SELECTED[@]}"; do [[ "$(cat "$STATE/s/$s/status")" == planned ]] && planned=$((planned + 1)); done
  ((rc == 0)) && echo "dry run OK: $planned of ${#SELECTED[@]} stages planned ($((${#SELECTED[@]} - planned)) skipped), $TOTAL s; summary: $OUT/summary.json"
  finish "$rc"
fi

# --- run ---------------------------------------------------------------------------------------------
((TOTAL > MAX_TOTAL)) && echo "WARNING: the budgets add up to $TOTAL s, over $MAX_TOTAL s: a rerun may not fit"
mkdir -p "$OUT/xml"
CURRENT=""
on_signal() {
  echo
  log "stopped by a signal during stage ${CURRENT:-?}"
  if [[ -f "$STATE/running.pid" ]]; then
    kill -TERM "$(cat "$STATE/running.pid")" 2>/dev/null
    sleep 1
  fi
  if [[ -n "$CURRENT" ]]; then
    put "$STATE/s/$CURRENT/status" timeout
    put "$STATE/s/$CURRENT/reason" "the run was stopped by a signal during this stage"
  fi
  pack_xml
  summarize
  finish 1
}
trap on_signal TERM INT HUP
summarize
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
for s in "${SELECTED[@]}"; do
  d="$STATE/s/$s"
  [[ "$(cat "$d/status")" == pending ]] || {
    log "stage $s: $(cat "$d/status") ($(cat "$d/reason"))"
    continue
  }
  CURRENT=$s
  put "$d/status" running
  summarize
  echo
  log "stage $s (budget ${BUDGET[$s]} s)"
  st0=$SECONDS
  t_start=$(now)
  # Shares of the parts after each one, scaled to the stage's budget.
  idx=()
  for i in "${!P_STAGE[@]}"; do [[ "${P_STAGE[$i]}" == "$s" ]] && idx+=("$i"); done
  nominal=0
  for i in "${idx[@]}"; do nominal=$((nominal + P_SHARE[i])); done
  status=passed prev_rc=0 k=0
  for j in "${!idx[@]}"; do
    i=${idx[$j]}
    pd="$d/p/$j"
    if [[ "${P_WHEN[$i]}" == onfail && $prev_rc == 0 ]]; then continue; fi
    later=0
    for jj in "${!idx[@]}"; do
      ((jj > j)) && later=$((later + P_SHARE[idx[jj]]))
    done
    limit=$((BUDGET[$s] - (SECONDS - st0) - later * BUDGET[$s] / nominal))
    # A diagnostic part gets its share at most (the server it starts runs until stopped).
    [[ "${P_KIND[$i]}" == diag ]] && ((limit > P_SHARE[i])) && limit=${P_SHARE[$i]}
    if ((limit < 3)); then
      log "$s / ${P_LABEL[$i]}: no time left in the stage's budget"
      put "$pd/rc" 124
      put "$pd/limit" 0
      status=timeout
      continue
    fi
    put "$pd/limit" "$limit"
    log "$s / ${P_LABEL[$i]} (limit $limit s): ${P_CMD[$i]}"
    p0=$(now)
    # In the background, so that a signal to this script is handled at once (on_signal stops the
    # part through its timeout, whose pid the subshell leaves before becoming it).
    { echo "$BASHPID" >"$STATE/running.pid"; eval "exec timeout -k 5 $limit ${P_CMD[$i]}"; } 2>&1 | tee "$pd/out" &
    wait $!
    rc=$?
    rm -f "$STATE/running.pid"
    put "$pd/rc" "$rc"
    put "$pd/seconds" "$(python3 -c "print(round($(now) - $p0, 2))")"
    [[ "${P_LABEL[$i]}" == bench_server && -f "$OUT/serve.jsonl" ]] && cat "$OUT/serve.jsonl"
    if [[ $rc == 124 || $rc == 137 ]]; then
      log "$s / ${P_LABEL[$i]}: TIMEOUT after $limit s"
      [[ "${P_KIND[$i]}" == diag ]] || status=timeout
    elif [[ $rc != 0 ]]; then
      log "$s / ${P_LABEL[$i]}: exit $rc"
      [[ "${P_KIND[$i]}" == diag || $status == timeout ]] || status=failed
    fi
    [[ "${P_KIND[$i]}" == diag ]] || prev_rc=$rc
    k=$((k + 1))
  done
  put "$d/seconds" "$(python3 -c "print(round($(now) - $t_start, 2))")"
  put "$d/status" "$status"
  pack_xml
  mkdir -p "$OUT/xml"
  summarize
  CURRENT=""
  log "stage $s: $(cat "$d/final" 2>/dev/null || echo "$status") ($((SECONDS - st0)) s of ${BUDGET[$s]} s)"
done
pack_xml
summarize 1
echo
failed=()
for s in "${SELECTED[@]}"; do
  st=$(cat "$STATE/s/$s/final" 2>/dev/null || cat "$STATE/s/$s/status")
  why=$(cut -c1-300 "$STATE/s/$s/final_reason" 2>/dev/null)
  [[ "$st" == failed || "$st" == timeout ]] && failed+=("$s ($st${why:+: $why})")
done
log "done; summary: $OUT/summary.json"
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  finish 1
fi
echo "ALL PASSED"
finish 0
