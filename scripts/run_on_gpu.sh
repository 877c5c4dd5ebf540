#!/usr/bin/env bash
# The prepared device check of issue 6 for a session lent an H200 (15 minutes of device time in
# all, the machine's start included): every tests/cuda test (op parity, the Qwen3 target, sampling,
# the drafter, ...) and `flashmap bench --device cuda --shape qwen3-8b`, each under its own timeout
# so one hang cannot eat the budget. Everything lands in $OUT: run.log (the whole output),
# bench_cuda.json, gtest-xml.tar.gz (one gtest XML per test binary), build.log if it built there.
#
# Preferred (the GPU image has nvcc and CMake but not the engine's other build dependencies, and
# building there costs device minutes): build the bundle here first, then carry it:
#   scripts/make_gpu_bundle.sh
#   run(command="scripts/run_on_gpu.sh", carry=["build-gpu/gpu-bundle.tar.gz"], timeout_s=560)
# Without a carried bundle it configures and builds on the device (-DFLASHMAP_CUDA=ON
# -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release), which needs those dependencies.
#
# Knobs (environment): FLASHMAP_GPU_TESTS="test_cuda_ops test_cuda_qwen3" (default: all),
# FLASHMAP_GTEST_FILTER (passed to every test), FLASHMAP_GPU_BENCH=0 (skip the bench),
# FLASHMAP_SANITIZE=1 (tests under compute-sanitizer memcheck: much slower).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT="$PWD"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
T0=$SECONDS
FAILED=()

# step LIMIT NAME CMD...: runs CMD under `timeout`, logs time and exit status, records failures.
step() {
  local limit=$1 name=$2
  shift 2
  echo
  echo "== [$((SECONDS - T0)) s] $name (limit $limit s): $*"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  [[ $rc == 124 || $rc == 137 ]] && echo "== TIMEOUT after $limit s: $name"
  echo "== [$((SECONDS - T0)) s] $name: exit $rc"
  [[ $rc == 0 ]] || FAILED+=("$name (exit $rc)")
  return $rc
}

echo "== $(date -u +%FT%TZ) flashmap CUDA device check, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
export PATH="/usr/local/cuda/bin:$PATH"
nvcc --version 2>/dev/null | tail -1 || true

# --- the binaries: the carried bundle, or a build here -------------------------------------------
BUNDLE="$ROOT/build-gpu/gpu-bundle.tar.gz"
if [[ -f "$BUNDLE" ]]; then
  mkdir -p /tmp/fm-bundle
  tar -C /tmp/fm-bundle -xzf "$BUNDLE" || { echo "FAILED: cannot unpack $BUNDLE"; exit 1; }
  BIN=/tmp/fm-bundle/bundle/bin
  export LD_LIBRARY_PATH="/tmp/fm-bundle/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "using the carried bundle, built at: $(head -1 /tmp/fm-bundle/bundle/COMMIT)"
  sed -n '2,$p' /tmp/fm-bundle/bundle/COMMIT | head -20
else
  B=build-cuda
  echo "no bundle carried: building in $B"
  step 60 configure cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DFLASHMAP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHMAP_BUILD_BENCH=OFF >"$OUT/build.log" 2>&1 || {
    tail -30 "$OUT/build.log"
    echo "FAILED: configure (carry a bundle from scripts/make_gpu_bundle.sh instead)"
    exit 1
  }
  targets=(flashmap)
  for src in tests/cuda/test_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
  step 300 build cmake --build "$B" -j"$(nproc)" --target "${targets[@]}" >>"$OUT/build.log" 2>&1 || {
    grep -E "error|Error" "$OUT/build.log" | head -40
    echo "FAILED: build"
    exit 1
  }
  mkdir -p "$B/gpu-bin"
  cp "$B/flashmap" "$B"/tests/cuda/test_cuda_* "$B/gpu-bin/" 2>/dev/null
  rm -f "$B"/gpu-bin/*.cmake
  BIN="$ROOT/$B/gpu-bin"
fi

# cuBLASLt / cudart of the device's toolkit: on the loader path, or found where CUDA or pip put it.
if ldd "$BIN/flashmap" | grep -q "not found"; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    $(find /usr /opt -name 'libcublasLt.so.13' -printf '%h\n' 2>/dev/null | head -3); do
    [[ -d "$d" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
  done
  export LD_LIBRARY_PATH
fi
# The bundle's libstdc++ only if the device's is too old for the binaries.
if [[ -d /tmp/fm-bundle/bundle/lib-fallback ]] && ! "$BIN/flashmap" --help >/dev/null 2>&1; then
  echo "using the bundle's libstdc++/libgcc_s"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/tmp/fm-bundle/bundle/lib-fallback"
fi
ldd "$BIN/flashmap" | grep -E "not found|cudart|cublas" || true
"$BIN/flashmap" --help >/dev/null 2>&1 || { echo "FAILED: $BIN/flashmap does not start"; "$BIN/flashmap" --help; exit 1; }

# --- tests: the op harness first (every later test builds on those kernels) -----------------------
mkdir -p "$OUT/xml"
tests=()
if [[ -n "${FLASHMAP_GPU_TESTS:-}" ]]; then
  read -r -a tests <<<"$FLASHMAP_GPU_TESTS"
else
  [[ -x "$BIN/test_cuda_ops" ]] && tests+=(test_cuda_ops)
  [[ -x "$BIN/test_cuda_qwen3" ]] && tests+=(test_cuda_qwen3)
  for t in "$BIN"/test_cuda_*; do
    n=$(basename "$t")
    [[ " ${tests[*]} " == *" $n "* ]] || tests+=("$n")
  done
fi
wrap=()
[[ "${FLASHMAP_SANITIZE:-0}" == 1 ]] && wrap=(compute-sanitizer --tool memcheck --error-exitcode 99)
for t in "${tests[@]}"; do
  step 120 "$t" "${wrap[@]}" "$BIN/$t" --gtest_color=no --gtest_output="xml:$OUT/xml/$t.xml" \
    ${FLASHMAP_GTEST_FILTER:+--gtest_filter="$FLASHMAP_GTEST_FILTER"}
done
grep -l "skipped=\"[1-9]" "$OUT"/xml/*.xml 2>/dev/null | sed 's/^/WARNING: tests skipped on the GPU machine: /'
tar -C "$OUT" -czf "$OUT/gtest-xml.tar.gz" xml && rm -rf "$OUT/xml"

# --- the benchmark: a tiny smoke run, then the Qwen3-8B shape --------------------------------------
if [[ "${FLASHMAP_GPU_BENCH:-1}" != 0 ]]; then
  step 60 "bench tiny" "$BIN/flashmap" bench --device cuda --shape tiny --context 64 --block 4 --reps 1
  step 240 "bench qwen3-8b" "$BIN/flashmap" bench --device cuda --shape qwen3-8b \
    --json "$OUT/bench_cuda.json"
fi

echo
echo "== [$((SECONDS - T0)) s] done"
if ((${#FAILED[@]})); then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "ALL PASSED"
