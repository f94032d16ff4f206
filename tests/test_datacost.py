"""otstab.DataCost: a transport cost on the raw variables (issue 28), and the exact 0/1 path of
linear models under it. The knapsack is checked against an enumeration of every option; the
certificates against brute force over every combination of levels scored by the pipeline's
own decision_function, and the 0/1 dual of otstab.certify_distances on those distances."""

import itertools
import json
import math
import pickle

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
from otstab_solvers.knapsack import solve_one
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

import otstab
from otstab.errors import ValidationError
from otstab.modeling._datacost import DataCost

# ------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def german():
    return german_pipeline()[:5]


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
    assert "observed range" in DataCost(bounds="observed").describe()


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


def test_cost_argument_is_checked():
    with pytest.raises(ValidationError, match="cost must be"):
        otstab.certify(otstab.LinearModel([1.0]), [[1.0]], [1], loss="zero_one", r=0.5,
                       cost="raw")


# ------------------------------------------------------------------------------------------
# the knapsack against an enumeration of every option


def _water(R, conts):
    """Least cost of gain >= R from continuous (Q, U) pieces, by bisection on the multiplier
    (independent of the solver's breakpoint walk)."""
    if R <= 0:
        return 0.0
    if sum(U for _, U in conts) < R:
        return math.inf
    lo, hi = 0.0, 1.0
    while sum(min(hi / (2 * Q), U) for Q, U in conts) < R:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if sum(min(mid / (2 * Q), U) for Q, U in conts) < R:
            lo = mid
        else:
            hi = mid
    return sum(Q * min(hi / (2 * Q), U) ** 2 for Q, U in conts)


def _enumerate(need, fin, ints, conts):
    best = math.inf
    kr = [range(int(min(K, math.ceil(need / a) + 1)) + 1) for a, q, K in ints]
    for ch in itertools.product(*[range(-1, len(o)) for o in fin]):
        g = sum(fin[v][j][0] for v, j in enumerate(ch) if j >= 0)
        c = sum(fin[v][j][1] for v, j in enumerate(ch) if j >= 0)
        for ks in itertools.product(*kr):
            gg = g + sum(a * k for (a, _, _), k in zip(ints, ks))
            cc = c + sum(q * k * k for (_, q, _), k in zip(ints, ks))
            best = min(best, cc + _water(need - gg, conts))
    return best


@pytest.mark.parametrize("seed, count", [
    (1, 15), pytest.param(2, 300, marks=pytest.mark.slow)])
def test_knapsack_equals_enumeration(seed, count):
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(count):
        fin = [[(float(rng.normal()), float(rng.choice([1.0, rng.uniform(0.2, 2), math.inf],
                                                        p=[.5, .4, .1])))
                for _ in range(rng.integers(2, 5))] for _ in range(rng.integers(0, 4))]
        ints = [(float(rng.uniform(0.05, 1)), float(rng.uniform(0.01, 1)),
                 float(rng.choice([math.inf, rng.integers(0, 6)])))
                for _ in range(rng.integers(0, 3))]
        conts = [(float(rng.uniform(0.1, 3)), float(rng.choice([math.inf, rng.uniform(0, 1.5)])))
                 for _ in range(rng.integers(0, 3))]
        need = float(rng.uniform(0.01, 3))
        cost, choices, steps, gains = solve_one(need, fin, ints, conts)
        ref = _enumerate(need, fin, ints, conts)
        if math.isinf(ref):
            assert math.isinf(cost)
            continue
        worst = max(worst, abs(cost - ref) / ref)
        # the returned move reaches the need at the returned cost
        g = sum(fin[v][j][0] for v, j in enumerate(choices) if j >= 0) + \
            sum(a * k for (a, _, _), k in zip(ints, steps)) + sum(gains)
        c = sum(fin[v][j][1] for v, j in enumerate(choices) if j >= 0) + \
            sum(q * k * k for (_, q, _), k in zip(ints, steps)) + \
            sum(Q * x * x for (Q, _), x in zip(conts, gains))
        assert g >= need * (1 - 1e-12) and c == pytest.approx(cost, rel=1e-12)
        assert all(float(k).is_integer() for k in steps)
    assert worst <= 1e-9


# ------------------------------------------------------------------------------------------
# certificates against brute force over every combination of levels


