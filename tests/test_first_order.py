"""First-order solver (otstab_solvers.first_order) and model adapters (otstab.nonlinear).

References are computed independently in each test: the 1-D dual maximised by
scipy.optimize.minimize_scalar with exact d-transforms (LogisticOracle, the hinge formula
``l_h = max(0, (1 - m) h + ||w||^2 h^2 / (4 theta1))``, ``l_h = h * loss`` when samples cannot
move), and primal audits recomputed from the returned atoms by calling the model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from otstab_solvers.first_order import solve_first_order
from otstab_solvers.smooth import LogisticOracle, SquaredOracle
from otstab_solvers.weights import chi2_dual_term, kl_dual_term, phi
from scipy.optimize import minimize_scalar

sklearn = pytest.importorskip("sklearn")
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402

from otstab import nonlinear  # noqa: E402
from otstab.errors import IncompatibleLossError, InputTypeError  # noqa: E402


def exact_dual(lh_fn, r, theta2, divergence, h_max=50.0):
    """sup_h F(h) by bounded scalar minimisation of -F (F is concave)."""
    term = (lambda lh: kl_dual_term(lh, theta2)) if divergence == "kl" else (
        lambda lh: chi2_dual_term(lh, theta2))
    res = minimize_scalar(lambda h: -(h * r - term(lh_fn(h))), bounds=(0.0, h_max),
                          method="bounded", options={"xatol": 1e-12})
    return float(res.x), float(-res.fun)


@pytest.fixture(scope="module")
def toy():
    """The paper's toy (Sec. 3): two Gaussian classes in 2-D."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal([2.0, 2.0], 1.0, (60, 2)), rng.normal([-1.0, -1.0], 1.0, (60, 2))])
    y = np.r_[np.zeros(60), np.ones(60)].astype(int)
    return X, y


def logistic_lg(w, b):
    def lg(Z, ys):
        m = ys * (Z @ w + b)
        return np.logaddexp(0.0, -m), (-ys / (1.0 + np.exp(m)))[:, None] * w[None, :]
    return lg


def hinge_lg(w, b):
    def lg(Z, ys):
        m = ys * (Z @ w + b)
        act = m < 1.0
        return np.maximum(0.0, 1.0 - m), np.where(act[:, None], -ys[:, None] * w[None, :], 0.0)
    return lg


def audit(sol, lg, X, y, r, theta1, theta2, divergence):
    """Recompute cost, risk and mass of the returned atoms from the model."""
    n = X.shape[0]
    src, share, w = sol.atom_source, sol.atom_share, sol.atom_weight
    loss = lg(sol.atom_X, y[src])[0]
    moved = np.sum((sol.atom_X - X[src]) ** 2, axis=1)
    cost = (theta1 * np.sum(share * w * moved) if math.isfinite(theta1) else 0.0) / n
    cost += (theta2 * np.sum(share * phi(w, divergence)) if math.isfinite(theta2) else 0.0) / n
    risk = float(np.sum(share * w * loss)) / n
    mass = float(np.sum(share * w)) / n
    return cost, risk, mass


# ----------------------------------------------------------------------------------------------
# agreement with the exact path on linear models
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("r", [0.3, 1.5])
def test_logistic_first_order_matches_exact(toy, divergence, r):
    X, y = toy
    clf = LogisticRegression().fit(X, y)
    w, b = clf.coef_[0], float(clf.intercept_[0])
    ys = 2.0 * y - 1.0
    theta1, theta2 = 1.0, 0.25
    orc = LogisticOracle.from_linear(X, ys, w, b, theta1)
    h_ref, R_ref = exact_dual(lambda h: orc.evaluate(h)[0], r, theta2, divergence)
    lg = logistic_lg(w, b)
    sol = solve_first_order(lg, X, ys, r=r, theta1=theta1, theta2=theta2, divergence=divergence)
    assert sol.status == "local_optimum"
    assert sol.value == pytest.approx(R_ref, rel=1e-3)
    assert sol.h == pytest.approx(h_ref, rel=1e-3)
    cost, risk, mass = audit(sol, lg, X, ys, r, theta1, theta2, divergence)
    assert risk == pytest.approx(r, abs=1e-3)
    assert mass == pytest.approx(1.0, abs=1e-9)
    assert cost == pytest.approx(sol.value, rel=1e-3)
    assert cost == pytest.approx(sol.primal_cost, rel=1e-9)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("r", [0.5, 3.0])
