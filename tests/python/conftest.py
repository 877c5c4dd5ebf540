"""Shared fixtures of the Python package's tests (pytest -q tests/python after pip install .).

The independent references: the `flashmap` CLI built from this repository (FLASHMAP_CLI, else
build/flashmap; tests that need it skip without it) and, where it is installed, the reference
package flashmap==0.1.0 on torch (test_reference.py skips without it)."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY_A = ROOT / "tests" / "fixtures" / "tiny-a"
DEFAULT = ROOT / "models" / "default"
PAIRS = {"tiny-a": TINY_A, "default": DEFAULT}


def cli_path():
    p = os.environ.get("FLASHMAP_CLI") or str(ROOT / "build" / "flashmap")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


@pytest.fixture(scope="session")
def cli():
    p = cli_path()
    if p is None:
        pytest.skip("no flashmap CLI (build it: cmake --build build, or set FLASHMAP_CLI)")

    def run(*args, threads=None):
        cmd = [p, *map(str, args)]
        if threads:
            cmd += ["--threads", str(threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def generate(pair, prompt, max_new_tokens, *extra):
        args = ["generate", "--target", pair / "target", "--prompt-ids", ",".join(map(str, prompt)),
                "--max-new-tokens", max_new_tokens, "--json", *extra]
        if "--no-draft" not in extra:
            args[3:3] = ["--draft", pair / "draft"]
        return json.loads(run(*args))

    run.generate = generate
    return run


@pytest.fixture(scope="session")
def engines():
    """One engine per pair for the whole session (loading packs the weights)."""
    from flashmap_engine import Engine

    made = {}

    def get(name, draft=True, steps=None):
        key = (name, draft, steps)
        if key not in made:
            pair = PAIRS[name]
            made[key] = Engine(str(pair / "target"), str(pair / "draft") if draft else None,
                               steps=steps)
        return made[key]

    return get
