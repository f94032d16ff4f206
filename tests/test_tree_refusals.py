"""What the leaf layouts of otstab.trees do not read is refused clearly (issue 29), on real
models of each library: XGBoost categorical splits (the JSON dump's list of categories as
``split_condition``), the ``gblinear`` and ``dart`` boosters; LightGBM linear trees and
random-forest mode (LightGBM's categorical splits are read:
tests/test_trees_lgb_categorical.py). Refused means an :class:`InputTypeError` that names the
structure from ``bounds.leaf_table``, and ``certify`` falling back to an upper bound
(``value_lower = 0``) instead of failing or certifying from a wrong layout."""

import warnings

import numpy as np
import pytest

import otstab
from otstab import bounds
from otstab.errors import InputTypeError

try:  # imported at collection: the first import costs seconds on a loaded machine
    import xgboost
except ImportError:  # pragma: no cover - optional
    xgboost = None
try:
    import lightgbm
except ImportError:  # pragma: no cover - optional
    lightgbm = None


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    X[:, 2] = rng.integers(0, 5, 200)  # category codes
    y = ((X[:, 0] > 0) ^ (X[:, 2] % 2 == 1)).astype(int)
    return X, y


def _check(model, X, y, match, trees=True):
    with pytest.raises(InputTypeError, match=match):
        bounds.leaf_table(model, X.shape[1], X)
    if not trees:
        return
    r = min(float(np.mean(model.predict(X[:6]) != y[:6])) + 0.25, 0.95)  # above the error
    res = otstab.certify(model, X[:6], y[:6], r=r, loss="zero_one", theta1=1.0, theta2=0.5)
    assert res.status == "bounds" and res.value_lower == 0.0 and res.value_upper > 0


@pytest.mark.parametrize("case", ["categorical", "gblinear", "dart"])
def test_xgboost_refusals(case):
    if xgboost is None:
        pytest.skip("xgboost not installed")
    xgb = xgboost
    X, y = _data()
    opts = dict(n_estimators=4, max_depth=2, n_jobs=1, random_state=0)
    if case == "categorical":
        model = xgb.XGBClassifier(enable_categorical=True, tree_method="hist",
                                  max_cat_to_onehot=1, feature_types=["q", "q", "c"], **opts)
        match = "categorical"
    else:
        model = xgb.XGBClassifier(booster=case, **opts)
        match = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, y)
    # gblinear: certify reads it as the linear model it is; categorical: the generic search
    # (no thresholds) takes seconds, the fallback is checked on LightGBM's
    _check(model, X, y, match, trees=case == "dart")


@pytest.mark.parametrize("case", ["linear", "rf"])
def test_lightgbm_refusals(case):
    if lightgbm is None:
        pytest.skip("lightgbm not installed")
    lgb = lightgbm
    X, y = _data()
    opts = dict(n_estimators=4, num_leaves=4, n_jobs=1, verbose=-1, random_state=0)
    if case == "linear":
        model = lgb.LGBMClassifier(linear_tree=True, **opts)
    else:
        model = lgb.LGBMClassifier(boosting_type="rf", bagging_freq=1, bagging_fraction=0.5,
                                   **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, y)
    _check(model, X, y, {"linear": "linear trees", "rf": "random-forest"}[case])
