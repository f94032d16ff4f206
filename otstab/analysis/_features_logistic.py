"""Feature scores of a binary logistic linear model from shared margins (issue 31).

Moving feature ``j`` alone changes a linear model's score by ``w_j delta``: the logistic
d-transform of the unit ``J`` (its columns) is the one of the margins ``m_i = y_i s_i`` with
the price ``c_J = theta1 / sum_{j in J} w_j^2``, the same for every sample
(:class:`otstab_solvers.smooth.LogisticOracle`). So every unit shares the model's scores, the
binned margins (:mod:`otstab_solvers.logistic_binned`, binned once) and one per-bin
Chebyshev quadrature of the margins
(:mod:`otstab_solvers.logistic_quadrature`, built once: the margins sorted, ``BINS`` bins,
their Chebyshev moments). Units of one price (equal ``sum w_j^2``) share one answer. Each
other unit costs:

1. ``h_c``, the root of the dual on the binned margins (``O(K)`` per evaluation);
2. the dual at ``h_c`` (``F(h_c) = h_c r - T(l_h)``, ``T`` the divergence term, its
   derivative ``g = r - E_w[loss*]`` and curvature) from the quadrature (each bin's
   interpolant of the summands at ``BINS * 9`` exact per-sample solves, integrated against
   the moments; the bins whose estimated interpolation error is not
   negligible, and those meeting the band of two local maxima, summed sample by sample, so
   that each sum equals the exact pass's to within ``1e-14`` relative by the estimate; chi2:
   the bins its active set's edge cuts too); where the quadrature would evaluate more than a
   quarter of the samples one by one, by one exact pass over the margins
   (:func:`otstab_solvers.logistic_pass.solve_at_root`);
3. if ``|g| > 1e-9 r`` a Newton step ``h_1 = h_c + g / curv`` and the same at ``h_1`` (up to
   three steps within 1 % of ``h_c``).

The distinct prices' steps 1-3 run on the CPUs the process may use (at most
:data:`MAX_WORKERS` threads; NumPy releases the GIL in its loops); each price's numbers are
its own, so the table does not depend on the thread count. The exact passes of the prices the
quadrature leaves run one after the other (they share one table of steps).

The score is accepted when ``|g| <= 1e-9 r`` at its ``h`` (:data:`G_RTOL`; the most
sensitive distribution there has the risk ``r - g``, which certify's audit would accept
within ``1e-8 r``). ``F(h)`` is a lower bound on the score at any ``h`` (weak duality), and
within ``|g| |h* - h|``, some ``g^2 / curv``, of it: some 1e-18 of the score, far below its
rounding. At n = 3e5 the binned root meets this at once for KL and theta2 = inf (one
evaluation per unit); chi2 takes the Newton step (two). The shares come from
the most sensitive distribution at ``h`` (its risk ``r - g``, the unweighted mean of the
losses at the maximisers for the moving part), as :func:`otstab.certify` reports them. A
unit that does not meet this (or whose binned dual has no root) is certified on its own,
as before; so are sample weights, prices outside ``MODERATE`` and thresholds at the edges
(no root of the dual: ``zero``, ``limit``, ``unreachable``).
"""

from __future__ import annotations

import math

import numpy as np
from otstab_solvers import logistic_binned, logistic_pass, logistic_quadrature
from otstab_solvers.smooth import LogisticOracle

from ..modeling._fingerprint import _pool
from ..modeling._nonlinear import loss_name
from ..modeling._threads import usable_cpus
from ..solve._piecewise import edge_kind

__all__ = ["logistic_feature_scores", "shared_margins", "SharedMargins"]

#: rows per block of the exact passes
BLOCK = 1 << 13
#: bins of the binned margins whose dual's root starts each unit (certify's 4096 halved: the
#: root only starts the Newton steps on the quadrature, and at n = 3e5, d = 50 every unit
#: was still accepted at it, at r near the base, middle and near the largest loss; 1024
#: needed a second evaluation for most units)
ROOT_BINS = 2048
#: threads of the units' quadrature answers (at most; the CPUs the process may use)
MAX_WORKERS = 2
#: the derivative of the dual accepted at a unit's h, relative to r: the risk of the most
#: sensitive distribution there is r - g, and certify's audit accepts a risk within
#: RISK_RTOL = 1e-8 r of r (the score F(h) is within some g^2 / curv of the optimum)
G_RTOL = 1e-9


def _applies(prob, r, theta1, theta2, moderate) -> bool:
    sc = prob.scorer
    if sc is None or sc.task != "binary" or prob.weights is not None or prob.scores is None \
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


