"""The windowed sorted view of the hinge shape, the dual solved on it, and Q* built from keys.

``SortedTwoPiece.window`` sorts only the keys whose kinks lie in a bracket of h; inside that
bracket every count, sum and kink must be those of the fully sorted view (checked here at the
bracket's ends, at random points and at the kinks, on both sides). ``solve_two_piece`` must give
the answer of ``solve_dual`` on the fully sorted view, also when its first windows miss the root
(it widens them, then sorts every key). ``SortedTwoPiece.moving_sums`` and ``KeyRule`` (the
keyed certificate builder's sums and atoms) are checked against sums written out here from the
dense ``l_h``. Whole certificates through the keyed builder are checked in
``tests/test_blockwise.py`` (against the direct audit) and ``tests/test_audit_properties.py``
(against the model's own scores).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from otstab_solvers import dual as sd
from otstab_solvers.dual import (
    PiecewiseOracle,
    negated_keys,
    oracle_for,
    solve_dual,
    solve_two_piece,
)
from otstab_solvers.sorted_oracle import SortedTwoPiece, window_thresholds
from otstab_solvers.weights import phi
from test_sorted_oracle import hinge_form, keys

INF = math.inf


def views(u, c, h_lo, h_hi, size=None):
    """The full view and a window over [h_lo, h_hi] of the keys u (through oracle_for, whose
    negated keys are those the certificate path writes)."""
    oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
    full = sd.sorted_view_of(oracle)
    win = SortedTwoPiece.window(lambda i, j, out: negated_keys(oracle, slice(i, j), out), u.size,
                                c, h_lo, h_hi, sd.keys_umax(oracle), size=size, block=64)
    return oracle, full, win


def same(a, b, rel=1e-12):
    return a == pytest.approx(b, rel=rel, abs=1e-15)


@pytest.mark.parametrize("kind", ["gauss", "ties", "positive"])
@pytest.mark.parametrize("c", [0.05, 1.0, 30.0])
@pytest.mark.parametrize("size", [None, 0, 10**6])  # counted / too small / ample
def test_window_matches_the_full_view_inside_its_bracket(kind, c, size):
    rng = np.random.default_rng(len(kind) + int(10 * c))
    n = 1000
    u = keys(rng, n, kind)
    for h_lo, h_hi in ((0.05, 0.4), (0.5, 0.52), (1.0, 3.0)):
        oracle, full, win = views(u, c, h_lo, h_hi, size)
        assert win.n == n and win.domain == (h_lo, h_hi)
        a_thr, c_thr = window_thresholds(c, h_lo, h_hi, win.umax, win.tie)
        nu = -u
        assert win.sorted_from == np.count_nonzero(nu < a_thr)
        assert win.n_fin == np.count_nonzero(nu <= c_thr)
        np.testing.assert_array_equal(np.sort(win.nu), np.sort(nu[nu <= c_thr]))
        assert np.all(np.diff(win.nu[win.sorted_from:]) >= 0)
        if win.sorted_from:
            assert win.nu[0] == win.nu[:win.sorted_from].min()
        # the kinks inside the bracket, and points around them
        kinks = nu[(nu > c * h_lo) & (nu < c * h_hi)] / c
        hs = [h_lo, h_hi, *rng.uniform(h_lo, h_hi, 5), *kinks[:5]]
        for h in hs:
            for side in ("right", "left"):
                assert win.count(h, side) == full.count(h, side), (h, side)
                assert win.thresholds(h) == full.thresholds(h)
                for theta2 in (0.05, 1.0, INF):
                    t1, m1, c1, _, k1 = full.reduce(h, side, theta2, "kl")
                    t2, m2, c2, _, k2 = win.reduce(h, side, theta2, "kl")
                    assert k1 == k2
                    assert same(t2, t1) and same(m2, m1) and same(c2, c1, 1e-9)
        for lo, hi in zip(sorted(hs)[:-1], sorted(hs)[1:]):
            if lo < hi:
                p_lo, p_hi = win.count(lo, "right"), win.count(hi, "left")
                q_lo, q_hi = full.count(lo, "right"), full.count(hi, "left")
                assert win.kinks_between(p_lo, p_hi, lo, hi) == \
                    full.kinks_between(q_lo, q_hi, lo, hi)


def test_window_refuses_what_needs_every_key():
    u = np.random.default_rng(0).standard_normal(200)
    _, _, win = views(u, 0.5, 0.2, 0.3)
    for h in (0.0, 0.19, 0.31, 5.0):
        with pytest.raises(ValueError, match="outside this window"):
            win.reduce(h, "right", 1.0, "kl")
    for call in (lambda: win.with_c(1.0), lambda: win.risk_parts(0.25, 1.0, "kl"),
                 lambda: win.weights_prefix(0.25, 10, 1.0, "kl")):
        with pytest.raises(ValueError, match="fully sorted view"):
            call()
    with pytest.raises(ValueError, match="0 < h_lo < h_hi"):
        SortedTwoPiece.window(lambda i, j, out: out, 10, 0.5, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="c > 0"):
        SortedTwoPiece.window(lambda i, j, out: out, 10, 0.0, 0.1, 1.0, 1.0)


@pytest.mark.parametrize("kind", ["gauss", "ties", "positive"])
@pytest.mark.parametrize("theta2, div", [(0.05, "kl"), (0.25, "kl"), (4.0, "kl"),
                                         (INF, "kl"), (INF, "chi2"), (0.25, "chi2")])
@pytest.mark.parametrize("c", [0.05, 0.7])
def test_solve_two_piece_matches_the_fully_sorted_solve(kind, theta2, div, c):
    rng = np.random.default_rng(7 + len(kind))
    n = 3000
    u = keys(rng, n, kind)
    r = 1.4 * float(np.mean(np.maximum(u, 0.0))) + 0.05
    oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
    sol = solve_two_piece(oracle, r, theta2, div, min_n=0)
    ref = solve_dual(oracle_for(*hinge_form(u, c)), r, theta2, div)
    dense = solve_dual(PiecewiseOracle(*hinge_form(u, c)), r, theta2, div)
    assert sol.status == ref.status == "optimal"
    assert same(sol.value, ref.value, 1e-11) and same(sol.value, dense.value, 1e-10)
    assert same(sol.h, ref.h, 1e-9)
    window = sol.info.get("window")
    # windowed (chi2 too: its front ends where its active set may end)
    assert window["tries"] and window["tries"][-1]["status"] == "optimal"
    assert window["tries"][-1]["sorted"] < n
    assert sol.info["view"].domain is not None


def test_windows_that_miss_the_root_widen_then_sort_every_key(monkeypatch):
    rng = np.random.default_rng(3)
    u = rng.standard_normal(2000)
    c, r, theta2 = 0.4, 0.9, 0.3
    oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
    ref = solve_dual(oracle_for(*hinge_form(u, c)), r, theta2, "kl")
    # a subsample h off by a factor 1.5: the first windows miss the root, a wider one has it
    honest = sd.solve_dual

    def off(oracle_, r_, theta2_, div_, **kw):
        sol = honest(oracle_, r_, theta2_, div_, **kw)
        if oracle_.domain is None and oracle_.n < 2000:  # the subsample's solve
            sol.h *= 1.5
        return sol

    monkeypatch.setattr(sd, "solve_dual", off)
    monkeypatch.setattr(sd, "WINDOW_SUBSAMPLE", 500)
    sol = solve_two_piece(oracle, r, theta2, "kl", min_n=0)
    tries = sol.info["window"]["tries"]
    assert [t["status"] for t in tries[:-1]] == ["root below the bracket"] * (len(tries) - 1)
    assert tries[-1]["status"] == "optimal" and len(tries) > 1
    # the next window is centred on the Newton estimate from the end that missed the root
    assert abs(tries[1]["h"] - ref.h) < 0.25 * abs(tries[0]["h"] - ref.h)
    assert same(sol.value, ref.value, 1e-11) and same(sol.h, ref.h, 1e-9)
    # no window has the root: every key is sorted
    monkeypatch.setattr(sd, "WINDOW_WIDTHS", (0.01,))
    sol = solve_two_piece(oracle, r, theta2, "kl", min_n=0)
    assert sol.info["window"]["fallback"] == "sorted every key"
    assert sol.info["view"].domain is None
    assert same(sol.value, ref.value, 1e-12) and same(sol.h, ref.h, 1e-12)


def test_small_data_and_a_zero_c_sort_every_key():
    u = np.random.default_rng(1).standard_normal(500)
    for c, min_n in ((0.5, None), (0.0, 0)):
        oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
        sol = solve_two_piece(oracle, 0.9, 0.3, "kl", min_n=min_n)
        assert sol.status == "optimal" and "window" not in sol.info
        assert sol.info["view"].domain is None
    with pytest.raises(ValueError, match="hinge-shaped"):
        solve_two_piece(PiecewiseOracle(np.ones((3, 2)), np.ones((1, 2))), 1.0, 1.0, "kl")


def dense_sums(u, c, h, theta2, side_moves):
    """The sums moving_sums returns, written out from the dense l_h: the weights of every
    sample (tied ones on the moving formula, floored at l_h = 0), and over the samples that
    move on both sides the weights, weight times loss at the moved point, that loss, phi."""
    v = u * h + c * h * h
    lh = np.maximum(v, 0.0)
    if math.isinf(theta2):
        w = np.ones(u.size)
    else:
        a = lh / theta2
        w = np.exp(a - a.max()) / np.mean(np.exp(a - a.max()))
    d = u + 2.0 * c * h
    m = side_moves
    return w, {"w": w[m].sum(), "wd": (w * d)[m].sum(), "d": d[m].sum(),
               "phi": 0.0 if math.isinf(theta2) else phi(w[m], "kl").sum()}


@pytest.mark.parametrize("theta2", [0.05, 1.0, 1e6, INF])
@pytest.mark.parametrize("windowed", [False, True])
@pytest.mark.parametrize("kind", ["gauss", "ties"])
def test_moving_sums_and_key_rule_match_dense_sums(theta2, windowed, kind):
    rng = np.random.default_rng(11)
    n, c = 800, 0.6
    u = keys(rng, n, kind)
    for h in (0.1, 0.5, 0.8):
        oracle, full, win = views(u, c, h * 0.9, h * 1.1)
        view = win if windowed else full
        for atol in (0.0, 1e300):  # phi per sample, or from the pass's sums
            rule, sums = view.moving_sums(h, theta2, phi_atol=atol)
            nu = -u
            assert sums["p_l"] == np.count_nonzero(rule.moving(nu)) == full.count(h, "left")
            assert sums["p_r"] - sums["p_l"] == np.count_nonzero(rule.tied(nu))
            w, ref = dense_sums(u, c, h, theta2, rule.moving(nu))
            np.testing.assert_allclose(rule.weights(nu), w, rtol=1e-12)
            assert rule.stay_weight() == pytest.approx(w[u * h + c * h * h < -1e-9].max()
                                                       if np.any(u * h + c * h * h < -1e-9)
                                                       else rule.stay_weight(), rel=1e-12)
            np.testing.assert_allclose(rule.loss_moved(nu), u + 2 * c * h, rtol=1e-13,
                                       atol=1e-15)
            for key in ("w", "wd", "d"):
                assert same(sums[key], ref[key], 1e-11), key
            # aggregated phi is refused where its cancellation could matter (large theta2)
            assert sums["phi"] == pytest.approx(ref["phi"], rel=1e-9 if atol == 0 else 1e-6,
                                                abs=1e-300 if atol == 0 else 1e-9 * n)


@pytest.mark.parametrize("theta2", [0.01, 0.25, 4.0, 1e6])
@pytest.mark.parametrize("kind", ["gauss", "ties"])
def test_chi2_sums_and_key_rule_match_dense_chi2(theta2, kind):
    """chi2's keyed sums (issue 31: chi2 certificates above the direct audit were built over
    blocks of rows, half the certificate's time) against the dense chi2 solution of l_h
    (``chi2_solution``: its own active-set alpha): the weights of every sample, alpha, and
    over the samples that move the weights, weight times loss at the moved point, that loss,
    phi; the dual's term T."""
    from otstab_solvers.weights import chi2_dual_term, chi2_solution

    rng = np.random.default_rng(12)
    n, c = 800, 0.6
    u = keys(rng, n, kind)
    oracle, full, _ = views(u, c, 0.1, 0.2)
    # a window with every key it keeps sorted (no front): the full view's sums in its bracket
    win = SortedTwoPiece.window(lambda i, j, out: negated_keys(oracle, slice(i, j), out), n,
                                c, 0.1, 0.2, sd.keys_umax(oracle), block=64,
                                front_below=-INF)
    assert win.sorted_from == 0 and win.n_fin < n
    for h in (0.1, 0.15, 0.2):
        for (_, a), (_, b) in [(full.chi2_sums(h, theta2), win.chi2_sums(h, theta2))]:
            for key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-12, abs=1e-13 * a["T_abs"]), key
    for h in (0.05, 0.5, 3.0):
        rule, sums = full.chi2_sums(h, theta2)
        nu = -u
        assert sums["p_l"] == np.count_nonzero(rule.moving(nu)) == full.count(h, "left")
        assert sums["p_r"] - sums["p_l"] == np.count_nonzero(rule.tied(nu))
        lh = np.maximum(u * h + c * h * h, 0.0)
        w, alpha, _ = chi2_solution(lh, theta2)
        assert sums["alpha"] == pytest.approx(alpha, rel=1e-11, abs=1e-12 * theta2)
        np.testing.assert_allclose(rule.weights(nu), w, rtol=1e-11, atol=1e-12)
        assert rule.stay_weight() == pytest.approx(max(alpha / (2 * theta2) + 1, 0.0),
                                                   rel=1e-11, abs=1e-12)
        m = rule.moving(nu)
        d = u + 2.0 * c * h
        for key, ref in (("w", w[m].sum()), ("wd", (w * d)[m].sum()), ("d", d[m].sum()),
                         ("phi", phi(w[m], "chi2").sum())):
            assert sums[key] == pytest.approx(ref, rel=1e-10, abs=1e-12 * n), key
        T = chi2_dual_term(lh, theta2)
        assert sums["T"] == pytest.approx(T, rel=1e-11, abs=1e-12 * sums["T_abs"])


