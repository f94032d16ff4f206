"""Cost of the sampling uncertainty of R (issue 14, ``docs/inference.md``).

- ``test_se_cost``: ``otstab.certify`` with the influence-function SE and interval
  (``res.se``, ``res.ci()``) versus ``certify(..., se=None)``, hinge KL, 0/1 KL and hinge with
  theta2 = inf (the case that rebuilds l_h from Q*'s moved points); target: the SE adds <= 10%
  at n = 1e6 (full) — compare the two rows of each group;
- ``test_bootstrap_cost``: a 200-replicate bootstrap (``se=Bootstrap(n_resamples=200)``) at
  n = 1e5 (full; target < 10 s), hinge KL and 0/1 KL.

The quick subset runs both at n = 1e4 so that the code cannot rot.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _benchlib import THETA1, THETA2, fmt_n, make_model_data, measure, record, sizes

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CASES = {"hinge-kl": ("hinge", THETA2), "zero_one-kl": ("zero_one", THETA2),
         "hinge-theta2=inf": ("hinge", math.inf)}


def _setup(case, n):
    loss, theta2 = CASES[case]
    model, X, y = make_model_data("hinge", n, seed=0)
    if loss == "zero_one":
        r = 1.5 * float(np.mean(y * model.decision_function(X) <= 0))
    else:
        r = 1.5 * float(np.mean(np.maximum(0.0, 1.0 - y * model.decision_function(X))))
    return dict(model=model, X=X, y=y, loss=loss, r=r, theta2=theta2)


@pytest.mark.parametrize("n", sizes((10_000,), (1_000_000,)))
@pytest.mark.parametrize("with_se", (False, True), ids=("certify", "certify+se"))
@pytest.mark.parametrize("case", list(CASES))
def test_se_cost(benchmark, case, with_se, n):
    import otstab

    a = _setup(case, n)
    benchmark.group = f"inference se-cost {case} n={fmt_n(n)}"

    def run():
        res = otstab.certify(a["model"], a["X"], a["y"], loss=a["loss"], r=a["r"],
                             theta1=THETA1, theta2=a["theta2"], se="analytic" if with_se
                             else None)
        if with_se:
            res.ci()
        return res

    res = measure(benchmark, run, slow=n >= 1_000_000)
    record(benchmark, suite="inference", case=case, n=n, status=res.status, value=res.value,
           se=res.se if with_se else math.nan, role="se" if with_se else "baseline")
    assert res.status == "optimal"
    assert math.isfinite(res.se) if with_se else math.isnan(res.se)


@pytest.mark.parametrize("n", sizes((10_000,), (100_000,)))
@pytest.mark.parametrize("case", ("hinge-kl", "zero_one-kl"))
def test_bootstrap_cost(benchmark, case, n):
    import otstab
    from otstab.solve._inference import Bootstrap

    a = _setup(case, n)
    benchmark.group = f"inference bootstrap-200 {case} n={fmt_n(n)}"

    def run():
        return otstab.certify(a["model"], a["X"], a["y"], loss=a["loss"], r=a["r"],
                              theta1=THETA1, theta2=a["theta2"], se=Bootstrap(n_resamples=200))

    res = measure(benchmark, run, slow=True)
    record(benchmark, suite="inference", case=case, n=n, n_boot=200, se=res.se,
           se_analytic=otstab.inference.analytic(res).se, target_s=10.0)
    assert res.inference.replicates.size == 200
