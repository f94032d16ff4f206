"""Logistic / cross-entropy certificates of boosted tree ensembles against enumeration (issue 29).

A boosted ensemble's margins are constant on every cell of the grid of its split thresholds,
so the exact d-transform of a smooth loss of the margins is a finite maximum over the cells:
``l_h(x_i) = max_cell h l(cell) - theta1 dist(x_i, cell)^2`` with the distance to the closure of
the float64 inputs of the cell (the grid and its closures from tests/test_trees.py, written from
the models' node arrays and dumps, independently of otstab) and the loss from the library's
own raw margins at an input of the cell. R is then the exact dual of that finite transform;
``value_lower <= R <= value_upper`` must hold for every model, price and threshold.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from otstab_solvers.dual import dual_objective, solve_dual
from test_trees import EXTERNAL, _axis_cells, make_data, sk_thresholds

import otstab
from otstab.errors import IncompatibleLossError, InputTypeError
from otstab.solve._datacost_cross_entropy import FiniteOracle
from otstab.solve._tree_smooth import envelope, merged

E = pytest.importorskip("sklearn.ensemble")

BOOSTED = ("GradientBoosting", "HistGradientBoosting") + EXTERNAL


@pytest.fixture(autouse=True)
def _one_openmp_thread():
    """Histogram gradient boosting predicts with OpenMP threads, whose start-up dominates
    these small calls on a busy machine: one thread keeps the tests fast."""
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    with threadpool_limits(limits=1, user_api="openmp"):
        yield


def boosted(lib, seed, trees=6):
    if lib == "GradientBoosting":
        return E.GradientBoostingClassifier(n_estimators=trees, max_depth=2, random_state=seed)
    if lib == "HistGradientBoosting":
        return E.HistGradientBoostingClassifier(max_iter=trees, max_depth=3, min_samples_leaf=3,
                                                random_state=seed)
    if lib == "XGBoost":
        import xgboost  # noqa: PLC0415

        return xgboost.XGBClassifier(n_estimators=trees, max_depth=3, n_jobs=1,
                                     random_state=seed, learning_rate=0.5)
    if lib == "LightGBM":
        import lightgbm  # noqa: PLC0415

        return lightgbm.LGBMClassifier(n_estimators=trees, max_depth=3, num_leaves=8,
                                       min_child_samples=2, min_data_in_bin=1, n_jobs=1,
                                       verbose=-1, random_state=seed, learning_rate=0.5)
    import catboost  # noqa: PLC0415

    return catboost.CatBoostClassifier(iterations=trees, depth=3, thread_count=1, verbose=0,
                                       allow_writing_files=False, random_seed=seed,
                                       learning_rate=0.5)


def library_margins(model, Z):
    """The library's own raw margins (n, K) (binary: columns 0 and the log-odds)."""
    name = type(model).__name__
    if name.startswith("XGB"):
        out = model.predict(Z, output_margin=True)
    elif name.startswith("LGBM"):
        out = model.predict(Z, raw_score=True)
    elif name.startswith("CatBoost"):
        out = model.predict(Z, prediction_type="RawFormulaVal")
    else:
        out = model.decision_function(Z)
    out = np.asarray(out, dtype=np.float64)
    return np.column_stack([np.zeros(out.size), out]) if out.ndim == 1 else out


