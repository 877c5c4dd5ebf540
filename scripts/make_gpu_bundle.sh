#!/usr/bin/env bash
# Builds here (a machine with the CUDA toolkit and the engine's build dependencies, no GPU needed)
# what scripts/run_on_gpu.sh runs on a lent H200, and packs it as build-gpu/gpu-bundle.tar.gz:
# the flashmap binary, every tests/cuda test, and the shared libraries they need that a bare GPU
# image lacks (fmt, PCRE2, utf8proc, OpenBLAS, cpp-httplib, ...; CUDA's own libraries are on the
# device). The GPU image has nvcc and CMake but not GoogleTest/fmt/nlohmann-json/..., so building
# there is only the fallback; carrying this bundle also saves device minutes.
#
#   scripts/make_gpu_bundle.sh
#   run(command="scripts/run_on_gpu.sh", carry=["build-gpu/gpu-bundle.tar.gz"], timeout_s=560)
#
# -DFLASHMAP_NATIVE=OFF: the CPU reference inside the tests must not use instructions of this
# machine's CPU that the GPU host's CPU may lack (-march=native would). Builds take the shared
# build lock and run at low priority, one target at a time (CPU is scarce on the dev machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
B="${FLASHMAP_GPU_BUILD:-build-gpu}"
LOCK="${FLASHMAP_BUILD_LOCK:-/tmp/fm-build.lock}"
JOBS="${JOBS:-2}"
export PATH="/usr/local/cuda/bin:$PATH"
locked() { nice -n 19 flock "$LOCK" "$@"; }

if [[ ! -f "$B/CMakeCache.txt" ]]; then
  locked cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DFLASHMAP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHMAP_NATIVE=OFF -DFLASHMAP_BUILD_BENCH=OFF >/dev/null
fi
tests=()
for src in tests/cuda/test_*.cpp; do tests+=("$(basename "$src" .cpp)"); done
for t in flashmap_lib flashmap_cuda flashmap "${tests[@]}"; do
  echo "building $t"
  locked cmake --build "$B" -j"$JOBS" --target "$t" >"$B/last_build.log" 2>&1 || {
    grep -E "error|Error" "$B/last_build.log" | head -30
    exit 1
  }
done

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
        libcudart.so* | libcublas*) ;;
      libstdc++.so* | libgcc_s.so*) cp -L "$path" "$B/bundle/lib-fallback/$name" ;;
      *) cp -L "$path" "$B/bundle/lib/$name" ;;
    esac
  done
git rev-parse --short HEAD >"$B/bundle/COMMIT" 2>/dev/null || true
git status --short -- src tests >>"$B/bundle/COMMIT" 2>/dev/null || true
tar -C "$B" -czf "$B/gpu-bundle.tar.gz" bundle
ls -la "$B/gpu-bundle.tar.gz"
echo "max glibc symbol version needed:"
for b in "${bins[@]}"; do objdump -T "$b" | grep -o 'GLIBC_[0-9.]*'; done | sort -uV | tail -1
