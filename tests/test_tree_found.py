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


def _found_inputs(model, X, y):
    """What tree_search hands to found_distances: (table, predict, yi, mv, thresholds)."""
    from otstab.modeling import _perturbation as perturbation
    d = X.shape[1]
    classes = np.asarray(model.classes_)
    yi = np.searchsorted(classes, y)
    table = bounds.leaf_table(model, d, X)
    thresholds = perturbation._ensemble_thresholds(model, d)

    def predict(Z):
        return np.searchsorted(classes, np.ravel(model.predict(Z)))

    return table, predict, yi, np.ones(d, dtype=bool), thresholds


def _check_found(model, X, y, best, P, exact):
    ok = np.isfinite(best) & (best > 0)
    assert np.all(best >= exact * (1 - 1e-12))
    assert np.all(np.ravel(model.predict(P[ok])) != y[ok])
    np.testing.assert_allclose(best[ok], np.sum((P[ok] - X[ok]) ** 2, axis=1), rtol=1e-12)


@pytest.mark.parametrize("lib,walk", [(lib, walk) for lib in ENSEMBLES for walk in (
    False, True) if lib in ("GradientBoosting", "XGBoost", "LightGBM") and (
    lib != "GradientBoosting" or not walk)])
def test_budgeted_found_side_equals_the_full_one_on_the_samples_it_refines(lib, walk, capsys):
    from otstab.solve._refine import ZeroOneDuals
    if walk:
        pytest.importorskip("numba")
    model, X, y = _fit(lib, 4, 3, 2, n=40)
    table, predict, yi, mv, thr = _found_inputs(model, X, y)
    loss0 = (predict(X) != yi).astype(float)
    duals = ZeroOneDuals(loss0, loss0.mean() + 0.2, 1.0, 0.25, "kl")
    # the reference: every sample through every stage, with the same scorer (the walk, as
    # XGBoost and LightGBM get it, or the model's predict); margins of 1 h (refinement) and
    # 2 h (first shrink sweep) so that the budget selects
    full = tree_found.found_distances(table, predict, X, yi, mv, thr, walk=walk)
    part = tree_found.found_distances(table, predict, X, yi, mv, thr, walk=walk, duals=duals,
                                      margin=1.0, shrink_margin=2.0, progress=True)
    # progress=True: the four stages on stderr, and the same answer as without it
    assert "found side (40 rows)" in capsys.readouterr().err
    again = tree_found.found_distances(table, predict, X, yi, mv, thr, walk=walk,
                                       duals=duals, margin=1.0, shrink_margin=2.0)
    assert capsys.readouterr().err == ""
    np.testing.assert_array_equal(again[0], part[0])
    refined = part[5]
    correct = loss0 == 0
    assert full[5][correct].all()  # without duals: every correct sample
    assert refined.any() and (correct & ~refined).any()  # a real selection
    np.testing.assert_array_equal(part[0][refined], full[0][refined])
    np.testing.assert_array_equal(part[1][refined], full[1][refined])
    assert np.all(part[0] >= full[0])  # the others keep their first-pass points
    _, h = duals(part[0])
    assert np.all(part[0][correct & ~refined] >= h)  # none left out could enter the dual
    exact = exact_distances(model, X, y)
    for best, P in ((full[0], full[1]), (part[0], part[1])):
        _check_found(model, X, y, best, P, exact)


@pytest.mark.parametrize("lib", [lib for lib in ENSEMBLES if lib in ("XGBoost", "LightGBM")])
def test_found_side_without_numba_uses_the_models_predict(lib, monkeypatch):
    model, X, y = _fit(lib, 5, 3, 2, n=24)
    table, predict, yi, mv, thr = _found_inputs(model, X, y)
    monkeypatch.setattr(tree_found, "numba", None)
    monkeypatch.setattr(tree_found, "_KERNEL", None)
    assert tree_found.TreeEvaluator.build(table, X) is None
    best, P, rows, walked, rest, _ = tree_found.found_distances(table, predict, X, yi, mv, thr)
    assert walked == 0 and rows > X.shape[0]  # every probe by the model's own predict
    _check_found(model, X, y, best, P, exact_distances(model, X, y))


