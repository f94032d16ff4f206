"""Certified lower bounds (otstab.bounds): checked against brute forces and exact paths.

* tree ensembles on 2-D data: d*_i by enumerating every cell of the threshold grid (the
  prediction is constant on each cell), so ``dlow <= d*`` and, where the branch and bound ran
  to completion, ``dlow == d*``; at the level of R: ``value_lower <= R <= value_upper`` with R
  from the exact 0/1 dual on the brute-force distances;
* MLPs with identity activations are linear classifiers in disguise: d*_i = m_i^2 / ||w||^2 in
  closed form, and the certified bound must be exact;
* nonlinear MLPs: the bound is checked by sampling (no point inside the certified radius
  changes the prediction) and against the distances the perturbation search found.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

import otstab
from otstab import bounds
from otstab.modeling._nonlinear import MLPModel
from otstab.modeling._perturbation import perturbation_search

sk_ens = pytest.importorskip("sklearn.ensemble")
sk_nn = pytest.importorskip("sklearn.neural_network")
from sklearn.exceptions import ConvergenceWarning  # noqa: E402


def _data(n=120, d=2, k=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).round(2)  # a coarse grid: thresholds sit between the values
    s = X @ rng.normal(size=(d, k)) + 0.5 * np.sin(3 * X[:, :1])
    y = np.argmax(s + 0.3 * rng.normal(size=s.shape), axis=1) if k > 2 else (
        s[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, y


def _ensembles(k):
    return [
        sk_ens.GradientBoostingClassifier(n_estimators=15, max_depth=2, random_state=0),
        sk_ens.RandomForestClassifier(n_estimators=8, max_depth=3, random_state=0),
        sk_ens.ExtraTreesClassifier(n_estimators=6, max_depth=3, random_state=0),
        sk_ens.HistGradientBoostingClassifier(max_iter=10, max_depth=3, random_state=0),
    ]


def brute_distances(table, model, X, y, movable):
    """Exact d* on the grid of every split threshold: each cell (product of threshold
    intervals) is predicted at an interior point by the model itself; its distance from x_i
    is taken to the closed cell (fixed features: the cell must hold x_i)."""
    d = X.shape[1]
    T = [np.unique(np.r_[table.lo[:, j], table.hi[:, j]]) for j in range(d)]
    T = [t[np.isfinite(t)] for t in T]
    lo_c = [np.r_[-np.inf, t] for t in T]
    hi_c = [np.r_[t, np.inf] for t in T]
    mid = [np.r_[t[0] - 1.0, 0.5 * (t[:-1] + t[1:]), t[-1] + 1.0] if t.size else np.zeros(1)
           for t in T]
    cells = np.array(list(itertools.product(*[range(m.size) for m in mid])))
    P = np.column_stack([mid[j][cells[:, j]] for j in range(d)])
    lo = np.column_stack([lo_c[j][cells[:, j]] for j in range(d)])
    hi = np.column_stack([hi_c[j][cells[:, j]] for j in range(d)])
    pred = model.predict(P)
    out = np.full(X.shape[0], np.inf)
    for i, x in enumerate(X):
        gap = np.maximum(np.maximum(lo - x, x - hi), 0.0)
        fixed_ok = np.all((gap == 0) | movable[None, :], axis=1)
        wrong = (pred != y[i]) & fixed_ok
        if model.predict(x[None])[0] != y[i]:
            out[i] = 0.0
        elif wrong.any():
            out[i] = float(np.min(np.sum(gap[wrong] ** 2, axis=1)))
    return out


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("which", range(4))
@pytest.mark.parametrize("movable", [(True, True), (True, False)])
def test_tree_ensembles_match_the_cell_brute_force(k, which, movable):
    X, y = _data(k=k, seed=which)
    model = _ensembles(k)[which].fit(X, y)
    mv = np.array(movable)
    table = bounds.leaf_table(model, 2, X)
    exact = brute_distances(table, model, X, y, mv)
    dlow, info = bounds.tree_lower_distances(model, X, y, mask=mv, max_nodes=5000)
    # sound everywhere; float32 rounding of the thresholds costs at most ~1e-7 in distance
    assert np.all(np.sqrt(dlow) <= np.sqrt(exact) + 1e-6)
    # run to completion, the search is exact
    assert info["exact"].all()
    fin = np.isfinite(exact)
    np.testing.assert_allclose(np.sqrt(dlow[fin]), np.sqrt(exact[fin]), rtol=0, atol=1e-6)
    assert np.all(np.isinf(dlow[~fin]))


def test_leaf_table_reproduces_the_model():
    X, y = _data(k=3, d=3)
    for model in _ensembles(3):
        model.fit(X, y)
        table = bounds.leaf_table(model, 3, X)
        np.testing.assert_array_equal(np.argmax(table.scores(X), axis=1),
                                      np.searchsorted(model.classes_, model.predict(X)))


def test_budget_gives_smaller_but_sound_bounds():
    X, y = _data(n=80, d=4, seed=3)
    model = sk_ens.GradientBoostingClassifier(n_estimators=40, max_depth=3,
                                              random_state=0).fit(X, y)
    up = perturbation_search(model, X, y).distances
    prev = np.zeros(len(y))
    for nodes in (1, 5, 50, 2000):
        dlow, _ = bounds.tree_lower_distances(model, X, y, upper=up, max_nodes=nodes)
        assert np.all(dlow >= prev - 1e-15)  # best first: more boxes never lower the bound
        assert np.all(dlow <= up)
        prev = dlow
    dlow0, info = bounds.tree_lower_distances(model, X, y, upper=up, time_budget=0.0)
    assert np.all(dlow0 <= prev + 1e-15)


@pytest.mark.parametrize("which", range(4))
def test_certify_interval_holds_the_exact_value(which):
    X, y = _data(k=2, seed=10 + which)
    model = _ensembles(2)[which].fit(X, y)
    exact_d = brute_distances(bounds.leaf_table(model, 2, X), model, X, y,
                              np.array([True, True]))
    for theta2, r in ((0.5, 0.3), (math.inf, 0.25)):
        res = otstab.certify(model, X, y, r=r, loss="zero_one", theta1=1.0, theta2=theta2)
        ref = otstab.certify_distances(exact_d, r, theta1=1.0, theta2=theta2,
                                       misclassified=model.predict(X) != y)
        assert res.status == "bounds"
        assert res.value_lower <= ref.value * (1 + 1e-6) + 1e-9
        assert ref.value <= res.value_upper * (1 + 1e-6) + 1e-9
        assert res.value_lower > 0.9 * ref.value  # run to completion: tight


def _mlp(activation, k, seed=0, d=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(150, d))
    s = X @ rng.normal(size=(d, k)) + np.sin(2 * X[:, :1])
    y = np.argmax(s, axis=1) if k > 2 else (s[:, 0] > 0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        m = sk_nn.MLPClassifier((12, 8) if seed % 2 else (16,), activation=activation,
                                max_iter=400, random_state=seed).fit(X, y)
    return m, X, y


@pytest.mark.parametrize("k", [2, 3])
def test_identity_mlp_is_exact(k):
    model, X, y = _mlp("identity", k)
    # the collapsed linear map x -> x W + b, d* = min_k ((s_y - s_k)_+)^2 / ||w_y - w_k||^2
    W, b = model.coefs_[0], model.intercepts_[0]
    for Wl, bl in zip(model.coefs_[1:], model.intercepts_[1:]):
        W, b = W @ Wl, b @ Wl + bl
    S = X @ W + b
    if k == 2:
        S, W = np.column_stack([np.zeros(len(S)), S[:, 0]]), np.column_stack([0 * W[:, 0],
                                                                              W[:, 0]])
    yi = np.searchsorted(model.classes_, y)
    exact = np.full(len(y), np.inf)
    for c in range(S.shape[1]):
        gap = np.maximum(S[np.arange(len(y)), yi] - S[:, c], 0.0)
        nrm = np.sum((W[:, yi] - W[:, [c]]) ** 2, axis=0)  # 0 only where yi == c
        exact = np.where(yi == c, exact, np.minimum(exact, gap ** 2 / np.where(yi == c, 1.0,
                                                                                nrm)))
    exact = np.where(model.predict(X) != y, 0.0, exact)
    dlow, _ = bounds.mlp_lower_distances(MLPModel(model), X, yi)
    np.testing.assert_allclose(dlow, exact, rtol=1e-5, atol=1e-12)
    res = otstab.certify(model, X, y, r=0.4, loss="zero_one", theta1=1.0, theta2=0.5)
    ref = otstab.certify_distances(exact, 0.4, theta1=1.0, theta2=0.5,
                                   misclassified=model.predict(X) != y)
    assert res.value_lower <= ref.value * (1 + 1e-6) <= res.value_upper * (1 + 2e-6)
    assert res.value_lower >= ref.value * (1 - 1e-4)


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic"])
@pytest.mark.parametrize("k,seed", [(2, 0), (3, 1), (2, 3)])
def test_mlp_radius_is_sound_by_sampling(activation, k, seed):
    model, X, y = _mlp(activation, k, seed)
    yi = np.searchsorted(model.classes_, y)
    up = perturbation_search(model, X, y).distances
    dlow, _ = bounds.mlp_lower_distances(MLPModel(model), X, yi, upper=up)
    assert np.all(dlow <= up)
    rng = np.random.default_rng(seed)
    ok = (dlow > 0) & np.isfinite(dlow)
    for i in np.flatnonzero(ok)[:40]:
        U = rng.normal(size=(300, X.shape[1]))
        U /= np.linalg.norm(U, axis=1, keepdims=True)
        radius = np.sqrt(dlow[i]) * (1 - 1e-9) * rng.uniform(0.5, 1.0, size=(300, 1))
        assert np.all(model.predict(X[i] + radius * U) == y[i])
    assert np.mean(dlow[ok] / up[ok]) > 0.05  # not trivial


def test_mlp_masked_features_do_not_move():
    model, X, y = _mlp("relu", 2, 0)
    yi = np.searchsorted(model.classes_, y)
    mv = np.array([True, False, True])
    full, _ = bounds.mlp_lower_distances(MLPModel(model), X, yi)
    masked, _ = bounds.mlp_lower_distances(MLPModel(model), X, yi, mask=mv)
    assert np.all(masked >= full * (1 - 1e-9))  # fewer directions: farther from the boundary
    none, _ = bounds.mlp_lower_distances(MLPModel(model), X, yi, mask=np.zeros(3, bool))
    assert np.all(np.isinf(none[model.predict(X) == y]))


@pytest.mark.parametrize("loss,k", [("logistic", 2), ("cross_entropy", 3)])
def test_smooth_transform_over_estimate_by_sampling(loss, k):
    model, X, y = _mlp("tanh", k, 1)
    ad = MLPModel(model).bind_loss(loss)
    yint = np.where(y == 1, 1.0, -1.0) if k == 2 else y.astype(float)
    base = ad.loss_values(X, yint)
    theta1 = 2.0
    oracle = bounds.mlp_transform_upper(MLPModel(model), loss, base, theta1)
    rng = np.random.default_rng(0)
    for h in (0.1, 1.0, 5.0):
        lh_up = oracle.evaluate(h)[0]
        for _ in range(20):
            Z = X + rng.normal(size=X.shape) * rng.uniform(0, 2)
            val = h * ad.loss_values(Z, yint) - theta1 * np.sum((Z - X) ** 2, axis=1)
            assert np.all(val <= lh_up + 1e-12)


def _identity_mlp_and_its_linear_model():
    """An identity MLP and the linear model it computes (its layers multiplied out), with the
    labels as the linear model's -1/+1: ``(model, X, y, lin, ylin)``."""
    model, X, y = _mlp("identity", 2, 0)
    W, b = model.coefs_[0], model.intercepts_[0]
    for Wl, bl in zip(model.coefs_[1:], model.intercepts_[1:]):
        W, b = W @ Wl, b @ Wl + bl
    lin = otstab.LinearModel(W[:, 0], float(b[0]))
    return model, X, y, lin, np.where(y == model.classes_[1], 1, -1)