SMALL_COST = dict(bounds={"u": (-4.0, 4.0), "k": (0, 8)}, decrease_only=["v"],
                  switch={"shape": 0.7, "colour": {"red": {"green": 0.5, "blue": 2.0},
                                                   "green": {"red": 1.5, "blue": 1.0},
                                                   "blue": {"red": 0.8}}},
                  price={"size": 0.6})


def _brute_distances(pipe, X, y, need, rc):
    """d*_i by enumerating every (colour, shape, size, k) scored by decision_function, the
    continuous u, v moved in closed form (bisection) within their bounds and directions."""
    sign = np.where(np.asarray(y) == pipe.classes_[1], 1.0, -1.0)
    s0 = pipe.decision_function(X)
    cols = {v.name: v for v in rc.variables}
    rows = np.flatnonzero(need > 0)
    X0, F, m = _every_level(X, cols, rows)
    src = np.repeat(rows, m)
    gain = -sign[src] * (pipe.decision_function(F) - s0[src])
    c = rc.cost(X0, F)
    slopes = _unit_slopes(pipe, X, s0)
    out = np.zeros(len(X))
    for pos, i in enumerate(rows):
        conts = [_continuous_option(cols[nm], X, i, float(slopes[nm][i]), -sign[i])
                 for nm in ("u", "v")]
        sl = slice(pos * m, (pos + 1) * m)
        out[i] = float(np.min(c[sl] + _water_many(need[i] - gain[sl], conts)))
    return out


def _every_level(X, cols, rows):
    """(X0, F, m): each of ``rows`` repeated once per combination of the discrete variables'
    levels (colour, shape, size, k in 0..8), F holding those combinations."""
    combos = list(itertools.product(cols["colour"].levels, cols["shape"].levels,
                                    cols["size"].levels, range(0, 9)))
    m = len(combos)
    X0 = X.iloc[np.repeat(rows, m)].reset_index(drop=True)
    F = X0.copy()
    for k, nm in enumerate(("colour", "shape", "size", "k")):
        F[nm] = [c[k] for c in combos] * rows.size
    return X0, F, m


def _unit_slopes(pipe, X, s0):
    """The change of the decision function per unit of each continuous variable."""
    slopes = {}
    for nm in ("u", "v"):
        step = X.copy()
        step[nm] = step[nm] + 1.0
        slopes[nm] = pipe.decision_function(step) - s0
    return slopes


def _continuous_option(v, X, i, a, toward):
    """(price per squared unit of gain, largest gain) of moving row i's continuous variable
    ``v`` whose score slope is ``a``, in the direction that helps (sign of ``toward * a``),
    within its bounds and allowed direction."""
    t = np.sign(toward * a)
    x = float(X[v.name].iloc[i])
    room = (max(v.hi, x) - x) if t > 0 else (x - min(v.lo, x))
    if v.direction and t != v.direction:
        room = 0.0
    return v.price / (v.scale * a) ** 2, abs(a) * room