def test_hinge_first_order_matches_exact(toy, divergence, r):
    X, y = toy
    rng = np.random.default_rng(1)
    w, b = np.array([-1.1, -0.8]) + 0.1 * rng.normal(size=2), 0.3
    ys = 2.0 * y - 1.0
    m = ys * (X @ w + b)
    a = float(w @ w)
    theta1, theta2 = 1.0, 0.25
    assert np.mean(m >= 1.0) > 0.5  # most samples sit where the hinge is flat

    def lh_fn(h):
        return np.maximum(0.0, (1.0 - m) * h + h * h * a / (4.0 * theta1))

    _, R_ref = exact_dual(lh_fn, r, theta2, divergence)
    lg = hinge_lg(w, b)
    sol = solve_first_order(lg, X, ys, r=r, theta1=theta1, theta2=theta2, divergence=divergence)
    assert sol.value == pytest.approx(R_ref, rel=1e-3)
    cost, risk, _ = audit(sol, lg, X, ys, r, theta1, theta2, divergence)
    assert risk == pytest.approx(r, abs=1e-3)
    assert cost == pytest.approx(R_ref, rel=1e-3)


def test_hinge_warm_only_is_an_upper_bound(toy):
    """Without the shared-direction start gradient ascent cannot leave the flat region of the
    hinge: the result is then a local estimate above the exact value (documented)."""
    X, y = toy
    w, b = np.array([-1.1, -0.8]), 0.3
    ys = 2.0 * y - 1.0
    m = ys * (X @ w + b)
    a = float(w @ w)
    _, R_ref = exact_dual(lambda h: np.maximum(0.0, (1 - m) * h + h * h * a / 4.0), 1.0, 0.25,
                          "chi2")
    sol = solve_first_order(hinge_lg(w, b), X, ys, r=1.0, theta1=1.0, theta2=0.25,
                            divergence="chi2", starts="warm")
    assert sol.primal_cost >= R_ref * (1 - 1e-9)
    assert sol.value > R_ref * (1 + 1e-3)


def test_squared_first_order_matches_exact():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(80, 3))
    beta = np.array([1.0, -0.5, 0.3])
    yv = X @ beta + 0.5 * rng.normal(size=80)
    theta1, theta2, r = 1.0, 0.5, 2.0
    orc = SquaredOracle.from_linear(X, yv, beta, 0.0, theta1)
    _, R_ref = exact_dual(lambda h: orc.evaluate(h)[0], r, theta2, "kl",
                          h_max=orc.h_max * (1 - 1e-9))

    def lg(Z, t):
        e = t - Z @ beta
        return e * e, -2.0 * e[:, None] * beta[None, :]

    sol = solve_first_order(lg, X, yv, r=r, theta1=theta1, theta2=theta2)
    assert sol.value == pytest.approx(R_ref, rel=1e-3)
    assert sol.risk == pytest.approx(r, abs=1e-3)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_reweighting_only(toy, divergence):
    """theta1 = inf: l_h = h * loss, no inner solve (one gradient evaluation per sample)."""
    X, y = toy
    w, b = np.array([-1.0, -1.0]), 0.5
    ys = 2.0 * y - 1.0
    lg = logistic_lg(w, b)
    loss = lg(X, ys)[0]
    r = 0.5 * (loss.mean() + loss.max())
    _, R_ref = exact_dual(lambda h: h * loss, r, 0.3, divergence, h_max=200.0)
    sol = solve_first_order(lg, X, ys, r=r, theta1=math.inf, theta2=0.3, divergence=divergence)
    assert sol.n_grad_evals == X.shape[0]
    np.testing.assert_array_equal(sol.atom_X, X[sol.atom_source])
    assert sol.value == pytest.approx(R_ref, rel=1e-6)
    assert sol.risk == pytest.approx(r, abs=1e-6)
    # above the largest loss, reweighting alone cannot reach r
    bad = solve_first_order(lg, X, ys, r=loss.max() * 1.01, theta1=math.inf, theta2=0.3)
    assert bad.status == "unreachable" and bad.value == math.inf