def test_smooth_identity_mlp_lower_bound_below_exact_linear():
    model, X, y, lin, ylin = _identity_mlp_and_its_linear_model()
    for r, theta2 in ((0.5, 0.5), (0.6, math.inf)):
        exact = otstab.certify(lin, X, ylin, r=r, loss="logistic", theta1=1.0, theta2=theta2)
        res = otstab.certify(model, X, y, r=r, loss="logistic", theta1=1.0, theta2=theta2)
        assert res.status == "bounds"
        assert 0 < res.value_lower <= exact.value * (1 + 1e-6)
        assert exact.value <= res.value_upper * (1 + 1e-6)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_weighted_mlp_lower_bound_equals_replicated_rows(divergence):
    # integer weights k_i are the rows replicated k_i times (the unweighted bound on np.repeat,
    # an independent computation); the bound is certified (<= the found value_upper) and not
    # the trivial 0; equal weights give the unweighted bound
    model, X, y = _mlp("tanh", 2, 1)
    k = np.random.default_rng(7).integers(0, 4, size=len(y))
    kw = dict(r=0.6, loss="logistic", theta1=1.0, theta2=0.5, divergence=divergence)
    res = otstab.certify(model, X, y, sample_weight=k, **kw)
    rep = otstab.certify(model, np.repeat(X, k, axis=0), np.repeat(y, k), **kw)
    assert res.status == rep.status == "bounds"
    assert 0 < res.value_lower <= res.value_upper
    assert res.value_lower == pytest.approx(rep.value_lower, rel=1e-9)
    same = otstab.certify(model, X, y, sample_weight=np.full(len(y), 2.5), **kw)
    plain = otstab.certify(model, X, y, **kw)
    assert same.value_lower == pytest.approx(plain.value_lower, rel=1e-12)
    assert 0 < same.value_lower <= same.value_upper


