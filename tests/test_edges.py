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

