"""Tree ensembles under a DataCost (issue 28 item 3, issue 29): the distances against an
enumeration of every combination of levels and integer values and of every cell of the
continuous variable's thresholds, each candidate row scored by the Pipeline's own ``predict``
and priced by the cost's definition written out here; the certificate's interval against the
0/1 dual on the enumerated distances; German credit pipelines with XGBoost, LightGBM and
histogram gradient boosting: a non-degenerate R and a Q* made of valid raw rows."""

import itertools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from german import (
    GERMAN_COST,
    assert_german_constraints,
    assert_valid_rows,
    german_pipeline,
    star_rows,
)
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from test_trees import sk_thresholds

import otstab
from otstab.errors import ValidationError
from otstab.modeling._datacost import DataCost
from otstab.modeling._losses import get_loss
from otstab.solve._datacost_certify import choose_cost

xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")

COLOURS = ["red", "green", "blue"]
SHAPES = ["disc", "star", "cube"]
COST = dict(scale={"k": 2.0, "u": 0.7, "v": 1.3}, switch={"colour": 1.0, "shape": 0.6},
            bounds={"k": (0, 8)}, decrease_only=["u"])


def _data(seed, n=240, classes=2):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"colour": rng.choice(COLOURS, n), "shape": rng.choice(SHAPES, n),
                      "k": rng.integers(0, 9, n), "u": rng.normal(size=n),
                      "v": rng.normal(size=n)})
    s = (X["colour"].map({"red": 1.0, "green": -0.5, "blue": 0.0}) + 0.4 * (X["k"] - 4)
         + X["u"] - 0.5 * X["v"] + (X["shape"] == "star") + 0.8 * rng.normal(size=n))
    y = (s > 0).astype(int) if classes == 2 else np.digitize(s, [-0.7, 0.7])
    return X, pd.Series(y)


def _pipe(kind, X, y, scaled):
    num = ("num", StandardScaler(), ["k", "u", "v"]) if scaled else \
        ("num", "passthrough", ["k", "u", "v"])
    ct = ColumnTransformer([("cat", OneHotEncoder(), ["colour", "shape"]), num])
    clf = {"hgb": HistGradientBoostingClassifier(max_iter=6, max_depth=3, random_state=0),
           "lgbm": lightgbm.LGBMClassifier(n_estimators=6, num_leaves=6, verbose=-1,
                                           random_state=0),
           "xgb": xgboost.XGBClassifier(n_estimators=6, max_depth=3, random_state=0),
           "rf": RandomForestClassifier(n_estimators=4, max_depth=4, random_state=0)}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Pipeline([("pre", ct), ("clf", clf)]).fit(X, y)


def _candidates(pipe, X, name, col):
    """Raw values of continuous variable ``name`` on both sides of every cell edge of the
    trees (thresholds on its encoded column ``col``, read from the models' node arrays and
    dumps): the float64 values around each threshold mapped back through the scaler, kept
    where the comparison ``c(z(x)) <= t`` (``c`` float32 rounding or the identity, ``z`` the
    scaler's own transform) differs from that of a float64 neighbour."""
    thr, kind = sk_thresholds(pipe[-1], len(pipe[:-1].get_feature_names_out()))
    T = thr[col]
    if T.size == 0:
        return np.zeros(0)
    sc = pipe.named_steps["pre"].named_transformers_["num"]
    j = ["k", "u", "v"].index(name)
    scale, mean = (sc.scale_[j], sc.mean_[j]) if hasattr(sc, "scale_") else (1.0, 0.0)

    def z(x):
        return (x - mean) / scale if hasattr(sc, "scale_") else x

    def c(v):
        return v.astype(np.float32).astype(np.float64) if kind == "f32" else v

    out = []
    for t in T:
        f = np.float32(t)
        f3 = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
        edges = [t] + [0.5 * (float(p) + float(q)) for p, q in zip(f3[:-1], f3[1:])]
        grid = []
        for e in edges:  # float64 steps around each edge's raw value (the scaler rounds)
            lo = hi = e * scale + mean
            grid.append(lo)
            for _ in range(40):
                lo, hi = np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf)
                grid += [lo, hi]
        grid = np.unique(np.array(grid))
        inside = c(z(grid)) <= t
        nxt = c(z(np.nextafter(grid, np.inf))) <= t
        prv = c(z(np.nextafter(grid, -np.inf))) <= t
        out.append(grid[(inside != nxt) | (inside != prv)])
    return np.unique(np.concatenate(out))


