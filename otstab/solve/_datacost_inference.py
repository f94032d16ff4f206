"""``se="bootstrap"`` under a :class:`otstab.DataCost`: R on rows resampled with replacement,
by the same exact paths as the certificate (:mod:`otstab.datacost_certify`).

Each sample's part of the problem does not depend on the other rows once the cost is
resolved: its distance to misclassification (0/1 loss) or its options (hinge, logistic:
the per-sample arrays of :func:`otstab.datacost_linear.flip_problem`). A replicate therefore
takes the drawn rows' parts and solves the exact 1-D dual on them (the 0/1 dual of
:mod:`otstab.zero_one`, or :func:`otstab_solvers.dual.solve_dual` on the hinge or logistic
oracle of the drawn rows); the cost stays the one resolved on the full evaluation data (its
scales, levels and observed bounds are not re-estimated per replicate). A sample weight
travels with its row, renormalised over the rows drawn.

Tree models: each replicate takes the drawn rows' found distances (the upper ends of the
raw branch and bound, exact where a sample's search completed), so a replicate is the found
(upper) value of the drawn rows, as with the encoded cost, where each replicate re-runs the
search; the multiclass cross-entropy: the candidates' exact dual on the drawn rows (upper
values too). :func:`otstab.solve._inference.bootstrap` says so in the note when the
certificate is not exact.
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers.dual import solve_dual
from otstab_solvers.result import OPTIMAL

from . import _audit as audit
from . import _inference as inference
from ._zero_one import _solve_and_build, move_prices

__all__ = ["zero_one_replicator", "oracle_replicator", "bootstrap"]


def _drawn(p, idx):
    if p is None:
        return None
    q = p[idx]
    return q / float(np.sum(q))


def zero_one_replicator(dstar, wrong, p, *, r, theta1, theta2, divergence, solver):
    """``value(idx)`` of the 0/1 loss: the exact 0/1 dual on the drawn rows' distances."""
    dstar = np.asarray(dstar, dtype=np.float64)
    wrong = np.asarray(wrong, dtype=bool)

    def value(idx):
        d = dstar[idx]
        res = _solve_and_build(move_prices(d, theta1), wrong[idx], r, theta1, theta2,
                               divergence, solver, None, None, None, lambda Xm, ym: None, [],
                               None, 0.0, d, p=_drawn(p, idx))
        return float(res.value)
    return value


def oracle_replicator(make, loss0, p, *, r, theta2, divergence):
    """``value(idx)`` of the hinge or logistic loss: ``make(idx)`` is the oracle of the drawn
    rows; R is 0 where their risk already reaches r and inf where the dual finds r out of
    reach."""
    loss0 = np.asarray(loss0, dtype=np.float64)

    def value(idx):
        q = _drawn(p, idx)
        base = float(np.mean(loss0[idx])) if q is None else float(np.dot(q, loss0[idx]))
        if audit.reached(r, base):
            return 0.0
        sol = solve_dual(make(idx), r, theta2, divergence, p=q)
        if sol.status != OPTIMAL or not math.isfinite(sol.h):
            return math.inf
        return float(sol.value)
    return value


def subset_options(fin, ints, conts, idx):
    """The options of :func:`otstab.datacost_linear.flip_problem` for the rows ``idx``."""
    return ([(G[idx], C[idx]) for G, C in fin],
            [tuple(np.broadcast_to(v, (np.size(t[0]),))[idx] for v in t) for t in ints],
            [tuple(np.broadcast_to(v, (np.size(t[0]),))[idx] for v in t) for t in conts])


def bootstrap(res, n, p, spec, value):
    """The bootstrap :class:`otstab.inference.Inference` of ``res`` from ``value(idx)``."""
    if p is not None:
        inner = value

        def value(idx):  # a draw of rows that all have zero weight: no distribution
            return inner(idx) if np.any(p[idx] > 0) else math.nan
    return inference.bootstrap(res, inference.resample(n, spec, value), spec)
