"""The sorted prefix-sum oracle (hinge shape, 0/1 distances) against the dense reduction."""

import math

import numpy as np
import pytest
from otstab_solvers.dual import PiecewiseOracle, _reduce, oracle_for, solve_dual
from otstab_solvers.sorted_oracle import SortedTwoPiece
from otstab_solvers.zero_one import DistanceOracle
from reference import dual_value, lh_hinge

INF = math.inf


def hinge_form(u, c):
    return np.column_stack([np.zeros(u.size), u]), np.array([[0.0, c]])


def keys(rng, n, kind):
    if kind == "gauss":
        return rng.standard_normal(n)
    if kind == "ties":  # many exactly tied keys (rounded margins)
        return np.round(rng.standard_normal(n), 1)
    if kind == "negative":  # every sample correct with margin > 1: base risk 0
        return -np.abs(rng.standard_normal(n)) - 0.1
    return np.abs(rng.standard_normal(n)) + 0.1  # "positive": every sample inside the margin


def dense_reduce(oracle, h, side, theta2, div):
    lh, d1, d2 = oracle.evaluate(h, side=side)
    return _reduce(lh, d1, d2, theta2, div, oracle.n)


def assert_same_reduction(dense, view, h, side, theta2, div):
    """The sorted view's (term, mean derivative, alpha) equal the dense reduction's."""
    t, mu, _, alpha = dense_reduce(dense, h, side, theta2, div)
    t2, mu2, _, alpha2, _ = view.reduce(h, side, theta2, div)
    assert t2 == pytest.approx(t, rel=1e-11, abs=1e-12)
    assert mu2 == pytest.approx(mu, rel=1e-11, abs=1e-12)
    if alpha is not None:
        assert alpha2 == pytest.approx(alpha, rel=1e-11, abs=1e-12)


@pytest.mark.parametrize("kind", ["gauss", "ties", "negative", "positive"])
@pytest.mark.parametrize("c", [0.0, 0.05, 2.0])
def test_hinge_reduction_matches_dense(kind, c):
    rng = np.random.default_rng(len(kind) + int(10 * c))
    for n in (1, 2, 57, 400):
        u = keys(rng, n, kind)
        oracle = oracle_for(*hinge_form(u, c))
        assert oracle.prefix is not None
        for theta2 in (0.1, 1.0, INF):
            for div in ("kl", "chi2"):
                for h in (0.0, 1e-3, 0.3, 1.0, 7.0):
                    for side in ("right", "left") if h > 0 else ("right",):
                        assert_same_reduction(oracle, oracle.prefix, h, side, theta2, div)


