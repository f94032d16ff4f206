"""Logistic and cross-entropy certificates of boosted tree Pipelines under a DataCost (issue
29): the certified interval against the exact dual of the d-transform enumerated over the raw
grid (every level of every categorical variable, every integer in its bounds, every candidate
value of each continuous variable on both sides of every cell edge of the trees, read from the
models' node arrays and dumps, and every sample's own values), each row's loss from the
Pipeline's own ``predict_proba`` and its cost from the cost's definition written out here; Q*'s
raw rows re-scored and re-priced the same way; immutables and bounds respected; German credit
gives a positive R."""

import itertools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from otstab_solvers.dual import solve_dual
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import GradientBoostingClassifier, HistGradientBoostingClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from test_datacost_trees import COLOURS, COST, SHAPES, _candidates, _data

import otstab
from otstab.errors import ValidationError
from otstab.modeling._datacost import DataCost
from otstab.solve._datacost_cross_entropy import FiniteOracle

xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")


def _model(kind, trees, depth):
    return {"gb": GradientBoostingClassifier(n_estimators=trees, max_depth=depth,
                                             random_state=0),
            "hgb": HistGradientBoostingClassifier(max_iter=trees, max_depth=depth,
                                                  random_state=0),
            "lgbm": lightgbm.LGBMClassifier(n_estimators=trees, num_leaves=2 ** depth,
                                            max_depth=depth, min_child_samples=5,
                                            verbose=-1, random_state=0),
            "xgb": xgboost.XGBClassifier(n_estimators=trees, max_depth=depth,
                                         random_state=0)}[kind] if kind != "cb" else \
        pytest.importorskip("catboost").CatBoostClassifier(
            iterations=trees, depth=depth, verbose=0, random_seed=0, thread_count=1,
            allow_writing_files=False)


def _pipe(kind, X, y, *, trees=3, depth=2, cats=("colour",), nums=("k", "u"), scaled=False):
    num = ("num", StandardScaler() if scaled else "passthrough", list(nums))
    ct = ColumnTransformer([("cat", OneHotEncoder(), list(cats)), num])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Pipeline([("pre", ct), ("clf", _model(kind, trees, depth))]).fit(
            X[list(cats) + list(nums)], y)


def _cost_of(x, F, cost, cats, nums):
    """The cost of moving raw row ``x`` to every row of ``F``, from the definition (inf: a
    move the cost forbids)."""
    c = np.zeros(len(F))
    for v in cats:
        moved = F[v].to_numpy() != x[v]
        c += moved * cost["switch"][v]
        if v in cost.get("immutable", ()):
            c[moved] = np.inf
    for v in nums:
        d = F[v].to_numpy(dtype=np.float64) - float(x[v])
        c += (d / cost["scale"][v]) ** 2
        lo, hi = cost.get("bounds", {}).get(v, (-np.inf, np.inf))
        c[(d != 0) & ((F[v] < min(lo, x[v])) | (F[v] > max(hi, x[v]))).to_numpy()] = np.inf
        if v in cost.get("decrease_only", ()):
            c[d > 0] = np.inf
        if v in cost.get("immutable", ()):
            c[d != 0] = np.inf
    return c


def _grid(pipe, X, cost, cats, nums):
    """Every combination of the levels, the integers of k's bounds and the candidate values
    of u (the trees' cell edges, both sides, and every sample's own value)."""
    names = list(pipe[:-1].get_feature_names_out())
    axes = []
    for v in cats:
        axes.append({"colour": COLOURS, "shape": SHAPES}[v])
    for v in nums:
        if v == "k":
            axes.append(list(range(0, 9)))
        else:
            col = names.index(next(n for n in names if n.endswith("__" + v)))
            axes.append(list(np.unique(np.r_[_candidates(pipe, X, v, col),
                                             X[v].to_numpy(dtype=np.float64)])))
    return pd.DataFrame(list(itertools.product(*axes)), columns=list(cats) + list(nums))


