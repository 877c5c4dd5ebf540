#!/usr/bin/env python3
"""Hugging Face `tokenizers` throughput on the tokenizer corpus, single thread, for comparison
with bench/bench_tokenizer.cpp (see bench/TOKENIZER.md).

    python3 bench/bench_tokenizer_hf.py [--repeat 5] [--corpus other.jsonl]

Reports MB/s (MB = 2^20 bytes of UTF-8 input, as Google Benchmark's bytes_per_second) for
encode() one line at a time and for encode_batch() over all lines, both with
add_special_tokens=False and one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false).
"""

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: its thread pool size
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def best_rate(fn, nbytes, repeat):
    """Best MB/s over `repeat` runs, by process CPU time (what Google Benchmark's
    bytes_per_second uses, so that a busy machine does not skew the ratio) and by wall time."""
    fn()  # warm the word cache, as the C++ benchmark's steady state is
    cpu = wall = float("inf")
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu = min(cpu, time.process_time() - c0)
        wall = min(wall, time.perf_counter() - w0)
    return nbytes / cpu / 2**20, nbytes / wall / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests/data/tokenizer_corpus.jsonl"),
                    help="JSONL file, one JSON string per line")
    args = ap.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    nbytes = sum(len(s.encode()) for s in lines)
    tok = Tokenizer.from_file(os.path.join(ROOT, "tests/data/qwen3-tokenizer/tokenizer.json"))

    cold = Tokenizer.from_file(os.path.join(ROOT, "tests/data/qwen3-tokenizer/tokenizer.json"))
    c0 = time.process_time()
    for s in lines:
        cold.encode(s, add_special_tokens=False)
    cold_rate = nbytes / (time.process_time() - c0) / 2**20

    one = best_rate(lambda: [tok.encode(s, add_special_tokens=False) for s in lines], nbytes,
                    args.repeat)
    batch = best_rate(lambda: tok.encode_batch(lines, add_special_tokens=False), nbytes,
                      args.repeat)
    print(f"tokenizers {tokenizers.__version__}, {len(lines)} lines, {nbytes} bytes, 1 thread; "
          "MB/s by CPU time (by wall time)")
    print(f"encode one by one, cold cache (first pass): {cold_rate:7.2f}")
    print(f"encode one by one:                          {one[0]:7.2f} ({one[1]:.2f})")
    print(f"encode_batch:                               {batch[0]:7.2f} ({batch[1]:.2f})")

if __name__ == "__main__":
    main()
