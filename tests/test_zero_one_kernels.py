"""The compiled window pass of the binary 0/1 closed form
(``otstab_solvers.zero_one_kernels``) against the NumPy blocks it replaces
(``RowPrices._window``): the same window prices and kept rows bit for bit, the same counts,
the sums to their rounding, on one thread or two; and the NumPy block where a kept row's move
is not finite."""

from __future__ import annotations

import math

import numpy as np
import pytest

import otstab
from otstab.modeling._models import resolve_model
from otstab.solve import _audit
from otstab.solve import _zero_one as zo
from otstab.solve import _zero_one_pass as zp

pytest.importorskip("numba")

from otstab_solvers import sorted_kernels as SK  # noqa: E402
from otstab_solvers import zero_one_kernels as ZK  # noqa: E402

INF = math.inf


@pytest.fixture(autouse=True)
def _small(monkeypatch):
    monkeypatch.setattr(SK, "KERNEL_MIN_KEYS", 1)
    monkeypatch.setattr(zo.RowPrices, "BLOCK", 1009)  # (several blocks, a short last one)
    monkeypatch.setattr(zp, "PARALLEL_MIN_ROWS", 0)
    assert ZK.use_kernel(1 << 20)  # (loaded before the spies count calls)


def _problem(n=6000, seed=0, scale=1.0, y_float=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4)) * scale
    coef = rng.standard_normal(4)
    y = np.where(X @ coef + 0.5 * scale * rng.standard_normal(n) > 0, 1, -1)
    prob = resolve_model(otstab.LinearModel(coef, 0.1), X, y, loss="zero_one")
    if y_float:
        prob.y = prob.y.astype(np.float64)
    return prob


def _window(prob, theta1, lo, hi, theta2, chi2, kernel, workers, monkeypatch, fuse=True):
    """``(window, sums, kept)`` of one window pass, the kernel on or off."""
    monkeypatch.setattr(ZK, "USE_KERNEL", kernel)
    monkeypatch.setattr(zp, "WORKERS", workers)
    calls = []
    real = ZK.window_block
    monkeypatch.setattr(ZK, "window_block", lambda *a: calls.append(a[-1]) or real(*a))
    rp, near = zo.linear_prices(prob, None, theta1)
    rp._fuse = (near.reduced, near.misclassified) if fuse else None
    win = rp._window(lo, hi, theta2, chi2=chi2)
    fz = rp._fused
    kept = None if fz is None else (fz.cand.copy(), fz.rows.copy(),
                                    (fz.W, fz.A, fz.NL, fz.WD2, fz.WDL, fz.QDL, fz.SDD))
    assert bool(calls) == kernel
    return win, dict(rp._window_sums), kept, calls


def _close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, (bool, int, np.integer)):
            assert x == y, k
        elif math.isnan(x):
            assert math.isnan(y), k
        else:
            assert x == pytest.approx(y, rel=1e-12, abs=1e-300), k


@pytest.mark.parametrize("theta1", [1.0, 2.5])
@pytest.mark.parametrize("y_float", [False, True])
@pytest.mark.parametrize("lo_q, hi_q, theta2, chi2", [
    (0.40, 0.45, 0.25, False),    # KL: exp terms below lo, rows kept
    (0.40, 0.45, 1e3, False),     # KL, every exponent small: expm1 terms
    (0.40, 0.45, INF, False),     # theta2 = inf: gaps
    (0.40, 0.45, 0.25, True),     # chi2: gaps, their squares, the prices
    (0.0, 0.02, 0.25, False),     # a window from 0: nothing below it
    (0.97, 1.0, 0.05, False),     # up to the largest price (hi = inf)
])
@pytest.mark.parametrize("workers", [1, 2])
def test_compiled_window_equals_numpy_blocks(monkeypatch, theta1, y_float, lo_q, hi_q, theta2,
                                             chi2, workers):
    prob = _problem(y_float=y_float)
    rp, _ = zo.linear_prices(prob, None, theta1)
    a = np.sort(rp.array())
    lo = 0.0 if lo_q == 0.0 else float(a[int(lo_q * a.size)])
    hi = INF if hi_q == 1.0 else float(a[int(hi_q * a.size)])
    ref = _window(prob, theta1, lo, hi, theta2, chi2, False, 1, monkeypatch)
    got = _window(prob, theta1, lo, hi, theta2, chi2, True, workers, monkeypatch)
    np.testing.assert_array_equal(got[0], ref[0])  # (the same operations: the same bits)
    assert got[0].size > 0
    _close(got[1], ref[1])
    assert (got[2] is None) == (ref[2] is None)
    if ref[2] is not None:
        np.testing.assert_array_equal(got[2][0], ref[2][0])
        np.testing.assert_array_equal(got[2][1], ref[2][1])
        for x, y in zip(got[2][2], ref[2][2]):
            assert x == pytest.approx(y, rel=1e-12, abs=1e-12)
    # the kernel's own counts: every row is at 0, below lo, in the window or above it
    n_kept = 0 if got[2] is None else got[2][0].size
    assert got[1]["below"] == sum(int(o[2]) for o in got[3]) == \
        int(np.count_nonzero(a < lo))
    assert n_kept in (0, got[1]["below"])


