"""CatBoost's oblivious trees in the leaf layout of :mod:`otstab.trees` (issue 29).

Checked against CatBoost itself: the layout's leaf sums equal the model's own
``predict(prediction_type="RawFormulaVal")`` (binary and 3-class, NaN routed by ``nan_mode``
``Min`` and ``Max``), what is not read (categorical features, non-symmetric trees) is refused,
a layout that disagrees with the model is refused, and the certified interval holds the value
computed from distances enumerated over the threshold grid (tests/test_trees.py, where CatBoost
also runs the enumeration soundness tests), also behind a Pipeline under a DataCost
(tests/test_datacost_trees.py's enumeration of every raw row)."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from test_trees import exact_distances, make_data

import otstab
from otstab import bounds, trees
from otstab.errors import InputTypeError
from otstab.modeling._datacost import DataCost

catboost = pytest.importorskip("catboost")


def _cb(seed=0, **kw):
    opts = dict(iterations=12, depth=3, thread_count=1, verbose=0, allow_writing_files=False,
                random_seed=seed)
    opts.update(kw)
    return catboost.CatBoostClassifier(**opts)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("nan_mode", ["Min", "Max"])
def test_leaf_sums_equal_raw_formula_val(k, nan_mode):
    rng = np.random.default_rng(k)
    X = rng.normal(size=(160, 3))
    s = X[:, 0] * X[:, 1] + X[:, 2]
    y = (s > 0).astype(int) if k == 2 else np.digitize(s, [-0.5, 0.5])
    Xt = X.copy()
    Xt[::5, 1] = np.nan  # NaN in training: CatBoost adds a border at -+FLT_MAX for them
    model = _cb(k, nan_mode=nan_mode).fit(Xt, y)
    table = bounds.leaf_table(model, 3, X)
    raw = np.asarray(model.predict(X, prediction_type="RawFormulaVal"), dtype=np.float64)
    raw = np.column_stack([np.zeros(len(raw)), raw]) if raw.ndim == 1 else raw
    assert raw.shape == (160, k)
    # CatBoost sums its leaf values in float64: equal to the float64 rounding of the sum
    tol = 1e-12 * (1 + np.abs(raw).max())
    np.testing.assert_allclose(table.scores(X), raw, rtol=0, atol=tol)
    # rows on both sides of every border (float32 steps) and far out
    Z = [X[0].copy() for _ in range(4)]
    Z[0][0], Z[1][0], Z[2][2], Z[3][2] = -1e30, 1e30, -1e-30, 1e-30
    for lo, hi in zip(table.lo, table.hi):
        for j in range(3):
            for t in (lo[j], hi[j]):
                if np.isfinite(t) and abs(t) < np.finfo(np.float32).max:
                    for v in (t, np.nextafter(np.float32(t), np.float32(np.inf))):
                        z = X[1].copy()
                        z[j] = float(v)
                        Z.append(z)
    Z = np.array(Z)
    np.testing.assert_allclose(table.scores(Z), trees.raw_margins(model, Z), rtol=0, atol=tol)
    # NaN: routed by the feature's nan_value_treatment, reproduced by fill_missing
    Xn = X.copy()
    Xn[::3, 1] = np.nan
    Xn[::4, 0] = np.nan  # a feature trained without NaN (AsIs: left at every border)
    filled = trees.fill_missing(model, Xn)
    assert np.isnan(Xn).sum() > 0 and not np.isnan(filled).any()
    np.testing.assert_allclose(table.scores(filled), trees.raw_margins(model, Xn), rtol=0,
                               atol=tol)
    # the prediction is the argmax of the margins (CatBoost multiclass: one column of labels)
    pred = np.ravel(model.predict(Xn))
    np.testing.assert_array_equal(model.classes_[np.argmax(table.scores(filled), axis=1)], pred)


@pytest.mark.parametrize("labels", [[0.0, 1.0], ["no", "yes"], [-3, 5], [False, True]])
def test_labels_of_any_type(labels):
    X, y = make_data(4, 2, 2, n=40)
    yl = np.array(labels)[y]
    model = _cb(4, iterations=4).fit(X, yl)
    table = bounds.leaf_table(model, 2, X)  # the JSON's class_names match classes_ by value
    assert list(model.classes_) == sorted(labels)
    np.testing.assert_array_equal(model.classes_[np.argmax(table.scores(X), axis=1)],
                                  np.ravel(model.predict(X)))


def test_what_is_not_read_is_refused():
    X, y = make_data(2, 3, 2, n=60)
    Xc = pd.DataFrame(X, columns=["a", "b", "c"])
    Xc["c"] = (X[:, 2] > 0).astype(int)  # a categorical feature (integer codes)
    model = _cb(cat_features=["c"]).fit(Xc, y)
    with pytest.raises(InputTypeError, match="categorical"):
        bounds.leaf_table(model, 3, Xc)
    model = _cb(grow_policy="Depthwise").fit(X, y)
    with pytest.raises(InputTypeError, match="non-symmetric"):
        bounds.leaf_table(model, 3, X)
    with pytest.raises(InputTypeError, match="CatBoost"):
        trees.fill_missing(object(), X)
    # not readable: certify falls back to an upper bound and says so
    res = otstab.certify(model, X, y, r=0.5, loss="zero_one", theta1=1.0, theta2=0.5)
    assert res.status == "bounds" and res.value_lower == 0.0
    assert "no certified lower bound" in res.message


def test_a_layout_that_disagrees_is_refused(monkeypatch):
    X, y = make_data(8, 2, 2, n=60)
    model = _cb(8).fit(X, y)
    bounds.leaf_table(model, 2, X)
    # borders one float32 step too low (a parse that loses a digit)
    monkeypatch.setattr(trees, "_f32_atmost", lambda b: float(np.nextafter(
        np.float32(b), np.float32(-np.inf))))
    with pytest.raises(InputTypeError, match="raw margins"):
        bounds.leaf_table(model, 2, X)


@pytest.mark.parametrize("k", [2, 3])
def test_certified_interval_holds_the_enumerated_value(k):
    X, y = make_data(20 + k, 2, k, n=16)
    model = _cb(k, iterations=8).fit(X, y)
    exact = exact_distances(model, X, y)
    assert np.sum(np.isfinite(exact) & (exact > 0)) > 5
    wrong = np.ravel(model.predict(X)) != y
    for theta2, r in ((math.inf, 0.5), (0.5, 0.7)):
        res = otstab.certify(model, X, y, r=r, loss="zero_one", theta1=1.0, theta2=theta2)
        ref = otstab.certify_distances(exact, r, theta1=1.0, theta2=theta2, misclassified=wrong)
        assert res.value_lower > 0
        assert res.value_lower <= ref.value * (1 + 1e-9) + 1e-12
        assert ref.value <= res.value_upper * (1 + 1e-9) + 1e-12
        assert res.value_lower == pytest.approx(ref.value, rel=1e-9)  # the search completes
        assert "branch-and-bound" in res.message


def test_pipeline_under_a_datacost_equals_the_enumeration():
    from sklearn.compose import ColumnTransformer  # noqa: PLC0415
    from sklearn.pipeline import Pipeline  # noqa: PLC0415
    from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: PLC0415
    from test_datacost_trees import COLOURS, COST, SHAPES, _brute, _data  # noqa: PLC0415

    X, y = _data(3)
    ct = ColumnTransformer([("cat", OneHotEncoder(), ["colour", "shape"]),
                            ("num", StandardScaler(), ["k", "u", "v"])])
    pipe = Pipeline([("pre", ct), ("clf", _cb(0, iterations=6, depth=3))]).fit(X, y)
    Xe, ye = X.iloc[:8].reset_index(drop=True), y.iloc[:8].reset_index(drop=True)
    res = otstab.certify(pipe, Xe, ye, loss="zero_one", r=0.6, theta2=0.5, cost=DataCost(**COST),
                         max_nodes=5000, rtol=None)
    lb = res.info["lower_bound"]
    dlow, dup = lb["dlow"], np.asarray(res.info["dstar"])
    right = np.flatnonzero(pipe.predict(Xe) == ye)
    ref = _brute(pipe, Xe, ye, right, COST)
    assert sum(0 < ref[i] < math.inf for i in right) >= 4  # not a trivial grid
    for i in right:
        assert dlow[i] <= ref[i] * (1 + 1e-9) + 1e-12, (i, dlow[i], ref[i])
        assert dup[i] == pytest.approx(ref[i], rel=1e-9, abs=1e-12)
    d = np.zeros(len(Xe))
    d[right] = [ref[i] for i in right]
    exact = otstab.certify_distances(d, 0.6, theta2=0.5, misclassified=pipe.predict(Xe) != ye)
    assert res.status == "optimal"
    assert res.value == pytest.approx(exact.value, rel=1e-9)
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    assert len(mv) > 0
    rows = mv[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    assert set(rows["colour"]) <= set(COLOURS) and set(rows["shape"]) <= set(SHAPES)
    rows = rows.astype({"k": int, "u": float, "v": float})
    assert np.all(pipe.predict(rows) != np.asarray(ye)[mv["source"]])


@pytest.mark.slow
def test_german_credit_pipeline_under_auto_cost():
    from german import german_pipeline  # noqa: PLC0415
    from sklearn.pipeline import Pipeline  # noqa: PLC0415

    pipe, X, y, num, cat, _ = german_pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tp = Pipeline([("pre", pipe.named_steps["pre"]),
                       ("clf", _cb(0, iterations=10, depth=3))]).fit(X, y)
    Xe, ye = X.iloc[:40].reset_index(drop=True), y.iloc[:40].reset_index(drop=True)
    res = otstab.certify(tp, Xe, ye, loss="zero_one", r=0.5, cost="auto", max_nodes=60)
    lower = res.value_lower if res.status == "bounds" else res.value
    upper = res.value_upper if res.status == "bounds" else res.value
    assert 0 < lower <= upper < math.inf
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    assert len(mv) > 0
    rows = mv[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    rows = rows.astype({c: X[c].dtype for c in num})
    enc_cat = tp.named_steps["pre"].named_transformers_["cat"]
    for j, c in enumerate(cat):
        assert set(rows[c]) <= set(enc_cat.categories_[j])
    assert np.all(tp.predict(pd.DataFrame(rows)) != np.asarray(ye)[mv["source"]])
