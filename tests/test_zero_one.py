"""0/1 loss: the O(n log n) closed form against a dense scalar search of the dual, the exact
distances of linear classifiers, Q* audits, and agreement with the conic hinge path where the
two losses coincide."""

import math

import numpy as np
import pytest
from reference import dual_value
from scipy.optimize import minimize

import otstab
from otstab.errors import ValidationError

INF = math.inf


def ref_value(d, r, theta1, theta2, div):
    d = np.asarray(d, float)
    a = theta1 * d if math.isfinite(theta1) else np.where(d > 0, np.inf, 0.0)
    base = np.mean(d == 0)
    if r <= base:
        return 0.0
    return dual_value(lambda h: np.maximum(h - a, 0.0), r, theta2, div)[0]


def instances():
    rng = np.random.default_rng(7)
    out = []
    for _ in range(5):
        n = int(rng.integers(2, 40))
        d = rng.exponential(size=n) * rng.choice([0.1, 1.0, 4.0])
        d[rng.random(n) < 0.25] = 0.0
        out.append(("random", d))
    out.append(("all_correct", np.linspace(0.1, 2.0, 15)))
    out.append(("ties", np.round(rng.exponential(size=30), 1) + 0.1 * (rng.random(30) < 0.2)))
    d = np.full(10, 0.5)
    d[:3] = 0
    out.append(("all_tied", d))
    return out


@pytest.mark.parametrize("div", ["kl", "chi2"])
@pytest.mark.parametrize("t1,t2", [(1.0, 0.25), (0.2, 5.0), (5.0, 0.2), (INF, 0.5),
                                   (1.0, INF)])
def test_closed_form_and_dual_match_dense_search(div, t1, t2):
    for name, d in instances():
        for r in (0.15, 0.6, 0.999, 1.0):
            ref = None
            for solver in ("closed_form", "dual"):
                res = otstab.certify_distances(d, r, theta1=t1, theta2=t2, divergence=div,
                                               solver=solver)
                if res.status == "unreachable":
                    assert math.isinf(t1) or math.isinf(t2) or r >= 1.0, name
                    continue
                if math.isinf(res.h):  # the r = 1 limit with theta1 = inf
                    A = np.mean(d == 0)
                    exp = t2 * (-math.log(A) if div == "kl" else 1 / A - 1)
                    assert res.value == pytest.approx(exp)
                    continue
                if ref is None:
                    ref = ref_value(d, r, t1, t2, div)
                assert res.value == pytest.approx(ref, rel=1e-9, abs=1e-11), (name, r, solver)
                assert res.gap <= 1e-9
                assert res.risk_star == pytest.approx(max(r, np.mean(d == 0)), abs=1e-9)


def test_all_wrong_and_reachability():
    res = otstab.certify_distances(np.zeros(5), 0.9)
    assert res.value == 0.0 and res.risk_base == 1.0
    # nothing misclassified, nothing can move: unreachable
    res = otstab.certify_distances(np.full(4, np.inf), 0.2)
    assert res.status == "unreachable" and math.isinf(res.value)
    # theta2 = inf: moving alone reaches only the movable share
    d = np.array([0.0, 1.0, np.inf, np.inf])
    assert otstab.certify_distances(d, 0.5, theta2=INF).value == pytest.approx(0.5 * 1.0 - 0.25)
    assert otstab.certify_distances(d, 0.75, theta2=INF).status == "unreachable"


def test_bad_distances():
    with pytest.raises(ValidationError, match="dstar"):
        otstab.certify_distances([0.1, -1.0], 0.5)
    with pytest.raises(ValidationError, match=r"\[0, 1\]"):
        otstab.certify_distances([0.1, 1.0], 1.5)


def _binary(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    w = rng.normal(size=4)
    y = np.where(X @ w + 0.6 * rng.normal(size=n) > 0, 1, -1)
    return otstab.LinearModel(w, 0.2), X, y


@pytest.mark.parametrize("div", ["kl", "chi2"])
@pytest.mark.parametrize("t1,t2", [(1.0, 0.25), (INF, 0.25), (1.0, INF), (0.2, 5.0)])
def test_linear_binary_certificates_audit(div, t1, t2):
    model, X, y = _binary()
    for r in (0.3, 0.5, 0.95):
        res = otstab.certify(model, X, y, loss="zero_one", r=r, theta1=t1, theta2=t2,
                             divergence=div)
        if res.status == "unreachable":
            assert math.isinf(t2)
            continue
        assert res.gap <= 1e-6
        assert res.risk_star >= r - 1e-9
        # every moved atom is misclassified by the model's own rule
        moved = np.linalg.norm(res.X_star - X[res.source], axis=1) > 0
        if moved.any():
            pred = model.predict(res.X_star[moved])
            assert np.all(pred != y[res.source][moved])
        else:
            assert math.isinf(t1)


def test_binary_distances_are_exact():
    model, X, y = _binary(50, seed=3)
    w, b = model.coef_, model.intercept_
    m = y * (X @ w + b)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.9, theta2=INF)
    dstar = res.info["dstar"]
    np.testing.assert_allclose(dstar, np.where(m > 0, m * m / (w @ w), 0.0), rtol=1e-12)


