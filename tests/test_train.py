"""otstab.train: adversarial and tilted logistic regression, selection, harden."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import minimize
from scipy.special import logsumexp
from sklearn.linear_model import LogisticRegression
from sklearn.utils.estimator_checks import parametrize_with_checks

import otstab
from otstab.errors import ValidationError
from otstab.training._train import (
    AdversarialLogisticRegression,
    TiltedLogisticRegression,
    harden,
    robust_objective,
    select_by_validation,
)

INF = math.inf


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(250, 4))
    y = (X[:, 0] - 0.7 * X[:, 1] + 0.2 * X[:, 2] + 0.6 * rng.normal(size=250) > 0).astype(int)
    return X, y


@parametrize_with_checks([AdversarialLogisticRegression(), AdversarialLogisticRegression(
    gamma=0.5, features=[0]), TiltedLogisticRegression(), TiltedLogisticRegression(t=0.3)])
def test_sklearn_estimator_checks(estimator, check):
    # check_array_api_input is skipped by scikit-learn itself (SCIPY_ARRAY_API unset)
    check(estimator)


def _sklearn_erm(X, y, C=1.0):
    return LogisticRegression(C=C, tol=1e-12, max_iter=5000).fit(X, y)


@pytest.mark.parametrize("est", [AdversarialLogisticRegression(gamma=INF),
                                 AdversarialLogisticRegression(gamma=1e9),
                                 TiltedLogisticRegression(t=INF),
                                 TiltedLogisticRegression(t=1e9)])
def test_limits_equal_erm(data, est):
    """gamma -> inf (AT) and t -> inf (tilted) both give scikit-learn's L2 logistic regression:
    the objective is sklearn's divided by C n, so the minimiser is the same."""
    X, y = data
    ref = _sklearn_erm(X, y)
    est.fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=2e-6)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, atol=2e-6)
    np.testing.assert_allclose(est.predict_proba(X), ref.predict_proba(X), atol=1e-6)


def test_tilted_small_t_minimises_the_largest_loss(data):
    """t -> 0: t log mean exp(l / t) -> max l; the fit's largest training loss is close to that
    of a direct minimax fit (same L2 term), and far below ERM's."""
    X, y = data
    s = np.where(y == 1, 1.0, -1.0)
    n, d = X.shape
    C = 1.0

    def max_loss(p):
        return float(np.max(np.logaddexp(0, -s * (X @ p[:d] + p[d]))))

    tilted = TiltedLogisticRegression(t=0.01, C=C).fit(X, y)
    p_t = np.append(tilted.coef_[0], tilted.intercept_)
    erm = _sklearn_erm(X, y)
    p_e = np.append(erm.coef_[0], erm.intercept_)
    # the minimax objective, smoothed independently by logsumexp at a much smaller tilt
    t0 = 1e-4

    def smooth_max(p):
        v = np.logaddexp(0, -s * (X @ p[:d] + p[d]))
        return t0 * (logsumexp(v / t0) - math.log(n)) + p[:d] @ p[:d] / (2 * C * n)

    direct = minimize(smooth_max, p_t, method="Nelder-Mead",
                      options={"maxiter": 4000, "xatol": 1e-8, "fatol": 1e-12})
    assert max_loss(p_t) < max_loss(p_e) - 0.5
    assert max_loss(p_t) <= max_loss(direct.x) + 0.05


def _brute_dtransform(w, b, x, s, gamma, mask):
    """sup_x log(1 + exp(-s (w.x + b))) - gamma ||x - x_i||^2 over the masked coordinates, by
    Nelder-Mead from several starts (independent of the closed-form 1-D reduction)."""
    idx = np.flatnonzero(mask)

    def neg(z):
        xx = x.copy()
        xx[idx] = z
        return -(np.logaddexp(0, -s * (w @ xx + b)) - gamma * np.sum((xx - x) ** 2))

    best = -np.inf
    for step in (0.0, 0.5, 2.0, 5.0):
        z0 = x[idx] - step * s * w[idx] / max(np.linalg.norm(w[idx]), 1e-12)
        res = minimize(neg, z0, method="Nelder-Mead",
                       options={"xatol": 1e-11, "fatol": 1e-14, "maxiter": 20000})
        best = max(best, -res.fun)
    return best


@pytest.mark.parametrize("gamma,features", [(0.3, None), (2.0, None), (0.5, [1])])
def test_adversarial_objective_equals_brute_force_dtransform(data, gamma, features):
    X, y = data
    X, y = X[:12, :3], y[:12]
    s = np.where(y == 1, 1.0, -1.0)
    w, b = np.array([1.3, -0.8, 0.4]), 0.2
    mask = np.zeros(3, dtype=bool)
    mask[features if features is not None else slice(None)] = True
    J, _, _, _ = robust_objective(w, b, X, s, gamma=gamma, mask=mask)
    brute = np.mean([_brute_dtransform(w, b, X[i], s[i], gamma, mask) for i in range(12)])
    assert J == pytest.approx(brute, rel=1e-8)


