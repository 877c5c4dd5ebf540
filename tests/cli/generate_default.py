#!/usr/bin/env python3
"""cli.generate_default: `flashmap generate --json` on the built-in pair (no --target) decodes for
real. Checks the ids against the vocabulary (the target's and its tokenizer's: ids past the
tokenizer's are padding and never sampled), their count and finish_reason against
--max-new-tokens and the eos ids, the per-round counts against the ids and the drafter's block
size, and that the speculative greedy ids equal a --no-draft run's (greedy decoding is lossless).
Stdlib only. Usage: generate_default.py FLASHMAP PAIR_DIR (PAIR_DIR: models/default)."""
import json
import subprocess
import sys

fails = []


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAIL:", what)


def run(exe, *args):
    cmd = [exe, "generate", "--json", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited with {out.returncode}: {out.stderr.strip()}")
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError as e:
        sys.exit(f"{' '.join(cmd)} printed no JSON object ({e}): {out.stdout[:500]!r}")


def main():
    exe, pair = sys.argv[1], sys.argv[2]
    with open(pair + "/target/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    with open(pair + "/target/tokenizer.json") as f:
        tok = json.load(f)
    tok_size = 1 + max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])])
    with open(pair + "/target/generation_config.json") as f:
        eos = json.load(f)["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos])
    with open(pair + "/draft/config.json") as f:
        block = json.load(f)["block_size"]

    for extra in (["--max-new-tokens", "8"], ["--max-new-tokens", "48", "--stop-ids", "none"]):
        n = int(extra[1])
        stops = set() if "--stop-ids" in extra else eos
        spec = run(exe, *extra)
        alone = run(exe, "--no-draft", *extra)
        for name, r in (("speculative", spec), ("--no-draft", alone)):
            what = f"{name} {' '.join(extra)}"
            ids, lengths = r["ids"], r["acceptance_lengths"]
            check(all(isinstance(i, int) and 0 <= i < min(vocab, tok_size) for i in ids),
                  f"{what}: ids outside [0, {min(vocab, tok_size)}): {ids}")
            check(r["finish_reason"] in ("length", "stop"),
                  f"{what}: finish_reason {r['finish_reason']!r}")
            if r["finish_reason"] == "length":
                check(len(ids) == n, f"{what}: finish_reason length with {len(ids)} of {n} ids")
                check(not stops & set(ids), f"{what}: a stop id inside {ids}")
            else:
                check(0 < len(ids) <= n and ids[-1] in stops and not stops & set(ids[:-1]),
                      f"{what}: finish_reason stop but ids {ids} (stop ids {sorted(stops)})")
            # The prefill gives the first token; every round then commits 1 to block + 1 tokens,
            # and the last round is the one that reached the end.
            check(r["rounds"] == len(lengths), f"{what}: rounds {r['rounds']} vs {lengths}")
            check(all(1 <= a <= block + 1 for a in lengths), f"{what}: round lengths {lengths}")
            check(1 + sum(lengths[:-1]) < len(ids) <= 1 + sum(lengths) if lengths
                  else len(ids) == 1, f"{what}: round lengths {lengths} for {len(ids)} ids")
            mean = sum(lengths) / len(lengths) if lengths else 0.0
            check(abs(r["acceptance_length"] - mean) < 1e-9,
                  f"{what}: acceptance_length {r['acceptance_length']} vs mean of {lengths}")
            check(isinstance(r["text"], str) and (r["text"] != "") == (len(ids) > 0),
                  f"{what}: text {r['text']!r}")
        # Slot k is accepted only after slots 0..k-1; accepted drafts per round = length − 1.
        at = spec["accepted_at"]
        check(len(at) == block and all(a >= b for a, b in zip(at, at[1:])) and
              sum(at) == sum(a - 1 for a in spec["acceptance_lengths"]),
              f"accepted_at {at} vs acceptance_lengths {spec['acceptance_lengths']}")
        check(alone["acceptance_lengths"] == [1] * alone["rounds"] and alone["accepted_at"] == [],
              f"--no-draft rounds {alone['acceptance_lengths']}, accepted_at {alone['accepted_at']}")
        check(spec["prompt_ids"] == alone["prompt_ids"] and len(spec["prompt_ids"]) > 0,
              f"prompt ids {spec['prompt_ids']} vs {alone['prompt_ids']}")
        check(spec["ids"] == alone["ids"],
              f"{' '.join(extra)}: speculative greedy ids {spec['ids']} != --no-draft {alone['ids']}")
        print(f"{' '.join(extra)}: {len(spec['ids'])} ids, {spec['finish_reason']}, "
              f"tau {spec['acceptance_length']:.2f}, equal to --no-draft: {spec['ids'] == alone['ids']}")
    print("FAILED" if fails else "ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
