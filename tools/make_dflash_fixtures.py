#!/usr/bin/env python3
"""Builds two tiny random DFlash drafters for the tiny Qwen3 target in tests/fixtures/tiny-a/target,
one in the z-lab release format (reference: PyPI dflash==0.1.0) and one in the speculators format
(reference: PyPI speculators, speculators_model_type "dflash", reduced draft vocabulary with d2t/t2d),
runs the reference packages on them in float32 and writes reference outputs. See docs/DFLASH.md.

    ~/.cache/flashmap-bench/venv/bin/python tools/make_dflash_fixtures.py

Run from the repository root (the speculators config names its verifier by the relative path
tests/fixtures/tiny-a/target). Writes:

    tests/fixtures/dflash/zlab/{config.json,model.safetensors}
    tests/fixtures/dflash/speculators/{config.json,model.safetensors}
    tests/fixtures/dflash/speculators-full/   zlab/ through speculators' DFlashConverter (full vocabulary)
    tests/fixtures/convert/flashmap-speculators/   tests/fixtures/tiny-a/draft in the speculators-style
                                              FlashMap layout this project defines (no published one)
    tests/fixtures/dflash/expected.safetensors   tensors (float32 / int64), names below
    tests/fixtures/dflash/expected.json          prompts, greedy outputs, acceptance lengths

Needs: pip install -r tools/requirements.txt. Deterministic for a given seed on one machine.
"""

import argparse
import json
import os
import re
import shutil
import time

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3Config

import dflash.model as zlab
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.convert.dflash.converter import DFlashConverter
from speculators.models.attention import create_float_mask
from speculators.models.dflash import DFlashDraftModel as SpecDFlash
from speculators.models.dflash import DFlashSpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

TARGET = "tests/fixtures/tiny-a/target"
OUT = "tests/fixtures/dflash"

BLOCK = 4  # block size: 1 anchor + 3 mask tokens, 3 drafted tokens per round
MASK_ID = 1000  # any id of the target vocabulary (the real Qwen3 drafters use an added special token)
ZLAB_LAYER_IDS = [0, 2]  # z-lab target_layer_ids: hidden_states[i + 1], outputs of decoder layers 0 and 2
SPEC_LAYER_IDS = [i + 1 for i in ZLAB_LAYER_IDS]  # the same features in speculators numbering
DRAFT_VOCAB = 640  # speculators reduced draft vocabulary (target has 1024)


def draft_layer_config(target_cfg, **extra):
    # Attention shape deliberately differs from the target's (head_dim 16 vs 24, rope theta) so a
    # loader that borrows the target's values instead of the drafter's fails the parity check.
    return Qwen3Config(
        vocab_size=target_cfg.vocab_size,
        hidden_size=target_cfg.hidden_size,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 20011.0},
        tie_word_embeddings=False,
        attention_bias=False,
        **extra,
    )


