"""The logistic dual of many prices on shared margins (issue 31, feature_stability):

* the per-bin Chebyshev quadrature (otstab_solvers.logistic_quadrature) against the exact
  pass (every sample's d-transform) at points on both sides of ``T = h / 2c = 4``, and its
  root against the plain bracketed search on the dense oracle (its own d-transform).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from otstab_solvers import logistic_pass
from otstab_solvers.dual import solve_dual
from otstab_solvers.logistic_quadrature import MarginQuadrature, solve_from
from otstab_solvers.smooth import LogisticOracle


def _margins(n=40_000, seed=0, spread=2.0):
    rng = np.random.default_rng(seed)
    s = rng.normal(0.8, spread, n)
    y = np.where(rng.random(n) < 0.85, 1, -1).astype(np.int8)
    return s, y


def _exact(s, y, a, theta1, h, r, theta2, divergence):
    oracle = LogisticOracle.of_scores(s, y, a, theta1)
    run = logistic_pass._Pass(oracle, s.size, theta2, divergence, None, 4096)
    return (*run.at(h, r)[:3], run.moved)


# T = h a / (2 theta1): 0.05, 1, 3.9 (concave), 4.5, 12 (two local maxima near the band)
POINTS = [(0.1, 1.0), (2.0, 1.0), (7.8, 1.0), (9.0, 1.0), (24.0, 1.0)]


@pytest.mark.parametrize("theta2", [0.25, math.inf, 5.0, 1e-2])
@pytest.mark.parametrize("h,a", POINTS)
def test_quadrature_equals_the_exact_pass(theta2, h, a):
    s, y = _margins()
    r = 1.1
    quad = MarginQuadrature(y * s, bins=512)
    got = quad.dual_at(1.0 / a, h, r, theta2)
    F, g, curv, moved = _exact(s, y, a, 1.0, h, r, theta2, "kl")
    assert got is not None
    Fq, gq, cq, mq, share = got
    # the divergence term h r - F and the weighted mean r - g to 1e-13 (relative)
    assert h * r - Fq == pytest.approx(h * r - F, rel=1e-13)
    assert r - gq == pytest.approx(r - g, rel=1e-13)
    # (the curvature only steers Newton; its variance term Z2/Z - mu^2 cancels, / theta2)
    assert cq == pytest.approx(curv, rel=1e-9)
    assert mq == pytest.approx(moved, rel=1e-13)
    T = h * a / 2.0
    if T > 4.0:  # the band of two maxima is evaluated sample by sample
        assert share > 0.0
    elif T < 3.0:  # (near T = 4, where l_h bends sharply, some bins are too)
        assert share < 0.01


def test_quadrature_refuses_when_too_many_samples_need_the_exact_solve(monkeypatch):
    """More samples than MAX_EXACT_SHARE in bins evaluated sample by sample (the band of two
    maxima at T = 4.5): None, so the caller runs the exact pass."""
    import otstab_solvers.logistic_quadrature as lq

    s, y = _margins()
    quad = MarginQuadrature(y * s, bins=512)
    assert quad.dual_at(1.0, 9.0, 1.1, 0.25) is not None
    monkeypatch.setattr(lq, "MAX_EXACT_SHARE", 1e-6)
    assert quad.dual_at(1.0, 9.0, 1.1, 0.25) is None


@pytest.mark.parametrize("theta2", [0.25, math.inf])
def test_quadrature_root_equals_the_plain_search(theta2):
    s, y = _margins()
    a, theta1, r = 0.9, 1.0, 1.1
    ref = solve_dual(LogisticOracle(y * s, a, theta1), r, theta2, "kl")
    quad = MarginQuadrature(y * s, bins=512)
    got = solve_from(quad, theta1 / a, ref.h * (1 + 1e-5), r, theta2, 1e-11)
    assert got is not None
    h, F, g, _, _ = got
    assert abs(g) <= 1e-11 * r
    assert F == pytest.approx(ref.value, rel=1e-12)
    assert h == pytest.approx(ref.h, rel=1e-9)


@pytest.mark.parametrize("kind", ["outliers", "heavy tails", "few values"])
def test_quadrature_on_awkward_margins(kind):
    """Margins with far outliers, Cauchy tails or a handful of distinct values: the bins cut
    at equal counts keep the dense part narrow, so the quadrature still answers (few samples
    summed one by one) and equals the exact pass."""
    rng = np.random.default_rng(3)
    n = 30_000
    s = rng.normal(0.8, 2.0, n)
    if kind == "outliers":
        s[:4] = [500.0, -300.0, 1e3, 2e3]
    elif kind == "heavy tails":
        s = 2.0 * rng.standard_cauchy(n)
    else:
        s = 0.7 * rng.integers(-3, 5, n).astype(float)
    y = np.where(rng.random(n) < 0.85, 1, -1).astype(np.int8)
    quad = MarginQuadrature(y * s, bins=512)
    for theta2 in (0.25, math.inf):
        got = quad.dual_at(1.0, 2.0, 1.1, theta2)
        assert got is not None
        F, g, curv, moved = _exact(s, y, 1.0, 1.0, 2.0, 1.1, theta2, "kl")
        assert 2.2 - got[0] == pytest.approx(2.2 - F, rel=1e-13)
        assert got[1] == pytest.approx(g, rel=1e-12, abs=1e-13)
        assert got[4] < 0.05


@pytest.mark.parametrize("theta2", [0.25, 5.0, 1e-2])
@pytest.mark.parametrize("h,a", POINTS)
def test_chi2_quadrature_equals_the_exact_pass(theta2, h, a):
    """chi2: alpha from the active set (a prefix of the sorted margins), the bins its edge
    cuts summed sample by sample; against the exact pass (BlockwiseDual.chi2 on every
    sample's d-transform)."""
    s, y = _margins()
    r = 1.1
    quad = MarginQuadrature(y * s, bins=512)
    got = quad.dual_at_chi2(1.0 / a, h, r, theta2)
    F, g, curv, moved = _exact(s, y, a, 1.0, h, r, theta2, "chi2")
    assert got is not None
    Fq, gq, cq, mq, share = got
    assert h * r - Fq == pytest.approx(h * r - F, rel=1e-13)
    assert r - gq == pytest.approx(r - g, rel=1e-13)
    assert cq == pytest.approx(curv, rel=1e-9)
    assert mq == pytest.approx(moved, rel=1e-13)
    assert share < 0.05