def _exact(pipe, X, y, cost, cats, nums, *, r, theta1, theta2, divergence="kl"):
    """R by the exact dual of the finite d-transform over the raw grid (module doc)."""
    F = _grid(pipe, X, cost, cats, nums)
    P = np.asarray(pipe.predict_proba(F), dtype=np.float64)
    yi = np.searchsorted(pipe.classes_, np.asarray(y))
    A = -np.log(P[:, yi].T)  # (n, grid)
    C = np.stack([_cost_of(X.iloc[i], F, cost, cats, nums) for i in range(len(X))])
    assert np.all(C.min(axis=1) == 0)  # every sample's own row is on the grid
    with np.errstate(invalid="ignore"):
        B = np.where(np.isfinite(C), theta1 * C, np.inf)
    sol = solve_dual(FiniteOracle(A, B), r, theta2, divergence)
    return float(sol.value), F


def _ends(res):
    if res.status == "bounds":
        return res.value_lower, res.value_upper
    if res.status == "unreachable":
        return math.inf, math.inf
    assert res.status == "optimal"
    return res.value, res.value


def _check_q_star(res, pipe, X, y, cost, cats, nums):
    """Q*'s raw rows: valid, re-scored by predict_proba and re-priced by the definition."""
    f = res.to_frame(raw=True)
    src = np.asarray(res.source)
    assert np.array_equal(f["source"].to_numpy(), src)
    rows = f[[f"{c}*" for c in cats + nums]].reset_index(drop=True)
    rows.columns = list(cats) + list(nums)
    rows = rows.astype({"k": np.int64, "u": np.float64})
    P = np.asarray(pipe.predict_proba(rows), dtype=np.float64)
    yi = np.searchsorted(pipe.classes_, np.asarray(y)[src])
    np.testing.assert_allclose(-np.log(P[np.arange(src.size), yi]), res.loss_star,
                               rtol=1e-6, atol=1e-9)
    c = np.array([_cost_of(X.iloc[i], rows.iloc[[a]], cost, cats, nums)[0]
                  for a, i in enumerate(src)])
    assert np.all(np.isfinite(c))
    np.testing.assert_allclose(c, res.info["moved2"], rtol=1e-9, atol=1e-12)
    assert set(rows["k"]) <= set(range(0, 9)) if "k" in nums else True
    return rows, src


def _setup(kind, classes, trees, depth, cats=("colour",), nums=("k", "u"), scaled=False,
           n=12):
    X, y = _data(5, n=120, classes=classes)
    pipe = _pipe(kind, X, y, trees=trees, depth=depth, cats=cats, nums=nums, scaled=scaled)
    Xe = X.iloc[:n][list(cats) + list(nums)].reset_index(drop=True)
    ye = y.iloc[:n].reset_index(drop=True)
    cost = {k: {v: w for v, w in COST[k].items() if v in cats + nums}
            for k in ("scale", "switch", "bounds")}
    cost["decrease_only"] = ["u"]
    base = float(np.mean(-np.log(np.asarray(pipe.predict_proba(Xe))[
        np.arange(n), np.searchsorted(pipe.classes_, ye)])))
    return pipe, Xe, ye, cost, base


#: (model, classes, trees, depth, StandardScaler on the numbers, categorical variables)
ONE, TWO = ("colour",), ("colour", "shape")
MODELS = [("gb", 2, 3, 2, False, ONE), ("hgb", 2, 3, 2, False, ONE),
          ("lgbm", 2, 4, 2, True, ONE), ("xgb", 2, 3, 2, False, ONE),
          ("gb", 3, 3, 2, False, ONE), ("lgbm", 3, 2, 2, False, ONE),
          ("hgb", 3, 2, 3, False, ONE), ("xgb", 3, 2, 2, True, ONE),
          ("gb", 2, 6, 2, False, TWO), ("hgb", 2, 4, 3, False, TWO),
          ("lgbm", 3, 3, 3, True, TWO), ("xgb", 2, 4, 3, False, TWO),
          ("cb", 2, 4, 2, True, TWO), ("cb", 3, 3, 2, False, ONE)]
#: (theta1, theta2, r - base loss)
PRICES = [(1.0, math.inf, 0.2), (2.0, 1.0, 0.15)]
#: two fast cases in the default suite, the rest of the campaign slow
FAST = {(MODELS[0], PRICES[0], "complete"), (MODELS[5], PRICES[1], "cut")}
CASES = [pytest.param(m, pr, how, marks=() if (m, pr, how) in FAST else pytest.mark.slow)
         for m in MODELS for pr in PRICES for how in ("complete", "cut")]


