"""The pass that finds a binary 0/1 certificate's moved rows and sums Q*'s weights
(``otstab.solve._zero_one_pass``): dense blocks read through masks, sparse ones gathered,
on one thread or two, against the certificate through the stored n-vector of prices."""

from __future__ import annotations

import math

import numpy as np
import pytest

import otstab
from otstab.modeling._models import per_sample_losses, resolve_model
from otstab.solve import _audit
from otstab.solve import _zero_one as zo
from otstab.solve import _zero_one_pass as zp

INF = math.inf
FIELDS = ("value", "h", "risk_star", "primal_cost", "total_mass", "status", "split")


def _data(n=4000, seed=3, ties=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 5))
    coef = rng.standard_normal(5)
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    if ties:  # copies of one correctly classified row: equal prices
        j = int(np.flatnonzero(y * (X @ coef + 0.1) > 0.5)[0])
        X[rng.choice(n, ties, replace=False)] = X[j]
        y = np.where(np.all(X == X[j], axis=1), y[j], y)
    return otstab.LinearModel(coef, 0.1), X, y


def _stored(prob, r, theta2, divergence):
    """The certificate through the n-vector of distances (no RowPrices, no pass)."""
    dstar, near = zo.linear_distances(prob, None)
    return zo._solve_and_build(dstar, near.misclassified, r, 1.0, theta2, divergence, "auto",
                               prob.X, near, prob.y, prob.losses, prob.feature_names,
                               prob.index, 0.0, dstar)


def _small_blocks(monkeypatch, dense_share, workers):
    monkeypatch.setattr(zo, "SUBSAMPLE", 256)
    monkeypatch.setattr(zo.RowPrices, "BLOCK", 211)  # (many blocks, a short last one)
    monkeypatch.setattr(_audit, "AUDIT_DIRECT_MAX", 1000)  # (the pass sums the moves)
    monkeypatch.setattr(zp, "DENSE_SHARE", dense_share)
    monkeypatch.setattr(zp, "DENSE_SHARE_KL", dense_share)
    monkeypatch.setattr(zp, "PARALLEL_MIN_ROWS", 0)
    monkeypatch.setattr(zp, "WORKERS", workers)


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("kl", 0.02), ("chi2", 0.25),
                                                ("kl", INF)])
@pytest.mark.parametrize("t", [0.01, 0.5, 0.95])
@pytest.mark.parametrize("dense_share, workers, fused", [(0.0, 1, False), (2.0, 1, False),
                                                         (0.5, 2, False), (0.0, 1, True),
                                                         (2.0, 2, True)])
def test_pass_equals_the_stored_prices(monkeypatch, divergence, theta2, t, dense_share,
                                       workers, fused):
    """Every block dense (0), every block gathered (2), or mixed on two threads, and the rows
    below the window kept by the window pass (``fused``: KL and chi2, every row read in the
    window pass, blocks dense or gathered): Q* as a measure and every audited number equal
    those of the stored prices (1e-12)."""
    _small_blocks(monkeypatch, dense_share, workers)
    monkeypatch.setattr(zp, "FUSED", fused)
    monkeypatch.setattr(zp, "FUSED_CHI2", True)
    kept = []
    real_f = zp.fused_near
    monkeypatch.setattr(zp, "fused_near",
                        lambda *a, **k: kept.append(real_f(*a, **k)) or kept[-1])
    model, X, y = _data()
    prob = resolve_model(model, X, y, loss="zero_one")
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    r = b + t * (1.0 - b)
    used = []
    real = zp.near_pass
    monkeypatch.setattr(zp, "near_pass", lambda *a, **k: used.append(1) or real(*a, **k))
    lean = zo.certify_zero_one_problem(prob, r, 1.0, theta2, divergence, None, "auto", 0.0)
    ref = _stored(prob, r, theta2, divergence)
    assert lean.status == ref.status == "optimal"
    served = [k is not None for k in kept]
    assert used or served == [True]
    if not fused:
        assert used and not kept
    elif divergence == "chi2" or (theta2 == 0.25 and t == 0.95):
        # (elsewhere KL's exponents below the window may all be small, or beyond 700 at
        # theta2 = 0.02: the per-row pass)
        assert served == [True] and not used
    assert lean.info["audit"]["method"] == "sampled"
    for f in FIELDS:
        x, z = getattr(lean, f), getattr(ref, f)
        assert x == (pytest.approx(z, rel=1e-12) if isinstance(x, float) else z), f
    for f in ("source", "loss_star", "X_star"):
        np.testing.assert_array_equal(getattr(lean, f), getattr(ref, f), err_msg=f)
    np.testing.assert_allclose(lean.mass, ref.mass, rtol=0, atol=100 * X.shape[0] * 2e-16)
    np.testing.assert_allclose(lean.weights, ref.weights, rtol=1e-12, atol=0)
    w = lean.weights * lean.mass
    assert float(np.sum(w * lean.loss_star)) / X.shape[0] == pytest.approx(r, rel=1e-9)


