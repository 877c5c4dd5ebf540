#!/usr/bin/env python3
"""Prompt-lookup speculation, flashmap against llama.cpp's own, on one workload and one target.

    python3 bench/vs_llama_cpp_lookup.py --flashmap build/flashmap
    python3 bench/vs_llama_cpp_lookup.py --flashmap build/flashmap --reps 3 --json lookup.json

In one run (each step reused from the cache folder when it is already there):
  1. llama.cpp from the llama-cpp-python sdist on PyPI (vendor/llama.cpp, as bench/vs_llama_cpp.py
     takes it), built CPU-only, Release, native: llama-speculative-simple, whose --spec-type
     ngram-simple drafts the continuation of the last n tokens' latest earlier occurrence;
  2. the target folder (default: the shipped pair's, models/default/target) written as an f32
     GGUF with the sdist's gguf-py (numpy only, no torch): the same weights, its BPE vocabulary
     and merges with Qwen2's pre-tokenizer (the folder's own regex), no BOS;
  3. every prompt of --prompt-file (default bench/workloads/repeat.jsonl; chat lines rendered
     by `flashmap render`, so both engines read the same text) decoded greedily for
     --max-new-tokens by llama.cpp alone (its speculative loop with an n-gram too long to
     match) and with ngram-simple (n = --ngram, m = --block), and by `flashmap bench` with the target alone and --draft ngram
     (--ngram-max = --ngram, --ngram-block = --block), --reps times, interleaved;
  4. a table of tokens/s (total new tokens over total decode time, medians over reps) and each
     engine's speed-up over its own target alone, with llama.cpp's acceptance rate.
Both decode with --threads threads. Not part of CI.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_llama_cpp as base  # noqa: E402  (its sdist download and extraction)

REPO = Path(__file__).resolve().parent.parent


def log(msg):
    print(f"[vs_llama_cpp_lookup] {msg}", file=sys.stderr, flush=True)


def ensure_build(cache, llama, jobs):
    build = cache / "llama-build-lookup"
    exe = build / "bin" / "llama-speculative-simple"
    if not exe.exists():
        base.run(["cmake", "-S", llama, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                  "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
                  "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF",
                  "-DGGML_CUDA=OFF"])
        base.run(["cmake", "--build", build, "-j", str(jobs), "--target",
                  "llama-speculative-simple"])
    return exe


def read_safetensors(path):
    """name -> float32 array, for the dtypes a Qwen3 folder holds."""
    import numpy as np
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if t["dtype"] == "F32":
            x = np.frombuffer(buf, dtype=np.float32)
        elif t["dtype"] == "BF16":
            x = (np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            x = np.frombuffer(buf, dtype=np.float16).astype(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {t['dtype']} not handled here")
        out[name] = x.reshape(t["shape"])
    return out


def ensure_gguf(cache, llama, target):
    cfg = json.loads((target / "config.json").read_text())
    files = sorted(target.glob("*.safetensors"))
    key = base.sha256_of(target / "config.json", target / "tokenizer.json", *files)
    out = cache / f"target-{key}.f32.gguf"
    if out.exists():
        return out
    sys.path.insert(0, str(llama / "gguf-py"))
    import gguf
    import numpy as np
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    tok = json.loads((target / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [""] * cfg["vocab_size"]
    types = [gguf.TokenType.UNUSED] * cfg["vocab_size"]
    for t, i in vocab.items():
        tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for t in tok.get("added_tokens", []):
        tokens[t["id"]] = t["content"]
        types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    for i, t in enumerate(tokens):
        if not t:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    theta = cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = cfg["eos_token_id"]
    w.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, x in tensors.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        if m and m.group(2) in per_layer:
            gname = f"blk.{m.group(1)}.{per_layer[m.group(2)]}.weight"
        elif name in names:
            gname = names[name]
        else:
            raise SystemExit(f"{target}: tensor {name} has no GGUF name here")
        w.add_tensor(gname, np.ascontiguousarray(x, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    log(f"wrote {out}")
    return out


def prompts_as_text(args):
    """The workload's prompts as the text both engines decode (chat lines rendered)."""
    out = []
    for line in Path(args.prompt_file).read_text().splitlines():
        if not line.strip():
            continue
        p = json.loads(line)
        if "prompt" in p:
            out.append(p["prompt"])
        elif "chat" in p:
            req = json.dumps({"messages": [{"role": "user", "content": p["chat"]}],
                              "add_generation_prompt": True})
            r = subprocess.run([args.flashmap, "render", "--tokenizer", args.target,
                                "--request", "-"], input=req, capture_output=True, text=True,
                               check=True)
            out.append(r.stdout)
        else:
            raise SystemExit(f"{args.prompt_file}: only text and chat prompts are compared here")
    return out


