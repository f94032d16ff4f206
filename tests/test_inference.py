"""Sampling uncertainty of R (otstab.inference): influence function, SE, intervals, bootstrap.

Independent references: the influence function against a central finite difference of certify
on reweighted data (one row duplicated / removed); the intervals' coverage against the value on
a 2e6-row sample of the same population; the analytic SE against the bootstrap SE; the fast
bootstrap replicate against certify on the resampled rows.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

import otstab
from otstab.errors import ValidationError
from otstab.modeling._losses import get_loss
from otstab.modeling._models import resolve_model
from otstab.solve._inference import Bootstrap, Inference, influence, replicator

BETA = np.array([1.0, -0.5, 0.25])
MODEL = otstab.LinearModel(BETA, 0.1)


def population(n, seed):
    """Gaussian features, logistic labels from 2 x . BETA; the model is fixed (MODEL)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-2 * (X @ BETA))), 1, -1)
    return X, y


# r well above the base risk (hinge base risk ~0.51, 0/1 base error ~0.20 in this population)
CASES = {
    "hinge_kl": dict(loss="hinge", r=1.0, theta2=0.25, divergence="kl"),
    "hinge_chi2": dict(loss="hinge", r=1.0, theta2=0.25, divergence="chi2"),
    "zero_one_kl": dict(loss="zero_one", r=0.4, theta2=0.25, divergence="kl"),
    "theta1_inf": dict(loss="hinge", r=1.0, theta1=math.inf, theta2=0.25, divergence="kl"),
}

FD_CASES = [
    *CASES.values(),
    dict(loss="hinge", r=1.0, theta2=math.inf),
    dict(loss="hinge", r=1.0, theta1=math.inf, theta2=0.5, divergence="chi2"),
    dict(loss="zero_one", r=0.35, theta2=0.5, divergence="chi2"),
    dict(loss="zero_one", r=0.35, theta2=math.inf),
    dict(loss="logistic", r=1.0, theta2=0.25),
    dict(loss="multiclass_hinge", r=1.0, theta2=0.25, divergence="chi2"),
]


