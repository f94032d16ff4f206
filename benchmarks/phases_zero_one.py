"""Per-phase timer of the binary 0/1 certificate (no cProfile: its per-call overhead distorts
the many small NumPy calls of the blockwise passes).

Every phase is a function of the 0/1 path wrapped for the run (time exclusive of the phases it
calls, calls, rows read); the rows passed through ``RowPrices._dstar`` (the prices computed
from the scores) are counted in n-vectors ("passes"), the sorted arrays by size, and a second
run under tracemalloc gives each top-level phase's peak above the memory at its start (and
that memory: their sum is the phase's peak).
Baseline: ``X @ coef`` + ``np.sort`` of the n scores, measured in the same process::

    PYTHONPATH=. python benchmarks/phases_zero_one.py [--n 1e6] [--reps 3] \\
        [--points near-kl,max-inf,...] [--input float64|float32|frame]

Points: ``{base,mid,max}-{kl,chi2,inf}`` (r = base + t (1 - base), t = 0.01, 0.5, 0.95),
``mid-kl-w`` (sample weights). The table goes to stdout.
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import time
import tracemalloc
from collections import defaultdict

import numpy as np

import otstab
from otstab.modeling import _models
from otstab.solve import _core
from otstab.solve import _zero_one as zo

T_POINTS = {"base": 0.01, "mid": 0.5, "max": 0.95}
PRICES = {"kl": ("kl", 0.25), "chi2": ("chi2", 0.25), "inf": ("kl", math.inf)}

#: (owner, attribute, phase name)
PHASES = [
    (_core, "resolve_model", "resolve"),
    (_models.LinearScorer, "scores_and_fingerprint", "scores+fingerprint"),
    (zo, "misclassified", "misclassified"),
    (zo.RowPrices, "_subsample", "subsample"),
    (zo, "solve_window", "window solve"),
    (zo.RowPrices, "smallest", "smallest"),
    (zo.RowPrices, "sorted", "sort all prices"),
    (zo, "solve_zero_one", "solve_zero_one"),
    (zo, "_weighted_dual", "weighted dual"),
    (zo.RowPrices, "near_weighted", "near_weighted pass"),
    (zo.RowPrices, "near", "near pass"),
    (zo, "_weights", "_weights"),
    (zo, "_move_plan", "move plan"),
    (zo, "_dual_at_h", "dual at h"),
    (zo, "_finish", "finish (audit)"),
    (zo, "_reach", "reach"),
]


class Recorder:
    def __init__(self):
        self.time = defaultdict(float)
        self.calls = defaultdict(int)
        self.stack: list[list] = []
        self.rows = defaultdict(int)
        self.sorted: list[tuple[str, int]] = []
        self.mem: dict[str, float] = defaultdict(float)
        self.start: dict[str, float] = defaultdict(float)
        self.trace = False
        self.peak = 0  # the largest traced peak seen (reset_peak clears tracemalloc's own)

    def wrap(self, name, fn):
        rec = self

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            top = not rec.stack
            if rec.trace and top:
                rec.peak = max(rec.peak, tracemalloc.get_traced_memory()[1])
                tracemalloc.reset_peak()
                m0 = tracemalloc.get_traced_memory()[0]
            rec.stack.append([name, 0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                _, child = rec.stack.pop()
                rec.time[name] += dt - child
                rec.calls[name] += 1
                if rec.stack:
                    rec.stack[-1][1] += dt
                if rec.trace and top:
                    rec.mem[name] = max(rec.mem[name], tracemalloc.get_traced_memory()[1] - m0)
                    rec.start[name] = max(rec.start[name], m0)
        return inner


def _install(rec: Recorder):
    saved = []
    for owner, attr, name in PHASES:
        fn = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        saved.append((owner, attr, fn))
        setattr(owner, attr, rec.wrap(name, fn))
    dstar = zo.RowPrices._dstar

    def counted(self, rows):
        out = dstar(self, rows)
        rec.rows["prices"] += out.size
        return out
    saved.append((zo.RowPrices, "_dstar", dstar))
    zo.RowPrices._dstar = counted
    reduced = zo.NearPoints.reduced

    def counted_reduced(self, rows):
        out = reduced(self, rows)
        rec.rows["reduced"] += np.size(out[0])
        return out
    saved.append((zo.NearPoints, "reduced", reduced))
    zo.NearPoints.reduced = counted_reduced
    window = zo.RowPrices.__dict__["_window"]
    saved.append((zo.RowPrices, "_window", window))

    def window_sizes(self, lo, hi, theta2, **kw):
        out = window(self, lo, hi, theta2, **kw)
        rec.sorted.append(("window", out.size))
        return out
    # (under the timing wrapper installed above)
    zo.RowPrices._window = rec.wrap("window pass+sort", window_sizes)
    return saved


def _restore(saved):
    for owner, attr, fn in saved:
        setattr(owner, attr, fn)


def data(n, d=50, kind="float64"):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d) / np.sqrt(d)
    y = np.where(X @ coef + 0.3 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    base = float(np.mean((X @ coef + 0.1 > 0) != (y > 0)))
    if kind == "float32":
        X = X.astype(np.float32)
    elif kind == "frame":
        import pandas as pd

        X = pd.DataFrame(X, columns=[f"x{j}" for j in range(d)])
    return model, X, y, coef, base


def baseline(X, coef, reps):
    if hasattr(X, "to_numpy"):
        X = X.to_numpy()
    c = coef.astype(X.dtype)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        np.sort(X @ c)
        best = min(best, time.perf_counter() - t0)
    return best


def run_point(model, X, y, base, point, reps, weights=None):
    where, price = point.split("-")[:2]
    div, th2 = PRICES[price]
    r = base + T_POINTS[where] * (1.0 - base)
    kw = dict(loss="zero_one", r=r, theta1=1.0, theta2=th2, divergence=div)
    if weights is not None:
        kw["sample_weight"] = weights
    otstab.certify(model, X, y, **kw)  # (warm)
    best, best_rec = math.inf, None
    for _ in range(reps):
        rec = Recorder()
        saved = _install(rec)
        try:
            gc.collect()
            t0 = time.perf_counter()
            res = otstab.certify(model, X, y, **kw)
            dt = time.perf_counter() - t0
        finally:
            _restore(saved)
        if dt < best:
            best, best_rec = dt, rec
    # memory: one more run under tracemalloc
    rec_m = Recorder()
    rec_m.trace = True
    saved = _install(rec_m)
    try:
        gc.collect()
        tracemalloc.start()
        otstab.certify(model, X, y, **kw)
        peak = max(rec_m.peak, tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
        _restore(saved)
    return res, best, best_rec, (rec_m.mem, rec_m.start), peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, default=1e6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--points", default="base-kl,base-chi2,base-inf,mid-kl,mid-chi2,mid-inf,"
                    "max-kl,max-chi2,max-inf")
    ap.add_argument("--input", default="float64")
    args = ap.parse_args()
    n = int(args.n)
    model, X, y, coef, base = data(n, kind=args.input)
    b = baseline(X, coef, 7)
    print(f"n = {n}, input {args.input}, baseline X @ coef + np.sort: {b * 1e3:.1f} ms "
          "(minimum of 7; the ratios divide by it)")
    for point in args.points.split(","):
        w = np.linspace(0.5, 1.5, n) if point.endswith("-w") else None
        res, t, rec, mem, peak = run_point(model, X, y, base, point, args.reps, w)
        print(f"\n{point}: {t * 1e3:.1f} ms = {t / b:.2f}x, status {res.status}, peak "
              f"{peak / (8.0 * n):.2f} n-vectors; price rows {rec.rows['prices'] / n:.2f} n, "
              f"reduced rows {rec.rows['reduced'] / n:.2f} n, sorted "
              f"{[(k, round(s / n, 3)) for k, s in rec.sorted]} n")
        total = sum(rec.time.values())
        mem, start = mem
        print(f"  {'phase':<22} {'ms':>7} {'calls':>5} {'peak MB':>8} {'at start':>8}")
        for name, dt in sorted(rec.time.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<22} {dt * 1e3:7.1f} {rec.calls[name]:5d} "
                  f"{mem.get(name, 0.0) / 2**20:8.1f} {start.get(name, 0.0) / 2**20:8.1f}")
        print(f"  {'(other)':<22} {(t - total) * 1e3:7.1f}")
    b2 = baseline(X, coef, 7)
    print(f"\nbaseline again at the end: {b2 * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
