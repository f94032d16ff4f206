"""Property-based audit of ``certify`` and ``feature_stability`` (issue 12).

Real scikit-learn models (and nothing else) on small random data drawn by hypothesis, over the
losses x divergences x prices 1e-6 .. 1e12 and inf. Every answer is checked against an audit
recomputed here, independently of otstab's internals: the loss of every atom of Q* comes from
the model's own ``predict`` / ``decision_function`` / ``predict_proba`` and the formulas below,
the cost from the cost function of the paper. Under the ``ci`` profile (conftest.py) the
examples are derandomized; every counterexample found is pinned as an ``@example``.
"""

from __future__ import annotations

import decimal
import functools
import math
import warnings

import numpy as np
import otstab_solvers.dual as sd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression, QuantileRegressor
from sklearn.svm import LinearSVC

import otstab
import otstab.solve._piecewise as pw
from otstab.modeling._losses import pinball

TAU = 0.3  # the pinball level
PRICES = [1e-6, 1e-3, 1.0, 1e3, 1e6, 1e12, math.inf]
#: docs/math.md: r is reached by the data (value 0) when r <= base (issue 27: no 1e-8 band;
#: above the base risk the value is positive, or an interval from 0 where it is not resolved)
REACHED_RTOL = 0.0
RTOL = 1e-6  # the audit tolerance (otstab.audit.AUDIT_RTOL)
#: prices at which every well-conditioned instance must be answered (outside this range a
#: refusal, SolverError, is allowed where double precision cannot resolve the value)
MODERATE = (1e-3, 1e3)

# case name -> (the loss passed to certify, the kind of labels, the scikit-learn model)
CASES = {
    "hinge": ("hinge", "binary", lambda: LinearSVC(C=1.0)),
    "zero_one": ("zero_one", "binary", lambda: LinearSVC(C=1.0)),
    "zero_one_multiclass": ("zero_one", "multiclass", lambda: LogisticRegression()),
    "logistic": ("logistic", "binary", lambda: LogisticRegression()),
    "multiclass_hinge": ("multiclass_hinge", "multiclass", lambda: LogisticRegression()),
    "cross_entropy": ("cross_entropy", "multiclass", lambda: LogisticRegression()),
    "absolute": ("absolute", "regression", LinearRegression),
    "squared": ("squared", "regression", LinearRegression),
    "pinball": (pinball(TAU), "regression",
                lambda: QuantileRegressor(quantile=TAU, alpha=0.0, solver="highs")),
}


@functools.lru_cache(maxsize=512)
def make_case(case, n, d, seed, dead=False):
    """(model, X, y): n samples in d dimensions from a noisy linear rule, the model fitted on
    them. Binary labels are 2/5 (not -1/+1: the mapping is part of what is tested), multiclass
    0/1/2, every class present. ``dead``: the last column is all zeros, so the fitted model
    gives it a zero coefficient."""
    kind = CASES[case][1]
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if dead:
        X[:, -1] = 0.0
    B = rng.normal(size=(d, 3))
    noise = rng.normal(size=(n, 3))
    if kind == "regression":
        y = X @ B[:, 0] + 0.5 * noise[:, 0]
    elif kind == "binary":
        y = np.where(X @ B[:, 0] + noise[:, 0] > 0, 5, 2)
        y[:2] = [2, 5]
    else:
        y = np.argmax(X @ B + noise, axis=1)
        y[:3] = [0, 1, 2]
    model = CASES[case][2]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    X.setflags(write=False)
    y.setflags(write=False)
    return model, X, y


