"""The German credit Pipeline the DataCost and pipeline tests share: raw columns, numeric ones
standardised, categorical ones one-hot encoded, a logistic regression on top."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from otstab.datasets import load_german


def german_pipeline(rows=None, warn="ignore"):
    """(pipe, X, y, num, cat, df): the pipeline fitted on the first ``rows`` raw rows (all by
    default) of German credit; ``warn`` is the warnings filter while fitting."""
    df = load_german(raw=True)
    if rows is not None:
        df = df.iloc[:rows].reset_index(drop=True)
    X, y = df.drop(columns="credit"), df["credit"]
    num = [c for c in X.columns if X[c].dtype.kind in "if"]
    cat = [c for c in X.columns if c not in num]
    ct = ColumnTransformer([("num", StandardScaler(), num),
                            ("cat", OneHotEncoder(handle_unknown="ignore"), cat)])
    with warnings.catch_warnings():
        warnings.simplefilter(warn)
        pipe = Pipeline([("pre", ct), ("clf", LogisticRegression(max_iter=2000))]).fit(X, y)
    return pipe, X, y, num, cat, df


#: the German-credit DataCost several tests certify under (two protected variables fixed, a
#: floor on the amount, the duration only lengthened)
GERMAN_COST = dict(immutable=["age", "personal_status_sex"], bounds={"amount": (250, None)},
                   increase_only=["duration"])


def star_rows(f, X, num=()):
    """Q*'s raw rows from ``f`` (``res.to_frame(raw=True)`` or some of its rows): the ``x*``
    columns named as ``X``'s, the ``num`` columns cast back to ``X``'s dtypes."""
    rows = f[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    return rows.astype({c: X[c].dtype for c in num})


def assert_valid_rows(rows, pipe, num, cat, integral=True):
    """Every categorical value among the fitted OneHotEncoder's levels (the ``cat`` step of the
    Pipeline's ColumnTransformer ``pre``); with ``integral``, every numeric one an integer."""
    enc = pipe.named_steps["pre"].named_transformers_["cat"]
    for j, c in enumerate(cat):
        assert set(rows[c]) <= set(enc.categories_[j]), c
    if integral:
        for c in num:
            assert np.all(rows[c].to_numpy() == np.round(rows[c].to_numpy())), c


def assert_german_constraints(rows, before):
    """Q*'s rows keep :data:`GERMAN_COST`: age and personal_status_sex unchanged, the amount
    at least min(250, its value), the duration not shortened (``before``: the rows' sources,
    the frame's raw columns)."""
    for c in GERMAN_COST["immutable"]:
        assert (rows[c].to_numpy() == before[c].to_numpy()).all(), c
    assert np.all(rows["amount"] >= np.minimum(250, before["amount"]))
    assert np.all(rows["duration"] >= before["duration"])
