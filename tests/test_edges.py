"""Exact at the edges (issue 27): a sample just outside the margin, r near the base risk,
weights that sum to 1 - 1 ulp, and the weak-duality check of the audit.

Every expected number is computed independently: a 50-digit 1-D dual from the model's own
margins (:mod:`hp_dual`), the conic backend, or a closed form derived in the test.
"""

import math

import numpy as np
import pytest
from hp_dual import dual

import otstab

# issue 27, item 1: sample 0 has margin 1 + 7.7e-5; its kink is at h = 3.1e-8, the optimum at
# h = 7.7e-10 (only sample 1 moves there)
BETA = np.array([-2.435049445341106, -1.9781367493482929])
B = 1.7622947504921098
X_PLANTED = np.array([[1.6593470415858023, -0.646174005487151],
                      [0.6098721138170045, 0.4549799886149021]])
Y_PLANTED = np.array([-1, -1])


def planted():
    model = otstab.LinearModel(BETA, B)
    margins = Y_PLANTED * model.decision_function(X_PLANTED)
    base = float(np.mean(np.maximum(0.0, 1.0 - margins)))
    return model, margins, base * (1 + 1e-5)


@pytest.mark.parametrize("divergence,theta2", [("kl", 1.0), ("chi2", 1.0), ("kl", math.inf)])
def test_planted_margin_value(divergence, theta2):
    model, margins, r = planted()
    res = otstab.certify(model, X_PLANTED, Y_PLANTED, loss="hinge", r=r, theta1=1e-3,
                         theta2=theta2, divergence=divergence)
    ref, h_ref = dual("hinge", 1.0 - margins, r, theta2, divergence,
                      c=float(BETA @ BETA) / (4e-3))
    assert res.status == "optimal"
    assert res.value == pytest.approx(ref, rel=1e-8)
    assert res.h == pytest.approx(h_ref, rel=1e-8)
    # theta2 = inf in closed form: only sample 1 moves, F(h) = h (r - base) - c h^2 / 2
    if math.isinf(theta2):
        c = float(BETA @ BETA) / (4e-3)
        gap = r - float(np.mean(np.maximum(0.0, 1.0 - margins)))
        assert res.value == pytest.approx(gap * gap / (2 * c), rel=1e-8)
    conic = otstab.certify(model, X_PLANTED, Y_PLANTED, loss="hinge", r=r, theta1=1e-3,
                           theta2=theta2, divergence=divergence, solver="conic")
    assert res.value == pytest.approx(conic.value, rel=1e-6)


def test_planted_margin_feature_scores():
    """feature_stability's one-sort path against certify(features=[j]) and the 50-digit dual
    with c_j = beta_j^2 / (4 theta1) (only coordinate j moves)."""
    model, margins, r = planted()
    scores = otstab.feature_stability(model, X_PLANTED, Y_PLANTED, loss="hinge", r=r,
                                      theta1=1e-3, theta2=1.0)
    for j in range(2):
        one = otstab.certify(model, X_PLANTED, Y_PLANTED, loss="hinge", r=r, theta1=1e-3,
                             theta2=1.0, features=[j])
        ref, _ = dual("hinge", 1.0 - margins, r, 1.0, "kl", c=BETA[j] ** 2 / 4e-3)
        score = float(scores.set_index("feature").loc[f"x{j}", "score"])
        assert one.status == "optimal"
        assert one.value == pytest.approx(ref, rel=1e-8)
        assert score == pytest.approx(ref, rel=1e-8)


# -- issue 27, item 3: weighted 0/1 at r = 1 ---------------------------------------------------
# LinearModel([1], 0) on x = 1..10, y = 1: every row is correct with margin x_i, so the
# distance to the boundary is d*_i = x_i^2 (||w|| = 1). Weights 0 on the first three rows: P0
# puts 1/7 on x = 4..10. At r = 1 every charged row must be misclassified: with theta2 = inf
# each moves to the boundary, R = sum p_i theta1 d*_i = (16 + 25 + ... + 100) / 7 = 371 / 7
# = 53; with KL every row moves and l_h = h - a_i, so F(h) = -theta2 log sum p_i
# exp(-a_i / theta2) for every h >= max a (the h terms cancel).
X_W = np.arange(1, 11, dtype=float)[:, None]
Y_W = np.ones(10)
SW = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 1.0])


def _r1_expected(theta2, a):
    p = SW / SW.sum()
    if math.isinf(theta2):
        return float(np.sum(p * a))
    return -theta2 * math.log(float(np.sum(p * np.exp(-a / theta2))))


@pytest.mark.parametrize("theta2", [math.inf, 1.0])
def test_weighted_zero_one_at_r_one(theta2):
    model = otstab.LinearModel([1.0], 0.0)
    assert (SW / SW.sum()).sum() != 1.0  # the case: normalised weights sum to 1 - 1 ulp
    res = otstab.certify(model, X_W, Y_W, loss="zero_one", r=1.0, theta1=1.0, theta2=theta2,
                         sample_weight=SW)
    assert res.status == "optimal", res.message
    assert res.value == pytest.approx(_r1_expected(theta2, X_W[:, 0] ** 2), rel=1e-6)
    if math.isinf(theta2):
        assert res.value == pytest.approx(53.0, rel=1e-6)
    # the rows of zero weight carry no mass: the answer without them is the same
    plain = otstab.certify(model, X_W[3:], Y_W[3:], loss="zero_one", r=1.0, theta1=1.0,
                           theta2=theta2)
    assert res.value == pytest.approx(plain.value, rel=1e-9)