def model_losses(model, case, X, y):
    """The loss of every row of (X, y), from the model's own outputs and the textbook formula."""
    if case in ("hinge", "logistic"):
        ypm = np.where(y == model.classes_[1], 1.0, -1.0)  # classes_[1] is the +1 class
        m = ypm * model.decision_function(X)
        return np.maximum(0.0, 1.0 - m) if case == "hinge" else np.logaddexp(0.0, -m)
    if case.startswith("zero_one"):
        return (model.predict(X) != y).astype(float)
    if case in ("absolute", "squared", "pinball"):
        e = y - model.predict(X)
        return {"absolute": np.abs(e), "squared": e * e,
                "pinball": np.maximum(TAU * e, (TAU - 1.0) * e)}[case]
    k = np.searchsorted(model.classes_, y)
    rows = np.arange(len(y))
    if case == "multiclass_hinge":  # Crammer-Singer: max_k (1[k != y] + s_k - s_y)
        S = model.decision_function(X)
        M = 1.0 + S - S[rows, k][:, None]
        M[rows, k] = 0.0
        return M.max(axis=1)
    # cross-entropy -log p_y; where p_y underflows to 0 (a point moved far), the same quantity
    # from the multinomial model's scores: p = softmax(decision_function)
    with np.errstate(divide="ignore"):
        ce = -np.log(model.predict_proba(X)[rows, k])
    S = model.decision_function(X)
    return np.where(np.isfinite(ce), ce, logsumexp(S, axis=1) - S[rows, k])


EPS = np.finfo(float).eps


def rounding(model, case, X, y, losses):
    """Per-row bound on the rounding error of a loss evaluated in double precision,
    8 eps (1 + |y| + |s|) (1 + l) with s the model's largest absolute score; 0 where the loss is
    exactly 0 (clipped by a max) and for the 0/1 loss (exactly 0 or 1). Two faithful evaluations
    of one loss (here and in otstab) may differ by that much, so no property may hinge on
    smaller differences (e.g. a regression that interpolates 3 points has residuals ~1e-16)."""
    if case.startswith("zero_one"):
        return np.zeros(len(y))
    regression = CASES[case][1] == "regression"
    S = model.predict(X) if regression else model.decision_function(X)
    scale = 1.0 + np.abs(S).reshape(len(y), -1).max(axis=1) + (np.abs(y) if regression else 0.0)
    return np.where(losses > 0, 8 * EPS * scale * (1.0 + losses), 0.0)


def phi(w, divergence):
    """phi_chi2 = (w - 1)^2; phi_KL = w log w - w + 1 evaluated in 40-digit decimal arithmetic
    (in double precision it cancels to rounding noise for w close to 1, which a large theta2
    would turn into cost)."""
    if divergence == "chi2":
        return (w - 1.0) ** 2
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        out = []
        for v in np.asarray(w, dtype=float).tolist():
            dv = decimal.Decimal(v)
            out.append(float(dv * dv.ln() - dv + 1) if v > 0 else 1.0)
    return np.array(out)


def independent_audit(model, X, y, res, loss, theta1, theta2, divergence):
    """Cost, risk and total mass of Q* = (1/n) sum_k mass_k w_k delta_(X_star[k]) (atom k comes
    from sample source[k]), recomputed from the model and the cost function; plus the largest
    squared move and the largest |w - 1| over the atoms that carry mass (a price of inf must
    leave that part of the perturbation out)."""
    n = len(y)
    src = np.asarray(res.source)
    mass = np.asarray(res.mass, dtype=float)
    w = np.asarray(res.weights, dtype=float)
    Xs = np.asarray(res.X_star, dtype=float)
    d2 = np.sum((Xs - X[src]) ** 2, axis=1)
    loss_star = model_losses(model, loss, Xs, y[src])
    err_star = rounding(model, loss, Xs, y[src], loss_star)
    move = 0.0 if math.isinf(theta1) else theta1 * float(np.sum(mass * w * d2)) / n
    rew = 0.0 if math.isinf(theta2) else theta2 * float(np.sum(mass * phi(w, divergence))) / n
    carries = mass > 0
    return {
        "cost": move + rew,
        "risk": float(np.sum(mass * w * loss_star)) / n,
        "risk_rounding": float(np.sum(mass * w * err_star)) / n,
        "mass": float(np.sum(mass * w)) / n,
        "max_move": float(np.max(d2[carries], initial=0.0)),
        "max_reweight": float(np.max(np.abs(w[carries] - 1.0), initial=0.0)),
    }


def reached(r, base, err=0.0):
    """True / False when r is reached / not reached by the data under the rule of docs/math.md
    whichever faithful evaluation of the base risk (within err of ``base``) is used; None in
    between (either answer is right)."""
    if r <= base * (1 + REACHED_RTOL) - err:
        return True
    if r > (base + err) * (1 + REACHED_RTOL):
        return False
    return None


