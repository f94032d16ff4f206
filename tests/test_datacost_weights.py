"""Sample weights and the bootstrap under a DataCost (otstab.datacost_inference): integer
weights equal the rows repeated; a bootstrap replicate equals a certificate of the drawn rows
under the same (resolved) cost."""

import math

import numpy as np
import pytest
from test_datacost import SMALL_COST, _small

import otstab
from otstab._validation import check_random_state
from otstab.modeling._datacost import DataCost
from otstab.solve._inference import Bootstrap

SLOW = pytest.mark.slow
CASES = [(loss, r, div, t2) for loss, r in (("hinge", 1.1), ("zero_one", 0.5))
         for div, t2 in (("kl", 0.25), ("chi2", 0.5), ("kl", math.inf))] + [
    ("logistic", 0.9, "kl", 0.25), pytest.param("logistic", 0.9, "chi2", 0.5, marks=SLOW),
    pytest.param("logistic", 0.9, "kl", math.inf, marks=SLOW)]


@pytest.mark.parametrize("loss, r, divergence, theta2", CASES)
def test_integer_weights_equal_repeated_rows(loss, r, divergence, theta2):
    pipe, X, y = _small(seed=6, n=18)
    wts = np.random.default_rng(1).integers(1, 4, len(X))
    cost = DataCost(**SMALL_COST)
    kw = dict(loss=loss, r=r, theta2=theta2, divergence=divergence, cost=cost)
    a = otstab.certify(pipe, X, y, sample_weight=wts, **kw)
    rep = np.repeat(np.arange(len(X)), wts)
    # the repeated rows resolve to the same cost as the weighted ones: pass it explicitly
    spec = DataCost.from_dict(a.info["cost"])
    b = otstab.certify(pipe, X.iloc[rep].reset_index(drop=True), np.asarray(y)[rep],
                       **dict(kw, cost=spec))
    assert a.status == b.status == "optimal"
    assert a.value == pytest.approx(b.value, rel=1e-9)
    if loss != "zero_one":
        f = a.to_frame(raw=True)
        p = wts / wts.sum()
        pm = p[f["source"]] * f["mass"] * f["weight"]
        assert float(np.sum(pm * f["loss*"])) >= r * (1 - 1e-8)


@pytest.mark.parametrize("loss, r", [("hinge", 1.1), pytest.param("logistic", 0.9, marks=SLOW),
                                     ("zero_one", 0.5)])
@pytest.mark.parametrize("weighted", [False, True])
def test_bootstrap_replicates_are_certificates_of_the_drawn_rows(loss, r, weighted):
    pipe, X, y = _small(seed=7, n=24)
    wts = np.random.default_rng(2).uniform(0.5, 2.0, len(X)) if weighted else None
    spec = Bootstrap(n_resamples=3, random_state=0)
    res = otstab.certify(pipe, X, y, loss=loss, r=r, cost=DataCost(**SMALL_COST), se=spec,
                         sample_weight=wts)
    assert res.status == "optimal"
    reps = res.inference.replicates
    assert reps.size == 3 and np.all(np.isfinite(reps))
    rng = check_random_state(0)
    fixed = DataCost.from_dict(res.info["cost"])
    for b in range(2):
        idx = rng.integers(0, len(X), len(X))
        ref = otstab.certify(pipe, X.iloc[idx].reset_index(drop=True), np.asarray(y)[idx],
                             loss=loss, r=r, cost=fixed, se=None,
                             sample_weight=None if wts is None else wts[idx])
        assert reps[b] == pytest.approx(ref.value, rel=1e-9, abs=1e-12)
    assert math.isfinite(res.se) or not res.inference.reliable
