"""The lean logistic d-transform for one shared price c (otstab_solvers.logistic_uniform).

``logistic_dtransform`` takes the lean path when ``c`` is one number broadcast over the
samples; given the same prices as a full array it takes the general bracketed solve. The two
are compared on every regime (concave, the fold at T = h / 2c = 4, two local maxima, extreme
margins), and both against a 50-digit maximisation (mpmath: every stationary point located on
a fine grid, refined, the best kept).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from otstab_solvers.logistic_uniform import uniform_steps
from otstab_solvers.smooth import logistic_dtransform
from scipy.special import expit

C = 0.7


def _margins(seed=0, n=3000):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(0.5, 3.0, n), rng.uniform(-60, 60, 200),
                           [0.0, 1e-300, 800.0, -800.0, 36.0, -36.0]])


def _both(m, T):
    h = 2.0 * C * T
    lean = logistic_dtransform(m, np.broadcast_to(C, m.shape), h)
    full = logistic_dtransform(m, np.full(m.shape, C), h)
    return lean, full


@pytest.mark.parametrize("T", [1e-3, 0.3, 1.0, 2.5, 3.99, 4.0, 4.01, 4.5, 7.0, 30.0, 400.0])
def test_lean_matches_bracketed_solve(T):
    m = _margins()
    (lh, d1, d2, t), (lh0, d10, d20, t0) = _both(m, T)
    # (m = 800: the bracketed t ~ 1e-15 instead of 0 costs c t^2 ~ 1e-30)
    np.testing.assert_allclose(lh, lh0, rtol=1e-13, atol=1e-28)
    np.testing.assert_allclose(d1, d10, rtol=1e-13, atol=1e-300)
    # the step: the bracketed solve carries an absolute error of some 1e-16 (t - m form)
    np.testing.assert_allclose(t, t0, rtol=1e-12, atol=1e-15 * (1.0 + T))
    # d2 = s^2 / (2c - h s (1 - s)) is ill-conditioned at the fold (denominator -> 0)
    s0 = expit(t0 - m)
    far = np.abs(1.0 - T * s0 * (1.0 - s0)) > 1e-3
    np.testing.assert_allclose(d2[far], d20[far], rtol=1e-9, atol=1e-300)


def _mp_transform(m, c, h):
    """max_t h softplus(t - m) - c t^2 in 50 digits: the stationary points of
    h sigmoid(t - m) = 2 c t on [0, h / 2c] from a grid of sign changes, the best kept."""
    mp.mp.dps = 50
    m, c, h = mp.mpf(m), mp.mpf(c), mp.mpf(h)
    T = h / (2 * c)

    def phi(t):
        return h / (1 + mp.exp(-(t - m))) - 2 * c * t

    def g(t):
        return h * mp.log(1 + mp.exp(t - m)) - c * t * t

    grid = [T * k / 120 for k in range(121)]
    best = g(mp.mpf(0))
    for a, b in zip(grid[:-1], grid[1:]):
        if phi(a) * phi(b) <= 0:
            root = mp.findroot(phi, (a, b), solver="anderson")
            best = max(best, g(root))
    return float(best)


@pytest.mark.parametrize("T", [0.5, 3.0, 4.0, 6.0, 25.0])
def test_lean_matches_50_digits(T):
    m = np.array([-9.0, -2.5, -0.3, 0.0, 0.7, 1.9, 2.0, 3.3, 5.0, 12.0])
    m = np.concatenate([m, T / 2 + np.array([-0.4, -0.01, 0.01, 0.4])])  # around the band
    h = 2.0 * C * T
    lh = logistic_dtransform(m, np.broadcast_to(C, m.shape), h)[0]
    ref = np.array([_mp_transform(mi, C, h) for mi in m])
    # l_h = h softplus - c t^2 may be a small difference of terms of size h (|m| + T): the
    # rounding of those terms (some 1e-16 of them) is the tolerance
    tol = 1e-14 * np.abs(ref) + 4e-16 * h * (1 + np.abs(m) + T)
    assert np.all(np.abs(lh - ref) <= tol), np.abs(lh - ref) / tol


def test_accepted_roots_and_rest():
    """The accepted samples solve T sigmoid(u) = u + m to an ulp and lie in [-m, T - m]; in
    the nonconcave case the margins with two local maxima are never accepted."""
    m = _margins(1)
    for T in (0.2, 2.0, 6.0, 50.0):
        u, s, rest = uniform_steps(m, C, 2.0 * C * T)
        ok = np.ones(m.size, bool)
        ok[rest] = False
        t = T * s[ok]
        np.testing.assert_allclose(t, u[ok] + m[ok], rtol=1e-13, atol=1e-13 * (1 + T))
        np.testing.assert_allclose(s[ok], 1 / (1 + np.exp(-u[ok])), rtol=1e-14, atol=1e-300)
        if T > 4:
            L = 2 * math.atanh(math.sqrt(1 - 4 / T))
            lo = T / (1 + math.exp(L)) + L
            hi = T / (1 + math.exp(-L)) - L
            band = (m >= lo) & (m <= hi)
            assert band.any() and not (ok & band).any()


def test_zero_price_paths_unchanged():
    """h = 0, c = inf and per-sample prices keep the general solve (no lean path)."""
    m = _margins(2, 50)
    lh, d1, d2, t = logistic_dtransform(m, np.broadcast_to(math.inf, m.shape), 3.0)
    np.testing.assert_array_equal(t, 0.0)
    np.testing.assert_allclose(d1, np.logaddexp(0.0, -m))
    lh0 = logistic_dtransform(m, np.broadcast_to(C, m.shape), 0.0)[0]
    np.testing.assert_array_equal(lh0, 0.0)