def threshold(model, case, X, y, u):
    """(r, base risk, its rounding bound, largest loss): r = base + u (lmax - base) (u = 0:
    exactly the base risk, u = 1: exactly the largest loss, up to 1.2: a bit above it), an error
    rate <= 1 for the 0/1 loss."""
    losses = model_losses(model, case, X, y)
    base, lmax = float(np.mean(losses)), float(np.max(losses))
    err = float(np.mean(rounding(model, case, X, y, losses)))
    span = lmax - base if lmax > base else 1.0
    r = base if u == 0 else lmax if (u == 1 and lmax > base) else base + u * span
    return (min(r, 1.0) if case.startswith("zero_one") else r), base, err, lmax


def certify(model, X, y, case, r, theta1, theta2, divergence, **kw):
    return otstab.certify(model, X, y, loss=CASES[case][0], r=r, theta1=theta1, theta2=theta2,
                          divergence=divergence, **kw)


def well_conditioned(thetas, base, lmax, err):
    """Moderate prices (or inf) and losses well above their own rounding: here certify must
    answer. Elsewhere (prices 1e-6 or 1e6..1e12 against losses of order 1, regressions that
    interpolate their data so that every residual is rounding noise) it may refuse."""
    moderate = all(math.isinf(t) or MODERATE[0] <= t <= MODERATE[1] for t in thetas)
    return moderate and lmax > 1e-6 and lmax - base > 1e-6 * lmax and err < 1e-9 * lmax


def answer(model, X, y, case, r, thetas, divergence, conditioned, **kw):
    """certify's result, or None when it refuses the instance (SolverError) -- allowed only
    where the instance is not well conditioned."""
    try:
        return certify(model, X, y, case, r, *thetas, divergence, **kw)
    except otstab.errors.SolverError:
        assert not conditioned, "a well-conditioned instance was refused"
        return None


def dual_floor(res):
    """An absolute floor for comparing values: 1e-12 h r. The dual value h r - Lambda(h) is the
    difference of two numbers of size ~h r (the price h of risk times the risk), so double
    precision resolves it only to a few thousand ulps of h r; below that nothing is meaningful.
    It vanishes with h, so the tolerance stays relative for tiny values (which are h (r - base)
    / 2 to first order: still ~1e-12 relative when r - base ~ 1e-6 r)."""
    return 1e-12 * res.h * res.r if math.isfinite(res.h) else 0.0


def check_result(model, X, y, case, res, base, err, lmax):
    """The result is explicit (status and value agree) and, when optimal, passes the audit."""
    r, theta1, theta2, div = res.r, res.theta1, res.theta2, res.divergence
    assert res.value >= 0, res.value
    if res.status == "unreachable":
        assert res.value == math.inf
        # reachable by moving whenever moving is allowed and changes the loss (every loss here
        # but 0/1 is unbounded in x; 0/1 reaches any r <= 1); else reweighting reaches lmax
        can_move = math.isfinite(theta1) and bool(np.any(np.asarray(model.coef_) != 0))
        assert not can_move, "unreachable although samples can move"
        assert reached(r, base, err) is not True
        assert math.isinf(theta2) or r > lmax * (1 - REACHED_RTOL)
        return
    assert res.status in ("optimal", "zero", "bounds", "found"), res.status
    if res.status in ("bounds", "found"):
        assert res.exact is False
        return
    zero = reached(r, base, err)
    if zero is not None:
        assert (res.value == 0) == zero, (res.status, res.value, r, base)
    if res.status == "zero":
        assert res.value == 0
        return
    a = independent_audit(model, X, y, res, case, theta1, theta2, div)
    assert abs(a["mass"] - 1) <= 1e-9, a["mass"]
    assert a["risk"] >= r * (1 - RTOL) - a["risk_rounding"], (a["risk"], r)
    assert abs(a["cost"] - res.value) <= RTOL * res.value + dual_floor(res), (a["cost"], res.value)
    if math.isinf(theta1):
        assert a["max_move"] == 0.0, a["max_move"]
    if math.isinf(theta2):
        assert a["max_reweight"] == 0.0, a["max_reweight"]


