#!/usr/bin/env python3
"""End-to-end test of `flashmap serve` over loopback HTTP, standard library only.

    python3 tests/server/test_server_e2e.py BUILD/flashmap tests/fixtures/tiny-a

Starts the server on free ports with the fixture's target and drafter and checks: greedy
output equals `flashmap generate` (streaming and not, with and without speculation, many
concurrent clients), OpenAI-style errors with the right statuses, auth, admission (429),
metrics, that a client hanging up mid-stream frees its sequence, and graceful SIGTERM.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import serve_process
from text_model import write_text_model

FLASHMAP = None
FIXTURE = None
KEY = "sk-test-key"


def start_server(*extra):
    return serve_process.start(
        [FLASHMAP, "serve", "--target", FIXTURE + "/target", "--draft", FIXTURE + "/draft",
         "--port", "0", "--served-model-name", "tiny", *extra])


def reference(prompt, max_tokens):
    out = subprocess.run(
        [FLASHMAP, "generate", "--target", FIXTURE + "/target", "--draft", FIXTURE + "/draft",
         "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(max_tokens),
         "--json", "--stop-ids", "none"],
        check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)["ids"]


def request(port, method, path, body=None, headers=None, raw=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, payload


def post(port, body, path="/v1/completions", **kw):
    status, payload = request(port, "POST", path, body, **kw)
    return status, json.loads(payload)


def stream(port, body, path="/v1/completions", headers=None):
    """Returns (status, [chunk dicts], saw_done)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request("POST", path, body=json.dumps(body).encode(), headers=h)
    resp = conn.getresponse()
    if resp.status != 200:
        payload = resp.read()
        conn.close()
        return resp.status, [json.loads(payload)], False
    assert resp.getheader("Content-Type", "").startswith("text/event-stream")
    chunks, done = [], False
    for line in resp:
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        assert not done, "data after [DONE]"
        if data == "[DONE]":
            done = True
        else:
            chunks.append(json.loads(data))
    conn.close()
    return 200, chunks, done