def test_weighted_identity_mlp_lower_bound_below_the_exact_weighted_value():
    # an identity MLP is a linear model: the exact weighted R of the specialised dual (with p)
    # bounds the certified weighted lower bound from above
    model, X, y, lin, ylin = _identity_mlp_and_its_linear_model()
    sw = np.random.default_rng(8).uniform(0.2, 3.0, size=len(y))
    kw = dict(r=0.5, loss="logistic", theta1=1.0, theta2=0.5, sample_weight=sw)
    exact = otstab.certify(lin, X, ylin, **kw)
    res = otstab.certify(model, X, y, **kw)
    assert res.status == "bounds"
    assert 0 < res.value_lower <= exact.value * (1 + 1e-6)
    assert exact.value <= res.value_upper * (1 + 1e-6)


def test_unsupported_model_gets_the_trivial_bound():
    from sklearn.svm import SVC  # noqa: PLC0415

    X, y = _data(n=60)
    model = SVC().fit(X, y)
    res = otstab.certify(model, X, y, r=0.4, loss="zero_one", theta1=1.0, theta2=0.5)
    assert res.status == "bounds" and res.value_lower == 0.0
    assert "no certified lower bound" in res.message


def test_caller_arrays_untouched_and_options_pass_through():
    X, y = _data(n=60, seed=5)
    model = _ensembles(2)[0].fit(X, y)
    X0, y0 = X.copy(), y.copy()
    res = otstab.certify(model, X, y, r=0.3, loss="zero_one", theta1=1.0, theta2=0.5,
                         max_nodes=3, time_budget=5.0)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)
    assert res.value_lower <= res.value_upper
    with pytest.raises(otstab.errors.ValidationError):
        otstab.certify(model, X, y, r=0.3, loss="zero_one", theta1=1.0, theta2=0.5,
                       max_nodez=3)