@pytest.mark.parametrize("theta1", [1.0, 2.5])
@pytest.mark.parametrize("y_float", [False, True])
def test_compiled_price_rows_equal_numpy_bit_for_bit(monkeypatch, theta1, y_float):
    """``RowPrices[i:j]`` (the weighted dual's blocks read it at every evaluation) in one
    compiled loop: the numbers of NumPy's operations (``_dstar`` then ``move_prices``), bit
    for bit, also for a zero margin, a misclassified row with a positive margin (0) and a
    NaN score."""
    prob = _problem(y_float=y_float)
    prob.scores = prob.scores.copy()
    prob.scores[:3] = [0.0, -0.0, math.nan]
    rp, _ = zo.linear_prices(prob, None, theta1)
    wrong = rp.wrong.copy()
    wrong[5] = not wrong[5]  # (a row flagged misclassified whatever its margin)
    rp.wrong = wrong
    got = [rp[i:j] for i, j in ((0, 6000), (0, 1), (17, 2048), (5999, 6000), (3, 3))]
    monkeypatch.setattr(ZK, "USE_KERNEL", False)
    ref = [rp[i:j] for i, j in ((0, 6000), (0, 1), (17, 2048), (5999, 6000), (3, 3))]
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype == np.float64
        np.testing.assert_array_equal(g.view(np.int64), r.view(np.int64))


def test_one_thread_and_two_give_the_same_bits(monkeypatch):
    prob = _problem(n=20000, seed=4)
    rp, _ = zo.linear_prices(prob, None, 1.0)
    a = np.sort(rp.array())
    lo, hi = float(a[9000]), float(a[9400])
    one = _window(prob, 1.0, lo, hi, 0.25, False, True, 1, monkeypatch)
    two = _window(prob, 1.0, lo, hi, 0.25, False, True, 2, monkeypatch)
    np.testing.assert_array_equal(one[0], two[0])
    assert one[1] == two[1]
    assert one[2][2] == two[2][2]
    np.testing.assert_array_equal(one[2][0], two[2][0])


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_a_price_that_overflows(monkeypatch):
    """A row whose price overflows to inf (a score of 1e160): counted at inf and above the
    window, as in NumPy."""
    prob = _problem(n=3000, seed=2)
    prob.scores = prob.scores.copy()
    prob.scores[17] = 3e160 * prob.y[17]  # (correct, far from the boundary)
    rp, _ = zo.linear_prices(prob, None, 1.0)
    a = np.sort(rp.array())
    assert a[-1] == INF
    lo = float(a[1500])
    ref = _window(prob, 1.0, lo, INF, 0.25, False, False, 1, monkeypatch)
    got = _window(prob, 1.0, lo, INF, 0.25, False, True, 1, monkeypatch)
    np.testing.assert_array_equal(got[0], ref[0])
    _close(got[1], ref[1])
    assert got[1]["n_fin"] == a.size - 1
    np.testing.assert_array_equal(got[2][0], ref[2][0])


