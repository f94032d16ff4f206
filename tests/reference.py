"""Independent brute-force references for the tests.

Nothing here calls otstab's reduction or solvers: the d-transform is written out per loss from
margins / residuals / scores, the dual is maximised by a grid scan plus scipy's bounded Brent
search, and the chi2 alpha is found by scipy's brentq on its defining equation.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.special import logsumexp


def lh_hinge(margins, wnorm2, theta1, h):
    """max(0, (1 - m) h + ||w||^2 h^2 / (4 theta1)) (pieces: stay at 0, move along -y w)."""
    quad = 0.0 if math.isinf(theta1) else wnorm2 * h * h / (4 * theta1)
    return np.maximum(0.0, (1 - margins) * h + quad)


def lh_pwl_residual(resid, slopes, intercepts, wnorm2, theta1, h):
    """max_k (a_k e + b_k) h + a_k^2 ||w||^2 h^2 / (4 theta1) for residual losses."""
    out = -np.inf
    for a, b in zip(slopes, intercepts):
        quad = 0.0 if math.isinf(theta1) else a * a * wnorm2 * h * h / (4 * theta1)
        out = np.maximum(out, (a * resid + b) * h + quad)
    return out


def lh_multiclass(S, y, W, theta1, h):
    """Crammer-Singer: max_k (1[k!=y] + s_k - s_y) h + ||w_k - w_y||^2 h^2 / (4 theta1)."""
    n, K = S.shape
    out = np.zeros(n)
    for k in range(K):
        c1 = np.where(y == k, 0.0, 1.0 + S[:, k] - S[np.arange(n), y])
        dw = W[k][None, :] - W[y]
        quad = 0.0 if math.isinf(theta1) else np.sum(dw * dw, axis=1) * h * h / (4 * theta1)
        out = np.maximum(out, c1 * h + quad)
    return out


def chi2_alpha_brentq(lh, theta2):
    f = lambda a: np.mean(np.maximum((lh + a) / (2 * theta2) + 1, 0)) - 1  # noqa: E731
    lo = -2 * theta2 - lh.max() - 1.0
    hi = -lh.min() + 1.0
    while f(hi) < 0:
        hi = 2 * abs(hi) + 1
    return brentq(f, lo, hi, xtol=1e-15, rtol=1e-15, maxiter=500)


def dual_value(lh_fn, r, theta2, divergence, h_hi=None):
    """max_{h >= 0} of the dual by grid scan + bounded Brent; returns (value, h)."""

    def F(h):
        lh = lh_fn(h)
        if math.isinf(theta2):
            return h * r - np.mean(lh)
        if divergence == "kl":
            return h * r - theta2 * (logsumexp(lh / theta2) - math.log(lh.size))
        a = chi2_alpha_brentq(lh, theta2)
        w = np.maximum((lh + a) / (2 * theta2) + 1, 0)
        return h * r + a + theta2 - theta2 * np.mean(w * w)

    if h_hi is None:
        h_hi = 1.0
        while F(2 * h_hi) > F(h_hi) and h_hi < 1e8:
            h_hi *= 2
        h_hi *= 4
    grid = np.linspace(0, h_hi, 401)
    vals = np.array([F(h) for h in grid])
    i = int(np.argmax(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    best_h, best = grid[i], vals[i]
    if hi > lo:
        res = minimize_scalar(lambda h: -F(h), bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-13 * max(1.0, hi), "maxiter": 500})
        if -res.fun > best:
            best_h, best = res.x, -res.fun
        # Brent stops at ~sqrt(eps) relative in h, which costs ~1e-8 in value when the optimum
        # sits at a kink; finish with a golden-section search on the concave F (to ~1e-15)
        g = (math.sqrt(5) - 1) / 2
        a, b = lo, hi
        c, d = b - g * (b - a), a + g * (b - a)
        Fc, Fd = F(c), F(d)
        for _ in range(160):
            if Fc >= Fd:
                b, d, Fd = d, c, Fc
                c = b - g * (b - a)
                Fc = F(c)
            else:
                a, c, Fc = c, d, Fd
                d = a + g * (b - a)
                Fd = F(d)
        for hh, val in ((c, Fc), (d, Fd)):
            if val > best:
                best_h, best = hh, val
    return max(best, F(0.0)), best_h


def measure_by_row(res, n):
    """Q* of ``res`` as a measure, aggregated per source row.

    Two numerically different paths may split a tied sample differently (one atom in one path,
    two atoms at the same or at equally good points in the other): the atom lists differ while
    the measure does not. Per source row i this returns the mass (sum of the atoms' masses), the
    weighted mass (sum of mass * weight), the weighted first moment of x* and the weighted loss
    at x*: what a Q* means, independent of how its atoms are listed.
    """
    src = np.asarray(res.source)
    mass, w = np.asarray(res.mass, float), np.asarray(res.weights, float)
    Xs = np.asarray(res.X_star, float)
    mw = mass * w
    out = {"mass": np.bincount(src, mass, minlength=n),
           "wmass": np.bincount(src, mw, minlength=n),
           "loss": np.bincount(src, mw * np.asarray(res.loss_star, float), minlength=n)}
    out["x"] = np.stack([np.bincount(src, mw * Xs[:, j], minlength=n)
                         for j in range(Xs.shape[1])], axis=1)
    return out


def assert_same_measure(res, ref, n, rtol=1e-8, atol=1e-12):
    """Equal certificates as measures: status, value, h, risk, cost, mass, and Q* aggregated per
    source row (``measure_by_row``), never the atom lists themselves."""
    assert res.status == ref.status
    for f in ("value", "h", "risk_star", "total_mass", "primal_cost"):
        a, b = getattr(res, f), getattr(ref, f)
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=1e-14), (f, a, b)
    ma, mb = measure_by_row(res, n), measure_by_row(ref, n)
    for key in ma:
        np.testing.assert_allclose(ma[key], mb[key], rtol=rtol, atol=atol, err_msg=key)