def metrics(port):
    status, payload = request(port, "GET", "/metrics")
    assert status == 200
    values = {}
    for line in payload.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 8],
    [900],
    [5, 17, 300, 2, 999, 41, 7, 64, 3, 12, 12, 12, 800, 801, 0, 1023],
    [42, 43],
    list(range(100, 137)),
]
MAX_TOKENS = [12, 20, 7, 30, 16]


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.refs = [reference(p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
        cls.proc, cls.port, cls.log = start_server("--max-running", "8", "--max-queue", "64")

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()

    def assertError(self, status, body, want_status, param=None):
        self.assertEqual(status, want_status, body)
        self.assertIn("error", body)
        err = body["error"]
        for key in ("message", "type", "param", "code"):
            self.assertIn(key, err)
        self.assertTrue(err["message"])
        if param is not None:
            self.assertEqual(err["param"], param)

    def test_health_and_models(self):
        status, payload = request(self.port, "GET", "/health")
        self.assertEqual(status, 200)
        status, payload = request(self.port, "GET", "/v1/models")
        self.assertEqual(status, 200)
        models = json.loads(payload)
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], ["tiny"])

    def test_model_by_id(self):
        status, payload = request(self.port, "GET", "/v1/models/tiny")
        self.assertEqual(status, 200)
        model = json.loads(payload)
        self.assertEqual((model["id"], model["object"], model["max_model_len"]),
                         ("tiny", "model", 4096))
        status, payload = request(self.port, "GET", "/v1/models/other/name")
        self.assertError(status, json.loads(payload), 404, "model")
        # No tokenizer in the fixture: the text endpoints say so.
        status, body = post(self.port, {"prompt": "x"}, path="/tokenize")
        self.assertError(status, body, 400)

    def test_unknown_fields_are_logged_once_and_change_nothing(self):
        body = {"prompt": [1, 2, 3], "max_tokens": 6, "temperature": 0}
        want = post(self.port, body)[1]["choices"][0]["token_ids"]
        for _ in range(3):
            status, got = post(self.port, dict(body, frobnicate_xyz={"a": 1}))
            self.assertEqual(status, 200, got)
            self.assertEqual(got["choices"][0]["token_ids"], want)
        time.sleep(0.2)
        lines = [l for l in self.log if "frobnicate_xyz" in l]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("warning", lines[0])

    def test_unsupported_fields(self):
        base = {"prompt": [1, 2, 3], "max_tokens": 2}
        for name, no_op, refused in [("suffix", "", "x"), ("include_stop_str_in_output", False,
                                                          True)]:
            with self.subTest(field=name):
                status, body = post(self.port, dict(base, **{name: no_op}))
                self.assertEqual(status, 200, body)
                status, body = post(self.port, dict(base, **{name: refused}))
                self.assertError(status, body, 400, name)
                self.assertIn("not supported", body["error"]["message"])
        # Structured output needs the tokenizer this server was started without.
        status, body = post(self.port, dict(base, response_format={"type": "json_object"}))
        self.assertError(status, body, 400, "response_format")
        chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": {"type": "function", "function": {"name": "nope"}}}
        status, body = post(self.port, chat, path="/v1/chat/completions")
        self.assertError(status, body, 400, "tool_choice")

    def test_sampling_controls_out_of_range(self):
        base = {"prompt": [1, 2, 3], "max_tokens": 2}
        for name, value in [("presence_penalty", 2.5), ("frequency_penalty", -3),
                            ("repetition_penalty", 0), ("repetition_penalty", 11),
                            ("logit_bias", {"x": 1}), ("logit_bias", {"5": 101}),
                            ("logit_bias", {"99999999": 1}), ("logit_bias", [1]),
                            ("min_tokens", -1), ("min_tokens", 3), ("logprobs", 21),
                            ("n", 0), ("n", 17), ("best_of", 1), ("ignore_eos", "yes")]:
            with self.subTest(field=name, value=value):
                body = dict(base, **{name: value})
                if name == "best_of":
                    body["n"] = 2
                status, got = post(self.port, body)
                self.assertError(status, got, 400, name)
        chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        status, got = post(self.port, dict(chat, logprobs=True, top_logprobs=21),
                           path="/v1/chat/completions")
        self.assertError(status, got, 400, "top_logprobs")
        status, got = post(self.port, dict(chat, top_logprobs=2), path="/v1/chat/completions")
        self.assertError(status, got, 400, "top_logprobs")
        status, got = post(self.port, dict(base, n=9))  # this server runs 8 sequences at once
        self.assertError(status, got, 400, "n")
        status, got = post(self.port, dict(base, best_of=3, stream=True))
        self.assertError(status, got, 400, "best_of")
        status, got = post(self.port, dict(base, prompt_logprobs=21))
        self.assertError(status, got, 400, "prompt_logprobs")

    def test_penalties_are_lossless_and_applied(self):
        # Greedy with penalties and a bias: the same tokens with and without speculation, and
        # not the plain greedy continuation.
        body = {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0,
                "presence_penalty": 1.5, "frequency_penalty": 0.5, "repetition_penalty": 1.3,
                "logit_bias": {"7": 4.0}, "min_tokens": 5}
        got = {}
        for spec in (True, False):
            status, r = post(self.port, dict(body, speculative=spec))
            self.assertEqual(status, 200, r)
            got[spec] = r["choices"][0]["token_ids"]
        self.assertEqual(got[True], got[False])
        status, plain = post(self.port, {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0})
        self.assertNotEqual(plain["choices"][0]["token_ids"], got[True])
        # A bias of -100 on the plain continuation's first token removes it.
        first = plain["choices"][0]["token_ids"][0]
        status, r = post(self.port, {"prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0,
                                     "logit_bias": {str(first): -100}})
        self.assertNotEqual(r["choices"][0]["token_ids"][0], first)

    def test_logprobs(self):
        for spec in (True, False):
            status, r = post(self.port, {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0,
                                         "logprobs": 3, "speculative": spec})
            self.assertEqual(status, 200, r)
            c = r["choices"][0]
            lp = c["logprobs"]
            self.assertEqual(len(lp["tokens"]), len(c["token_ids"]))
            self.assertEqual(len(lp["token_logprobs"]), len(c["token_ids"]))
            for v, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
                self.assertLessEqual(v, 0.0)
                self.assertEqual(len(top), 3)
                # Greedy: the emitted token is the most likely one.
                self.assertAlmostEqual(max(top.values()), v, places=5)
            if spec:
                with_spec = lp["token_logprobs"]
            else:
                for a, b in zip(with_spec, lp["token_logprobs"]):
                    self.assertAlmostEqual(a, b, places=4)
        self.assertEqual(lp["tokens"][0], "token_id:%d" % c["token_ids"][0])  # no tokenizer

    def test_prefix_cache(self):
        # A second turn extends the first (prompt + output + more): its shared prefix comes from
        # the cache, and the output is still exactly `flashmap generate`'s (no cache there).
        turn1 = [(i * 53 + 11) % 1000 + 1 for i in range(48)]
        status, r1 = post(self.port, {"prompt": turn1, "max_tokens": 20, "temperature": 0})
        out1 = r1["choices"][0]["token_ids"]
        turn2 = turn1 + out1 + [5, 6, 7, 8]
        status, r2 = post(self.port, {"prompt": turn2, "max_tokens": 20, "temperature": 0})
        self.assertEqual(status, 200, r2)
        self.assertGreaterEqual(r2["usage"]["prompt_tokens_details"]["cached_tokens"], len(turn1))
        self.assertEqual(r2["choices"][0]["token_ids"], reference(turn2, 20))
        status, text = request(self.port, "GET", "/metrics")
        metrics = dict(l.rsplit(" ", 1) for l in text.decode().splitlines()
                       if l.startswith("flashmap_prefix_cache"))
        self.assertGreater(int(metrics["flashmap_prefix_cache_hits_total"]), 0)
        self.assertGreater(int(metrics["flashmap_prefix_cache_hit_tokens_total"]), len(turn1) - 1)
        self.assertLessEqual(int(metrics["flashmap_prefix_cache_bytes"]),
                             int(metrics["flashmap_prefix_cache_budget_bytes"]))

    def test_n_and_best_of(self):
        body = {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 1.0, "seed": 11}
        status, one = post(self.port, body)
        status, many = post(self.port, dict(body, n=3))
        self.assertEqual(status, 200, many)
        ids = [c["token_ids"] for c in many["choices"]]
        self.assertEqual([c["index"] for c in many["choices"]], [0, 1, 2])
        self.assertEqual(ids[0], one["choices"][0]["token_ids"])  # choice 0 keeps the seed
        self.assertGreater(len({tuple(x) for x in ids}), 1)
        self.assertEqual(many["usage"]["completion_tokens"], sum(len(x) for x in ids))
        # Each choice is the seeded request with its own seed stream.
        golden = 0x9E3779B97F4A7C15
        for i in (1, 2):
            seed = (11 + i * golden) % (1 << 64)
            if seed >= 1 << 63:
                continue  # the API takes signed seeds
            status, r = post(self.port, dict(body, seed=seed))
            self.assertEqual(r["choices"][0]["token_ids"], ids[i])
        # best_of 3: the one with the highest summed logprob among the three.
        status, scored = post(self.port, dict(body, n=3, logprobs=0))
        sums = [sum(c["logprobs"]["token_logprobs"]) for c in scored["choices"]]
        status, best = post(self.port, dict(body, best_of=3))
        self.assertEqual(status, 200, best)
        self.assertEqual(len(best["choices"]), 1)
        self.assertEqual(best["choices"][0]["token_ids"],
                         scored["choices"][sums.index(max(sums))]["token_ids"])
        # Streaming n = 2: chunks carry their choice's index; each ends once.
        status, events, done = stream(self.port, dict(body, n=2, stream=True))
        self.assertTrue(done)
        got = {0: [], 1: []}
        ends = []
        for ev in events:
            for ch in ev["choices"]:
                got[ch["index"]] += ch.get("token_ids") or []
                if ch["finish_reason"]:
                    ends.append(ch["index"])
        self.assertEqual(sorted(ends), [0, 1])
        self.assertEqual(got[0], ids[0])
        self.assertEqual(got[1], ids[1])

    def test_completion_equals_generate(self):
        for spec in (True, False):
            for prompt, n, ref in zip(PROMPTS, MAX_TOKENS, self.refs):
                status, body = post(self.port, {"model": "tiny", "prompt": prompt, "max_tokens": n,
                                                "temperature": 0, "speculative": spec})
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                self.assertEqual(choice["token_ids"], ref, (prompt, spec))
                self.assertEqual(choice["finish_reason"], "length")
                self.assertEqual(body["object"], "text_completion")
                usage = dict(body["usage"])
                cached = usage.pop("prompt_tokens_details")["cached_tokens"]
                self.assertEqual(usage, {"prompt_tokens": len(prompt), "completion_tokens": n,
                                         "total_tokens": len(prompt) + n})
                self.assertTrue(0 <= cached < len(prompt), cached)
                self.assertGreaterEqual(body["acceptance_length"], 1.0)

    def test_stream_equals_generate(self):
        for prompt, n, ref in zip(PROMPTS, MAX_TOKENS, self.refs):
            status, chunks, done = stream(self.port, {"prompt": prompt, "max_tokens": n,
                                                      "stream": True,
                                                      "stream_options": {"include_usage": True}})
            self.assertEqual(status, 200)
            self.assertTrue(done)
            ids = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
            self.assertEqual(ids, ref)
            finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"]
                        if ch["finish_reason"]]
            self.assertEqual(finishes, ["length"])
            usage = chunks[-1]
            self.assertEqual(usage["choices"], [])
            self.assertEqual(usage["usage"]["completion_tokens"], n)
            self.assertTrue(all(c["object"] == "text_completion" for c in chunks))

    def test_stop_token_ids(self):
        ref = self.refs[3]
        stop = ref[4]
        status, body = post(self.port, {"prompt": PROMPTS[3], "max_tokens": 30,
                                        "stop_token_ids": [stop]})
        self.assertEqual(status, 200)
        ids = body["choices"][0]["token_ids"]
        self.assertEqual(ids, ref[:ref.index(stop) + 1])
        self.assertEqual(body["choices"][0]["finish_reason"], "stop")

    def test_seeded_sampling_is_reproducible(self):
        req = {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0.9, "top_p": 0.9,
               "top_k": 40, "seed": 1234}
        a = post(self.port, req)[1]["choices"][0]["token_ids"]
        b = post(self.port, req)[1]["choices"][0]["token_ids"]
        self.assertEqual(a, b)
        self.assertEqual(len(a), 20)

    def test_bad_requests(self):
        p = self.port
        cases = [
            (dict(raw=b'{"prompt": [1, 2'), 400, None),
            (dict(raw=b'[1, 2, 3]'), 400, None),
            (dict(raw=b'{"prompt": "\xff\xfe"}'), 400, None),
            (dict(body={"prompt": []}), 400, "prompt"),
            (dict(body={"prompt": ""}), 400, "prompt"),
            (dict(body={}), 400, "prompt"),
            (dict(body={"prompt": [1, "a"]}), 400, "prompt"),
            (dict(body={"prompt": [1, 2], "max_tokens": 0}), 400, "max_tokens"),
            (dict(body={"prompt": [1, 2], "max_tokens": -3}), 400, "max_tokens"),
            (dict(body={"prompt": [1, 2], "max_tokens": "ten"}), 400, "max_tokens"),
            (dict(body={"prompt": [1, 2], "temperature": -0.5}), 400, "temperature"),
            (dict(body={"prompt": [1, 2], "temperature": "hot"}), 400, "temperature"),
            (dict(body={"prompt": [1, 2], "top_p": 1.5}), 400, "top_p"),
            (dict(body={"prompt": [1, 2], "top_p": 0}), 400, "top_p"),
            (dict(body={"prompt": [1, 2], "stream": "yes"}), 400, "stream"),
            (dict(body={"prompt": [1, 2], "stop": ["a", "b", "c", "d", "e"]}), 400, "stop"),
            (dict(body={"prompt": [1, 2], "model": "gpt-4"}), 404, "model"),
            (dict(body={"prompt": [1, 5000]}), 400, "prompt"),  # outside the vocabulary
            (dict(body={"prompt": [1] * 5000}), 400, "prompt"),  # longer than the context
            (dict(body={"prompt": [1] * 100, "max_tokens": 4000}), 400, "max_tokens"),
            (dict(body={"prompt": [1, 2], "stop_token_ids": [5000]}), 400, "stop_token_ids"),
            (dict(body={"prompt": [1, 2], "max_tokens": 4, "speculative": 1}), 400, "speculative"),
        ]
        for kw, want, param in cases:
            status, payload = request(p, "POST", "/v1/completions", **kw)
            body = json.loads(payload)
            with self.subTest(kw=str(kw)[:80]):
                self.assertError(status, body, want, param)
        # The engine's context check names the field and OpenAI's code.
        for body, param in [({"prompt": [1] * 4096}, "prompt"),
                            ({"prompt": [1] * 100, "max_tokens": 3997}, "max_tokens")]:
            status, resp = post(p, body)
            self.assertError(status, resp, 400, param)
            self.assertEqual(resp["error"]["code"], "context_length_exceeded")
        status, body = post(p, {"model": "tiny"}, path="/v1/chat/completions")
        self.assertError(status, body, 400, "messages")
        status, body = post(p, {"messages": []}, path="/v1/chat/completions")
        self.assertError(status, body, 400, "messages")
        status, payload = request(p, "GET", "/v1/nothing-here")
        self.assertError(status, json.loads(payload), 404)
        status, payload = request(p, "POST", "/v1/embeddings", {"input": "x"})
        self.assertError(status, json.loads(payload), 404)

    def test_concurrent_streams(self):
        errors, results = [], []
        lock = threading.Lock()

        def client(t):
            try:
                for r in range(3):
                    i = (t + r) % len(PROMPTS)
                    body = {"prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i],
                            "speculative": (t + r) % 2 == 0}
                    if (t + r) % 3 == 0:
                        status, resp = post(self.port, body)
                        ids = resp["choices"][0]["token_ids"]
                    else:
                        body["stream"] = True
                        status, chunks, done = stream(self.port, body)
                        assert done, "no [DONE]"
                        ids = [x for c in chunks for ch in c["choices"]
                               for x in ch.get("token_ids", [])]
                    with lock:
                        results.append((status, ids == self.refs[i]))
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(repr(e))

        threads = [threading.Thread(target=client, args=(t,)) for t in range(16)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        self.assertLess(time.time() - t0, 120)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 48)
        self.assertTrue(all(s == 200 and ok for s, ok in results), results)
        m = metrics(self.port)
        self.assertEqual(m["flashmap_running_sequences"], 0)
        self.assertEqual(m["flashmap_queue_depth"], 0)
        self.assertGreaterEqual(m['flashmap_requests_total{endpoint="/v1/completions",status="200"}'],
                                48)
        self.assertGreaterEqual(m["flashmap_time_to_first_token_seconds_count"], 48)
        self.assertGreater(m["flashmap_inter_token_latency_seconds_count"], 0)
        self.assertGreater(m["flashmap_rounds_total"], 0)
        self.assertGreater(m["flashmap_acceptance_length_count"], 0)
        self.assertGreaterEqual(m["flashmap_generation_tokens_total"],
                                sum(MAX_TOKENS[(t + r) % 5] for t in range(16) for r in range(3)))

    def test_metrics_count_errors_and_tokens(self):
        before = metrics(self.port)
        post(self.port, {"prompt": [1, 2], "max_tokens": 0})
        post(self.port, {"prompt": PROMPTS[1], "max_tokens": 5})
        after = metrics(self.port)
        key400 = 'flashmap_requests_total{endpoint="/v1/completions",status="400"}'
        self.assertEqual(after.get(key400, 0), before.get(key400, 0) + 1)
        self.assertEqual(after["flashmap_generation_tokens_total"],
                         before["flashmap_generation_tokens_total"] + 5)
        self.assertEqual(after["flashmap_prompt_tokens_total"],
                         before["flashmap_prompt_tokens_total"] + 1)

    def test_client_killed_mid_stream_is_freed(self):
        key = 'flashmap_requests_total{endpoint="/v1/completions",status="499"}'
        before = metrics(self.port).get(key, 0)
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 4000 - 8, "stream": True,
                           "speculative": True}).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(4096)
        # The stats are taken after each round, and a round's tokens may reach the client in
        # more than one chunk: wait for a round that has seen two tokens committed.
        deadline = time.time() + 10
        m = metrics(self.port)
        while m["flashmap_kv_cache_tokens"] < len(PROMPTS[0]) + 2 and time.time() < deadline:
            time.sleep(0.01)
            m = metrics(self.port)
        self.assertEqual(m["flashmap_running_sequences"], 1)
        # The endpoint picker's series (Gateway API Inference Extension, vLLM's names).
        self.assertEqual(m["vllm:num_requests_running"], 1)
        self.assertEqual(m["vllm:num_requests_waiting"], m["flashmap_queue_depth"])
        # The one sequence holds its prompt and its tokens so far, of 8 slots x the context.
        self.assertGreaterEqual(m["flashmap_kv_cache_tokens"], len(PROMPTS[0]) + 2)
        self.assertEqual(m["flashmap_kv_cache_capacity_tokens"], 8 * 4096)
        self.assertAlmostEqual(m["vllm:kv_cache_usage_perc"],
                               m["flashmap_kv_cache_tokens"] / (8 * 4096), places=9)
        self.assertEqual(m["vllm:gpu_cache_usage_perc"], m["vllm:kv_cache_usage_perc"])
        s.close()
        # ~4000 speculative tokens take far longer than this deadline on the fixture.
        deadline = time.time() + 5
        while time.time() < deadline:
            m = metrics(self.port)
            if m["flashmap_running_sequences"] == 0 and m.get(key, 0) == before + 1:
                break
            time.sleep(0.05)
        self.assertEqual(m["flashmap_running_sequences"], 0)
        self.assertEqual(m.get(key, 0), before + 1)

    def test_openai_client(self):
        openai = openai_module()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                               max_retries=0)
        r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12,
                                      temperature=0)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 12)
        # The token_ids extension survives the client's models as an extra field.
        self.assertEqual(r.choices[0].token_ids, self.refs[0])
        pieces = list(client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12,
                                                temperature=0, stream=True))
        self.assertTrue(pieces)
        ids = [t for p in pieces for c in p.choices for t in (c.token_ids or [])]
        self.assertEqual(ids, self.refs[0])
        self.assertEqual([c.finish_reason for p in pieces for c in p.choices if c.finish_reason],
                         ["length"])
        with self.assertRaises(openai.BadRequestError):
            client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=0)
        self.assertEqual([m.id for m in client.models.list()], ["tiny"])

    def test_metrics_show_the_speculation_policy(self):
        for _ in range(3):
            post(self.port, {"prompt": PROMPTS[2], "max_tokens": 20})
        m = metrics(self.port)
        self.assertEqual(m['flashmap_spec_policy{policy="adaptive"}'], 1)
        # Every drafting sequence's round is the drafter model's here (no prompt lookup), and
        # the acceptance histogram counts the same rounds and tokens.
        drafter = m['flashmap_proposer_sequence_rounds_total{proposer="drafter"}']
        self.assertGreater(drafter, 0)
        self.assertEqual(m['flashmap_proposer_sequence_rounds_total{proposer="lookup"}'], 0)
        self.assertEqual(drafter, m["flashmap_acceptance_length_count"])
        self.assertEqual(m['flashmap_proposer_committed_tokens_total{proposer="drafter"}'],
                         m["flashmap_acceptance_length_sum"])
        rounds = {k: v for k, v in m.items() if k.startswith("flashmap_spec_policy_rounds_total")}
        self.assertEqual(len(rounds), 4)
        # Every round with a drafting-capable sequence is counted under one mode.
        self.assertLessEqual(sum(rounds.values()), m["flashmap_rounds_total"])
        self.assertGreater(
            m['flashmap_spec_policy_rounds_total{mode="speculative",explore="true"}'], 0)
        # Batch 1 has been measured both ways by now.
        for mode in ("speculative", "target"):
            key = f'flashmap_spec_policy_tokens_per_second{{batch="1",mode="{mode}"}}'
            self.assertGreater(m[key], 0, key)
        self.assertIn(m['flashmap_spec_policy_speculating{batch="1"}'], (0, 1))


