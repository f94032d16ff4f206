"""Feature stability and stability curves."""

import math

import numpy as np
import pandas as pd
import pytest

import otstab
from otstab.errors import ValidationError


def data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(rng.normal(size=(n, 4)), columns=["age", "hours", "c: a", "c: b"])
    w = np.array([1.0, -0.5, 0.3, 0.2])
    y = np.where(X.to_numpy() @ w + 0.5 * rng.normal(size=n) > 0, 1, -1)
    return otstab.LinearModel(w, 0.1), X, y


@pytest.mark.parametrize("loss,r", [("hinge", 1.0), ("zero_one", 0.4)])
def test_only_feature_with_weight_ranks_first_others_inf(loss, r):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3))
    y = np.where(X[:, 1] + 0.5 * rng.normal(size=200) > 0, 1, -1)
    model = otstab.LinearModel([0.0, 1.3, 0.0])
    df = otstab.feature_stability(model, X, y, loss=loss, r=r)
    assert df.loc[0, "feature"] == "x1"
    assert math.isfinite(df.loc[0, "score"])
    assert np.all(np.isinf(df["score"].iloc[1:]))
    assert list(df["rank"]) == [1, 2, 2]


@pytest.mark.parametrize("div", ["kl", "chi2"])
def test_one_pass_scores_match_certify_per_feature(div):
    model, X, y = data()
    df = otstab.feature_stability(model, X, y, loss="hinge", r=1.0, divergence=div)
    for _, row in df.iterrows():
        res = otstab.certify(model, X, y, loss="hinge", r=1.0, divergence=div,
                             features=[row.feature], solver="clarabel")
        assert row.score == pytest.approx(res.value, rel=1e-6)
        assert row.share_moving + row.share_reweighting == pytest.approx(1.0)
    assert list(df["score"]) == sorted(df["score"])


def test_zero_one_scores_match_certify_and_groups():
    model, X, y = data()
    groups = {"c": ["c: a", "c: b"]}
    df = otstab.feature_stability(model, X, y, loss="zero_one", r=0.45, groups=groups)
    assert set(df["feature"]) == {"age", "hours", "c"}
    row = df.set_index("feature").loc["c"]
    res = otstab.certify(model, X, y, loss="zero_one", r=0.45, features=["c: a", "c: b"])
    assert row.score == pytest.approx(res.value, rel=1e-10)
    assert row["columns"] == ["c: a", "c: b"]
    for f in ("age", "hours"):
        res = otstab.certify(model, X, y, loss="zero_one", r=0.45, features=[f])
        assert df.set_index("feature").loc[f, "score"] == pytest.approx(res.value, rel=1e-10)


def test_multiclass_feature_scores():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(150, 3))
    W = rng.normal(size=(3, 3))
    model = otstab.LinearModel(W)
    y = np.argmax(X @ W.T + rng.gumbel(size=(150, 3)), axis=1)
    for loss, r in (("multiclass_hinge", 1.2), ("zero_one", 0.6)):
        df = otstab.feature_stability(model, X, y, loss=loss, r=r)
        for _, row in df.iterrows():
            res = otstab.certify(model, X, y, loss=loss, r=r, features=[row.feature])
            assert row.score == pytest.approx(res.value, rel=1e-8)


def test_feature_names_from_sklearn_and_bad_features():
    sk = pytest.importorskip("sklearn.linear_model")
    model, X, y = data()
    est = sk.LogisticRegression().fit(X, y)
    df = otstab.feature_stability(est, X.to_numpy(), y, loss="hinge", r=1.0)
    assert set(df["feature"]) == set(X.columns)
    with pytest.raises(ValidationError, match="unknown feature"):
        otstab.feature_stability(est, X, y, loss="hinge", r=1.0, features=["nope"])
    with pytest.raises(ValidationError, match="unknown column"):
        otstab.feature_stability(est, X, y, loss="hinge", r=1.0, groups={"g": ["nope"]})


def test_stability_curve_matches_certify_and_compiles_once(monkeypatch):
    from otstab_solvers import conic

    model, X, y = data(200)
    grid = [0.1, 0.8, 1.0, 1.5]
    built = []
    orig = conic.ConicProgram.__init__

    def counting(self, *a, **k):
        built.append(1)
        orig(self, *a, **k)

    monkeypatch.setattr(conic.ConicProgram, "__init__", counting)
    df = otstab.stability_curve(model, X, y, r=grid, loss="hinge", solver="clarabel")
    assert len(built) == 1
    for rv, val in zip(grid, df["value"]):
        ref = otstab.certify(model, X, y, loss="hinge", r=rv, solver="dual")
        assert val == pytest.approx(ref.value, rel=1e-6, abs=1e-9)
    assert np.all(np.diff(df["value"]) >= -1e-12)
    z = otstab.stability_curve(model, X, y, r=[0.2, 0.4], loss="zero_one")
    assert z["value"].iloc[1] >= z["value"].iloc[0]


def test_smooth_and_nonlinear_feature_scores():
    sk = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] + 0.5 * X[:, 1] + 0.5 * rng.normal(size=200) > 0).astype(int)
    lr = sk.LogisticRegression().fit(X, y)
    df = otstab.feature_stability(lr, X, y, loss="logistic", r=0.8)
    for _, row in df.iterrows():
        res = otstab.certify(lr, X, y, loss="logistic", r=0.8, features=[row.feature])
        assert row.score == pytest.approx(res.value, rel=1e-10)
    assert df.loc[0, "feature"] == "x0"
    # a feature the model ignores is infinitely stable on the smooth path too
    lm = otstab.LinearModel([1.0, 0.0, 0.0])
    yy = np.where(X[:, 0] > 0, 1, -1)
    d2 = otstab.feature_stability(lm, X, yy, loss="logistic", r=0.9)
    assert d2.loc[0, "feature"] == "x0" and np.all(np.isinf(d2["score"].iloc[1:]))


@pytest.mark.parametrize("t2,div", [(0.25, "kl"), (math.inf, "kl"), (0.25, "chi2"),
                                    (3.0, "chi2")])
def test_zero_one_shares_match_the_certificate_decomposition(t2, div):
    # chi2: one sorted distance oracle rescaled per feature (O(log n) per dual evaluation)
    model, X, y = data(500, seed=4)
    df = otstab.feature_stability(model, X, y, loss="zero_one", r=0.45, theta2=t2,
                                  divergence=div)
    for _, row in df.iterrows():
        res = otstab.certify(model, X, y, loss="zero_one", r=0.45, theta2=t2,
                             divergence=div, features=[row.feature])
        assert row.score == pytest.approx(res.value, rel=1e-10)
        excess = res.risk_star - res.risk_base
        assert row.share_moving == pytest.approx(res.decomposition["corruption"] / excess,
                                                 abs=1e-9)
        assert row.share_reweighting == pytest.approx(
            res.decomposition["reweighting"] / excess, abs=1e-9)
