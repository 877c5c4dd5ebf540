#!/usr/bin/env python3
"""Generate tests/fixtures/gguf/: GGUF files and the values the `gguf` package (llama.cpp's own
Python reader and writer, from PyPI) gives for them.

* quants.gguf: one tensor per ggml type this engine reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
  Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), 3 rows of 512 elements each. The types the package quantizes
  (F*, Q8_0, Q4_*, Q5_0, Q5_1) are quantized from random values by it; the K-quants, which it only
  dequantizes, are random blocks (finite fp16 scales, random 4/5/6-bit codes). Plus metadata of
  every value type (integers of each width, floats, bools, strings, arrays, an array of arrays).
* quants_expected.safetensors: for each tensor, gguf.quants.dequantize of its bytes (F32).

* tiny-a-f32.gguf: tests/fixtures/tiny-a/target (F32) written as llama.cpp's converter writes a
  Qwen3 (convert_hf_to_gguf.py: the `qwen3.*` keys, tensor names from the package's own tensor
  map, norms and weights as they are), without a tokenizer.
* tiny-a-split-00001-of-00003.gguf (and -00002, -00003): the same, split by the package's writer
  (split_max_tensors=20), the first file naming the split count.
* qwen3-q4km.gguf: a random 2-layer Qwen3 (hidden 256, 4/2 heads of 64, MLP 512) with the
  shipped pair's tokenizer (models/default/target: byte-level BPE, Qwen2's pre-tokenizer) and chat
  template, its tokens, types and merges written by llama.cpp's vocabulary rule (get_vocab_base,
  gguf.SpecialVocab), and weights in Q4_K_M's mix: Q4_K for most matrices, Q6_K for attn_v,
  ffn_down and output, F32 norms.
* qwen3-q4km_expected.json: the config the metadata describes and, per tensor under its
  transformers name, its shape and the XXH3-64 of gguf.quants.dequantize's F32 bytes.

The tests (tests/io/test_gguf.cpp) check that our dequantization equals the package's, bit for
bit, that the metadata reads back as written, and that `flashmap convert` turns the Qwen3 files
into folders holding exactly these tensors, configs and tokenizers.

Run from the repository root:  python3 tools/make_gguf_fixtures.py   (needs: pip install gguf numpy transformers xxhash)
"""

import json
import os
import struct

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")

ROWS, COLS = 3, 512


def random_k_blocks(rng, qtype, n_blocks):
    """Random blocks of a K-quant: every code random, the fp16 scales finite and moderate."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
    _, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)

    def halves(n):
        return np.frombuffer(rng.uniform(-0.05, 0.05, n).astype(np.float16).tobytes(), np.uint8)

    for b in range(n_blocks):
        if qtype in (T.Q4_K, T.Q5_K):
            raw[b, 0:4] = halves(2)  # d, dmin first
        elif qtype == T.Q6_K:
            raw[b, size - 2:size] = halves(1)  # d last
    return raw


def main():
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    rng = np.random.default_rng(20261205)
    os.makedirs(OUT, exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(OUT, "quants.gguf"), arch="test")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 2 ** 63 + 5)
    w.add_int64("test.i64", -(2 ** 62))
    w.add_float32("test.f32", 0.25)
    w.add_float64("test.f64", -1.5e300)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo, wörld")
    w.add_array("test.strings", ["a", "", "ünïcode", "tokens"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.nested", [[1, 2], [3]])
    expected = {}
    for name, qtype in [("f32", T.F32), ("f16", T.F16), ("bf16", T.BF16), ("q8_0", T.Q8_0),
                        ("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q5_0", T.Q5_0), ("q5_1", T.Q5_1),
                        ("q4_k", T.Q4_K), ("q5_k", T.Q5_K), ("q6_k", T.Q6_K)]:
        if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
            block = gguf.GGML_QUANT_SIZES[qtype][0]
            raw = random_k_blocks(rng, qtype, ROWS * COLS // block).reshape(ROWS, -1)
        else:
            x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
            raw = quants.quantize(x, qtype)
        deq = quants.dequantize(raw, qtype).astype(np.float32).reshape(ROWS, COLS)
        w.add_tensor(name, raw, raw_dtype=qtype)
        expected[name] = deq
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # The expected values as a safetensors file (F32), written without torch.
    header, blobs, offset = {}, [], 0
    for name in sorted(expected):
        data = np.ascontiguousarray(expected[name]).tobytes()
        header[name] = {"dtype": "F32", "shape": [ROWS, COLS],
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"gguf": gguf.__name__, "generated_by": "tools/make_gguf_fixtures.py"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(OUT, "quants_expected.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    print("wrote", os.path.relpath(OUT, ROOT))


# transformers' names of a Qwen3 layer's tensors.
LAYER = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
         "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def hf_names(layers, tied):
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if tied else ["lm_head.weight"])
    for i in range(layers):
        names += [f"model.layers.{i}.{n}.weight" for n in LAYER]
    return names


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


def add_qwen3_params(w, c):
    """The `qwen3.*` keys llama.cpp's converter writes for a Qwen3 config (TextModel)."""
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])