def le(a, b):
    """a <= b up to a relative 2e-6 (inf <= inf): each value is certified to a relative 1e-6
    (its audit), so two values can be ordered only up to the sum of their tolerances (the 0/1
    dual and closed form, for example, agree to about 2e-9)."""
    return a <= b or a - b <= 2e-6 * abs(b)


# one hypothesis run per loss, so that each loss reports its own failures
over_losses = pytest.mark.parametrize("case", sorted(CASES))
sizes = st.integers(3, 60)
dims = st.integers(1, 4)
seeds = st.integers(0, 2**16)
prices = st.sampled_from(PRICES)
price_pairs = st.tuples(prices, prices).filter(lambda t: not (math.isinf(t[0]) and
                                                              math.isinf(t[1])))
divergences = st.sampled_from(["kl", "chi2"])
positions = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.2))


@over_losses
@settings(max_examples=25)
@given(n=sizes, d=dims, seed=seeds, thetas=price_pairs, divergence=divergences, u=positions)
# found on current main (first with the absolute loss; run for every loss):
# 3 points in 2-D interpolated by the regression, r at the largest residual ~4e-16 (rounding)
@example(n=3, d=2, seed=0, thetas=(1e-6, 1e6), divergence="chi2", u=1.0)
@example(n=3, d=2, seed=0, thetas=(1e-6, 1e-6), divergence="kl", u=1.0)
# SolverError: every solver failed (dual inaccurate, conic ones "unbounded")
@example(n=3, d=1, seed=0, thetas=(1e-3, 1e12), divergence="kl", u=1.0)
# a negative value -1.01e-7
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e12), divergence="kl", u=1.0)
# primal cost 1.01059e-7 vs value 1.01113e-7 (5e-4 relative) accepted as "optimal"
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e6), divergence="kl", u=1.0)
# cross_entropy: IndexError inside certify (chi2, theta2 = 1e-6)
@example(n=3, d=1, seed=0, thetas=(1e12, 1e-6), divergence="chi2", u=1.125)
# cross_entropy, zero_one_multiclass: total mass of Q* 0.9999999983 (chi2, theta2 = 1e-6)
@example(n=3, d=1, seed=0, thetas=(1e3, 1e-6), divergence="chi2", u=1.125)
@example(n=3, d=1, seed=0, thetas=(1e3, 1e-6), divergence="chi2", u=1.0)
# cross_entropy: cost 8.16029e-8 vs value 8.16037e-8; squared: 7.129826e-8 vs 7.129810e-8;
# multiclass_hinge: 8.0525e-20 vs 8.0510e-20 (all accepted: the gap is taken against max(1, v))
@example(n=3, d=1, seed=0, thetas=(1e-6, 1.0), divergence="chi2", u=1.0)
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e3), divergence="chi2", u=1.0)
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e-6), divergence="kl", u=1e-6)
# zero_one_multiclass: value -1.1e-11; a Q* of cost 0 (no move reaches r) for a value 1.5e-22
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e6), divergence="kl", u=1e-9)
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e-6), divergence="kl", u=1e-9)
# found by the dev profile (zero_one_multiclass): the point pushed past the boundary by an
# absolute 1e-9 cost 1.5e-6 relative for a small margin (now a relative push)
@example(n=10, d=1, seed=1, thetas=(1e-3, 1e-3), divergence="kl", u=1.0)
def test_every_answer_is_explicit_and_optimal_ones_pass_the_audit(case, n, d, seed, thetas,
                                                                   divergence, u):
    model, X, y = make_case(case, n, d, seed)
    r, base, err, lmax = threshold(model, case, X, y, u)
    res = answer(model, X, y, case, r, thetas, divergence,
                 well_conditioned(thetas, base, lmax, err))
    if res is not None:
        check_result(model, X, y, case, res, base, err, lmax)


