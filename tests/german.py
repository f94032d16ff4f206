"""The German credit Pipeline the DataCost and pipeline tests share: raw columns, numeric ones
standardised, categorical ones one-hot encoded, a logistic regression on top."""

from __future__ import annotations

import warnings

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
