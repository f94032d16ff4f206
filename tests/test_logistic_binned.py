"""The logistic dual searched from binned margins (otstab_solvers.logistic_binned) and the
two-branch Newton solve of the nonconcave d-transform (logistic_uniform.two_branch_steps).

The binned root only chooses where the exact dual is evaluated: certificates through it are
compared with the plain exact search (value, h, risk, cost and Q* as a measure) over
divergences, prices, thresholds, sample weights, feature masks, float32 input and the
nonconcave regime; the two-point rule's moment identities and the accuracy of its root are
checked directly, and the two-branch solve against the robust bracketed one.
"""

from __future__ import annotations

import math

import numpy as np
import otstab_solvers.logistic_binned as lb
import pytest
from otstab_solvers.dual import solve_dual
from otstab_solvers.logistic_uniform import two_branch_steps, uniform_steps
from otstab_solvers.smooth import LogisticOracle, logistic_steps
from reference import measure_by_row

import otstab
from otstab.modeling._models import per_sample_losses


def _binary(n=3000, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d) / 2
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    return otstab.LinearModel(coef, 0.2), X, y


def _certify(monkeypatch, binned, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(lb, "MIN_N", 0 if binned else 1 << 62)
        return otstab.certify(*args, **kw)


def _same(res, ref):
    assert res.status == ref.status == "optimal"
    assert res.value == pytest.approx(ref.value, rel=1e-9)
    assert res.h == pytest.approx(ref.h, rel=1e-9)
    for f in ("risk_star", "total_mass", "primal_cost"):
        assert getattr(res, f) == pytest.approx(getattr(ref, f), rel=1e-9, abs=1e-14)
    n = int(max(np.max(res.source), np.max(ref.source))) + 1
    ma, mb = measure_by_row(res, n), measure_by_row(ref, n)
    # both h solve g(h) = 0 to some 1e-11 of r, not to the same bits: a chi2 weight near the
    # edge of the active set (w near 0) moves by about that much in absolute terms
    for key in ma:
        np.testing.assert_allclose(ma[key], mb[key], rtol=1e-8,
                                   atol=1e-9 if key == "x" else 1e-10, err_msg=key)


@pytest.mark.parametrize("price", [("kl", 0.3), ("chi2", 0.3), ("kl", math.inf)])
@pytest.mark.parametrize("t", [0.01, 0.5, 0.95])
@pytest.mark.parametrize("extra", ["none", "weights", "features", "float32"])
def test_binned_search_equals_plain_search(monkeypatch, price, t, extra):
    model, X, y = _binary()
    losses = per_sample_losses(model, X, y, "logistic")
    r = float(losses.mean() + t * (losses.max() - losses.mean()))
    divergence, theta2 = price
    kw = dict(loss="logistic", r=r, theta1=0.7, theta2=theta2, divergence=divergence,
              se=None)
    if extra == "weights":
        kw["sample_weight"] = np.random.default_rng(3).uniform(0.2, 3.0, X.shape[0])
    elif extra == "features":
        kw["features"] = [0, 2]
    elif extra == "float32":
        X = X.astype(np.float32)
    res = _certify(monkeypatch, True, model, X, y, **kw)
    ref = _certify(monkeypatch, False, model, X, y, **kw)
    assert "binned_h" in res.info and "binned_h" not in ref.info
    _same(res, ref)
    # the binned root is close: the exact search needs at most three evaluations from it
    # (chi2 too: its alpha from the binned one, its sums in the same pass)
    assert res.info["passes"] <= 3 < ref.info["passes"]


@pytest.mark.parametrize("divergence,theta2", [("kl", 1.0), ("chi2", 1.0), ("kl", math.inf)])
def test_binned_search_nonconcave(monkeypatch, divergence, theta2):
    """theta1 small: h / 2c well above 4, two local maxima for many samples (the binned
    dual's l_h has a kink in the margin: its root is rougher, the answer the same)."""
    model, X, y = _binary(seed=1)
    kw = dict(loss="logistic", r=8.0, theta1=0.05, theta2=theta2, divergence=divergence,
              se=None)
    res = _certify(monkeypatch, True, model, X, y, **kw)
    ref = _certify(monkeypatch, False, model, X, y, **kw)
    assert "binned_h" in res.info
    assert res.h * float(model.coef_ @ model.coef_) / (2 * 0.05) > 4  # nonconcave
    _same(res, ref)


def test_points_oracle_warm_starts(monkeypatch):
    """The binned points' oracle starts each evaluation from the last one's steps when h
    moved by at most 10%: the same d-transform as the plain oracle (rtol 1e-13) along a
    search-like sequence of h (concave and two-maxima regimes), in fewer sigmoids."""
    import otstab_solvers.logistic_uniform as lu

    rng = np.random.default_rng(4)
    m = np.sort(rng.normal(0.5, 2.0, 8192))
    calls: list = []
    real = lu.expit
    monkeypatch.setattr(lu, "expit", lambda x, out=None: calls.append(x.size) or
                        real(x, out=out))
    hs = [1.0, 1.05, 1.049, 1.0491, 3.0, 3.2, 12.0, 12.5, 12.49]  # (T = h / 2.5: 0.4 to 5)
    spent = {}
    for name, cls in (("warm", lb._PointsOracle), ("plain", LogisticOracle)):
        oracle = cls(m, 0.8, 1.0)
        calls.clear()
        got = [oracle.evaluate(h) for h in hs]
        spent[name] = sum(calls)
        if name == "warm":
            warm = got
    for a, b in zip(warm, got):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-300)
    assert spent["warm"] < 0.8 * spent["plain"]


