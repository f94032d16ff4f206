"""The compiled passes of the sorted two-piece oracle (``otstab_solvers.sorted_kernels``).

Their exp against mpmath and NumPy; their sums, the window's partition (from blocks of keys
and from the rows), chi2's keyed sums and the sampled audit's moved rows against the NumPy
code they replace (the same numbers up to the order of summation; the partition and the moved
rows bit for bit); a window whose front is computed from the rows against the stored front;
the fallback where numba fails; and the sorted oracle's own checks (tests/test_window.py,
tests/test_sorted_oracle.py, tests/test_blockwise.py: against the dense reduction, brute
force, high precision and the direct audit) rerun with the kernels on small data.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import test_blockwise as tb
import test_sorted_oracle as tso
import test_window as tw
from otstab_solvers import sorted_kernels as K
from otstab_solvers.dual import negated_keys, oracle_for, solve_two_piece
from otstab_solvers.sorted_oracle import SortedTwoPiece

pytestmark = pytest.mark.skipif(not K.HAVE_NUMBA, reason="numba is not installed")
INF = math.inf


@pytest.fixture
def kernels_on(monkeypatch):
    """Every view runs the kernels (however small)."""
    monkeypatch.setattr(K, "USE_KERNEL", True)
    monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)


@pytest.fixture
def kernels_off(monkeypatch):
    monkeypatch.setattr(K, "USE_KERNEL", False)


def ulps(a, ref):
    return np.abs(a - ref) / np.spacing(np.abs(ref))


def test_exp_within_one_ulp_of_mpmath_and_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-700.0, 0.0, 3000), rng.uniform(-1.0, 0.0, 1000),
                        [0.0, -0.0, -1e-300, 1e-15, -700.0, -math.log(2.0), -0.5 * math.log(2.0)]])
    got = K.exp_into(x, np.empty_like(x))
    ref = np.array([float(mpmath.exp(mpmath.mpf(float(v)))) for v in x])
    assert ulps(got, ref).max() <= 1.0
    assert got[np.flatnonzero(x == 0.0)].tolist() == [1.0, 1.0]
    dense = np.linspace(-700.0, 0.0, 200_001)
    assert ulps(K.exp_into(dense, np.empty_like(dense)), np.exp(dense)).max() <= 1.0
    # in place, and across chunk boundaries
    y = dense[:5 * K.CHUNK + 7].copy()
    K.exp_into(y, y)
    np.testing.assert_array_equal(y, K.exp_into(dense[:y.size], np.empty(y.size)))


@pytest.mark.parametrize("floor", [None, -700.0, -3.0])
def test_kl_sums_match_numpy_sums(floor):
    rng = np.random.default_rng(1)
    nu = np.sort(rng.standard_normal(10_000) * 3.0)
    k1, k0, c = -2.5, -8.0, float(nu[4000])
    for start, stop in ((0, 10_000), (0, 1), (17, 3 * K.CHUNK + 5), (500, 500)):
        nb = nu[start:stop]
        x = k1 * nb + k0
        if floor is not None:
            x = np.maximum(x, floor)
        e = np.exp(x)
        d = nb - c
        ref = (e.sum(), e @ nb, e @ x, nb.sum(), e @ d, e @ d ** 2, e @ d ** 3)
        got = K.kl_sums(nu, start, stop, k1, k0, floor, c)
        scale = (e.sum(), np.abs(e) @ np.abs(nb), np.abs(e @ x) + e @ np.abs(x),
                 np.abs(nb).sum(), e @ np.abs(d), e @ d ** 2, e @ np.abs(d) ** 3)
        for g, r, s in zip(got, ref, scale):
            assert abs(g - r) <= 1e-13 * s + 1e-300


@pytest.mark.parametrize("size", [None, 0, 10**6])  # counted / too small / ample
@pytest.mark.parametrize("kind", ["gauss", "ties"])
def test_the_compiled_window_holds_the_same_keys(kind, size, monkeypatch):
    """The partition writes A in row order and B (sorted afterwards) from the back: the same
    array as the NumPy blocks', key for key, whether its size was estimated, too small or
    counted."""
    rng = np.random.default_rng(3)
    n, c = 5000, 0.6
    u = tso.keys(rng, n, kind)
    oracle = oracle_for(*tso.hinge_form(u, c), sorted_view=False)

    def window(kernel, h_lo, h_hi):
        monkeypatch.setattr(K, "USE_KERNEL", kernel)
        monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
        return SortedTwoPiece.window(lambda i, j, out: negated_keys(oracle, slice(i, j), out),
                                     n, c, h_lo, h_hi, float(np.abs(u).max()), size=size,
                                     block=700)

    for h_lo, h_hi in ((0.05, 0.4), (0.5, 0.52), (1.0, 3.0), (20.0, 30.0)):
        a, b = window(False, h_lo, h_hi), window(True, h_lo, h_hi)
        assert (a.sorted_from, a.n_fin, a._sorted.front_max) == \
            (b.sorted_from, b.n_fin, b._sorted.front_max)
        np.testing.assert_array_equal(a.nu, b.nu)


@pytest.mark.parametrize("theta2", [0.05, 0.25, 4.0])
@pytest.mark.parametrize("windowed", [False, True])
def test_kl_evaluations_match_the_numpy_blocks(theta2, windowed, monkeypatch):
    rng = np.random.default_rng(4)
    n, c = 6000, 0.6
    u = rng.standard_normal(n)
    out = {}
    for kernel in (False, True):
        monkeypatch.setattr(K, "USE_KERNEL", kernel)
        monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
        _, full, win = tw.views(u, c, 0.2, 0.9)
        view = win if windowed else full
        out[kernel] = [view.reduce(h, side, theta2, "kl") for h in (0.2, 0.45, 0.9)
                       for side in ("left", "right")] + \
            [view.moving_sums(h, theta2)[1] for h in (0.3, 0.7)]
    for a, b in zip(out[False][:6], out[True][:6]):
        assert a[3:] == b[3:]  # (alpha, count)
        for x, y in zip(a[:2], b[:2]):  # term, mean derivative
            assert y == pytest.approx(x, rel=1e-13, abs=1e-15)
        assert b[2] == pytest.approx(a[2], rel=1e-9)  # (the curvature only steers Newton)
    for a, b in zip(out[False][6:], out[True][6:]):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-12, abs=1e-12), key


@pytest.mark.parametrize("theta2", [0.01, 0.25, 1e6])
def test_chi2_sums_match_the_numpy_blocks(theta2, monkeypatch):
    rng = np.random.default_rng(5)
    n, c = 4000, 0.6
    u = np.round(rng.standard_normal(n), 2)
    out = {}
    for kernel in (False, True):
        monkeypatch.setattr(K, "USE_KERNEL", kernel)
        monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
        _, full, _ = tw.views(u, c, 0.1, 0.2)
        out[kernel] = [full.chi2_sums(h, theta2)[1] for h in (0.05, 0.5, 3.0)]
    for a, b in zip(out[False], out[True]):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-12, abs=1e-13 * a["T_abs"]), key


# the sorted oracle's own checks, with the kernels ---------------------------------------------

@pytest.mark.parametrize("theta2", [0.05, 1.0, INF])
@pytest.mark.parametrize("windowed", [False, True])
def test_moving_sums_against_dense_sums_with_kernels(theta2, windowed, kernels_on):
    tw.test_moving_sums_and_key_rule_match_dense_sums(theta2, windowed, "ties")


@pytest.mark.parametrize("kernel", [False, True])
def test_phi_of_weights_near_one_against_high_precision(kernel, monkeypatch):
    """At theta2 = 1e6 every weight is 1 + O(1e-6) and sum phi ~ 1e-12: its rounding is that
    of the normalisation n / Z (a few ulps of 1 in each w - 1 ~ 1e-6), about 1e-9 of phi with
    or without the kernels (a dense NumPy evaluation is off as much); against 50 digits."""
    monkeypatch.setattr(K, "USE_KERNEL", kernel)
    monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
    rng = np.random.default_rng(11)
    n, c, theta2 = 800, 0.6, 1e6
    u = tso.keys(rng, n, "ties")
    _, full, _ = tw.views(u, c, 0.1, 0.2)
    with mpmath.workdps(50):
        for h in (0.1, 0.5, 0.8):
            rule, sums = full.moving_sums(h, theta2, phi_atol=0.0)
            mp = mpmath.mpf
            e = [mpmath.exp(max(mp(float(x)) * mp(h) + mp(c) * mp(h) ** 2, 0) / theta2)
                 for x in u]
            Z = sum(e) / n
            exact = sum(ei / Z * mpmath.log(ei / Z) - ei / Z + 1
                        for ei, m in zip(e, rule.moving(-u)) if m)
            assert sums["phi"] == pytest.approx(float(exact), rel=1e-8)


@pytest.mark.parametrize("theta2", [0.05, 1e6])
@pytest.mark.parametrize("windowed", [False, True])
def test_moving_sums_reuse_bit_for_bit_with_kernels(theta2, windowed, kernels_on):
    tw.test_moving_sums_reuse_the_solver_pass_bit_for_bit(theta2, windowed)


@pytest.mark.parametrize("theta2", [0.01, 4.0])
def test_chi2_sums_against_dense_chi2_with_kernels(theta2, kernels_on):
    tw.test_chi2_sums_and_key_rule_match_dense_chi2(theta2, "gauss")


@pytest.mark.parametrize("size", [None, 0, 10**6])
def test_window_inside_its_bracket_with_kernels(size, kernels_on):
    tw.test_window_matches_the_full_view_inside_its_bracket("ties", 1.0, size)


@pytest.mark.parametrize("theta2, div", [(0.05, "kl"), (4.0, "kl"), (INF, "kl"),
                                         (0.25, "chi2")])
def test_solve_two_piece_with_kernels(theta2, div, kernels_on):
    tw.test_solve_two_piece_matches_the_fully_sorted_solve("gauss", theta2, div, 0.7)


@pytest.mark.parametrize("theta2", [0.25, 4.0, 1e4])
def test_kl_term_against_high_precision_with_kernels(theta2, kernels_on):
    tso.test_kl_term_against_high_precision_either_side_of_the_expm1_pass(theta2)


@pytest.mark.parametrize("theta2, div", [(0.25, "kl"), (INF, "kl"), (0.25, "chi2")])
def test_solutions_equal_with_and_without_kernels(theta2, div, monkeypatch):
    """solve_two_piece with and without the kernels: the same h, value and status."""
    rng = np.random.default_rng(8)
    n, c = 20_000, 0.5
    u = rng.standard_normal(n)
    base = float(np.mean(np.maximum(u, 0.0)))
    for t in (0.01, 0.5, 0.95):
        r = base + t * (float(u.max()) - base)
        sols = []
        for kernel in (False, True):
            monkeypatch.setattr(K, "USE_KERNEL", kernel)
            monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
            oracle = oracle_for(*tso.hinge_form(u, c), sorted_view=False)
            sols.append(solve_two_piece(oracle, r, theta2, div, min_n=0, base=base))
        a, b = sols
        assert a.status == b.status == "optimal"
        assert b.value == pytest.approx(a.value, rel=1e-12)
        assert b.h == pytest.approx(a.h, rel=1e-9)


@pytest.mark.parametrize("case", [c for c in tb.WINDOWED if not c[3] and math.isfinite(c[2])],
                         ids=lambda c: tb._id(c[:4]))
def test_keyed_certificates_with_kernels(case, monkeypatch, kernels_on):
    """Whole hinge certificates on a window through the keyed builder, with the kernels:
    the sampled audit against the direct one (tests/test_blockwise.py)."""
    tb.test_blockwise_sampled_audit_matches_direct(monkeypatch, case)


@pytest.mark.parametrize("kind", ["margin", "residual"])
@pytest.mark.parametrize("ydtype", [np.int8, np.int64, np.float64])
@pytest.mark.parametrize("size", [None, 0, 10**6])
def test_the_window_from_the_rows_holds_the_same_keys(kind, ydtype, size, monkeypatch):
    """The window's compiled pass over the rows (keys ``y s - b`` computed in the loop) and
    the rows' range: the same numbers as NumPy's blocks of ``AffineRows``."""
    from otstab_solvers.dual import AffineOracle, AffineRows, _key_rows, keys_umax

    rng = np.random.default_rng(9)
    n, c = 7000, 0.6
    s = rng.standard_normal(n) * 1.3
    y = (rng.choice((-1, 1), n) if kind == "margin" else rng.standard_normal(n)).astype(ydtype)
    rows = AffineRows(s, y, kind, [0.0, -1.0], [0.0, 1.0])
    out = {}
    for kernel in (False, True):
        monkeypatch.setattr(K, "USE_KERNEL", kernel)
        monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
        oracle = oracle_for(None, np.array([[0.0, c]]), rows=AffineRows(s, y, kind, rows.a,
                                                                        rows.b),
                            sorted_view=False)
        assert isinstance(oracle, AffineOracle)
        key_rows = _key_rows(oracle)
        assert key_rows is not None  # (used by the window with the kernels only)
        umax = keys_umax(oracle)
        out[kernel] = (oracle.rows.u_range(), umax, [
            SortedTwoPiece.window(lambda i, j, o, f=oracle: negated_keys(f, slice(i, j), o), n, c,
                                  h_lo, h_hi, umax, size=size, rows=key_rows)
            for h_lo, h_hi in ((0.05, 0.4), (1.0, 1.2), (3.0, 9.0))])
    a, b = out[False], out[True]
    assert a[:2] == b[:2]
    for va, vb in zip(a[2], b[2]):
        assert (va.sorted_from, va.n_fin, va._sorted.front_max) == \
            (vb.sorted_from, vb.n_fin, vb._sorted.front_max)
        np.testing.assert_array_equal(va.nu, vb.nu)


def test_rows_with_nan_have_a_nan_range(kernels_on):
    from otstab_solvers.dual import AffineRows

    s = np.ones(10)
    s[3] = np.nan
    got = AffineRows(s, np.ones(10, dtype=np.int8), "margin", [0.0, -1.0], [0.0, 1.0]).u_range()
    assert all(math.isnan(v) for v in got)


def test_a_failing_numba_falls_back_to_numpy(monkeypatch, caplog):
    """Kernels that cannot be compiled (a broken numba) leave the NumPy blocks running, with
    a warning, and the same answer."""
    rng = np.random.default_rng(10)
    u = rng.standard_normal(3000)
    oracle = oracle_for(*tso.hinge_form(u, 0.5), sorted_view=False)
    r = float(np.mean(np.maximum(u, 0.0))) + 0.3
    monkeypatch.setattr(K, "USE_KERNEL", False)
    ref = solve_two_piece(oracle, r, 0.25, "kl", min_n=0)

    def broken():
        raise RuntimeError("no LLVM here")

    monkeypatch.setattr(K, "USE_KERNEL", True)
    monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
    monkeypatch.setattr(K, "load", broken)
    monkeypatch.setitem(K._LOADED, "ok", None)
    with caplog.at_level("WARNING", logger="otstab"):
        sol = solve_two_piece(oracle_for(*tso.hinge_form(u, 0.5), sorted_view=False), r, 0.25,
                              "kl", min_n=0)
    assert "no LLVM here" in caplog.text and K._LOADED["ok"] is False
    assert sol.value == ref.value and sol.h == ref.h
    monkeypatch.setitem(K._LOADED, "ok", None)  # (the next test loads them again)


@pytest.mark.parametrize("kind", ["margin", "residual"])
def test_a_front_from_the_rows_equals_the_stored_front(kind, kernels_on):
    """A window whose front is computed from the rows (not stored: the view holds B alone)
    gives the stored window's counts, kinks, sums, KL / chi2 / theta2 = inf evaluations on
    both sides, model steps and keyed sums, inside its bracket."""
    from otstab_solvers.dual import AffineRows, _chi2_front, _key_rows, keys_umax

    rng = np.random.default_rng(12)
    n, c = 9000, 0.6
    s = np.round(rng.standard_normal(n) * 1.3, 3)  # (ties at some kinks)
    y = rng.choice(np.array([-1, 1], dtype=np.int8), n) if kind == "margin" else \
        np.round(rng.standard_normal(n), 2)
    oracle = oracle_for(None, np.array([[0.0, c]]),
                        rows=AffineRows(s, y, kind, [0.0, -1.0], [0.0, 1.0]),
                        sorted_view=False)
    rows, umax = _key_rows(oracle), keys_umax(oracle)
    sub = SortedTwoPiece(-negated_keys(oracle, slice(0, n, 5), np.empty(len(range(0, n, 5)))),
                         "hinge", c)
    for (h_lo, h_hi), theta2 in (((0.3, 0.5), 0.25), ((0.8, 1.1), 0.05), ((0.3, 0.5), 4.0)):
        fb = _chi2_front(sub, h_lo, h_hi, theta2)  # (chi2's front: its active set sorted)
        views = [SortedTwoPiece.window(lambda i, j, o: negated_keys(oracle, slice(i, j), o),
                                       n, c, h_lo, h_hi, umax, rows=rows, front_rows=fr,
                                       front_below=fb) for fr in (False, True)]
        stored, virtual = views
        assert virtual._sorted.front is not None and virtual.sorted_from > 0
        assert virtual.nu.size == stored.n_fin - stored.sorted_from  # (B alone)
        assert (virtual.sorted_from, virtual.n_fin, virtual._sorted.front_max) == \
            (stored.sorted_from, stored.n_fin, stored._sorted.front_max)
        hs = list(np.linspace(h_lo, h_hi, 7)) + [stored.kink(i) for i in
                                                 range(stored.sorted_from, stored.n_fin, 97)
                                                 if h_lo < stored.kink(i) < h_hi]
        for h in hs:
            for side in ("left", "right"):
                assert virtual.count(h, side) == stored.count(h, side)
                for div, t2 in (("kl", theta2), ("kl", INF), ("chi2", theta2)):
                    a = stored.reduce(h, side, t2, div)
                    b = virtual.reduce(h, side, t2, div)
                    assert b[4] == a[4] and (a[3] is None) == (b[3] is None)
                    for x, z in zip(a[:2] + a[3:4], b[:2] + b[3:4]):
                        if x is not None:
                            assert z == pytest.approx(x, rel=1e-12, abs=1e-14), (h, side, div)
                    assert b[2] == pytest.approx(a[2], rel=1e-8, abs=1e-12)
                if side == "right":  # (the model step of the KL pass just made at h)
                    stored.reduce(h, side, theta2, "kl")
                    virtual.reduce(h, side, theta2, "kl")
                    ms = stored.model_step(h, side, 0.01, 1.0)
                    mv = virtual.model_step(h, side, 0.01, 1.0)
                    assert (math.isnan(ms) and math.isnan(mv)) or \
                        mv == pytest.approx(ms, rel=1e-9)
        assert stored.kinks_between(stored.sorted_from, stored.n_fin, h_lo, h_hi)[:3] == \
            virtual.kinks_between(stored.sorted_from, stored.n_fin, h_lo, h_hi)[:3]
        for h in hs[1:6]:
            for t2 in (theta2, INF, 1e6):
                for atol in (0.0, 1e300):
                    a = stored.moving_sums(h, t2, phi_atol=atol)[1]
                    b = virtual.moving_sums(h, t2, phi_atol=atol)[1]
                    for key in a:  # (T = theta2 (M - log(n / Z)): rounding of theta2 ulps)
                        tol = 64 * np.finfo(float).eps * t2 if key == "T" else 1e-12
                        if key == "phi" and atol:  # (from the sums: cancels near w = 1)
                            tol = 1e-9 * n
                        assert b[key] == pytest.approx(a[key], rel=1e-10, abs=tol), key
            a, b = stored.chi2_sums(h, theta2)[1], virtual.chi2_sums(h, theta2)[1]
            for key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-12, abs=1e-13 * a["T_abs"]), key


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_moved_rows_are_numpys(dtype):
    """The sampled audit's moved rows x + t g_i v: NumPy's outer product and sum, bit for
    bit (no fused multiply-add), float32 rows as float64; the squared moves of x* - x in
    floating point to the rounding of their sums."""
    rng = np.random.default_rng(14)
    Xg = (rng.standard_normal((300, 37)) * np.logspace(-3, 3, 37)).astype(dtype)
    tg = rng.standard_normal(300) * 1e-3
    v = rng.standard_normal(37)
    out, d2 = np.empty((300, 37)), np.empty(300)
    K.moved_rows(Xg, tg, v, out, d2)
    ref = Xg + np.multiply.outer(tg, v)
    np.testing.assert_array_equal(out, ref)
    diff = ref - Xg
    np.testing.assert_allclose(d2, np.einsum("ij,ij->i", diff, diff), rtol=1e-14)


def test_the_front_passes_over_two_halves_equal_one_pass_on_any_cpu_count(monkeypatch):
    """kl_front, front_moments and chi2_front run over two halves of the rows (split at a
    multiple of CHUNK), on two threads where there are two CPUs: the same bits on one CPU
    as on two, and the numbers of one pass over all rows up to the order of summation;
    the count, smallest and largest key exactly."""
    rng = np.random.default_rng(11)
    n = 5 * K.CHUNK + 37
    y = np.where(rng.random(n) > 0.5, 1, -1).astype(np.int8)
    s = rng.standard_normal(n)
    rows = (y, s, 0.3, False)
    a_thr = 0.2
    calls = {
        "kl": lambda: K.kl_front(rows, a_thr, -2.0, 0.1, -700.0, 0.05, 0.4),
        "moments": lambda: K.front_moments(rows, a_thr),
        "chi2": lambda: K.chi2_front(rows, a_thr, 1.5, 0.2, -0.1, 0.25, 1.0, 0.3),
    }
    both = {k: f() for k, f in calls.items()}
    monkeypatch.setattr(K, "_two_cpus", lambda: False)
    one_cpu = {k: f() for k, f in calls.items()}
    assert both == one_cpu  # bit for bit
    whole = {  # one pass over every row (no split)
        "kl": K._kernel(K._kl_front_py)(y, s, 0.3, False, a_thr, -2.0, 0.1, -700.0, 0.05, 0.4),
        "moments": K._kernel(K._front_moments_py)(y, s, 0.3, False, a_thr),
        "chi2": K._kernel(K._chi2_front_py)(y, s, 0.3, False, a_thr, 1.5, 0.2, -0.1, 0.25, 1.0,
                                            0.3),
    }
    for k in calls:
        np.testing.assert_allclose(both[k], whole[k], rtol=1e-13, atol=1e-12)
    assert both["moments"][0] == whole["moments"][0]
    assert both["moments"][3:] == whole["moments"][3:]
