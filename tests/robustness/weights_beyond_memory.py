#!/usr/bin/env python3
"""A target or drafter whose weights cannot fit in memory is refused before any is read.

Writes a Qwen3 GGUF of 128 layers of width 16384 (485 G values) whose Q4_K blocks are a sparse
file's hole: 273 GB on paper, nothing on disk. Held as read (--weights native: F32) they would
take 1.9 TB, in q4 273 GB: `flashmap generate` must exit 1 at once with one error line naming the
file, the format and both sizes (not be killed for memory after reading the file, nor allocate).
Then the same for a DFlash drafter beside the built-in target: 256 layers of MLP width 262144,
F32 safetensors (412 GB, a hole). Skipped (77) where the machine has that much memory available.

weights_beyond_memory.py FLASHMAP TOKENIZER_DIR SMALL_TARGET_DIR"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

flashmap, tokenizer, small_target = sys.argv[1], sys.argv[2], sys.argv[3]
H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 16384, 128, 128, 8, 128, 65536, 1024
Q4_K, F32, QK_K, Q4_K_BYTES = 12, 0, 256, 144  # ggml's type codes; a Q4_K block: 256 values, 144 B
ALIGN = 32


def gstr(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, code, value):
    return gstr(key) + struct.pack("<I", code) + value


# (name, dims as GGUF lists them: columns first, ggml type)
tensors = [("token_embd.weight", [H, VOCAB], Q4_K), ("output_norm.weight", [H], F32)]
for i in range(LAYERS):
    b = f"blk.{i}."
    tensors += [(b + "attn_norm.weight", [H], F32), (b + "ffn_norm.weight", [H], F32),
                (b + "attn_q_norm.weight", [HEAD_DIM], F32),
                (b + "attn_k_norm.weight", [HEAD_DIM], F32),
                (b + "attn_q.weight", [H, HEADS * HEAD_DIM], Q4_K),
                (b + "attn_k.weight", [H, KV_HEADS * HEAD_DIM], Q4_K),
                (b + "attn_v.weight", [H, KV_HEADS * HEAD_DIM], Q4_K),
                (b + "attn_output.weight", [HEADS * HEAD_DIM, H], Q4_K),
                (b + "ffn_gate.weight", [H, MLP], Q4_K), (b + "ffn_up.weight", [H, MLP], Q4_K),
                (b + "ffn_down.weight", [MLP, H], Q4_K)]

a = "qwen3."
kvs = [kv("general.architecture", 8, gstr("qwen3")), kv(a + "block_count", 4, struct.pack("<I", LAYERS)),
       kv(a + "context_length", 4, struct.pack("<I", 4096)),
       kv(a + "embedding_length", 4, struct.pack("<I", H)),
       kv(a + "feed_forward_length", 4, struct.pack("<I", MLP)),
       kv(a + "attention.head_count", 4, struct.pack("<I", HEADS)),
       kv(a + "attention.head_count_kv", 4, struct.pack("<I", KV_HEADS)),
       kv(a + "attention.key_length", 4, struct.pack("<I", HEAD_DIM)),
       kv(a + "attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-6)),
       kv(a + "rope.freq_base", 6, struct.pack("<f", 1e6))]

head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
offset, values, f32_bytes = 0, 0, 0
for name, dims, gtype in tensors:
    n = 1
    for d in dims:
        n *= d
    size = n * 4 if gtype == F32 else n // QK_K * Q4_K_BYTES
    head += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    head += struct.pack("<IQ", gtype, offset)
    offset += -(-size // ALIGN) * ALIGN
    if name != "token_embd.weight":
        values += n
        f32_bytes += n * 4
head += b"\0" * (-len(head) % ALIGN)

with open("/proc/meminfo") as f:
    available = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
if available >= values // 16 * 9:
    print(f"skipped: {available / 1e9:.0f} GB of memory available, enough to load this target")
    sys.exit(77)

failures = []


def expect_refused(what, path, args, held, need, env):
    """`args` exits 1 with one line saying `path`'s weights held as `held` need `need` bytes."""
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    lines = p.stderr.strip().splitlines()
    want = (rf"^flashmap: error: {re.escape(path)}: its weights held as {held} take at least "
            rf"{need / 1e9:.1f} GB, more than the [0-9.]+ GB of memory available")
    if p.returncode != 1 or len(lines) != 1 or not re.search(want, lines[0]):
        failures.append(f"{what}: exit {p.returncode}, stderr {p.stderr[-600:]!r}")
    else:
        print(f"ok: {what}: {lines[0]}")


