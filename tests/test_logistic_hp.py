"""The logistic certificate against a 30-digit dual (mpmath), independent of otstab's solvers.

For a linear binary model every sample's d-transform is ``l_h(m) = max_t h log(1 + e^(t - m))
- c t^2`` with ``c = theta1 / ||w||^2`` (``m`` the margin from the model's own
decision_function). Here it is solved in mpmath at 30 digits (the stationarity condition
``T sigmoid(u) = u + m`` in ``u = t - m``, ``T = h / 2c``, by bracketed root finding on
``[-m, T - m]``: one root in the concave regime ``T <= 4`` that the thresholds below stay
in); the dual ``sup_h h r - T(h)`` by the root of its derivative ``g(h) = r - E_w[loss at the
maximiser]`` (KL by exp/log, chi2 by the exact active set of ``tests/hp_dual.py``, theta2 =
inf the plain mean). The certificate (its plain exact search, and the binned root with one
exact pass forced at this small n) must give the same value, h, and Q* as a measure: each
sample's weight and its weighted loss at the maximiser.
"""

from __future__ import annotations

import math
from decimal import Decimal

import hp_dual
import mpmath as mp
import numpy as np
import otstab_solvers.logistic_binned as lb
import pytest
from reference import measure_by_row

import otstab

DPS = 30


def _data(n=14, seed=5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    coef = np.array([0.9, -0.6, 0.4])
    y = np.where(X @ coef + 0.6 * rng.standard_normal(n) > 0, 1, -1)
    return otstab.LinearModel(coef, 0.15), X, y


def _lh(m, c, h):
    """(l_h, loss at the maximiser) of margin ``m`` at ``h`` (concave regime)."""
    T = h / (2 * c)
    u = mp.findroot(lambda v: T / (1 + mp.exp(-v)) - v - m, (-m, T - m), solver="illinois")
    loss = mp.log1p(mp.exp(u))
    t = u + m
    return h * loss - c * t * t, loss


def _dual(margins, c, r, theta2, divergence, p):
    """(value, h, weights, losses at the maximisers) of the 30-digit dual."""
    ms = [mp.mpf(float(v)) for v in margins]
    pp = [mp.mpf(float(q)) for q in p]
    rr, cc = mp.mpf(float(r)), mp.mpf(float(c))

    def parts(h):
        got = [_lh(m, cc, h) for m in ms]
        lh = [Decimal(mp.nstr(v[0], DPS + 5)) for v in got]
        pd = [Decimal(mp.nstr(q, DPS + 5)) for q in pp]
        t2 = None if math.isinf(theta2) else Decimal(repr(theta2))
        term, w = hp_dual._term_and_weights(lh, pd, t2, divergence)
        return (mp.mpf(str(term)), [mp.mpf(str(x)) for x in w], [v[1] for v in got])

    def g(h):
        _, w, d = parts(h)
        return rr - mp.fsum(q * x * y for q, x, y in zip(pp, w, d))

    hi = mp.mpf(1)
    while g(hi) > 0:
        hi *= 2
    h = mp.findroot(g, (mp.mpf("1e-12"), hi), solver="illinois", tol=mp.mpf(10) ** (-2 * DPS + 6))
    term, w, d = parts(h)
    return float(h * rr - term), float(h), np.array([float(x) for x in w]), \
        np.array([float(x) for x in d])


@pytest.mark.parametrize("binned", [False, True])
@pytest.mark.parametrize("divergence,theta2", [("kl", 0.5), ("chi2", 0.5), ("kl", math.inf)])
@pytest.mark.parametrize("weighted", [False, True])
def test_logistic_certificate_against_30_digits(monkeypatch, binned, divergence, theta2,
                                                weighted):
    model, X, y = _data()
    n = X.shape[0]
    margins = y * model.decision_function(X)
    losses = np.logaddexp(0.0, -margins)
    sw = np.random.default_rng(7).uniform(0.3, 2.0, n) if weighted else None
    p = np.full(n, 1.0 / n) if sw is None else sw / sw.sum()
    base = float(p @ losses)
    r = base + 0.3 * (float(losses.max()) - base)
    theta1 = 2.0
    c = theta1 / float(model.coef_ @ model.coef_)
    with mp.workdps(DPS):
        value, h, w, d = _dual(margins, c, r, theta2, divergence, p)
    assert h / (2 * c) < 4.0  # (the concave regime: one root per sample)
    monkeypatch.setattr(lb, "MIN_N", 0 if binned else 1 << 62)
    kw = dict(loss="logistic", r=r, theta1=theta1, theta2=theta2, divergence=divergence,
              se=None)
    if sw is not None:
        kw["sample_weight"] = sw
    res = otstab.certify(model, X, y, **kw)
    assert res.status == "optimal"
    assert ("binned_h" in res.info) == binned
    assert res.value == pytest.approx(value, rel=1e-10)
    assert res.h == pytest.approx(h, rel=1e-8)
    # Q* as a measure: sample i carries P0-mass p_i times its weight w_i, at its maximiser
    q = measure_by_row(res, n)
    np.testing.assert_allclose(q["mass"], 1.0, rtol=1e-12)
    np.testing.assert_allclose(q["wmass"], w, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(q["loss"], w * d, rtol=1e-8, atol=1e-10)
    assert res.risk_star == pytest.approx(r, rel=1e-9)
