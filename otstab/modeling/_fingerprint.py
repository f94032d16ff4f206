"""Fingerprints of in-memory X: results keep the caller's array, not a copy of it.

``certify`` keeps a NumPy ``X`` by reference (a read-only view; no copy of n x d numbers) and
takes a fingerprint of it in the pass that already reads it for the model's scores. Every later
read of X through a result (``X_star``, ``to_frame``, the influence function, pickling) first
recomputes the fingerprint and raises :class:`otstab.errors.DataChangedError` when the values
changed (docs/guarantees.md, "Data ownership").

The fingerprint: the rows are cut into groups of ``GROUP`` = 32 consecutive rows, and each
group ``k`` gets the number ``g_k = sum_{i in k, j} u_(i mod 32) v_j x_ij`` for fixed
pseudo-random weights ``u`` (32) and ``v`` (d) drawn from [1, 2) with random signs. With
numba (at least :data:`otstab.modeling._pass_kernels.KERNEL_MIN_ROWS` rows) it is summed in
the compiled loop that computes the scores, each row read once (:func:`compiled_pass`);
otherwise it is computed as ``X.reshape(n / 32, 32 d) @ kron(u, v)`` over blocks of rows
that the scores pass has just read (cache-resident): one more matrix-vector product. n / 32
numbers are kept, and how they were taken (``Fingerprint.how``), so that the check takes
them the same way.

What it detects: any change of the values of X (entries, rows moved or swapped, a column
rescaled, NaN written in) that moves some ``g_k`` by more than the rounding of its float
evaluation, i.e. any change of an entry by more than about ``1e-10`` times the mean magnitude
of the entries of its group (for random ``u, v`` a change cancels within a group only on a set
of measure zero). Smaller changes are below every tolerance of the audit and may pass
unnoticed. Recomputing on unchanged data gives the same numbers bit for bit in practice; when
it does not (another BLAS kernel), the difference is compared with a rigorous bound on the
rounding of both evaluations, so unchanged data is never reported as changed.

Results find the fingerprint of their ``X`` by identity (``fingerprint_of(res.X)``): the
array view ``certify`` made is registered here and unregistered when it is freed. Arrays otstab
made itself (a subset's rows, an unpickled result's X) have none and are not checked.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import DataChangedError
from . import _pass_kernels
from ._threads import blas_threads, one_blas_thread

__all__ = ["GROUP", "Fingerprint", "block_rows", "column_major", "of_matrix", "register",
           "fingerprint_of", "check", "register_weights", "each_block", "each_run",
           "kernel_layout", "compiled_pass"]

#: rows per fingerprint group (n / GROUP numbers are kept: 1/32 of an n-vector)
GROUP = 32
#: bytes of X per block of the fingerprint pass (fits the cache beside the scores pass)
BLOCK_BYTES = 1 << 20
_SEED = 0x07AB5EED
_EPS = 2.0 ** -53
#: below this many entries of X a blocked pass runs in the calling thread only
PARALLEL_MIN = 1 << 18


def block_rows(d: int) -> int:
    """Rows per block of the fingerprint pass: a multiple of GROUP, about BLOCK_BYTES of X."""
    return GROUP * max(1, BLOCK_BYTES // (8 * GROUP * max(d, 1)))


@functools.lru_cache(maxsize=16)
def _weights(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(u, v, kron(u, v))``, fixed (read-only)."""
    # its own generator (not np.random.default_rng, which callers may replace)
    rng = np.random.Generator(np.random.PCG64(_SEED))
    u = rng.uniform(1.0, 2.0, GROUP) * rng.choice((-1.0, 1.0), GROUP)
    v = rng.uniform(1.0, 2.0, d) * rng.choice((-1.0, 1.0), d)
    w = np.kron(u, v)  # w[i * d + j] = u_i v_j
    for a in (u, v, w):
        a.setflags(write=False)
    return u, v, w


