#!/usr/bin/env bash
# Builds here (a machine with the CUDA toolkit and the engine's build dependencies, no GPU needed)
# what scripts/run_on_gpu.sh runs on an H200, and packs it as $B/gpu-bundle.tar.gz: the
# flashmap binary, every tests/cuda test, and the shared libraries they need that a bare GPU
# image lacks (fmt, PCRE2, utf8proc, cpp-httplib, ...; CUDA's own libraries are on the
# device). The GPU image has nvcc and CMake but not GoogleTest/fmt/nlohmann-json/..., so building
# there is only the fallback; bringing this bundle also saves device minutes.
#
#   scripts/make_gpu_bundle.sh
#   scripts/run_on_gpu.sh   # on the GPU, with build-gpu/gpu-bundle.tar.gz copied into the checkout
#
# It also writes $B/payload, what a runner with a transfer cap carries beside a slim checkout
# (scripts/gpu_checkout.sh): bundle.tar.xz (the same bundle, xz-compressed: a third of the gzip's
# size) and files/ (repo paths the slim checkout lacks and a device stage reads: the default
# target as bf16, scripts/safetensors_bf16.py). `scripts/run_on_gpu.sh --payload $B/payload`
# uses both.
#
# B = ${FLASHMAP_GPU_BUILD:-build-gpu}. Without a configured build there, it is configured with
# -DFLASHMAP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHMAP_NATIVE=OFF -DFLASHMAP_BUILD_BENCH=OFF
# (Release): the CPU reference inside the tests must not use instructions of this machine's CPU
# that the GPU host's CPU may lack (-march=native would). The default build-gpu is (re)configured
# with those flags on every call (a no-op when they are already set); an existing build named by
# FLASHMAP_GPU_BUILD (CI: FLASHMAP_GPU_BUILD=build, its main build) is used as it is, with a warning
# when it has FLASHMAP_NATIVE=ON (fine for `run_on_gpu.sh --dry-run`, not for a real GPU run).
#
# Knobs: JOBS (default: nproc), FLASHMAP_BUILD_LOCK (a lock file shared by builds on this machine,
# default /tmp/fm-build.lock). Idempotent: a second call rebuilds nothing and repacks the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
B="${FLASHMAP_GPU_BUILD:-build-gpu}"
LOCK="${FLASHMAP_BUILD_LOCK:-/tmp/fm-build.lock}"
JOBS="${JOBS:-$(nproc)}"
export PATH="/usr/local/cuda/bin:$PATH"
locked() { nice -n 10 flock "$LOCK" "$@"; }
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$B/CMakeCache.txt" | head -1; }

if [[ -z "${FLASHMAP_GPU_BUILD:-}" || ! -f "$B/CMakeCache.txt" ]]; then
  echo "configuring $B (CUDA ON, sm_90a, FLASHMAP_NATIVE=OFF, Release)"
  locked cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DFLASHMAP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHMAP_NATIVE=OFF -DFLASHMAP_BUILD_BENCH=OFF >/dev/null
else
  echo "using the configured build $B as it is (not reconfigured)"
  if [[ "$(cache_value FLASHMAP_NATIVE)" =~ ^(ON|On|on|TRUE|True|true|1|YES|Yes|yes)$ ]]; then
    echo "WARNING: $B has FLASHMAP_NATIVE=ON (-march=native): its binaries may use instructions the" \
      "GPU host's CPU lacks. Fine for run_on_gpu.sh --dry-run; for a real GPU run build the default" \
      "build-gpu (FLASHMAP_NATIVE=OFF)." >&2
  fi
  if [[ -z "$(cache_value CMAKE_CUDA_COMPILER)" ]]; then
    echo "FAILED: $B was configured without CUDA (no CMAKE_CUDA_COMPILER in its cache)" >&2
    exit 1
  fi
  arch="$(cache_value CMAKE_CUDA_ARCHITECTURES)"
  if [[ -n "$arch" && "$arch" != *90* ]]; then
    echo "WARNING: $B has CMAKE_CUDA_ARCHITECTURES=$arch: no sm_90 code for an H200" >&2
  fi
fi

tests=()
for src in tests/cuda/test_*.cpp; do tests+=("$(basename "$src" .cpp)"); done
echo "building in $B (-j$JOBS): flashmap ${tests[*]}"
locked cmake --build "$B" -j"$JOBS" --target flashmap "${tests[@]}" >"$B/gpu_bundle_build.log" 2>&1 || {
  grep -E "error|Error" "$B/gpu_bundle_build.log" | head -30
  echo "FAILED: build (log: $B/gpu_bundle_build.log)" >&2
  exit 1
}

rm -rf "$B/bundle"
mkdir -p "$B/bundle/bin" "$B/bundle/lib" "$B/bundle/lib-fallback"
bins=("$B/flashmap")
for t in "${tests[@]}"; do bins+=("$B/tests/cuda/$t"); done
cp "${bins[@]}" "$B/bundle/bin/"
# Every shared library they load, except glibc's own (the device has a glibc) and CUDA's (the
# device's toolkit matches its driver). libstdc++/libgcc_s go to lib-fallback: run_on_gpu.sh uses
# them only if the device's own are too old for these binaries.
for b in "${bins[@]}"; do ldd "$b"; done | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so* | \
        libcudart.so* | libcublas* | libnvidia*) ;;
      libstdc++.so* | libgcc_s.so*) cp -L "$path" "$B/bundle/lib-fallback/$name" ;;
      *) cp -L "$path" "$B/bundle/lib/$name" ;;
    esac
  done
if ldd "${bins[@]}" | grep -q "not found"; then
  ldd "${bins[@]}" | grep "not found" | sort -u >&2
  echo "FAILED: a library the binaries need is not found here" >&2
  exit 1
fi
{
  git rev-parse --short HEAD 2>/dev/null || echo unknown
  git status --short -- src tests CMakeLists.txt 2>/dev/null || true
} >"$B/bundle/COMMIT"
# Fixed order, owner and times: the same files give the same archive.
tar -C "$B" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - bundle |
  gzip -n >"$B/gpu-bundle.tar.gz"
ls -la "$B/gpu-bundle.tar.gz"
rm -rf "$B/payload"
mkdir -p "$B/payload/files/models/default/target"
python3 - "$B/gpu-bundle.tar.gz" "$B/payload/bundle.tar.xz" <<'PY'
import gzip, lzma, shutil, sys
with gzip.open(sys.argv[1]) as src, lzma.open(sys.argv[2], "wb", preset=9) as dst:
    shutil.copyfileobj(src, dst)
PY
python3 scripts/safetensors_bf16.py models/default/target/model.safetensors \
  "$B/payload/files/models/default/target/model.safetensors"
du -sh "$B/payload"
size=$(stat -c %s "$B/gpu-bundle.tar.gz")
if ((size > 60 * 1024 * 1024)); then
  echo "WARNING: $B/gpu-bundle.tar.gz is $((size >> 20)) MiB; a copy to a remote runner holds 64 MiB in all" >&2
fi
echo "built from: $(head -1 "$B/bundle/COMMIT")$( (($(wc -l <"$B/bundle/COMMIT") > 1)) && echo ' (with uncommitted changes under src/ tests/)')"
echo "max glibc symbol version needed:"
for b in "${bins[@]}"; do objdump -T "$b" | grep -o 'GLIBC_[0-9.]*'; done | sort -uV | tail -1
