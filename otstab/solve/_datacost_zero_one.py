"""Exact 0/1 certificates of linear models under a :class:`otstab.DataCost`.

The score of a raw row is a sum over its raw variables (:mod:`otstab.datacost_linear`). The
distance of sample i to misclassification under the cost is then the cheapest mixed move
whose score change in the flipping direction (``-y_i`` times the change) reaches the margin
``m_i = y_i s_i``: a multiple-choice knapsack with quadratic continuous tails (the options of
:func:`otstab.datacost_linear.flip_problem`), solved exactly per sample by
:mod:`otstab_solvers.knapsack`.

The need is the margin plus the 0/1 path's push past the boundary (a relative 1e-9 of the
margin plus a few hundred ulps of the score's terms), so the moved row is misclassified by the
model's own rule; ``d*_i`` is the exact least cost of that need. A multiclass classifier solves
one such knapsack per other class k (the gain being the change of ``s_k - s_y``, the need
``s_y - s_k`` plus the push) and keeps the cheapest. The distances go to the exact
0/1 dual of :mod:`otstab.zero_one`; Q* moves each chosen sample to its cheapest flipping *raw
row* (levels among the allowed ones, integers integral, inside the bounds, immutables
unchanged), and the audit re-scores these raw rows with ``model.predict`` and re-prices them
with :meth:`ResolvedCost.cost` (no solver output is trusted): an answer whose Q* is not
misclassified by the model, or costs other than the value, is refused.
"""

from __future__ import annotations

import math
import time

import numpy as np
from otstab_solvers.knapsack import solve_batch

from ..errors import SolverError
from ..modeling._losses import zero_one
from . import _audit as audit
from ._datacost_linear import DataCostView, encode, flip_problem, moved_rows, predict
from ._results import Lazy
from ._zero_one import _solve_and_build, move_prices

__all__ = ["certify_datacost_zero_one", "zero_one_distances"]

PUSH = 1e-9
EPS = float(np.finfo(float).eps)


def _needs(prob, rows, k=None):
    """Margin plus push of the correctly classified ``rows`` (see the module doc): binary,
    or against class ``k`` of a multiclass classifier (``s_y - s_k``)."""
    sc = prob.scorer
    if k is None:
        m = prob.y[rows] * prob.scores[rows]
        terms = np.abs(prob.X[rows]) @ np.abs(sc.W[0]) + abs(float(sc.b[0]))
    else:
        y = prob.y[rows].astype(np.intp)
        S = prob.scores[rows]
        m = S[np.arange(rows.size), y] - S[:, k]
        A = np.abs(prob.X[rows])
        terms = np.einsum("ij,ij->i", A, np.abs(sc.W[y])) + A @ np.abs(sc.W[k]) + \
            np.abs(sc.b[y]) + abs(float(sc.b[k]))
    return m + PUSH * m + 512.0 * EPS * (1.0 + m + terms)


def _distances(prob, rc, parts, frame, rows, need):
    """``(d*, moved raw rows)`` of the correctly classified ``rows`` (``need`` filled in):
    binary, or the cheapest over the other classes of a multiclass classifier."""
    out = frame.copy()
    if prob.scorer.task == "binary":
        need[rows] = _needs(prob, rows)
        coef = -prob.y[rows].astype(np.float64)[:, None]
        fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rows)
        c, choices, steps, gains = solve_batch(need[rows], fin, ints, conts)
        moved_rows(out, rows, layout, choices, steps, gains, np.isfinite(c))
        return c, out
    y = prob.y[rows].astype(np.intp)
    K = prob.scorer.W.shape[0]
    best = np.full(rows.size, math.inf)
    which = np.full(rows.size, -1)
    solved = {}
    for k in range(K):
        sel = np.flatnonzero(y != k)
        if not sel.size:
            continue
        rk = rows[sel]
        coef = -np.eye(K)[y[sel]]
        coef[:, k] += 1.0
        nk = _needs(prob, rk, k)
        fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rk)
        c, choices, steps, gains = solve_batch(nk, fin, ints, conts)
        better = c < best[sel]
        best[sel[better]] = c[better]
        which[sel[better]] = k
        need[rk[better]] = nk[better]
        solved[k] = (sel, rk, layout, choices, steps, gains)
    for k, (sel, rk, layout, choices, steps, gains) in solved.items():
        moved_rows(out, rk, layout, choices, steps, gains, which[sel] == k)
    return best, out


