#!/usr/bin/env python3
"""`flashmap convert` output loads in the reference packages and drafts as the original does.

  DFlash:   tests/fixtures/dflash/speculators-full (speculators' DFlashConverter output)
            -> flashmap convert -> dflash==0.1.0 DFlashDraftModel.from_pretrained; block logits of
            one drafting round equal to the z-lab fixture's (tests/fixtures/dflash/zlab) and to
            expected.safetensors zlab.block_logits.
  FlashMap: tests/fixtures/convert/flashmap-speculators (this project's speculators-style layout)
            -> flashmap convert -> flashmap==0.1.0 FlashMapDraftModel.from_pretrained; draft logits
            equal to the release drafter's (tests/fixtures/tiny-a/draft) for the same noise.

Usage: convert_reference.py FLASHMAP. Exits 77 (ctest: skipped) without torch, transformers,
dflash or flashmap (tools/requirements.txt).
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def convert(exe, src, dst):
    cmd = [exe, "convert", src, dst]
    print("+", " ".join(cmd), flush=True)
    print(subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout, end="")


def main():
    try:
        import torch
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        import dflash.model as zlab
        from flashmap import FlashMapCache, FlashMapDraftModel
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    exe = os.path.abspath(sys.argv[1])
    os.chdir(ROOT)  # the speculators config names its verifier relative to the repository root
    torch.set_grad_enabled(False)
    target = AutoModelForCausalLM.from_pretrained(
        "tests/fixtures/tiny-a/target", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        # DFlash: one round after prefilling the fixture's prompt (make_dflash_fixtures.zlab_block).
        out = os.path.join(tmp, "zlab")
        convert(exe, "tests/fixtures/dflash/speculators-full", out)
        expected = load_file("tests/fixtures/dflash/expected.safetensors")
        prompt = expected["prompt_ids"][None]

        def block_logits(model):
            res = target(prompt, output_hidden_states=True)
            ctx = zlab.extract_context_feature(res.hidden_states, model.target_layer_ids)
            block = torch.full((1, model.block_size), model.mask_token_id, dtype=torch.long)
            block[:, 0] = res.logits[:, -1].argmax(-1)
            positions = torch.arange(prompt.shape[1] + model.block_size)[None]
            hidden = model(target_hidden=ctx, noise_embedding=embed(block), position_ids=positions)
            return model.compute_logits(hidden[:, 1:], lm_head)[0]

        ours = zlab.DFlashDraftModel.from_pretrained(out, dtype=torch.float32).eval()
        orig = zlab.DFlashDraftModel.from_pretrained("tests/fixtures/dflash/zlab", dtype=torch.float32).eval()
        a, b = block_logits(ours), block_logits(orig)
        diff = float((a - b).abs().max())
        ref = float((a - expected["zlab.block_logits"]).abs().max())
        print(f"DFlash: converted vs z-lab fixture max |diff| = {diff:.3g}; vs expected.safetensors {ref:.3g}")
        failures += diff != 0.0 or ref > 1e-5

        # FlashMap: a one-step draft after the prompt's features, same noise for both.
        out = os.path.join(tmp, "draft")
        convert(exe, "tests/fixtures/convert/flashmap-speculators", out)
        ours = FlashMapDraftModel.from_pretrained(out, dtype=torch.float32).eval()
        orig = FlashMapDraftModel.from_pretrained("tests/fixtures/tiny-a/draft", dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(15)
        P, K, V = 12, orig.config.block_size, orig.config.vocab_size
        prompt = torch.randint(0, V, (1, P), generator=gen)
        noise = torch.randn((1, K, V), generator=gen)
        res = target(prompt, output_hidden_states=True)

        def draft_logits(model):
            feats = model.select_target_hidden(res.hidden_states)
            cache = FlashMapCache(model.config, 1, P + K + 2, dtype=torch.float32)
            model.extend_context(cache, feats[:, : P - 1])
            return model.draft(prompt[:, -1], cache, embed, lm_head, num_steps=1, noise=noise)[0]

        a, b = draft_logits(ours), draft_logits(orig)
        diff = float((a - b).abs().max())
        print(f"FlashMap: converted vs release drafter max |diff| = {diff:.3g} over {a.numel()} logits")
        failures += diff != 0.0
    print("FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
