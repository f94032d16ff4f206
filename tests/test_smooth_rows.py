"""The margin / residual path of the smooth losses (otstab.smooth._certify_rows).

A binary linear classifier with the logistic loss (or the two-class cross-entropy) and a linear
regressor with the squared loss are certified from their scores, blockwise, with Q* built as
each sample's step along ``w_M``. Checked against:

- the dense path (the whole-vector oracle, every atom materialised and re-scored by the model),
  the path these certificates took before, across divergences, prices, sample weights, feature
  masks and feature costs, including switching points of the d-transform (split samples);
- an independent dual: each ``l_h`` by a brute-force 1-D maximisation (grid + bounded
  refinement), F(h) maximised over h by a bounded scalar search;
- the audit recomputed here from the model's own ``decision_function`` at ``res.X_star``;
- the sampled audit (above AUDIT_DIRECT_MAX rows) against the direct one, and a wrong reduced
  form, which the sampled model check must refuse.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from otstab_solvers.weights import chi2_dual_term, kl_dual_term, phi
from reference import measure_by_row
from scipy.optimize import minimize_scalar

import otstab
import otstab.solve._audit as oa
from otstab import smooth
from otstab.errors import SolverError


def _binary(n=400, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d)
    y = np.where(X @ coef + 0.6 * rng.standard_normal(n) > 0, 1, -1)
    return otstab.LinearModel(coef, 0.2), X, y


def _regression(n=400, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d)
    y = X @ coef + 0.4 * rng.standard_normal(n)
    return otstab.LinearModel(coef, 0.1, task="regression"), X, y


def _multiclass(n=400, d=4, seed=0, K=3):
    rng = np.random.default_rng(seed + 1)
    W = rng.standard_normal((K, d))
    X = rng.standard_normal((n, d))
    y = np.argmax(X @ W.T + rng.gumbel(size=(n, K)), axis=1)
    return otstab.LinearModel(W, np.zeros(K)), X, y


CASES = {  # loss: (instance, r)
    "logistic": (_binary, 0.8),
    "cross_entropy": (_binary, 0.8),
    "squared": (_regression, 0.45),
    "multiclass cross_entropy": (_multiclass, 1.1),
}


def _loss(name):
    return name.split()[-1]


def _dense(monkeypatch, *args, **kw):
    """The same certificate through the dense path (no margin / residual oracle)."""
    with monkeypatch.context() as m:
        m.setattr(smooth, "margin_oracle", lambda *a, **k: None)
        return otstab.certify(*args, **kw)


def _same(res, ref, rtol=1e-9, mass_rtol=1e-8):
    """The same certificate from two numerically different paths: values, and Q* as a measure
    (a tied sample may be split by one path and not by the other: the atom lists may differ)."""
    assert res.status == ref.status == "optimal"
    assert res.value == pytest.approx(ref.value, rel=rtol)
    assert res.h == pytest.approx(ref.h, rel=rtol)
    for f in ("risk_star", "total_mass", "primal_cost"):
        assert getattr(res, f) == pytest.approx(getattr(ref, f), rel=1e-8, abs=1e-14)
    n = int(max(np.max(res.source), np.max(ref.source))) + 1
    ma, mb = measure_by_row(res, n), measure_by_row(ref, n)
    for key in ma:
        np.testing.assert_allclose(ma[key], mb[key], rtol=max(mass_rtol, 1e-8),
                                   atol=1e-9 if key == "x" else 1e-12, err_msg=key)


def _model_audit(model, X, y, res, loss):
    """Risk and cost of ``res``'s Q* from the model's own decision function at X_star."""
    Xs = np.asarray(res.X_star)
    src, w, mass = np.asarray(res.source), np.asarray(res.weights), np.asarray(res.mass)
    s = model.decision_function(Xs)
    ys = np.asarray(y)[src]
    lstar = np.logaddexp(0.0, -ys * s) if loss != "squared" else (ys - s) ** 2
    n = X.shape[0]
    risk = float(np.sum(mass * w * lstar)) / n
    moved2 = np.sum((Xs - X[src]) ** 2, axis=1)
    cost = res.theta1 * float(np.sum(mass * w * moved2)) / n
    if math.isfinite(res.theta2):
        cost += res.theta2 * float(np.sum(mass * phi(w, res.divergence))) / n
    return risk, cost


@pytest.mark.parametrize("theta2", [0.3, math.inf])
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("loss", list(CASES))
@pytest.mark.parametrize("extra", ["none", "weights", "features", "costs"])
def test_rows_path_equals_dense_path(monkeypatch, loss, divergence, theta2, extra):
    make, r = CASES[loss]
    model, X, y = make()
    kw = dict(loss=_loss(loss), r=r, divergence=divergence, theta2=theta2, theta1=0.7, se=None)
    if extra == "weights":
        kw["sample_weight"] = np.random.default_rng(3).uniform(0.2, 3.0, X.shape[0])
    elif extra == "features":
        kw["features"] = [0, 2]
    elif extra == "costs":
        kw["feature_costs"] = np.array([1.0, 4.0, 0.5, math.inf])
    res = otstab.certify(model, X, y, **kw)
    assert res.info["oracle"] in ("LogisticOracle", "SquaredOracle", "CrossEntropyOracle")
    assert "passes" in res.info  # (the blockwise dual, not the dense one)
    assert res.info["audit"]["method"] == "direct"
    assert res.info["audit"]["max_rel_error"] <= 1e-12
    _same(res, _dense(monkeypatch, model, X, y, **kw))
    if extra in ("none", "features") and loss != "multiclass cross_entropy":
        risk, cost = _model_audit(model, X, y, res, loss)  # the model's own scores at Q*
        assert risk >= r * (1 - 1e-8)
        assert cost == pytest.approx(res.value, rel=1e-7)


def _switching_instance():
    """Three identical samples and a few others, theta1 small: the logistic d-transform is
    nonconcave and the optimum of the dual sits where the identical samples switch maximiser."""
    X = np.array([[3.0, 0.0]] * 3 + [[2.0, 1.0]] * 2 + [[4.0, -1.0]])
    return otstab.LinearModel(np.array([1.0, 0.5]), 0.0), X, np.ones(6, dtype=int)


@pytest.mark.parametrize("divergence,theta2", [("kl", 1.0), ("chi2", 1.0), ("kl", math.inf)])
@pytest.mark.parametrize("theta1,r", [(0.05, 0.5), (0.1, 2.0), (0.3, 0.5)])
def test_switching_point_split(monkeypatch, divergence, theta2, theta1, r):
    model, X, y = _switching_instance()
    kw = dict(loss="logistic", r=r, theta1=theta1, theta2=theta2, divergence=divergence,
              se=None)
    res = otstab.certify(model, X, y, **kw)
    assert res.split and "switching point" in res.message
    assert np.asarray(res.source).size == X.shape[0] + 1  # one sample split
    assert res.risk_star == pytest.approx(r, rel=1e-9)
    # the split share: the dense path counts every other sample at its maximiser just below
    # h, this path at h (the share differs by some 1e-9 relative of the risk)
    _same(res, _dense(monkeypatch, model, X, y, **kw), rtol=1e-9, mass_rtol=1e-6)
    risk, cost = _model_audit(model, X, y, res, "logistic")
    assert risk >= r * (1 - 1e-8)
    assert cost == pytest.approx(res.value, rel=1e-7)


def _brute_lh(margin_or_res, a, theta1, h, loss):
    """max over the step t of h loss(t) - theta1 t^2 / a, by a grid and bounded refinement."""
    out = np.empty(margin_or_res.size)
    for i, v in enumerate(margin_or_res):
        if loss == "squared":
            def f(t, v=v):
                return h * (v + t) ** 2 - theta1 * t * t / a
        else:
            def f(t, v=v):
                return h * np.logaddexp(0.0, t - v) - theta1 * t * t / a
        T = 4.0 * (h * a / theta1 + abs(v) + 1.0)
        grid = np.linspace(-T, T, 8001)
        j = int(np.argmax(f(grid)))
        lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
        best = minimize_scalar(lambda t: -f(t), bounds=(lo, hi), method="bounded",
                               options={"xatol": 1e-14 * T})
        out[i] = max(-best.fun, f(grid[j]))
    return out


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("loss", ["logistic", "squared"])
def test_value_against_a_brute_force_dual(loss, divergence):
    make, r = CASES[loss]
    model, X, y = make(n=25, d=3, seed=4)
    theta1, theta2 = 0.8, 0.5
    res = otstab.certify(model, X, y, loss=loss, r=r, theta1=theta1, theta2=theta2,
                         divergence=divergence, se=None)
    s = model.decision_function(X)
    v = y * s if loss != "squared" else y - s
    a = float(model.coef_ @ model.coef_)
    h_max = theta1 / a if loss == "squared" else 50.0 * res.h

    def F(h):
        lh = _brute_lh(v, a, theta1, h, loss)
        term = kl_dual_term(lh, theta2) if divergence == "kl" else chi2_dual_term(lh, theta2)
        return h * r - term

    best = minimize_scalar(lambda h: -F(h), bounds=(0.0, 0.999 * h_max), method="bounded",
                           options={"xatol": 1e-10})
    assert res.value == pytest.approx(-best.fun, rel=1e-6)
    assert res.value >= -best.fun * (1 - 1e-9)  # the exact optimum is no smaller


@pytest.mark.parametrize("loss", list(CASES))
@pytest.mark.parametrize("extra", ["none", "weights"])
def test_sampled_audit_equals_direct(monkeypatch, loss, extra):
    """Above AUDIT_DIRECT_MAX the sums come from the reduced form and AUDIT_SAMPLE atoms are
    re-scored by the model: the same certificate as the direct audit, to rounding."""
    make, r = CASES[loss]
    model, X, y = make(n=600, seed=2)
    kw = dict(loss=_loss(loss), r=r, se=None)
    if extra == "weights":
        kw["sample_weight"] = np.random.default_rng(5).uniform(0.2, 3.0, X.shape[0])
    direct = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(oa, "AUDIT_DIRECT_MAX", 0)
    monkeypatch.setattr(oa, "AUDIT_SAMPLE", 37)
    sampled = otstab.certify(model, X, y, **kw)
    assert direct.info["audit"]["method"] == "direct"
    assert sampled.info["audit"] == {**sampled.info["audit"], "method": "sampled",
                                     "sample": 37}
    assert sampled.info["audit"]["max_rel_error"] <= 1e-12
    assert (sampled.status, sampled.value, sampled.h) == (direct.status, direct.value, direct.h)
    for f in ("risk_star", "total_mass", "primal_cost"):
        assert getattr(sampled, f) == pytest.approx(getattr(direct, f), rel=1e-12, abs=1e-15)
    np.testing.assert_array_equal(sampled.X_star, direct.X_star)


def test_sampled_audit_refuses_a_wrong_reduced_form(monkeypatch):
    """Points of Q* that disagree with the reduced form the audit sums (here built with half
    the step) are not passed off: the model check fails the audit."""
    model, X, y = _binary(n=500, seed=6)
    monkeypatch.setattr(oa, "AUDIT_DIRECT_MAX", 0)
    honest = smooth._RowAtoms.points

    def halfway(self, src, st):
        Xg, Xs = honest(self, src, st)
        return Xg, Xg + 0.5 * (Xs - Xg)

    monkeypatch.setattr(smooth._RowAtoms, "points", halfway)
    with pytest.raises(SolverError, match="audit"):
        otstab.certify(model, X, y, loss="logistic", r=0.8, se=None)
    monkeypatch.setattr(oa, "SAMPLED_RTOL", math.inf)  # what stopped it was the model check
    res = otstab.certify(model, X, y, loss="logistic", r=0.8, se=None)
    assert res.info["audit"]["max_rel_error"] > 1e-3


def test_inputs_untouched_x_not_copied_float32_and_pickle():
    model, X, y = _binary(n=800, seed=7)
    X0, y0 = X.copy(), y.copy()
    X.flags.writeable = False  # a frozen X is kept by reference
    res = otstab.certify(model, X, y, loss="logistic", r=0.8, se=None)
    assert np.shares_memory(res.X, X)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)
    res32 = otstab.certify(model, X.astype(np.float32), y, loss="logistic", r=0.8, se=None)
    assert res32.status == "optimal"
    assert res32.X_star.dtype == np.float64
    assert res32.value == pytest.approx(res.value, rel=1e-5)
    back = pickle.loads(pickle.dumps(res))
    np.testing.assert_array_equal(back.X_star, res.X_star)
    np.testing.assert_array_equal(back.weights, res.weights)
    np.testing.assert_array_equal(back.info["moved2"], res.info["moved2"]())  # built
    assert "displacement" not in back.info
    frame = res.to_frame()
    assert len(frame) == np.asarray(res.source).size


def test_displacement_matches_x_star():
    model, X, y = _switching_instance()
    res = otstab.certify(model, X, y, loss="logistic", r=0.5, theta1=0.05, theta2=1.0,
                         se=None)
    atoms = np.arange(np.asarray(res.source).size)
    np.testing.assert_allclose(X[np.asarray(res.source)] + res.info["displacement"](atoms),
                               res.X_star, rtol=0, atol=1e-12)
    moved2 = res.info["moved2"]
    np.testing.assert_allclose(moved2() if callable(moved2) else moved2,
                               np.sum((res.X_star - X[res.source]) ** 2, axis=1), rtol=1e-9)


def test_edges_and_multiclass_keep_their_paths():
    model, X, y = _binary(n=300, seed=8)
    zero = otstab.certify(model, X, y, loss="logistic", r=0.01, se=None)
    assert zero.status == "zero"
    frozen = otstab.certify(model, X, y, loss="logistic", r=0.8, theta1=math.inf,
                            theta2=0.5, se=None)
    assert frozen.status == "optimal"  # reweighting only: every step 0
    np.testing.assert_array_equal(frozen.X_star, X)


def test_multiclass_above_h_concave_is_a_bound(monkeypatch):
    """Multinomial cross-entropy above h_concave: l_h is the best of several local maxima, so
    the answer is the upper bound its audited Q* gives (status 'bounds'), on this path as on
    the dense one, with the model's own scores at Q* reaching r."""
    model, X, y = _multiclass(n=300, d=3, seed=3, K=4)
    kw = dict(loss="cross_entropy", r=2.5, theta1=0.05, theta2=0.5, se=None)
    res = otstab.certify(model, X, y, **kw)
    assert res.status == "bounds" and "h_concave" in res.message
    assert res.value_upper == pytest.approx(res.primal_cost)
    ref = _dense(monkeypatch, model, X, y, **kw)
    assert ref.status == "bounds"
    assert res.value == pytest.approx(ref.value, rel=1e-9)
    S = model.decision_function(np.asarray(res.X_star))
    ys = y[np.asarray(res.source)]
    top = S.max(1)
    ce = np.log(np.sum(np.exp(S - top[:, None]), 1)) + top - S[np.arange(ys.size), ys]
    risk = float(np.sum(np.asarray(res.mass) * np.asarray(res.weights) * ce)) / X.shape[0]
    assert risk >= 2.5 * (1 - 1e-8)


