#!/usr/bin/env python3
"""Builds small random Qwen3 targets and FlashMap drafters, runs the reference package
(flashmap==0.1.0 on transformers) on them in float32, and writes a fixture folder that
`flashmap parity DIR` checks (format: tests/fixtures/README.md).

    python3 tools/make_fixtures.py --out tests/fixtures/tiny-a --seed 1 --preset a
    python3 tools/make_fixtures.py --out /tmp/fx --seed 7 --vocab 777 --hidden 80 ...

Needs: pip install -r tools/requirements.txt. Deterministic for a given seed on one machine.
"""

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from flashmap import FlashMapCache, FlashMapConfig, FlashMapDraftModel

PRESETS = {
    # vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, tie
    # drafter: block, hidden, layers, heads, intermediate, noise_gate, num_steps, layer_ids
    "a": dict(vocab=1024, hidden=64, layers=4, heads=4, kv_heads=2, head_dim=24, inter=160, tie=False,
              block=8, d_hidden=48, d_layers=2, d_heads=4, d_inter=128, noise_gate="jump", num_steps=1,
              layer_ids=[0, 2], extras=True),
    "b": dict(vocab=1024, hidden=64, layers=3, heads=4, kv_heads=4, head_dim=16, inter=160, tie=True,
              block=16, d_hidden=48, d_layers=3, d_heads=2, d_inter=96, noise_gate="constant", num_steps=2,
              layer_ids=[1], extras=False),
    "c": dict(vocab=1536, hidden=80, layers=5, heads=8, kv_heads=1, head_dim=16, inter=224, tie=False,
              block=5, d_hidden=72, d_layers=1, d_heads=3, d_inter=200, noise_gate="jump", num_steps=3,
              layer_ids=[3, 0, 2], extras=False),
}


