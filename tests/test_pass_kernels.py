"""The compiled scores + fingerprint pass (otstab/modeling/_pass_kernels.py, numba).

Independent references: NumPy's own product ``X @ W.T + b`` (another kernel: equal to
rounding), the fingerprint's definition ``g_k = sum_{i in k, j} u_(i mod 32) v_j x_ij`` summed
exactly (mpmath), the NumPy pass's fingerprint (the same sums in another order), and a changed
entry, which the check must find (and must not find on unchanged data). The kernel is forced on
small arrays by lowering its row threshold.
"""

import mpmath
import numpy as np
import pytest

pytest.importorskip("numba")

from otstab_solvers import sorted_kernels as SK  # noqa: E402

from otstab.modeling import _fingerprint as F  # noqa: E402
from otstab.modeling import _pass_kernels as PK  # noqa: E402
from otstab.modeling._models import LinearScorer  # noqa: E402


@pytest.fixture
def kernel(monkeypatch):
    """The compiled pass on any number of rows, its column blocks small (several per run)."""
    monkeypatch.setattr(PK, "KERNEL_MIN_ROWS", 1)
    monkeypatch.setattr(PK, "USE_KERNEL", True)
    monkeypatch.setattr(F, "PARALLEL_MIN", 1)
    assert PK.available(10)


def _data(n=3001, d=7, seed=0, layout="rows", dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((n, d)) * np.logspace(-2, 2, d)).astype(np.float32)
    X = X.astype(dtype)  # (float32-representable: its float64 copy has the same values)
    if layout == "cols":
        X = np.asfortranarray(X)
    X.setflags(write=False)  # (certify reads X through a read-only view)
    return X, rng.standard_normal((3, d))


def _exact_fingerprint(X, k):
    u, v, _ = F._weights(X.shape[1])
    rows = np.asarray(X[32 * k:32 * (k + 1)], dtype=np.float64)
    exact = mpmath.fsum(mpmath.mpf(float(u[i])) * mpmath.mpf(float(v[j]))
                        * mpmath.mpf(float(rows[i, j]))
                        for i in range(rows.shape[0]) for j in range(X.shape[1]))
    scale = float(np.abs(rows) @ np.abs(v) @ np.abs(u[:rows.shape[0]]))
    return float(exact), scale


@pytest.mark.parametrize("layout", ["rows", "cols"])
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("d", [1, 6, 7, 9])
def test_scores_and_fingerprint_against_numpy_and_the_definition(kernel, layout, K, d):
    X, W = _data(n=1000 + d, d=d, layout=layout)
    W = W[:K, :d] if K > 1 else np.random.default_rng(1).standard_normal((1, d))
    task = "multiclass" if K > 1 else "binary"
    sc = LinearScorer(W, np.linspace(-0.5, 0.5, K), task)
    S, fp = sc.scores_and_fingerprint(X)
    assert fp.how == ("rows" if d == 1 else layout)  # (one column: also row-major)
    ref = X @ W.T + np.linspace(-0.5, 0.5, K)
    np.testing.assert_allclose(S, ref if K > 1 else ref[:, 0], rtol=0,
                               atol=4 * d * 2.0 ** -53 * (np.abs(X) @ np.abs(W).T).max() + 1e-15)
    for k in (0, 7, fp.values.size - 1):  # (the last group is short)
        exact, scale = _exact_fingerprint(X, k)
        assert abs(fp.values[k] - exact) <= (32 + d + 2) * 2.0 ** -53 * scale
    ref_fp = F.Fingerprint(*X.shape)  # the NumPy pass: the same sums, another order
    if fp.how == "cols":
        ref_fp.fill_columns(X)
    else:
        F.each_block(X, ref_fp.fill)
    np.testing.assert_allclose(fp.values, ref_fp.values, rtol=1e-12,
                               atol=1e-12 * np.abs(ref_fp.values).max())


@pytest.mark.parametrize("layout", ["rows", "cols"])
@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_bit_for_bit_on_any_thread_count_for_float32_and_alone(kernel, monkeypatch, layout,
                                                               task):
    X64, W = _data(n=5003, layout=layout)
    Wm = W[:1] if task == "binary" else W
    sc = LinearScorer(Wm, np.full(Wm.shape[0], 0.25), task)
    runs = {}
    for workers in (1, 2, 3):
        monkeypatch.setattr(F, "blas_threads", lambda w=workers: w)
        for dtype in (np.float64, np.float32):
            X = X64.astype(dtype, order="F" if layout == "cols" else "C")
            runs[workers, dtype] = sc.scores_and_fingerprint(X)
            assert runs[workers, dtype][1].how == layout
            alone = F.of_matrix(X)  # the fingerprint without the scores (the check's pass)
            np.testing.assert_array_equal(alone.values, runs[workers, dtype][1].values)
    S0, fp0 = runs[1, np.float64]
    for S, fp in runs.values():
        np.testing.assert_array_equal(S, S0)
        np.testing.assert_array_equal(fp.values, fp0.values)
    assert fp0.changed_groups(X64).size == 0