def _water_many(R, conts):
    """:func:`_water` for an array of needs (vectorised bisection on the multiplier)."""
    R = np.asarray(R, dtype=np.float64)
    total = sum(U for _, U in conts)
    lo, hi = np.zeros_like(R), np.ones_like(R)
    for _ in range(2000):
        short = sum(np.minimum(hi / (2 * Q), U) for Q, U in conts) < R
        if not (short & (R <= total)).any():
            break
        hi = np.where(short, 2 * hi, hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        short = sum(np.minimum(mid / (2 * Q), U) for Q, U in conts) < R
        lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
    cost = sum(Q * np.minimum(hi / (2 * Q), U) ** 2 for Q, U in conts)
    return np.where(R <= 0, 0.0, np.where(R > total, math.inf, cost))


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("chi2", 0.5), ("kl", math.inf)])
def test_small_pipeline_equals_brute_force(divergence, theta2):
    pipe, X, y = _small()
    cost = DataCost(**SMALL_COST)
    rc = cost.resolve(pipe, X)
    r = 0.55
    res = otstab.certify(pipe, X, y, loss="zero_one", r=r, theta1=1.0, theta2=theta2,
                         divergence=divergence, cost=cost)
    assert res.status == "optimal"
    need = res.info["need"]
    wrong = pipe.predict(X) != np.asarray(y)
    # the need is the margin plus a relative 1e-9 push (and a few hundred ulps)
    margin = np.abs(pipe.decision_function(X))
    assert np.all(need[~wrong] >= margin[~wrong])
    assert np.all(need[~wrong] <= margin[~wrong] * (1 + 2e-9) + 1e-12)
    ref = _brute_distances(pipe, X, y, need, rc)
    d = np.asarray(res.info["dstar"])
    np.testing.assert_allclose(d, ref, rtol=1e-9, atol=0)
    base = otstab.certify_distances(ref, r, theta1=1.0, theta2=theta2, divergence=divergence,
                                    misclassified=wrong)
    assert res.value == pytest.approx(base.value, rel=1e-9)
    # Q*: every moved atom is a valid raw row, misclassified by the pipeline, at cost d*
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    assert len(mv) > 0
    np.testing.assert_allclose(mv["cost"].to_numpy(), ref[mv["source"].to_numpy()], rtol=1e-9)
    rows = mv[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    assert np.all(pipe.predict(rows.astype({"u": float, "v": float, "k": int}))
                  != np.asarray(y)[mv["source"]])
    assert set(rows["colour"]) <= {"red", "green", "blue"} and set(rows["size"]) <= {"S", "M", "L"}
    assert np.all(rows["k"].astype(float) % 1 == 0) and rows["k"].between(0, 8).all()
    assert np.all(rows["v"].astype(float) <= mv["v"].astype(float))
    # the audit: cost and risk of Q* from the rows alone
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    n = len(X)
    moved_cost = float(np.sum(m * w * f["cost"])) / n
    phi = 0.0 if math.isinf(theta2) else theta2 * float(
        np.sum(m * (w * np.log(w) - w + 1 if divergence == "kl" else (w - 1) ** 2))) / n
    assert moved_cost + phi == pytest.approx(res.value, rel=1e-6)
    assert float(np.sum(m * w * f["loss*"])) / n >= r * (1 - 1e-8)


def test_theta1_inf_and_reached_threshold():
    pipe, X, y = _small(seed=2)
    res = otstab.certify(pipe, X, y, loss="zero_one", r=0.0, cost="auto")
    assert res.status == "zero" and res.value == 0.0
    res = otstab.certify(pipe, X, y, loss="zero_one", r=0.6, theta1=math.inf, cost="auto")
    enc = otstab.certify(pipe, X, y, loss="zero_one", r=0.6, theta1=math.inf)
    assert res.value == pytest.approx(enc.value, rel=1e-12)  # reweighting alone: same answer


def test_features_and_unsupported_combinations():
    pipe, X, y = _small()
    res = otstab.certify(pipe, X, y, loss="zero_one", r=0.55, cost="auto", features=["u"])
    f = res.to_frame(raw=True)
    for c in X.columns:
        if c != "u":
            assert (f[c].astype(str) == f[f"{c}*"].astype(str)).all()
    with pytest.raises(ValidationError, match="cost=DataCost is exact for"):
        otstab.certify(pipe, X, y, loss="squared", r=0.5, cost="auto")
    with pytest.raises(ValidationError, match="price"):
        otstab.certify(pipe, X, y, loss="zero_one", r=0.5, cost="auto",
                       feature_costs={"u": 2.0})
    with pytest.raises(ValidationError, match="did you mean 'u'"):
        otstab.certify(pipe, X, y, loss="zero_one", r=0.5, cost=DataCost(immutable=["uu"]))


def test_german_q_star_is_a_valid_data_set(german):
    pipe, X, y, num, cat = german
    cost = DataCost(**GERMAN_COST)
    r = 0.4
    res = otstab.certify(pipe, X, y, loss="zero_one", r=r, cost=cost)
    assert res.status == "optimal"
    assert sorted(res.info["cost"]["immutable"]) == ["age", "personal_status_sex"]
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    assert len(mv) > 20
    rows = star_rows(mv, X, num)
    assert_valid_rows(rows, pipe, num, cat)
    assert_german_constraints(rows, mv)
    # re-scored by the pipeline itself: every moved row is misclassified, Q* reaches r
    pred = pipe.predict(rows)
    assert np.all(pred != np.asarray(y)[mv["source"]])
    loss_star = f["loss"].to_numpy().copy()
    loss_star[mv.index] = (pred != np.asarray(y)[mv["source"]]).astype(float)
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    assert float(np.sum(m * w * loss_star)) / len(X) >= r * (1 - 1e-8)
    # the encoded atoms are the pipeline's encoding of the raw rows: one-hot stays 0/1
    Z = np.asarray(res.X_star)
    onehot = [j for j, nm in enumerate(res.feature_names) if nm.startswith("cat__")]
    assert set(np.unique(Z[:, onehot])) <= {0.0, 1.0}
    # the default for a Pipeline with encoders on a raw DataFrame is cost="auto", and the
    # result says so; cost="encoded" is the paper's cost
    a = otstab.certify(pipe, X, y, loss="zero_one", r=r, cost="auto")
    b = otstab.certify(pipe, X, y, loss="zero_one", r=r)
    assert a.value == b.value and b.info["cost"] == a.info["cost"]
    assert b.info["cost_used"].startswith("auto (default") and "transport cost" in b.summary()
    enc = otstab.certify(pipe, X, y, loss="zero_one", r=r, cost="encoded")
    assert enc.value != pytest.approx(b.value, rel=1e-3) and "cost" not in enc.info
    assert enc.info["cost_used"] == "encoded (given)"


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("chi2", 1.0), ("kl", math.inf)])
def test_continuous_data_keeps_the_encoded_numbers(divergence, theta2):
    """On continuous data a StandardScaler's DataCost is the encoded cost: same value (up to
    the push past the boundary, which the DataCost distances include: relative 2e-9)."""
    rng = np.random.default_rng(3)
    X = pd.DataFrame(rng.normal(size=(200, 3)) * [1.0, 3.0, 0.5], columns=["a", "b", "c"])
    y = (X["a"] - X["b"] / 3 + rng.normal(0, 1, 200) > 0).astype(int)
    pipe = Pipeline([("sc", StandardScaler()), ("clf", LogisticRegression())]).fit(X, y)
    kw = dict(loss="zero_one", r=0.45, theta2=theta2, divergence=divergence)
    a = otstab.certify(pipe, X, y, cost="auto", **kw)
    b = otstab.certify(pipe, X, y, cost="encoded", **kw)
    assert a.status == b.status == "optimal"
    assert a.value == pytest.approx(b.value, rel=5e-9)
    # hinge: the same d-transform as the encoded cost's (no push is involved: 1e-9)
    kh = dict(kw, loss="hinge", r=1.1)
    a = otstab.certify(pipe, X, y, cost="auto", **kh)
    b = otstab.certify(pipe, X, y, cost="encoded", **kh)
    assert a.status == b.status == "optimal"
    assert a.value == pytest.approx(b.value, rel=1e-9)
    # a model without preprocessing: unit scales are the Euclidean cost
    lm = otstab.LinearModel([0.7, -0.4, 1.1], 0.2)
    Xa = X.to_numpy()
    ya = np.where(y == 1, 1, -1)
    unit = DataCost(scale={"x0": 1.0, "x1": 1.0, "x2": 1.0})
    a = otstab.certify(lm, Xa, ya, cost=unit, **kw)
    b = otstab.certify(lm, Xa, ya, **kw)
    assert a.value == pytest.approx(b.value, rel=5e-9)


