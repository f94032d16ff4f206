"""The logistic loss of binary linear models under a DataCost (otstab.datacost_smooth): the
branch-and-bound d-transform against brute force over every combination of levels scored by
the pipeline's own decision_function (the continuous variables moved on a fine grid of their
total gain, then refined), and the certificates' value and Q* against it."""

import math

import numpy as np
import pandas as pd
import pytest
from german import (
    GERMAN_COST,
    assert_german_constraints,
    assert_valid_rows,
    german_pipeline,
    star_rows,
)
from scipy.optimize import minimize_scalar
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from test_datacost import SMALL_COST, _continuous_option, _every_level, _small

import otstab
from otstab.errors import ValidationError
from otstab.modeling._datacost import DataCost


def _softplus(t):
    return np.logaddexp(0.0, t)


def _combos(pipe, X, y, rc):
    """(z (n,), gain (n, m), cost (n, m)): every combination of colour, shape, size and k in
    0..8, its score change in the direction -y (the pipeline's decision_function) and its
    DataCost (ResolvedCost.cost: inf where a constraint forbids it)."""
    sign = np.where(np.asarray(y) == pipe.classes_[1], 1.0, -1.0)
    s0 = pipe.decision_function(X)
    cols = {v.name: v for v in rc.variables}
    n = len(X)
    X0, F, m = _every_level(X, cols, np.arange(n))
    src = np.repeat(np.arange(n), m)
    gain = (-sign[src] * (pipe.decision_function(F) - s0[src])).reshape(n, m)
    cost = rc.cost(X0, F).reshape(n, m)
    return -sign * s0, gain, cost


def _water2(t, c1, c2):
    """Least cost of total gain t from two continuous pieces (Q, U), in closed form."""
    (Q1, U1), (Q2, U2) = c1, c2
    i1 = 0.0 if math.isinf(Q1) else 1.0 / Q1
    i2 = 0.0 if math.isinf(Q2) else 1.0 / Q2
    S = i1 + i2
    g1 = t * (i1 / S) if S > 0 else np.zeros_like(t)
    g1 = np.where(g1 > U1, U1, g1)
    g2 = t - g1
    over = g2 > U2
    g1 = np.where(over, t - U2, g1)
    g2 = np.where(over, U2, g2)
    with np.errstate(invalid="ignore"):
        out = (np.where(g1 > 0, Q1 * g1 * g1, 0.0) + np.where(g2 > 0, Q2 * g2 * g2, 0.0))
    return np.where(t <= U1 + U2 + 1e-15, out, math.inf)


def _brute_lh(pipe, X, y, rc, h, theta1, data, continuous):
    """l_h of every sample: max over every combination of levels (and, with ``continuous``,
    over the total gain t of u and v on a grid of 2001 points refined by a bounded scalar
    search) of h softplus(z + gain) - theta1 cost."""
    z, gain, cost = data
    with np.errstate(invalid="ignore"):
        base = np.where(np.isfinite(cost), h * _softplus(z[:, None] + gain) - theta1 * cost,
                        -np.inf)
    if not continuous:
        return base.max(axis=1)
    cols = {v.name: v for v in rc.variables}
    s0 = pipe.decision_function(X)
    sign = -z / np.where(s0 != 0, s0, 1.0)
    slopes = {}
    for nm in ("u", "v"):
        step = X.copy()
        step[nm] = step[nm] + 1.0
        slopes[nm] = pipe.decision_function(step) - s0
    out = np.empty(len(X))
    for i in range(len(X)):
        cs = [_continuous_option(cols[nm], X, i, float(slopes[nm][i]), -sign[i])
              for nm in ("u", "v")]
        inv = sum(0.0 if math.isinf(Q) else 1.0 / Q for Q, _ in cs)
        T = min(sum(U for _, U in cs), h * inv / theta1 * 1.01)
        ok = np.isfinite(cost[i])
        G, C = gain[i, ok], cost[i, ok]
        t = np.linspace(0.0, T, 2001)
        W = _water2(t, *cs)
        V = h * _softplus(z[i] + G[:, None] + t[None, :]) - theta1 * (C[:, None] + W[None, :])
        best = float(V.max())
        # refine the combinations whose grid maximum is near the best
        top = np.argsort(V.max(axis=1))[::-1][:4]
        for c in top:
            j = int(np.argmax(V[c]))
            lo, hi = t[max(j - 1, 0)], t[min(j + 1, t.size - 1)]

            def f(tt, zg=z[i] + G[c], cc=C[c], cs=cs):
                return -(h * float(_softplus(zg + tt))
                         - theta1 * (cc + float(_water2(np.array(tt), *cs))))
            if hi > lo:
                r = minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                    options={"xatol": 1e-13 * max(T, 1.0)})
                best = max(best, -float(r.fun))
        out[i] = best
    return out


