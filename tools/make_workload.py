#!/usr/bin/env python3
"""Writes bench/workloads/repeat.jsonl: prompts that invite the model to repeat text it was
given, for `flashmap bench --prompt-file` (prompt-lookup drafting pays exactly there).

    apt-get install fortunes fortunes-min
    python3 tools/make_workload.py [--corpus /usr/share/games/fortunes] [--out bench/workloads/repeat.jsonl]

The passages are records from the held-out end (last 2%) of the corpus the default pair was
trained on (tools/train/README.md: the Debian fortunes files, BSD licence), so the model has not
memorised them. Two kinds, alternating:
  quote:   the passage, a blank line, then its first words again (a plain-text prompt: the
           model continues a quotation it has just read);
  rewrite: a chat message asking for the passage again with one change.
Standard library only; the output is a function of the corpus and --seed.

    python3 tools/make_workload.py --context L --flashmap build/flashmap [--out F]

writes instead 3 prompts of exactly L token ids each (default bench/workloads/context-L.jsonl),
cut at seeded offsets from the held-out records joined, tokenized by `flashmap tokenize` with the
default target's tokenizer: the long contexts `--draft-window` is measured on.
"""
import argparse
import json
import os
import random
import subprocess


def records(path):
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path)
        if os.path.isfile(os.path.join(path, f)) and not f.endswith((".dat", ".u8")))
    docs = []
    for f in files:
        with open(f, "rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        docs += [r.strip("\n%") + "\n" for r in text.split("\n%\n") if r.strip("\n%").strip()]
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--out", default="bench/workloads/repeat.jsonl")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--context", type=int, default=0, help="token ids per prompt (long contexts)")
    ap.add_argument("--flashmap", default="build/flashmap", help="for --context: the tokenizer")
    args = ap.parse_args()
    docs = records(args.corpus)
    held_out = docs[-max(len(docs) // 50, 1):]
    if args.context > 0:
        return write_context(args, held_out)
    # Passages of 25..80 words: long enough to quote, short enough for the default pair's context.
    passages = [d for d in held_out if 25 <= len(d.split()) <= 80]
    rng = random.Random(args.seed)
    picked = rng.sample(passages, min(args.prompts, len(passages)))
    with open(args.out, "w") as f:
        for i, p in enumerate(picked):
            if i % 2 == 0:
                head = " ".join(p.split()[:6])
                f.write(json.dumps({"prompt": p + "\n" + head}) + "\n")
            else:
                f.write(json.dumps({"chat": "Say this again, changing one word:\n\n" + p}) + "\n")
    print(f"{len(picked)} prompts from {len(held_out)} held-out records -> {args.out}")


def write_context(args, held_out):
    out = args.out if args.out != "bench/workloads/repeat.jsonl" else \
        f"bench/workloads/context-{args.context}.jsonl"
    text = "\n".join(held_out)[:200000]
    r = subprocess.run([args.flashmap, "tokenize", "--tokenizer", "models/default/target",
                        "--text", text], capture_output=True, text=True, check=True)
    ids = json.loads(r.stdout.strip().splitlines()[-1])
    rng = random.Random(args.seed)
    with open(out, "w") as f:
        for _ in range(3):
            s = rng.randrange(0, len(ids) - args.context)
            f.write(json.dumps({"prompt_ids": ids[s:s + args.context]}) + "\n")
    print(f"3 prompts of {args.context} ids from {len(ids)} held-out tokens -> {out}")


if __name__ == "__main__":
    main()
