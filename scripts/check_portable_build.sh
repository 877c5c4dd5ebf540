#!/usr/bin/env bash
# A binary built for a generic x86-64-v3 CPU (AVX2 + FMA, no AVX-512) must run everywhere and
# still use the AVX-512 GEMM kernel where the CPU has it: builds the ops tests that way and runs
# them with each kernel the CPU allows (FLASHMAP_ISA caps the choice, as a CPU without AVX-512
# would), checking that the run-time choice is what the CPU supports.
#   scripts/check_portable_build.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-x86-64-v3}
[ "$(uname -m)" = x86_64 ] || { echo "not x86-64: nothing to check"; exit 0; }
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DFLASHMAP_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
  -DFLASHMAP_CUDA=OFF -DFLASHMAP_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target test_ops -j"$(nproc)"
# Outside the AVX-512 and AMX kernels' own object files, nothing may touch a zmm register (roofline.cpp's
# peak loops carry their own target attributes and run only where the CPU has the set). grep
# reads the whole listing: with -q it would stop early, and pipefail would then report objdump's
# SIGPIPE instead of the match.
has() { objdump -d --no-show-raw-insn "$1" | grep -c -- "$2" >/dev/null; }
bad=$(find "$dir/src" -name '*.o' ! -name 'gemm_avx512.cpp.o' ! -name 'gemm_avx512bf16.cpp.o' ! -name 'gemm_amx.cpp.o' ! -name 'roofline.cpp.o' | while read -r o; do
  has "$o" '%zmm' && echo "$o"; done || true)
if [ -n "$bad" ]; then
  echo "AVX-512 instructions outside gemm_avx512.cpp, gemm_avx512bf16.cpp and gemm_amx.cpp: $bad" >&2
  exit 1
fi
# int8 dot products (AVX-VNNI, AVX512-VNNI) only in the kernels built for them.
bad=$(find "$dir/src" -name '*.o' ! -name 'gemm_avx512.cpp.o' ! -name 'roofline.cpp.o' ! -path '*flashmap_gemm_avx2vnni.dir*' | while read -r o; do
  has "$o" vpdpbusd && echo "$o"; done || true)
if [ -n "$bad" ]; then
  echo "int8 dot products outside the VNNI kernels: $bad" >&2
  exit 1
fi
for isa in generic avx2 avx2-vnni avx512 avx512-vnni avx512-bf16 amx; do
  echo "== FLASHMAP_ISA=$isa"
  FLASHMAP_ISA=$isa "$dir/tests/ops/test_ops" --gtest_brief=1 --gtest_filter='Gemm.*:OpsVsReference.Linear*:Bf16Compute.*'
done
# A misspelt cap is reported and ignored, not a silent fall back to the scalar kernel.
out=$(FLASHMAP_ISA=avx-512 "$dir/tests/ops/test_ops" --gtest_brief=1 --gtest_filter='Gemm.Every*' 2>&1)
if ! grep -q "FLASHMAP_ISA=avx-512 is not one of" <<<"$out" || grep -q "(generic CPU)" <<<"$out"; then
  echo "a misspelt FLASHMAP_ISA was not reported, or capped the kernels:" >&2
  echo "$out" >&2
  exit 1
fi
echo "== misspelt FLASHMAP_ISA reported and ignored"
