"""otstab.shift_cost: the cost S of an observed shift (issue 32) and budget_used.

Independent checks: the convex program written densely from its definition and solved by
cvxpy (ECOS/SCS for an exponential cone, here Clarabel on a dense formulation that shares no
code with the library's), the W2^2 assignment (scipy's linear_sum_assignment), the KL and chi2
of duplicated rows computed by hand, the theorem S(marginal of Q*) = R, and the model's own
losses on the current data when S < R is certified."""

import math

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linear_sum_assignment
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import otstab
from otstab import DataCost, LinearModel, certify, shift_cost
from otstab.errors import ValidationError
from otstab.shift import pairwise_datacost


def direct(D, ya, yb, theta1, theta2, div, p=None, q=None):
    """min theta1 <G, D> + theta2 sum_i p_i phi(a_i/p_i) over plans G >= 0 with columns q,
    zero across labels: the program of docs/math.md written densely (n x m variables)."""
    n, m = D.shape
    p = np.full(n, 1 / n) if p is None else p / p.sum()
    q = np.full(m, 1 / m) if q is None else q / q.sum()
    allowed = (ya[:, None] == yb[None, :]) & np.isfinite(D)
    G = cp.Variable((n, m), nonneg=True)
    a = cp.sum(G, axis=1)
    cons = [cp.sum(G, axis=0) == q, cp.multiply(G, (~allowed).astype(float)) == 0]
    obj = theta1 * cp.sum(cp.multiply(np.where(allowed, D, 0.0), G))
    if math.isinf(theta2):
        cons.append(a == p)
    elif div == "kl":
        obj = obj + theta2 * cp.sum(cp.rel_entr(a, p) - a + p)
    else:
        obj = obj + theta2 * cp.sum(cp.multiply(1 / p, cp.square(a - p)))
    pr = cp.Problem(cp.Minimize(obj), cons)
    pr.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert pr.status in ("optimal", "optimal_inaccurate")
    return pr.value


def sqdist(A, B):
    return ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)


def _instance(seed, n=14, m=11, d=3, labels=2):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, d))
    B = rng.normal(size=(m, d)) * 1.3 + 0.4
    ya = rng.integers(0, labels, n)
    yb = rng.integers(0, labels, m)
    yb[:labels] = np.arange(labels)
    ya[:labels] = np.arange(labels)
    return A, ya, B, yb, rng


def _inside(res, value, rel=1e-6):
    tol = rel * max(abs(value), 1e-12)
    assert res.value_lower <= value + tol, (res.value_lower, value)
    assert res.value_upper >= value - tol, (res.value_upper, value)


# ------------------------------------------------------------------------------------------
# the value


@pytest.mark.parametrize("div", ["kl", "chi2"])
@pytest.mark.parametrize("theta1,theta2", [(1.0, 0.25), (0.3, 2.0)])
def test_conic_matches_the_program_written_directly(div, theta1, theta2):
    for seed in range(2):
        A, ya, B, yb, rng = _instance(seed)
        p = rng.uniform(0.5, 2.0, len(A))
        ref = direct(sqdist(A, B), ya, yb, theta1, theta2, div, p=p)
        res = shift_cost(A, ya, B, yb, theta1=theta1, theta2=theta2, divergence=div,
                         solver="conic", sample_weight=p)
        assert res.status == "optimal"
        assert res.value == pytest.approx(ref, rel=1e-6)
        _inside(res, ref)
        assert res.moving + res.reweighting == pytest.approx(res.value, rel=1e-12)
        # the plan is feasible and prices to the value
        plan = res.to_frame("plan")
        cols = plan.groupby("cur")["mass"].sum().reindex(range(len(B)), fill_value=0)
        np.testing.assert_allclose(cols.to_numpy(), 1 / len(B), rtol=1e-12)
        assert np.all(ya[plan["ref"]] == yb[plan["cur"]])


@pytest.mark.parametrize("div", ["kl", "chi2"])
def test_dual_solver_agrees_with_the_conic_one(div):
    A, ya, B, yb, _ = _instance(3, n=9, m=8)
    conic = shift_cost(A, ya, B, yb, theta1=1.0, theta2=0.5, divergence=div, solver="conic")
    dual = shift_cost(A, ya, B, yb, theta1=1.0, theta2=0.5, divergence=div, solver="dual",
                      rtol=1e-6)
    assert dual.status == "optimal"
    assert dual.value == pytest.approx(conic.value, rel=1e-6)
    _inside(dual, conic.value)
    _inside(conic, dual.value)


