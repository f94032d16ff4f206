"""The cross-entropy of multiclass linear models under a DataCost
(otstab.solve._datacost_cross_entropy): a certified interval [value_lower, value_upper]
against brute force over every combination of levels scored by the pipeline's own
predict_proba, the sandwich of the d-transforms at many h, Q* as a valid data set."""

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from test_datacost import SMALL_COST, _every_level, _small
from test_datacost_smooth import _dual_term

import otstab
from otstab.errors import ValidationError
from otstab.modeling._datacost import DataCost


def _three_class(seed=5, n=24):
    pipe2, X, _ = _small(seed=seed, n=n)
    rng = np.random.default_rng(seed)
    y = np.where(X["u"] > 1, 2, np.where(X["colour"] == "red", 1, 0))
    y = np.where(rng.random(len(X)) < 0.2, rng.integers(0, 3, len(X)), y)
    pipe = Pipeline([("pre", pipe2.named_steps["pre"]),
                     ("clf", LogisticRegression(C=10.0))]).fit(X, y)
    return pipe, X, y


def _enumerate(pipe, X, y, rc, only=None):
    """(CE (n, m), cost (n, m)): every combination of colour, shape, size and k in 0..8 (u, v
    immutable), its cross-entropy from predict_proba and its DataCost (inf: forbidden; also
    where a variable other than ``only`` changes, when given)."""
    cols = {v.name: v for v in rc.variables}
    n = len(X)
    X0, F, m = _every_level(X, cols, np.arange(n))
    src = np.repeat(np.arange(n), m)
    P = pipe.predict_proba(F)
    ce = -np.log(P[np.arange(len(F)), np.searchsorted(pipe.classes_, y[src])])
    c = rc.cost(X0, F)
    if only is not None:
        other = np.zeros(len(F), dtype=bool)
        for nm in ("colour", "shape", "size", "k"):
            if nm != only:
                other |= (F[nm].to_numpy() != X0[nm].to_numpy())
        c = np.where(other, np.inf, c)
    return ce.reshape(n, m), c.reshape(n, m)


def _brute_lh(ce, cost, h, theta1=1.0):
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(cost), h * ce - theta1 * cost, -np.inf).max(axis=1)


def _check_q_star(res, pipe, X, y, r, fixed=True):
    """Q*'s raw rows: valid levels, integral k in its bounds, u and v unchanged (``fixed``;
    else u in its bounds and v only decreased); re-scored by
    predict_proba, their cross-entropy reaches r and equals loss*; their cost is the value."""
    f = res.to_frame(raw=True)
    rows = f[[f"{c}*" for c in X.columns]].copy()
    rows.columns = list(X.columns)
    rows = rows.astype({"u": float, "v": float, "k": float})
    assert set(rows["colour"]) <= {"red", "green", "blue"}
    assert set(rows["shape"]) <= {"a", "b", "c", "d"}
    assert set(rows["size"]) <= {"S", "M", "L"}
    assert np.all(rows["k"] == np.round(rows["k"])) and rows["k"].between(0, 8).all()
    if fixed:
        np.testing.assert_array_equal(rows["u"], f["u"].astype(float))
        np.testing.assert_array_equal(rows["v"], f["v"].astype(float))
    else:
        x = f["u"].astype(float).to_numpy()  # (a row outside the bounds may only move in)
        assert np.all((rows["u"] >= np.minimum(-4, x)) & (rows["u"] <= np.maximum(4, x)))
        assert np.all(rows["v"] <= f["v"].astype(float))
    P = pipe.predict_proba(rows)
    ce = -np.log(P[np.arange(len(rows)), np.searchsorted(pipe.classes_, y[f["source"]])])
    np.testing.assert_allclose(f["loss*"].to_numpy(), ce, rtol=1e-9, atol=1e-12)
    w, m = f["weight"].to_numpy(), f["mass"].to_numpy()
    assert float(np.sum(m * w * ce)) / len(X) >= r * (1 - 1e-8)
    assert res.primal_cost == pytest.approx(res.value_upper, rel=1e-6)