@pytest.mark.parametrize("lib", [lib for lib in ENSEMBLES if lib in ("GradientBoosting",
                                                                       "XGBoost")])
def test_line_probes_do_not_depend_on_the_block_sizes(lib):
    from otstab.modeling import _perturbation as perturbation
    model, X, y = _fit(lib, 6, 3, 2, n=30)
    _, predict, yi, _, thr = _found_inputs(model, X, y)
    rng = np.random.default_rng(1)
    B = X + rng.normal(size=X.shape)
    f32 = perturbation._compares_float32(model)
    for j in range(3):
        sign = rng.choice([-1.0, 1.0], size=X.shape[0])
        limit = rng.uniform(0.1, 3.0, size=X.shape[0])
        runs = [perturbation._line_first_wrong(predict, B, yi, j, thr[j], X[:, j], sign, limit,
                                               block=bl, first_block=fb, f32=f32)
                for fb, bl in ((1, 1), (4, 32), (32, 32))]
        assert np.isfinite(runs[0]).any()
        for v in runs[1:]:
            np.testing.assert_array_equal(v, runs[0])


@pytest.mark.parametrize("lib", ENSEMBLES)
@pytest.mark.parametrize("compiled", [False, True])
def test_points_the_search_ends_on_are_misclassified_at_the_exact_distance(lib, compiled):
    # issue 29: a completed branch and bound ends on a box with one leaf per tree whose
    # intersection the model misclassifies; its input nearest x_i is a real point at d*_i
    if compiled:
        pytest.importorskip("numba")
    seen = 0
    for seed in (0, 1):
        model, X, y = _fit(lib, seed, 2, 2)
        exact = exact_distances(model, X, y)
        yi = np.searchsorted(model.classes_, y)
        dlow, info = bounds.tree_lower_distances(model, X, yi, upper=np.full(len(y), np.inf),
                                                 max_nodes=10 ** 5, compiled=compiled)
        P = info.get("region_points")
        has = np.zeros(len(y), dtype=bool) if P is None else np.isfinite(P).all(axis=1)
        assert np.all(info["exact"][has])
        # every sample with a finite exact distance got its point (the search completed)
        np.testing.assert_array_equal(has, np.isfinite(exact))
        d = np.sum((P[has] - X[has]) ** 2, axis=1)
        np.testing.assert_allclose(d, exact[has], rtol=1e-7, atol=0)
        np.testing.assert_allclose(dlow[has], exact[has], rtol=1e-7, atol=0)
        assert np.all(np.ravel(model.predict(P[has])) != y[has])
        seen += int(np.sum(exact[has] > 0))
    assert seen > 0


def _loose_case():
    """An XGBoost model whose fast found side is loose (6 features, 60 trees of depth 4)."""
    xgb = pytest.importorskip("xgboost")
    from test_bounds import _data
    X, y = _data(n=80, d=6, seed=0)
    model = xgb.XGBClassifier(n_estimators=60, max_depth=4, random_state=0, n_jobs=1)
    model.fit(X, y)
    base = float(np.mean(model.predict(X) != y))
    return model, X, y, dict(r=base + 0.15, loss="zero_one", theta1=1.0, theta2=0.5)


