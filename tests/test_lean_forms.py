"""The reduced forms computed per block of rows instead of stored (issue 17): every number
they give is the one the stored arrays give.

- ``otstab_solvers.dual.AffineRows`` / ``AffineOracle`` (margin and residual losses: the pieces
  ``c1[i, k] = a_k u_i + b_k`` from the scores and labels) against ``PiecewiseOracle`` on the
  materialised ``c1``, and the sorted view built from them against the one built from ``c1``;
- ``otstab.zero_one.RowPrices`` (0/1 prices of a binary linear classifier) against the
  n-vector of ``linear_distances`` and ``move_prices``;
- whole certificates through the lean forms against the same certificates through the
  stored arrays (hinge, pinball, 0/1; KL, chi2, theta2 = inf), bit for bit;
- ``audit.sample_positions`` and ``results.LazyInfo``.
"""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest
from otstab_solvers.dual import AffineOracle, AffineRows, PiecewiseOracle, oracle_for

import otstab
from otstab import audit, core, reduction
from otstab import zero_one as zo
from otstab.modeling._models import resolve_model
from otstab.solve._results import Lazy, LazyInfo

INF = math.inf


def _rows(kind, a, b, n=500, seed=0, block=64):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=n) * 2.0
    y = np.where(rng.random(n) < 0.5, -1, 1).astype(np.int8) if kind == "margin" else \
        rng.normal(size=n)
    rows = AffineRows(s, y, kind, np.asarray(a, float), np.asarray(b, float))
    rows.BLOCK = block  # many blocks, a partial last one
    return rows


PIECES = [("margin", [0.0, -1.0], [0.0, 1.0]),           # hinge
          ("margin", [-1.0, 0.0], [1.0, 0.0]),           # hinge, pieces swapped
          ("residual", [1.0, -1.0], [0.0, 0.0]),         # absolute
          ("residual", [0.3, -0.7], [0.0, 0.0]),         # pinball(0.3)
          ("residual", [1.0, -1.0, 0.0], [-0.2, -0.2, 0.0]),  # epsilon-insensitive(0.2)
          ("margin", [0.0, -2.5], [0.0, 1.5])]           # a general slope


@pytest.mark.parametrize("kind, a, b", PIECES)
def test_affine_oracle_equals_stored_pieces(kind, a, b):
    rows = _rows(kind, a, b)
    c1 = rows.materialize().T
    c2 = (np.asarray(a) ** 2 * 0.37)[None, :]
    lean, dense = AffineOracle(rows, c2), PiecewiseOracle(c1, c2)
    assert lean._zero == dense._zero
    np.testing.assert_array_equal(lean._c1max, dense._c1max)
    assert lean.c1abs == dense.c1abs
    sels = [slice(None), slice(3, 211), np.array([0, 7, 7, 499, 250])]
    for h in (0.0, 0.05, 0.7, 3.0, 40.0):
        assert lean.values_max(h) == dense.values_max(h)
        for sel in sels:
            np.testing.assert_array_equal(lean.values(h, sel), dense.values(h, sel))
            for x, z in zip(lean.scan(h, 1e-10, sel), dense.scan(h, 1e-10, sel)):
                np.testing.assert_array_equal(x, z)
        for side in ("left", "right"):  # the dense methods build the whole array once
            for x, z in zip(lean.evaluate(h, side=side, with_pieces=True),
                            dense.evaluate(h, side=side, with_pieces=True)):
                np.testing.assert_array_equal(x, z)


@pytest.mark.parametrize("kind, a, b", PIECES[:2])
def test_sorted_view_from_rows_equals_the_stored_one(kind, a, b):
    rows = _rows(kind, a, b, n=2000, seed=3)
    c2 = np.array([[0.0, 0.25]]) if a[0] == 0.0 else np.array([[0.25, 0.0]])
    lean = oracle_for(None, c2, rows=rows)
    dense = oracle_for(rows.materialize().T, c2)
    assert lean.prefix is not None and dense.prefix is not None
    np.testing.assert_array_equal(lean.prefix.nu, dense.prefix.nu)
    for h in (0.0, 0.3, 2.0):
        for div, t2 in (("kl", 0.5), ("kl", 1e6), ("chi2", 0.5), ("kl", INF)):
            x = lean.prefix.reduce(h, "right", t2, div)
            z = dense.prefix.reduce(h, "right", t2, div)
            np.testing.assert_array_equal(np.array(x[:3], float), np.array(z[:3], float))


def test_affine_rows_reject_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        AffineRows(np.zeros(3), np.ones(3), "multiclass", [1.0], [0.0])


