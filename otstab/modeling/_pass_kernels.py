"""The scores + fingerprint pass of a linear model as compiled loops (numba).

A certificate of a linear model reads X once: the scores ``X @ W.T + b`` and the fingerprint
of X (:mod:`otstab.modeling._fingerprint`) from the same rows. In NumPy that is two BLAS
products per block of rows (the second one on the block just read); at n = 1e6, d = 50 the
pass took 1.5-1.7 times one ``X @ coef`` on this project's 2-core machine. Compiled, each row
is read once into registers for both sums, and the pass runs at the speed of one product
(docs/scale.md).

Two loops, each over a run of rows ``lo:hi`` (``lo`` a multiple of ``GROUP`` = 32; the runs
go to Python threads, as :func:`otstab.modeling._fingerprint.each_block` spreads its blocks):

* :func:`rows_pass` for row-major X (each row contiguous): every row is copied into a float64
  buffer of ``d`` numbers (float32 converted exactly) and its dot products with ``v`` and
  ``W``'s first row summed in one compiled loop (reassociated: vectorised), with the other
  rows of ``W`` one by one. Float32 data and its float64 copy run the very same code on the
  same numbers: equal scores and fingerprints, bit for bit; so do one thread and several (a
  row is one thread's), and a fingerprint taken alone (the check) and with the scores.
* :func:`cols_pass` for column-major X (a DataFrame's values): blocks of ``COL_BLOCK`` rows,
  the columns of the block added four at a time into per-row sums, in column order (no
  reassociation: the loop is vectorised across rows).

Their fingerprints are the same numbers as the NumPy pass's up to rounding (each a sum of the
same ``32 d`` products in another order): a fingerprint records how it was taken
(``Fingerprint.how``) and its check recomputes it the same way, so that unchanged data gives
the same bits; where that is not possible, the check compares with the rounding bound.

Also here, from the scores the pass wrote: the base risk and the largest loss
(:func:`loss_stats`: piecewise-linear and binary 0/1 losses, the same loss values as
:mod:`otstab.modeling._losses` bit for bit; :func:`logistic_stats`: the logistic loss's sum
with the exp and log1p of the logistic pass, and the rows at the smallest margin, where the
caller takes the largest loss from the loss itself), each chunk's losses written first (one
branch-free loop per kind of loss) and reduced in a separate loop (vectorised). The stats run
as two halves of the rows on two threads where there are two CPUs, each chunk's sum kept and
the chunks added in order: the same bits on one thread or two.

Compiled on first use for at least :data:`KERNEL_MIN_ROWS` rows (or loaded from numba's
cache on disk: the first large certificate of a process pays that once); without numba, or
when compiling fails (a warning on the "otstab" logger), the NumPy pass runs. This module
does not import the rest of otstab (only otstab_solvers' exp and log1p).
"""

from __future__ import annotations

import importlib.util

import numpy as np
from otstab_solvers import logistic_kernels as _lk
from otstab_solvers import sorted_kernels as _sk
from otstab_solvers.weights import ScaledWeights

__all__ = ["HAVE_NUMBA", "USE_KERNEL", "KERNEL_MIN_ROWS", "COL_BLOCK", "GROUP", "available",
           "rows_pass", "cols_pass", "loss_stats", "logistic_stats"]

#: numba is installed
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
#: use the compiled pass (False: NumPy's blocks; set to compare the two)
USE_KERNEL = HAVE_NUMBA
#: the fewest rows of X for the compiled pass (loading it costs some 0.3-0.6 s once a process)
KERNEL_MIN_ROWS = 1 << 17
#: rows per block of :func:`cols_pass` (a multiple of GROUP; its sums stay in the L1 cache)
COL_BLOCK = 2048
#: rows per fingerprint group (as :data:`otstab.modeling._fingerprint.GROUP`)
GROUP = 32

_COMPILED: dict = {}
_LOADED: dict = {"ok": None}


