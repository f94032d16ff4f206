"""Exact d-transforms of smooth losses of linear models (otstab_solvers.smooth).

Every oracle is checked against an independent maximisation (dense grid + bounded refinement,
or random-restart BFGS), its derivatives against finite differences, and its maximiser
against the definition ``h loss(x*) - theta1 ||x* - x||^2 = l_h``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from otstab_solvers.smooth import (
    CrossEntropyOracle,
    LogisticOracle,
    SquaredOracle,
    logistic_dtransform,
    logistic_steps,
)
from scipy.optimize import minimize, minimize_scalar


def softplus(u):
    return np.logaddexp(0.0, u)


def brute_logistic(m, c, h, n_grid=4001):
    """max_t h softplus(t - m) - c t^2 by a dense grid on [0, h/(2c)] and local refinement.

    Returns the value and the number of local maxima seen on the grid.
    """
    T = h / (2.0 * c)
    t = np.linspace(0.0, T * 1.05, n_grid)
    g = h * softplus(t - m) - c * t * t
    j = int(np.argmax(g))
    lo, hi = t[max(j - 1, 0)], t[min(j + 1, n_grid - 1)]
    res = minimize_scalar(lambda s: -(h * softplus(s - m) - c * s * s), bounds=(lo, hi),
                          method="bounded", options={"xatol": 1e-13 * (1 + T)})
    n_max = int(np.sum((g[1:-1] > g[:-2]) & (g[1:-1] >= g[2:])))
    return max(float(g[j]), -float(res.fun)), n_max


@pytest.fixture(scope="module")
def logistic_case():
    rng = np.random.default_rng(3)
    n = 150
    m = rng.normal(0.0, 4.0, n)
    c = np.exp(rng.normal(0.0, 1.2, n))
    return m, c


@pytest.mark.parametrize("h", [0.05, 1.0, 6.0, 40.0])
def test_logistic_dtransform_matches_dense_grid(logistic_case, h):
    m, c = logistic_case
    lh, d1, _, t = logistic_dtransform(m, c, h)
    ref = np.empty(m.size)
    n_max = np.empty(m.size, dtype=int)
    for i in range(m.size):
        ref[i], n_max[i] = brute_logistic(m[i], c[i], h)
    # the oracle is a global maximum: never below the brute force, and equal to it
    np.testing.assert_allclose(lh, ref, rtol=1e-10, atol=1e-12)
    # consistency of value, step and derivative
    np.testing.assert_allclose(lh, h * softplus(t - m) - c * t * t, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d1, softplus(t - m), rtol=1e-12)
    if h >= 6.0:
        # the nonconcave regime (two local maxima) is exercised for some samples
        assert np.any(n_max >= 2)


def test_logistic_two_branches_tie_switch():
    """Near the tie of the two local maxima the global one switches branch (far for larger h)."""
    m, c = np.array([6.0]), np.array([1.0])
    # far branch value ~ h (h/(4c) - m) + ..., near branch ~ h exp(-m): switch near h ~ 4 c m
    hs = np.linspace(20.0, 28.0, 81)
    steps = np.array([logistic_steps(m, c, h)[0] for h in hs])
    far = steps > m[0]
    assert not far[0] and far[-1]
    # once on the far branch it stays there (the switch is monotone in h)
    assert np.all(np.diff(far.astype(int)) >= 0)
    for h in (hs[np.argmax(far) - 1], hs[np.argmax(far)]):
        ref, _ = brute_logistic(m[0], c[0], h, n_grid=20001)
        assert logistic_dtransform(m, c, h)[0][0] == pytest.approx(ref, rel=1e-11)


@pytest.mark.parametrize("h", [0.3, 3.0, 25.0])
def test_logistic_derivatives_finite_differences(logistic_case, h):
    m, c = logistic_case
    lh, d1, d2, _ = logistic_dtransform(m, c, h)
    eps = 1e-5 * h
    lp, d1p, _, _ = logistic_dtransform(m, c, h + eps)
    lm, d1m, _, _ = logistic_dtransform(m, c, h - eps)
    # skip samples switching branch inside [h - eps, h + eps] (kinks of l_h)
    smooth = np.abs((lp - 2 * lh + lm) / eps**2 - d2) < 1e3 * (1 + np.abs(d2))
    assert smooth.mean() > 0.95
    np.testing.assert_allclose(((lp - lm) / (2 * eps))[smooth], d1[smooth], rtol=1e-6,
                               atol=1e-8)
    np.testing.assert_allclose(((d1p - d1m) / (2 * eps))[smooth], d2[smooth], rtol=1e-4,
                               atol=1e-7)
    assert np.all(d2 >= 0)  # l_h is convex in h


def test_logistic_oracle_argmax_and_mask():
    rng = np.random.default_rng(0)
    n, d = 40, 4
    X = rng.normal(size=(n, d))
    ys = rng.choice([-1.0, 1.0], n)
    w = rng.normal(size=d) * 2.0
    b = 0.3
    mask = np.array([True, False, True, False])
    X_before = X.copy()
    orc = LogisticOracle.from_linear(X, ys, w, b, 0.7, mask=mask)
    assert np.array_equal(X, X_before)
    for h in (0.2, 2.0, 15.0):
        lh, d1, _ = orc.evaluate(h)
        Xs = orc.argmax(h)
        np.testing.assert_array_equal(Xs[:, ~mask], X[:, ~mask])
        loss_star = softplus(-ys * (Xs @ w + b))
        np.testing.assert_allclose(loss_star, d1, rtol=1e-10)
        np.testing.assert_allclose(h * loss_star - 0.7 * np.sum((Xs - X) ** 2, axis=1), lh,
                                   rtol=1e-9, atol=1e-12)
        # no masked move does better: random masked perturbations of x* lower the objective
        for _ in range(5):
            D = rng.normal(size=(n, d)) * mask * 1e-3
            Z = Xs + D
            obj = h * softplus(-ys * (Z @ w + b)) - 0.7 * np.sum((Z - X) ** 2, axis=1)
            assert np.all(obj <= lh + 1e-12)


def test_logistic_cannot_move():
    m = np.array([-1.0, 0.0, 2.0])
    for orc in (LogisticOracle(m, 0.0, 1.0), LogisticOracle(m, 3.0, math.inf)):
        lh, d1, d2 = orc.evaluate(2.5)
        np.testing.assert_allclose(lh, 2.5 * softplus(-m))
        np.testing.assert_allclose(d1, softplus(-m))
        np.testing.assert_array_equal(d2, 0.0)
    assert LogisticOracle(m, 1.0, 1.0).h_max == math.inf


def test_logistic_oracle_validation():
    with pytest.raises(ValueError, match="theta1"):
        LogisticOracle([0.0, 1.0], 1.0, -1.0)
    with pytest.raises(ValueError, match="direction_norm2"):
        LogisticOracle([0.0, 1.0], [1.0, 2.0, 3.0], 1.0)
    with pytest.raises(ValueError, match="margins"):
        LogisticOracle([0.0, np.nan], 1.0, 1.0)
    with pytest.raises(ValueError, match="y_signs"):
        LogisticOracle.from_linear(np.zeros((2, 2)), [0, 1], [1.0, 1.0], 0.0, 1.0)
    orc = LogisticOracle([0.0, 1.0], 1.0, 1.0)
    with pytest.raises(ValueError, match="argmax needs"):
        orc.argmax(1.0)
    with pytest.raises(ValueError, match="h must be"):
        orc.evaluate(-1.0)


# ----------------------------------------------------------------------------------------------
# squared loss
# ----------------------------------------------------------------------------------------------


def test_squared_matches_numeric_maximisation():
    rng = np.random.default_rng(1)
    n, d = 30, 3
    X = rng.normal(size=(n, d))
    beta = np.array([1.0, -2.0, 0.5])
    y = X @ beta + 0.2 + rng.normal(size=n)
    theta1 = 1.5
    orc = SquaredOracle.from_linear(X, y, beta, 0.2, theta1)
    a = float(beta @ beta)
    assert orc.h_max == pytest.approx(theta1 / a)
    e = y - X @ beta - 0.2
    for frac in (0.1, 0.5, 0.9):
        h = frac * orc.h_max
        lh, d1, d2 = orc.evaluate(h)
        # 1-D numeric maximisation over the residual change s: h (e + s)^2 - theta1 s^2 / a
        for i in range(n):
            res = minimize_scalar(lambda s, i=i, h=h: -(h * (e[i] + s) ** 2 - theta1 * s * s / a))
            assert lh[i] == pytest.approx(-res.fun, rel=1e-8, abs=1e-10)
        Xs = orc.argmax(h)
        loss_star = (y - Xs @ beta - 0.2) ** 2
        np.testing.assert_allclose(loss_star, d1, rtol=1e-10)
        np.testing.assert_allclose(h * loss_star - theta1 * np.sum((Xs - X) ** 2, axis=1), lh,
                                   rtol=1e-10)
        eps = 1e-6 * h
        fd1 = (orc.evaluate(h + eps)[0] - orc.evaluate(h - eps)[0]) / (2 * eps)
        fd2 = (orc.evaluate(h + eps)[1] - orc.evaluate(h - eps)[1]) / (2 * eps)
        np.testing.assert_allclose(fd1, d1, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(fd2, d2, rtol=1e-5, atol=1e-8)
    lh, _, _ = orc.evaluate(1.01 * orc.h_max)
    assert np.all(np.isinf(lh))
    with pytest.raises(ValueError, match="h_max"):
        orc.argmax(orc.h_max)


def test_squared_masked_and_infinite_theta1():
    X = np.array([[1.0, 2.0], [0.0, -1.0]])
    beta = np.array([2.0, 1.0])
    y = np.array([1.0, 3.0])
    orc = SquaredOracle.from_linear(X, y, beta, 0.0, 1.0, mask=np.array([False, True]))
    assert orc.h_max == pytest.approx(1.0)  # ||beta_M||^2 = 1
    Xs = orc.argmax(0.5)
    np.testing.assert_array_equal(Xs[:, 0], X[:, 0])
    orc_inf = SquaredOracle.from_linear(X, y, beta, 0.0, math.inf)
    assert orc_inf.h_max == math.inf
    e2 = (y - X @ beta) ** 2
    np.testing.assert_allclose(orc_inf.evaluate(3.0)[0], 3.0 * e2)
    np.testing.assert_array_equal(orc_inf.argmax(3.0), X)


# ----------------------------------------------------------------------------------------------
# multinomial cross-entropy
# ----------------------------------------------------------------------------------------------


def ce(s, y):
    mx = np.max(s)
    return mx + np.log(np.sum(np.exp(s - mx))) - s[y]


def restart_search(S, y, W, b_scores, theta1, h, rng, n_starts=8):
    """max_delta h CE(s + W delta) - theta1 ||delta||^2 by random-restart BFGS."""
    d = W.shape[1]

    def f(dx):
        s = b_scores + W @ dx
        p = np.exp(s - np.max(s))
        p /= p.sum()
        p[y] -= 1.0
        val = -(h * ce(s, y) - theta1 * dx @ dx)
        grad = -(h * W.T @ p - 2.0 * theta1 * dx)
        return val, grad

    best = -np.inf
    scale = h * np.linalg.norm(W, 2) / theta1 + 1e-3
    for k in range(n_starts):
        x0 = np.zeros(d) if k == 0 else rng.normal(size=d) * rng.uniform(0.1, 1.5) * scale
        res = minimize(f, x0, jac=True, method="BFGS", options={"gtol": 1e-11})
        best = max(best, -res.fun)
    return best


@pytest.mark.parametrize("K", [3, 4])
def test_cross_entropy_matches_random_restarts(K):
    rng = np.random.default_rng(K)
    n, d = 15, 3
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(K, d)) * 1.5
    b = rng.normal(size=K)
    S = X @ W.T + b
    y = rng.integers(0, K, n)
    theta1 = 1.0
    orc = CrossEntropyOracle(S, y, W, theta1, X=X)
    assert orc.exact_at(0.5 * orc.h_concave) and not orc.exact_at(2 * orc.h_concave)
    for h in (0.5 * orc.h_concave, 3.0 * orc.h_concave, 40.0 * orc.h_concave):
        lh, d1, _ = orc.evaluate(h)
        ref = np.array([restart_search(S, y[i], W, S[i], theta1, h, rng) for i in range(n)])
        # never beaten by an 8-start search; equal to it in the concave regime (unique
        # maximum) and, above it, wherever the search found the best maximum
        assert np.all(lh >= ref - 1e-8 * (1 + np.abs(ref)))
        same = np.abs(lh - ref) <= 1e-7 * (1 + np.abs(ref))
        if h <= orc.h_concave:
            assert same.all()
        else:
            assert same.mean() >= 0.8
        Xs = orc.argmax(h)
        loss_star = np.array([ce(Xs[i] @ W.T + b, y[i]) for i in range(n)])
        np.testing.assert_allclose(loss_star, d1, rtol=1e-9)
        np.testing.assert_allclose(h * loss_star - theta1 * np.sum((Xs - X) ** 2, axis=1), lh,
                                   rtol=1e-9, atol=1e-12)


def test_cross_entropy_derivatives_and_mask():
    rng = np.random.default_rng(7)
    n, d, K = 30, 4, 3
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(K, d))
    b = rng.normal(size=K)
    y = rng.integers(0, K, n)
    mask = np.array([True, True, False, False])
    orc = CrossEntropyOracle(X @ W.T + b, y, W[:, mask], 0.8, X=X, mask=mask)
    for h in (0.3, 2.0, 8.0):
        _, d1, d2 = orc.evaluate(h)
        eps = 1e-5 * h
        fd1 = (orc.evaluate(h + eps)[0] - orc.evaluate(h - eps)[0]) / (2 * eps)
        fd2 = (orc.evaluate(h + eps)[1] - orc.evaluate(h - eps)[1]) / (2 * eps)
        np.testing.assert_allclose(fd1, d1, rtol=1e-6, atol=1e-8)
        ok = np.abs(fd2 - d2) < 1e3 * (1 + d2)  # away from branch switches
        assert ok.mean() > 0.9
        np.testing.assert_allclose(fd2[ok], d2[ok], rtol=1e-4, atol=1e-6)
        Xs = orc.argmax(h)
        np.testing.assert_array_equal(Xs[:, ~mask], X[:, ~mask])


def test_cross_entropy_two_classes_is_logistic():
    rng = np.random.default_rng(11)
    n, d = 50, 3
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(2, d)) * 2
    b = rng.normal(size=2)
    y = rng.integers(0, 2, n)
    S = X @ W.T + b
    orc = CrossEntropyOracle(S, y, W, 0.5, X=X)
    ys = np.where(y == 1, 1.0, -1.0)
    lo = LogisticOracle.from_linear(X, ys, W[1] - W[0], b[1] - b[0], 0.5)
    for h in (0.1, 1.0, 10.0, 60.0):
        np.testing.assert_allclose(orc.evaluate(h)[0], lo.evaluate(h)[0], rtol=1e-12,
                                   atol=1e-14)
        np.testing.assert_allclose(orc.argmax(h), lo.argmax(h), rtol=1e-10, atol=1e-12)
    assert orc.exact_at(1e6)


def test_cross_entropy_validation():
    S = np.zeros((3, 3))
    with pytest.raises(ValueError, match="labels"):
        CrossEntropyOracle(S, [0, 1, 3], np.ones((3, 2)), 1.0)
    with pytest.raises(ValueError, match="W_masked"):
        CrossEntropyOracle(S, [0, 1, 2], np.ones((2, 2)), 1.0)
    with pytest.raises(ValueError, match="scores"):
        CrossEntropyOracle(np.zeros(3), [0, 1, 2], np.ones((3, 2)), 1.0)
    orc = CrossEntropyOracle(S, [0, 1, 2], np.ones((3, 2)), 1.0)
    # W with identical rows: no move changes the scores' differences
    assert orc.q == 0
    np.testing.assert_allclose(orc.evaluate(2.0)[0], 2.0 * np.log(3.0))
