#!/usr/bin/env python3
"""Multi-turn chat workload for `flashmap serve`, with and without the prefix cache.

    python3 bench/bench_prefix_cache.py --flashmap build/flashmap --target DIR [--draft DIR]

Each of --conversations conversations shares one system prompt (--system token ids) and runs
--turns turns: a turn's prompt is the previous turn's prompt + its output + a new user message
(--user ids), as a chat client resends its history. Conversations run one after another, turns
in order (streaming /v1/completions with token-id prompts, greedy, --max-tokens per turn). The
server is started twice, with `--prefix-cache-mb 0` and with the default cache, on the same
workload; reported per configuration: time to first token (mean, p50, p90) over turns, turn 1
vs later turns, total wall time, output tokens/s, and the server's prefix-cache counters. The
outputs of the two runs are compared token for token (the cache must not change them).
Standard library only.
"""

import argparse
import http.client
import json
import random
import re
import statistics
import subprocess
import threading
import time


def stream_turn(port, prompt, max_tokens):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft, ids, cached = None, [], 0
    for line in resp:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            cached = chunk["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        for c in chunk.get("choices", []):
            if c.get("token_ids"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                ids += c["token_ids"]
    conn.close()
    return ttft, ids, cached, time.perf_counter() - t0


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines()
            if l.startswith("flashmap_prefix_cache")}


def start(a, cache_mb):
    cmd = [a.flashmap, "serve", "--target", a.target, "--port", "0",
           "--prefix-cache-mb", str(cache_mb), *a.serve_args.split()]
    if a.draft:
        cmd += ["--draft", a.draft]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
            return proc, int(m.group(1))
    raise SystemExit("the server did not start")


def run(a, cache_mb):
    proc, port = start(a, cache_mb)
    try:
        rng = random.Random(a.seed)
        vocab = a.vocab
        system = [rng.randrange(vocab) for _ in range(a.system)]
        ttfts, first, later, outputs, tokens = [], [], [], [], 0
        t0 = time.perf_counter()
        for c in range(a.conversations):
            prompt = list(system)
            for t in range(a.turns):
                prompt += [rng.randrange(vocab) for _ in range(a.user)]
                ttft, ids, cached, _ = stream_turn(port, prompt, a.max_tokens)
                ttfts.append(ttft)
                (first if t == 0 else later).append(ttft)
                outputs.append(ids)
                tokens += len(ids)
                prompt += ids
        wall = time.perf_counter() - t0
        return {"ttft": ttfts, "first": first, "later": later, "wall": wall, "tokens": tokens,
                "outputs": outputs, "metrics": metrics(port), "prompt_len": len(prompt)}
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashmap", default="build/flashmap")
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default="")
    ap.add_argument("--serve-args", default="")
    ap.add_argument("--vocab", type=int, default=1000, help="ids drawn from [0, vocab)")
    ap.add_argument("--system", type=int, default=400, help="system prompt tokens")
    ap.add_argument("--user", type=int, default=24, help="tokens per user message")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    runs = {}
    for label, mb in (("off", 0), ("on", 1024)):
        runs[label] = run(a, mb)
    same = runs["off"]["outputs"] == runs["on"]["outputs"]
    print(f"workload: {a.conversations} conversations x {a.turns} turns, system {a.system} "
          f"tokens, user {a.user} tokens/turn, {a.max_tokens} output tokens/turn; last prompt "
          f"{runs['on']['prompt_len']} tokens")
    print("| prefix cache | TTFT mean (s) | p50 | p90 | turn 1 mean | later turns mean | wall (s) "
          "| output tok/s | hit tokens / prompt tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in runs.items():
        m = r["metrics"]
        q = m.get("flashmap_prefix_cache_query_tokens_total", 0)
        h = m.get("flashmap_prefix_cache_hit_tokens_total", 0)
        x = sorted(r["ttft"])
        print(f"| {label} | {statistics.mean(x):.3f} | {x[len(x) // 2]:.3f} | "
              f"{x[int(0.9 * (len(x) - 1))]:.3f} | {statistics.mean(r['first']):.3f} | "
              f"{statistics.mean(r['later']):.3f} | {r['wall']:.1f} | "
              f"{r['tokens'] / r['wall']:.1f} | {h:.0f} / {q:.0f} |")
    off, on = runs["off"], runs["on"]
    print(f"later-turn TTFT off/on: {statistics.mean(off['later']) / statistics.mean(on['later']):.2f}x;"
          f" wall off/on: {off['wall'] / on['wall']:.2f}x; identical outputs: {same}")
    if not same:
        raise SystemExit("the prefix cache changed the output")


if __name__ == "__main__":
    main()
