"""chi2 on a window of sorted keys (issue 31: chi2 sorted every key, 15 ms of a certificate at
n = 1e6).

chi2's alpha needs the active set (the samples of positive weight: the largest ``l``) in
sorted order where it ends; a window keeps its front unsorted only below the end that the
subsample places (``dual._chi2_front``), and its evaluation checks that the end is not inside
the front (``WindowMiss`` otherwise, and ``solve_two_piece`` sorts every key). Checked here:
the window's evaluations and keyed sums against the fully sorted view's, the miss, and the
certificates' values against the fully sorted solve and the dense dual.
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
from otstab_solvers.sorted_oracle import SortedTwoPiece, WindowMiss
from test_sorted_oracle import hinge_form


def window(oracle, n, c, h_lo, h_hi, front_below):
    return SortedTwoPiece.window(lambda i, j, out: negated_keys(oracle, slice(i, j), out), n,
                                 c, h_lo, h_hi, sd.keys_umax(oracle), block=97,
                                 front_below=front_below)


@pytest.mark.parametrize("theta2", [0.01, 0.25, 4.0])
def test_chi2_on_a_window_equals_the_full_view(theta2):
    """Inside its bracket, on both sides and at the kinks, a window whose front ends before
    the active set does gives the full view's term, mean derivative, alpha and count; its
    keyed sums are the full view's."""
    rng = np.random.default_rng(21)
    n, c = 4000, 0.6
    u = np.round(rng.standard_normal(n), 2)
    oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
    full = sd.sorted_view_of(oracle)
    sub = SortedTwoPiece(u[::7], "hinge", c)  # a subsample places the front
    h_lo, h_hi = 0.4, 0.7
    win = window(oracle, n, c, h_lo, h_hi, sd._chi2_front(sub, h_lo, h_hi, theta2))
    assert win.n_fin < n  # (the samples that move nowhere in the bracket are only counted)
    kinks = [full.kink(i) for i in range(full.n_fin) if h_lo < full.kink(i) < h_hi][::50]
    for h in [h_lo, 0.5, 0.61, h_hi] + kinks:
        for side in ("left", "right"):
            a = full.reduce(h, side, theta2, "chi2")
            b = win.reduce(h, side, theta2, "chi2")
            assert b[4] == a[4]
            for x, y in zip(a[:2] + a[3:4], b[:2] + b[3:4]):
                assert y == pytest.approx(x, rel=1e-12, abs=1e-14)
    for h in (0.45, 0.6):
        a, b = full.chi2_sums(h, theta2)[1], win.chi2_sums(h, theta2)[1]
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-12, abs=1e-13 * a["T_abs"]), key


def test_an_active_set_ending_in_the_front_is_a_miss(monkeypatch):
    """With the KL window's front (every key that moves in the bracket unsorted), chi2 at a
    small theta2 (most moving samples of weight 0) cannot find alpha: WindowMiss; and
    solve_two_piece, whose front the subsample misplaces here, sorts every key and gives the
    fully sorted answer."""
    rng = np.random.default_rng(22)
    n, c, theta2 = 6000, 0.5, 0.01
    u = rng.standard_normal(n)
    oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
    win = window(oracle, n, c, 0.3, 0.5, None)
    assert win.sorted_from > 0
    with pytest.raises(WindowMiss, match="active set"):
        win.reduce(0.4, "right", theta2, "chi2")
    full = sd.sorted_view_of(oracle)
    r = full.reduce(0.4, "right", theta2, "chi2")[1]  # (the root at h = 0.4)
    ref = solve_dual(oracle_for(*hinge_form(u, c)), r, theta2, "chi2")
    monkeypatch.setattr(sd, "_chi2_front", lambda *args: None)  # (the KL window's front)
    sol = solve_two_piece(oracle, r, theta2, "chi2", min_n=0)
    assert sol.status == ref.status == "optimal"
    assert sol.value == pytest.approx(ref.value, rel=1e-12) and sol.h == ref.h
    assert sol.info["window"]["fallback"] == "sorted every key"
    assert "active set" in sol.info["window"]["tries"][0]["status"]
    assert sol.info["view"].domain is None