@pytest.mark.parametrize("t2", [0.25, INF])
def test_threads_give_the_same_numbers_with_ties(monkeypatch, t2):
    """Tied rows at h (a split row) and a short size estimate (a second, counted pass): one
    thread and two give the same bits."""
    model, X, y = _data(n=3000, seed=9, ties=300)
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    out = {}
    for workers in (1, 2):
        with monkeypatch.context() as m:
            _small_blocks(m, 0.5, workers)
            m.setattr(zo.RowPrices, "_estimate", lambda self, thr: 50)  # (too short)
            out[workers] = [otstab.certify(model, X, y, loss="zero_one", r=float(r),
                                           theta2=t2, se=None)
                            for r in np.linspace(b + 0.02, 0.9, 9)]
    assert any(c.split for c in out[1])
    for one, two in zip(out[1], out[2]):
        assert one.status == two.status == "optimal"
        for f in ("value", "h", "risk_star", "primal_cost", "total_mass", "split"):
            assert getattr(one, f) == getattr(two, f), f
        for f in ("source", "mass", "weights", "X_star"):
            np.testing.assert_array_equal(getattr(one, f), getattr(two, f), err_msg=f)


def test_back_part_moves_up_in_chunks(monkeypatch):
    """The second run's candidates (written from the back) are moved up to the first run's
    in chunks smaller than the gap and larger than it: the rows in order."""
    for chunk in (3, 1000):
        monkeypatch.setattr(zp, "MOVE_CHUNK", chunk)
        out = zp._Out(100, np.int32)
        for k, back in ((7, False), (11, True), (5, False), (13, True)):
            at = out.reserve(k, back)
            out.cand[at:at + k] = np.arange(k) + (1000 if back else 0) + 100 * k
        assert out.reserve(100, False) is None and out.full
        got = out.compact()
        ref = np.concatenate([np.arange(7) + 700, np.arange(5) + 500,
                              np.arange(13) + 2300, np.arange(11) + 2100])
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("theta2", [0.01, 0.25, 3.0, INF])
def test_window_pass_on_two_threads_gives_the_same_numbers(monkeypatch, theta2):
    """RowPrices._window's blocks on two threads: the same window and the same sums (bits)
    as on one, and those equal the sums over the sorted prices."""
    monkeypatch.setattr(zp, "PARALLEL_MIN_ROWS", 0)
    model, X, y = _data(n=5000, seed=1)
    prob = resolve_model(model, X, y, loss="zero_one")
    rp, _ = zo.linear_prices(prob, None, 1.0)
    rp.BLOCK = 333
    s = rp.sorted()
    for lo_k, hi_k in ((0, 700), (1500, 2500), (4000, 4999)):
        lo = float(s[lo_k]) if lo_k else 0.0
        out = {}
        for workers in (1, 2):
            monkeypatch.setattr(zp, "WORKERS", workers)
            out[workers] = (rp._window(lo, float(s[hi_k]), theta2), dict(rp._window_sums))
        np.testing.assert_array_equal(out[1][0], out[2][0])
        assert out[1][1].keys() == out[2][1].keys()
        for key, x in out[1][1].items():
            z = out[2][1][key]
            assert x == z or (math.isnan(x) and math.isnan(z)), key
        np.testing.assert_array_equal(out[1][0], s[(s >= lo) & (s <= s[hi_k])])
        below = s[s < lo]
        assert out[1][1]["below"] == below.size
        if math.isinf(theta2):
            assert out[1][1]["below_gap"] == pytest.approx(float(np.sum(lo - below)),
                                                           rel=1e-12)
        else:
            ref = float(np.sum(np.exp(np.maximum(-below / theta2, -700.0))))
            assert out[1][1]["below_exp"] == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("theta1", [1.0, 2.5, 1e300])
