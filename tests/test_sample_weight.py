"""``sample_weight=``: P0 = sum_i p_i delta_{z_i} (issue 15).

The references are independent of the weighted code: integer weights are the same problem as
the rows replicated that many times (the unweighted path on ``np.repeat``), zero weights the
rows dropped, and the audit of a weighted Q* is recomputed here from the model's own
decision_function.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import otstab
from otstab.errors import ValidationError

RTOL = 1e-9


def _binary(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1, -1)
    return otstab.LinearModel(rng.normal(size=d), 0.1), X, y


def _multiclass(n=45, d=3, K=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = rng.integers(0, K, size=n)
    return otstab.LinearModel(rng.normal(size=(K, d)), rng.normal(size=K)), X, y


def _regression(n=40, d=3, seed=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X @ np.array([1.0, -0.5, 0.2]) + 0.3 * rng.normal(size=n)
    return otstab.LinearModel(np.array([0.8, -0.4, 0.0]), 0.05, task="regression"), X, y


# (problem, loss, r): r above the base risk of each problem
CASES = [(_binary, "hinge", 1.5), (_binary, "zero_one", 0.6), (_binary, "logistic", 1.2),
         (_regression, "absolute", 0.8), (_multiclass, "multiclass_hinge", 2.5),
         (_multiclass, "cross_entropy", 2.0)]
PRICES = [(1.0, 0.5), (math.inf, 0.5), (1.0, math.inf)]


def _counts(n, seed=3, low=0):
    return np.random.default_rng(seed).integers(low, 4, size=n)


def _close(a, b):
    assert a.status == b.status
    assert a.value == pytest.approx(b.value, rel=RTOL, abs=1e-300)


@pytest.mark.parametrize("make, loss, r", CASES)
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("theta1, theta2", PRICES)
def test_integer_weights_equal_replicated_rows(make, loss, r, divergence, theta1, theta2):
    model, X, y = make()
    k = _counts(len(y))  # includes zeros: those rows are dropped by the replication
    kw = dict(loss=loss, r=r, theta1=theta1, theta2=theta2, divergence=divergence)
    res = otstab.certify(model, X, y, sample_weight=k, **kw)
    ref = otstab.certify(model, np.repeat(X, k, axis=0), np.repeat(y, k), **kw)
    _close(res, ref)
    assert res.status in ("optimal", "zero", "unreachable")
    assert res.risk_base == pytest.approx(ref.risk_base, rel=1e-12)


@pytest.mark.parametrize("make, loss, r", CASES)
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_weights_read_by_reference_equal_weights_converted(make, loss, r, divergence,
                                                           monkeypatch):
    """float64 weights are read from the caller's array (``w[i] / sum(w)`` where needed);
    integer weights are converted into an array of otstab's own, normalised in place. The
    two give the same bits (value, base risk, Q*'s weights and masses), with the direct
    audit and with the sampled one that large data gets (its threshold made small here),
    and the integer weights equal replicated rows (above)."""
    from otstab.solve import _audit, _piecewise

    model, X, y = make()
    k = _counts(len(y))
    kw = dict(loss=loss, r=r, divergence=divergence)
    for direct_max in (_audit.AUDIT_DIRECT_MAX, 50):
        monkeypatch.setattr(_audit, "AUDIT_DIRECT_MAX", direct_max)
        monkeypatch.setattr(_piecewise, "AUDIT_DIRECT_MAX", direct_max)
        a = otstab.certify(model, X, y, sample_weight=k, **kw)
        b = otstab.certify(model, X, y, sample_weight=k.astype(np.float64), **kw)
        assert a.info["sample_weight"].owned and not b.info["sample_weight"].owned
        assert (a.status, repr(a.value), repr(a.risk_base), repr(a.risk_star)) == \
            (b.status, repr(b.value), repr(b.risk_base), repr(b.risk_star))
        np.testing.assert_array_equal(np.asarray(a.weights) * np.asarray(a.mass),
                                      np.asarray(b.weights) * np.asarray(b.mass))


@pytest.mark.parametrize("make", [_binary, _multiclass])
def test_zero_one_rate_reachable_by_moving_alone_is_weighted(make):
    """With theta2 = inf only moving counts: the largest error rate it reaches is 1 less the
    P0-mass of the correct rows that cannot move (here none can: theta1 = inf). Just above
    that weighted rate the answer is "unreachable", at or below it "zero", as on replicated
    rows (a rate taken as 1 would miss it)."""
    model, X, y = make(n=400)
    k = _counts(len(y), low=0)
    base = float(np.average(otstab.certify(model, X, y, loss="zero_one", r=0.0,
                                           sample_weight=k).loss_base, weights=k))
    for r, want in ((base + 1e-6, "unreachable"), (base - 1e-6, "zero")):
        kw = dict(loss="zero_one", r=r, theta1=math.inf, theta2=math.inf)
        res = otstab.certify(model, X, y, sample_weight=k, **kw)
        ref = otstab.certify(model, np.repeat(X, k, axis=0), np.repeat(y, k), **kw)
        assert res.status == ref.status == want, r


@pytest.mark.parametrize("make, loss, r", CASES[:3])
def test_zero_weights_equal_dropped_rows_and_scaling_changes_nothing(make, loss, r):
    model, X, y = make()
    k = _counts(len(y), seed=4)
    keep = k > 0
    p = np.where(keep, np.random.default_rng(5).uniform(0.5, 2.0, size=len(y)), 0.0)
    kw = dict(loss=loss, r=r, theta1=1.0, theta2=0.5)
    res = otstab.certify(model, X, y, sample_weight=p, **kw)
    _close(res, otstab.certify(model, X[keep], y[keep], sample_weight=p[keep], **kw))
    scaled = otstab.certify(model, X, y, sample_weight=1e3 * p, **kw)
    _close(res, scaled)


@pytest.mark.parametrize("make, loss, r", CASES)
def test_uniform_weights_are_bit_identical_to_none(make, loss, r):
    model, X, y = make()
    kw = dict(loss=loss, r=r, theta1=1.0, theta2=0.5, divergence="chi2")
    a = otstab.certify(model, X, y, sample_weight=np.full(len(y), 2.5), **kw)
    b = otstab.certify(model, X, y, **kw)
    assert (a.value, a.h, a.risk_star, a.primal_cost) == (b.value, b.h, b.risk_star,
                                                         b.primal_cost)
    assert np.array_equal(a.weights, b.weights)


@pytest.mark.parametrize("loss, r", [("hinge", 1.5), ("zero_one", 0.6), ("logistic", 1.2)])
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_weighted_audit_recomputed_from_the_model(loss, r, divergence):
    model, X, y = _binary()
    sw = np.random.default_rng(6).uniform(0.0, 3.0, size=len(y))
    theta1, theta2 = 1.0, 0.5
    res = otstab.certify(model, X, y, loss=loss, r=r, theta1=theta1, theta2=theta2,
                         divergence=divergence, sample_weight=sw)
    assert res.status == "optimal"
    p = sw / sw.sum()
    src, mass, w = np.asarray(res.source), np.asarray(res.mass), np.asarray(res.weights)
    Xs = np.asarray(res.X_star)
    margin = y[src] * model.decision_function(Xs)
    loss_star = {"hinge": np.maximum(0.0, 1.0 - margin),
                 "zero_one": (margin <= 0).astype(float),
                 "logistic": np.logaddexp(0.0, -margin)}[loss]
    pm = p[src] * mass
    phi = (w * np.log(np.where(w > 0, w, 1.0)) - w + 1.0) if divergence == "kl" \
        else (w - 1.0) ** 2
    cost = theta1 * np.sum(pm * w * np.sum((Xs - X[src]) ** 2, axis=1)) + theta2 * np.sum(
        pm * phi)
    assert np.sum(pm * w) == pytest.approx(1.0, abs=1e-9)
    assert np.sum(pm * w * loss_star) == pytest.approx(r, rel=1e-8)
    assert cost == pytest.approx(res.value, rel=1e-6)
    base = {"hinge": np.maximum(0.0, 1.0 - y * model.decision_function(X)),
            "zero_one": (y * model.decision_function(X) <= 0).astype(float),
            "logistic": np.logaddexp(0.0, -y * model.decision_function(X))}[loss]
    assert res.risk_base == pytest.approx(float(p @ base), rel=1e-12)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_limit_value_uses_the_weighted_mass_of_the_largest_losses(divergence):
    # samples cannot move (theta1 = inf) and r is the largest loss: all mass on the samples
    # A of largest loss, R = theta2 log(1/P(A)) (KL) or theta2 (1/P(A) - 1) (chi2)
    model, X, y = _binary()
    sw = np.random.default_rng(7).uniform(0.1, 2.0, size=len(y))
    losses = np.maximum(0.0, 1.0 - y * model.decision_function(X))
    top = losses == losses.max()
    PA = sw[top].sum() / sw.sum()
    res = otstab.certify(model, X, y, loss="hinge", r=float(losses.max()), theta1=math.inf,
                         theta2=0.5, divergence=divergence, sample_weight=sw)
    expect = 0.5 * (math.log(1 / PA) if divergence == "kl" else 1 / PA - 1)
    assert res.value == pytest.approx(expect, rel=1e-12)


def test_sweeps_and_features_equal_replicated_rows():
    model, X, y = _binary()
    k = _counts(len(y), seed=8)
    Xr, yr = np.repeat(X, k, axis=0), np.repeat(y, k)
    grid = [1.2, 1.5, 2.0]
    a = otstab.stability_curve(model, X, y, r=grid, loss="hinge", sample_weight=k).to_frame()
    b = otstab.stability_curve(model, Xr, yr, r=grid, loss="hinge").to_frame()
    np.testing.assert_allclose(a["value"], b["value"], rtol=RTOL)
    fa = otstab.feature_stability(model, X, y, loss="hinge", r=1.5, sample_weight=k).to_frame()
    fb = otstab.feature_stability(model, Xr, yr, loss="hinge", r=1.5).to_frame()
    fa, fb = fa.sort_values("feature"), fb.sort_values("feature")
    np.testing.assert_allclose(fa["score"], fb["score"], rtol=1e-8)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_weighted_conic_curve_builds_one_program_and_equals_the_dual_curve(monkeypatch,
                                                                           divergence):
    # the conic program with p (one cvxpy build, r a Parameter) against the specialised dual
    # with p at every threshold: two independent solvers of the same weighted R
    from otstab_solvers import conic

    model, X, y = _binary()
    sw = np.random.default_rng(19).uniform(0.0, 3.0, size=len(y))
    grid = [1.2, 1.5, 2.0]
    kw = dict(r=grid, loss="hinge", theta1=1.0, theta2=0.5, divergence=divergence,
              sample_weight=sw)
    built = []
    orig = conic.ConicProgram.__init__

    def counting(self, *a, **k):
        built.append(k.get("weights"))
        orig(self, *a, **k)

    monkeypatch.setattr(conic.ConicProgram, "__init__", counting)
    a = otstab.stability_curve(model, X, y, solver="clarabel", **kw).to_frame()
    assert len(built) == 1 and built[0] is not None
    assert list(a["solver"]) == ["clarabel"] * len(grid)
    b = otstab.stability_curve(model, X, y, solver="dual", **kw).to_frame()
    np.testing.assert_allclose(a["value"], b["value"], rtol=1e-6)
    assert not np.allclose(a["value"], otstab.stability_curve(
        model, X, y, solver="dual", **{**kw, "sample_weight": None}).to_frame()["value"], rtol=1e-4)


def test_weighted_se_with_zero_one_weights_equals_dropped_rows():
    # with weights in {0, 1} the Kish SE sqrt(sum p_i^2 IF_i^2) is sd(IF)/sqrt(m) on the m kept
    # rows: the unweighted SE of the kept rows
    model, X, y = _binary(n=120)
    keep = np.random.default_rng(9).uniform(size=len(y)) < 0.7
    kw = dict(loss="hinge", r=1.5, theta1=1.0, theta2=0.5)
    a = otstab.certify(model, X, y, sample_weight=keep.astype(float), **kw)
    b = otstab.certify(model, X[keep], y[keep], **kw)
    assert a.se == pytest.approx(b.se, rel=1e-8)


@pytest.mark.parametrize("bad, match", [
    (np.ones(39), "40 rows"), (-np.ones(40), ">= 0"), (np.zeros(40), "positive sum"),
    (np.full(40, np.nan), "NaN"), (np.ones(40, dtype=bool), "booleans"),
    (np.array(["1"] * 40), "numeric"), (np.ones((40, 2)), "1-D")])
def test_bad_weights_raise_naming_sample_weight(bad, match):
    model, X, y = _binary()
    with pytest.raises(ValidationError, match="sample_weight") as err:
        otstab.certify(model, X, y, loss="hinge", r=1.5, sample_weight=bad)
    assert match in str(err.value)


def test_weighted_certificate_needs_its_weights():
    model, X, y = _binary()
    sw = np.arange(1.0, 41.0)
    res = otstab.certify(model, X, y, loss="hinge", r=1.5, sample_weight=sw)
    from otstab.certificates import make_certificate
    with pytest.raises(ValidationError, match="sample_weight"):
        make_certificate(res, model, X, y)


def test_caller_weights_not_mutated():
    model, X, y = _binary()
    sw = np.arange(1.0, 41.0)
    keep = sw.copy()
    otstab.certify(model, X, y, loss="hinge", r=1.5, sample_weight=sw)
    assert np.array_equal(sw, keep)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_perturbation_search_with_integer_weights_equals_replicated_rows(divergence):
    """The 0/1 loss of a predict-only classifier (a decision tree: exact distances) with
    integer weights equals the same data with rows replicated that many times."""
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] + 0.4 * rng.normal(size=60) > 0).astype(int)
    tree = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y)
    k = rng.integers(0, 4, size=60)
    k[:2] = 1
    base = float(np.sum(k * (tree.predict(X) != y)) / k.sum())
    r = min(0.95, base + 0.2)
    res = otstab.certify(tree, X, y, loss="zero_one", r=r, divergence=divergence,
                         sample_weight=k)
    ref = otstab.certify(tree, np.repeat(X, k, axis=0), np.repeat(y, k), loss="zero_one", r=r,
                         divergence=divergence)
    assert res.status == ref.status
    assert res.value == pytest.approx(ref.value, rel=1e-9)
    assert res.value_lower == pytest.approx(ref.value_lower, rel=1e-9)


# --- conic backends with weights -----------------------------------------------------------

CONIC_CASES = [(_binary, "hinge"), (_regression, "absolute"), (_regression, "pinball")]


def _piecewise_losses(model, X, y, loss):
    f = model.decision_function(X)
    if loss == "hinge":
        return np.maximum(0.0, 1.0 - y * f)
    u = y - f
    return np.abs(u) if loss == "absolute" else np.maximum(0.3 * u, -0.7 * u)


@pytest.mark.parametrize("make, loss", CONIC_CASES)
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("theta1, theta2", PRICES)
def test_conic_with_weights_equals_dual_and_replicated_rows(make, loss, divergence, theta1,
                                                            theta2):
    # three independent computations of the same weighted R: the specialised dual with p, the
    # conic program with p (its own value `solver_value`, before the refinement of h by the
    # dual's oracle) and the conic program on the rows replicated k_i times (uniform weights)
    model, X, y = make()
    k = _counts(len(y), seed=11)
    # r between the weighted base risk and the largest loss of a kept row (reachable also by
    # reweighting alone, theta1 = inf)
    losses = _piecewise_losses(model, X, y, loss)
    base = float(k @ losses) / k.sum()
    r = base + 0.6 * (losses[k > 0].max() - base)
    loss = otstab.losses.pinball(0.3) if loss == "pinball" else loss
    kw = dict(loss=loss, r=r, theta1=theta1, theta2=theta2, divergence=divergence)
    dual = otstab.certify(model, X, y, sample_weight=k, solver="dual", **kw)
    assert dual.status == "optimal"
    conic = otstab.certify(model, X, y, sample_weight=k, solver="clarabel", **kw)
    rep = otstab.certify(model, np.repeat(X, k, axis=0), np.repeat(y, k), solver="clarabel",
                         **kw)
    assert conic.status == rep.status == "optimal"
    assert conic.solver == "clarabel"
    for res in (conic, rep):
        assert res.info["solver_value"] == pytest.approx(dual.value, rel=1e-6)
        assert res.value == pytest.approx(dual.value, rel=1e-6)


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_auto_falls_back_to_conic_with_weights(monkeypatch, divergence):
    # the specialised dual reports a failure: "auto" moves on to the conic backends, which now
    # solve the weighted program (equal to the dual's own weighted answer)
    from otstab_solvers.result import FAILED, DualSolution

    import otstab.solve._piecewise as pw

    model, X, y = _binary()
    sw = np.random.default_rng(12).uniform(0.0, 3.0, size=len(y))
    kw = dict(loss="hinge", r=1.5, theta1=1.0, theta2=0.5, divergence=divergence,
              sample_weight=sw)
    ref = otstab.certify(model, X, y, **kw)
    monkeypatch.setattr(pw, "solve_dual", lambda *a, **k: DualSolution(
        np.nan, None, np.nan, FAILED, "dual", native_status="forced failure"))
    res = otstab.certify(model, X, y, **kw)
    assert res.solver_log[0]["solver"] == "dual" and res.solver != "dual"
    assert res.status == "optimal"
    assert res.value == pytest.approx(ref.value, rel=1e-6)


def test_conic_program_drops_zero_weight_rows():
    # a zero weight is the row removed: the program on (c1, c2) with weights (0, ...) equals the
    # program on the other rows with the remaining weights
    from otstab_solvers.conic import ConicProgram

    rng = np.random.default_rng(13)
    c1 = np.column_stack([np.zeros(12), rng.uniform(0.5, 2.0, size=12)])
    c2 = np.array([[0.0, 0.25]])
    w = rng.uniform(0.5, 2.0, size=12)
    w[[2, 7]] = 0.0
    keep = w > 0
    for div in ("kl", "chi2"):
        a = ConicProgram(c1, c2, 0.5, div, weights=w).solve("clarabel", 1.8)
        b = ConicProgram(c1[keep], c2, 0.5, div, weights=w[keep]).solve("clarabel", 1.8)
        assert a.status == b.status == "optimal"
        assert a.value == pytest.approx(b.value, rel=1e-7)


# --- first-order path with weights ---------------------------------------------------------

#: the first-order search stops at |risk - r| <= 1e-4 r; its value, stationary in h, is then
#: accurate to far better than that, and two runs on the same problem agree to it
FO_RTOL = 1e-4


def _mlp_problem():
    from sklearn.neural_network import MLPClassifier

    rng = np.random.default_rng(14)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] + 0.5 * X[:, 1] ** 2 + 0.3 * rng.normal(size=60) > 0.3).astype(int)
    mlp = MLPClassifier(hidden_layer_sizes=(8,), max_iter=3000, random_state=0).fit(X, y)
    k = rng.integers(0, 4, size=60)
    k[:2] = 1
    return mlp, X, y, k


def _audit_from_proba(model, res, X, y, p, divergence):
    """(mass, risk, cost) of a weighted Q* recomputed from the model's predict_proba."""
    src, mass, w = np.asarray(res.source), np.asarray(res.mass), np.asarray(res.weights)
    Xs = np.asarray(res.X_star)
    proba = model.predict_proba(Xs)
    loss = -np.log(proba[np.arange(src.size), np.searchsorted(model.classes_, y[src])])
    pm = p[src] * mass
    phi = (w * np.log(np.where(w > 0, w, 1.0)) - w + 1.0) if divergence == "kl" \
        else (w - 1.0) ** 2
    cost = res.theta1 * np.sum(pm * w * np.sum((Xs - X[src]) ** 2, axis=1)) \
        + res.theta2 * np.sum(pm * phi)
    return np.sum(pm * w), np.sum(pm * w * loss), cost


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("loss", ["logistic", "cross_entropy"])
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_first_order_mlp_integer_weights_equal_replicated_rows(loss, divergence):
    mlp, X, y, k = _mlp_problem()
    kw = dict(loss=loss, r=0.8, theta1=1.0, theta2=0.5, divergence=divergence)
    res = otstab.certify(mlp, X, y, sample_weight=k, **kw)
    ref = otstab.certify(mlp, np.repeat(X, k, axis=0), np.repeat(y, k), **kw)
    assert res.status == ref.status == "bounds"
    assert res.value_upper == pytest.approx(ref.value_upper, rel=FO_RTOL)
    assert res.risk_base == pytest.approx(ref.risk_base, rel=1e-12)
    # the audit of the weighted Q*, recomputed here from the network's own probabilities
    mass, risk, cost = _audit_from_proba(mlp, res, X, y, k / k.sum(), divergence)
    assert mass == pytest.approx(1.0, abs=1e-9)
    assert risk >= 0.8 * (1 - 1e-8)
    assert cost == pytest.approx(res.value_upper, rel=1e-9)
    assert 0.0 <= res.value_lower <= res.value_upper


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_first_order_linear_with_weights_bounds_the_exact_value(divergence):
    # the first-order Q* is a feasible perturbation of the weighted P0: its cost is >= the exact
    # weighted R of the specialised dual, and the local search finds it (to FO_RTOL) on this
    # concave (linear model, logistic loss) problem; the replicated rows give the same answer
    model, X, y = _binary(n=50)
    k = _counts(len(y), seed=15)
    kw = dict(loss="logistic", r=1.2, theta1=1.0, theta2=0.5, divergence=divergence)
    exact = otstab.certify(model, X, y, sample_weight=k, **kw)
    fo = otstab.certify(model, X, y, sample_weight=k, solver="first_order", **kw)
    rep = otstab.certify(model, np.repeat(X, k, axis=0), np.repeat(y, k), solver="first_order",
                         **kw)
    assert exact.status == "optimal" and fo.status == rep.status == "bounds"
    assert fo.value_upper >= exact.value * (1 - 1e-9)
    assert fo.value_upper == pytest.approx(exact.value, rel=FO_RTOL)
    assert fo.value_upper == pytest.approx(rep.value_upper, rel=FO_RTOL)


# --- sampling uncertainty with weights -------------------------------------------------------


@pytest.mark.parametrize("loss, r", [("hinge", 1.5), ("zero_one", 0.6), ("logistic", 1.2)])
@pytest.mark.parametrize("weighted", [True, False])
def test_bootstrap_replicates_are_the_problem_on_the_resampled_rows(loss, r, weighted):
    # brute force: each replicate is certify on the rows drawn (uniformly, with replacement, by
    # the documented generator), with their own weights (the weighted 0/1 case failed when a
    # replicate reused the losses cached for the original rows)
    from otstab.solve._inference import Bootstrap

    model, X, y = _binary()
    sw = np.random.default_rng(16).uniform(0.0, 3.0, size=len(y)) if weighted else None
    kw = dict(loss=loss, r=r, theta1=1.0, theta2=0.5)
    res = otstab.certify(model, X, y, sample_weight=sw,
                         se=Bootstrap(n_resamples=6, random_state=3), **kw)
    rng = np.random.default_rng(3)
    expect = []
    for _ in range(6):
        idx = rng.integers(0, len(y), len(y))
        expect.append(otstab.certify(model, X[idx], y[idx], se=None, **kw,
                                     sample_weight=None if sw is None else sw[idx]).value)
    np.testing.assert_allclose(res.inference.replicates, expect, rtol=1e-9)
    assert res.se == pytest.approx(np.std(expect, ddof=1), rel=1e-9)


@pytest.mark.parametrize("loss, r, divergence, n_boot", [
    ("hinge", 0.6, "kl", 1000),
    pytest.param("hinge", 0.6, "chi2", 1000, marks=pytest.mark.slow),  # 6-8 s
    ("zero_one", 0.25, "kl", 500)])
def test_weighted_analytic_se_agrees_with_the_weighted_bootstrap(loss, r, divergence, n_boot):
    # the influence-function SE of the ratio estimator, sqrt(sum p_i^2 IF_i^2), against the
    # standard deviation of the bootstrap over (row, weight) pairs (docs/inference.md); with
    # n_boot replicates the bootstrap SE is itself off by about 1/sqrt(2 n_boot) <= 3.2%
    from otstab.solve._inference import Bootstrap

    rng = np.random.default_rng(20)
    n = 5000
    X = rng.normal(size=(n, 3))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1, -1)
    model = otstab.LinearModel(np.array([1.0, 0.3, -0.2]), 0.1)
    sw = rng.lognormal(0.0, 0.7, size=n)
    kw = dict(loss=loss, r=r, divergence=divergence, sample_weight=sw)
    a = otstab.certify(model, X, y, **kw)
    b = otstab.certify(model, X, y, se=Bootstrap(n_resamples=n_boot, random_state=1), **kw)
    assert a.status == "optimal" and a.inference.reliable
    assert 0.9 < a.se / b.se < 1.1


