#!/usr/bin/env python3
"""A random Qwen3 GGUF at a real shape, for timing a GGUF target read in place.

    python3 bench/random_gguf.py --shape qwen3-0.6b --type Q8_0 OUT.gguf

Weights N(0, 0.02) quantized by the `gguf` package (PyPI) to --type (a type its quantizer
writes: F32, F16, BF16, Q8_0, Q4_0, ...), norms 1, tied embeddings for qwen3-0.6b as the
released model has them, and no tokenizer (time with --prompt-ids or `bench --shape`) unless
--tokenizer DIR gives one (a Hugging Face folder, e.g. tests/data/qwen3-tokenizer: its tokens as
llama.cpp's converter writes them, padded to the shape's vocabulary), which llama.cpp needs to
load the file. Then:

    flashmap bench --shape qwen3-0.6b --target OUT.gguf --weights q8 --no-sweep
"""
import argparse
import os
import sys

import numpy as np
import gguf

SHAPES = {  # layers, hidden, intermediate, heads, kv heads, head dim, vocab, tied
    "qwen3-0.6b": (28, 1024, 3072, 16, 8, 128, 151936, True),
    "qwen3-8b": (36, 4096, 12288, 32, 8, 128, 151936, False),
}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--shape", choices=SHAPES, default="qwen3-0.6b")
ap.add_argument("--type", default="Q8_0", help="ggml type of the matrices (default Q8_0)")
ap.add_argument("--tokenizer", help="a Hugging Face tokenizer folder to write into the metadata")
ap.add_argument("out")
a = ap.parse_args()
L, H, I, NH, NKV, HD, V, tied = SHAPES[a.shape]
qt = gguf.GGMLQuantizationType[a.type]
w = gguf.GGUFWriter(a.out, "qwen3")
w.add_block_count(L)
w.add_embedding_length(H)
w.add_feed_forward_length(I)
w.add_head_count(NH)
w.add_head_count_kv(NKV)
w.add_key_length(HD)
w.add_value_length(HD)
w.add_context_length(40960)
w.add_layer_norm_rms_eps(1e-6)
w.add_rope_freq_base(1e6)
if a.tokenizer:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    from make_gguf_fixtures import add_vocab  # noqa: E402 - the converter's vocabulary rule
    add_vocab(w, a.tokenizer, V)
rng = np.random.default_rng(0)


def mat(name, rows, cols):
    x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
    q = gguf.quants.quantize(x, qt)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)


def ones(name, n):
    w.add_tensor(name, np.ones(n, dtype=np.float32))


mat("token_embd.weight", V, H)
if not tied:
    mat("output.weight", V, H)
ones("output_norm.weight", H)
for layer in range(L):
    p = f"blk.{layer}."
    for n, size in (("attn_norm", H), ("ffn_norm", H), ("attn_q_norm", HD), ("attn_k_norm", HD)):
        ones(p + n + ".weight", size)
    mat(p + "attn_q.weight", NH * HD, H)
    mat(p + "attn_k.weight", NKV * HD, H)
    mat(p + "attn_v.weight", NKV * HD, H)
    mat(p + "attn_output.weight", H, NH * HD)
    mat(p + "ffn_gate.weight", I, H)
    mat(p + "ffn_up.weight", I, H)
    mat(p + "ffn_down.weight", H, I)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