@pytest.mark.parametrize("scale", [1.0, 1e160])
def test_finite_prices_from_the_largest_score(theta1, scale):
    """RowPrices.finite from the largest |score| (no pass of prices) equals the count over
    every price, also where the largest prices overflow to inf."""
    rng = np.random.default_rng(2)
    S = rng.standard_normal(3000) * scale
    S[:3] = [1e-300, -2.0 * scale, 0.0]
    y = np.where(rng.random(3000) < 0.5, 1, -1).astype(np.int8)
    wrong = (S > 0) != (y > 0)
    rp = zo.RowPrices(S, y, wrong, 0.7, theta1)
    with np.errstate(over="ignore"):  # (the prices that overflow)
        a = rp.array()
        got = rp.finite()
    fin = np.isfinite(a)
    assert got == (bool(fin.any()), bool(fin.all()),
                           int(np.count_nonzero(fin & ~wrong)))
    assert fin.all() == (scale == 1.0)


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("chi2", 0.25), ("kl", INF)])
@pytest.mark.parametrize("t", [0.01, 0.5, 0.95])
@pytest.mark.parametrize("sampled", [False, True])
def test_sample_weights_from_the_prices_equal_the_arrays(monkeypatch, divergence, theta2, t,
                                                         sampled):
    """Sample weights: Q*'s weights computed from the prices where read (_MapWeights, a
    compact plan, tied rows as positions) against the arrays of the candidates' prices,
    weights and masses: the same Q* and audited numbers (1e-12); with ties at h."""
    monkeypatch.setattr(zo, "REDUCED_BLOCK", 97)  # (several blocks of candidates)
    if sampled:
        monkeypatch.setattr(_audit, "AUDIT_DIRECT_MAX", 1000)
    model, X, y = _data(n=3000, seed=5, ties=40)
    sw = np.random.default_rng(6).uniform(0.2, 2.0, X.shape[0])
    b = float(np.average(per_sample_losses(model, X, y, "zero_one"), weights=sw))
    kw = dict(loss="zero_one", r=b + t * (1.0 - b), theta1=1.0, theta2=theta2,
              divergence=divergence, sample_weight=sw, se=None)
    kinds = []
    real = zo._move_plan
    monkeypatch.setattr(zo, "_move_plan",
                        lambda *a, **k: kinds.append(type(a[1]).__name__) or real(*a, **k))
    lean = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(zo, "MAP_WEIGHTS", False)
    ref = otstab.certify(model, X, y, **kw)
    assert kinds == ["_MapWeights", "_Weights"]
    assert lean.status == ref.status == "optimal"
    for f in FIELDS:
        x, z = getattr(lean, f), getattr(ref, f)
        assert x == (pytest.approx(z, rel=1e-12) if isinstance(x, float) else z), f
    for f in ("loss_star", "X_star"):
        np.testing.assert_array_equal(getattr(lean, f)[np.argsort(lean.source, kind="stable")],
                                      getattr(ref, f)[np.argsort(ref.source, kind="stable")],
                                      err_msg=f)
    np.testing.assert_array_equal(np.sort(lean.source), np.sort(ref.source))
    np.testing.assert_allclose(lean.weights, ref.weights, rtol=1e-12, atol=0)
    np.testing.assert_allclose(np.sort(lean.mass), np.sort(ref.mass), rtol=1e-9, atol=1e-12)
    p = sw / sw.sum()
    pa = p[lean.source] * lean.mass  # (P0-mass of each atom)
    assert float(np.sum(pa * lean.weights * lean.loss_star)) == pytest.approx(lean.r,
                                                                             rel=1e-9)