def free_whitespace(text):
    """The whitespace runs of JSON text outside its strings that compact separators do not allow
    (anything but one space after ',' or ':')."""
    runs, i, in_string = [], 0, False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in " \n\t\r":
            j = i
            while j < len(text) and text[j] in " \n\t\r":
                j += 1
            if not (text[i:j] == " " and i > 0 and text[i - 1] in ",:"):
                runs.append(text[i:j])
            i = j
            continue
        i += 1
    return runs


def openai_module():
    """The official client: scripts/setup installs it, so its absence is a failure, not a skip."""
    try:
        import openai
    except ImportError as e:
        raise AssertionError("the openai package is missing: run scripts/setup") from e
    return openai


class LimitsTest(unittest.TestCase):
    """A second server: API key, one running slot and one queue slot, small bodies."""

    @classmethod
    def setUpClass(cls):
        cls.proc, cls.port, cls.log = start_server(
            "--api-key", KEY, "--max-running", "1", "--max-queue", "1", "--max-body-bytes", "2048")
        cls.auth = {"Authorization": "Bearer " + KEY}

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()

    def test_api_key(self):
        status, body = post(self.port, {"prompt": [1, 2], "max_tokens": 2})
        self.assertEqual(status, 401)
        self.assertIn("error", body)
        status, body = post(self.port, {"prompt": [1, 2], "max_tokens": 2},
                            headers={"Authorization": "Bearer wrong"})
        self.assertEqual(status, 401)
        status, body = post(self.port, {"prompt": [1, 2], "max_tokens": 2}, headers=self.auth)
        self.assertEqual(status, 200)
        self.assertEqual(request(self.port, "GET", "/health")[0], 200)

    def test_body_too_large(self):
        status, payload = request(self.port, "POST", "/v1/completions",
                                  {"prompt": [1] * 3000}, headers=self.auth)
        self.assertEqual(status, 413)
        self.assertIn("error", json.loads(payload))

    def test_queue_full_is_429(self):
        conns = []
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 3000, "stream": True}).encode()
        try:
            for _ in range(2):  # one running, one queued
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                c.request("POST", "/v1/completions", body=body,
                          headers={"Content-Type": "application/json", **self.auth})
                conns.append(c)
            r = conns[0].getresponse()
            self.assertEqual(r.status, 200)
            r.fp.readline()  # the first token: the first request runs
            deadline = time.time() + 10
            while time.time() < deadline and metrics(self.port)["flashmap_queue_depth"] < 1:
                time.sleep(0.02)
            status, err = post(self.port, {"prompt": [1, 2], "max_tokens": 2}, headers=self.auth)
            self.assertEqual(status, 429, err)
            self.assertEqual(err["error"]["type"], "rate_limit_error")
        finally:
            for c in conns:
                c.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            m = metrics(self.port)
            if m["flashmap_running_sequences"] == 0 and m["flashmap_queue_depth"] == 0:
                break
            time.sleep(0.05)
        self.assertEqual(m["flashmap_running_sequences"] + m["flashmap_queue_depth"], 0)


