#!/usr/bin/env python3
"""Generate tests/fixtures/quant/: tiny-a's target (tests/fixtures/tiny-a/target) as Qwen's two
quantized release formats, and the weights their reference dequantization gives.

* fp8/: every decoder matrix as float8_e4m3fn with one `weight_scale_inv` (F32) per 128 x 128
  block, quantized as the FP8 releases are made (scale = block max |w| / 448, w / scale cast to
  e4m3 by ml_dtypes, whose float8_e4m3fn is torch's); embedding, lm_head and norms as they are;
  config.json with quantization_config {quant_method fp8, fmt e4m3, weight_block_size [128, 128]}.
* awq/: every decoder matrix as AWQ 4-bit with zero points, group 32 along the input, in AutoAWQ's
  GEMM packing (qweight/qzeros int32 holding 8 values each in the order [0, 2, 4, 6, 1, 3, 5, 7],
  scales F16); config.json with quantization_config {quant_method awq, bits 4, group_size 32,
  zero_point true, version gemm}.
* expected.json: per format and tensor, the shape and XXH3-64 of the F32 weight [out, in] as the
  reference dequantization computes it: FP8 as fp32(e4m3) * scale (DeepSeek/Qwen's weight_dequant),
  AWQ as vLLM's awq_dequantize unpacks it (shifts 0, 4, ..., 28, then the reverse order
  [0, 4, 1, 5, 2, 6, 3, 7]), (q - z) * scale in fp32.

Run from the repository root:  python3 tools/make_quant_fixtures.py   (needs: pip install numpy ml_dtypes xxhash)
"""
import json
import os
import shutil
import struct

import ml_dtypes
import numpy as np
import xxhash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "tiny-a", "target")
OUT = os.path.join(ROOT, "tests", "fixtures", "quant")
MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUP = 32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", name
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], np.float32).reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array of that layout)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, a = tensors[name]
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def is_matrix(name):
    return any(name.endswith(m + ".weight") for m in MATRICES)


def fp8_quantize(w):
    R, C = w.shape
    sr, sc = -(-R // 128), -(-C // 128)
    scale = np.zeros((sr, sc), np.float32)
    q = np.zeros((R, C), ml_dtypes.float8_e4m3fn)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = np.float32(np.abs(blk).max()) / np.float32(448.0)
            scale[i, j] = s
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / s).astype(ml_dtypes.float8_e4m3fn)
    return q, scale


def fp8_dequantize(q, scale):
    s = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:q.shape[0], :q.shape[1]]
    return q.astype(np.float32) * s


def awq_pack(v):
    """v [rows, out] of 4-bit values -> int32 [rows, out / 8] in AutoAWQ's order."""
    rows, out = v.shape
    packed = np.zeros((rows, out // 8), np.uint32)
    for k in range(8):
        packed |= v[:, AWQ_ORDER[k]::8].astype(np.uint32) << np.uint32(4 * k)
    return packed.view(np.int32)


def awq_quantize(w):
    """w [out, in] -> qweight, qzeros, scales as AutoAWQ's GEMM layout holds them."""
    wt = w.T.astype(np.float32)  # [in, out]
    n_in, n_out = wt.shape
    g = wt.reshape(n_in // GROUP, GROUP, n_out)
    lo, hi = g.min(axis=1), g.max(axis=1)
    scales = ((hi - lo) / 15.0).astype(np.float16)
    s32 = np.maximum(scales.astype(np.float32), 1e-8)
    zeros = np.clip(np.round(-lo / s32), 0, 15).astype(np.int64)
    q = np.clip(np.round(g / s32[:, None, :]) + zeros[:, None, :], 0, 15).astype(np.int64)
    return awq_pack(q.reshape(n_in, n_out)), awq_pack(zeros), scales


def awq_dequantize(qweight, qzeros, scales):
    """vLLM's reference: unpack by shifts, undo the order, (q - z) * s; here in fp32."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)

    def unpack(p):
        v = (p.view(np.uint32)[:, :, None] >> shifts) & np.uint32(0xF)
        return v.reshape(p.shape[0], -1, 8)[:, :, AWQ_REVERSE_ORDER].reshape(p.shape[0], -1)

    iw, iz = unpack(qweight).astype(np.int64), unpack(qzeros).astype(np.int64)
    groups = scales.shape[0]
    group = qweight.shape[0] // groups
    iz = np.repeat(iz, group, axis=0)
    s = np.repeat(scales.astype(np.float32), group, axis=0)
    return ((iw - iz).astype(np.float32) * s).T  # [out, in]


def main():
    weights = read_safetensors(os.path.join(SRC, "model.safetensors"))
    config = json.load(open(os.path.join(SRC, "config.json")))
    expected = {}
    for fmt in ("fp8", "awq"):
        out = os.path.join(OUT, fmt)
        os.makedirs(out, exist_ok=True)
        tensors, exp = {}, {}
        for name, w in weights.items():
            if not is_matrix(name):
                tensors[name] = ("F32", w)
                continue
            if fmt == "fp8":
                q, s = fp8_quantize(w)
                tensors[name] = ("F8_E4M3", q.view(np.uint8))
                tensors[name + "_scale_inv"] = ("F32", s)
                d = fp8_dequantize(q, s)
            else:
                qw, qz, s = awq_quantize(w)
                p = name[:-len(".weight")]
                tensors[p + ".qweight"] = ("I32", qw)
                tensors[p + ".qzeros"] = ("I32", qz)
                tensors[p + ".scales"] = ("F16", s)
                d = awq_dequantize(qw, qz, s)
            assert d.shape == w.shape and d.dtype == np.float32
            exp[name] = {"shape": list(d.shape), "xxh3_64": xxhash.xxh3_64_intdigest(d.tobytes())}
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        c = dict(config)
        c["quantization_config"] = (
            {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128]} if fmt == "fp8" else
            {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
             "version": "gemm"})
        json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=2)
        shutil.copy(os.path.join(SRC, "generation_config.json"), out)
        expected[fmt] = exp
    json.dump(expected, open(os.path.join(OUT, "expected.json"), "w"), indent=1, sort_keys=True)
    print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()