def test_no_reweighting_and_trivial_threshold(toy):
    X, y = toy
    w, b = np.array([-1.0, -1.0]), 0.5
    ys = 2.0 * y - 1.0
    lg = logistic_lg(w, b)
    sol = solve_first_order(lg, X, ys, r=0.6, theta1=1.0, theta2=math.inf)
    np.testing.assert_array_equal(sol.atom_weight, 1.0)
    orc = LogisticOracle.from_linear(X, ys, w, b, 1.0)
    res = minimize_scalar(lambda h: -(0.6 * h - orc.evaluate(h)[0].mean()), bounds=(0, 50),
                          method="bounded", options={"xatol": 1e-12})
    assert sol.value == pytest.approx(-res.fun, rel=1e-4)
    base = lg(X, ys)[0].mean()
    zero = solve_first_order(lg, X, ys, r=0.5 * base, theta1=1.0, theta2=0.25)
    assert zero.value == 0.0 and zero.h == 0.0
    np.testing.assert_array_equal(zero.atom_X, X)


def test_mask_only_moves_masked_features(toy):
    X, y = toy
    w, b = np.array([-1.0, -1.2]), 0.5
    ys = 2.0 * y - 1.0
    mask = np.array([False, True])
    lg = logistic_lg(w, b)
    sol = solve_first_order(lg, X, ys, r=0.5, mask=mask)
    np.testing.assert_array_equal(sol.atom_X[:, 0], X[sol.atom_source, 0])
    orc = LogisticOracle.from_linear(X, ys, w, b, 1.0, mask=mask)
    _, R_ref = exact_dual(lambda h: orc.evaluate(h)[0], 0.5, 0.25, "kl")
    assert sol.value == pytest.approx(R_ref, rel=1e-3)


# ----------------------------------------------------------------------------------------------
# MLP: audit, Q* risk, envelope vs the paper's Adam outer loop
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp(toy):
    X, y = toy
    clf = MLPClassifier(hidden_layer_sizes=(16,), activation="tanh", max_iter=3000,
                        random_state=0).fit(X, y)
    return clf, nonlinear.MLPModel(clf).bind_loss("logistic")


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_mlp_primal_audit(toy, mlp, divergence):
    X, y = toy
    clf, ad = mlp
    ys = 2.0 * y - 1.0
    r, theta1, theta2 = 0.5, 1.0, 0.25
    X_before = X.copy()
    sol = solve_first_order(ad.loss_and_grad, X, ys, r=r, theta1=theta1, theta2=theta2,
                            divergence=divergence)
    assert np.array_equal(X, X_before)
    assert sol.status == "local_optimum"
    # recompute the loss at the atoms with scikit-learn's own probabilities
    proba = clf.predict_proba(sol.atom_X)[:, 1]
    t = (ys[sol.atom_source] > 0)
    loss = -np.log(np.where(t, proba, 1.0 - proba))
    n = X.shape[0]
    risk = float(np.sum(sol.atom_share * sol.atom_weight * loss)) / n
    assert risk >= r - 1e-3 and risk == pytest.approx(r, abs=1e-3)
    cost, _, mass = audit(sol, ad.loss_and_grad, X, ys, r, theta1, theta2, divergence)
    assert mass == pytest.approx(1.0, abs=1e-9)
    assert cost == pytest.approx(sol.value, rel=1e-3)
    # the trace converges to r
    assert abs(sol.trace["risk"][-1] - r) <= 1e-3 * r
    assert len(sol.trace["h"]) == sol.iterations
    assert sol.trace["n_grad_evals"][-1] == sol.n_grad_evals


def evals_to_reach(trace, key, target, rtol):
    """Gradient evaluations after which trace[key] stays within rtol of target."""
    a = np.asarray(trace[key])
    ev = np.asarray(trace["n_grad_evals"])
    bad = np.nonzero(np.abs(a - target) > rtol * abs(target))[0]
    k = bad[-1] + 1 if bad.size else 0
    return ev[k] if k < ev.size else math.inf


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_envelope_needs_far_fewer_gradient_evaluations_than_adam(toy, mlp, divergence):
    """The envelope root search reaches the paper's Adam outer loop's value (and Q(t)'s risk
    reaches r) in at least 5x fewer gradient evaluations (same inner solver)."""
    X, y = toy
    _, ad = mlp
    ys = 2.0 * y - 1.0
    r = 0.5
    env = solve_first_order(ad.loss_and_grad, X, ys, r=r, divergence=divergence)
    # the paper's loop, run to a tight tolerance so that its final value is a sharp target
    adam = solve_first_order(ad.loss_and_grad, X, ys, r=r, divergence=divergence, outer="adam",
                             tol=1e-6)
    assert adam.status == "local_optimum"
    V = adam.value
    assert env.value == pytest.approx(V, rel=1e-6)
    ratios = []
    for key, target, rtol in (("value", V, 1e-6), ("risk", r, 1e-3)):
        ea = evals_to_reach(adam.trace, key, target, rtol)
        ee = evals_to_reach(env.trace, key, target, rtol)
        ratios.append(ea / ee)
    print(f"\n[{divergence}] gradient evaluations: envelope {env.n_grad_evals}, "
          f"adam {adam.n_grad_evals}; ratio to reach the value {ratios[0]:.1f}x, "
          f"to reach the risk {ratios[1]:.1f}x")
    assert min(ratios) >= 5.0