class StrictTest(unittest.TestCase):
    def test_strict_refuses_unknown_fields(self):
        proc, port, log = start_server("--strict")
        try:
            status, body = post(port, {"prompt": [1, 2], "max_tokens": 2, "frobnicate": True})
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["param"], "frobnicate")
            status, body = post(port, {"prompt": [1, 2], "max_tokens": 2, "user": "u"})
            self.assertEqual(status, 200, body)
            # A router's registration: the model's name and folders under SGLang's names.
            for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
                status, payload = request(port, "GET", path)
                self.assertEqual(status, 200, path)
                info = json.loads(payload)
                self.assertEqual(info["served_model_name"], "tiny")
                self.assertEqual(info["model_path"], FIXTURE + "/target")
                self.assertEqual(info["context_length"], 4096)
        finally:
            proc.kill()
            proc.wait()


class GenerationConfigDefaultsTest(unittest.TestCase):
    """Sampling fields a request leaves out come from the target's generation_config.json."""

    def test_defaults_from_generation_config(self):
        import shutil
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "target")
            shutil.copytree(FIXTURE + "/target", target)
            with open(os.path.join(target, "generation_config.json"), "w") as f:
                json.dump({"do_sample": True, "temperature": 1.3, "top_k": 50, "top_p": 0.9}, f)
            proc = subprocess.Popen(
                [FLASHMAP, "serve", "--target", target, "--draft", FIXTURE + "/draft",
                 "--port", "0"], stderr=subprocess.PIPE, text=True)
            try:
                port = None
                for line in proc.stderr:
                    m = re.search(r"listening on http://[\d.]+:(\d+)", line)
                    if m:
                        port = int(m.group(1))
                        threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
                        break
                self.assertIsNotNone(port)
                base = {"prompt": [5, 6, 7, 8], "max_tokens": 24, "seed": 11}

                def ids(**kw):
                    status, body = post(port, dict(base, **kw))
                    self.assertEqual(status, 200, body)
                    return body["choices"][0]["token_ids"]

                implicit = ids()
                self.assertEqual(implicit, ids(temperature=1.3, top_k=50, top_p=0.9))
                self.assertNotEqual(implicit, ids(temperature=0))
                # A request field overrides its default only.
                self.assertEqual(ids(top_k=3), ids(temperature=1.3, top_k=3, top_p=0.9))
                # `flashmap generate` without sampling flags follows the same defaults.
                out = subprocess.run(
                    [FLASHMAP, "generate", "--target", target, "--draft", FIXTURE + "/draft",
                     "--prompt-ids", "5,6,7,8", "--max-new-tokens", "24", "--seed", "11",
                     "--json", "--stop-ids", "none"],
                    check=True, capture_output=True, text=True, timeout=120)
                self.assertEqual(json.loads(out.stdout)["ids"], implicit)
            finally:
                proc.kill()
                proc.wait()


