"""The 0/1 closed form from a window of the sorted prices (``RowPrices.solve_window``,
``otstab_solvers.zero_one.solve_window``) against the closed form on every sorted price:
the same h, the same value up to the order of the sums (1e-12 relative), and whole
certificates equal to those of the stored n-vector of prices."""

from __future__ import annotations

import math

import numpy as np
import pytest
from otstab_solvers.zero_one import solve_window, solve_zero_one, zero_one_objective

import otstab
from otstab import zero_one as zo
from otstab.modeling._models import per_sample_losses, resolve_model

INF = math.inf


def _prices(n=3000, seed=0, zeros=400):
    rng = np.random.default_rng(seed)
    a = np.sort(np.concatenate([np.zeros(zeros), rng.exponential(size=n - zeros) ** 2]))
    a[n - zeros + 350:n - zeros + 360] = a[n - zeros + 350]  # ties
    return np.sort(a)


def _summaries(s, lo, hi, theta2):
    """What RowPrices._window sums, from the sorted prices directly."""
    below = s[s < lo] if lo > 0 else s[:0]
    win = s[(s >= lo) & (s <= hi) & np.isfinite(s)]
    small = math.isfinite(theta2) and lo / theta2 < 0.5
    em1 = float(np.sum(np.expm1((lo - below) / theta2))) if small else math.nan
    ex = math.exp(-lo / theta2) * (below.size + em1) if small else \
        float(np.sum(np.exp(np.maximum(below * (-1.0 / theta2), -700.0))))
    fin = np.isfinite(s)
    return win, dict(below=below.size, below_exp=ex, below_gap=float(np.sum(lo - below)),
                     lo=lo, n_zero=int(np.sum(s == 0)), n_fin=int(fin.sum()),
                     top=not np.any(fin & (s > hi)), below_em1=em1)


@pytest.mark.parametrize("theta2", [0.01, 0.25, 3.0, INF])
@pytest.mark.parametrize("r", [0.14, 0.3, 0.7, 0.97])
def test_window_equals_the_full_closed_form(theta2, r):
    s = _prices()
    s[-5:] = INF  # (prices that cannot move: last)
    ref = solve_zero_one(s, r, theta2, "kl", presorted=True)
    assert ref.status == "optimal"
    hits = 0
    for k_lo in (0, 200, 400, 900, 1500, 2100, 2600, 2900):
        for width in (30, 300, 3000):
            lo = float(s[k_lo]) if k_lo else 0.0
            k_hi = k_lo + width
            hi = float(s[k_hi]) if k_hi < s.size and math.isfinite(s[k_hi]) else INF
            win, kw = _summaries(s, lo, hi, theta2)
            sol = solve_window(win, r, theta2, "kl", s.size, **kw)
            if sol is None:
                continue
            hits += 1
            assert sol.h == pytest.approx(ref.h, rel=1e-13)  # (a kink: exactly)
            assert sol.value == pytest.approx(ref.value, rel=1e-12)
            if math.isfinite(theta2):
                for key in ("n_moved", "n_tied"):
                    assert sol.info[key] == ref.info[key]
                for key in ("moved_weight", "unit_weight"):
                    assert sol.info[key] == pytest.approx(ref.info[key], rel=1e-12)
    assert hits >= 1  # (the widest window from 0 holds every answer)
    # a window that holds the answer is found; one that misses it says so (None)
    j = ref.info["n_moved"] if math.isfinite(theta2) else int(np.searchsorted(s, ref.h))
    win, kw = _summaries(s, float(s[j + 50]), float(s[j + 80]), theta2)
    assert solve_window(win, r, theta2, "kl", s.size, **kw) is None


def _data(n, seed=0, d=5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d) / np.sqrt(d)
    y = np.where(X @ coef + 0.3 * rng.standard_normal(n) > 0, 1, -1)
    return otstab.LinearModel(coef, 0.1), X, y