@pytest.mark.slow  # importing POT imports torch when installed: ~15 s on a loaded machine
def test_pot_solver_interval_contains_the_value():
    pytest.importorskip("ot")
    A, ya, B, yb, _ = _instance(4)
    conic = shift_cost(A, ya, B, yb, theta1=1.0, theta2=0.5, solver="conic")
    pot = shift_cost(A, ya, B, yb, theta1=1.0, theta2=0.5, solver="pot")
    _inside(pot, conic.value, rel=1e-9)  # certified: whatever the solver, it brackets S
    assert pot.value == pytest.approx(conic.value, rel=1e-2)


@pytest.mark.parametrize("solver", ["conic", "dual",
                                    pytest.param("pot", marks=pytest.mark.slow)])
def test_theta2_inf_is_the_w2_assignment(solver):
    if solver == "pot":
        pytest.importorskip("ot")
    rng = np.random.default_rng(5)
    n = 10
    A = rng.normal(size=(n, 2))
    B = rng.normal(size=(n, 2)) + 1.0
    y = np.zeros(n, dtype=int)
    D = sqdist(A, B)
    r, c = linear_sum_assignment(D)
    w2 = 1.7 * D[r, c].sum() / n
    res = shift_cost(A, y, B, y, theta1=1.7, theta2=math.inf, solver=solver)
    assert res.value == pytest.approx(w2, rel=1e-6)
    _inside(res, w2)
    assert res.reweighting == 0.0
    np.testing.assert_allclose(res.weights, 1.0, rtol=1e-9)
    # labels: the assignment within each label class
    y2 = np.repeat([0, 1], n // 2)
    yb = rng.permutation(y2)
    expect = 0.0
    for k in (0, 1):
        Dk = D[np.ix_(y2 == k, yb == k)]
        rr, cc = linear_sum_assignment(Dk)
        expect += 1.7 * Dk[rr, cc].sum() / n
    res = shift_cost(A, y2, B, yb, theta1=1.7, theta2=math.inf, solver=solver)
    assert res.value == pytest.approx(expect, rel=1e-6)


@pytest.mark.parametrize("div", ["kl", "chi2"])
def test_theta1_inf_is_the_divergence_of_duplicated_rows(div):
    rng = np.random.default_rng(6)
    A = rng.normal(size=(6, 2))
    ya = np.array([0, 0, 1, 1, 0, 1])
    counts = np.array([3, 1, 0, 2, 1, 5])           # row 2 disappears
    B = np.repeat(A, counts, axis=0)
    yb = np.repeat(ya, counts)
    perm = rng.permutation(len(B))
    P = np.full(6, 1 / 6)
    Q = counts / counts.sum()
    phi = (lambda t: np.where(t > 0, t * np.log(np.where(t > 0, t, 1)) - t + 1, 1.0)) \
        if div == "kl" else (lambda t: (t - 1) ** 2)
    expect = 0.8 * float(np.sum(P * phi(Q / P)))
    res = shift_cost(A, ya, B[perm], yb[perm], theta1=math.inf, theta2=0.8, divergence=div)
    assert res.value == pytest.approx(expect, rel=1e-12)
    assert res.moving == 0.0 and res.status == "optimal"
    if div == "kl":  # all the mass of a row goes to its copies: KL(Q || P)
        kl = float(np.sum(Q[Q > 0] * np.log(Q[Q > 0] / P[Q > 0])))
        assert res.value == pytest.approx(0.8 * kl, rel=1e-12)
    # a finite but huge theta1 tends to it (the same program with moves priced out)
    big = shift_cost(A, ya, B[perm], yb[perm], theta1=1e6, theta2=0.8, divergence=div,
                     solver="conic")
    # (rel 1e-5: Clarabel 0.6, the oldest allowed, solves this one to 2.7e-6)
    assert big.value == pytest.approx(expect, rel=1e-5)
    # a current row with no identical reference row: no zero-cost shift
    B2 = B.copy()
    B2[0, 0] += 1e-3
    res = shift_cost(A, ya, B2, yb, theta1=math.inf, theta2=0.8, divergence=div)
    assert res.status == "unreachable" and math.isinf(res.value)


def test_identical_samples_cost_zero():
    A, ya, _, _, rng = _instance(7)
    perm = rng.permutation(len(A))
    for t1, t2, div in [(1.0, 0.25, "kl"), (math.inf, 1.0, "chi2"), (2.0, math.inf, "kl")]:
        res = shift_cost(A, ya, A[perm], ya[perm], theta1=t1, theta2=t2, divergence=div)
        assert res.value == 0.0 and res.status == "zero"
        assert res.value_lower == res.value_upper == 0.0
    # duplicated rows with proportional weights are the same distribution too
    res = shift_cost(A, ya, np.vstack([A, A]), np.concatenate([ya, ya]))
    assert res.value == 0.0
    # a small change costs a little, and more change costs more (monotone along a path)
    vals = [shift_cost(A, ya, A + t, ya, solver="conic").value for t in (0.0, 0.05, 0.2)]
    assert vals[0] == 0.0 < vals[1] < vals[2]


def test_labels_that_cannot_be_matched():
    A, ya, B, yb, _ = _instance(8)
    res = shift_cost(A, np.zeros(len(A), int), B, yb)  # class 1 absent from the reference
    assert res.status == "unreachable" and math.isinf(res.value)
    assert "labels never move" in res.message
    # a class absent from the current data: its reference rows lose their mass (phi(0) = 1)
    yc = np.zeros(len(B), int)
    res = shift_cost(A, ya, B, yc, theta1=1.0, theta2=0.5, solver="conic")
    ref = direct(sqdist(A, B), ya, yc, 1.0, 0.5, "kl")
    assert res.value == pytest.approx(ref, rel=1e-6)
    res = shift_cost(A, ya, B, yc, theta1=1.0, theta2=math.inf)
    assert res.status == "unreachable"


# ------------------------------------------------------------------------------------------
# S against R


def _hinge_risk(model, X, y, w):
    return float(np.sum(w * np.maximum(0.0, 1 - y * (X @ model.coef_ + model.intercept_)))
                 / np.sum(w))


@pytest.mark.parametrize("div", ["kl", "chi2"])
def test_the_marginal_of_qstar_costs_exactly_r(div):
    """Every plan onto the W-weighted marginal of Q* has risk r (so S >= R) and Q* is one (so
    S <= R): S = R, the two programs' units agree."""
    rng = np.random.default_rng(11)
    for t1, t2 in [(1.0, 0.5), (2.0, math.inf)]:
        X = rng.normal(size=(20, 2))
        y = np.where(rng.random(20) < 0.5, -1, 1)
        model = LinearModel(rng.normal(size=2), 0.1)
        r = 1.3 * _hinge_risk(model, X, y, np.ones(20)) + 0.05
        res = certify(model, X, y, loss="hinge", r=r, theta1=t1, theta2=t2, divergence=div)
        S = shift_cost(X, y, res.X_star, y[res.source], theta1=t1, theta2=t2, divergence=div,
                       sample_weight_cur=res.mass * res.weights)
        assert S.value == pytest.approx(res.value, rel=1e-6)
        assert _hinge_risk(model, res.X_star, y[res.source], res.mass * res.weights) == \
            pytest.approx(r, rel=1e-8)


def test_s_below_r_certifies_the_risk_on_the_current_data():
    rng = np.random.default_rng(12)
    certified = refuted = 0
    for trial in range(8):
        n = 16
        X = rng.normal(size=(n, 2))
        y = np.where(rng.random(n) < 0.5, -1, 1)
        model = LinearModel(rng.normal(size=2), rng.normal() * 0.3)
        base = _hinge_risk(model, X, y, np.ones(n))
        r = base * rng.uniform(1.05, 1.6) + 0.02
        div = ("kl", "chi2")[trial % 2]
        res = certify(model, X, y, loss="hinge", r=r, theta1=1.0, theta2=0.5, divergence=div)
        # the current data: rows moved at random (some towards Q*), some duplicated/dropped
        keep = np.concatenate([np.arange(n), rng.integers(0, n, rng.integers(0, 4))])
        Xc = X[keep] + rng.normal(size=(len(keep), 2)) * (0.02, 0.1, 2.0)[trial % 3] \
            * (rng.random((len(keep), 1)) < 0.5)
        yc = y[keep]
        S = shift_cost(X, y, Xc, yc, theta1=1.0, theta2=0.5, divergence=div)
        use = res.budget_used(S)
        risk = _hinge_risk(model, Xc, yc, np.ones(len(yc)))
        if use.certified:
            certified += 1
            assert risk < r, (trial, S.value, res.value, risk, r)
        # a current sample at risk r (Q*'s marginal) is never certified
        w = res.mass * res.weights
        at_r = shift_cost(X, y, res.X_star, y[res.source], theta1=1.0, theta2=0.5,
                          divergence=div, sample_weight_cur=w)
        assert _hinge_risk(model, res.X_star, y[res.source], w) >= r * (1 - 1e-9)
        if not res.budget_used(at_r).certified:
            refuted += 1
    assert certified >= 2 and refuted == 8  # both sides were exercised


def test_budget_used_reports_and_refuses_other_units():
    rng = np.random.default_rng(13)
    X = rng.normal(size=(20, 2))
    y = np.where(rng.random(20) < 0.5, -1, 1)
    model = LinearModel([1.0, -0.5], 0.0)
    r = _hinge_risk(model, X, y, np.ones(20)) + 0.3
    res = certify(model, X, y, loss="hinge", r=r, theta1=1.0, theta2=0.5)
    S = shift_cost(X, y, X + 0.01, y, theta1=1.0, theta2=0.5)
    use = otstab.budget_used(res, S)
    assert use.certified and use.outcome == "certified_below_r"
    assert "certified below r" in use.conclusion
    assert use.share == pytest.approx(S.value_upper / res.value_lower)
    lo, hi = use.R_ci
    assert lo <= res.value <= hi
    assert "R(beta, r" in use.summary() and len(repr(use)) < 1500
    with pytest.raises(ValidationError, match="theta2 differs"):
        otstab.budget_used(res, shift_cost(X, y, X + 0.01, y, theta1=1.0, theta2=0.7))
    with pytest.raises(ValidationError, match="divergence"):
        otstab.budget_used(res, shift_cost(X, y, X + 0.01, y, theta1=1.0, theta2=0.5,
                                           divergence="chi2"))
    with pytest.raises(ValidationError, match="rows"):
        otstab.budget_used(res, shift_cost(X[:10], y[:10], X + 0.01, y, theta1=1.0,
                                           theta2=0.5))
    Xo = X.copy()
    Xo[0, 0] += 1.0
    with pytest.raises(ValidationError, match="evaluation data"):
        otstab.budget_used(res, shift_cost(Xo, y, X + 0.01, y, theta1=1.0, theta2=0.5))
    big = shift_cost(X, y, X + 3.0, y, theta1=1.0, theta2=0.5)
    use = otstab.budget_used(res, big)
    assert not use.certified and "no guarantee" in use.conclusion


# ------------------------------------------------------------------------------------------
# DataCost


def _mixed(seed, n):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"colour": rng.choice(["red", "green", "blue"], n),
                      "u": rng.normal(0, 2, n), "k": rng.integers(0, 5, n)})
    y = rng.integers(0, 2, n)
    return X, y, rng


