#!/usr/bin/env python3
"""Fits the polynomials behind ops::gelu's erf and ops::silu's e^x (src/ops/cpu_ops.cpp).

Least squares on Chebyshev nodes in float64, coefficients rounded to float32, then the float32
evaluation checked against math.erf / numpy.exp over a dense sweep. Prints the tables kErf and
kExp. Needs numpy only:  python3 tools/fit_activations.py
"""
from math import erf

import numpy as np

verf = np.vectorize(erf)
f32 = np.float32


def cheb(a, b, n=600):
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos(np.pi * (k + 0.5) / n)


def fit(t, y, degree):
    A = np.vstack([t**i for i in range(degree + 1)]).T
    return np.linalg.lstsq(A, y, rcond=None)[0].astype(np.float32)


def horner(c, t):
    p = np.full_like(t, c[-1])
    for cj in c[-2::-1]:
        p = (p * t + cj).astype(np.float32)
    return p


# erf on [0, 4): u·P(u²) on [0, 1), P(u − centre) on [1, 2), [2, 3), [3, 4); degree 8.
D = 8
z = cheb(1e-4, 1.0)
k_erf = [fit(z * z, verf(z) / z, D)]
for a in (1, 2, 3):
    z = cheb(a, a + 1)
    k_erf.append(fit(z - (a + 0.5), verf(z), D))

us = np.concatenate([np.linspace(0, 4.5, 90001), 10.0 ** np.linspace(-30, 0, 2001)]).astype(f32)
piece = np.minimum(us.astype(np.int64), 3)
got = np.empty_like(us)
for r in range(4):
    sel = piece == r
    u = us[sel]
    t = (u * u).astype(f32) if r == 0 else (u - f32(r + 0.5)).astype(f32)
    p = horner(k_erf[r], t)
    got[sel] = (u * p).astype(f32) if r == 0 else p
got[us >= 4] = 1
want = verf(us.astype(np.float64))
print(f"erf: max abs error {np.max(np.abs(got - want)):.3g}")
print("kErf = {")
for c in k_erf:
    print("    {" + ", ".join(f"{x:.9e}f" for x in c) + "},")
print("}")

# e^r on |r| ≤ ln 2 / 2, degree 6; e^t = e^r · 2^n with t = n·ln2_hi + n·ln2_lo + r.
r = (np.log(2) / 2) * np.cos(np.pi * (np.arange(800) + 0.5) / 800)
k_exp = fit(r, np.exp(r), 6)
ts = np.linspace(-86, 88.7, 400001).astype(f32)
n = np.rint(ts * f32(1.44269504)).astype(f32)
rr = ((ts - n * f32(0.693359375)).astype(f32) - n * f32(-2.12194440e-4)).astype(f32)
got = (horner(k_exp, rr).astype(np.float64) * np.exp2(n.astype(np.float64))).astype(f32)
want = np.exp(ts.astype(np.float64))
ulps = np.abs(got - want) / np.spacing(want.astype(f32)).astype(np.float64)
print(f"exp: max error {ulps.max():.3g} units in the last place")
print("kExp = {" + ", ".join(f"{x:.9e}f" for x in k_exp) + "}")