def test_certify_adopts_the_points_the_searches_end_on(monkeypatch):
    import otstab
    from otstab.solve import _core as core
    from otstab.solve import _zero_one as zero_one
    monkeypatch.setattr(tree_found, "FAST_ABOVE", 0)  # the fast found side at this size
    model, X, y, kw = _loose_case()
    res = otstab.certify(model, X, y, **kw)
    real = zero_one.certify_zero_one_search
    monkeypatch.setattr(core, "certify_zero_one_search",
                        lambda *a, **k: real(*a, adopt_points=False, **k))
    before = otstab.certify(model, X, y, **kw)
    monkeypatch.undo()
    assert before.value_lower == res.value_lower  # the certified side is the same
    # the found side alone was loose; with the searches' points the interval closes
    assert res.value_upper < 0.9 * before.value_upper
    assert res.value_lower <= res.value_upper <= res.value_lower * (1 + 1e-6)
    Q = res.to_frame()
    moved = Q["distance2"].to_numpy() > 0
    assert moved.any()  # the atoms Q* moves are misclassified, at their distances
    star = Q.loc[moved, [f"x{j}*" for j in range(X.shape[1])]].to_numpy()
    src = Q.loc[moved, "source"].to_numpy()
    assert np.all(model.predict(star) != y[src])
    np.testing.assert_allclose(np.sum((star - X[src]) ** 2, axis=1),
                               Q.loc[moved, "distance2"].to_numpy(), rtol=1e-9)


def test_verify_of_a_time_stopped_certificate_with_adopted_points(monkeypatch):
    # the points the searches end on depend on where the time budget stopped them (here
    # value_upper differs from the unlimited run's: fewer searches completed): the
    # certificate records the node_budget that reproduces the cut, and verify recomputes there
    import itertools

    import otstab
    from otstab.certificates import make_certificate, verify_certificate
    from otstab.solve import _bounds as bounds_mod
    monkeypatch.setattr(tree_found, "FAST_ABOVE", 0)
    model, X, y, kw = _loose_case()
    full = otstab.certify(model, X, y, **kw)
    clock = bounds_mod.time.perf_counter
    for budget in range(4, 40, 2):  # a clock that advances a second a reading
        ticks = itertools.count()
        monkeypatch.setattr(bounds_mod.time, "perf_counter", lambda t=ticks: float(next(t)))
        cut = otstab.certify(model, X, y, **kw, time_budget=float(budget))
        monkeypatch.setattr(bounds_mod.time, "perf_counter", clock)
        if cut.info["lower_bound"]["stopped"] == "time_budget" and \
                cut.value_upper != full.value_upper:
            break
    else:  # pragma: no cover - the case is meant to have such a cut
        raise AssertionError("no time budget cut the search where it changes value_upper")
    lb = cut.info["lower_bound"]
    assert cut.value_lower < full.value_lower  # a real cut
    assert full.value_lower <= full.value_upper < cut.value_upper
    cert = make_certificate(cut, model, X, y, solver_options={"time_budget": float(budget)})
    assert cert["inputs"]["solver_options"] == {"time_budget": float(budget),
                                                "node_budget": lb["node_budget"]}
    rep = verify_certificate(cert, model, X, y)
    assert rep.ok, rep
    # without the recorded node budget the recomputation runs further: another value
    cert["inputs"]["solver_options"] = {"time_budget": float(budget)}
    assert not verify_certificate(cert, model, X, y).ok


def test_neighbours_read_a_capped_reference_set():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    pred0 = (X[:, 0] > 0).astype(np.intp)
    yi = pred0.copy()
    idx = np.arange(60)
    mv = np.ones(3, dtype=bool)
    ref = tree_found._reference_rows(pred0, 5)
    assert ref.size == 10 and all(np.sum(pred0[ref] == c) == 5 for c in (0, 1))
    nbr = tree_found._neighbours(X, yi, pred0, idx, mv, 3, cap=5)
    assert np.all(np.isin(nbr, ref))
    for i in idx:  # the nearest reference rows of the other class, in order
        other = ref[pred0[ref] != yi[i]]
        d2 = np.sum((X[other] - X[i]) ** 2, axis=1)
        np.testing.assert_array_equal(nbr[i], other[np.argsort(d2, kind="stable")[:3]])
    full = tree_found._neighbours(X, yi, pred0, idx, mv, 3)  # below the cap: every row
    for i in idx:
        other = np.flatnonzero(pred0 != yi[i])
        d2 = np.sum((X[other] - X[i]) ** 2, axis=1)
        np.testing.assert_array_equal(full[i], other[np.argsort(d2, kind="stable")[:3]])
