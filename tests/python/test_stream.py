"""Engine.stream: the tokens of each round as they are accepted, and early exits."""
import threading
import time

import pytest


def test_stream_equals_generate(engines):
    e = engines("default")
    prompt = [3, 17, 42, 99, 5]
    # The same seed: the drafter's noise, hence the acceptance lengths, come from it.
    want = e.generate(prompt, 60, stop_token_ids=[], seed=3)
    s = e.stream(prompt, 60, stop_token_ids=[], seed=3)
    assert s.result is None
    chunks = list(s)
    assert [t for c in chunks for t in c] == want.ids.tolist()
    # The prefill's token first, then one chunk per verify round: its committed tokens (the last
    # one cut at max_new_tokens).
    assert chunks[0] == want.ids.tolist()[:1]
    lens = [len(c) for c in chunks[1:]]
    assert lens[:-1] == want.acceptance_lengths.tolist()[:-1]
    assert lens[-1] <= want.acceptance_lengths[-1]
    r = s.result
    assert r.ids.tolist() == want.ids.tolist() and r.finish_reason == "length"
    assert r.acceptance_lengths.tolist() == want.acceptance_lengths.tolist()


def test_break_cancels_and_engine_stays_usable(engines):
    e = engines("default")
    t0 = time.perf_counter()
    for chunk in e.stream([1, 2, 3], 4000, stop_token_ids=[]):
        break  # the iterator is dropped here: its request is cancelled between rounds
    assert time.perf_counter() - t0 < 30
    assert e.generate([1, 2, 3], 8, stop_token_ids=[]).ids.shape == (8,)


def test_close_and_context_manager(engines):
    e = engines("default")
    with e.stream([1, 2, 3], 4000, stop_token_ids=[]) as s:
        next(s)
    with pytest.raises(StopIteration):
        while True:
            next(s)
    assert s.result is not None and s.result.finish_reason == "cancelled"
    s.close()  # twice is fine


def test_stream_bad_input_raises_at_call(engines):
    e = engines("tiny-a")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        e.stream([1, 5000], 4)


def test_streams_from_threads(engines):
    e = engines("default")
    prompts = [[i + 1, i + 2, i + 3] for i in range(6)]
    want = [e.generate(p, 30, stop_token_ids=[]).ids.tolist() for p in prompts]
    got = [None] * len(prompts)

    def work(i):
        got[i] = [t for c in e.stream(prompts[i], 30, stop_token_ids=[]) for t in c]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want


def test_stream_dropped_before_it_starts(engines):
    # Another thread holds the engine: a stream closed while it waits never starts decoding.
    e = engines("default")
    t = threading.Thread(target=lambda: e.generate([1, 2], 1500, stop_token_ids=[]))
    t.start()
    time.sleep(0.1)
    s = e.stream([1, 2, 3], 50, stop_token_ids=[])
    s.close()
    t.join(120)
    with pytest.raises(StopIteration):
        next(s)
    assert s.result is None or s.result.finish_reason == "cancelled"  # None: it never started
