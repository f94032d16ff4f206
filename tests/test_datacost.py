"""otstab.DataCost: a transport cost on the raw variables (issue 28), and the exact 0/1 path of
linear models under it. The knapsack is checked against an enumeration of every option; the
certificates against brute force over every combination of levels scored by the pipeline's
own decision_function, and the 0/1 dual of otstab.certify_distances on those distances."""

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

import otstab
from otstab.datacost import DataCost
from otstab.datasets import load_german
from otstab.errors import ValidationError

# ------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def german():
    df = load_german(raw=True)
    X, y = df.drop(columns="credit"), df["credit"]
    num = [c for c in X.columns if X[c].dtype.kind in "if"]
    cat = [c for c in X.columns if c not in num]
    ct = ColumnTransformer([("num", StandardScaler(), num),
                            ("cat", OneHotEncoder(handle_unknown="ignore"), cat)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = Pipeline([("pre", ct), ("clf", LogisticRegression(max_iter=2000))]).fit(X, y)
    return pipe, X, y, num, cat


def _small(seed=0, n=30):
    """Two categorical (3 and 4 levels) and one ordinal variable, two continuous, one integer;
    a logistic regression on them."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({
        "colour": rng.choice(["red", "green", "blue"], n),
        "shape": rng.choice(["a", "b", "c", "d"], n),
        "size": rng.choice(["S", "M", "L"], n),
        "u": rng.normal(0, 2, n),
        "v": rng.normal(1, 1, n),
        "k": rng.integers(0, 6, n),
    })
    s = (X["u"] - 0.5 * X["v"] + 0.4 * X["k"] - 1.0 + (X["colour"] == "red") * 1.2
         - (X["shape"] == "b") * 0.8 + X["size"].map({"S": 0, "M": 0.5, "L": 1.0}))
    y = (s + rng.normal(0, 1.5, n) > 0).astype(int)
    ct = ColumnTransformer([
        ("num", StandardScaler(), ["u", "v", "k"]),
        ("cat", OneHotEncoder(), ["colour", "shape"]),
        ("ord", OrdinalEncoder(categories=[["S", "M", "L"]]), ["size"])])
    pipe = Pipeline([("pre", ct), ("clf", LogisticRegression(C=10.0))]).fit(X, y)
    return pipe, X, y


# ------------------------------------------------------------------------------------------
# the spec


def test_resolve_german_auto_keeps_the_scalers_numbers(german):
    pipe, X, y, num, cat = german
    rc = DataCost().resolve(pipe, X)
    sc = pipe.named_steps["pre"].named_transformers_["num"]
    for v in rc.variables:
        if v.name in num:
            assert v.kind == "integer"  # German's numeric columns are all int64
            assert v.scale == pytest.approx(sc.scale_[num.index(v.name)], rel=1e-14)
        else:
            assert v.kind == "categorical"
            enc = pipe.named_steps["pre"].named_transformers_["cat"]
            assert v.levels == list(enc.categories_[cat.index(v.name)])
            assert v.switch == 1.0


def test_resolve_infers_std_scale_and_ordinal():
    X = pd.DataFrame({"a": [0.5, 1.5, 2.0, 4.0], "b": [1.0, 2.0, 2.0, 7.0],
                      "c": pd.Categorical(["lo", "hi", "mid", "lo"],
                                          categories=["lo", "mid", "hi"], ordered=True)})
    model = otstab.LinearModel([1.0, -1.0])
    rc = DataCost().resolve(model, X[["a", "b"]])
    assert rc.variable("a").kind == "numeric"
    assert rc.variable("a").scale == pytest.approx(float(np.std(X["a"])))
    assert rc.variable("b").kind == "integer"  # integral floats
    pipe = _small()[0]
    rc = DataCost().resolve(pipe, _small()[1])
    assert rc.variable("size").kind == "ordinal"
    assert rc.variable("size").levels == ["S", "M", "L"]


def test_unknown_names_are_refused_with_suggestions(german):
    pipe, X, *_ = german
    with pytest.raises(ValidationError, match="immutable: unknown variable 'agee'.*'age'"):
        DataCost(immutable=["agee"]).resolve(pipe, X)
    with pytest.raises(ValidationError, match="switch.*categorical"):
        DataCost(switch={"age": 2.0}).resolve(pipe, X)
    with pytest.raises(ValidationError, match=r"bounds\['purpose'\]"):
        DataCost(bounds={"purpose": (0, 1)}).resolve(pipe, X)
    with pytest.raises(ValidationError, match="scale"):
        DataCost(scale={"purpose": 2.0}).resolve(pipe, X)
    with pytest.raises(ValidationError, match="level 'space'"):
        DataCost(switch={"purpose": {"car (new)": {"space": 1.0}}}).resolve(pipe, X)


@pytest.mark.parametrize("kwargs, match", [
    ({"scale": {"a": -1.0}}, r"scale\['a'\]"),
    ({"scale": {"a": math.inf}}, r"scale\['a'\]"),
    ({"bounds": {"a": (3, 1)}}, "low 3.0 > high 1.0"),
    ({"bounds": {"a": 5}}, r"bounds\['a'\] must be a pair"),
    ({"bounds": "everything"}, "bounds must be"),
    ({"increase_only": ["a"], "decrease_only": ["a"]}, "both name"),
    ({"kinds": {"a": "text"}}, r"kinds\['a'\]"),
    ({"price": {"a": 0}}, r"price\['a'\]"),
    ({"switch": {"a": "x"}}, r"switch\['a'\]"),
    ({"immutable": [3]}, "immutable must hold column names"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        DataCost(**kwargs)


def test_to_dict_round_trips_through_json(german):
    pipe, X, *_ = german
    spec = DataCost(scale={"amount": 1000.0}, switch={
        "purpose": 0.5, "housing": {"own": {"rent": 2.0}, "rent": {"own": math.inf}}},
        immutable=["age", "personal_status_sex"], bounds={"amount": (0, None),
                                                          "duration": "observed"},
        increase_only=["duration"], price={"number_credits": 3.0})
    back = DataCost.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec
    rc = spec.resolve(pipe, X)
    explicit = DataCost.from_dict(json.loads(json.dumps(rc.to_dict())))
    assert explicit.resolve(pipe, X).to_dict() == rc.to_dict()
    text = rc.describe()
    assert "age: integer, immutable" in text and "increase only" in text
    assert "within [0, inf]" in text and "a level-to-level matrix" in text
    assert "purpose" in spec.describe()


def test_cost_of_rows_follows_the_definition(german):
    pipe, X, *_ = german
    spec = DataCost(immutable=["age"], bounds={"amount": (250, None)},
                    increase_only=["duration"], switch={"purpose": 0.5},
                    price={"installment_rate": 2.0})
    rc = spec.resolve(pipe, X)
    X0 = X.iloc[:6].reset_index(drop=True)
    X1 = X0.copy()
    sd = {v.name: v.scale for v in rc.variables}
    X1.loc[0, "amount"] = X0.loc[0, "amount"] + 300  # numeric move
    X1.loc[1, "purpose"] = "education" if X0.loc[1, "purpose"] != "education" else "retraining"
    X1.loc[2, "installment_rate"] = X0.loc[2, "installment_rate"] - 1
    X1.loc[3, "age"] = X0.loc[3, "age"] + 1  # immutable
    X1.loc[4, "duration"] = X0.loc[4, "duration"] - 1  # wrong direction
    X1.loc[5, "amount"] = 100  # below its bound
    c = rc.cost(X0, X1)
    assert c[0] == pytest.approx((300 / sd["amount"]) ** 2, rel=1e-14)
    assert c[1] == 0.5
    assert c[2] == pytest.approx(2.0 * (1 / sd["installment_rate"]) ** 2, rel=1e-14)
    assert np.all(np.isinf(c[3:]))
    X2 = X0.copy()
    X2["purpose"] = "space travel"  # not a level
    X2.loc[0, "purpose"] = X0.loc[0, "purpose"]
    assert np.all(np.isinf(rc.cost(X0, X2)[1:])) and rc.cost(X0, X2)[0] == 0.0
    X3 = X0.astype({"duration": float})
    X3.loc[0, "duration"] += 0.5  # fractional integer
    assert np.isinf(rc.cost(X0, X3)[0])
    obs = DataCost(bounds="observed").resolve(pipe, X)
    assert obs.variable("age").lo == X["age"].min() and obs.variable("age").hi == X["age"].max()
