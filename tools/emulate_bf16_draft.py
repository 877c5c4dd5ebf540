"""Sizes the tolerance of tests/cuda/test_cuda_flashmap.cpp without a GPU: runs the reference
drafter (flashmap==0.1.0) on the committed fixtures twice, in fp32 and with exactly the roundings of
the CUDA drafter (src/cuda/flashmap_cuda.cpp): every nn.Linear weight and input rounded to bf16
(fp32 accumulation), the target's embedding and lm_head in bf16, the state and the posterior
rounded to bf16 before they are read through E, z and L in bf16 for the one-step embedding noise.
Prints per draft the NMSE, argmax agreement and the smallest top-2 logit gap.

    python3 tools/emulate_bf16_draft.py tests/fixtures/tiny-a tests/fixtures/tiny-b tests/fixtures/tiny-c
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from flashmap import FlashMapDraftModel, FlashMapCache
torch.set_num_threads(1)
bf = lambda x: x.to(torch.bfloat16).float()

def run(fx, emulate):
    draft = FlashMapDraftModel.from_pretrained(f"{fx}/draft").float().eval()
    target = AutoModelForCausalLM.from_pretrained(f"{fx}/target").float().eval()
    ref = load_file(f"{fx}/expected.safetensors")
    emb, lm = target.get_input_embeddings(), target.get_output_embeddings()
    if emulate:
        with torch.no_grad():
            for m in list(draft.modules()) + [lm]:
                if isinstance(m, torch.nn.Linear):
                    m.weight.copy_(bf(m.weight))
                    m.register_forward_pre_hook(lambda mod, args: (bf(args[0]),))
            emb.weight.copy_(bf(emb.weight))
        def embed_state(state, s, t, embedding):
            if s == 0:
                pe = draft.target_constants(embedding)[0]
            else:
                post = (state.float() * (s / max(1.0 - s, 1e-3) ** 2)).softmax(dim=-1)
                pe = bf(post) @ embedding
            return draft.mix_state(pe, bf(state) @ embedding, s, t)
        draft.embed_state = embed_state
    feats = ref["target_features"][None]
    prompt = ref["prompt_ids"][None]
    P = prompt.shape[1]; K = draft.config.block_size
    def fresh():
        c = FlashMapCache(draft.config, 1, P + K + 2, dtype=torch.float32)
        draft.extend_context(c, feats[:, :P-1]); return c
    anchor = prompt[:, -1]
    outs = {}
    with torch.no_grad():
        uni, factor = draft.target_constants(emb.weight)
        for n in sorted(draft.config.jump_grids, key=int):
            outs[f"steps{n}"] = draft.draft(anchor, fresh(), emb, lm, num_steps=int(n), noise=ref[f"noise_x0_steps{n}"][None])[0]
        z = ref["noise_z"][None]
        cache = fresh(); pos = cache.length
        from flashmap.modeling_flashmap import rope_tables
        ac = draft.anchor_norm(draft.anchor_proj(emb(anchor[:, None])))
        rope = rope_tables(torch.full((1, 1), pos), draft.head_dim, draft.config.rope_theta)
        for i, layer in enumerate(draft.layers):
            cache.write(i, pos, *layer.cross_attn.project_kv(ac, rope))
        t1 = draft.config.jump_grids["1"][1]
        f = bf(factor) if emulate else factor
        zz = bf(z) if emulate else z
        inputs = draft.mix_state(uni, zz @ f.T, 0.0, t1)
        positions = pos + 1 + torch.arange(K)[None]
        outs["z"] = lm(draft(inputs, 0.0, t1, positions, cache.context(pos + 1)))[0]
    return outs

for fx in sys.argv[1:]:
    a, b = run(fx, False), run(fx, True)
    for k in a:
        x, y = a[k].double(), b[k].double()
        nmse = ((x - y) ** 2).sum() / (x ** 2).sum()
        top2 = x.topk(2, dim=-1).values
        gap = (top2[:, 0] - top2[:, 1])
        agree = (x.argmax(-1) == y.argmax(-1)).sum().item()
        rmse = ((x - y) ** 2).mean(-1).sqrt()
        print(f"{fx} {k}: nmse {nmse:.2e} argmax {agree}/{x.shape[0]} std {x.std():.3f} min gap {gap.min():.2e} max rms err {rmse.max():.2e} max|d| {(x-y).abs().max():.2e}")