def available(n: int) -> bool:
    """Whether a pass over ``n`` rows runs compiled (loading the loops on the first call)."""
    if not (USE_KERNEL and n >= KERNEL_MIN_ROWS):
        return False
    return _sk.load_once(_LOADED, _load, "the scores pass")


def _load() -> None:
    import numba

    for name, py, fast in (("_dot", _dot_py, {"reassoc"}), ("_dot2", _dot2_py, {"reassoc"}),
                           ("_rows", _rows_py, False), ("_cols", _cols_py, False),
                           ("_reduce", _reduce_py, {"reassoc", "nnan", "nsz"}),
                           ("_low", _low_py, {"reassoc", "nnan", "nsz"}),
                           ("_stats", _stats_py, False), ("_in_order", _in_order_py, False),
                           ("_exp_chunk", _exp_chunk_py, None),
                           ("_log1p_unit", _log1p_unit_py, None),
                           ("_logit_stats", _logit_stats_py, False),
                           ("_below", _below_py, False)):
        if fast is None:  # (the logistic pass's own helpers, with its floating-point flags)
            fast = _LK_FASTMATH.get(name, False)
        if name not in _COMPILED:  # (_rows calls _dot by its name: compiled first)
            # (error_model="numpy": no zero-division check in the loops, which would keep
            # them from being vectorised; none of them divides by zero)
            _COMPILED[name] = numba.njit(cache=True, nogil=True, fastmath=fast,
                                         error_model="numpy")(py)
            globals()[name] = _COMPILED[name]
    W, b = np.zeros((1, 2)), np.zeros(1)
    # (the fingerprint's weights u and v are read-only arrays, and certify reads X through a
    # read-only view: numba compiles per type, so these are the types a certificate passes,
    # compiled or loaded now rather than inside its first pass)
    v, u = np.zeros(2), np.zeros(GROUP)
    v.setflags(write=False)
    u.setflags(write=False)
    for dtype in (np.float64, np.float32):
        X = np.zeros((2, 2), dtype=dtype)
        X.setflags(write=False)
        XF = np.asfortranarray(X)
        XF.setflags(write=False)
        for store in (True, False):
            rows_pass(X, W, b, v, u, np.empty((2, 1)), np.empty(1), 0, 2, store)
            cols_pass(XF, W, b, v, u, np.empty((2, 1)), np.empty(1), 0, 2, store)
    ro = np.ones(2)  # (the caller's weights are read through a read-only view)
    ro.setflags(write=False)
    for y in (np.ones(2, dtype=np.int8), np.ones(2)):  # (labels +-1 int8, targets float64)
        for p in (None, np.ones(2), ScaledWeights(ro, 2.0)):
            loss_stats(np.zeros(2), y, "margin", (1.0,), (0.0,), p)
            if y.dtype == np.int8:
                logistic_stats(np.zeros(2), y, p)


def _dot_py(x, w):  # pragma: no cover - compiled
    s = 0.0
    for j in range(x.size):
        s += x[j] * w[j]
    return s


def _dot2_py(x, w, v):  # pragma: no cover - compiled
    s = t = 0.0
    for j in range(x.size):
        s += x[j] * w[j]
        t += x[j] * v[j]
    return s, t


#: :func:`_dot_py` and :func:`_dot2_py`, compiled once the pass is (the loops call them by
#: these names)
_dot = _dot_py
_dot2 = _dot2_py