def test_a_block_whose_kept_sums_are_not_finite_is_summed_by_numpy(monkeypatch):
    """Where the kernel reports the kept rows' sums not finite (a move that overflows), that
    block's results are NumPy's: the pass equals the NumPy pass."""
    prob = _problem(n=5000, seed=6)
    rp, _ = zo.linear_prices(prob, None, 1.0)
    a = np.sort(rp.array())
    lo, hi = float(a[2000]), float(a[2200])
    ref = _window(prob, 1.0, lo, hi, 0.25, False, False, 1, monkeypatch)
    real = ZK.window_block
    flagged = []

    def flag(*args):  # (every other block reported not finite)
        real(*args)
        if len(flagged) % 2 == 0:
            args[-1][17] = 0.0
        flagged.append(1)
    monkeypatch.setattr(ZK, "window_block", flag)
    monkeypatch.setattr(ZK, "USE_KERNEL", True)
    rp, near = zo.linear_prices(prob, None, 1.0)
    rp._fuse = (near.reduced, near.misclassified)
    win = rp._window(lo, hi, 0.25)
    assert len(flagged) >= 4
    np.testing.assert_array_equal(win, ref[0])
    _close(dict(rp._window_sums), ref[1])
    fz = rp._fused
    np.testing.assert_array_equal(fz.cand, ref[2][0])
    np.testing.assert_array_equal(fz.rows, ref[2][1])
    for x, y in zip((fz.W, fz.A, fz.NL, fz.WD2, fz.WDL, fz.QDL, fz.SDD), ref[2][2]):
        assert x == pytest.approx(y, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("kl", INF), ("chi2", 0.25)])
@pytest.mark.parametrize("t", [0.01, 0.5, 0.95])
def test_certificate_with_the_compiled_window_equals_the_numpy_one(monkeypatch, divergence,
                                                                   theta2, t):
    """The whole certificate (Q* as a measure, every audited number) with and without the
    compiled window pass, the audit summing the moves in the passes (above
    AUDIT_DIRECT_MAX)."""
    monkeypatch.setattr(zo, "SUBSAMPLE", 256)
    monkeypatch.setattr(_audit, "AUDIT_DIRECT_MAX", 1000)
    rng = np.random.default_rng(5)
    n = 8000
    X = rng.standard_normal((n, 6))
    coef = rng.standard_normal(6)
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, -0.2)
    base = float(np.mean(np.sign(X @ coef - 0.2) != y))
    kw = dict(loss="zero_one", r=base + t * (1 - base), theta2=theta2, divergence=divergence)
    out = {}
    for kernel in (False, True):
        monkeypatch.setattr(ZK, "USE_KERNEL", kernel)
        calls = []
        real = ZK.window_block
        monkeypatch.setattr(ZK, "window_block",
                            lambda *a, calls=calls, real=real: calls.append(1) or real(*a))
        out[kernel] = otstab.certify(model, X, y, **kw)
        monkeypatch.setattr(ZK, "window_block", real)
        assert bool(calls) == kernel
    ref, got = out[False], out[True]
    assert got.status == ref.status == "optimal"
    for f in ("value", "h", "risk_star", "primal_cost", "total_mass"):
        assert getattr(got, f) == pytest.approx(getattr(ref, f), rel=1e-11), f
    assert got.split == ref.split
    for f in ("source", "loss_star", "X_star"):
        np.testing.assert_array_equal(getattr(got, f), getattr(ref, f), err_msg=f)
    np.testing.assert_allclose(got.weights, ref.weights, rtol=1e-12, atol=0)
    np.testing.assert_allclose(got.mass, ref.mass, rtol=0, atol=100 * n * 2e-16)


