#!/usr/bin/env bash
# The checkout a remote GPU runner copies, kept under its transfer cap.
#
# A runner that copies this checkout's tracked files and its untracked, not-ignored ones (plus
# folders it is told to carry) to a GPU machine, with a cap on the bytes (64 MiB), cannot take the
# whole tree: the default pair's f32 target alone is 55 MB. The device check needs none of the
# large files below but that target, which scripts/make_gpu_bundle.sh puts in its payload as
# bf16 (the bits the GPU runs anyway: the device uploads every weight as bf16), with the binaries.
# So, around a device run:
#
#   scripts/make_gpu_bundle.sh             # build-gpu/payload: binaries + the bf16 default target
#   scripts/gpu_checkout.sh slim           # the large files leave the index (kept on disk, ignored)
#   <runner: carry build-gpu/payload>  scripts/run_on_gpu.sh --payload build-gpu/payload
#   scripts/gpu_checkout.sh restore        # back as they were
#
# Usage: scripts/gpu_checkout.sh slim|restore|status|check [PAYLOAD]
#   slim     untracks the files of SLIM below (git rm --cached) and ignores them in .git/info/exclude
#            (between marker lines); nothing on disk changes. While slim, `git status` shows them as
#            staged deletions: restore before committing.
#   restore  tracks them again and drops the marker lines (a no-op when not slim).
#   status   what the runner would copy from the slim checkout (whether slim now or not) plus
#            PAYLOAD (default build-gpu/payload), in bytes, against the cap.
#   check    status, failing over the budget; then copies exactly that set to a temporary folder
#            and runs scripts/run_on_gpu.sh --dry-run --payload there, so a file the device stages
#            need that the slim checkout or the payload lacks fails here, not on the GPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

# Large tracked files no device stage reads (tests/cuda, bench/bench_server.py, the flashmap
# binary on models/default and tests/fixtures), and the default target, which the payload brings.
# A name ending in / is a folder.
SLIM=(
  models/default/target/model.safetensors
  tests/data/qwen3-tokenizer/tokenizer.json
  tests/data/tokenizer_golden.jsonl
  tests/data/tokenizer_corpus.jsonl
  tests/data/utf8_cases.json
  tests/data/chat/jinja_cases.json
  tests/fuzz/corpus/
  tests/fixtures/gguf/
  tests/fixtures/quant/
  tests/fixtures/q8/
  tests/fixtures/llama_cpp/
)
CAP=$((64 << 20))
# What CI holds the transfer to: the cap less room for the tree to grow between device runs.
BUDGET=$((60 << 20))
BEGIN="# gpu_checkout.sh slim: begin"
END="# gpu_checkout.sh slim: end"
EXCLUDE="$(git rev-parse --git-path info/exclude)"

usage() { sed -n 's/^# Usage: //p' "$0"; }
die() { echo "gpu_checkout.sh: $*" >&2; exit 1; }
is_slim() { [[ -f "$EXCLUDE" ]] && grep -qxF "$BEGIN" "$EXCLUDE"; }

# The files a runner copies from the slim checkout, NUL-separated, relative to ROOT.
travel_files() {
  local f skip
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    skip=0
    for s in "${SLIM[@]}"; do [[ "$f" == "$s" || ("$s" == */ && "$f" == "$s"*) ]] && skip=1; done
    ((skip)) || { [[ -f "$f" ]] && printf '%s\0' "$f"; }
  done
}
bytes_of_files() { travel_files | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1; }
bytes_of_dir() { [[ -d "$1" ]] && du -sb "$1" | cut -f1 || echo 0; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

status() {
  local payload="$1" tree pay
  tree=$(bytes_of_files)
  pay=$(bytes_of_dir "$payload")
  echo "slim checkout: $(mib "$tree") ($(travel_files | tr -cd '\0' | wc -c) files); payload" \
    "$payload: $(mib "$pay")$([[ -d "$payload" ]] || echo ' (missing: scripts/make_gpu_bundle.sh)')"
  echo "together: $(mib $((tree + pay))) of the $(mib "$CAP") cap (budget $(mib "$BUDGET"));" \
    "the checkout is $(is_slim && echo slim now || echo whole now)"
  TOTAL=$((tree + pay))
}

cmd="${1:-}"
payload="${2:-build-gpu/payload}"
case "$cmd" in
  slim)
    is_slim && { echo "already slim"; exit 0; }
    for f in "${SLIM[@]}"; do
      git ls-files --error-unmatch -- "$f" >/dev/null 2>&1 || die "$f is not tracked: nothing to slim"
      git diff --cached --quiet -- "$f" || die "$f has staged changes: commit or unstage them first"
    done
    git rm -q -r --cached -- "${SLIM[@]}"
    mkdir -p "$(dirname "$EXCLUDE")"
    { echo "$BEGIN"; for f in "${SLIM[@]}"; do echo "/$f"; done; echo "$END"; } >>"$EXCLUDE"
    status "$payload"
    echo "slim: restore with scripts/gpu_checkout.sh restore before committing"
    ;;
  restore)
    is_slim || { echo "not slim: nothing to restore"; exit 0; }
    git reset -q -- "${SLIM[@]}"
    sed -i "/^$BEGIN\$/,/^$END\$/d" "$EXCLUDE"
    echo "restored: ${#SLIM[@]} files tracked again"
    ;;
  status)
    status "$payload"
    ;;
  check)
    status "$payload"
    ((TOTAL <= BUDGET)) || die "the device run would copy $(mib "$TOTAL"), over the $(mib "$BUDGET") budget: slim more (SLIM in this script) or shrink the payload"
    [[ -d "$payload" ]] || die "no payload at $payload (scripts/make_gpu_bundle.sh makes it)"
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/fm-travel.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    travel_files | tar --null -T - -cf - | tar -C "$tmp" -xf -
    mkdir -p "$tmp/$(dirname "$payload")"
    cp -r "$payload" "$tmp/$payload"
    echo "dry run in a copy of what travels ($tmp):"
    (cd "$tmp" && OUT="$tmp/.out" scripts/run_on_gpu.sh --dry-run --payload "$payload") ||
      die "the dry run fails on what a runner copies (see above)"
    ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
