#!/usr/bin/env python3
"""Writes a copy of a safetensors file with every F32 tensor rounded to BF16 (to nearest even,
NaN kept NaN: core/dtype.h's f32_to_bf16, the rounding the CUDA backend applies when it uploads
f32 weights), other tensors copied as they are. For the device payload (make_gpu_bundle.sh): the
GPU runs bf16 weights, so the bf16 copy gives it the same bits in half the bytes.

    python3 scripts/safetensors_bf16.py IN.safetensors OUT.safetensors
"""
import json
import struct
import sys

import numpy as np


def main(src, dst):
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out, blobs, offset = {}, [], 0
    for name, t in header.items():
        if name == "__metadata__":
            out[name] = t
            continue
        begin, end = t["data_offsets"]
        raw, dtype = data[begin:end], t["dtype"]
        if dtype == "F32":
            u = np.frombuffer(raw, dtype="<u4").astype(np.uint64)
            nan = (u & 0x7FFFFFFF) > 0x7F800000
            r = np.where(nan, (u >> 16) | 0x40, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
            raw, dtype = r.astype("<u2").tobytes(), "BF16"
        out[name] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(out, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