@pytest.mark.parametrize("theta2", [0.05, 1.0, 1e6])
@pytest.mark.parametrize("windowed", [False, True])
def test_moving_sums_reuse_the_solver_pass_bit_for_bit(theta2, windowed):
    """moving_sums at an h the KL evaluation has just summed (no tied sample) reads that
    pass's sums (issue 31: one exp pass less per certificate): the same numbers, bit for
    bit, as its own pass; a tied h or another h makes its own pass."""
    rng = np.random.default_rng(13)
    n, c = 5000, 0.6
    u = np.round(rng.standard_normal(n), 2)  # (ties at some kinks)
    _, full, win = views(u, c, 0.2, 0.9)
    view = win if windowed else full
    kink = float(np.sort(-u)[np.searchsorted(np.sort(-u), 0.5 * c)]) / c  # a tied key's kink
    tied = []
    for h in (0.2512, 0.5037, 0.8071, kink):
        view._kl_sums.clear()
        fresh = view.moving_sums(h, theta2)[1]
        view.reduce(h, "right", theta2, "kl")
        assert (fresh["p_r"], h, c * h * h, theta2) in view._kl_sums
        again = view.moving_sums(h, theta2)[1]
        assert again == fresh  # (dicts of floats: equal bit for bit)
        tied.append(fresh["p_l"] < fresh["p_r"])
    assert tied == [False, False, False, True]
    view.reduce(0.3, "right", theta2, "kl")  # (another h: its own pass)
    if not windowed:
        assert view.moving_sums(0.31, theta2)[1] == full.moving_sums(0.31, theta2)[1]