@pytest.mark.parametrize("loss, r", [("hinge", 1.5), ("zero_one", 0.6), ("logistic", 1.2)])
@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_weighted_influence_equals_replicated_rows(loss, r, divergence):
    # the influence function is a property of P0 = sum p_i delta_{z_i}: every copy of a row in
    # the replicated data has the influence of that row under the integer weights
    from otstab.solve._inference import influence

    model, X, y = _binary()
    k = _counts(len(y), seed=17)
    kw = dict(loss=loss, r=r, theta1=1.0, theta2=0.5, divergence=divergence)
    res = otstab.certify(model, X, y, sample_weight=k, **kw)
    ref = otstab.certify(model, np.repeat(X, k, axis=0), np.repeat(y, k), **kw)
    a = influence(res)[np.repeat(np.arange(len(y)), k)]
    np.testing.assert_allclose(a, influence(ref), rtol=1e-7, atol=1e-9 * res.theta2)


def test_feature_confidence_with_weights_resamples_rows_with_their_weights():
    model, X, y = _binary(n=60)
    sw = np.random.default_rng(18).uniform(0.2, 3.0, size=len(y))
    kw = dict(loss="hinge", r=1.5)
    df = otstab.feature_stability(model, X, y, sample_weight=sw, level=0.9, n_resamples=4,
                                  random_state=5, **kw).to_frame().set_index("feature")
    rng = np.random.default_rng(5)
    scores = []
    for _ in range(4):
        idx = rng.integers(0, len(y), len(y))
        rep = otstab.feature_stability(model, X[idx], y[idx], sample_weight=sw[idx],
                                       **kw).to_frame()
        scores.append(rep.set_index("feature")["score"].reindex(df.index).to_numpy())
    np.testing.assert_allclose(df["se"], np.std(scores, axis=0, ddof=1), rtol=1e-9)


