"""The entry points under a DataCost (issue 28): feature_stability scores each raw variable
with only that variable movable, stability_curve, worst_case_risk and compare take cost= with
certify's meaning."""

import math

import numpy as np
import pytest
from test_datacost import SMALL_COST, _small

import otstab
from otstab.errors import ValidationError
from otstab.modeling._datacost import DataCost


@pytest.fixture(scope="module")
def small():
    return _small()


def _colour_distances(pipe, X, y, rc):
    """d*_i when only colour may move: the cheapest level (switch matrix) that the pipeline
    misclassifies, by enumeration of the levels scored by predict."""
    v = rc.variable("colour")
    d = np.full(len(X), math.inf)
    pred0 = pipe.predict(X)
    wrong = pred0 != np.asarray(y)
    d[wrong] = 0.0
    for lv in v.levels:
        F = X.copy()
        F["colour"] = lv
        c = rc.cost(X, F)
        flips = pipe.predict(F) != np.asarray(y)
        d = np.where(~wrong & flips, np.minimum(d, c), d)
    return d, wrong


def test_feature_stability_scores_each_raw_variable(small):
    pipe, X, y = small
    cost = DataCost(**SMALL_COST, immutable=["shape"])
    r = 0.55
    fs = otstab.feature_stability(pipe, X, y, loss="zero_one", r=r, cost=cost)
    t = fs.table.set_index("feature")
    assert set(t.index) == set(X.columns)
    # colour alone, against the enumeration of its levels and the 0/1 dual on them
    rc = cost.resolve(pipe, X)
    d, wrong = _colour_distances(pipe, X, y, rc)
    # the certificate pushes a relative 1e-9 past the boundary; the levels flip or not
    ref = otstab.certify_distances(d, r, misclassified=wrong)
    assert t.loc["colour", "score"] == pytest.approx(ref.value, rel=1e-9)
    # an immutable variable scores the reweighting-only value and is flagged
    assert bool(t.loc["shape", "ignored"])
    assert t.loc["shape", "score"] == pytest.approx(fs.reweighting_only_value, rel=1e-12)
    rw = otstab.certify(pipe, X, y, loss="zero_one", r=r, theta1=math.inf)
    assert fs.reweighting_only_value == pytest.approx(rw.value, rel=1e-9)
    # every movable variable's score is certify's with only it movable
    for nm in ("u", "k", "size"):
        res = otstab.certify(pipe, X, y, loss="zero_one", r=r, cost=cost, features=[nm])
        assert t.loc[nm, "score"] == pytest.approx(res.value, rel=1e-12)
        f = res.to_frame(raw=True)
        for c in X.columns:
            if c != nm:
                assert (f[c].astype(str) == f[f"{c}*"].astype(str)).all()
    sub = otstab.feature_stability(pipe, X, y, loss="hinge", r=1.1, cost=cost,
                                   features=["u", "colour"])
    assert list(sorted(sub.table["feature"])) == ["colour", "u"]
    with pytest.raises(ValidationError, match="did you mean 'u'"):
        otstab.feature_stability(pipe, X, y, loss="hinge", r=1.1, cost=cost, features=["uu"])
    with pytest.raises(ValidationError, match="feature_groups"):
        otstab.feature_stability(pipe, X, y, loss="hinge", r=1.1, cost=cost,
                                 feature_groups="auto")


def test_feature_stability_bootstrap_under_the_cost(small):
    pipe, X, y = small
    fs = otstab.feature_stability(pipe, X, y, loss="zero_one", r=0.55, cost="auto",
                                  features=["u", "colour"], level=0.9, n_resamples=3)
    assert {"se", "ci_low", "ci_high", "p_top_k"} <= set(fs.table.columns)
    assert np.isfinite(fs.table["ci_low"]).all()


@pytest.mark.parametrize("loss, grid", [("zero_one", [0.4, 0.55, 0.7]),
                                        ("hinge", [1.0, 1.2, 1.4])])
def test_stability_curve_is_certify_at_each_threshold(small, loss, grid):
    pipe, X, y = small
    cost = DataCost(**SMALL_COST)
    cur = otstab.stability_curve(pipe, X, y, loss=loss, r=grid, cost=cost).to_frame()
    for rv, val in zip(grid, cur["value"]):
        ref = otstab.certify(pipe, X, y, loss=loss, r=rv, cost=cost).value
        assert val == pytest.approx(ref, rel=1e-12)
    assert np.all(np.diff(cur["value"].to_numpy()) > 0)
    enc = otstab.stability_curve(pipe, X, y, loss=loss, r=grid).to_frame()
    assert not np.allclose(enc["value"], cur["value"])  # another cost, other numbers


@pytest.mark.parametrize("loss, eps", [("zero_one", 0.3), ("hinge", 0.2),
                                       pytest.param("logistic", 0.1, marks=pytest.mark.slow)])
def test_worst_case_risk_inverts_certify(small, loss, eps):
    pipe, X, y = small
    cost = DataCost(**SMALL_COST)
    w = otstab.worst_case_risk(pipe, X, y, loss=loss, eps=eps, cost=cost)
    assert w.status == "optimal" and w.certificate.status == "optimal"
    # certify(r = W(eps)).value == eps: the certificate is certify's under the same cost
    assert w.certificate.value == pytest.approx(eps, rel=1e-7)
    assert w.certificate.info["cost"] == cost.resolve(pipe, X).to_dict()
    w2 = otstab.worst_case_risk(pipe, X, y, loss=loss, eps=2 * eps, cost=cost)
    assert w2.risk > w.risk
    # a smaller budget in the encoded metric is another number
    enc = otstab.worst_case_risk(pipe, X, y, loss=loss, eps=eps)
    assert enc.risk != pytest.approx(w.risk, rel=1e-6)


def test_worst_case_risk_supremum_with_bounded_moves(small):
    """Every variable bounded or discrete: the hinge loss a sample can reach is bounded, so
    is the worst-case risk (eps = inf: the supremum)."""
    pipe, X, y = small
    cost = DataCost(**SMALL_COST, immutable=["v"])
    w = otstab.worst_case_risk(pipe, X, y, loss="hinge", eps=math.inf, cost=cost)
    assert math.isfinite(w.risk) and w.status in ("supremum", "capped")
    big = otstab.worst_case_risk(pipe, X, y, loss="hinge", eps=50.0, cost=cost)
    assert big.risk <= w.risk * (1 + 1e-9)


def test_compare_takes_the_cost(small):
    pipe, X, y = small
    cost = DataCost(**SMALL_COST)
    tab = otstab.compare({"a": pipe}, X, y, loss="zero_one", r=0.55, cost=cost,
                         n_resamples=3).to_frame()
    ref = otstab.certify(pipe, X, y, loss="zero_one", r=0.55, cost=cost)
    assert tab["value"].iloc[0] == pytest.approx(ref.value, rel=1e-12)
    assert np.isfinite(tab["ci_lower"].iloc[0]) and np.isfinite(tab["se"].iloc[0])
    with pytest.raises(ValidationError, match="feature_costs"):
        otstab.worst_case_risk(pipe, X, y, loss="hinge", eps=0.1, cost=cost,
                               feature_costs={"u": 2.0})