@pytest.mark.parametrize("model, prices, how", CASES)
def test_interval_holds_the_enumerated_value(model, prices, how):
    """value_lower <= exact <= value_upper, the ends meeting the exact value when every search
    completes (``how="complete"``) and holding it when they are cut at 3 boxes (``"cut"``);
    Q*'s raw rows valid and their losses and costs those of the Pipeline and the cost."""
    kind, classes, trees, depth, scaled, cats = model
    theta1, theta2, dr = prices
    nums = ("k", "u")
    pipe, Xe, ye, cost, base = _setup(kind, classes, trees, depth, cats=cats, scaled=scaled)
    loss = "logistic" if classes == 2 else "cross_entropy"
    r = base + dr
    exact, _ = _exact(pipe, Xe, ye, cost, cats, nums, r=r, theta1=theta1, theta2=theta2)
    opts = {"rtol": 0.0} if how == "complete" else {"max_nodes": 3, "rtol": 0.0}
    res = otstab.certify(pipe, Xe, ye, loss=loss, r=r, theta1=theta1, theta2=theta2,
                         cost=DataCost(**cost), **opts)
    lo, up = _ends(res)
    tol = 1e-7 * (1 + exact)
    assert lo - tol <= exact <= up + tol, (opts, lo, exact, up)
    if how == "complete":  # every search completes: the ends meet
        assert abs(up - exact) <= 1e-6 * (1 + exact)
        if kind in ("xgb", "cb"):  # float32 sums: the loss bound keeps a rounding band
            assert up - lo <= 1e-3 * up
        else:
            assert res.status == "optimal", (lo, exact, up)
    _check_q_star(res, pipe, Xe, ye, cost, cats, nums)


def test_immutable_and_bounded_variables_never_move():
    """colour immutable, k bounded to [2, 6] (a sample outside stays on its own side), u
    decrease-only: no Q* row breaks them, and the interval holds the enumerated value under
    the same constraints."""
    pipe, Xe, ye, cost, base = _setup("lgbm", 2, 4, 2)
    cost = {**cost, "bounds": {"k": (2, 6)}, "immutable": ["colour"]}
    r = base + 0.12
    exact, _ = _exact(pipe, Xe, ye, cost, ("colour",), ("k", "u"), r=r, theta1=1.0,
                      theta2=math.inf)
    res = otstab.certify(pipe, Xe, ye, loss="logistic", r=r, theta1=1.0, theta2=math.inf,
                         cost=DataCost(**cost),
                         rtol=0.0)
    lo, up = _ends(res)
    assert lo - 1e-7 * (1 + exact) <= exact <= up + 1e-7 * (1 + exact)
    rows, src = _check_q_star(res, pipe, Xe, ye, cost, ("colour",), ("k", "u"))
    x0 = Xe.iloc[src].reset_index(drop=True)
    assert np.array_equal(rows["colour"].to_numpy(), x0["colour"].to_numpy())
    assert np.all(rows["u"].to_numpy() <= x0["u"].to_numpy())
    k, k0 = rows["k"].to_numpy(), x0["k"].to_numpy()
    assert np.all((k == k0) | ((k >= np.minimum(2, k0)) & (k <= np.maximum(6, k0))))
    assert np.any(rows["k"].to_numpy() != x0["k"].to_numpy()) or \
        np.any(rows["u"].to_numpy() != x0["u"].to_numpy())  # some row moved
    # r beyond the largest mean loss of the grid (the same constraints): unreachable, and
    # just below it: reachable
    F = _grid(pipe, Xe, cost, ("colour",), ("k", "u"))
    A = -np.log(np.asarray(pipe.predict_proba(F))[:, np.searchsorted(pipe.classes_, ye)].T)
    C = np.stack([_cost_of(Xe.iloc[i], F, cost, ("colour",), ("k", "u"))
                  for i in range(len(Xe))])
    reach = float(np.mean(np.where(np.isfinite(C), A, -np.inf).max(axis=1)))
    for rr, status in ((reach * (1 + 1e-6), "unreachable"), (reach * (1 - 1e-3), None)):
        res = otstab.certify(pipe, Xe, ye, loss="logistic", r=rr, theta1=1.0,
                             theta2=math.inf, cost=DataCost(**cost))
        assert (res.status == "unreachable") == (status == "unreachable")


