"""Linear bound propagation (otstab.solve._crown) checked against exhaustive grids and exact paths.

* every relaxation lies below / above its activation on a dense grid of its interval;
* on 2-D toy networks, a grid over each ball: the network's margins never fall below the
  propagated linear bound, no grid point inside a certified radius is misclassified, and the
  maximum over a grid of ``h l(f(x), y) - theta1 |x - x_i|^2`` never exceeds the nested-ball
  over-estimate of the d-transform;
* identity activations: the certified distance is the exact linear one (closed form, 1e-9);
* through ``certify``: ``value_lower <= value_upper``, and for identity MLPs ``value_lower <=``
  the exact linear R.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import otstab
from otstab import bounds
from otstab.modeling._nonlinear import MLPModel
from otstab.solve import _crown as crown

sk_nn = pytest.importorskip("sklearn.neural_network")
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

ACTS = [("relu", 0.0), ("leaky_relu", 0.1), ("tanh", 0.0), ("logistic", 0.0), ("gelu", 0.0),
        ("identity", 0.0)]


def _g(act, z):
    return crown.activation(crown.Ops(), act, z)


@pytest.mark.parametrize("act", ACTS, ids=[a[0] for a in ACTS])
def test_relaxations_enclose_the_activation_on_a_grid(act):
    rng = np.random.default_rng(0)
    lo = rng.normal(scale=3, size=400)
    hi = lo + np.abs(rng.normal(scale=2, size=400)) * rng.choice([1e-12, 1e-3, 1, 5], size=400)
    kl, cl, ku, cu = crown.relax(crown.Ops(), act, lo, hi)
    t = np.linspace(0, 1, 2001)[:, None]
    Z = lo[None] + t * (hi - lo)[None]
    G = _g(act, Z)
    assert np.all(kl * Z + cl <= G + 1e-15 * (1 + np.abs(G)))
    assert np.all(G <= ku * Z + cu + 1e-15 * (1 + np.abs(G)))
    if act[0] in ("tanh", "logistic", "gelu"):  # not vacuous: the gap is small on short spans
        short = (hi - lo) < 1e-2
        gap = (cu - cl)[short]
        assert np.all(gap < 1e-4)


def _random_net(acts, d=2, widths=(10, 8), out=1, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    dims = [d, *widths[:len(acts)], out]
    W = [rng.normal(scale=scale / np.sqrt(a), size=(a, b)) for a, b in zip(dims[:-1], dims[1:])]
    b = [rng.normal(scale=0.3, size=bb) for bb in dims[1:]]
    return crown.Network(W, b, list(acts), "binary" if out == 1 else "multiclass",
                         crown.Ops())


def _ball_grid(x, rho, k=60):
    """Polar grid of the closed ball (radii up to rho, 4k angles), plus the center."""
    r = np.linspace(0, rho, k)[:, None]
    a = np.linspace(0, 2 * np.pi, 4 * k, endpoint=False)[None, :]
    pts = np.stack([x[0] + r * np.cos(a), x[1] + r * np.sin(a)], -1).reshape(-1, 2)
    return pts


NETS = [[a] for a in ACTS[:5]] + [[ACTS[0], ACTS[2]], [ACTS[4], ACTS[1]], [ACTS[3], ACTS[3]]]


@pytest.mark.parametrize("acts", NETS, ids=["-".join(a[0] for a in n) for n in NETS])
def test_linear_lower_bound_holds_on_a_grid_of_each_ball(acts):
    rng = np.random.default_rng(1)
    for out in (1, 3):
        net = _random_net(acts, out=out, seed=len(acts) + out)
        X = rng.normal(size=(6, 2))
        rho = rng.uniform(0.05, 1.5, size=6)
        C = crown.margin_rows(net, rng.integers(0, 2 if out == 1 else 3, size=6))
        for opt in (0, 10):
            c, s = crown.linear_lower(net, X, rho, C, optimize=opt)
            for i in range(6):
                P = _ball_grid(X[i], rho[i], 30)
                F = net.outputs(P)
                F = F[:, None] if F.ndim == 1 else F
                M = F @ C[i].T  # (points, m)
                dist = np.linalg.norm(P - X[i], axis=1)
                assert np.all(M >= c[i][None] - s[i][None] * dist[:, None] - 1e-12)


def _toy(activation, k=2, seed=0, hidden=(16,)):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(150, 2))
    s = X @ rng.normal(size=(2, k)) + np.sin(2 * X[:, :1])
    y = np.argmax(s, axis=1) if k > 2 else (s[:, 0] > 0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        m = sk_nn.MLPClassifier(hidden, activation=activation, random_state=seed,
                                max_iter=400).fit(X, y)
    return m, X[:40], y[:40]


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic"])
@pytest.mark.parametrize("k", [2, 3])
def test_no_misclassified_grid_point_inside_a_certified_radius(activation, k):
    m, X, y = _toy(activation, k, seed=k, hidden=(16,) if activation == "relu" else (12, 8))
    ad = MLPModel(m)
    yi = np.searchsorted(m.classes_, y)
    net = crown.as_network(ad)
    rho = crown.certified_radius(net, X, yi)
    pred0 = m.predict(X)
    ok = pred0 == y
    assert np.all(rho[~ok] == 0)
    assert np.median(rho[ok]) > 0.05  # not vacuous
    for i in np.flatnonzero(ok):
        P = _ball_grid(X[i], rho[i] * (1 - 1e-9), 40)
        assert np.all(m.predict(P) == y[i])


@pytest.mark.parametrize("loss,k", [("logistic", 2), ("cross_entropy", 3)])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_d_transform_over_estimate_beats_an_exhaustive_grid(loss, k, activation):
    m, X, y = _toy(activation, k, seed=5)
    ad = MLPModel(m).bind_loss(loss)
    yint = np.where(y == 1, 1, -1) if k == 2 else y
    theta1 = 1.0
    orc = crown.smooth_oracle(MLPModel(m), loss, X[:8], yint[:8], theta1, h_ref=0.5,
                              n_radii=16)
    g = np.linspace(-5, 5, 161)
    P = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    for i in range(8):
        L = ad.loss_values(P, np.full(len(P), yint[i]))
        d2 = np.sum((P - X[i]) ** 2, axis=1)
        for h in (0.05, 0.5, 2.0, 8.0):
            u = orc.evaluate(h)[0][i]
            grid = float(np.max(h * L - theta1 * d2))
            assert grid <= u + 1e-12 * (1 + abs(u)), (i, h, grid, u)
    # and not vacuous near the reference h: within a factor 3 of the grid's value on average
    h = 0.5
    u = orc.evaluate(h)[0]
    grid = np.array([np.max(h * ad.loss_values(P, np.full(len(P), yint[i]))
                            - np.sum((P - X[i]) ** 2, axis=1)) for i in range(8)])
    assert np.mean(u) <= 3.0 * np.mean(grid)


def test_identity_network_is_the_exact_linear_distance():
    for k in (2, 3):
        m, X, y = _toy("identity", k, seed=3, hidden=(6, 4))
        ad = MLPModel(m)
        W = ad.W[0] @ ad.W[1] @ ad.W[2]
        b = (ad.b[0] @ ad.W[1] + ad.b[1]) @ ad.W[2] + ad.b[2]
        F = X @ W + b
        yi = np.searchsorted(m.classes_, y)
        if k == 2:
            s = np.where(yi == 1, 1.0, -1.0)
            exact = np.where(s * F[:, 0] > 0, (F[:, 0] / np.linalg.norm(W)) ** 2, 0.0)
        else:
            exact = np.empty(len(y))
            for i in range(len(y)):
                others = [j for j in range(k) if j != yi[i]]
                dm = [(F[i, yi[i]] - F[i, j]) / np.linalg.norm(W[:, yi[i]] - W[:, j])
                      for j in others]
                exact[i] = min(dm) ** 2 if min(dm) > 0 else 0.0
        net = crown.as_network(ad)
        rho = crown.certified_radius(net, X, yi)
        np.testing.assert_allclose(rho ** 2, exact, rtol=1e-9, atol=1e-300)
        yint = np.where(yi == 1, 1, -1) if k == 2 else yi
        dlow, info = bounds.certified_distances(ad, X, yint)
        np.testing.assert_allclose(dlow, exact, rtol=1e-9, atol=1e-300)
        assert "CROWN" in info["method"]


def test_masked_coordinates_do_not_move():
    m, X, y = _toy("relu", 2, seed=0)
    net = crown.as_network(MLPModel(m))
    mv = np.array([True, False])
    rho = crown.certified_radius(net, X, y, mask=mv)
    for i in np.flatnonzero(rho > 0):
        t = np.linspace(-rho[i], rho[i], 801) * (1 - 1e-9)
        P = np.column_stack([X[i, 0] + t, np.full_like(t, X[i, 1])])
        assert np.all(m.predict(P) == y[i])
    full = crown.certified_radius(net, X, y)
    assert np.all(rho >= full * (1 - 1e-9))  # fewer directions: a radius at least as large
    none = crown.certified_radius(net, X, y, mask=np.zeros(2, bool))
    assert np.all(none[m.predict(X) == y] == np.inf)


@pytest.mark.parametrize("loss", ["zero_one", "logistic"])
def test_certify_interval_is_ordered_and_tighter_than_before(loss):
    m, X, y = _toy("relu", 2, seed=7)
    kw = dict(theta1=1.0, theta2=0.5, divergence="kl")
    ad = MLPModel(m).bind_loss("logistic")
    base = float(np.mean(ad.loss_values(X, np.where(y == 1, 1, -1))))
    r = 0.3 if loss == "zero_one" else base + 0.3
    res = otstab.certify(m, X, y, loss=loss, r=r, **kw)
    assert res.status == "bounds"
    assert 0 < res.value_lower <= res.value_upper
    assert "CROWN" in res.message or "CROWN" in str(res.info.get("lower_bound"))


def test_identity_mlp_smooth_lower_bound_is_below_the_exact_linear_value():
    m, X, y = _toy("identity", 2, seed=3, hidden=(6,))
    ad = MLPModel(m)
    W = ad.W[0] @ ad.W[1]
    b = ad.b[0] @ ad.W[1] + ad.b[1]
    from sklearn.linear_model import LogisticRegression
    lin = LogisticRegression().fit(X, y)
    lin.coef_, lin.intercept_ = W.T.copy(), b.copy()
    kw = dict(loss="logistic", theta1=1.0, theta2=0.5, divergence="kl")
    base = float(np.mean(ad.bind_loss("logistic").loss_values(X, np.where(y == 1, 1, -1))))
    exact = otstab.certify(lin, X, y, r=base + 0.2, **kw)
    res = otstab.certify(m, X, y, r=base + 0.2, **kw)
    assert exact.status == "optimal"
    assert res.value_lower <= exact.value * (1 + 1e-9)
    assert res.value_lower >= 0.5 * exact.value  # and not vacuous


def _grid_dstar(m, x, y, half=3.0, k=601):
    """The smallest squared distance from x to a misclassified point of a fine grid around
    it (an upper bound on d*, within the grid's resolution of it)."""
    g = np.linspace(-half, half, k)
    P = np.stack(np.meshgrid(x[0] + g, x[1] + g), -1).reshape(-1, 2)
    wrong = m.predict(P) != y
    return float(np.min(np.sum((P[wrong] - x) ** 2, axis=1))) if wrong.any() else np.inf


def _regions_vs_grid(k, n, half, res, seed=11):
    from otstab.solve._relu_regions import region_lower_distances
    m, X, y = _toy("relu", k, seed=seed, hidden=(8,))
    X, y = X[:n], y[:n]
    net = crown.as_network(MLPModel(m))
    yi = np.searchsorted(m.classes_, y)
    ok = m.predict(X) == y
    grid = np.array([_grid_dstar(m, X[i], y[i], half, res) if ok[i] else 0.0
                     for i in range(len(y))])
    up = np.where(np.isfinite(grid), grid, 100.0)
    ex, pts = region_lower_distances(net, X, yi, up)
    done = np.isfinite(ex)
    assert done[ok].mean() > 0.8
    step = 2 * half / (res - 1)
    for i in np.flatnonzero(done & ok):
        assert ex[i] <= grid[i] * (1 + 1e-12)  # sound
        # exact: the grid's distance is within its resolution of the bound (where the grid's
        # square holds the whole disc of that radius)
        if np.sqrt(grid[i]) < half - step:
            assert np.sqrt(grid[i]) - np.sqrt(ex[i]) <= step * np.sqrt(2) + 1e-9
        P = _ball_grid(X[i], np.sqrt(ex[i]) * (1 - 1e-9), 30)
        assert np.all(m.predict(P) == y[i])


@pytest.mark.parametrize("k", [2, 3])
def test_activation_regions_are_sound_and_exact_on_a_grid(k):
    _regions_vs_grid(k, 12, 2.5, 251)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [2, 3])