@pytest.mark.parametrize("theta1", [1.0, 2.5])
def test_row_prices_window_equals_sorting_every_price(monkeypatch, theta1):
    monkeypatch.setattr(zo, "SUBSAMPLE", 256)  # a strided subsample at n = 6000
    model, X, y = _data(6000)
    prob = resolve_model(model, X, y, loss="zero_one")
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    n_window = 0
    for t in (0.001, 0.01, 0.5, 0.95, 0.999):
        r = b + t * (1.0 - b)
        for theta2 in (0.01, 0.25, 3.0, INF):
            rp, _ = zo.linear_prices(prob, None, theta1)
            rp.BLOCK = 999  # (several blocks, a partial last one)
            sol = rp.solve_window(r, theta2, "kl")
            ref = solve_zero_one(rp.sorted(), r, theta2, "kl", presorted=True)
            if sol is None:
                continue
            n_window += 1
            assert sol.h == pytest.approx(ref.h, rel=1e-13)  # (a kink: exactly)
            assert sol.value == pytest.approx(ref.value, rel=1e-12)
    assert n_window >= 18  # (the window misses rarely: a wider one is tried first)


FIELDS = ("value", "h", "risk_star", "primal_cost", "total_mass", "status", "split")


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("kl", 0.02), ("kl", INF),
                                                ("chi2", INF)])
@pytest.mark.parametrize("t", [0.01, 0.5, 0.95])
@pytest.mark.parametrize("sampled", [False, True])
def test_certificate_through_the_window_equals_the_stored_prices(monkeypatch, divergence,
                                                                 theta2, t, sampled):
    """Q* as a measure (atoms, weights, masses, losses) and every audited number equal those
    of the certificate through the n-vector of prices (the closed form on all of them).
    ``sampled``: above AUDIT_DIRECT_MAX rows, where the moves of the rows below h are summed
    by the pass that finds them (RowPrices.near_weighted), the rest by _finish."""
    from otstab.solve import _audit

    monkeypatch.setattr(zo, "SUBSAMPLE", 256)
    if sampled:
        monkeypatch.setattr(_audit, "AUDIT_DIRECT_MAX", 1000)
        monkeypatch.setattr(zo, "REDUCED_BLOCK", 300)  # (several blocks of moved rows)
    model, X, y = _data(5000, seed=3)
    prob = resolve_model(model, X, y, loss="zero_one")
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    r = b + t * (1.0 - b)
    used = []
    real = zo.RowPrices.solve_window
    real_pw = zo._price_weights
    summed = []

    def spy_pw(*args):
        got = real_pw(*args)
        summed.append(got[0].sums.get("n_below", -1))
        return got
    monkeypatch.setattr(zo, "_price_weights", spy_pw)

    def spy(self, *args):
        sol = real(self, *args)
        used.append(sol is not None)
        return sol
    monkeypatch.setattr(zo.RowPrices, "solve_window", spy)
    lean = zo.certify_zero_one_problem(prob, r, 1.0, theta2, divergence, None, "auto", 0.0)
    dstar, near = zo.linear_distances(prob, None)
    ref = zo._solve_and_build(dstar, near.misclassified, r, 1.0, theta2, divergence, "auto",
                              prob.X, near, prob.y, prob.losses, prob.feature_names,
                              prob.index, 0.0, dstar)
    assert lean.status == ref.status == "optimal"
    assert used == [True]  # (the window held the answer)
    assert lean.info["audit"]["method"] == ("sampled" if sampled else "direct")
    assert (summed[0] > 0) if sampled else summed == [-1]  # (the pass summed the moves)
    for f in FIELDS:
        x, z = getattr(lean, f), getattr(ref, f)
        assert x == (pytest.approx(z, rel=1e-12) if isinstance(x, float) else z), f
    for f in ("source", "loss_star", "X_star"):
        np.testing.assert_array_equal(getattr(lean, f), getattr(ref, f), err_msg=f)
    # the split atom's mass is (n r - risk) / gain: the rounding of the risk's sums (in
    # another order), n eps, over a gain of about 1
    np.testing.assert_allclose(lean.mass, ref.mass, rtol=0, atol=100 * X.shape[0] * 2e-16)
    np.testing.assert_allclose(lean.weights, ref.weights, rtol=1e-12, atol=0)
    # and the measure answers the question: its risk is r, its cost the value, which is the
    # dual objective at h summed directly over every price (zero_one_objective)
    w = lean.weights * lean.mass
    assert float(np.sum(w * lean.loss_star)) / X.shape[0] == pytest.approx(r, rel=1e-9)
    assert lean.primal_cost == pytest.approx(lean.value, rel=1e-8)
    direct = zero_one_objective(dstar, lean.h, r, theta2, divergence)
    assert lean.value == pytest.approx(direct, rel=1e-12)


