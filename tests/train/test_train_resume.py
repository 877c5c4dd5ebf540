#!/usr/bin/env python3
"""Resuming is exact: a training run interrupted (--stop-after) and rerun with the same command
ends with the same weights, bit for bit, as an uninterrupted run — for the target (train_target.py
with --minutes 0, a step-count schedule) and for both drafter stages (train_drafter.py with
--stage1-steps/--stage2-steps), including an interruption at the stage boundary.
A checkpoint from another configuration is refused.
Exits 77 (ctest: skipped) when torch, transformers, tokenizers or flashmap are missing."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "tools", "train")


def run(*cmd, ok=True):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=300)
    if ok and r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(1)
    return r


def same_tensors(a, b):
    import torch
    if a.keys() != b.keys():
        return False
    return all(torch.equal(a[k], b[k]) for k in a)


def main():
    try:
        import flashmap  # noqa: F401
        import safetensors.torch
        import tokenizers  # noqa: F401
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "corpus.txt")
        words = "the cat sat on a mat and the dog ran to the red house by the sea".split()
        with open(corpus, "w") as f:
            for i in range(300):
                f.write(" ".join(words[(i * 7 + j) % len(words)] for j in range(10)) + "\n%\n")
        tt = os.path.join(TRAIN, "train_target.py")
        toy = ["--corpus", corpus, "--vocab", "300", "--hidden", "32", "--layers", "3", "--heads", "2",
               "--kv-heads", "1", "--intermediate", "64", "--seq", "16", "--batch", "4", "--steps", "6",
               "--minutes", "0", "--threads", "1"]
        run(tt, *toy, "--out", f"{d}/t1")
        run(tt, *toy, "--out", f"{d}/t2", "--stop-after", "4")
        assert not os.path.exists(f"{d}/t2/model.safetensors"), "stopped run must not export"
        run(tt, *toy, "--out", f"{d}/t2")
        w1 = safetensors.torch.load_file(f"{d}/t1/model.safetensors")
        w2 = safetensors.torch.load_file(f"{d}/t2/model.safetensors")
        if not same_tensors(w1, w2):
            print("target: interrupted + resumed != uninterrupted")
            return 1
        bad = run(tt, *[a if a != "32" else "48" for a in toy], "--out", f"{d}/t2", ok=False)
        if bad.returncode == 0 or "another configuration" not in bad.stderr + bad.stdout:
            print("target: a checkpoint of another configuration was not refused:", bad.stderr)
            return 1

        td = os.path.join(TRAIN, "train_drafter.py")
        common = ["--target", f"{d}/t1", "--corpus", corpus, "--data", f"{d}/data.pt", "--layer-ids", "0,1",
                  "--block", "4", "--hidden", "32", "--layers", "1", "--heads", "2", "--intermediate", "48",
                  "--cond-dim", "16", "--time-embed-dim", "8", "--batch", "4", "--threads", "1"]
        run(td, "gen", *common, "--out", f"{d}/data.pt", "--sequences", "8", "--gen-batch", "8",
            "--prompt-len", "6", "--gen-len", "12")
        steps = ["--stage1-steps", "3", "--stage2-steps", "3"]
        run(td, "train", *common, *steps, "--ckpt", f"{d}/a.ckpt")
        for _ in range(3):  # 2 + 2 + 2 steps: the second run crosses from stage 1 into stage 2
            run(td, "train", *common, *steps, "--ckpt", f"{d}/b.ckpt", "--stop-after", "2")
        a = torch.load(f"{d}/a.ckpt", weights_only=False)
        b = torch.load(f"{d}/b.ckpt", weights_only=False)
        if a["state"]["step"] != 6 or b["state"]["step"] != 6:
            print("drafter: expected 6 steps, got", a["state"]["step"], b["state"]["step"])
            return 1
        if not same_tensors(a["model"], b["model"]):
            print("drafter: interrupted + resumed != uninterrupted")
            return 1
        bad = run(td, "train", *[x if x != "48" else "64" for x in common], *steps, "--ckpt", f"{d}/a.ckpt",
                  ok=False)
        if bad.returncode == 0 or "another configuration" not in bad.stderr + bad.stdout:
            print("drafter: a checkpoint of another configuration was not refused:", bad.stderr)
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