def test_german_lightgbm_is_not_degenerate():
    """German credit, a small LightGBM Pipeline, no cost=: the DataCost is chosen (said so, no
    warning), R is positive and finite (the encoded cost gave 1e-71) and tight."""
    from german import german_pipeline

    pipe, X, y, num, cat, _ = german_pipeline()
    clf = lightgbm.LGBMClassifier(n_estimators=6, num_leaves=8, verbose=-1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tp = Pipeline([("pre", pipe.named_steps["pre"]), ("clf", clf)]).fit(X, y)
    Xe, ye = X.iloc[:20].reset_index(drop=True), y.iloc[:20].reset_index(drop=True)
    P = np.asarray(tp.predict_proba(Xe))
    base = float(np.mean(-np.log(P[np.arange(20), np.searchsorted(tp.classes_, ye)])))
    with warnings.catch_warnings():
        # otstab's warnings (the encoded cost's among them) are UserWarnings; the libraries'
        # own deprecation notices (FutureWarning, with the oldest allowed versions) are not
        # what this test is about
        warnings.simplefilter("error", UserWarning)
        res = otstab.certify(tp, Xe, ye, loss="logistic", r=base + 0.1, theta2=math.inf)
    assert res.info["cost_used"].startswith("auto (default")
    lo, up = _ends(res)
    assert 1e-3 < lo <= up < math.inf and lo >= 0.9 * up


@pytest.mark.slow
def test_german_constraints_hold():
    from german import GERMAN_COST, assert_german_constraints, german_pipeline, star_rows

    pipe, X, y, num, cat, _ = german_pipeline()
    clf = HistGradientBoostingClassifier(max_iter=8, max_depth=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tp = Pipeline([("pre", pipe.named_steps["pre"]), ("clf", clf)]).fit(X, y)
    Xe, ye = X.iloc[:40].reset_index(drop=True), y.iloc[:40].reset_index(drop=True)
    P = np.asarray(tp.predict_proba(Xe))
    base = float(np.mean(-np.log(P[np.arange(40), np.searchsorted(tp.classes_, ye)])))
    res = otstab.certify(tp, Xe, ye, loss="logistic", r=base + 0.1, theta2=math.inf)
    res2 = otstab.certify(tp, Xe, ye, loss="logistic", r=base + 0.1, theta2=math.inf,
                          cost=DataCost(**GERMAN_COST), rtol=0.05)
    assert _ends(res2)[0] >= _ends(res)[0] * (1 - 0.02)  # constraints only raise R
    f = res2.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    assert len(mv) > 0
    assert_german_constraints(star_rows(mv, X, num), mv)


def test_options_refusals_and_sweeps():
    """The tree search's options are accepted (node_budget reproduces a cut run); hinge, a
    conic solver, se='bootstrap' and loss='logistic' on 3 classes are refused before any
    search; stability_curve and feature_stability follow certify's routing."""
    pipe, Xe, ye, cost, base = _setup("gb", 2, 3, 2, n=10)
    dc = DataCost(**cost)
    kw = dict(r=base + 0.2, theta1=1.0, theta2=1.0, cost=dc)
    res = otstab.certify(pipe, Xe, ye, loss="logistic", node_budget=30, rtol=0.0, **kw)
    assert res.info["lower_bound"]["stopped"] == "node_budget"
    assert res.info["lower_bound"]["nodes"] <= 32  # (a split's two children: one over)
    again = otstab.certify(pipe, Xe, ye, loss="logistic", node_budget=30, rtol=0.0, **kw)
    assert _ends(again) == _ends(res)
    kw["theta2"] = math.inf
    for bad, match in (({"loss": "hinge"}, "hinge"), ({"solver": "conic"}, "solver"),
                       ({"se": "bootstrap"}, "bootstrap")):
        with pytest.raises(ValidationError, match=match):
            otstab.certify(pipe, Xe, ye, **{"loss": "logistic", **kw, **bad})
    p3, X3, y3, c3, _ = _setup("gb", 3, 2, 2, n=10)
    with pytest.raises(ValidationError, match="cross_entropy"):
        otstab.certify(p3, X3, y3, loss="logistic", r=1.0, theta1=1.0, cost=DataCost(**c3))
    curve = otstab.stability_curve(pipe, Xe, ye, loss="logistic", r=[base + 0.1, base + 0.2],
                                   theta1=1.0, theta2=math.inf, cost=dc)
    vals = [_ends(c)[0] for c in curve.results] if hasattr(curve, "results") else None
    assert vals is None or vals[0] <= vals[1] + 1e-9
    fs = otstab.feature_stability(pipe, Xe, ye, loss="logistic", r=base + 0.2, theta1=1.0,
                                  theta2=math.inf, cost=dc)
    assert len(fs) >= 3


@pytest.mark.slow
def test_certificate_round_trip():
    """A cut interval's certificate verifies (its max_nodes recorded), a tampered certified
    end does not."""
    from otstab.certificates import make_certificate, verify_certificate

    pipe, Xe, ye, cost, base = _setup("lgbm", 2, 4, 2, n=10)
    res = otstab.certify(pipe, Xe, ye, loss="logistic", r=base + 0.2, theta1=1.0,
                         theta2=math.inf, cost=DataCost(**cost), max_nodes=3)
    assert res.status == "bounds"
    cert = make_certificate(res, pipe, Xe, ye, solver_options={"max_nodes": 3})
    rep = verify_certificate(cert, pipe, Xe, ye)
    assert rep.ok, rep.mismatches
    cert["results"]["value_lower"] = res.value_lower * 1.5 + 1e-3
    assert not verify_certificate(cert, pipe, Xe, ye).ok


@pytest.mark.slow
def test_compare_follows_the_routing():
    pipe, Xe, ye, cost, base = _setup("gb", 2, 3, 2, n=10)
    pipe2, *_ = _setup("hgb", 2, 3, 2, n=10)
    c = otstab.compare({"gb": pipe, "hgb": pipe2}, Xe, ye, loss="logistic", r=base + 0.2,
                       settings=((1.0, math.inf),), n_resamples=3, cost=DataCost(**cost))
    for name, p in (("gb", pipe), ("hgb", pipe2)):
        one = otstab.certify(p, Xe, ye, loss="logistic", r=base + 0.2, theta1=1.0,
                             theta2=math.inf, cost=DataCost(**cost))
        row = c.table[c.table["model"] == name] if hasattr(c, "table") else None
        assert row is None or abs(float(row["value"].iloc[0]) - one.value) <= 1e-9 * one.value


def test_weights_equal_duplicated_rows():
    """sample_weight 3 on three rows gives the interval of those rows written three times."""
    pipe, Xe, ye, cost, base = _setup("gb", 2, 3, 2, n=8)
    kw = dict(loss="logistic", r=base + 0.2, theta1=1.0, theta2=math.inf,
              cost=DataCost(**cost), rtol=0.0)
    w = np.ones(8)
    w[:3] = 3.0
    a = otstab.certify(pipe, Xe, ye, sample_weight=w, **kw)
    idx = np.r_[np.arange(8), 0, 0, 1, 1, 2, 2]
    b = otstab.certify(pipe, Xe.iloc[idx].reset_index(drop=True),
                       ye.iloc[idx].reset_index(drop=True), **kw)
    np.testing.assert_allclose(_ends(a), _ends(b), rtol=1e-7)


def test_nothing_moves():
    """theta1 = inf and a cost with every variable immutable give the same exact answer:
    the reweighting dual of the Pipeline's own losses."""
    pipe, Xe, ye, cost, base = _setup("gb", 2, 3, 2, n=8)
    kw = dict(loss="logistic", r=base + 0.1, theta2=1.0)
    a = otstab.certify(pipe, Xe, ye, theta1=math.inf, cost=DataCost(**cost), **kw)
    b = otstab.certify(pipe, Xe, ye, theta1=1.0,
                       cost=DataCost(**{**cost, "immutable": ["colour", "k", "u"]}), **kw)
    assert a.status == b.status == "optimal"
    assert abs(a.value - b.value) <= 1e-9 * a.value
    P = np.asarray(pipe.predict_proba(Xe))
    loss0 = -np.log(P[np.arange(8), np.searchsorted(pipe.classes_, ye)])
    exact = solve_dual(FiniteOracle(loss0[:, None], np.zeros((8, 1))), base + 0.1, 1.0, "kl")
    assert abs(a.value - exact.value) <= 1e-7 * exact.value
