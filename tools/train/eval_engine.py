#!/usr/bin/env python3
"""tau of our engine (`flashmap generate`) on the same held-out prompts as
`train_drafter.py eval` (same seed), 1..4 steps, mean +- 95% CI over rounds, and tau by
position (share of rounds in which draft slot k was accepted).

    python3 tools/train/eval_engine.py --flashmap build/flashmap --target T --draft D [--temperatures 0,1] [--keyed]

At T > 0 the engine verifies by rejection sampling (as the reference does) unless the request
is seeded; --keyed passes a seed per prompt, measuring the keyed verification of seeded requests
instead (src/specdec/sampling.h). Without it the runs are unseeded, so T > 0 figures vary a little
from run to run.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_drafter import heldout_prompts  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashmap", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0])
    ap.add_argument("--keyed", action="store_true", help="seeded requests (keyed verification)")
    args = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    prompts, _ = heldout_prompts(args.corpus, tok, args.prompts, args.seed)
    # A DFlash drafter (tools/train/train_dflash.py, or any z-lab / speculators folder) has no
    # steps: one row per temperature.
    with open(os.path.join(args.draft, "config.json")) as f:
        cfg = json.load(f)
    dflash = "speculators_model_type" in cfg or "DFlashDraftModel" in cfg.get("architectures", [])
    for temp in args.temperatures:
        for n in ((None,) if dflash else (1, 2, 3, 4)):
            taus, slots = [], None
            for j, p in enumerate(prompts):
                out = subprocess.run([args.flashmap, "generate", "--target", args.target, "--draft", args.draft,
                                      "--prompt-ids", ",".join(map(str, p)), "--json",
                                      "--max-new-tokens", str(args.max_new_tokens), "--stop-ids", "none",
                                      "--temperature", str(temp), "--threads", "1"]
                                     + (["--steps", str(n)] if n else [])
                                     + (["--seed", str(args.seed + j)] if args.keyed else []),
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout)
                taus.extend(r["acceptance_lengths"])
                acc = r.get("accepted_at") or []
                slots = [a + b for a, b in zip(slots, acc)] if slots else list(acc)
            m = sum(taus) / len(taus)
            sd = (sum((x - m) ** 2 for x in taus) / max(len(taus) - 1, 1)) ** 0.5
            by_pos = " ".join(f"{s / len(taus):.2f}" for s in (slots or []))
            print(f"engine tau T={temp} {'dflash' if n is None else f'steps={n}'}: {m:.3f} +- {1.96 * sd / len(taus) ** 0.5:.3f} "
                  f"({len(taus)} rounds); slot acceptance {by_pos}", flush=True)


if __name__ == "__main__":
    main()
