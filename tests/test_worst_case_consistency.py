"""Consistency of the worst-case estimators with the OT core (WORST_CASE.md, "Relation to the
OT criterion"): reweighting only (theta1 = inf) with KL on the fitted E[loss | Z] of a Gaussian
case gives theta2 (r - m)^2 / (2 s^2) -- the KL projection of N(m, s^2) onto {mean >= r} is the
exponential tilt N(r, s^2), at cost (r - m)^2 / (2 s^2)."""

import math

import numpy as np
import pytest

import otstab


def test_kl_certify_on_fitted_conditional_loss_matches_gaussian_formula():
    sk = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(0)
    n, m, s, tau = 20_000, 5.0, 1.0, 1.0
    Z = rng.normal(size=(n, 1))
    losses = m + s * Z[:, 0] + tau * rng.normal(size=n)
    wc = otstab.worst_subpopulation(losses, Z, p=0.5, regressor=sk.LinearRegression(),
                                    random_state=0)
    mu = wc.h  # cross-fitted E[loss | Z] per row, ~ N(m, s^2)
    assert mu.min() > 0
    # a model whose per-sample absolute loss is exactly mu: the zero regressor with targets mu
    model = otstab.LinearModel([0.0], 0.0, task="regression")
    theta2 = 1.0
    m_hat, s_hat = float(mu.mean()), float(mu.std())
    for delta in (0.25, 0.5):
        r = m_hat + delta
        res = otstab.certify(model, np.zeros((n, 1)), mu, loss="absolute", r=r,
                             theta1=math.inf, theta2=theta2)
        expected = theta2 * (r - m_hat) ** 2 / (2 * s_hat**2)
        # the sample is Gaussian only up to O(1/sqrt(n)) in its third cumulant, which moves
        # the tilt's cost by a relative O(delta * skew / s) ~ 1e-2 at n = 20,000
        assert res.value == pytest.approx(expected, rel=0.03)
        assert res.gap <= 1e-6 and res.risk_star == pytest.approx(r, abs=1e-9)
