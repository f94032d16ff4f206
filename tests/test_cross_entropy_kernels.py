"""The multinomial cross-entropy d-transform in one compiled loop
(otstab_solvers/cross_entropy_kernels.py, numba) against the NumPy blocks of
``CrossEntropyOracle._solve_rows`` and against a brute-force search of the inner maximum.

Independent references: the NumPy blocks (the same algorithm on arrays, another order of the
floating-point operations), a grid search of ``max_c h CE(s + A c) - theta1 |c|^2`` over the
reduced coordinates (two of them: K = 3), the definition of ``l_h`` as a maximum (never below
the objective at any point tried), and whole certificates with the kernel on and off.
"""

import math

import numpy as np
import pytest

pytest.importorskip("numba")

from otstab_solvers import cross_entropy_kernels as CK  # noqa: E402
from otstab_solvers.smooth import CrossEntropyOracle  # noqa: E402

import otstab  # noqa: E402


def _oracle(n=600, d=5, K=4, theta1=1.0, seed=0, mask=None):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W = rng.standard_normal((K, d))
    S = X @ W.T
    y = np.argmax(S + rng.gumbel(size=(n, K)), axis=1)
    Wm = W if mask is None else W[:, mask]
    return CrossEntropyOracle(S, y, Wm, theta1, copy=False, cache=False)


def _both(oracle, h, monkeypatch):
    rows = np.arange(oracle.n)
    monkeypatch.setattr(CK, "USE_KERNEL", False)
    ref = oracle._solve_rows(h, rows)
    monkeypatch.setattr(CK, "USE_KERNEL", True)
    monkeypatch.setattr(CK, "KERNEL_MIN_ROWS", 1)
    assert CK.use_kernel(oracle.n)
    return oracle._solve_rows(h, rows), ref


@pytest.mark.parametrize("K, mask", [(3, None), (4, None), (5, None), (4, [0])])
@pytest.mark.parametrize("theta1", [0.3, 1.0, 5.0])
@pytest.mark.parametrize("ratio", [0.2, 0.9999, 1.5, 6.0, 50.0])
def test_compiled_rows_equal_the_numpy_blocks(monkeypatch, K, mask, theta1, ratio):
    """The same maximisers row by row: ``l_h`` to 1e-12 (relative), its derivatives and the
    maximiser to the Newton tolerance's effect on them (flat maxima), below the concavity
    bound h_concave (one start, plain Newton), at it and above it (a start per class,
    Levenberg steps), with a rank-deficient mask (q = 1)."""
    o = _oracle(K=K, theta1=theta1, mask=mask, seed=K)
    h = ratio * o.h_concave
    got, ref = _both(o, h, monkeypatch)
    scale = 1.0 + np.abs(ref[0])
    np.testing.assert_array_less(np.abs(got[0] - ref[0]), 1e-12 * scale)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-6, atol=1e-9)
    fin = np.isfinite(ref[2])
    np.testing.assert_array_equal(np.isfinite(got[2]), fin)
    np.testing.assert_allclose(got[2][fin], ref[2][fin], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-6, atol=1e-7)


def _objective(o, rows, C, h):
    S = o.scores[rows] + C @ o.A.T
    m = S.max(axis=1)
    lse = m + np.log(np.exp(S - m[:, None]).sum(axis=1))
    ce = lse - S[np.arange(rows.size), o.labels[rows]]
    return h * ce - o.theta1 * np.sum(C * C, axis=1)


@pytest.mark.parametrize("ratio", [0.5, 3.0, 30.0])
def test_l_h_is_the_maximum_of_a_grid_search(monkeypatch, ratio):
    """K = 3 (two reduced coordinates): ``l_h`` of every row is at least the objective's
    largest value on a fine grid around the origin (the global maximum, also where the
    objective has several local maxima), and never below the objective at the returned
    maximiser (it is that value)."""
    o = _oracle(n=60, K=3, theta1=1.0, seed=7)
    h = ratio * o.h_concave
    (lh, _, _, C), _ = _both(o, h, monkeypatch)
    rows = np.arange(o.n)
    np.testing.assert_allclose(lh, _objective(o, rows, C, h), rtol=1e-13, atol=1e-13)
    radius = h * (1.0 + np.abs(o.A).max()) / o.theta1 + 1.0
    grid = np.linspace(-radius, radius, 801)
    G = np.stack(np.meshgrid(grid, grid), axis=-1).reshape(-1, 2)
    for i in range(o.n):
        best = _objective(o, np.full(G.shape[0], i), G, h).max()
        assert lh[i] >= best - 1e-9 * (1.0 + abs(best)), (i, lh[i], best)


def test_two_halves_give_the_numbers_of_one_pass(monkeypatch):
    """Rows are independent: split over two threads or not, the same bits."""
    o = _oracle(n=3000, K=4, theta1=1.0, seed=3)
    h = 4.0 * o.h_concave
    monkeypatch.setattr(CK, "KERNEL_MIN_ROWS", 1)
    rows = np.arange(o.n)
    two = o._solve_rows(h, rows)
    monkeypatch.setattr(CK, "PAIR_MIN_ROWS", 1 << 30)
    one = o._solve_rows(h, rows)
    for a, b in zip(two, one):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("r", [0.9, 1.6])
def test_certificate_with_the_kernel_equals_the_numpy_one(monkeypatch, divergence, r):
    """A multinomial logistic certificate (its value, status and Q*'s risk) is the same with
    the compiled rows as with the NumPy blocks, to the rounding of the dual's search."""
    rng = np.random.default_rng(11)
    n, d, K = 3000, 6, 4
    X = rng.standard_normal((n, d))
    W = rng.standard_normal((K, d)) / math.sqrt(d)
    y = np.argmax(X @ W.T + rng.gumbel(size=(n, K)), axis=1)
    model = otstab.LinearModel(W, np.zeros(K))
    kw = dict(loss="cross_entropy", r=r, divergence=divergence)
    monkeypatch.setattr(CK, "USE_KERNEL", False)
    ref = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(CK, "USE_KERNEL", True)
    monkeypatch.setattr(CK, "KERNEL_MIN_ROWS", 1)
    got = otstab.certify(model, X, y, **kw)
    assert got.status == ref.status
    assert got.value == pytest.approx(ref.value, rel=1e-9)
    assert got.risk_star == pytest.approx(ref.risk_star, rel=1e-9)


def test_used_from_its_threshold_on(monkeypatch):
    monkeypatch.setattr(CK, "USE_KERNEL", True)
    assert not CK.use_kernel(CK.KERNEL_MIN_ROWS - 1)
    assert CK.use_kernel(CK.KERNEL_MIN_ROWS)
    monkeypatch.setattr(CK, "USE_KERNEL", False)
    assert not CK.use_kernel(1 << 20)
