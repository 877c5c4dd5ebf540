#!/usr/bin/env python3
"""Writes the seed corpora of the fuzzing harnesses (tests/fuzz/corpus/NAME/) from the tests'
fixtures and data:

    python3 tests/fuzz/make_seeds.py

Each seed is named by its content's SHA-1, so running this again adds what is new and rewrites
nothing. Inputs that once found a bug are committed beside the seeds by hand (scripts/fuzz.sh
prints where libFuzzer left them), so this script never deletes anything.
"""

import ast
import glob
import hashlib
import json
import os
import re
import struct

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(name, data):
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    d = os.path.join(CORPUS, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, hashlib.sha1(data).hexdigest())
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(data)


def read(rel, mode="r"):
    with open(os.path.join(ROOT, rel), mode) as f:
        return f.read()


def safetensors_bytes(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> a safetensors file."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "BOOL": 1}
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "**", "*.safetensors"),
                                 recursive=True)):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            base = 8 + n
            picked = []
            for name, info in header.items():
                if name == "__metadata__" or info["data_offsets"][1] - info["data_offsets"][0] > 2048:
                    continue
                f.seek(base + info["data_offsets"][0])
                raw = f.read(info["data_offsets"][1] - info["data_offsets"][0])
                picked.append((name, info["dtype"], info["shape"], raw))
                if len(picked) == 4:
                    break
        if picked:
            put("safetensors", safetensors_bytes(picked, header.get("__metadata__")))
    put("safetensors", safetensors_bytes([]))
    put("safetensors", safetensors_bytes([("s", "F32", [], b"\0\0\x80?")], {"format": "pt"}))
    put("safetensors", safetensors_bytes([("e", "BF16", [0, 3], b""), ("i", "I64", [2], b"\1" * 16),
                                          ("b", "BOOL", [3], b"\1\0\1"), ("h", "F16", [1], b"\0<")]))
    put("safetensors", safetensors_bytes([("i32", "I32", [1, 1], b"\xff\xff\xff\x7f")]))
    # Qwen's quantized releases: an FP8 weight with its block scale, an AWQ triple.
    put("safetensors", safetensors_bytes([("m.weight", "F8_E4M3", [4, 8], bytes(range(0, 128, 4))),
                                          ("m.weight_scale_inv", "F32", [1, 1], b"\0\0\x80?")]))
    put("safetensors", safetensors_bytes([("m.qweight", "I32", [8, 1], bytes(range(32))),
                                          ("m.qzeros", "I32", [1, 1], b"\x88\x88\x88\x88"),
                                          ("m.scales", "F16", [1, 8], b"\0<" * 8)]))
    assert sizes


def shard_index_seeds():
    put("shard_index", read("tests/fixtures/tiny-a/target_sharded/model.safetensors.index.json"))
    for wm in ({"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"},
               {"x": "b.safetensors", "z": "b.safetensors"},
               {"x": "a.safetensors", "q": "a.safetensors"},
               {"x": "../a.safetensors"}, {}):
        put("shard_index", json.dumps({"metadata": {"total_size": 28}, "weight_map": wm}))


def config_seeds():
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "**", "*config.json"),
                                 recursive=True) +
                       glob.glob(os.path.join(ROOT, "models", "default", "*", "*config.json"))):
        if os.path.basename(path) in ("config.json", "generation_config.json"):
            with open(path) as f:
                put("config", f.read())


