"""draft_dir="ngram": the n-gram (prompt-lookup) drafter through the Python module. Greedy and
seeded output equal the target alone's (the C++ tests check the sampling law); bad options raise
the engine's one-line errors naming the option."""
import pytest

import flashmap_engine as fe
from conftest import TINY_A

PROMPT = [3, 141, 59, 265, 358, 979]  # tiny-a continues it with runs and loops


@pytest.fixture(scope="module")
def alone():
    return fe.Engine(str(TINY_A / "target"))


def test_greedy_and_seeded_equal_the_target_alone(alone):
    e = fe.Engine(str(TINY_A / "target"), "ngram", ngram_min=2, ngram_max=5, ngram_block=6)
    assert e.block_size == 6
    assert e.draft_dir == "ngram"
    want = alone.generate(PROMPT, 60).ids.tolist()
    got = e.generate(PROMPT, 60)
    assert got.ids.tolist() == want
    assert got.acceptance_length > 1.0  # the target's output loops: lookup drafts it
    for seed in (1, 2):
        kw = dict(temperature=0.8, top_p=0.9, seed=seed)
        want = alone.generate(PROMPT, 40, **kw).ids.tolist()
        assert e.generate(PROMPT, 40, **kw).ids.tolist() == want


@pytest.mark.parametrize("kwargs,match", [
    (dict(ngram_min=5, ngram_max=4), r"--ngram-min 5 is above --ngram-max 4"),
    (dict(ngram_min=0), r"--ngram-min 0: must be in \[1, 32\]"),
    (dict(ngram_max=10 ** 6), r"--ngram-max 1000000: must be in \[1, 32\]"),
    (dict(ngram_block=0), r"--ngram-block 0: must be in \[1, 64\]"),
    (dict(device="cuda"), r"--draft ngram runs on the CPU backend only"),
    (dict(steps=2), r"--steps applies to FlashMap drafters"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(fe.Error, match=match) as ei:
        fe.Engine(str(TINY_A / "target"), "ngram", **kwargs)
    assert "\n" not in str(ei.value)


def test_options_without_the_drafter():
    with pytest.raises(fe.Error, match="--ngram-max needs --draft ngram"):
        fe.Engine(str(TINY_A / "target"), str(TINY_A / "draft"), ngram_max=3)
