#!/usr/bin/env python3
"""Per-call overhead of the Python binding (flashmap_engine) against the CLI on one pair.

    python3 -m pip install . && python3 bench/bench_python.py --flashmap build/flashmap

Each way of calling decodes the same random prompts greedily; a call's overhead is its wall time
minus the engine's own `timings_ms.total` (the round loop: prefill to the last token), so that the
figures do not depend on how fast this machine decodes at the moment:

* binding, generate(): argument conversion, releasing and taking the GIL, the process-wide
  lock, the numpy result; the engine is loaded once.
* binding, stream(): the same plus the worker thread and one hand-over per round.
* CLI, `flashmap generate --json`: process start, loading the pair, printing JSON (what a caller
  that runs the CLI per prompt pays).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np

import flashmap_engine as fe


def cpu_model():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown"
    return (f"{info.get('model name', 'unknown')} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')})")


def summary(walls, totals):
    over = [w - t for w, t in zip(walls, totals)]
    return {"wall_ms": statistics.median(walls), "engine_ms": statistics.median(totals),
            "overhead_ms": statistics.median(over), "overhead_min_ms": min(over)}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default=os.path.join(root, "models", "default"))
    ap.add_argument("--flashmap", default=os.path.join(root, "build", "flashmap"), help="the CLI")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()

    target, draft = os.path.join(args.pair, "target"), os.path.join(args.pair, "draft")
    t0 = time.perf_counter()
    engine = fe.Engine(target, draft, threads=args.threads)
    load_ms = 1000 * (time.perf_counter() - t0)
    threads = fe.cpu_threads()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, engine.vocab_size, size=16).tolist() for _ in range(args.prompts)]
    engine.generate(prompts[0], 8, stop_token_ids=[])  # warm-up

    rows = []
    for n in args.max_new_tokens:
        for way in ("binding generate()", "binding stream()", "CLI generate --json"):
            walls, totals = [], []
            for _ in range(args.reps):
                for p in prompts:
                    if way == "binding generate()":
                        t0 = time.perf_counter()
                        r = engine.generate(p, n, stop_token_ids=[])
                        walls.append(1000 * (time.perf_counter() - t0))
                        totals.append(r.timings_ms["total"])
                    elif way == "binding stream()":
                        t0 = time.perf_counter()
                        s = engine.stream(p, n, stop_token_ids=[])
                        for _chunk in s:
                            pass
                        walls.append(1000 * (time.perf_counter() - t0))
                        totals.append(s.result.timings_ms["total"])
                    else:
                        if not os.access(args.flashmap, os.X_OK):
                            break
                        cmd = [args.flashmap, "generate", "--target", target, "--draft", draft,
                               "--prompt-ids", ",".join(map(str, p)), "--max-new-tokens", str(n),
                               "--stop-ids", "none", "--temperature", "0", "--json",
                               "--threads", str(threads)]
                        t0 = time.perf_counter()
                        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                        walls.append(1000 * (time.perf_counter() - t0))
                        totals.append(json.loads(out.stdout)["timings_ms"]["total"])
            if walls:
                rows.append({"way": way, "max_new_tokens": n, "calls": len(walls),
                             **summary(walls, totals)})

    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; engine threads {threads}; "
          f"pair {args.pair}; Python {platform.python_version()}; binding load {load_ms:.0f} ms")
    print(f"{args.prompts} random 16-token prompts x {args.reps} reps, greedy, medians per call\n")
    print("| way | new tokens | calls | wall ms | engine ms | overhead ms (median / min) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['way']} | {r['max_new_tokens']} | {r['calls']} | {r['wall_ms']:.3f} | "
              f"{r['engine_ms']:.3f} | {r['overhead_ms']:.3f} / {r['overhead_min_ms']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "threads": threads, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
