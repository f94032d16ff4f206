"""The compiled logistic exact pass (``otstab_solvers.logistic_kernels``).

Its log1p against mpmath; one exact pass (and a second, warm-started one) with the kernels
against the NumPy path they replace (``USE_KERNEL`` off) on random margins with extreme ones
(``|m|`` up to 700), prices from tiny to huge and ``h`` around the switching points (the band
of two local maxima, whose rows the compiled loop hands to the robust solve): the dual's value
and derivative within 1e-13, the kept steps and losses within some ulps; the certificate with
the kernels forced on small data against the 30-digit dual of tests/test_logistic_hp.py, and
against the NumPy path (value, h, Q* as a measure); the kernel is used where it should be.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import otstab_solvers.logistic_binned as lb
import otstab_solvers.logistic_kernels as LK
import pytest
import test_logistic_hp as hp
from otstab_solvers import logistic_pass as lp
from otstab_solvers import sorted_kernels as K
from otstab_solvers.smooth import LogisticOracle
from reference import measure_by_row

import otstab

pytestmark = pytest.mark.skipif(not K.HAVE_NUMBA, reason="numba is not installed")


@pytest.fixture
def kernels_on(monkeypatch):
    """Every oracle runs the compiled pass (however small)."""
    monkeypatch.setattr(K, "USE_KERNEL", True)
    monkeypatch.setattr(LK, "USE_KERNEL", True)
    monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
    LK.use_kernel(0)  # (loaded here: its calls not counted)


def _count_blocks(monkeypatch):
    """Count the blocks the compiled pass solves (and the rows it hands back)."""
    seen = {"blocks": 0, "rest": 0, "edge": 0}
    real = LK.solve_block

    def counted(*a, **k):
        rest, sums, edge = real(*a, **k)
        seen["blocks"] += 1
        seen["rest"] += rest.size
        seen["edge"] += edge.size
        return rest, sums, edge
    monkeypatch.setattr(LK, "solve_block", counted)
    return seen


def test_log1p_within_two_ulps_of_mpmath(kernels_on):
    import numba

    LK.load()
    f = LK._COMPILED["_log1p_unit"]

    @numba.njit
    def every(q, out):
        for i in range(q.size):
            out[i] = f(q[i])
    rng = np.random.default_rng(0)
    q = np.concatenate([rng.random(3000), rng.random(500) * 1e-8, np.logspace(-300, 0, 500),
                        [0.0, 5e-324, 0.5, np.nextafter(0.5, 0.0), np.nextafter(0.5, 1.0), 1.0]])
    got = np.empty_like(q)
    every(q, got)
    ref = np.array([float(mpmath.log1p(mpmath.mpf(float(v)))) for v in q])
    nz = ref > 0
    assert np.all(got[~nz] == 0.0)
    assert (np.abs(got[nz] - ref[nz]) / np.spacing(ref[nz])).max() <= 2.0


def _margins(seed, n=3000):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal(n) * 2.0
    s[:40] = rng.uniform(-700.0, 700.0, 40)  # extreme margins
    s[40:80] = rng.uniform(-30.0, 30.0, 40)
    y = np.where(rng.random(n) < 0.5, 1, -1).astype(np.int8)
    return s, y


def _pass(monkeypatch, use, s, y, c, h, theta2, dtype=np.float64):
    """Two passes (at h, then warm-started at 1.002 h): (F, g, curv) of each, and the kept
    losses and steps of the second."""
    monkeypatch.setattr(LK, "USE_KERNEL", use)
    o = LogisticOracle.of_scores(s.astype(dtype), y, 1.0 / c, 1.0)
    run = lp._Pass(o, s.size, theta2, "kl", None, 1000)
    o.keep_values = True
    out = []
    for hh in (h, 1.002 * h):
        F, g, curv, _ = run.at(hh, 1.0)
        out += [F, g, run.curvature(hh) if curv is None else curv]
    loss, t = o.kept_vectors(1.002 * h)
    return np.array(out), loss.copy(), t.copy()


@pytest.mark.parametrize("theta2", [0.25, 3.0, math.inf])
@pytest.mark.parametrize("c,h", [(1.0, 0.7), (1.0, 3.9), (1.0, 8.0), (1.0, 30.0),
                                 (1e-4, 0.5), (1e-4, 7.9e-4), (1e3, 5.0), (0.05, 0.4)])
def test_pass_matches_numpy(monkeypatch, kernels_on, theta2, c, h):
    s, y = _margins(int(c * 1000 + h * 10))
    seen = _count_blocks(monkeypatch)
    ref = _pass(monkeypatch, False, s, y, c, h, theta2)
    assert seen["blocks"] == 0
    got = _pass(monkeypatch, True, s, y, c, h, theta2)
    assert seen["blocks"] == 2 * 3  # (two passes of three blocks)
    a, b = ref[0], got[0]
    scale = np.maximum(np.abs(a), 1.0)
    for i in (0, 1, 3, 4):  # the value and the derivative
        assert abs(a[i] - b[i]) <= 1e-13 * scale[i], (i, a[i], b[i])
    # the curvature (the Newton step only): Z2 / Z - mu^2 cancels where the weights
    # concentrate, which amplifies the ulps of the steps
    np.testing.assert_allclose(b[[2, 5]], a[[2, 5]], rtol=1e-9)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-13, atol=0.0)  # losses
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-13, atol=1e-300)  # steps
    if h / (2.0 * c) > 4.0 and h < 20.0:  # the band of two maxima: the robust solve's rows
        assert seen["rest"] > 0


def test_rows_near_the_fold_and_float32_scores(monkeypatch, kernels_on):
    """Margins at the ends of the band (F' near 0 at the root), float32 scores."""
    c, h = 1.0, 9.0
    T = h / (2 * c)
    L = 2.0 * math.atanh(math.sqrt(1.0 - 4.0 / T))
    sl = 1.0 / (1.0 + math.exp(L))
    ends = np.array([T * sl + L, T * (1.0 - sl) - L])
    rng = np.random.default_rng(3)
    s = np.concatenate([ends[:, None] + rng.uniform(-1e-6, 1e-6, (2, 200)),
                        ends[:, None] + rng.uniform(-1e-3, 1e-3, (2, 200))]).ravel()
    s = np.concatenate([s, rng.standard_normal(1200)])
    y = np.ones(s.size, dtype=np.int8)
    seen = _count_blocks(monkeypatch)
    for dtype in (np.float64, np.float32):
        ref = _pass(monkeypatch, False, s, y, c, h, 0.5, dtype)
        got = _pass(monkeypatch, True, s, y, c, h, 0.5, dtype)
        np.testing.assert_allclose(got[0][[0, 1, 3, 4]], ref[0][[0, 1, 3, 4]], rtol=1e-13)
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-14)
        np.testing.assert_allclose(got[2], ref[2], rtol=1e-14)
    assert seen["rest"] > 0


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.5), ("kl", math.inf), ("chi2", 0.5)])
def test_against_30_digits_with_kernels(monkeypatch, kernels_on, divergence, theta2):
    """tests/test_logistic_hp.py's 30-digit dual, the binned path's exact pass compiled."""
    seen = _count_blocks(monkeypatch)
    hp.test_logistic_certificate_against_30_digits(monkeypatch, True, divergence, theta2,
                                                   False)
    assert seen["blocks"] > 0


