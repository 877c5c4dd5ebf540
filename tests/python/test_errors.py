"""Bad input: exceptions with the engine's one-line messages, never a crash."""
import numpy as np
import pytest

import flashmap_engine as fe
from conftest import PAIRS, TINY_A


@pytest.mark.parametrize("ids,exc,match", [
    (np.array([1.0, 2.0]), TypeError, "expected integer ids"),
    (np.array([True, False]), TypeError, "expected integer ids"),
    (np.zeros((2, 3), dtype=np.int64), ValueError, r"shape \(n,\) or \(1, n\), got \(2, 3\)"),
    (np.zeros((1, 1, 3), dtype=np.int64), ValueError, r"got \(1, 1, 3\)"),
    (np.int64(5), ValueError, r"got \(\)"),
    ([1, "2"], TypeError, r"input_ids\[1\]: expected an int, got str"),
    ([1, 2.0], TypeError, r"input_ids\[1\]: expected an int, got float"),
    ([1, True], TypeError, r"input_ids\[1\]: expected an int, got bool"),
    ([1, -3], ValueError, r"input_ids\[1\] = -3 is not a token id"),
    ([1, 2 ** 40], ValueError, r"input_ids\[1\] = \d+ is not a token id"),
    ([1, 2 ** 80], ValueError, r"input_ids\[1\] is not a token id"),
    (np.array([1, -1], dtype=np.int8), ValueError, r"input_ids\[1\] = -1 is not a token id"),
    (np.array([1, 2 ** 63], dtype=np.uint64), ValueError, r"input_ids\[1\] = 9223372036854775808 is"),
    ("1,2,3", TypeError, "got str"),
    (b"\x01\x02", TypeError, "got bytes"),
    ({1, 2}, TypeError, "got set"),
    (None, TypeError, "got NoneType"),
])
def test_bad_input_ids(engines, ids, exc, match):
    e = engines("tiny-a")
    with pytest.raises(exc, match=match):
        e.generate(ids, 4)


def one_line(excinfo):
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("kwargs,match", [
    (dict(input_ids=[1, 5000]), r"prompt token 5000 \(at index 1\) is outside the vocabulary"),
    (dict(input_ids=[]), "empty"),
    (dict(max_new_tokens=0), "must be > 0"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(min_p=2.0), "min_p"),
    (dict(top_k=-1), "top_k"),
    (dict(seed=-1), "seed must be >= 0"),
    (dict(stop_token_ids=[1, 99999]), "99999"),
])
def test_engine_refuses(engines, kwargs, match):
    e = engines("tiny-a")
    args = dict(input_ids=[1, 2, 3], max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(fe.Error, match=match) as ei:
        e.generate(**args)
    one_line(ei)
    assert isinstance(ei.value, ValueError)


def test_bad_stop_ids_type(engines):
    with pytest.raises(TypeError, match=r"stop_token_ids\[0\]: expected an int"):
        engines("tiny-a").generate([1, 2], 4, stop_token_ids=["x"])


def test_wrong_argument_types(engines):
    e = engines("tiny-a")
    with pytest.raises(TypeError):
        e.generate([1, 2], "4")
    with pytest.raises(TypeError):
        e.generate([1, 2], 4, temperature="hot")
    with pytest.raises(TypeError):
        fe.Engine(123)


@pytest.mark.parametrize("args,kwargs,match", [
    (("no-such-dir",), {}, "no-such-dir/config.json: cannot open"),
    ((str(TINY_A / "target"), str(TINY_A / "draft")), dict(steps=5), "steps must be one of 1, 2, 3, 4"),
    ((str(TINY_A / "target"),), dict(steps=2), "steps needs a drafter"),
    ((str(TINY_A / "target"),), dict(device="gpu"), "expected cpu, cuda or cuda:N, got 'gpu'"),
    ((str(PAIRS["default"] / "target"), str(TINY_A / "draft")), {}, "needs a target with"),
])
def test_load_errors(args, kwargs, match):
    with pytest.raises(fe.Error, match=match) as ei:
        fe.Engine(*args, **kwargs)
    one_line(ei)


def test_closed_engine():
    e = fe.Engine(str(TINY_A / "target"), str(TINY_A / "draft"))
    assert e.generate([1, 2], 4).ids.shape == (4,)
    with e:
        pass  # leaving the block closes it
    assert e.closed
    for call in (lambda: e.generate([1, 2], 4), lambda: e.stream([1, 2], 4),
                 lambda: e.device, lambda: e.block_size):
        with pytest.raises(RuntimeError, match="the engine is closed"):
            call()
    e.close()  # twice is fine


def test_spec_generate_arguments(engines):
    e = engines("tiny-a")
    with pytest.raises(ValueError, match="one sequence at a time"):
        fe.spec_generate(e, np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="steps=2"):
        fe.spec_generate(e, [[1, 2, 3]], num_steps=2)
