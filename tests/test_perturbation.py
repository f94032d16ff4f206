"""Nearest misclassified points (otstab.perturbation) against independent brute force.

For axis-aligned models (trees and tree ensembles) the prediction is constant on the cells of
the product grid of split thresholds, so the nearest misclassified point is among the points
whose every coordinate is either ``x_j`` or a value just past a threshold of feature ``j``:
enumerating that product is an exact brute force in 2-D.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.ensemble import (  # noqa: E402
    GradientBoostingClassifier,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
)
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402
from sklearn.tree import DecisionTreeClassifier  # noqa: E402

from otstab import nonlinear  # noqa: E402
from otstab.errors import IncompatibleLossError, ValidationError  # noqa: E402
from otstab.perturbation import min_perturbation_distances, perturbation_search  # noqa: E402


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = (X[:, 0] + 0.5 * X[:, 1] + 0.4 * rng.normal(size=200) > 0).astype(int)
    return X, y


def thresholds_of(model, j):
    """Split thresholds on feature j of a tree or a tree ensemble (independent of the module)."""
    if hasattr(model, "_predictors"):
        t = [p.nodes["num_threshold"][(~p.nodes["is_leaf"].astype(bool))
                                      & (p.nodes["feature_idx"] == j)]
             for it in model._predictors for p in it]
    else:
        ests = [model] if hasattr(model, "tree_") else list(np.ravel(model.estimators_))
        t = [e.tree_.threshold[(e.tree_.children_left != -1) & (e.tree_.feature == j)]
             for e in ests]
    return np.unique(np.concatenate(t))


def probes(T):
    """Values just above each threshold (float32-safe) and at or just below it."""
    up = np.nextafter(T.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    up = np.where(up <= T, np.nextafter(up.astype(np.float32), np.float32(np.inf)), up)
    dn = T.astype(np.float32).astype(np.float64)
    dn = np.where(dn > T, np.nextafter(dn.astype(np.float32), np.float32(-np.inf)), dn)
    return np.concatenate([up, dn])


def brute_axis_aligned(model, X, y, movable=(0, 1)):
    """Exact d* by enumerating the threshold-product candidates (2-D)."""
    cand_vals = [probes(thresholds_of(model, j)) for j in range(X.shape[1])]
    out = np.empty(X.shape[0])
    for i, x in enumerate(X):
        axes = [np.r_[x[j], cand_vals[j]] if j in movable else np.array([x[j]])
                for j in range(X.shape[1])]
        C = np.array(list(itertools.product(*axes)))
        wrong = model.predict(C) != y[i]
        out[i] = np.min(np.sum((C[wrong] - x) ** 2, axis=1)) if wrong.any() else np.inf
    return out


def assert_dist_close(a, b):
    """Distances agree up to float32 rounding of the model's inputs (trees compare float32)."""
    np.testing.assert_allclose(np.sqrt(a), np.sqrt(b), rtol=0, atol=1e-6)