def tokenizer_seeds():
    for line in read("tests/data/tokenizer_golden.jsonl").split("\n"):
        if not line:
            continue
        r = json.loads(line)
        if r["kind"] == "tokenizer":
            put("tokenizer_json", json.dumps(r["json"]))
    put("tokenizer_json", read("models/default/target/tokenizer.json"))
    # Codec: a selector byte (bit 0: the Qwen3 tokenizer; bits 1-2: encode, raw ids, ids in the
    # vocabulary; bit 3: skip special tokens), then text or little-endian ids.
    corpus = [json.loads(l) for l in read("tests/data/tokenizer_corpus.jsonl").split("\n") if l]
    texts = [c if isinstance(c, str) else c.get("text", "") for c in corpus]
    texts = sorted({t for t in texts if 0 < len(t.encode("utf-8", "surrogatepass")) <= 200})
    step = max(1, len(texts) // 120)
    for i, t in enumerate(texts[::step]):
        put("tokenizer_codec", bytes([i % 2]) + t.encode("utf-8", "surrogatepass"))
    for line in read("tests/data/tokenizer_golden.jsonl").split("\n")[:4000:40]:
        if not line:
            continue
        r = json.loads(line)
        if r["kind"] in ("decode",) and r.get("ids"):
            put("tokenizer_codec", bytes([1 | 2 | (8 if r.get("skip_special") else 0)]) +
                b"".join(struct.pack("<i", i) for i in r["ids"][:256]))
    put("tokenizer_codec", bytes([0]) + b"<|endoftext|>hello\xff\xfe world")
    put("tokenizer_codec", bytes([4]) + struct.pack("<4i", 0, 1, 2047, 2048))


def jinja_seeds():
    for case in json.loads(read("tests/data/chat/jinja_cases.json")):
        put("jinja", case["template"])
    for path in glob.glob(os.path.join(ROOT, "tests", "data", "**", "*.jinja"), recursive=True):
        with open(path) as f:
            put("jinja", f.read())
    for path in glob.glob(os.path.join(ROOT, "tests", "data", "chat", "*", "tokenizer_config.json")) + \
            [os.path.join(ROOT, "models", "default", "target", "tokenizer_config.json")]:
        with open(path) as f:
            t = json.load(f).get("chat_template")
        if isinstance(t, str):
            put("jinja", t)
        elif isinstance(t, list):
            for x in t:
                put("jinja", x["template"])


def request_seeds():
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "chat", "requests", "*.json"))):
        with open(path) as f:
            body = json.load(f)
        body.pop("chat_template", None)  # template sources are the jinja harness's
        put("chat_request", json.dumps(body))
    api = json.loads(read("tests/data/chat/api_prompts.json"))
    for case in api["cases"]:
        name = {"chat": "chat_request", "responses": "responses", "messages": "messages"}.get(
            case["endpoint"])
        if name:
            put(name, json.dumps(case["body"]))
    user = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "maxLength": 4}}}}}
    for body in (
            {"prompt": "hello", "max_tokens": 4, "stop": ["\n", "x"], "logit_bias": {"5": -100}},
            {"prompt": [1, 2, 3], "max_tokens": 2, "n": 2, "best_of": 3, "logprobs": 2,
             "echo": True, "seed": 7, "temperature": 0.7, "top_p": 0.9, "top_k": 5},
            {"prompt": "x", "guided_regex": "[a-c]{2,4}", "stop_token_ids": [0, 1]},
            {"prompt": "x", "guided_choice": ["yes", "no"], "min_tokens": 1},
            {"prompt": "x", "guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}}},
            {"messages": user, "response_format": {"type": "json_object"}, "max_tokens": 8},
            {"messages": user, "response_format": {"type": "json_schema", "json_schema": {
                "name": "s", "schema": {"type": "array", "items": {"enum": [1, "a", None]}}}}},
            {"messages": user, "tools": [tool], "tool_choice": "required",
             "parallel_tool_calls": False},
            {"messages": user, "tools": [tool], "tool_choice": {"type": "function",
                                                                "function": {"name": "f"}}},
            {"messages": user, "presence_penalty": 1.5, "frequency_penalty": -1,
             "repetition_penalty": 1.2, "logprobs": True, "top_logprobs": 3,
             "stream": True, "stream_options": {"include_usage": True},
             "chat_template_kwargs": {"enable_thinking": False}, "flexible_whitespace": True},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                       {"type": "text", "text": "b"}]}],
             "max_completion_tokens": 3, "ignore_eos": True, "return_token_ids": True}):
        put("chat_request", json.dumps(body))
    put("responses", json.dumps({"input": "hi", "instructions": "be brief", "max_output_tokens": 8,
                                 "text": {"format": {"type": "json_schema", "name": "x",
                                                     "schema": {"type": "object"}}}}))
    put("responses", json.dumps({"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                            "arguments": "{\"a\": 1}"},
                                           {"type": "function_call_output", "call_id": "c",
                                            "output": "ok"}],
                                 "tools": [{"type": "function", "name": "f",
                                            "parameters": {"type": "object"}}],
                                 "tool_choice": {"type": "function", "name": "f"}}))
    put("messages", json.dumps({"max_tokens": 8, "system": "s", "messages": user,
                                "stop_sequences": ["zz"], "thinking": {"type": "enabled",
                                                                       "budget_tokens": 1024}}))
    put("messages", json.dumps({"max_tokens": 8, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                           "input": {"a": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": [{"type": "text", "text": "r"}]}]},
        {"role": "assistant", "content": "prefill"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"}}))


def cpp_strings(source):
    """The raw and plain string literals of a C++ file, unescaped where they are plain."""
    out = [m.group(1) for m in re.finditer(r'R"\((.*?)\)"', source, re.S)]
    for m in re.finditer(r'"((?:[^"\\\n]|\\.)*)"', source):
        try:
            out.append(ast.literal_eval('"' + m.group(1) + '"'))
        except (ValueError, SyntaxError):
            pass
    return out


def constrain_seeds():
    src = read("tests/constrain/test_constrain.cpp")
    for s in cpp_strings(src):
        try:
            j = json.loads(s)
        except ValueError:
            continue
        if isinstance(j, (dict, bool)):
            put("json_schema", s)
    for m in re.finditer(r'compile_regex\("((?:[^"\\]|\\.)*)"\)', src):
        put("regex", ast.literal_eval('"' + m.group(1) + '"'))
    for block in re.findall(r"kRegexes?\[?\]?\s*=\s*\{(.*?)\};", src, re.S):
        for s in cpp_strings(block):
            put("regex", s)
    for p in (r"\d{3}-\d{4}", r"[A-Z][a-z]+( [A-Z][a-z]+)*", r"(yes|no|maybe)", r"^[^\s@]+@\w+\.com$",
              r"\p{L}+", r"[\u00e0-\u00ff]{1,3}", r"a{0,512}", r"(a|b)*c?", r"\.\*\+\?\[\]"):
        put("regex", p)
    doc = read("docs/STRUCTURED_OUTPUT.md")
    for block in re.findall(r"```json\n(.*?)```", doc, re.S):
        try:
            json.loads(block)
            put("json_schema", block)
        except ValueError:
            pass
    put("json_schema", json.dumps({"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8, "pattern": "^[a-z]+$"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
        "n": {"type": "number", "minimum": 0}, "ok": {"type": "boolean"},
        "any": {}, "u": {"anyOf": [{"type": "null"}, {"const": 3}]},
        "ref": {"$ref": "#/$defs/r"}},
        "required": ["name"], "additionalProperties": False,
        "$defs": {"r": {"type": "object", "properties": {"x": {"type": "integer"}}}}}))


def http_seeds():
    body = b'{"prompt": [1, 2], "max_tokens": 2}'
    for raw in (
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body,
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body,
            b"GET /a HTTP/1.1\r\nA: 1\r\n\r\nGET /b?x=%20 HTTP/1.1\r\nConnection: close\r\n\r\n",
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            b"POST /x HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n{",
            b"GET /v1/models/m%2Fx HTTP/1.0\r\nRange: bytes=0-1,5-\r\n\r\n",
            b"POST /v1/messages HTTP/1.1\r\ncontent-length: 2\r\nx-api-key: k\r\n\r\n{}"):
        put("http", raw)


DICTS = {
    "json.dict": ['"{"', '"}"', '"["', '"]"', '":"', '","', '"\\""', '"true"', '"false"', '"null"',
                  '"\\\\u0000"', '"1e308"', '"-0"', '"18446744073709551616"'],
    "jinja.dict": ['"{{"', '"}}"', '"{%"', '"%}"', '"{#"', '"#}"', '"{%-"', '"-%}"', '"for "',
                   '"endfor"', '"if "', '"elif "', '"else"', '"endif"', '"set "', '"macro "',
                   '"endmacro"', '"call"', '"namespace("', '"loop.index"', '"messages"', '"|tojson"',
                   '"|length"', '"|join("', '"|trim"', '"is defined"', '"range("', '"raise_exception("',
                   '"recursive"', '"loop("', '"**"', '"~"', '" in "', '"not "', '"[::-1]"'],
    "regex.dict": ['"\\\\d"', '"\\\\w"', '"\\\\s"', '"\\\\p{L}"', '"[^"', '"(?:"', '"{1,3}"', '"*?"',
                   '"|"', '"^"', '"$"', '"\\\\u00"', '"[a-z]"', '"(?="'],
    "http.dict": ['"\\x0d\\x0a"', '"\\x0d\\x0a\\x0d\\x0a"', '"Content-Length: "', '"Transfer-Encoding: "',
                  '"Expect: 100-continue"', '"Connection: close"', '"HTTP/1.1"', '"POST "', '"GET "',
                  '"Host: "', '"chunked"', '"/v1/chat/completions"'],
}


def gguf_bytes(kvs, tensors, alignment=32):
    """kvs: [(key, type code, packed value bytes)]; tensors: [(name, dims, ggml type, raw bytes)]
    -> a GGUF v3 file."""
    def gstr(t):
        b = t.encode()
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, code, value in kvs:
        out += gstr(key) + struct.pack("<I", code) + value
    offset = 0
    for name, dims, gtype, raw in tensors:
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gtype, offset)
        offset += -(-len(raw) // alignment) * alignment
    out += b"\0" * (-len(out) % alignment)
    for _, _, _, raw in tensors:
        out += raw + b"\0" * (-len(raw) % alignment)
    return out


def gguf_seeds():
    put("gguf", read("tests/fixtures/gguf/quants.gguf", "rb"))
    arch = ("general.architecture", 8, struct.pack("<Q", 5) + b"qwen3")
    nested = struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 4, 2) + struct.pack("<II", 1, 2) + \
        struct.pack("<IQ", 8, 1) + struct.pack("<Q", 1) + b"a"
    put("gguf", gguf_bytes([arch, ("qwen3.block_count", 4, struct.pack("<I", 2)),
                            ("qwen3.rope.freq_base", 6, struct.pack("<f", 1e6)),
                            ("tokenizer.ggml.tokens", 9, nested), ("flag", 7, b"\1")],
                           [("token_embd.weight", [8, 2], 0, struct.pack("<16f", *range(16))),
                            ("blk.0.attn_q.weight", [32, 1], 8,
                             struct.pack("<e", 0.5) + bytes(range(32))),
                            ("output_norm.weight", [8], 1, struct.pack("<8e", *([1.0] * 8)))]))
    put("gguf", gguf_bytes([("general.alignment", 4, struct.pack("<I", 64))],
                           [("t", [4], 30, b"\x80\x3f" * 4)], alignment=64))
    put("gguf", gguf_bytes([], []))


def dicts():
    d = os.path.join(ROOT, "tests", "fuzz", "dict")
    os.makedirs(d, exist_ok=True)
    for name, words in DICTS.items():
        with open(os.path.join(d, name), "w") as f:
            f.write("# libFuzzer dictionary (tests/fuzz/make_seeds.py)\n")
            f.write("".join(w + "\n" for w in words))


if __name__ == "__main__":
    safetensors_seeds()
    gguf_seeds()
    shard_index_seeds()
    config_seeds()
    tokenizer_seeds()
    jinja_seeds()
    request_seeds()
    constrain_seeds()
    http_seeds()
    dicts()
    for name in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, name))
        size = sum(os.path.getsize(os.path.join(CORPUS, name, f)) for f in files)
        print(f"{name}: {len(files)} seeds, {size} bytes")