def vs_size(cv):
    return cv.size + 1


def _brute(pipe, X, y, rows, cost):
    """d*_i by enumeration: every colour, shape, k in its bounds, and every candidate value of
    u (not above the sample's own: decrease_only) and v; the model's own predict."""
    names = list(pipe[:-1].get_feature_names_out())
    cu = _candidates(pipe, X, "u", names.index(next(n for n in names if n.endswith("__u"))))
    cv = _candidates(pipe, X, "v", names.index(next(n for n in names if n.endswith("__v"))))
    out = {}
    for i in rows:
        x = X.iloc[i]
        us = np.unique(np.r_[x["u"], cu[cu <= x["u"]]])
        assert us.size * vs_size(cv) < 20000
        vs = np.unique(np.r_[x["v"], cv])
        combos = list(itertools.product(COLOURS, SHAPES, range(0, 9)))
        C = pd.DataFrame(combos, columns=["colour", "shape", "k"])
        m = len(C)
        F = C.loc[C.index.repeat(us.size * vs.size)].reset_index(drop=True)
        F["u"] = np.tile(np.repeat(us, vs.size), m)
        F["v"] = np.tile(vs, m * us.size)
        F = F[["colour", "shape", "k", "u", "v"]]
        wrong = np.asarray(pipe.predict(F) != y.iloc[i])
        c = ((F["colour"] != x["colour"]) * cost["switch"]["colour"]
             + (F["shape"] != x["shape"]) * cost["switch"]["shape"]
             + ((F["k"] - x["k"]) / cost["scale"]["k"]) ** 2
             + ((F["u"] - x["u"]) / cost["scale"]["u"]) ** 2
             + ((F["v"] - x["v"]) / cost["scale"]["v"]) ** 2).to_numpy()
        out[i] = float(np.min(c[wrong])) if wrong.any() else math.inf
    return out


@pytest.mark.parametrize("kind, scaled", [
    ("lgbm", True), pytest.param("hgb", False, marks=pytest.mark.slow),
    pytest.param("xgb", True, marks=pytest.mark.slow),
    pytest.param("rf", False, marks=pytest.mark.slow)])
def test_distances_equal_the_enumeration(kind, scaled):
    X, y = _data(3)
    pipe = _pipe(kind, X, y, scaled)
    Xe, ye = X.iloc[:14].reset_index(drop=True), y.iloc[:14].reset_index(drop=True)
    res = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.6, theta2=0.5, cost=DataCost(**COST),
                         max_nodes=5000, rtol=None)
    lb = res.info["lower_bound"]
    dlow, dup = lb["dlow"], np.asarray(res.info["dstar"])
    right = np.flatnonzero(pipe.predict(Xe) == ye)
    ref = _brute(pipe, Xe, ye, right, COST)
    for i in right:
        assert dlow[i] <= ref[i] * (1 + 1e-9) + 1e-12, (i, dlow[i], ref[i])
        assert ref[i] <= dup[i] * (1 + 1e-9) + 1e-12, (i, ref[i], dup[i])
        assert lb["exact"][i]
        assert dup[i] == pytest.approx(ref[i], rel=1e-9, abs=1e-12)
    d = np.zeros(len(Xe))
    d[right] = [ref[i] for i in right]
    exact = otstab.certify_distances(d, 0.6, theta2=0.5,
                                     misclassified=pipe.predict(Xe) != ye)
    assert res.status == "optimal"
    assert res.value == pytest.approx(exact.value, rel=1e-9)
    _valid_q_star(res, pipe, Xe, ye, ["k"], {"colour": COLOURS, "shape": SHAPES})