def test_interval_downstream_certificate_verify_report_summary():
    from otstab.certificates import make_certificate, verify_certificate  # noqa: PLC0415
    from otstab.reporting._report import render_html  # noqa: PLC0415

    X, y = _data(n=80, seed=7)
    model = _ensembles(2)[0].fit(X, y)
    res = otstab.certify(model, X, y, r=0.3, loss="zero_one", theta1=1.0, theta2=0.5)
    assert 0 < res.value_lower <= res.value_upper
    cert = make_certificate(res, model, X, y)
    assert cert["results"]["value_lower"] == res.value_lower
    assert cert["results"]["value_upper"] == res.value_upper
    rep = verify_certificate(cert, model, X, y)
    assert rep.ok, rep
    cert["results"]["value_lower"] = res.value_lower * 1.5  # a claimed bound must reproduce
    assert not verify_certificate(cert, model, X, y).ok
    html = render_html(make_certificate(res, model, X, y))
    assert "(certified)" in html and "does (found" in html
    assert "(certified)" in res.summary()


def test_time_budget_cut_is_reproduced_by_its_node_budget(monkeypatch, compiled=False,
                                                          time_budget=40):
    # a fake clock that advances one second per reading stops the search mid-way, at a point
    # that depends on the clock alone; the node_budget it reports reproduces the same bounds
    # (the NumPy search here; the compiled one: tests/test_tree_kernel.py)
    X, y = _data(n=40, d=4, seed=3)
    model = sk_ens.GradientBoostingClassifier(n_estimators=15, max_depth=3,
                                              random_state=0).fit(X, y)
    up = perturbation_search(model, X, y).distances
    full, info_full = bounds.tree_lower_distances(model, X, y, upper=up, max_nodes=60,
                                                  compiled=compiled)
    assert info_full["stopped"] is None and info_full["node_budget"] is None
    ticks = itertools.count()
    monkeypatch.setattr(bounds.time, "perf_counter", lambda: float(next(ticks)))
    cut, info = bounds.tree_lower_distances(model, X, y, upper=up, max_nodes=60,
                                            time_budget=time_budget, compiled=compiled)
    monkeypatch.undo()
    assert info["stopped"] == "time_budget"
    assert 1 < info["node_budget"] < info_full["nodes"]
    again, info2 = bounds.tree_lower_distances(model, X, y, upper=up, max_nodes=60,
                                               node_budget=info["node_budget"],
                                               compiled=compiled)
    np.testing.assert_array_equal(again, cut)
    np.testing.assert_array_equal(info2["exact"], info["exact"])
    assert np.all(cut <= full) and np.any(cut < full)  # the cut was real, and sound
    for nb in (1, 10, 100, 10 ** 6):  # more boxes never lower a bound
        dl, _ = bounds.tree_lower_distances(model, X, y, upper=up, max_nodes=60,
                                            node_budget=nb, compiled=compiled)
        assert np.all(dl <= full)
        if nb == 10 ** 6:
            np.testing.assert_array_equal(dl, full)
    with pytest.raises(otstab.errors.ValidationError, match="node_budget"):
        bounds.tree_lower_distances(model, X, y, node_budget=0)