@pytest.mark.parametrize("divergence,theta2,t", [("kl", 0.25, 0.5), ("kl", 0.25, 0.02),
                                                 ("kl", math.inf, 0.5), ("kl", 2.0, 0.9),
                                                 ("chi2", 0.25, 0.5), ("chi2", 0.25, 0.02),
                                                 ("chi2", 2.0, 0.9)])
def test_certificate_matches_numpy_path(monkeypatch, kernels_on, divergence, theta2, t):
    rng = np.random.default_rng(11)
    n, d = 20_000, 4
    X = rng.standard_normal((n, d))
    coef = np.array([1.2, -0.7, 0.5, 0.3])
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    m = y * model.decision_function(X)
    losses = np.logaddexp(0.0, -m)
    r = losses.mean() + t * (losses.max() - losses.mean())
    monkeypatch.setattr(lb, "MIN_N", 0)
    kw = dict(loss="logistic", r=r, theta1=1.0, theta2=theta2, divergence=divergence)
    seen = _count_blocks(monkeypatch)
    res = {}
    for use in (False, True):
        monkeypatch.setattr(LK, "USE_KERNEL", use)
        res[use] = otstab.certify(model, X, y, **kw)
        assert res[use].status == "optimal"
        assert "binned_h" in res[use].info
    assert seen["blocks"] > 0
    a, b = res[False], res[True]
    assert b.value == pytest.approx(a.value, rel=1e-12)
    assert b.h == pytest.approx(a.h, rel=1e-12)
    qa, qb = measure_by_row(a, n), measure_by_row(b, n)
    for key in ("mass", "wmass", "loss"):
        np.testing.assert_allclose(qb[key], qa[key], rtol=1e-10, atol=1e-14)


