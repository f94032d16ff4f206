"""The multiclass hinge's blockwise form (otstab_solvers/multiclass.py) against the dense one.

:class:`MulticlassOracle` computes the pieces ``c1 = (1 + s_k) - s_y`` (0 at the label) and
``c2 = C[y, k]`` per block of rows instead of storing them: every method must give the numbers
of :class:`PiecewiseOracle` on the stored arrays (ties included: integer scores and dyadic
curvatures make many pieces exactly equal), and a certificate the one the stored form gives
(the path before the blockwise form, kept here as the reference by replacing the reduced form
with its dense arrays), the conic backend's on a tiny problem, and the plain search's when the
search starts from a subsample (:func:`solve_multiclass`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import otstab_solvers.multiclass as multiclass
import pytest
from otstab_solvers.dual import PiecewiseOracle, solve_dual
from otstab_solvers.multiclass import (
    BLOCK,
    MulticlassDual,
    MulticlassOracle,
    MulticlassRows,
    multiclass_blocks,
    solve_multiclass,
)
from otstab_solvers.result import OPTIMAL

import otstab
import otstab.solve._core as core
import otstab.solve._piecewise as piecewise
from otstab.modeling import _reduction as reduction
from otstab.modeling._models import per_sample_losses

K = 4
needs_numba = pytest.mark.skipif(not multiclass.HAVE_NUMBA, reason="numba is not installed")


def _rows(n, seed=0, ties=False):
    rng = np.random.default_rng(seed)
    if ties:  # integer scores, dyadic curvatures: many exactly equal pieces at h = 1, 2
        S = rng.integers(-2, 3, size=(n, K)).astype(float)
        C = rng.integers(1, 5, size=(K, K)) / 4.0
        C = C + C.T
    else:
        S = rng.standard_normal((n, K))
        W = rng.standard_normal((K, 6))
        C = ((W[None, :, :] - W[:, None, :]) ** 2).sum(axis=2) / 4.0
    np.fill_diagonal(C, 0.0)
    labels = rng.integers(0, K, size=n)
    return MulticlassRows(S, labels, C)


def _dense(rows):
    return PiecewiseOracle(rows.materialize().T, rows.materialize_c2().T)


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_numba)])
@pytest.mark.parametrize("ties", [False, True])
def test_oracle_equals_the_dense_oracle(monkeypatch, ties, kernel):
    """Both ways of evaluating the rows, the compiled kernel (numba) and the NumPy blocks:
    bit for bit the dense oracle's numbers."""
    monkeypatch.setattr(multiclass, "USE_KERNEL", kernel)
    monkeypatch.setattr(multiclass, "KERNEL_MIN_ROWS", 0)  # (every call, the picked rows too)
    n = 2 * BLOCK + 123  # several blocks, a partial last one
    rows = _rows(n, seed=1, ties=ties)
    lean, dense = MulticlassOracle(rows), _dense(rows)
    assert lean.c1abs == dense.c1abs
    assert lean._bound(1.7) == dense._bound(1.7)
    pick = np.random.default_rng(2).choice(n, 500, replace=False)
    for h in (0.0, 0.3, 1.0, 2.0, 2.5):
        np.testing.assert_array_equal(lean.values(h), dense.values(h))
        np.testing.assert_array_equal(lean.values(h, pick), dense.values(h, pick))
        assert lean.values_max(h) == dense.values_max(h)
        for rows_sel in (None, slice(5, n - 7), pick):
            got = lean.scan(h, 1e-10, rows_sel)
            ref = dense.scan(h, 1e-10, rows_sel)
            for a, b in zip(got, ref):
                np.testing.assert_array_equal(a, b)
        for side in ("left", "right"):
            got = lean.evaluate(h, side=side, with_pieces=True)
            ref = dense.evaluate(h, side=side, with_pieces=True)
            for a, b in zip(got, ref):
                np.testing.assert_array_equal(a, b)
    ka = np.zeros(pick.size, dtype=np.intp)
    kb = np.full(pick.size, 2, dtype=np.intp)
    np.testing.assert_array_equal(lean.crossings(ka, kb, pick), dense.crossings(ka, kb, pick))
    if ties:  # the case is meant to have ties: the tie rule was exercised
        lo, hi = dense.scan(1.0, 1e-10)[1::2]
        assert np.any(lo != hi)


def _problem(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 5))
    W = rng.standard_normal((K, 5))
    y = np.argmax(X @ W.T + rng.gumbel(size=(n, K)), axis=1)
    return otstab.LinearModel(W, rng.standard_normal(K) * 0.1), X, y


