#!/usr/bin/env python3
"""Loopback load generator for `flashmap serve` (standard library only).

    python3 bench/bench_server.py --flashmap build/flashmap --fixture tests/fixtures/tiny-a
    python3 bench/bench_server.py --url http://127.0.0.1:8000 --model NAME

For each concurrency level, N streaming requests (token-id prompts, greedy, fixed max_tokens)
are sent by that many client threads, once with speculation and once with `speculative: false`.
Reports requests/s, output tokens/s, time to first token and inter-token latency percentiles
(client side: a chunk carrying k tokens after a gap g counts k latencies of g/k).
Bounded: --requests per level, --max-tokens per request, --timeout per request.
"""

import argparse
import http.client
import json
import random
import re
import subprocess
import threading
import time
import urllib.parse


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one_request(host, port, body, timeout):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft, itl, last, ntok = None, [], None, 0
    for line in resp:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        k = sum(len(c.get("token_ids", [])) for c in chunk.get("choices", []))
        if k == 0:
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t0
        else:
            itl.extend([(now - last) / k] * k)
        last = now
        ntok += k
    conn.close()
    return ttft, itl, ntok, time.perf_counter() - t0


def run_level(host, port, model, concurrency, n, max_tokens, speculative, timeout, seed):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1024) for _ in range(rng.randrange(4, 64))] for _ in range(n)]
    todo = list(range(n))
    lock = threading.Lock()
    ttfts, itls, tokens, errors = [], [], [0], []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = {"prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0,
                    "stream": True, "speculative": speculative}
            if model:
                body["model"] = model
            try:
                ttft, itl, ntok, _ = one_request(host, port, body, timeout)
                with lock:
                    ttfts.append(ttft)
                    itls.extend(itl)
                    tokens[0] += ntok
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "concurrency": concurrency, "speculative": speculative, "requests": n,
        "errors": len(errors), "wall_s": wall, "req_per_s": (n - len(errors)) / wall,
        "out_tok_per_s": tokens[0] / wall,
        "ttft_ms": [1000 * pct(ttfts, p) for p in (50, 90, 99)],
        "itl_ms": [1000 * pct(itls, p) for p in (50, 90, 99)],
    }


def scrape(host, port, name):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def policy_rounds(host, port):
    """(speculative, target) rounds the server's speculation policy chose so far."""
    get = lambda mode, ex: scrape(
        host, port, f'flashmap_spec_policy_rounds_total{{mode="{mode}",explore="{ex}"}}')
    return (get("speculative", "false") + get("speculative", "true"),
            get("target", "false") + get("target", "true"))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--model", default="", help="model name to send")
    ap.add_argument("--flashmap", default="build/flashmap")
    ap.add_argument("--fixture", default="tests/fixtures/tiny-a")
    ap.add_argument("--serve-args", default="", help="extra `flashmap serve` arguments")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", action="store_true", help="print one JSON line per level")
    a = ap.parse_args()

    proc = None
    if a.url:
        u = urllib.parse.urlparse(a.url)
        host, port = u.hostname, u.port or 80
    else:
        cmd = [a.flashmap, "serve", "--target", a.fixture + "/target", "--draft",
               a.fixture + "/draft", "--port", "0", *a.serve_args.split()]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        host, port = "127.0.0.1", None
        for line in proc.stderr:
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            raise SystemExit("the server did not start")
        threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
    try:
        levels = [int(c) for c in a.concurrency.split(",")]
        if not a.json:
            print(f"{'conc':>4} {'spec':>5} {'req/s':>7} {'out tok/s':>9} "
                  f"{'TTFT p50/p90/p99 ms':>22} {'ITL p50/p90/p99 ms':>22} {'err':>3} "
                  f"{'drafted':>7}")
        for c in levels:
            for spec in (True, False):
                before = policy_rounds(host, port)
                r = run_level(host, port, a.model, c, a.requests, a.max_tokens, spec,
                              a.timeout, seed=c)
                # Share of this level's rounds in which the policy chose to draft (nan when no
                # sequence could: `speculative: false`).
                after = policy_rounds(host, port)
                ds, dp = after[0] - before[0], after[1] - before[1]
                r["drafted_share"] = ds / (ds + dp) if ds + dp > 0 else float("nan")
                if a.json:
                    print(json.dumps(r))
                else:
                    print(f"{c:>4} {str(spec):>5} {r['req_per_s']:>7.1f} {r['out_tok_per_s']:>9.0f} "
                          f"{'/'.join(f'{x:.1f}' for x in r['ttft_ms']):>22} "
                          f"{'/'.join(f'{x:.2f}' for x in r['itl_ms']):>22} {r['errors']:>3} "
                          f"{r['drafted_share']:>7.0%}")
        count = scrape(host, port, "flashmap_acceptance_length_count")
        total = scrape(host, port, "flashmap_acceptance_length_sum")
        if not a.json and count > 0:
            print(f"server: mean acceptance length {total / count:.2f} over {count:.0f} "
                  f"speculative verifies, {scrape(host, port, 'flashmap_rounds_total'):.0f} rounds")
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