@pytest.mark.parametrize("gamma,t", [(0.5, INF), (INF, 0.4), (1.0, 0.7)])
def test_gradient_matches_finite_differences(data, gamma, t):
    X, y = data
    s = np.where(y == 1, 1.0, -1.0)
    p = np.array([0.9, -0.6, 0.3, 0.1, -0.2])

    def J(q):
        return robust_objective(q[:4], q[4], X, s, gamma=gamma, t=t)[0]

    _, gc, gi, _ = robust_objective(p[:4], p[4], X, s, gamma=gamma, t=t)
    num = np.array([(J(p + 1e-6 * e) - J(p - 1e-6 * e)) / 2e-6 for e in np.eye(5)])
    np.testing.assert_allclose(np.append(gc, gi), num, rtol=1e-6, atol=1e-8)


def test_targeted_at_moves_only_the_target_feature(data):
    """features=[j]: the maximisers differ from the data only in column j, so the gradient
    terms of the other coefficients are -mean s sigma(-m*) x_k with the *unmoved* x_k (only
    the shared factor sigma(-m*) changes), while coefficient j sees the moved column."""
    X, y = data
    s = np.where(y == 1, 1.0, -1.0)
    w, b, j = np.array([0.9, -0.6, 0.3, 0.1]), -0.2, 1
    mask = np.arange(4) == j
    _, gc, _, Xs = robust_objective(w, b, X, s, gamma=0.5, mask=mask)
    others = np.arange(4) != j
    np.testing.assert_array_equal(Xs[:, others], X[:, others])
    assert np.any(Xs[:, j] != X[:, j])
    m_star = s * (Xs @ w + b)
    factor = s / (1 + np.exp(m_star))
    np.testing.assert_allclose(gc[others], -(factor @ X[:, others]) / len(y), rtol=1e-12)
    np.testing.assert_allclose(gc[j], -(factor @ Xs[:, j]) / len(y), rtol=1e-12)


def test_targeted_at_raises_the_target_feature_score(data):
    """Sec. 4.2: training against perturbations of feature j makes the model harder to break
    through feature j (its feature-stability score, certify with features=[j], goes up)."""
    X, y = data
    j = 0
    erm = AdversarialLogisticRegression(gamma=INF).fit(X, y)
    tat = AdversarialLogisticRegression(gamma=0.5, features=[j]).fit(X, y)
    kw = dict(loss="zero_one", r=0.4, theta1=1.0, theta2=0.25, features=[j])
    assert otstab.certify(tat, X, y, **kw).value > otstab.certify(erm, X, y, **kw).value
    assert abs(tat.coef_[0, j]) < abs(erm.coef_[0, j])


def test_features_by_name_and_dataframe(data):
    X, y = data
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    by_name = AdversarialLogisticRegression(gamma=0.5, features=["b"]).fit(df, y)
    by_idx = AdversarialLogisticRegression(gamma=0.5, features=[1]).fit(X, y)
    np.testing.assert_allclose(by_name.coef_, by_idx.coef_, rtol=1e-10)
    with pytest.raises(ValidationError, match="unknown feature"):
        AdversarialLogisticRegression(features=["zz"]).fit(df, y)


@pytest.mark.parametrize("est,match", [(AdversarialLogisticRegression(gamma=0.0), "gamma"),
                                       (AdversarialLogisticRegression(gamma="a"), "gamma"),
                                       (TiltedLogisticRegression(t=-1.0), "t"),
                                       (TiltedLogisticRegression(C=0.0), "C"),
                                       (TiltedLogisticRegression(max_iter=0), "max_iter")])
def test_bad_hyperparameters(data, est, match):
    X, y = data
    with pytest.raises((ValidationError, TypeError), match=match):
        est.fit(X, y)


def test_select_by_validation(data):
    X, y = data
    best, table = select_by_validation(AdversarialLogisticRegression(), {"gamma": [0.1, 1.0, INF]},
                                       X[:150], y[:150], X[150:], y[150:])
    accs = [float(np.mean(AdversarialLogisticRegression(gamma=g).fit(X[:150], y[:150])
                          .predict(X[150:]) == y[150:])) for g in (0.1, 1.0, INF)]
    assert table["val_accuracy"].tolist() == accs
    assert best.gamma == [0.1, 1.0, INF][int(np.argmax(accs))]


def test_harden(data, capsys):
    X, y = data
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    erm = LogisticRegression().fit(df[:150], y[:150])
    out = harden(erm, df[:150], y[:150], X_eval=df[150:], y_eval=y[150:], r=0.4, gamma=0.5)
    ranking = otstab.feature_stability(erm, df[150:], y[150:], loss="zero_one", r=0.4).to_frame()
    assert out.feature == ranking["feature"].iloc[0]
    assert out.before["score"] == pytest.approx(ranking["score"].iloc[0])
    assert out.after["score"] > out.before["score"]
    assert out.after["accuracy"] == pytest.approx(
        float(np.mean(out.model.predict(df[150:]) == y[150:])))
    assert "before" in str(out)  # print(out) shows the table; harden itself prints nothing
    assert capsys.readouterr().out == ""