# --- whole certificates: lean against stored ------------------------------------------------

def _binary(n=400, d=4, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    coef = rng.normal(size=d)
    y = np.where(X @ coef + 0.5 * rng.normal(size=n) > 0, 1, -1)
    return otstab.LinearModel(coef, 0.1), X, y


def _regression(n=300, d=3, seed=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X @ np.array([1.0, -0.5, 0.2]) + 0.3 * rng.normal(size=n)
    return otstab.LinearModel(np.array([0.8, -0.4, 0.0]), 0.05, task="regression"), X, y


DUALS = [("kl", 0.5), ("chi2", 0.5), ("kl", INF)]
FIELDS = ("value", "h", "risk_star", "primal_cost", "gap", "total_mass", "status", "split")
ARRAYS = ("weights", "source", "mass", "loss_star", "X_star")


def _same(res, ref, rtol=0.0):
    for f in FIELDS:
        x, z = getattr(res, f), getattr(ref, f)
        if rtol == 0.0 or not isinstance(x, float):
            assert x == z, f
        else:  # (the gap is itself a relative rounding-level number: compared absolutely)
            assert x == pytest.approx(z, rel=rtol, abs=1e-12 if f == "gap" else 1e-300), f
    for f in ARRAYS:
        # (a split atom's mass is (n r - risk) / gain: the rounding of the risk's sums, n eps)
        np.testing.assert_allclose(getattr(res, f), getattr(ref, f), rtol=rtol,
                                   atol=1e-12 if rtol and f == "mass" else 0, err_msg=f)


@pytest.mark.parametrize("divergence, theta2", DUALS)
@pytest.mark.parametrize("case", ["hinge", "pinball"])
def test_piecewise_certificate_lean_equals_stored(monkeypatch, case, divergence, theta2):
    model, X, y = _binary() if case == "hinge" else _regression()
    loss = "hinge" if case == "hinge" else otstab.losses.pinball(0.3)
    kw = dict(loss=loss, r=(0.9 if case == "hinge" else 0.6), theta1=1.5, theta2=theta2,
              divergence=divergence, solver="dual", se=None)
    lean = otstab.certify(model, X, y, **kw)
    real = reduction.reduce_problem

    def stored(prob, theta1, mask=None):  # the same reduced form, c1 held as an array
        red = real(prob, theta1, mask)
        return dataclasses.replace(red, c1_dense=red.c1, rows=None)

    monkeypatch.setattr(core, "reduce_problem", stored)  # what certify calls
    ref = otstab.certify(model, X, y, **kw)
    assert lean.status == "optimal"
    _same(lean, ref)


def _zero_one_stored(prob, r, theta1, theta2, divergence):
    """The 0/1 certificate through the n-vector of distances (the path before RowPrices)."""
    dstar, near = zo.linear_distances(prob, None)
    a = zo.move_prices(dstar, theta1)
    return zo._solve_and_build(a, near.misclassified, r, theta1, theta2, divergence, "auto",
                               prob.X, near, prob.y, prob.losses, prob.feature_names,
                               prob.index, 0.0, dstar)


@pytest.mark.parametrize("divergence, theta2", DUALS)
@pytest.mark.parametrize("theta1", [1.0, 2.5, INF])
@pytest.mark.parametrize("r", [0.35, 1.0])
def test_zero_one_row_prices_equal_the_distance_vector(divergence, theta2, theta1, r):
    model, X, y = _binary(seed=5)
    prob = resolve_model(model, X, y, loss="zero_one")
    lean = zo.certify_zero_one_problem(prob, r, theta1, theta2, divergence, None, "auto", 0.0)
    ref = _zero_one_stored(prob, r, theta1, theta2, divergence)
    assert lean.status == ref.status
    if lean.status in ("optimal", "limit"):
        # the same h and Q*; the sums over Q*'s atoms (its cost, risk, mass) are summed in
        # the pass that finds the moved rows (r < 1: no array of their weights), and at
        # r = 1 and with theta2 = inf the closed form's value is a mean over the prices it
        # is given, here the sorted copy, there the row order: the last bits may differ
        _same(lean, ref, rtol=1e-13)
        assert lean.h == ref.h
    np.testing.assert_array_equal(lean.info["dstar"], ref.info["dstar"])


def test_row_prices_against_the_vectors():
    model, X, y = _binary(n=1000, seed=7)
    prob = resolve_model(model, X, y, loss="zero_one")
    for mask in (None, np.array([True, False, False, False])):
        dstar, near = zo.linear_distances(prob, mask)
        for theta1 in (1.0, 0.3, INF):
            prices, _ = zo.linear_prices(prob, mask, theta1)
            prices.BLOCK = 37
            a = zo.move_prices(dstar, theta1)
            np.testing.assert_array_equal(prices.dstar(), dstar)
            np.testing.assert_array_equal(prices.array(), a)
            np.testing.assert_array_equal(prices.sorted(), np.sort(a))
            np.testing.assert_array_equal(prices[np.array([5, 1, 999])], a[[5, 1, 999]])
            for h in (0.0, float(np.median(a[np.isfinite(a)])), 1e9):
                cand, ac = prices.near(h)
                ref_c, ref_a = zo._near(a, h)
                np.testing.assert_array_equal(cand, ref_c)
                np.testing.assert_array_equal(ac, ref_a)
            fin = np.isfinite(a)
            assert prices.finite() == (bool(fin.any()), bool(fin.all()),
                                       int(np.count_nonzero(fin & ~near.misclassified)))


def test_row_prices_of_a_zero_model():
    # w = 0 (every feature masked away): nothing can move; misclassified rows cost 0
    model, X, y = _binary(seed=2)
    prob = resolve_model(model, X, y, loss="zero_one")
    prices, near = zo.linear_prices(prob, np.zeros(X.shape[1], dtype=bool), 1.0)
    expected = np.where(near.misclassified, 0.0, np.inf)
    np.testing.assert_array_equal(prices.array(), expected)
    assert prices.finite() == (bool(near.misclassified.any()),
                               bool(near.misclassified.all()), 0)


def test_linear_prices_needs_a_binary_model():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    model = otstab.LinearModel(rng.normal(size=(3, 3)), 0.0)
    prob = resolve_model(model, X, model.predict(X), loss="zero_one")
    with pytest.raises(ValueError, match="binary"):
        zo.linear_prices(prob, None, 1.0)


def test_zero_one_certificate_holds_no_distance_vector_until_asked():
    model, X, y = _binary(n=600, seed=4)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.4)
    assert isinstance(dict.__getitem__(res.info, "dstar"), Lazy)
    d = res.info["dstar"]  # built on first read, then kept
    assert dict.__getitem__(res.info, "dstar") is d
    m = y * model.decision_function(X)
    w = model.coef_
    np.testing.assert_allclose(d, np.where(m > 0, m * m / (w @ w), 0.0), rtol=1e-12)
    np.testing.assert_array_equal(res.loss_base, (model.predict(X) != y).astype(float))


# --- helpers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("m, k", [(10, 20), (10, 10), (100, 30), (100_000, 20_000),
                                  (1_000_000, 5), (7, 0)])
