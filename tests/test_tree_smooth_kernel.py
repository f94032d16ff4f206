"""The compiled smooth-loss tree search (otstab/solve/_tree_smooth_kernel.py, issue 29) against
the NumPy search it reimplements (otstab/solve/_tree_smooth.py, ``SmoothSearch.run``) and the
enumeration of tests/test_tree_smooth.py:

* per sample, at equal budget, h and distance cut (far), the same finite d-transform (the
  maximum of the lines ``h A - B`` on a grid of h, to 1e-12 relative), the same box count,
  the same completion and the very same found points, for every library, binary and
  3-class, fixed features and per-feature prices, cut after 1 to 500 boxes;
* through ``certify``: the same interval and box count as the NumPy path, and the interval
  holds the enumerated R (tests/test_tree_smooth.py's ``check`` runs the compiled path too);
* a time budget cut between batches is reproduced by the node budget it reports;
* without numba the NumPy path runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_tree_smooth import BOOSTED, boosted, check
from test_trees import make_data

import otstab
from otstab.solve import _tree_kernel as tree_kernel
from otstab.solve import _tree_smooth as tree_smooth
from otstab.solve import _tree_smooth_kernel as smooth_kernel
from otstab.solve._bounds import leaf_table

pytest.importorskip("numba")


@pytest.fixture(autouse=True)
def _one_openmp_thread():
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    with threadpool_limits(limits=1, user_api="openmp"):
        yield


def test_allowances_are_the_numpy_paths():
    assert smooth_kernel.A_ROUND == tree_smooth.A_ROUND
    assert smooth_kernel.B_ROUND == tree_smooth.B_ROUND


def _compare(model, X, y, mv, w, budgets, hs, theta1=1.0, far=None):
    """``far``: the cut of the leaves (squared distance; the tail line at 10), or None."""
    d = X.shape[1]
    table = leaf_table(model, d, X)
    kt = smooth_kernel.KernelTable(table, mv, w)
    yi = np.searchsorted(model.classes_, y)
    grid = np.r_[0.0, np.geomspace(1e-3, 1e3, 40)]
    for budget in budgets:
        for h in hs:
            cut = None if far is None else np.full(len(y), far)
            tail = None if far is None else np.full(len(y), 10.0)
            runs = smooth_kernel.smooth_batch(kt, X, yi, np.arange(len(y)),
                                              np.full(len(y), budget), h, theta1,
                                              tree_smooth.MAX_LINES, tree_smooth.TOP_POINTS,
                                              cut, tail)
            for i, (Ak, Bk, pk, exk, used) in enumerate(runs):
                sm = tree_smooth.SmoothSearch(table, X[i], int(yi[i]), mv, w[mv], theta1)
                if far is None:
                    L, pts, ex = sm.run(h, budget)
                else:
                    L, pts, ex = sm.run(h, budget, far=far, tail=10.0)
                A, B = tree_smooth.merged(L[:, 0], L[:, 1])
                assert Ak.size <= tree_smooth.MAX_LINES
                f = np.max(grid[:, None] * A - B, axis=1)
                fk = np.max(grid[:, None] * Ak - Bk, axis=1)
                np.testing.assert_allclose(fk, f, rtol=1e-12, atol=1e-300)
                assert (exk, used) == (ex, sm.nodes)
                assert len(pk) == len(pts)
                for p, q in zip(pk, pts):
                    np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("lib", BOOSTED)
def test_kernel_runs_are_the_numpy_runs(lib):
    for d, k, seed, trees in ((2, 2, 1, 6), (3, 3, 2, 8)):
        X, y = make_data(seed, d, k, n=14)
        model = boosted(lib, seed, trees).fit(X, y)
        _compare(model, X, y, np.ones(d, dtype=bool), np.ones(d), (1, 9, 200), (0.3, 3.0),
                 far=None if k == 2 else 0.3)


@pytest.mark.parametrize("lib", ["GradientBoosting", "LightGBM"])
def test_kernel_runs_with_fixed_features_and_prices(lib):
    if lib not in BOOSTED:
        pytest.skip("not installed")
    X, y = make_data(3, 3, 2, n=14)  # rounded X: ties with the thresholds
    model = boosted(lib, 3, trees=10).fit(X, y)
    _compare(model, X, y, np.array([True, False, True]), np.array([0.5, 1.0, 2.0]),
             (1, 9, 200), (1.0,), theta1=2.0)
    _compare(model, X, y, np.array([True, False, True]), np.array([0.5, 1.0, 2.0]),
             (1, 9, 200), (1.0,), theta1=2.0, far=0.2)


def _both(monkeypatch, model, X, y, **kw):
    out = []
    for compiled in (False, True):
        with monkeypatch.context() as m:
            if not compiled:
                m.setattr(smooth_kernel, "available", lambda: False)
            out.append(otstab.certify(model, X, y, **kw))
    return out


@pytest.mark.parametrize("lib", ["XGBoost", "HistGradientBoosting"])
def test_certify_compiled_is_the_numpy_interval(lib, monkeypatch):
    if lib not in BOOSTED:
        pytest.skip("not installed")
    X, y = make_data(12, 3, 3, n=20)
    model = boosted(lib, 12, trees=10).fit(X, y)
    r = otstab.certify(model, X, y, loss="cross_entropy", r=0.0).risk_base + 0.2
    for kw in ({}, {"node_budget": 150}, {"max_nodes": 40, "rtol": 0.0}):
        a, b = _both(monkeypatch, model, X, y, loss="cross_entropy", r=r, theta1=1.0,
                     theta2=0.5, **kw)
        np.testing.assert_allclose([b.value_lower, b.value_upper],
                                   [a.value_lower, a.value_upper], rtol=1e-12)
        assert b.info["lower_bound"]["nodes"] == a.info["lower_bound"]["nodes"]
        assert b.status == a.status


def test_compiled_path_against_enumeration_in_batches(monkeypatch):
    """Batches of one or two samples (the node-budget cut and the batch loop) still give an
    interval holding the enumerated R."""
    monkeypatch.setattr(tree_smooth, "CHUNK_NODES", 20)
    X, y = make_data(13, 2, 2, n=20)
    model = boosted("GradientBoosting", 13, trees=8).fit(X, y)
    check(model, X, y, max_nodes=64)
    check(model, X, y, node_budget=97, divergence="chi2")


def test_a_compiled_time_budget_is_reproduced_by_its_node_budget(monkeypatch):
    """The time budget is read between batches (a fake clock: a second a reading)."""
    monkeypatch.setattr(tree_smooth, "CHUNK_NODES", 16)
    X, y = make_data(11, 2, 2, n=30)
    model = boosted("GradientBoosting", 11, trees=12).fit(X, y)
    r = otstab.certify(model, X, y, loss="logistic", r=0.0).risk_base + 0.15
    clock = [0.0]

    def tick():
        clock[0] += 1.0
        return clock[0]

    with monkeypatch.context() as m:
        m.setattr(tree_smooth.time, "perf_counter", tick)
        a = otstab.certify(model, X, y, loss="logistic", r=r, time_budget=12)
    info = a.info["lower_bound"]
    assert info["stopped"] == "time_budget" and info["node_budget"] == info["nodes"]
    b = otstab.certify(model, X, y, loss="logistic", r=r, node_budget=info["node_budget"])
    assert b.info["lower_bound"]["nodes"] == info["nodes"]
    assert (a.value_lower, a.value_upper) == (b.value_lower, b.value_upper)


def test_without_numba_the_numpy_path_runs(monkeypatch):
    X, y = make_data(1, 2, 2, n=14)
    model = boosted("GradientBoosting", 1).fit(X, y)
    r = otstab.certify(model, X, y, loss="logistic", r=0.0).risk_base + 0.1
    ref = otstab.certify(model, X, y, loss="logistic", r=r)
    monkeypatch.setattr(tree_kernel, "numba", None)
    assert not smooth_kernel.available()

    def boom(*a, **kw):  # pragma: no cover - must not be called
        raise AssertionError("kernel called without numba")

    monkeypatch.setattr(smooth_kernel, "smooth_batch", boom)
    res = otstab.certify(model, X, y, loss="logistic", r=r)
    np.testing.assert_allclose([res.value_lower, res.value_upper],
                               [ref.value_lower, ref.value_upper], rtol=1e-12)


@pytest.mark.parametrize("lib", ["XGBoost", "HistGradientBoosting"])
def test_cut_lines_over_estimate_the_enumerated_transform_at_every_h(lib):
    """With far leaves cut (and the tail line), a sample's lines still bound its enumerated
    d-transform ``max_cell h l(cell) - theta1 dist(cell)`` from above at every h, far from
    the search's h too (where only the tail covers the far inputs)."""
    if lib not in BOOSTED:
        pytest.skip("not installed")
    from test_tree_smooth import exact_lines  # noqa: PLC0415

    X, y = make_data(14, 2, 3, n=12)
    model = boosted(lib, 14, trees=8).fit(X, y)
    exact = exact_lines(model, X, y)
    table = leaf_table(model, 2, X)
    kt = smooth_kernel.KernelTable(table, np.ones(2, dtype=bool), np.ones(2))
    yi = np.searchsorted(model.classes_, y)
    theta1, grid = 1.5, np.r_[0.0, np.geomspace(1e-3, 1e3, 61)]
    root = smooth_kernel.smooth_batch(kt, X, yi, np.arange(len(y)), np.ones(len(y)), 1.0,
                                      theta1, tree_smooth.MAX_LINES, tree_smooth.TOP_POINTS)
    lmax = np.array([A.max() for A, *_ in root])
    for h, budget in ((0.05, 30), (0.5, 300)):
        far = tree_smooth._far(h, lmax, theta1)
        assert np.all(np.isfinite(far))
        runs = smooth_kernel.smooth_batch(kt, X, yi, np.arange(len(y)), np.full(len(y), budget),
                                          h, theta1, tree_smooth.MAX_LINES,
                                          tree_smooth.TOP_POINTS, far, lmax)
        for i, (A, B, *_rest) in enumerate(runs):
            la, dd = exact[i]
            ref = np.max(grid[:, None] * la - theta1 * dd, axis=1)
            got = np.max(grid[:, None] * A - B, axis=1)
            assert np.all(got >= ref - 1e-12 * np.abs(ref)), (i, h, np.min(got - ref))
