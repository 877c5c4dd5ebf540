#!/usr/bin/env bash
# with_input.sh FILE PYTHON_EXPR PATTERN CMD...: writes the string that the Python expression
# makes (inputs too large or too deep to commit, e.g. "'[' * 100000 + ']' * 100000") to FILE in a
# fresh temporary folder, then runs tests/cli/expect_error.sh PATTERN CMD, with @INPUT@ in CMD's
# arguments replaced by the file's path, @DIR@ by the folder's, and an @EMPTY@ argument by an
# empty one (CMake drops empty arguments). FILE "-" writes nothing.
set -u
here=$(cd "$(dirname "$0")" && pwd)
file=$1 expr=$2 pattern=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$file" != - ]; then
  mkdir -p "$(dirname "$tmp/$file")"
  python3 -c "import sys; sys.stdout.write($expr)" >"$tmp/$file" || exit 1
fi
args=()
for a in "$@"; do
  a=${a//@INPUT@/$tmp/$file}
  a=${a//@DIR@/$tmp}
  args+=("${a//@EMPTY@/}")
done
"$here/../cli/expect_error.sh" "$pattern" "${args[@]}"
