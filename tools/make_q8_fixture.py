#!/usr/bin/env python3
"""Writes tests/fixtures/q8/q8_reference.safetensors: weight matrices and their Q8_0 and Q4_0
quantizations by the gguf package (llama.cpp's own Python quantizer, bit-exact with
ggml-quants.c), which tests/ops/test_gemm.cpp compares byte for byte with flashmap's --weights q8
and q4 packings.

    pip install gguf numpy
    python3 tools/make_q8_fixture.py --out tests/fixtures/q8/q8_reference.safetensors

Tensors: w (F32 [N, K]) with d (F16 [N, K/32]) and q (I32 [N, K], the int8 values); wb (BF16), db,
qb the same for a bf16 matrix (widened to fp32 before quantizing, as both engines do); d4, q4
(the nibbles 0…15) and d4b, q4b: Q4_0 of the same two.
"""

import argparse
import json
import os

import numpy as np
from gguf import GGMLQuantizationType, quants

N, K = 37, 160


def matrix(rng):
    w = rng.standard_normal((N, K)).astype(np.float32)
    w *= np.exp(rng.uniform(-6, 3, size=(N, 1))).astype(np.float32)  # row scales 2.5e-3 … 20
    w[3, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    w[5, :32] = 1e-7 * rng.standard_normal(32)  # d below fp16's normal range
    w[7, 64:96] = np.linspace(-127, 127, 32, dtype=np.float32)  # q = w exactly, ties at ±0.5 d
    w[8, 96:128] = (np.arange(32, dtype=np.float32) - 15.5) * 2.0  # halves after scaling
    w[9, 128:160] = 3.0  # one value repeated
    # d = 1 exactly, so w · (1/d) lands on halves: roundf rounds them away from zero (2.5 → 3).
    w[10, :32] = np.concatenate([[127.0], np.arange(31, dtype=np.float32) - 15.5])
    return w


def q8(w):
    blocks = quants.quantize(w, GGMLQuantizationType.Q8_0).reshape(N, K // 32, 34)
    d = blocks[:, :, :2].copy().view(np.float16).reshape(N, K // 32)
    q = blocks[:, :, 2:].copy().view(np.int8).reshape(N, K).astype(np.int32)
    return d, q


def q4(w):
    blocks = quants.quantize(w, GGMLQuantizationType.Q4_0).reshape(N, K // 32, 18)
    d = blocks[:, :, :2].copy().view(np.float16).reshape(N, K // 32)
    # ggml's Q4_0 byte i holds element i in its low nibble and element i + 16 in its high one.
    qs = blocks[:, :, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(N, K).astype(np.int32)
    return d, q


def write_safetensors(path, tensors):
    """The format by hand (safetensors.numpy has no bfloat16): an 8-byte little-endian header
    length, the JSON header, then the raw little-endian bytes of each tensor."""
    header, blobs, at = {}, [], 0
    for name, dtype, a in tensors:
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(20261201)
    w = matrix(rng)
    d, q = q8(w)
    # bf16: round to nearest even by the upper 16 bits, kept as uint16 bits for safetensors.
    u = w.view(np.uint32).astype(np.uint64)
    wb_bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    wb = (wb_bits.astype(np.uint32) << 16).view(np.float32)
    db, qb = q8(wb)
    d4, q4s = q4(w)
    d4b, q4b = q4(wb)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    write_safetensors(args.out, [("w", "F32", w), ("d", "F16", d), ("q", "I32", q), ("wb", "BF16", wb_bits),
                                 ("db", "F16", db), ("qb", "I32", qb), ("d4", "F16", d4),
                                 ("q4", "I32", q4s), ("d4b", "F16", d4b), ("q4b", "I32", q4b)])

if __name__ == "__main__":
    main()
