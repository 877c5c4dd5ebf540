#!/usr/bin/env python3
"""DFlash drafter training on the same data as the FlashMap drafter, export to the z-lab release
format (the `dflash==0.1.0` package's DFlashDraftModel), for the FlashMap-vs-DFlash comparison
(docs/MEASURED.md).

    python3 tools/train/train_drafter.py gen --target T --out D/data.pt ...   (the same data file)
    python3 tools/train/train_dflash.py train  --target T --data D/data.pt --ckpt D/dflash.ckpt --steps 6500
    python3 tools/train/train_dflash.py check  --target T --data D/data.pt --ckpt D/dflash.ckpt
    python3 tools/train/train_dflash.py export --target T --ckpt D/dflash.ckpt --out D/dflash --bf16

The architecture is dflash.DFlashDraftModel itself, so the weights are the release format's. A
training sample is one block: the anchor token at position a (whose own features the drafter has
not seen, as in dflash_generate, where the anchor is the last verified token), B-1 mask tokens,
block positions a..a+B-1, the target features of positions < a as context; rows 1..B-1 are
trained with cross-entropy against tokens a+1..a+B-1 (position-weighted e^(-k/gamma), as the
FlashMap trainer weights its slots). A batch holds whole sequences of features; the attention mask
hides the context positions >= a of each sample, so the forward equals the inference forward on
the features before a (`check` verifies it against the package's cached, unmasked forward).
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_drafter import heldout_prompts, load_target  # noqa: E402


def make_config(args, target, data):
    from transformers import Qwen3Config
    V, H = target.config.vocab_size, target.config.hidden_size
    if data["vocab_size"] != V or data["target_hidden"] != H:
        sys.exit("error: the data was generated with another target (vocabulary or hidden size differ)")
    # The drafter embeds its block with the target's embedding and reads out through the target's
    # lm_head, so its hidden size is the target's (dflash/model.py DFlashDraftModel); the budget is
    # spent on the depth and the MLP width instead.
    return Qwen3Config(
        vocab_size=V, hidden_size=H, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, intermediate_size=args.intermediate,
        rms_norm_eps=target.config.rms_norm_eps, max_position_embeddings=target.config.max_position_embeddings,
        rope_parameters=dict(target.config.rope_parameters), tie_word_embeddings=False,
        architectures=["DFlashDraftModel"], block_size=args.block, num_target_layers=target.config.num_hidden_layers,
        dflash_config={"mask_token_id": args.mask_token_id, "target_layer_ids": data["layer_ids"],
                       "block_size": args.block})


def make_draft(cfg, seed):
    from dflash.model import DFlashDraftModel
    torch.manual_seed(seed)
    return DFlashDraftModel(cfg).float()


def least_frequent_token(data):
    """The mask token: the target has no spare special token, so the block's mask slots take the
    embedding of the token the training data uses least (never as a target of the loss at the
    mask rows' positions in practice, and a vector the drafter can learn to read as 'unknown')."""
    counts = torch.bincount(data["tokens"].flatten(), minlength=data["vocab_size"])
    return int(counts.argmin())


def sample_blocks(data, n_seq, n_anchor, K, gen):
    """n_seq sequences with n_anchor distinct anchors each (the range train_drafter.batch_samples
    draws from: in the generated part, K tokens after each), and the K tokens after each anchor."""
    tokens, feats, P = data["tokens"], data["features"], data["prompt_len"]
    N, L = tokens.shape
    seq = torch.randint(0, N, (n_seq,), generator=gen)
    anchors = torch.stack([P - 1 + torch.randperm(L - K - P + 1, generator=gen)[:n_anchor] for _ in range(n_seq)])
    toks = tokens[seq]
    y = toks.gather(1, (anchors[:, :, None] + 1 + torch.arange(K)).flatten(1)).view(n_seq, n_anchor, K)
    return feats[seq].float(), toks, anchors, y


def block_forward(draft, E, W, feats, tokens, anchors, mask_id):
    """Logits (S, A, B-1, V) of the blocks after `anchors` (S, A) of sequences with target
    features `feats (S, L, F)` and tokens `tokens (S, L)`. The A blocks of a sequence share one
    projection of its features (as speculators' training does with many anchors per sequence):
    block j sees the context positions < its anchor and its own B slots, nothing else."""
    S, L = tokens.shape
    A = anchors.shape[1]
    B, dev = draft.block_size, feats.device
    block = torch.full((S, A, B), mask_id, dtype=torch.long, device=dev)
    block[:, :, 0] = tokens.gather(1, anchors)
    pos_ctx = torch.arange(L, device=dev)[None].expand(S, -1)
    pos_blk = (anchors[:, :, None] + torch.arange(B, device=dev)).flatten(1)  # (S, A*B)
    position_ids = torch.cat([pos_ctx, pos_blk], dim=1)
    sees_ctx = pos_ctx[:, None, :] < anchors[:, :, None]  # (S, A, L)
    same_block = torch.eye(A, dtype=torch.bool, device=dev)[None, :, :].expand(S, A, A)
    sees_blk = same_block[:, :, :, None].expand(S, A, A, B).flatten(2)  # (S, A, A*B)
    visible = torch.cat([sees_ctx, sees_blk], dim=2)  # (S, A, L + A*B), per block
    mask = visible[:, :, None, :].expand(S, A, B, L + A * B).reshape(S, 1, A * B, L + A * B)
    hidden = draft(position_ids=position_ids, attention_mask=mask, noise_embedding=E[block.flatten(1)],
                   target_hidden=feats)
    logits = draft.compute_logits(hidden.view(S, A, B, -1)[:, :, 1:], lambda h: h @ W.T)
    return logits


def cmd_train(args):
    torch.set_num_threads(args.threads)
    target = load_target(args.target, args.device)
    data = torch.load(args.data, weights_only=False)
    if args.mask_token_id < 0:
        args.mask_token_id = least_frequent_token(data)
    cfg = make_config(args, target, data)
    draft = make_draft(cfg, args.seed).to(args.device)
    E = target.get_input_embeddings().weight.detach().float()
    W = target.get_output_embeddings().weight.detach().float()
    nparams = sum(p.numel() for p in draft.parameters())
    print(f"DFlash drafter: {nparams} parameters, block {args.block}, mask token {args.mask_token_id}", flush=True)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    state = {"step": 0, "elapsed": 0.0}
    gen = torch.Generator().manual_seed(args.seed)
    if os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt, weights_only=False)
        if ck["config"] != cfg.to_dict():
            sys.exit(f"error: checkpoint {args.ckpt} is for another configuration")
        draft.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        torch.set_rng_state(ck["rng"])
        gen.set_state(ck["gen"])
        print(f"resumed at step {state['step']}", flush=True)

    def save():
        torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), "state": state, "rng": torch.get_rng_state(),
                    "gen": gen.get_state(), "config": cfg.to_dict()}, args.ckpt + ".tmp")
        os.replace(args.ckpt + ".tmp", args.ckpt)

    K = args.block - 1
    pos_w = torch.exp(-torch.arange(K).float() / args.pos_gamma)
    pos_w = (pos_w / pos_w.mean()).to(args.device)
    draft.train()
    last_print, last_save = -1e9, time.time()
    while state["step"] < args.steps:
        t0 = time.time()
        frac = state["step"] / args.steps
        # the FlashMap trainer's schedule: 5% warm-up, cosine to a tenth
        lr = args.lr * min(1.0, frac * 20 + 0.02) * (0.5 * (1 + math.cos(math.pi * frac)) * 0.9 + 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        feats, toks, anchors, y = sample_blocks(data, args.batch // args.anchors, args.anchors, K, gen)
        feats, toks, anchors, y = (t.to(args.device) for t in (feats, toks, anchors, y))
        with torch.autocast(device_type=torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.amp):
            logits = block_forward(draft, E, W, feats, toks, anchors, args.mask_token_id)
        logits = logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        loss = (loss.view(-1, K) * pos_w).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["elapsed"] += time.time() - t0
        if state["elapsed"] - last_print > 20:
            last_print = state["elapsed"]
            with torch.no_grad():
                acc = (logits.argmax(-1) == y).float().flatten(0, 1).mean(0)
            pace = state["elapsed"] / state["step"]
            print(f"step {state['step']} loss {loss.item():.3f} acc@slot0 {acc[0]:.2f} acc {acc.mean():.2f} "
                  f"lr {lr:.1e} {args.batch * K / (time.time() - t0):.0f} tok/s "
                  f"ETA {(args.steps - state['step']) * pace / 60:.1f} min", flush=True)
        if time.time() - last_save > 60:
            save()
            last_save = time.time()
    save()
    print(f"training done: {state['step']} steps in {state['elapsed'] / 60:.1f} min", flush=True)


def load_ckpt(args):
    from transformers import Qwen3Config
    ck = torch.load(args.ckpt, weights_only=False)
    cfg = Qwen3Config.from_dict(ck["config"])
    draft = make_draft(cfg, 0)
    draft.load_state_dict(ck["model"])
    return draft.eval()


@torch.no_grad()
def cmd_check(args):
    """The masked batch forward equals the package's forward on the context before the anchor
    (the one dflash_generate runs, without a mask, dflash/model.py:573-597)."""
    target = load_target(args.target, "cpu")
    data = torch.load(args.data, weights_only=False)
    if os.path.exists(args.ckpt):
        draft = load_ckpt(args)
    else:
        if args.mask_token_id < 0:
            args.mask_token_id = least_frequent_token(data)
        draft = make_draft(make_config(args, target, data), args.seed).eval()
    E = target.get_input_embeddings().weight.float()
    W = target.get_output_embeddings().weight.float()
    mask_id = draft.mask_token_id
    B = draft.block_size
    feats, toks, anchors, _ = sample_blocks(data, 2, 4, B - 1, torch.Generator().manual_seed(1))
    batch = block_forward(draft, E, W, feats, toks, anchors, mask_id)
    worst = 0.0
    for i in range(2):
        for j in range(4):
            a = int(anchors[i, j])
            block = torch.full((1, B), mask_id, dtype=torch.long)
            block[0, 0] = toks[i, a]
            hidden = draft(position_ids=torch.arange(a + B)[None], noise_embedding=E[block],
                           target_hidden=feats[i:i + 1, :a])
            ref = draft.compute_logits(hidden[:, 1:], lambda h: h @ W.T)
            worst = max(worst, ((batch[i, j] - ref[0]).abs().max() / ref.abs().max().clamp_min(1.0)).item())
    print(f"training forward vs the package's forward: max relative |diff| {worst:.2e}")
    if worst > 1e-4:
        sys.exit("error: the training forward does not match the package's forward")


def cmd_export(args):
    import shutil
    draft = load_ckpt(args)
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    draft.to(torch.bfloat16 if args.bf16 else torch.float32).save_pretrained(args.out)
    with open(os.path.join(args.out, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("auto_map", None)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    print(f"wrote {args.out}")


@torch.no_grad()
def cmd_eval(args):
    """tau of the reference loop (dflash_generate, dflash/model.py:180-328) on the held-out prompts
    that train_drafter.py eval and eval_engine.py use (same seed), mean +- 95% CI over rounds."""
    import dflash.model as zlab
    from tokenizers import Tokenizer
    from dflash.model import DFlashDraftModel, dflash_generate
    zlab._cuda_time = time.perf_counter  # its timer synchronizes CUDA; a wall clock on the CPU
    torch.set_num_threads(args.threads)
    target = load_target(args.target, "cpu")
    draft = DFlashDraftModel.from_pretrained(args.draft_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    prompts, _ = heldout_prompts(args.corpus, tok, args.prompts, args.seed)
    for temp in args.temperatures:
        taus = []
        for p in prompts:
            out = dflash_generate(draft, target, torch.tensor([p]), max_new_tokens=args.max_new_tokens,
                                  stop_token_ids=None, temperature=temp, return_stats=True)
            taus.extend(out.acceptance_lengths)
        m = sum(taus) / len(taus)
        sd = (sum((x - m) ** 2 for x in taus) / max(len(taus) - 1, 1)) ** 0.5
        print(f"reference tau T={temp} dflash: {m:.3f} +- {1.96 * sd / len(taus) ** 0.5:.3f} ({len(taus)} rounds)",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["train", "check", "export", "eval"])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", default=None)
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--draft-dir", default=None)
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    # drafter: the defaults give 2.59M parameters at the default target's hidden size 512, the
    # shipped FlashMap drafter's budget (2.59M), and 8 proposals per block as its K = 8.
    ap.add_argument("--block", type=int, default=9, help="block size B (anchor + B-1 proposals)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=416)
    ap.add_argument("--mask-token-id", type=int, default=-1, help="-1: the data's least frequent token")
    # training
    ap.add_argument("--batch", type=int, default=64, help="blocks per step (the FlashMap trainer's 64)")
    ap.add_argument("--anchors", type=int, default=8, help="blocks per sequence in a batch")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--pos-gamma", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=6500)
    ap.add_argument("--amp", action="store_true", help="bf16 autocast (fp32 master weights)")
    ap.add_argument("--bf16", action="store_true", help="export in bfloat16")
    # eval
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0])
    args = ap.parse_args()
    {"train": cmd_train, "check": cmd_check, "export": cmd_export, "eval": cmd_eval}[args.cmd](args)


if __name__ == "__main__":
    main()