class TextTest(unittest.TestCase):
    """Text prompts, detokenized output, stop strings and chat on the real Qwen3 tokenizer."""

    @classmethod
    def setUpClass(cls):
        tok = os.path.join(os.path.dirname(FIXTURE), "..", "data", "qwen3-tokenizer")
        if not os.path.exists(os.path.join(tok, "tokenizer.json")):
            raise unittest.SkipTest("tests/data/qwen3-tokenizer is missing")
        import tempfile
        cls.tmp = tempfile.TemporaryDirectory()
        write_text_model(cls.tmp.name)
        proc = subprocess.Popen(
            [FLASHMAP, "serve", "--target", cls.tmp.name, "--tokenizer", tok, "--port", "0",
             "--served-model-name", "text"], stderr=subprocess.PIPE, text=True)
        cls.proc = proc
        line = ""
        for line in proc.stderr:
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                cls.port = int(m.group(1))
                threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
                return
        proc.kill()
        raise RuntimeError("text server did not start: " + line)

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()
        cls.tmp.cleanup()

    def complete(self, **kw):
        body = {"prompt": "The quick brown fox jumps over", "max_tokens": 40, "temperature": 0}
        body.update(kw)
        status, resp = post(self.port, body)
        self.assertEqual(status, 200, resp)
        return resp

    def test_chat_logprobs(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                "temperature": 0, "logprobs": True, "top_logprobs": 2,
                "chat_template_kwargs": {"enable_thinking": False}}
        status, r = post(self.port, chat, path="/v1/chat/completions")
        self.assertEqual(status, 200, r)
        content = r["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), r["usage"]["completion_tokens"])
        for e in content:
            self.assertEqual(len(e["top_logprobs"]), 2)
            self.assertEqual(e["top_logprobs"][0]["logprob"], e["logprob"])  # greedy
            self.assertEqual(bytes(e["bytes"]).decode("utf-8", "replace"), e["token"])
        # Streamed: the same values, chunk by chunk.
        status, events, done = stream(self.port, dict(chat, stream=True),
                                      path="/v1/chat/completions")
        streamed = [e for ev in events for ch in ev["choices"]
                    if ch.get("logprobs") for e in ch["logprobs"]["content"]]
        self.assertEqual([e["logprob"] for e in streamed], [e["logprob"] for e in content])

    def test_structured_output(self):
        import jsonschema
        schema = {"type": "object",
                  "properties": {"name": {"type": "string", "maxLength": 8},
                                 "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                 "tags": {"type": "array", "items": {"enum": ["red", "blue"]},
                                          "maxItems": 3},
                                 "ok": {"type": "boolean"}},
                  "required": ["name", "age", "tags"]}
        base = {"messages": [{"role": "user", "content": "Describe a person as JSON."}],
                "max_tokens": 160, "temperature": 1.0,
                "chat_template_kwargs": {"enable_thinking": False}}
        for seed in range(6):
            with self.subTest(seed=seed):
                status, r = post(self.port, dict(base, seed=seed, response_format={
                    "type": "json_schema", "json_schema": {"name": "p", "schema": schema}}),
                    path="/v1/chat/completions")
                self.assertEqual(status, 200, r)
                self.assertEqual(r["choices"][0]["finish_reason"], "stop", r)
                doc = json.loads(r["choices"][0]["message"]["content"])
                jsonschema.validate(doc, schema)
                # Properties in the schema's order.
                self.assertEqual(list(doc)[:2], ["name", "age"])
        status, r = post(self.port, dict(base, seed=1, response_format={"type": "json_object"},
                                         max_tokens=400, temperature=0.7),
                         path="/v1/chat/completions")
        self.assertEqual(status, 200, r)
        if r["choices"][0]["finish_reason"] == "stop":
            self.assertIsInstance(json.loads(r["choices"][0]["message"]["content"]), dict)
        for seed in range(4):
            status, r = post(self.port, {"prompt": "Code:", "max_tokens": 40, "seed": seed,
                                         "temperature": 1.0,
                                         "guided_regex": "[A-Z]{2}-[0-9]{3,5}"})
            self.assertEqual(status, 200, r)
            self.assertRegex(r["choices"][0]["text"], r"^[A-Z]{2}-[0-9]{3,5}$")
            status, r = post(self.port, {"prompt": "Pick:", "max_tokens": 20, "seed": seed,
                                         "temperature": 1.0,
                                         "guided_choice": ["yes", "no", "maybe (later)"]})
            self.assertIn(r["choices"][0]["text"], ["yes", "no", "maybe (later)"])
        # Streaming delivers the same constrained text.
        body = {"prompt": "Code:", "max_tokens": 40, "seed": 3, "temperature": 1.0,
                "guided_regex": "[A-Z]{2}-[0-9]{3,5}"}
        status, whole = post(self.port, body)
        status, events, done = stream(self.port, dict(body, stream=True))
        self.assertEqual("".join(c["text"] for e in events for c in e["choices"]),
                         whole["choices"][0]["text"])
        # What the compiler does not support: a 400 naming the field and the construct.
        status, r = post(self.port, dict(base, response_format={
            "type": "json_schema", "json_schema": {"name": "p", "schema": {
                "type": "number", "multipleOf": 3}}}), path="/v1/chat/completions")
        self.assertEqual(status, 400, r)
        self.assertEqual(r["error"]["param"], "response_format")
        self.assertIn("multipleOf", r["error"]["message"])
        status, r = post(self.port, {"prompt": "x", "guided_regex": "(a"})
        self.assertEqual(status, 400, r)
        self.assertEqual(r["error"]["param"], "guided_regex")

    def test_echo_with_logprobs_scores_the_prompt(self):
        # lm-eval's loglikelihood request: echo + logprobs scores every prompt token given the
        # ones before it. Each score must equal the raw logprob the same token gets when it is
        # generated after that prefix (a +100 bias forces it; logprobs are before the bias).
        prompt = "The quick brown fox jumps over"
        status, r = post(self.port, {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                     "echo": True, "logprobs": 2})
        self.assertEqual(status, 200, r)
        lp = r["choices"][0]["logprobs"]
        self.assertTrue(r["choices"][0]["text"].startswith(prompt))
        status, tok = post(self.port, {"prompt": prompt}, path="/tokenize")
        ids = tok["tokens"]
        self.assertEqual(len(lp["tokens"]), len(ids) + 1)
        self.assertIsNone(lp["token_logprobs"][0])
        self.assertIsNone(lp["top_logprobs"][0])
        for k in range(1, len(ids)):
            status, g = post(self.port, {"prompt": ids[:k], "max_tokens": 1, "temperature": 0,
                                         "logprobs": 0, "logit_bias": {str(ids[k]): 100}})
            self.assertEqual(g["choices"][0]["token_ids"], [ids[k]])
            self.assertAlmostEqual(g["choices"][0]["logprobs"]["token_logprobs"][0],
                                   lp["token_logprobs"][k], places=4)
        # vLLM's prompt_logprobs field, and the same through streaming.
        status, v = post(self.port, {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                     "prompt_logprobs": 1})
        pl = v["choices"][0]["prompt_logprobs"]
        self.assertIsNone(pl[0])
        self.assertAlmostEqual(pl[1][str(ids[1])]["logprob"], lp["token_logprobs"][1], places=5)
        status, events, done = stream(self.port, {"prompt": prompt, "max_tokens": 1,
                                                  "temperature": 0, "echo": True, "logprobs": 2,
                                                  "stream": True})
        streamed = [x for e in events for c in e["choices"] if c.get("logprobs")
                    for x in c["logprobs"]["token_logprobs"]]
        self.assertEqual(streamed, lp["token_logprobs"])

    def test_return_token_ids(self):
        # vLLM's return_token_ids (llama-benchy asks for it): the prompt's ids and the output's.
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "temperature": 0, "chat_template_kwargs": {"enable_thinking": False},
                "return_token_ids": True}
        status, r = post(self.port, chat, path="/v1/chat/completions")
        self.assertEqual(status, 200, r)
        status, tok = post(self.port, {k: chat[k] for k in ("messages", "chat_template_kwargs")},
                           path="/tokenize")
        self.assertEqual(r["prompt_token_ids"], tok["tokens"])
        ids = r["choices"][0]["token_ids"]
        self.assertEqual(len(ids), r["usage"]["completion_tokens"])
        status, events, done = stream(self.port, dict(chat, stream=True),
                                      path="/v1/chat/completions")
        self.assertEqual(events[0]["prompt_token_ids"], tok["tokens"])
        self.assertEqual([t for e in events for c in e["choices"] for t in c.get("token_ids", [])],
                         ids)

    def test_echo(self):
        plain = self.complete(max_tokens=5)["choices"][0]["text"]
        echoed = self.complete(max_tokens=5, echo=True)["choices"][0]["text"]
        self.assertEqual(echoed, "The quick brown fox jumps over" + plain)
        status, events, done = stream(self.port, {"prompt": "The quick brown fox jumps over",
                                                  "max_tokens": 5, "temperature": 0,
                                                  "echo": True, "stream": True})
        self.assertEqual("".join(ch["text"] for ev in events for ch in ev["choices"]), echoed)

    def streamed(self, **kw):
        body = {"prompt": "The quick brown fox jumps over", "max_tokens": 40, "stream": True}
        body.update(kw)
        status, chunks, done = stream(self.port, body)
        self.assertEqual(status, 200)
        self.assertTrue(done)
        text = "".join(ch["text"] for c in chunks for ch in c["choices"])
        finish = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
        return text, finish

    def test_text_prompt_stream_equals_whole(self):
        whole = self.complete()
        self.assertEqual(whole["choices"][0]["finish_reason"], "length")
        self.assertEqual(whole["usage"]["prompt_tokens"], 6)  # The| quick| brown| fox| jumps| over
        text, finish = self.streamed()
        self.assertEqual(text, whole["choices"][0]["text"])
        self.assertTrue(text)
        self.assertEqual(finish, ["length"])

    def test_stop_strings_cut_and_never_leak(self):
        full = self.complete()["choices"][0]["text"]
        self.assertGreater(len(full), 12)
        # A stop string from the middle of the text, most likely spanning token boundaries.
        start = len(full) // 2
        stop = full[start:start + 5]
        want = full[:full.index(stop)]
        got = self.complete(stop=[stop, "\x00never"])
        self.assertEqual(got["choices"][0]["text"], want)
        self.assertEqual(got["choices"][0]["finish_reason"], "stop")
        self.assertLess(got["usage"]["completion_tokens"], 40)
        text, finish = self.streamed(stop=stop)
        self.assertEqual(text, want)
        self.assertEqual(finish, ["stop"])

    def test_chat(self):
        body = {"model": "text", "messages": [{"role": "user", "content": "Hello there"}],
                "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}}
        status, resp = post(self.port, body, path="/v1/chat/completions")
        if status == 400 and "unavailable" in resp["error"]["message"]:
            self.skipTest(resp["error"]["message"])
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["object"], "chat.completion")
        msg = resp["choices"][0]["message"]
        self.assertEqual(msg["role"], "assistant")
        self.assertIsInstance(msg["content"], str)
        # enable_thinking false: the template closed an empty think block; all is content.
        self.assertIsNone(msg["reasoning_content"])
        # <|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n + empty think block
        self.assertGreater(resp["usage"]["prompt_tokens"], 8)
        body["stream"] = True
        status, chunks, done = stream(self.port, body, path="/v1/chat/completions")
        self.assertTrue(done)
        self.assertEqual(chunks[0]["choices"][0]["delta"].get("role"), "assistant")
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        self.assertEqual(content, msg["content"])


    def tokenizer_ids(self, text):
        tok = os.path.join(os.path.dirname(FIXTURE), "..", "data", "qwen3-tokenizer")
        out = subprocess.run([FLASHMAP, "tokenize", "--tokenizer", tok, "--text", text],
                             check=True, capture_output=True, text=True, timeout=60)
        return json.loads(out.stdout)

    def test_tokenize_detokenize_round_trip(self):
        for text in ["The quick brown fox", "  leading spaces\n\ttabs", "漢字とかな 😀👍🏽",
                     "<|im_start|>user\nhi<|im_end|>", "don't   stop\r\n", "x" * 3000]:
            with self.subTest(text=text[:30]):
                status, t = post(self.port, {"prompt": text}, path="/tokenize")
                self.assertEqual(status, 200, t)
                self.assertEqual(t["tokens"], self.tokenizer_ids(text))
                self.assertEqual(t["count"], len(t["tokens"]))
                self.assertEqual(t["max_model_len"], 2048)
                status, d = post(self.port, {"tokens": t["tokens"]}, path="/detokenize")
                self.assertEqual(status, 200, d)
                self.assertEqual(d["prompt"], text)

    def test_tokenize_chat_and_content_parts(self):
        def tokens(messages, **kw):
            status, t = post(self.port, {"messages": messages, **kw}, path="/tokenize")
            self.assertEqual(status, 200, t)
            return t["tokens"]

        plain = tokens([{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "first\nsecond"}])
        parts = tokens([{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                        {"role": "user", "content": [{"type": "text", "text": "first"},
                                                     {"type": "text", "text": "second"}]}])
        self.assertEqual(parts, plain)
        want = self.tokenizer_ids("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                  "first\nsecond<|im_end|>\n<|im_start|>assistant\n")
        self.assertEqual(plain, want)
        no_think = tokens([{"role": "user", "content": "hi"}],
                          chat_template_kwargs={"enable_thinking": False})
        self.assertEqual(no_think[-len(self.tokenizer_ids("<think>\n\n</think>\n\n")):],
                         self.tokenizer_ids("<think>\n\n</think>\n\n"))
        no_prompt = tokens([{"role": "user", "content": "hi"}], add_generation_prompt=False)
        self.assertEqual(no_prompt, self.tokenizer_ids("<|im_start|>user\nhi<|im_end|>\n"))
        # A chat request with parts renders the same prompt as with the joined string.
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                          {"type": "text", "text": "b"}]}],
                "max_tokens": 1, "temperature": 0}
        status, resp = post(self.port, body, path="/v1/chat/completions")
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["usage"]["prompt_tokens"],
                         len(tokens([{"role": "user", "content": "a\nb"}])))

    def test_tool_calls_in_the_history(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
        status, t = post(self.port, {"messages": messages, "tools": tools}, path="/tokenize")
        self.assertEqual(status, 200, t)
        status, d = post(self.port, {"tokens": t["tokens"]}, path="/detokenize")
        self.assertIn('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", '
                      '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>', d["prompt"])
        self.assertIn("<tool_response>\n18 C\n</tool_response>", d["prompt"])
        self.assertIn("# Tools", d["prompt"])
        # A chat completion with tools: this random model writes no call, so content and no
        # tool_calls (the parsing itself is unit-tested in test_api.cpp).
        body = {"messages": messages, "tools": tools, "max_tokens": 6, "temperature": 0}
        status, resp = post(self.port, body, path="/v1/chat/completions")
        self.assertEqual(status, 200, resp)
        choice = resp["choices"][0]
        self.assertNotIn("tool_calls", choice["message"])
        self.assertIn(choice["finish_reason"], ("stop", "length"))
        status, chunks, done = stream(self.port, dict(body, stream=True),
                                      path="/v1/chat/completions")
        self.assertTrue(done)
        self.assertEqual("".join(c["choices"][0]["delta"].get("content", "") for c in chunks
                                 if c["choices"]), choice["message"]["content"])
        status, resp = post(self.port, dict(body, messages=[
            messages[0], dict(messages[1], tool_calls=[{"function": {"name": "f",
                                                                     "arguments": "{oops"}}])]),
            path="/v1/chat/completions")
        self.assertEqual(status, 400)
        self.assertEqual(resp["error"]["param"], "messages[1].tool_calls[0].function.arguments")

    def test_text_endpoints_bad_input(self):
        p = self.port
        cases = [
            ("/detokenize", {"tokens": [1, 151669]}, "tokens[1]"),
            ("/detokenize", {"tokens": [1, -2]}, "tokens[1]"),
            ("/detokenize", {"tokens": [0.5]}, "tokens[0]"),
            ("/detokenize", {"tokens": "12"}, "tokens"),
            ("/detokenize", {"tokens": [[1]]}, "tokens[0]"),
            ("/detokenize", {}, "tokens"),
            ("/tokenize", {"prompt": 5}, "prompt"),
            ("/tokenize", {}, "prompt"),
            ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             "messages[0].content[0].type"),
            ("/tokenize", {"prompt": "x", "model": "nope"}, "model"),
            ("/v1/chat/completions",
             {"messages": [{"role": "user", "content": [
                 {"type": "text", "text": "look"},
                 {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
             "messages[0].content[1].type"),
            ("/v1/chat/completions",
             {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
             "messages[0].content[0].type"),
            ("/v1/chat/completions",
             {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
             "messages[0].content[0].text"),
            # A chat prompt past the context (2048): the engine's "prompt" is the messages.
            ("/v1/chat/completions",
             {"messages": [{"role": "user", "content": "a " * 3000}]}, "messages"),
        ]
        for path, body, param in cases:
            with self.subTest(path=path, body=str(body)[:60]):
                status, resp = post(p, body, path=path)
                self.assertIn(status, (400, 404), resp)
                self.assertEqual(resp["error"]["param"], param)
        # A huge id list and invalid UTF-8: 400 or an answer, never a crash.
        status, resp = post(p, {"tokens": list(range(100000))}, path="/detokenize")
        self.assertEqual(status, 200)
        for path in ("/tokenize", "/detokenize"):
            status, payload = request(p, "POST", path, raw=b'{"prompt": "\xff\xfe"}')
            self.assertEqual(status, 400)
        self.assertEqual(request(p, "GET", "/health")[0], 200)

    def test_openai_client_text_and_chat(self):
        openai = openai_module()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                               max_retries=0)
        whole = self.complete()["choices"][0]["text"]
        r = client.completions.create(model="text", prompt="The quick brown fox jumps over",
                                      max_tokens=40, temperature=0)
        self.assertEqual(r.choices[0].text, whole)
        self.assertEqual(r.usage.prompt_tokens, 6)
        pieces = client.completions.create(model="text", prompt="The quick brown fox jumps over",
                                           max_tokens=40, temperature=0, stream=True)
        self.assertEqual("".join(c.text for p in pieces for c in p.choices), whole)

        messages = [{"role": "user", "content": "Hello there"}]
        extra = {"chat_template_kwargs": {"enable_thinking": False}}
        status, raw = post(self.port, {"model": "text", "messages": messages, "max_tokens": 8,
                                       "temperature": 0, **extra}, path="/v1/chat/completions")
        if status == 400 and "unavailable" in raw["error"]["message"]:
            self.skipTest(raw["error"]["message"])
        self.assertEqual(status, 200, raw)
        want = raw["choices"][0]["message"]["content"]
        c = client.chat.completions.create(model="text", messages=messages, max_tokens=8,
                                           temperature=0, extra_body=extra)
        self.assertEqual(c.choices[0].message.role, "assistant")
        self.assertEqual(c.choices[0].message.content, want)
        self.assertEqual(c.usage.completion_tokens, 8)
        chunks = list(client.chat.completions.create(
            model="text", messages=messages, max_tokens=8, temperature=0, extra_body=extra,
            stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual("".join(ch.choices[0].delta.content or "" for ch in chunks
                                 if ch.choices), want)
        self.assertEqual(chunks[-1].usage.completion_tokens, 8)
        with self.assertRaises(openai.BadRequestError):
            client.chat.completions.create(model="text", messages=[], max_tokens=8)


    def test_auto_tool_calls_stream_their_arguments(self):
        # tool_choice auto parses <tool_call> blocks from free text; a regex makes the random
        # model write one (spelled in ordinary tokens, which decode to the same text).
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]
        body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": tools,
                "max_tokens": 60, "temperature": 1.0, "seed": 4,
                "chat_template_kwargs": {"enable_thinking": False},
                "guided_regex": 'Sure\\.\\n<tool_call>\\n\\{"name": "get_weather", "arguments": '
                                '\\{"city": "[a-z]{3,9}"\\}\\}\\n</tool_call>'}
        status, whole = post(self.port, body, path="/v1/chat/completions")
        self.assertEqual(status, 200, whole)
        msg = whole["choices"][0]["message"]
        self.assertEqual(whole["choices"][0]["finish_reason"], "tool_calls", whole)
        self.assertEqual(msg["content"], "Sure.\n")
        self.assertEqual(msg["tool_calls"][0]["function"]["name"], "get_weather")
        args = json.loads(msg["tool_calls"][0]["function"]["arguments"])
        status, events, done = stream(self.port, dict(body, stream=True),
                                      path="/v1/chat/completions")
        deltas = [tc for e in events for c in e["choices"]
                  for tc in c.get("delta", {}).get("tool_calls") or []]
        self.assertEqual(deltas[0]["function"]["name"], "get_weather")
        self.assertTrue(deltas[0]["id"].startswith("call_"))
        pieces = [d["function"]["arguments"] for d in deltas if d["function"].get("arguments")]
        self.assertGreater(len(pieces), 1)  # the arguments came in several chunks
        self.assertEqual(json.loads("".join(pieces)), args)
        self.assertEqual("".join(c["delta"].get("content") or "" for e in events
                                 for c in e["choices"]), "Sure.\n")
        self.assertEqual(events[-1]["choices"][0]["finish_reason"], "tool_calls")

    def test_openai_tool_call_round_trip(self):
        # A forced call (tool_choice names the function: constrained decoding, so even a random
        # model calls it), the tool's answer, then the final message; streaming and not, with the
        # official client and the real Qwen3 template.
        import jsonschema
        openai = openai_module()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                               max_retries=0)
        params = {"type": "object",
                  "properties": {"city": {"type": "string", "maxLength": 12},
                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city", "days"]}
        tools = [{"type": "function", "function": {"name": "get_weather",
                                                   "description": "The weather of a city",
                                                   "parameters": params}},
                 {"type": "function", "function": {"name": "get_time",
                                                   "parameters": {"type": "object", "properties": {
                                                       "zone": {"enum": ["UTC", "CET"]}},
                                                       "required": ["zone"]}}}]
        extra = {"chat_template_kwargs": {"enable_thinking": False}}
        messages = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
        forced = {"type": "function", "function": {"name": "get_weather"}}
        args = dict(model="text", messages=messages, tools=tools, tool_choice=forced,
                    max_tokens=80, temperature=0.8, seed=5, extra_body=extra)
        r = client.chat.completions.create(**args)
        msg = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertIsNone(msg.content)
        self.assertEqual(len(msg.tool_calls), 1)
        call = msg.tool_calls[0]
        self.assertEqual(call.function.name, "get_weather")
        self.assertTrue(call.id.startswith("call_"))
        jsonschema.validate(json.loads(call.function.arguments), params)
        # Streamed: the header once, then the arguments in pieces that add up to the same call.
        chunks = list(client.chat.completions.create(**args, stream=True))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        self.assertGreater(len(deltas), 1)
        self.assertEqual(deltas[0].function.name, "get_weather")
        self.assertTrue(deltas[0].id.startswith("call_"))
        self.assertTrue(all(d.id is None for d in deltas[1:]))
        self.assertEqual("".join(d.function.arguments or "" for d in deltas),
                         call.function.arguments)
        # The second turn: the call and the tool's answer reach the template.
        history = messages + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call.id, "type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        status, tok = post(self.port, {"messages": history, "tools": tools, **extra},
                           path="/tokenize")
        self.assertEqual(status, 200, tok)
        status, text = post(self.port, {"tokens": tok["tokens"]}, path="/detokenize")
        self.assertIn("sunny, 21 C", text["prompt"])
        self.assertIn("get_weather", text["prompt"])
        for stream in (False, True):
            final = client.chat.completions.create(model="text", messages=history, tools=tools,
                                                   max_tokens=12, temperature=0,
                                                   extra_body=extra, stream=stream)
            if stream:
                final = list(final)
                self.assertIn(final[-1].choices[0].finish_reason, ("stop", "length",
                                                                   "tool_calls"))
            else:
                self.assertEqual(final.choices[0].message.role, "assistant")
                self.assertIn(final.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        # tool_choice "required": a list of calls of the given tools, finish_reason tool_calls.
        r = client.chat.completions.create(model="text", messages=messages, tools=tools,
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=120, temperature=0.8, seed=2,
                                           extra_body=extra)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls", r)
        self.assertEqual(len(r.choices[0].message.tool_calls), 1)
        c = r.choices[0].message.tool_calls[0]
        self.assertIn(c.function.name, ("get_weather", "get_time"))
        schema = params if c.function.name == "get_weather" else tools[1]["function"]["parameters"]
        jsonschema.validate(json.loads(c.function.arguments), schema)
        # tool_choice "none": no tools in the prompt, no calls parsed.
        r = client.chat.completions.create(model="text", messages=messages, tools=tools,
                                           tool_choice="none", max_tokens=8, temperature=0,
                                           extra_body=extra)
        self.assertFalse(r.choices[0].message.tool_calls)


    def test_openai_schema_output_is_complete_at_t1(self):
        # Compact separators by default: nothing to spend max_tokens on between the values, so at
        # temperature 1 every seed ends with complete JSON that the schema accepts.
        import jsonschema
        openai = openai_module()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                               max_retries=0)
        schema = {"type": "object",
                  "properties": {"city": {"type": "string", "maxLength": 10},
                                 "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                 "tags": {"type": "array", "items": {"type": "boolean"},
                                          "maxItems": 3},
                                 "meta": {"type": "object", "properties": {
                                     "ok": {"type": "boolean"}}, "required": ["ok"]}},
                  "required": ["city", "days", "tags", "meta"]}
        extra = {"chat_template_kwargs": {"enable_thinking": False}}
        for seed in range(5):
            with self.subTest(seed=seed):
                r = client.chat.completions.create(
                    model="text", messages=[{"role": "user", "content": "Plan a trip."}],
                    max_tokens=120, temperature=1.0, seed=seed, extra_body=extra,
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "trip", "schema": schema}})
                text = r.choices[0].message.content
                self.assertEqual(r.choices[0].finish_reason, "stop", text)
                jsonschema.validate(json.loads(text), schema)
                self.assertEqual(free_whitespace(text), [], text)
        r = client.chat.completions.create(
            model="text", messages=[{"role": "user", "content": "JSON please."}], max_tokens=400,
            temperature=1.0, seed=3, extra_body=extra, response_format={"type": "json_object"})
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
            self.assertEqual(free_whitespace(r.choices[0].message.content), [])
        # The opt-in is a boolean, and it is accepted with every JSON form.
        with self.assertRaises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="text", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                extra_body={"flexible_whitespace": "yes"}, response_format={"type": "json_object"})
        self.assertEqual(e.exception.body["param"], "flexible_whitespace")
        r = client.chat.completions.create(
            model="text", messages=[{"role": "user", "content": "x"}], max_tokens=200,
            temperature=1.0, seed=1, extra_body=dict(extra, flexible_whitespace=True),
            response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)

    def test_openai_required_tool_calls_stream_as_deltas(self):
        # tool_choice "required" streams like a named choice: per call a delta with its id and
        # name, then its arguments in pieces; they add up to the non-streamed calls of the seed.
        import jsonschema
        openai = openai_module()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                               max_retries=0)
        weather = {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}
        zone = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"]}
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}},
                 {"type": "function", "function": {"name": "get_time", "parameters": zone}}]
        schemas = {"get_weather": weather, "get_time": zone}
        extra = {"chat_template_kwargs": {"enable_thinking": False}}
        # A random model may write parallel calls until max_tokens: those seeds are skipped.
        ended = 0
        for seed, parallel in ((2, False), (3, False), (4, True), (5, True), (6, True), (7, True)):
            with self.subTest(seed=seed, parallel=parallel):
                args = dict(model="text", tools=tools, tool_choice="required",
                            messages=[{"role": "user", "content": "Weather in Paris?"}],
                            parallel_tool_calls=parallel, max_tokens=200, temperature=1.0,
                            seed=seed, extra_body=extra)
                whole = client.chat.completions.create(**args)
                if parallel and whole.choices[0].finish_reason == "length":
                    continue
                ended += 1
                self.assertEqual(whole.choices[0].finish_reason, "tool_calls", whole)
                calls = whole.choices[0].message.tool_calls
                self.assertIsNone(whole.choices[0].message.content)
                chunks = list(client.chat.completions.create(**args, stream=True))
                choices = [ch.choices[0] for ch in chunks if ch.choices]
                self.assertEqual("".join(c.delta.content or "" for c in choices), "")
                self.assertEqual([c.finish_reason for c in choices if c.finish_reason],
                                 ["tool_calls"])
                deltas = [tc for c in choices for tc in (c.delta.tool_calls or [])]
                names, ids, pieces = {}, {}, {}
                for d in deltas:
                    if d.id is not None:
                        self.assertNotIn(d.index, ids)
                        ids[d.index], names[d.index] = d.id, d.function.name
                        pieces[d.index] = []
                    else:
                        self.assertIn(d.index, ids)  # the name comes first
                        self.assertIsNone(d.function.name)
                    pieces[d.index].append(d.function.arguments or "")
                self.assertEqual(sorted(ids), list(range(len(calls))))
                for k, call in enumerate(calls):
                    self.assertTrue(ids[k].startswith("call_"))
                    self.assertEqual(names[k], call.function.name)
                    streamed = "".join(pieces[k])
                    self.assertEqual(streamed, call.function.arguments)
                    self.assertEqual(json.loads(streamed), json.loads(call.function.arguments))
                    jsonschema.validate(json.loads(streamed), schemas[call.function.name])
                    # In pieces, not one chunk at the end.
                    self.assertGreater(len([p for p in pieces[k] if p]), 1)
        self.assertGreaterEqual(ended, 3)


