"""The logistic dual at the binned root: one exact pass, a Newton correction where needed.

The root ``h_c`` of the dual on binned margins (:mod:`otstab_solvers.logistic_binned`) is
within some 1e-11 of the exact root for KL and theta2 = inf, and some 1e-8 for chi2 (whose
weights have a kink in the margin), at n = 1e6 (issue 31). A bracketed search from it still
evaluates the exact dual at two or more points and Q*'s build solves every sample once more.
:func:`solve_at_root` instead evaluates the exact dual at ``h_c`` (one pass over the margins:
each sample's d-transform, summed over blocks) and

* accepts ``h_c`` when the derivative there is within :data:`G_RTOL` of ``r`` (the stopping
  rule of :func:`otstab_solvers.dual.solve_dual` on ``g``): the most sensitive distribution at
  ``h_c`` has the risk ``r - g``, and its cost is the dual value less ``h g``;
* otherwise takes a Newton step ``h + g / curv`` (the dual is smooth near its root away
  from switching points, so one step from an error of 1e-8 leaves some 1e-16) and evaluates
  there, up to :data:`MAX_NEWTON` steps, each within :data:`WINDOW` of ``h_c``;
* returns None when neither happens (a switching point of ``l_h`` near the root, a flat
  dual): the caller then runs the bracketed search.

The value at the returned ``h`` is the exact dual objective there (a lower bound on R by weak
duality); ``gap_bound`` is ``|h g|``, the distance from it to the cost of the most sensitive
distribution at ``h``; ``info["kl_weights"]`` (plain KL) the pass's normalisation of the
weights of Q*, ``(largest l_h / theta2, sum of exp(l_h / theta2 - largest), term)``. The
oracle (a :class:`~otstab_solvers.smooth.LogisticOracle` read in
slices, with warm starts) keeps each block's maximisers at the last ``h``, so that Q*'s build
at the returned ``h`` reads them instead of solving every sample again.

The KL reduction is the one of :func:`otstab_solvers.blockwise.block_kl` (per block the
largest ``l_h / theta2`` and the sums of ``e``, ``e dl``, ``e dl^2`` and ``e d2l``, combined
by the log-sum-exp of the blocks) without its ``expm1`` sum: that sum is only read when every
``l_h / theta2`` is close to the largest (the mean of ``e`` above 1/2), and is then computed
from the kept ``l_h`` of the pass. chi2, theta2 = inf and sample weights are reduced by
:class:`~otstab_solvers.blockwise.BlockwiseDual` over the kept ``l_h`` and derivatives.

This module imports neither otstab nor Dask.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .blockwise import BlockwiseDual, in_memory
from .result import OPTIMAL, DualSolution

__all__ = ["solve_at_root", "G_RTOL", "MAX_NEWTON", "WINDOW"]

#: |g| accepted at a point, relative to r (as :func:`otstab_solvers.dual.solve_dual`)
G_RTOL = 1e-11
#: Newton steps from the binned root before the caller's bracketed search takes over
MAX_NEWTON = 3
#: the relative distance from the binned root within which the steps stay
WINDOW = 1e-2
#: rows per block of a pass
BLOCK = 1 << 13


class _Kept:
    """Block ``k`` of the last pass's ``l_h``, ``dl`` and ``d2l`` as a block of
    :class:`BlockwiseDual` (``p``: its rows' probabilities)."""

    def __init__(self, store, k, p):
        self.store, self.k, self.p = store, k, p

    def evaluate(self, h, side="right", with_pieces=True):
        return (*self.store[self.k], None)


class _Pass:
    """Exact passes of the logistic dual over the blocks of an oracle's rows. Each block's
    arrays of the last pass are kept as the oracle returned them (the oracle may keep the
    same arrays: no copy)."""

    def __init__(self, oracle, n, theta2, divergence, p, block):
        self.oracle, self.n, self.theta2, self.divergence, self.p = \
            oracle, n, theta2, divergence, p
        self.bounds = [(s, min(s + block, n)) for s in range(0, n, block)]
        # plain KL keeps l_h alone (for the expm1 sum), theta2 = inf nothing (its sums are
        # plain); the others every derivative
        self.plain_kl = p is None and divergence == "kl" and math.isfinite(theta2)
        self.plain_mean = p is None and math.isinf(theta2)
        self.store: list = [None] * len(self.bounds)
        self.passes = 0
        self.moved = math.nan
        self.kl_weights: tuple | None = None  # plain KL: (largest l_h / theta2, sum e, term)
        self.dual = None
        if not (self.plain_kl or self.plain_mean):
            blocks = [_Kept(self.store, k, None if p is None else p[s:e])
                      for k, (s, e) in enumerate(self.bounds)]
            self.dual = BlockwiseDual(in_memory(blocks), n, n if p is None else 1.0,
                                      kinks=False)

    def at(self, h, r):
        """``(F, g, curv, alpha)`` of the exact dual at ``h`` (and :attr:`moved`: the
        P0-mean loss at the maximisers)."""
        self.passes += 1
        oracle, store = self.oracle, self.store
        if self.plain_mean:  # theta2 = inf: the means of l_h, dl and d2l
            sl = sd1 = sd2 = 0.0
            for s, e in self.bounds:
                lb, d1, d2 = oracle.transform_rows(h, slice(s, e))[:3]
                sl += float(np.sum(lb))
                sd1 += float(np.sum(d1))
                sd2 += float(np.sum(d2))
            N = float(self.n)
            self.moved = sd1 / N
            return h * r - sl / N, r - sd1 / N, sd2 / N, None  # (as BlockwiseDual.reduce)
        if not self.plain_kl:
            moved = 0.0
            kept = getattr(oracle, "kept", None) if getattr(oracle, "keep_values", False) \
                else None
            for k, (s, e) in enumerate(self.bounds):
                lb, d1, d2 = oracle.transform_rows(h, slice(s, e))[:3]
                got = None if kept is None else kept(h, slice(s, e))
                if got is not None:  # (the same losses, in the oracle's kept n-vector: one copy)
                    d1 = got[0]
                store[k] = lb, d1, d2
                moved += float(np.sum(d1)) if self.p is None else float(np.dot(self.p[s:e], d1))
            term, mu, curv, alpha, _ = self.dual.reduce(h, "right", self.theta2,
                                                        self.divergence)
            self.moved = moved / self.n if self.p is None else moved
            return h * r - term, r - mu, curv, alpha
        theta2 = self.theta2
        parts = []
        moved = 0.0
        # (an oracle that keeps each block's loss and step at h gives l_h again for the
        # expm1 sum below: no n-vector of l_h kept here)
        kept = getattr(oracle, "kept", None) if getattr(oracle, "keep_values", False) else None
        for k, (s, e) in enumerate(self.bounds):
            lb, d1, d2 = oracle.transform_rows(h, slice(s, e))[:3]
            store[k] = None if kept is not None and kept(h, slice(s, e)) is not None else lb
            moved += float(np.sum(d1))
            a = lb / theta2
            m = float(a.max())
            a -= m
            np.maximum(a, -700.0, out=a)  # (no subnormal terms, as dual._exp_shifted)
            ev = np.exp(a, out=a)
            ed1 = ev * d1
            parts.append((m, float(np.sum(ev)), float(np.sum(ed1)), float(np.dot(ed1, d1)),
                          float(np.dot(ev, d2))))
        self.moved = moved / self.n
        M = max(q[0] for q in parts)
        f = [math.exp(q[0] - M) for q in parts]
        Z, Z1, Z2, Z3 = (sum(fb * q[i] for fb, q in zip(f, parts)) for i in (1, 2, 3, 4))
        N = float(self.n)
        if Z > 0.5 * N:  # every l / theta2 close to the largest: expm1 keeps the accuracy
            em1 = 0.0
            for k, lb in enumerate(store):
                if lb is None:  # h loss - c t^2, as the d-transform computed it
                    assert kept is not None
                    loss, t = kept(h, slice(*self.bounds[k]))
                    lb = h * loss
                    lb -= float(oracle.c[0]) * t * t
                em1 += float(np.sum(np.expm1(np.maximum(lb / theta2 - M, -700.0))))
            log_mean = math.log1p(em1 / N)
        else:
            log_mean = math.log(Z / N)
        mu = Z1 / Z
        var = max(Z2 / Z - mu * mu, 0.0)
        term = theta2 * (M + log_mean)
        self.kl_weights = (M, Z, term)
        return h * r - term, r - mu, Z3 / Z + var / theta2, None


def solve_at_root(oracle, n: int, h_c: float, r: float, theta2: float, divergence: str, *,
                  p=None, block: int = BLOCK, g_rtol: float = G_RTOL,
                  keep_values: bool = False) -> DualSolution | None:
    """The exact dual of a logistic ``oracle`` (``transform_rows(h, rows)``) solved from the
    binned root ``h_c`` (module docstring), or None: the caller then searches. ``p``: the
    sample probabilities (None: uniform); ``g_rtol``: the derivative accepted, relative to r;
    ``keep_values``: the oracle keeps each block's loss at the maximiser with its steps
    (``LogisticOracle.keep_values``, one more n-vector, for Q*'s build).
    ``info``: ``passes`` (the exact passes made), ``g`` (the derivative at ``h``: the most
    sensitive distribution there has the risk ``r - g``), ``moved`` (the P0-mean loss at the
    maximisers) and ``kl_weights``."""
    t0 = time.perf_counter()
    if not (h_c > 0.0 and math.isfinite(h_c)):
        return None
    run = _Pass(oracle, n, theta2, divergence, p, block)
    if keep_values:
        oracle.keep_values = True
    try:
        return _newton(run, h_c, r, g_rtol, t0)
    finally:  # (the pass's arrays: BlockwiseDual refers to itself, so not freed at once)
        run.store.clear()


def _newton(run, h_c, r, g_rtol, t0):
    """The steps of :func:`solve_at_root` from ``h_c``."""
    h = h_c
    for _ in range(MAX_NEWTON + 1):
        F, g, curv, alpha = run.at(h, r)
        if not (math.isfinite(F) and math.isfinite(g)):
            return None
        if abs(g) <= g_rtol * abs(r):
            return DualSolution(
                h=h, alpha=alpha, value=F, status=OPTIMAL, solver="dual",
                native_status="optimal (exact pass at the binned root)",
                iterations=run.passes, gap_bound=abs(h * g),
                solve_time=time.perf_counter() - t0,
                info={"passes": run.passes, "kl_weights": run.kl_weights, "g": g,
                      "moved": run.moved})
        if not curv > 0.0:
            return None
        h = h + g / curv
        if not (h > 0.0 and abs(h - h_c) <= WINDOW * h_c):
            return None
    return None
