"""Small models for the server tests that need the real Qwen3 tokenizer (standard library only)."""

import json
import os
import shutil

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
TOKENIZER = os.path.join(DATA, "qwen3-tokenizer")


def write_text_model(out):
    """A random Qwen3 target with the real Qwen3 vocabulary (151936) but hidden size 32 and two
    layers: big enough for the real tokenizer, small enough to write and run in a second."""
    import array
    import random
    rng = random.Random(7)
    V, H, L, NH, NKV, HD, I = 151936, 32, 2, 2, 1, 16, 64
    base = array.array("f", [rng.gauss(0, 1) for _ in range(1 << 16)]).tobytes()

    def tensor(shape, scale=None, ones=False):
        n = 1
        for d in shape:
            n *= d
        if ones:
            return array.array("f", [1.0] * n).tobytes()
        if n <= (1 << 15):
            return array.array("f", [rng.gauss(0, 1) / shape[-1] ** 0.5 for _ in range(n)]).tobytes()
        # Large tensors: rows cut from a random pool at scattered offsets (fast, still varied).
        row = shape[-1] * 4
        pool = len(base) - row
        return b"".join(base[(i * 7919 * 4) % pool // 4 * 4:][:row] for i in range(n // shape[-1]))

    tensors = {"model.embed_tokens.weight": ([V, H], tensor([V, H])),
               "model.norm.weight": ([H], tensor([H], ones=True))}
    for l in range(L):
        p = f"model.layers.{l}."
        tensors.update({
            p + "input_layernorm.weight": ([H], tensor([H], ones=True)),
            p + "post_attention_layernorm.weight": ([H], tensor([H], ones=True)),
            p + "self_attn.q_norm.weight": ([HD], tensor([HD], ones=True)),
            p + "self_attn.k_norm.weight": ([HD], tensor([HD], ones=True)),
            p + "self_attn.q_proj.weight": ([NH * HD, H], tensor([NH * HD, H])),
            p + "self_attn.k_proj.weight": ([NKV * HD, H], tensor([NKV * HD, H])),
            p + "self_attn.v_proj.weight": ([NKV * HD, H], tensor([NKV * HD, H])),
            p + "self_attn.o_proj.weight": ([H, NH * HD], tensor([H, NH * HD])),
            p + "mlp.gate_proj.weight": ([I, H], tensor([I, H])),
            p + "mlp.up_proj.weight": ([I, H], tensor([I, H])),
            p + "mlp.down_proj.weight": ([H, I], tensor([H, I])),
        })
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        shape, data = tensors[name]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)
    config = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
              "attention_dropout": 0.0, "head_dim": HD, "hidden_act": "silu", "hidden_size": H,
              "intermediate_size": I, "max_position_embeddings": 2048, "model_type": "qwen3",
              "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": NKV,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
              "vocab_size": V, "torch_dtype": "float32", "use_sliding_window": False,
              "sliding_window": None, "max_window_layers": L}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [151645, 151643]}, f)


def official_tokenizer(out):
    """A tokenizer folder with the real Qwen3 tokenizer and the official Qwen3-8B chat template
    (chat_template.jinja, which wins over tokenizer_config.json's, as in transformers)."""
    os.makedirs(out, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, name), out)
    shutil.copy(os.path.join(TOKENIZER, "chat_template.qwen3-official.jinja"),
                os.path.join(out, "chat_template.jinja"))
    return out
