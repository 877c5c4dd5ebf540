#!/usr/bin/env python3
"""Acceptance length (tau) of the two sampled verifications, side by side on one pair.

    python3 bench/seeded_tau.py build/flashmap [--target T --draft D] [--temperatures 1,0.7]

Seeded requests (`--seed`) draw every token keyed by (seed, position) and keep a draft only when
it equals the target's keyed draw (src/specdec/sampling.h: sample_keyed), which makes their output
independent of batching and speculation; unseeded requests use rejection sampling, which accepts
a draft with probability min(1, p/q) and so keeps the most drafts any verification can. This
prints tau (tokens per verify pass, mean +- 95% CI over rounds) for both on the same prompts, and
the ratio: what reproducibility costs in acceptance. Default pair: models/default.
"""
import argparse
import json
import os
import subprocess
import sys

PROMPTS = [
    "The secret of a happy life is", "A man who", "Never trust", "If you can read this",
    "The best way to predict the future", "Love is", "Today is a good day to", "Why do",
    "Money can't buy", "There are two kinds of people:", "The only thing we have to fear",
    "In the beginning", "You will meet", "A fool and his money", "Every cloud", "When in doubt,",
    "It is better to", "The early bird", "Nothing is", "Don't", "Life is what happens",
    "All that glitters", "To be or not to be", "Experience is",
]


def tau_of(flashmap, target, draft, prompt, temperature, seed, n):
    cmd = [flashmap, "generate", "--target", target, "--draft", draft, "--prompt", prompt,
           "--json", "--max-new-tokens", str(n), "--stop-ids", "none",
           "--temperature", str(temperature)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return r["acceptance_lengths"]


def summary(xs):
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / max(len(xs) - 1, 1)) ** 0.5
    return m, 1.96 * sd / len(xs) ** 0.5


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("flashmap")
    ap.add_argument("--target", default=os.path.join(root, "models/default/target"))
    ap.add_argument("--draft", default=os.path.join(root, "models/default/draft"))
    ap.add_argument("--temperatures", default="1,0.7")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2, help="runs per prompt and mode")
    args = ap.parse_args()
    for t in [float(x) for x in args.temperatures.split(",")]:
        res = {}
        for mode in ("rejection", "keyed"):
            rounds = []
            for i, p in enumerate(PROMPTS):
                for r in range(args.repeats):
                    seed = 1000 * r + i if mode == "keyed" else None
                    rounds += tau_of(args.flashmap, args.target, args.draft, p, t, seed,
                                     args.max_new_tokens)
            res[mode] = summary(rounds) + (len(rounds),)
        (mr, cr, nr), (mk, ck, nk) = res["rejection"], res["keyed"]
        print(f"T={t}: rejection tau {mr:.3f} +- {cr:.3f} ({nr} rounds), "
              f"keyed tau {mk:.3f} +- {ck:.3f} ({nk} rounds), keyed/rejection {mk / mr:.3f}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
