"""The exact logistic dual at the binned root (otstab_solvers.logistic_pass), the table of
steps that starts a block's Newton iterations (logistic_uniform.StepTable), the softplus
from the sigmoid (smooth._softplus_at) and Q*'s build from the losses the pass kept (the
audit's sampled atoms re-scored by the model check them).

Each is checked against an independent computation: the dual against the plain bracketed
search on the dense oracle (:func:`solve_dual` on stored margins, its own d-transform), the
steps against the robust bracketed solve (:func:`logistic_steps`), the softplus against a
50-digit evaluation. Certificates through the new path are compared with the plain search in
tests/test_logistic_binned.py.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import otstab_solvers.logistic_binned as lb
import pytest
from otstab_solvers import logistic_pass
from otstab_solvers.dual import solve_dual
from otstab_solvers.logistic_binned import binned_guess
from otstab_solvers.logistic_uniform import StepTable, uniform_steps
from otstab_solvers.smooth import LogisticOracle, _softplus_at, log1p_unit, logistic_steps
from scipy.special import expit

import otstab
from otstab.errors import SolverError

PRICES = [("kl", 0.25), ("chi2", 0.25), ("kl", math.inf), ("chi2", math.inf)]


def _margins(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.normal(0.8, 2.0, n)
    y = np.where(rng.random(n) < 0.85, 1, -1).astype(np.int8)
    return s, y


@pytest.mark.parametrize("divergence,theta2", PRICES)
@pytest.mark.parametrize("weighted", [False, True])
def test_solve_at_root_equals_the_plain_search(divergence, theta2, weighted):
    s, y = _margins()
    n = s.size
    a, theta1, r = 0.9, 1.0, 1.1
    p = None
    if weighted:
        p = np.random.default_rng(1).uniform(0.1, 2.0, n)
        p /= p.sum()
    ref = solve_dual(LogisticOracle(y * s, a, theta1), r, theta2, divergence, p=p)
    h_c = binned_guess(lambda i, j: y[i:j] * s[i:j], n, a, theta1, r, theta2, divergence, p=p)
    oracle = LogisticOracle.of_scores(s, y, a, theta1)
    sol = logistic_pass.solve_at_root(oracle, n, h_c, r, theta2, divergence, p=p, block=4096)
    assert ref.status == sol.status == "optimal"
    assert sol.value == pytest.approx(ref.value, rel=1e-12)
    assert sol.h == pytest.approx(ref.h, rel=1e-9)
    assert sol.info["passes"] <= 2
    # the kept steps are the maximisers at the returned h (the robust solve's, to rounding)
    t = np.concatenate([oracle.step_rows(sol.h, slice(i, min(i + 4096, n)))[3]
                        for i in range(0, n, 4096)])
    np.testing.assert_allclose(t, logistic_steps(y * s, theta1 / a, sol.h), rtol=1e-12,
                               atol=1e-14)


@pytest.mark.parametrize("divergence,theta2", PRICES[:3])
def test_solve_at_root_newton_steps_and_refusal(divergence, theta2):
    """A start 1e-4 off takes Newton steps to the same root; one outside the window (5 %
    off) is refused (None: the caller searches)."""
    s, y = _margins(seed=2)
    n = s.size
    a, theta1, r = 0.9, 1.0, 1.1
    ref = solve_dual(LogisticOracle(y * s, a, theta1), r, theta2, divergence)
    oracle = LogisticOracle.of_scores(s, y, a, theta1)
    sol = logistic_pass.solve_at_root(oracle, n, ref.h * (1 + 1e-4), r, theta2, divergence)
    assert sol is not None and sol.info["passes"] >= 2
    assert sol.value == pytest.approx(ref.value, rel=1e-12)
    assert sol.h == pytest.approx(ref.h, rel=1e-9)
    assert sol.gap_bound <= 1e-10 * sol.value
    far = logistic_pass.solve_at_root(LogisticOracle.of_scores(s, y, a, theta1), n,
                                      ref.h * 1.05, r, theta2, divergence)
    assert far is None


@pytest.mark.parametrize("divergence,theta2", [("kl", 0.25), ("kl", 30.0), ("kl", math.inf)])
@pytest.mark.parametrize("weighted", [False, True])
def test_curvature_from_the_kept_steps(divergence, theta2, weighted):
    """A pass of an oracle that keeps its steps (Q*'s build reads them) sums no second
    derivative (plain KL, theta2 = inf): the curvature that steers a Newton step is summed
    from the kept steps and losses only when a step is needed, equal to the one the pass
    sums otherwise (rtol 1e-12), and the Newton steps from a start 1e-4 off reach the same
    value and h."""
    s, y = _margins(seed=2)
    n = s.size
    a, theta1, r = 0.9, 1.0, 1.1
    p = None
    if weighted:
        p = np.random.default_rng(1).uniform(0.1, 2.0, n)
        p /= p.sum()
    ref = solve_dual(LogisticOracle(y * s, a, theta1), r, theta2, divergence, p=p)
    h = ref.h * (1 + 1e-4)
    plain = logistic_pass._Pass(LogisticOracle.of_scores(s, y, a, theta1), n, theta2,
                                divergence, p, 4096)
    curv = plain.at(h, r)[2]
    oracle = LogisticOracle.of_scores(s, y, a, theta1)
    oracle.keep_values = True
    seen = []
    rows = oracle.transform_rows
    oracle.transform_rows = lambda hh, sl: seen.append(rows(hh, sl)) or seen[-1]
    lazy = logistic_pass._Pass(oracle, n, theta2, divergence, p, 4096)
    F, g, none, _ = lazy.at(h, r)
    assert none is None and all(out[2] is None for out in seen) and oracle.curvature
    assert (F, g) == pytest.approx(plain.at(h, r)[:2], rel=1e-13)
    assert lazy.curvature(h) == pytest.approx(curv, rel=1e-12)
    sols = [logistic_pass.solve_at_root(LogisticOracle.of_scores(s, y, a, theta1), n, h, r,
                                        theta2, divergence, p=p, block=4096, keep_values=keep)
            for keep in (False, True)]
    assert all(sol is not None and sol.info["passes"] >= 2 for sol in sols)
    assert sols[1].value == pytest.approx(sols[0].value, rel=1e-13)
    assert sols[1].h == pytest.approx(sols[0].h, rel=1e-12)
    assert sols[1].value == pytest.approx(ref.value, rel=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_kl_expm1_sums_of_the_pass(monkeypatch, weighted):
    """Near the base risk (every l_h / theta2 close to the largest: the expm1 form of the
    normalisation), a block whose values lie within EXPM1_SPAN of its largest sums expm1 in
    the pass and the others are summed again after it: the same value whichever blocks do
    (none, some: at a span of 0.1 the first block, which holds a few large losses, does not,
    every one), and the plain search's value at the same h."""
    rng = np.random.default_rng(11)
    n, block, a, theta1, theta2 = 20_000, 4096, 0.9, 1.0, 0.25
    s = rng.normal(0.8, 2.0, n)
    y = np.where(rng.random(n) < 0.85, 1, -1).astype(np.int8)
    s[:5], y[:5] = -40.0, 1
    m = y * s
    p = None
    if weighted:
        p = rng.uniform(0.1, 2.0, n)
        p /= p.sum()
    r = float(np.mean(np.logaddexp(0.0, -m)) if p is None else p @ np.logaddexp(0.0, -m))
    r += 0.01
    ref = solve_dual(LogisticOracle(m, a, theta1), r, theta2, "kl", p=p)
    lh = LogisticOracle(m, a, theta1).evaluate(ref.h)[0] / theta2
    spread = [float(np.ptp(lh[i:i + block])) for i in range(0, n, block)]
    assert spread[0] > 0.1 > max(spread[1:])  # (a span of 0.1: both kinds of block)
    got = {}
    for span in (-1.0, 0.1, math.inf):
        monkeypatch.setattr(logistic_pass, "EXPM1_SPAN", span)
        sol = logistic_pass.solve_at_root(LogisticOracle.of_scores(s, y, a, theta1), n, ref.h,
                                          r, theta2, "kl", p=p, block=block, g_rtol=1.0)
        _, Z, _ = sol.info["kl_weights"]
        assert Z > 0.5 * (n if p is None else 1.0)  # (the expm1 form)
        got[span] = sol.value
    scale = 1e-13 * ref.h * r  # (the value is h r less the term: rounding of h r)
    for v in got.values():
        assert abs(v - got[-1.0]) <= scale
        assert abs(v - ref.value) <= 10 * scale


@pytest.mark.parametrize("h", [0.05, 1.6, 6.4, 40.0])
def test_step_table_starts_near_the_root(h):
    """The table's start is close to the roots outside the two-maxima band (spacing^2 |t''|
    / 8: larger where t* bends sharply, near T = 4), and the lean solve from it gives the
    robust solve's steps."""
    rng = np.random.default_rng(3)
    m = np.concatenate([rng.normal(1.0, 2.0, 30_000), [-25.0, 25.0]])
    c = 1.0
    exact = logistic_steps(m, c, h)
    table = StepTable(m.min(), m.max(), lambda g: logistic_steps(g, c, h))
    u0 = table.start(m)
    u, sg, rest = uniform_steps(m, c, h, u0)
    ok = np.setdiff1d(np.arange(m.size), rest)
    assert ok.size > 0.9 * m.size
    # away from the band (where the step jumps between two maxima) the start is close
    err = np.abs(u0[ok] + m[ok] - exact[ok])
    assert np.median(err) <= 1e-6 and np.quantile(err, 0.99) <= 1e-4
    np.testing.assert_allclose((u + m)[ok], exact[ok], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(sg[ok], expit(u[ok]), rtol=1e-14)
    # the start as steps (what the oracle passes): the same table, the same roots
    t0 = table.start_t(m)
    np.testing.assert_allclose(t0 - m, u0, rtol=0.0, atol=1e-12 * (1.0 + np.abs(m)).max())
    u_t, sg_t, rest_t = uniform_steps(m, c, h, start_t=t0)
    ok_t = np.setdiff1d(np.arange(m.size), rest_t)
    assert ok_t.size > 0.9 * m.size
    np.testing.assert_allclose((u_t + m)[ok_t], exact[ok_t], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(sg_t[ok_t], expit(u_t[ok_t]), rtol=1e-14)


def test_step_table_quadratic_where_linear_is_coarse(monkeypatch):
    """Where the linear table's error (its second differences / 8) is above QUADRATIC_ABOVE
    (T = 2.7: some 5e-8, and a first Halley step fails the Newton bound for most samples),
    the table interpolates quadratically: the start is within 1e-9 of the robust solve's
    steps and one Halley step (one sigmoid per sample) finishes every block; where it is
    small (T = 0.7) it stays linear. Forced either way, both give the same roots."""
    import otstab_solvers.logistic_uniform as lu

    rng = np.random.default_rng(12)
    m = rng.normal(0.1, 1.0, 40_000)
    c = 1.0
    calls: list = []
    real = lu.expit
    monkeypatch.setattr(lu, "expit", lambda x, out=None: calls.append(x.size) or
                        real(x, out=out))
    for h, quad in ((1.4, False), (5.4, True)):
        exact = logistic_steps(m, c, h)
        steps = lambda g, h=h: logistic_steps(g, c, h)  # noqa: E731
        auto = StepTable(m.min(), m.max(), steps)
        assert (auto.half_d2 is not None) == quad
        lin = StepTable(m.min(), m.max(), steps, quadratic=False)
        qd = StepTable(m.min(), m.max(), steps, quadratic=True)
        err_lin = np.abs(lin.start_t(m) - exact).max()
        err_q = np.abs(qd.start_t(m) - exact).max()
        assert err_q <= 1e-9 and err_q < err_lin / 10
        assert (err_lin > lu.QUADRATIC_ABOVE) == quad  # (the estimate agrees)
        for table in (lin, qd):
            calls.clear()
            u, _, rest = uniform_steps(m, c, h, start_t=table.start_t(m))
            assert not rest.size
            np.testing.assert_allclose(u + m, exact, rtol=1e-12, atol=1e-13)
            if table is qd:
                assert sum(calls) == m.size  # (one step)
            elif quad:
                assert sum(calls) >= 2 * m.size  # (the linear start: two)


def test_softplus_from_the_sigmoid():
    rng = np.random.default_rng(4)
    u = np.concatenate([rng.normal(0, 4, 3000), rng.uniform(-740, 740, 300),
                        [0.0, 1e-300, -1e-300, 36.7, -36.7, 700.0, -700.0]])
    ref = np.array([float(mpmath.log1p(mpmath.exp(mpmath.mpf(float(x))))) for x in u])
    got = _softplus_at(u, expit(u))
    # (below 1e-300 the sigmoid underflows to 0 before the loss does: an absolute 1e-300)
    np.testing.assert_allclose(got, ref, rtol=2e-15, atol=1e-300)


def _binary(n=3000, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d) / 2
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    return otstab.LinearModel(coef, 0.2), X, y


@pytest.mark.parametrize("divergence,theta2", PRICES[:3] + [("kl", 30.0)])
def test_sampled_audit_of_the_kept_losses_equals_direct(monkeypatch, divergence, theta2):
    """Through the pass at the binned root, Q*'s build takes each sample's loss at its
    maximiser from the pass (LogisticOracle.kept); above AUDIT_DIRECT_MAX the audit sums
    those and re-scores a sample with the model: the certificate is the direct audit's."""
    import otstab.solve._audit as oa

    model, X, y = _binary()
    monkeypatch.setattr(lb, "MIN_N", 0)
    kw = dict(loss="logistic", r=1.0, theta1=0.7, theta2=theta2, divergence=divergence,
              se=None)
    direct = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(oa, "AUDIT_DIRECT_MAX", 0)
    monkeypatch.setattr(oa, "AUDIT_SAMPLE", 97)
    sampled = otstab.certify(model, X, y, **kw)
    assert "binned_h" in sampled.info
    assert direct.info["audit"]["method"] == "direct"
    assert sampled.info["audit"]["method"] == "sampled"
    assert sampled.info["audit"]["max_rel_error"] <= 1e-12
    assert (sampled.status, sampled.value, sampled.h) == (direct.status, direct.value, direct.h)
    for f in ("risk_star", "total_mass", "primal_cost"):
        assert getattr(sampled, f) == pytest.approx(getattr(direct, f), rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(sampled.loss_star, direct.loss_star, rtol=1e-13)


def test_sampled_audit_refuses_wrong_kept_losses(monkeypatch):
    """Kept losses that disagree with the model at Q*'s points (here 1 % too high) must not
    be passed off: the sampled check fails the audit."""
    from otstab_solvers import smooth

    import otstab.solve._audit as oa

    model, X, y = _binary(seed=1)
    monkeypatch.setattr(lb, "MIN_N", 0)
    monkeypatch.setattr(oa, "AUDIT_DIRECT_MAX", 0)
    honest = smooth.LogisticOracle.kept_vectors

    def inflated(self, h):  # (what Q*'s build takes from the pass)
        got = honest(self, h)
        return None if got is None else (got[0] * 1.01, got[1])

    monkeypatch.setattr(smooth.LogisticOracle, "kept_vectors", inflated)
    # theta2 = inf: unit weights, so the mass and the cost of Q* do not read the losses
    kw = dict(loss="logistic", r=1.0, theta1=0.7, theta2=math.inf, divergence="kl", se=None)
    with pytest.raises(SolverError, match="audit"):
        otstab.certify(model, X, y, **kw)
    # what stopped it is the sampled check: the kept sums alone are consistent
    monkeypatch.setattr(oa, "SAMPLED_RTOL", math.inf)
    res = otstab.certify(model, X, y, **kw)
    assert res.info["audit"]["max_rel_error"] >= 1e-3  # (relative to 1 + loss)


@pytest.mark.parametrize("theta2", [0.25, 1e3])
def test_kept_values_give_the_same_pass(theta2):
    """With ``keep_values`` the plain-KL pass keeps no l_h of its own: where every
    ``l_h / theta2`` is close to the largest (theta2 = 1e3: the expm1 sum) it recomputes l_h
    from the oracle's kept losses and steps; the answer is bit-identical, and Q*'s build can
    take the two kept n-vectors (LogisticOracle.kept_vectors) once."""
    s, y = _margins()
    n = s.size
    a, theta1, r = 0.9, 1.0, 1.1
    h_c = binned_guess(lambda i, j: y[i:j] * s[i:j], n, a, theta1, r, theta2, "kl")
    sols = []
    for keep in (False, True):
        oracle = LogisticOracle.of_scores(s, y, a, theta1)
        sols.append(logistic_pass.solve_at_root(oracle, n, h_c, r, theta2, "kl", block=4096,
                                                keep_values=keep))
        if keep:
            loss, t = oracle.kept_vectors(sols[-1].h)
            assert loss.shape == t.shape == (n,)
            np.testing.assert_allclose(t, logistic_steps(y * s, theta1 / a, sols[-1].h),
                                       rtol=1e-12, atol=1e-14)
            assert oracle.kept_vectors(sols[-1].h) is None  # (taken)
    assert (sols[0].value, sols[0].h) == (sols[1].value, sols[1].h)
    assert sols[0].info["kl_weights"] == sols[1].info["kl_weights"]


def _chi2_case(n=40_000, seed=5, weighted=False):
    rng = np.random.default_rng(seed)
    s = rng.normal(0.9, 1.5, n)
    y = np.where(rng.random(n) < 0.85, 1, -1).astype(np.int8)
    p = None
    if weighted:
        p = rng.uniform(0.1, 2.0, n)
        p[rng.random(n) < 0.05] = 0.0  # (samples of zero weight count nowhere)
        p /= p.sum()
    return s, y, p


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("theta2", [0.25, 0.05])
def test_binned_chi2_root_refines_the_edge(weighted, theta2):
    """chi2's binned root with the bins at the edge of the active set given margin by margin
    (binned_solution) is the exact root (the plain search on the dense oracle) to some
    1e-11, the plain two-point rule's to some 1e-8 here; its alpha is the exact one's."""
    from otstab_solvers.weights import weights_at

    s, y, p = _chi2_case(weighted=weighted)
    n, a, theta1, r = s.size, 0.9, 1.0, 2.5
    m = y * s
    ref = solve_dual(LogisticOracle(m, a, theta1), r, theta2, "chi2", p=p, tol=1e-14)
    w = weights_at(LogisticOracle(m, a, theta1).evaluate(ref.h)[0], theta2, "chi2", p)[0]
    assert 0.1 < np.mean(w > 0) < 0.9  # (an edge inside the margins)
    h, alpha, span = lb.binned_solution(lambda i, j: m[i:j], n, a, theta1, r, theta2, "chi2",
                                        p=p)
    assert span == (m.min(), m.max())
    assert h == pytest.approx(ref.h, rel=1e-10)
    assert alpha == pytest.approx(ref.alpha, rel=1e-10)
    if not weighted:  # (what the refinement buys)
        plain = lb.binned_root(*lb.binned_margins(lambda i, j: m[i:j], n), a, theta1, r,
                               theta2, "chi2")
        assert abs(plain - ref.h) > 1e-9 * ref.h


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("guess", ["binned", "wide band", "off"])
def test_chi2_pass_sums_once(monkeypatch, weighted, guess):
    """chi2 in one pass from a guess of alpha (_Pass._chi2_at) gives the dual of the pass
    that keeps l_h and sums the active-set steps over it (BlockwiseDual.chi2) to 1e-12, and
    its weights' normalisation is that of weight_map on the exact l_h. A guess outside the
    band (``off``) is refused and summed the old way: the same answer; a wide band (1e-2:
    hundreds of rows summed one by one at the edge) changes nothing."""
    from otstab_solvers.weights import weight_map

    if guess == "wide band":
        monkeypatch.setattr(logistic_pass, "CHI2_BAND", 1e-2)

    s, y, p = _chi2_case(weighted=weighted)
    n, a, theta1, theta2, r = s.size, 0.9, 1.0, 0.25, 2.5  # (an edge: 41 % active)
    m = y * s
    h_c, alpha, _ = lb.binned_solution(lambda i, j: m[i:j], n, a, theta1, r, theta2, "chi2",
                                       p=p)
    old = logistic_pass._Pass(LogisticOracle.of_scores(s, y, a, theta1), n, theta2, "chi2",
                              p, 4096)
    F0, g0, c0, al0 = old.at(h_c, r)
    guess_alpha = alpha + 0.3 if guess == "off" else alpha
    new = logistic_pass._Pass(LogisticOracle.of_scores(s, y, a, theta1), n, theta2, "chi2",
                              p, 4096, alpha=guess_alpha)
    F1, g1, c1, al1 = new.at(h_c, r)
    assert F1 == pytest.approx(F0, rel=1e-12)
    assert g1 == pytest.approx(g0, rel=1e-9, abs=1e-12 * r)
    assert c1 == pytest.approx(c0, rel=1e-10)
    assert al1 == pytest.approx(al0, rel=1e-12, abs=1e-14)
    assert new.moved == pytest.approx(old.moved, rel=1e-13)
    if guess == "off":
        assert new.chi2_weights is None and new.passes == 2
        return
    assert new.passes == 1
    lh = LogisticOracle(m, a, theta1).evaluate(h_c)[0]
    wm = weight_map(lh, theta2, "chi2", p)
    shift, alpha_s, term = new.chi2_weights
    assert alpha_s - shift == pytest.approx(wm.alpha, rel=1e-12, abs=1e-14)
    assert term == pytest.approx(wm.term, rel=1e-12)
    assert h_c * r - term == pytest.approx(F1, rel=1e-13)


def test_logistic_loss_values_are_logaddexp():
    """SmoothLoss("logistic").values (the base risk's pass) computes max(-m, 0) +
    log1p(exp(-|m|)) in vectorised passes (the log1p by :func:`log1p_unit`): numpy's
    logaddexp(0, -m) to an ulp or two, exactly at the infinities, the caller's arrays
    untouched."""
    from otstab.modeling._losses import SmoothLoss

    rng = np.random.default_rng(6)
    s = np.concatenate([rng.normal(0, 5, 5000), [0.0, -0.0, 1e-300, 745.0, -745.0, 1e308,
                                                 -1e308, np.inf, -np.inf]])
    y = np.where(rng.random(s.size) < 0.5, 1, -1).astype(np.int8)
    s0, y0 = s.copy(), y.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        got = SmoothLoss("logistic").values(s, y)
        ref = np.logaddexp(0.0, -(y * s))
    np.testing.assert_allclose(got, ref, rtol=4e-16, atol=0.0)
    inf = np.isinf(ref) | (ref == 0.0)
    np.testing.assert_array_equal(got[inf], ref[inf])
    np.testing.assert_array_equal(s, s0)
    np.testing.assert_array_equal(y, y0)


def test_log1p_unit_against_50_digits():
    """log1p_unit (log1p of [0, 1] from numpy's vectorised log and one correction) against a
    50-digit log1p, from 1 down to the subnormals; NaN stays NaN."""
    rng = np.random.default_rng(8)
    q = np.concatenate([rng.random(2000), 10.0 ** rng.uniform(-320, 0, 2000),
                        [0.0, 1.0, 5e-324, 2.0 ** -53, 2.0 ** -52, 1.5 * 2.0 ** -53,
                         np.nextafter(1.0, 0.0), 0.5]])
    with mpmath.workdps(50):
        ref = np.array([float(mpmath.log1p(mpmath.mpf(float(x)))) for x in q])
    got = log1p_unit(q)
    np.testing.assert_allclose(got, ref, rtol=3e-16, atol=0.0)
    assert math.isnan(float(log1p_unit(np.array([np.nan]))[0]))


def test_chi2_keeps_no_more_than_kl(monkeypatch):
    """chi2's pass sums once (no l_h, dl, d2l kept for its active-set steps): the peak extra
    memory of its certificate is KL's up to a few blocks (was 1.2 n-vectors more here, 1.9 at
    n = 1e6; tracemalloc)."""
    import tracemalloc

    import otstab.solve._audit as oa

    monkeypatch.setattr(oa, "AUDIT_DIRECT_MAX", 0)  # (the audit of large n: sampled atoms)
    rng = np.random.default_rng(7)
    n, d = 70_000, 3  # (above logistic_binned.MIN_N)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d)
    y = np.where(X @ coef + 0.5 * rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    r = 0.7
    peaks = {}
    for div in ("kl", "chi2"):
        kw = dict(loss="logistic", r=r, theta1=1.0, theta2=0.25, divergence=div, se=None)
        otstab.certify(model, X, y, **kw)  # (what the first call allocates once)
        tracemalloc.start()
        res = otstab.certify(model, X, y, **kw)
        peaks[div] = tracemalloc.get_traced_memory()[1] / (8 * n)
        tracemalloc.stop()
        assert res.status == "optimal" and "binned_h" in res.info
    # (a few blocks of temporaries more: 0.2 n-vectors at this n; the kept l_h, dl, d2l of
    # the old pass: 1.2)
    assert peaks["chi2"] <= peaks["kl"] + 0.5, peaks


@pytest.mark.parametrize("theta2", [0.25, 1e3, math.inf])
def test_weighted_pass_sums_as_blockwise(theta2):
    """With sample weights (5 % of them 0) the pass sums KL and theta2 = inf itself (no l_h,
    dl, d2l kept for BlockwiseDual): the dual at h is BlockwiseDual's over the same rows to
    1e-12 (theta2 = 1e3: the expm1 branch), and the weights' normalisation that of
    weight_map on the exact l_h."""
    from otstab_solvers.blockwise import BlockwiseDual, RowsBlock, in_memory
    from otstab_solvers.weights import weight_map

    s, y, p = _chi2_case(n=30_000, weighted=True)
    n, a, theta1, r = s.size, 0.9, 1.0, 1.4
    h = 1.3
    run = logistic_pass._Pass(LogisticOracle.of_scores(s, y, a, theta1), n, theta2, "kl", p,
                              4096)
    F, g, curv, _ = run.at(h, r)
    ref_oracle = LogisticOracle(y * s, a, theta1)
    blocks = [RowsBlock(ref_oracle, i, min(i + 4096, n), p[i:i + 4096])
              for i in range(0, n, 4096)]
    term, mu, curv_ref, _, _ = BlockwiseDual(in_memory(blocks), n, 1.0, kinks=False).reduce(
        h, "right", theta2, "kl")
    assert F == pytest.approx(h * r - term, rel=1e-12)
    assert g == pytest.approx(r - mu, rel=1e-12, abs=1e-13)
    assert curv == pytest.approx(curv_ref, rel=1e-10)
    assert run.moved == pytest.approx(float(np.dot(p, ref_oracle.evaluate(h)[1])), rel=1e-13)
    wm = weight_map(ref_oracle.evaluate(h)[0], theta2, "kl", p)
    if math.isinf(theta2):
        assert run.unit_term == pytest.approx(wm.term, rel=1e-13)
        return
    M, Z, term_kl = run.kl_weights
    assert (M, Z, term_kl) == pytest.approx((wm.shift, wm.scale, wm.term), rel=1e-12)