@pytest.mark.parametrize("theta2", [0.25, 1.0, 3.0, INF])
@pytest.mark.parametrize("t", [0.3, 0.95, 0.999])
@pytest.mark.parametrize("workers, short", [(1, False), (2, False), (2, True)])
def test_rows_below_the_window_kept_by_the_window_pass(monkeypatch, theta2, t, workers,
                                                       short):
    """The window pass keeps the rows below its window (their indices, and their exp terms
    times the audit's moves): the certificate equals the one whose moved-rows pass reads
    every row (Q* as a measure, the audited numbers at 1e-12), with ties at h, on one or two
    threads; a short size estimate for the kept rows (``short``) falls back to that pass."""
    _small_blocks(monkeypatch, 0.5, workers)
    monkeypatch.setattr(zp, "FUSED_INF", True)  # (off by default: tested here)
    if short:
        monkeypatch.setattr(zo.RowPrices, "_estimate", lambda self, thr: 50)
    model, X, y = _data(n=6000, seed=11, ties=200)
    X = 3.0 * X  # (prices of about 10: exponents below the window above 0.5 at theta2 <= 3)
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    kw = dict(loss="zero_one", r=b + t * (1.0 - b), theta1=1.0, theta2=theta2, se=None)
    kept = []
    real_f = zp.fused_near
    monkeypatch.setattr(zp, "fused_near",
                        lambda *a, **k: kept.append(real_f(*a, **k)) or kept[-1])
    lean = otstab.certify(model, X, y, **kw)
    served = [k is not None for k in kept]
    monkeypatch.setattr(zp, "FUSED", False)
    ref = otstab.certify(model, X, y, **kw)
    assert lean.status == ref.status == "optimal"
    # (theta2 >= 1 near the largest rate: every exponent below the window small, per row)
    assert short or served == [True] or (theta2 >= 1.0 and t == 0.95)
    for f in FIELDS:
        x, z = getattr(lean, f), getattr(ref, f)
        assert x == (pytest.approx(z, rel=1e-12) if isinstance(x, float) else z), f
    np.testing.assert_array_equal(lean.source, ref.source)
    for f in ("loss_star", "X_star"):
        np.testing.assert_array_equal(getattr(lean, f), getattr(ref, f), err_msg=f)
    np.testing.assert_allclose(lean.mass, ref.mass, rtol=0, atol=100 * X.shape[0] * 2e-16)
    np.testing.assert_allclose(lean.weights, ref.weights, rtol=1e-12, atol=0)
    assert lean.info["audit"]["max_rel_error"] <= 1e-12
    if not short and workers == 1:  # and the kink-exact dual on the distances (no window)
        dual = otstab.certify(model, X, y, solver="dual", **kw)
        assert dual.status == "optimal"
        assert lean.value == pytest.approx(dual.value, rel=1e-9)
        assert lean.primal_cost == pytest.approx(dual.value, rel=1e-8)


@pytest.mark.parametrize("theta2", [0.25, INF])
def test_defaults_above_the_thread_threshold(monkeypatch, theta2):
    """At the default sizes (n above PARALLEL_MIN_ROWS: two threads where the process may run
    on two CPUs, dense blocks, the kept rows) the certificate equals the one of one thread
    reading every row (the same bits: sums in block order) and of the stored prices."""
    model, X, y = _data(n=150_000, seed=12)
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    kw = dict(loss="zero_one", r=b + 0.9 * (1.0 - b), theta1=1.0, theta2=theta2, se=None)
    monkeypatch.setattr(zp, "WORKERS", 2)
    lean = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(zp, "WORKERS", 1)
    one = otstab.certify(model, X, y, **kw)
    for f in ("value", "h", "risk_star", "primal_cost", "total_mass"):
        assert getattr(lean, f) == getattr(one, f), f
    np.testing.assert_array_equal(lean.weights, one.weights)
    ref = _stored(resolve_model(model, X, y, loss="zero_one"), kw["r"], theta2, "kl")
    for f in FIELDS:
        x, z = getattr(lean, f), getattr(ref, f)
        assert x == (pytest.approx(z, rel=1e-12) if isinstance(x, float) else z), f