def test_sample_positions(m, k):
    pos = audit.sample_positions(m, k)
    assert pos.size == min(m, k)
    assert np.all(np.diff(pos) > 0)  # distinct and ascending
    assert pos.size == 0 or (pos[0] >= 0 and pos[-1] < m)
    np.testing.assert_array_equal(pos, audit.sample_positions(m, k))  # the same every run
    if 0 < k < m:
        assert not np.array_equal(pos, audit.sample_positions(m, k, seed=1))


def test_lazy_info_builds_once_and_pickles_built():
    calls = []

    def build():
        calls.append(1)
        return np.arange(3.0)

    info = LazyInfo({"x": Lazy(build), "y": 2})
    assert "x" in info and info.get("missing") is None and info["y"] == 2
    np.testing.assert_array_equal(info.get("x"), np.arange(3.0))
    np.testing.assert_array_equal(info["x"], np.arange(3.0))
    assert calls == [1]
    info2 = LazyInfo({"x": Lazy(build)})
    back = pickle.loads(pickle.dumps(info2))
    assert isinstance(back, LazyInfo)
    np.testing.assert_array_equal(dict.__getitem__(back, "x"), np.arange(3.0))


def test_result_with_lazy_info_pickles():
    model, X, y = _binary(n=300, seed=8)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.4)
    back = pickle.loads(pickle.dumps(res))
    np.testing.assert_array_equal(back.info["dstar"], res.info["dstar"])
    assert back.value == res.value


# --- property: any affine pieces, any h ------------------------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_slopes = st.sampled_from([-1.0, 0.0, 1.0]) | st.floats(-1e3, 1e3, allow_nan=False)
_offsets = st.sampled_from([0.0, 1.0, -0.5]) | st.floats(-1e3, 1e3, allow_nan=False)


