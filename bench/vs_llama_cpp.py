#!/usr/bin/env python3
"""flashmap against llama.cpp on random Qwen3-shaped models, CPU, side by side.

    python3 bench/vs_llama_cpp.py                      # everything, cached in ~/.cache/flashmap-bench
    python3 bench/vs_llama_cpp.py --threads 2 --context 512 --reps 5 --json vs_llama.json
    python3 bench/vs_llama_cpp.py --shape qwen3-8b --reps 2 --inner-reps 3   # and the rounds

In one run (each step reused from the cache folder when it is already there):
  1. llama.cpp from the llama-cpp-python sdist on PyPI (vendor/llama.cpp), built CPU-only,
     Release, native (--no-amx: without AMX tiles): libllama, llama-bench, llama-quantize,
     llama-speculative-simple, and bench/llama_api_timer.cpp linked against libllama;
  2. a venv with the Python requirements of llama.cpp's convert_hf_to_gguf.py (torch from PyPI,
     gguf from the vendored gguf-py), or the Python given by --converter-python;
  3. a Hugging Face folder with the config of Qwen3-0.6B (--shape qwen3-0.6b, the default) or
     Qwen3-8B (--shape qwen3-8b) and random bf16 weights, plus the repo's Qwen3 tokenizer files
     (tests/data/qwen3-tokenizer); at qwen3-8b also the Qwen3-0.6B folder, as the draft model
     of llama.cpp's own speculative decoding;
  4. that folder converted by convert_hf_to_gguf.py to a bf16 GGUF, quantized to Q8_0 by
     llama-quantize (--weights q4km: also to Q4_K_M, which flashmap reads as it is);
  5. decode (1 token) and verify-17 (17 tokens, logits for all 17 rows) at --context, timed in
     --reps interleaved rounds (flashmap bf16, llama.cpp bf16, flashmap q8, llama.cpp Q8_0,
     and so on for each of --weights);
     each process reports the median of --inner-reps calls after a warm-up, and the table
     shows the median over rounds. Each run waits for a quiet second and is repeated when
     other processes took more than --max-interference of the CPUs meanwhile; runs still
     disturbed are kept out of the medians;
  6. at qwen3-8b, a speculative round in each engine at the same τ: flashmap's (one FlashMap
     draft of 16 + verify-17 + commit, from `--draft-shape flashmap-qwen3-8b`) against
     llama.cpp's with a draft model (16 decode steps of the Qwen3-0.6B model + verify-17 of the
     8B), and the tokens/s and speed-up over each engine's own decode that follow for τ = 1…10;
  7. at qwen3-8b, a DFlash round in each engine on the same weights: a random drafter of
     z-lab/Qwen3-8B-DFlash-b16's shape (safetensors for flashmap, converted by llama.cpp's
     converter for llama.cpp) over the same target, flashmap's `bench --target --draft` against
     llama.cpp's own `llama-speculative-simple --spec-type draft-dflash`, each timed as whole
     requests (greedy, every round a full block of 15 drafts).
flashmap runs `flashmap bench --shape qwen3-0.6b --target DIR --no-sweep` (q8: plus
`--weights q8`; bf16 with `--compute bf16` when asked, which matches llama.cpp's own bf16 dot
products on a CPU with AVX512-BF16); llama.cpp runs
through its C API (llama_api_timer.cpp), since llama-bench's pp asks for the last logit only.
Not part of CI. See bench/LLAMA_CPP.md.
"""

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
REPO = Path(__file__).resolve().parent.parent
TIMER_SRC = REPO / "bench" / "llama_api_timer.cpp"
TOKENIZER_DIR = REPO / "tests" / "data" / "qwen3-tokenizer"
VERIFY_ROWS = 17  # a block of 16 drafts plus the bonus token
MODEL_SEED = 1
DRAFTS = VERIFY_ROWS - 1  # the drafts of a round

# Qwen/Qwen3-0.6B's config.json (the values that matter to a forward pass are all real).
QWEN3_06B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Qwen/Qwen3-8B's config.json: the 0.6B one with its sizes (untied embeddings).
QWEN3_8B_CONFIG = dict(QWEN3_06B_CONFIG, hidden_size=4096, intermediate_size=12288,
                       max_window_layers=36, num_attention_heads=32, num_hidden_layers=36,
                       tie_word_embeddings=False)