def test_kept_rows_are_not_held_by_the_result(monkeypatch):
    """Where Q*'s weights do not come from the pass (here forced: the candidates' arrays),
    nothing the window pass kept stays with the prices the result holds."""
    _small_blocks(monkeypatch, 0.5, 1)
    model, X, y = _data(n=4000, seed=13)
    X = 3.0 * X
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    seen = []
    real = zo.RowPrices.solve_window
    monkeypatch.setattr(zo.RowPrices, "solve_window",
                        lambda self, *a: seen.append(self) or real(self, *a))
    real_w = zo.RowPrices._window
    kept = []
    monkeypatch.setattr(zo.RowPrices, "_window", lambda self, *a: (
        real_w(self, *a), kept.append(self._fused is not None))[0])
    monkeypatch.setattr(zo, "_price_weights", lambda *a, **k: None)
    res = otstab.certify(model, X, y, loss="zero_one", r=b + 0.9 * (1.0 - b), theta2=0.25,
                         se=None)
    assert res.status == "optimal" and kept == [True]
    assert seen[0]._fused is None and seen[0]._fuse is None


def test_points_and_reduced_equal_their_two_computations():
    """NearPoints.points_and_reduced (the sampled audit's rows) equals moved_points' x, x*
    and reduced's numbers, bit for bit, binary and multiclass."""
    rng = np.random.default_rng(14)
    X = rng.standard_normal((500, 4))
    for model, y in ((otstab.LinearModel(rng.standard_normal(4), 0.2),
                      np.where(rng.random(500) < 0.5, 1, -1)),
                     (otstab.LinearModel(rng.standard_normal((3, 4)), np.zeros(3)),
                      rng.integers(0, 3, 500))):
        prob = resolve_model(model, X, y, loss="zero_one")
        _, near = zo.linear_distances(prob, None)
        rows = np.array([3, 17, 18, 250, 499])
        Xr, Xm, lm, dd = near.points_and_reduced(prob.X, rows)
        np.testing.assert_array_equal(Xr, X[rows])
        np.testing.assert_array_equal(Xm, X[rows] + near.displacement(rows))
        ref_l, ref_d = near.reduced(rows)
        np.testing.assert_array_equal(lm, ref_l)
        np.testing.assert_array_equal(dd, ref_d)


def _chi2_summaries(s, lo, hi):
    """What RowPrices._window sums for chi2, from the sorted prices directly."""
    below = s[s < lo] if lo > 0 else s[:0]
    fin = np.isfinite(s)
    return s[(s >= lo) & (s <= hi) & fin], dict(
        below=below.size, lo=lo, d1=float(np.sum(lo - below)),
        d2=float(np.sum((lo - below) ** 2)), a1=float(np.sum(below)), n_zero=int(np.sum(s == 0)),
        n_fin=int(fin.sum()), top=not np.any(fin & (s > hi)))


@pytest.mark.parametrize("theta2", [0.05, 0.25, 3.0])
@pytest.mark.parametrize("r", [0.101, 0.11, 0.2, 0.5, 0.9, 0.99])
def test_chi2_window_equals_the_dual_on_every_price(theta2, r):
    """The chi2 closed form from a window of the sorted prices (every weight positive at
    the optimum: alpha = -mean(l_h)) against the kink-exact dual on every price: the same h
    and value (1e-12), with ties and prices that cannot move; a window that misses says so."""
    from otstab_solvers.zero_one import solve_window_chi2, solve_zero_one, zero_one_objective

    rng = np.random.default_rng(int(100 * r + 10 * theta2))
    n = 3000
    s = np.sort(np.concatenate([np.zeros(300), rng.exponential(size=n - 300) ** 2]))
    s[1500:1510] = s[1500]
    s[-4:] = INF
    ref = solve_zero_one(s, r, theta2, "chi2", presorted=True)
    assert ref.status == "optimal"
    hits = 0
    for k_lo in (0, 300, 900, 1500, 2100, 2700):
        for width in (40, 400, 3000):
            lo = float(s[k_lo]) if k_lo else 0.0
            hi = float(s[k_lo + width]) if k_lo + width < n - 4 else INF
            win, kw = _chi2_summaries(s, lo, hi)
            sol = solve_window_chi2(win, r, theta2, n, **kw)
            if sol is None:
                continue
            hits += 1
            assert sol.h == pytest.approx(ref.h, rel=1e-12)
            assert sol.value == pytest.approx(ref.value, rel=1e-12)
            assert sol.value == pytest.approx(zero_one_objective(s, sol.h, r, theta2, "chi2"),
                                              rel=1e-12)
            lh = np.maximum(sol.h - s, 0.0)  # alpha = -mean(l_h): the weights' mass is 1
            assert float(np.mean(1.0 + (lh + sol.alpha) / (2 * theta2))) == \
                pytest.approx(1.0, rel=1e-13)
    assert hits >= 1
    j = int(np.searchsorted(s, ref.h))  # a window above the answer misses it
    win, kw = _chi2_summaries(s, float(s[min(j + 60, n - 5)]), float(s[min(j + 90, n - 5)]))
    assert solve_window_chi2(win, r, theta2, n, **kw) is None


