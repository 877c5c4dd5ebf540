#!/usr/bin/env python3
"""Jump grids of the "decoding error" time schedule (Flow Map Language Models, eq. 25).

On the path x_t = (1 - t) eps + t onehot(y), eps ~ N(0, I_V), the probability that argmax x_t
is the right token is

    q_V(t) = integral phi(z) Phi(z + t / (1 - t))^(V - 1) dz,

and tau(t) = (V q_V(t) - 1) / (V - 1) rescales it to [0, 1]. An n-step grid is
t_i = tau^-1(i / n), with the endpoints exactly 0 and 1. Pure Python (math only), so that it
runs wherever the tests run:

    python3 tools/train/jump_grids.py --vocab 2048 --max-steps 4
"""

import argparse
import json
import math

_NODES = None


def _nodes(lo=-9.0, hi=9.0, n=4000):
    """Composite Simpson nodes and weights (times phi) on [lo, hi]."""
    global _NODES
    if _NODES is None:
        h = (hi - lo) / n
        pts = []
        for i in range(n + 1):
            z = lo + i * h
            w = (1 if i in (0, n) else 4 if i % 2 else 2) * h / 3
            pts.append((z, w * math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)))
        _NODES = pts
    return _NODES


def q_V(t, V):
    """P(argmax x_t = y) for vocabulary size V."""
    if t <= 0:
        return 1.0 / V
    if t >= 1:
        return 1.0
    a = t / (1.0 - t)
    total = 0.0
    for z, w in _nodes():
        # log Phi(z + a), with erfc for accuracy in the tail
        phi_cdf = 0.5 * math.erfc(-(z + a) / math.sqrt(2.0))
        if phi_cdf <= 0.0:
            continue
        total += w * math.exp((V - 1) * math.log(phi_cdf))
    return total


def tau(t, V):
    return (V * q_V(t, V) - 1.0) / (V - 1.0)


def tau_inverse(u, V, tol=1e-12):
    """t with tau(t) = u (tau is increasing); bisection."""
    if u <= 0:
        return 0.0
    if u >= 1:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if tau(mid, V) < u:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def float32(x):
    import struct
    return struct.unpack("f", struct.pack("f", x))[0]


def jump_grids(V, max_steps=4, as_float32=True):
    """{"n": [0, t_1, ..., 1]} for n = 1..max_steps, interior times rounded to float32 (as the
    seed's DEFAULT_JUMP_GRIDS are) unless as_float32 is False."""
    cache = {}
    grids = {}
    for n in range(1, max_steps + 1):
        grid = [0.0]
        for i in range(1, n):
            key = (i / n)
            if key not in cache:
                cache[key] = tau_inverse(key, V)
            grid.append(float32(cache[key]) if as_float32 else cache[key])
        grid.append(1.0)
        grids[str(n)] = grid
    return grids


def tau_table(V, size=512):
    """(u_i, t_i) with t_i = tau^-1(u_i) at u_i = i / size; the trainer interpolates it."""
    return [i / size for i in range(size + 1)], [tau_inverse(i / size, V, tol=1e-9) for i in range(size + 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--max-steps", type=int, default=4)
    args = ap.parse_args()
    print(json.dumps(jump_grids(args.vocab, args.max_steps), indent=2))


if __name__ == "__main__":
    main()
