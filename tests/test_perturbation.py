"""Nearest misclassified points (otstab.perturbation) against independent brute force.

For axis-aligned models (trees and tree ensembles) the prediction is constant on each cell of
the product grid of split thresholds: ``brute_cells`` predicts one point inside each cell and
takes, per sample, the smallest squared distance to a cell predicted as another class (the
distance from a point to an axis-aligned box), which is the exact ``d*`` in 2-D.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.ensemble import (  # noqa: E402
    AdaBoostClassifier,
    BaggingClassifier,
    ExtraTreesClassifier,
    GradientBoostingClassifier,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
)
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.neighbors import KNeighborsClassifier  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402
from sklearn.svm import SVC  # noqa: E402
from sklearn.tree import DecisionTreeClassifier  # noqa: E402

from otstab import nonlinear  # noqa: E402
from otstab.errors import IncompatibleLossError, ValidationError  # noqa: E402
from otstab.modeling._perturbation import min_perturbation_distances, perturbation_search  # noqa: E402


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = (X[:, 0] + 0.5 * X[:, 1] + 0.4 * rng.normal(size=200) > 0).astype(int)
    return X, y


@pytest.fixture(scope="module")
def data3():
    """Two informative columns and a column of zeros (never split on), binary and 3 classes."""
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=(200, 2)), np.zeros(200)])
    s = X[:, 0] + 0.5 * X[:, 1] + 0.4 * rng.normal(size=200)
    return X, (s > 0).astype(int), np.digitize(s, [-0.6, 0.6])


def all_thresholds(model):
    """Every finite split threshold of a tree or tree ensemble, whatever feature it splits.

    The union over features is a superset of each feature's thresholds, so its product grid is
    finer than the model's cells (and needs no feature indexing, e.g. of bagging's column
    subsets). scikit-learn trees send ``float32(x) <= t`` left: on float64 inputs the cell edge
    is the midpoint between the float32 values around ``t``. Histogram gradient boosting
    compares float64 inputs with ``t`` itself.
    """
    if hasattr(model, "_predictors"):
        t = [p.nodes["num_threshold"][~p.nodes["is_leaf"].astype(bool)]
             for it in model._predictors for p in it]
        f32 = False
    else:
        ests = [model] if hasattr(model, "tree_") else list(np.ravel(model.estimators_))
        t = [e.tree_.threshold[e.tree_.children_left != -1] for e in ests]
        f32 = True
    t = np.concatenate(t)
    t = np.unique(t[np.isfinite(t)])
    if f32:
        below = t.astype(np.float32)
        below = np.where(below > t, np.nextafter(below, np.float32(-np.inf)), below)
        above = np.nextafter(below, np.float32(np.inf))
        t = np.unique(0.5 * (below.astype(np.float64) + above.astype(np.float64)))
    return t


def brute_cells(model, X, y, movable=(0, 1)):
    """Exact d*: min squared distance from x_i to a grid cell predicted != y_i.

    Features outside ``movable`` keep the sample's value. Each cell is a box between
    consecutive grid values (unbounded at the ends), predicted at an interior point.
    """
    T = all_thresholds(model)
    lo1, hi1 = np.r_[-np.inf, T], np.r_[T, np.inf]
    mid = np.r_[T[0] - 1.0, 0.5 * (T[:-1] + T[1:]), T[-1] + 1.0] if T.size else np.zeros(1)
    d = X.shape[1]
    axes = [np.arange(mid.size) if j in movable else np.array([-1]) for j in range(d)]
    cells = np.array(list(itertools.product(*axes)))
    out = np.full(X.shape[0], np.inf)
    for i, x in enumerate(X):
        C = np.where(cells >= 0, mid[cells], x[None, :])
        lo = np.where(cells >= 0, lo1[cells], x[None, :])
        hi = np.where(cells >= 0, hi1[cells], x[None, :])
        wrong = model.predict(C) != y[i]
        gap = np.maximum(np.maximum(lo - x, x - hi), 0.0)
        if wrong.any():
            out[i] = np.min(np.sum(gap[wrong] ** 2, axis=1))
    return out


def assert_dist_close(a, b):
    """Distances agree up to float32 rounding of the model's inputs (trees compare float32)."""
    np.testing.assert_allclose(np.sqrt(a), np.sqrt(b), rtol=0, atol=1e-6)


