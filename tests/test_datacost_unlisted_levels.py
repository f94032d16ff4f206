"""Rows at a categorical level the DataCost does not list (a level the encoder never saw,
one-hot encoded as zeros under handle_unknown="ignore"): a warning naming the column and the
levels, a note in the cost's description, and R equal to a brute force over every level in
which such a row keeps its level for free, may switch to a listed level, and never comes back
(or may, when ``levels`` lists it)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import otstab

pytest.importorskip("sklearn")


def _case():
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    rng = np.random.default_rng(1)
    n = 60
    a, v = rng.choice(list("abc"), n), rng.normal(size=n)
    y = ((a == "a") ^ (v > 0.3) ^ (rng.random(n) < 0.1)).astype(int)
    X = pd.DataFrame({"A": a, "N": v})
    ct = ColumnTransformer([("c", OneHotEncoder(handle_unknown="ignore"), ["A"]),
                            ("n", "passthrough", ["N"])])
    pipe = Pipeline([("enc", ct), ("clf", LogisticRegression(C=5))]).fit(X, y)
    X.loc[:14, "A"] = "Q"  # 15 rows at a level the encoder never saw
    return pipe, X, y


def _brute(pipe, X, y, r, to_q: bool) -> float:
    """R at theta2 = inf for the 0/1 loss: the cheapest flips of correctly classified rows
    (fractional last), each row's cheapest flip over every level (the level's one-hot
    coefficient, zero for 'Q') and the least move of N across the boundary (cost dN^2)."""
    w, b0 = pipe[-1].coef_[0], float(pipe[-1].intercept_[0])
    coef = dict(zip(pipe[0].named_transformers_["c"].categories_[0], w[:3]))
    pred = pipe.predict(X)

    def flip(i):
        best = math.inf
        for lv in ["a", "b", "c", "Q"]:
            if lv == "Q" and X.A[i] != "Q" and not to_q:
                continue
            c = float(lv != X.A[i])
            s = coef.get(lv, 0.0) + w[3] * X.N[i] + b0
            best = min(best, c if (s > 0) != bool(y[i]) else c + (s / w[3]) ** 2)
        return best

    costs = np.sort([flip(i) for i in range(len(y)) if pred[i] == y[i]])
    need = (r - float(np.mean(pred != y))) * len(y)
    k = int(need)
    return (costs[:k].sum() + (need - k) * costs[k]) / len(y)


@pytest.mark.parametrize("listed", [False, True])
def test_unlisted_level_rows_match_the_brute_force(listed):
    pipe, X, y = _case()
    levels = {"A": ["a", "b", "c", "Q"]} if listed else {}
    cost = otstab.DataCost(scale={"N": 1.0}, levels=levels)
    base = float(np.mean(pipe.predict(X) != y))
    for t in (0.05, 0.2, 0.4):
        if listed:
            res = otstab.certify(pipe, X, y, loss="zero_one", r=base + t, theta2=math.inf,
                                 cost=cost)
        else:
            with pytest.warns(UserWarning, match=r"'A' has 15 row\(s\).*'Q'"):
                res = otstab.certify(pipe, X, y, loss="zero_one", r=base + t,
                                     theta2=math.inf, cost=cost)
        assert res.status == "optimal"
        # (the certificate's flips cross the boundary by a relative 1e-9)
        assert res.value == pytest.approx(_brute(pipe, X, y, base + t, listed), rel=1e-7)
    note = "15 row(s) at levels it does not list ('Q')"
    assert (note in res.info["cost_description"]) is not listed
