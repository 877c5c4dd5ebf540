#!/usr/bin/env python3
"""Trains a tiny Qwen3-architecture target from scratch on a text corpus, with its own
byte-level BPE tokenizer, and saves it as a Hugging Face folder our engine loads.

    python3 tools/train/train_target.py --corpus /usr/share/games/fortunes --out /tmp/fm/target \
        --minutes 20 --ckpt /tmp/fm/target.ckpt

The corpus is a file or a folder of strfile(1)-format fortune files (records separated by a
line holding "%"); each record becomes one document ended by <|endoftext|>. Resumable: the
checkpoint holds model, optimizer, step and RNG state; rerunning continues where it stopped.
"""

import argparse
import json
import math
import os
import random
import sys
import time

import torch

EOS = "<|endoftext|>"
# Qwen2/Qwen3's pre-tokenizer split pattern (byte-level BPE behind it).
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def read_corpus(path):
    if not os.path.exists(path):
        sys.exit(f"error: corpus {path} does not exist")
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path)
        if os.path.isfile(os.path.join(path, f)) and not f.endswith((".dat", ".u8")))
    docs = []
    for f in files:
        with open(f, "rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        for rec in text.split("\n%\n"):
            rec = rec.strip("\n%")
            if rec.strip():
                docs.append(rec + "\n")
    if not docs:
        sys.exit(f"error: corpus {path} is empty")
    return docs


def train_tokenizer(docs, vocab_size, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
                   "model_max_length": 4096, "add_prefix_space": False, "clean_up_tokenization_spaces": False,
                   "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}, f, indent=2)
    return tok, eos_id


def make_config(args, vocab, eos_id):
    from transformers import Qwen3Config
    return Qwen3Config(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=True, eos_token_id=eos_id, bos_token_id=None,
        pad_token_id=eos_id)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", default=None, help="checkpoint file (default OUT.ckpt)")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=100000, help="upper bound; --minutes usually stops first")
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="time budget (the schedule follows elapsed time); 0: exactly --steps steps, "
                         "scheduled by step count, reproducible bit for bit across interruptions")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop (with a checkpoint) after this many steps of this run, as an interruption")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast for the matmuls (fp32 master weights; ~2.4x faster on CPUs with "
                         "AVX512-BF16 or AMX, and on GPUs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import Qwen3ForCausalLM
    from tokenizers import Tokenizer

    ckpt_path = args.ckpt or args.out.rstrip("/") + ".ckpt"
    docs = read_corpus(args.corpus)
    tok_file = os.path.join(args.out, "tokenizer.json")
    if os.path.exists(tok_file) and os.path.exists(ckpt_path):
        tok = Tokenizer.from_file(tok_file)
        eos_id = tok.token_to_id(EOS)
    else:
        tok, eos_id = train_tokenizer(docs, args.vocab, args.out)
    vocab = tok.get_vocab_size()
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids + [eos_id])
    data = torch.tensor(ids, dtype=torch.long)
    n_val = len(data) // 50
    train, val = data[:-n_val], data[-n_val:]
    print(f"corpus: {len(docs)} documents, {len(data)} tokens, vocab {vocab}", flush=True)

    cfg = make_config(args, vocab, eos_id)
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(cfg).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step, elapsed = 0, 0.0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, weights_only=False)
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
        if any(ck["config"].get(k) != getattr(cfg, k) for k in keys):
            sys.exit(f"error: checkpoint {ckpt_path} is for another configuration")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        torch.set_rng_state(ck["rng"])
        print(f"resumed at step {step} ({elapsed / 60:.1f} min)", flush=True)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"target: {nparams / 1e6:.2f}M parameters", flush=True)
    budget = args.minutes * 60
    total_steps = args.steps

    def lr_at(frac):
        return args.lr * min(1.0, frac * 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "rng": torch.get_rng_state(), "config": cfg.to_dict()}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    t0, last_print, last_save = time.time() - elapsed, 0.0, time.time()
    model.train()
    by_steps = args.minutes <= 0
    run_steps = 0
    while step < total_steps and (by_steps or elapsed < budget):
        if args.stop_after and run_steps >= args.stop_after:
            save()
            print(f"stopped after {run_steps} steps (--stop-after); rerun to resume", flush=True)
            return
        frac = step / total_steps if by_steps else elapsed / budget
        for g in opt.param_groups:
            g["lr"] = lr_at(frac)
        starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,))
        x = torch.stack([train[s:s + args.seq + 1] for s in starts]).to(args.device)
        with torch.autocast(device_type=torch.device(args.device).type, dtype=torch.bfloat16,
                            enabled=args.bf16):
            logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run_steps += 1
        elapsed = time.time() - t0
        if elapsed - last_print > 30:
            last_print = elapsed
            tps = step * args.batch * args.seq / max(elapsed, 1e-9)
            eta = elapsed * (total_steps - step) / step if by_steps else budget - elapsed
            print(f"step {step} loss {loss.item():.3f} lr {lr_at(frac):.2e} {tps:.0f} tok/s "
                  f"elapsed {elapsed / 60:.1f} min ETA {eta / 60:.1f} min", flush=True)
        if time.time() - last_save > 120:
            save()
            last_save = time.time()
    save()
    model.eval()
    with torch.no_grad():
        vx = val[: (len(val) // (args.seq + 1)) * (args.seq + 1)].view(-1, args.seq + 1)[:64].to(args.device)
        vl = torch.nn.functional.cross_entropy(model(vx[:, :-1]).logits.reshape(-1, vocab), vx[:, 1:].reshape(-1))
    print(f"done: {step} steps, {elapsed / 60:.1f} min, val loss {vl.item():.3f}", flush=True)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.generation_config.do_sample = False
    model.save_pretrained(args.out)


if __name__ == "__main__":
    main()