@pytest.mark.parametrize("layout", ["rows", "cols"])
def test_a_change_is_caught_and_unchanged_data_is_not(kernel, monkeypatch, layout):
    X, W = _data(n=4500, layout=layout)
    sc = LinearScorer(W[:1], np.zeros(1), "binary")
    monkeypatch.setattr(F, "blas_threads", lambda: 2)
    _, fp = sc.scores_and_fingerprint(X)
    Y = X.copy(order="F" if layout == "cols" else "C")
    Y[4000, 5] *= 1 + 1e-9
    for workers in (1, 2):
        monkeypatch.setattr(F, "blas_threads", lambda w=workers: w)
        np.testing.assert_array_equal(fp.changed_groups(Y), [4000 // 32])
        assert fp.changed_groups(X).size == 0
    # the check without the compiled pass (recomputed by NumPy: other rounding, compared
    # with the rounding bound): the same verdicts
    monkeypatch.setattr(PK, "USE_KERNEL", False)
    assert F.kernel_layout(X) is None
    assert fp.changed_groups(X).size == 0
    np.testing.assert_array_equal(fp.changed_groups(Y), [4000 // 32])


def test_rows_with_a_stride_and_short_arrays(kernel):
    base, W = _data(n=2000, d=9)
    X = base[::3, :7]  # rows neither adjacent nor whole: still each row contiguous
    assert F.kernel_layout(X) == "rows"
    sc = LinearScorer(W[:1, :7], np.zeros(1), "binary")
    S, fp = sc.scores_and_fingerprint(X)
    np.testing.assert_allclose(S, X @ W[0, :7], rtol=1e-13, atol=1e-12)
    assert fp.changed_groups(np.ascontiguousarray(X)).size == 0
    for n in (1, 31, 33):
        Xs = np.ascontiguousarray(base[:n])
        _, fps = LinearScorer(W[:1], np.zeros(1), "binary").scores_and_fingerprint(Xs)
        assert fps.how == "rows" and fps.values.size == -(-n // 32)
        for k in range(fps.values.size):
            exact, scale = _exact_fingerprint(Xs, k)
            assert abs(fps.values[k] - exact) <= (32 + 9 + 2) * 2.0 ** -53 * scale


def test_used_from_its_threshold_on_and_not_below(monkeypatch):
    monkeypatch.setattr(PK, "KERNEL_MIN_ROWS", 100)
    X, W = _data(n=99)
    sc = LinearScorer(W[:1], np.zeros(1), "binary")
    assert sc.scores_and_fingerprint(X)[1].how == "blas"
    X, W = _data(n=100)
    assert sc.scores_and_fingerprint(X)[1].how == "rows"
    Xo = np.asarray(X, dtype=np.float64)[:, ::2]  # (columns with a stride: NumPy's pass)
    assert F.kernel_layout(Xo) is None


@pytest.mark.parametrize("loss", ["hinge", "zero_one", "pinball", "absolute"])
@pytest.mark.parametrize("weighted", [False, True])
def test_loss_stats_compiled_equal_the_losses_of_the_model(kernel, monkeypatch, loss, weighted):
    """``Problem.loss_stats`` from the compiled loop against the per-sample losses computed
    by the loss itself (``losses_from_scores``) and summed exactly (math.fsum), and the
    largest over the samples of positive probability."""
    import math

    import otstab
    from otstab.modeling._losses import pinball
    from otstab.modeling._models import resolve_model

    rng = np.random.default_rng(4)
    n = 4099
    X = rng.standard_normal((n, 5))
    coef = rng.standard_normal(5)
    regression = loss in ("pinball", "absolute")
    if regression:
        y = X @ coef + rng.standard_normal(n)
        model = otstab.LinearModel(coef, 0.2, task="regression")
        loss_arg = pinball(0.3) if loss == "pinball" else "absolute"
    else:
        y = np.where(X @ coef + rng.standard_normal(n) > 0, 1, -1)
        model, loss_arg = otstab.LinearModel(coef, 0.2), loss
    w = rng.uniform(0.0, 2.0, n) * (rng.random(n) > 0.2) if weighted else None
    prob = resolve_model(model, X, y, loss=loss_arg, sample_weight=w)
    assert prob._compiled_stats() is not None
    got = prob.loss_stats()
    losses = prob.losses_from_scores(prob.scores, prob.y)
    p = prob.p
    if p is None:
        exact, top = math.fsum(losses) / n, losses.max()
    else:
        exact, top = math.fsum(p * losses), losses[p > 0].max()
    assert got[0] == pytest.approx(exact, rel=1e-13)
    assert got[1] == top
    monkeypatch.setattr(PK, "USE_KERNEL", False)  # the NumPy blocks: the same numbers
    prob.extra.clear()
    assert prob._compiled_stats() is None
    ref = prob.loss_stats()
    assert ref[0] == pytest.approx(got[0], rel=1e-13) and ref[1] == got[1]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_logistic_stats_compiled(kernel, monkeypatch, weighted, ties):
    """The logistic loss's base risk from the compiled loop against math.fsum of the loss's
    own values (NumPy), and its largest loss equal to theirs bit for bit: taken from the rows
    near the smallest margin, or from every row when more than TOP_ROWS tie there."""
    import math

    import otstab
    from otstab.modeling._models import resolve_model

    rng = np.random.default_rng(7)
    n = 5000
    X = rng.standard_normal((n, 4)) * np.array([1.0, 10.0, 100.0, 0.1])
    coef = rng.standard_normal(4)
    y = np.where(rng.random(n) > 0.5, 1, -1)
    if ties:  # half the rows at the smallest margin
        i = int(np.argmin(y * (X @ coef)))
        X[: n // 2], y[: n // 2] = X[i], y[i]
        monkeypatch.setattr(PK, "TOP_ROWS", 64)
    w = rng.uniform(0.0, 2.0, n) * (rng.random(n) > 0.1) if weighted else None
    prob = resolve_model(otstab.LinearModel(coef, 0.3), X, y, loss="logistic", sample_weight=w)
    assert prob._compiled_stats() == "logistic"
    assert (PK.logistic_stats(prob.scores, prob.y, prob.p)[1] is None) == ties
    got = prob.loss_stats()
    losses = prob.losses_from_scores(prob.scores, prob.y)
    p = prob.p
    exact = math.fsum(losses) / n if p is None else math.fsum(p * losses)
    top = losses.max() if p is None else losses[p > 0].max()
    assert got[0] == pytest.approx(exact, rel=1e-14)
    assert got[1] == top


@pytest.mark.parametrize("n", [1, 2047, 2048, 2049, 4096 * 3 + 5])
def test_stats_on_two_threads_equal_one_thread_bit_for_bit(kernel, monkeypatch, n):
    """The stats passes run as two halves split at a chunk boundary; each chunk's sum is
    kept and the chunks added in order, so two threads and one give the same bits (and the
    chunk sums in order are the total); the largest loss and the smallest margin are found
    in either half."""
    import math

    rng = np.random.default_rng(n)
    s = rng.standard_normal(n) * 3
    y = np.where(rng.random(n) > 0.5, 1, -1).astype(np.int8)
    s[-1], y[-1] = 50.0, -1  # the largest loss and smallest margin in the last row
    p = rng.random(n) * (rng.random(n) > 0.3)
    p /= max(p.sum(), 1e-300)
    calls = [lambda q: PK.loss_stats(s, y, "margin", (-1.0, 0.0), (1.0, 0.0), q),
             lambda q: PK.loss_stats(s, y, "zero_one", None, None, q),
             lambda q: PK.loss_stats(s, y.astype(np.float64), "residual", (0.3, -0.7),
                                     (0.0, 0.0), q),
             lambda q: PK.logistic_stats(s, y, q)[0]]
    two = [f(q) for f in calls for q in (None, p)]
    monkeypatch.setattr(SK, "_two_cpus", lambda: False)
    one = [f(q) for f in calls for q in (None, p)]
    assert repr(two) == repr(one)
    hinge = np.maximum(1.0 - y * s, 0.0)
    assert two[0][0] == pytest.approx(math.fsum(hinge), rel=1e-13)
    assert two[0][1] == hinge.max() == 51.0
    zo = ((s > 0) != (y > 0)).astype(float)
    assert two[3][0] == pytest.approx(math.fsum(p * zo), rel=1e-13, abs=1e-300)


@pytest.mark.parametrize("n", [1, 2049, 4096 * 3 + 5])
def test_stats_read_the_callers_weights_as_their_probabilities(kernel, n):
    """With the caller's weights read by reference (``ScaledWeights(w, total)``, a read-only
    view), the compiled passes divide each weight by the total where they read it: the same
    bits as the n-vector ``w / total`` gives, zero weights (and weights whose share
    underflows to 0) left out of the largest loss alike."""
    from otstab_solvers.weights import ScaledWeights

    rng = np.random.default_rng(n + 1)
    s = rng.standard_normal(n) * 3
    y = np.where(rng.random(n) > 0.5, 1, -1).astype(np.int8)
    s[0], y[0] = 40.0, -1  # the largest loss and smallest margin, of weight 0
    w = rng.uniform(0.5, 1.5, n) * (rng.random(n) > 0.3)
    w[0] = 0.0 if n > 1 else 1.0
    if n > 2:
        w[1] = 1e-320  # w / total underflows to 0: not in the support
    w.setflags(write=False)
    total = float(np.sum(w))
    calls = [lambda q: PK.loss_stats(s, y, "margin", (-1.0, 0.0), (1.0, 0.0), q),
             lambda q: PK.loss_stats(s, y, "zero_one", None, None, q),
             lambda q: PK.logistic_stats(s, y, q)]
    for f in calls:
        got, ref = f(ScaledWeights(w, total)), f(w / total)
        assert repr(got[0]) == repr(ref[0])
        if isinstance(got[1], np.ndarray):
            np.testing.assert_array_equal(got[1], ref[1])
        else:
            assert repr(got[1]) == repr(ref[1])


def test_a_failing_numba_leaves_the_numpy_pass(monkeypatch, caplog):
    """Where compiling the loops fails, the NumPy pass runs from then on, with a warning on
    the "otstab" logger, and certificates are unchanged in value."""
    import logging

    import otstab

    X, W = _data(n=3000, d=5)
    y = np.where(X @ W[0, :5] > 0, 1, -1)
    model = otstab.LinearModel(W[0, :5], 0.1)
    ref = otstab.certify(model, X, y, loss="hinge", r=1.0)  # (below the threshold: NumPy)

    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(PK, "KERNEL_MIN_ROWS", 1)
    monkeypatch.setattr(PK, "_LOADED", {"ok": None})
    monkeypatch.setattr(PK, "_load", broken)
    with caplog.at_level(logging.WARNING, logger="otstab"):
        res = otstab.certify(model, X, y, loss="hinge", r=1.0)
    assert any("could not compile the scores pass" in m for m in caplog.messages)
    assert F.kernel_layout(X) is None
    assert res.value == pytest.approx(ref.value, rel=1e-12)


def test_loading_compiles_every_type_a_certificate_passes(monkeypatch):
    """After the modules' loads (what the first large certificate does), certificates of
    float64, float32 and column-major data, hinge / 0/1 / logistic, KL / chi2 / theta2 = inf
    and sample weights compile no further specialisation: nothing is compiled inside a
    certificate (its time, and the memory tests that trace one)."""
    from otstab_solvers import logistic_binned as LB
    from otstab_solvers import logistic_kernels as LK
    from otstab_solvers import sorted_kernels as SK
    from otstab_solvers import zero_one_kernels as ZK

    import otstab
    from otstab.solve import _zero_one as zo

    monkeypatch.setattr(zo, "SUBSAMPLE", 256)  # (0/1's window pass at n = 3000)
    monkeypatch.setattr(PK, "KERNEL_MIN_ROWS", 1024)
    monkeypatch.setattr(SK, "KERNEL_MIN_KEYS", 1024)
    monkeypatch.setattr(LB, "MIN_N", 0)
    PK.available(1 << 20)
    SK.use_kernel(1 << 20)
    LK.use_kernel(1 << 20)
    ZK.use_kernel(1 << 20)

    def signatures():
        return {(mod.__name__, k): len(d.signatures) for mod in (PK, SK, LK, ZK)
                for k, d in mod._COMPILED.items()}

    before = signatures()
    n, d = 3000, 4
    rng = np.random.default_rng(9)
    X = rng.standard_normal((n, d))
    coef = rng.standard_normal(d)
    y = np.where(X @ coef + rng.standard_normal(n) > 0, 1, -1)
    model = otstab.LinearModel(coef, 0.1)
    for Xi in (X, X.astype(np.float32), np.asfortranarray(X)):
        for loss, r in (("hinge", 1.0), ("zero_one", 0.4), ("logistic", 0.8)):
            for div, th2 in (("kl", 0.25), ("chi2", 0.25), ("kl", np.inf)):
                otstab.certify(model, Xi, y, loss=loss, r=r, theta2=th2, divergence=div)
        otstab.certify(model, Xi, y, loss="hinge", r=1.0,
                       sample_weight=rng.uniform(0.5, 1.5, n))
    after = signatures()
    assert ("otstab_solvers.zero_one_kernels", "_window_block_py") in before
    assert set(after) >= set(before)
    grown = {k: (before.get(k, 0), v) for k, v in after.items() if v != before.get(k, 0)}
    assert not grown, grown
