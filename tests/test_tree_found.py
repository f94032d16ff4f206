"""The fast found side and the radius key of the tree branch and bound (issue 29), against the
exhaustive enumeration of tests/test_trees.py.

* the radius key is a lower bound on every misclassified input's distance: the branch and
  bound stopped after its root box (1 box), or after 3, still certifies ``dlow <= exact``;
* the compiled walk of the leaf table reproduces the table's scores (and so the model's);
* the fast found side returns points the model itself misclassifies, at their own distances,
  never below the exact distance.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_trees import EXTERNAL, LIBS, exact_distances, make_data, make_model

from otstab import bounds
from otstab.solve import _tree_found as tree_found

ENSEMBLES = tuple(lib for lib in LIBS + EXTERNAL if lib != "DecisionTree")


def _fit(lib, seed, d, k, n=14):
    X, y = make_data(seed + 10 * k, d, k, n=n)
    return make_model(lib, seed).fit(X, y), X, y


@pytest.mark.parametrize("lib", LIBS + EXTERNAL)
@pytest.mark.parametrize("k", [2, 3])
def test_radius_key_of_a_few_boxes_is_a_certified_lower_bound(lib, k):
    positive = 0
    for d, seed in ((2, 0), (2, 1)):
        model, X, y = _fit(lib, seed, d, k)
        exact = exact_distances(model, X, y)
        yi = np.searchsorted(model.classes_, y)
        for nodes in (1, 3):
            lower, _ = bounds.tree_lower_distances(model, X, yi, upper=np.full(len(y), np.inf),
                                                   max_nodes=nodes)
            assert np.all(lower <= exact * (1 + 1e-12)), np.c_[lower, exact]
            positive += int(np.sum((lower > 0) & np.isfinite(exact)))
    assert positive > 0  # the key is not the trivial 0 everywhere


@pytest.mark.parametrize("lib", ENSEMBLES)
def test_compiled_walk_reproduces_the_leaf_table(lib):
    pytest.importorskip("numba")
    model, X, y = _fit(lib, 2, 3, 3)
    table = bounds.leaf_table(model, 3, X)
    ev = tree_found.TreeEvaluator.build(table, X)
    if ev is None and lib == "CatBoost":  # oblivious trees may hold empty leaf boxes: the
        pytest.skip("walk not built (the model's own predict is used)")  # walk refuses
    assert ev is not None
    rng = np.random.default_rng(0)
    Z = np.r_[X, rng.normal(size=(300, 3)) * 2, X.round(1)]
    np.testing.assert_allclose(ev.scores(Z), table.scores(Z), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(model.classes_)[ev.predict(Z)],
                                  np.ravel(model.predict(Z)))


@pytest.mark.parametrize("lib", ENSEMBLES)
@pytest.mark.parametrize("k", [2, 3])
def test_fast_found_points_are_misclassified_and_not_below_exact(lib, k, monkeypatch):
    monkeypatch.setattr(tree_found, "FAST_ABOVE", 0)  # the fast side even at this size
    model, X, y = _fit(lib, 3, 3, k, n=16)
    exact = exact_distances(model, X, y)
    internal = np.where(y == model.classes_[1], 1, -1) if k == 2 else np.searchsorted(
        model.classes_, y)
    res, _ = tree_found.tree_search(model, X, internal)
    assert res.method == "tree_ensemble" and not res.exact
    assert np.all(res.distances >= exact * (1 - 1e-12))
    ok = np.isfinite(res.points).all(axis=1)
    assert np.all(np.ravel(model.predict(res.points[ok])) != y[ok])
    np.testing.assert_allclose(res.distances[ok],
                               np.sum((res.points[ok] - X[ok]) ** 2, axis=1), rtol=1e-12)
    assert np.all(np.isinf(res.distances[~ok]))