def llama_run(args, exe, gguf_path, prompt, spec):
    cmd = [exe, "-m", gguf_path, "-p", prompt, "-n", str(args.max_new_tokens), "--temp", "0",
           "-t", str(args.threads), "-c", "4096", "--ignore-eos"]
    # Alone: the same loop with an n-gram no prompt reaches, so that nothing is ever drafted
    # (this tool refuses --spec-type none).
    cmd += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
            str(args.ngram if spec else 1024), "--spec-ngram-simple-size-m", str(args.block)]
    # A run that ends without its summary is retried (seen once in many runs: exit status 0,
    # output cut); a second failure stops the benchmark.
    for attempt in range(2):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        text = r.stdout + r.stderr
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
        if r.returncode == 0 and m:
            break
        log(f"llama.cpp run {attempt + 1} failed (exit {r.returncode}): " + r.stderr[-500:])
    else:
        raise SystemExit("llama.cpp failed twice:\n" + " ".join(map(str, cmd)))
    grab = lambda k: int(re.search(rf"{k}\s*=\s*(\d+)", text).group(1)) if re.search(
        rf"{k}\s*=\s*(\d+)", text) else 0
    return int(m.group(1)), float(m.group(2)), grab("n_drafted"), grab("n_accept")


def flashmap_run(args, texts):
    """`flashmap bench --json`'s target_alone and ngram rows."""
    with tempfile.TemporaryDirectory() as tmp:
        wl = Path(tmp) / "prompts.jsonl"
        wl.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
        js = Path(tmp) / "out.json"
        base.run([args.flashmap, "bench", "--target", args.target, "--draft", "ngram",
                  "--ngram-max", str(args.ngram), "--ngram-block", str(args.block),
                  "--prompt-file", wl, "--max-new-tokens", str(args.max_new_tokens),
                  "--threads", str(args.threads), "--reps", "1", "--json", js])
        return json.loads(js.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flashmap", required=True)
    ap.add_argument("--target", default=str(REPO / "models" / "default" / "target"))
    ap.add_argument("--prompt-file", default=str(REPO / "bench" / "workloads" / "repeat.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ngram", type=int, default=4, help="n-gram length matched (both engines)")
    ap.add_argument("--block", type=int, default=8, help="drafts per round, at most")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "flashmap-bench"))
    ap.add_argument("--llama-build", help="a llama.cpp build folder with bin/llama-speculative-simple")
    ap.add_argument("--json")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    llama = base.ensure_sources(cache)
    exe = (Path(args.llama_build) / "bin" / "llama-speculative-simple" if args.llama_build
           else ensure_build(cache, llama, args.jobs))
    gguf_path = ensure_gguf(cache, llama, Path(args.target))
    texts = prompts_as_text(args)

    runs = {"llama.cpp alone": [], "llama.cpp ngram-simple": [], "flashmap alone": [],
            "flashmap --draft ngram": []}
    accept = []
    for rep in range(args.reps):
        for spec in (False, True):
            tokens = secs = drafted = accepted = 0
            for t in texts:
                n, s, d, a = llama_run(args, exe, gguf_path, t, spec)
                tokens, secs, drafted, accepted = tokens + n, secs + s, drafted + d, accepted + a
            runs["llama.cpp ngram-simple" if spec else "llama.cpp alone"].append(tokens / secs)
            if spec:
                accept.append(accepted / drafted if drafted else 0.0)
        rows = flashmap_run(args, texts)
        runs["flashmap alone"].append(rows["target_alone"]["tokens_per_s"])
        runs["flashmap --draft ngram"].append(rows["ngram"]["tokens_per_s"])
        tau = round(rows["ngram"]["tau"], 2)
        log(f"rep {rep + 1}/{args.reps} done")

    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu = base.cpu_model()
    print(f"# prompt lookup on {cpu}, {args.threads} threads: {len(texts)} prompts of "
          f"{args.prompt_file} x {args.max_new_tokens} new tokens, greedy, n = {args.ngram}, "
          f"block {args.block}, medians of {args.reps} interleaved runs\n")
    print("| engine | tokens/s alone | tokens/s prompt lookup | speed-up | acceptance |")
    print("|---|---|---|---|---|")
    print(f"| llama.cpp (ngram-simple) | {med['llama.cpp alone']:.1f} | "
          f"{med['llama.cpp ngram-simple']:.1f} | "
          f"{med['llama.cpp ngram-simple'] / med['llama.cpp alone']:.2f}x | "
          f"{statistics.median(accept):.2f} of drafts |")
    print(f"| flashmap (--draft ngram) | {med['flashmap alone']:.1f} | "
          f"{med['flashmap --draft ngram']:.1f} | "
          f"{med['flashmap --draft ngram'] / med['flashmap alone']:.2f}x | tau {tau} |")
    print(f"\nflashmap / llama.cpp: alone {med['flashmap alone'] / med['llama.cpp alone']:.2f}x, "
          f"prompt lookup {med['flashmap --draft ngram'] / med['llama.cpp ngram-simple']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu, "runs": runs, "accept": accept,
                                               "tau": tau}, indent=1))


if __name__ == "__main__":
    main()