def test_sample_weights_and_pickle():
    pipe, X, y = _small(seed=4, n=40)
    wts = np.random.default_rng(0).uniform(0.5, 2.0, len(X))
    res = otstab.certify(pipe, X, y, loss="zero_one", r=0.55, cost="auto", sample_weight=wts)
    assert res.status == "optimal"
    wrong = pipe.predict(X) != np.asarray(y)
    # the weighted value from the same distances through the weighted 0/1 dual
    from otstab.solve._zero_one import _solve_and_build

    d = np.asarray(res.info["dstar"])
    base = _solve_and_build(d, wrong, 0.55, 1.0, 0.25, "kl", "auto", None, None, None,
                            lambda a, b: None, [], None, 0.0, d, p=wts / wts.sum())
    assert res.value == pytest.approx(base.value, rel=1e-12)
    back = pickle.loads(pickle.dumps(res))
    f0, f1 = res.to_frame(raw=True), back.to_frame(raw=True)
    pd.testing.assert_frame_equal(f0, f1)


def test_multiclass_equals_brute_force():
    """A 3-class logistic regression: d*_i = the cheapest move to any other class, against
    every combination of levels scored by decision_function (the brute force at the exact
    margins: the solver's pushed needs put d* at most a relative 1e-8 above it)."""
    pipe2, X, _ = _small(seed=5, n=24)
    rng = np.random.default_rng(5)
    y = np.where(X["u"] > 1, 2, np.where(X["colour"] == "red", 1, 0))
    y = np.where(rng.random(len(X)) < 0.2, rng.integers(0, 3, len(X)), y)
    pipe = Pipeline([("pre", pipe2.named_steps["pre"]),
                     ("clf", LogisticRegression(C=10.0))]).fit(X, y)
    cost = DataCost(**SMALL_COST)
    rc = cost.resolve(pipe, X)
    res = otstab.certify(pipe, X, y, loss="zero_one", r=0.7, cost=cost)
    assert res.status == "optimal"
    S0 = pipe.decision_function(X)
    cols = {v.name: v for v in rc.variables}
    wrong = pipe.predict(X) != y
    rows = np.flatnonzero(~wrong)
    X0, F, m = _every_level(X, cols, rows)
    S = pipe.decision_function(F)
    c = rc.cost(X0, F)
    slopes = _unit_slopes(pipe, X, S0)
    ref = np.zeros(len(X))
    for pos, i in enumerate(rows):
        sl = slice(pos * m, (pos + 1) * m)
        best = math.inf
        for k in range(3):
            if k == y[i]:
                continue
            margin = S0[i, y[i]] - S0[i, k]
            gain = (S[sl, k] - S[sl, y[i]]) - (S0[i, k] - S0[i, y[i]])
            conts = [_continuous_option(cols[nm], X, i,
                                        float(slopes[nm][i, k] - slopes[nm][i, y[i]]), 1.0)
                     for nm in ("u", "v")]
            best = min(best, float(np.min(c[sl] + _water_many(margin - gain, conts))))
        ref[i] = best
    d = np.asarray(res.info["dstar"])
    assert np.all(d >= ref * (1 - 1e-12)) and np.all(d <= ref * (1 + 1e-8))
    base = otstab.certify_distances(ref, 0.7, misclassified=wrong)
    assert res.value == pytest.approx(base.value, rel=1e-8)
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    rows_ = mv[[f"{c}*" for c in X.columns]].copy()
    rows_.columns = list(X.columns)
    assert np.all(pipe.predict(rows_.astype({"u": float, "v": float, "k": int}))
                  != y[mv["source"]])