def test_multiclass_distances_against_numerical_projection():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(25, 3))
    W = rng.normal(size=(3, 3))
    b = rng.normal(size=3) * 0.3
    model = otstab.LinearModel(W, b)
    y = model.predict(X)  # all correct
    res = otstab.certify(model, X, y, loss="zero_one", r=0.99, theta2=INF)
    dstar = res.info["dstar"]
    for i in range(X.shape[0]):
        best = np.inf
        for k in range(3):
            if k == y[i]:
                continue
            cons = {"type": "ineq",
                    "fun": lambda x, k=k, i=i: (W[k] - W[y[i]]) @ x + b[k] - b[y[i]]}
            sol = minimize(lambda x, i=i: np.sum((x - X[i]) ** 2), X[i], constraints=[cons],
                           method="SLSQP", options={"ftol": 1e-14, "maxiter": 200})
            best = min(best, sol.fun)
        assert dstar[i] == pytest.approx(best, rel=1e-6, abs=1e-9)


def test_agrees_with_conic_hinge_where_the_losses_coincide():
    # margins either exactly 0 with y = +1 (hinge 1, misclassified) or >= 1 (hinge 0, correct):
    # with theta1 = inf (no moves) both losses are the same 0/1 vector
    rng = np.random.default_rng(5)
    n = 60
    w = np.array([1.0, 0.0])
    y = np.where(rng.random(n) < 0.3, 1, -1)
    margins = np.where(y > 0, 0.0, 1.0 + rng.exponential(size=n))
    X = np.column_stack([margins * y, rng.normal(size=n)])
    X[y > 0, 0] = 0.0
    model = otstab.LinearModel(w, 0.0)
    for div in ("kl", "chi2"):
        for r in (0.4, 0.7):
            zo = otstab.certify(model, X, y, loss="zero_one", r=r, theta1=INF, theta2=0.5,
                                divergence=div)
            hi = otstab.certify(model, X, y, loss="hinge", r=r, theta1=INF, theta2=0.5,
                                divergence=div, solver="clarabel")
            assert zo.value == pytest.approx(hi.value, rel=1e-6)


def test_split_at_a_breakpoint_is_reported():
    model, X, y = _binary(200, seed=11)
    hits = 0
    for r in np.linspace(0.3, 0.9, 7) + 0.0025:  # r n is not an integer: one sample splits
        res = otstab.certify(model, X, y, loss="zero_one", r=float(r), theta2=INF)
        assert res.risk_star == pytest.approx(r, abs=1e-12)
        hits += res.split
    assert hits >= 1


@pytest.mark.parametrize("div", ["kl", "chi2"])
@pytest.mark.parametrize("t2", [0.1, 1.0, INF])
def test_q_star_from_distances_matches_a_dense_construction(div, t2):
    """The lean Q* builder (weights from the solver's unit weight / alpha, moves from one pass)
    against weights and costs recomputed densely from h alone."""
    from otstab_solvers.weights import chi2_alpha, chi2_weights, kl_weights, phi

    rng = np.random.default_rng(7)
    n = 2000
    d = rng.exponential(1.0, n)
    d[rng.random(n) < 0.1] = 0.0
    d[:300] = np.round(d[:300], 1)  # ties
    mis = d == 0
    mis[rng.random(n) < 0.05] = True  # misclassified rows given with d > 0: treated as d = 0
    keep = d.copy()
    for r in (0.2, 0.45, 0.8):
        res = otstab.certify_distances(d, r, theta1=2.0, theta2=t2, divergence=div,
                                       misclassified=mis)
        np.testing.assert_array_equal(d, keep)  # the caller's array is untouched
        a = 2.0 * np.where(mis, 0.0, d)
        lh = np.maximum(res.h - a, 0.0)
        if math.isinf(t2):
            w = np.ones(n)
        elif div == "kl":
            w = kl_weights(lh, t2)
        else:
            w = chi2_weights(lh, t2, chi2_alpha(lh, t2))
        np.testing.assert_allclose(res.weights[:n], w, rtol=1e-11, atol=1e-14)
        np.testing.assert_array_equal(res.weights[n:], res.weights[res.source[n:]])
        np.testing.assert_allclose(np.bincount(res.source, weights=res.mass, minlength=n), 1.0)
        moved = res.loss_star > res.loss_base[res.source]
        assert np.all(a[res.source[moved]] <= res.h * (1 + 1e-9))
        cost = 2.0 * np.sum(res.mass * res.weights * np.where(moved, a[res.source] / 2.0, 0.0))
        if math.isfinite(t2):
            cost += t2 * np.sum(res.mass * phi(res.weights, div))
        assert cost / n == pytest.approx(res.value, rel=1e-9, abs=1e-12)
        # the audit fields (summed over the moved atoms and compact weights) equal the same
        # sums over the materialised atoms
        risk = np.sum(res.mass * res.weights * res.loss_star) / n
        assert risk == pytest.approx(r, abs=1e-9)
        assert res.risk_star == pytest.approx(risk, rel=1e-12)
        assert res.primal_cost == pytest.approx(cost / n, rel=1e-9, abs=1e-14)
        assert res.total_mass == pytest.approx(np.sum(res.mass * res.weights) / n, rel=1e-12)
        moved_risk = np.sum(res.mass * res.loss_star) / n
        assert res.decomposition["corruption"] == pytest.approx(moved_risk - res.risk_base,
                                                               abs=1e-12)


