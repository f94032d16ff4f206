"""Per-feature move prices (``feature_costs``): a diagonal metric in the moving cost."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier

import otstab
from otstab.errors import IncompatibleLossError, ValidationError

CASES = [("hinge", 1.0), ("zero_one", 0.3), ("logistic", 0.8)]


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = (X @ [1.0, 0.5, -0.3] + 0.3 * rng.normal(size=300) > 0).astype(int)
    return LogisticRegression().fit(X, y), X, y


@pytest.mark.parametrize("loss,r", CASES)
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_a_price_equals_rescaling_the_feature(problem, loss, r, divergence):
    """Price c on feature j is the same problem as feature j multiplied by sqrt(c) with its
    coefficient divided by sqrt(c) (same scores) at price 1: values agree, and Q* maps back."""
    model, X, y = problem
    res = otstab.certify(model, X, y, loss=loss, r=r, divergence=divergence,
                         feature_costs={"x0": 4.0, 2: 0.25})
    scale = np.array([2.0, 1.0, 0.5])
    ref = otstab.certify(otstab.LinearModel(model.coef_[0] / scale, model.intercept_[0]),
                         X * scale, np.where(y == 1, 1, -1), loss=loss, r=r,
                         divergence=divergence)
    assert res.status == ref.status == "optimal"
    assert res.value == pytest.approx(ref.value, rel=1e-9)
    np.testing.assert_allclose(np.asarray(res.X_star) * scale, ref.X_star, rtol=1e-12,
                               atol=1e-12)
    # the audited cost is the weighted one, recomputed from the returned atoms
    src, w, m = np.asarray(res.source), np.asarray(res.weights), np.asarray(res.mass)
    d2 = np.sum(scale**2 * (np.asarray(res.X_star) - X[src]) ** 2, axis=1)
    move = float(np.sum(m * w * d2)) / len(y)
    assert move == pytest.approx(res.decomposition["cost_moving"], rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("loss,r", CASES)
def test_an_infinite_price_makes_the_feature_immutable(problem, loss, r):
    model, X, y = problem
    res = otstab.certify(model, X, y, loss=loss, r=r, feature_costs=[math.inf, 1, 1])
    ref = otstab.certify(model, X, y, loss=loss, r=r, features=[1, 2])
    assert res.value == pytest.approx(ref.value, rel=1e-12)
    np.testing.assert_array_equal(np.asarray(res.X_star)[:, 0], X[np.asarray(res.source), 0])


def test_unit_prices_change_nothing(problem):
    model, X, y = problem
    a = otstab.certify(model, X, y, loss="hinge", r=1.0, feature_costs=[1, 1, 1])
    b = otstab.certify(model, X, y, loss="hinge", r=1.0)
    assert a.value == b.value and "feature_costs" not in a.info


@pytest.mark.parametrize("costs, match", [
    ({"nope": 2.0}, "unknown feature"),
    ({"x0": 0.0}, r"\(0, inf\]"),
    ({"x0": -1.0}, r"\(0, inf\]"),
    ({"x0": float("nan")}, r"\(0, inf\]"),
    ({"x0": "2"}, "number"),
    ([1.0, 2.0], "3 entries"),
    ([math.inf] * 3, "immutable"),
    ({7: 1.0}, "out of range"),
])
def test_bad_prices_are_refused_naming_the_argument(problem, costs, match):
    model, X, y = problem
    with pytest.raises(ValidationError, match=match):
        otstab.certify(model, X, y, loss="hinge", r=1.0, feature_costs=costs)


def test_models_without_a_linear_reduced_form_are_refused(problem):
    _, X, y = problem
    mlp = MLPClassifier(hidden_layer_sizes=(4,), max_iter=2000, random_state=0).fit(X, y)
    with pytest.raises(IncompatibleLossError, match="feature_costs"):
        otstab.certify(mlp, X, y, loss="zero_one", r=0.3, feature_costs={"x0": 2.0})


def test_feature_scores_with_prices_equal_certify_per_feature(problem):
    model, X, y = problem
    costs = {"x0": 4.0, "x1": math.inf}
    for loss, r in CASES:
        df = otstab.feature_stability(model, X, y, loss=loss, r=r, feature_costs=costs)
        rw = df.attrs["reweighting_only_value"]
        for _, row in df.iterrows():
            if row.feature == "x1":  # immutable: the reweighting-only value
                assert row.ignored and row.score == pytest.approx(rw, rel=1e-9)
                continue
            ref = otstab.certify(model, X, y, loss=loss, r=r, features=row["columns"],
                                 feature_costs=costs)
            assert row.score == pytest.approx(ref.value, rel=1e-9), (loss, row.feature)