def test_large_n_takes_the_binned_search():
    n = lb.MIN_N + 1000
    model, X, y = _binary(n=n, d=3, seed=2)
    res = otstab.certify(model, X, y, loss="logistic", r=1.0, theta1=1.0, theta2=0.5,
                         divergence="kl", se=None)
    assert res.status == "optimal" and "binned_h" in res.info
    assert res.info["passes"] <= 3
    assert res.h == pytest.approx(res.info["binned_h"], rel=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_two_point_rule_matches_the_moments(weighted):
    rng = np.random.default_rng(4)
    m = np.concatenate([rng.normal(1.0, 2.0, 50_000), rng.uniform(-30, 30, 100), [5.0] * 7])
    p = rng.uniform(0.0, 2.0, m.size) if weighted else None
    if p is not None:
        p /= p.sum()
    pts, mass = lb.binned_margins(lambda s, e: m[s:e], m.size, p, bins=512)
    assert pts.size <= 2 * 512 and np.all(np.diff(pts) >= 0)
    assert mass.sum() == pytest.approx(1.0, rel=1e-14)
    assert pts.min() >= m.min() and pts.max() <= m.max()
    w = np.full(m.size, 1.0 / m.size) if p is None else p
    # each bin's two points carry its mass, mean and variance: so do all of them together
    assert float(mass @ pts) == pytest.approx(float(w @ m), rel=1e-12)
    assert float(mass @ pts ** 2) == pytest.approx(float(w @ m ** 2), rel=1e-10)


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.25), ("chi2", 0.25), ("kl", math.inf)])
def test_binned_root_is_close_to_the_exact_root(divergence, theta2):
    rng = np.random.default_rng(5)
    m = rng.normal(1.0, 1.5, 40_000)
    a, theta1, r = 0.8, 1.0, 1.0
    exact = solve_dual(LogisticOracle(m, a, theta1), r, theta2, divergence)
    h_c = lb.binned_guess(lambda s, e: m[s:e], m.size, a, theta1, r, theta2, divergence)
    assert exact.status == "optimal"
    assert h_c == pytest.approx(exact.h, rel=1e-6)


def test_binned_guess_none_below_the_base_risk():
    m = np.random.default_rng(6).normal(2.0, 1.0, 5000)
    assert lb.binned_guess(lambda s, e: m[s:e], m.size, 1.0, 1.0, 0.01, 0.5, "kl") is None


@pytest.mark.parametrize("T", [4.5, 7.0, 30.0, 400.0])
def test_two_branch_steps_match_the_bracketed_solve(T):
    c = 0.7
    h = 2.0 * c * T
    rng = np.random.default_rng(7)
    L = 2.0 * math.atanh(math.sqrt(1.0 - 4.0 / T))
    lo_band = T / (1.0 + math.exp(L)) + L
    hi_band = T - T / (1.0 + math.exp(L)) - L
    m = np.concatenate([rng.uniform(lo_band, hi_band, 2000), rng.normal(T / 2, T, 2000),
                        [lo_band, hi_band, lo_band * (1 + 1e-6), hi_band * (1 - 1e-6)]])
    u, s, ok = two_branch_steps(m, c, h)
    assert ok.mean() > 0.95  # (a few near the folds go to the robust solve)
    t_ref = logistic_steps(m, c, h)
    np.testing.assert_allclose((s * T)[ok], t_ref[ok], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose((u + m)[ok], t_ref[ok], rtol=1e-12, atol=1e-11)
    # the band samples were those uniform_steps left to the robust solve
    assert uniform_steps(m, c, h)[2].size >= 2000


def test_may_switch_only_where_nonconcave():
    oracle = LogisticOracle(np.zeros(3), 2.0, 1.0)  # c = 0.5: nonconcave iff h > 4
    assert not oracle.may_switch(4.0) and oracle.may_switch(4.0001)
    per_sample = LogisticOracle(np.zeros(3), np.array([2.0, 1.0, 0.0]), 1.0)  # c 0.5, 1, inf
    assert per_sample.may_switch(4.1) and not per_sample.may_switch(3.9)


@pytest.mark.parametrize("weighted", [False, True])
def test_chi2_edge_one_pass_equals_plain_search(monkeypatch, weighted):
    """chi2 with the edge of the active set inside the data (some samples at weight 0): the
    binned root refined at the edge is accepted by one exact pass, whose alpha and sums give
    the certificate of the plain exact search (value, h, risk, cost, Q* as a measure)."""
    model, X, y = _binary(n=20_000, seed=4)
    losses = per_sample_losses(model, X, y, "logistic")
    r = float(losses.mean() + 0.9 * (losses.max() - losses.mean()))
    kw = dict(loss="logistic", r=r, theta1=0.7, theta2=0.05, divergence="chi2", se=None)
    if weighted:
        kw["sample_weight"] = np.random.default_rng(5).uniform(0.2, 3.0, X.shape[0])
    res = _certify(monkeypatch, True, model, X, y, **kw)
    ref = _certify(monkeypatch, False, model, X, y, **kw)
    assert "binned_h" in res.info and res.info["passes"] == 1
    w = np.asarray(res.weights)
    assert 0.05 < np.mean(w == 0) < 0.95  # (an edge inside the data)
    _same(res, ref)
    if not weighted:  # without the margins at the edge: a Newton step, more passes
        monkeypatch.setattr(lb, "KINK_ROUNDS", 0)
        plain = _certify(monkeypatch, True, model, X, y, **kw)
        assert plain.info["passes"] >= 2 and plain.info["binned_h"] != res.info["binned_h"]
        _same(plain, ref)