def check_points(model, X, y, res):
    """Returned points are misclassified and at the reported (or a smaller) distance."""
    fin = np.isfinite(res.distances)
    P = res.points[fin]
    assert np.all(model.predict(P) != y[fin])
    moved = np.sum((P - X[fin]) ** 2, axis=1)
    if res.exact:  # exact infimum; the point lies a rounding step beyond the boundary
        assert_dist_close(moved, res.distances[fin])
    else:
        np.testing.assert_allclose(moved, res.distances[fin], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(res.distances[res.misclassified], 0.0)


def test_decision_tree_exact_vs_brute_force(data):
    X, y = data
    tree = DecisionTreeClassifier(max_depth=6, random_state=0).fit(X, y)
    Xe, ye = X[:60], y[:60]
    res = perturbation_search(tree, Xe, ye)
    assert res.exact and res.method == "tree"
    assert res.misclassified.any() and (~res.misclassified).any()
    ref = brute_axis_aligned(tree, Xe, ye)
    assert_dist_close(res.distances, ref)
    check_points(tree, Xe, ye, res)
    # masked: only feature 1 may move
    res1 = perturbation_search(tree, Xe, ye, mask=np.array([False, True]))
    ref1 = brute_axis_aligned(tree, Xe, ye, movable=(1,))
    assert np.array_equal(np.isinf(res1.distances), np.isinf(ref1))
    fin = np.isfinite(ref1)
    assert_dist_close(res1.distances[fin], ref1[fin])
    check_points(tree, Xe, ye, res1)
    np.testing.assert_array_equal(res1.points[fin][:, 0], Xe[fin][:, 0])


def test_decision_tree_dense_grid_upper_bounds_it(data):
    """A plain dense grid can only find points at least as far (up to its spacing)."""
    X, y = data
    tree = DecisionTreeClassifier(max_depth=4, random_state=1).fit(X, y)
    g = np.linspace(-4, 4, 401)
    G = np.array(np.meshgrid(g, g)).reshape(2, -1).T
    pg = tree.predict(G)
    d = min_perturbation_distances(tree, X[:30], y[:30])
    for i in range(30):
        dg = np.min(np.sum((G[pg != y[i]] - X[i]) ** 2, axis=1))
        # (the grid may be much farther: it misses leaves thinner than its spacing, which
        # the exact search finds and verifies, see check_points above)
        assert d[i] <= dg + 1e-12


def test_linear_closed_form(data):
    X, y = data
    lr = LogisticRegression().fit(X, y)
    res = perturbation_search(lr, X, y)
    assert res.exact and res.method == "linear"
    s = lr.decision_function(X)
    w = lr.coef_[0]
    expected = np.where(res.misclassified, 0.0, s**2 / (w @ w))
    np.testing.assert_allclose(res.distances, expected, rtol=1e-12)
    check_points(lr, X, y, res)
    d, P = min_perturbation_distances(lr, X, y, mask=[1], return_points=True)
    np.testing.assert_allclose(d, np.where(res.misclassified, 0.0, s**2 / w[1] ** 2),
                               rtol=1e-12)
    np.testing.assert_array_equal(P[:, 0], X[:, 0])


def test_linear_multiclass_closed_form():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(150, 3))
    y = np.argmax(X @ rng.normal(size=(3, 3)).T + 0.5 * rng.normal(size=(150, 3)), axis=1)
    lr = LogisticRegression().fit(X, y)
    res = perturbation_search(lr, X, y)
    S = lr.decision_function(X)
    W = lr.coef_
    ref = np.full(150, np.inf)
    for k in range(3):
        gap = np.maximum(S[np.arange(150), y] - S[:, k], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            dk = gap**2 / np.sum((W[y] - W[k]) ** 2, axis=1)
        ref = np.where(k != y, np.minimum(ref, dk), ref)
    ref[lr.predict(X) != y] = 0.0
    np.testing.assert_allclose(res.distances, ref, rtol=1e-12, atol=1e-15)
    check_points(lr, X, y, res)


@pytest.mark.parametrize("model", [
    RandomForestClassifier(n_estimators=8, max_depth=3, random_state=0),
    GradientBoostingClassifier(n_estimators=8, max_depth=2, random_state=0),
    HistGradientBoostingClassifier(max_iter=8, max_depth=3),
], ids=["rf", "gb", "hgb"])
def test_tree_ensembles(data, model):
    X, y = data
    model.fit(X, y)
    Xe, ye = X[:30], y[:30]
    # one movable feature: the coordinate line is the whole search space -> exact
    res1 = perturbation_search(model, Xe, ye, mask=np.array([True, False]))
    assert res1.exact
    ref1 = brute_axis_aligned(model, Xe, ye, movable=(0,))
    assert np.array_equal(np.isinf(res1.distances), np.isinf(ref1))
    fin = np.isfinite(ref1)
    assert_dist_close(res1.distances[fin], ref1[fin])
    # all features: a heuristic upper bound, verified misclassified, close to the truth
    res = perturbation_search(model, Xe, ye)
    assert not res.exact
    check_points(model, Xe, ye, res)
    ref = brute_axis_aligned(model, Xe, ye)
    assert np.all(np.sqrt(res.distances) >= np.sqrt(ref) - 1e-6)
    close = res.distances <= ref * 1.05 + 1e-9
    assert close.mean() >= 0.8


def test_mlp_identity_activation_matches_closed_form(data):
    """An MLP with identity activations is linear: the gradient search must find the exact
    distance s^2 / ||w_eff||^2."""
    X, y = data
    clf = MLPClassifier(hidden_layer_sizes=(5,), activation="identity", max_iter=2000,
                        random_state=0).fit(X, y)
    w_eff = (clf.coefs_[0] @ clf.coefs_[1])[:, 0]
    b_eff = float(clf.intercepts_[0] @ clf.coefs_[1][:, 0] + clf.intercepts_[1][0])
    s = X @ w_eff + b_eff
    res = perturbation_search(clf, X, y)
    assert res.method == "gradient" and not res.exact
    ref = np.where(res.misclassified, 0.0, s**2 / (w_eff @ w_eff))
    assert np.all(res.distances >= ref * (1 - 1e-9) - 1e-15)  # upper bounds
    np.testing.assert_allclose(res.distances, ref, rtol=1e-4, atol=1e-12)
    check_points(clf, X, y, res)


def test_mlp_upper_bound_and_close_to_dense_grid(data):
    X, y = data
    clf = MLPClassifier(hidden_layer_sizes=(8,), activation="tanh", max_iter=3000,
                        random_state=0).fit(X, y)
    Xe, ye = X[:40], y[:40]
    res = perturbation_search(clf, Xe, ye)
    check_points(clf, Xe, ye, res)
    g = np.linspace(-4.5, 4.5, 601)
    G = np.array(np.meshgrid(g, g)).reshape(2, -1).T
    pg = nonlinear.MLPModel(clf).predict_internal(G)  # class index 0/1 as -1/+1
    pg = (pg > 0).astype(int)
    for i in np.nonzero(~res.misclassified)[0]:
        dg = np.sqrt(np.min(np.sum((G[pg != ye[i]] - Xe[i]) ** 2, axis=1)))
        di = np.sqrt(res.distances[i])
        assert di <= dg + 0.011  # upper bound found by the grid, up to its spacing (0.015/2^.5)
        assert di <= dg * 1.02 + 0.011  # and close to the true distance


def test_internal_labels_adapters_and_errors(data):
    X, y = data
    clf = MLPClassifier(hidden_layer_sizes=(4,), max_iter=2000, random_state=0).fit(
        X, np.where(y == 1, "yes", "no"))
    labels = np.where(y == 1, "yes", "no")
    d_model = min_perturbation_distances(clf, X[:20], labels[:20])
    ad = nonlinear.MLPModel(clf)
    internal = np.where(labels[:20] == clf.classes_[1], 1.0, -1.0)
    d_int = min_perturbation_distances(ad, X[:20], internal, labels="internal")
    np.testing.assert_allclose(d_model, d_int, rtol=1e-12)
    with pytest.raises(ValidationError, match="unknown"):
        min_perturbation_distances(clf, X[:5], np.array(["a"] * 5))
    with pytest.raises(ValidationError, match="mask"):
        min_perturbation_distances(clf, X[:5], labels[:5], mask=np.array([True]))
    reg = MLPRegressor(hidden_layer_sizes=(3,), max_iter=200, random_state=0)
    with pytest.warns(Warning):
        reg.fit(X, X[:, 0])
    with pytest.raises(IncompatibleLossError):
        min_perturbation_distances(nonlinear.MLPModel(reg), X[:5], X[:5, 0])
    X_before = X.copy()
    min_perturbation_distances(DecisionTreeClassifier(max_depth=2).fit(X, y), X, y)
    np.testing.assert_array_equal(X, X_before)


def test_torch_module_distances(data):
    torch = pytest.importorskip("torch")
    X, y = data
    clf = MLPClassifier(hidden_layer_sizes=(6,), activation="tanh", max_iter=2000,
                        random_state=0).fit(X, y)
    net = torch.nn.Sequential(torch.nn.Linear(2, 6), torch.nn.Tanh(),
                              torch.nn.Linear(6, 1)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor(clf.coefs_[0].T))
        net[0].bias.copy_(torch.tensor(clf.intercepts_[0]))
        net[2].weight.copy_(torch.tensor(clf.coefs_[1].T))
        net[2].bias.copy_(torch.tensor(clf.intercepts_[1]))
    tm = nonlinear.TorchModel(net, task="binary", classes=[0, 1])
    d_t = min_perturbation_distances(tm, X[:30], y[:30])
    d_s = min_perturbation_distances(clf, X[:30], y[:30])
    np.testing.assert_allclose(d_t, d_s, rtol=1e-6, atol=1e-12)


def test_certify_zero_one_nonlinear(data):
    """certify(loss='zero_one') on a tree uses the exact distances; Q*'s error rate is r."""
    import otstab
    from otstab.zero_one import certify_distances

    X, y = data
    tree = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y)
    res = otstab.certify(tree, X, y, loss="zero_one", r=0.3)
    ref = certify_distances(brute_axis_aligned(tree, X, y), 0.3)
    assert res.exact and res.value == pytest.approx(ref.value, rel=1e-5)
    # the error rate of Q* recomputed with the tree's own predictions
    wrong = tree.predict(res.X_star) != y[res.source]
    assert np.sum(res.mass * res.weights * wrong) / X.shape[0] == pytest.approx(0.3, abs=1e-9)
    mlp = MLPClassifier(hidden_layer_sizes=(6,), max_iter=2000, random_state=0).fit(X, y)
    res_m = otstab.certify(mlp, X, y, loss="zero_one", r=0.3)
    assert not res_m.exact and "upper bound" in res_m.message
    assert res_m.risk_star == pytest.approx(0.3, abs=1e-9)
