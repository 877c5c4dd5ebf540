#!/usr/bin/env python3
"""models/default loads in our engine and decodes losslessly: speculative greedy ids (1..4
steps) equal target-alone greedy ids. Stdlib only. Usage: test_default_pair.py FLASHMAP DIR"""
import json
import subprocess
import sys


def run(exe, pair, *extra):
    cmd = [exe, "generate", "--target", pair + "/target", "--json", "--max-new-tokens", "64",
           "--stop-ids", "none", "--threads", "1", "--seed", "3", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    exe, pair = sys.argv[1], sys.argv[2]
    fails = 0
    for prompt in ("1,2,3,4,5,6,7,8", "40,50,60"):
        ref = run(exe, pair, "--no-draft", "--prompt-ids", prompt)
        for steps in ("1", "2", "3", "4"):
            spec = run(exe, pair, "--draft", pair + "/draft", "--steps", steps, "--prompt-ids", prompt)
            same = spec["ids"] == ref["ids"]
            print(f"prompt {prompt} steps {steps}: tau {spec['acceptance_length']:.2f}, "
                  f"{'equal' if same else 'DIFFERENT'} ids")
            fails += not same
    print("FAILED" if fails else "ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
