"""float32 evaluation data of linear models is kept in float32 (issue 17: no conversion copy).

The scores are computed in float64 block by block from the float32 values (float32 -> float64
is exact), so every result must equal the one on ``X.astype(float64)`` exactly; moved points are
built in float64.
"""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, LogisticRegression

import otstab
import otstab.modeling._models as om

N, D = 1500, 5


def _data(seed=0, classes=2):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)).astype(np.float32)
    if classes == 2:
        y = np.where(X @ rng.standard_normal(D) + 0.5 * rng.standard_normal(N) > 0, 1, 0)
    else:
        y = np.argmax(X[:, :classes] + 0.5 * rng.standard_normal((N, classes)), axis=1)
    return X, y


CASES = [("hinge", 0.8, 2), ("zero_one", 0.3, 2), ("logistic", 0.8, 2),
         ("multiclass_hinge", 1.2, 3), ("zero_one", 0.5, 3), ("cross_entropy", 1.2, 3)]


@pytest.mark.parametrize("divergence", ["kl", "chi2"])
@pytest.mark.parametrize("loss,r,classes", CASES)
def test_float32_equals_float64_copy(monkeypatch, loss, r, classes, divergence):
    monkeypatch.setattr(om, "SCORE_BLOCK", 97)  # several blocks, a ragged last one
    X, y = _data(classes=classes)
    model = LogisticRegression(max_iter=500).fit(X.astype(np.float64), y)
    a = otstab.certify(model, X, y, loss=loss, r=r, divergence=divergence)
    b = otstab.certify(model, X.astype(np.float64), y, loss=loss, r=r, divergence=divergence)
    assert a.status == b.status == "optimal"
    assert a.value == b.value and a.h == b.h
    assert a.X.dtype == np.float32 and a.X_star.dtype == np.float64
    np.testing.assert_array_equal(a.X_star, b.X_star)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert a.se == b.se
    # the moved points audit against the model's own decision function
    delta = a.X_star - a.X[a.source].astype(np.float64)
    assert np.all(np.isfinite(delta))


def test_frozen_float32_is_kept_by_reference_and_never_written():
    X, y = _data()
    X.flags.writeable = False
    before = X.copy()
    model = LogisticRegression().fit(X.astype(np.float64), y)
    res = otstab.certify(model, X, y, loss="hinge", r=0.8)
    assert np.shares_memory(res.X, X)
    np.testing.assert_array_equal(X, before)
    frame = res.to_frame()
    assert frame.shape[0] == res.n_atoms


def test_writeable_float32_is_kept_in_float32_without_copy():
    """A writable float32 X is kept by reference (no float32 or float64 copy); a later change
    of the caller's array is detected on the next read of X (tests/test_no_copy.py)."""
    X, y = _data()
    model = LogisticRegression().fit(X.astype(np.float64), y)
    res = otstab.certify(model, X, y, loss="zero_one", r=0.3)
    assert res.X.dtype == np.float32 and np.shares_memory(res.X, X)
    old = X[3, 1]
    X[3, 1] = old + 0.5
    with pytest.raises(otstab.scale.DataChangedError):
        _ = res.X_star
    X[3, 1] = old  # the same values again: reads work
    assert res.to_frame().shape[0] == res.n_atoms


def test_float32_regression_and_feature_scores():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, D)).astype(np.float32)
    y = X.astype(np.float64) @ rng.standard_normal(D) + 0.1 * rng.standard_normal(N)
    model = LinearRegression().fit(X.astype(np.float64), y)
    for loss, r in [("absolute", 1.5), ("squared", 2.0)]:
        a = otstab.certify(model, X, y, loss=loss, r=r)
        b = otstab.certify(model, X.astype(np.float64), y, loss=loss, r=r)
        assert a.value == b.value and a.status == b.status == "optimal"
    fa = otstab.feature_stability(model, X, y, loss="absolute", r=1.5).to_frame()
    fb = otstab.feature_stability(model, X.astype(np.float64), y, loss="absolute", r=1.5).to_frame()
    np.testing.assert_array_equal(fa["score"].to_numpy(), fb["score"].to_numpy())