def zero_one_distances(prob, rc, parts, frame, rows):
    """``d*`` of the correctly classified ``rows``: the exact least cost of a move the model
    misclassifies (the knapsacks of the module doc)."""
    return _distances(prob, rc, parts, frame, rows, np.zeros(prob.n))[0]


def certify_datacost_zero_one(model, prob, rc, parts, frame, *, r, theta1, theta2, divergence,
                              solver, t_start):
    """``certify(..., loss="zero_one", cost=DataCost)`` of a linear classifier (binary or
    multiclass), its inputs prepared by :func:`otstab.datacost_certify.certify_datacost`."""
    wrong = zero_one.values(prob.scores, prob.y) > 0
    n = prob.n
    rows = np.flatnonzero(~wrong)
    need = np.zeros(n)
    dstar = np.zeros(n)
    Xs = frame
    if rows.size and math.isfinite(theta1):
        dstar[rows], Xs = _distances(prob, rc, parts, frame, rows, need)
    elif rows.size:  # theta1 = inf: nothing moves
        dstar[rows] = math.inf
    loss0 = wrong
    a = move_prices(dstar, theta1)
    res = _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, None, None, None,
                           lambda Xm, ym: None, list(prob.feature_names), prob.index, t_start,
                           dstar, p=prob.p)
    _raw_audit(res, model, prob, rc, frame, Xs)
    res.info["cost"] = rc.to_dict()
    res.info["cost_description"] = rc.describe()
    if prob.weights is not None:  # as certify's other paths: for the certificate and inference
        res.info["sample_weight"] = prob.weights
    res.info["need"] = need
    res.info["wall_time"] = time.perf_counter() - t_start
    return res


def _raw_audit(res, model, prob, rc, frame, Xs):
    """Re-score Q*'s moved raw rows with the model and re-price them with the cost; refuse an
    answer the model or the cost refutes."""
    if res.status not in ("optimal", "bounds"):
        res.X, res.feature_names = prob.X, list(prob.feature_names)
        res.info["raw_view"] = DataCostView(rc, frame, Xs, np.zeros(res.n_atoms, dtype=bool))
        return
    src = np.asarray(res.source)
    mass = np.asarray(res.mass, dtype=np.float64)
    w = np.asarray(res.weights, dtype=np.float64)
    loss_base = np.asarray(prob.losses(prob.X), dtype=np.float64)
    moved = np.asarray(res.loss_star) > loss_base[src]
    loss_star = loss_base[src].copy()
    moved2 = np.zeros(src.size)
    if moved.any():
        ms = src[moved]
        X1 = Xs.iloc[ms].reset_index(drop=True)
        pred = predict(model, X1)
        loss_star[moved] = (pred != np.asarray(prob.y_original)[ms]).astype(np.float64)
        moved2[moved] = rc.cost(frame.iloc[ms].reset_index(drop=True), X1)
    sums = audit.audit_sums(loss_base, loss_star, moved2, mass, w, res.theta1, res.theta2,
                            res.divergence, res.value, prob.p, src)
    for key in ("risk_base", "risk_star", "total_mass", "primal_cost", "gap",
                "decomposition"):
        setattr(res, key, sums[key])
    res.loss_star = loss_star
    res.loss_base = loss_base
    res.info["moved2"] = moved2
    res.info["audit"] = {**(res.info.get("audit") or {}), "method": "raw rows re-scored",
                         "sample": int(np.count_nonzero(moved))}
    why = audit.problems(res)
    if why:
        raise SolverError("the 0/1 certificate under the DataCost failed its audit on the "
                          "model's own predictions of Q*'s raw rows: " + "; ".join(why))
    res.X, res.feature_names = prob.X, list(prob.feature_names)
    view = DataCostView(rc, frame, Xs, moved)
    res.info["raw_view"] = view
    res.X_star = Lazy(lambda: encode(model, view.star_rows(src)))