def test_moving_sums_sums_phi_per_sample_when_weights_are_near_one():
    """At theta2 = 1e12 every weight is 1 + O(1e-12): phi ~ 1e-25 per sample, and the pass's
    sums (of size n) would cancel to rounding; given a tight phi_atol the sum is per sample."""
    u = np.random.default_rng(2).standard_normal(500)
    oracle, full, _ = views(u, 0.5, 0.1, 0.2)
    rule, sums = full.moving_sums(0.6, 1e12, phi_atol=1e-30)
    w = rule.weights(-u)
    m = rule.moving(-u)
    assert sums["phi"] == pytest.approx(phi(w[m], "kl").sum(), rel=1e-9)
    assert 0 < sums["phi"] < 1e-18


def near_base(monkeypatch, seed, n, subsample, c=0.5):
    """(keys, c, base risk, hinge-shaped oracle) of n Gaussian keys, the windows' subsample set
    to ``subsample`` keys."""
    u = np.random.default_rng(seed).standard_normal(n)
    monkeypatch.setattr(sd, "WINDOW_SUBSAMPLE", subsample)
    return u, c, float(np.mean(np.maximum(u, 0.0))), oracle_for(*hinge_form(u, c),
                                                                 sorted_view=False)


def test_a_threshold_just_above_the_base_risk_finds_its_window(monkeypatch):
    """r = base (1 + 1e-6): the subsample's base risk differs from the data's by far more than
    r - base, so its h is far off (here by orders of magnitude); the windows are re-centred on
    the Newton estimate from the end that missed the root, and one holds it (no full sort)."""
    u, c, base, oracle = near_base(monkeypatch, 4, 6000, 300)
    for r in (base * (1 + 1e-6), base * (1 + 1e-3)):
        ref = solve_dual(oracle_for(*hinge_form(u, c)), r, 0.25, "kl")
        sol = solve_two_piece(oracle, r, 0.25, "kl", min_n=0)
        assert sol.status == ref.status == "optimal"
        assert "fallback" not in sol.info["window"], sol.info["window"]
        assert same(sol.h, ref.h, 1e-6) and same(sol.value, ref.value, 1e-6)