@pytest.mark.parametrize("divergence, theta2", [
    ("kl", 0.25), pytest.param("chi2", 0.5, marks=pytest.mark.slow),
    pytest.param("kl", math.inf, marks=pytest.mark.slow)])
def test_interval_holds_the_brute_force(divergence, theta2):
    pipe, X, y = _three_class()
    cost = DataCost(**SMALL_COST, immutable=["u", "v"])
    rc = cost.resolve(pipe, X)
    r = 1.5
    res = otstab.certify(pipe, X, y, loss="cross_entropy", r=r, theta2=theta2,
                         divergence=divergence, cost=cost)
    assert res.status == "bounds" and not res.exact
    assert res.value == res.value_upper and 0 < res.value_lower < res.value_upper
    ce, c = _enumerate(pipe, X, y, rc)
    out = minimize_scalar(lambda h: -(h * r - _dual_term(_brute_lh(ce, c, h), theta2,
                                                         divergence)),
                          bounds=(0.0, 5 * res.h), method="bounded", options={"xatol": 1e-12})
    brute = -out.fun
    assert res.value_lower <= brute * (1 + 1e-9)
    assert brute <= res.value_upper * (1 + 1e-9)
    # how tight (not a promise): the candidates hold the maximisers here
    assert res.value_upper == pytest.approx(brute, rel=1e-6)
    assert res.value_lower >= 0.85 * brute
    _check_q_star(res, pipe, X, y, r)


def test_dear_moves_are_exact():
    """theta1 = inf (nothing moves) or dear enough that no move pays: the bound with pi from
    the data is exact there, so both ends equal the reweighting-only R of the encoded path."""
    pipe, X, y = _three_class()
    cost = DataCost(**SMALL_COST, immutable=["u", "v"])
    ref = otstab.certify(pipe, X, y, loss="cross_entropy", r=1.5, cost="encoded",
                         theta1=math.inf)
    assert ref.status == "optimal"
    for theta1 in (math.inf, 30.0):
        res = otstab.certify(pipe, X, y, loss="cross_entropy", r=1.5, cost=cost, theta1=theta1)
        assert res.status == "optimal" and res.exact
        assert res.value_lower == res.value_upper == res.value
        assert res.value == pytest.approx(ref.value, rel=1e-9)


def test_transforms_sandwich_the_brute_force():
    """At many h: max_k l_h[phi(d_k)] <= l_h[CE] <= each upper transform (pi uniform, from
    the data, random per sample), each computed by the binary logistic branch and bound on
    the class's gains."""
    from otstab.modeling._losses import get_loss
    from otstab.modeling._models import resolve_model
    from otstab.solve._datacost_cross_entropy import class_slots
    from otstab.solve._datacost_linear import flip_problem, linear_parts, raw_frame
    from otstab.solve._datacost_smooth import LogisticOracle

    pipe, X, y = _three_class(seed=7, n=16)
    cost = DataCost(**SMALL_COST, immutable=["u", "v"])
    prob = resolve_model(pipe, X, y, loss=get_loss("cross_entropy"))
    frame = raw_frame(pipe, X, prob)
    rc = cost.resolve(pipe, frame, prob.feature_names)
    parts = linear_parts(pipe, prob, rc, frame)
    n, S, yi = prob.n, prob.scores, prob.y.astype(int)
    rows = np.arange(n)
    slots = class_slots(yi, 3)
    assert np.all(slots != yi[:, None]) and np.all(slots[:, 0] < slots[:, 1])
    log_e0 = np.logaddexp.reduce(S[rows[:, None], slots] - S[rows, yi][:, None], axis=1)
    ce, c = _enumerate(pipe, X, y, rc)
    theta1 = 1.7
    pi = np.random.default_rng(0).dirichlet([0.5, 0.5], size=n)
    for h in (0.05, 0.5, 2.0, 8.0):
        lo = up1 = up2 = up3 = -np.inf
        for j in range(2):
            k = slots[:, j]
            coef = -np.eye(3)[yi]
            coef[rows, k] += 1.0
            fin, ints, conts, _ = flip_problem(rc, parts, frame, coef, rows)
            z = S[rows, k] - S[rows, yi]
            lo = np.maximum(lo, LogisticOracle(z, fin, ints, conts, theta1).argmax(h)[0])
            up1 = np.maximum(up1, LogisticOracle(z + math.log(2), fin, ints, conts,
                                                 theta1).argmax(h)[0])
            up2 = np.maximum(up2, LogisticOracle(log_e0, fin, ints, conts,
                                                 theta1).argmax(h)[0])
            up3 = np.maximum(up3, LogisticOracle(z - np.log(pi[:, j]), fin, ints, conts,
                                                 theta1).argmax(h)[0])
        ref = _brute_lh(ce, c, h, theta1)
        tol = 1e-9 * (1 + np.abs(ref))
        assert np.all(lo <= ref + tol)
        assert np.all(ref <= np.minimum(np.minimum(up1, up2), up3) + tol)