def test_reproducible_and_random_starts(toy, mlp):
    X, y = toy
    _, ad = mlp
    ys = 2.0 * y - 1.0
    a = solve_first_order(ad.loss_and_grad, X, ys, r=0.5, random_starts=2, seed=3)
    b = solve_first_order(ad.loss_and_grad, X, ys, r=0.5, random_starts=2, seed=3)
    assert a.value == b.value and a.n_grad_evals == b.n_grad_evals
    np.testing.assert_array_equal(a.atom_X, b.atom_X)


def test_callback_verbose_and_validation(toy, mlp):
    X, y = toy
    _, ad = mlp
    ys = 2.0 * y - 1.0
    seen = []

    def cb(state):
        seen.append(state)
        return len(seen) >= 2

    sol = solve_first_order(ad.loss_and_grad, X, ys, r=0.5, callback=cb, verbose=True)
    assert sol.status == "stopped" and len(seen) == 2 and sol.iterations == 2
    assert set(seen[0]) == {"iteration", "h", "risk", "value", "n_grad_evals"}
    with pytest.raises(ValueError, match="outer"):
        solve_first_order(ad.loss_and_grad, X, ys, r=0.5, outer="sgd")
    with pytest.raises(ValueError, match="divergence"):
        solve_first_order(ad.loss_and_grad, X, ys, r=0.5, divergence="tv")
    with pytest.raises(ValueError, match="theta1"):
        solve_first_order(ad.loss_and_grad, X, ys, r=0.5, theta1=0.0)
    with pytest.raises(ValueError, match="y must have shape"):
        solve_first_order(ad.loss_and_grad, X, ys[:-1], r=0.5)
    with pytest.raises(ValueError, match="grad of shape"):
        solve_first_order(lambda Z, t: (np.zeros(len(Z)), np.zeros((len(Z), 1))), X, ys, r=0.5)
    with pytest.raises(TypeError, match="callable"):
        solve_first_order(None, X, ys, r=0.5)


# ----------------------------------------------------------------------------------------------
# adapters
# ----------------------------------------------------------------------------------------------