def randomize(model, gen, scale):
    """Re-draws every parameter so that activations and logits are far from uniform (the
    default 0.02 init leaves near-ties that make argmax checks meaningless)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="a")
    ap.add_argument("--prompt-len", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=40)
    for key in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "inter", "block", "d_hidden",
                "d_layers", "d_heads", "d_inter", "num_steps"):
        ap.add_argument("--" + key.replace("_", "-"), type=int)
    ap.add_argument("--noise-gate", choices=["jump", "constant"])
    ap.add_argument("--layer-ids", type=lambda s: [int(x) for x in s.split(",")])
    args = ap.parse_args()
    cfg = dict(PRESETS[args.preset])
    for key in list(cfg):
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)

    tconf = Qwen3Config(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["inter"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        head_dim=cfg["head_dim"], max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0 + 17 * args.seed,
        tie_word_embeddings=cfg["tie"], eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    target = Qwen3ForCausalLM(tconf).float().eval()
    randomize(target, gen, 1.0)
    if cfg["tie"]:
        target.tie_weights()
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    target.save_pretrained(os.path.join(args.out, "target"))

    dconf = FlashMapConfig(
        target_model="tiny-qwen3", target_hidden_size=cfg["hidden"], vocab_size=cfg["vocab"],
        target_layer_ids=cfg["layer_ids"], block_size=cfg["block"], hidden_size=cfg["d_hidden"],
        num_hidden_layers=cfg["d_layers"], num_attention_heads=cfg["d_heads"], intermediate_size=cfg["d_inter"],
        cond_dim=32, time_embed_dim=16, noise_gate=cfg["noise_gate"], num_steps=cfg["num_steps"],
    )
    draft = FlashMapDraftModel(dconf).float().eval()
    randomize(draft, gen, 1.0)
    with torch.no_grad():
        draft.noise_gate.fill_(0.75)
    draft._clear_caches()
    draft.save_pretrained(os.path.join(args.out, "draft"))
    for name in ("configuration_flashmap.py", "modeling_flashmap.py"):
        # save_pretrained copies the reference's source beside the weights; the fixture needs
        # only config.json and weights (the installed package loads them).
        path = os.path.join(args.out, "draft", name)
        if os.path.exists(path):
            os.remove(path)

    V, K, P = cfg["vocab"], cfg["block"], args.prompt_len
    prompt = torch.randint(0, V, (1, P), generator=gen)
    embed_tokens, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    out = {}
    with torch.no_grad():
        res = target(prompt, output_hidden_states=True)
        features = draft.select_target_hidden(res.hidden_states)
        out["prompt_ids"] = prompt[0]
        out["target_logits"] = res.logits[0]
        out["target_features"] = features[0]
        uniform_embeds, factor = draft.target_constants(embed_tokens.weight)
        out["uniform_embeds"] = uniform_embeds.reshape(-1)
        out["noise_factor"] = factor

        def fresh_cache():
            cache = FlashMapCache(dconf, 1, P + K + 2, dtype=torch.float32)
            draft.extend_context(cache, features[:, : P - 1])
            return cache

        anchor = prompt[:, -1]
        for n in sorted(dconf.jump_grids, key=int):
            x0 = torch.randn((1, K, V), generator=gen)
            out[f"noise_x0_steps{n}"] = x0[0]
            out[f"draft_logits_steps{n}"] = draft.draft(anchor, fresh_cache(), embed_tokens, lm_head,
                                                        num_steps=int(n), noise=x0)[0]
        # The one-step draft from embedding-space noise, as draft() builds it when it draws z.
        z = torch.randn((1, K, factor.shape[0]), generator=gen)
        cache = fresh_cache()
        pos = cache.length
        anchor_context = draft.anchor_norm(draft.anchor_proj(embed_tokens(anchor[:, None])))
        rope = __import__("flashmap.modeling_flashmap", fromlist=["rope_tables"]).rope_tables(
            torch.full((1, 1), pos), draft.head_dim, dconf.rope_theta)
        for i, layer in enumerate(draft.layers):
            cache.write(i, pos, *layer.cross_attn.project_kv(anchor_context, rope))
        t1 = dconf.jump_grids["1"][1]
        inputs = draft.mix_state(uniform_embeds, z @ factor.T, 0.0, t1)
        positions = pos + 1 + torch.arange(K)[None]
        out["noise_z"] = z[0]
        out["draft_logits_z"] = lm_head(draft(inputs, 0.0, t1, positions, cache.context(pos + 1)))[0]

        N = args.new_tokens
        greedy = target.generate(prompt, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        out["greedy_ids"] = greedy[0, P:]
        spec = draft.spec_generate(target, prompt, max_new_tokens=N, temperature=0.0, stop_token_ids=[])
        out["spec_ids"] = spec.sequences[0, P:]
        # A stop token the greedy continuation reaches midway, so that stopping is exercised.
        stop_token = int(greedy[0, P + N // 2])
        spec_stop = draft.spec_generate(target, prompt, max_new_tokens=N, temperature=0.0,
                                        stop_token_ids=[stop_token])
        out["spec_ids_stop"] = spec_stop.sequences[0, P:]

    tensors = {k: (v.contiguous().to(torch.int64) if v.dtype == torch.int64 else v.contiguous().float())
               for k, v in out.items()}
    save_file(tensors, os.path.join(args.out, "expected.safetensors"))
    expected = {
        "vocab_size": V, "target_hidden": cfg["hidden"], "block_size": K, "prompt_len": P,
        "stop_token": stop_token, "jump_grids": {k: v for k, v in dconf.jump_grids.items()},
        "spec_acceptance_lengths": spec.acceptance_lengths,
        "spec_stop_acceptance_lengths": spec_stop.acceptance_lengths,
        "seed": args.seed, "preset": args.preset, "config": cfg,
        "reference": "flashmap==0.1.0, transformers " + __import__("transformers").__version__
                     + ", torch " + torch.__version__ + ", float32 on CPU",
    }
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)

    if cfg.get("extras"):
        # A bf16 copy (weights rounded to bf16; the reference logits computed in fp32 from those
        # weights) and a sharded copy of the target, to test loading both.
        target.save_pretrained(os.path.join(args.out, "target_sharded"), max_shard_size="250KB")
        bf16 = Qwen3ForCausalLM.from_pretrained(os.path.join(args.out, "target"), dtype=torch.bfloat16)
        bf16.save_pretrained(os.path.join(args.out, "target_bf16"))
        with torch.no_grad():
            logits = bf16.float()(prompt).logits[0]
        save_file({"target_logits": logits.contiguous()}, os.path.join(args.out, "target_bf16", "expected.safetensors"))
    print(f"wrote {args.out}: V={V} K={K} P={P} spec tau={spec.acceptance_length:.2f}")


if __name__ == "__main__":
    main()