def _stored(monkeypatch):
    """Certificates through the dense (stored) reduced form: the path before the blockwise
    one."""
    real = reduction.reduce_problem

    def stored(prob, theta1, mask=None):
        red = real(prob, theta1, mask)
        return dataclasses.replace(red, c1_dense=red.c1, c2_dense=red.c2, mrows=None)

    monkeypatch.setattr(core, "reduce_problem", stored)


#: the value to 1e-12; h (where F is flat: the two searches stop at different points of the
#: same plateau, h to about sqrt of the value's tolerance) and what Q* makes of it to 1e-8
FIELDS = {"value": 1e-12, "h": 1e-8, "risk_star": 1e-10, "primal_cost": 1e-8,
          "total_mass": 1e-10}


def _same(lean, ref):
    assert lean.status == ref.status == "optimal"
    for f, rtol in FIELDS.items():
        assert getattr(lean, f) == pytest.approx(getattr(ref, f), rel=rtol, abs=1e-15), f


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.5), ("chi2", 0.5), ("kl", math.inf)])
@pytest.mark.parametrize("t", [0.02, 0.5, 0.95])
@pytest.mark.parametrize("sampled", [False, True])
def test_certificate_equals_the_stored_form(monkeypatch, divergence, theta2, t, sampled):
    model, X, y = _problem(3000, seed=3)
    losses = per_sample_losses(model, X, y, "multiclass_hinge")
    r = losses.mean() + t * (losses.max() - losses.mean())
    if sampled:  # the audit's sampled sums (above AUDIT_DIRECT_MAX rows) on a small problem
        monkeypatch.setattr(piecewise, "AUDIT_DIRECT_MAX", 1000)
    kw = dict(loss="multiclass_hinge", r=r, theta1=1.5, theta2=theta2, divergence=divergence)
    lean = otstab.certify(model, X, y, **kw)
    _stored(monkeypatch)
    ref = otstab.certify(model, X, y, **kw)
    _same(lean, ref)
    # Q* as a measure: the same mass at the same moved points (atoms in the same order)
    np.testing.assert_array_equal(lean.source, ref.source)
    np.testing.assert_allclose(lean.weights * lean.mass, ref.weights * ref.mass, rtol=1e-8)
    np.testing.assert_allclose(lean.X_star, ref.X_star, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_weighted_certificate_equals_the_stored_form(monkeypatch, divergence):
    model, X, y = _problem(2000, seed=4)
    w = np.random.default_rng(5).uniform(0.2, 2.0, X.shape[0])
    w[::37] = 0.0  # rows outside P0's support
    kw = dict(loss="multiclass_hinge", r=1.6, theta1=1.0, theta2=0.3, sample_weight=w,
              divergence=divergence)
    lean = otstab.certify(model, X, y, **kw)
    _stored(monkeypatch)
    ref = otstab.certify(model, X, y, **kw)
    _same(lean, ref)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_certificate_agrees_with_the_conic_backend(divergence):
    model, X, y = _problem(40, seed=6)
    kw = dict(loss="multiclass_hinge", r=1.5, theta1=1.0, theta2=0.5, divergence=divergence)
    lean = otstab.certify(model, X, y, **kw)
    conic = otstab.certify(model, X, y, solver="conic", **kw)
    assert lean.status == "optimal" and conic.status == "optimal"
    assert lean.value == pytest.approx(conic.value, rel=1e-5)


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.25), ("chi2", 0.25), ("kl", math.inf)])
@pytest.mark.parametrize("t", [0.01, 0.5, 0.95])
def test_search_from_a_subsample_equals_the_plain_search(divergence, theta2, t):
    rows = _rows(40_000, seed=7)
    oracle = MulticlassOracle(rows)
    keep = divergence == "chi2" and not math.isinf(theta2)
    dual = MulticlassDual(multiclass_blocks(oracle, keep=keep), rows.n, float(rows.n))
    dense = _dense(rows)
    losses = dense.c1.max(axis=1)
    base = float(np.mean(losses))
    r = base + t * (float(losses.max()) - base)
    got = solve_multiclass(oracle, dual, r, theta2, divergence, base=base, min_n=0)
    ref = solve_dual(dense, r, theta2, divergence)
    assert got.status == ref.status == OPTIMAL
    assert "window" in got.info  # the subsample's start was taken
    assert got.value == pytest.approx(ref.value, rel=1e-12)
    assert got.h == pytest.approx(ref.h, rel=1e-9)


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.25), ("chi2", 0.25)])
@pytest.mark.parametrize("offset", [-0.4, 0.4])
def test_search_from_a_missed_window_equals_the_plain_search(divergence, theta2, offset):
    """A subsample start far from the root (its threshold moved by a wrong base risk): the
    first full point misses, the next one is placed by the subsample's model corrected to
    it (the wrong base is a constant the correction removes), and the answer is still the
    plain search's."""
    rows = _rows(40_000, seed=8)
    oracle = MulticlassOracle(rows)
    keep = divergence == "chi2"
    dual = MulticlassDual(multiclass_blocks(oracle, keep=keep), rows.n, float(rows.n))
    dense = _dense(rows)
    losses = dense.c1.max(axis=1)
    base = float(np.mean(losses))
    r = base + 0.5 * (float(losses.max()) - base)
    got = solve_multiclass(oracle, dual, r, theta2, divergence, base=base + offset, min_n=0)
    ref = solve_dual(dense, r, theta2, divergence)
    assert got.status == ref.status == OPTIMAL
    points = got.info["window"]["points"]
    assert "fallback" not in got.info["window"] and len(points) >= 2
    assert abs(points[0]["h"] / ref.h - 1.0) > 1e-2  # the first point missed
    assert got.iterations <= 5  # (the plain search from 0: 6-9)
    assert got.value == pytest.approx(ref.value, rel=1e-12)