def fd_grad(fn, X, y, eps=1e-6):
    G = np.zeros_like(X)
    for j in range(X.shape[1]):
        E = np.zeros_like(X)
        E[:, j] = eps
        G[:, j] = (fn(X + E, y)[0] - fn(X - E, y)[0]) / (2 * eps)
    return G


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("activation", ["identity", "logistic", "tanh", "relu"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_mlp_classifier_adapter(activation, n_classes):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(80, 3))
    y = rng.integers(0, n_classes, 80)
    labels = np.array(["a", "b", "c"])[:n_classes]
    clf = MLPClassifier(hidden_layer_sizes=(6, 5), activation=activation, max_iter=300,
                        random_state=0).fit(X, labels[y])
    ad = nonlinear.adapt(clf)
    assert isinstance(ad, nonlinear.MLPModel)
    assert ad.task == ("binary" if n_classes == 2 else "multiclass")
    yi = (2.0 * y - 1.0) if n_classes == 2 else y
    ad.bind_loss("cross_entropy")
    loss, grad = ad.loss_and_grad(X, yi)
    # loss = -log predict_proba of the true class (scikit-learn's own forward pass)
    p = clf.predict_proba(X)[np.arange(80), y]
    np.testing.assert_allclose(loss, -np.log(p), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grad, fd_grad(ad.loss_and_grad, X, yi), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(ad.zero_one(X, yi), (clf.predict(X) != labels[y]))
    m, gm = ad.margin_and_grad(X, yi)
    np.testing.assert_array_equal(m > 0, clf.predict(X) == labels[y])
    if activation != "relu":  # relu margins have kinks where fd is unreliable
        np.testing.assert_allclose(gm, fd_grad(ad.margin_and_grad, X, yi), rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(IncompatibleLossError):
        ad.bind_loss("squared")
    if n_classes == 3:
        with pytest.raises(IncompatibleLossError):
            ad.bind_loss("logistic")


def test_mlp_regressor_adapter_and_zero_one_loss():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 2))
    t = X[:, 0] - np.sin(X[:, 1])
    reg = MLPRegressor(hidden_layer_sizes=(8,), max_iter=500, random_state=0).fit(X, t)
    ad = nonlinear.adapt(reg).bind_loss("squared")
    assert ad.task == "regression"
    loss, grad = ad.loss_and_grad(X, t)
    np.testing.assert_allclose(loss, (t - reg.predict(X)) ** 2, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad, fd_grad(ad.loss_and_grad, X, t), rtol=1e-5, atol=1e-7)
    with pytest.raises(IncompatibleLossError):
        ad.bind_loss("zero_one")
    clf = LogisticRegression().fit(X, (t > 0).astype(int))
    np.testing.assert_array_equal(nonlinear.zero_one_loss(clf, X, (t > 0).astype(int)),
                                  clf.predict(X) != (t > 0))


def test_callable_and_dispatch_errors():
    w = np.array([1.0, -1.0])

    def f(Z, ys):
        m = ys * (Z @ w)
        return np.logaddexp(0.0, -m), (-ys / (1.0 + np.exp(m)))[:, None] * w[None, :]

    cm = nonlinear.CallableModel(f, task="binary", predict=lambda Z: np.where(Z @ w > 0, 1, -1))
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    ys = np.array([1.0, 1.0])
    np.testing.assert_array_equal(cm.zero_one(X, ys), [0.0, 1.0])
    assert nonlinear.adapt(cm) is cm
    with pytest.raises(InputTypeError, match="CallableModel"):
        nonlinear.adapt(f)
    assert nonlinear.adapt(object()) is None
    with pytest.raises(InputTypeError):
        nonlinear.CallableModel(3)


def test_certify_integration_linear_and_mlp(toy, mlp):
    """certify() runs the exact oracle on linear models, the first-order path otherwise."""
    import otstab

    X, y = toy
    clf, _ = mlp
    lr = LogisticRegression().fit(X, y)
    exact = otstab.certify(lr, X, y, loss="logistic", r=0.5)
    fo = otstab.certify(lr, X, y, loss="logistic", r=0.5, solver="first_order")
    assert exact.exact and not fo.exact and fo.solver == "first_order"
    assert fo.value == pytest.approx(exact.value, rel=1e-3)
    assert exact.gap < 1e-6 and exact.risk_star == pytest.approx(0.5, abs=1e-6)
    res = otstab.certify(clf, X, y, loss="logistic", r=0.5, inner_method="gradient")
    assert res.status == "bounds" and res.risk_star == pytest.approx(0.5, abs=1e-3)
    assert "local" in res.message
    with pytest.raises(Exception, match="unknown solver option"):
        otstab.certify(clf, X, y, loss="logistic", r=0.5, bogus=1)
    reg = LinearRegression().fit(X, X[:, 0])
    sq = otstab.certify(reg, X, X[:, 0] + 0.5, loss="squared", r=1.0)
    assert sq.exact and sq.risk_star == pytest.approx(1.0, abs=1e-6)


def test_torch_module_adapter(toy, mlp):
    torch = pytest.importorskip("torch")
    X, y = toy
    clf, ad = mlp
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    net = net.double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor(clf.coefs_[0].T))
        net[0].bias.copy_(torch.tensor(clf.intercepts_[0]))
        net[2].weight.copy_(torch.tensor(clf.coefs_[1].T))
        net[2].bias.copy_(torch.tensor(clf.intercepts_[1]))
    net.train()
    with pytest.raises(InputTypeError, match="TorchModel"):
        nonlinear.adapt(net)  # one output: binary or regression?
    tm = nonlinear.TorchModel(net, task="binary").bind_loss("logistic")
    ys = 2.0 * y - 1.0
    l1, g1 = tm.loss_and_grad(X, ys)
    l2, g2 = ad.loss_and_grad(X, ys)
    np.testing.assert_allclose(l1, l2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g1, g2, rtol=1e-10, atol=1e-12)
    assert net.training  # mode restored
    assert all(p.grad is None for p in net.parameters())  # no parameter gradients
    m1 = tm.margin_and_grad(X, ys)
    m2 = ad.margin_and_grad(X, ys)
    np.testing.assert_allclose(m1[0], m2[0], rtol=1e-12)
    np.testing.assert_allclose(m1[1], m2[1], rtol=1e-10, atol=1e-12)