def add_vocab(w, tokenizer_dir, vocab_size):
    """llama.cpp's _set_vocab_gpt2: get_vocab_base's tokens and types, then SpecialVocab."""
    import gguf
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    reverse = {i: t for t, i in tok.vocab.items()}
    added = tok.get_added_vocab()
    decoder = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if t in added:
            if not decoder[i].normalized:
                t = tok.decode(tok.encode(t, add_special_tokens=False))
            special = decoder[i].special or (t.startswith("<|") and t.endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(tokenizer_dir, load_merges=True).add_to_gguf(w)


def write_gguf(path, arch, fill, split_max_tensors=0):
    import gguf
    w = gguf.GGUFWriter(path, arch=arch, split_max_tensors=split_max_tensors)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def qwen3_fixtures():
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    import xxhash

    # tiny-a's target, F32, as the converter writes it.
    src = os.path.join(ROOT, "tests", "fixtures", "tiny-a", "target")
    c = json.load(open(os.path.join(src, "config.json")))
    c["rope_theta"] = c["rope_parameters"]["rope_theta"]
    weights = read_safetensors(os.path.join(src, "model.safetensors"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, c["num_hidden_layers"])

    def tiny(w):
        add_qwen3_params(w, c)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        for hf in sorted(weights):
            w.add_tensor(names.get_name(hf, try_suffixes=(".weight",)), weights[hf])
    write_gguf(os.path.join(OUT, "tiny-a-f32.gguf"), "qwen3", tiny)
    # The same split in three files of at most 20 tensors, as the converter's
    # --split-max-tensors writes them (tiny-a-split-0000K-of-00003.gguf).
    write_gguf(os.path.join(OUT, "tiny-a-split.gguf"), "qwen3", tiny, split_max_tensors=20)

    # A random Qwen3 in Q4_K_M's mix, with a tokenizer and a chat template.
    rng = np.random.default_rng(20261206)
    tokdir = os.path.join(ROOT, "models", "default", "target")
    vocab = len(json.load(open(os.path.join(tokdir, "tokenizer.json")))["model"]["vocab"]) + 1
    q = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "max_position_embeddings": 4096, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
         "vocab_size": vocab}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, q["num_hidden_layers"])
    H, I, D = q["hidden_size"], q["intermediate_size"], q["head_dim"]
    shapes = {"model.embed_tokens.weight": [vocab, H], "model.norm.weight": [H],
              "lm_head.weight": [vocab, H]}
    for i in range(q["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                       p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
                       p + "self_attn.q_proj.weight": [4 * D, H],
                       p + "self_attn.k_proj.weight": [2 * D, H],
                       p + "self_attn.v_proj.weight": [2 * D, H],
                       p + "self_attn.o_proj.weight": [H, 4 * D],
                       p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                       p + "mlp.down_proj.weight": [H, I]})
    assert sorted(shapes) == sorted(hf_names(q["num_hidden_layers"], False))
    expected = {"config": q, "tensors": {}}

    def q4km(w):
        add_qwen3_params(w, q)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
        add_vocab(w, tokdir, vocab)
        for hf in sorted(shapes):
            shape = shapes[hf]
            if len(shape) == 1:
                qtype = T.F32
                raw = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            else:
                six = any(k in hf for k in ("v_proj", "down_proj", "lm_head"))
                qtype = T.Q6_K if six else T.Q4_K
                block = gguf.GGML_QUANT_SIZES[qtype][0]
                raw = random_k_blocks(rng, qtype, shape[0] * shape[1] // block)
                raw = raw.reshape(shape[0], -1)
            deq = quants.dequantize(raw, qtype).astype(np.float32).reshape(shape)
            expected["tensors"][hf] = {"shape": shape, "type": qtype.name,
                                       "xxh3_64": xxhash.xxh3_64_intdigest(deq.tobytes())}
            w.add_tensor(names.get_name(hf, try_suffixes=(".weight",)), raw, raw_dtype=qtype)
    write_gguf(os.path.join(OUT, "qwen3-q4km.gguf"), "qwen3", q4km)
    with open(os.path.join(OUT, "qwen3-q4km_expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
    qwen3_fixtures()
