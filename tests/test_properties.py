"""Property tests (hypothesis) of R(beta, r) on small random hinge instances."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import otstab

thetas = st.sampled_from([0.2, 1.0, 5.0, math.inf])


@st.composite
def instance(draw):
    n = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    w = rng.normal(size=2)
    y = np.where(rng.random(n) < 0.5, 1, -1)
    return otstab.LinearModel(w, float(rng.normal())), X, y


def R(model, X, y, r, t1=1.0, t2=0.25, div="kl"):
    return otstab.certify(model, X, y, loss="hinge", r=r, theta1=t1, theta2=t2,
                          divergence=div).value


@settings(max_examples=40, deadline=None)
@given(instance(), st.floats(0.0, 4.0), thetas, st.sampled_from(["kl", "chi2"]))
def test_nonnegative_monotone_in_r(inst, r, t2, div):
    model, X, y = inst
    a = R(model, X, y, r, t2=t2, div=div)
    b = R(model, X, y, r + 0.3, t2=t2, div=div)
    assert a >= 0
    assert b >= a - 1e-9 * max(1, a)


@settings(max_examples=40, deadline=None)
@given(instance(), st.floats(0.5, 3.0), st.sampled_from(["kl", "chi2"]))
def test_monotone_in_thetas(inst, r, div):
    model, X, y = inst
    vals1 = [R(model, X, y, r, t1=t, div=div) for t in (0.2, 1.0, 5.0)]
    vals2 = [R(model, X, y, r, t2=t, div=div) for t in (0.2, 1.0, 5.0)]
    for vals in (vals1, vals2):
        assert all(b >= a - 1e-9 * max(1, a) for a, b in zip(vals, vals[1:]))


@settings(max_examples=40, deadline=None)
@given(instance(), st.floats(0.0, 3.0), st.integers(0, 1000))
def test_zero_below_base_and_permutation_invariant(inst, r, seed):
    model, X, y = inst
    base = np.mean(np.maximum(0, 1 - y * (X @ model.coef_ + model.intercept_)))
    kl = R(model, X, y, r)
    chi = R(model, X, y, r, div="chi2")
    assert (kl == 0) == (r <= base) == (chi == 0)
    p = np.random.default_rng(seed).permutation(len(y))
    assert R(model, X[p], y[p], r) == __import__("pytest").approx(kl, rel=1e-9, abs=1e-12)