def test_verify_of_a_time_budgeted_certificate_passes():
    # issue 29: the bound under a time budget depends on the machine's speed, so verify of an
    # untouched certificate failed; it now recomputes without the time limit and checks that
    # the recorded bound is at most the recomputed one
    from otstab.certificates import make_certificate, verify_certificate  # noqa: PLC0415

    X, y = _data(n=40, d=3, seed=4)
    model = sk_ens.GradientBoostingClassifier(n_estimators=10, max_depth=2,
                                              random_state=0).fit(X, y)
    kw = dict(r=0.3, loss="zero_one", theta1=1.0, theta2=0.5)
    res = otstab.certify(model, X, y, **kw, time_budget=0.0)
    assert res.info["lower_bound"]["stopped"] == "time_budget"
    assert "node_budget=" in res.message
    full = otstab.certify(model, X, y, **kw)
    assert res.value_lower < full.value_lower  # the time budget cut the bound
    cert = make_certificate(res, model, X, y, solver_options={"time_budget": 0.0})
    rep = verify_certificate(cert, model, X, y)
    assert rep.ok, rep
    assert any("time budget" in note for note in rep.notes)
    cert["results"]["value_lower"] = full.value_lower * 1.01  # above what a search proves
    assert not verify_certificate(cert, model, X, y).ok
    # a node budget is deterministic: verified as an equality
    nb = res.info["lower_bound"]["node_budget"]
    det = otstab.certify(model, X, y, **kw, node_budget=nb)
    assert det.value_lower == res.value_lower
    cert = make_certificate(det, model, X, y, solver_options={"node_budget": nb})
    assert verify_certificate(cert, model, X, y).ok
    cert["results"]["value_lower"] = det.value_lower * 0.5 + 0.5 * full.value_lower
    assert not verify_certificate(cert, model, X, y).ok


def _budget_case():
    # a group of two movable columns: the search is not exact there, so the bound runs
    X, y = _data(n=40, d=4, seed=3)
    model = sk_ens.GradientBoostingClassifier(n_estimators=15, max_depth=3,
                                              random_state=0).fit(X, y)
    return model, X, y, dict(loss="zero_one", r=0.4, theta1=1.0, theta2=0.5)


