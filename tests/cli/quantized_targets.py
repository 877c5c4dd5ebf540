#!/usr/bin/env python3
"""Targets whose weights are stored quantized.

`flashmap generate --target FILE.gguf`: a Qwen3 GGUF read in place decodes exactly as the
folder it was converted to (tensors dequantized by `flashmap convert`, whose values the io tests
check against the gguf package) and as the folder it was written from (tiny-a's F32 target, in
one file and split in three, with its drafter); the model folder is made once in the cache and reused; a cache that cannot be
written is one clear error.

Qwen's FP8 and AWQ releases (tiny-a's target in both, tests/fixtures/quant; their weights are
checked against the reference dequantization in tests/io/test_quantized_releases.cpp): with
tiny-a's drafter, greedy and seeded sampled ids equal the target alone's, so speculation stays
lossless with respect to the quantized model.

quantized_targets.py FLASHMAP SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile

flashmap, src = sys.argv[1], sys.argv[2]
fx = os.path.join(src, "tests", "fixtures")
tiny_a = os.path.join(fx, "tiny-a")
f32_gguf = os.path.join(fx, "gguf", "tiny-a-f32.gguf")
split_gguf = os.path.join(fx, "gguf", "tiny-a-split-00001-of-00003.gguf")
q4km_gguf = os.path.join(fx, "gguf", "qwen3-q4km.gguf")
failures = []


def run(args, env, check=True):
    p = subprocess.run([flashmap] + args, capture_output=True, text=True, env=env, timeout=120)
    if check and p.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def decode(target, extra, env):
    out = run(["generate", "--target", target, "--json"] + extra, env).stdout
    d = json.loads(out)
    return d["ids"], d.get("text")


def same(what, a, b):
    if a != b:
        failures.append(f"{what}: {a} != {b}")
    else:
        print(f"ok: {what}")


with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, FLASHMAP_CACHE_DIR=os.path.join(tmp, "cache"))
    # tiny-a's target as an F32 GGUF (one file, and split in three), with tiny-a's drafter:
    # sampled and greedy.
    for mode in (["--seed", "3", "--temperature", "0.8"], ["--temperature", "0"]):
        args = ["--draft", os.path.join(tiny_a, "draft"), "--prompt-ids", "1,2,3,4,5",
                "--max-new-tokens", "24"] + mode
        want = decode(os.path.join(tiny_a, "target"), args, env)
        same(f"F32 GGUF with a drafter {mode}", decode(f32_gguf, args, env), want)
        same(f"split F32 GGUF with a drafter {mode}", decode(split_gguf, args, env), want)
    # The Q4_K_M mix, with the tokenizer and chat template of its metadata, in both weight
    # formats, against the folder `flashmap convert` writes.
    copied = os.path.join(tmp, "copied")
    run(["convert", q4km_gguf, copied], env)
    linked = os.path.join(tmp, "linked")
    run(["convert", "--link", q4km_gguf, linked], env)
    # Natively both hold the dequantized F32 weights. In the integer formats the GGUF read in
    # place keeps its Q4_K matrices as they are (q4k) and holds its Q6_K ones as q8 under q4
    # too, so q8 and q4 are one model there; the copied folder's F32 weights are requantized.
    for weights in ("native", "q8", "q4"):
        args = ["--no-draft", "--chat", "hello there", "--weights", weights,
                "--max-new-tokens", "16", "--seed", "1"]
        want = decode(copied if weights == "native" else q4km_gguf, args, env)
        if weights == "native":
            same(f"Q4_K_M GGUF, --weights {weights}", decode(q4km_gguf, args, env), want)
        same(f"Q4_K_M --link folder, --weights {weights}", decode(linked, args, env), want)
    for mode in (["--temperature", "0"], ["--seed", "4", "--temperature", "0.8"]):
        args = ["--prompt-ids", "5,6,7,5,6,7,5,6", "--max-new-tokens", "32"] + mode
        q8 = decode(q4km_gguf, ["--no-draft", "--weights", "q8"] + args, env)
        same(f"Q4_K_M GGUF: q4 = q8 {mode}",
             decode(q4km_gguf, ["--no-draft", "--weights", "q4"] + args, env), q8)
        same(f"Q4_K_M GGUF, q4: prompt lookup = target alone {mode}",
             decode(q4km_gguf, ["--draft", "ngram", "--weights", "q4"] + args, env), q8)
    # One folder per file in the cache, made once.
    cache = os.path.join(tmp, "cache", "gguf1")
    folders = sorted(os.listdir(cache))
    same("cache folders", len(folders), 3)
    stamp = {f: os.stat(os.path.join(cache, f, "config.json")).st_mtime_ns for f in folders}
    decode(q4km_gguf, ["--no-draft", "--prompt", "hi", "--max-new-tokens", "2"], env)
    same("cache reused", {f: os.stat(os.path.join(cache, f, "config.json")).st_mtime_ns
                          for f in sorted(os.listdir(cache))}, stamp)
    # A cache that cannot be made: one line naming it.
    blocker = os.path.join(tmp, "file")
    open(blocker, "w").close()
    bad = dict(env, FLASHMAP_CACHE_DIR=os.path.join(blocker, "cache"))
    p = run(["generate", "--target", q4km_gguf, "--no-draft", "--prompt", "hi"], bad, check=False)
    err = p.stderr.strip().splitlines()
    if p.returncode != 1 or len(err) != 1 or blocker not in err[0]:
        failures.append(f"unwritable cache: exit {p.returncode}, stderr {p.stderr!r}")
    else:
        print(f"ok: unwritable cache: {err[0]}")

    for fmt in ("fp8", "awq"):
        target = os.path.join(fx, "quant", fmt)
        for mode in (["--temperature", "0"], ["--seed", "5", "--temperature", "0.8"]):
            args = ["--prompt-ids", "1,2,3,4,5", "--max-new-tokens", "32"] + mode
            same(f"{fmt}: speculative = target alone {mode}",
                 decode(target, ["--draft", os.path.join(tiny_a, "draft")] + args, env),
                 decode(target, ["--no-draft"] + args, env))

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