@given(kind=st.sampled_from(["margin", "residual"]),
       pieces=st.lists(st.tuples(_slopes, _offsets), min_size=1, max_size=4),
       scale=st.floats(1e-6, 1e6), h=st.floats(0.0, 1e6), c=st.floats(0.0, 1e3),
       seed=st.integers(0, 2**16))
def test_affine_oracle_equals_stored_pieces_property(kind, pieces, scale, h, c, seed):
    # the per-block pieces give the stored array's numbers for any slopes, offsets, score
    # scales and h: values, the largest value, and the scan with its ties
    a, b = (np.array(v, dtype=float) for v in zip(*pieces))
    rows = _rows(kind, a, b, n=97, seed=seed, block=16)
    rows.s = rows.s * scale
    c2 = (a * a * c)[None, :]
    lean, dense = AffineOracle(rows, c2), PiecewiseOracle(rows.materialize().T, c2)
    assert lean._zero == dense._zero and lean.c1abs == dense.c1abs
    assert lean.values_max(h) == dense.values_max(h)
    for sel in (slice(None), slice(5, 60), np.array([3, 3, 96, 0])):
        np.testing.assert_array_equal(lean.values(h, sel), dense.values(h, sel))
        for x, z in zip(lean.scan(h, 1e-10, sel), dense.scan(h, 1e-10, sel)):
            np.testing.assert_array_equal(x, z)


def test_affine_oracle_rows_as_a_boolean_mask():
    rows = _rows("margin", [0.0, -1.0], [0.0, 1.0], n=50, seed=9)
    c2 = np.array([[0.0, 0.3]])
    lean, dense = AffineOracle(rows, c2), PiecewiseOracle(rows.materialize().T, c2)
    mask = np.zeros(50, dtype=bool)
    mask[[1, 4, 30]] = True
    for h in (0.0, 0.8):
        np.testing.assert_array_equal(lean.values(h, mask), dense.values(h, mask))
        assert lean.values(h, mask).shape == (3,)


# ---------------------------------------------------------------------------------------------
# blockwise weights, the weighted dual over blocks, crossings and prefix sums without n-vectors


@pytest.mark.parametrize("theta2", [0.05, 0.7, 1e6, INF])
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("weighted", [False, True])
def test_weight_map_blocks_equals_the_dense_map(divergence, theta2, weighted):
    """``blockwise.weight_map_blocks`` (l_h given per block, never stored; chi2's alpha by
    active-set passes) gives the weights, term and alpha of ``weights.weight_map`` on the whole
    vector, to the rounding of the sums' order."""
    from otstab_solvers.blockwise import weight_map_blocks
    from otstab_solvers.weights import BLOCK, weight_map

    rng = np.random.default_rng(17 + weighted)
    n = 2 * BLOCK + 123  # two full blocks and a partial one
    lh = np.maximum(rng.normal(size=n) * 2.0 + 0.5, 0.0)
    lh[rng.random(n) < 0.3] = 0.0  # many rows at 0, as on the stay piece
    p = None
    if weighted:
        p = rng.uniform(0.0, 2.0, n)
        p[rng.random(n) < 0.1] = 0.0  # zero-probability rows, some above the support's top
        lh[np.flatnonzero(p == 0)[:5]] = 50.0
        p /= p.sum()
    dense = weight_map(lh, theta2, divergence, p)
    blocks = weight_map_blocks(lambda s, e: lh[s:e], n, theta2, divergence, p=p)
    # (a chi2 weight near 0 is the difference of two numbers of size 1: absolute rounding)
    np.testing.assert_allclose(blocks(lh), dense(lh), rtol=1e-12,
                               atol=1e-13 * float(dense(lh).max()))
    assert blocks.term == pytest.approx(dense.term, rel=1e-12, abs=1e-300)
    if dense.alpha is None:
        assert blocks.alpha is None
    else:
        # (the dense alpha rounds 2 theta2 n against itself: some 1e-9 of alpha at theta2 = 1e6;
        # where every sample is active alpha is minus the mean of l_h, to which the blocks'
        # alpha is accurate to rounding)
        assert blocks.alpha == pytest.approx(dense.alpha, rel=1e-8, abs=1e-12 * (1 + lh.max()))
        if math.isfinite(theta2) and float(np.min(dense(lh))) > 0:
            exact = -(math.fsum(lh) / n if p is None else math.fsum(p * lh))
            assert blocks.alpha == pytest.approx(exact, rel=1e-14)
    w = blocks(lh)
    mass = float(np.mean(w)) if p is None else float(p @ w)
    assert mass == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("kind, a, b", PIECES)
