"""The found side of smooth losses of networks (otstab.solve._neural_found).

* ``certify(solver="auto")`` keeps the cheaper audited Q* of the Adam loop and of the second
  search, so its ``value_upper`` is never above ``solver="first_order"``'s (the paper's loop,
  deterministic), on binary logistic and multiclass cross-entropy toy nets;
* on a 2-D toy net, an exhaustive grid of ``h l(f(x), y) - theta1 |x - x_i|^2`` at the found h:
  the found points never beat the grid by more than its resolution allows, never exceed the
  certified over-estimate, and the found R is within 1% of the dual on the grid (an
  independent estimate of R from above: restricting moves to grid points only raises R);
* the solver hooks: moves stay inside ``max_move``; hint starts sit at the over-estimate's radius.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from otstab_solvers.dual import solve_dual
from otstab_solvers.first_order import solve_first_order

import otstab
from otstab.modeling._nonlinear import MLPModel
from otstab.solve import _crown as crown
from otstab.solve import _neural_found as neural_found

sk_nn = pytest.importorskip("sklearn.neural_network")
from sklearn.exceptions import ConvergenceWarning  # noqa: E402


def _toy(k=2, seed=1, n=40, hidden=(16,), activation="relu"):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 2))
    s = X @ rng.normal(size=(2, k)) + np.sin(2 * X[:, :1])
    y = np.argmax(s, axis=1) if k > 2 else (s[:, 0] > 0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        m = sk_nn.MLPClassifier(hidden, activation=activation, random_state=seed,
                                max_iter=300).fit(X, y)
    return m, X[:n], y[:n]


def _internal(m, y, k):
    return np.where(y == m.classes_[1], 1, -1) if k == 2 else np.searchsorted(m.classes_, y)


@pytest.mark.parametrize("loss,k,activation", [("logistic", 2, "relu"),
                                               ("logistic", 2, "tanh"),
                                               ("cross_entropy", 3, "relu")])
def test_never_worse_than_the_adam_loop(loss, k, activation):
    m, X, y = _toy(k, seed=k, n=25, activation=activation)
    ad = MLPModel(m).bind_loss(loss)
    r = float(np.mean(ad.loss_values(X, _internal(m, y, k)))) + 0.4
    kw = dict(loss=loss, r=r, theta1=1.0, theta2=0.5)
    adam = otstab.certify(m, X, y, solver="first_order", **kw)
    best = otstab.certify(m, X, y, **kw)
    assert adam.status == best.status == "bounds"
    assert best.value_upper <= adam.value_upper * (1 + 1e-12)
    assert best.value_lower == adam.value_lower  # the certified side is untouched
    assert best.value_lower <= best.value_upper
    assert best.risk_star >= r * (1 - 1e-9)
    assert "first_order+restarts" in best.info["found_costs"]


def test_found_side_against_an_exhaustive_2d_grid():
    m, X, y = _toy(2, seed=1, n=20)
    ad = MLPModel(m).bind_loss("logistic")
    yi = _internal(m, y, 2)
    theta1, theta2 = 1.0, 1.0
    r = float(np.mean(ad.loss_values(X, yi))) + 0.5
    res = otstab.certify(m, X, y, loss="logistic", r=r, theta1=theta1, theta2=theta2)
    h = res.h
    g = np.linspace(-6, 6, 161)
    P = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    LY = np.stack([ad.loss_values(P, np.full(len(P), c)) for c in yi])  # (n, grid)
    D2 = np.sum((P[None] - X[:, None]) ** 2, axis=2)
    step = g[1] - g[0]

    class Grid:  # the d-transform restricted to grid points (an under-estimate)
        h_max, n = math.inf, len(y)

        def evaluate(self, hh):
            obj = hh * LY - theta1 * D2
            j = np.argmax(obj, axis=1)
            rows = np.arange(self.n)
            return obj[rows, j], LY[rows, j], np.zeros(self.n)

    grid_R = solve_dual(Grid(), r, theta2, "kl").value
    assert res.value_lower <= grid_R
    assert res.value_upper <= grid_R * 1.01  # the search finds R to 1%
    # per sample at the found h: the found points' objective is at most the certified
    # over-estimate, and the grid's best is at most that too
    src = res.source
    first = np.unique(src, return_index=True)[1]
    Z = res.X_star[first]
    obj = h * ad.loss_values(Z, yi) - theta1 * np.sum((Z - X) ** 2, axis=1)
    up = crown.smooth_oracle(MLPModel(m), "logistic", X, yi, theta1, h_ref=h).evaluate(h)[0]
    lh_grid = Grid().evaluate(h)[0]
    assert np.all(obj <= up + 1e-9 * (1 + np.abs(up)))
    assert np.all(lh_grid <= up + 1e-9 * (1 + np.abs(up)))
    # the found points are local maxima at least as good as the grid's, up to its resolution
    G = crown.network_lipschitz(crown.as_network(MLPModel(m)))
    slack = h * G * step + theta1 * (step * step + 2 * step * 12)
    assert np.all(obj >= lh_grid - slack)


def test_moves_stay_inside_max_move_and_extra_starts_are_used():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 3))
    y = np.ones(20)
    seen = []

    def lg(Z, yy):  # loss |z|^2 / 2: unbounded, so moves want to grow
        return 0.5 * np.sum(Z * Z, axis=1), Z.copy()

    def extra(h):
        seen.append(h)
        return [X + 5.0]

    sol = solve_first_order(lg, X, y, r=5.0, theta1=1.0, theta2=1.0, max_move=lambda h: 0.3,
                            extra_starts=extra, inner_method="gradient", inner_steps=30,
                            max_outer=8)
    moved = np.sqrt(np.sum((sol.atom_X - X[sol.atom_source]) ** 2, axis=1))
    assert np.all(moved <= 0.3 * (1 + 1e-12))
    assert seen
    with pytest.raises(TypeError, match="max_move"):
        solve_first_order(lg, X, y, r=5.0, max_move=0.3)


def test_hint_starts_sit_at_the_over_estimates_radius():
    m, X, y = _toy(2, seed=3, n=10)
    ad = MLPModel(m).bind_loss("logistic")
    yi = _internal(m, y, 2)
    orc = crown.smooth_oracle(MLPModel(m), "logistic", X, yi, 1.0, h_ref=0.5)
    _, g0 = ad.loss_and_grad(X, yi)
    pts = neural_found.hint_starts(orc, X, g0, np.zeros_like(X), np.ones(2), 0.5)
    assert len(pts) == 2  # the gradient direction at t and t/2 (no found moves)
    t = orc.argmax_radius(0.5)
    assert np.allclose(np.linalg.norm(pts[0] - X, axis=1), np.where(
        np.linalg.norm(g0, axis=1) > 0, t, 0.0))
    # argmax_radius is where evaluate's maximum is attained: the piece there gives the value
    assert np.all(t >= 0) and np.all(np.isfinite(t))
