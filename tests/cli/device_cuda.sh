#!/usr/bin/env bash
# device_cuda.sh WITH_CUDA CMD...: `flashmap generate --device cuda ... --json` (CMD) against what
# this machine and build should give, decided before CMD runs:
#   - WITH_CUDA is OFF (a binary built without the CUDA backend): exit status 1 and exactly the
#     one line saying so;
#   - a CUDA build on a machine with a GPU (`nvidia-smi -L` lists one; without nvidia-smi, a
#     /dev/nvidiaN device node): it must decode, exit status 0 and JSON ids on device "cuda" — a
#     GPU that flashmap cannot use (driver too old, out of memory) fails here instead of passing
#     as "no GPU";
#   - a CUDA build without a GPU (as in CI): exit status 1 and exactly the one line "no usable
#     CUDA GPU on this machine (<the runtime's reason>)".
# Anything else (a crash, another error, more output on stderr) fails the test.
with_cuda=$1
shift
err_file=$(mktemp)
trap 'rm -f "$err_file"' EXIT

if [ "$with_cuda" = ON ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU [0-9]')
    probe="nvidia-smi -L lists $gpus GPU(s)"
  else
    gpus=$(find /dev -maxdepth 1 -name 'nvidia[0-9]*' 2>/dev/null | wc -l)
    probe="no nvidia-smi; $gpus /dev/nvidiaN device node(s)"
  fi
  if [ "$gpus" -gt 0 ]; then
    expect=decode
  else
    expect=no_gpu
  fi
else
  expect=no_cuda
  probe="built without CUDA"
fi

out=$("$@" 2>"$err_file")
rc=$?
err=$(cat "$err_file")
lines=$(grep -c '' "$err_file")

case $expect in
  decode)
    if [ "$rc" -ne 0 ]; then
      echo "FAIL ($probe): expected a decode on the GPU, got exit status $rc: $err"
      exit 1
    fi
    if ! grep -qE '"ids":\[[0-9]+(,[0-9]+)*\]' <<<"$out" || ! grep -qF '"device":"cuda"' <<<"$out"; then
      echo "FAIL ($probe): exit status 0 without JSON ids decoded on device cuda: $out"
      exit 1
    fi
    echo "ok ($probe): decoded on the GPU: $out"
    exit 0
    ;;
  no_gpu)
    pattern='^flashmap: error: --device cuda: no usable CUDA GPU on this machine \(.+\)$'
    ;;
  no_cuda)
    pattern='^flashmap: error: --device cuda: this flashmap binary was built without CUDA \(configure with -DFLASHMAP_CUDA=ON on a machine with the CUDA toolkit\)$'
    ;;
esac
if [ "$rc" -ne 1 ]; then
  echo "FAIL ($probe): expected exit status 1 and the clear error, got $rc: stdout $out, stderr $err"
  exit 1
fi
if [ "$lines" -ne 1 ] || ! grep -qE -e "$pattern" <<<"$err"; then
  echo "FAIL ($probe): stderr is not the one line /$pattern/: $err"
  exit 1
fi
if [ -n "$out" ]; then
  echo "FAIL ($probe): the error also printed on stdout: $out"
  exit 1
fi
echo "ok ($probe): $err"
