"""Results keep the caller's X by reference, not a copy (issue 31), and detect a later change.

``certify`` on a linear model keeps a NumPy X as a read-only view and fingerprints it in the
scores pass (:mod:`otstab.fingerprint`); reading X through a result after the caller changed it
(``X_star``, ``to_frame``, pickling) raises ``DataChangedError``. Checked here: no copy
(tracemalloc: the peak during ``certify`` stays below half the size of X), every kind of change
is detected on the next read and an unchanged X is never refused (also when the fingerprint
is recomputed on another number of BLAS threads, or is not bit-identical).
"""

import pickle
import tracemalloc

import numpy as np
import pandas as pd
import pytest
from otstab_solvers import sorted_kernels, zero_one_kernels
from threadpoolctl import threadpool_limits

import otstab
from otstab import fingerprint
from otstab.modeling import _pass_kernels
from otstab.scale import DataChangedError


def _binary(n=3000, d=6, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    coef = rng.standard_normal(d) / np.sqrt(d)
    y = np.where(X.astype(np.float64) @ coef + 0.3 * rng.standard_normal(n) > 0, 1, -1)
    return X, otstab.LinearModel(coef, 0.1), y


def _multiclass(n=2000, d=5, K=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W = rng.standard_normal((K, d))
    y = np.argmax(X @ W.T + rng.gumbel(size=(n, K)), axis=1)
    return X, otstab.LinearModel(W, np.zeros(K)), y


CASES = {
    "hinge": dict(loss="hinge", r=0.6),
    "hinge chi2 inf": dict(loss="hinge", r=0.6, divergence="chi2", theta2=np.inf),
    "zero_one": dict(loss="zero_one", r=0.3),
    "logistic": dict(loss="logistic", r=0.7),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_change_after_certify_raises_on_next_read(case, dtype):
    X, model, y = _binary(dtype=dtype)
    res = otstab.certify(model, X, y, **CASES[case])
    assert res.status == "optimal"
    assert np.shares_memory(res.X, X) and res.X.dtype == dtype  # no copy, no conversion
    old = X[1234, 3]
    X[1234, 3] = old * 1.5 + 0.25
    for read in (lambda: res.X_star, res.to_frame, lambda: pickle.dumps(res)):
        with pytest.raises(DataChangedError, match="changed since it was certified"):
            read()
    X[1234, 3] = old  # the certified values again: every read works
    frame = res.to_frame()
    assert len(frame) == res.n_atoms
    np.testing.assert_array_equal(frame[res.feature_names].to_numpy(),
                                  X[res.source].astype(np.float64))
    back = pickle.loads(pickle.dumps(res))
    X[:] = 0  # an unpickled result owns its copy: the caller's later changes do not reach it
    assert back.value == res.value and back.to_frame().shape == frame.shape
    np.testing.assert_array_equal(np.asarray(back.X_star), np.asarray(res.X_star))


def test_multiclass_is_checked():
    X, model, y = _multiclass()
    res = otstab.certify(model, X, y, loss="multiclass_hinge", r=1.3)
    assert np.shares_memory(res.X, X)
    X[5] = X[6]
    with pytest.raises(DataChangedError):
        _ = res.X_star


def test_pipeline_with_an_identity_step_is_checked():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    Xb, _, yb = _binary(n=500)
    pipe = make_pipeline(FunctionTransformer(None), LogisticRegression()).fit(Xb, yb)
    res = otstab.certify(pipe, Xb, yb, loss="hinge", r=0.6)  # the identity step: X itself
    Xb[0, 0] += 1.0
    with pytest.raises(DataChangedError):
        res.to_frame()


def test_dataframe_input_never_reads_a_changed_frame():
    """A DataFrame is converted to an array (a copy: the result owns it) or, when pandas hands
    its own buffer, fingerprinted: a later change of the frame never reaches a result
    silently."""
    X, model, y = _binary()
    df = pd.DataFrame(X, columns=[f"c{j}" for j in range(X.shape[1])])
    res = otstab.certify(model, df, y, loss="hinge", r=0.6)
    before = res.to_frame()
    df.iloc[10, 2] = 100.0
    try:
        after = res.to_frame()
    except DataChangedError:
        return
    pd.testing.assert_frame_equal(after, before)


@pytest.mark.parametrize("change", ["entry", "tiny", "swap rows", "negate column", "nan",
                                    "scale", "last row"])
def test_fingerprint_detects_every_kind_of_change(change):
    rng = np.random.default_rng(4)
    n, d = 1001, 7  # n not a multiple of the group: the last group is shorter
    X = rng.standard_normal((n, d))
    fp = fingerprint.of_matrix(X)
    assert fp.changed_groups(X).size == 0
    Y = X.copy()
    if change == "entry":
        Y[500, 6] += 1.0
    elif change == "tiny":  # 1e-8 relative: far below any effect on a result, still seen
        Y[17, 0] *= 1 + 1e-8
    elif change == "swap rows":  # within a group and across groups
        Y[[3, 4]] = Y[[4, 3]]
    elif change == "negate column":  # two sign flips cancel in an integer hash; not here
        Y[:, 2] *= -1
    elif change == "nan":
        Y[999, 1] = np.nan
    elif change == "scale":
        Y *= 2.0
    elif change == "last row":
        Y[-1, -1] += 1e-3
    bad = fp.changed_groups(Y)
    assert bad.size > 0
    rows = np.flatnonzero(np.any(~(Y == X), axis=1))  # the groups that really changed
    np.testing.assert_array_equal(bad, np.unique(rows // fingerprint.GROUP))
    if change == "swap rows":  # two rows of different groups swapped
        Y = X.copy()
        Y[[40, 900]] = Y[[900, 40]]
        np.testing.assert_array_equal(fp.changed_groups(Y), [40 // 32, 900 // 32])


def test_unchanged_data_is_never_refused():
    """The same data recomputed on 1 or 2 BLAS threads, from a copy (other addresses), or with
    stored values off by rounding (not bit-identical) passes; a change beyond rounding does
    not."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((20_000, 30)) * np.logspace(-3, 3, 30)
    fp = fingerprint.of_matrix(X)
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            assert fp.changed_groups(X).size == 0
            assert fp.changed_groups(X.copy()).size == 0
    exact = fp.values.copy()
    fp.values = exact * (1 + 4e-16 * rng.choice((-1, 1), exact.size))  # rounding-sized
    assert fp.changed_groups(X).size == 0
    fp.values = exact.copy()
    fp.values[7] += 1e-6 * abs(exact[7])
    np.testing.assert_array_equal(fp.changed_groups(X), [7])


def test_no_copy_of_a_writable_x():
    """tracemalloc's peak during certify on a writable float64 X (40 MB, n = 2.5e5, above the
    direct audit) stays below half the size of X (the old copy alone was X); the result keeps
    X itself."""
    X, model, y = _binary(n=250_000, d=20, seed=6)
    # the compiled kernels of the hinge's sorted view, of the 0/1 passes and of the scores
    # pass, loaded once per process (numba: some 40 MB of Python objects, not data) before
    # the peak is traced
    sorted_kernels.load()
    zero_one_kernels.use_kernel(X.shape[0])
    _pass_kernels.available(X.shape[0])
    for kw in (dict(loss="hinge", r=0.6), dict(loss="zero_one", r=0.3)):
        tracemalloc.start()
        try:
            res = otstab.certify(model, X, y, **kw)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert res.status == "optimal" and np.shares_memory(res.X, X)
        assert peak < 0.5 * X.nbytes, (kw, peak / X.nbytes)


def test_registry_releases_freed_arrays():
    X, model, y = _binary()
    res = otstab.certify(model, X, y, loss="hinge", r=0.6)
    view = res.X
    assert fingerprint.fingerprint_of(view) is not None
    assert fingerprint.fingerprint_of(X) is None  # the caller's own object is not the view
    before = len(fingerprint._REGISTRY)
    del res, view
    import gc

    gc.collect()
    assert len(fingerprint._REGISTRY) < before


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fortran_ordered_x_is_kept_and_checked(dtype):
    """A Fortran-ordered X (a DataFrame's values) is kept as it is and fingerprinted column by
    column; a result equals the one on the C-ordered copy and a change is caught."""
    X, model, y = _binary(n=2003, dtype=dtype)
    XF = np.asfortranarray(X)
    res = otstab.certify(model, XF, y, loss="hinge", r=0.6)
    ref = otstab.certify(model, np.ascontiguousarray(X), y, loss="hinge", r=0.6)
    assert res.value == pytest.approx(ref.value, rel=1e-12) and res.status == "optimal"
    if dtype == np.float64:
        assert np.shares_memory(res.X, XF)
    fp = fingerprint.of_matrix(XF)  # column by column == row by row, up to rounding
    np.testing.assert_allclose(fp.values, fingerprint.of_matrix(X).values, rtol=1e-12)
    if dtype == np.float64:
        # the scores pass and the check take X v in the same product (issue 31: one pass,
        # not a column-major read of each block of rows): the same numbers, bit for bit, so
        # the check never needs its rounding bound on unchanged data
        taken = fingerprint.fingerprint_of(res.X)
        np.testing.assert_array_equal(taken.values, fp.values)
        assert taken.changed_groups(res.X).size == 0
        assert fingerprint.column_major(res.X) and not fingerprint.column_major(X)
    XF[2001, 4] += 1e-3  # in the last, shorter group
    with pytest.raises(DataChangedError, match="rows 1984..2002"):
        res.to_frame()


WEIGHTED = {
    "hinge": dict(loss="hinge", r=0.6, solver="dual"),
    "hinge chi2": dict(loss="hinge", r=0.6, solver="dual", divergence="chi2"),
    "zero_one": dict(loss="zero_one", r=0.3),
    "zero_one chi2": dict(loss="zero_one", r=0.3, divergence="chi2"),
    "zero_one theta2=inf": dict(loss="zero_one", r=0.3, theta2=np.inf),
    "logistic": dict(loss="logistic", r=0.7),
}


def _reads(res):
    """Every read of a result that uses its sample weights, as comparable values."""
    return {"weights": lambda: np.asarray(res.weights),
            "mass": lambda: np.asarray(res.mass),
            "to_frame": lambda: res.to_frame()["weight"].to_numpy(),
            "probabilities": lambda: np.asarray(res.info["sample_weight"]),
            "pickle": lambda: np.asarray(pickle.loads(pickle.dumps(res)).weights)}


@pytest.mark.parametrize("case", list(WEIGHTED))
def test_sample_weights_kept_by_reference_and_checked(case, monkeypatch):
    """The caller's float64 weights are read through a view, not copied (the probabilities
    ``w / sum(w)`` computed where read), and fingerprinted: after the caller changes them,
    a read of the result either raises DataChangedError or returns the values certified
    (the result then holds its own n-vector of probabilities), never the changed ones. Above
    the direct audit (made small here) the hinge and 0/1 paths never build that n-vector, so
    every read raises. The answers equal those of weights the result owns (a list)."""
    from otstab.solve import _audit, _piecewise

    monkeypatch.setattr(_audit, "AUDIT_DIRECT_MAX", 500)
    monkeypatch.setattr(_piecewise, "AUDIT_DIRECT_MAX", 500)
    X, model, y = _binary()
    w = np.random.default_rng(5).uniform(0.5, 1.5, y.size)
    kw = WEIGHTED[case]
    res = otstab.certify(model, X, y, sample_weight=w, **kw)
    own = otstab.certify(model, X, y, sample_weight=w.tolist(), **kw)
    assert res.status == own.status == "optimal"
    assert repr(res.value) == repr(own.value)
    sw = res.info["sample_weight"]
    assert np.shares_memory(sw.w, w) and own.info["sample_weight"].owned
    by_reference = case.split()[0] in ("hinge", "zero_one")
    if by_reference:  # (no n-vector of p was built)
        assert sw._array is None
    old = w[77]
    w[77] = old * 2.0
    for name, read in _reads(res).items():
        if by_reference:
            with pytest.raises(DataChangedError, match="sample weights"):
                read()
            continue
        try:
            got = read()
        except DataChangedError:
            continue
        np.testing.assert_array_equal(got, _reads(own)[name](), err_msg=name)
    w[77] = old  # the certified values again: every read works, as the owned result's
    for name, read in _reads(res).items():
        np.testing.assert_array_equal(read(), _reads(own)[name](), err_msg=name)
