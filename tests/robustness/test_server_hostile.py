#!/usr/bin/env python3
"""`flashmap serve` against hostile clients, over loopback only.

    python3 tests/robustness/test_server_hostile.py BUILD/flashmap tests/fixtures/tiny-a

Each test attacks a server started for it and then checks that the server is still alive and
answers a normal request correctly: invalid UTF-8 in the path and headers, padding ids sampled
at a high temperature (streaming and not), slowloris (dripping sockets, bounded in number and
time), generation up to the end of the context with speculation forced, large declared bodies,
seeded sampling reproduced under a concurrent load, a whole oversized body, and model files that
are removed or truncated under a running server. Every loop here is bounded in count and time,
and every server is stopped at the end.
"""

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import test_server_e2e as e2e  # noqa: E402  (request, post, stream, metrics)


def raw_exchange(port, data, timeout=5.0):
    """Sends raw bytes and returns the raw answer (up to the server closing or `timeout`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out:
                head, _, body = out.partition(b"\r\n\r\n")
                length = [int(l.split(b":")[1]) for l in head.split(b"\r\n")
                          if l.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    break
        return out
    finally:
        s.close()


def status_of(answer):
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def json_of(answer):
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def trimmed_tokenizer(src_dir, dst_dir, keep):
    """The default pair's BPE tokenizer cut to ids below `keep`: a tokenizer that knows fewer
    ids than a model's embedding has rows, as Qwen3's (151,669 ids, 151,936 rows)."""
    with open(os.path.join(src_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < keep}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = merges
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < keep]
    os.makedirs(dst_dir, exist_ok=True)
    with open(os.path.join(dst_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f)
    return len(vocab)


class Server:
    """A server for one test: started, then always stopped."""

    def __init__(self, *extra, target=None, draft=True):
        """`target`: another target folder; `draft` False: no drafter (else the fixture's)."""
        import re
        import subprocess
        pair = ["--draft", e2e.FIXTURE + "/draft"] if draft else ["--no-draft"]
        args = [e2e.FLASHMAP, "serve", "--port", "0",
                "--target", target or e2e.FIXTURE + "/target", *pair, *extra]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, errors="replace")
        deadline = time.time() + 60
        lines = []
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self.log = []
                # Keep draining stderr so that the server never blocks on a full pipe.
                threading.Thread(target=lambda: self.log.extend(self.proc.stderr),
                                 daemon=True).start()
                return
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("server did not start:\n" + "".join(lines))

    def alive_and_correct(self, test):
        """The server answers /health and a greedy completion after the attack."""
        test.assertIsNone(self.proc.poll(), "the server died:\n" + "".join(self.log[-20:]))
        status, _ = e2e.request(self.port, "GET", "/health", timeout=10)
        test.assertEqual(status, 200)
        status, body = e2e.post(self.port, {"prompt": [1, 2, 3], "max_tokens": 4}, timeout=30)
        test.assertEqual(status, 200, body)
        test.assertEqual(len(body["choices"][0]["token_ids"]), 4)

    def stop(self, test=None, within=30):
        """SIGTERM; with a test, the server must exit 0 within `within` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=within)
                if test is not None:
                    test.assertEqual(rc, 0, "".join(self.log[-20:]))
            except Exception:
                self.proc.kill()
                self.proc.wait()
                if test is not None:
                    test.fail("the server did not stop on SIGTERM within %d s" % within)


class HostileRequests(unittest.TestCase):
    def test_invalid_utf8_in_path_and_headers(self):
        srv = Server("--api-key", "sk-k")
        try:
            for path in (b"/\xff", b"/v1/\xc3\x28", b"/health\xed\xa0\x80", b"/" + b"\x80" * 5000):
                answer = raw_exchange(srv.port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertIn(status_of(answer), (401, 404, 414), answer[:200])
                if status_of(answer) != 414:
                    self.assertIn("error", json_of(answer))
            for header in (b"Authorization: Bearer \xff\xfe", b"X-Thing: \xc0\xaf",
                           b"\xff\xff: yes"):
                answer = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" +
                                      header + b"\r\nContent-Length: 2\r\n\r\n{}")
                self.assertIn(status_of(answer), (400, 401), answer[:200])
            # Bodies that would take a handler down or make every token expensive.
            auth = {"Authorization": "Bearer sk-k"}
            for body in (b"[" * 100000 + b"]" * 100000,
                         b'{"prompt": "hi", "tools": ' + b"[" * 50000 + b"]" * 50000 + b"}",
                         b'{"messages": [{"role": "user", "content": ' + b"[" * 30000 +
                         b"]" * 30000 + b"}]}",
                         json.dumps({"prompt": [1], "stop": ["x" * 100000]}).encode(),
                         json.dumps({"prompt": [1], "stop_token_ids": [1] * 100000}).encode()):
                for path in ("/v1/completions", "/v1/chat/completions"):
                    status, payload = e2e.request(srv.port, "POST", path, raw=body, headers=auth)
                    self.assertEqual(status, 400, payload[:300])
                    self.assertIn("error", json.loads(payload))
            # A body that is not UTF-8, with a valid key.
            body = b'{"prompt": "\xff"}'
            answer = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"Authorization: Bearer sk-k\r\nContent-Length: %d\r\n\r\n"
                                  % len(body) + body)
            self.assertEqual(status_of(answer), 400, answer[:300])
            # The server still works, with the key.
            status, body = e2e.post(srv.port, {"prompt": [1, 2], "max_tokens": 3},
                                    headers={"Authorization": "Bearer sk-k"})
            self.assertEqual(status, 200, body)
            self.assertIsNone(srv.proc.poll())
        finally:
            srv.stop(self)

    def test_padding_ids_are_never_sampled(self):
        # The fixture's target has 1024 embedding rows; the tokenizer here knows 1000 ids. At
        # temperature 5 sampling is near-uniform: unmasked, ~2% of the tokens would be padding.
        tmp = tempfile.mkdtemp()
        try:
            known = trimmed_tokenizer(os.path.join(ROOT, "models", "default", "target"), tmp,
                                      1000)
            self.assertEqual(known, 1000)
            srv = Server("--tokenizer", tmp)
            try:
                seen = []
                for i in range(6):
                    req = {"prompt": [1, 2, 3 + i], "max_tokens": 120, "temperature": 5.0}
                    status, body = e2e.post(srv.port, req)
                    self.assertEqual(status, 200, body)
                    seen += body["choices"][0]["token_ids"]
                    self.assertIsInstance(body["choices"][0]["text"], str)
                    req["stream"] = True
                    req["seed"] = i
                    status, chunks, done = e2e.stream(srv.port, req)
                    self.assertTrue(done, chunks[-1:])
                    self.assertFalse([c for c in chunks if "error" in c], chunks[-1:])
                    seen += [t for c in chunks for ch in c["choices"]
                             for t in ch.get("token_ids", [])]
                self.assertEqual(len(seen), 6 * 2 * 120)
                self.assertLess(max(seen), known)
                # Varied enough that unmasked sampling would have met the padding.
                self.assertGreater(len(set(seen)), 500)
                srv.alive_and_correct(self)
            finally:
                srv.stop(self)
        finally:
            shutil.rmtree(tmp)

    def test_text_endpoints_and_request_fields(self):
        # /tokenize, /detokenize, /v1/models/{id}, content parts, unknown and unsupported fields:
        # wrong types, huge arrays and numbers, invalid UTF-8 get a 400 naming the field.
        tmp = tempfile.mkdtemp()
        default = os.path.join(ROOT, "models", "default", "target")
        trimmed_tokenizer(default, tmp, 1000)  # the fixture's target has 1024 rows
        shutil.copy(os.path.join(default, "tokenizer_config.json"), tmp)
        srv = Server("--tokenizer", tmp)
        try:
            p = srv.port
            chat = "/v1/chat/completions"
            user = lambda content: {"messages": [{"role": "user", "content": content}]}
            cases = [
                ("/detokenize", {"tokens": [2 ** 64]}, "tokens[0]"),
                ("/detokenize", {"tokens": [-2 ** 63]}, "tokens[0]"),
                ("/detokenize", {"tokens": [1, 1e300]}, "tokens[1]"),
                ("/detokenize", {"tokens": [1, None]}, "tokens[1]"),
                ("/detokenize", {"tokens": [{"id": 1}]}, "tokens[0]"),
                ("/detokenize", {"tokens": [1] * 400000 + [1000]}, "tokens[400000]"),
                ("/detokenize", {"tokens": {"0": 1}}, "tokens"),
                ("/tokenize", {"prompt": ["a"]}, "prompt"),
                ("/tokenize", {"prompt": None, "messages": None}, "prompt"),
                ("/tokenize", user([{"type": "text", "text": "a"}] * 50000 + [{"type": 1}]),
                 "messages[0].content[50000].type"),
                ("/tokenize", user("x") | {"add_generation_prompt": "yes"},
                 "add_generation_prompt"),
                (chat, user([[{"type": "text", "text": "nested"}]]), "messages[0].content[0]"),
                (chat, user([{"type": "file", "file": {"file_data": "AAAA"}}]),
                 "messages[0].content[0].type"),
                (chat, user("x") | {"presence_penalty": "high"}, "presence_penalty"),
                (chat, user("x") | {"logit_bias": [1, 2]}, "logit_bias"),
                (chat, user("x") | {"n": 10 ** 30}, "n"),
                (chat, user("x") | {"tool_choice": 5}, "tool_choice"),
                (chat, user("x") | {"tools": {"f": 1}}, "tools"),
                (chat, user("x") | {"response_format": {"type": "json_schema"}},
                 "response_format"),
                # Structured output and sampling controls: sizes from the request are bounded
                # before anything is compiled or allocated.
                (chat, user("x") | {"guided_regex": "a{100000}"}, "guided_regex"),
                (chat, user("x") | {"guided_regex": "(" * 5000}, "guided_regex"),
                (chat, user("x") | {"guided_choice": ["c%d" % i for i in range(10000)]},
                 "guided_choice"),
                (chat, user("x") | {"guided_json": {"type": "array", "minItems": 10 ** 9}},
                 "guided_json"),
                (chat, user("x") | {"guided_json": {"type": "object", "properties": {
                    "p%d" % i: {"type": "string"} for i in range(5000)}}}, "guided_json"),
                (chat, user("x") | {"response_format": {"type": "json_schema", "json_schema": {
                    "schema": {"$defs": {"n": {"type": "object", "properties": {
                        "a": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}}}},
                 "response_format"),
                (chat, user("x") | {"tools": [{"type": "function", "function": {
                    "name": "f", "parameters": {"type": "string", "pattern": "a{1000}"}}}],
                    "tool_choice": "required"}, "tool_choice"),
                (chat, user("x") | {"logit_bias": {str(i): 1 for i in range(100000)}},
                 "logit_bias"),
                (chat, user("x") | {"top_logprobs": 10 ** 12, "logprobs": True}, "top_logprobs"),
                ("/v1/completions", {"prompt": [1], "best_of": 10 ** 6}, "best_of"),
                ("/v1/completions", {"prompt": [1], "prompt_logprobs": 10 ** 6},
                 "prompt_logprobs"),
                (chat, {"messages": [{"role": "assistant", "tool_calls": [{"function": [1]}]}]},
                 "messages[0].tool_calls[0].function"),
                (chat, {"messages": [{"role": "assistant", "tool_calls": [{"function": {
                    "name": "f", "arguments": "[" * 60 + "]" * 60}}]}]},
                 "messages[0].tool_calls[0].function.arguments"),
            ]
            for path, body, param in cases:
                with self.subTest(path=path, param=param):
                    status, resp = e2e.post(p, body, path=path, timeout=30)
                    self.assertEqual(status, 400, resp)
                    self.assertEqual(resp["error"]["param"], param, resp)
            # Invalid UTF-8 in a body and in a model id.
            for path in ("/tokenize", "/detokenize", chat):
                status, _ = e2e.request(p, "POST", path, raw=b'{"prompt": "a\xc0\xaf"}')
                self.assertEqual(status, 400)
            answer = raw_exchange(p, b"GET /v1/models/\xff\xfe%ff HTTP/1.1\r\nHost: x\r\n"
                                     b"Connection: close\r\n\r\n")
            self.assertEqual(status_of(answer), 404)
            self.assertEqual(json_of(answer)["error"]["param"], "model")
            status, payload = e2e.request(p, "GET", "/v1/models/" + "m" * 20000)
            self.assertIn(status, (404, 414, 431))
            # 9,000 distinct unknown fields: accepted, and the log stays bounded.
            body = {"prompt": [1, 2], "max_tokens": 2}
            body.update({"unknown_%d" % i: i for i in range(9000)})
            status, resp = e2e.post(p, body, timeout=30)
            self.assertEqual(status, 200, resp)
            time.sleep(0.3)
            warnings = [l for l in srv.log if "unknown request field" in l]
            self.assertLessEqual(len(warnings), 256)
            self.assertIn("no more unknown fields will be logged", warnings[-1])
            # A 3 MB prompt tokenizes (the body limit is 4 MiB).
            status, resp = e2e.post(p, {"prompt": "ab " * 1000000}, path="/tokenize", timeout=60)
            self.assertEqual(status, 200)
            self.assertEqual(resp["count"], len(resp["tokens"]))
            srv.alive_and_correct(self)
        finally:
            srv.stop(self)
            shutil.rmtree(tmp)

    def test_responses_and_messages_bodies(self):
        # Every field and item type of /v1/responses, /v1/messages and count_tokens given
        # hostile values (wrong types, huge arrays and numbers, invalid UTF-8, unknown item
        # types, results for unknown calls, empty content): a 400 in the API's own error shape
        # (or an answer, where the value is valid), never a crash or a hang.
        from text_model import official_tokenizer, write_text_model
        tmp = tempfile.mkdtemp()
        write_text_model(os.path.join(tmp, "model"))
        official_tokenizer(os.path.join(tmp, "tok"))
        srv = Server("--tokenizer", os.path.join(tmp, "tok"), "--max-running", "4",
                     target=os.path.join(tmp, "model"), draft=False)
        try:
            p = srv.port
            tool = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}}}
            responses = {
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                          {"type": "function_call", "call_id": "c", "name": "f",
                           "arguments": '{"a": "x"}'},
                          {"type": "function_call_output", "call_id": "c", "output": "ok"},
                          {"type": "reasoning", "summary": [{"type": "summary_text",
                                                             "text": "t"}]}],
                "instructions": "x", "max_output_tokens": 2,
                "tools": [{"type": "function", "name": "f", "parameters": tool}],
                "tool_choice": "auto", "text": {"format": {"type": "text"}},
                "reasoning": {"effort": "low"}, "metadata": {"k": "v"}, "store": False,
                "include": [], "parallel_tool_calls": True, "temperature": 0, "top_p": 1,
                "truncation": "disabled", "user": "u", "top_logprobs": 0,
            }
            messages = {
                "max_tokens": 2, "system": [{"type": "text", "text": "s"}],
                "messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": [
                                 {"type": "thinking", "thinking": "t", "signature": ""},
                                 {"type": "tool_use", "id": "t1", "name": "f",
                                  "input": {"a": "x"}}]},
                             {"role": "user", "content": [
                                 {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                                 {"type": "text", "text": "go"}]}],
                "tools": [{"name": "f", "description": "d", "input_schema": tool}],
                "tool_choice": {"type": "auto"}, "stop_sequences": ["zz"],
                "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"},
                "temperature": 0, "top_p": 1, "top_k": 5,
            }
            hostile = [None, 0, -1, 2 ** 64, 1e300, "", "x" * 5000, [], [1] * 2000, {},
                       {"a": [{}]}, True, "\ud800", [{"type": "nope"}], [None], [""]]

            def check(path, body, anthropic):
                status, payload = e2e.request(p, "POST", path, body, timeout=30)
                self.assertIn(status, (200, 400), (path, body, payload[:300]))
                if status == 200:
                    return
                err = json.loads(payload)
                if anthropic:
                    self.assertEqual(err["type"], "error", err)
                    self.assertEqual(err["error"]["type"], "invalid_request_error", err)
                    self.assertTrue(err["error"]["message"])
                else:
                    self.assertEqual(err["error"]["type"], "invalid_request_error", err)
                    self.assertTrue(err["error"]["message"])

            def mutations(base):
                """The base with one field (top level, or of one item or block) replaced."""
                for key in base:
                    for v in hostile:
                        yield dict(base, **{key: v})
                for list_key in ("input", "messages"):
                    for i, item in enumerate(base.get(list_key, [])):
                        for key in item:
                            for v in hostile:
                                items = json.loads(json.dumps(base[list_key]))
                                items[i][key] = v
                                yield dict(base, **{list_key: items})
                        for j, block in enumerate(item.get("content") or []):
                            if not isinstance(block, dict):
                                continue
                            for key in block:
                                for v in hostile[:12]:
                                    items = json.loads(json.dumps(base[list_key]))
                                    items[i]["content"][j][key] = v
                                    yield dict(base, **{list_key: items})

            n = 0
            for path, base, anthropic in (("/v1/responses", responses, False),
                                          ("/v1/messages", messages, True),
                                          ("/v1/messages/count_tokens", messages, True)):
                self.assertEqual(e2e.request(p, "POST", path, base, timeout=30)[0], 200)
                for body in mutations(base):
                    check(path, body, anthropic)
                    n += 1
            self.assertGreater(n, 1000)
            # Whole bodies: invalid UTF-8, deep nesting, huge arrays, unknown items, results
            # for calls never made, empty content, arguments nested past the body's bound.
            big_input = [{"role": "user", "content": "x"}] * 60000
            cases = [
                ("/v1/responses", {"input": big_input, "max_output_tokens": 1}, "input"),
                ("/v1/responses", {"input": [{"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": "a"}]
                                              * 100000}], "max_output_tokens": 1}, "input"),
                ("/v1/responses", {"input": [{"type": "custom_tool_call"}]}, "input[0].type"),
                ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "x",
                                              "output": "y"}]}, "input[0].call_id"),
                ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c",
                                              "name": "f", "arguments": "[" * 100000}]},
                 "input[0].arguments"),
                ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": "f"}]
                                   * 50000, "tool_choice": "required"}, None),
                ("/v1/messages", {"max_tokens": 1, "messages": [
                    {"role": "user", "content": "x"}] * 60000}, "messages"),
                ("/v1/messages", {"max_tokens": 1, "messages": [
                    {"role": "user", "content": []}]}, "messages[0].content"),
                ("/v1/messages", {"max_tokens": 1, "messages": [
                    {"role": "user", "content": [{"type": "tool_result",
                                                  "tool_use_id": "nope"}]}]},
                 "messages[0].content[0].tool_use_id"),
                ("/v1/messages", {"max_tokens": 1, "messages": [
                    {"role": "user", "content": [{"type": "mystery"}]}]},
                 "messages[0].content[0].type"),
                ("/v1/messages", {"max_tokens": 2 ** 40, "messages": [
                    {"role": "user", "content": "x"}]}, "max_tokens"),
                ("/v1/messages/count_tokens", {"messages": [
                    {"role": "user", "content": "ab " * 900000}]}, None),
            ]
            for path, body, param in cases:
                with self.subTest(path=path, param=param):
                    t0 = time.time()
                    status, payload = e2e.request(p, "POST", path, body, timeout=60)
                    self.assertLess(time.time() - t0, 30)
                    if param is None:
                        self.assertIn(status, (200, 400), payload[:300])
                        continue
                    self.assertEqual(status, 400, payload[:300])
                    err = json.loads(payload)
                    if path.startswith("/v1/messages"):
                        self.assertEqual(err["type"], "error")
                    else:
                        self.assertEqual(err["error"]["param"], param, err)
            for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
                status, payload = e2e.request(p, "POST", path, raw=b'{"input": "a\xc0\xaf"}')
                self.assertEqual(status, 400)
                status, payload = e2e.request(p, "POST", path, raw=b"[" * 100000)
                self.assertEqual(status, 400)
                if path.startswith("/v1/messages"):
                    self.assertEqual(json.loads(payload)["type"], "error")
            srv.alive_and_correct(self)
            status, body = e2e.post(p, {"input": "hi", "max_output_tokens": 3},
                                    path="/v1/responses", timeout=30)
            self.assertEqual(status, 200, body)
        finally:
            srv.stop(self)
            shutil.rmtree(tmp)

    def test_generation_to_the_end_of_the_context(self):
        # A copy of the fixture's target whose context is 64 positions; speculation forced, so
        # every round wants a full block near the end.
        tmp = tempfile.mkdtemp()
        try:
            target = os.path.join(tmp, "target")
            os.makedirs(target)
            src = e2e.FIXTURE + "/target"
            for name in os.listdir(src):
                if name != "config.json":
                    os.symlink(os.path.abspath(os.path.join(src, name)), os.path.join(target, name))
            with open(os.path.join(src, "config.json")) as f:
                cfg = json.load(f)
            cfg["max_position_embeddings"] = 64
            with open(os.path.join(target, "config.json"), "w") as f:
                json.dump(cfg, f)
            srv = Server("--spec-policy", "always", target=target)
            try:
                for n_prompt in (1, 20, 50, 63):
                    for temperature in (0, 1):
                        req = {"prompt": list(range(1, n_prompt + 1)),
                               "max_tokens": 64 - n_prompt, "temperature": temperature}
                        status, body = e2e.post(srv.port, req)
                        self.assertEqual(status, 200, (n_prompt, body))
                        self.assertEqual(body["choices"][0]["finish_reason"], "length")
                        self.assertEqual(len(body["choices"][0]["token_ids"]), 64 - n_prompt)
                        req["stream"] = True
                        status, chunks, done = e2e.stream(srv.port, req)
                        self.assertTrue(done)
                        self.assertEqual(sum(len(ch.get("token_ids", [])) for c in chunks
                                             for ch in c["choices"]), 64 - n_prompt)
                # One past the context is refused up front.
                status, body = e2e.post(srv.port, {"prompt": [1] * 10, "max_tokens": 55})
                self.assertEqual(status, 400)
                self.assertEqual(body["error"]["code"], "context_length_exceeded")
                srv.alive_and_correct(self)
            finally:
                srv.stop(self)
        finally:
            shutil.rmtree(tmp)

    def test_large_declared_body_is_refused_at_once(self):
        srv = Server("--max-body-bytes", "1000000")
        try:
            for declared in (100_000_000, 1_000_001, 10 ** 17):
                t0 = time.time()
                answer = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                      b"Content-Type: application/json\r\n"
                                      b"Content-Length: %d\r\n\r\n{\"prompt\":" % declared)
                self.assertEqual(status_of(answer), 413, answer[:200])
                self.assertLess(time.time() - t0, 1.0)
                self.assertEqual(json_of(answer)["error"]["code"], "request_too_large")
            for bad in (b"Content-Length: -5", b"Content-Length: 12abc",
                        b"Content-Length: 99999999999999999999999",
                        b"Content-Length: 5\r\nContent-Length: 6", b"Transfer-Encoding: chunked"):
                answer = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" +
                                      bad + b"\r\n\r\n")
                self.assertIn(status_of(answer), (400, 411, 413), (bad, answer[:200]))
            # A head that never ends.
            answer = raw_exchange(srv.port, b"GET /health HTTP/1.1\r\n" + b"X-A: b\r\n" * 20000)
            self.assertEqual(status_of(answer), 431, answer[:200])
            srv.alive_and_correct(self)
        finally:
            srv.stop(self)

    def test_a_whole_oversized_body_still_reads_the_413(self):
        # Clients (curl, requests, the OpenAI SDK) send the whole body before reading. The 413
        # goes out when the head arrives and the body is read and dropped, so the client reads
        # the answer instead of finding the connection reset (EPIPE / ECONNRESET) mid-send.
        srv = Server("--max-body-bytes", "1000000")
        try:
            body = b'{"prompt": "' + b"x" * (5 * 1000 * 1000) + b'"}'
            for _ in range(3):
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
                try:
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                              % len(body) + body)
                    answer = b""
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        answer += chunk
                finally:
                    s.close()
                self.assertEqual(status_of(answer), 413, answer[:200])
                self.assertEqual(json_of(answer)["error"]["code"], "request_too_large")
            # A body far over what the front drains (64 MiB) is still answered at once.
            answer = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 100000000000\r\n\r\n{")
            self.assertEqual(status_of(answer), 413, answer[:200])
            srv.alive_and_correct(self)
        finally:
            srv.stop(self)

    def test_model_folder_removed_while_serving(self):
        # The weights are mapped, the tokenizer and template read at start: a folder deleted (or
        # moved) under a running server takes nothing from it.
        tmp = tempfile.mkdtemp()
        try:
            target = os.path.join(tmp, "target")
            shutil.copytree(e2e.FIXTURE + "/target", target)
            srv = Server(target=target, draft=False)
            try:
                shutil.rmtree(tmp)
                for i in range(3):
                    srv.alive_and_correct(self)
                    status, body = e2e.post(srv.port, {"prompt": [1, 2, i], "max_tokens": 8,
                                                       "temperature": 1.0, "seed": i})
                    self.assertEqual(status, 200, body)
                time.sleep(1.5)  # the server's check of its files runs about once a second
                srv.alive_and_correct(self)
            finally:
                srv.stop(self)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_weights_truncated_while_serving(self):
        # A weights file truncated in place under a running server (`cp` over it truncates
        # first): reads past its new end were a SIGBUS that killed the server without a word.
        # Now /health turns 503 naming the file, and serve exits non-zero for a supervisor.
        tmp = tempfile.mkdtemp()
        try:
            target = os.path.join(tmp, "target")
            shutil.copytree(e2e.FIXTURE + "/target", target)
            srv = Server(target=target, draft=False)
            try:
                srv.alive_and_correct(self)
                weights = os.path.join(target, "model.safetensors")
                with open(weights, "r+b") as f:
                    f.truncate(4096)
                # The embedding is read from the mapping: a request now reads the missing pages.
                status, body = e2e.post(srv.port, {"prompt": [1, 2, 3], "max_tokens": 4},
                                        timeout=30)
                self.assertIn(status, (200, 503), body)
                # /health says why for a second (while a router notices), then serve exits 1.
                deadline = time.time() + 10
                while time.time() < deadline and srv.proc.poll() is None:
                    try:
                        status, text = e2e.request(srv.port, "GET", "/health", timeout=5)
                    except OSError:
                        break
                    if status == 503:
                        self.assertIn("model.safetensors: the file shrank while it was in use",
                                      text.decode())
                        break
                    time.sleep(0.1)
                self.assertEqual(srv.proc.wait(timeout=30), 1)
                time.sleep(0.2)  # the rest of stderr
                log = "".join(srv.log)
                self.assertIn("flashmap serve: the model's files changed on disk, stopping: " +
                              weights + ": the file shrank while it was in use", log)
                self.assertIn("serve stopped: the model's files changed on disk since they were "
                              "loaded", log)
                self.assertNotIn("internal error", log)
            finally:
                srv.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_slowloris_does_not_starve_other_clients(self):
        # 100 sockets, each sending its request one byte every 0.5 s; normal requests meanwhile
        # must be answered promptly. A second round with a connection limit below the number of
        # dripping sockets: the longest-waiting ones are evicted, new clients still get in.
        for extra, n_slow in ((("--request-timeout", "4"), 100),
                              (("--max-connections", "40", "--request-timeout", "30"), 100)):
            srv = Server(*extra)
            slow = []
            stop = threading.Event()
            try:
                for _ in range(n_slow):
                    s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
                    s.sendall(b"P")
                    slow.append(s)

                def drip():
                    payload = b"OST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    for i in range(len(payload)):
                        if stop.wait(0.5):
                            return
                        for s in slow:
                            try:
                                s.sendall(payload[i:i + 1])
                            except OSError:
                                pass

                dripper = threading.Thread(target=drip, daemon=True)
                dripper.start()
                time.sleep(1.0)
                worst = 0.0
                for i in range(10):
                    t0 = time.time()
                    status, body = e2e.post(srv.port, {"prompt": [1, 2, i], "max_tokens": 8},
                                            timeout=10)
                    worst = max(worst, time.time() - t0)
                    self.assertEqual(status, 200, body)
                    self.assertEqual(len(body["choices"][0]["token_ids"]), 8)
                self.assertLess(worst, 2.0, extra)
                m = e2e.metrics(srv.port)
                if "--max-connections" in extra:
                    self.assertGreater(m['flashmap_http_refused_total{reason="evicted"}'], 0)
                else:
                    # The dripping requests run out of time: 408, and their sockets are freed.
                    # Wait for the count itself (the open-connection gauge can drop before the
                    # last timeouts are counted, on a loaded machine).
                    key = 'flashmap_http_refused_total{reason="request_timeout"}'
                    deadline = time.time() + 20
                    while time.time() < deadline and m[key] < n_slow:
                        time.sleep(0.5)
                        m = e2e.metrics(srv.port)
                    self.assertGreaterEqual(m['flashmap_http_refused_total{reason="request_timeout"}'],
                                            n_slow)
                srv.alive_and_correct(self)
            finally:
                stop.set()
                for s in slow:
                    s.close()
                srv.stop(self)

    def test_seeded_sampling_is_reproducible_under_load(self):
        srv = Server("--max-running", "6", "--max-queue", "64")
        try:
            reqs = [{"prompt": [3 + i, 7, 11 * i % 1000], "max_tokens": 24, "temperature": 1.0,
                     "seed": 1000 + i, **({"top_p": 0.9} if i % 3 == 0 else {})}
                    for i in range(24)]
            alone = []
            for r in reqs:
                status, body = e2e.post(srv.port, r)
                self.assertEqual(status, 200, body)
                alone.append(body["choices"][0]["token_ids"])
            # Speculation off for the same requests: the same tokens.
            for r, want in zip(reqs[:6], alone):
                status, body = e2e.post(srv.port, dict(r, speculative=False))
                self.assertEqual(body["choices"][0]["token_ids"], want)
            # All at once, with unseeded and greedy requests in the same batches.
            results = {}

            def client(i, r):
                status, body = e2e.post(srv.port, r, timeout=120)
                results[i] = body["choices"][0]["token_ids"] if status == 200 else body

            threads = [threading.Thread(target=client, args=(i, r)) for i, r in enumerate(reqs)]
            threads += [threading.Thread(target=client, args=(100 + i, {
                "prompt": [i + 1], "max_tokens": 30, "temperature": 0.7 if i % 2 else 0}))
                for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            differ = [i for i in range(len(reqs)) if results.get(i) != alone[i]]
            self.assertEqual(differ, [], "seeded requests that changed under load")
            # And the command line gives the same tokens for the same seed.
            import subprocess
            for i in (0, 1):
                r = reqs[i]
                cmd = [e2e.FLASHMAP, "generate", "--target", e2e.FIXTURE + "/target",
                       "--draft", e2e.FIXTURE + "/draft",
                       "--prompt-ids", ",".join(map(str, r["prompt"])),
                       "--max-new-tokens", str(r["max_tokens"]), "--temperature", "1",
                       "--seed", str(r["seed"]), "--json", "--stop-ids", "none"]
                if "top_p" in r:
                    cmd += ["--top-p", str(r["top_p"])]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
                self.assertEqual(json.loads(out.stdout)["ids"], alone[i])
            srv.alive_and_correct(self)
        finally:
            srv.stop(self)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    e2e.FLASHMAP, e2e.FIXTURE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