def test_logistic_oracle_of_scores_equals_the_margins_oracle():
    """``LogisticOracle.of_scores`` (margins computed per block from the scores and int8
    labels, never stored) gives the numbers of the oracle on the stored margins (to a few
    ulps: a slice read at a new h starts its Newton steps from the table of that h's steps,
    the stored margins from t = 0, and the last steps round differently)."""
    from otstab_solvers.smooth import LogisticOracle

    rng = np.random.default_rng(9)
    s = rng.normal(size=1000) * 3.0
    y = np.where(rng.random(1000) < 0.5, -1, 1).astype(np.int8)
    lean = LogisticOracle.of_scores(s, y, 0.8, 0.3)
    dense = LogisticOracle(y * s, 0.8, 0.3)
    np.testing.assert_array_equal(lean.margins, dense.margins)
    for h in (0.0, 0.1, 1.7, 40.0):  # concave and nonconcave (h > 8 c = 3)
        for rows in (slice(None), slice(17, 530), np.array([3, 3, 999, 0])):
            for a, b in zip(lean.transform_rows(h, rows), dense.transform_rows(h, rows)):
                np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-300)
        for a, b in zip(lean.evaluate(h), dense.evaluate(h)):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(lean.loss(), dense.loss())
    with pytest.raises(ValueError, match="one length"):
        LogisticOracle.of_scores(s, y[:10], 0.8, 0.3)