@pytest.mark.slow
def test_interval_holds_the_enumerated_value_with_small_budgets():
    X, y = _data(5)
    pipe = _pipe("xgb", X, y, True)
    Xe, ye = X.iloc[:14].reset_index(drop=True), y.iloc[:14].reset_index(drop=True)
    right = np.flatnonzero(pipe.predict(Xe) == ye)
    ref = _brute(pipe, Xe, ye, right, COST)
    d = np.zeros(len(Xe))
    d[right] = [ref[i] for i in right]
    exact = otstab.certify_distances(d, 0.6, theta2=0.5, misclassified=pipe.predict(Xe) != ye)
    last = -1.0
    for nodes in (1, 3, 10, 5000):
        res = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.6, theta2=0.5,
                             cost=DataCost(**COST), max_nodes=nodes)
        dlow = res.info["lower_bound"]["dlow"]
        assert np.all(dlow[right] <= d[right] * (1 + 1e-9) + 1e-12)
        lo = res.value_lower if res.status == "bounds" else res.value
        up = res.value_upper if res.status == "bounds" else res.value
        assert lo <= exact.value * (1 + 1e-9) <= up * (1 + 2e-9)
        assert lo >= last * (1 - 1e-12)  # more nodes never lower the bound
        last = lo


def test_rtol_stops_once_the_interval_is_tight():
    X, y = _data(11)
    pipe = _pipe("lgbm", X, y, True)
    Xe, ye = X.iloc[:30].reset_index(drop=True), y.iloc[:30].reset_index(drop=True)
    full = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.5, theta2=0.5,
                          cost=DataCost(**COST), max_nodes=3000, rtol=None)
    exact = full.value
    assert full.status == "optimal"
    for rtol in (0.3, 0.05, 0.0):
        res = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.5, theta2=0.5,
                             cost=DataCost(**COST), max_nodes=3000, rtol=rtol)
        lo = res.value_lower if res.status == "bounds" else res.value
        up = res.value_upper if res.status == "bounds" else res.value
        assert lo <= exact * (1 + 1e-9) and exact <= up * (1 + 1e-9)
        assert lo >= (1 - rtol) * up * (1 - 1e-9)
        assert res.info["lower_bound"]["nodes"] <= full.info["lower_bound"]["nodes"] * 1.5 + 50
    with pytest.raises(ValidationError, match="rtol"):
        otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.5, cost="auto", rtol=1.5)


@pytest.mark.slow

@pytest.mark.slow
def test_multiclass_and_immutables():
    X, y = _data(7, classes=3)
    pipe = _pipe("hgb", X, y, True)
    Xe, ye = X.iloc[:12].reset_index(drop=True), y.iloc[:12].reset_index(drop=True)
    cost = dict(COST, immutable=["colour"])
    res = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.7, theta2=0.5,
                         cost=DataCost(**cost), max_nodes=5000, rtol=None)
    right = np.flatnonzero(pipe.predict(Xe) == ye)
    dup = np.asarray(res.info["dstar"])
    # colour immutable: the enumeration over the other variables only
    ref = _brute_fixed(pipe, Xe, ye, right, cost)
    for i in right:
        assert dup[i] == pytest.approx(ref[i], rel=1e-9, abs=1e-12)
    f = _valid_q_star(res, pipe, Xe, ye, ["k"], {"colour": COLOURS, "shape": SHAPES})
    assert (f["colour"].astype(str) == f["colour*"].astype(str)).all()


def _brute_fixed(pipe, X, y, rows, cost):
    full = _brute(pipe, X, y, rows, dict(cost, switch={"colour": 1e6, "shape":
                                                       cost["switch"]["shape"]}))
    return {i: (v if v < 1e5 else math.inf) for i, v in full.items()}


