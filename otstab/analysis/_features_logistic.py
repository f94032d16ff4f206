"""Feature scores of a binary logistic linear model from shared margins (issue 31).

Moving feature ``j`` alone changes a linear model's score by ``w_j delta``: the logistic
d-transform of the unit ``J`` (its columns) is the one of the margins ``m_i = y_i s_i`` with
the price ``c_J = theta1 / sum_{j in J} w_j^2``, the same for every sample
(:class:`otstab_solvers.smooth.LogisticOracle`). So every unit shares the model's scores and
the binned margins (:mod:`otstab_solvers.logistic_binned`, binned once), and each unit costs
the binned dual (``O(K)`` per evaluation) and one or two exact passes over the margins:

1. ``h_c``, the root of the dual on the binned margins;
2. the exact ``l_h``, loss at the maximiser and ``d2 l_h / dh2`` of every sample at ``h_c``:
   the dual ``F(h_c) = h_c r - T(l_h)`` (``T`` the divergence term, exact: the weights of
   :func:`otstab_solvers.weights.weight_map`), its derivative ``g = r - E_w[loss*]`` and
   curvature;
3. if ``|g| > 1e-9 r`` one Newton step ``h_1 = h_c + g / curv`` (warm-started) and the
   same at ``h_1``.

The score is accepted when ``|g| <= 1e-9 r`` at its ``h`` (:data:`G_RTOL`; the most
sensitive distribution there has the risk ``r - g``, which certify's audit would accept
within ``1e-8 r``). ``F(h)`` is a lower bound on the score at any ``h`` (weak duality), and
within ``|g| |h* - h|``, some ``g^2 / curv``, of it: some 1e-18 of the score, far below its
rounding. At n = 3e5 the binned root meets this at once for KL and theta2 = inf (one exact
pass per unit); chi2 takes the Newton step. The shares come from
the most sensitive distribution at ``h`` (its risk ``r - g``, the unweighted mean of the
losses at the maximisers for the moving part), as :func:`otstab.certify` reports them. A
unit that does not meet this (or whose binned dual has no root) is certified on its own,
as before; so are sample weights, prices outside ``MODERATE`` and thresholds at the edges
(no root of the dual: ``zero``, ``limit``, ``unreachable``).
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers import logistic_binned
from otstab_solvers.smooth import LogisticOracle
from otstab_solvers.weights import weight_map

from ..modeling._nonlinear import loss_name
from ..solve._piecewise import edge_kind

__all__ = ["logistic_feature_scores"]

#: rows per block of the exact passes
BLOCK = 1 << 13
#: the derivative of the dual accepted at a unit's h, relative to r: the risk of the most
#: sensitive distribution there is r - g, and certify's audit accepts a risk within
#: RISK_RTOL = 1e-8 r of r (the score F(h) is within some g^2 / curv of the optimum)
G_RTOL = 1e-9


def _applies(prob, r, theta1, theta2, moderate) -> bool:
    sc = prob.scorer
    if sc is None or sc.task != "binary" or prob.p is not None or prob.scores is None \
            or np.ndim(prob.scores) != 1 or sc.W.shape[0] != 1:
        return False
    if loss_name(prob.loss) not in ("logistic", "cross_entropy"):
        return False
    if prob.n < logistic_binned.MIN_N:
        return False
    lo, hi = moderate
    if not (math.isfinite(theta1) and lo <= theta1 <= hi):
        return False
    if math.isfinite(theta2) and not lo <= theta2 <= hi:
        return False
    return edge_kind(None, r, theta2, True, None, stats=prob.loss_stats()) is None


def _at(oracle, h, n, r, theta2, divergence, lh, d1, d2):
    """(F, g, curv, risk of Q*, moved risk) of the exact dual at ``h`` (fills ``lh``, ``d1``
    and ``d2``: each sample's l_h, loss at the maximiser and d2 l_h / dh2)."""
    for s in range(0, n, BLOCK):
        e = min(s + BLOCK, n)
        lh[s:e], d1[s:e], d2[s:e] = oracle.transform_rows(h, slice(s, e))[:3]
    wm = weight_map(lh, theta2, divergence)
    w = wm(lh)

    def dot(a, b):  # (einsum, not a BLAS dot: no threads spawned on a busy machine)
        return float(np.einsum("i,i->", a, b))

    risk = dot(w, d1) / n
    moved = float(np.sum(d1)) / n
    g = r - risk
    if math.isinf(theta2):
        curv = float(np.sum(d2)) / n
    elif divergence == "kl":  # E_w d2 + Var_w(d1) / theta2
        dev = d1 - risk
        dev *= dev
        curv = dot(w, d2) / n + dot(w, dev) / n / theta2
    else:  # chi2: E_w d2 + the variance of d1 over the active samples / (2 theta2)
        da = d1[w > 0]
        da -= da.mean()
        curv = (dot(w, d2) + dot(da, da) / (2.0 * theta2)) / n
    return h * r - wm.term, g, curv, risk, moved


def logistic_feature_scores(prob, units, r, theta1, theta2, divergence, moderate):
    """``[(score, h, share_moving, share_reweighting) or None]`` for ``units`` (``[(label,
    columns)]``; None: certify that unit on its own), or None where this path does not apply
    (module docstring)."""
    if not _applies(prob, r, theta1, theta2, moderate):
        return None
    n = prob.n
    scores, signs = prob.scores, prob.y
    points, mass = logistic_binned.binned_margins(
        lambda s, e: signs[s:e] * scores[s:e], n)
    base = prob.loss_stats()[0]
    lh, d1, d2 = np.empty(n), np.empty(n), np.empty(n)
    W = prob.scorer.W[0]
    out: list = []
    for _label, cols in units:
        a = float(np.sum(W[cols] ** 2))
        h = logistic_binned.binned_root(points, mass, a, theta1, r, theta2, divergence) \
            if a > 0 else None
        if h is None:
            out.append(None)
            continue
        oracle = LogisticOracle.of_scores(scores, signs, a, theta1)  # (warm: the 2nd pass)
        F, g, curv, risk, moved = _at(oracle, h, n, r, theta2, divergence, lh, d1, d2)
        if abs(g) > G_RTOL * abs(r) and curv > 0:
            h1 = h + g / curv
            if h1 > 0:
                h = h1
                F, g, curv, risk, moved = _at(oracle, h, n, r, theta2, divergence, lh, d1, d2)
        if not (abs(g) <= G_RTOL * abs(r) and math.isfinite(F)):
            out.append(None)
            continue
        excess = risk - base
        if excess > 0:
            out.append((F, h, (moved - base) / excess, (risk - moved) / excess))
        else:
            out.append((F, h, 0.0, 0.0))
    return out