@pytest.mark.parametrize("theta2", [0.001, 0.01, 0.25, 4.0])
def test_chi2_windows_placed_by_the_subsample_hold_the_answer(theta2, monkeypatch):
    """Over thresholds from just above the base risk to near the largest loss, the window
    placed by a subsample of 2,000 keys (of 60,000) holds the answer without a miss, and the
    value is the fully sorted solve's and the dense dual's."""
    monkeypatch.setattr(sd, "WINDOW_SUBSAMPLE", 2000)
    rng = np.random.default_rng(23)
    n, c = 60_000, 0.5
    u = rng.standard_normal(n) * 0.8 + 0.2
    base = float(np.mean(np.maximum(u, 0.0)))
    for t in (0.01, 0.3, 0.6, 0.95):
        r = base + t * (float(u.max()) - base)
        oracle = oracle_for(*hinge_form(u, c), sorted_view=False)
        sol = solve_two_piece(oracle, r, theta2, "chi2", min_n=0, base=base)
        ref = solve_dual(oracle_for(*hinge_form(u, c)), r, theta2, "chi2")
        assert sol.status == ref.status == "optimal"
        assert sol.info["view"].domain is not None, sol.info["window"]
        assert "fallback" not in sol.info["window"]
        assert sol.value == pytest.approx(ref.value, rel=1e-11)
        assert sol.h == pytest.approx(ref.h, rel=1e-9)
    small = u[:3000]  # the dense dual (no sorted keys) on a part of the data
    oracle = oracle_for(*hinge_form(small, c), sorted_view=False)
    r = float(np.mean(np.maximum(small, 0.0))) + 0.2
    sol = solve_two_piece(oracle, r, theta2, "chi2", min_n=0)
    dense = solve_dual(PiecewiseOracle(*hinge_form(small, c)), r, theta2, "chi2")
    assert sol.value == pytest.approx(dense.value, rel=1e-10)
    assert not math.isnan(sol.h)


@pytest.mark.parametrize("seed, thetas, u", [(0, (1e-6, 1e-6), 1.0), (1, (1e-6, 1e-6), 1.0),
                                             (0, (1e-3, 1e-6), 0.99)])
def test_a_key_in_a_front_from_the_rows_is_a_window_miss(monkeypatch, seed, thetas, u):
    """With the compiled passes (a window's front computed from the rows, not stored) chi2's
    active set may need a key of that front: the window reports a miss and the solve sorts
    every key (found by tests/test_audit_properties.py with the kernels forced at n = 3:
    "key 2 is in a front computed from the rows" was a ValueError out of certify). The
    certificate passes its audit, with the value of the fully sorted solve."""
    pytest.importorskip("numba")
    from otstab_solvers import sorted_kernels

    import otstab
    import otstab.solve._piecewise as pw
    from otstab.modeling import _pass_kernels
    from otstab.modeling._models import per_sample_losses

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3, 1))
    y = np.array([-1, 1, 1 if seed else -1])
    model = otstab.LinearModel(np.array([0.8]), 0.1)
    losses = per_sample_losses(model, X, y, "hinge")
    r = float(losses.mean() + u * (losses.max() - losses.mean()))
    kw = dict(loss="hinge", r=r, theta1=thetas[0], theta2=thetas[1], divergence="chi2")
    ref = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(sd, "WINDOW_MIN_N", 0)
    monkeypatch.setattr(pw, "AUDIT_DIRECT_MAX", 0)
    monkeypatch.setattr(sorted_kernels, "KERNEL_MIN_KEYS", 1)
    monkeypatch.setattr(_pass_kernels, "KERNEL_MIN_ROWS", 1)
    misses = []
    real = SortedTwoPiece._chi2

    def spy(self, *a):
        try:
            return real(self, *a)
        except WindowMiss as miss:
            misses.append(str(miss))
            raise
    monkeypatch.setattr(SortedTwoPiece, "_chi2", spy)
    res = otstab.certify(model, X, y, **kw)
    assert res.status == ref.status
    assert res.value == pytest.approx(ref.value, rel=1e-9, abs=1e-300)
    if seed == 0 and u == 1.0:
        assert any("computed from the rows" in m for m in misses), misses