@settings(max_examples=60)
@given(n=sizes, d=dims, seed=seeds, thetas=price_pairs, divergence=divergences, u=positions)
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e12), divergence="kl", u=1.0)
@example(n=3, d=1, seed=0, thetas=(1e-3, 1e12), divergence="kl", u=1.0)
@example(n=10, d=2, seed=1, thetas=(1e12, 1e-6), divergence="kl", u=0.5)
@example(n=10, d=2, seed=1, thetas=(1.0, math.inf), divergence="chi2", u=0.5)
def test_hinge_through_the_large_data_forms_passes_the_audit(n, d, seed, thetas, divergence,
                                                              u):
    """The hinge certificate through the forms that large data takes (above 2^17 rows the
    dual on a window of sorted keys, ``solve_two_piece``; above 200,000 rows Q* summed from
    the keys and the sampled check, ``piecewise._build_keyed``), forced here at any size and
    audited from the model's own decision_function across prices."""
    model, X, y = make_case("hinge", n, d, seed)
    r, base, err, lmax = threshold(model, "hinge", X, y, u)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sd, "WINDOW_MIN_N", 0)
        m.setattr(pw, "AUDIT_DIRECT_MAX", 0)
        res = answer(model, X, y, "hinge", r, thetas, divergence,
                     well_conditioned(thetas, base, lmax, err))
    if res is not None:
        check_result(model, X, y, "hinge", res, base, err, lmax)


@over_losses
@settings(max_examples=10)
@given(n=sizes, d=dims, seed=seeds, thetas=price_pairs, divergence=divergences, u1=positions,
       u2=positions)
# found on current main with the absolute loss: SolverError at r = lmax; value(lmax) < 0
@example(n=3, d=1, seed=0, thetas=(1e-3, 1e12), divergence="kl", u1=0.0, u2=1.0)
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e12), divergence="kl", u1=0.0, u2=1.0)
# pinball: SolverError at r = base + (lmax - base) / 2; zero_one: value 2.2e-4 at r = 2/3 but
# 0 at r = 1 (theta2 = 1e12)
@example(n=3, d=1, seed=0, thetas=(1e-3, 1e12), divergence="kl", u1=0.0, u2=0.5)
@example(n=3, d=1, seed=0, thetas=(1e-6, 1e12), divergence="kl", u1=1.0, u2=0.5)
# numpy 1.24 (the oldest allowed) sums the base risk 1 ulp lower than the test's: r1 is just
# above it and cross_entropy answers the interval [0, inf]
@example(n=3, d=1, seed=5, thetas=(1e-6, 1e-6), divergence="kl", u1=0.0, u2=1.0)
def test_monotone_in_r(case, n, d, seed, thetas, divergence, u1, u2):
    model, X, y = make_case(case, n, d, seed)
    (r1, base, err, lmax), (r2, *_) = sorted(threshold(model, case, X, y, u) for u in (u1, u2))
    ok = well_conditioned(thetas, base, lmax, err)
    res1 = answer(model, X, y, case, r1, thetas, divergence, ok)
    res2 = answer(model, X, y, case, r2, thetas, divergence, ok)
    if res1 is not None and res2 is not None:
        # R(r1) <= R(r2): the certified lower end at r1 is below the found upper end at r2
        # (both equal value for exact answers; a `bounds` answer just above the base risk may
        # be the honest interval [0, inf] where double precision cannot resolve r - base)
        assert le(res1.value_lower, res2.value_upper), (r1, res1.value_lower, r2,
                                                        res2.value_upper)
        if res1.exact and res2.exact:
            assert le(res1.value, res2.value), (r1, res1.value, r2, res2.value)


@over_losses
@settings(max_examples=10)
@given(n=sizes, d=dims, seed=seeds, which=st.sampled_from([0, 1]), other=prices,
       divergence=divergences, u=positions,
       pair=st.lists(prices, min_size=2, max_size=2, unique=True))
