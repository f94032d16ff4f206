"""A tighter certified side for tree ensembles (issue 29: tightness at production size).

* **reach** (otstab/solve/_refine.py): a round of the 0/1 refinement searches each sample only
  out to ``reach * h / theta1``; the certified distances stay below the exact distances of the
  enumeration of the threshold grid (tests/test_trees.py), a capped search that completes is
  not reported exact unless it found the misclassified region, and the certified value stays
  below the value of the exact distances;
* **merged trees** (otstab/solve/_tree_kernel.py ``merge_groups``): the compiled search on
  groups of trees whose leaves are the intersections of theirs: its bounds never exceed the
  enumeration's exact distances, cut after any box count; a completed search gives the exact
  distance; at the root box the merged bound is never below the independent-trees one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_trees import EXTERNAL, LIBS, exact_distances, make_data, make_model

import otstab
from otstab import bounds
from otstab.solve import _tree_kernel as tree_kernel
from otstab.solve._refine import ZeroOneDuals

ENSEMBLES = tuple(lib for lib in LIBS + EXTERNAL if lib != "DecisionTree")
REL = 1e-12


def _case(lib, seed, d, k, n=12):
    X, y = make_data(seed + 10 * k, d, k, n=n)
    model = make_model(lib, seed).fit(X, y)
    return model, X, y, np.searchsorted(model.classes_, y)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("lib", ["RandomForest", "GradientBoosting", *EXTERNAL[:2]])
def test_reach_keeps_the_bounds_below_the_enumeration(lib, compiled):
    if compiled and not tree_kernel.available():
        pytest.skip("numba")
    for d, seed, k in ((2, 0, 2), (3, 1, 3)):
        model, X, y, yi = _case(lib, seed, d, k, n=16)
        exact = exact_distances(model, X, y)
        wrong = model.predict(X) != y
        loss0 = wrong.astype(float)
        up = np.where(wrong, 0.0, np.where(np.isfinite(exact), exact * 1.5 + 0.05, np.inf))
        duals = ZeroOneDuals(loss0, min(loss0.mean() + 0.2, 0.9), 1.0, 0.5, "kl")
        ref, _ = duals(np.where(wrong, 0.0, exact))
        for reach in (1.05, math.inf):
            for nodes in (4, 20000):
                lo, info = bounds.tree_lower_distances(model, X, yi, upper=up, duals=duals,
                                                       rtol=0.0, max_nodes=nodes,
                                                       compiled=compiled, reach=reach)
                assert np.all(lo <= exact * (1 + REL)), np.c_[lo, exact]
                done = info["exact"] & np.isfinite(exact)
                np.testing.assert_allclose(lo[done], exact[done], rtol=REL, atol=0)
                val, _ = duals(lo)
                assert val <= ref * (1 + 1e-9) + 1e-15


def test_reach_caps_the_search_radius():
    """With a cap below a sample's distance the search proves the cap, not the distance, and
    the sample is not reported exact; with the search run to completion (rtol 0, a large
    budget) the certified value is the value of the exact distances."""
    model, X, y, yi = _case("GradientBoosting", 1, 2, 2, n=16)
    exact = exact_distances(model, X, y)
    wrong = model.predict(X) != y
    up = np.where(wrong, 0.0, exact * 4.0)
    duals = ZeroOneDuals(wrong.astype(float), 0.3, 1.0, 0.5, "kl")
    _, h = duals(up)
    lo, info = bounds.tree_lower_distances(model, X, yi, upper=up, duals=duals, rtol=0.0,
                                           max_nodes=20000, reach=1.05)
    assert np.all(lo <= exact * (1 + REL))
    # samples beyond the first round's cap: proved at least the cap, not exact
    far = ~wrong & (exact > 1.05 * h) & (lo < exact * (1 - 1e-9))
    assert far.any()
    assert not np.any(info["exact"][far])
    ref, _ = duals(np.where(wrong, 0.0, exact))
    val, _ = duals(lo)
    assert val == pytest.approx(ref, rel=1e-9)


@pytest.mark.skipif(not tree_kernel.available(), reason="numba")
@pytest.mark.parametrize(("lib", "k"), [
    pytest.param(lib, k, marks=[pytest.mark.slow] if lib == "HistGradientBoosting" else [])
    for k in (2, 3) for lib in ENSEMBLES])  # (HistGradientBoosting: 100 trees, 5-12 s)
def test_merged_bounds_against_enumeration(lib, k):
    checked = 0
    for d, seed in ((2, 0), (3, 1)):
        model, X, y, yi = _case(lib, seed, d, k)
        exact = exact_distances(model, X, y)
        up = np.where(np.isfinite(exact), exact * 2.0 + 0.1, np.inf)
        root0, _ = bounds.tree_lower_distances(model, X, yi, upper=up, max_nodes=1,
                                               compiled=True, merge=0)
        for cap in (2, 256):
            for nodes in (1, 20, 20000):
                lo, info = bounds.tree_lower_distances(model, X, yi, upper=up,
                                                       max_nodes=nodes, compiled=True,
                                                       merge=cap)
                assert np.all(lo <= exact * (1 + REL)), (cap, nodes, np.c_[lo, exact])
                done = info["exact"] & np.isfinite(exact)
                np.testing.assert_allclose(lo[done], exact[done], rtol=REL, atol=0)
                if nodes == 1:  # the merged root key is at least the independent one
                    assert np.all(lo >= root0 * (1 - REL))
                else:
                    checked += int(np.sum(done & (exact > 0)))
    assert checked > 5


@pytest.mark.skipif(not tree_kernel.available(), reason="numba")
def test_merged_certificate_holds_the_enumerated_value(monkeypatch):
    monkeypatch.setattr(tree_kernel, "MERGE_CAP", 32)
    calls = []
    real = tree_kernel.batch_merged

    def spy(*a):
        calls.append(a[-1])
        return real(*a)

    monkeypatch.setattr(tree_kernel, "batch_merged", spy)
    for seed, lib in ((3, "GradientBoosting"),):
        model, X, y, _ = _case(lib, seed, 2, 2, n=16)
        exact = exact_distances(model, X, y)
        wrong = model.predict(X) != y
        res = otstab.certify(model, X, y, r=0.5, loss="zero_one", theta1=1.0, theta2=0.5)
        ref = otstab.certify_distances(exact, 0.5, theta1=1.0, theta2=0.5, misclassified=wrong)
        assert res.value_lower <= ref.value * (1 + 1e-9) + 1e-12
        assert ref.value <= res.value_upper * (1 + 1e-9) + 1e-12
    assert calls and set(calls) == {32}  # the merged search ran


@pytest.mark.skipif(not tree_kernel.available(), reason="numba")
def test_merged_bounds_with_fixed_features_and_prices():
    X, y = make_data(4, 3, 2, n=12)
    model = make_model("GradientBoosting", 4).fit(X, y)
    yi = np.searchsorted(model.classes_, y)
    mask = np.array([True, False, True])
    exact = exact_distances(model, X, y, mask)
    for kw in ({"mask": mask}, {"weights": np.array([0.3, 1.0, 3.0])}):
        ref = exact if "mask" in kw else None
        for nodes in (1, 20000):
            lo, info = bounds.tree_lower_distances(model, X, yi, max_nodes=nodes,
                                                   compiled=True, merge=16, **kw)
            lo0, info0 = bounds.tree_lower_distances(model, X, yi, max_nodes=nodes,
                                                     compiled=False, **kw)
            if ref is not None:
                assert np.all(lo <= ref * (1 + REL))
            done = info["exact"] & info0["exact"]
            np.testing.assert_allclose(lo[done], lo0[done], rtol=REL, atol=0)
            if nodes == 1:
                assert np.all(lo >= lo0 * (1 - REL))