class DefaultPairTest(unittest.TestCase):
    """Structured output on the built-in pair: a small trained model with a real 2048-token
    vocabulary, where whitespace tokens are likely at temperature 1."""

    @classmethod
    def setUpClass(cls):
        pair = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models",
                            "default")
        if not os.path.exists(os.path.join(pair, "target", "tokenizer.json")):
            raise unittest.SkipTest("models/default is missing")
        cls.proc = subprocess.Popen(
            [FLASHMAP, "serve", "--target", os.path.join(pair, "target"), "--draft",
             os.path.join(pair, "draft"), "--port", "0", "--served-model-name", "default"],
            stderr=subprocess.PIPE, text=True)
        line = ""
        for line in cls.proc.stderr:
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                cls.port = int(m.group(1))
                threading.Thread(target=lambda: cls.proc.stderr.read(), daemon=True).start()
                return
        cls.proc.kill()
        raise RuntimeError("default-pair server did not start: " + line)

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()

    SCHEMA = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 8},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120},
                             "tags": {"type": "array", "items": {"enum": ["red", "blue"]},
                                      "maxItems": 3},
                             "ok": {"type": "boolean"}},
              "required": ["name", "age", "tags"]}

    def schema_output(self, client, seed, **extra):
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Describe a person as JSON."}],
            max_tokens=160, temperature=1.0, seed=seed, extra_body=extra or None,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "p", "schema": self.SCHEMA}})
        return r.choices[0].finish_reason, r.choices[0].message.content

    def test_schema_output_ends_and_flexible_whitespace_is_opt_in(self):
        import jsonschema
        openai = openai_module()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                               max_retries=0)
        for seed in range(6):
            with self.subTest(seed=seed):
                finish, text = self.schema_output(client, seed)
                self.assertEqual(finish, "stop", text)
                jsonschema.validate(json.loads(text), self.SCHEMA)
                self.assertEqual(free_whitespace(text), [], text)
        # The opt-in gives the model the free whitespace back (this model takes it), and what
        # ends is still valid.
        flexible = [self.schema_output(client, seed, flexible_whitespace=True)
                    for seed in range(3)]
        self.assertTrue(any(free_whitespace(text) for _, text in flexible), flexible)
        for finish, text in flexible:
            if finish == "stop":
                jsonschema.validate(json.loads(text), self.SCHEMA)


