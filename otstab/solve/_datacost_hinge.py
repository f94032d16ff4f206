"""Exact hinge-loss certificates of binary linear models under a :class:`otstab.DataCost`.

The hinge loss ``max(0, 1 - y s(u))`` of a raw row ``u`` is ``max(0, m'_i + g)`` with
``m'_i = 1 - y_i s(u_i)`` and ``g`` the score change in the direction ``-y_i`` (a sum over
the raw variables, :mod:`otstab.datacost_linear`). Its d-transform separates: for ``h >= 0``

    l_h(u_i) = max(0, h m'_i + sum_v psi_v(h)),   psi_v(h) = max_o (h g_o - theta1 c_o),

each variable's best option found on its own: the levels (finite), ``k`` = the nearest
integer (floor or ceil) to ``h |a_v| / (2 theta1 q_v)`` within its range, a continuous move
``g = min(h / (2 theta1 Q_v), U_v)``. ``l_h`` is convex in ``h`` (a maximum of affine and
convex functions of h), its one-sided derivatives are the hinge loss at the left and right
maximisers, and the 1-D concave dual of :func:`otstab_solvers.dual.solve_dual` is maximised on
it. Q* moves each sample to its maximiser at the optimal ``h``; where the maximiser jumps at
``h`` (a kink) the samples' masses are split between the two maximisers so that the risk of
Q* is r. The audit re-scores Q*'s raw rows with the model's ``decision_function`` and
re-prices them with the cost.
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers.dual import solve_dual
from otstab_solvers.result import OPTIMAL
from otstab_solvers.weights import chi2_solution

from ..errors import SolverError
from . import _audit as audit
from ._datacost_linear import flip_problem, integer_step, split_at_kink
from ._datacost_result import edges_before_dual, raw_result

__all__ = ["HingeOracle", "certify_datacost_hinge"]

#: relative tolerance under which two options of a variable tie at h
TIE = 1e-12


class HingeOracle:
    """``l_h`` of every sample (see the module doc), with one-sided derivatives."""

    h_max = math.inf

    def __init__(self, mprime, finite, integer, continuous, theta1):
        self.m = mprime
        self.n = mprime.size
        self.fin, self.ints, self.conts = finite, integer, continuous
        self.theta1 = theta1

    def argmax(self, h, right=True):
        """``(l_h, dl_h/dh on that side, d2, choices, steps, gains)``."""
        n, t1 = self.n, self.theta1
        total = h * self.m
        slope = self.m.copy()
        curv = np.zeros(n)
        choices = np.full((n, len(self.fin)), -1, dtype=np.intp)
        steps = np.zeros((n, len(self.ints)))
        gains = np.zeros((n, len(self.conts)))
        if math.isfinite(t1):
            for j, (G, C) in enumerate(self.fin):
                with np.errstate(invalid="ignore"):
                    V = np.where(np.isfinite(C), h * G - t1 * C, -np.inf)
                best = np.maximum(V.max(axis=1, initial=-np.inf), 0.0)
                tol = TIE * (1.0 + np.abs(best) + h * np.abs(G).max(axis=1, initial=0.0))
                tie = V >= (best - tol)[:, None]
                key = np.where(tie, G if right else -G, -np.inf)
                pick = np.argmax(key, axis=1)
                g_pick = G[np.arange(n), pick]
                stay_ok = best <= tol
                use = tie[np.arange(n), pick] & ~(stay_ok & ((g_pick <= 0) if right
                                                             else (g_pick >= 0)))
                choices[:, j] = np.where(use, pick, -1)
                total = total + best
                slope = slope + np.where(use, g_pick, 0.0)
            for j, (a, q, K) in enumerate(self.ints):
                k, v = integer_step(h, a, q, K, t1, TIE, right)
                steps[:, j] = k
                total = total + v
                slope = slope + a * k
            for j, (Q, U) in enumerate(self.conts):
                free = h / (2.0 * t1 * Q)
                g = np.minimum(free, U)
                gains[:, j] = g
                total = total + h * g - t1 * Q * g * g
                slope = slope + g
                inside = (free < U) if right else (free <= U)
                curv = curv + np.where(inside & (U > 0), 1.0 / (2.0 * t1 * Q), 0.0)
        pos = total > TIE * (1.0 + h * np.abs(self.m))
        at0 = ~pos & (total >= -TIE * (1.0 + h * np.abs(self.m)))
        lh = np.maximum(total, 0.0)
        # max(0, L(h)): on the 0 side the move is none; at a tie the side decides
        moving = pos | (at0 & ((slope > 0) if right else (slope < 0)))
        d1 = np.where(moving, slope, 0.0)
        d2 = np.where(moving & pos, curv, 0.0)
        choices[~moving] = -1
        steps[~moving] = 0.0
        gains[~moving] = 0.0
        return lh, d1, d2, choices, steps, gains

    def evaluate(self, h, side="right"):
        lh, d1, d2, *_ = self.argmax(h, side == "right")
        return lh, d1, d2


def certify_datacost_hinge(model, prob, rc, parts, frame, *, r, theta1, theta2, divergence,
                           t_start):
    """``certify(..., loss="hinge", cost=DataCost)`` of a binary linear classifier."""
    n = prob.n
    rows = np.arange(n)
    y = prob.y.astype(np.float64)
    mprime = 1.0 - y * prob.scores
    coef = -y[:, None]
    fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rows)
    oracle = HingeOracle(mprime, fin, ints, conts, theta1)
    loss0 = np.maximum(mprime, 0.0)
    p = prob.p  # sample probabilities (None: uniform)
    edge = edges_before_dual(model, prob, rc, frame, loss0, r, theta1, theta2, divergence,
                             t_start, "hinge")
    if edge is not None:
        return edge
    sol = solve_dual(oracle, r, theta2, divergence, p=p)
    if sol.status != OPTIMAL or not math.isfinite(sol.h):
        raise SolverError(f"the hinge dual under the DataCost did not converge "
                          f"({sol.native_status}); r may be unreachable")
    h = float(sol.h)
    left = oracle.argmax(h, right=False)
    right = oracle.argmax(h, right=True)
    lh = right[0]
    w, src, mass, star, X0 = split_at_kink(frame, rows, layout, left, right, lh, r, p,
                                           theta2, divergence)
    scores = np.asarray(model.decision_function(star), dtype=np.float64)
    loss_star = np.maximum(1.0 - y[src] * scores, 0.0)
    moved2 = rc.cost(X0, star)
    wa = w[src]
    alpha = None if divergence == "kl" or math.isinf(theta2) else \
        chi2_solution(lh, theta2, p)[1]
    res = raw_result(model, prob, rc, frame, star, src, mass, wa, loss0, loss_star, moved2,
                     float(sol.value), h, alpha, r, theta1, theta2, divergence, t_start, sol,
                     "hinge")
    why = audit.accept(res)
    if why:
        raise SolverError("the hinge certificate under the DataCost failed its audit on the "
                          "model's own scores of Q*'s raw rows: " + "; ".join(why))
    return res