@pytest.mark.slow
def test_adult_q_star_is_a_valid_data_set():
    from otstab.datasets import load_adult

    df = load_adult(raw=True).sample(3000, random_state=0)
    X, y = df.drop(columns="income").reset_index(drop=True), df["income"].to_numpy()
    num = [c for c in X.columns if X[c].dtype.kind in "if"]
    cat = [c for c in X.columns if c not in num]
    pre = ColumnTransformer([("num", StandardScaler(), num),
                             ("cat", OneHotEncoder(handle_unknown="ignore"), cat)])
    pipe = Pipeline([("pre", pre), ("clf", LogisticRegression(max_iter=3000))]).fit(X, y)
    fixed = ["sex", "race", "age"]
    res = otstab.certify(pipe, X, y, loss="zero_one", r=0.35,
                         cost=DataCost(immutable=fixed, bounds="observed"))
    assert res.status == "optimal"
    f = res.to_frame(raw=True)
    mv = f[f["loss*"] > f["loss"]]
    rows = star_rows(mv, X, num)
    assert_valid_rows(rows, pipe, num, cat)
    for c in num:
        v = rows[c].to_numpy()
        assert v.min() >= X[c].min() and v.max() <= X[c].max()
    for c in fixed:
        assert (rows[c].to_numpy() == mv[c].to_numpy()).all()
    pred = pipe.predict(rows)
    assert np.all(pred != y[mv["source"]])
    loss_star = f["loss"].to_numpy().copy()
    loss_star[mv.index] = 1.0
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    assert float(np.sum(m * w * loss_star)) / len(X) >= 0.35 * (1 - 1e-8)


