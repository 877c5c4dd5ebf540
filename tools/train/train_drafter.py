#!/usr/bin/env python3
"""FlashMap drafter training: data from the target, stage 1 (flow), stage 2 (flow-map
self-distillation), export to the release format.

    python3 tools/train/train_drafter.py gen    --target T --out D/data.pt [--sequences 2000]
    python3 tools/train/train_drafter.py train  --target T --data D/data.pt --ckpt D/draft.ckpt \
                                                --stage1-minutes 10 --stage2-minutes 3
    python3 tools/train/train_drafter.py export --target T --ckpt D/draft.ckpt --out D/draft

The architecture is flashmap.FlashMapDraftModel (flashmap==0.1.0) itself, so weight names match
the release format. Training conditions the drafter exactly as FlashMapDraftModel.draft() does:
cross-attention to the target's features at positions before the anchor (fc + hidden_norm), the
anchor's embedding at the anchor's position (anchor_proj + anchor_norm), block positions
anchor+1..anchor+K with interleaved RoPE, AdaLN on the jump's times (s, t), the state read through
the target's embedding (embed_state), the output through the target's lm_head.
`--check` compares the training forward with draft() on random samples.

Options can also come from a JSON file (--config FILE, keys are option names with underscores).
Checkpoints hold weights, optimizer, stage, step, elapsed time and RNG state; rerunning `train`
resumes where it stopped.
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
import jump_grids as JG  # noqa: E402


def load_target(path, device):
    from transformers import AutoModelForCausalLM
    if not os.path.exists(os.path.join(path, "config.json")):
        sys.exit(f"error: {path} is not a Hugging Face model folder")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# ---- data -------------------------------------------------------------------------------

@torch.no_grad()
def cmd_gen(args):
    from tokenizers import Tokenizer
    from train_target import EOS, read_corpus
    torch.manual_seed(args.seed)
    target = load_target(args.target, args.device)
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    if tok.get_vocab_size() != target.config.vocab_size:
        sys.exit(f"error: tokenizer vocabulary {tok.get_vocab_size()} != target vocabulary {target.config.vocab_size}")
    eos = tok.token_to_id(EOS)
    docs = read_corpus(args.corpus)
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids + [eos])
    stream = torch.tensor(ids)
    layer_ids = args.layer_ids
    if max(layer_ids) >= target.config.num_hidden_layers - 1:
        sys.exit(f"error: target_layer_ids {layer_ids} need more than {target.config.num_hidden_layers} target layers")
    P, G, N, B = args.prompt_len, args.gen_len, args.sequences, args.gen_batch
    all_tokens, all_feats = [], []
    t0 = time.time()
    for start in range(0, N, B):
        n = min(B, N - start)
        starts = torch.randint(0, len(stream) - P, (n,))
        prompts = torch.stack([stream[s:s + P] for s in starts]).to(args.device)
        sampled = torch.rand(()) < args.sampled_frac
        out = target.generate(prompts, max_new_tokens=G, min_new_tokens=G, do_sample=bool(sampled),
                              temperature=1.0 if sampled else None, top_k=0 if sampled else None,
                              top_p=1.0 if sampled else None,
                              eos_token_id=None, pad_token_id=eos, attention_mask=torch.ones_like(prompts))
        res = target(out, output_hidden_states=True)
        feats = torch.cat([res.hidden_states[i + 1] for i in layer_ids], dim=-1)
        all_tokens.append(out.cpu())
        all_feats.append(feats.to(torch.float16).cpu())
        done = start + n
        el = time.time() - t0
        print(f"gen {done}/{N} sequences, {done * G / el:.0f} tok/s, ETA {el / done * (N - done):.0f} s", flush=True)
    torch.save({"tokens": torch.cat(all_tokens), "features": torch.cat(all_feats), "prompt_len": P,
                "layer_ids": layer_ids, "vocab_size": target.config.vocab_size,
                "target_hidden": target.config.hidden_size}, args.out)
    print(f"wrote {args.out}")


def heldout_prompts(corpus, tok, n, seed):
    """The first 16 tokens of n documents drawn (seeded) from the last 2% of the corpus (the
    target's validation split), those of at least 4 tokens, and the generator after the draws
    (train_drafter eval goes on using it). Shared by every tau evaluation so they see the same
    prompts."""
    from train_target import read_corpus
    docs = read_corpus(corpus)
    docs = docs[-max(len(docs) // 50, 1):]
    gen = torch.Generator().manual_seed(seed)
    prompts = [tok.encode(docs[int(i)]).ids[:16] for i in torch.randint(0, len(docs), (n,), generator=gen)]
    return [p for p in prompts if len(p) >= 4], gen


# ---- the training forward ----------------------------------------------------------------

def _attention(mod, x, rope, keys, values, mask=None):
    from flashmap.modeling_flashmap import apply_rope
    queries = apply_rope(mod.q_norm(mod._heads(mod.q_proj(x))), rope)
    out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values, attn_mask=mask)
    return mod.o_proj(out.transpose(1, 2).flatten(2))


def embed_state(draft, state, s, t, E):
    """Differentiable FlashMapDraftModel.embed_state with per-sample times s, t (B,)."""
    mult = (s / (1.0 - s).clamp_min(1e-3) ** 2)[:, None, None]
    posterior = (state.float() * mult).softmax(dim=-1)
    posterior_embeds = posterior @ E
    jump = torch.ones_like(s) if draft.config.noise_gate == "constant" else t - s
    gate = draft.noise_gate.float() * jump[:, None, None]
    return draft.state_norm(posterior_embeds) + gate * draft.noise_norm(state @ E)


def draft_forward(draft, E, lm_head_w, feats, tokens, anchors, inputs, s, t):
    """Logits (B, K, V) of the jump s -> t for blocks after `anchors` (B,) of sequences whose
    target features are `feats (B, L, F)` and tokens `tokens (B, L)`, from DiT inputs (B, K, H)."""
    from flashmap.modeling_flashmap import rope_tables
    B, L = tokens.shape
    K, dev = draft.config.block_size, feats.device
    ctx = draft.hidden_norm(draft.fc(feats))
    anchor_tok = tokens.gather(1, anchors[:, None])
    anchor_ctx = draft.anchor_norm(draft.anchor_proj(E[anchor_tok]))  # (B, 1, D)
    pos = torch.arange(L, device=dev)
    at_anchor = (pos[None] == anchors[:, None])[..., None]
    ctx = torch.where(at_anchor, anchor_ctx, ctx)
    mask = (pos[None] <= anchors[:, None])[:, None, None, :]  # (B, 1, 1, L)
    rope_ctx = rope_tables(pos[None].expand(B, -1), draft.head_dim, draft.config.rope_theta)
    qpos = anchors[:, None] + 1 + torch.arange(K, device=dev)[None]
    rope_q = rope_tables(qpos, draft.head_dim, draft.config.rope_theta)
    cond = (draft.time_embed(s) + draft.jump_embed(t))[:, None, :]
    h = draft.x_embed(inputs)
    for layer in draft.layers:
        ck, cv = layer.cross_attn.project_kv(ctx, rope_ctx)
        x, gate = layer.self_attn_adaln(h, layer.self_attn_adaln.modulation(cond))
        h = h + gate * _attention(layer.self_attn, x, rope_q, *layer.self_attn.project_kv(x, rope_q))
        x, gate = layer.cross_attn_adaln(h, layer.cross_attn_adaln.modulation(cond))
        h = h + gate * _attention(layer.cross_attn, x, rope_q, ck, cv, mask)
        x, gate = layer.mlp_adaln(h, layer.mlp_adaln.modulation(cond))
        h = h + gate * layer.mlp(x)
    h, _ = draft.final_adaln(h, draft.final_adaln.modulation(cond))
    return draft.head(h) @ lm_head_w.T


# ---- model / config ----------------------------------------------------------------------

def make_draft(args, target, data):
    from flashmap import FlashMapConfig, FlashMapDraftModel
    V, H = target.config.vocab_size, target.config.hidden_size
    if data["vocab_size"] != V or data["target_hidden"] != H:
        sys.exit("error: the data was generated with another target (vocabulary or hidden size differ)")
    cfg = FlashMapConfig(
        target_model=os.path.basename(os.path.normpath(args.target)), target_hidden_size=H, vocab_size=V,
        target_layer_ids=data["layer_ids"], block_size=args.block, hidden_size=args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, intermediate_size=args.intermediate,
        cond_dim=args.cond_dim, time_embed_dim=args.time_embed_dim, noise_gate="jump", num_steps=1,
        jump_grids=JG.jump_grids(V, 4))
    torch.manual_seed(args.seed)
    draft = FlashMapDraftModel(cfg).float()
    # AdaLN-zero-ish start would stall a tiny model; keep the default init but small gates.
    return draft


class TimeSampler:
    """t = tau^-1(u), u ~ U(0, 1), by interpolation in a table."""

    def __init__(self, V, size=256):
        u, t = JG.tau_table(V, size)
        self.t = torch.tensor(t)
        self.size = size

    def __call__(self, n):
        return self.inv(torch.rand(n))

    def inv(self, u):
        u = u.clamp(0, 1) * self.size
        i = u.floor().long().clamp(max=self.size - 1)
        f = u - i
        return self.t[i] * (1 - f) + self.t[i + 1] * f


def batch_samples(data, n, K, gen):
    tokens, feats, P = data["tokens"], data["features"], data["prompt_len"]
    N, L = tokens.shape
    seq = torch.randint(0, N, (n,), generator=gen)
    anchors = torch.randint(P - 1, L - K, (n,), generator=gen)
    blocks = torch.stack([tokens[q, a + 1:a + 1 + K] for q, a in zip(seq.tolist(), anchors.tolist())])
    return feats[seq].float(), tokens[seq], anchors, blocks


def cmd_train(args):
    torch.set_num_threads(args.threads)
    target = load_target(args.target, args.device)
    data = torch.load(args.data, weights_only=False)
    draft = make_draft(args, target, data).to(args.device)
    E = target.get_input_embeddings().weight.detach().float()
    W = target.get_output_embeddings().weight.detach().float()
    V, K = E.shape[0], args.block
    grids = draft.config.jump_grids
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    state = {"stage": 1, "step": 0, "elapsed": [0.0, 0.0], "stage_steps": [0, 0]}
    if os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt, weights_only=False)
        if ck["config"] != draft.config.to_dict():
            sys.exit(f"error: checkpoint {args.ckpt} is for another configuration")
        draft.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        state.setdefault("stage_steps", [0, 0])
        torch.set_rng_state(ck["rng"])
        print(f"resumed: stage {state['stage']}, step {state['step']}", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    if os.path.exists(args.ckpt) and "gen" in ck:
        gen.set_state(ck["gen"])
    sampler = TimeSampler(V)
    pos_w = torch.exp(-torch.arange(K).float() / args.pos_gamma)
    pos_w = (pos_w / pos_w.mean()).to(args.device)
    budgets = [args.stage1_minutes * 60, args.stage2_minutes * 60]
    # --stageN-steps > 0: the stage is N steps long and its schedule follows the step count, so
    # that a run (interrupted and resumed or not) is reproducible bit for bit; else minutes.
    step_budgets = [args.stage1_steps, args.stage2_steps]
    run_steps = 0

    def stage_frac(si):
        if step_budgets[si] > 0:
            return state["stage_steps"][si] / step_budgets[si]
        return state["elapsed"][si] / budgets[si] if budgets[si] > 0 else 1.0

    def save():
        torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), "state": state,
                    "rng": torch.get_rng_state(), "gen": gen.get_state(), "config": draft.config.to_dict()},
                   args.ckpt + ".tmp")
        os.replace(args.ckpt + ".tmp", args.ckpt)

    def path_state(y1h, s):
        eps = torch.randn(y1h.shape, device=y1h.device)
        return (1 - s)[:, None, None] * eps + s[:, None, None] * y1h

    def ce(logits, target_probs_or_ids):
        if target_probs_or_ids.dtype == torch.long:
            l = F.cross_entropy(logits.reshape(-1, V), target_probs_or_ids.reshape(-1), reduction="none")
        else:
            l = -(target_probs_or_ids * logits.log_softmax(-1)).sum(-1).reshape(-1)
        return (l.view(-1, K) * pos_w).mean()

    last_print, last_save = 0.0, time.time()
    draft.train()
    while state["stage"] <= 2:
        si = state["stage"] - 1
        if stage_frac(si) >= 1.0:
            state["stage"] += 1
            save()
            last_print = -1e9
            continue
        if args.stop_after and run_steps >= args.stop_after:
            save()
            print(f"stopped after {run_steps} steps (--stop-after); rerun to resume", flush=True)
            return
        t_start = time.time()
        frac = stage_frac(si)
        lr = args.lr * min(1.0, frac * 20 + 0.02) * (0.5 * (1 + math.cos(math.pi * frac)) * 0.9 + 0.1)
        if si == 1:
            lr *= args.stage2_lr_scale
        for g in opt.param_groups:
            g["lr"] = lr
        B = args.batch
        feats, toks, anchors, y = batch_samples(data, B, K, gen)
        feats, toks, anchors, y = feats.to(args.device), toks.to(args.device), anchors.to(args.device), y.to(args.device)
        y1h = F.one_hot(y, V).float()
        # --amp: bf16 matmuls (fp32 master weights, fp32 loss); ~2x on CPUs with AVX512-BF16/AMX.
        amp = torch.autocast(device_type=torch.device(args.device).type, dtype=torch.bfloat16,
                             enabled=args.amp)
        amp.__enter__()
        if si == 0:
            # half the batch: the flow (denoiser D_{t,t}) at t uniform in tau; half: the grids'
            # jumps (s, t) trained on the data directly (their marginal), as a warm start.
            s = sampler(B).to(args.device)
            t = s.clone()
            nj = B // 2
            pairs = []
            for _ in range(nj):
                n = str(int(torch.randint(1, 5, (1,), generator=gen)))
                i = int(torch.randint(0, int(n), (1,), generator=gen))
                pairs.append((grids[n][i], grids[n][i + 1]))
            s[:nj] = torch.tensor([p[0] for p in pairs], device=args.device)
            t[:nj] = torch.tensor([p[1] for p in pairs], device=args.device)
            x = path_state(y1h, s)
            logits = draft_forward(draft, E, W, feats, toks, anchors, embed_state(draft, x, s, t, E), s, t)
        else:
            # self-distillation: D_{s,t} -> w1 D_{s,u}(x) + w2 D_{u,t}(X_{s,u}(x)), u the midpoint in tau
            # (X_{s,t} = X_{u,t} o X_{s,u}); plus the data loss on a quarter of the batch.
            n_d = B // 4
            us = torch.rand(B) * 0.999
            ut = us + (1 - us) * torch.rand(B)
            one = torch.rand(B) < 0.5  # half the jumps end at t = 1 (what drafting uses)
            ut[one] = 1.0
            us[torch.rand(B) < 0.25] = 0.0
            s, t = sampler.inv(us).to(args.device), sampler.inv(ut).to(args.device)
            u = sampler.inv((us + ut) / 2).to(args.device)
            x = path_state(y1h, s)
            with torch.no_grad():
                d1 = draft_forward(draft, E, W, feats, toks, anchors, embed_state(draft, x, s, u, E), s, u).softmax(-1)
                xu = ((1 - u)[:, None, None] * x + (u - s)[:, None, None] * d1) / (1 - s)[:, None, None]
                d2 = draft_forward(draft, E, W, feats, toks, anchors, embed_state(draft, xu, u, t, E), u, t).softmax(-1)
                w1 = ((1 - t) * (u - s) / ((1 - u) * (t - s)).clamp_min(1e-6))[:, None, None]
                w2 = ((t - u) * (1 - s) / ((1 - u) * (t - s)).clamp_min(1e-6))[:, None, None]
                teacher = w1 * d1 + w2 * d2
                teacher[:n_d] = y1h[:n_d]
            logits = draft_forward(draft, E, W, feats, toks, anchors, embed_state(draft, x, s, t, E), s, t)
        amp.__exit__(None, None, None)
        logits = logits.float()
        loss = ce(logits, teacher if si == 1 else y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["stage_steps"][si] += 1
        run_steps += 1
        state["elapsed"][si] += time.time() - t_start
        if state["elapsed"][si] - last_print > 20:
            last_print = state["elapsed"][si]
            with torch.no_grad():
                acc = (logits.argmax(-1) == y).float().mean(0)
            el = state["elapsed"][si]

            def left(i):  # seconds left in stage i: by its step budget at this stage's pace, or its minutes
                if step_budgets[i] <= 0:
                    return max(budgets[i] - state["elapsed"][i], 0.0)
                done = state["stage_steps"][i]
                pace = state["elapsed"][i] / done if done else el / max(state["stage_steps"][si], 1)
                return max(step_budgets[i] - done, 0) * pace * (2 if i > si else 1)  # stage 2 ~2x per step
            print(f"stage {si + 1} step {state['step']} loss {loss.item():.3f} acc@slot0 {acc[0]:.2f} "
                  f"acc {acc.mean():.2f} lr {lr:.1e} {B * K * 1.0 / (time.time() - t_start):.0f} tok/s "
                  f"ETA {left(si) / 60:.1f} min (stage), "
                  f"{sum(left(i) for i in range(si, 2)) / 60:.1f} min (all)", flush=True)
            last_print = el
        if time.time() - last_save > 60:
            save()
            last_save = time.time()
    save()
    print("training done", flush=True)


def load_ckpt_draft(args, target):
    from flashmap import FlashMapConfig, FlashMapDraftModel
    ck = torch.load(args.ckpt, weights_only=False)
    cfg = FlashMapConfig(**{k: v for k, v in ck["config"].items() if k in FlashMapConfig().to_dict()
                            and k not in ("model_type", "transformers_version", "architectures")})
    draft = FlashMapDraftModel(cfg).float()
    draft.load_state_dict(ck["model"])
    return draft.eval()


@torch.no_grad()
def cmd_check(args):
    """The training forward equals draft() for 1..4 steps (same noise)."""
    from flashmap import FlashMapCache
    target = load_target(args.target, "cpu")
    data = torch.load(args.data, weights_only=False)
    draft = load_ckpt_draft(args, target) if os.path.exists(args.ckpt) else make_draft(args, target, data).eval()
    E = target.get_input_embeddings().weight.float()
    W = target.get_output_embeddings().weight.float()
    K, V = draft.config.block_size, E.shape[0]
    feats, toks, anchors, _ = batch_samples(data, 3, K, torch.Generator().manual_seed(1))
    worst = 0.0
    for b in range(3):
        a = int(anchors[b])
        for n in ("1", "2", "3", "4"):
            x0 = torch.randn(1, K, V)
            cache = FlashMapCache(draft.config, 1, toks.shape[1] + K + 2, dtype=torch.float32)
            draft.extend_context(cache, feats[b:b + 1, :a])
            ref = draft.draft(toks[b:b + 1, a], cache, target.get_input_embeddings(), target.get_output_embeddings(),
                              num_steps=int(n), noise=x0)
            grid = draft.config.jump_grids[n]
            state = x0
            for s, t in zip(grid[:-1], grid[1:]):
                sv, tv = torch.tensor([s]), torch.tensor([t])
                logits = draft_forward(draft, E, W, feats[b:b + 1], toks[b:b + 1], anchors[b:b + 1],
                                       embed_state(draft, state, sv, tv, E), sv, tv)
                if t < 1.0:
                    state = ((1.0 - t) * state + (t - s) * logits.softmax(-1)) / (1.0 - s)
            worst = max(worst, (logits - ref).abs().max().item() / max(1.0, ref.abs().max().item()))
    print(f"training forward vs draft(): max relative |diff| {worst:.2e}")
    if worst > 1e-4:
        sys.exit("error: the training forward does not match draft()")


def cmd_export(args):
    import shutil
    target = load_target(args.target, "cpu")
    draft = load_ckpt_draft(args, target)
    draft.config.jump_grids = JG.jump_grids(draft.config.vocab_size, 4)
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    draft.to(torch.bfloat16 if args.bf16 else torch.float32).save_pretrained(args.out)
    for name in ("configuration_flashmap.py", "modeling_flashmap.py"):
        p = os.path.join(args.out, name)
        if os.path.exists(p):
            os.remove(p)
    print(f"wrote {args.out}")


@torch.no_grad()
def cmd_eval(args):
    """tau of the reference (flashmap 0.1.0 spec_generate) on held-out prompts, with a 95% CI."""
    import flashmap  # noqa: F401  (registers AutoModel)
    from transformers import AutoModel
    from tokenizers import Tokenizer
    target = load_target(args.target, "cpu")
    draft = AutoModel.from_pretrained(args.draft_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    prompts, gen = heldout_prompts(args.corpus, tok, args.prompts, args.seed)
    results = {}
    for temp in args.temperatures:
        for n in (1, 2, 3, 4):
            taus = []
            for p in prompts:
                out = draft.spec_generate(target, torch.tensor([p]), max_new_tokens=args.max_new_tokens,
                                          temperature=temp, num_steps=n, stop_token_ids=[], generator=gen)
                taus.extend(out.acceptance_lengths)
            m = sum(taus) / len(taus)
            sd = (sum((x - m) ** 2 for x in taus) / max(len(taus) - 1, 1)) ** 0.5
            results[f"T={temp} steps={n}"] = (m, 1.96 * sd / len(taus) ** 0.5)
            print(f"reference tau T={temp} steps={n}: {m:.3f} +- {1.96 * sd / len(taus) ** 0.5:.3f} "
                  f"({len(taus)} rounds)", flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["gen", "train", "check", "export", "eval"])
    ap.add_argument("--config", help="JSON file of option values")
    ap.add_argument("--target", required=True)
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--data", default=None)
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--draft-dir", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    # data
    ap.add_argument("--layer-ids", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--sequences", type=int, default=2048)
    ap.add_argument("--gen-batch", type=int, default=128)
    ap.add_argument("--sampled-frac", type=float, default=0.0)
    # drafter
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--cond-dim", type=int, default=64)
    ap.add_argument("--time-embed-dim", type=int, default=32)
    # training
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--stage2-lr-scale", type=float, default=0.3)
    ap.add_argument("--pos-gamma", type=float, default=4.0)
    ap.add_argument("--stage1-minutes", type=float, default=10.0)
    ap.add_argument("--stage2-minutes", type=float, default=3.0)
    ap.add_argument("--stage1-steps", type=int, default=0, help="> 0: stage 1 by steps, not minutes")
    ap.add_argument("--stage2-steps", type=int, default=0, help="> 0: stage 2 by steps, not minutes")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop (with a checkpoint) after this many steps of this run, as an interruption")
    ap.add_argument("--bf16", action="store_true", help="export in bfloat16")
    ap.add_argument("--amp", action="store_true", help="train with bf16 autocast (fp32 master weights)")
    # eval
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0])
    args = ap.parse_args()
    if args.config:
        with open(args.config) as f:
            for k, v in json.load(f).items():
                if not hasattr(args, k):
                    sys.exit(f"error: unknown option {k} in {args.config}")
                setattr(args, k, v)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    {"gen": cmd_gen, "train": cmd_train, "check": cmd_check, "export": cmd_export, "eval": cmd_eval}[args.cmd](args)


if __name__ == "__main__":
    main()
