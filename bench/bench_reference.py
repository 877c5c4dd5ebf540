#!/usr/bin/env python3
"""Per-round time of the reference (flashmap==0.1.0 spec_generate on transformers, torch on
CPU, float32) on the same model pair and prompts as `flashmap bench`, for the side-by-side
ratio in the README.

    python3 bench/bench_reference.py --pair models/default --prompts 4 --max-new-tokens 64
    ./build/flashmap bench --target models/default/target --draft models/default/draft \
        --prompts 4 --max-new-tokens 64 --steps 1

Prompts are random ids like flashmap bench's (not the same ids: the per-round time of a random
pair does not depend on them). Needs: pip install -r tools/requirements.txt.
"""
import argparse
import json
import time

import torch
from transformers import AutoModel, Qwen3ForCausalLM

import flashmap  # noqa: F401  (registers the FlashMap model type)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="models/default", help="folder with target/ and draft/")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = Qwen3ForCausalLM.from_pretrained(f"{args.pair}/target", dtype=torch.float32).eval()
    draft = AutoModel.from_pretrained(f"{args.pair}/draft", dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(7)
    V = target.config.vocab_size
    prompts = [torch.randint(0, V, (1, 16), generator=gen) for _ in range(args.prompts)]
    # warm-up
    draft.spec_generate(target, prompts[0], max_new_tokens=8, temperature=0.0, stop_token_ids=[])
    rounds = tokens = 0
    spec_s = 0.0
    for p in prompts:
        t0 = time.perf_counter()
        out = draft.spec_generate(target, p, max_new_tokens=args.max_new_tokens, temperature=0.0,
                                  num_steps=args.steps, stop_token_ids=[])
        spec_s += time.perf_counter() - t0
        rounds += len(out.acceptance_lengths)
        tokens += out.num_new_tokens
    alone_s = 0.0
    for p in prompts:
        t0 = time.perf_counter()
        target.generate(p, max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                        do_sample=False, eos_token_id=None, pad_token_id=0)
        alone_s += time.perf_counter() - t0
    res = {"reference": "flashmap==0.1.0 spec_generate, torch " + torch.__version__ + " CPU fp32",
           "threads": args.threads, "round_ms": 1000 * spec_s / rounds, "spec_tokens_per_s": tokens / spec_s,
           "target_alone_tokens_per_s": args.prompts * args.max_new_tokens / alone_s, "rounds": rounds}
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