def test_pairwise_datacost_is_the_row_cost():
    X0, _, rng = _mixed(20, 9)
    X1, _, _ = _mixed(21, 7)
    X1 = X1.astype({"k": float})
    X1.loc[0, "colour"] = "purple"                      # a level outside the allowed ones
    X1.loc[1, "k"] = 2.5                                 # a fractional integer
    spec = DataCost(switch={"colour": {"red": {"green": 0.5, "blue": 2.0},
                                       "green": {"red": 0.5}}},
                    bounds={"u": (-3, 3)}, increase_only=["k"], scale={"u": 2.0})
    rc = spec.resolve(None, X0)
    D = pairwise_datacost(rc, X0, X1).block(np.arange(9), np.arange(7))
    ii, jj = np.meshgrid(np.arange(9), np.arange(7), indexing="ij")
    rows = rc.cost(X0.iloc[ii.ravel()].reset_index(drop=True),
                   X1.iloc[jj.ravel()].reset_index(drop=True))
    np.testing.assert_array_equal(D.ravel(), rows)
    assert np.isinf(D).any() and np.isfinite(D).any()


def test_datacost_shift_matches_the_program_on_its_costs():
    X0, y0, rng = _mixed(22, 12)
    X1, y1, _ = _mixed(23, 10)
    spec = DataCost(immutable=["colour"])
    rc = spec.resolve(None, X0)
    ii, jj = np.meshgrid(np.arange(12), np.arange(10), indexing="ij")
    D = rc.cost(X0.iloc[ii.ravel()].reset_index(drop=True),
                X1.iloc[jj.ravel()].reset_index(drop=True)).reshape(12, 10)
    y0[:] = 0
    y1[:] = 0
    X1.loc[:, "colour"] = X0["colour"].iloc[:10].to_numpy()
    D = rc.cost(X0.iloc[ii.ravel()].reset_index(drop=True),
                X1.iloc[jj.ravel()].reset_index(drop=True)).reshape(12, 10)
    ref = direct(D, y0, y1, 1.0, 0.5, "kl")
    res = shift_cost(X0, y0, X1, y1, theta1=1.0, theta2=0.5, cost=spec, by="colour")
    assert res.cost == "datacost" and res.value == pytest.approx(ref, rel=1e-6)
    table = res.to_frame("variables")
    assert set(table["variable"]) == {"colour", "u", "k"}
    assert table.loc[table["variable"] == "colour", "cost"].item() == 0.0  # immutable
    assert table["share"].sum() == pytest.approx(1.0)
    groups = res.to_frame("groups")
    assert set(groups["column"]) == {"label", "colour"}
    sub = groups[groups["column"] == "colour"]
    assert sub["transported"].sum() == pytest.approx(1.0)