def _dual_term(lh, theta2, divergence):
    if math.isinf(theta2):
        return float(np.mean(lh))
    if divergence == "kl":
        top = lh.max()
        return top + theta2 * math.log(float(np.mean(np.exp((lh - top) / theta2))))
    inner = minimize_scalar(
        lambda al: -(al + theta2 - theta2 * float(np.mean(
            np.maximum((lh + al) / (2 * theta2) + 1, 0) ** 2))),
        bounds=(-lh.max() - 4 * theta2, 4 * theta2), method="bounded",
        options={"xatol": 1e-14})
    return inner.fun


def _check_q_star(res, pipe, X, y, r):
    """Q*'s raw rows: valid levels, integral k in its bounds, v only decreased; re-scored by
    the pipeline, their logistic losses reach r."""
    f = res.to_frame(raw=True)
    rows = f[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    rows = rows.astype({"u": float, "v": float, "k": int})
    assert set(rows["colour"]) <= {"red", "green", "blue"}
    assert set(rows["size"]) <= {"S", "M", "L"}
    assert rows["k"].between(0, 8).all() and rows["u"].between(-4, 4).all() | \
        (rows["u"] == f["u"]).all()
    assert np.all(rows["v"].to_numpy() <= f["v"].astype(float).to_numpy())
    sgn = np.where(np.asarray(y)[f["source"]] == 1, 1.0, -1.0)
    loss = _softplus(-sgn * pipe.decision_function(rows))
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    assert float(np.sum(m * w * loss)) / len(X) >= r * (1 - 1e-8)
    np.testing.assert_allclose(f["loss*"].to_numpy(), loss, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("divergence, theta2", [("kl", 0.25), ("chi2", 0.5), ("kl", math.inf)])
def test_discrete_logistic_equals_brute_force(divergence, theta2):
    """u and v immutable: l_h is a maximum of finitely many moves (affine in h), the optimum
    sits at a kink and Q* splits a sample between two moves."""
    pipe, X, y = _small()
    cost = DataCost(**SMALL_COST, immutable=["u", "v"])
    rc = cost.resolve(pipe, X)
    r = 0.9
    res = otstab.certify(pipe, X, y, loss="logistic", r=r, theta2=theta2,
                         divergence=divergence, cost=cost)
    assert res.status == "optimal"
    data = _combos(pipe, X, y, rc)
    out = minimize_scalar(
        lambda h: -(h * r - _dual_term(_brute_lh(pipe, X, y, rc, h, 1.0, data, False), theta2,
                                       divergence)),
        bounds=(0.0, 3 * res.h), method="bounded", options={"xatol": 1e-12})
    assert res.value == pytest.approx(-out.fun, rel=1e-9)
    _check_q_star(res, pipe, X, y, r)


@pytest.mark.parametrize("divergence, theta2", [
    ("kl", 0.25), pytest.param("chi2", 0.5, marks=pytest.mark.slow),
    pytest.param("kl", math.inf, marks=pytest.mark.slow)])
def test_mixed_logistic_equals_brute_force(divergence, theta2):
    """Levels, an integer, a bounded and a one-way continuous variable: the oracle's l_h
    equals the brute force at the certificate's h, and so does the dual there; the dual is
    stationary (no better value at h (1 +- 1e-3))."""
    pipe, X, y = _small(n=12)
    cost = DataCost(**SMALL_COST)
    rc = cost.resolve(pipe, X)
    r = 0.9
    res = otstab.certify(pipe, X, y, loss="logistic", r=r, theta2=theta2,
                         divergence=divergence, cost=cost)
    assert res.status == "optimal"
    data = _combos(pipe, X, y, rc)

    def F(h):
        return h * r - _dual_term(_brute_lh(pipe, X, y, rc, h, 1.0, data, True), theta2,
                                  divergence)
    h = res.h
    assert F(h) == pytest.approx(res.value, rel=1e-9)
    assert F(h * (1 + 1e-3)) <= res.value * (1 + 1e-12)
    assert F(h * (1 - 1e-3)) <= res.value * (1 + 1e-12)
    _check_q_star(res, pipe, X, y, r)


def test_oracle_equals_brute_force_at_many_h():
    """The branch and bound's l_h and its right derivative (the loss at the maximiser) against
    the brute force, from no move (small h) to large moves."""
    from otstab.modeling._losses import get_loss
    from otstab.modeling._models import resolve_model
    from otstab.solve._datacost_linear import flip_problem, linear_parts, raw_frame
    from otstab.solve._datacost_smooth import LogisticOracle

    pipe, X, y = _small(seed=1, n=10)
    cost = DataCost(**SMALL_COST)
    prob = resolve_model(pipe, X, y, loss=get_loss("logistic"))
    frame = raw_frame(pipe, X, prob)
    rc = cost.resolve(pipe, frame, prob.feature_names)
    parts = linear_parts(pipe, prob, rc, frame)
    sgn = prob.y.astype(float)
    fin, ints, conts, _ = flip_problem(rc, parts, frame, -sgn[:, None], np.arange(prob.n))
    theta1 = 1.3
    oracle = LogisticOracle(-sgn * prob.scores, fin, ints, conts, theta1)
    data = _combos(pipe, X, y, rc)
    for h in (0.05, 0.4, 1.0, 3.0, 12.0):
        lh, d1, *_ = oracle.argmax(h)
        ref = _brute_lh(pipe, X, y, rc, h, theta1, data, True)
        np.testing.assert_allclose(lh, ref, rtol=1e-9, atol=1e-12)
        # the derivative is the loss of a move whose objective is l_h
        assert np.all(d1 >= _softplus(-sgn * prob.scores) - 1e-12)


def test_continuous_data_keeps_the_encoded_numbers():
    """On continuous data a StandardScaler's DataCost is the encoded cost: the same value."""
    rng = np.random.default_rng(3)
    X = pd.DataFrame(rng.normal(size=(120, 3)) * [1.0, 3.0, 0.5], columns=["a", "b", "c"])
    y = (X["a"] - X["b"] / 3 + rng.normal(0, 1, 120) > 0).astype(int)
    pipe = Pipeline([("sc", StandardScaler()), ("clf", LogisticRegression())]).fit(X, y)
    for divergence, theta2 in (("kl", 0.25), ("chi2", 1.0), ("kl", math.inf)):
        kw = dict(loss="logistic", r=0.8, theta2=theta2, divergence=divergence)
        a = otstab.certify(pipe, X, y, cost="auto", **kw)
        b = otstab.certify(pipe, X, y, cost="encoded", **kw)
        assert a.status == b.status == "optimal"
        assert a.value == pytest.approx(b.value, rel=1e-9)
    # cross_entropy of a binary model is the logistic loss
    c = otstab.certify(pipe, X, y, loss="cross_entropy", r=0.8, cost="auto")
    d = otstab.certify(pipe, X, y, loss="logistic", r=0.8, cost="auto")
    assert c.value == pytest.approx(d.value, rel=1e-12)


def test_german_logistic_q_star_is_a_valid_data_set():
    pipe, X, y, num, cat, _ = german_pipeline(rows=300)
    cost = DataCost(**GERMAN_COST)
    r = 0.75
    res = otstab.certify(pipe, X, y, loss="logistic", r=r, cost=cost)
    assert res.status == "optimal"
    assert sorted(res.info["cost"]["immutable"]) == ["age", "personal_status_sex"]
    f = res.to_frame(raw=True)
    rows = star_rows(f, X, num)
    assert_valid_rows(rows, pipe, num, cat)
    assert_german_constraints(rows, f)
    assert (f["cost"] > 0).sum() > 10
    # re-scored by the pipeline's own predict_proba: Q* reaches r
    proba = pipe.predict_proba(rows)
    ys = np.asarray(y)[f["source"]]
    p_true = proba[np.arange(len(rows)), np.searchsorted(pipe.classes_, ys)]
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    assert float(np.sum(m * w * -np.log(p_true))) / len(X) >= r * (1 - 1e-8)


def test_refusals():
    pipe, X, y = _small()
    y3 = np.where(X["u"] > 1, 2, np.asarray(y))
    pipe3 = Pipeline([("pre", pipe.named_steps["pre"]), ("clf", LogisticRegression())]).fit(
        X, y3)
    with pytest.raises(ValidationError, match="multiclass classifier"):
        otstab.certify(pipe3, X, y3, loss="logistic", r=1.5, cost="auto")
    with pytest.raises(ValidationError, match="cost=DataCost is exact for"):
        otstab.certify(pipe, X, y, loss="multiclass_hinge", r=1.5, cost="auto")


def test_german_default_cost_is_auto_and_q_star_is_valid():
    """No cost= for a Pipeline with encoders on raw data: the DataCost (auto), said so; Q*'s
    raw rows are valid and, re-scored by the pipeline, reach r (hinge)."""
    pipe, X, y, num, cat, _ = german_pipeline(rows=300)
    r = 1.0
    res = otstab.certify(pipe, X, y, loss="hinge", r=r)
    assert res.status == "optimal" and res.info["cost_used"].startswith("auto (default")
    assert res.value == pytest.approx(
        otstab.certify(pipe, X, y, loss="hinge", r=r, cost="auto").value, rel=1e-12)
    f = res.to_frame(raw=True)
    rows = star_rows(f, X, num)
    assert_valid_rows(rows, pipe, num, cat)
    sgn = np.where(np.asarray(y)[f["source"]] == pipe.classes_[1], 1.0, -1.0)
    loss = np.maximum(1 - sgn * pipe.decision_function(rows), 0)
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    assert float(np.sum(m * w * loss)) / len(X) >= r * (1 - 1e-8)
    # the encoded cost only when asked for (or when the call needs it)
    enc_res = otstab.certify(pipe, X, y, loss="hinge", r=r, feature_costs={"age": 2.0})
    assert enc_res.info["cost_used"].startswith("encoded (default")


def test_edges_before_the_dual():
    """r at or below the base logistic risk: Q* = P0 (status zero, value 0); nothing may move
    or be reweighted (theta1 = theta2 = inf): unreachable, as under the encoded cost."""
    pipe, X, y = _small()
    cost = DataCost(**SMALL_COST)
    sign = np.where(np.asarray(y) == pipe.classes_[1], 1.0, -1.0)
    base = float(np.mean(_softplus(-sign * pipe.decision_function(X))))
    res = otstab.certify(pipe, X, y, loss="logistic", r=0.5 * base, cost=cost)
    assert res.status == "zero" and res.value == 0.0
    assert res.risk_base == pytest.approx(base, rel=1e-12)
    for c in (cost, "encoded"):
        res = otstab.certify(pipe, X, y, loss="logistic", r=base + 0.1, theta1=math.inf,
                             theta2=math.inf, cost=c)
        assert res.status == "unreachable" and math.isinf(res.value)


@pytest.mark.parametrize("loss", ["hinge", "logistic", "cross_entropy"])
def test_reweighting_only_edges_match_the_encoded_cost(loss):
    """theta1 = inf (nothing moves, so the cost is irrelevant): above the largest loss r is
    unreachable, at it the limit value theta2 log(1 / P(A)), below it the reweighting dual --
    the DataCost answers equal the encoded cost's, which decide these edges the same way for
    every model."""
    if loss == "cross_entropy":
        from test_datacost_cross_entropy import _three_class
        pipe, X, y = _three_class()
        S = pipe.predict_log_proba(X)
        loss0 = -S[np.arange(len(X)), np.searchsorted(pipe.classes_, y)]
    else:
        pipe, X, y = _small()
        sign = np.where(np.asarray(y) == pipe.classes_[1], 1.0, -1.0)
        m = sign * pipe.decision_function(X)
        loss0 = np.maximum(1.0 - m, 0.0) if loss == "hinge" else _softplus(-m)
    top = float(loss0.max())
    cost = DataCost(**SMALL_COST)
    for r, want in ((1.1 * top, "unreachable"), (top, "optimal"),
                    (0.5 * (top + loss0.mean()), "optimal")):
        got = [otstab.certify(pipe, X, y, loss=loss, r=r, theta1=math.inf, theta2=0.5,
                              cost=c) for c in (cost, "encoded")]
        assert [g.status for g in got] == [want, want]
        if want == "unreachable":
            assert all(math.isinf(g.value) for g in got)
        else:
            assert got[0].value == pytest.approx(got[1].value, rel=1e-9)
            assert got[0].risk_star == pytest.approx(r, rel=1e-9)