def test_predict_only_model_below_base_error_is_zero():
    """Regression: r <= the base error of a predict-only model moves nothing, and the model's
    predict is never called on zero rows (scikit-learn refuses that)."""
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 3))
    y = (X[:, 0] + rng.normal(scale=1.0, size=120) > 0).astype(int)
    model = RandomForestClassifier(n_estimators=5, max_depth=2, random_state=0).fit(X, y)
    base = float(np.mean(model.predict(X) != y))
    assert base > 0
    res = otstab.certify(model, X, y, loss="zero_one", r=base / 2)
    assert res.status == "zero" and res.value == 0.0 and res.risk_base == pytest.approx(base)


# --- the smallest prices only, and move plans without position arrays --------------------------

@pytest.mark.parametrize("div, t2", [("kl", 0.05), ("kl", 0.25), ("kl", 4.0), ("kl", INF),
                                     ("chi2", INF)])
@pytest.mark.parametrize("ties", [False, True])
def test_closed_form_on_the_smallest_prices_matches_the_full_sort(div, t2, ties):
    """solve_zero_one(..., n=) with every price up to some value held gives the full closed
    form's answer whenever it answers, and says "needs more prices" otherwise."""
    from otstab_solvers.zero_one import solve_zero_one

    rng = np.random.default_rng(3)
    n = 2000
    a = np.abs(rng.normal(size=n))
    if ties:
        a = np.round(a, 1)
    a[rng.random(n) < 0.1] = 0.0  # already misclassified
    a[rng.random(n) < 0.05] = INF  # cannot be moved
    s = np.sort(a)
    for r in (0.15, 0.3, 0.6, 0.9):
        full = solve_zero_one(s, r, t2, div, presorted=True)
        answered = 0
        for keep in (0.1, 0.2, 0.35, 0.7, 0.95):
            tau = s[int(keep * n)]
            held = s[s <= tau]
            sol = solve_zero_one(held, r, t2, div, presorted=True, n=n)
            if sol.native_status == "needs more prices":
                assert sol.status == "failed"
                continue
            answered += 1
            assert sol.status == full.status == "optimal"
            assert sol.h == full.h
            assert sol.value == pytest.approx(full.value, rel=1e-12, abs=1e-15)
            for key in ("n_moved", "n_tied", "moved_weight", "unit_weight"):
                if key in full.info:
                    assert sol.info[key] == pytest.approx(full.info[key], rel=1e-12), key
        assert answered  # (the largest share held answers every r here)
    with pytest.raises(ValueError, match="smallest prices"):
        solve_zero_one(s[:100], 0.3, 0.25, "chi2", presorted=True, n=n)


def test_row_prices_smallest_are_every_price_up_to_a_quantile(monkeypatch):
    import otstab.solve._zero_one as zo
    from otstab.modeling._models import resolve_model
    from otstab.solve._zero_one import linear_prices

    model, X, y = _binary(n=5000, seed=4)
    prob = resolve_model(model, X, y, loss="zero_one")
    rp, _ = linear_prices(prob, None, 1.0)
    everything = rp.sorted()
    for sub in (500, 5000):  # a strided subsample; every row (then all prices)
        monkeypatch.setattr(zo, "SUBSAMPLE", sub)
        for share in (0.05, 0.3, 0.8, 1.0):
            held = rp.smallest(share)
            assert np.all(np.diff(held) >= 0)
            np.testing.assert_array_equal(held, everything[:held.size])
            assert held.size == everything.size or everything[held.size] > held[-1]
            assert held.size >= min(share, 1.0) * everything.size
            if sub == 500 and share <= 0.3:
                assert held.size < 0.5 * everything.size  # (the subsample placed it)
            if sub == 5000:
                assert held.size == everything.size