# found on current main with the absolute loss: SolverError; value(theta2 = 1e12) < 0
@example(n=3, d=1, seed=0, which=1, other=1e-3, divergence="kl", u=1.0, pair=[1e-6, 1e12])
@example(n=3, d=1, seed=0, which=1, other=1e-6, divergence="kl", u=1.0, pair=[1e-6, 1e12])
# zero_one at r = 1: value 1.7917595e-6 at theta1 = 1e-6 but 1.7917482e-6 at theta1 = 1e3
@example(n=6, d=1, seed=0, which=0, other=1e-6, divergence="kl", u=1.0, pair=[1e-6, 1e3])
# found by the dev profile (pinball, r 1e-14 of the way above the base risk): two `bounds`
# answers whose found values (upper ends, ~4e-38) were compared as if exact; their intervals
# [1.9e-38, 4.7e-38] and [1.9e-38, 4.2e-38] are ordered as the property says
@example(n=3, d=1, seed=2, which=1, other=1e-6, divergence="kl", u=1e-14, pair=[1e-6, 1e-3])
def test_monotone_in_theta1_and_theta2(case, n, d, seed, which, other, divergence, u, pair):
    """With the other price fixed, raising theta1 (which = 0) or theta2 (which = 1) never
    lowers the value: the certified lower end at the lower price is below the found upper end
    at the higher one, and the values are ordered where both answers are exact."""
    model, X, y = make_case(case, n, d, seed)
    r, base, err, lmax = threshold(model, case, X, y, u)
    got = []
    for t in sorted(pair):
        thetas = (t, other) if which == 0 else (other, t)
        if math.isinf(thetas[0]) and math.isinf(thetas[1]):
            return
        res = answer(model, X, y, case, r, thetas, divergence,
                     well_conditioned(thetas, base, lmax, err))
        if res is None:
            return
        got.append(res)
    lo, hi = got
    assert le(lo.value_lower, hi.value_upper), (pair, lo.value_lower, hi.value_upper)
    if lo.exact and hi.exact:
        assert le(lo.value, hi.value), (pair, lo.value, hi.value)


# cross_entropy's 10 examples take about 25 s (a multiclass smooth certificate per feature):
# run with the slow tests; the other losses keep this property in the default run
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow)
                                  if c == "cross_entropy" else c for c in sorted(CASES)])
@settings(max_examples=10)
@given(n=sizes, d=dims, seed=seeds, dead=st.booleans(), thetas=price_pairs,
       divergence=divergences, u=positions)
# found on current main with the absolute loss: a feature with a zero coefficient is scored inf
# by feature_stability, certify(features=[j]) answers 0 (r = base) or the reweighting value
@example(n=3, d=1, seed=0, dead=True, thetas=(1e-6, 1e-6), divergence="kl", u=0.0)
# every loss: with theta1 = inf every feature is scored inf, certify answers 0 at r = base
@example(n=3, d=1, seed=0, dead=False, thetas=(math.inf, 1e-6), divergence="kl", u=0.0)
# zero_one: a zero-coefficient feature scored inf, certify gives the reweighting value at r = 1
@example(n=3, d=1, seed=0, dead=True, thetas=(1e-6, 1e-6), divergence="kl", u=1.0)
# found by the dev profile (zero_one): at r = 1 the value 9e-4 was refused as below the
# resolution of h r = 2e6 (now computed in closed form as -T(-a), without that cancellation)
@example(n=15, d=2, seed=0, dead=False, thetas=(1000.0, 0.001), divergence="kl", u=1.0)
def test_feature_stability_equals_certify_per_feature(case, n, d, seed, dead, thetas,
                                                      divergence, u):
    model, X, y = make_case(case, n, d, seed, dead)
    r, base, err, lmax = threshold(model, case, X, y, u)
    # (just above the base risk the values are below the dual's resolution: certify answers
    # a certified interval, feature scores have none and may be refused; issue 27)
    ok = well_conditioned(thetas, base, lmax, err) and not 0 < r - base <= 1e-8 * r
    try:
        df = otstab.feature_stability(model, X, y, loss=CASES[case][0], r=r, theta1=thetas[0],
                                      theta2=thetas[1], divergence=divergence).to_frame()
    except otstab.errors.SolverError:
        assert not ok, "feature_stability refused a well-conditioned instance"
        return
    score = dict(zip(df["feature"], df["score"]))
    for j in range(d):
        res = answer(model, X, y, case, r, thetas, divergence, ok, features=[j])
        if res is None:
            continue
        s = score[res.feature_names[j]]
        assert s == res.value or abs(s - res.value) <= RTOL * res.value + dual_floor(res), (
            j, s, res.value, res.status)