def test_activation_regions_on_fine_grids(k, seed):
    _regions_vs_grid(k, 40, 3.0, 801, seed)


def test_refined_points_are_misclassified_and_never_farther():
    from otstab.modeling._perturbation import perturbation_search
    from otstab.solve._neural_search import refine_min_norm
    m, X, y = _toy("tanh", 3, seed=2, hidden=(12,))
    ad = MLPModel(m)
    yi = np.searchsorted(m.classes_, y)
    pr = perturbation_search(ad, X, yi, labels="internal")
    P0, D0 = pr.points.copy(), pr.distances.copy()
    P, D = refine_min_norm(ad, X, yi, pr.points, pr.distances)
    np.testing.assert_array_equal(pr.points, P0)  # inputs untouched
    assert np.all(D <= D0)
    moved = D < D0
    assert np.all(m.predict(P[moved]) != y[moved])
    np.testing.assert_allclose(np.sum((P[moved] - X[moved]) ** 2, axis=1), D[moved],
                               rtol=1e-12)


def test_zero_one_interval_of_a_relu_mlp_closes():
    """One hidden ReLU layer: the regions make the certified side meet the found one."""
    m, X, y = _toy("relu", 2, seed=4, hidden=(8,))
    res = otstab.certify(m, X, y, loss="zero_one", r=0.3, theta1=1.0, theta2=0.5)
    assert res.status == "bounds"
    assert res.value_lower <= res.value_upper
    assert res.value_lower >= 0.99 * res.value_upper
    assert "activation regions" in res.info["lower_bound"]["method"]
