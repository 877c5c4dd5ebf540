#!/usr/bin/env python3
"""Generate tests/fixtures/llama_cpp/: a small Qwen3, written to GGUF by llama.cpp's own
converter, and what llama.cpp itself decodes from those files.

* source/: a random Qwen3 (2 layers, hidden 64, 4/2 heads of 16, MLP 192, tied embeddings) in
  transformers' layout, F32 safetensors, with the shipped pair's tokenizer (models/default/target:
  2048 byte-level BPE tokens, Qwen2's pre-tokenizer). Norm weights are drawn around 1 and the
  embedding wide enough that the logits of a step differ by units, so a greedy step has a clear
  winner (the smallest margin of every recorded step is printed and kept in expected.json).
* qwen3-f32.gguf, qwen3-q8_0.gguf: source/ converted by convert_hf_to_gguf.py of llama.cpp
  (from the llama-cpp-python sdist bench/vs_llama_cpp.py builds) with --outtype f32 and q8_0.
  The converter recognizes a tokenizer by a checksum of how it splits a test text, and knows
  Qwen's 151k vocabulary, not this 2048-token one; its pre-tokenizer is Qwen2's regex, so the
  script tells the converter "qwen2" (the name it would give Qwen's own).
* expected.json: per file and prompt, llama.cpp's greedy ids (llama.cpp's libllama through the
  llama-cpp-python bindings of the same sdist, one sequence, a full-logits context) and, for every
  generated step, llama.cpp's 20 most likely ids with their log-probabilities (log_softmax of its
  logits in float64), plus the step's margin between the first and second logit.

tests/io/test_llama_cpp_gguf.cpp decodes the same prompts with our engine from each GGUF and from
source/ and compares ids and log-probabilities against llama.cpp's.

Run from the repository root (needs torch, transformers, safetensors, numpy, diskcache; the sdist
bench/vs_llama_cpp.py unpacks, and a libllama built from it: bench/vs_llama_cpp.py's build, or
any other, given with --llama-lib; the committed files came from one configured with
-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DBUILD_SHARED_LIBS=ON):
  python3 tools/make_llama_cpp_fixtures.py --llama-lib DIR
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "llama_cpp")
CACHE = os.path.expanduser("~/.cache/flashmap-bench")
SDIST = os.path.join(CACHE, "llama_cpp_python-0.3.36")

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "eos_token_id": 0,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 192,
    "max_position_embeddings": 4096,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 2048,
}

PROMPTS = [[17, 301, 4, 1999, 56], [5, 900, 901, 902, 33, 1024, 7, 7, 7, 250, 1500, 64],
           list(range(100, 2000, 83))]
NEW_TOKENS = 24
TOP = 20


def make_source(path, seed):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    c = CONFIG
    H, I, D = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D

    def mat(rows, cols, scale):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(c["vocab_size"], H, 0.6), "model.norm.weight": norm(H)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        t[p + "self_attn.q_proj.weight"] = mat(q, H, H ** -0.5)
        t[p + "self_attn.k_proj.weight"] = mat(kv, H, H ** -0.5)
        t[p + "self_attn.v_proj.weight"] = mat(kv, H, H ** -0.5)
        t[p + "self_attn.o_proj.weight"] = mat(H, q, 3 * q ** -0.5)
        t[p + "self_attn.q_norm.weight"] = norm(D)
        t[p + "self_attn.k_norm.weight"] = norm(D)
        t[p + "mlp.gate_proj.weight"] = mat(I, H, H ** -0.5)
        t[p + "mlp.up_proj.weight"] = mat(I, H, H ** -0.5)
        t[p + "mlp.down_proj.weight"] = mat(H, I, 3 * I ** -0.5)
    os.makedirs(path, exist_ok=True)
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ROOT, "models", "default", "target", name), path)


CONVERT = """
import sys
sys.path.insert(0, {src!r})
sys.argv = ["convert_hf_to_gguf.py"] + {args!r}
import convert_hf_to_gguf as c
from conversion import base
# The converter knows tokenizers by a checksum of their split of a test text; this 2048-token one
# uses Qwen2's pre-tokenizer regex.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
c.main()
"""


def convert(llama_src, source, out, outtype):
    code = CONVERT.format(src=llama_src, args=[source, "--outfile", out, "--outtype", outtype])
    subprocess.run([sys.executable, "-c", code], check=True)


def decode(path):
    from llama_cpp import Llama
    import llama_cpp
    # F32 K and V caches (llama.cpp keeps them in F16 unless told), as this engine keeps them.
    m = Llama(path, logits_all=True, verbose=False, n_ctx=256, n_batch=256, seed=0,
              type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    cases = []
    for prompt in PROMPTS:
        m.reset()
        m.eval(prompt)
        ids, steps = [], []
        for _ in range(NEW_TOKENS):
            row = np.array(m.scores[m.n_tokens - 1], dtype=np.float64)
            order = np.argsort(-row, kind="stable")
            lse = row.max() + np.log(np.exp(row - row.max()).sum())
            steps.append({"top": [[int(i), float(row[i] - lse)] for i in order[:TOP]],
                          "margin": float(row[order[0]] - row[order[1]])})
            ids.append(int(order[0]))
            m.eval([int(order[0])])
        cases.append({"prompt": prompt, "ids": ids, "steps": steps})
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", default=os.path.join(SDIST, "vendor", "llama.cpp"),
                    help="llama.cpp's source tree (its convert_hf_to_gguf.py and conversion/)")
    ap.add_argument("--bindings", default=SDIST, help="llama-cpp-python's source (llama_cpp/)")
    ap.add_argument("--llama-lib", default=os.path.join(CACHE, "llama-build", "bin"),
                    help="the folder holding the built libllama.so")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    os.environ["LLAMA_CPP_LIB_PATH"] = a.llama_lib
    sys.path.insert(0, a.bindings)

    shutil.rmtree(OUT, ignore_errors=True)
    source = os.path.join(OUT, "source")
    make_source(source, a.seed)
    expected = {"llama_cpp": os.path.basename(os.path.dirname(os.path.dirname(a.llama_cpp))),
                "new_tokens": NEW_TOKENS, "files": {}}
    for outtype in ("f32", "q8_0"):
        name = f"qwen3-{outtype}.gguf"
        convert(a.llama_cpp, source, os.path.join(OUT, name), outtype)
        cases = decode(os.path.join(OUT, name))
        margin = min(s["margin"] for c in cases for s in c["steps"])
        print(f"{name}: {os.path.getsize(os.path.join(OUT, name))} bytes, "
              f"smallest greedy margin {margin:.4f}")
        expected["files"][name] = cases
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
