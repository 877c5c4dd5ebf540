#!/usr/bin/env bash
# device_cuda.sh CMD...: `flashmap generate --device cuda[:N] ... --json` either decodes (a CUDA
# build on a machine with a usable GPU: exit status 0 and the JSON's "ids") or fails cleanly with
# exit status 1 and one clear line: no usable GPU (a CUDA build without a GPU, as in CI) or a
# binary built without CUDA. Anything else (a crash, another error) fails the test.
err_file=$(mktemp)
trap 'rm -f "$err_file"' EXIT
out=$("$@" 2>"$err_file")
rc=$?
err=$(cat "$err_file")
if [ "$rc" -eq 0 ]; then
  if grep -q '"ids"' <<<"$out"; then
    echo "ok (decoded on the GPU): $out"
    exit 0
  fi
  echo "exit status 0 without the JSON's ids: $out"
  exit 1
fi
if [ "$rc" -ne 1 ]; then
  echo "expected exit status 0 or 1, got $rc: $err"
  exit 1
fi
pattern="--device cuda(:[0-9]+)?: (no usable CUDA GPU on this machine|this flashmap binary was built without CUDA)"
if grep -qE -e "$pattern" <<<"$err"; then
  echo "ok: $err"
  exit 0
fi
echo "stderr is not the clear no-GPU error: $err"
exit 1