def block64(block: np.ndarray, buf: np.ndarray | None) -> np.ndarray:
    """``block`` as float64: itself, or cast into the C-ordered buffer ``buf`` (rows x d,
    reused from block to block: no allocation per block). The fingerprint pass and its check
    both read blocks through this, so that they compute the same way."""
    if block.dtype == np.float64:
        return block
    assert buf is not None, "a buffer for blocks that are not float64"
    out = buf[:block.shape[0]]
    np.copyto(out, block)
    return out


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The pool of ``workers`` threads of :func:`each_block` (made on first use)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="otstab-pass")
        return _POOLS[workers]


def _forget_pools() -> None:
    # a forked child has none of the parent's threads: its pools would queue work that no
    # thread runs (a hang); it makes its own on first use
    _POOLS.clear()
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def each_run(n: int, unit: int, run: Callable[[int, int], None], size: int,
             workers: int | None = None) -> None:
    """Call ``run(lo, hi)`` for ``workers`` contiguous runs of rows covering ``0:n``, each
    starting at a multiple of ``unit`` (the units spread as evenly as they go), on the
    threads of a pool (NumPy, BLAS and the compiled passes release the GIL) and every BLAS
    call inside on one thread. ``size``: the entries of the pass (below
    :data:`PARALLEL_MIN` it runs in the calling thread); ``workers`` default: as many as BLAS
    would use."""
    units = -(-n // unit)
    if threading.current_thread().name.startswith("otstab-pass"):
        workers = 1  # (a pass inside a pass: never wait on the pool from its own thread)
    elif workers is None:  # (read before the limit below)
        workers = 1 if size < PARALLEL_MIN else blas_threads()
    workers = max(1, min(int(workers), units))
    cuts = [min(n, units * k // workers * unit) for k in range(workers)] + [n]
    with one_blas_thread():
        if workers == 1:
            run(0, n)
        else:
            for f in [_pool(workers).submit(run, cuts[k], cuts[k + 1])
                      for k in range(workers)]:
                f.result()


def each_block(X: np.ndarray, visit: Callable[[np.ndarray, int], None],
               workers: int | None = None) -> None:
    """Call ``visit(block, start)`` for every block of :func:`block_rows` rows of the
    row-major ``X`` (float64, or float32 cast by :func:`block64` into a buffer of the calling
    thread), in order within each of ``workers`` contiguous runs of blocks (:func:`each_run`).

    The blocks are the same whatever the number of workers, and every BLAS call in ``visit``
    runs on one thread (:func:`otstab.modeling._threads.one_blas_thread`): the numbers each
    block gives do not depend on the thread count or on the dtype (float32 -> float64 is
    exact). The runs go to ``workers`` Python threads (default: as many as BLAS would use),
    which spreads the pass over the cores as BLAS would, without the thread wake-ups of two
    small multi-threaded BLAS calls per block (on two cores at n = 1e6, d = 50 those cost as
    much as the pass itself). ``visit`` must only write to the rows of its block."""
    n, d = X.shape
    step = block_rows(d)

    def run(lo: int, hi: int) -> None:
        buf = np.empty((min(step, hi - lo), d)) if X.dtype != np.float64 else None
        for s in range(lo, hi, step):
            visit(block64(X[s:min(s + step, hi)], buf), s)

    each_run(n, step, run, n * d, workers)


def kernel_layout(X) -> str | None:
    """How the compiled pass (:mod:`otstab.modeling._pass_kernels`) reads ``X``: ``"rows"``
    (each row contiguous), ``"cols"`` (column-major), or None (another layout or dtype, or
    fewer rows than it is loaded for, or no numba: the NumPy pass)."""
    if X.ndim != 2 or X.dtype not in (np.float64, np.float32) or X.shape[1] == 0:
        return None
    if X.flags.f_contiguous and not X.flags.c_contiguous:
        layout = "cols"
    elif X.strides[1] == X.itemsize:
        layout = "rows"
    else:
        return None
    return layout if _pass_kernels.available(X.shape[0]) else None


def compiled_pass(X: np.ndarray, layout: str, W: np.ndarray, b: np.ndarray,
                  out: np.ndarray | None, fp: Fingerprint, values: np.ndarray | None = None,
                  workers: int | None = None) -> None:
    """The scores ``out = X @ W.T + b`` ((n, K) C-ordered; W with no row: none) and the fingerprint
    (into ``values``, default ``fp.values``) in one compiled pass over ``X``, read as
    ``layout`` says (:func:`kernel_layout`); the runs over the threads of :func:`each_run`."""
    n, d = X.shape
    g = fp.values if values is None else values
    store = W.shape[0] > 0
    if not store:  # (the fingerprint alone: the same loop, with a row of W it does not use)
        W, b, out = np.zeros((1, d)), np.zeros(1), np.empty((1, 1))
    W = np.ascontiguousarray(W, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    kernel = _pass_kernels.rows_pass if layout == "rows" else _pass_kernels.cols_pass
    unit = GROUP if layout == "rows" else _pass_kernels.COL_BLOCK
    each_run(n, unit, lambda lo, hi: kernel(X, W, b, fp.v, fp.u, out, g, lo, hi, store),
             n * d, workers)
    if values is None:
        fp.how = layout


class Fingerprint:
    """The group sums ``values`` of an (n, d) matrix (see the module docstring)."""

    __slots__ = ("n", "d", "values", "u", "v", "w", "how", "__weakref__")

    def __init__(self, n: int, d: int):
        self.n, self.d = int(n), int(d)
        self.u, self.v, self.w = _weights(self.d)
        self.values = np.empty(-(-self.n // GROUP))
        #: how the values were taken: "blas" (NumPy's products), "rows" or "cols" (the
        #: compiled pass, :func:`compiled_pass`); the check recomputes them the same way
        self.how = "blas"

    def fill(self, block: np.ndarray, start: int, out: np.ndarray | None = None) -> None:
        """Fingerprint the float64 C-contiguous rows ``block`` of X starting at row ``start``
        (a multiple of GROUP; only the last block of X may end inside a group)."""
        out = self.values if out is None else out
        m = block.shape[0]
        k0, full = start // GROUP, m // GROUP
        if not block.flags.c_contiguous and block.strides[0] == block.itemsize:
            # Fortran-ordered rows (a DataFrame's values): the same sums as v (X_k^T u),
            # read column by column (no transposing copy)
            u, v = self.u, self.v
            if full:
                cols = block[:full * GROUP].T.reshape(self.d, full, GROUP)
                np.dot(v, cols @ u, out=out[k0:k0 + full])
            rest = m - full * GROUP
            if rest:
                out[k0 + full] = v @ (block[full * GROUP:].T @ u[:rest])
            return
        if full:
            np.dot(block[:full * GROUP].reshape(full, GROUP * self.d), self.w,
                   out=out[k0:k0 + full])
        rest = m - full * GROUP
        if rest:
            out[k0 + full] = block[full * GROUP:].reshape(-1) @ self.w[:rest * self.d]

    def fill_columns(self, X: np.ndarray, out: np.ndarray | None = None,
                     work: np.ndarray | None = None) -> None:
        """Fingerprint a whole column-major float64 ``X`` (a DataFrame's values): the same
        sums, grouped as ``g_k = sum_i u_i (X v)_(32 k + i)``, from one matrix-vector product
        that streams each column (blocks of rows of a column-major X cost more than two whole
        passes). ``X v`` is written into ``work`` (an n-vector, e.g. the scores' buffer before
        they are computed; None: a new one)."""
        out = self.values if out is None else out
        t = np.dot(X, self.v, out=work)
        full = self.n // GROUP
        if full:
            np.dot(t[:full * GROUP].reshape(full, GROUP), self.u, out=out[:full])
        rest = self.n - full * GROUP
        if rest:
            out[full] = t[full * GROUP:] @ self.u[:rest]

    def changed_groups(self, X) -> np.ndarray:
        """Indices of the groups whose values differ from ``values`` beyond rounding."""
        n, d = self.n, self.d
        if X.shape != (n, d):
            return np.arange(self.values.size)
        now = np.empty_like(self.values)
        layout = kernel_layout(X) if self.how != "blas" else None
        if layout is not None and layout == self.how:  # (as taken: the same loop and numbers)
            compiled_pass(X, layout, np.empty((0, d)), np.empty(0), None, self, now)
        elif column_major(X):
            self.fill_columns(X, now)
        else:
            each_block(X, lambda block, s: self.fill(block, s, now))
        differ = np.flatnonzero(~(now == self.values))
        if differ.size == 0:
            return differ
        # not bit-identical: compare with the rounding bound of both evaluations (each is a
        # sum of at most GROUP d products: |error| <= gamma_{GROUP d} sum |u_i v_j x_ij|)
        absw = np.abs(self.w)
        scale = np.empty(differ.size)
        last = self.values.size - 1
        for c in range(0, differ.size, 512):  # full groups, 512 at a time
            ks = differ[c:c + 512]
            ks = ks[ks < last] if n % GROUP else ks
            rows = (ks[:, None] * GROUP + np.arange(GROUP)).reshape(-1)
            block = np.abs(np.asarray(X[rows], dtype=np.float64))
            scale[c:c + ks.size] = block.reshape(ks.size, GROUP * d) @ absw
        if n % GROUP and differ[-1] == last:  # the last group, shorter
            rows = np.abs(np.asarray(X[last * GROUP:], dtype=np.float64)).reshape(-1)
            scale[-1] = rows @ absw[:rows.size]
        tol = 4.0 * (GROUP * d + 2) * _EPS * scale + 1e-300
        return differ[~(np.abs(now[differ] - self.values[differ]) <= tol)]


def column_major(X) -> bool:
    """Whether ``X`` is a column-major float64 matrix (not also row-major): fingerprinted by
    :meth:`Fingerprint.fill_columns`."""
    return X.dtype == np.float64 and X.flags.f_contiguous and not X.flags.c_contiguous


def of_matrix(X: np.ndarray) -> Fingerprint:
    """The fingerprint of ``X`` in a pass of its own (paths without a scores pass)."""
    n, d = X.shape
    fp = Fingerprint(n, d)
    layout = kernel_layout(X)
    if layout is not None:
        compiled_pass(X, layout, np.empty((0, d)), np.empty(0), None, fp)
    elif column_major(X):
        fp.fill_columns(X)
    else:
        each_block(X, fp.fill)
    return fp


_REGISTRY: dict[int, tuple[weakref.ref, Fingerprint]] = {}


def register(X: np.ndarray, fp: Fingerprint) -> None:
    """Attach ``fp`` to the array object ``X`` (until ``X`` is freed)."""
    key = id(X)
    _REGISTRY[key] = (weakref.ref(X), fp)
    weakref.finalize(X, _REGISTRY.pop, key, None)


def fingerprint_of(X) -> Fingerprint | None:
    """The fingerprint registered for the array object ``X`` (None: not a caller's array)."""
    entry = _REGISTRY.get(id(X))
    if entry is None or entry[0]() is not X:
        return None
    return entry[1]


def check(X, what: str = "X") -> None:
    """Raise DataChangedError when ``X`` (a caller's array a result keeps by reference: the
    evaluation data, or, 1-D, the sample weights) no longer has the values it had when it was
    certified; nothing for other arrays."""
    fp = fingerprint_of(X) if isinstance(X, np.ndarray) else None
    if fp is None:
        return
    weights = X.ndim == 1
    bad = fp.changed_groups(X[:, None] if weights else X)
    if bad.size:
        k = int(bad[0])
        first, last = k * GROUP, min((k + 1) * GROUP, fp.n) - 1
        data, copy = ("the sample weights (sample_weight) changed since they were",
                      "sample_weight.copy()") if weights else \
            ("the evaluation data X changed since it was", "X.copy()")
        raise DataChangedError(
            f"{what}: {data} certified (first in rows "
            f"{first}..{last}; {bad.size} of {fp.values.size} groups of {GROUP} rows differ). "
            "certify keeps your array by reference, not a copy: certify again, or pass a copy "
            f"({copy}) if you change it in place afterwards")


def register_weights(w: np.ndarray) -> None:
    """Fingerprint the caller's sample weights ``w`` (1-D, float64, read through a view: no
    copy), checked by :func:`check` before a result reads them again. One pass, 1/32 of an
    n-vector kept."""
    register(w, of_matrix(w[:, None]))