def test_the_base_risk_moves_the_subsample_threshold(monkeypatch):
    """With the data's base risk given, the subsample is solved at r moved by the difference of
    the two base risks: its h lands much closer to the data's where r is near the base risk."""
    u, c, base, oracle = near_base(monkeypatch, 8, 20000, 1000)
    for factor in (1.01, 1.2):
        r = base * factor
        ref = solve_dual(oracle_for(*hinge_form(u, c)), r, 0.25, "kl")
        plain = solve_two_piece(oracle, r, 0.25, "kl", min_n=0)
        moved = solve_two_piece(oracle, r, 0.25, "kl", min_n=0, base=base)
        err = [abs(s.info["window"]["h_subsample"] / ref.h - 1) for s in (plain, moved)]
        assert err[1] < 0.5 * err[0], err
        assert same(moved.h, ref.h, 1e-9) and same(moved.value, ref.value, 1e-11)


def test_few_effective_samples_start_from_the_wider_window(monkeypatch):
    """KL weights concentrated on a few of the subsample's keys (r near the largest loss)
    leave its h far off: the search starts from the second width (issue 31: one window
    instead of a missed one and a second); the answer is the fully sorted view's."""
    rng = np.random.default_rng(5)
    n = 30_000
    u = rng.standard_normal(n)
    c, theta2 = 0.3, 0.05
    oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
    monkeypatch.setattr(sd, "WINDOW_SUBSAMPLE", 2048)
    for r, wide in ((3.2, True), (0.6, False)):
        sub = -u[::n // 2048]
        ref = solve_dual(oracle_for(*hinge_form(u, c)), r, theta2, "kl")
        h_ref = ref.h
        ess = sd._kl_ess(np.sort(sub), c, h_ref, theta2)
        assert (ess < sd.WINDOW_ESS_SHARE * sub.size) == wide, ess
        # (the effective size, against its definition)
        w = np.exp(np.maximum(-sub * h_ref + c * h_ref ** 2, 0.0) / theta2)
        assert ess == pytest.approx(w.sum() ** 2 / (w @ w), rel=1e-9)
        sol = solve_two_piece(oracle, r, theta2, "kl", min_n=0)
        assert sol.status == "optimal" and same(sol.value, ref.value, 1e-11)
        assert same(sol.h, ref.h, 1e-9)
        assert sol.info["window"]["tries"][0]["width"] == (0.25 if wide else 0.06)