def check_points(model, X, y, res):
    """Returned points are misclassified and at the reported (or a smaller) distance."""
    fin = np.isfinite(res.distances)
    P = res.points[fin]
    if fin.any():  # (scikit-learn refuses to predict zero rows)
        assert np.all(model.predict(P) != y[fin])
    moved = np.sum((P - X[fin]) ** 2, axis=1)
    if res.exact:  # exact infimum; the point lies a rounding step beyond the boundary
        assert_dist_close(moved, res.distances[fin])
    else:
        np.testing.assert_allclose(moved, res.distances[fin], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(res.distances[res.misclassified], 0.0)


@pytest.mark.parametrize("classes", ["binary", "multiclass"])
def test_decision_tree_exact_vs_brute_force(data3, classes):
    X3, yb, ym = data3
    X, y = X3[:, :2], (yb if classes == "binary" else ym)
    tree = DecisionTreeClassifier(max_depth=6, random_state=0).fit(X, y)
    Xe, ye = X[:60], y[:60]
    res = perturbation_search(tree, Xe, ye)
    assert res.exact and res.method == "tree"
    assert res.misclassified.any() and (~res.misclassified).any()
    ref = brute_cells(tree, Xe, ye)
    # both are the distance to the nearest box edge (float32 midpoints): equal to rounding
    np.testing.assert_allclose(res.distances, ref, rtol=1e-12, atol=0)
    check_points(tree, Xe, ye, res)
    # masked: only feature 1 may move
    res1 = perturbation_search(tree, Xe, ye, mask=np.array([False, True]))
    ref1 = brute_cells(tree, Xe, ye, movable=(1,))
    np.testing.assert_allclose(res1.distances, ref1, rtol=1e-12, atol=0)
    check_points(tree, Xe, ye, res1)
    fin = np.isfinite(ref1)
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


ENSEMBLES = {
    "gb": lambda: GradientBoostingClassifier(n_estimators=8, max_depth=2, random_state=0),
    "rf": lambda: RandomForestClassifier(n_estimators=8, max_depth=3, random_state=0),
    "hgb": lambda: HistGradientBoostingClassifier(max_iter=8, max_depth=3),
    "et": lambda: ExtraTreesClassifier(n_estimators=8, max_depth=3, random_state=0),
    "ada": lambda: AdaBoostClassifier(n_estimators=8, random_state=0),
    # each tree sees one column: its feature 0 is column estimators_features_[k][0]
    "bag": lambda: BaggingClassifier(DecisionTreeClassifier(max_depth=3), n_estimators=6,
                                     max_features=1, random_state=0),
}


@pytest.mark.parametrize("classes", ["binary", "multiclass"])
@pytest.mark.parametrize("name", list(ENSEMBLES))
def test_tree_ensembles_with_an_unused_feature(data3, name, classes):
    """Regression (issue 12): a movable feature that no tree splits on made the line search
    index an empty threshold array (IndexError). Such a feature is now kept fixed."""
    X, yb, ym = data3
    y = yb if classes == "binary" else ym
    model = ENSEMBLES[name]().fit(X, y)
    Xe, ye = X[:30], y[:30]
    # the column of zeros is never split on: moving it anywhere changes no prediction
    for shift in (-100.0, 100.0):
        Xs = Xe.copy()
        Xs[:, 2] = shift
        np.testing.assert_array_equal(model.predict(Xs), model.predict(Xe))
    # one useful movable feature (plus the unused one): the coordinate line is the whole
    # search space -> exact, and equal to the brute force up to float32 rounding
    for mask in ([0], [0, 2], [1, 2]):
        res1 = perturbation_search(model, Xe, ye, mask=mask)
        assert res1.exact
        check_points(model, Xe, ye, res1)
        ref1 = brute_cells(model, Xe, ye, movable=tuple(j for j in mask if j != 2))
        assert np.array_equal(np.isinf(res1.distances), np.isinf(ref1))
        fin = np.isfinite(ref1)
        assert_dist_close(res1.distances[fin], ref1[fin])
        np.testing.assert_array_equal(res1.points[fin, 2], Xe[fin, 2])
    # all features: a heuristic upper bound, verified misclassified, close to the truth
    res = perturbation_search(model, Xe, ye)
    check_points(model, Xe, ye, res)
    ref = brute_cells(model, Xe, ye)
    assert np.array_equal(np.isinf(res.distances), np.isinf(ref))
    fin = np.isfinite(ref)
    assert np.all(res.distances[fin] >= ref[fin] - 1e-9)  # never below the exact minimum
    assert np.mean(res.distances[fin] <= ref[fin] * 1.05 + 1e-9) >= 0.8
    np.testing.assert_array_equal(res.points[fin, 2], Xe[fin, 2])


def test_only_the_unused_feature_movable_is_exact_and_unreachable(data3):
    X, y, _ = data3
    model = GradientBoostingClassifier(n_estimators=4, max_depth=2, random_state=0).fit(X, y)
    res = perturbation_search(model, X[:20], y[:20], mask=[2])
    assert res.exact
    np.testing.assert_array_equal(res.distances, np.where(res.misclassified, 0.0, np.inf))


def test_gradient_boosting_with_a_model_init_is_not_axis_aligned(data):
    """With init=LogisticRegression the prediction also moves between split thresholds: no
    exactness claim for one movable feature, and the search still finds the nearest change
    along that line (checked against a dense 1-D scan)."""
    X, y = data
    model = GradientBoostingClassifier(n_estimators=3, max_depth=1, init=LogisticRegression(),
                                       random_state=0).fit(X, y)
    Xe, ye = X[:20], y[:20]
    res = perturbation_search(model, Xe, ye, mask=[0])
    assert not res.exact
    check_points(model, Xe, ye, res)
    g = np.linspace(-8, 8, 16001)  # spacing 1e-3
    for i in range(20):
        Z = np.repeat(Xe[i:i + 1], g.size, axis=0)
        Z[:, 0] = g
        wrong = model.predict(Z) != ye[i]
        scan = np.sqrt(np.min((g[wrong] - Xe[i, 0]) ** 2)) if wrong.any() else np.inf
        assert np.sqrt(res.distances[i]) <= scan + 1e-3


PREDICT_ONLY = {  # (the other ensembles' points are checked above)
    "knn": lambda: KNeighborsClassifier(5),
    "svc": lambda: SVC(kernel="rbf"),
    "tree": lambda: DecisionTreeClassifier(max_depth=3, random_state=0),
    "et": ENSEMBLES["et"],
    "ada": ENSEMBLES["ada"],
}


@pytest.mark.parametrize("mask", [None, [0, 2], [2]], ids=["all", "0+2", "2"])
@pytest.mark.parametrize("classes", ["binary", "multiclass"])
@pytest.mark.parametrize("name", list(PREDICT_ONLY))
def test_any_classifier_points_are_misclassified_at_the_reported_distance(data3, name, classes,
                                                                          mask):
    X, yb, ym = data3
    y = yb if classes == "binary" else ym
    model = PREDICT_ONLY[name]().fit(X, y)
    res = perturbation_search(model, X[:25], y[:25], mask=mask)
    check_points(model, X[:25], y[:25], res)
    if mask is not None:  # columns outside the mask never move
        fixed = np.setdiff1d(np.arange(3), mask)
        fin = np.isfinite(res.distances)
        np.testing.assert_array_equal(res.points[fin][:, fixed], X[:25][fin][:, fixed])
    assert np.all(np.isnan(res.points[~np.isfinite(res.distances)]))


@pytest.mark.parametrize("name", ["gb", "rf", "hgb", "knn", "tree"])
def test_degenerate_inputs(data3, name):
    X, y, _ = data3
    model = {**ENSEMBLES, **PREDICT_ONLY}[name]().fit(X, y)
    Xe, ye = X[:30], y[:30]
    pred = model.predict(Xe)
    # nothing may move: correctly classified samples are out of reach
    res = perturbation_search(model, Xe, ye, mask=np.zeros(3, dtype=bool))
    assert res.exact
    np.testing.assert_array_equal(res.distances, np.where(pred != ye, 0.0, np.inf))
    # one sample (no data scale for the search radius): a verified misclassified point
    one = perturbation_search(model, Xe[3:4], ye[3:4])
    check_points(model, Xe[3:4], ye[3:4], one)
    assert np.isfinite(one.distances[0])
    # every sample already misclassified: zero distances, the points are the samples
    wrong = 1 - pred
    res = perturbation_search(model, Xe, wrong)
    np.testing.assert_array_equal(res.distances, 0.0)
    np.testing.assert_array_equal(res.points, Xe)


@pytest.mark.parametrize("name", ["tree", "rf", "gb", "hgb"])
def test_model_predicting_one_class_everywhere(data3, name):
    """Trees reduced to one leaf: no move changes the prediction (d* = inf, exact)."""
    X, _, _ = data3
    y = np.zeros(X.shape[0], dtype=int)
    y[:3] = 1  # too few to be split off with min_samples_leaf=150
    kw = {"min_samples_leaf": 150}
    model = {"tree": DecisionTreeClassifier(**kw),
             "rf": RandomForestClassifier(n_estimators=3, random_state=0, **kw),
             "gb": GradientBoostingClassifier(n_estimators=3, **kw),
             "hgb": HistGradientBoostingClassifier(max_iter=3, **kw)}[name].fit(X, y)
    assert np.all(model.predict(X) == 0)
    res = perturbation_search(model, X[:20], y[:20])
    assert res.exact
    np.testing.assert_array_equal(res.distances, np.where(y[:20] == 1, 0.0, np.inf))


@pytest.mark.parametrize("name", ["gb", "rf", "hgb", "ada"])
def test_certify_zero_one_tree_ensemble_with_an_unused_feature(data3, name):
    """certify(loss='zero_one') used to raise IndexError here; Q*'s error rate, recomputed
    with the model's own predictions, is r; one useful movable feature gives an exact value."""
    import otstab

    X, y, _ = data3
    model = ENSEMBLES[name]().fit(X, y)
    r = float(np.mean(model.predict(X) != y)) + 0.1
    res = otstab.certify(model, X, y, loss="zero_one", r=r)
    assert np.isfinite(res.value) and not res.exact
    wrong = model.predict(res.X_star) != y[res.source]
    assert np.sum(res.mass * res.weights * wrong) / X.shape[0] == pytest.approx(r, abs=1e-9)
    res1 = otstab.certify(model, X, y, loss="zero_one", r=r, features=[0, 2])
    assert res1.exact


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
    from otstab.solve._zero_one import certify_distances

    X, y = data
    tree = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y)
    res = otstab.certify(tree, X, y, loss="zero_one", r=0.3)
    ref = certify_distances(brute_cells(tree, X, y), 0.3)
    assert res.exact and res.value == pytest.approx(ref.value, rel=1e-5)
    # the error rate of Q* recomputed with the tree's own predictions
    wrong = tree.predict(res.X_star) != y[res.source]
    assert np.sum(res.mass * res.weights * wrong) / X.shape[0] == pytest.approx(0.3, abs=1e-9)
    mlp = MLPClassifier(hidden_layer_sizes=(6,), max_iter=2000, random_state=0).fit(X, y)
    res_m = otstab.certify(mlp, X, y, loss="zero_one", r=0.3)
    assert not res_m.exact and "upper bound" in res_m.message
    assert res_m.risk_star == pytest.approx(0.3, abs=1e-9)
