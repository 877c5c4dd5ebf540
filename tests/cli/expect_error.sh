#!/usr/bin/env bash
# expect_error.sh PATTERN CMD...: CMD must exit non-zero and print PATTERN (a grep -E regex) on
# stderr, on one line, without crashing (exit status 1, not a signal).
pattern=$1
shift
err=$("$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -ne 1 ]; then
  echo "expected exit status 1, got $rc: $err"
  exit 1
fi
if ! grep -qE -e "$pattern" <<<"$err"; then
  echo "stderr does not match '$pattern': $err"
  exit 1
fi
echo "ok: $err"