@pytest.mark.parametrize("kw", FD_CASES, ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_influence_matches_finite_difference(kw):
    # P + eps (delta_j - P) is the data tiled k times with one copy of row j added
    # (eps = 1/(kn+1)) or removed (eps = -1/(kn-1)); the difference of R over the two is
    # IF(z_j) + O(eps) (O(eps^2) where the optimum h moves smoothly; a kink of l_h at the
    # optimum or weights concentrated on a few rows leave an O(eps) asymmetry)
    X, y = population(200, 3)
    n, k = y.size, 8
    res = otstab.certify(MODEL, X, y, **kw)
    infl = influence(res)
    Xt, yt = np.tile(X, (k, 1)), np.tile(y, k)
    # rows with the smallest, largest and median influence, plus a few others
    order = np.argsort(infl)
    rows = sorted({int(order[0]), int(order[-1]), int(order[n // 2]), 5, 17})
    for j in rows:
        up = otstab.certify(MODEL, np.vstack([Xt, X[j]]), np.append(yt, y[j]), se=None, **kw)
        keep = np.arange(k * n) != j
        down = otstab.certify(MODEL, Xt[keep], yt[keep], se=None, **kw)
        fd = (up.value - down.value) / (1 / (k * n + 1) + 1 / (k * n - 1))
        assert fd == pytest.approx(infl[j], abs=2e-2 * np.max(np.abs(infl)) + 1e-12), j
    assert res.se == pytest.approx(np.std(infl) / math.sqrt(n))
    assert abs(np.mean(infl)) < 1e-9 * (1 + np.max(np.abs(infl)))


def test_interval_and_bound_follow_the_normal_approximation():
    X, y = population(1000, 0)
    res = otstab.certify(MODEL, X, y, **CASES["hinge_kl"])
    z95 = NormalDist().inv_cdf(0.975)
    assert res.ci() == pytest.approx((res.value - z95 * res.se, res.value + z95 * res.se))
    lo90, hi90 = res.ci(0.9)
    lo99, hi99 = res.ci(0.99)
    assert lo99 < lo90 < res.value < hi90 < hi99
    # one-sided 95% bound = the low end of the two-sided 90% interval
    assert res.lower_confidence_bound(0.95) == pytest.approx(lo90)
    assert "sampling SE" in res.summary()
    for bad in (0, 1, 1.5, "x"):
        with pytest.raises(ValidationError, match="level"):
            res.ci(bad)


def test_edge_statuses():
    X, y = population(300, 1)
    zero = otstab.certify(MODEL, X, y, loss="hinge", r=0.1)
    assert zero.status == "zero" and zero.se == 0.0 and zero.ci() == (0.0, 0.0)
    assert zero.inference.reliable
    # r just below the base risk: R = 0 here, but maybe not in the population
    near = otstab.certify(MODEL, X, y, loss="hinge", r=zero.risk_base * 0.999)
    assert near.status == "zero" and not near.inference.reliable
    assert "base risk" in near.inference.note
    unreach = otstab.certify(MODEL, X, y, loss="hinge", r=50.0, theta1=math.inf)
    assert unreach.status == "unreachable"
    assert unreach.se == math.inf and unreach.ci() == (0.0, math.inf)
    assert unreach.lower_confidence_bound() == 0.0
    bounds = otstab.certify(MODEL, X, y, loss="logistic", r=1.0, solver="first_order")
    assert bounds.status == "bounds" and math.isfinite(bounds.se)
    assert "not exact" in bounds.inference.note and not bounds.inference.reliable
    assert math.isnan(otstab.certify(MODEL, X, y, loss="hinge", r=1.0, se=None).se)


def test_limit_case_influence_is_the_closed_form():
    # theta1 = inf and r = the largest loss: R = -theta2 log p (KL), p the share of rows of
    # largest loss, so IF(z) = -theta2 (1{top}/p - 1)
    X, y = population(200, 2)
    losses = otstab.models.per_sample_losses(MODEL, X, y, "hinge")
    res = otstab.certify(MODEL, X, y, loss="hinge", r=float(losses.max()), theta1=math.inf)
    assert math.isinf(res.h)
    top = losses >= losses.max() * (1 - 1e-12)
    p = top.mean()
    assert influence(res) == pytest.approx(-0.25 * (top / p - 1))
    assert not res.inference.reliable


def test_bootstrap_replicate_equals_certify_on_resampled_rows():
    X, y = population(500, 4)
    rng = np.random.default_rng(0)
    for kw in [*CASES.values(), dict(loss="hinge", r=0.3), dict(loss="logistic", r=1.0),
               dict(loss="hinge", r=50.0, theta1=math.inf)]:
        kw = {"theta1": 1.0, "theta2": 0.25, "divergence": "kl", **kw}
        loss = kw.pop("loss")
        prob = resolve_model(MODEL, X, y, loss=get_loss(loss))
        value = replicator(prob, mask=None, solver="auto", **kw)
        for _ in range(3):
            idx = rng.integers(0, 500, 500)
            ref = otstab.certify(MODEL, X[idx], y[idx], loss=loss, se=None, **kw).value
            assert value(idx) == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_bootstrap_result_and_intervals():
    X, y = population(800, 5)
    Xc, yc = X.copy(), y.copy()
    spec = Bootstrap(n_resamples=60, random_state=3)
    res = otstab.certify(MODEL, X, y, se=spec, **CASES["hinge_kl"])
    assert np.array_equal(X, Xc) and np.array_equal(y, yc)
    inf_ = res.inference
    assert inf_.method == "bootstrap" and inf_.replicates.size == 60
    assert res.se == pytest.approx(np.std(inf_.replicates, ddof=1))
    assert res.ci(0.9) == pytest.approx(tuple(np.quantile(inf_.replicates, [0.05, 0.95])))
    again = otstab.certify(MODEL, X, y, se=spec, **CASES["hinge_kl"])
    assert np.array_equal(again.inference.replicates, inf_.replicates)
    bca = otstab.certify(MODEL, X, y, se=Bootstrap(n_resamples=60, random_state=3, interval="bca"),
                         **CASES["hinge_kl"])
    lo, hi = bca.ci()
    assert inf_.replicates.min() <= lo < hi <= inf_.replicates.max()


def test_bca_reduces_to_percentile_without_bias_or_skew():
    # replicates symmetric about the value (z0 = 0) and no acceleration: BCa = percentile
    reps = np.linspace(-1, 1, 201)
    pct = Inference("bootstrap", 0.5, 0.0, 100, replicates=reps, interval="percentile")
    bca = Inference("bootstrap", 0.5, 0.0, 100, replicates=reps, interval="bca")
    assert bca.ci(0.9) == pytest.approx(pct.ci(0.9))
    assert bca.lower_confidence_bound(0.95) == pytest.approx(np.quantile(reps, 0.05))
    # a positive acceleration moves both ends up (Efron's adjusted levels)
    acc = Inference("bootstrap", 0.5, 0.0, 100, replicates=reps, interval="bca",
                    acceleration=0.1)
    assert acc.ci(0.9)[0] > pct.ci(0.9)[0] and acc.ci(0.9)[1] > pct.ci(0.9)[1]


def test_bootstrap_progress_bar(capsys):
    X, y = population(200, 6)
    otstab.certify(MODEL, X, y, se=Bootstrap(n_resamples=5, progress=True), **CASES["zero_one_kl"])
    assert "5/5" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["exact", 3, Bootstrap])
def test_se_argument_is_validated(bad):
    X, y = population(50, 0)
    with pytest.raises(ValidationError, match="se must be"):
        otstab.certify(MODEL, X, y, loss="hinge", r=1.0, se=bad)


@pytest.mark.parametrize("kw", [dict(n_resamples=1), dict(n_resamples=2.5),
                                dict(interval="normal"), dict(random_state="a"),
                                dict(random_state=True), dict(random_state=-1)])
def test_bootstrap_settings_are_validated(kw):
    with pytest.raises(ValidationError):
        Bootstrap(**kw)


@pytest.mark.parametrize("name", list(CASES))
def test_analytic_se_agrees_with_bootstrap(name):
    # at n = 5000 the influence-function SE is within 10% of the bootstrap SE (500
    # replicates: the bootstrap SE itself has a Monte Carlo error of about 1/sqrt(1000) = 3%)
    X, y = population(5000, 7)
    kw = CASES[name]
    analytic = otstab.certify(MODEL, X, y, **kw).se
    boot = otstab.certify(MODEL, X, y, se=Bootstrap(n_resamples=500, random_state=1), **kw).se
    assert analytic == pytest.approx(boot, rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_coverage_of_95_percent_intervals(name):
    # truth: R on 2e6 rows of the population (its own SE is sqrt(1000) ~ 32 times smaller
    # than at n = 2000); 1000 replications at n = 2000: the binomial standard deviation of the
    # coverage at 95% is 0.7%, so [93%, 97%] is a +-2.9 sigma band
    kw = CASES[name]
    Xp, yp = population(2_000_000, 12345)
    truth = otstab.certify(MODEL, Xp, yp, se=None, **kw).value
    reps = 1000
    hits = 0
    for k in range(reps):
        X, y = population(2000, k)
        lo, hi = otstab.certify(MODEL, X, y, **kw).ci(0.95)
        hits += lo <= truth <= hi
    assert 0.93 <= hits / reps <= 0.97


def test_feature_uncertainty_is_the_bootstrap_of_certify_per_feature():
    # the replicates are feature_stability on rows resampled with default_rng(seed); each
    # score is certify(..., features=[j]).value on those rows (the documented definition)
    X, y = population(300, 8)
    kw = dict(loss="hinge", r=1.0, theta2=0.25)
    df = otstab.feature_stability(MODEL, X, y, level=0.9, n_resamples=6, random_state=4,
                                  top_k=1, **kw).to_frame()
    rng = np.random.default_rng(4)
    reps = np.empty((6, 3))
    for b in range(6):
        idx = rng.integers(0, 300, 300)
        for j in range(3):
            reps[b, j] = otstab.certify(MODEL, X[idx], y[idx], features=[j], se=None,
                                        **kw).value
    for _, row in df.iterrows():
        j = int(row["feature"][1:])
        assert row["se"] == pytest.approx(np.std(reps[:, j], ddof=1), rel=1e-6)
        assert row["ci_low"] == pytest.approx(np.quantile(reps[:, j], 0.05), rel=1e-6)
        assert row["ci_high"] == pytest.approx(np.quantile(reps[:, j], 0.95), rel=1e-6)
        assert row["p_top_k"] == pytest.approx(np.mean(np.argmin(reps, axis=1) == j))
    assert df["p_top_k"].sum() == pytest.approx(1.0)
    with pytest.raises(ValidationError, match="top_k"):
        otstab.feature_stability(MODEL, X, y, level=0.9, top_k=0, **kw).to_frame()


def test_stability_curve_bands_are_each_certificates_interval():
    X, y = population(500, 9)
    grid = [0.3, 0.8, 1.0]
    df = otstab.stability_curve(MODEL, X, y, r=grid, loss="hinge", level=0.8).to_frame()
    for rv, lo, hi, se in zip(grid, df["ci_low"], df["ci_high"], df["se"]):
        res = otstab.certify(MODEL, X, y, loss="hinge", r=rv)
        assert (lo, hi) == pytest.approx(res.ci(0.8))
        assert se == pytest.approx(res.se)
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from otstab import plot

    ax = plot.stability_curve(df)
    assert len(ax.collections) == 1  # the band
    assert "80% interval" in [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("se", ["analytic",
                                Bootstrap(n_resamples=20, random_state=2, interval="bca")])
def test_certificate_records_and_verify_rechecks_uncertainty(se):
    from otstab.certificates import (
        make_certificate,
        validate_certificate,
        verify_certificate,
    )
    from otstab.reporting._report import render_html

    X, y = population(400, 10)
    res = otstab.certify(MODEL, X, y, loss="hinge", r=1.0, se=se)
    cert = make_certificate(res, MODEL, X, y, level=0.9)
    validate_certificate(cert)
    unc = cert["results"]["uncertainty"]
    assert unc["level"] == 0.9 and unc["se"] == pytest.approx(res.se)
    assert (unc["ci_low"], unc["ci_high"]) == pytest.approx(res.ci(0.9))
    assert unc["lower_bound"] == pytest.approx(res.lower_confidence_bound(0.9))
    assert verify_certificate(cert, MODEL, X, y)
    page = render_html(cert)
    assert 'id="uncertainty"' in page and "with 90% confidence" in page
    for key, factor in (("se", 1.5), ("ci_high", 1.1), ("lower_bound", 0.5)):
        bad = {**cert, "results": {**cert["results"], "uncertainty": {**unc,
                                                                       key: unc[key] * factor}}}
        report = verify_certificate(bad, MODEL, X, y)
        assert not report and any(key in m for m in report.reasons)


def test_an_interval_is_not_advised_a_bootstrap():
    # a bootstrap of an interval re-estimates only its found end (and some interval paths
    # refuse se='bootstrap'): the analytic SE's note must not advise one
    from sklearn.ensemble import GradientBoostingClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = (X[:, 0] * X[:, 1] + 0.3 * rng.normal(size=200) > 0).astype(int)
    m = GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=0).fit(X, y)
    res = otstab.certify(m, X, y, loss="logistic", r=0.6, theta1=1.0, theta2=0.25,
                         max_nodes=2, rtol=None, progress=False)
    assert res.status == "bounds"
    assert "not exact" in res.inference.note
    assert "bootstrap" not in res.inference.note and "bootstrap" not in res.summary()
