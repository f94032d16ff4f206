"""theta1 = inf for models without an exact moving path (MLPs, tree ensembles): nothing moves,
so R is the reweighting dual of the data's own losses, exact for any model. Checked against
that dual maximised independently (scipy's bounded scalar search on the explicit KL dual
``h r - theta2 log mean exp(h loss / theta2)``, concave in h) and against the model's own
losses at Q* (the audit); theta2 = inf or r above the largest loss: unreachable."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.neural_network import MLPClassifier

import otstab


def _fit(kind):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] * X[:, 1] + 0.3 * rng.normal(size=200) > 0).astype(int)
    model = {"mlp": MLPClassifier((8,), max_iter=500, random_state=0),
             "gb": GradientBoostingClassifier(n_estimators=10, random_state=0),
             "rf": RandomForestClassifier(5, max_depth=3, random_state=0)}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, y)
    return model, X, y


def _losses(model, X, y, loss):
    if loss == "zero_one":
        return (model.predict(X) != y).astype(float)
    P = model.predict_proba(X)
    return -np.log(P[np.arange(len(y)), y])


def _kl_dual(losses, r, theta2):
    def neg(h):
        return -(h * r - theta2 * (logsumexp(h * losses / theta2) - math.log(losses.size)))
    top = 200.0 * theta2 / max(float(losses.max()), 1e-12)
    return -minimize_scalar(neg, bounds=(0.0, top), method="bounded",
                            options={"xatol": 1e-12}).fun


@pytest.mark.parametrize("kind, loss", [("mlp", "zero_one"), ("mlp", "logistic"),
                                        ("gb", "zero_one"), ("rf", "zero_one")])
def test_theta1_inf_is_the_exact_reweighting_dual(kind, loss):
    model, X, y = _fit(kind)
    losses = _losses(model, X, y, loss)
    r = 0.5 * (losses.mean() + losses.max())
    res = otstab.certify(model, X, y, loss=loss, r=r, theta1=math.inf, theta2=0.5)
    assert res.status == "optimal" and res.value_lower == res.value
    assert res.value == pytest.approx(_kl_dual(losses, r, 0.5), rel=1e-7)
    # Q*: the data reweighted; its risk under the model's own losses is r
    w = np.asarray(res.weights)
    assert np.allclose(res.X_star, X)
    assert float(np.mean(w * losses)) == pytest.approx(r, rel=1e-9)
    above = [] if loss == "zero_one" else [(0.5, 1.1 * float(losses.max()))]  # (r <= 1)
    for th2, rr in [(math.inf, r)] + above:
        out = otstab.certify(model, X, y, loss=loss, r=rr, theta1=math.inf, theta2=th2)
        assert out.status == "unreachable" and math.isinf(out.value)
