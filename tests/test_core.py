"""certify on piecewise-linear losses: every backend against an independent brute force, the
primal audit on every instance, edge semantics and bad input."""

import math

import numpy as np
import pandas as pd
import pytest
from reference import dual_value, lh_hinge, lh_multiclass, lh_pwl_residual

import otstab
from otstab.errors import (
    IncompatibleLossError,
    InputTypeError,
    NotFittedError,
    SolverError,
    SolverNotAvailableError,
    ValidationError,
)
from otstab.modeling._losses import epsilon_insensitive, pinball

THETAS = [0.2, 1.0, 5.0, math.inf]
INF = math.inf


def binary_instance(n, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    b = 0.3
    y = np.where(X @ w + b + 0.7 * rng.normal(size=n) > 0, 1, -1)
    return otstab.LinearModel(w, b), X, y


def regression_instance(n, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = X @ w + 0.1 + rng.normal(size=n)
    return otstab.LinearModel(w, 0.1, task="regression"), X, y


def multiclass_instance(n, d=3, K=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(K, d))
    b = rng.normal(size=K) * 0.2
    y = np.argmax(X @ W.T + b + rng.gumbel(size=(n, K)), axis=1)
    return otstab.LinearModel(W, b), X, y


def reference(kind, model, X, y, loss, r, theta1, theta2, div):
    """Brute-force dual value, from quantities computed here (not by otstab.reduction)."""
    if kind == "hinge":
        w, b = model.coef_, model.intercept_
        m = y * (X @ w + b)
        fn = lambda h: lh_hinge(m, w @ w, theta1, h)  # noqa: E731
        base = np.mean(np.maximum(0, 1 - m))
    elif kind == "residual":
        w, b = model.coef_, model.intercept_
        e = y - (X @ w + b)
        fn = lambda h: lh_pwl_residual(e, loss.slopes, loss.intercepts, w @ w, theta1, h)  # noqa
        base = np.mean(fn(1.0)) if math.isinf(theta1) else np.mean(
            lh_pwl_residual(e, loss.slopes, loss.intercepts, 0.0, INF, 1.0))
    else:
        W, b = model.coef_, model.intercept_
        S = X @ W.T + b
        fn = lambda h: lh_multiclass(S, y, W, theta1, h)  # noqa: E731
        base = np.mean(lh_multiclass(S, y, W, INF, 1.0))
    if r <= base:
        return 0.0
    return dual_value(fn, r, theta2, div)[0]


def assert_audit(res, r, tol=1e-6):
    assert res.gap <= tol, (res.gap, res.primal_cost, res.value)
    assert res.risk_star >= r - tol, (res.risk_star, r)
    assert abs(res.total_mass - 1) <= 1e-9
    # shares of one sample's mass sum to one
    np.testing.assert_allclose(np.bincount(res.source, weights=res.mass), 1.0, atol=1e-12)


CASES = []
for kind in ("hinge", "residual", "multiclass"):
    for n in (1, 7, 200):
        for t1 in THETAS:
            for t2 in THETAS:
                if math.isinf(t1) and math.isinf(t2):
                    continue
                CASES.append((kind, n, t1, t2))


def make(kind, n, seed):
    if kind == "hinge":
        model, X, y = binary_instance(n, seed=seed)
        return model, X, y, "hinge", 1.2
    if kind == "residual":
        model, X, y = regression_instance(n, seed=seed)
        loss = pinball(0.3) if seed % 2 else epsilon_insensitive(0.2)
        return model, X, y, loss, 0.9
    model, X, y = multiclass_instance(n, seed=seed)
    return model, X, y, "multiclass_hinge", 1.5


@pytest.mark.parametrize("div", ["kl", "chi2"])
@pytest.mark.parametrize("kind,n,t1,t2", CASES)
def test_dual_matches_brute_force(kind, n, t1, t2, div):
    model, X, y, loss, r = make(kind, n, seed=n + int(t1 * 7 if t1 < INF else 3))
    res = otstab.certify(model, X, y, loss=loss, r=r, theta1=t1, theta2=t2, divergence=div,
                         solver="dual")
    ref = reference(kind, model, X, y, otstab.losses.get_loss(loss), r, t1, t2, div)
    if math.isinf(res.value):
        assert res.status == "unreachable"
        assert math.isinf(t1)
        return
    # the brute force is a lower bound up to its own accuracy; the dual must not be below it
    assert res.value == pytest.approx(ref, rel=1e-9, abs=1e-10)
    assert_audit(res, r)


CONIC_CASES = [c for c in CASES if c[1] in (7, 200) and c[2] in (0.2, 1.0, INF)
               and c[3] in (0.2, 5.0, INF)]


# chi2 (8 s) runs with the slow tests; kl keeps the brute-force check in the default run
@pytest.mark.parametrize("div", ["kl", pytest.param("chi2", marks=pytest.mark.slow)])
def test_clarabel_matches_brute_force(div):
    """Clarabel agrees to 1e-6 whenever it reports optimal; it may report a failure (then
    certify raises) on a few exp-cone instances, but on at most 10% of them."""
    failures, total = 0, 0
    for kind, n, t1, t2 in CONIC_CASES:
        model, X, y, loss, r = make(kind, n, seed=n + 11)
        ref = reference(kind, model, X, y, otstab.losses.get_loss(loss), r, t1, t2, div)
        if math.isinf(t1) and ref == 0:
            continue
        total += 1
        try:
            res = otstab.certify(model, X, y, loss=loss, r=r, theta1=t1, theta2=t2,
                                 divergence=div, solver="clarabel")
        except SolverError:
            failures += 1
            continue
        if math.isinf(res.value):
            continue
        assert res.solver == "clarabel"
        assert res.value == pytest.approx(ref, rel=1e-6, abs=1e-8)
        # the solver's own objective (before refinement) agrees to its looser accuracy
        assert res.info["solver_value"] == pytest.approx(ref, rel=1e-5, abs=1e-6)
        assert_audit(res, r)
    assert failures <= 0.1 * total, (failures, total)


TIGHT_CLARABEL = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10, "max_iter": 600}


@pytest.mark.parametrize("div", ["kl", "chi2"])
def test_dual_agrees_with_tight_clarabel_to_1e7(div):
    """Issue 3's agreement target: with its tolerances tightened to 1e-10, Clarabel's own
    (unrefined) objective agrees with the specialised dual to 1e-7 relative on every conic test
    instance where it reports optimal (at its defaults, 1e-8 absolute, it pins the value to
    about 1e-5 only: see test_clarabel_matches_brute_force)."""
    failures, total = 0, 0
    for kind, n, t1, t2 in CONIC_CASES:
        model, X, y, loss, r = make(kind, n, seed=n + 11)
        d = otstab.certify(model, X, y, loss=loss, r=r, theta1=t1, theta2=t2, divergence=div,
                           solver="dual")
        if not math.isfinite(d.value) or d.value == 0:
            continue
        total += 1
        try:
            c = otstab.certify(model, X, y, loss=loss, r=r, theta1=t1, theta2=t2,
                               divergence=div, solver="clarabel",
                               **TIGHT_CLARABEL)
        except SolverError:  # reported as inaccurate at these tolerances: never passed off
            failures += 1
            continue
        assert c.info["solver_value"] == pytest.approx(d.value, rel=1e-7), (kind, n, t1, t2)
    assert failures <= 0.1 * total, (failures, total)


@pytest.mark.parametrize("solver,tol", [pytest.param("scs", 1e-4, marks=pytest.mark.slow),
                                        ("ecos", 1e-5)])
def test_other_backends(solver, tol):
    ok = 0
    for kind, n, t1, t2 in CONIC_CASES[::3]:
        for div in ("kl", "chi2"):
            model, X, y, loss, r = make(kind, n, seed=n + 5)
            ref = reference(kind, model, X, y, otstab.losses.get_loss(loss), r, t1, t2, div)
            try:
                res = otstab.certify(model, X, y, loss=loss, r=r, theta1=t1, theta2=t2,
                                     divergence=div, solver=solver)
            except SolverError:
                continue
            if math.isinf(res.value):
                continue
            ok += 1
            assert res.value == pytest.approx(ref, rel=tol, abs=tol)
            assert_audit(res, r, tol=1e-5)
    assert ok >= 5


def test_auto_uses_dual_and_agrees_with_clarabel():
    model, X, y = binary_instance(300, seed=3)
    a = otstab.certify(model, X, y, loss="hinge", r=1.0)
    b = otstab.certify(model, X, y, loss="hinge", r=1.0, solver="clarabel")
    assert a.solver == "dual"
    assert a.value == pytest.approx(b.value, rel=1e-7)


def test_large_n_2000_both_backends():
    model, X, y = multiclass_instance(2000, K=4, seed=9)
    for div in ("kl", "chi2"):
        a = otstab.certify(model, X, y, loss="multiclass_hinge", r=1.3, divergence=div)
        b = otstab.certify(model, X, y, loss="multiclass_hinge", r=1.3, divergence=div,
                           solver="conic")
        assert a.value == pytest.approx(b.value, rel=1e-6)
        assert_audit(a, 1.3)
        assert_audit(b, 1.3)


def test_ties_are_split_so_the_audit_closes():
    # theta2 = inf with hinge: the optimum sits at a kink (MATH.md), a one-atom-per-sample Q*
    # would miss r; the split makes the risk exactly r
    hit = 0
    for seed in range(6):
        model, X, y = binary_instance(40, seed=seed)
        res = otstab.certify(model, X, y, loss="hinge", r=1.1, theta1=1.0, theta2=INF)
        assert_audit(res, 1.1, tol=1e-9)
        assert res.risk_star == pytest.approx(1.1, abs=1e-9)
        hit += res.split
        assert res.n_atoms == 40 + int(res.split)
    assert hit >= 1


# ------------------------------------------------------------------ edge semantics


def test_r_below_base_risk_is_zero_and_q_is_p0():
    model, X, y = binary_instance(50, seed=1)
    base = np.mean(np.maximum(0, 1 - y * (X @ model.coef_ + model.intercept_)))
    for div in ("kl", "chi2"):
        res = otstab.certify(model, X, y, loss="hinge", r=base * 0.9, divergence=div)
        assert res.value == 0.0 and res.h == 0.0
        np.testing.assert_array_equal(res.X_star, X)
        np.testing.assert_array_equal(res.weights, 1.0)
        assert res.risk_star == pytest.approx(base)


def test_unreachable_threshold_is_decided_before_any_solver():
    model, X, y = binary_instance(30, seed=2)
    lmax = np.max(np.maximum(0, 1 - y * (X @ model.coef_ + model.intercept_)))
    for solver in ("auto", "clarabel", "dual"):
        res = otstab.certify(model, X, y, loss="hinge", r=lmax + 0.5, theta1=INF, solver=solver)
        assert math.isinf(res.value)
        assert res.status == "unreachable"
        assert res.solver == "none"
        assert "exceeds the largest loss" in res.message


def test_limit_at_the_largest_loss():
    # theta1 = inf, r = max loss: value theta2 log(n / |argmax|) (KL), theta2 (n/|A| - 1) (chi2)
    model = otstab.LinearModel([1.0, 0.0], 0.0)
    X = np.array([[0.5, 0], [-1.0, 0], [-1.0, 1], [2.0, 0]])
    y = np.array([1, 1, 1, 1])
    # hinge losses 0.5, 2, 2, 0: argmax set of size 2
    kl = otstab.certify(model, X, y, loss="hinge", r=2.0, theta1=INF, theta2=0.5)
    assert kl.value == pytest.approx(0.5 * math.log(4 / 2))
    assert kl.risk_star == pytest.approx(2.0)
    assert kl.primal_cost == pytest.approx(kl.value)
    chi = otstab.certify(model, X, y, loss="hinge", r=2.0, theta1=INF, theta2=0.5,
                         divergence="chi2")
    assert chi.value == pytest.approx(0.5 * (4 / 2 - 1))


def test_both_thetas_infinite_means_nothing_changes():
    model, X, y = binary_instance(20, seed=4)
    res = otstab.certify(model, X, y, loss="hinge", r=5.0, theta1=INF, theta2=INF)
    assert res.status == "unreachable" and math.isinf(res.value)


# ------------------------------------------------------------------ models and labels


def test_sklearn_models_and_labels(rng):
    skl = pytest.importorskip("sklearn.linear_model")
    from sklearn.svm import LinearSVC

    X = rng.normal(size=(120, 3))
    ylab = np.where(X[:, 0] + 0.3 * rng.normal(size=120) > 0, "good", "bad")
    for est in (skl.LogisticRegression(), LinearSVC(), skl.SGDClassifier(random_state=0),
                skl.RidgeClassifier(), skl.Perceptron(random_state=0)):
        est.fit(X, ylab)
        res = otstab.certify(est, X, ylab, loss="hinge", r=1.0)
        # same problem through LinearModel with labels mapped by classes_ (classes_[1] -> +1)
        y_pm = np.where(ylab == est.classes_[1], 1, -1)
        lm = otstab.LinearModel(est.coef_.ravel(), float(np.ravel(est.intercept_)[0]))
        ref = otstab.certify(lm, X, y_pm, loss="hinge", r=1.0)
        assert res.value == pytest.approx(ref.value, rel=1e-10)
    y3 = np.digitize(X[:, 0], [-0.5, 0.5])
    lr = skl.LogisticRegression().fit(X, y3)
    res = otstab.certify(lr, X, y3, loss="multiclass_hinge", r=1.0)
    assert_audit(res, 1.0)
    yr = X @ [1.0, 2.0, 0.0] + rng.normal(size=120)
    for reg in (skl.LinearRegression(), skl.Ridge(), skl.Lasso(alpha=0.01),
                skl.QuantileRegressor(quantile=0.5, alpha=0.0)):
        reg.fit(X, yr)
        res = otstab.certify(reg, X, yr, loss="absolute", r=1.5)
        assert_audit(res, 1.5)


def test_dataframe_names_and_index_survive(rng):
    X = pd.DataFrame(rng.normal(size=(30, 2)), columns=["age", "income"],
                     index=np.arange(100, 130))
    y = pd.Series(np.where(X["age"] > 0, 1, -1), index=X.index)
    res = otstab.certify(otstab.LinearModel([1.0, 0.5]), X, y, loss="hinge", r=1.0)
    df = res.to_frame()
    assert {"age", "income", "age*", "income*", "weight", "loss", "loss*"} <= set(df.columns)
    assert df["index"].iloc[0] == 100
    d = res.to_dict()
    assert d["value"] == pytest.approx(res.value)
    assert '"value"' in res.to_json()


def test_multiclass_hinge_on_binary_equals_hinge():
    model, X, y = binary_instance(100, seed=8)
    a = otstab.certify(model, X, y, loss="hinge", r=1.1)
    b = otstab.certify(model, X, y, loss="multiclass_hinge", r=1.1)
    assert a.value == pytest.approx(b.value, rel=1e-10)


def test_pipeline_perturbs_final_inputs(rng):
    pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = pd.DataFrame(rng.normal(size=(80, 2)) * [10, 1], columns=["a", "b"])
    y = (X["a"] / 10 + X["b"] > 0).astype(int)
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    res = otstab.certify(pipe, X, y, loss="hinge", r=1.0)
    Z = pipe[:-1].transform(X)
    ref = otstab.certify(pipe[-1], Z, y, loss="hinge", r=1.0)
    assert res.value == pytest.approx(ref.value, rel=1e-12)
    assert {"a", "b", "a*", "b*"} <= set(res.to_frame().columns)


# ------------------------------------------------------------------ bad input


def test_bad_input_errors_name_the_argument():
    model, X, y = binary_instance(10, seed=0)
    Xn = X.copy()
    Xn[2, 1] = np.nan
    cases = [
        (dict(X=Xn), ValidationError, "X contains NaN"),
        (dict(y=y[:-1]), ValidationError, "samples"),
        (dict(y=np.where(y > 0, 2, -1)), ValidationError, "unknown to the model"),
        (dict(r=-1.0), ValidationError, "r must be"),
        (dict(r=float("nan")), ValidationError, "r must be finite"),
        (dict(theta1=0.0), ValidationError, "theta1"),
        (dict(theta2=-1.0), ValidationError, "theta2"),
        (dict(loss="huber"), ValidationError, "unknown loss"),
        (dict(divergence="tv"), ValidationError, "divergence"),
        (dict(solver="gurobi"), ValidationError, "solver"),
        (dict(loss="absolute"), IncompatibleLossError, "does not fit"),
        (dict(X=X[:, :2]), ValidationError, "features"),
    ]
    for override, exc, text in cases:
        kw = dict(X=X, y=y, loss="hinge", r=1.0)
        kw.update(override)
        with pytest.raises(exc, match=text):
            otstab.certify(model, kw.pop("X"), kw.pop("y"), **kw)
    yf = y.astype(float)
    yf[0] = np.nan
    with pytest.raises(ValidationError, match="y contains NaN"):
        otstab.certify(model, X, yf, loss="hinge", r=1.0)


def test_unfitted_and_unsupported_models():
    pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression

    X = np.zeros((3, 2))
    with pytest.raises(NotFittedError, match="not fitted"):
        otstab.certify(LogisticRegression(), X, [0, 1, 0], loss="hinge", r=1.0)
    with pytest.raises(InputTypeError, match="not supported"):
        otstab.certify(object(), X, [0, 1, 0], loss="hinge", r=1.0)


def test_hinge_on_a_regressor_and_zero_one_r_range():
    model, X, y = regression_instance(10)
    with pytest.raises(IncompatibleLossError, match="regressor"):
        otstab.certify(model, X, y, loss="hinge", r=1.0)
    bm, bX, by = binary_instance(10)
    with pytest.raises(ValidationError, match=r"\[0, 1\]"):
        otstab.certify(bm, bX, by, loss="zero_one", r=1.5)


def test_mosek_without_licence_is_a_clear_error():
    from otstab_solvers.conic import BACKENDS

    ok, why = BACKENDS["mosek"].availability()
    model, X, y = binary_instance(10)
    if ok:
        pytest.skip("MOSEK is licensed here")
    with pytest.raises(SolverNotAvailableError) as info:
        otstab.certify(model, X, y, loss="hinge", r=1.2, solver="mosek")
    msg = str(info.value)
    assert "mosek" in msg.lower() and ("licence" in msg or "install" in msg)
    # auto records why MOSEK was skipped when it gets that far
    res = otstab.certify(model, X, y, loss="hinge", r=1.2, solver="conic")
    assert res.solver_log[-1]["status"] == "optimal"


def test_inputs_are_not_mutated():
    model, X, y = binary_instance(40, seed=1)
    X0, y0, c0 = X.copy(), y.copy(), model.coef_.copy()
    res = otstab.certify(model, X, y, loss="hinge", r=1.2)
    res.X_star[:] = 0
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(model.coef_, c0)


def test_sampled_audit_agrees_with_direct_audit(monkeypatch):
    import otstab.solve._piecewise as core

    model, X, y = multiclass_instance(3000, K=3, seed=21)
    direct = otstab.certify(model, X, y, loss="multiclass_hinge", r=1.4)
    monkeypatch.setattr(core, "AUDIT_DIRECT_MAX", 100)
    monkeypatch.setattr(core, "AUDIT_SAMPLE", 500)
    sampled = otstab.certify(model, X, y, loss="multiclass_hinge", r=1.4)
    assert sampled.info["audit"]["method"] == "sampled"
    assert sampled.info["audit"]["max_rel_error"] < 1e-12
    for f in ("primal_cost", "risk_star", "total_mass", "gap"):
        assert getattr(sampled, f) == pytest.approx(getattr(direct, f), rel=1e-9, abs=1e-12)
    bmodel, bX, by = binary_instance(3000, seed=22)
    d = otstab.certify(bmodel, bX, by, loss="hinge", r=1.2, divergence="chi2")
    monkeypatch.setattr(core, "AUDIT_DIRECT_MAX", 10**9)
    e = otstab.certify(bmodel, bX, by, loss="hinge", r=1.2, divergence="chi2")
    assert d.primal_cost == pytest.approx(e.primal_cost, rel=1e-9)
    np.testing.assert_allclose(d.X_star, e.X_star)


# --- BLAS threads (otstab.threads) --------------------------------------------------------------

def _blas_threads():
    from threadpoolctl import threadpool_info

    return [d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"]


@pytest.mark.parametrize("loss", ["hinge", "zero_one", "logistic"])
def test_linear_paths_run_on_one_blas_thread_and_restore_the_setting(monkeypatch, loss):
    """After the scores, a linear model's certificate runs with BLAS on one thread (its BLAS
    calls are on blocks of a few thousand numbers; docs/scale.md) and gives the caller's
    setting back, also when the path raises."""
    from threadpoolctl import threadpool_limits

    import otstab.solve._core as core

    model, X, y = binary_instance(200)
    seen = []
    honest = core._dispatch

    def spy(*args, **kwargs):
        seen.append(_blas_threads())
        return honest(*args, **kwargs)

    monkeypatch.setattr(core, "_dispatch", spy)
    with threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        res = otstab.certify(model, X, y, loss=loss, r=0.6 if loss != "zero_one" else 0.3)
        assert res.status == "optimal"
        assert _blas_threads() == before
        assert seen and all(n == 1 for n in seen[-1])

        def boom(*args, **kwargs):
            raise RuntimeError("boom")

        monkeypatch.setattr(core, "_dispatch", boom)
        with pytest.raises(RuntimeError, match="boom"):
            otstab.certify(model, X, y, loss=loss, r=0.6 if loss != "zero_one" else 0.3)
        assert _blas_threads() == before