def test_feature_scores_carry_their_interval():
    """feature_stability under the cost: each raw variable's score is certify's interval with
    only that variable movable (score_lower, score_upper, exact), holding the brute force."""
    pipe, X, y = _three_class()
    cost = DataCost(**SMALL_COST, immutable=["u", "v"])
    rc = cost.resolve(pipe, X)
    r, theta2 = 1.5, 0.25
    fs = otstab.feature_stability(pipe, X, y, loss="cross_entropy", r=r, cost=cost,
                                  features=["shape"]).to_frame()
    assert {"score_lower", "score_upper", "exact"} <= set(fs.columns)
    for _, row in fs.iterrows():
        ce, c = _enumerate(pipe, X, y, rc, only=row["feature"])
        out = minimize_scalar(lambda h, ce=ce, c=c: -(h * r - _dual_term(
                                  _brute_lh(ce, c, h), theta2, "kl")),
                              bounds=(0.0, 5 * row["h"]), method="bounded",
                              options={"xatol": 1e-12})
        assert row["score_lower"] <= -out.fun * (1 + 1e-9)
        assert -out.fun <= row["score_upper"] * (1 + 1e-9)
        assert row["score"] == row["score_upper"]


def test_bootstrap_and_refusals():
    pipe, X, y = _three_class()
    cost = DataCost(**SMALL_COST, immutable=["u", "v"])
    res = otstab.certify(pipe, X, y, loss="cross_entropy", r=1.5, cost=cost,
                         se=otstab.Bootstrap(n_resamples=20, random_state=0))
    inf = res.inference
    assert inf.method == "bootstrap" and inf.replicates.size == 20
    assert np.all(np.isfinite(inf.replicates) | np.isinf(inf.replicates))
    assert "upper" in inf.note and not inf.reliable
    with pytest.raises(ValidationError, match="multiclass classifier"):
        otstab.certify(pipe, X, y, loss="logistic", r=1.5, cost=cost)


def test_zero_when_r_is_below_the_base_risk():
    pipe, X, y = _three_class()
    res = otstab.certify(pipe, X, y, loss="cross_entropy", r=0.01,
                         cost=DataCost(**SMALL_COST))
    assert res.status == "zero" and res.value == 0.0


@pytest.mark.slow
def test_continuous_interval_holds_the_candidates_dual():
    """Levels, an integer and two continuous variables: a valid Q*, and the interval holds
    the upper end (checked by Q*'s re-scoring) above the certified lower end."""
    pipe, X, y = _three_class()
    r = 1.5
    res = otstab.certify(pipe, X, y, loss="cross_entropy", r=r, cost=DataCost(**SMALL_COST))
    assert res.status == "bounds" and 0 < res.value_lower < res.value_upper
    assert res.value_lower >= 0.8 * res.value_upper
    _check_q_star(res, pipe, X, y, r, fixed=False)
