"""MLP pipelines under a DataCost (otstab.solve._datacost_networks), checked by enumeration.

A tiny pipeline (2 categorical variables of 3 levels, 1 integer, 1 continuous; one-hot and
standard scaling; MLPClassifier with 6 hidden units, relu or tanh). The brute force
enumerates every level combination, the integers -6..11 (the data's are 0..5) and a fine
grid of the continuous variable (step 0.02 on [-4, 4]), prices every grid row with the cost
written out here (not otstab's), and scores it with the pipeline's own ``predict``:
``d_grid_i`` (the cheapest misclassified grid row) is at least ``d*_i`` and within the
grid's resolution of it. Checked:
``dlow_i <= d_grid_i``, ``dup_i >= d_grid_i - resolution``, ``value_lower <= V(d_grid)`` and
``value_upper >= V(d_grid - resolution)`` with V the exact 0/1 dual (and within 5% of
``V(d_grid)``: the search is good); Q*'s rows valid (levels among the data's, integers
integral, immutables unchanged) and re-scored by the pipeline.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from otstab_solvers.zero_one import solve_zero_one

import otstab
from otstab.errors import ValidationError
from otstab.solve import _datacost_networks as dn

sk_nn = pytest.importorskip("sklearn.neural_network")
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402

TH1, TH2 = 1.0, 0.5
STEP = 0.02  # the continuous variable's grid step


@functools.lru_cache(maxsize=2)
def _fitted(seed=0, n=200, hidden=(6,), activation="relu"):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"a": rng.choice(["p", "q", "r"], n), "b": rng.choice(["u", "v", "w"], n),
                       "k": rng.integers(0, 6, n), "x": rng.normal(size=n)})
    s = (df.a == "q") * 1.0 - (df.b == "w") * 1.2 + 0.4 * df.k - 1.0 + np.sin(2 * df.x)
    y = (s + 0.3 * rng.normal(size=n) > 0).astype(int).to_numpy()
    pre = ColumnTransformer([("cat", OneHotEncoder(), ["a", "b"]),
                             ("num", StandardScaler(), ["k", "x"])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = Pipeline([("pre", pre), ("mlp", sk_nn.MLPClassifier(
            hidden, activation=activation, random_state=seed, max_iter=2000))]).fit(df, y)
    return pipe, df.iloc[:25].reset_index(drop=True), y[:25]


def _pipe(activation="relu"):
    pipe, X, y = _fitted(activation=activation)
    return pipe, X.copy(), y.copy()


def _grid(pipe, X):
    """Every level combination x integers -8..13 x continuous grid: rows and predictions."""
    xs = np.round(np.arange(-200, 201) * STEP, 10)
    ks = np.arange(-6, 12)
    A, B, K, Xg = np.meshgrid(np.array(["p", "q", "r"]), np.array(["u", "v", "w"]), ks, xs,
                              indexing="ij")
    G = pd.DataFrame({"a": A.ravel(), "b": B.ravel(), "k": K.ravel(), "x": Xg.ravel()})
    return G, pipe.predict(G)


def _d_grid(pipe, X, y, immutable=()):
    sc = pipe.named_steps["pre"].named_transformers_["num"].scale_  # DataCost's default scales
    G, pred = _grid(pipe, X)
    ga, gb = G.a.to_numpy(), G.b.to_numpy()
    gk, gx = G.k.to_numpy(float), G.x.to_numpy()
    d = np.empty(len(X))
    slack = np.empty(len(X))
    for i in range(len(X)):
        c = ((ga != X.a[i]) * 1.0 + (gb != X.b[i]) * 1.0 + ((gk - X.k[i]) / sc[0]) ** 2
             + ((gx - X.x[i]) / sc[1]) ** 2)
        for name in immutable:
            c = np.where(G[name].to_numpy() != X[name][i], np.inf, c)
        c = np.where(pred != y[i], c, np.inf)
        j = int(np.argmin(c))
        d[i] = c[j]
        dx = abs(gx[j] - X.x[i])
        slack[i] = (2 * dx * STEP + STEP ** 2) / sc[1] ** 2  # a continuous move between grid points
    wrong = pipe.predict(X) != y
    d[wrong], slack[wrong] = 0.0, 0.0
    return d, slack


def _value(d, r):
    return solve_zero_one(TH1 * d, r, TH2, "kl", method="closed_form").value


@pytest.mark.parametrize("immutable,activation", [((), "relu"), (("a",), "tanh")])
def test_interval_brackets_the_enumeration_and_q_star_is_valid(immutable, activation):
    pipe, X, y = _pipe(activation)
    r = 0.4
    cost = otstab.DataCost(immutable=list(immutable))
    res = otstab.certify(pipe, X, y, loss="zero_one", r=r, theta1=TH1, theta2=TH2, cost=cost)
    assert res.status in ("bounds", "optimal")
    dg, slack = _d_grid(pipe, X, y, immutable)
    dlow = res.info["lower_bound"]["dlow"]
    dup = np.asarray(res.info["dstar"])
    assert np.all(dlow <= dg + 1e-12)
    assert np.all(dup >= dg - slack - 1e-12)
    assert np.all(dlow <= dup)
    assert res.value_lower <= _value(dg, r) + 1e-12
    assert res.value_upper >= _value(np.maximum(dg - slack, 0), r) - 1e-12
    assert res.value_lower >= 0.5 * _value(dg, r)  # not vacuous (0.96 on this toy)
    # the found side is a search, but a good one: within 5% of the grid's value, and its
    # distances within 10% of the grid's for 70% of the samples
    assert res.value_upper <= 1.05 * _value(dg, r)
    mv = dg > 0
    assert np.mean(dup[mv] <= 1.10 * dg[mv]) >= 0.7
    # Q*: valid raw rows, re-scored by the pipeline
    f = res.to_frame(raw=True)
    assert set(f["a*"]) <= {"p", "q", "r"} and set(f["b*"]) <= {"u", "v", "w"}
    assert np.all(np.asarray(f["k*"], dtype=float) == np.round(np.asarray(f["k*"], dtype=float)))
    for name in immutable:
        assert np.all(f[name].to_numpy() == f[name + "*"].to_numpy())
    star = pd.DataFrame({c: f[c + "*"].to_numpy() for c in ("a", "b", "k", "x")})
    star["k"] = star["k"].astype(float)
    pred = pipe.predict(star)
    assert np.array_equal((pred != y[f["source"].to_numpy()]).astype(float),
                          f["loss*"].to_numpy(dtype=float))
    assert res.risk_star >= r * (1 - 1e-9)


def test_encoded_weights_never_exceed_the_cost_of_a_level_switch():
    pipe, X, _ = _pipe()
    rc = otstab.DataCost(switch={"a": 0.5}).resolve(pipe, X)
    names = list(pipe[:-1].get_feature_names_out())
    w = dn.encoded_weights(pipe, rc, X, len(names))
    Z = pipe[:-1].transform(X)
    for name, lv, price in (("a", "q", 0.5), ("b", "w", 1.0)):
        Y = X.copy()
        Y[name] = lv
        dz = pipe[:-1].transform(Y) - Z
        moved = (X[name] != lv).to_numpy()
        assert np.all(np.sum(w * dz ** 2, axis=1)[moved] <= price * (1 + 1e-12))
        assert np.allclose(np.sum(w * dz ** 2, axis=1)[moved], price)  # tight for one-hot
    Y = X.copy()
    Y["x"] = Y["x"] + 0.7
    dz = pipe[:-1].transform(Y) - Z
    sx = pipe.named_steps["pre"].named_transformers_["num"].scale_[1]
    assert np.allclose(np.sum(w * dz ** 2, axis=1), (0.7 / sx) ** 2)


def test_smooth_losses_under_a_datacost_are_refused_clearly():
    pipe, X, y = _pipe()
    with pytest.raises(ValidationError, match="zero_one"):
        otstab.certify(pipe, X, y, loss="logistic", r=1.0, cost="auto")
    assert math.isfinite(otstab.certify(pipe, X, y, loss="logistic", r=1.0,
                                        cost="encoded").value_upper)


def test_time_budget_is_accepted_and_other_options_refused():
    pipe, X, y = _pipe()
    kw = dict(loss="zero_one", r=0.4, theta1=TH1, theta2=TH2, cost="auto")
    res = otstab.certify(pipe, X.iloc[:8], y[:8], time_budget=0.0, **kw)
    assert 0 <= res.value_lower <= res.value_upper
    with pytest.raises(ValidationError, match="max_nodes"):
        otstab.certify(pipe, X.iloc[:8], y[:8], max_nodes=5, **kw)


def test_rows_with_an_unseen_category_keep_a_zero_lower_bound():
    pipe, X, y = _pipe()
    rc = otstab.DataCost().resolve(pipe, X)
    Y = X.copy()
    Y.loc[3, "a"] = "zz"  # not a level of the encoder
    odd = dn.off_level_rows(rc, Y)
    assert odd.tolist() == [i == 3 for i in range(len(Y))]