def test_chi2_certificate_through_the_window(monkeypatch):
    """A chi2 certificate of RowPrices reads a window (no sorted n-vector of prices) and
    equals the one through the stored prices (Q* as a measure, 1e-12)."""
    _small_blocks(monkeypatch, 0.5, 2)
    model, X, y = _data(n=5000, seed=15)
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    sorted_calls = []
    real = zo.RowPrices.sorted
    monkeypatch.setattr(zo.RowPrices, "sorted",
                        lambda self: sorted_calls.append(1) or real(self))
    prob = resolve_model(model, X, y, loss="zero_one")
    for t in (0.3, 0.6, 0.95):
        r = b + t * (1.0 - b)
        lean = zo.certify_zero_one_problem(prob, r, 1.0, 0.25, "chi2", None, "auto", 0.0)
        ref = _stored(prob, r, 0.25, "chi2")
        assert lean.status == ref.status == "optimal" and not sorted_calls
        assert lean.solver == "zero_one_closed_form"
        for f in FIELDS:
            x, z = getattr(lean, f), getattr(ref, f)
            assert x == (pytest.approx(z, rel=1e-12) if isinstance(x, float) else z), f
        np.testing.assert_array_equal(lean.source, ref.source)
        np.testing.assert_allclose(lean.weights, ref.weights, rtol=1e-12, atol=0)


@pytest.mark.parametrize("theta2", [0.05, 0.25, 3.0])
@pytest.mark.parametrize("t", [0.01, 0.3, 0.95, 0.999])
@pytest.mark.parametrize("workers", [1, 2])
def test_chi2_rows_below_the_window_kept(monkeypatch, theta2, t, workers):
    """chi2: the window pass keeps the rows below its window (sums of lo - a, its square and
    the moves times 1 and lo - a); the certificate equals the one whose moved-rows pass reads
    every row and the kink-exact dual on every price (Q* as a measure, 1e-12), with ties."""
    _small_blocks(monkeypatch, 0.5, workers)
    monkeypatch.setattr(zp, "FUSED_CHI2", True)  # (off by default: tested here)
    model, X, y = _data(n=6000, seed=16, ties=150)
    b = float(np.mean(per_sample_losses(model, X, y, "zero_one")))
    kw = dict(loss="zero_one", r=b + t * (1.0 - b), theta1=1.0, theta2=theta2,
              divergence="chi2", se=None)
    kept = []
    real_f = zp.fused_near
    monkeypatch.setattr(zp, "fused_near",
                        lambda *a, **k: kept.append(real_f(*a, **k)) or kept[-1])
    lean = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(zp, "FUSED", False)
    ref = otstab.certify(model, X, y, **kw)
    dual = otstab.certify(model, X, y, solver="dual", **kw)
    assert [k is not None for k in kept] == [True]
    assert lean.status == ref.status == dual.status == "optimal"
    for f in FIELDS:
        x, z = getattr(lean, f), getattr(ref, f)
        assert x == (pytest.approx(z, rel=1e-12) if isinstance(x, float) else z), f
    assert lean.value == pytest.approx(dual.value, rel=1e-12)
    np.testing.assert_array_equal(lean.source, ref.source)
    np.testing.assert_array_equal(lean.X_star, ref.X_star)
    np.testing.assert_allclose(lean.weights, ref.weights, rtol=1e-12, atol=0)
    np.testing.assert_allclose(lean.mass, ref.mass, rtol=0, atol=100 * X.shape[0] * 2e-16)