def test_weighted_zero_one_at_r_one_multiclass():
    """Three classes, scores (x, 0.5, -x): class 0 is right; the nearest wrong class is 1, at
    d*_i = (x_i - 0.5)^2 / ||w_0 - w_1||^2 = (x_i - 0.5)^2."""
    W = np.array([[1.0], [0.0], [-1.0]])
    model = otstab.LinearModel(W, np.array([0.0, 0.5, 0.0]))
    y = np.zeros(10, dtype=int)
    res = otstab.certify(model, X_W, y, loss="zero_one", r=1.0, theta1=1.0,
                         theta2=math.inf, sample_weight=SW)
    assert res.status == "optimal", res.message
    assert res.value == pytest.approx(_r1_expected(math.inf, (X_W[:, 0] - 0.5) ** 2),
                                      rel=1e-6)


def test_weighted_zero_one_at_r_one_dask():
    """The gathered Dask path answers as NumPy; the distributed path refuses r = 1 with its
    documented error (it used to say ``unreachable``) and agrees just below it."""
    da = pytest.importorskip("dask.array")
    import dask

    from otstab import dask_path
    from otstab.solve._dask_path import NotDistributed
    model = otstab.LinearModel([1.0], 0.0)
    Xd, swd = da.from_array(X_W, chunks=(4, 1)), da.from_array(SW, chunks=3)
    with dask.config.set(scheduler="synchronous"):
        res = otstab.certify(model, Xd, Y_W, loss="zero_one", r=1.0, theta1=1.0,
                             theta2=math.inf, sample_weight=swd)
        assert res.status == "optimal" and res.value == pytest.approx(53.0, rel=1e-6)
        with pytest.raises(NotDistributed, match="r = 1"):
            dask_path.certify_distributed(model, Xd, Y_W, loss="zero_one", r=1.0,
                                          theta1=1.0, theta2=math.inf, sample_weight=swd)
        near = dask_path.certify_distributed(model, Xd, Y_W, loss="zero_one", r=0.999,
                                             theta1=1.0, theta2=math.inf, sample_weight=swd)
    ref = otstab.certify(model, X_W, Y_W, loss="zero_one", r=0.999, theta1=1.0,
                         theta2=math.inf, sample_weight=SW)
    assert near.status == ref.status == "optimal"
    assert near.value == pytest.approx(ref.value, rel=1e-9)


# -- issue 27, weak duality in the audit -------------------------------------------------------
def test_audit_refutes_a_value_above_the_dual_at_h(monkeypatch):
    """With the old absolute tie tolerance put back, the specialised dual returns 1.65e-13 at
    the wrong h; the builder's own dual objective at that h (l_h clipped at the zero piece) is
    negative, so the audit refuses the value (weak duality) and the conic fallback answers."""
    from otstab_solvers import dual as du
    from otstab_solvers import sorted_oracle as so

    def old_thresholds(self, h):
        A, B = self.coefficients(h)[:2]
        tol = self.tie * (1.0 + h * self.umax + self.c * h * h)
        return (B - tol) / A, (B + tol) / A

    bound = du.PiecewiseOracle._bound
    monkeypatch.setattr(so.SortedTwoPiece, "thresholds", old_thresholds)
    monkeypatch.setattr(du.PiecewiseOracle, "_bound", lambda self, h: 1.0 + bound(self, h))
    model, margins, r = planted()
    res = otstab.certify(model, X_PLANTED, Y_PLANTED, loss="hinge", r=r, theta1=1e-3,
                         theta2=1.0)
    ref, _ = dual("hinge", 1.0 - margins, r, 1.0, "kl", c=float(BETA @ BETA) / 4e-3)
    assert res.value == pytest.approx(ref, rel=1e-6)
    assert res.solver_log[0]["solver"] == "dual"
    assert res.solver_log[0]["status"] == "audit_failed"
    assert "weak duality" in res.solver_log[0]["reason"]


def test_weak_duality_problem_rule():
    from otstab import audit
    assert audit.weak_duality_problem(1.0, 2.0, 1.0, None) == []
    assert audit.weak_duality_problem(1.0, 2.0, 1.0, 1.0 - 5e-7) == []
    assert audit.weak_duality_problem(1.0, 2.0, 1.0, 1.0 - 1e-5)
    assert audit.weak_duality_problem(1.0, 2.0, 1.0, 2.0) == []  # below the dual at h: fine


@pytest.mark.parametrize("divergence,theta2", [("kl", 1e-12), ("chi2", 1e-12),
                                               ("kl", math.inf), ("kl", 1.0)])
