#!/usr/bin/env python3
"""tools/train/jump_grids.py reproduces the seed's DEFAULT_JUMP_GRIDS (flashmap 0.1.0,
configuration_flashmap.py) to 1e-6 at V = 151936. Pure Python: needs no third-party package."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
import jump_grids  # noqa: E402

SEED = {
    "1": [0.0, 1.0],
    "2": [0.0, 0.8172569274902344, 1.0],
    "3": [0.0, 0.8010796308517456, 0.8310279846191406, 1.0],
    "4": [0.0, 0.7906050682067871, 0.8172569274902344, 0.8379518389701843, 1.0],
}


def main():
    fails = 0
    for as_f32 in (True, False):
        grids = jump_grids.jump_grids(151936, 4, as_float32=as_f32)
        for n, ref in SEED.items():
            got = grids[n]
            err = max(abs(a - b) for a, b in zip(got, ref)) if len(got) == len(ref) else float("inf")
            print(f"steps {n} float32={as_f32}: max |diff| {err:.2e}")
            if err > 1e-6 or got[0] != 0.0 or got[-1] != 1.0:
                fails += 1
    # monotone in vocabulary: a smaller vocabulary decodes earlier
    small = jump_grids.jump_grids(2048, 4)
    if not all(a < b for a, b in zip(small["4"], small["4"][1:])) or small["2"][1] >= SEED["2"][1]:
        print("grid at V=2048 not increasing or not below V=151936's")
        fails += 1
    # tau is 0 at t = 0 and 1 at t = 1, and tau(tau^-1(u)) = u
    for u in (0.1, 0.5, 0.9):
        if abs(jump_grids.tau(jump_grids.tau_inverse(u, 151936), 151936) - u) > 1e-9:
            fails += 1
    print("FAILED" if fails else "ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