@pytest.mark.parametrize("ties", [0, 5, 400])  # tied rows at h: none, few, many (no plan)
@pytest.mark.parametrize("t2", [0.25, INF])
def test_compact_move_plans_give_the_same_certificate(monkeypatch, ties, t2):
    """Tied rows put last in Q*'s candidate rows (moved rows as a prefix, no array of their
    positions) against the plan with position arrays: the same certificate."""
    import otstab.solve._zero_one as zo

    rng = np.random.default_rng(9)
    n = 3000
    X = rng.normal(size=(n, 2))
    w = np.array([1.0, 0.0])
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1, -1)
    if ties:  # copies of one correctly classified row: a block of equal prices
        j = int(np.flatnonzero((y > 0) & (X[:, 0] > 0.3))[0])
        X[rng.choice(n, ties, replace=False)] = X[j]
        y = np.where(np.all(X == X[j], axis=1), y[j], y)
    model = otstab.LinearModel(w, 0.0)
    base = float(np.mean(model.predict(X) != y))

    def run():
        out = []
        for r in np.linspace(base + 0.01, min(base + 0.4, 0.95), 25):
            with monkeypatch.context() as m:
                m.setattr(otstab.audit, "AUDIT_DIRECT_MAX", 0)
                out.append(otstab.certify(model, X, y, loss="zero_one", r=float(r),
                                          theta2=t2, se=None))
        return out

    compact = run()
    with monkeypatch.context() as m:
        m.setattr(zo, "TIED_LAST_MIN", -1)
        m.setattr(zo, "TIED_LAST_SHARE", -1.0)
        arrays = run()
    assert any(c.split for c in compact) or not ties
    for c, a in zip(compact, arrays):
        assert c.status == a.status == "optimal"
        assert (c.value, c.h, c.split) == (a.value, a.h, a.split)
        for f in ("risk_star", "primal_cost", "total_mass"):
            assert getattr(c, f) == pytest.approx(getattr(a, f), rel=1e-12), f
        np.testing.assert_array_equal(c.source, a.source)
        # (the split row's share divides the risk still needed, a sum over the moved rows
        # taken in another order: equal to its rounding, n eps r / gain)
        np.testing.assert_allclose(c.mass, a.mass, rtol=1e-9, atol=0)
        np.testing.assert_array_equal(c.weights, a.weights)
        np.testing.assert_array_equal(c.X_star, a.X_star)


def test_row_prices_write_into_arrays_sized_from_the_subsample(monkeypatch):
    """RowPrices.smallest and .near write the prices (and rows) they keep in one pass into
    arrays sized from the strided subsample (issue 31: a counting pass over every price came
    first); when the estimate falls short they count and write again: the same arrays as
    the dense prices give (``_near``, the sorted prefix) either way."""
    import otstab.solve._zero_one as zo
    from otstab.modeling._models import resolve_model

    model, X, y = _binary(n=5000, seed=4)
    prob = resolve_model(model, X, y, loss="zero_one")
    monkeypatch.setattr(zo, "SUBSAMPLE", 500)
    for short in (False, True):
        rp, _ = zo.linear_prices(prob, None, 1.0)
        rp.BLOCK = 333
        a = rp.array()
        everything = np.sort(a)
        fin = everything[np.isfinite(everything)]
        passes = []
        honest = rp._dstar
        monkeypatch.setattr(rp, "_dstar", lambda rows, passes=passes, honest=honest:
                            passes.append(1) or honest(rows))
        if short:
            monkeypatch.setattr(rp, "_estimate", lambda thr: 3)
        for share in (0.1, 0.4):
            held = rp.smallest(share)
            np.testing.assert_array_equal(held, everything[:held.size])
            assert everything[held.size] > held[-1]
        for h in (0.0, float(fin[fin.size // 3]), float(fin[-1]), 1e9):
            del passes[:]
            cand, ac = rp.near(h)
            ref_c, ref_a = zo._near(a, h)
            np.testing.assert_array_equal(cand, ref_c)
            np.testing.assert_array_equal(ac, ref_a)
            blocks = -(-5000 // 333)
            if not short and h < fin[-1]:  # one pass and the strided subsample (at the
                assert len(passes) <= blocks + 1, len(passes)  # largest, a count first)
            elif short:
                assert len(passes) >= 2 * blocks
