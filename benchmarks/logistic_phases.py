"""Where a logistic certificate spends its time: a per-phase timer of the grid's logistic points.

Issue 31's grid (``benchmarks/test_bench_grid.py``) times whole certificates; this script splits
each logistic point (r near the base risk, in the middle, near the largest loss; KL and chi2 at
theta2 = 0.25 and theta2 = inf; float32 and a DataFrame at the middle, KL) into its phases,
without cProfile (whose per-call overhead distorts the many small NumPy calls): each phase's
function is wrapped by a timer that records its own time less its timed callees'. It also counts
the elements given to each transcendental function (``expit``, ``exp``, ``log``, ``log1p``,
``expm1``), in multiples of n: an operation on n numbers is some 0.6 ms at n = 1e6 on this
machine, a transcendental some 5-14 ms, one ``X @ coef`` some 16-20 ms.

Usage (the machine is shared: say the load, ``uptime``, next to any number)::

    PYTHONPATH=. python benchmarks/logistic_phases.py [--n 1e6] [--reps 3] [--only middle-kl]
        [--no-kernel]

``--no-kernel``: the NumPy passes where numba would compile the exact pass, the binning and
the audit's sums (``otstab_solvers.logistic_kernels.USE_KERNEL``), to compare the two.

The wrappers and counters patch module attributes of this process only (``numpy.exp`` and the
like included); the timings in the table are of one extra certificate after ``--reps`` timed
ones (whose minimum is the ratio's numerator), so they are noisier than the minimum.
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import time

import numpy as np
import otstab_solvers.logistic_binned as lb
import otstab_solvers.logistic_kernels as lk
import otstab_solvers.logistic_pass as lp
import otstab_solvers.logistic_uniform as lu
import otstab_solvers.smooth as sm
import pandas as pd
from threadpoolctl import threadpool_limits

import otstab
import otstab.solve._audit as audit
import otstab.solve._smooth as smooth_path
from otstab.modeling._models import LinearScorer, Problem, per_sample_losses

D = 50
#: r = base + t (largest loss - base)
R_POINTS = {"near base": 0.01, "middle": 0.5, "near max": 0.95}
PRICES = {"kl": ("kl", 0.25), "chi2": ("chi2", 0.25), "inf": ("kl", math.inf)}
#: (owner, attribute, phase) of the timed functions
PHASES = [
    (LinearScorer, "scores_and_fingerprint", "scores + fingerprint (one pass over X)"),
    (Problem, "loss_stats", "base loss pass (loss_stats)"),
    (lb._Bins, "__init__", "binning the margins"),
    (lb._Bins, "gather", "chi2: margins at the kink"),
    (lb, "solve_dual", "binned root (K-point dual)"),
    (sm.LogisticOracle, "_table", "step table (build)"),
    (lu.StepTable, "start_t", "step table (start)"),
    (lu.StepTable, "start", "step table (start)"),
    (sm, "uniform_steps", "Halley steps (uniform_steps)"),
    (sm, "two_branch_steps", "two-branch / robust steps"),
    (sm, "logistic_steps", "two-branch / robust steps"),
    (sm, "_softplus_at", "loss at the maximiser (softplus)"),
    (sm, "_uniform_dtransform", "l_h, d2 and kept arrays"),
    (sm.LogisticOracle, "fused_rows", "exact pass: compiled loop (logistic_kernels)"),
    (lk, "bin_block", "binning the margins"),
    (lk, "audit_sums", "audit: sums over Q*"),
    (lp._Pass, "at", "exact pass: reductions"),
    (lp._Pass, "_chi2_at", "exact pass: reductions"),
    (smooth_path, "solve_dual", "bracketed exact search"),
    (smooth_path, "_build_rows", "Q* (steps of every sample)"),
    (smooth_path, "_audit_rows", "audit: sums over Q*"),
    (audit, "rescored", "audit: sampled atoms re-scored"),
    (otstab, "certify", "other (validation, resolve, result)"),
]
TRANSCENDENTAL = [(lu, "expit", "expit"), (sm, "expit", "expit"), (np, "exp", "exp"),
                  (np, "log", "log"), (np, "log1p", "log1p"), (np, "expm1", "expm1")]


class Timer:
    """Exclusive time and calls per phase, and elements per transcendental function."""

    def __init__(self):
        self.time = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.elements = collections.Counter()
        self._stack: list[float] = []

    def clear(self):
        self.time.clear()
        self.calls.clear()
        self.elements.clear()

    def wrap(self, owner, name, phase):
        fn = getattr(owner, name, None)
        if fn is None:  # (another version of the code: not there)
            return

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                inner = self._stack.pop()
                self.time[phase] += spent - inner
                self.calls[phase] += 1
                if self._stack:
                    self._stack[-1] += spent

        setattr(owner, name, timed)

    def count(self, owner, name, label):
        fn = getattr(owner, name, None)
        if fn is None:
            return

        def counted(x, *args, **kwargs):
            self.elements[label] += np.size(x)
            return fn(x, *args, **kwargs)

        setattr(owner, name, counted)


def _data(n):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, D))
    coef = rng.standard_normal(D) / np.sqrt(D)
    y = np.where(X @ coef + 0.3 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    losses = per_sample_losses(model, X, y, "logistic")
    return model, X, y, float(np.mean(losses)), float(np.max(losses))


def _best(fn, reps):
    out = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=1e6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default=None, help="points whose name contains this")
    ap.add_argument("--no-kernel", action="store_true",
                    help="NumPy passes instead of the compiled logistic ones")
    args = ap.parse_args(argv)
    if args.no_kernel:
        lk.USE_KERNEL = False
    n = int(args.n)
    model, X, y, base, top = _data(n)
    inputs = {"float64": X, "float32": X.astype(np.float32),
              "frame": pd.DataFrame(X, columns=[f"x{j}" for j in range(D)])}
    coef32 = model.coef_.astype(np.float32)
    points = [(rp, price, "float64") for rp in R_POINTS for price in PRICES]
    points += [("middle", "kl", "float32"), ("middle", "kl", "frame")]
    # (numba compiles / loads the kernels before the counters replace numpy's ufuncs, which
    # its typing reads)
    lk.use_kernel(n)
    timer = Timer()
    for owner, name, phase in PHASES:
        timer.wrap(owner, name, phase)
    for owner, name, label in TRANSCENDENTAL:
        timer.count(owner, name, label)
    rows = []
    with threadpool_limits(2, user_api="blas"):
        base64 = _best(lambda: X @ model.coef_, max(args.reps, 3))
        base32 = _best(lambda: inputs["float32"] @ coef32, max(args.reps, 3))
        print(f"n = {n:,}, d = {D}; one X @ coef {base64 * 1e3:.1f} ms, X32 @ coef32 "
              f"{base32 * 1e3:.1f} ms (2 BLAS threads)")
        for rp, price, kind in points:
            name = f"{rp}-{price}-{kind}".replace(" ", "-")
            if args.only and args.only not in name:
                continue
            divergence, theta2 = PRICES[price]
            kw = dict(loss="logistic", r=base + R_POINTS[rp] * (top - base), theta1=1.0,
                      theta2=theta2, divergence=divergence)
            data = inputs[kind]
            otstab.certify(model, data, y, **kw)  # (warm: imports, thread pools)
            best = _best(lambda data=data, kw=kw: otstab.certify(model, data, y, **kw),
                         args.reps)
            timer.clear()
            t0 = time.perf_counter()
            res = otstab.certify(model, data, y, **kw)
            once = time.perf_counter() - t0
            baseline = base32 if kind == "float32" else base64
            rows.append((name, best, best / baseline, once, res, dict(timer.time),
                         dict(timer.calls), {k: v / n for k, v in timer.elements.items()}))
    for name, best, ratio, once, res, phases, calls, elements in rows:
        print(f"\n### {name}: {best * 1e3:.1f} ms = {ratio:.2f}x one pass (min of "
              f"{args.reps}); status {res.status}, exact passes {res.info.get('passes')}, "
              f"h {res.h:.6g}; the timed certificate {once * 1e3:.1f} ms\n")
        print("| phase | ms | calls |\n|---|---|---|")
        for phase, spent in sorted(phases.items(), key=lambda kv: -kv[1]):
            print(f"| {phase} | {spent * 1e3:.1f} | {calls[phase]} |")
        print("\nelements per n: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                              sorted(elements.items())))


if __name__ == "__main__":
    main()