class ReasoningTest(unittest.TestCase):
    """reasoning_content on a template that leaves the prompt inside an open think block (as
    Qwen3-2507 Thinking's does), so that a random model's output is all reasoning."""

    @classmethod
    def setUpClass(cls):
        import shutil
        import tempfile
        tok = os.path.join(os.path.dirname(FIXTURE), "..", "data", "qwen3-tokenizer")
        if not os.path.exists(os.path.join(tok, "tokenizer.json")):
            raise unittest.SkipTest("tests/data/qwen3-tokenizer is missing")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = os.path.join(cls.tmp.name, "model")
        write_text_model(cls.model)
        cls.tok = os.path.join(cls.tmp.name, "tok")
        os.makedirs(cls.tok)
        shutil.copy(os.path.join(tok, "tokenizer.json"), cls.tok)
        with open(os.path.join(cls.tok, "chat_template.jinja"), "w") as f:
            f.write("{{ '<|im_start|>user\\n' + messages[-1].content + '<|im_end|>\\n' }}"
                    "{{ '<|im_start|>assistant\\n<think>\\n' }}")
        cls.servers = []

    @classmethod
    def tearDownClass(cls):
        for proc in cls.servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        cls.tmp.cleanup()

    def serve(self, *extra):
        proc = subprocess.Popen(
            [FLASHMAP, "serve", "--target", self.model, "--tokenizer", self.tok, "--port", "0",
             *extra], stderr=subprocess.PIPE, text=True)
        self.servers.append(proc)
        for line in proc.stderr:
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
                return int(m.group(1))
        self.fail("server did not start")

    def test_reasoning_split_and_raw(self):
        port = self.serve()
        body = {"messages": [{"role": "user", "content": "Why?"}], "max_tokens": 12,
                "temperature": 0}
        status, resp = post(port, body, path="/v1/chat/completions")
        self.assertEqual(status, 200, resp)
        msg = resp["choices"][0]["message"]
        # The same prompt as a completion: its text is reasoning [+ </think> + content].
        prompt = "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>\n"
        status, whole = post(port, {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        self.assertEqual(status, 200, whole)
        text = whole["choices"][0]["text"]
        self.assertTrue(msg["reasoning_content"])
        self.assertEqual(msg["reasoning_content"] + ("</think>" + msg["content"]
                                                     if "</think>" in text else ""), text)
        # Streaming: reasoning_content deltas, then content deltas, adding up to the same.
        status, chunks, done = stream(port, dict(body, stream=True), path="/v1/chat/completions")
        self.assertTrue(done)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas),
                         msg["reasoning_content"])
        self.assertEqual("".join(d.get("content", "") for d in deltas), msg["content"])
        kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
        self.assertEqual(kinds, sorted(kinds, key=lambda k: k == "content"))
        # --reasoning raw: everything stays in content, as before.
        raw = self.serve("--reasoning", "raw")
        status, resp = post(raw, body, path="/v1/chat/completions")
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["choices"][0]["message"]["content"], text)
        self.assertNotIn("reasoning_content", resp["choices"][0]["message"])


class ShutdownTest(unittest.TestCase):
    def test_sigterm_finishes_running_requests(self):
        proc, port, log = start_server()
        try:
            result = {}

            def client():
                result["r"] = stream(port, {"prompt": [1, 2, 3], "max_tokens": 300,
                                            "stream": True})

            t = threading.Thread(target=client)
            t.start()
            deadline = time.time() + 10
            while time.time() < deadline and metrics(port)["flashmap_running_sequences"] < 1:
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.1)
            try:
                status, _ = post(port, {"prompt": [1], "max_tokens": 1})
                self.assertEqual(status, 503)
            except (ConnectionError, OSError):
                pass  # already closed: also refused
            t.join(timeout=60)
            status, chunks, done = result["r"]
            self.assertTrue(done)
            ids = [x for c in chunks for ch in c["choices"] for x in ch.get("token_ids", [])]
            self.assertEqual(len(ids), 300)
            self.assertEqual(proc.wait(timeout=30), 0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    FLASHMAP, FIXTURE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
