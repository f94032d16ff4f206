"""Tests of otstab.plot (matplotlib, Agg backend)."""

from __future__ import annotations

import builtins
import math
import sys

import numpy as np
import pandas as pd
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.quiver import Quiver  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402

import otstab  # noqa: E402
from otstab import plot  # noqa: E402
from otstab.datasets import make_toy  # noqa: E402
from otstab.errors import ValidationError  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def toy():
    X, y = make_toy(50, random_state=3)
    model = LogisticRegression().fit(X, y)
    return model, X, y


@pytest.fixture(scope="module")
def wide():
    """5 features; only columns 1 and 3 may move (so they are 'the two most moved')."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 5))
    y = (X @ np.array([1.0, -1.0, 0.5, 1.0, 0.2]) + 0.3 * rng.normal(size=150) > 0).astype(int)
    X = pd.DataFrame(X, columns=[f"f{j}" for j in range(5)])
    model = LogisticRegression().fit(X, y)
    return model, X, y


def test_sensitive_distribution_2d(toy):
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="hinge", r=0.5)
    fig, ax = plt.subplots()
    out = plot.sensitive_distribution(res, ax=ax, y=y)
    assert out is ax
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("x0", "x1")
    # point sizes proportional to mass * weight of the atoms
    atoms = [c for c in ax.collections if isinstance(c, PathCollection)
             and c.get_label() == "Q* (size = weight)"]
    assert atoms
    sizes = atoms[0].get_sizes()
    np.testing.assert_allclose(sizes / sizes.sum(),
                               (res.weights * res.mass) / np.sum(res.weights * res.mass))
    np.testing.assert_allclose(atoms[0].get_offsets(), res.X_star)
    # arrows from x to x*, one per moved atom (fewer than max_arrows here)
    quiv = [c for c in ax.collections if isinstance(c, Quiver)]
    moved = np.sum(np.linalg.norm(res.X_star - res.X[res.source], axis=1) > 1e-9)
    assert moved > 0 and quiv and quiv[0].N == moved
    # a new figure when ax is omitted
    ax2 = plot.sensitive_distribution(res, max_arrows=5)
    assert ax2 is not ax and [c for c in ax2.collections if isinstance(c, Quiver)][0].N == 5


def test_sensitive_distribution_picks_most_moved_coordinates(wide):
    model, X, y = wide
    res = otstab.certify(model, X, y, loss="hinge", r=0.6, features=["f1", "f3"])
    P, Ps, labels = plot.projection(res)
    assert labels == ("f1", "f3")
    np.testing.assert_allclose(P, X[["f1", "f3"]].to_numpy())
    ax = plot.sensitive_distribution(res)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("f1", "f3")
    # explicit coordinates, by name or index
    assert plot.projection(res, coords=("f4", 0))[2] == ("f4", "f0")
    with pytest.raises(ValidationError, match="unknown feature"):
        plot.projection(res, coords=("f1", "nope"))
    with pytest.raises(ValidationError, match="coords"):
        plot.projection(res, coords="sideways")


def test_sensitive_distribution_pca_when_nothing_moves(wide):
    model, X, y = wide
    res = otstab.certify(model, X, y, loss="hinge", r=0.6, theta1=math.inf)
    P, Ps, labels = plot.projection(res)
    assert labels == ("PC1", "PC2")
    Xc = X.to_numpy() - X.to_numpy().mean(axis=0)
    # the projection keeps the variance of the two leading principal components
    top2 = np.sort(np.linalg.svd(Xc, compute_uv=False))[::-1][:2] ** 2
    np.testing.assert_allclose(np.sort(np.sum(P ** 2, axis=0))[::-1], top2, rtol=1e-10)
    ax = plot.sensitive_distribution(res)
    assert not [c for c in ax.collections if isinstance(c, Quiver)]


def test_feature_stability_bars(wide):
    model, X, y = wide
    table = otstab.feature_stability(model, X, y, loss="zero_one", r=0.4).to_frame()
    fig, ax = plt.subplots()
    assert plot.feature_stability(table, ax=ax, top=3) is ax
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 3
    # most sensitive (lowest score) on top, i.e. at the highest y position
    best = table.sort_values("score")["feature"].iloc[0]
    pos = dict(zip(labels, ax.get_yticks()))
    assert pos[best] == max(pos.values())
    widths = sorted(p.get_width() for p in ax.patches)
    np.testing.assert_allclose(widths, np.sort(table["score"].to_numpy())[:3])
    with pytest.raises(ValidationError, match="feature"):
        plot.feature_stability(pd.DataFrame({"x": [1]}))


def test_decomposition_grid_and_plot(toy):
    model, X, y = toy
    grid = plot.decomposition_grid(model, X, y, loss="zero_one", r=0.3, total=5.0,
                                   splits=[0.0, 0.25, 0.5, 1.0])
    assert list(grid["split"]) == [0.0, 0.25, 0.5, 1.0]
    inv = [(0 if math.isinf(a) else 1 / a) + (0 if math.isinf(b) else 1 / b)
           for a, b in zip(grid["theta1"], grid["theta2"])]
    np.testing.assert_allclose(inv, 5.0)
    # only reweighting at split 0 (theta1 = inf), only moving at split 1 (theta2 = inf)
    assert math.isinf(grid["theta1"].iloc[0]) and grid["corruption"].iloc[0] == 0
    assert math.isinf(grid["theta2"].iloc[-1])
    assert abs(grid["reweighting"].iloc[-1]) < 1e-12
    # corruption + reweighting = r - base risk at every split
    np.testing.assert_allclose(grid["corruption"] + grid["reweighting"],
                               0.3 - grid["risk_base"], atol=1e-9)
    # the value at split 0.5 is certify's value at theta1 = theta2 = 0.4
    ref = otstab.certify(model, X, y, loss="zero_one", r=0.3, theta1=0.4, theta2=0.4)
    assert grid["value"].iloc[2] == pytest.approx(ref.value, rel=1e-12)
    fig, ax = plt.subplots()
    assert plot.decomposition(grid, ax=ax) is ax
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_allclose(heights[:4], grid["corruption"])
    np.testing.assert_allclose(heights[4:8], grid["reweighting"])
    with pytest.raises(ValidationError, match="total"):
        plot.decomposition_grid(model, X, y, loss="zero_one", r=0.3, total=0)
    with pytest.raises(ValidationError, match="splits"):
        plot.decomposition_grid(model, X, y, loss="zero_one", r=0.3, splits=[1.5])


def test_stability_curve(toy):
    model, X, y = toy
    curve = plot.value_curve(model, X, y, loss="zero_one", r=[0.1, 0.2, 0.3, 0.4])
    fig, ax = plt.subplots()
    assert plot.stability_curve(curve, ax=ax, highlight=0.3) is ax
    line = ax.get_lines()[0]
    np.testing.assert_allclose(line.get_xdata(), curve["r"])
    np.testing.assert_allclose(line.get_ydata(), curve["value"])
    # also from a list of results
    results = [otstab.certify(model, X, y, loss="zero_one", r=r) for r in (0.2, 0.4)]
    ax2 = plot.stability_curve(results)
    np.testing.assert_allclose(ax2.get_lines()[0].get_ydata(), [r.value for r in results])
    with pytest.raises(ValidationError, match="'r' and 'value'"):
        plot.stability_curve(pd.DataFrame({"x": [1]}))


def test_convergence_trace_formats(toy):
    trace = {"h": [0.5, 0.3, 0.35], "risk": [0.9, 0.45, 0.5], "value": [-0.1, 0.1, 0.12]}
    forms = [trace, pd.DataFrame(trace),
             [{"iteration": i, "h": h, "risk": r, "value": v}
              for i, (h, r, v) in enumerate(zip(*trace.values()))]]
    for form in forms:
        fig, ax = plt.subplots()
        assert plot.convergence_trace(form, ax=ax, r=0.5, show_h=True) is ax
        np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), trace["risk"])
        np.testing.assert_allclose(ax.get_lines()[0].get_xdata(), [0, 1, 2])
        plt.close(fig)
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="hinge", r=0.5)
    with pytest.raises(ValidationError, match="no convergence trace"):
        plot.convergence_trace(res)
    with pytest.raises(ValidationError, match="risk"):
        plot.convergence_trace([{"iteration": 0, "h": 1.0}])


def test_convergence_trace_of_first_order_result(toy):
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="logistic", r=0.5, solver="first_order")
    tr = res.info.get("trace")
    if tr is None:
        pytest.skip("the first-order solver records no trace in this build")
    ax = plot.convergence_trace(res)
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), tr["risk"])


def test_missing_matplotlib_names_the_extra(toy, monkeypatch):
    model, X, y = toy
    res = otstab.certify(model, X, y, loss="hinge", r=0.5)
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.delitem(sys.modules, "matplotlib.pyplot", raising=False)
    with pytest.raises(ImportError, match=r"pip install otstab\[plot\]"):
        plot.sensitive_distribution(res)
    # the computing helpers do not need matplotlib
    assert len(plot.value_curve(model, X, y, loss="hinge", r=[0.5])) == 1