def test_distance_reduction_matches_dense():
    rng = np.random.default_rng(3)
    for n in (1, 5, 300):
        a = np.abs(rng.standard_normal(n))
        a[rng.random(n) < 0.2] = 0.0  # already misclassified
        a[rng.random(n) < 0.1] = INF  # cannot be misclassified
        a[: n // 3] = np.round(a[: n // 3], 1)  # ties
        oracle = DistanceOracle(a)
        for theta2 in (0.05, 1.0, INF):
            for div in ("kl", "chi2"):
                for h in (0.0, 0.1, 0.5, 3.0):
                    for side in ("right", "left"):
                        assert_same_reduction(oracle, oracle.prefix, h, side, theta2, div)


def test_kinks_between_match_dense_crossings():
    rng = np.random.default_rng(5)
    u = np.round(rng.standard_normal(200), 2)
    c = 0.7
    oracle = oracle_for(*hinge_form(u, c))
    for lo, hi in ((0.01, 0.5), (0.2, 0.21), (1.0, 3.0), (0.0, 10.0)):
        _, _, _, k_lo = oracle.evaluate(lo, with_pieces=True)
        _, _, _, k_hi = oracle.evaluate(hi, with_pieces=True)
        sw = np.nonzero(k_lo != k_hi)[0]
        hc = oracle.crossings(k_lo[sw], k_hi[sw], sw)
        hc = np.sort(hc[np.isfinite(hc) & (hc > lo) & (hc < hi)])
        p_lo = oracle.prefix.count(lo)
        p_hi = oracle.prefix.count(hi)
        cnt, kmin, kmax, kmid = oracle.prefix.kinks_between(p_lo, p_hi, lo, hi)
        assert cnt == hc.size
        if cnt:
            assert kmin == pytest.approx(hc[0], rel=1e-14)
            assert kmax == pytest.approx(hc[-1], rel=1e-14)
            assert hc[0] <= kmid <= hc[-1]


@pytest.mark.parametrize("div", ["kl", "chi2"])
@pytest.mark.parametrize("theta2", [0.05, 0.25, INF])
@pytest.mark.parametrize("kind", ["gauss", "ties"])
def test_sorted_solve_matches_brute_force_and_dense(kind, theta2, div):
    rng = np.random.default_rng(11)
    n, c = 500, 0.3
    u = keys(rng, n, kind)
    m = 1.0 - u
    r = 1.4 * float(np.mean(np.maximum(u, 0.0)))
    sorted_sol = solve_dual(oracle_for(*hinge_form(u, c)), r, theta2, div)
    dense_sol = solve_dual(PiecewiseOracle(*hinge_form(u, c)), r, theta2, div)
    ref = dual_value(lambda h: lh_hinge(m, 4.0 * c, 1.0, h), r, theta2, div)[0]
    assert sorted_sol.status == dense_sol.status == "optimal"
    assert sorted_sol.value == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert sorted_sol.value == pytest.approx(dense_sol.value, rel=1e-10, abs=1e-13)


def test_risk_parts_match_dense_scan():
    from otstab_solvers.weights import weights_at

    rng = np.random.default_rng(2)
    u = np.round(rng.standard_normal(300), 1)
    c = 0.5
    oracle = oracle_for(*hinge_form(u, c))
    h = 0.2 / c  # u = -0.2 is tied at this h: every such sample sits on a kink
    for theta2 in (0.1, INF):
        for div in ("kl", "chi2"):
            lh, _, d_lo, _, d_hi = oracle.scan(h)
            w = weights_at(lh, theta2, div)[0]
            dense = (w @ d_lo / u.size, w @ d_hi / u.size, d_lo.mean(), d_hi.mean())
            np.testing.assert_allclose(oracle.prefix.risk_parts(h, theta2, div), dense,
                                       rtol=1e-11, atol=1e-13)
            assert dense[1] > dense[0]  # the tie is real


def test_structure_detection_and_with_c2():
    rng = np.random.default_rng(0)
    u = rng.standard_normal(50)
    assert oracle_for(*hinge_form(u, 0.4)).prefix is not None
    c1, c2 = hinge_form(u, 0.4)
    assert oracle_for(c1[:, ::-1], c2[:, ::-1]).prefix is not None  # zero piece second
    # pinball-like: no zero piece
    assert oracle_for(np.column_stack([u, -u]), np.array([[0.1, 0.1]])).prefix is None
    # per-sample c2 (rowwise) is not the hinge shape
    assert oracle_for(c1, np.column_stack([np.zeros(50), np.full(50, 0.4)])).prefix is None
    assert oracle_for(np.column_stack([u, u, -u]), np.zeros((1, 3))).prefix is None
    base = oracle_for(c1, c2)
    other = base.with_c2(np.array([[0.0, 2.0]]))
    assert other.prefix is not None and other.prefix.c == 2.0
    assert other.prefix.nu is base.prefix.nu  # no new sort
    t, mu, *_ = dense_reduce(other, 0.3, "right", 0.5, "kl")
    t2, mu2, *_ = other.prefix.reduce(0.3, "right", 0.5, "kl")
    assert (t2, mu2) == pytest.approx((t, mu), rel=1e-12)


def test_inputs_not_mutated_and_bad_kind():
    u = np.array([0.5, -0.2, 1.0])
    keep = u.copy()
    SortedTwoPiece(u, "hinge", 1.0)
    np.testing.assert_array_equal(u, keep)
    with pytest.raises(ValueError, match="kind"):
        SortedTwoPiece(u, "bogus")


def test_rescaled_distances_match_dense():
    """with_scale(s) evaluates l_h = (h - s a_i)_+ from the same sorted keys."""
    rng = np.random.default_rng(8)
    a = np.sort(np.round(np.abs(rng.standard_normal(300)), 2))
    base = SortedTwoPiece(-a, "distance", presorted=True)
    for s in (0.3, 1.0, 7.5):
        dense = DistanceOracle(s * a)
        view = base.with_scale(s)
        assert view.nu is base.nu
        for theta2 in (0.2, INF):
            for div in ("kl", "chi2"):
                for h in (0.05, 0.7, 3.0, float(s * a[150])):  # the last one at a kink
                    for side in ("right", "left"):
                        assert_same_reduction(dense, view, h, side, theta2, div)
        r = 0.6
        dense.prefix = None  # the dense kink-exact path
        ref = solve_dual(dense, r, 0.2, "chi2")
        got = solve_dual(view, r, 0.2, "chi2")  # a sorted view is itself an oracle
        assert got.value == pytest.approx(ref.value, rel=1e-10)
    with pytest.raises(ValueError, match="scale"):
        base.with_scale(0.0)


@pytest.mark.parametrize("theta2", [0.25, 4.0, 1e4])
def test_kl_term_against_high_precision_either_side_of_the_expm1_pass(theta2):
    """The KL term of a sorted view (its log(Z / n) when Z / n is below 1 - EXPM1_SHARE, the
    expm1 pass above) equals a 50-digit evaluation at h where Z / n lies on either side of
    that share (the near-base regime of issue 31 sits between 0.5 and 15/16)."""
    from decimal import Decimal

    import hp_dual
    from otstab_solvers import sorted_oracle

    rng = np.random.default_rng(31)
    n, c = 1500, 0.05
    u = rng.standard_normal(n)
    view = SortedTwoPiece(u, "hinge", c)
    shares = set()
    for h in (1e-4, 3e-3, 0.02, 0.1, 0.5):
        term = view.reduce(h, "right", theta2, "kl")[0]
        with hp_dual._ctx():
            lh, _ = hp_dual._pieces("hinge", [Decimal(float(k)) for k in u], Decimal(c),
                                    Decimal(h))
            p = [Decimal(1) / n] * n
            exact = float(hp_dual._term_and_weights(lh, p, Decimal(theta2), "kl")[0])
        lmax = float(np.max(np.maximum(u * h + c * h * h, 0.0)))
        zn = float(np.mean(np.exp((np.maximum(u * h + c * h * h, 0.0) - lmax) / theta2)))
        shares.add(zn > 1.0 - sorted_oracle.EXPM1_SHARE)
        # a few ulps of the largest l_h (the shift M, times theta2) and of the term itself
        assert term == pytest.approx(exact, rel=1e-13, abs=64 * np.finfo(float).eps * lmax)
    # (both branches at theta2 = 0.25 and 4; the expm1 pass alone at 1e4)
    assert shares == ({True} if theta2 > 100 else {True, False})


@pytest.mark.parametrize("kind", ["margin", "residual"])
def test_sorted_view_of_rows_equals_the_dense_keys(kind):
    """sorted_view_of writes the hinge's keys of the rows form in one product over all rows
    (issue 31): the same numbers, bit for bit, as the stored column's negation, sorted."""
    from otstab_solvers.dual import AffineRows, sorted_view_of

    rng = np.random.default_rng(7)
    n = 3 * AffineRows.BLOCK + 5  # several blocks of the blocked form, a ragged last one
    s = rng.standard_normal(n)
    y = np.where(rng.random(n) < 0.5, -1, 1).astype(np.int8) if kind == "margin" else \
        rng.standard_normal(n)
    rows = AffineRows(s, y, kind, np.array([0.0, -1.0]), np.array([0.0, 1.0]))
    oracle = oracle_for(None, np.array([[0.0, 0.3]]), rows=rows, sorted_view=False)
    assert oracle._hinge_piece == 1
    view = sorted_view_of(oracle)
    u = 1.0 - (y * s if kind == "margin" else y - s)  # the piece a u' + b, a = -1, b = 1
    np.testing.assert_array_equal(view.nu, np.sort(-u))
    np.testing.assert_array_equal(view.nu, np.sort(-rows.materialize()[1]))


@pytest.mark.parametrize("offset", [1e-3, -1e-2, 5e-2])
def test_kl_model_step_counts_the_kinks(offset, monkeypatch):
    """model_step (issue 31): from a point off the root by ``offset`` of h, the root of the
    local model (curvature slope + the jumps of mu at the kinks on the way) is far closer
    to the exact root than Newton's step; a bracketed search that uses it needs no more
    exact evaluations than Newton's and ends at the same root."""
    rng = np.random.default_rng(11)
    n, c, theta2 = 100_000, 0.25, 0.25
    u = rng.standard_normal(n)
    view = SortedTwoPiece(u, "hinge", c)
    r = float(np.mean(np.maximum(u, 0.0))) + 0.5
    sol = solve_dual(view, r, theta2, "kl")
    h0 = sol.h * (1.0 + offset)
    _, mu, curv, _, _ = view.reduce(h0, "right", theta2, "kl")
    g = r - mu
    h_model = view.model_step(h0, "right", g, curv)
    h_newton = h0 + g / curv
    assert abs(h_model - sol.h) <= 1e-2 * abs(h_newton - sol.h), (h_model, h_newton, sol.h)
    assert math.isnan(view.model_step(h0 * 1.1, "right", g, curv))  # not evaluated there
    bracket = (sol.h * 0.9, sol.h * 1.1)
    with_model = solve_dual(view, r, theta2, "kl", bracket=bracket, h_init=h0)
    monkeypatch.setattr(SortedTwoPiece, "model_step", lambda self, *a: math.nan)
    newton = solve_dual(view, r, theta2, "kl", bracket=bracket, h_init=h0)
    assert with_model.status == newton.status == "optimal"
    assert with_model.iterations <= newton.iterations
    # (the search stops at |g| <= 1e-11 r: h to about that precision)
    assert with_model.h == pytest.approx(sol.h, rel=1e-10)
    assert newton.h == pytest.approx(sol.h, rel=1e-10)
    assert with_model.value == pytest.approx(newton.value, rel=1e-14)
    # against the dense reduction (independent of the sorted sums) at the root
    dense = PiecewiseOracle(*hinge_form(u, c))
    assert_same_reduction(dense, view, with_model.h, "right", theta2, "kl")


@pytest.mark.parametrize("use_kernel", [False, True])
def test_kl_weights_exact_when_the_exponents_offset_is_huge(monkeypatch, use_kernel):
    """At extreme prices (theta1 = 1e12, theta2 = 1e-6) ``l / theta2 = (A u + B) / theta2``
    is near 1e19: the exponents ``(l - max l) / theta2`` must be taken about the largest key
    (``k1 (nu - piv) + k0``), not as ``k1 nu + (B / theta2 - M)``, whose cancellation left the
    largest one off by up to 2^10 (its weight 0, or an overflow). Reference: the weights
    ``exp((l_i - max l) / theta2)`` with ``l_i`` evaluated exactly in mpmath: here 1 for the
    three tied top keys and 0 for the others."""
    mpmath = pytest.importorskip("mpmath")
    from otstab_solvers import sorted_kernels as K

    if use_kernel:
        if not K.HAVE_NUMBA:
            pytest.skip("needs numba")
        monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 1)
    else:
        monkeypatch.setattr(K, "USE_KERNEL", False)
    rng = np.random.default_rng(5)
    theta2 = 1e-6
    for _ in range(20):
        top_key = rng.uniform(1.0, 2.0)
        u = np.concatenate([np.full(3, top_key), top_key - rng.uniform(0.01, 1.0, 40)])
        h = rng.uniform(1e12, 5e12)
        view = SortedTwoPiece(u, "hinge", rng.uniform(0.5, 2.0) * 1e12 / h ** 2)
        rule, sums = view.moving_sums(h, theta2)
        assert sums["p_l"] == u.size
        got = rule.weights(-np.sort(u)[::-1])
        A, B, _, _, _ = view.coefficients(h)
        with mpmath.workdps(60):
            ls = [mpmath.mpf(A) * mpmath.mpf(float(x)) + mpmath.mpf(B) for x in np.sort(u)[::-1]]
            top = max(ls)
            ref = np.array([float(mpmath.exp((v - top) / mpmath.mpf(theta2))) for v in ls])
            Z = mpmath.fsum(mpmath.exp((v - top) / mpmath.mpf(theta2)) for v in ls)
            exact = float(top + mpmath.mpf(theta2) * mpmath.log(Z / u.size))
        assert np.all(np.isfinite(got)) and got.sum() > 0
        np.testing.assert_allclose(got / got.sum(), ref / ref.sum(), rtol=1e-12, atol=1e-300)
        term = view.reduce(h, "right", theta2, "kl")[0]
        assert term == pytest.approx(exact, rel=1e-14)