def still_a_hole(path, written):
    """The file was never read: its bytes past `written` are still a hole."""
    if os.stat(path).st_blocks * 512 > written + (1 << 20):
        failures.append(f"{path}: the hole was filled: {os.stat(path).st_blocks * 512} bytes on disk")


# A DFlash drafter of the built-in target's width (its config as check_target wants it), whose MLPs
# are as wide as a config may say and whose F32 tensors are a hole.
with open(os.path.join(small_target, "config.json")) as f:
    t = json.load(f)
D_LAYERS, D_MLP = 256, 262144
TH, TQ, TKV = t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"]
THD = t.get("head_dim", TH // TQ)
draft_config = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": TH,
    "intermediate_size": D_MLP, "num_hidden_layers": D_LAYERS, "num_attention_heads": TQ,
    "num_key_value_heads": TKV, "head_dim": THD, "rms_norm_eps": 1e-6,
    "vocab_size": t["vocab_size"], "max_position_embeddings": 4096,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "num_target_layers": t["num_hidden_layers"], "block_size": 4,
    "dflash_config": {"block_size": 4, "mask_token_id": 1, "target_layer_ids": [1]}}
draft_tensors = {"fc.weight": [TH, TH], "hidden_norm.weight": [TH], "norm.weight": [TH]}
for i in range(D_LAYERS):
    b = f"layers.{i}."
    for n in ("input_layernorm", "post_attention_layernorm"):
        draft_tensors[b + n + ".weight"] = [TH]
    for n in ("q_norm", "k_norm"):
        draft_tensors[b + "self_attn." + n + ".weight"] = [THD]
    draft_tensors[b + "self_attn.q_proj.weight"] = [TQ * THD, TH]
    draft_tensors[b + "self_attn.k_proj.weight"] = [TKV * THD, TH]
    draft_tensors[b + "self_attn.v_proj.weight"] = [TKV * THD, TH]
    draft_tensors[b + "self_attn.o_proj.weight"] = [TH, TQ * THD]
    draft_tensors[b + "mlp.gate_proj.weight"] = [D_MLP, TH]
    draft_tensors[b + "mlp.up_proj.weight"] = [D_MLP, TH]
    draft_tensors[b + "mlp.down_proj.weight"] = [TH, D_MLP]
st_header, st_offset = {}, 0
for name, shape in draft_tensors.items():
    n = 1
    for d in shape:
        n *= d
    st_header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [st_offset, st_offset + 4 * n]}
    st_offset += 4 * n
st_head = json.dumps(st_header).encode()
st_head += b" " * (-len(st_head) % 8)
st_head = struct.pack("<Q", len(st_head)) + st_head

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "huge-q4_k.gguf")
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset)  # the tensors' bytes: a hole
    env = dict(os.environ, FLASHMAP_CACHE_DIR=os.path.join(tmp, "cache"))
    for weights, held, need in (("native", r"read \(--weights native; quantized tensors as F32\)",
                                 f32_bytes), ("q4", "q4", values // 16 * 9)):
        expect_refused(f"target, --weights {weights}", path,
                       [flashmap, "generate", "--target", path, "--tokenizer", tokenizer,
                        "--no-draft", "--weights", weights, "--prompt", "hi",
                        "--max-new-tokens", "1"], held, need, env)
    still_a_hole(path, len(head))

    draft = os.path.join(tmp, "huge-dflash")
    os.mkdir(draft)
    with open(os.path.join(draft, "config.json"), "w") as f:
        json.dump(draft_config, f)
    weights_file = os.path.join(draft, "model.safetensors")
    with open(weights_file, "wb") as f:
        f.write(st_head)
        f.truncate(len(st_head) + st_offset)
    expect_refused("DFlash drafter, --weights native", draft,
                   [flashmap, "generate", "--target", small_target, "--draft", draft,
                    "--prompt", "hi", "--max-new-tokens", "1"],
                   r"read \(--weights native; quantized tensors as F32\)", st_offset, env)
    still_a_hole(weights_file, len(st_head))

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