def _valid_q_star(res, pipe, X, y, ints, levels):
    """Every moved atom of Q* is a valid raw row (levels among the encoder's, integers
    integral and in bounds, u not increased) that the pipeline itself misclassifies."""
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    if res.status in ("optimal", "bounds") and res.value > 0:
        assert len(mv) > 0
    rows = mv[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    for c, lv in levels.items():
        assert set(rows[c]) <= set(lv)
    for c in ints:
        vals = rows[c].astype(float).to_numpy()
        assert np.all(vals == np.round(vals)) and np.all((vals >= 0) & (vals <= 8))
    assert np.all(rows["u"].astype(float).to_numpy() <= mv["u"].astype(float).to_numpy())
    rows = rows.astype({"k": int, "u": float, "v": float})
    assert np.all(pipe.predict(rows) != np.asarray(y)[mv["source"]])
    return f


# ------------------------------------------------------------------------------------------
# German credit


def _german_tree(kind):
    pipe, X, y, num, cat, _ = german_pipeline()
    clf = {"xgb": xgboost.XGBClassifier(n_estimators=10, max_depth=3, random_state=0),
           "lgbm": lightgbm.LGBMClassifier(n_estimators=10, num_leaves=8, verbose=-1,
                                           random_state=0),
           "hgb": HistGradientBoostingClassifier(max_iter=10, max_depth=3, random_state=0)}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tp = Pipeline([("pre", pipe.named_steps["pre"]), ("clf", clf)]).fit(X, y)
    return pipe, tp, X, y, num, cat


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["xgb", "lgbm", "hgb"])
def test_german_tree_pipelines_are_not_degenerate(kind):
    pipe, tp, X, y, num, cat = _german_tree(kind)
    Xe, ye = X.iloc[:40].reset_index(drop=True), y.iloc[:40].reset_index(drop=True)
    r = 0.6
    cost = DataCost(**GERMAN_COST)
    # theta2 = 1: reweighting alone is dear, so Q* moves rows (checked below)
    res = otstab.certify(tp, Xe, ye, loss="zero_one", r=r, theta2=1.0, cost=cost, max_nodes=60)
    lin = otstab.certify(pipe, Xe, ye, loss="zero_one", r=r, theta2=1.0, cost=cost)
    lower = res.value_lower if res.status == "bounds" else res.value
    upper = res.value_upper if res.status == "bounds" else res.value
    # of the order of the linear model's R on the same data (the encoded cost moves one-hot
    # indicators by fractions: tests/test_datacost_trees.py::test_german_encoded_collapses)
    assert lower > 0.05 * lin.value and upper < 20 * lin.value
    assert lower <= upper
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    assert len(mv) > 0
    rows = star_rows(mv, X, num)
    assert_valid_rows(rows, tp, num, cat, integral=False)
    assert_german_constraints(rows, mv)
    assert np.all(tp.predict(rows) != np.asarray(ye)[mv["source"]])
    assert sorted(res.info["cost"]["immutable"]) == ["age", "personal_status_sex"]


@pytest.mark.slow
def test_german_encoded_collapses():
    """The encoded cost's R of a tree pipeline is far below the raw cost's certified lower
    end (a fraction of a one-hot indicator crosses a split at 0.5)."""
    _, tp, X, y, _, _ = _german_tree("xgb")
    Xe, ye = X.iloc[:40].reset_index(drop=True), y.iloc[:40].reset_index(drop=True)
    res = otstab.certify(tp, Xe, ye, loss="zero_one", r=0.45, cost="auto", max_nodes=60)
    enc = otstab.certify(tp, Xe, ye, loss="zero_one", r=0.45, cost="encoded", max_nodes=5)
    lower = res.value_lower if res.status == "bounds" else res.value
    enc_up = enc.value_upper if enc.status == "bounds" else enc.value
    assert enc_up < 0.1 * lower


def test_tree_pipelines_default_to_the_datacost():
    """No cost= for a tree Pipeline with encoders on raw data and the 0/1 loss: the DataCost
    (the encoded cost collapses there: test_german_encoded_collapses), said so, the same
    answer as cost="auto"; the tree search's options keep it; an option of the encoded
    search, or a smooth loss of a model without margins, keeps the encoded cost."""
    _, tp, X, y, _, _ = _german_tree("hgb")
    Xe, ye = X.iloc[:30].reset_index(drop=True), y.iloc[:30].reset_index(drop=True)
    base = float(np.mean(tp.predict(Xe) != ye))
    res = otstab.certify(tp, Xe, ye, loss="zero_one", r=base + 0.1, max_nodes=40)
    assert res.info["cost_used"].startswith("auto (default")
    assert res.value_lower > 0
    zero_one, logistic = get_loss("zero_one"), get_loss("logistic")
    assert choose_cost(None, tp, Xe, zero_one, options=("max_nodes", "rtol"))[0] is not None
    assert choose_cost(None, tp, Xe, zero_one, options=("n_directions",))[0] is None
    # a smooth loss of a boosted ensemble takes the DataCost too (a certified interval:
    # tests/test_datacost_tree_smooth.py); a random forest has no margins: encoded, with the
    # warning that R may be meaningless
    assert choose_cost(None, tp, Xe, logistic)[0] is not None
    rf = Pipeline([("pre", tp.steps[0][1]),
                   ("clf", RandomForestClassifier(n_estimators=2, max_depth=2,
                                                  random_state=0))]).fit(X, y)
    with pytest.warns(UserWarning, match="fractional move"):
        cost, how = choose_cost(None, rf, Xe, logistic)
    assert cost is None and "loss='zero_one'" in how and "vanishingly small" in how
    # worst_case_risk's exact oracles are the linear models': encoded there, with the warning
    with pytest.warns(UserWarning, match="fractional move"):
        assert choose_cost(None, tp, Xe, zero_one, trees_too=False)[0] is None
    # a linear pipeline's unsupported default keeps the old note, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lin = make_pipeline(tp.steps[0][1], LogisticRegression(max_iter=500)).fit(X, y)
        assert choose_cost(None, lin, Xe, get_loss("squared"))[1].startswith(
            "encoded (default: cost='auto' is the default only where")