def test_pipeline_encoded_cost_is_the_models_input_space():
    X0, y0, rng = _mixed(24, 30)
    X1, y1, _ = _mixed(25, 25)
    ct = ColumnTransformer([("num", StandardScaler(), ["u", "k"]),
                            ("cat", OneHotEncoder(), ["colour"])])
    pipe = Pipeline([("pre", ct), ("clf", LogisticRegression())]).fit(X0, y0)
    res = shift_cost(X0, y0, X1, y1, model=pipe, solver="conic")
    A, B = pipe[:-1].transform(X0), pipe[:-1].transform(X1)
    ref = shift_cost(A, y0, B, y1, solver="conic")
    assert res.value == pytest.approx(ref.value, rel=1e-9)
    assert "num__u" in set(res.variables["variable"])
    cert = certify(pipe, X0, y0, loss="zero_one", r=0.5, cost="encoded")
    use = cert.budget_used(res)  # same reference data in the model's space: comparable
    assert use.outcome in ("certified_below_r", "not_certified")


# ------------------------------------------------------------------------------------------
# inputs and the result object


@pytest.mark.parametrize("kwargs,match", [
    ({"theta1": 0.0}, "theta1"), ({"theta2": -1}, "theta2"), ({"divergence": "tv"},
                                                             "divergence"),
    ({"solver": "magic"}, "solver"), ({"rtol": 2.0}, "rtol"), ({"by": "nope"}, "by"),
    ({"sample_weight": [1.0, 2.0]}, "sample_weight"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    A, ya, B, yb, _ = _instance(30)
    with pytest.raises(ValidationError, match=match):
        shift_cost(A, ya, B, yb, **kwargs)


def test_bad_data_is_refused_before_work():
    A, ya, B, yb, _ = _instance(31)
    with pytest.raises(ValidationError, match="y_cur"):
        shift_cost(A, ya, B, yb[:-1])
    with pytest.raises(ValidationError, match="columns"):
        shift_cost(A, ya, B[:, :2], yb)
    with pytest.raises(ValidationError, match="DataFrames"):
        shift_cost(A, ya, B, yb, cost="auto")
    Bn = B.copy()
    Bn[0, 0] = np.nan
    with pytest.raises(ValidationError, match="missing"):
        shift_cost(A, ya, Bn, yb)


def test_result_conventions():
    A, ya, B, yb, _ = _instance(32)
    A0, B0 = A.copy(), B.copy()
    res = shift_cost(A, ya, B, yb, solver="conic")
    np.testing.assert_array_equal(A, A0)
    np.testing.assert_array_equal(B, B0)
    assert len(repr(res)) < 1500 and "ShiftCost(value=" in repr(res)
    d = res.to_dict()
    assert d["value"] == res.value and isinstance(d["variables"], list)
    import json
    assert json.loads(res.to_json())["status"] == "optimal"
    assert "<pre>" in res._repr_html_() and "<table" in res._repr_html_()
    assert "certified interval" in res.summary()
    with pytest.raises(ValidationError, match="what"):
        res.to_frame("nothing")


def test_datacost_certificate_and_shift_share_their_units():
    from test_datacost import _small

    pipe, X, y = _small(0, 30)
    res = certify(pipe, X, y, loss="zero_one", r=0.4, cost="auto")
    X2 = X.assign(u=X["u"] + 0.1)
    S = shift_cost(X, y, X2, y, cost="auto", model=pipe)
    use = res.budget_used(S)
    assert use.certified and float(np.mean(pipe.predict(X2) != y)) < 0.4
    # the moving cost is u's alone, priced by the pipeline's scaler: 0.1^2 / scale^2
    scale = pipe[0].named_transformers_["num"].scale_[0]
    assert S.value == pytest.approx((0.1 / scale) ** 2, rel=1e-6)
    assert S.variables["variable"].iloc[0] == "u"
    with pytest.raises(ValidationError, match="transport costs differ"):
        res.budget_used(shift_cost(X, y, X2, y, model=pipe))


@pytest.mark.parametrize("div,theta2", [("kl", 0.5), ("chi2", 0.5), ("kl", math.inf)])
def test_chunked_passes_give_the_dense_answer(monkeypatch, div, theta2):
    """Large classes never store the cost matrix: every pass recomputes it in row chunks
    (forced here on a small problem) and must give the same answer."""
    import otstab.shift._shift_cost as sc

    A, ya, B, yb, _ = _instance(40, n=12, m=12)
    if math.isinf(theta2):
        yb = np.sort(ya)
        ya = np.sort(ya)
    dense = shift_cost(A, ya, B, yb, theta2=theta2, divergence=div, solver="dual")
    monkeypatch.setattr(sc, "DENSE_MAX_PAIRS", 0)
    monkeypatch.setattr(sc, "CHUNK_ENTRIES", 5 * 12 * 3)  # three chunks of rows
    chunked = shift_cost(A, ya, B, yb, theta2=theta2, divergence=div, solver="dual")
    # (the matrix products round differently per chunk, so L-BFGS takes another path: the
    # answers agree to the solver's rtol, and both intervals hold the conic value)
    assert chunked.status == dense.status == "optimal"
    assert chunked.value == pytest.approx(dense.value, rel=1e-6)
    by_name = dense.variables.set_index("variable")["cost"]
    np.testing.assert_allclose(chunked.variables.set_index("variable")["cost"][by_name.index],
                               by_name, rtol=1e-4, atol=1e-12)
    conic = shift_cost(A, ya, B, yb, theta2=theta2, divergence=div, solver="conic")
    _inside(chunked, conic.value)
    _inside(dense, conic.value)


@pytest.mark.parametrize("solver", ["conic", "dual"])
@pytest.mark.parametrize("offset", [1e4, 1e6])
def test_interval_is_certified_far_from_the_origin(solver, offset):
    """The encoded cost is translation invariant, so data moved far from 0 have the same S.
    The expansion |a|^2 + |b|^2 - 2 a.b used to round relative to |a|^2 (about 1e-4 per pair
    at offset 1e6 against distances of 1e-6) and certified a value that the shift at offset 0
    refutes; the interval at every offset must overlap the one at 0."""
    rng = np.random.default_rng(3)
    Xr = rng.normal(size=(60, 3))
    Xc = Xr + 1e-3 * rng.normal(size=(60, 3))
    y = rng.integers(0, 2, 60)
    base = otstab.shift_cost(Xr, y, Xc, y, theta1=1.0, theta2=0.5, solver=solver)
    far = otstab.shift_cost(Xr + offset, y, Xc + offset, y, theta1=1.0, theta2=0.5,
                            solver=solver)
    tol = 1e-9 * base.value_upper
    assert far.value_lower <= base.value_upper + tol
    assert base.value_lower <= far.value_upper + tol
    assert far.value_upper <= 1.01 * base.value_upper  # and it stays informative
