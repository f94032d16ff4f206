"""shift_cost(..., solver="dual", device=...): the PyTorch backend of the chunked dual.

Checked against the NumPy dual path (same value and interval ends to the solver's rtol), the
conic solve (the certified interval brackets it) and the program written densely from its
definition for a DataCost (cvxpy + Clarabel, sharing no code with the library). Runs on the
CPU build of torch; skipped when torch is absent."""

import math
import sys

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest

from otstab import DataCost, shift_cost
from otstab.errors import ValidationError

torch = pytest.importorskip("torch")


def _instance(seed, n=10, m=9, d=3, labels=2):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, d))
    B = rng.normal(size=(m, d)) * 1.3 + 0.4
    ya = rng.integers(0, labels, n)
    yb = rng.integers(0, labels, m)
    ya[:labels] = yb[:labels] = np.arange(labels)
    return A, ya, B, yb


def _inside(res, value, rel=1e-6):
    tol = rel * max(abs(value), 1e-12)
    assert res.value_lower <= value + tol, (res.value_lower, value)
    assert res.value_upper >= value - tol, (res.value_upper, value)


def _same(dev, ref, rel=1e-6):
    for name in ("value", "value_lower", "value_upper", "moving", "reweighting"):
        assert getattr(dev, name) == pytest.approx(getattr(ref, name), rel=rel, abs=1e-12), name
    assert dev.status == ref.status
    np.testing.assert_allclose(dev.weights, ref.weights, rtol=1e-3, atol=1e-6)
    by = ref.variables.set_index("variable")["cost"]
    np.testing.assert_allclose(dev.variables.set_index("variable")["cost"][by.index], by,
                               rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("div,theta2", [("kl", 0.5), ("chi2", 0.5), ("kl", math.inf)])
def test_torch_dual_equals_the_numpy_dual_and_is_certified(div, theta2):
    A, ya, B, yb = _instance(1)
    if math.isinf(theta2):  # equal label shares: W2^2 between equal-size samples
        A, B = A[:9], B
        ya = yb = np.zeros(9, dtype=int)
    ref = shift_cost(A, ya, B, yb, theta2=theta2, divergence=div, solver="dual")
    dev = shift_cost(A, ya, B, yb, theta2=theta2, divergence=div, solver="dual", device="cpu")
    assert dev.solver == "dual[cpu]"
    _same(dev, ref)
    conic = shift_cost(A, ya, B, yb, theta2=theta2, divergence=div, solver="conic")
    _inside(dev, conic.value)   # lower <= exact <= upper
    assert dev.value == pytest.approx(conic.value, rel=1e-5)


@pytest.mark.parametrize("div", ["kl", "chi2"])
def test_chunked_device_passes_give_the_dense_answer(monkeypatch, div):
    """Large classes recompute the costs per chunk on the device (the matrix-product form for
    the smoothed passes, direct differences for the exact ones): forced on a small problem."""
    import otstab.shift._shift_torch as st

    A, ya, B, yb = _instance(2, n=12, m=11)
    dense = shift_cost(A, ya, B, yb, theta2=0.5, divergence=div, solver="dual", device="cpu")
    monkeypatch.setattr(st, "DENSE_MAX_PAIRS", 0)
    monkeypatch.setattr(st, "DEVICE_CHUNK_ENTRIES", 4 * 11)  # chunks of 4 rows (1 per feature)
    chunked = shift_cost(A, ya, B, yb, theta2=0.5, divergence=div, solver="dual",
                         device="cpu")
    _same(chunked, dense)
    conic = shift_cost(A, ya, B, yb, theta2=0.5, divergence=div, solver="conic")
    _inside(chunked, conic.value)


def test_datacost_on_the_device_matches_the_program():
    rng = np.random.default_rng(5)

    def mixed(n):
        return pd.DataFrame({"colour": rng.choice(["red", "green", "blue"], n),
                             "u": rng.normal(0, 2, n), "k": rng.integers(0, 5, n)})

    X0, X1 = mixed(9), mixed(8)
    X1["colour"] = X0["colour"].iloc[:8].to_numpy()
    y0, y1 = np.zeros(9, dtype=int), np.zeros(8, dtype=int)
    spec = DataCost(immutable=["colour"])
    rc = spec.resolve(None, X0)
    ii, jj = np.meshgrid(np.arange(9), np.arange(8), indexing="ij")
    D = rc.cost(X0.iloc[ii.ravel()].reset_index(drop=True),
                X1.iloc[jj.ravel()].reset_index(drop=True)).reshape(9, 8)
    # the program from its definition: KL penalty on the source marginal, exact columns
    G = cp.Variable((9, 8), nonneg=True)
    a, p = cp.sum(G, axis=1), np.full(9, 1 / 9)
    allowed = np.isfinite(D)
    pr = cp.Problem(cp.Minimize(cp.sum(cp.multiply(np.where(allowed, D, 0.0), G))
                                + 0.5 * cp.sum(cp.rel_entr(a, p) - a + p)),
                    [cp.sum(G, axis=0) == 1 / 8, cp.multiply(G, (~allowed) * 1.0) == 0])
    pr.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    ref = shift_cost(X0, y0, X1, y1, theta2=0.5, cost=spec, solver="dual")
    dev = shift_cost(X0, y0, X1, y1, theta2=0.5, cost=spec, solver="dual", device="cpu")
    assert dev.cost == "datacost"
    _same(dev, ref)
    _inside(dev, pr.value)
    assert dev.value == pytest.approx(pr.value, rel=1e-5)
    table = dev.variables.set_index("variable")
    assert table.loc["colour", "cost"] == 0.0          # immutable: never moved


def test_auto_uses_the_device_for_the_dual_classes(monkeypatch):
    import otstab.shift._shift_cost as sc

    A, ya, B, yb = _instance(3)
    monkeypatch.setattr(sc, "CONIC_MAX_PAIRS", 0)       # every class goes to the dual
    res = shift_cost(A, ya, B, yb, theta2=0.5, device="cpu")
    assert res.solver == "dual[cpu]" and res.status == "optimal"
    conic = shift_cost(A, ya, B, yb, theta2=0.5, solver="conic")
    _inside(res, conic.value)


@pytest.mark.parametrize("kwargs,match", [
    ({"device": "nonsense"}, "device must be a torch device"),
    ({"device": "cpu", "solver": "conic"}, "runs the 'dual' solver"),
    ({"device": "cpu", "solver": "pot"}, "runs the 'dual' solver"),
])
def test_bad_device_arguments_are_refused(kwargs, match):
    A, ya, B, yb = _instance(4)
    with pytest.raises(ValidationError, match=match):
        shift_cost(A, ya, B, yb, **kwargs)


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    A, ya, B, yb = _instance(4)
    with pytest.raises(ValidationError, match="CUDA is not available"):
        shift_cost(A, ya, B, yb, solver="dual", device="cuda")


def test_without_torch_the_error_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)       # import torch -> ImportError
    A, ya, B, yb = _instance(4)
    with pytest.raises(ValidationError, match="needs PyTorch"):
        shift_cost(A, ya, B, yb, solver="dual", device="cpu")
    assert shift_cost(A, ya, B, yb, solver="dual").status == "optimal"  # NumPy unaffected