class SharedMargins:
    """What every unit shares: the model's scores and labels, the binned margins and (KL,
    ``theta2 = inf``) the per-bin quadrature of the margins (module docstring)."""

    def __init__(self, prob, divergence):
        self.n = prob.n
        self.scores, self.signs = prob.scores, prob.y
        scores, signs = self.scores, self.signs
        self.points, self.mass = logistic_binned.binned_margins(
            lambda s, e: signs[s:e] * scores[s:e], self.n, bins=ROOT_BINS)
        self.quad = None
        if divergence in ("kl", "chi2"):  # every unit's sums from one set of bins
            self.quad = logistic_quadrature.MarginQuadrature(signs * scores)

    def reweighting_only(self, losses, r, theta1, theta2, divergence):
        """The reweighting-only row ``(value, h, 0, 1)`` (no sample moves: ``l_h = h loss``,
        the price ``c = inf``) from the binned root and the quadrature's Newton steps (each
        evaluation ``BINS * 9`` losses, not ``n``), or None: the caller's dense dual then
        answers (the edges ``zero``, ``limit`` and ``unreachable``, a refusal)."""
        if self.quad is None or edge_kind(losses, r, theta2, False, None) is not None:
            return None
        h = logistic_binned.binned_root(self.points, self.mass, 0.0, theta1, r, theta2,
                                        divergence)
        got = None if h is None else logistic_quadrature.solve_from(
            self.quad, math.inf, h, r, theta2, G_RTOL, divergence)
        if got is None or not math.isfinite(got[1]):
            return None
        return got[1], got[0], 0.0, 1.0


def shared_margins(prob, r, theta1, theta2, divergence, moderate) -> SharedMargins | None:
    """The :class:`SharedMargins` of ``prob``, or None where this path does not apply."""
    if not _applies(prob, r, theta1, theta2, moderate):
        return None
    return SharedMargins(prob, divergence)


def logistic_feature_scores(prob, units, r, theta1, theta2, divergence, moderate,
                            shared: SharedMargins | None = None):
    """``[(score, h, share_moving, share_reweighting) or None]`` for ``units`` (``[(label,
    columns)]``; None: certify that unit on its own), or None where this path does not apply
    (module docstring). ``shared``: the :func:`shared_margins` of ``prob`` (made here when
    None)."""
    if shared is None:
        shared = shared_margins(prob, r, theta1, theta2, divergence, moderate)
        if shared is None:
            return None
    n = prob.n
    scores, signs = shared.scores, shared.signs
    points, mass, quad = shared.points, shared.mass, shared.quad
    base = prob.loss_stats()[0]
    W = prob.scorer.W[0]
    prices = [float(np.sum(W[cols] ** 2)) for _label, cols in units]
    distinct = list(dict.fromkeys(prices))  # (units of one price share their answer)

    def from_bins(a):
        """``(h_c, quadrature's answer or None)`` of the price ``a`` (h_c None: no root)."""
        h = logistic_binned.binned_root(points, mass, a, theta1, r, theta2, divergence) \
            if a > 0 else None
        if h is None or quad is None:
            return h, None
        return h, logistic_quadrature.solve_from(quad, theta1 / a, h, r, theta2, G_RTOL,
                                                 divergence)

    # the prices on the CPUs the process may use (each price's numbers its own: the same on
    # any number of threads), the exact passes one by one (they share one table of steps)
    workers = min(usable_cpus(), len(distinct), MAX_WORKERS)
    if workers > 1:
        quick = list(_pool(workers).map(from_bins, distinct))
    else:
        quick = [from_bins(a) for a in distinct]
    m_range = None
    done: dict = {}  # ||w_J||^2 -> its row
    for a, (h, got) in zip(distinct, quick):
        if h is None:
            done[a] = None
            continue
        if got is not None:
            h_at, value, g, moved = got[:4]
        else:
            oracle = LogisticOracle.of_scores(scores, signs, a, theta1)
            if m_range is not None:
                oracle.margin_range = m_range  # (one range for every unit's table of steps)
            sol = logistic_pass.solve_at_root(oracle, n, h, r, theta2, divergence,
                                              block=BLOCK, g_rtol=G_RTOL)
            m_range = oracle.margin_range
            if sol is None or not math.isfinite(sol.value):
                done[a] = None
                continue
            h_at, value, g, moved = sol.h, sol.value, sol.info["g"], sol.info["moved"]
        if not math.isfinite(value):
            done[a] = None
            continue
        risk = r - g
        excess = risk - base
        if excess > 0:
            done[a] = (value, h_at, (moved - base) / excess, (risk - moved) / excess)
        else:
            done[a] = (value, h_at, 0.0, 0.0)
    return [done[a] for a in prices]