def exact_lines(model, X, y, mask=None, prices=None):
    """Per sample: (loss of every reachable cell, priced squared distance to it), enumerated
    (``prices``: per-feature prices of the squared moves, default 1)."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    prices = np.ones(d) if prices is None else np.asarray(prices, dtype=np.float64)
    thresholds, kind = sk_thresholds(model, d)
    axes = [[c for c in _axis_cells(T, kind) if c is not None] for T in thresholds]
    # an input of each cell: its first comparison value (or last, or 0)
    reps = [np.array([c[2] if np.isfinite(c[2]) else (c[3] if np.isfinite(c[3]) else 0.0)
                      for c in ax]) for ax in axes]
    lo = [np.array([c[0] for c in ax]) for ax in axes]
    hi = [np.array([c[1] for c in ax]) for ax in axes]
    grid = np.array(list(itertools.product(*[range(len(ax)) for ax in axes])))
    P = np.column_stack([reps[j][grid[:, j]] for j in range(d)])
    S = library_margins(model, P)
    yi = np.searchsorted(model.classes_, y)
    out = []
    for i in range(n):
        loss = np.logaddexp.reduce(S - S[:, [yi[i]]], axis=1)  # -log softmax_y
        dist = np.zeros(len(grid))
        ok = np.ones(len(grid), dtype=bool)
        for j in range(d):
            cl, ch = lo[j][grid[:, j]], hi[j][grid[:, j]]
            if mv[j]:
                gap = np.maximum(np.maximum(cl - X[i, j], X[i, j] - ch), 0.0)
                dist += prices[j] * gap * gap
            else:
                c = float(np.float32(X[i, j])) if kind == "f32" else X[i, j]
                first = np.array([a[2] for a in axes[j]])[grid[:, j]]
                last = np.array([a[3] for a in axes[j]])[grid[:, j]]
                ok &= (first <= c) & (c <= last)
        out.append((loss[ok], dist[ok]))
    return out


def exact_R(lines, r, theta1, theta2, divergence, p=None):
    """R of the enumerated finite d-transform: the exact dual, and the best of a grid of h
    (each a lower bound by weak duality) as a check on the solver."""
    width = max(a.size for a, _ in lines)
    A = np.zeros((len(lines), width))
    B = np.full((len(lines), width), np.inf)
    for i, (a, dd) in enumerate(lines):
        A[i, :a.size] = a
        B[i, :a.size] = np.where(dd > 0, theta1 * np.where(dd > 0, dd, 1.0), 0.0)
    fo = FiniteOracle(A, B)
    sol = solve_dual(fo, r, theta2, divergence, p=p)
    assert sol.status == "optimal" and math.isfinite(sol.value)
    for h in sol.h * np.array([0.5, 0.9, 0.99, 1.01, 1.1, 2.0]):
        assert dual_objective(fo.evaluate(h)[0], h, r, theta2, divergence, p) <= \
            sol.value * (1 + 1e-9) + 1e-15
    return float(sol.value)


def check(model, X, y, *, r_above=0.15, theta1=1.0, theta2=1.0, divergence="kl", mask=None,
          loss="logistic", prices=None, sample_weight=None, **options):
    S0 = library_margins(model, X)
    yi0 = np.searchsorted(model.classes_, y)
    loss0 = np.logaddexp.reduce(S0 - S0[np.arange(len(y)), yi0][:, None], axis=1)
    p = None if sample_weight is None else sample_weight / sample_weight.sum()
    r = float(np.mean(loss0) if p is None else p @ loss0) + r_above
    lines = exact_lines(model, X, y, mask, prices)
    if prices is not None:
        options["feature_costs"] = list(prices)
    if sample_weight is not None:
        options["sample_weight"] = sample_weight
    res = otstab.certify(model, X, y, loss=loss, r=r, theta1=theta1, theta2=theta2,
                         divergence=divergence, features=None if mask is None else
                         list(np.flatnonzero(mask)), **options)
    if res.status == "unreachable":
        top = max(a.max() for a, _ in lines) if math.isfinite(theta2) else \
            np.mean([a.max() for a, _ in lines])
        assert r > top
        return res, math.inf
    R = exact_R(lines, r, theta1, theta2, divergence, p)
    assert res.status in ("optimal", "bounds")
    # certified ends; an optimal answer is R within the audit's tolerance (AUDIT_RTOL)
    slack = 2e-6 if res.status == "optimal" else 1e-9
    assert res.value_lower <= R * (1 + slack) + 1e-15, (res.value_lower, R)
    assert R <= res.value_upper * (1 + 1e-9) + 1e-15, (R, res.value_upper)
    # Q*: real points re-scored by the library itself reach r at cost value_upper
    S = library_margins(model, res.X_star)
    yi = np.searchsorted(model.classes_, y)[res.source]
    lossq = np.logaddexp.reduce(S - S[np.arange(len(yi)), yi][:, None], axis=1)
    mass = res.mass / len(y) if p is None else res.mass * p[res.source]
    assert float(np.sum(mass * res.weights * lossq)) >= r * (1 - 1e-6)
    c = np.ones(X.shape[1]) if prices is None else np.asarray(prices)
    move = np.sum(c * (res.X_star - np.asarray(X, dtype=np.float64)[res.source]) ** 2, axis=1)
    if math.isinf(theta1):
        assert np.all(move == 0)
        cost = 0.0
    else:
        cost = theta1 * float(np.sum(mass * res.weights * move))
    if divergence == "kl" and math.isfinite(theta2):
        w = res.weights
        cost += theta2 * float(np.sum(mass * np.where(w > 0, w * np.log(np.where(w > 0, w, 1)),
                                                      0.0)))
    if divergence == "kl":
        np.testing.assert_allclose(cost, res.value_upper, rtol=1e-6)
    return res, R


@pytest.mark.parametrize("lib", BOOSTED)
def test_binary_logistic_against_enumeration(lib):
    X, y = make_data(1, 2, 2)
    model = boosted(lib, 1).fit(X, y)
    res, R = check(model, X, y)
    assert math.isfinite(R)


@pytest.mark.parametrize("lib", BOOSTED)
def test_three_class_cross_entropy_against_enumeration(lib):
    X, y = make_data(2, 2, 3, n=24)
    model = boosted(lib, 2).fit(X, y)
    check(model, X, y, loss="cross_entropy", r_above=0.2)


@pytest.mark.parametrize("lib", ["HistGradientBoosting", "XGBoost"])
def test_three_features_one_fixed_chi2(lib):
    if lib not in BOOSTED:
        pytest.skip("not installed")
    X, y = make_data(4, 3, 2, n=16)
    model = boosted(lib, 4).fit(X, y)
    check(model, X, y, mask=np.array([True, False, True]), divergence="chi2", theta2=0.5)


def test_only_moving_and_exact_when_searched_to_the_end():
    X, y = make_data(3, 2, 2)  # rounded X: ties with thresholds
    model = boosted("GradientBoosting", 3, trees=4).fit(X, y)
    res, R = check(model, X, y, theta2=math.inf, max_nodes=4096, rtol=0.0)
    assert res.status == "optimal"
    np.testing.assert_allclose(res.value, R, rtol=1e-6)


@pytest.mark.parametrize("lib", ["GradientBoosting", "XGBoost"])
def test_feature_prices_and_sample_weights_against_enumeration(lib):
    if lib not in BOOSTED:
        pytest.skip("not installed")
    X, y = make_data(7, 2, 2)
    model = boosted(lib, 7).fit(X, y)
    check(model, X, y, prices=[4.0, 0.5])
    sw = np.random.default_rng(7).uniform(0.5, 2.0, len(y))
    check(model, X, y, sample_weight=sw, theta2=math.inf)


def test_only_reweighting_is_exact_and_r_beyond_reach_is_unreachable():
    X, y = make_data(8, 2, 2)
    model = boosted("XGBoost" if "XGBoost" in BOOSTED else "GradientBoosting", 8).fit(X, y)
    res, R = check(model, X, y, theta1=math.inf, r_above=0.05)
    assert res.status == "optimal"
    np.testing.assert_allclose(res.value, R, rtol=1e-6)
    res = otstab.certify(model, X, y, loss="logistic", r=50.0)
    assert res.status == "unreachable" and "exceeds the largest loss" in res.message


def test_node_budget_is_deterministic_and_still_sound():
    X, y = make_data(9, 2, 2)
    model = boosted("GradientBoosting", 9, trees=8).fit(X, y)
    a, R = check(model, X, y, node_budget=40)
    b = otstab.certify(model, X, y, loss="logistic", r=a.r, theta2=1.0, node_budget=40)
    assert (a.value_lower, a.value_upper) == (b.value_lower, b.value_upper)
    assert a.info["lower_bound"]["stopped"] == "node_budget"


def test_forests_are_refused_and_exponential_loss_too():
    X, y = make_data(5, 2, 2)
    rf = E.RandomForestClassifier(n_estimators=3, max_depth=2, random_state=0).fit(X, y)
    with pytest.raises(IncompatibleLossError, match="averages leaf probabilities"):
        otstab.certify(rf, X, y, loss="logistic", r=1.0)
    gb = E.GradientBoostingClassifier(loss="exponential", n_estimators=3).fit(X, y)
    with pytest.raises(InputTypeError, match="not the softmax"):
        otstab.certify(gb, X, y, loss="logistic", r=1.0)


def test_envelope_keeps_the_maximum_for_every_h():
    rng = np.random.default_rng(0)
    for _ in range(50):
        A = rng.exponential(size=30).round(1)
        B = rng.exponential(size=30).round(1)
        keep = envelope(A, B)
        A2, B2 = merged(A, B, limit=3)
        for h in np.r_[0.0, np.geomspace(1e-3, 1e3, 60)]:
            full = np.max(h * A - B)
            assert np.max(h * A[keep] - B[keep]) == pytest.approx(full, abs=1e-12)
            assert np.max(h * A2 - B2) >= full - 1e-12


def test_shells_against_a_plain_loop_over_distances():
    """Each shell's line against the bound written out: for every distance d at which every
    tree has a leaf within d, base + the sum over trees of the smallest margin among its leaves
    within d (3 classes, all leaves of the root box)."""
    from otstab.solve._bounds import leaf_table  # noqa: PLC0415
    from otstab.solve._tree_smooth import SmoothSearch, _ce_bound  # noqa: PLC0415

    X, y = make_data(1, 2, 3, n=30)
    model = boosted("GradientBoosting", 1, trees=5).fit(X, y)
    table = leaf_table(model, 2, X)
    for i in range(0, 30, 7):
        sm = SmoothSearch(table, X[i], int(y[i]), np.ones(2, bool), np.ones(2), 1.0)
        gap = np.maximum(np.maximum(sm.a - sm.x, sm.x - sm.b), 0.0)
        dist = (gap * gap).sum(axis=1)
        starts = np.flatnonzero(np.r_[True, sm.tree[1:] != sm.tree[:-1]])
        A, B = sm._shells(dist, sm.marg, starts)
        ref = []
        for d in np.unique(dist):
            inside = dist <= d
            if len(np.unique(sm.tree[inside])) < sm.n_trees:
                continue
            tot = sm.base + sum(sm.marg[inside & (sm.tree == t)].min(axis=0)
                                for t in np.unique(sm.tree))
            ref.append((float(_ce_bound(tot - sm.tol)), d))
        ref = np.array(ref)
        assert len(A) == len(ref)
        assert np.all(A >= ref[:, 0]) and np.all(B <= ref[:, 1])
        np.testing.assert_allclose(A, ref[:, 0], rtol=1e-12)
        np.testing.assert_allclose(B, ref[:, 1], rtol=1e-11)


def test_feature_stability_of_a_boosted_model():
    """feature_stability takes the logistic loss of boosted trees (one certificate per
    feature, the tree path); a feature no tree splits on (constant in training) is ignored."""
    X, y = make_data(10, 2, 2, n=30)
    X = np.column_stack([X, np.zeros(len(y))])
    model = boosted("GradientBoosting", 10).fit(X, y)
    r = otstab.certify(model, X, y, loss="logistic", r=0.0).risk_base + 0.1
    fs = otstab.feature_stability(model, X, y, loss="logistic", r=r).to_frame()
    used = {int(f) for est in np.ravel(model.estimators_) for f in est.tree_.feature if f >= 0}
    ignored = dict(zip(fs["feature"], fs["ignored"]))
    assert 2 not in used and 0 in used
    assert all(bool(ignored[f"x{j}"]) == (j not in used) for j in range(3))
    one = otstab.certify(model, X, y, loss="logistic", r=r, features=[0])
    score = dict(zip(fs["feature"], fs["score"]))["x0"]
    assert one.value_lower <= score * (1 + 1e-9) and score <= one.value_upper * (1 + 1e-9)


def test_a_time_budget_is_reproduced_by_the_node_budget_it_reports():
    X, y = make_data(11, 2, 2, n=30)
    model = boosted("GradientBoosting", 11, trees=12).fit(X, y)
    r = otstab.certify(model, X, y, loss="logistic", r=0.0).risk_base + 0.15
    for budget in (0.0, 0.05):
        a = otstab.certify(model, X, y, loss="logistic", r=r, time_budget=budget)
        info = a.info["lower_bound"]
        if info["stopped"] is None:
            continue
        assert info["stopped"] == "time_budget" and info["node_budget"] == info["nodes"]
        b = otstab.certify(model, X, y, loss="logistic", r=r, node_budget=info["node_budget"])
        assert b.info["lower_bound"]["nodes"] == info["nodes"]
        assert (a.value_lower, a.value_upper) == (b.value_lower, b.value_upper)
        assert "node_budget=" in a.message


@pytest.mark.slow
def test_campaign_against_enumeration():
    """Seeds x libraries x prices x thresholds, binary and 3-class: the interval always holds
    the enumerated R (rounded data every third seed: ties with the thresholds)."""
    cases = 0
    for seed in range(12):
        lib = BOOSTED[seed % len(BOOSTED)]
        k = 2 if seed % 2 == 0 else 3
        X, y = make_data(100 + seed, 2, k, n=20)
        if len(np.unique(y)) < k:
            continue
        model = boosted(lib, seed, trees=4 + seed % 5).fit(X, y)
        loss = "logistic" if k == 2 else "cross_entropy"
        for theta1, theta2, div, r_above in ((1.0, 0.25, "kl", 0.05), (3.0, 1.0, "chi2", 0.3),
                                             (0.5, math.inf, "kl", 0.1)):
            check(model, X, y, loss=loss, theta1=theta1, theta2=theta2, divergence=div,
                  r_above=r_above, max_nodes=64)
            cases += 1
    assert cases >= 24