def test_kl_phi_from_the_exponents_equals_phi_of_the_weights():
    """phi_KL of Q*'s weights from their exponents (no log) equals weights.phi of them, also
    for weights within NEAR_ONE of 1 (the series) and far from it."""
    from otstab_solvers.weights import phi

    a = np.concatenate([np.linspace(0.0, 3.0, 4001), [0.5 - 1e-9, 0.5, 0.5 + 1e-12]])
    for h, uw, theta2 in ((0.5, 0.9, 0.25), (2.0, 0.01, 0.3), (0.5, 1.0, 1e3),
                          (1e-6, 0.999999, 0.25)):
        sol = type("Sol", (), {"info": {"unit_weight": uw}})()
        fn = zo._row_weight_fn(h, sol, theta2, "kl")
        w, p = fn(a, with_phi=True)
        np.testing.assert_array_equal(w, fn(a))
        ref = phi(w, "kl")
        # (just above NEAR_ONE both forms keep w t - (w - 1) to an absolute eps or so)
        np.testing.assert_allclose(p, ref, rtol=1e-13, atol=1e-15)
        assert np.sum(p) == pytest.approx(np.sum(ref), rel=1e-13)


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("chi2", 0.25), ("kl", INF)])
def test_weighted_sums_over_blocks_equal_replicated_rows(monkeypatch, divergence, theta2):
    """Sample weights: q = n p is read per block (_RowMass) and Q*'s sums over blocks of
    its rows; with blocks of 64 rows the certificate equals the one on replicated rows."""
    from otstab_solvers import weights as sw

    monkeypatch.setattr(zo, "REDUCED_BLOCK", 64)
    monkeypatch.setattr(sw, "PMEAN_BLOCK", 64)
    model, X, y = _data(700, seed=4)
    k = np.random.default_rng(5).integers(0, 4, size=700)
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    kw = dict(loss="zero_one", r=b + 0.4 * (1.0 - b), theta1=1.0, theta2=theta2,
              divergence=divergence)
    res = otstab.certify(model, X, y, sample_weight=k, **kw)
    ref = otstab.certify(model, np.repeat(X, k, axis=0), np.repeat(y, k), **kw)
    assert res.status == ref.status == "optimal"
    for f in ("value", "risk_star", "primal_cost", "total_mass"):
        assert getattr(res, f) == pytest.approx(getattr(ref, f), rel=1e-10), f


def test_misclassified_is_the_zero_one_rule_with_ties():
    """The blockwise booleans equal ZeroOne.values of the scores, ties at a score of 0 to the
    negative class."""
    from otstab.modeling._losses import zero_one

    model, X, y = _data(3000, seed=6)
    prob = resolve_model(model, X, y, loss="hinge")
    S = prob.scores.copy()
    S[::7] = 0.0
    S[1::11] = -0.0
    prob.scores = S
    got = zo.misclassified(prob, S)
    np.testing.assert_array_equal(got, zero_one.values(S, prob.y) > 0)
    assert got[::7].sum() == np.count_nonzero(prob.y[::7] > 0)
