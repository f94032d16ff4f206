"""Raw variables of scikit-learn Pipelines (otstab.pipeline): groups="auto", raw names in
features=, to_frame(raw=True). Every inverse is checked against the pipeline's own forward
transform (sklearn), never against otstab's inversion code."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from german import german_pipeline
from sklearn.compose import ColumnTransformer
from sklearn.decomposition import PCA
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import (
    MinMaxScaler,
    OneHotEncoder,
    OrdinalEncoder,
    PowerTransformer,
    StandardScaler,
)

import otstab
from otstab import pipeline
from otstab.datasets import load_adult
from otstab.errors import ValidationError


@pytest.fixture(scope="module")
def german():
    model, X, y, num, cat, _ = german_pipeline(warn="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = otstab.certify(model, X, y, loss="zero_one", r=0.4, cost="encoded")
    return model, X, y, num, cat, res


def test_auto_groups_are_the_raw_columns(german):
    model, X, y, num, cat, res = german
    groups = pipeline.auto_groups(model, res.feature_names)
    assert list(groups) == list(X.columns)  # exactly the user's names, in their order
    # levels with " : " (personal_status_sex) stay one variable with the encoder's columns
    pss = sorted(X["personal_status_sex"].unique())
    assert groups["personal_status_sex"] == [f"cat__personal_status_sex_{v}" for v in pss]
    assert groups["amount"] == ["num__amount"]


def test_to_frame_raw_round_trips_through_the_pipeline(german):
    model, X, y, num, cat, res = german
    f = res.to_frame(raw=True)
    for c in X.columns:
        assert c in f.columns and f"{c}*" in f.columns
    for c in cat:  # only categories of the data
        assert set(f[f"{c}*"]) <= set(X[c])
    moved = f["distance2"] > 0
    assert moved.any() and (~moved).any()
    # unmoved atoms: the raw rows themselves, exactly
    src = f.loc[~moved, "source"].to_numpy()
    for c in X.columns:
        assert list(f.loc[~moved, f"{c}*"]) == list(X[c].iloc[src])
    # moved atoms: the pipeline's forward transform of the raw row gives back x* on the numeric
    # columns (scalers inverted exactly), and the category is the largest moved indicator
    raw_star = pd.DataFrame({c: f.loc[moved, f"{c}*"].to_numpy() for c in X.columns})
    raw_star[num] = raw_star[num].astype(float)
    Z = model[:-1].transform(raw_star)
    Xs = res.X_star[moved.to_numpy()]
    names = list(res.feature_names)
    jn = [names.index(f"num__{c}") for c in num]
    np.testing.assert_allclose(Z[:, jn], Xs[:, jn], rtol=1e-12, atol=1e-12)
    for c in cat:
        cols = [j for j, n in enumerate(names) if n.startswith(f"cat__{c}_")]
        best = [names[cols[k]][len(f"cat__{c}_"):] for k in np.argmax(Xs[:, cols], axis=1)]
        assert list(raw_star[c]) == best
        assert all(t.startswith(b) or t.split(": ")[0] == b
                   for t, b in zip(f.loc[moved, f"{c}* indicators"], best))
    assert "raw units" in f.attrs["note"]
    # the default frame is unchanged: encoded columns
    assert "num__amount*" in res.to_frame().columns


def test_raw_feature_names_select_their_encoded_columns(german):
    model, X, y, num, cat, res = german
    groups = pipeline.auto_groups(model, res.feature_names)
    kw = dict(loss="zero_one", r=0.4, cost="encoded")  # (the encoded columns' selection)
    assert otstab.certify(model, X, y, features=["duration"], **kw).value == \
        otstab.certify(model, X, y, features=["num__duration"], **kw).value
    assert otstab.certify(model, X, y, features=["purpose", "amount"], **kw).value == \
        otstab.certify(model, X, y, features=groups["purpose"] + ["num__amount"], **kw).value
    with pytest.raises(ValidationError, match="num__duration"):
        otstab.certify(model, X, y, features=["durration"], **kw)


def test_feature_stability_auto_groups(german):
    model, X, y, num, cat, res = german
    t = otstab.feature_stability(model, X, y, loss="zero_one", r=0.4,
                                 feature_groups="auto").to_frame()
    assert sorted(t["feature"]) == sorted(X.columns)
    row = t.set_index("feature").loc["purpose"]
    assert row["score"] == pytest.approx(otstab.certify(
        model, X, y, loss="zero_one", r=0.4, features=list(row["columns"])).value, rel=1e-9)
    sub = otstab.feature_stability(model, X, y, loss="zero_one", r=0.4, features=["age"]).to_frame()
    assert list(sub["feature"]) == ["age"]
    with pytest.raises(ValidationError, match="groups"):
        otstab.feature_stability(model, X, y, loss="zero_one", r=0.4,
                                 feature_groups="raw").to_frame()


def _toy(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({
        "income": rng.normal(3000, 800, n),
        "grade": rng.choice(["low", "mid", "high"], n),
        "city": rng.choice(["A : north", "B: south", "C"], n),
        "note": rng.normal(size=n),  # dropped by the model
    })
    y = ((X["income"] > 3000) ^ (X["city"] == "C") ^ (rng.random(n) < 0.1)).astype(int)
    return X, y


def test_ordinal_dropped_imputer_and_drop_first():
    X, y = _toy()
    ct = ColumnTransformer([
        ("num", make_pipeline(SimpleImputer(), MinMaxScaler()), ["income"]),
        ("ord", OrdinalEncoder(categories=[["low", "mid", "high"]]), ["grade"]),
        ("cat", OneHotEncoder(drop="first"), ["city"])], remainder="drop")
    model = Pipeline([("pre", ct), ("clf", LogisticRegression())]).fit(X, y)
    res = otstab.certify(model, X, y, loss="hinge", r=1.0, cost="encoded")
    groups = pipeline.auto_groups(model, res.feature_names)
    assert list(groups) == ["income", "grade", "city"]  # "note" is never read
    f = res.to_frame(raw=True)
    assert list(f["note*"]) == list(X["note"].iloc[f["source"]])  # passed through
    assert set(f["grade*"]) <= {"low", "mid", "high"}
    assert set(f["city*"]) <= set(X["city"])
    moved = (f["distance2"] > 0).to_numpy()
    assert moved.any()
    raw_star = f.loc[moved, ["income*", "grade*", "city*", "note*"]]
    raw_star.columns = list(X.columns)
    Z = model[:-1].transform(raw_star.astype({"income": float}))
    np.testing.assert_allclose(Z[:, 0], res.X_star[moved, 0], rtol=1e-12, atol=1e-12)
    # the ordinal code rounds to the nearest category
    np.testing.assert_array_equal(Z[:, 1], np.clip(np.rint(res.X_star[moved, 1]), 0, 2))
    with pytest.raises(ValidationError, match="drops"):
        otstab.certify(model, X, y, loss="hinge", r=1.0, features=["note"], cost="encoded")


def test_not_invertible_preprocessing_is_refused():
    X, y = _toy()
    Xn = X[["income", "note"]]
    model = make_pipeline(StandardScaler(), PCA(2), LogisticRegression()).fit(Xn, y)
    res = otstab.certify(model, Xn, y, loss="hinge", r=1.0)
    assert pipeline.raw_map(model, res.feature_names) is None
    with pytest.raises(ValidationError, match="cannot be inverted"):
        res.to_frame(raw=True)
    with pytest.raises(ValidationError, match="groups='auto'"):
        otstab.feature_stability(model, Xn, y, loss="hinge", r=1.0,
                                 feature_groups="auto").to_frame()


def test_plain_scaler_pipeline_on_arrays():
    X, y = _toy()
    A = X[["income", "note"]].to_numpy()
    model = make_pipeline(StandardScaler(), LogisticRegression()).fit(A, y)
    res = otstab.certify(model, A, y, loss="hinge", r=1.0)
    f = res.to_frame(raw=True)
    assert {"x0*", "x1*"} <= set(f.columns)
    back = model[:-1].transform(f[["x0*", "x1*"]].to_numpy(float))
    np.testing.assert_allclose(back, res.X_star, rtol=1e-12, atol=1e-12)


def test_named_one_hot_columns_without_pipeline():
    df = load_adult().sample(400, random_state=1)
    X, y = df.drop(columns="income"), df["income"]
    model = LogisticRegression(max_iter=1000).fit(X, y)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.4)
    f = res.to_frame(raw=True)
    race_cols = [c for c in X.columns if c.startswith("race: ")]
    assert set(f["race*"]) <= {c[len("race: "):] for c in race_cols}
    # the moved category is the largest race indicator of x*
    names = list(res.feature_names)
    idx = [names.index(c) for c in race_cols]
    best = [race_cols[k][len("race: "):] for k in np.argmax(res.X_star[:, idx], axis=1)]
    assert list(f["race*"]) == best
    np.testing.assert_array_equal(f["age*"], res.X_star[:, names.index("age")])


def test_caller_frame_changes_do_not_reach_the_result(german):
    model, X, y, num, cat, _ = german
    Xc = X.copy()
    res = otstab.certify(model, Xc, y, loss="zero_one", r=0.4)
    Xc.loc[:, "amount"] = 0
    assert list(res.to_frame(raw=True)["amount"]) == list(X["amount"].iloc[
        res.to_frame()["source"]])


def test_raw_prices_are_per_unit_of_the_raw_variable(german):
    """feature_costs by raw name: the audited moving cost of Q* equals the cost recomputed in
    raw units through sklearn's own inverse of the scaler (price per squared raw unit), each
    indicator of a priced one-hot block at its price, other columns at 1, age unmoved."""
    model, X, y, num, cat, res0 = german
    costs = {"age": math.inf, "purpose": 2.0, "duration": 0.01}
    res = otstab.certify(model, X, y, loss="zero_one", r=0.4, feature_costs=costs)
    assert res.status == "optimal" and res.value > res0.value
    names = res.feature_names
    src = np.asarray(res.source)
    Z0, Z1 = np.asarray(res.X)[src], np.asarray(res.X_star)
    ncols = [names.index(f"num__{c}") for c in num]
    scaler = model.named_steps["pre"].named_transformers_["num"]
    raw0, raw1 = scaler.inverse_transform(Z0[:, ncols]), scaler.inverse_transform(Z1[:, ncols])
    assert np.array_equal(raw0[:, num.index("age")], raw1[:, num.index("age")])
    dur = num.index("duration")
    cost = 0.01 * (raw1[:, dur] - raw0[:, dur]) ** 2
    purpose = [j for j, nm in enumerate(names) if nm.startswith("cat__purpose_")]
    other = [j for j in range(len(names)) if j not in purpose and j not in ncols]
    other += [ncols[k] for k, c in enumerate(num) if c not in ("age", "duration")]
    cost += 2.0 * np.sum((Z1[:, purpose] - Z0[:, purpose]) ** 2, axis=1)
    cost += np.sum((Z1[:, other] - Z0[:, other]) ** 2, axis=1)
    moving = float(np.sum(np.asarray(res.mass) * np.asarray(res.weights) * cost)) / len(y)
    assert cost.max() > 0
    assert moving == pytest.approx(res.decomposition["cost_moving"], rel=1e-6)
    # feature_stability takes the same raw prices: its purpose score is certify's
    table = otstab.feature_stability(model, X, y, loss="zero_one", r=0.4, feature_groups="auto",
                                     feature_costs=costs).to_frame()
    row = table.set_index("feature").loc["purpose"]
    ref = otstab.certify(model, X, y, loss="zero_one", r=0.4, features=["purpose"],
                         feature_costs=costs)
    assert row.score == pytest.approx(ref.value, rel=1e-9)
    assert table.set_index("feature").loc["age", "ignored"]


@pytest.mark.parametrize("costs, match", [
    ({"durration": 2.0}, "did you mean 'duration'"),
    ({"duration": 2.0, "num__duration": 3.0}, "twice"),
])
def test_bad_raw_prices_are_refused(german, costs, match):
    model, X, y, *_ = german
    with pytest.raises(ValidationError, match=match):
        otstab.certify(model, X, y, loss="zero_one", r=0.4, feature_costs=costs)


def test_raw_prices_need_an_affine_preprocessing():
    """A raw price is refused through a nonlinear transformer (no constant price per raw unit)
    and for a dropped column; the encoded name is accepted."""
    X, y = _toy()
    ct = ColumnTransformer([("num", PowerTransformer(), ["income"]),
                            ("cat", OneHotEncoder(), ["grade", "city"])], remainder="drop")
    model = make_pipeline(ct, LogisticRegression()).fit(X, y)
    with pytest.raises(ValidationError, match="nonlinearly.*'num__income'"):
        otstab.certify(model, X, y, loss="zero_one", r=0.4, feature_costs={"income": 2.0})
    with pytest.raises(ValidationError, match="drops"):
        otstab.certify(model, X, y, loss="zero_one", r=0.4, feature_costs={"note": 2.0})
    res = otstab.certify(model, X, y, loss="zero_one", r=0.4,
                         feature_costs={"num__income": math.inf})
    src = np.asarray(res.source)
    assert np.array_equal(np.asarray(res.X_star)[:, 0], np.asarray(res.X)[src, 0])


def test_slopes_match_the_pipelines_own_transform():
    """RawMap.slopes (dz/dx per encoded column) against a finite difference of sklearn's
    transform (exact for affine scalers), with a scaler after the ColumnTransformer too."""
    X, y = _toy()
    ct = ColumnTransformer([("num", MinMaxScaler(), ["income"]),
                            ("cat", OneHotEncoder(sparse_output=False), ["grade"])])
    model = make_pipeline(ct, StandardScaler(), LogisticRegression()).fit(X, y)
    names = [str(c) for c in model[:-1].get_feature_names_out()]
    rmap = pipeline.raw_map(model, names)
    X1 = X.copy()
    X1["income"] += 100.0
    dz = (model[:-1].transform(X1) - model[:-1].transform(X)) / 100.0
    (j, slope), = rmap.slopes("income").items()
    assert slope == pytest.approx(dz[0, j], rel=1e-9)
    assert np.all(dz[:, j] == pytest.approx(slope, rel=1e-9))
    post = model[1].scale_  # an indicator moves 1/scale_ of the standardised column per unit
    for j, sl in rmap.slopes("grade").items():
        assert sl == pytest.approx(1.0 / post[j], rel=1e-12)


def test_categories_and_step_names_of_each_raw_variable():
    """RawMap.categories against the raw column's own distinct values (two variables sharing
    one encoder, and an ordinal one), RawMap.step_names against the pipeline as built, and
    raw_column_names against the frame the model was fitted on."""
    X, y = _toy()
    ct = ColumnTransformer([("num", make_pipeline(SimpleImputer(), MinMaxScaler()), ["income"]),
                            ("cat", OneHotEncoder(sparse_output=False), ["grade", "city"]),
                            ("ord", OrdinalEncoder(), ["note"])])
    X = X.assign(note=np.where(X["note"] > 0, "yes", "no"))
    model = make_pipeline(ct, StandardScaler(), LogisticRegression()).fit(X, y)
    names = [str(c) for c in model[:-1].get_feature_names_out()]
    rmap = pipeline.raw_map(model, names)
    for name in ("grade", "city", "note"):
        assert rmap.categories(name) == sorted(X[name].unique()), name
    assert rmap.categories("income") is None
    assert rmap.step_names("income") == ["SimpleImputer", "MinMaxScaler", "StandardScaler"]
    assert rmap.step_names("city") == ["OneHotEncoder", "StandardScaler"]
    assert pipeline.raw_column_names(model) == list(X.columns)
    assert pipeline.raw_column_names(LogisticRegression().fit(X[["income"]].to_numpy(), y)) \
        == ["x0"]