def test_feature_stability_passes_the_bound_options_to_certify():
    # issue 29: feature_stability refused time_budget (TypeError); each feature's bound under
    # node_budget / time_budget is now certify(features=cols, ...)'s, and it is a real cut
    model, X, y, kw = _budget_case()
    groups = {"a": [0, 1], "b": [2, 3]}
    full = otstab.certify(model, X, y, **kw, features=[0, 1], max_nodes=60)
    for opts in ({"node_budget": 30, "max_nodes": 60}, {"time_budget": 0.0}):
        fs = otstab.feature_stability(model, X, y, **kw, feature_groups=groups,
                                      features=["a"], **opts)
        row = fs.to_frame().set_index("feature").loc["a"]
        one = otstab.certify(model, X, y, **kw, features=[0, 1], **opts)
        assert one.info["lower_bound"]["stopped"] in ("node_budget", "time_budget")
        assert row["score_lower"] == one.value_lower
        assert row["score_upper"] == one.value_upper
        assert one.value_lower < full.value_lower  # the option cut the bound
    with pytest.raises(otstab.errors.ValidationError, match="node_budget"):
        otstab.feature_stability(model, X, y, **kw, feature_groups=groups, node_budget=0)


def test_feature_stability_refuses_bound_options_where_no_bound_runs():
    sk_lin = pytest.importorskip("sklearn.linear_model")
    X, y = _data(n=40, d=3, seed=1)
    lin = sk_lin.LogisticRegression().fit(X, y)
    for loss, r in (("zero_one", 0.5), ("hinge", 1.0), ("logistic", 1.0)):
        with pytest.raises(otstab.errors.ValidationError, match="time_budget"):
            otstab.feature_stability(lin, X, y, loss=loss, r=r, time_budget=1.0)


def test_stability_curve_and_compare_pass_the_bound_options_to_certify():
    model, X, y, kw = _budget_case()
    kw.pop("r")
    opts = {"node_budget": 30, "max_nodes": 60}
    curve = otstab.stability_curve(model, X, y, **kw, r=[0.4], features=[0, 1],
                                   **opts).to_frame()
    for rv, lo, hi in zip(curve["r"], curve["value_lower"], curve["value_upper"]):
        one = otstab.certify(model, X, y, **kw, r=float(rv), features=[0, 1], **opts)
        assert (lo, hi) == (one.value_lower, one.value_upper)
    cmp = dict(loss="zero_one", settings=[(1.0, 0.5)], n_resamples=0)
    table = otstab.compare({"gb": model}, X, y, **cmp, r=0.4, features=[0, 1],
                           **opts).to_frame()
    one = otstab.certify(model, X, y, **kw, r=0.4, features=[0, 1], **opts)
    assert table["value"].iloc[0] == one.value
    with pytest.raises(otstab.errors.ValidationError, match="node_budget"):
        otstab.stability_curve(model, X, y, **kw, r=[0.4], features=[0, 1], node_budget=0)
    with pytest.raises(otstab.errors.ValidationError, match="node_budget"):
        otstab.compare({"gb": model}, X, y, **cmp, r=0.4, features=[0, 1], node_budget=0)


def test_verify_recomputes_budgeted_feature_scores_under_the_recorded_budgets():
    # a certificate whose feature table was scored under the tree bound's budgets: verify
    # scores the features under the recorded node_budget (equality) and, for a time budget,
    # without it (each recorded score_lower at most the recomputed one)
    from otstab.certificates import make_certificate, verify_certificate  # noqa: PLC0415

    model, X, y, kw = _budget_case()
    groups = {"a": ["x0", "x1"], "b": ["x2", "x3"]}
    for opts in ({"node_budget": 30, "max_nodes": 60}, {"time_budget": 0.0}):
        res = otstab.certify(model, X, y, **kw, **opts)
        table = otstab.feature_stability(model, X, y, **kw, feature_groups=groups,
                                         **opts).to_frame()
        assert "score_lower" in table.columns
        cert = make_certificate(res, model, X, y, features=table, groups=groups,
                                solver_options=opts)
        rep = verify_certificate(cert, model, X, y)
        assert rep.ok, rep
        row = cert["results"]["feature_stability"]["table"][0]
        row["score_lower"] = row["score"] * 1.01 + 1e-6  # above the found (upper) score
        rep = verify_certificate(cert, model, X, y)
        assert not rep.ok
        assert any("score_lower" in m.field for m in rep.mismatches)