def test_zero_one_tiny_prices(divergence, theta2):
    """theta1 = 1e-11: every move price a_i = theta1 d*_i is below 1e-10 and so is h; a tie
    tolerance of 1e-10 max(1, h) tied every sample at every h (the audit then failed and
    certify raised). Against the 50-digit dual on the prices."""
    rng = np.random.default_rng(36)
    X = rng.normal(size=(20, 2))
    w = rng.normal(size=2)
    y = np.where(rng.random(20) < 0.5, 1, -1)
    model = otstab.LinearModel(w, float(rng.normal()))
    s = model.decision_function(X)
    wrong = np.where(y > 0, s <= 0, s > 0)
    a = 1e-11 * np.where(wrong, 0.0, np.maximum(y * s, 0.0)) ** 2 / float(w @ w)
    r = float(np.mean(wrong)) + 0.2
    res = otstab.certify(model, X, y, loss="zero_one", r=r, theta1=1e-11, theta2=theta2,
                         divergence=divergence)
    ref, _ = dual("distance", a, r, theta2, divergence)
    assert res.status == "optimal"
    assert res.value == pytest.approx(ref, rel=1e-6)


# -- issue 27, item 2: r just above the base risk -----------------------------------------------
def near_base_instance():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 2))
    y = np.sign(X[:, 0] + 0.5 * rng.normal(size=100))
    model = otstab.LinearModel([1.0, 0.5], 0.1)
    margins = y * model.decision_function(X)
    return model, X, y, margins, float(np.mean(np.maximum(0.0, 1.0 - margins)))


@pytest.mark.parametrize("theta1", [1e50, 1e12, 1.0])
@pytest.mark.parametrize("rel", [0.9e-8, 1.1e-8, 1e-12, 3e-16])
def test_near_base_risk_is_not_zero(theta1, rel):
    """R(r) is continuous and positive above the base risk: r = base (1 + 0.9e-8) was
    answered 0 (status zero) while the 50-digit dual gives 2.4e33 at theta1 = 1e50. Now the
    value is audited (optimal) where double precision resolves it, and otherwise a certified
    interval (bounds) that contains the 50-digit dual."""
    model, X, y, margins, base = near_base_instance()
    r = base * (1 + rel)
    res = otstab.certify(model, X, y, loss="hinge", r=r, theta1=theta1, theta2=math.inf)
    ref, _ = dual("hinge", 1.0 - margins, r, math.inf, c=1.25 / (4 * theta1))
    assert ref > 0
    if rel > 1e-9:
        assert res.status == "optimal"
        assert res.value == pytest.approx(ref, rel=2e-6)
    else:
        assert res.status == "bounds" and res.exact is False
        assert res.value_lower <= ref * (1 + 1e-9) and ref <= res.value_upper * (1 + 1e-9)
        assert res.value == res.value_upper
        if rel >= 1e-12:  # resolved to a few per cent still
            assert res.value_upper <= 1.05 * ref and res.value_lower >= 0.95 * ref
        assert "not resolved" in res.message


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
def test_near_base_risk_interval_kl_chi2(divergence):
    model, X, y, margins, base = near_base_instance()
    r = base * (1 + 1e-12)
    res = otstab.certify(model, X, y, loss="hinge", r=r, theta1=1.0, theta2=1.0,
                         divergence=divergence)
    ref, _ = dual("hinge", 1.0 - margins, r, 1.0, divergence, c=1.25 / 4)
    assert res.status == "bounds"
    assert res.value_lower <= ref * (1 + 1e-9) and ref <= res.value_upper * (1 + 1e-9)
    assert res.value_upper <= 1.05 * ref


def test_at_the_base_risk_is_zero():
    model, X, y, _, _ = near_base_instance()
    res0 = otstab.certify(model, X, y, loss="hinge", r=0.1, theta1=1.0, theta2=math.inf)
    base = res0.risk_base  # the library's own evaluation of the mean loss
    res = otstab.certify(model, X, y, loss="hinge", r=base, theta1=1.0, theta2=math.inf)
    assert res.status == "zero" and res.value == 0.0
    nxt = np.nextafter(base, 1.0)  # one ulp above: positive (an interval from 0 at least)
    res = otstab.certify(model, X, y, loss="hinge", r=nxt, theta1=1.0, theta2=math.inf)
    assert res.status == "bounds" and res.value_upper > 0


def test_near_base_zero_one_interval():
    """The 0/1 path near the base error rate: the interval contains the 50-digit dual."""
    model, X, y, _, _ = near_base_instance()
    s = model.decision_function(X)
    wrong = np.where(y > 0, s <= 0, s > 0)
    a = np.where(wrong, 0.0, np.maximum(y * s, 0.0)) ** 2 / 1.25
    for rel in (1e-8, 1e-10):
        r = float(np.mean(wrong)) * (1 + rel)
        res = otstab.certify(model, X, y, loss="zero_one", r=r, theta1=1.0, theta2=1.0)
        ref, _ = dual("distance", a, r, 1.0, "kl")
        assert res.status in ("optimal", "bounds")
        if res.status == "optimal":
            assert res.value == pytest.approx(ref, rel=2e-6)
        else:
            assert res.value_lower <= ref * (1 + 1e-9) and ref <= res.value_upper * (1 + 1e-9)
