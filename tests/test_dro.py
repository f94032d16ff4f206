"""worst_case_risk: the DRO view, inverse of certify, against independent closed forms."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.neural_network import MLPClassifier

import otstab
from otstab.analysis._dro import worst_case_risk
from otstab.errors import IncompatibleLossError, InputTypeError, ValidationError

INF = math.inf
SETTINGS = [(1.0, 0.25), (INF, 0.5), (0.5, INF)]


@pytest.fixture(scope="module")
def clf_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 3))
    y = (X[:, 0] - 0.5 * X[:, 1] + 0.6 * rng.normal(size=150) > 0).astype(int)
    return LogisticRegression().fit(X, y), X, y


@pytest.fixture(scope="module")
def reg_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 2))
    y = X @ np.array([1.0, -2.0]) + 0.3 + rng.normal(size=120)
    return LinearRegression().fit(X, y), X, y


@pytest.mark.parametrize("loss", ["hinge", "logistic", "zero_one", "absolute"])
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("theta1,theta2", SETTINGS)
@pytest.mark.parametrize("eps", [1e-3, 0.05, 0.4])
def test_inverse_of_certify(clf_data, reg_data, loss, divergence, theta1, theta2, eps):
    """certify(r = W(eps)).value == eps to 1e-8 relative, and Q* attains the risk W."""
    model, X, y = reg_data if loss == "absolute" else clf_data
    res = worst_case_risk(model, X, y, loss=loss, eps=eps, theta1=theta1, theta2=theta2,
                          divergence=divergence)
    if res.status == "capped":  # 0/1: the error rate reached 1 within the budget
        assert loss == "zero_one" and res.risk == 1.0 and res.certificate.value <= eps
        return
    assert res.status == "optimal"
    again = otstab.certify(model, X, y, loss=loss, r=res.risk, theta1=theta1, theta2=theta2,
                           divergence=divergence)
    assert again.status == "optimal"
    assert again.value == pytest.approx(eps, rel=1e-8)
    assert res.certificate.risk_star == pytest.approx(res.risk, rel=1e-8)
    assert res.certificate.h == pytest.approx(res.h, rel=1e-6)
    # a slightly larger risk costs more than eps (W is the largest risk within eps)
    above = otstab.certify(model, X, y, loss=loss, r=res.risk * (1 + 1e-6) + 1e-9,
                           theta1=theta1, theta2=theta2, divergence=divergence)
    assert above.value > eps


@pytest.mark.parametrize("eps", [1e-4, 0.01, 1.0, 25.0])
def test_squared_loss_w2_closed_form(reg_data, eps):
    """theta2 = inf, squared loss: moving x_i by delta_i changes the residual to
    e_i - beta.delta_i; with D_i = beta.delta_i, |D_i| <= ||beta|| ||delta_i|| and Minkowski,
    sqrt(mean (e - D)^2) <= sqrt(mean e^2) + ||beta|| sqrt(mean ||delta||^2), and
    theta1 mean ||delta||^2 <= eps; equality for delta_i = -t e_i beta / ||beta||. So
    W(eps) = (sqrt(mean e^2) + ||beta|| sqrt(eps / theta1))^2 (the W2 worst case of least
    squares, e.g. Blanchet, Kang, Murthy 2019, "Robust Wasserstein profile inference", Sec. 3)."""
    model, X, y = reg_data
    theta1 = 2.0
    e = y - model.predict(X)
    expected = (math.sqrt(np.mean(e ** 2))
                + np.linalg.norm(model.coef_) * math.sqrt(eps / theta1)) ** 2
    res = worst_case_risk(model, X, y, loss="squared", eps=eps, theta1=theta1, theta2=INF)
    assert res.status == "optimal"
    assert res.risk == pytest.approx(expected, rel=1e-9)
    assert res.certificate.value == pytest.approx(eps, rel=1e-8)


@pytest.mark.parametrize("eps", [1e-3, 0.1, 2.0])
def test_absolute_loss_closed_form(reg_data, eps):
    """theta2 = inf, absolute loss: |e_i - D_i| <= |e_i| + |D_i| and mean |D| <=
    ||beta|| sqrt(mean ||delta||^2) (Cauchy-Schwarz), equality moving every sample the same
    distance against the sign of its residual: W(eps) = mean |e| + ||beta|| sqrt(eps/theta1)
    (zero residuals do not occur in this continuous sample)."""
    model, X, y = reg_data
    theta1 = 0.7
    e = y - model.predict(X)
    expected = np.mean(np.abs(e)) + np.linalg.norm(model.coef_) * math.sqrt(eps / theta1)
    res = worst_case_risk(model, X, y, loss="absolute", eps=eps, theta1=theta1, theta2=INF)
    assert res.risk == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("eps", [1e-3, 0.02, 0.1])
def test_zero_one_moving_only_is_a_fractional_knapsack(clf_data, eps):
    """theta2 = inf, 0/1 loss: sample i becomes an error at cost theta1 d*_i / n (d*_i = m_i^2 /
    ||w||^2, its squared distance to the boundary), so W is the fractional knapsack: move the
    cheapest samples first until the budget eps is spent."""
    model, X, y = clf_data
    theta1 = 0.5
    s = np.where(y == 1, 1.0, -1.0)
    m = s * model.decision_function(X)
    w2 = float(model.coef_[0] @ model.coef_[0])
    cost = np.sort(theta1 * np.maximum(m, 0.0) ** 2 / w2 / len(y))
    cum = np.cumsum(cost)
    k = int(np.searchsorted(cum, eps, side="right"))  # samples moved whole
    spent = cum[k - 1] if k else 0.0
    expected = (k + (eps - spent) / cost[k]) / len(y)
    res = worst_case_risk(model, X, y, loss="zero_one", eps=eps, theta1=theta1, theta2=INF)
    assert res.risk == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5])
def test_zero_one_reweighting_only_is_a_bernoulli_kl_ball(clf_data, eps):
    """theta1 = inf, KL: the loss takes values 0/1 with base error rate p; the largest error
    rate among distributions with theta2 KL(Q || P) <= eps is the q >= p with
    KL(Bern(q) || Bern(p)) = eps / theta2 (reweighting within a class never helps)."""
    model, X, y = clf_data
    theta2 = 0.5
    p = float(np.mean(model.predict(X) != y))

    def kl(q):
        return q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))

    q = brentq(lambda t: kl(t) - eps / theta2, p, 1 - 1e-15)
    res = worst_case_risk(model, X, y, loss="zero_one", eps=eps, theta1=INF, theta2=theta2)
    assert res.risk == pytest.approx(q, rel=1e-9)


def test_worst_case_risk_is_concave_and_increasing_in_eps(clf_data):
    """W is the inverse of the convex increasing R(r), hence concave and increasing."""
    model, X, y = clf_data
    grid = np.linspace(0.01, 0.3, 8)
    W = np.array([worst_case_risk(model, X, y, loss="logistic", eps=e).risk for e in grid])
    assert np.all(np.diff(W) > 0)
    assert np.all(np.diff(W, 2) <= 1e-12)


def test_edge_cases(clf_data):
    model, X, y = clf_data
    base = float(np.mean(model.predict(X) != y))
    zero = worst_case_risk(model, X, y, loss="zero_one", eps=0.0)
    assert zero.status == "zero" and zero.risk == pytest.approx(base)
    assert zero.certificate.value == 0.0
    unbounded = worst_case_risk(model, X, y, loss="hinge", eps=INF)
    assert unbounded.status == "unbounded" and unbounded.risk == INF
    # 0/1 with every sample movable: the error rate is capped at 1, reached at a finite cost
    capped = worst_case_risk(model, X, y, loss="zero_one", eps=INF)
    assert capped.status == "capped" and capped.risk == 1.0
    assert capped.certificate.risk_star == pytest.approx(1.0)
    assert capped.eps_sup == pytest.approx(capped.certificate.value)
    # nothing may move or reweight: the budget buys nothing
    frozen = worst_case_risk(model, X, y, loss="hinge", eps=1.0, theta1=INF, theta2=INF)
    assert frozen.status == "capped"
    assert frozen.risk == pytest.approx(np.mean(np.maximum(
        0, 1 - np.where(y == 1, 1, -1) * model.decision_function(X))))


def test_reweighting_only_cap_is_the_largest_loss(clf_data):
    """theta1 = inf, KL: the risk can reach the largest loss, at cost theta2 log(n / k)
    (all mass on the k samples of largest loss); beyond that budget the answer is capped."""
    model, X, y = clf_data
    theta2 = 0.3
    lmax = float(np.max(np.maximum(0, 1 - np.where(y == 1, 1, -1)
                                   * model.decision_function(X))))
    cost = theta2 * math.log(len(y))  # a single sample has the largest loss here
    below = worst_case_risk(model, X, y, loss="hinge", eps=0.5 * cost, theta1=INF,
                            theta2=theta2)
    assert below.status == "optimal" and below.risk < lmax
    above = worst_case_risk(model, X, y, loss="hinge", eps=2 * cost, theta1=INF, theta2=theta2)
    assert above.status == "capped" and above.risk == pytest.approx(lmax)
    assert above.eps_sup == pytest.approx(cost, rel=1e-9)


def test_features_mask_limits_the_worst_case(clf_data):
    model, X, y = clf_data
    full = worst_case_risk(model, X, y, loss="logistic", eps=0.1)
    one = worst_case_risk(model, X, y, loss="logistic", eps=0.1, features=[2])
    assert one.risk < full.risk
    again = otstab.certify(model, X, y, loss="logistic", r=one.risk, features=[2])
    assert again.value == pytest.approx(0.1, rel=1e-8)


def test_does_not_mutate_inputs(clf_data):
    model, X, y = clf_data
    X0, y0 = X.copy(), y.copy()
    worst_case_risk(model, X, y, loss="hinge", eps=0.1)
    assert np.array_equal(X, X0) and np.array_equal(y, y0)


@pytest.mark.parametrize("eps,err", [(-1.0, ValidationError), (math.nan, ValidationError),
                                     ("0.1", InputTypeError), (True, InputTypeError)])
def test_bad_eps(clf_data, eps, err):
    model, X, y = clf_data
    with pytest.raises(err, match="eps"):
        worst_case_risk(model, X, y, loss="hinge", eps=eps)


def test_bad_prices_and_models(clf_data):
    model, X, y = clf_data
    with pytest.raises(ValidationError, match="theta1"):
        worst_case_risk(model, X, y, loss="hinge", eps=0.1, theta1=0.0)
    with pytest.raises(ValidationError, match="divergence"):
        worst_case_risk(model, X, y, loss="hinge", eps=0.1, divergence="tv")
    mlp = MLPClassifier(hidden_layer_sizes=(3,), max_iter=50, random_state=0)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp.fit(X, y)
    with pytest.raises(IncompatibleLossError, match="linear model"):
        worst_case_risk(mlp, X, y, loss="logistic", eps=0.1)


def test_result_serialises(clf_data):
    model, X, y = clf_data
    res = otstab.worst_case_risk(model, X, y, loss="hinge", eps=0.1)
    d = res.to_dict()
    assert d["risk"] == res.risk and "certificate" not in d
    assert "worst-case risk" in res.summary()
    assert res.X_star.shape[1] == X.shape[1]
