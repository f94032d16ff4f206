"""The scores + fingerprint pass over blocks of rows (issue 31): spread over Python threads,
each block on one BLAS thread, so that its numbers do not depend on the thread count or on the
dtype, and the check recomputes them bit for bit.

Independent references: ``X @ coef`` (NumPy's own product), the fingerprint's definition
``g_k = sum_{i in k, j} u_(i mod 32) v_j x_ij`` evaluated in exact rational arithmetic (mpmath
fsum of the products), and the float64 copy of float32 data.
"""

import threading

import mpmath
import numpy as np
import pytest

from otstab.modeling import _fingerprint as F
from otstab.modeling._models import LinearScorer


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 rows (two groups): many blocks, a ragged last one, several per worker."""
    monkeypatch.setattr(F, "BLOCK_BYTES", 64 * 8 * 7)
    monkeypatch.setattr(F, "PARALLEL_MIN", 1)
    assert F.block_rows(7) == 64


def _data(n=5003, d=7, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.logspace(-2, 2, d)
    return X, rng.standard_normal(d), rng.standard_normal((3, d))


def test_blocks_are_the_same_on_any_number_of_workers(small_blocks):
    X, coef, W = _data()
    seen = {}
    for workers in (1, 2, 3, 7):
        hits = np.zeros(X.shape[0], int)

        def visit(block, s, hits=hits):
            hits[s:s + block.shape[0]] += 1
            seen.setdefault(s, block.shape[0])
            assert seen[s] == block.shape[0] and s % 64 == 0

        F.each_block(X, visit, workers=workers)
        assert np.all(hits == 1)  # every row exactly once
    assert sorted(seen) == list(range(0, 5003, 64))


@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_scores_and_fingerprint_on_threads_equal_one_thread_and_float32(small_blocks,
                                                                        monkeypatch, task):
    X, coef, W = _data()
    X = X.astype(np.float32).astype(np.float64)  # exactly representable in float32
    Wm = coef[None, :] if task == "binary" else W
    sc = LinearScorer(Wm, np.full(Wm.shape[0], 0.25), task)
    runs = {}
    for workers in (1, 2, 3):
        monkeypatch.setattr(F, "blas_threads", lambda w=workers: w)
        for dtype in (np.float64, np.float32):
            runs[workers, dtype] = sc.scores_and_fingerprint(X.astype(dtype))
    S0, fp0 = runs[1, np.float64]
    for S, fp in runs.values():  # bit for bit
        np.testing.assert_array_equal(S, S0)
        np.testing.assert_array_equal(fp.values, fp0.values)
    # against NumPy's own product (another kernel: equal to rounding)
    ref = X @ Wm.T + 0.25
    np.testing.assert_allclose(S0, ref[:, 0] if task == "binary" else ref, rtol=1e-12,
                               atol=1e-12 * np.abs(X).max())
    assert fp0.changed_groups(X).size == 0 and fp0.changed_groups(X.astype(np.float32)).size == 0


def test_fingerprint_values_match_the_definition_exactly_summed(small_blocks):
    X, _, _ = _data(n=200, d=7, seed=3)
    fp = F.of_matrix(X)
    u, v, _ = F._weights(7)
    for k in range(fp.values.size):
        rows = X[32 * k:32 * (k + 1)]
        exact = mpmath.fsum(mpmath.mpf(float(u[i])) * mpmath.mpf(float(v[j]))
                            * mpmath.mpf(float(rows[i, j]))
                            for i in range(rows.shape[0]) for j in range(7))
        scale = float(np.abs(rows) @ np.abs(v) @ np.abs(u[:rows.shape[0]]))
        assert abs(fp.values[k] - float(exact)) <= (32 * 7 + 2) * 2.0 ** -53 * scale


def test_a_change_is_caught_whatever_the_workers(small_blocks, monkeypatch):
    X, coef, _ = _data()
    sc = LinearScorer(coef[None, :], np.zeros(1), "binary")
    monkeypatch.setattr(F, "blas_threads", lambda: 2)
    _, fp = sc.scores_and_fingerprint(X)
    Y = X.copy()
    Y[4000, 5] *= 1 + 1e-9
    np.testing.assert_array_equal(fp.changed_groups(Y), [4000 // 32])
    monkeypatch.setattr(F, "blas_threads", lambda: 1)
    np.testing.assert_array_equal(fp.changed_groups(Y), [4000 // 32])
    assert fp.changed_groups(X).size == 0


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_runs_its_own_pass(small_blocks, monkeypatch):
    """After the pool's threads started, a forked child (multiprocessing's default on Linux)
    has none of them: its pass must not wait on them (it makes its own pool)."""
    import os

    X, coef, _ = _data()
    sc = LinearScorer(coef[None, :], np.zeros(1), "binary")
    monkeypatch.setattr(F, "blas_threads", lambda: 2)
    S, fp = sc.scores_and_fingerprint(X)
    pool = F._pool(2)  # both of its threads started (each waits for the other), then idle
    both = threading.Barrier(2)
    for f in [pool.submit(both.wait, 5.0) for _ in range(2)]:
        f.result()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 when its pass gives the parent's numbers
        try:
            S2, fp2 = sc.scores_and_fingerprint(X)
            ok = np.array_equal(S2, S) and np.array_equal(fp2.values, fp.values)
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    import select

    ready, _, _ = select.select([r], [], [], 10.0)
    got = os.read(r, 1) if ready else b"timeout"
    os.close(r)
    os.waitpid(pid, 0) if ready else os.kill(pid, 9)
    assert got == b"1", got
