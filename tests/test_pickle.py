"""Results pickle (joblib caches, multiprocessing): lazy fields are built into the pickle and
the unpickled result holds the same numbers."""

import math
import pickle

import numpy as np
import pytest
from sklearn.neural_network import MLPClassifier

import otstab
import otstab.solve._piecewise as pw

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4))
    y = np.where(X @ np.array([1.0, -0.5, 0.3, 0.0]) + 0.4 * rng.standard_normal(n) > 0, 1, -1)
    return X, y


def _same(a, b):
    for name in ("value", "h", "status", "risk_star", "primal_cost", "value_lower",
                 "value_upper", "se"):
        va, vb = getattr(a, name), getattr(b, name)
        assert va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb)), name
    for name in ("X_star", "weights", "source", "mass", "loss_star"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)))


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("loss,r", [("hinge", 0.8), ("zero_one", 0.3), ("logistic", 0.8)])
def test_linear_results_round_trip(monkeypatch, loss, r, sampled):
    if sampled:  # the blockwise builder with the sampled audit (large-n path) on small data
        monkeypatch.setattr(pw, "AUDIT_DIRECT_MAX", 0)
    X, y = _data()
    res = otstab.certify(otstab.LinearModel(np.array([1.0, -0.5, 0.3, 0.0]), 0.1), X, y,
                         loss=loss, r=r)
    back = pickle.loads(pickle.dumps(res))
    _same(res, back)
    assert back.summary() == res.summary()


def test_nonlinear_bounds_result_round_trips():
    X, y = _data(200)
    mlp = MLPClassifier(hidden_layer_sizes=(6,), max_iter=300, random_state=0).fit(X, y)
    res = otstab.certify(mlp, X, y, loss="zero_one", r=0.3)
    back = pickle.loads(pickle.dumps(res))
    _same(res, back)
    assert back.status == "bounds"