def _near(prob, h, divergence, alpha, kernel, workers, reduced, monkeypatch, flag_every=0):
    """``(cand, tied, sums)`` of the moved-rows pass at ``h``, the kernel on or off
    (``flag_every``: every such block reported not finite, summed by NumPy)."""
    monkeypatch.setattr(ZK, "USE_KERNEL", kernel)
    monkeypatch.setattr(zp, "WORKERS", workers)
    real = ZK.near_block
    calls = []

    def spy(*args):
        real(*args)
        if flag_every and len(calls) % flag_every == 0:
            args[-1][12] = 0.0
        calls.append(1)
    monkeypatch.setattr(ZK, "near_block", spy)
    rp, near = zo.linear_prices(prob, None, 1.0)
    theta2 = 0.25 if divergence == "chi2" else INF
    sol = type("Sol", (), {"alpha": alpha, "solver": "zero_one_closed_form", "info": {}})()
    fn = zo._row_weight_fn(h, sol, theta2, divergence)
    assert fn is not None
    got = zp.near_pass(rp, h, fn, near.misclassified, divergence, 1e-10,
                       near.reduced if reduced else None, None, np.int32)
    assert bool(calls) == kernel
    return got


@pytest.mark.parametrize("divergence, alpha", [(None, 0.0), ("chi2", -0.3), ("chi2", -2.0)])
@pytest.mark.parametrize("reduced", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("q", [0.2, 0.5, 0.98])
def test_compiled_moved_rows_pass_equals_numpy_blocks(monkeypatch, divergence, alpha,
                                                      reduced, workers, q):
    """The candidates and their order, the tied positions (h a price: rows tied at it) and
    every sum of the moved-rows pass, unit or chi2 weights (alpha = -2: weights clipped at
    0), with or without the moves."""
    prob = _problem(n=7000, seed=8)
    rp, _ = zo.linear_prices(prob, None, 1.0)
    a = np.sort(rp.array())
    h = float(a[int(q * a.size)])
    assert h > 0
    ref = _near(prob, h, divergence, alpha, False, 1, reduced, monkeypatch)
    got = _near(prob, h, divergence, alpha, True, workers, reduced, monkeypatch)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert got[1].size >= 1  # (the row at h)
    assert got[2].keys() == ref[2].keys()
    for k in ref[2]:
        assert got[2][k] == pytest.approx(ref[2][k], rel=1e-12, abs=1e-9), k
    flagged = _near(prob, h, divergence, alpha, True, workers, reduced, monkeypatch,
                    flag_every=2)
    np.testing.assert_array_equal(flagged[0], ref[0])
    np.testing.assert_array_equal(flagged[1], ref[1])
    for k in ref[2]:
        assert flagged[2][k] == pytest.approx(ref[2][k], rel=1e-12, abs=1e-9), k


@pytest.mark.parametrize("fused_chi2", [False, True])
def test_kept_rows_of_theta2_inf_and_chi2(monkeypatch, fused_chi2):
    """With the window pass keeping the rows below it for theta2 = inf (FUSED_INF, off by
    default) the NumPy blocks run (unit terms, not the kernel's gaps); for chi2 (FUSED_CHI2)
    the kernel's kept sums, with chi2's terms ``lo - a``, equal NumPy's."""
    monkeypatch.setattr(zp, "FUSED_INF", True)
    monkeypatch.setattr(zp, "FUSED_CHI2", fused_chi2)
    prob = _problem(n=6000, seed=11)
    rp, _ = zo.linear_prices(prob, None, 1.0)
    a = np.sort(rp.array())
    lo, hi = float(a[3000]), float(a[3300])
    theta2, chi2 = (0.25, True) if fused_chi2 else (INF, False)
    ref = _window(prob, 1.0, lo, hi, theta2, chi2, False, 1, monkeypatch)
    monkeypatch.setattr(ZK, "USE_KERNEL", True)
    calls = []
    real = ZK.window_block
    monkeypatch.setattr(ZK, "window_block", lambda *a: calls.append(1) or real(*a))
    rp, near = zo.linear_prices(prob, None, 1.0)
    rp._fuse = (near.reduced, near.misclassified)
    win = rp._window(lo, hi, theta2, chi2=chi2)
    assert bool(calls) == fused_chi2
    np.testing.assert_array_equal(win, ref[0])
    _close(dict(rp._window_sums), ref[1])
    fz = rp._fused
    assert fz is not None and ref[2] is not None
    np.testing.assert_array_equal(fz.cand, ref[2][0])
    for x, y in zip((fz.W, fz.A, fz.NL, fz.WD2, fz.WDL, fz.QDL, fz.SDD), ref[2][2]):
        assert x == pytest.approx(y, rel=1e-12, abs=1e-12)