def test_kernel_only_at_its_size(monkeypatch):
    """Below KERNEL_MIN_KEYS the NumPy path runs (no compiled pass)."""
    monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 1 << 17)
    seen = _count_blocks(monkeypatch)
    s, y = _margins(2)
    _pass(monkeypatch, True, s, y, 1.0, 0.7, 0.25)
    assert seen["blocks"] == 0
    monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
    _pass(monkeypatch, True, s, y, 1.0, 0.7, 0.25)
    assert seen["blocks"] > 0


@pytest.mark.parametrize("divergence,theta2,t", [("kl", 0.25, 0.5), ("kl", 0.25, 0.001),
                                                 ("kl", math.inf, 0.5), ("chi2", 0.25, 0.5),
                                                 ("chi2", 0.25, 0.001)])
def test_audit_sums_match_numpy(monkeypatch, kernels_on, divergence, theta2, t):
    """The audit's compiled sums (logistic_kernels.audit_sums) against its NumPy blocks: the
    certificate's primal cost, gap and risk; near the base risk (t = 0.001) most KL weights
    lie within NEAR_ONE of 1 (phi's series)."""
    import otstab.solve._audit as au

    monkeypatch.setattr(au, "AUDIT_DIRECT_MAX", 100)  # (the sampled audit: reduced form)
    monkeypatch.setattr(lb, "MIN_N", 0)
    rng = np.random.default_rng(5)
    n = 20_000
    X = rng.standard_normal((n, 3))
    coef = np.array([1.0, -0.6, 0.4])
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    losses = np.logaddexp(0.0, -y * model.decision_function(X))
    r = losses.mean() + t * (losses.max() - losses.mean())
    calls = {"n": 0, "near": 0}
    real = LK.audit_sums

    def counted(*a, **k):
        got = real(*a, **k)
        calls["n"] += 1
        calls["near"] += got[5]
        return got
    monkeypatch.setattr(LK, "audit_sums", counted)
    res = {}
    for use in (False, True):
        monkeypatch.setattr(LK, "USE_KERNEL", use)
        res[use] = otstab.certify(model, X, y, loss="logistic", r=r, theta1=1.0,
                                  theta2=theta2, divergence=divergence)
        assert res[use].status == "optimal"
        assert res[use].info["audit"]["method"] == "sampled"
        assert (calls["n"] > 0) == use
    a, b = res[False], res[True]
    assert b.value == pytest.approx(a.value, rel=1e-13)  # (the pass compiled too)
    assert b.primal_cost == pytest.approx(a.primal_cost, rel=1e-13)
    assert b.risk_star == pytest.approx(a.risk_star, rel=1e-13)
    assert abs(b.gap - a.gap) <= 1e-13 * max(abs(a.value), r)  # (sums of order r)
    if t < 0.01 and divergence == "kl":
        assert calls["near"] > 0


def test_binning_matches_numpy(monkeypatch, kernels_on):
    """The binned margins' range and per-bin sums compiled (logistic_kernels.bin_block):
    the same sums as the NumPy bincounts (row order within each block, blocks added)."""
    rng = np.random.default_rng(8)
    n = 150_000  # (more than one block of the binning)
    s = rng.standard_normal(n) * 3.0
    s[:5] = [-700.0, 700.0, 0.0, 1e-300, -1e-300]
    y = np.where(rng.random(n) < 0.5, 1, -1).astype(np.int8)

    def margins_of(a, b):
        return np.multiply(y[a:b], s[a:b], dtype=np.float64)
    calls = {"n": 0}
    real = LK.bin_block

    def counted(*a):
        calls["n"] += 1
        return real(*a)
    monkeypatch.setattr(LK, "bin_block", counted)
    ref = lb._Bins(margins_of, n, None, lb.BINS)
    assert calls["n"] == 0
    got = lb._Bins(margins_of, n, None, lb.BINS, rows=(y, s))
    assert calls["n"] > 0
    assert (got.lo, got.hi) == (ref.lo, ref.hi)
    for key in ("count", "first", "second"):
        np.testing.assert_array_equal(getattr(got, key), getattr(ref, key))