def _rows_py(X, W, b, v, u, out, g, lo, hi, store):  # pragma: no cover - compiled
    d = X.shape[1]
    K = W.shape[0]
    buf = np.empty(d)
    w0 = W[0]
    for k in range(lo // GROUP, (hi + GROUP - 1) // GROUP):
        r0 = k * GROUP
        acc = 0.0
        for i in range(min(GROUP, hi - r0)):
            r = r0 + i
            for j in range(d):
                buf[j] = X[r, j]
            s, t = _dot2(buf, w0, v)  # (the same loop for every K: the same fingerprint)
            acc += u[i] * t
            if store:
                out[r, 0] = s + b[0]
                for c in range(1, K):
                    out[r, c] = _dot(buf, W[c]) + b[c]
        g[k] = acc


def _cols_py(X, W, b, v, u, out, g, lo, hi, store):  # pragma: no cover - compiled
    d = X.shape[1]
    K = W.shape[0] if store else 0
    t = np.empty(COL_BLOCK)
    s = np.empty((K, COL_BLOCK))
    for s0 in range(lo, hi, COL_BLOCK):
        m = min(COL_BLOCK, hi - s0)
        t[:m] = 0.0
        s[:, :m] = 0.0
        for j in range(0, d - d % 4, 4):  # four columns at a time, added in column order
            x0, x1 = X[s0:s0 + m, j], X[s0:s0 + m, j + 1]
            x2, x3 = X[s0:s0 + m, j + 2], X[s0:s0 + m, j + 3]
            a0, a1, a2, a3 = v[j], v[j + 1], v[j + 2], v[j + 3]
            for i in range(m):
                t[i] = (((t[i] + x0[i] * a0) + x1[i] * a1) + x2[i] * a2) + x3[i] * a3
            for c in range(K):
                a0, a1, a2, a3 = W[c, j], W[c, j + 1], W[c, j + 2], W[c, j + 3]
                for i in range(m):
                    s[c, i] = (((s[c, i] + x0[i] * a0) + x1[i] * a1) + x2[i] * a2) \
                        + x3[i] * a3
        for j in range(d - d % 4, d):
            x0 = X[s0:s0 + m, j]
            a0 = v[j]
            for i in range(m):
                t[i] += x0[i] * a0
            for c in range(K):
                a0 = W[c, j]
                for i in range(m):
                    s[c, i] += x0[i] * a0
        for c in range(K):
            for i in range(m):
                out[s0 + i, c] = s[c, i] + b[c]
        for k in range(s0 // GROUP, (s0 + m + GROUP - 1) // GROUP):
            acc = 0.0
            for i in range(min(GROUP, s0 + m - k * GROUP)):
                acc += u[i] * t[k * GROUP - s0 + i]
            g[k] = acc


def rows_pass(X, W, b, v, u, out, g, lo: int, hi: int, store: bool = True) -> None:
    """Rows ``lo:hi`` of a row-major X (float64 or float32): ``out[r, c] = X[r] . W[c] +
    b[c]`` (``out`` (n, K), K >= 1; ``store=False``: not written, the fingerprint alone) and
    ``g[k] = sum_i u_i (X[32 k + i] . v)`` for the groups of the run; ``lo`` a multiple of
    32."""
    _COMPILED["_rows"](X, W, b, v, u, out, g, lo, hi, store)


def cols_pass(X, W, b, v, u, out, g, lo: int, hi: int, store: bool = True) -> None:
    """:func:`rows_pass` for a column-major X; ``lo`` a multiple of :data:`COL_BLOCK`."""
    _COMPILED["_cols"](X, W, b, v, u, out, g, lo, hi, store)


#: rows per partial sum of :func:`loss_stats` (the partial sums then added in order)
STATS_CHUNK = 2048


def _stats_py(s, y, kind, a, c, p, scale, weighted, lo, hi, parts):  # pragma: no cover
    """Rows ``lo:hi`` (``lo`` a multiple of STATS_CHUNK): each chunk's sum of (weighted)
    losses into ``parts[chunk]``; returns the largest loss (over p > 0). The probabilities
    are ``p[i] / scale`` (the caller's weights and their sum, or p and 1.0)."""
    K = a.size
    lb = np.empty(STATS_CHUNK)
    top = -np.inf
    for c0 in range(lo, hi, STATS_CHUNK):
        kk = min(STATS_CHUNK, hi - c0)
        # (one loop per kind, each without branches: vectorised)
        if kind == 2:  # 0/1: 1[(s > 0) != (y > 0)]
            for j in range(kk):
                lb[j] = np.float64((s[c0 + j] > 0.0) != (y[c0 + j] > 0))
        elif kind == 0:
            for j in range(kk):
                u = y[c0 + j] * s[c0 + j]
                loss = a[0] * u + c[0]
                for k in range(1, K):
                    loss = max(loss, a[k] * u + c[k])
                lb[j] = loss
        else:
            for j in range(kk):
                u = y[c0 + j] - s[c0 + j]
                loss = a[0] * u + c[0]
                for k in range(1, K):
                    loss = max(loss, a[k] * u + c[k])
                lb[j] = loss
        part, high = _reduce(lb, p, scale, c0, kk, weighted)
        parts[c0 // STATS_CHUNK] = part
        top = max(top, high)
    return top


def _in_order_py(parts):  # pragma: no cover - compiled
    """``parts[0] + parts[1] + ...`` from 0.0, in order (no reassociation)."""
    total = 0.0
    for j in range(parts.size):
        total += parts[j]
    return total


def _reduce_py(lb, p, scale, c0, kk, weighted):  # pragma: no cover - compiled
    """``(sum of p_i l_i or of l_i, largest l_i over p_i > 0)`` of a chunk, ``p_i = p[i] /
    scale`` (reassociated: vectorised; the losses are finite)."""
    part = 0.0
    high = -np.inf
    if weighted:
        for j in range(kk):
            pj = p[c0 + j] / scale
            part += pj * lb[j]
            high = max(high, lb[j] if pj > 0.0 else -np.inf)
    else:
        for j in range(kk):
            part += lb[j]
            high = max(high, lb[j])
    return part, high


_reduce = _reduce_py


def _low_py(mb, p, scale, c0, kk, weighted):  # pragma: no cover - compiled
    """The smallest ``mb[j]`` of a chunk over ``p / scale > 0`` (vectorised; finite)."""
    low = np.inf
    if weighted:
        for j in range(kk):
            low = min(low, mb[j] if p[c0 + j] / scale > 0.0 else np.inf)
    else:
        for j in range(kk):
            low = min(low, mb[j])
    return low


_low = _low_py


def loss_stats(scores, y, on: str, slopes, intercepts,
               p=None) -> tuple[float, float]:
    """``(sum of p_i l_i (1 without p), largest l_i over p_i > 0)`` of the per-sample losses
    from a binary or regression model's scores in one compiled loop: ``on`` "margin" (``l =
    max_k(a_k y s + c_k)``), "residual" (``u = y - s``) or "zero_one" (``1[(s > 0) != (y >
    0)]``); the same losses as :mod:`otstab.modeling._losses`, bit for bit, summed in chunks
    of :data:`STATS_CHUNK` rows."""
    kind = {"margin": 0, "residual": 1, "zero_one": 2}[on]
    a = np.asarray(slopes if kind != 2 else (0.0,), dtype=np.float64)
    c = np.asarray(intercepts if kind != 2 else (0.0,), dtype=np.float64)
    weighted = p is not None
    pv, scale = _probabilities(p)
    total, tops = _by_halves("_stats", scores.size, scores, y, kind, a, c, pv, scale,
                             weighted)
    return float(total), float(max(tops))


#: the exp and log1p of the logistic pass (otstab_solvers.logistic_kernels: within an ulp or
#: two, vectorised), compiled here under these names with that module's flags
_exp_chunk_py = _sk._exp_chunk_py
_log1p_unit_py = _lk._log1p_unit_py
_LK_FASTMATH = {"_exp_chunk": {"contract"}}
_exp_chunk = _exp_chunk_py
_log1p_unit = _log1p_unit_py
#: the most rows :func:`logistic_stats` reads again for the largest loss
TOP_ROWS = 4096


def _logit_stats_py(s, y, p, scale, weighted, lo, hi, parts):  # pragma: no cover
    """Rows ``lo:hi``: each chunk's (weighted) sum of losses into ``parts[chunk]``; returns
    the smallest margin (over p > 0)."""
    mb = np.empty(STATS_CHUNK)
    xb = np.empty(STATS_CHUNK)
    eb = np.empty(STATS_CHUNK)
    scb = np.empty(STATS_CHUNK)
    low = np.inf
    for c0 in range(lo, hi, STATS_CHUNK):
        kk = min(STATS_CHUNK, hi - c0)
        for j in range(kk):
            m = y[c0 + j] * s[c0 + j]
            mb[j] = m
            xb[j] = -abs(m)
        _exp_chunk(xb, eb, scb, kk)
        for j in range(kk):  # (no reduction here: vectorised)
            eb[j] = max(-mb[j], 0.0) + _log1p_unit(eb[j])
        parts[c0 // STATS_CHUNK] = _reduce(eb, p, scale, c0, kk, weighted)[0]
        low = min(low, _low(mb, p, scale, c0, kk, weighted))
    return low


def _probabilities(p) -> tuple[np.ndarray, float]:
    """``(v, scale)`` with the probabilities ``p_i = v[i] / scale``: a
    :class:`~otstab_solvers.weights.ScaledWeights`' weights and their sum (read in the loop:
    no n-vector of p), an array and 1.0, or an empty array for uniform rows."""
    if p is None:
        return np.empty(0), 1.0
    if isinstance(p, ScaledWeights):
        return p.w, p.total
    return np.asarray(p, dtype=np.float64), 1.0


def _by_halves(name, n, *args):
    """``(total, (r1, r2))`` of the chunked kernel ``name`` over rows ``0:n`` as two halves
    split at a chunk boundary (on two threads where there are two CPUs:
    :func:`otstab_solvers.sorted_kernels.pair`): the chunks' sums added in order, so that
    one thread and two give the same bits."""
    kern = _COMPILED[name]
    parts = np.empty(-(-n // STATS_CHUNK))
    h = (parts.size // 2) * STATS_CHUNK
    if h == 0:
        r = kern(*args, 0, n, parts)
        both = (r, r)
    else:
        both = _sk.pair(lambda: kern(*args, 0, h, parts), lambda: kern(*args, h, n, parts))
    return _COMPILED["_in_order"](parts), both


def _below_py(s, y, p, scale, weighted, thr, out):  # pragma: no cover - compiled
    k = 0
    for i in range(s.size):
        if y[i] * s[i] <= thr and (not weighted or p[i] / scale > 0.0):
            if k < out.size:
                out[k] = i
            k += 1
    return k


def logistic_stats(scores, y, p=None) -> tuple[float, np.ndarray | None]:
    """``(sum of p_i l_i (1 without p), rows)`` of the binary logistic loss ``l = log(1 +
    exp(-m))``, ``m = y s``, in one compiled loop (the exp and log1p of the logistic pass,
    within an ulp or two of NumPy's), and the rows whose margins are within 1e-9 (relative)
    of the smallest (positive probability): the largest loss is among them, where the loss
    itself gives it (a margin further up has a loss smaller by far more than the rounding).
    ``rows`` None: more than :data:`TOP_ROWS` of them (the caller then takes the largest
    loss over every row)."""
    weighted = p is not None
    pv, scale = _probabilities(p)
    total, lows = _by_halves("_logit_stats", scores.size, scores, y, pv, scale, weighted)
    low = min(lows)
    thr = low + 1e-9 * abs(low) + 1e-300
    out = np.empty(TOP_ROWS, dtype=np.intp)
    k = _COMPILED["_below"](scores, y, pv, scale, weighted, thr, out)
    return float(total), (out[:k] if k <= TOP_ROWS else None)