def test_scaled_weights_are_their_probabilities():
    """``ScaledWeights(w, total)`` reads ``w[key] / total`` where sliced (the bits of the
    n-vector ``w / total``), behaves as that n-vector in any other NumPy use (built once,
    read-only, after its ``check``), and pickles as it."""
    import pickle

    from otstab_solvers.weights import ScaledWeights, dense, pmean

    rng = np.random.default_rng(0)
    w = rng.uniform(0.0, 3.0, 50_000)
    total = float(np.sum(w))
    p = w / total
    sw = ScaledWeights(w, total)
    checks = []
    sw.check = checks.append
    for key in (slice(3, 40_000), slice(None), np.array([5, 1, 49_999]), w > 1.0, 7):
        np.testing.assert_array_equal(np.asarray(sw[key]).view(np.int64),
                                      np.asarray(p[key]).view(np.int64))
    assert not checks and sw.size == len(sw) == 50_000 and sw.shape == (50_000,)
    x = rng.standard_normal(50_000)
    assert pmean(x, sw) == pytest.approx(float(p @ x), rel=1e-13)
    assert pmean(x > 0, sw) == pytest.approx(float(p @ (x > 0)), rel=1e-13)
    assert not checks  # (read by slices)
    assert float(sw @ x) == float(p @ x) and np.array_equal(sw > 1e-5, p > 1e-5)
    assert float(np.sum(sw)) == float(np.sum(p)) and float(sw.max()) == float(p.max())
    assert checks == ["the sample probabilities"]  # (built once, checked then)
    arr = dense(sw)
    assert arr is sw.array() and not arr.flags.writeable and np.array_equal(arr, p)
    mine = np.array(sw)
    mine[0] = -1.0  # (a copy: the probabilities are unchanged)
    assert sw[0] == p[0] and len(checks) == 1
    back = pickle.loads(pickle.dumps(sw))
    assert back.owned and np.array_equal(np.asarray(back), p)
    assert dense(None) is None and dense(p) is p