@pytest.mark.parametrize("device", [None, "cpu"])
def test_time_limit_stops_early_and_stays_certified(device):
    A, ya, B, yb = _instance(6)
    conic = shift_cost(A, ya, B, yb, theta2=0.5, solver="conic")
    res = shift_cost(A, ya, B, yb, theta2=0.5, solver="dual", device=device,
                     time_limit=1e-9)  # up before the first evaluation: v = 0, one stage
    assert [len(h) for h in res.info["dual_history"]] == [1, 1]
    assert res.status == "bounds" and res.value_lower < res.value_upper
    _inside(res, conic.value, rel=0.0)
    with pytest.raises(ValidationError, match="time_limit"):
        shift_cost(A, ya, B, yb, solver="dual", device=device, time_limit=-1)


@pytest.mark.parametrize("theta2", [0.5, math.inf])
def test_plan_repair_on_the_device_is_the_numpy_repair(theta2):
    """_PlanBuilder through the array hooks: an approximate plan with an empty column (fed
    from its cheapest row) and off-target columns is repaired and priced as by NumPy, and
    the result is feasible (columns = q; theta2 = inf: rows = p too)."""
    from otstab.shift._shift_cost import _Class, _Encoded, _PlanBuilder, _Problem
    from otstab.shift._shift_torch import TorchProblem

    A, _, B, _ = _instance(7, n=6, m=5)
    geo = _Encoded(A, B, ["a", "b", "c"])
    cls = _Class(np.arange(6), np.arange(5), np.full(6, 1 / 6), np.full(5, 1 / 5))
    G = np.random.default_rng(7).uniform(0, 0.05, (6, 5))
    G[:, 2] = 0.0                                       # nothing reaches column 2
    ref = _Problem(geo, cls, 1.0, theta2, "kl")
    dev = TorchProblem(geo, cls, 1.0, theta2, "kl", "cpu")
    a = _PlanBuilder(ref, lambda: iter([(np.arange(6), ref._cost(np.arange(6)), G)])).build(
        True)
    b = _PlanBuilder(dev, lambda: iter([(np.arange(6), (0, 6), dev.dev(G))])).build(True)
    np.testing.assert_allclose(b.rowsum, a.rowsum, rtol=1e-13)
    assert b.move == pytest.approx(a.move, rel=1e-13)
    cols = b.kept[0][1].sum(0)
    if b.extra is not None:
        np.add.at(cols, b.extra[1], b.extra[2])
        np.testing.assert_array_equal(b.extra[0], a.extra[0])
        assert b.extra[0][0] == np.argmin(((A - B[2]) ** 2).sum(1))   # the cheapest row
    if b.rank1 is not None:
        er, ec, s = b.rank1
        cols = cols + ec * er.sum() / s
        np.testing.assert_allclose(b.rowsum, 1 / 6, rtol=1e-12)
    np.testing.assert_allclose(cols, 1 / 5, rtol=1e-12)
