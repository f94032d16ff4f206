"""Boosted tree Pipelines, logistic loss under a DataCost (issue 29): how tight the certified
interval on the data's own variables gets within a time budget.

German credit (otstab.datasets, raw DataFrame), its Pipeline's preprocessing (standardised
numbers, one-hot categories) and a LightGBM classifier (``num_leaves=8``), ``cost=None`` (the
DataCost, chosen by default), r = base log-loss + 0.1, theta1 = 1, theta2 = inf: the ratio
``value_lower / value_upper`` and the wall time of ``certify`` (raw leaf table, search,
duals, audit). Full size (``OTSTAB_BENCH=full``): 100 trees, all 1,000 rows,
``time_budget=30``; quick: 20 trees, 100 rows, ``time_budget=10``. Prints one line (``-s``);
docs/bounds.md ("Boosted trees under a DataCost") has the numbers measured here.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings

import numpy as np
import pytest

import otstab

FULL = os.environ.get("OTSTAB_BENCH") == "full"
lightgbm = pytest.importorskip("lightgbm")


def test_german_lightgbm_logistic_datacost():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from german import german_pipeline
    from sklearn.pipeline import Pipeline

    trees, rows, budget = (100, 1000, 30.0) if FULL else (20, 100, 10.0)
    pipe, X, y, _, _, _ = german_pipeline()
    clf = lightgbm.LGBMClassifier(n_estimators=trees, num_leaves=8, verbose=-1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tp = Pipeline([("pre", pipe.named_steps["pre"]), ("clf", clf)]).fit(X, y)
    Xe, ye = X.iloc[:rows].reset_index(drop=True), y.iloc[:rows].reset_index(drop=True)
    P = np.asarray(tp.predict_proba(Xe))
    base = float(np.mean(-np.log(P[np.arange(rows), np.searchsorted(tp.classes_, ye)])))
    t0 = time.perf_counter()
    res = otstab.certify(tp, Xe, ye, loss="logistic", r=base + 0.1, theta1=1.0,
                         theta2=math.inf, time_budget=budget)
    wall = time.perf_counter() - t0
    lo = res.value_lower if res.status == "bounds" else res.value
    up = res.value_upper if res.status == "bounds" else res.value
    assert res.info["cost_used"].startswith("auto")
    assert 0 <= lo <= up < math.inf
    print(f"\nLightGBM {trees} trees, {rows} rows, DataCost, logistic: [{lo:.6g}, {up:.6g}] "
          f"ratio {lo / up:.3f}, {res.info['lower_bound']['nodes']} boxes, {wall:.1f} s, "
          f"load {os.getloadavg()[0]:.1f}")
