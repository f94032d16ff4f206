"""LightGBM's categorical splits in the leaf layout (issue 29): LightGBM sends x left when
``int(x)`` (truncated toward 0; negative values go right) is in the split's set of
categories; otstab.trees reads each side as a union of float64 intervals.

Checked against LightGBM itself: the layout's leaf sums equal ``predict(raw_score=True)`` on
random rows, on integer rows and one float64 step either side of every integer (binary and
3-class), and the certified distances against the enumeration of the grid of all cell edges
(tests/test_trees.py, whose threshold reader places LightGBM's categorical cell edges at -1
and just below every category c and c + 1), scored by the model's own ``predict``."""

import warnings

import numpy as np
import pytest
from test_trees import check_against_enumeration, exact_distances

import otstab
from otstab import bounds, trees

lightgbm = pytest.importorskip("lightgbm")


def _fit(seed, k, n=300, **kw):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    X[:, 1] = rng.integers(0, 8, n)
    X[:, 2] = rng.integers(0, 4, n)
    s = X[:, 0] + np.isin(X[:, 1], [1, 4, 5]) - 0.7 * (X[:, 2] == 2) + 0.3 * rng.normal(size=n)
    y = (s > 0.5).astype(int) if k == 2 else np.digitize(s, [0.0, 1.0])
    opts = dict(n_estimators=8, num_leaves=6, min_data_per_group=2, cat_smooth=1, n_jobs=1,
                verbose=-1, random_state=seed)
    opts.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lightgbm.LGBMClassifier(**opts).fit(X, y, categorical_feature=[1, 2])
    return model, X, y


@pytest.mark.parametrize("k", [2, 3])
def test_leaf_sums_equal_the_raw_scores(k):
    model, X, y = _fit(k, k)
    assert _cat_split(model)
    table = bounds.leaf_table(model, 3, X)
    rng = np.random.default_rng(10 + k)
    Z = rng.normal(size=(2000, 3)) * 4
    ints = np.arange(-3, 11, dtype=np.float64)
    edges = np.r_[ints, np.nextafter(ints, np.inf), np.nextafter(ints, -np.inf), 1e10, -1e10]
    for j in (1, 2):
        W = np.repeat(Z[:1], edges.size, axis=0)
        W[:, j] = edges
        Z = np.vstack([Z, W])
    raw = trees.raw_margins(model, Z)
    np.testing.assert_allclose(table.scores(Z), raw, rtol=0, atol=1e-9 * (1 + np.abs(raw).max()))


def _cat_split(model):
    return '"decision_type": "=="' in str(model.booster_.dump_model()).replace("'", '"')


@pytest.mark.parametrize("k", [2, 3])
def test_certified_distances_against_the_enumeration(k):
    # 2-D (one numeric feature, one categorical) for the enumeration; some codes non-integer
    rng = np.random.default_rng(k)
    n = 150
    X = np.c_[rng.normal(size=n), rng.integers(0, 6, n)]
    s = X[:, 0] * (1 + (X[:, 1] % 3 == 1)) + np.isin(X[:, 1], [1, 4]) + 0.5 * rng.normal(size=n)
    y = (s > 0.5).astype(int) if k == 2 else np.digitize(s, [0.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lightgbm.LGBMClassifier(n_estimators=5, num_leaves=5, min_data_per_group=2,
                                        cat_smooth=1, cat_l2=0.0, min_child_samples=5,
                                        n_jobs=1, verbose=-1,
                                        random_state=k).fit(X, y, categorical_feature=[1])
    assert _cat_split(model)
    Xe, ye = X[:10].copy(), y[:10]
    Xe[:, 0] += 0.1 * rng.normal(size=10)
    Xe[:3, 1] += 0.5
    assert check_against_enumeration(model, Xe, ye) >= 3
    exact = exact_distances(model, Xe, ye)
    res = otstab.certify(model, Xe, ye, r=0.6, loss="zero_one", theta1=1.0, theta2=0.5)
    ref = otstab.certify_distances(exact, 0.6, theta1=1.0, theta2=0.5,
                                   misclassified=model.predict(Xe) != ye)
    lo = res.value_lower if res.status == "bounds" else res.value
    up = res.value_upper if res.status == "bounds" else res.value
    assert 0 < lo <= ref.value * (1 + 1e-9) <= up * (1 + 2e-9)