# slow: runs in the newest-versions environment only (xgboost 2.0, the oldest allowed, lacks
# scikit-learn 1.6's __sklearn_tags__ in a Pipeline)
@pytest.mark.slow
def test_german_auto_cost_and_unsupported_options():
    pipe, tp, X, y, num, cat = _german_tree("xgb")
    Xe, ye = X.iloc[:25].reset_index(drop=True), y.iloc[:25].reset_index(drop=True)
    res = otstab.certify(tp, Xe, ye, loss="zero_one", r=0.5, cost="auto", max_nodes=30)
    assert (res.value_lower if res.status == "bounds" else res.value) > 0
    with pytest.raises(ValidationError, match="loss='hinge' needs cost='encoded'"):
        otstab.certify(tp, Xe, ye, loss="hinge", r=0.5, cost="auto")
    with pytest.raises(ValidationError, match="n_directions"):
        otstab.certify(tp, Xe, ye, loss="zero_one", r=0.5, cost="auto", n_directions=3)


def test_certificate_round_trip_under_the_datacost():
    from otstab.certificates import make_certificate, verify_certificate

    X, y = _data(3)
    pipe = _pipe("lgbm", X, y, True)
    Xe, ye = X.iloc[:20].reset_index(drop=True), y.iloc[:20].reset_index(drop=True)
    res = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.6, theta2=0.5,
                         cost=DataCost(**COST))
    cert = make_certificate(res, pipe, Xe, ye)
    rep = verify_certificate(cert, pipe, Xe, ye)
    assert rep.ok, rep.mismatches
    # a tampered certified end is caught by the recomputation
    if res.status == "bounds":
        cert["results"]["value_lower"] = res.value_lower * 1.5 + 1e-3
        assert not verify_certificate(cert, pipe, Xe, ye).ok


def test_bootstrap_replicates_the_enumerated_distances():
    """se="bootstrap" under a DataCost: each replicate is the exact 0/1 dual on the drawn rows'
    distances; with every search complete, these are the enumerated distances, so the
    replicates equal certify_distances on the same draws."""
    from otstab.solve._inference import Bootstrap, resample

    X, y = _data(3)
    # LightGBM: xgboost 2.0 (the oldest allowed) lacks __sklearn_tags__ in a Pipeline
    pipe = _pipe("lgbm", X, y, True)
    Xe, ye = X.iloc[:14].reset_index(drop=True), y.iloc[:14].reset_index(drop=True)
    spec = Bootstrap(n_resamples=12, random_state=3)
    res = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.6, theta2=0.5,
                         cost=DataCost(**COST), max_nodes=5000, rtol=None, se=spec)
    assert res.status == "optimal"
    wrong = np.asarray(pipe.predict(Xe) != ye)
    right = np.flatnonzero(~wrong)
    ref = _brute(pipe, Xe, ye, right, COST)
    d = np.zeros(len(Xe))
    d[right] = [ref[i] for i in right]
    expect = resample(len(Xe), spec, lambda idx: otstab.certify_distances(
        d[idx], 0.6, theta2=0.5, misclassified=wrong[idx]).value)
    inf = res.inference
    assert inf.method == "bootstrap"
    np.testing.assert_allclose(inf.replicates, expect, rtol=1e-9)
    assert inf.value == res.value
