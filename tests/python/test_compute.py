"""weights= and compute= through the Python module: the bf16 compute mode (AVX512-BF16 dot
products) decodes what the CLI's --compute bf16 decodes and, with a drafter, what its own target
alone decodes (the C++ tests check its sampling law); bad values raise the engine's one-line
errors naming the option."""
import pytest

import flashmap_engine as fe
from conftest import DEFAULT

PROMPT = [3, 141, 59, 265, 358, 979]


def bf16_engine(*args, **kwargs):
    try:
        return fe.Engine(*args, compute="bf16", **kwargs)
    except fe.Error as e:
        if "AVX512-BF16" in str(e):
            pytest.skip("this CPU has no AVX512-BF16")
        raise


def test_bf16_compute_matches_the_cli_and_its_own_target(cli):
    alone = bf16_engine(str(DEFAULT / "target"))
    spec = bf16_engine(str(DEFAULT / "target"), str(DEFAULT / "draft"))
    # No stop ids: the pair's eos would end some continuations after a few tokens.
    want = alone.generate(PROMPT, 40, stop_token_ids=[]).ids.tolist()
    got = spec.generate(PROMPT, 40, stop_token_ids=[])
    assert got.ids.tolist() == want and len(want) == 40
    assert got.acceptance_length > 1.0
    out = cli.generate(DEFAULT, PROMPT, 40, "--no-draft", "--compute", "bf16", "--stop-ids", "none")
    assert out["ids"] == want
    for seed in (1, 2):
        kw = dict(temperature=0.9, top_p=0.95, seed=seed, stop_token_ids=[])
        assert (spec.generate(PROMPT, 30, **kw).ids.tolist()
                == alone.generate(PROMPT, 30, **kw).ids.tolist())


@pytest.mark.parametrize("kwargs,match", [
    (dict(compute="fp16"), r"--compute: unknown compute mode 'fp16'"),
    (dict(weights="q2"), r"--weights: unknown weight format 'q2'"),
    (dict(weights="q4", compute="bf16"), r"--compute bf16 with --weights q4"),
    (dict(compute="bf16", device="cuda"), r"--compute bf16: a CPU option"),
])
def test_bad_values(kwargs, match):
    with pytest.raises(fe.Error, match=match) as ei:
        fe.Engine(str(DEFAULT / "target"), **kwargs)
    assert "\n" not in str(ei.value)
