"""The result of the exact DataCost duals of linear models (hinge, logistic, cross-entropy)
and the edges decided before their dual runs.

:func:`raw_result` wraps a candidate Q* of raw rows (``star``, one per atom, from sample
``src`` with mass ``mass`` and weight ``wa``) into a :class:`StabilityResult` whose audit sums
are recomputed from the model's own losses at those rows; :func:`edges_before_dual` decides, as
the encoded paths do (:func:`otstab.solve._piecewise.edge_kind`), the thresholds that need no
dual: ``zero`` (the data already reach r: Q* = P0), and, when nothing can move
(``theta1 = inf``), ``unreachable`` (``theta2 = inf``, or r above the largest loss: R = inf) and
the limit case (r equal to the largest loss: all mass on the samples of largest loss, the value
``theta2 log(1 / P(A))`` or ``theta2 (1 / P(A) - 1)`` attained only as h -> inf).
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import _audit as audit
from ._datacost_linear import DataCostView, encode
from ._piecewise import edge_kind, limit_weights
from ._results import Lazy, StabilityResult

__all__ = ["raw_result", "edges_before_dual"]


def raw_result(model, prob, rc, frame, star, src, mass, wa, loss0, loss_star, moved2, value, h,
               alpha, r, theta1, theta2, divergence, t_start, sol, loss_name):
    """A candidate (status ``"candidate"``: the caller audits it) with Q* the raw rows
    ``star``."""
    sums = audit.audit_sums(loss0, loss_star, moved2, mass, wa, theta1, theta2, divergence,
                            value, prob.p, src)
    res = StabilityResult(
        value=value, h=h, alpha=alpha, X_star=Lazy(lambda: encode(model, star)), weights=wa,
        source=src, mass=mass, risk_base=sums["risk_base"], risk_star=sums["risk_star"],
        total_mass=sums["total_mass"], primal_cost=sums["primal_cost"], gap=sums["gap"],
        decomposition=sums["decomposition"], solver="dual", status="candidate",
        solve_time=(sol.solve_time if sol is not None else 0.0), r=r, theta1=theta1,
        theta2=theta2, divergence=divergence, loss=loss_name,
        dual_gap_bound=(sol.gap_bound if sol is not None else 0.0),
        iterations=(sol.iterations if sol is not None else 0), split=bool(src.size > prob.n),
        loss_star=loss_star, loss_base=loss0, X=prob.X,
        feature_names=list(prob.feature_names), index=prob.index,
        info={"moved2": moved2, "wall_time": time.perf_counter() - t_start,
              "audit": {"method": "raw rows re-scored", "sample": int(src.size)},
              "raw_view": DataCostView(rc, frame, None, np.zeros(0, dtype=bool), atoms=star)})
    if prob.weights is not None:  # as certify's other paths: for the certificate and inference
        res.info["sample_weight"] = prob.weights
    return res


def edges_before_dual(model, prob, rc, frame, loss0, r, theta1, theta2, divergence, t_start,
                      loss_name, edge=None):
    """The result of an edge (module doc), or None when the dual is needed; ``edge``: a
    ``(kind, message)`` the caller decided itself (e.g. r beyond any reachable loss)."""
    n = prob.n
    rows = np.arange(n)
    if edge is None:
        edge = edge_kind(loss0, r, theta2, math.isfinite(theta1), prob.p)
    if edge is None:
        return None
    kind, message = edge
    if kind == "limit":
        w, value = limit_weights(loss0, theta2, divergence, prob.p)
        h = math.inf
    else:  # zero, unreachable: Q* = P0 (unreachable: only its value inf is reported)
        w, value, h = np.ones(n), 0.0, 0.0
    res = raw_result(model, prob, rc, frame, frame.copy(), rows, np.ones(n), w, loss0, loss0,
                     np.zeros(n), value, h, None, r, theta1, theta2, divergence, t_start, None,
                     loss_name)
    res.solver, res.message = "none", message
    res.info["edge_case"] = kind
    res.solver_log = [{"solver": "none", "status": kind, "reason": message}]
    if kind == "unreachable":  # as the encoded paths' edge_result
        res.value, res.h = math.inf, math.nan
        res.primal_cost = res.gap = res.dual_gap_bound = math.nan
    audit.mark_edge(res, kind)
    return res
