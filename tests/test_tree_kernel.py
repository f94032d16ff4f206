"""The compiled, parallel tree branch and bound (otstab/solve/_tree_kernel.py, issue 29), against
the NumPy branch and bound it reimplements and the exhaustive enumeration of
tests/test_trees.py.

* at equal ``max_nodes`` the kernel certifies the NumPy path's distances (same boxes, same
  keys, same order: same bound, same completion, same box count), with fixed features and
  per-feature prices too, and on forests whose votes tie (the kernel hands those boxes back);
* its bounds never exceed the exact distance of the enumeration, cut after any box count;
* ``refine`` run in parallel chunks gives the sequential run's bounds, and a run stopped by
  the time budget is reproduced by its ``node_budget``;
* without numba the NumPy path runs (the fallback).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_trees import EXTERNAL, LIBS, exact_distances, make_data, make_model

from otstab import bounds
from otstab.solve import _refine as refine_mod
from otstab.solve import _tree_kernel as tree_kernel

pytest.importorskip("numba")

ENSEMBLES = LIBS + EXTERNAL


def _both(model, X, y, nodes, **kw):
    yi = np.searchsorted(model.classes_, y)
    up = kw.pop("upper", np.full(len(y), np.inf))
    out = []
    for compiled in (False, True):
        out.append(bounds.tree_lower_distances(model, X, yi, upper=up, max_nodes=nodes,
                                               compiled=compiled, **kw))
    return out


@pytest.mark.parametrize(("lib", "k"), [
    pytest.param(lib, k, marks=[pytest.mark.slow] if (lib, k) == ("HistGradientBoosting", 3)
                 else [])  # (10 s under load: 3 x 100 trees on the NumPy side)
    for k in (2, 3) for lib in ENSEMBLES])
def test_kernel_certifies_the_numpy_distances(lib, k):
    for d, seed in ((2, 0), (3, 1)):
        X, y = make_data(seed + 10 * k, d, k, n=12)
        model = make_model(lib, seed).fit(X, y)
        exact = exact_distances(model, X, y)
        for nodes in ((1, 20) if lib == "HistGradientBoosting" else (1, 20, 300)):  # (slow)
            (lo_np, inf_np), (lo_k, inf_k) = _both(model, X, y, nodes, rtol=None)
            np.testing.assert_allclose(lo_k, lo_np, rtol=1e-12, atol=0)
            np.testing.assert_array_equal(inf_k["exact"], inf_np["exact"])
            assert inf_k["nodes"] == inf_np["nodes"]
            assert np.all(lo_k <= exact * (1 + 1e-12)), np.c_[lo_k, exact]


@pytest.mark.parametrize("lib", ["RandomForest", "HistGradientBoosting", *EXTERNAL[:1]])
def test_kernel_with_fixed_features_and_prices(lib):
    X, y = make_data(4, 3, 2, n=12)
    model = make_model(lib, 4).fit(X, y)
    mask = np.array([True, False, True])
    for kw in ({"mask": mask}, {"weights": np.array([2.0, 1.0, 0.5])},
               {"mask": mask, "weights": np.array([0.3, 1.0, 3.0])}):
        for nodes in (3, 20000):
            (lo_np, inf_np), (lo_k, inf_k) = _both(model, X, y, nodes, **kw)
            np.testing.assert_allclose(lo_k, lo_np, rtol=1e-12, atol=0)
            np.testing.assert_array_equal(inf_k["exact"], inf_np["exact"])
            assert inf_k["nodes"] == inf_np["nodes"]
    exact = exact_distances(model, X, y, mask)
    (_, _), (lo_k, inf_k) = _both(model, X, y, 20000, mask=mask)
    assert np.all(lo_k <= exact * (1 + 1e-12))
    np.testing.assert_allclose(lo_k[inf_k["exact"] & np.isfinite(exact)],
                               exact[inf_k["exact"] & np.isfinite(exact)], rtol=1e-12)


def test_ties_are_handed_back_to_the_model(monkeypatch):
    """A forest of two trees votes half and half on whole regions: the kernel reports those
    boxes and the sample is searched by the NumPy path, which asks the model's predict."""
    X, y = make_data(3, 2, 2, n=14)
    model = make_model("RandomForest", 3).set_params(n_estimators=2).fit(X, y)
    seen = []
    real = tree_kernel.search_batch

    def spy(*a, **kw):
        out = real(*a, **kw)
        seen.append(int(np.sum(out[3] == tree_kernel.FALLBACK)))
        return out

    monkeypatch.setattr(tree_kernel, "search_batch", spy)
    exact = exact_distances(model, X, y)
    (lo_np, inf_np), (lo_k, inf_k) = _both(model, X, y, 20000)
    np.testing.assert_allclose(lo_k, lo_np, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(inf_k["exact"], inf_np["exact"])
    assert sum(seen) > 0  # the case was exercised
    assert np.all(lo_k <= exact * (1 + 1e-12))


def test_without_numba_the_numpy_path_runs(monkeypatch):
    X, y = make_data(1, 2, 2, n=12)
    model = make_model("GradientBoosting", 1).fit(X, y)
    yi = np.searchsorted(model.classes_, y)
    ref, _ = bounds.tree_lower_distances(model, X, yi, max_nodes=50, compiled=True)
    monkeypatch.setattr(tree_kernel, "numba", None)
    assert not tree_kernel.available()

    def boom(*a, **kw):  # pragma: no cover - must not be called
        raise AssertionError("kernel called without numba")

    monkeypatch.setattr(tree_kernel, "search_batch", boom)
    lo, _ = bounds.tree_lower_distances(model, X, yi, max_nodes=50)
    np.testing.assert_allclose(lo, ref, rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------------------------
# refine: chunks in parallel = the sequential run
# ----------------------------------------------------------------------------------------------


def _fake(n, seed):
    """A deterministic search: sample i's bound grows with its budget, its search completes
    after need[i] boxes."""
    rng = np.random.default_rng(seed)
    need = rng.integers(1, 300, size=n)
    scale = rng.uniform(0.1, 1.0, size=n)

    def search(i, budget, deadline, upper):
        used = min(need[i], budget + (budget > 1))
        low = upper if used >= need[i] else scale[i] * upper * (1 - 1 / (1 + used))
        return low, bool(used >= need[i]), int(used), False, upper

    def many(ids, budgets, deadline, uppers):
        return [search(int(i), int(b), deadline, float(u))
                for i, b, u in zip(ids, budgets, uppers)]

    return search, many


@pytest.mark.parametrize("node_budget", [None, 1, 50, 777, 5000, 40000])
def test_refine_in_chunks_is_the_sequential_run(node_budget, monkeypatch):
    n = 400
    search, many = _fake(n, 0)
    up = np.random.default_rng(1).uniform(0.5, 2.0, size=n)
    duals = refine_mod.ZeroOneDuals(np.zeros(n), 0.2, 1.0, 0.25, "kl")
    monkeypatch.setattr(refine_mod, "CHUNK_NODES", 64)  # many chunks
    seq = refine_mod.refine(n, search, up.copy(), duals, rtol=0.01, max_nodes=512,
                            node_budget=node_budget)
    par = refine_mod.refine(n, search, up.copy(), duals, rtol=0.01, max_nodes=512,
                            node_budget=node_budget, search_many=many)
    np.testing.assert_array_equal(par[0], seq[0])
    np.testing.assert_array_equal(par[1], seq[1])
    assert par[2] == seq[2]


def test_a_time_stopped_chunked_run_is_reproduced_by_its_node_budget(monkeypatch):
    n = 400
    search, many = _fake(n, 2)
    up = np.random.default_rng(3).uniform(0.5, 2.0, size=n)
    duals = refine_mod.ZeroOneDuals(np.zeros(n), 0.2, 1.0, 0.25, "kl")
    monkeypatch.setattr(refine_mod, "CHUNK_NODES", 64)
    clock = [0.0]

    def timed(ids, budgets, deadline, uppers):
        clock[0] += float(np.sum(budgets))  # one second a box
        return many(ids, budgets, deadline, uppers)

    monkeypatch.setattr(refine_mod.time, "perf_counter", lambda: clock[0])
    cut = refine_mod.refine(n, search, up.copy(), duals, rtol=0.0, max_nodes=512,
                            deadline=9000.0, search_many=timed)
    assert cut[2]["stopped"] == "time_budget" and cut[2]["node_budget"] > 0
    again = refine_mod.refine(n, search, up.copy(), duals, rtol=0.0, max_nodes=512,
                              node_budget=cut[2]["node_budget"], search_many=many)
    np.testing.assert_array_equal(again[0], cut[0])
    assert again[2]["stopped"] == "node_budget"
    seq = refine_mod.refine(n, search, up.copy(), duals, rtol=0.0, max_nodes=512,
                            node_budget=cut[2]["node_budget"])
    np.testing.assert_array_equal(seq[0], cut[0])
    assert math.isfinite(float(np.sum(cut[0])))


def test_compiled_time_budget_cut_is_reproduced_by_its_node_budget(monkeypatch):
    from test_bounds import test_time_budget_cut_is_reproduced_by_its_node_budget as check

    # a chunk a sample: the fake clock (a second a reading) is read between chunks
    monkeypatch.setattr(refine_mod, "CHUNK_NODES", 60)
    check(monkeypatch, compiled=True, time_budget=20)
