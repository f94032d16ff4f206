"""Feature scores of a binary logistic linear model from shared margins
(otstab.analysis._features_logistic) against certify per feature.

Each unit's score, h and shares must be certify's (``features=cols``); units the shared path
leaves (a zero coefficient, no root of the binned dual, a derivative too large after the
Newton step) are certified on their own, and instances it does not take (sample weights,
extreme prices, thresholds at the edges) never reach it.
"""

from __future__ import annotations

import math

import numpy as np
import otstab_solvers.logistic_binned as lb
import pytest

import otstab
import otstab.analysis._features_logistic as fl
from otstab.modeling._models import per_sample_losses


def _problem(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 5))
    w = np.array([1.0, -0.5, 0.3, 0.0, 0.15])  # x3 ignored
    y = np.where(X @ w + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    return otstab.LinearModel(w, 0.1), X, y


def _r(model, X, y, t):
    losses = per_sample_losses(model, X, y, "logistic")
    return float(losses.mean() + t * (losses.max() - losses.mean()))


def _scores(monkeypatch, shared, model, X, y, **kw):
    """feature_stability with the shared path on (and checked to answer) or off."""
    calls = []
    real = fl.logistic_feature_scores

    def spy(*a, **k):
        out = real(*a, **k)
        calls.append(out)
        return out

    with monkeypatch.context() as m:
        m.setattr(lb, "MIN_N", 0 if shared else 1 << 62)
        m.setattr("otstab.analysis._features.logistic_feature_scores", spy)
        df = otstab.feature_stability(model, X, y, **kw).to_frame().set_index("feature")
    return df, calls


@pytest.mark.parametrize("price", [("kl", 0.25), ("chi2", 0.25), ("kl", math.inf)])
@pytest.mark.parametrize("t", [0.01, 0.5, 0.95])
def test_shared_scores_equal_certify_per_feature(monkeypatch, price, t):
    model, X, y = _problem()
    divergence, theta2 = price
    kw = dict(loss="logistic", r=_r(model, X, y, t), theta1=0.5, theta2=theta2,
              divergence=divergence)
    groups = {"x0+x4": [0, 4]}
    df, calls = _scores(monkeypatch, True, model, X, y, feature_groups=groups, **kw)
    assert len(calls) == 1 and calls[0] is not None
    # every unit with a coefficient answered by the shared path; x3 (zero) certified alone
    labels = ["x1", "x2", "x3", "x0+x4"]
    answered = dict(zip(labels, calls[0]))
    assert answered["x3"] is None
    assert all(answered[k] is not None for k in ("x1", "x2", "x0+x4"))
    for label, row in df.iterrows():
        cols = [0, 4] if label == "x0+x4" else [int(label[1:])]
        res = otstab.certify(model, X, y, features=cols, **kw)
        if label == "x3":  # ignored: the reweighting-only value (inf with theta2 = inf)
            assert row.score == pytest.approx(res.value, rel=1e-9), label
            continue
        assert res.status == "optimal"
        assert row.score == pytest.approx(res.value, rel=1e-9), label
        assert row.h == pytest.approx(res.h, rel=1e-7), label
        exc = res.risk_star - res.risk_base
        dec = res.decomposition
        assert row.share_moving == pytest.approx(dec["corruption"] / exc, abs=1e-7), label
        assert row.share_reweighting == pytest.approx(dec["reweighting"] / exc,
                                                      abs=1e-7), label
    assert bool(df.loc["x3", "ignored"])
    # and the same table without the shared path (every unit certified alone)
    ref, calls = _scores(monkeypatch, False, model, X, y, feature_groups=groups, **kw)
    assert calls == [None]
    np.testing.assert_allclose(df["score"], ref.loc[df.index, "score"], rtol=1e-9)


def test_nonconcave_units_match_certify(monkeypatch):
    """theta1 small: h / 2c above 6 for x0 and x1 (two local maxima for some samples)."""
    model, X, y = _problem(seed=1)
    kw = dict(loss="logistic", r=6.0, theta1=0.02, theta2=1.0, divergence="kl")
    df, calls = _scores(monkeypatch, True, model, X, y, **kw)
    assert calls[0] is not None
    for label, row in df.iterrows():
        res = otstab.certify(model, X, y, features=[int(label[1:])], **kw)
        assert row.score == pytest.approx(res.value, rel=1e-9), label


@pytest.mark.parametrize("case", ["weights", "extreme", "below base", "small n"])
def test_instances_it_does_not_take(monkeypatch, case):
    model, X, y = _problem(n=1000)
    kw = dict(loss="logistic", r=_r(model, X, y, 0.5), theta1=0.5, theta2=0.25,
              divergence="kl")
    if case == "weights":
        kw["sample_weight"] = np.random.default_rng(2).uniform(0.5, 2.0, X.shape[0])
    elif case == "extreme":
        kw["theta1"] = 1e6
    elif case == "below base":
        kw["r"] = 0.01
    if case == "small n":
        _, calls = _scores(monkeypatch, False, model, X, y, **kw)
    else:
        _, calls = _scores(monkeypatch, True, model, X, y, **kw)
    assert all(c is None for c in calls)  # (never called, or declined)


@pytest.mark.parametrize("price", [("kl", 0.25), ("kl", math.inf)])
def test_quadrature_scores_with_tied_prices_equal_certify(monkeypatch, price):
    """KL and theta2 = inf: every unit's dual from one per-bin quadrature of the margins
    (otstab_solvers.logistic_quadrature); x0 and x1 have one price (|w| equal, opposite
    signs: one solve answers both), x3 a zero coefficient (certified alone). Each score,
    h and share against certify with features=[j]."""
    import otstab_solvers.logistic_quadrature as lq

    rng = np.random.default_rng(4)
    X = rng.standard_normal((4000, 5))
    w = np.array([0.8, -0.8, 0.3, 0.0, 0.15])
    y = np.where(X @ w + 0.5 * rng.standard_normal(4000) > 0, 1, -1)
    model = otstab.LinearModel(w, -0.2)
    divergence, theta2 = price
    kw = dict(loss="logistic", r=_r(model, X, y, 0.4), theta1=0.5, theta2=theta2,
              divergence=divergence)
    answered = []
    real = lq.solve_from

    def spy(*a, **k):
        out = real(*a, **k)
        answered.append(out is not None)
        return out

    monkeypatch.setattr(lq, "solve_from", spy)
    df, calls = _scores(monkeypatch, True, model, X, y, **kw)
    # x0 (x1 shares its answer), x2, x4; with KL the reweighting-only value first (c = inf)
    assert answered == [True] * (4 if divergence == "kl" and math.isfinite(theta2) else 3)
    assert calls[0][0] == calls[0][1] and calls[0][3] is None
    for label, row in df.iterrows():
        res = otstab.certify(model, X, y, features=[int(label[1:])], **kw)
        assert row.score == pytest.approx(res.value, rel=1e-10), label
        if label == "x3":
            continue
        assert row.h == pytest.approx(res.h, rel=1e-7), label
        exc = res.risk_star - res.risk_base
        assert row.share_moving == pytest.approx(res.decomposition["corruption"] / exc,
                                                 abs=1e-7), label


def test_fixed_features_and_weights_match_certify(monkeypatch):
    """A feature priced inf (feature_costs) cannot move: ignored, the reweighting-only value;
    with feature_costs or sample weights every feature is scored through certify (the shared
    margins are not used), and each score is certify's with the same arguments."""
    model, X, y = _problem(n=2000, seed=5)
    base = dict(loss="logistic", r=_r(model, X, y, 0.5), theta1=0.5, theta2=0.25,
                divergence="kl")
    w = np.random.default_rng(6).uniform(0.5, 2.0, X.shape[0])
    for extra in (dict(feature_costs={"x2": math.inf}), dict(sample_weight=w)):
        kw = {**base, **extra}
        df, calls = _scores(monkeypatch, True, model, X, y, **kw)
        assert all(c is None for c in calls)
        for label, row in df.iterrows():
            if label == "x2" and "feature_costs" in extra:
                continue  # (certify refuses a feature set that cannot move)
            res = otstab.certify(model, X, y, features=[int(label[1:])], **kw)
            assert row.score == pytest.approx(res.value, rel=1e-9), (label, extra)
        if "feature_costs" in extra:
            assert bool(df.loc["x2", "ignored"])
            assert df.loc["x2", "score"] == pytest.approx(
                otstab.feature_stability(model, X, y, **kw).reweighting_only_value, rel=1e-12)


@pytest.mark.parametrize("price", [("kl", 0.25), ("chi2", 0.25), ("kl", math.inf)])
def test_units_on_one_thread_and_two_give_the_same_table(monkeypatch, price):
    """The units' quadrature answers run on the process's CPUs (at most MAX_WORKERS threads):
    every score, h and share the same bits as on one thread."""
    model, X, y = _problem(seed=3)
    divergence, theta2 = price
    kw = dict(loss="logistic", r=_r(model, X, y, 0.5), theta1=0.5, theta2=theta2,
              divergence=divergence,
              feature_groups={"x0+x4": [0, 4], "x1+x2": [1, 2], "x0+x1": [0, 1]})
    import threading

    tables = {}
    real_root = lb.binned_root
    for workers in (1, 2):
        names = set()

        def root(*a, names=names, **k):
            names.add(threading.current_thread().name.startswith("otstab-pass"))
            return real_root(*a, **k)
        monkeypatch.setattr(lb, "binned_root", root)
        monkeypatch.setattr(fl, "MAX_WORKERS", workers)
        monkeypatch.setattr(fl, "usable_cpus", lambda: 2)
        df, calls = _scores(monkeypatch, True, model, X, y, **kw)
        assert calls and calls[0] is not None and sum(row is not None for row in calls[0]) >= 3
        assert (True in names) == (workers == 2)  # (the pool's threads answered)
        tables[workers] = df
    import pandas as pd

    pd.testing.assert_frame_equal(tables[1], tables[2], check_exact=True)
