#!/usr/bin/env python3
"""Two `flashmap serve` workers behind the SGLang Model Gateway (sglang-router, from PyPI).

    python3 tests/server/test_router.py BUILD/flashmap models/default

Starts two workers (--strict: every field the router adds must be known) and the router with
cache-aware routing on loopback, checks that the router learns the model's name from the
workers, then sends 40 seeded sampling requests (a few streamed) through it from 8 clients and
kills one worker mid-run. Every request must be answered: with the tokens `flashmap generate`
gives for the same prompt and seed, or with an error status and an OpenAI-style error body;
none may hang or vanish. Exits 77 (skipped) where sglang_router is not installed.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

import serve_process

FLASHMAP = None
PAIR = None
PROMPTS = ["The secret of a happy life is", "Once upon a time", "A cat and a dog",
           "To be or not to be", "In the beginning", "The weather today",
           "Why is the sky blue?", "My favourite book"]
MAX_TOKENS = 12


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker():
    return serve_process.start(
        [FLASHMAP, "serve", "--target", PAIR + "/target", "--draft", PAIR + "/draft",
         "--port", "0", "--threads", "1", "--strict", "--served-model-name", "flashmap-default"])


def get(port, path, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


def post(port, body, timeout=120):
    """(status, body); a body cut short (a stream whose worker died) is returned as far as it
    came: the caller tells a cut stream from a complete one by its [DONE]."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    try:
        payload = resp.read()
    except http.client.IncompleteRead as e:
        payload = e.partial
    except ConnectionResetError:
        payload = b""
    conn.close()
    return resp.status, payload


def reference(prompt, seed):
    out = subprocess.run(
        [FLASHMAP, "generate", "--target", PAIR + "/target", "--draft", PAIR + "/draft",
         "--prompt", prompt, "--seed", str(seed), "--temperature", "1", "--max-new-tokens",
         str(MAX_TOKENS), "--threads", "1", "--json"],
        check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)["ids"]


def stream_ids(payload):
    """Token ids of a streamed completion's chunks, and whether [DONE] ended it."""
    ids, done = [], False
    for line in payload.decode().splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:  # the stream was cut inside this event
            break
        for c in chunk.get("choices", []):
            ids.extend(c.get("token_ids") or [])
    return ids, done


class RouterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workers = [start_worker(), start_worker()]
        cls.port = free_port()
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--port", str(cls.port), "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(free_port()), "--policy", "cache_aware",
               "--log-level", "warn", "--worker-urls",
               *[f"http://127.0.0.1:{p}" for _, p, _ in cls.workers]]
        cls.router = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
        cls.router_log = []
        threading.Thread(target=lambda: cls.router_log.extend(cls.router.stderr),
                         daemon=True).start()
        deadline = time.time() + 90
        while time.time() < deadline:
            if cls.router.poll() is not None:
                break
            try:
                status, body = get(cls.port, "/workers")
                if status == 200 and sum(w.get("is_healthy", False)
                                         for w in json.loads(body)["workers"]) == 2:
                    return
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                pass
            time.sleep(0.3)
        cls.tearDownClass()
        raise RuntimeError("router did not register both workers:\n" + "".join(cls.router_log))

    @classmethod
    def tearDownClass(cls):
        for p in [cls.router] + [w[0] for w in cls.workers]:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()

    def test_model_name_from_workers(self):
        status, body = get(self.port, "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual([m["id"] for m in json.loads(body)["data"]], ["flashmap-default"])

    def test_zz_forty_requests_one_worker_killed(self):
        jobs = [(PROMPTS[i % len(PROMPTS)], 100 + i, i % 5 == 4) for i in range(40)]
        with ThreadPoolExecutor(2) as pool:
            refs = list(pool.map(lambda j: reference(j[0], j[1]), jobs))
        done = threading.Semaphore(0)

        def one(job):
            prompt, seed, streamed = job
            body = {"model": "flashmap-default", "prompt": prompt, "seed": seed,
                    "temperature": 1, "max_tokens": MAX_TOKENS, "return_token_ids": True,
                    "stream": streamed}
            try:
                return post(self.port, body)
            finally:
                done.release()

        victim = self.workers[1][0]

        def kill_after(n):
            for _ in range(n):
                done.acquire()
            victim.send_signal(signal.SIGKILL)

        killer = threading.Thread(target=kill_after, args=(12,))
        killer.start()
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, jobs))
        killer.join()
        self.assertIsNotNone(victim.poll(), "the worker was not stopped mid-run")

        answered, cut, refused = 0, 0, 0
        for (prompt, seed, streamed), ref, (status, payload) in zip(jobs, refs, results):
            with self.subTest(prompt=prompt, seed=seed, streamed=streamed):
                if status == 200:
                    if streamed:
                        ids, finished = stream_ids(payload)
                        if not finished:
                            # A stream cut when its worker died: the client sees no [DONE],
                            # and what it got is a prefix of the right tokens.
                            self.assertEqual(ids, ref[:len(ids)])
                            cut += 1
                            continue
                    else:
                        ids = json.loads(payload)["choices"][0]["token_ids"]
                    self.assertEqual(ids, ref)
                    answered += 1
                else:
                    # Refused: a clear status with a JSON error, never an empty answer.
                    self.assertGreaterEqual(status, 400, payload)
                    self.assertTrue(payload.strip(), f"status {status} with an empty body")
                    refused += 1
        print(f"\n40 requests: {answered} answered in full, {cut} streams cut, {refused} refused",
              file=sys.stderr)
        # The router retries a dead worker's non-streamed requests on the live one.
        self.assertGreaterEqual(answered, 36, f"only {answered} of 40 answered")

        # The surviving worker reports the gauges an endpoint picker scrapes.
        status, text = get(self.workers[0][1], "/metrics")
        self.assertEqual(status, 200)
        series = dict(l.rsplit(" ", 1) for l in text.decode().splitlines()
                      if l and not l.startswith("#"))
        for name in ["vllm:num_requests_waiting", "vllm:num_requests_running",
                     "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total"]:
            self.assertIn(name, series)
        self.assertGreater(float(series["vllm:prefix_cache_queries_total"]), 0)
        self.assertTrue(0 <= float(series["vllm:kv_cache_usage_perc"]) <= 1)
        log = "".join(self.workers[0][2])
        self.assertNotIn("unknown request field", log)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        print("sglang_router is not installed (pip install sglang-router): skipped")
        sys.exit(77)
    FLASHMAP, PAIR = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=sys.argv[:1], verbosity=2)