def test_affine_crossings_without_the_stored_pieces(kind, a, b):
    rows = _rows(kind, a, b)
    c2 = (np.asarray(a) ** 2 * 0.37 + np.arange(len(a)) * 0.1)[None, :]
    lean, dense = AffineOracle(rows, c2), PiecewiseOracle(rows.materialize().T, c2)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, rows.n, 300)
    ka, kb = rng.integers(0, len(a), 300), rng.integers(0, len(a), 300)
    np.testing.assert_array_equal(lean.crossings(ka, kb, idx), dense.crossings(ka, kb, idx))
    assert lean._dense is None  # no (K, n) array was built


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.3), ("chi2", 0.3), ("kl", INF)])
@pytest.mark.parametrize("kind, a, b", PIECES[:4])
def test_weighted_dual_over_blocks_equals_the_dense_dual(kind, a, b, divergence, theta2):
    """The weighted dual summed over in-memory blocks (``affine_blocks``) reaches the value of
    the dense weighted dual."""
    from otstab_solvers.blockwise import BlockwiseDual, affine_blocks, in_memory
    from otstab_solvers.dual import solve_dual

    rows = _rows(kind, a, b, n=3000, block=1 << 14)
    c2 = (np.asarray(a) ** 2 * 0.37)[None, :]
    p = np.random.default_rng(4).uniform(0.1, 2.0, rows.n)
    p /= p.sum()
    dense = AffineOracle(rows, c2)
    lh0 = dense.values(0.0)  # r between the base and the largest reachable risk
    d1 = dense.evaluate(0.0)[1]
    r = float(p @ np.maximum(d1, 0.0)) * 0.5 + 0.6
    ref = solve_dual(dense, r, theta2, divergence, p=p)
    blocks = BlockwiseDual(in_memory(affine_blocks(rows, c2, dense.c1abs, p, size=700)),
                           rows.n, 1.0)
    sol = solve_dual(blocks, r, theta2, divergence)
    assert ref.status == sol.status == "optimal", (ref.native_status, sol.native_status)
    assert sol.value == pytest.approx(ref.value, rel=1e-10, abs=1e-14)
    assert sol.h == pytest.approx(ref.h, rel=1e-7)
    assert lh0.size == rows.n


@pytest.mark.parametrize("seed", range(4))
def test_sorted_prefix_sums_from_the_negated_keys(seed):
    """The prefix sums of the sorted keys, computed from ``nu = -u`` in place, equal those of
    ``u`` bit for bit (negation is exact), with infinite keys left out."""
    from otstab_solvers.sorted_oracle import SortedTwoPiece

    rng = np.random.default_rng(seed)
    u = rng.normal(size=1000) * 10.0 ** rng.uniform(-3, 3)
    u[rng.random(1000) < 0.05] = -INF
    view = SortedTwoPiece(u, "hinge", 0.5)
    us = np.sort(u)[::-1]
    fin = us[np.isfinite(us)]
    cu = np.concatenate([[0.0], np.cumsum(fin), np.zeros(u.size - fin.size)])
    cu2 = np.concatenate([[0.0], np.cumsum(fin * fin), np.zeros(u.size - fin.size)])
    np.testing.assert_array_equal(view.cu, cu)
    np.testing.assert_array_equal(view.cu2, cu2)
    np.testing.assert_array_equal(view.us, us)


@pytest.mark.parametrize("seed", range(5))
def test_shares_in_order(seed):
    """``audit.shares_in_order``: whole shares first (in order), one partial share that makes
    the moved gain exactly ``need``, nothing after; nothing for ``need <= 0``; everything when
    the gains do not reach ``need``."""
    rng = np.random.default_rng(seed)
    gain = rng.uniform(0.1, 2.0, 40)
    for need in (-1.0, 0.0, 0.05, float(gain[:7].sum()), 0.37 * gain.sum(), 2 * gain.sum()):
        frac = audit.shares_in_order(gain, need)
        assert np.all((frac >= 0) & (frac <= 1))
        k = int(np.count_nonzero(frac >= 1))
        assert np.all(frac[:k] == 1) and np.all(frac[k + 1:] == 0)
        assert np.count_nonzero((frac > 0) & (frac < 1)) <= 1
        assert float(frac @ gain) == pytest.approx(min(max(need, 0.0), gain.sum()), rel=1e-12,
                                                   abs=1e-15)
    np.testing.assert_array_equal(audit.shares_in_order(np.zeros(0), 1.0), np.zeros(0))
