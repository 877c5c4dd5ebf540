#!/usr/bin/env python3
"""Smoke test of the training recipe on a toy configuration: target (tokenizer + a few steps),
drafter data, stage 1 and stage 2 (a few seconds each), the training forward against draft(),
export, load with flashmap==0.1.0 (AutoModel + spec_generate) and with our engine.
Exits 77 (ctest: skipped) when torch, transformers, tokenizers or flashmap are missing.
Usage: test_train_smoke.py FLASHMAP"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "tools", "train")


def main():
    try:
        import flashmap  # noqa: F401
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "corpus.txt")
        words = "the cat sat on a mat and the dog ran to the red house by the sea".split()
        with open(corpus, "w") as f:
            for i in range(400):
                f.write(" ".join(words[(i + j) % len(words)] for j in range(12)) + "\n%\n")
        py = [sys.executable]

        def step(*cmd):
            print("+", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, timeout=300)

        t = os.path.join(d, "target")
        step(*py, os.path.join(TRAIN, "train_target.py"), "--corpus", corpus, "--out", t, "--vocab", "300",
             "--hidden", "32", "--layers", "3", "--heads", "2", "--kv-heads", "1", "--intermediate", "64",
             "--seq", "32", "--batch", "8", "--steps", "20", "--minutes", "1")
        common = ["--target", t, "--corpus", corpus, "--data", os.path.join(d, "data.pt"),
                  "--ckpt", os.path.join(d, "draft.ckpt"), "--layer-ids", "0,1", "--block", "4", "--hidden", "32",
                  "--layers", "1", "--heads", "2", "--intermediate", "48", "--cond-dim", "16",
                  "--time-embed-dim", "8", "--batch", "8"]
        dt = os.path.join(TRAIN, "train_drafter.py")
        step(*py, dt, "gen", *common, "--out", os.path.join(d, "data.pt"), "--sequences", "8",
             "--gen-batch", "8", "--prompt-len", "8", "--gen-len", "16")
        step(*py, dt, "train", *common, "--stage1-minutes", "0.05", "--stage2-minutes", "0.05")
        step(*py, dt, "check", *common)
        step(*py, dt, "export", *common, "--out", os.path.join(d, "draft"), "--bf16")
        step(*py, dt, "eval", *common, "--draft-dir", os.path.join(d, "draft"), "--prompts", "2",
             "--max-new-tokens", "8")
        with open(os.path.join(d, "draft", "config.json")) as f:
            cfg = json.load(f)
        assert cfg["model_type"] == "flashmap" and sorted(cfg["jump_grids"]) == ["1", "2", "3", "4"], cfg
        ids = []
        for extra in (["--no-draft"], ["--draft", os.path.join(d, "draft")]):
            out = subprocess.run([exe, "generate", "--target", t, *extra, "--prompt-ids", "5,6,7",
                                  "--max-new-tokens", "16", "--stop-ids", "none", "--json", "--threads", "1"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                print(out.stderr)
                return 1
            ids.append(json.loads(out.stdout)["ids"])
        if ids[0] != ids[1]:
            print("speculative ids differ from target-alone ids:", ids)
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
