#!/usr/bin/env python3
"""Decoding beside a busy process: does the engine degrade gracefully when it shares its cores?

    python3 bench/shared_cores.py [--flashmap build/flashmap] [--busy N] [--reps 5]
                                  [--threads T] [--max-new-tokens 256]

Runs `flashmap generate --json` on the built-in pair (target alone, and speculative with the
FlashMap drafter), first on a quiet machine, then beside N busy processes (one spinning loop
each; default: one per core), and prints the tokens/s of each and the slowdown busy/quiet. An
engine whose threads hand their cores over well degrades about as the share of the cores it
keeps: with N busy processes on C cores, about (C + N) / C for both modes; a pool that waits on
a descheduled thread loses far more in the mode with more parallel loops per token.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spin(stop):
    x = 0
    while not stop.is_set():
        x += 1


def tokens_per_second(args, draft):
    cmd = [args.flashmap, "generate", "--json", "--max-new-tokens", str(args.max_new_tokens),
           "--temperature", "0", "--stop-ids", "none", "--threads", str(args.threads)]
    if not draft:
        cmd.append("--no-draft")
    runs = []
    for _ in range(args.reps):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        r = json.loads(out.stdout)
        runs.append(r["tokens_per_second"])
    return statistics.median(runs), runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashmap", default=os.path.join(ROOT, "build", "flashmap"))
    ap.add_argument("--busy", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    figures = {"cores": os.cpu_count(), "threads": args.threads, "busy": args.busy}
    for label, busy in (("quiet", 0), ("busy", args.busy)):
        stop = multiprocessing.Event()
        spinners = [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(busy)]
        for p in spinners:
            p.start()
        time.sleep(0.5)
        try:
            for mode, draft in (("target", False), ("speculative", True)):
                median, runs = tokens_per_second(args, draft)
                figures[f"{label}_{mode}"] = median
                figures[f"{label}_{mode}_worst"] = min(runs)
                print(f"{label:5s} {mode:11s} {median:8.1f} tok/s median, {min(runs):8.1f} worst "
                      f"(runs {', '.join(f'{r:.1f}' for r in runs)})")
        finally:
            stop.set()
            for p in spinners:
                p.join()
    for mode in ("target", "speculative"):
        figures[f"slowdown_{mode}"] = figures[f"quiet_{mode}"] / figures[f"busy_{mode}"]
    share = (figures["cores"] + args.busy) / figures["cores"]
    print(f"\nslowdown beside {args.busy} busy process(es) on {figures['cores']} cores "
          f"(fair share: {share:.2f}x): target alone {figures['slowdown_target']:.2f}x, "
          f"speculative {figures['slowdown_speculative']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
