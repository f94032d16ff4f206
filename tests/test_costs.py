"""Per-feature move prices (``feature_costs``): a diagonal metric in the moving cost."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.svm import SVC
from sklearn.tree import DecisionTreeClassifier

import otstab
from otstab import bounds, perturbation
from otstab.errors import ValidationError
from otstab.modeling._nonlinear import LinearDifferentiable

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


# -- models without a linear reduced form: the change of variables x~ = sqrt(c) x -----------
# Reference: the same model composed with the scaled input, fed X * sqrt(c), without prices.
# A decision tree (or forest) fitted on X * s has the same structure with thresholds times s
# (splits depend on the order of the values only; bootstrap and feature draws on the seed);
# an MLP reads x~ / s when its first layer is W_1 / s.

C = np.array([4.0, 1.0, 0.25])  # s = sqrt(C) = (2, 1, 0.5)


def _scaled_mlp(mlp, s):
    ref = copy.deepcopy(mlp)
    ref.coefs_[0] = mlp.coefs_[0] / s[:, None]
    return ref


@pytest.fixture(scope="module")
def mlp(problem):
    _, X, y = problem
    return MLPClassifier(hidden_layer_sizes=(8,), max_iter=3000, random_state=0).fit(X, y)


def test_tree_prices_equal_a_tree_on_scaled_inputs(problem):
    """Exact (tree boxes, weighted distance) on both sides: the same value and status."""
    _, X, y = problem
    s = np.sqrt(C)
    tree = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y)
    ref_tree = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X * s, y)
    res = otstab.certify(tree, X, y, loss="zero_one", r=0.3, feature_costs=C)
    ref = otstab.certify(ref_tree, X * s, y, loss="zero_one", r=0.3)
    assert res.status == ref.status == "optimal"
    assert res.value == pytest.approx(ref.value, rel=1e-9)
    # Q* is in the caller's coordinates: the model errs on every moved atom, and the moving
    # cost is the priced one, recomputed from the atoms
    Xs, src = np.asarray(res.X_star), np.asarray(res.source)
    moved = np.any(Xs != X[src], axis=1)
    assert moved.any() and np.all(tree.predict(Xs[moved]) != y[src][moved])
    d2 = np.sum(C * (Xs - X[src]) ** 2, axis=1)
    cost = float(np.sum(np.asarray(res.mass) * np.asarray(res.weights) * d2)) / len(y)
    assert cost == pytest.approx(res.decomposition["cost_moving"], rel=1e-6)


def test_tree_lower_bounds_use_the_priced_metric(problem):
    """Run to completion, the branch and bound on a single tree meets the exact weighted
    distances of the tree path (both from the same boxes, computed independently) up to its
    conservative float32 edges (one float32 step, ~1e-7 here, wider per box side)."""
    _, X, y = problem
    tree = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y)
    exact = perturbation._tree(tree, X, y, np.ones(3, dtype=bool), weights=C).distances
    dlow, info = bounds.tree_lower_distances(tree, X, y, weights=C, max_nodes=10**5)
    assert info["exact"].all()
    assert np.all(dlow <= exact)
    np.testing.assert_allclose(np.sqrt(dlow), np.sqrt(exact), rtol=0, atol=1e-6)


def test_forest_prices_are_sound_against_a_forest_on_scaled_inputs(problem):
    """One movable feature (the others immutable): the reference's threshold search is exact;
    with a price it is an upper bound (probes mapped to x~) and the branch and bound in the
    priced metric proves a lower one, so value_lower <= R <= value_upper with both tight."""
    _, X, y = problem
    s = np.sqrt(C)
    rf = RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0).fit(X, y)
    ref_rf = RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0).fit(X * s, y)
    res = otstab.certify(rf, X, y, loss="zero_one", r=0.3,
                         feature_costs=[C[0], math.inf, math.inf])
    ref = otstab.certify(ref_rf, X * s, y, loss="zero_one", r=0.3, features=[0])
    assert ref.status == "optimal"
    assert res.value_lower <= ref.value * (1 + 1e-9) <= res.value_upper * (1 + 2e-9)
    assert res.value_upper == pytest.approx(ref.value, rel=1e-6)
    assert res.value_lower == pytest.approx(ref.value, rel=1e-6)


class _Composed:
    """A classifier reading ``x~ / s``: ``model`` composed with the inverse scaling."""

    def __init__(self, model, s):
        self.model, self.s, self.classes_ = model, s, model.classes_

    def predict(self, Z):
        return self.model.predict(np.asarray(Z) / self.s)


def test_predict_only_prices_equal_the_model_composed_with_the_scaling(problem):
    """The generic search (kernel SVM, no gradient, no thresholds) runs in x~ on both sides."""
    _, X, y = problem
    s = np.sqrt(C)
    svm = SVC(gamma=0.5).fit(X, y)
    res = otstab.certify(svm, X, y, loss="zero_one", r=0.3, feature_costs=C)
    ref = otstab.certify(_Composed(svm, s), X * s, y, loss="zero_one", r=0.3)
    assert res.status == ref.status == "bounds"
    assert res.value == pytest.approx(ref.value, rel=1e-9)
    Xs, src = np.asarray(res.X_star), np.asarray(res.source)
    moved = np.any(Xs != X[src], axis=1)
    assert moved.any() and np.all(svm.predict(Xs[moved]) != y[src][moved])


@pytest.mark.parametrize("loss,r", [("zero_one", 0.3), ("logistic", 0.8)])
def test_mlp_prices_equal_the_mlp_composed_with_the_scaling(problem, mlp, loss, r):
    """Gradient search (0/1) and the first-order path (logistic), with their certified
    lower bounds: the same computation in x~ on both sides."""
    _, X, y = problem
    s = np.sqrt(C)
    res = otstab.certify(mlp, X, y, loss=loss, r=r, feature_costs=C)
    ref = otstab.certify(_scaled_mlp(mlp, s), X * s, y, loss=loss, r=r)
    assert res.status == ref.status
    assert res.value == pytest.approx(ref.value, rel=1e-6)
    assert res.value_lower == pytest.approx(ref.value_lower, rel=1e-6)
    assert 0 < res.value_lower <= res.value


@pytest.mark.parametrize("loss,r", [("zero_one", 0.3), ("logistic", 0.8)])
def test_linear_model_on_the_nonlinear_paths_matches_the_exact_priced_path(problem, loss, r):
    """A linear model seen as a differentiable model (gradient search, first-order solver)
    with prices vs the exact linear path with the same prices."""
    model, X, y = problem
    adapter = LinearDifferentiable(model.coef_, model.intercept_, "binary", np.array([0, 1]))
    costs = {0: C[0], 2: math.inf}
    res = otstab.certify(adapter, X, y, loss=loss, r=r, feature_costs=costs)
    ref = otstab.certify(model, X, y, loss=loss, r=r, feature_costs=costs)
    assert ref.status == "optimal"
    assert res.value == pytest.approx(ref.value, rel=1e-4)
    np.testing.assert_array_equal(np.asarray(res.X_star)[:, 2], X[np.asarray(res.source), 2])


def test_feature_scores_with_prices_equal_certify_per_feature(problem):
    model, X, y = problem
    costs = {"x0": 4.0, "x1": math.inf}
    for loss, r in CASES:
        df = otstab.feature_stability(model, X, y, loss=loss, r=r, feature_costs=costs).to_frame()
        rw = df.attrs["reweighting_only_value"]
        for _, row in df.iterrows():
            if row.feature == "x1":  # immutable: the reweighting-only value
                assert row.ignored and row.score == pytest.approx(rw, rel=1e-9)
                continue
            ref = otstab.certify(model, X, y, loss=loss, r=r, features=row["columns"],
                                 feature_costs=costs)
            assert row.score == pytest.approx(ref.value, rel=1e-9), (loss, row.feature)


class _IdentityResample:
    """A stand-in for ``np.random.default_rng`` whose resample is the data itself."""

    def integers(self, low, high, size):
        return np.arange(low, high)


def test_feature_confidence_bootstraps_the_priced_scores(problem, monkeypatch):
    # every bootstrap replicate scores with the prices: (a) at the identity resample each
    # replicate is the priced table itself (se 0, interval = the priced score); (b) the SE is
    # the spread of feature_stability(..., feature_costs=costs) on the resampled rows,
    # recomputed here, and differs from the SE of the unpriced scores
    model, X, y = problem
    costs = {"x0": 4.0, "x1": math.inf}
    kw = dict(loss="hinge", r=1.0)
    priced = otstab.feature_stability(model, X, y, feature_costs=costs, **kw).to_frame()
    plain = otstab.feature_stability(model, X, y, **kw).to_frame()
    assert not np.allclose(priced.sort_values("feature")["score"],
                           plain.sort_values("feature")["score"], rtol=1e-3)
    boot = dict(level=0.9, n_resamples=3, random_state=5)
    with monkeypatch.context() as m:
        m.setattr(np.random, "default_rng", lambda seed=None: _IdentityResample())
        same = otstab.feature_stability(model, X, y, feature_costs=costs, **boot, **kw).to_frame()
    same, ref = same.set_index("feature"), priced.set_index("feature")
    np.testing.assert_allclose(same["ci_low"], ref.loc[same.index, "score"], rtol=1e-12)
    np.testing.assert_allclose(same["ci_high"], ref.loc[same.index, "score"], rtol=1e-12)
    np.testing.assert_array_equal(same["se"], 0.0)
    df = otstab.feature_stability(model, X, y, feature_costs=costs, **boot,
                                  **kw).to_frame().set_index("feature")
    rng = np.random.default_rng(5)
    scores = []
    for _ in range(3):
        idx = rng.integers(0, len(y), len(y))
        rep = otstab.feature_stability(model, X[idx], y[idx], feature_costs=costs, **kw).to_frame()
        scores.append(rep.set_index("feature")["score"].reindex(df.index).to_numpy())
    np.testing.assert_allclose(df["se"], np.std(scores, axis=0, ddof=1), rtol=1e-9)
    unpriced = otstab.feature_stability(model, X, y, **boot, **kw).to_frame().set_index("feature")
    moving = df.index[np.isfinite([costs.get(f, 1.0) for f in df.index])]
    assert not np.allclose(df.loc[moving, "se"], unpriced.loc[moving, "se"], rtol=1e-3)