def _scored_rows(n, seed=0):
    """Scores of a linear model (d = 6) and labels drawn from them (as the benchmark's)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((K, 6))
    S = rng.standard_normal((n, 6)) @ W.T
    labels = np.argmax(S + rng.gumbel(size=(n, K)), axis=1)
    C = ((W[None, :, :] - W[:, None, :]) ** 2).sum(axis=2) / 4.0
    return MulticlassRows(S, labels, C)


@pytest.mark.parametrize("t", [0.95, 0.99])
def test_near_max_kl_takes_few_passes(t):
    """Near the largest loss the KL weights sit on the top rows, which a strided subsample
    has few of (it put the root 2x too far and the search took 12 evaluations of all rows):
    the subsample takes the top rows of every (label, piece) pair, and each next point is
    its model's root corrected to the last full point. Counted, not timed: at most 4
    evaluations of all rows (and cheaper passes for the kinks) against the plain search's
    7-12, and the plain search's answer."""
    n = 150_000  # above WINDOW_MIN_N: the default path
    rows = _scored_rows(n)
    oracle = MulticlassOracle(rows)
    losses = np.concatenate([rows.block(slice(i, j))[0].max(axis=1) for i, j in rows.blocks()])
    base = float(np.mean(losses))
    r = base + t * (float(losses.max()) - base)
    dual = MulticlassDual(multiclass_blocks(oracle), n, float(n))
    got = solve_multiclass(oracle, dual, r, 0.25, "kl", base=base)
    plain_dual = MulticlassDual(multiclass_blocks(oracle), n, float(n))
    ref = solve_dual(plain_dual, r, 0.25, "kl")
    assert got.status == ref.status == OPTIMAL
    assert "tail" in got.info["window"] and "fallback" not in got.info["window"]
    assert got.iterations <= 4 and dual.passes <= 5  # (before: 8 passes here, 20 at 1e6)
    assert ref.iterations >= 7  # (what the subsample saves)
    assert got.value == pytest.approx(ref.value, rel=1e-12)
    assert got.h == pytest.approx(ref.h, rel=1e-9)