def randomize(named_params, gen, scale=1.0):
    """Redraws parameters so activations are far from the near-uniform default init."""
    with torch.no_grad():
        for name, p in named_params:
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))  # only norm weights are 1-D here
            else:
                p.copy_(scale * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def target_greedy(target, ids, new_tokens):
    out = ids
    for _ in range(new_tokens):
        logits = target(out).logits[:, -1]
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
    return out


def make_zlab(target, gen, out_dir):
    cfg = draft_layer_config(
        target.config,
        block_size=BLOCK,
        num_target_layers=target.config.num_hidden_layers,
        dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": ZLAB_LAYER_IDS},
        architectures=["DFlashDraftModel"],
    )
    model = zlab.DFlashDraftModel(cfg).float().eval()
    randomize(model.named_parameters(), gen)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir)
    # Keep only what a z-lab release config carries (no transformers bookkeeping noise).
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved.pop("transformers_version", None)
    saved["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    with open(path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    return zlab.DFlashDraftModel.from_pretrained(out_dir, dtype=torch.float32).eval()


def make_speculators(target, gen, out_dir):
    layer_cfg = draft_layer_config(target.config)
    config = DFlashSpeculatorConfig(
        transformer_layer_config=layer_cfg,
        draft_vocab_size=DRAFT_VOCAB,
        block_size=BLOCK,
        aux_hidden_state_layer_ids=SPEC_LAYER_IDS,
        mask_token_id=MASK_ID,
        speculators_config=SpeculatorsConfig(
            algorithm="dflash",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=BLOCK - 1)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(TARGET),
        ),
    )
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention needs a compiler
    model = SpecDFlash(config).float()
    body = [(n, p) for n, p in model.named_parameters() if n.split(".")[0] in ("layers", "fc", "hidden_norm", "norm")]
    randomize(body, gen)
    # A seeded "token frequency" picks the draft vocabulary, via the package's own mapping builder.
    freq = {t: int(c) for t, c in enumerate(torch.randint(0, 1000, (target.config.vocab_size,), generator=gen))}
    d2t, t2d = build_vocab_mappings_from_distribution(freq, DRAFT_VOCAB, target.config.vocab_size)
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()  # embed_tokens, lm_head = verifier lm_head rows where t2d, verifier_norm
    with torch.no_grad():
        # The checkpoint's lm_head is what the reference uses for a reduced vocabulary; perturb it so a
        # loader that takes the verifier's rows instead fails the parity check.
        model.lm_head.weight.add_(0.05 * torch.randn(model.lm_head.weight.shape, generator=gen))
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved.pop("transformers_version", None)
    with open(path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    loaded = SpecDFlash.from_pretrained(out_dir)
    loaded.config.transformer_layer_config._attn_implementation = "eager"
    for layer in loaded.layers:
        layer.self_attn.config._attn_implementation = "eager"
    loaded._create_mask_fn = create_float_mask  # the mask builder that goes with eager attention
    return loaded.float().eval()


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_speculators_full(zlab_dir, out_dir):
    """The z-lab drafter as speculators' own DFlashConverter writes it (full vocabulary: no lm_head,
    no d2t/t2d; aux_hidden_state_layer_ids = target_layer_ids + 1)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    DFlashConverter().convert(zlab_dir, out_dir, base_model=TARGET, validate=False)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved.pop("transformers_version", None)
    write_json(path, saved)


# FlashMap has no published speculators or SpecForge layout; this project defines one by analogy
# with speculators' DFlash (docs/DFLASH.md, Conversion): the release config's drafter fields nested
# in transformer_layer_config, the tool-level fields at the top with layer ids + 1, and the weights
# under the release names.
FLASHMAP_RELEASE = "tests/fixtures/tiny-a/draft"
FLASHMAP_SPECULATORS = "tests/fixtures/convert/flashmap-speculators"
FLASHMAP_TOP_LEVEL = ("architectures", "block_size", "target_layer_ids", "target_hidden_size", "target_model")


def write_flashmap_speculators(release_dir, out_dir):
    """The FlashMap release drafter in the speculators-style layout, weights as the reference
    package (flashmap==0.1.0) loads them."""
    from flashmap import FlashMapDraftModel

    with open(os.path.join(release_dir, "config.json")) as f:
        release = json.load(f)
    model = FlashMapDraftModel.from_pretrained(release_dir, dtype=torch.float32).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    layer = {k: v for k, v in release.items() if k not in FLASHMAP_TOP_LEVEL}
    block = release.get("block_size", 16)
    config = {
        "speculators_model_type": "flashmap",
        "architectures": release.get("architectures", ["FlashMapDraftModel"]),
        "transformer_layer_config": layer,
        "block_size": block,
        "aux_hidden_state_layer_ids": [i + 1 for i in release["target_layer_ids"]],
        "target_hidden_size": release["target_hidden_size"],
        "draft_vocab_size": release["vocab_size"],
        "speculators_config": {
            "algorithm": "flashmap",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block}],
            "verifier": {"name_or_path": release["target_model"], "architectures": ["Qwen3ForCausalLM"]},
        },
    }
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), config)


def zlab_block(model, target, prompt):
    """One drafting round after prefill: context = the prompt's features, anchor = the target's
    greedy next token at position len(prompt), block = [anchor, mask x (BLOCK-1)]."""
    out = target(prompt, output_hidden_states=True)
    ctx = zlab.extract_context_feature(out.hidden_states, model.target_layer_ids)
    anchor = out.logits[:, -1].argmax(-1)
    block = torch.full((1, BLOCK), MASK_ID, dtype=torch.long)
    block[:, 0] = anchor
    noise = target.get_input_embeddings()(block)
    positions = torch.arange(prompt.shape[1] + BLOCK)[None]
    projected = model.hidden_norm(model.fc(ctx))
    hidden = model(target_hidden=ctx, noise_embedding=noise, position_ids=positions)
    logits = model.compute_logits(hidden[:, 1:], target.lm_head)
    return ctx, anchor, projected, hidden, logits


def speculators_block(model, target, prompt, anchor):
    """The same round through the speculators training forward with one anchor at len(prompt)."""
    p = prompt.shape[1]
    pad = torch.zeros((1, BLOCK), dtype=torch.long)  # after the anchor; never visible to the block
    ids = torch.cat([prompt, anchor[:, None], pad], dim=1)
    hs = target(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i] for i in model.target_layer_ids], dim=-1)
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, p] = 1
    hidden, logits, _, _, idx = model._backbone_forward(
        feats,
        ids,
        loss_mask,
        torch.zeros_like(hs[-1]),
        torch.zeros_like(ids),
        max_anchors=1,
    )
    assert idx.tolist() == list(range(p, p + BLOCK)), idx
    return feats[:, :p], hidden, logits[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    torch.set_grad_enabled(False)

    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32, attn_implementation="eager").eval()
    vocab = target.config.vocab_size
    prompts = [torch.randint(0, MASK_ID, (1, n), generator=gen) for n in (11, 5, 17)]

    zm = make_zlab(target, gen, os.path.join(OUT, "zlab"))
    sm = make_speculators(target, gen, os.path.join(OUT, "speculators"))

    tensors, meta = {}, {"seed": args.seed, "target": TARGET, "block_size": BLOCK, "mask_token_id": MASK_ID}
    prompt = prompts[0]
    ctx, anchor, projected, zhidden, zlogits = zlab_block(zm, target, prompt)
    tensors["prompt_ids"] = prompt[0].clone()
    tensors["context_features"] = ctx[0].contiguous()  # [P, 2*64]: hidden_states[1] | hidden_states[3]
    tensors["anchor_id"] = anchor.clone()
    tensors["zlab.projected_context"] = projected[0].contiguous()  # hidden_norm(fc(context)) [P, 64]
    tensors["zlab.block_hidden"] = zhidden[0].contiguous()  # final norm output [BLOCK, 64]
    tensors["zlab.block_logits"] = zlogits[0].contiguous()  # [BLOCK-1, 1024]
    tensors["zlab.draft_ids"] = zlogits[0].argmax(-1)

    sfeats, shidden, slogits = speculators_block(sm, target, prompt, anchor)
    # The off-by-one: speculators ids [1, 3] select the same tensors as z-lab ids [0, 2].
    # (Not bit-equal: the target ran on a longer sequence here.)
    assert torch.allclose(sfeats, ctx, atol=1e-5), float((sfeats - ctx).abs().max())
    tensors["speculators.block_hidden"] = shidden[0].contiguous()
    tensors["speculators.block_logits"] = slogits[0].contiguous()  # [BLOCK-1, 640] over the draft vocab
    draft = slogits[0].argmax(-1)
    tensors["speculators.draft_ids"] = draft  # draft-vocabulary ids
    tensors["speculators.draft_ids_target"] = draft + sm.d2t[draft]  # mapped: id + d2t[id]
    assert bool(sm.t2d[tensors["speculators.draft_ids_target"]].all())

    # Cross-check with the package's converter: the z-lab drafter converted to speculators format
    # (target_layer_ids + 1) gives the z-lab block logits through the speculators forward. The
    # converted folder is kept: `flashmap convert` turns it back into zlab/ (tests/models/test_convert.cpp).
    full = os.path.join(OUT, "speculators-full")
    write_speculators_full(os.path.join(OUT, "zlab"), full)
    with open(os.path.join(full, "config.json")) as f:
        converted = json.load(f)
    meta["converted_aux_hidden_state_layer_ids"] = converted["aux_hidden_state_layer_ids"]
    cm = SpecDFlash.from_pretrained(full).float().eval()
    for layer in cm.layers:
        layer.self_attn.config._attn_implementation = "eager"
    cm._create_mask_fn = sm._create_mask_fn
    _, _, clogits = speculators_block(cm, target, prompt, anchor)
    meta["converted_max_abs_diff"] = float((clogits - zlogits).abs().max())
    assert torch.allclose(clogits, zlogits, atol=1e-5, rtol=1e-4), meta["converted_max_abs_diff"]
    write_flashmap_speculators(FLASHMAP_RELEASE, FLASHMAP_SPECULATORS)

    # The z-lab spec-generate loop, greedy, on CPU (its timing helper needs CUDA: replaced).
    zlab._cuda_time = time.perf_counter
    runs = []
    for i, p in enumerate(prompts):
        ref = target_greedy(target, p, args.new_tokens)
        # Record each round's drafted ids (argmax of the block logits): with a random drafter few are
        # accepted, so the output ids alone would not test the drafter across rounds.
        drafts = []

        def recording(hidden, head, inner=type(zm).compute_logits):
            logits = inner(zm, hidden, head)
            drafts.append(logits[0].argmax(-1).tolist())
            return logits

        zm.compute_logits = recording
        res = zlab.dflash_generate(zm, target, p, args.new_tokens, None, temperature=0.0, return_stats=True)
        del zm.compute_logits
        assert torch.equal(res.output_ids, ref), (res.output_ids, ref)
        tensors[f"greedy.{i}.output_ids"] = res.output_ids[0].clone()
        runs.append(
            {
                "prompt_ids": p[0].tolist(),
                "max_new_tokens": args.new_tokens,
                "output_ids": res.output_ids[0].tolist(),
                "acceptance_lengths": list(res.acceptance_lengths),
                "draft_ids_per_round": drafts,
            }
        )
    meta["zlab_greedy"] = runs
    meta["vocab_size"] = vocab
    meta["draft_vocab_size"] = DRAFT_VOCAB
    meta["zlab_target_layer_ids"] = ZLAB_LAYER_IDS
    meta["speculators_aux_hidden_state_layer_ids"] = SPEC_LAYER_IDS
    meta["tensors"] = {k: [list(v.shape), str(v.dtype)] for k, v in sorted(tensors.items())}

    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "expected.safetensors"))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        text = json.dumps(meta, indent=1)
        # One line per list of numbers.
        text = re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
        f.write(text + "\n")
    print(json.dumps({k: v for k, v in meta.items() if k != "tensors"}, indent=1)[:3000])


if __name__ == "__main__":
    main()
