"""Several Python threads at once, the GIL released while decoding, and threads=."""
import os
import subprocess
import sys
import threading
import time

import pytest

import flashmap_engine
from conftest import PAIRS


def test_concurrent_generate_from_threads(engines):
    a, b = engines("default"), engines("tiny-a")
    jobs = [(a if i % 2 else b, [i + 1, i + 7, i + 9, 3]) for i in range(12)]
    want = [e.generate(p, 24, stop_token_ids=[]).ids.tolist() for e, p in jobs]
    got, errors = [None] * len(jobs), []

    def work(i):
        try:
            e, p = jobs[i]
            got[i] = e.generate(p, 24, stop_token_ids=[]).ids.tolist()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and got == want


def test_gil_released_while_decoding(engines):
    e = engines("default")
    ticks = 0
    done = threading.Event()

    def spin():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    e.generate([1, 2, 3], 400, stop_token_ids=[])
    before = ticks
    done.set()
    t.join()
    assert before > 5  # the other thread ran while generate() was decoding


def test_close_while_another_thread_decodes():
    e = flashmap_engine.Engine(str(PAIRS["default"] / "target"), str(PAIRS["default"] / "draft"))
    out = {}
    t = threading.Thread(target=lambda: out.update(r=e.generate([1, 2], 300, stop_token_ids=[])))
    t.start()
    time.sleep(0.05)
    e.close()
    t.join(120)
    assert out["r"].ids.shape == (300,)  # the running call kept the models until it ended
    with pytest.raises(RuntimeError, match="closed"):
        e.generate([1, 2], 4)


def run_py(code):
    env = dict(os.environ)
    env.pop("FLASHMAP_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_threads_argument():
    # The pool is per process and made once: each case runs in a process of its own.
    pair = PAIRS["default"]
    code = f"""
import flashmap_engine as fe
e = fe.Engine({str(pair / 'target')!r}, {str(pair / 'draft')!r}, threads={{n}})
print(fe.cpu_threads())
print(e.generate([4, 5, 6, 7], 40, stop_token_ids=[]).ids.tolist())
try:
    fe.Engine({str(pair / 'target')!r}, threads={{n}} + 1)
except fe.Error as exc:
    print("refused:", exc)
"""
    one = run_py(code.format(n=1))
    two = run_py(code.format(n=2))
    assert one[0] == "1" and two[0] == "2"
    assert one[1] == two[1]  # the CPU path gives the same bits with any thread count
    assert "already runs 1 threads" in one[2] and "already runs 2 threads" in two[2]


def test_threads_out_of_range():
    with pytest.raises(ValueError, match="threads must be in"):
        flashmap_engine.Engine(str(PAIRS["default"] / "target"), threads=0)
