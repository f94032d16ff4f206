"""Raw variables of scikit-learn Pipelines (otstab.pipeline): groups="auto", raw names in
features=, to_frame(raw=True). Every inverse is checked against the pipeline's own forward
transform (sklearn), never against otstab's inversion code."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.decomposition import PCA
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import MinMaxScaler, OneHotEncoder, OrdinalEncoder, StandardScaler

import otstab
from otstab import pipeline
from otstab.datasets import load_adult, load_german
from otstab.errors import ValidationError


@pytest.fixture(scope="module")
def german():
    df = load_german(raw=True)
    X, y = df.drop(columns="credit"), df["credit"]
    num = [c for c in X.columns if X[c].dtype.kind in "if"]
    cat = [c for c in X.columns if c not in num]
    ct = ColumnTransformer([("num", StandardScaler(), num),
                            ("cat", OneHotEncoder(handle_unknown="ignore"), cat)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = Pipeline([("pre", ct), ("clf", LogisticRegression(max_iter=2000))]).fit(X, y)
        res = otstab.certify(model, X, y, loss="zero_one", r=0.4)
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
    kw = dict(loss="zero_one", r=0.4)
    assert otstab.certify(model, X, y, features=["duration"], **kw).value == \
        otstab.certify(model, X, y, features=["num__duration"], **kw).value
    assert otstab.certify(model, X, y, features=["purpose", "amount"], **kw).value == \
        otstab.certify(model, X, y, features=groups["purpose"] + ["num__amount"], **kw).value
    with pytest.raises(ValidationError, match="num__duration"):
        otstab.certify(model, X, y, features=["durration"], **kw)


def test_feature_stability_auto_groups(german):
    model, X, y, num, cat, res = german
    t = otstab.feature_stability(model, X, y, loss="zero_one", r=0.4, groups="auto")
    assert sorted(t["feature"]) == sorted(X.columns)
    row = t.set_index("feature").loc["purpose"]
    assert row["score"] == pytest.approx(otstab.certify(
        model, X, y, loss="zero_one", r=0.4, features=list(row["columns"])).value, rel=1e-9)
    sub = otstab.feature_stability(model, X, y, loss="zero_one", r=0.4, features=["age"])
    assert list(sub["feature"]) == ["age"]
    with pytest.raises(ValidationError, match="groups"):
        otstab.feature_stability(model, X, y, loss="zero_one", r=0.4, groups="raw")


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
    res = otstab.certify(model, X, y, loss="hinge", r=1.0)
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
        otstab.certify(model, X, y, loss="hinge", r=1.0, features=["note"])


def test_not_invertible_preprocessing_is_refused():
    X, y = _toy()
    Xn = X[["income", "note"]]
    model = make_pipeline(StandardScaler(), PCA(2), LogisticRegression()).fit(Xn, y)
    res = otstab.certify(model, Xn, y, loss="hinge", r=1.0)
    assert pipeline.raw_map(model, res.feature_names) is None
    with pytest.raises(ValidationError, match="cannot be inverted"):
        res.to_frame(raw=True)
    with pytest.raises(ValidationError, match="groups='auto'"):
        otstab.feature_stability(model, Xn, y, loss="hinge", r=1.0, groups="auto")


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