@pytest.mark.parametrize("c,h", [(1.0, 0.7), (1.0, 5.0), (0.05, 0.4)])
def test_chi2_pass_matches_numpy(monkeypatch, kernels_on, c, h):
    """chi2's pass from a guess of alpha with the kernels against NumPy's, with a band wide
    enough that many rows are the edge's (kept one by one): value, derivative, alpha."""
    monkeypatch.setattr(lp, "CHI2_BAND", 3e-2)
    s, y = _margins(int(c * 100 + h))
    s = s[100:]  # (no extreme margins: the active set's edge among many rows)
    y = y[100:]
    theta2 = 0.02  # (small: the active set ends among the rows)
    o = LogisticOracle.of_scores(s, y, 1.0 / c, 1.0)
    exact = lp._Pass(o, s.size, theta2, "chi2", None, 1000)  # (alpha by the active set)
    o.keep_values = True
    alpha = exact.at(h, 1.0)[3]
    seen = _count_blocks(monkeypatch)
    out = {}
    for use in (False, True):
        monkeypatch.setattr(LK, "USE_KERNEL", use)
        o = LogisticOracle.of_scores(s, y, 1.0 / c, 1.0)
        run = lp._Pass(o, s.size, theta2, "chi2", None, 1000, alpha=alpha * (1 + 1e-3))
        o.keep_values = True
        got = run._chi2_at(h, 1.0)
        assert got is not None
        out[use] = np.array(got)
    assert seen["blocks"] == 3 and seen["edge"] > 0
    a, b = out[False], out[True]
    scale = np.maximum(np.abs(a), 1.0)
    assert np.all(np.abs(a - b)[[0, 1, 3]] <= 1e-13 * scale[[0, 1, 3]]), (a, b)
    assert abs(a[2] - b[2]) <= 1e-9 * abs(a[2])  # (the curvature: d2l from s = t / T)
    assert a[3] == pytest.approx(alpha, rel=1e-9)


def test_a_failing_numba_falls_back_to_numpy(monkeypatch, caplog):
    """Loops that cannot be compiled leave the NumPy passes running, with a warning, and the
    same certificate."""
    rng = np.random.default_rng(4)
    n = 5000
    X = rng.standard_normal((n, 3))
    coef = np.array([1.0, -0.5, 0.3])
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.0)
    losses = np.logaddexp(0.0, -y * model.decision_function(X))
    kw = dict(loss="logistic", r=float(losses.mean() + 0.2), theta1=1.0, theta2=0.5,
              divergence="kl")
    monkeypatch.setattr(lb, "MIN_N", 0)
    monkeypatch.setattr(LK, "USE_KERNEL", False)
    ref = otstab.certify(model, X, y, **kw)

    def broken():
        raise RuntimeError("no LLVM here")

    monkeypatch.setattr(LK, "USE_KERNEL", True)
    monkeypatch.setattr(K, "KERNEL_MIN_KEYS", 0)
    monkeypatch.setattr(LK, "load", broken)
    monkeypatch.setitem(LK._LOADED, "ok", None)
    seen = _count_blocks(monkeypatch)
    with caplog.at_level("WARNING", logger="otstab"):
        got = otstab.certify(model, X, y, **kw)
    assert "no LLVM here" in caplog.text and LK._LOADED["ok"] is False
    assert seen["blocks"] == 0
    assert got.value == ref.value and got.h == ref.h and got.status == "optimal"
    monkeypatch.setitem(LK._LOADED, "ok", None)  # (the next test loads them again)