def test_chi2_keeps_one_vector_per_evaluation():
    """chi2 sums one h over several passes (its active-set steps): the blocks keep ``l_h``
    and the pieces (int8), and the derivatives of the last pass are computed from the pieces
    (the same numbers, :meth:`MulticlassOracle._derivs`), not kept: chi2's peak is within
    half an n-vector of KL's (2.1-2.3 n-vectors above it when l_h and both derivatives were
    kept). Above the direct audit and the subsample's threshold: the path users take."""
    import tracemalloc

    model, X, y = _problem(210_000, seed=9)
    losses = per_sample_losses(model, X, y, "multiclass_hinge")
    r = float(losses.mean() + 0.5 * (losses.max() - losses.mean()))
    del losses
    peaks = {}
    for div in ("kl", "chi2"):
        kw = dict(loss="multiclass_hinge", r=r, theta1=1.0, theta2=0.25, divergence=div)
        otstab.certify(model, X[:300], y[:300], **kw)  # (imports)
        tracemalloc.start()
        try:
            res = otstab.certify(model, X, y, **kw)
            peaks[div] = tracemalloc.get_traced_memory()[1] / (8.0 * X.shape[0])
        finally:
            tracemalloc.stop()
        assert res.status == "optimal"
    assert peaks["chi2"] < peaks["kl"] + 0.5, peaks


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_numba)])
def test_derivatives_from_the_pieces_are_the_evaluations(monkeypatch, kernel):
    """:meth:`MulticlassOracle._derivs` on the pieces an evaluation chose gives its
    derivatives bit for bit (ties included: integer scores, dyadic curvatures), whichever
    way the evaluation was made."""
    monkeypatch.setattr(multiclass, "USE_KERNEL", kernel)
    monkeypatch.setattr(multiclass, "KERNEL_MIN_ROWS", 0)
    for ties in (False, True):
        rows = _rows(3000, seed=10, ties=ties)
        oracle = MulticlassOracle(rows)
        for h in (0.0, 0.5, 1.0, 2.0, 3.7):
            for side in ("left", "right"):
                _, d1, d2, k = oracle.evaluate(h, side=side, with_pieces=True)
                e1, e2 = oracle._derivs(h, k.astype(np.int8))
                np.testing.assert_array_equal(e1, d1)
                np.testing.assert_array_equal(e2, d2)


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_numba)])
def test_tail_rows_hold_the_top_rows_of_every_h(monkeypatch, kernel):
    """The rows :func:`_tail_rows` adds to the subsample: exactly those with some
    ``c1[i, k]`` at or above its (label, piece) threshold (enumerated on the dense pieces),
    and so, at every h, every row whose l_h reaches the largest l_h a row outside can have."""
    monkeypatch.setattr(multiclass, "USE_KERNEL", kernel)
    monkeypatch.setattr(multiclass, "KERNEL_MIN_ROWS", 0)
    rows = _scored_rows(20_000, seed=11)
    stride = 16
    c1_sub = rows.block(slice(0, rows.n, stride))[0]
    got = multiclass._tail_rows(rows, c1_sub, rows.labels[::stride], stride, 64)
    c1 = rows.materialize().T  # (n, K)
    j = 64 // stride
    tau = np.full((K, K), np.inf)
    for yy in range(K):
        for k in range(K):
            col = c1_sub[rows.labels[::stride] == yy][:, k]
            if k != yy:
                tau[yy, k] = -np.inf if col.size <= j else np.sort(col)[-j]
    want = np.flatnonzero((c1 >= tau[rows.labels]).any(axis=1))
    np.testing.assert_array_equal(got, want)
    assert 0 < got.size < rows.n // 4
    dense = _dense(rows)
    outside = np.setdiff1d(np.arange(rows.n), got)
    for h in (0.1, 1.0, 5.0):
        lh = dense.values(h)
        cap = (tau * h + rows.C * h * h)[rows.labels[outside]].max(axis=1)
        assert np.all(lh[outside] < cap)  # the bound the docstring states
        top = np.argsort(lh)[-64:]
        assert np.isin(top, got).all()  # the 64 largest l_h are all in the set


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_numba)])
def test_values_max_from_the_top_of_each_label_and_piece(monkeypatch, kernel):
    """values_max in O(K^2) from the largest c1 of every (label, piece): the dense oracle's
    largest l_h, with labels missing (their -inf tops left out) and ties."""
    monkeypatch.setattr(multiclass, "USE_KERNEL", kernel)
    monkeypatch.setattr(multiclass, "KERNEL_MIN_ROWS", 0)
    for ties in (False, True):
        rows = _rows(5000, seed=12, ties=ties)
        rows = MulticlassRows(rows.S, np.where(rows.labels % 2 == 1, 0, rows.labels), rows.C)
        lean, dense = MulticlassOracle(rows), _dense(rows)
        assert not rows.present()[1] and not rows.present()[3]
        for h in (0.0, 1e-3, 0.3, 1.0, 2.0, 7.5):
            assert lean.values_max(h) == dense.values_max(h) == float(dense.values(h).max())


@needs_numba
@pytest.mark.parametrize("divergence,theta2", [("kl", 0.25), ("chi2", 0.25), ("kl", math.inf)])
def test_certificate_is_the_same_with_and_without_the_kernels(monkeypatch, divergence, theta2):
    """A certificate above KERNEL_MIN_ROWS is the same number whether its passes run
    compiled or as NumPy blocks (the same arithmetic and tie rule: bit for bit), and so is
    its Q* (sampled audit and all)."""
    model, X, y = _problem(40_000, seed=13)
    losses = per_sample_losses(model, X, y, "multiclass_hinge")
    r = float(losses.mean() + 0.5 * (losses.max() - losses.mean()))
    kw = dict(loss="multiclass_hinge", r=r, theta1=1.0, theta2=theta2, divergence=divergence)
    monkeypatch.setattr(piecewise, "AUDIT_DIRECT_MAX", 1000)  # (the sampled audit's sums)
    got = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(multiclass, "USE_KERNEL", False)
    ref = otstab.certify(model, X, y, **kw)
    assert got.status == ref.status == "optimal"
    for f in ("value", "h", "risk_star", "primal_cost", "total_mass"):
        assert getattr(got, f) == getattr(ref, f), f
    np.testing.assert_array_equal(got.source, ref.source)
    np.testing.assert_array_equal(got.weights * got.mass, ref.weights * ref.mass)
