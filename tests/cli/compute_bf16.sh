#!/usr/bin/env bash
# compute_bf16.sh CMD...: `flashmap generate --compute bf16 ... --json` (CMD) against what this
# CPU should give, decided before CMD runs from /proc/cpuinfo's flags:
#   - a CPU with avx512_bf16 (and FLASHMAP_ISA not capping below it): it must decode, exit status 0
#     and JSON ids;
#   - elsewhere: exit status 1 and exactly one line on stderr naming AVX512-BF16 and the way back
#     (--compute fp32).
# Anything else (a crash, another error, more output on stderr) fails the test.
err_file=$(mktemp)
trap 'rm -f "$err_file"' EXIT
if grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null &&
  { [ -z "${FLASHMAP_ISA:-}" ] || [ "$FLASHMAP_ISA" = avx512-bf16 ] || [ "$FLASHMAP_ISA" = amx ]; }; then
  expect=decode
else
  expect=refused
fi
out=$("$@" 2>"$err_file")
rc=$?
err=$(cat "$err_file")
lines=$(grep -c '' "$err_file")
if [ "$expect" = decode ]; then
  if [ "$rc" -ne 0 ] || ! grep -qE '"ids":\[[0-9]+(,[0-9]+)*\]' <<<"$out"; then
    echo "FAIL (avx512_bf16 CPU): expected a decode, got exit status $rc: $out $err"
    exit 1
  fi
  echo "ok (avx512_bf16 CPU): decoded: $out"
  exit 0
fi
pattern='^flashmap: error: --compute bf16 needs a CPU with AVX512-BF16 .*\(use --compute fp32\)$'
if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -qE -e "$pattern" <<<"$err"; then
  echo "FAIL (no avx512_bf16): expected exit status 1 and the one line /$pattern/, got $rc: $err"
  exit 1
fi
echo "ok (no avx512_bf16): $err"