def test_certify_uses_the_kernels_at_their_size(monkeypatch):
    """Defaults (KERNEL_MIN_KEYS = 2^17 rows): a certificate of that many rows runs the
    compiled pass, binning and audit sums; one row fewer runs none of them."""
    rng = np.random.default_rng(6)
    n = K.KERNEL_MIN_KEYS
    X = rng.standard_normal((n, 2))
    coef = np.array([1.0, -0.5])
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.0)
    losses = np.logaddexp(0.0, -y * model.decision_function(X))
    kw = dict(loss="logistic", r=float(losses.mean() + 0.2), theta1=1.0, theta2=0.5,
              divergence="kl")
    import otstab.solve._audit as au

    # (the sampled audit, whose sums the kernel takes, above AUDIT_DIRECT_MAX rows)
    monkeypatch.setattr(au, "AUDIT_DIRECT_MAX", min(au.AUDIT_DIRECT_MAX, n // 2))
    seen = _count_blocks(monkeypatch)
    used = {"bin": 0, "audit": 0}
    real_bin, real_audit = LK.bin_block, LK.audit_sums

    def bin_block(*a):
        used["bin"] += 1
        return real_bin(*a)

    def audit_sums(*a, **k):
        used["audit"] += 1
        return real_audit(*a, **k)
    monkeypatch.setattr(LK, "bin_block", bin_block)
    monkeypatch.setattr(LK, "audit_sums", audit_sums)
    res = otstab.certify(model, X, y, **kw)
    assert res.status == "optimal" and "binned_h" in res.info
    assert seen["blocks"] > 0 and used["bin"] > 0 and used["audit"] > 0
    seen["blocks"] = used["bin"] = used["audit"] = 0
    assert otstab.certify(model, X[1:], y[1:], **kw).status == "optimal"
    assert seen["blocks"] == used["bin"] == used["audit"] == 0


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.25), ("kl", math.inf), ("chi2", 0.25)])
def test_blocks_on_two_threads_give_the_same_bits(monkeypatch, kernels_on, divergence, theta2):
    """The exact pass's blocks run in two halves, the second on a thread of its own where
    there are two CPUs (sorted_kernels.pair); each block's sums are added in block order, so
    the certificate is the same bit for bit on one CPU."""
    rng = np.random.default_rng(12)
    n, d = 30_000, 3
    X = rng.standard_normal((n, d))
    coef = np.array([1.0, -0.5, 0.25])
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    losses = np.logaddexp(0.0, -y * model.decision_function(X))
    r = losses.mean() + 0.5 * (losses.max() - losses.mean())
    monkeypatch.setattr(lb, "MIN_N", 0)
    kw = dict(loss="logistic", r=r, theta1=1.0, theta2=theta2, divergence=divergence)
    threads = []
    real = K.pair

    def watched(first, second):
        threads.append(K._two_cpus())
        return real(first, second)

    monkeypatch.setattr(K, "pair", watched)
    two = otstab.certify(model, X, y, **kw)
    assert threads  # the pass went through pair()
    monkeypatch.setattr(K, "_two_cpus", lambda: False)
    one = otstab.certify(model, X, y, **kw)
    assert two.status == one.status == "optimal"
    assert two.value == one.value and two.h == one.h
    np.testing.assert_array_equal(two.weights, one.weights)


@pytest.mark.parametrize("seed, spread", [(0, 1.0), (1, 30.0), (2, 0.0)])
def test_quadrature_moments_compiled_equal_numpy(monkeypatch, kernels_on, seed, spread):
    """MarginQuadrature's Chebyshev moments in one compiled pass against NumPy's recurrence
    and reduceat (spread 0: every margin equal, bins of one value): the bins' weights within
    1e-13 of the largest of their bin, and the dual at a few prices and h within 1e-12."""
    from otstab_solvers import logistic_quadrature as LQ

    rng = np.random.default_rng(seed)
    m = rng.standard_normal(20_000) * spread + 0.3
    m[:50] = rng.uniform(-40.0, 40.0, 50) if spread else 0.3  # (sparse tails: wide bins)
    calls = []
    real = LK.moments
    monkeypatch.setattr(LK, "moments", lambda *a: calls.append(1) or real(*a))
    got = LQ.MarginQuadrature(m, bins=256)
    assert calls
    monkeypatch.setattr(LK, "USE_KERNEL", False)
    ref = LQ.MarginQuadrature(m, bins=256)
    scale = np.max(np.abs(ref.weights), axis=1, keepdims=True)
    assert np.all(np.abs(got.weights - ref.weights) <= 1e-13 * scale)
    for c, h in ((0.5, 0.3), (2.0, 1.5), (0.05, 2.0)):
        a, b = got.dual_at(c, h, 0.9, 0.25), ref.dual_at(c, h, 0.9, 0.25)
        assert (a is None) == (b is None)
        if a is not None:
            assert a[0] == pytest.approx(b[0], rel=1e-12, abs=1e-14)
            assert a[1] == pytest.approx(b[1], rel=1e-12, abs=1e-12)