# ------------------------------------------------------------------------------------------
# hinge: the separable d-transform against enumeration, the dual by a bounded scalar search


def _brute_hinge_value(pipe, X, y, rc, r, theta1, theta2, divergence, h_hint):
    from scipy.optimize import minimize_scalar

    sign = np.where(np.asarray(y) == pipe.classes_[1], 1.0, -1.0)
    s0 = pipe.decision_function(X)
    mp = 1.0 - sign * s0
    cols = {v.name: v for v in rc.variables}
    n = len(X)
    X0, F, m = _every_level(X, cols, np.arange(n))
    src = np.repeat(np.arange(n), m)
    gain = (-sign[src] * (pipe.decision_function(F) - s0[src])).reshape(n, m)
    cost = rc.cost(X0, F).reshape(n, m)
    conts = []
    for nm in ("u", "v"):
        step = X.copy()
        step[nm] = step[nm] + 1.0
        a = -sign * (pipe.decision_function(step) - s0)  # gain per unit, per row
        v = cols[nm]
        x = X[nm].to_numpy()
        room = np.where(a > 0, np.maximum(v.hi, x) - x, x - np.minimum(v.lo, x))
        if v.direction:
            room = np.where(np.sign(a) == v.direction, room, 0.0)
        if v.immutable:
            room = np.zeros_like(room)
        conts.append((v.price / (v.scale * a) ** 2, np.abs(a) * room))

    def lh(h):
        best = np.max(h * (mp[:, None] + gain) - theta1 * cost, axis=1)
        for Q, U in conts:  # max over g in [0, U] of h g - theta1 Q g^2 (a concave parabola)
            g = np.clip(h / (2 * theta1 * Q), 0, U)
            best = best + h * g - theta1 * Q * g * g
        return np.maximum(best, 0.0)

    def term(h):
        val = lh(h)
        if math.isinf(theta2):
            return float(np.mean(val))
        if divergence == "kl":
            top = val.max()
            return top + theta2 * math.log(float(np.mean(np.exp((val - top) / theta2))))
        inner = minimize_scalar(
            lambda al: -(al + theta2 - theta2 * float(np.mean(
                np.maximum((val + al) / (2 * theta2) + 1, 0) ** 2))),
            bounds=(-val.max() - 4 * theta2, 4 * theta2), method="bounded",
            options={"xatol": 1e-13})
        return inner.fun  # T(h) = -max over alpha

    out = minimize_scalar(lambda h: -(h * r - term(h)), bounds=(0.0, 3 * h_hint),
                          method="bounded", options={"xatol": 1e-12})
    return -out.fun


@pytest.mark.parametrize("divergence, theta2, discrete", [
    ("kl", 0.25, False), ("chi2", 0.5, False), ("kl", math.inf, False),
    ("chi2", 0.5, True), ("kl", math.inf, True)])
def test_hinge_small_pipeline_equals_brute_force(divergence, theta2, discrete):
    """(discrete: the continuous variables immutable, so l_h is piecewise linear and the
    optimum sits at a kink, where Q* splits samples between two maximisers)"""
    pipe, X, y = _small()
    cost = DataCost(**SMALL_COST, immutable=["u", "v"] if discrete else None)
    rc = cost.resolve(pipe, X)
    r = 1.2
    res = otstab.certify(pipe, X, y, loss="hinge", r=r, theta2=theta2, divergence=divergence,
                         cost=cost)
    assert res.status == "optimal"
    ref = _brute_hinge_value(pipe, X, y, rc, r, 1.0, theta2, divergence, res.h)
    assert res.value == pytest.approx(ref, rel=1e-9)
    if discrete:
        assert res.split  # the optimum is at a kink: one sample's mass is shared
    f = res.to_frame(raw=True)
    rows = f[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    rows = rows.astype({"u": float, "v": float, "k": int})
    assert set(rows["colour"]) <= {"red", "green", "blue"}
    assert rows["k"].between(0, 8).all()
    sgn = np.where(np.asarray(y)[f["source"]] == 1, 1.0, -1.0)
    loss = np.maximum(1 - sgn * pipe.decision_function(rows), 0)
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    assert float(np.sum(m * w * loss)) / len(X) >= r * (1 - 1e-8)