SHAPES = {"qwen3-0.6b": QWEN3_06B_CONFIG, "qwen3-8b": QWEN3_8B_CONFIG}
# The draft model llama.cpp's speculative decoding pairs with a target of each shape.
DRAFT_MODEL = {"qwen3-8b": "qwen3-0.6b"}
# z-lab/Qwen3-8B-DFlash-b16's config.json (every value a forward pass reads is the released
# one): five Qwen3 layers of the target's width, fc from the five tapped layers' features,
# blocks of 16, the mask token after the vocabulary's special tokens.
DFLASH_8B_CONFIG = dict(
    QWEN3_8B_CONFIG, architectures=["DFlashDraftModel"], num_hidden_layers=5,
    max_window_layers=5, num_target_layers=36, block_size=16,
    dflash_config={"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]})
DFLASH = {"qwen3-8b": DFLASH_8B_CONFIG}

# The weights a run can time, each the same model in both engines: the label of its rows,
# flashmap's options, and the `llama-quantize` type of llama.cpp's GGUFs made from the bf16 one
# (target, and the draft model llama.cpp speculates with; the DFlash drafter's) or None for the
# bf16 GGUF itself. flashmap reads the bf16 folder and makes q8 at load, the same rule as
# Q8_0; a Q4_K_M file it reads as it is (`--target FILE.gguf --weights q4`: its Q4_K and Q6_K
# blocks kept), and it quantizes a drafter's own matrices to q4 at load, Q4_0's rule, so
# llama.cpp's DFlash drafter is Q4_0 there.
WEIGHTS = {
    "bf16": {"label": "bf16", "flashmap": [], "target": None, "dflash": None},
    "q8": {"label": "q8 (Q8_0)", "flashmap": ["--weights", "q8"], "target": "Q8_0",
           "dflash": "Q8_0"},
    "q4km": {"label": "Q4_K_M (flashmap: the file, --weights q4)",
             "flashmap": ["--weights", "q4"], "target": "Q4_K_M", "dflash": "Q4_0",
             "flashmap_reads_gguf": True},
}


def log(msg):
    print(f"[vs_llama_cpp] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    """Runs a command, its output to our stderr; raises with the command on failure."""
    log("$ " + " ".join(str(c) for c in cmd))
    r = subprocess.run([str(c) for c in cmd], stdout=sys.stderr, stderr=sys.stderr, **kw)
    if r.returncode != 0:
        raise SystemExit(f"vs_llama_cpp: command failed (exit {r.returncode}): "
                         + " ".join(str(c) for c in cmd))


def capture(cmd, **kw):
    # errors="replace": generated text may end inside a character
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace",
                       **kw)
    return r.returncode, r.stdout, r.stderr


def sha256_of(*paths_or_bytes):
    h = hashlib.sha256()
    for p in paths_or_bytes:
        h.update(p if isinstance(p, bytes) else Path(p).read_bytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# 1. llama.cpp sources (the llama-cpp-python sdist) and build


def ensure_sources(cache):
    src = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    llama = src / "vendor" / "llama.cpp"
    if (src / ".extracted").exists():
        return llama
    dl = cache / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    tgz = dl / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not tgz.exists():
        run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", dl])
    if src.exists():
        shutil.rmtree(src)
    log(f"extracting {tgz.name}")
    with tarfile.open(tgz) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(cache, filter="data")
        else:
            t.extractall(cache)
    if not (llama / "include" / "llama.h").exists():
        raise SystemExit(f"vs_llama_cpp: {tgz} has no vendor/llama.cpp/include/llama.h")
    (src / ".extracted").write_text("ok\n")
    return llama


CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",  # for llama-speculative-simple; only the targets below build
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_CUDA=OFF",
]


# The native build without AMX tiles: some VMs list AMX among the CPU's features yet fault
# (SIGILL) on its first tile instruction, which ggml's Q8_0 products use where it is compiled in.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def ensure_build(cache, llama, jobs, no_amx=False):
    build = cache / ("llama-build-no-amx" if no_amx else "llama-build")
    bin_dir = build / "bin"
    stamp = build / ".flashmap-bench-built"
    flags = CMAKE_FLAGS + ([f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
                           if no_amx else [])
    want = json.dumps({"version": LLAMA_CPP_PYTHON, "flags": flags})
    if not (stamp.exists() and stamp.read_text() == want):
        run(["cmake", "-S", llama, "-B", build, *flags])
        run(["cmake", "--build", build, "-j", str(jobs), "--target", "llama", "llama-bench",
             "llama-quantize", "llama-speculative-simple"])
        stamp.write_text(want)
    # The timer, rebuilt when its source changes.
    timer = bin_dir / f"llama-api-timer-{sha256_of(TIMER_SRC)}"
    if not timer.exists():
        libs = sorted({p.parent for p in build.rglob("libllama.so*")} |
                      {p.parent for p in build.rglob("libggml*.so*")})
        cmd = [os.environ.get("CXX", "c++"), "-O2", "-std=c++17", TIMER_SRC, "-o", timer,
               "-I", llama / "include", "-I", llama / "ggml" / "include"]
        for d in libs:
            cmd += ["-L", d, f"-Wl,-rpath,{d}"]
        cmd += ["-lllama", "-lggml", "-lggml-base"]
        run(cmd)
    return {"bench": bin_dir / "llama-bench", "quantize": bin_dir / "llama-quantize",
            "speculative": bin_dir / "llama-speculative-simple", "timer": timer}


# ---------------------------------------------------------------------------------------------
# 2. the converter's Python environment


def converter_requirements(llama):
    """The pins of requirements-convert_hf_to_gguf.txt (following -r), without index options
    (its extra PyTorch index is not reachable here: torch comes from PyPI) and without gguf
    (installed from the vendored gguf-py)."""
    out, seen = [], set()

    def read(path):
        if path in seen:
            return
        seen.add(path)
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-r"):
                read((path.parent / line[2:].strip()).resolve())
            elif line.startswith("-"):
                continue
            elif line.split("=")[0].split(">")[0].split("<")[0].split("~")[0].strip() == "gguf":
                continue
            else:
                out.append(line)

    read(llama / "requirements" / "requirements-convert_hf_to_gguf.txt")
    return out


def ensure_venv(cache, llama):
    venv = cache / "venv"
    py = venv / "bin" / "python"
    reqs = converter_requirements(llama)
    stamp = venv / ".flashmap-bench-ok"
    want = json.dumps({"reqs": reqs, "gguf-py": str(llama / "gguf-py")})
    if stamp.exists() and stamp.read_text() == want:
        return py
    if not py.exists():
        run([sys.executable, "-m", "venv", venv])
    run([py, "-m", "pip", "install", "--upgrade", "pip"])
    run([py, "-m", "pip", "install", *reqs, llama / "gguf-py"])
    stamp.write_text(want)
    return py


# ---------------------------------------------------------------------------------------------
# 3. the random Qwen3 folders (runs in the venv: numpy)


def make_model(out_dir, seed, shape, dflash=False):
    """Random bf16 weights of a Qwen3 shape (dflash: of the DFlash drafter released for it):
    normal, std 1/sqrt(fan_in); norms 1. Written one block of rows at a time, so that 16 GB of
    Qwen3-8B weights need little memory."""
    import numpy as np

    c = DFLASH[shape] if dflash else SHAPES[shape]
    H, I, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    hd, nq, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    if dflash:  # z-lab's names; the embedding and lm_head are the target's
        taps = len(c["dflash_config"]["target_layer_ids"])
        prefix = ""
        tensors = [("fc.weight", (H, taps * H)), ("hidden_norm.weight", (H,)),
                   ("norm.weight", (H,))]
    else:
        prefix = "model."
        tensors = [("model.embed_tokens.weight", (V, H)), ("model.norm.weight", (H,))]
        if not c["tie_word_embeddings"]:
            tensors.append(("lm_head.weight", (V, H)))
    for i in range(L):
        p = f"{prefix}layers.{i}."
        tensors += [(p + "input_layernorm.weight", (H,)),
                    (p + "post_attention_layernorm.weight", (H,)),
                    (p + "self_attn.q_norm.weight", (hd,)),
                    (p + "self_attn.k_norm.weight", (hd,)),
                    (p + "self_attn.q_proj.weight", (nq * hd, H)),
                    (p + "self_attn.k_proj.weight", (nkv * hd, H)),
                    (p + "self_attn.v_proj.weight", (nkv * hd, H)),
                    (p + "self_attn.o_proj.weight", (H, nq * hd)),
                    (p + "mlp.gate_proj.weight", (I, H)),
                    (p + "mlp.up_proj.weight", (I, H)),
                    (p + "mlp.down_proj.weight", (H, I))]
    # safetensors: u64 little-endian header length, JSON header (offsets into the data), data.
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    rng = np.random.default_rng(seed)

    def bf16(x):  # round to nearest even
        u = x.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "model.safetensors.partial"
    with open(tmp, "wb") as f:
        f.write(len(hjson).to_bytes(8, "little"))
        f.write(hjson)
        for name, shape in tensors:
            if len(shape) == 1:
                f.write(bf16(np.ones(shape, np.float32)).tobytes())
                continue
            rows, cols = shape
            scale = np.float32(1.0 / np.sqrt(cols))
            step = max(1, (1 << 24) // cols)  # 64 MB of fp32 at a time
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                x = rng.standard_normal((r1 - r0, cols), dtype=np.float32) * scale
                f.write(bf16(x).tobytes())
    tmp.rename(out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    if dflash:
        return
    (out_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": False}) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / name, out_dir / name)


def ensure_model(cache, py, shape, dflash=False):
    d = cache / (f"dflash-{shape}-random" if dflash else f"{shape}-random")
    stamp = d / ".flashmap-bench-ok"
    want = json.dumps({"seed": MODEL_SEED, "config": (DFLASH if dflash else SHAPES)[shape],
                       "tokenizer": sha256_of(TOKENIZER_DIR / "tokenizer.json",
                                              TOKENIZER_DIR / "tokenizer_config.json")})
    if stamp.exists() and stamp.read_text() == want:
        return d
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (TOKENIZER_DIR / name).exists():
            raise SystemExit(f"vs_llama_cpp: the repo's Qwen3 tokenizer is missing: "
                             f"{TOKENIZER_DIR / name}")
    if d.exists():
        shutil.rmtree(d)
    log(f"writing random {'DFlash ' if dflash else ''}{shape} weights to {d}")
    run([py, __file__, "--_make-model", d, "--_seed", str(MODEL_SEED + dflash), "--shape", shape]
        + (["--_dflash"] if dflash else []))
    stamp.write_text(want)
    return d


# ---------------------------------------------------------------------------------------------
# 4. GGUF: converted by llama.cpp's converter, quantized by llama-quantize


def ensure_gguf(cache, py, llama, tools, model_dir, modes, kind="target", target_dir=None):
    """The folder's GGUF for each of the weights modes (WEIGHTS[mode][kind]: the bf16 conversion
    or a `llama-quantize` type of it); a DFlash drafter's conversion reads the vocabulary of
    its target's folder (target_dir)."""
    stamp_text = (model_dir / ".flashmap-bench-ok").read_text()
    key = sha256_of(stamp_text.encode(), LLAMA_CPP_PYTHON.encode())
    bf16 = cache / f"{model_dir.name}-bf16-{key}.gguf"
    if not bf16.exists():
        tmp = bf16.with_suffix(".partial")
        # NO_LOCAL_GGUF unset: the converter puts the vendored gguf-py first on its path.
        run([py, llama / "convert_hf_to_gguf.py", model_dir, "--outtype", "bf16",
             "--outfile", tmp] + (["--target-model-dir", target_dir] if target_dir else []))
        tmp.rename(bf16)
    got = {}
    for mode in modes:
        qtype = WEIGHTS[mode][kind]
        if qtype is None:
            got[mode] = bf16
            continue
        got[mode] = cache / f"{model_dir.name}-{qtype.lower()}-{key}.gguf"
        if not got[mode].exists():
            tmp = got[mode].with_suffix(".partial")
            run([tools["quantize"], bf16, tmp, qtype])
            tmp.rename(got[mode])
    return got


# ---------------------------------------------------------------------------------------------
# 5. timing


def flashmap_mode(args, weights):
    """flashmap's options for the weights timed: q8 or q4, or the bf16 file's with --compute."""
    if WEIGHTS[weights]["flashmap"]:
        return WEIGHTS[weights]["flashmap"]
    return ["--compute", "bf16"] if args.compute == "bf16" else []


def flashmap_json(args, cmd, prompt=None):
    """`flashmap bench` with the arguments `cmd`, its `--json` written to a temporary file (and
    `--prompt-file` of the one raw-text `prompt` when given): the JSON it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [args.flashmap, "bench"] + cmd + ["--json", out]
        if prompt is not None:
            prompt_file = Path(tmp) / "prompt.jsonl"
            prompt_file.write_text(json.dumps({"prompt": prompt}) + "\n")
            cmd += ["--prompt-file", prompt_file]
        rc, so, se = capture(cmd)
        if rc != 0:
            raise SystemExit(f"vs_llama_cpp: flashmap failed (exit {rc}): "
                             + " ".join(map(str, cmd)) + "\n" + (se or so).strip())
        return json.loads(out.read_text())


def flashmap_once(args, model_dir, weights):
    """flashmap's decode and verify on the folder (or GGUF file); at a shape with a released
    FlashMap drafter (qwen3-8b) also its round, with a random drafter of that shape made in
    memory."""
    cmd = ["--shape", args.shape, "--target", model_dir, "--context", args.context,
           "--block", VERIFY_ROWS - 1, "--threads", args.threads, "--reps", args.inner_reps,
           "--no-sweep"]
    if args.shape in DRAFT_MODEL:
        cmd += ["--draft-shape", f"flashmap-{args.shape}", "--prefill", 1]
    j = flashmap_json(args, cmd + flashmap_mode(args, weights))
    r = {"decode_ms": j["decode_ms"], "verify_ms": j[f"verify{VERIFY_ROWS}_ms"],
         "lm_head_dtype": j.get("lm_head_dtype"),
         "weight_bytes_per_step": j.get("weight_bytes_per_step")}
    if "round_ms" in j:
        d = j["drafter"]
        r.update(round_ms=j["round_ms"], draft_ms=d["draft"]["1"]["ms"],
                 commit_ms=d["commit_ms"] - d["fork_copy_ms"])
    return r


def llama_once(args, tools, gguf, verify=True):
    rows = f"1,{VERIFY_ROWS}" if verify else "1"
    cmd = [tools["timer"], "--model", gguf, "--threads", args.threads, "--context", args.context,
           "--reps", args.inner_reps, "--rows", rows]
    rc, so, se = capture(cmd)
    if rc != 0:
        raise SystemExit(f"vs_llama_cpp: llama-api-timer failed (exit {rc}): "
                         + " ".join(map(str, cmd)) + "\n" + (se or so).strip())
    j = json.loads(so.strip().splitlines()[-1])
    return {"decode_ms": j["rows1_ms"], "verify_ms": j.get(f"rows{VERIFY_ROWS}_ms"),
            "llama_version": j.get("llama_version")}


# The DFlash rounds: each engine decodes ROUND_SHORT tokens and ROUND_SHORT + --round-tokens,
# and a round costs the difference in decoding time over the difference in rounds. Both engines
# shrink the block over the last tokens of a request (no drafts past max tokens), and those
# last rounds are the same in the two requests, so the difference is made of full rounds only.
ROUND_SHORT = 16
DFLASH_DRAFTS = 15  # a DFlash block of 16: the last token and 15 mask positions
# The prompt of both engines' requests, raw text (no chat template): 14 tokens.
ROUND_PROMPT = "The history of the printing press begins in the fifteenth century, when"


def full_rounds(a, b):
    """One full round from two requests that differ only in full rounds: each total (decoding
    time, tokens, and what else both report: drafts, phase times) over the rounds between them;
    None when they do not differ."""
    if b["rounds"] <= a["rounds"]:
        return None
    n = b["rounds"] - a["rounds"]
    per = {"decode_ms": "round_ms", "tokens": "tau", "drafted": "drafts_per_round",
           "draft_total_ms": "draft_ms", "verify_total_ms": "verify_ms"}
    return {v: (b[k] - a[k]) / n for k, v in per.items() if k in a and k in b}


def flashmap_dflash_round(args, model_dir, dflash_dir, weights):
    """flashmap's DFlash round on the target (folder or GGUF file) and the drafter's folder:
    `flashmap bench --target --draft` (llama.cpp's prompt, greedy), twice, with and without
    ROUND_SHORT tokens."""
    got = []
    for n in (ROUND_SHORT, ROUND_SHORT + args.round_tokens):
        cmd = ["--target", model_dir, "--draft", dflash_dir, "--threads", args.threads,
               "--reps", 1, "--max-new-tokens", n] + flashmap_mode(args, weights)
        j = flashmap_json(args, cmd, prompt=ROUND_PROMPT)
        d, n = j["dflash"], j["dflash"]["rounds"]
        got.append({"decode_ms": d["round_ms"] * n, "rounds": n, "tokens": d["tau"] * n,
                    "draft_total_ms": d["draft_ms_per_round"] * n,
                    "verify_total_ms": d["verify_ms_per_round"] * n,
                    "alone_ms": j["target_alone"]["round_ms"]})
    r = full_rounds(*got)
    if r is None:
        raise SystemExit("vs_llama_cpp: flashmap's two DFlash requests ran the same rounds")
    r["decode_ms"] = got[1]["alone_ms"]
    return r


def llama_dflash_round(args, tools, target_gguf, dflash_gguf):
    """llama.cpp's own DFlash speculative decoding (`llama-speculative-simple --spec-type
    draft-dflash`, greedy, every round a full block: no minimum draft probability), twice, with
    and without ROUND_SHORT tokens; its "decoded N tokens in S seconds" and draft counts."""
    got = []
    for n in (ROUND_SHORT, ROUND_SHORT + args.round_tokens):
        cmd = [tools["speculative"], "-m", target_gguf, "-md", dflash_gguf,
               "--spec-type", "draft-dflash", "--spec-draft-n-max", DFLASH_DRAFTS,
               "--spec-draft-n-min", DFLASH_DRAFTS, "--spec-draft-p-min", 0,
               "-t", args.threads, "-tb", args.threads, "-td", args.threads,
               "-tbd", args.threads, "--temp", 0, "-n", n, "-c", 1024, "-p", ROUND_PROMPT]
        rc, so, se = capture(cmd)
        text = so + se
        if rc != 0:
            raise SystemExit(f"vs_llama_cpp: llama-speculative-simple failed (exit {rc}): "
                             + " ".join(map(str, cmd)) + "\n" + text.strip()[-2000:])
        # Its log lines may start with a time stamp and a level.
        vals = {}
        m = re.search(r"\bdecoded\s+\d+ tokens in\s+([0-9.]+) seconds", text)
        if m:
            vals["decode_ms"] = 1000 * float(m.group(1))
        for key in ("n_predict", "n_drafted", "n_accept"):
            m = re.search(rf"\b{key}\s*=\s*(\d+)", text)
            if m:
                vals[key] = int(m.group(1))
        if len(vals) != 4:
            raise SystemExit("vs_llama_cpp: llama-speculative-simple's summary not found: "
                             + " ".join(map(str, cmd)) + "\n" + text.strip()[-2000:])
        # Each round commits its accepted drafts and one token of the target's own.
        got.append({"decode_ms": vals["decode_ms"], "tokens": vals["n_predict"],
                    "rounds": vals["n_predict"] - vals["n_accept"],
                    "drafted": vals["n_drafted"]})
    r = full_rounds(*got)
    if r is None:
        raise SystemExit("vs_llama_cpp: llama.cpp's two DFlash requests ran the same rounds")
    return r


def llama_bench_tg(args, tools, gguf):
    """llama-bench's own decode figure at the same depth (a cross-check of the timer)."""
    cmd = [tools["bench"], "-m", gguf, "-t", args.threads, "-p", 0, "-n", 16, "-d", args.context,
           "-r", 3, "-o", "json"]
    rc, so, se = capture(cmd)
    if rc != 0:
        log(f"llama-bench failed (exit {rc}): {(se or so).strip()[-500:]}")
        return None
    try:
        rows = json.loads(so)
        return 1000.0 / float(rows[0]["avg_ts"])
    except (ValueError, KeyError, IndexError) as e:
        log(f"llama-bench output not understood: {e}")
        return None


# Other processes' share of the CPUs: /proc/stat's busy time less what our children used.
def cpu_snapshot():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user .. steal
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic(), sum(v) - v[3] - v[4], ru.ru_utime + ru.ru_stime


def others_share(a, b):
    wall = max(b[0] - a[0], 1e-6)
    busy = (b[1] - a[1]) / os.sysconf("SC_CLK_TCK")
    return max(0.0, busy - (b[2] - a[2])) / (wall * (os.cpu_count() or 1))


def wait_quiet(args):
    """Waits (up to --quiet-wait s) for a second in which other processes use at most
    --max-interference of the CPUs; returns the last second's share."""
    t_end = time.monotonic() + args.quiet_wait
    said = False
    while True:
        a = cpu_snapshot()
        time.sleep(1.0)
        share = others_share(a, cpu_snapshot())
        if share <= args.max_interference or time.monotonic() >= t_end:
            return share
        if not said:
            log(f"other processes use {100 * share:.0f}% of the CPUs: waiting up to "
                f"{args.quiet_wait} s for a quiet second")
            said = True


def timed(args, what, fn):
    """fn() in a quiet moment; run again (up to --retries times) when other processes took more
    than --max-interference of the CPUs while it ran. Adds that share as "interference"."""
    for attempt in range(args.retries + 1):
        wait_quiet(args)
        a = cpu_snapshot()
        r = fn()
        share = others_share(a, cpu_snapshot())
        if share <= args.max_interference or attempt == args.retries:
            r["interference"] = share
            return r
        log(f"{what}: other processes took {100 * share:.0f}% of the CPUs meanwhile; again")


def cpu_model():
    rc, so, _ = capture(["lscpu"])
    for line in so.splitlines() if rc == 0 else []:
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def med(xs):
    return statistics.median(xs) if xs else None


def fmt_ms(x):
    return "n/a" if x is None else f"{x:.2f}"


TAUS = (1, 2, 3, 4, 5, 6, 6.5, 7, 8, 9, 10)


def round_tables(args, runs, values, draft_shape, modes):
    """Prints a speculative round in each engine, phase by phase, and the tokens/s it gives at
    each τ (tokens a round commits; the same τ for both, since it is the drafter's and the
    text's, not the engine's) against each engine's own target-alone decode; returns them."""
    out = {}
    for w in modes:
        wl = WEIGHTS[w]["label"]

        def medians(engine, keys):
            got = {}
            for k in keys:
                xs = [v for v in values(engine, w, lambda x, k=k: x.get(k)) if v is not None]
                if xs:
                    got[k] = med(xs)
            return got

        fm = medians("flashmap", ("round_ms", "draft_ms", "verify_ms", "commit_ms", "decode_ms"))
        ll = medians("llama.cpp round",
                     ("round_ms", "drafts_ms", "draft_decode_ms", "verify_ms", "decode_ms"))
        if "round_ms" not in ll:
            continue
        print(f"\n## A speculative round of {DRAFTS} drafts, {wl}\n")
        print(f"| phase | flashmap (FlashMap drafter) ms | llama.cpp ({draft_shape} draft "
              "model) ms |")
        print("|---|---|---|")
        print(f"| draft {DRAFTS} tokens | {fmt_ms(fm.get('draft_ms'))} (one block pass) | "
              f"{fmt_ms(ll['drafts_ms'])} ({DRAFTS} x {fmt_ms(ll['draft_decode_ms'])} decode "
              "steps) |")
        print(f"| verify-{VERIFY_ROWS} | {fmt_ms(fm.get('verify_ms'))} | "
              f"{fmt_ms(ll['verify_ms'])} |")
        print(f"| drafter commit | {fmt_ms(fm.get('commit_ms'))} | (in the draft steps) |")
        print(f"| round | {fmt_ms(fm.get('round_ms'))} | {fmt_ms(ll['round_ms'])} |")
        print(f"| target alone, 1 token | {fmt_ms(fm.get('decode_ms'))} | "
              f"{fmt_ms(ll['decode_ms'])} |")
        table = []
        if "round_ms" in fm:
            print("\n| τ | flashmap tokens/s (speed-up) | llama.cpp tokens/s (speed-up) | "
                  "flashmap / llama.cpp |")
            print("|---|---|---|---|")
            for tau in TAUS:
                a, b = 1000 * tau / fm["round_ms"], 1000 * tau / ll["round_ms"]
                sa, sb = a * fm["decode_ms"] / 1000, b * ll["decode_ms"] / 1000
                table.append({"tau": tau, "flashmap_tokens_per_s": a, "flashmap_speedup": sa,
                              "llama_cpp_tokens_per_s": b, "llama_cpp_speedup": sb})
                print(f"| {tau:g} | {a:.2f} ({sa:.2f}x) | {b:.2f} ({sb:.2f}x) | {a / b:.2f} |")
        out[w] = {"flashmap": fm, "llama_cpp": ll, "by_tau": table}
    print("\nmedians over the rounds left alone; llama.cpp's round is its draft model's "
          f"{DRAFTS} decode steps plus the target's verify-{VERIFY_ROWS} (sampling and "
          "bookkeeping not counted)")
    return out


def dflash_table(runs, values, ratios, modes):
    """Prints the DFlash round of each engine on the same drafter and target weights; returns
    the medians."""
    out = {}
    print("\n## A DFlash round, the same random Qwen3-8B and DFlash-b16 weights in both "
          "engines\n")
    print("| weights | flashmap round ms (draft / verify) | llama.cpp round ms | ratio "
          "(flashmap/llama.cpp) | τ flashmap / llama.cpp | llama.cpp drafts a round |")
    print("|---|---|---|---|---|---|")
    for w in modes:
        wl = WEIGHTS[w]["label"]
        fm = {k: med(values("flashmap dflash", w, lambda x, k=k: x[k]))
              for k in ("round_ms", "draft_ms", "verify_ms", "tau", "decode_ms")}
        ll = {k: med(values("llama.cpp dflash", w, lambda x, k=k: x[k]))
              for k in ("round_ms", "tau", "drafts_per_round")}
        ratio = med(ratios(w, lambda x: x["round_ms"], "flashmap dflash", "llama.cpp dflash"))
        print(f"| {wl} | {fmt_ms(fm['round_ms'])} ({fmt_ms(fm['draft_ms'])} / "
              f"{fmt_ms(fm['verify_ms'])}) | {fmt_ms(ll['round_ms'])} | "
              f"{'n/a' if ratio is None else format(ratio, '.2f')} | "
              f"{fmt_ms(fm['tau'])} / {fmt_ms(ll['tau'])} | {fmt_ms(ll['drafts_per_round'])} |")
        out[w] = {"flashmap": fm, "llama_cpp": ll, "ratio": ratio}
    print(f"\na round: the cost of one more full round ({DFLASH_DRAFTS} drafts and a verify of "
          f"{DFLASH_DRAFTS + 1}) in a whole request, from two requests of each engine that "
          "differ in full rounds only (greedy; random weights accept few drafts, τ near 1); "
          "flashmap's draft / verify: those phases of that round")
    return out


def weights_list(text):
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in WEIGHTS]
    if not modes or bad:
        raise argparse.ArgumentTypeError(
            f"'{text}': expected a comma-separated list of {', '.join(WEIGHTS)}")
    return tuple(dict.fromkeys(modes))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b",
                    help="the target's shape (qwen3-0.6b); qwen3-8b adds the speculative rounds")
    ap.add_argument("--setup-only", action="store_true",
                    help="build, convert and cache everything, then stop (time later, on a "
                         "quiet machine)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines (2)")
    ap.add_argument("--compute", choices=("fp32", "bf16"), default="fp32",
                    help="flashmap's arithmetic on the bf16 weights: fp32 (its reference) or bf16 "
                         "(--compute bf16: AVX512-BF16 dot products, the rounding llama.cpp's bf16 "
                         "path makes on such a CPU)")
    ap.add_argument("--context", type=int, default=512,
                    help="filled context before the timed steps (512)")
    ap.add_argument("--reps", type=int, default=5,
                    help="interleaved rounds (A B A B ...); the table shows their median (5)")
    ap.add_argument("--inner-reps", type=int, default=5,
                    help="timed calls per process after a warm-up; each process reports "
                         "their median (5)")
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "flashmap-bench",
                    help="llama.cpp build, venv, model folder and GGUFs (~/.cache/flashmap-bench)")
    ap.add_argument("--flashmap", type=Path, default=REPO / "build" / "flashmap",
                    help="the flashmap binary (build/flashmap)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                    help="parallel jobs for the llama.cpp build")
    ap.add_argument("--no-amx", action="store_true",
                    help="build llama.cpp natively but without AMX tiles (for CPUs, some VMs, "
                         "that report AMX and fault on it; flashmap uses no AMX either)")
    ap.add_argument("--no-llama-bench", action="store_true",
                    help="skip llama-bench's own decode figure (a cross-check of the timer)")
    ap.add_argument("--max-interference", type=float, default=0.10,
                    help="share of the CPUs other processes may take during a timed run; a run "
                         "past it is repeated (0.10)")
    ap.add_argument("--retries", type=int, default=2,
                    help="repeats of a run disturbed past --max-interference (2)")
    ap.add_argument("--quiet-wait", type=int, default=60,
                    help="seconds to wait, before each run, for a quiet second (60)")
    ap.add_argument("--weights", type=weights_list, default="bf16,q8",
                    help="which weights to time, comma-separated: bf16 (llama.cpp's bf16 GGUF), "
                         "q8 (its Q8_0; flashmap --weights q8), q4km (its Q4_K_M, which flashmap "
                         "reads as it is with --weights q4; DFlash drafter Q4_0) (bf16,q8)")
    ap.add_argument("--no-dflash", action="store_true",
                    help="at qwen3-8b, skip the DFlash rounds (a random drafter of "
                         "z-lab/Qwen3-8B-DFlash-b16's shape in both engines)")
    ap.add_argument("--round-tokens", type=int, default=32,
                    help="tokens the longer of each engine's two DFlash requests adds: the "
                         "rounds timed (about as many at random weights' τ near 1; 32)")
    ap.add_argument("--converter-python", type=Path,
                    help="a Python with torch and the converter's requirements, instead of the "
                         "venv the script makes in the cache folder")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    ap.add_argument("--_make-model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_seed", type=int, default=MODEL_SEED, help=argparse.SUPPRESS)
    ap.add_argument("--_dflash", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._make_model:
        make_model(args._make_model, args._seed, args.shape, args._dflash)
        return
    for name in ("threads", "context", "reps", "inner_reps", "jobs", "round_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.retries < 0 or args.quiet_wait < 0 or not 0 <= args.max_interference <= 1:
        ap.error("--retries and --quiet-wait must be >= 0, --max-interference in [0, 1]")
    if args.context + VERIFY_ROWS + 64 > SHAPES[args.shape]["max_position_embeddings"]:
        ap.error(f"--context {args.context} exceeds what {args.shape} holds")
    args.flashmap = args.flashmap.resolve()
    if not (args.flashmap.is_file() and os.access(args.flashmap, os.X_OK)):
        ap.error(f"--flashmap {args.flashmap}: no such executable (build it: cmake --build build "
                 "--target flashmap)")
    for tool in ("cmake", "lscpu"):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed")

    cache = args.cache_dir.expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    t_setup = time.time()
    llama = ensure_sources(cache)
    tools = ensure_build(cache, llama, args.jobs, args.no_amx)
    py = args.converter_python or ensure_venv(cache, llama)
    model_dir = ensure_model(cache, py, args.shape)
    modes = args.weights
    gguf = ensure_gguf(cache, py, llama, tools, model_dir, modes)
    # What flashmap reads for each mode: the folder, or llama.cpp's own file.
    fm_target = {w: gguf[w] if WEIGHTS[w].get("flashmap_reads_gguf") else model_dir
                 for w in modes}
    draft_shape = DRAFT_MODEL.get(args.shape)
    draft_gguf = None
    if draft_shape:
        draft_dir = ensure_model(cache, py, draft_shape)
        draft_gguf = ensure_gguf(cache, py, llama, tools, draft_dir, modes)
    dflash_dir = dflash_gguf = None
    if args.shape in DFLASH and not args.no_dflash:
        dflash_dir = ensure_model(cache, py, args.shape, dflash=True)
        dflash_gguf = ensure_gguf(cache, py, llama, tools, dflash_dir, modes, kind="dflash",
                                  target_dir=model_dir)
    log(f"setup done in {time.time() - t_setup:.0f} s")
    if args.setup_only:
        return
    log(f"timing {args.reps} interleaved rounds")

    commit = capture(["git", "-C", REPO, "rev-parse", "HEAD"])[1].strip()
    load_before = os.getloadavg()
    # runs[engine][weights][round]: {"decode_ms", "verify_ms", "interference"}, or None (not run)
    engines = (("flashmap", "llama.cpp") + (("llama.cpp round",) if draft_shape else ())
               + (("flashmap dflash", "llama.cpp dflash") if dflash_dir else ()))
    runs = {e: {w: [] for w in modes} for e in engines}
    fm_dtype = {}
    llama_version = None
    for r in range(args.reps):
        for w in modes:
            f = timed(args, f"flashmap {w}", lambda: flashmap_once(args, fm_target[w], w))
            fm_dtype[w] = f["lm_head_dtype"]
            runs["flashmap"][w].append(f)
            l = timed(args, f"llama.cpp {w}", lambda: llama_once(args, tools, gguf[w]))
            llama_version = l["llama_version"]
            runs["llama.cpp"][w].append(l)
            if draft_shape:
                # llama.cpp's speculative round with a draft model: the draft model decodes
                # its 16 drafts one by one, then the target verifies them (and the bonus row).
                d = timed(args, f"llama.cpp {draft_shape} draft {w}",
                          lambda: llama_once(args, tools, draft_gguf[w], verify=False))
                runs["llama.cpp round"][w].append({
                    "draft_decode_ms": d["decode_ms"], "drafts_ms": DRAFTS * d["decode_ms"],
                    "verify_ms": l["verify_ms"], "decode_ms": l["decode_ms"],
                    "round_ms": DRAFTS * d["decode_ms"] + l["verify_ms"],
                    "interference": max(d["interference"], l["interference"])})
            if dflash_dir:
                fd = timed(args, f"flashmap DFlash round {w}",
                           lambda: flashmap_dflash_round(args, fm_target[w], dflash_dir, w))
                ld = timed(args, f"llama.cpp DFlash round {w}",
                           lambda: llama_dflash_round(args, tools, gguf[w], dflash_gguf[w]))
                runs["flashmap dflash"][w].append(fd)
                runs["llama.cpp dflash"][w].append(ld)
                log(f"round {r + 1}/{args.reps} {w}: DFlash round flashmap "
                    f"{fmt_ms(fd and fd['round_ms'])} ms (draft "
                    f"{fmt_ms(fd and fd['draft_ms'])}, verify {fmt_ms(fd and fd['verify_ms'])}), "
                    f"llama.cpp {ld['round_ms']:.2f} ms ({ld['drafts_per_round']:.1f} drafts a "
                    "round)")
            log(f"round {r + 1}/{args.reps} {w}: flashmap "
                f"{fmt_ms(f and f['decode_ms'])} / {fmt_ms(f and f['verify_ms'])} ms, llama.cpp "
                f"{l['decode_ms']:.2f} / {l['verify_ms']:.2f} ms (decode / verify-{VERIFY_ROWS})"
                + "".join(f"; {n} disturbed ({100 * x['interference']:.0f}%)"
                          for n, x in (("flashmap", f), ("llama.cpp", l))
                          if x and x["interference"] > args.max_interference))
    for w, dtype in fm_dtype.items():
        if WEIGHTS[w]["flashmap"] and dtype in ("BF16", "F16", "F32"):
            log(f"warning: flashmap accepted {' '.join(WEIGHTS[w]['flashmap'])} but its lm_head "
                f"is {dtype}")
    load_after = os.getloadavg()
    interference = [x["interference"] for e in runs.values() for w in e.values() for x in w if x]

    tg = {}
    if not args.no_llama_bench:
        for w in modes:
            tg[w] = timed(args, f"llama-bench {w}",
                          lambda: {"ms": llama_bench_tg(args, tools, gguf[w])})["ms"]

    def clean(x):
        return x is not None and x["interference"] <= args.max_interference

    disturbed = set()  # figures that had to use disturbed runs

    def values(e, w, fn):
        """fn of each round's run, over the runs other processes left alone (all runs, and the
        figure marked, when none was)."""
        xs = [x for x in runs[e][w] if clean(x)]
        if not xs and any(runs[e][w]):
            xs = [x for x in runs[e][w] if x]
            disturbed.add(w)
        return [fn(x) for x in xs]

    def ratios(w, fn, a="flashmap", b="llama.cpp"):
        """fn(a's run) / fn(b's run) of each round, over the rounds where both were left alone
        (all rounds with both, and the figure marked, when none was)."""
        both = list(zip(runs[a][w], runs[b][w]))
        pairs = [(a, b) for a, b in both if clean(a) and clean(b)]
        if not pairs and any(a and b for a, b in both):
            pairs = [(a, b) for a, b in both if a and b]
            disturbed.add(w)
        return [fn(a) / fn(b) for a, b in pairs if fn(b)]

    cpu = cpu_model()
    rows = []
    figures = (("decode", "decode_ms", lambda x: x["decode_ms"]),
               (f"verify-{VERIFY_ROWS}", "verify_ms", lambda x: x["verify_ms"]),
               (f"verify-{VERIFY_ROWS} / decode", None,
                lambda x: x["verify_ms"] / x["decode_ms"]))
    for w in modes:
        wl = WEIGHTS[w]["label"]
        for label, key, fn in figures:
            fm, ll, ratio = values("flashmap", w, fn), values("llama.cpp", w, fn), ratios(w, fn)
            rows.append({"figure": f"{label}, {wl}" + ("" if key else " (x, not ms)")
                         + (" *" if w in disturbed else ""),
                         "flashmap_ms": med(fm), "llama_cpp_ms": med(ll),
                         "ratio": med(ratio), "disturbed": w in disturbed,
                         "flashmap_runs_used": len(fm), "llama_cpp_runs_used": len(ll)})

    def used(e, w):
        return f"{sum(clean(x) for x in runs[e][w])}/{sum(x is not None for x in runs[e][w])}"

    print(f"# flashmap vs llama.cpp, {args.shape} shape, random weights\n")
    print(f"CPU: {cpu}; threads: {args.threads}; flashmap --compute {args.compute} (bf16 rows); "
          f"context: {args.context}; "
          f"{args.reps} interleaved rounds x {args.inner_reps} calls")
    print(f"llama.cpp: llama-cpp-python {LLAMA_CPP_PYTHON} sdist (llama_version "
          f"{llama_version}), via the C API; flashmap: {args.flashmap} (repo at {commit[:12]})")
    print(f"other processes' share of the {os.cpu_count()} CPUs during the timed runs: median "
          f"{100 * med(interference):.0f}%, max {100 * max(interference):.0f}%; runs left "
          f"alone (<= {100 * args.max_interference:.0f}%): "
          + ", ".join(f"{e} {w} {used(e, w)}" for e in runs for w in runs[e]
                      if any(runs[e][w])) + "\n")
    print("| figure | flashmap ms | llama.cpp ms | ratio (flashmap/llama.cpp) |")
    print("|---|---|---|---|")
    for x in rows:
        print(f"| {x['figure']} | {fmt_ms(x['flashmap_ms'])} | {fmt_ms(x['llama_cpp_ms'])} | "
              f"{'n/a' if x['ratio'] is None else format(x['ratio'], '.2f')} |")
    print("\nms: median, over the rounds left alone, of each process's median; ratio: median of "
          "the round's flashmap/llama.cpp over the rounds where both runs were left alone")
    if disturbed:
        print("* WARNING: no run of these figures was left alone by other processes: they come "
              "from disturbed runs and compare nothing (run again on a quieter machine)")
    rounds = round_tables(args, runs, values, draft_shape, modes) if draft_shape else None
    dflash_rounds = dflash_table(runs, values, ratios, modes) if dflash_dir else None
    if tg:
        print("llama-bench cross-check (one run after the rounds), tg16 at depth {}: {}".format(
            args.context, ", ".join(f"{w} {fmt_ms(v)} ms/token" for w, v in tg.items())))

    if args.json:
        args.json.write_text(json.dumps({
            "cpu": cpu, "threads": args.threads, "compute": args.compute, "context": args.context,
            "reps": args.reps,
            "inner_reps": args.inner_reps, "verify_rows": VERIFY_ROWS,
            "llama_cpp_python": LLAMA_CPP_PYTHON, "llama_version": llama_version,
            "flashmap": str(args.flashmap), "flashmap_commit": commit,
            "model_dir": str(model_dir), "gguf": {k: str(v) for k, v in gguf.items()},
            "load_average_before": load_before, "load_average_after": load_after,
            "interference": interference, "max_interference": args.max_interference,
            "table": rows, "runs": runs,
            "flashmap_lm_head_dtype": fm_dtype, "llama_bench_tg_ms": tg,
            "shape": args.shape, "draft_model_shape": draft_shape, "rounds": rounds,
            "dflash_rounds": dflash_rounds,
            "dflash_gguf": {k: str(v) for k, v in dflash_gguf.items()} if dflash_gguf else None,
            "draft_gguf": {k: str(v) for k, v in draft_gguf.items()} if draft_gguf else None,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
