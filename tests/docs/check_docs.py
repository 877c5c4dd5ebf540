#!/usr/bin/env python3
"""Keeps the documentation true to the code.

    python3 tests/docs/check_docs.py BUILD/flashmap

Over README.md, docs/*.md, bench/*.md and src/*/README.md:

* every option of a command synopsis (a code block whose first line is `flashmap <cmd> ...`)
  exists in `flashmap <cmd> --help`, and a value the synopsis shows as the default
  (`[--port 8000]`) is the default the help states, where it states one;
* every repository path quoted in backticks (`src/...`, `tests/...`, `docs/...`, `scripts/...`,
  `bench/...`, `tools/...`, `include/...`, `models/...`, `python/...`, `cmake/...`, `.ci/...`)
  exists (a glob must match something; `:line` and `#anchor` suffixes are ignored);
* every relative Markdown link points at a file that exists.

Exits non-zero listing every stale statement with its file and line.
"""

import glob
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PATH_ROOTS = ("src/", "tests/", "docs/", "scripts/", "bench/", "tools/", "include/", "models/",
              "python/", "cmake/", ".ci/")


def doc_files():
    files = ["README.md"]
    files += sorted(glob.glob("docs/*.md", root_dir=ROOT))
    files += sorted(glob.glob("bench/*.md", root_dir=ROOT))
    files += sorted(glob.glob("src/*/README.md", root_dir=ROOT))
    return [f for f in files if os.path.exists(os.path.join(ROOT, f))]


def help_of(flashmap, cmd, cache={}):
    if cmd not in cache:
        out = subprocess.run([flashmap, cmd, "--help"], capture_output=True, text=True, timeout=60)
        cache[cmd] = out.stdout + out.stderr
    return cache[cmd]


def option_help(text, flag):
    """The help entry of `flag` (its line and the indented lines after it)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.search(r"(^|[\s,])" + re.escape(flag) + r"(\b|$)", line.strip().split("  ")[0]):
            entry = [line]
            for more in lines[i + 1:]:
                if more.startswith("  ") and not more.strip().startswith("-"):
                    entry.append(more)
                else:
                    break
            return " ".join(entry)
    return None


def synopses(path):
    """(line number, command, text) of each code block that is a flashmap command synopsis."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    for m in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
        body = m.group(1)
        first = body.strip().splitlines()[0] if body.strip() else ""
        cm = re.match(r"flashmap (\w+) \[", first)
        if cm:
            yield text[:m.start()].count("\n") + 2, cm.group(1), body


def check_synopses(flashmap, problems):
    for path in doc_files():
        for line, cmd, body in synopses(path):
            text = help_of(flashmap, cmd)
            if "Usage" not in text:
                problems.append(f"{path}:{line}: `flashmap {cmd}` is not a command")
                continue
            for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", body))):
                entry = option_help(text, flag)
                if entry is None:
                    problems.append(f"{path}:{line}: `flashmap {cmd}` has no option {flag}")
                    continue
                # `[--flag VALUE]` with a literal VALUE: the default, where the help gives one.
                for value in re.findall(r"\[" + re.escape(flag) + r" ([\w.]+)\]", body):
                    if not re.fullmatch(r"[0-9.]+|[a-z][a-z0-9-]*", value) or value.isupper():
                        continue
                    stated = re.search(r"\(default:? ([\w.-]+)", entry)
                    if stated and stated.group(1).rstrip(".") != value:
                        problems.append(f"{path}:{line}: {flag} shows {value} as its default, "
                                        f"`flashmap {cmd} --help` says {stated.group(1)}")


def check_paths(problems):
    for path in doc_files():
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        base = os.path.dirname(os.path.join(ROOT, path))
        for n, line in enumerate(text.splitlines(), 1):
            for quoted in re.findall(r"`([^`\s]+)`", line):
                p = re.split(r"[:#]", quoted)[0].rstrip(".,;)")
                if not p.startswith(PATH_ROOTS) or "..." in p or "<" in p or "{" in p:
                    continue
                # Placeholders (`context-L.jsonl`, `NAME.txt`) match any name; a benchmark or
                # tool binary (`bench/bench_constrain`) is named by its source.
                pattern = re.sub(r"(?<![A-Za-z])[A-Z]+(?=[.-])", "*", p)
                if not (glob.glob(os.path.join(ROOT, p)) or glob.glob(os.path.join(ROOT, pattern))
                        or glob.glob(os.path.join(ROOT, p) + ".*")):
                    problems.append(f"{path}:{n}: `{quoted}` names no file of this repository")
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                t = target.split("#")[0]
                if t and not os.path.exists(os.path.join(base, t)):
                    problems.append(f"{path}:{n}: link ({target}) points at nothing")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    flashmap = os.path.abspath(sys.argv[1])
    problems = []
    check_synopses(flashmap, problems)
    check_paths(problems)
    for p in problems:
        print(p)
    print(f"{len(doc_files())} documents checked: {len(problems)} stale statement(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
