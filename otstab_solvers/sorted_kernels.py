"""Compiled passes of the sorted two-piece oracle (numba; NumPy's blocks without it).

A KL evaluation of :class:`~otstab_solvers.sorted_oracle.SortedTwoPiece` is one pass over the
active keys: the exponents ``k1 (nu - piv) + k0`` (at least a floor), their exponentials and
seven sums. In NumPy that is a dozen passes over each block, and NumPy's float64 ``exp`` is
scalar on machines without AVX-512 (5 ns a key; 9 ns a key for the whole evaluation at n =
1e6). The kernels here do it in one loop per chunk of keys that the compiler vectorises, with
an ``exp`` of their own (:func:`_exp_chunk_py`: Cody-Waite reduction by ``ln 2`` and a
degree-13 Taylor polynomial, within 1 ulp of NumPy's over the exponents an evaluation takes,
``[-700, 0]``; tests/test_sorted_kernels.py checks it against mpmath). The sums are accumulated
per chunk of :data:`CHUNK` keys and the chunks' sums in order, so their rounding is of the
order of NumPy's blocked sums (at most ``(CHUNK / 4 + n / CHUNK)`` ulps of the sum of the
absolute terms).

Also here: the window's partition of the keys (:func:`window_partition`, or from the rows
themselves, :func:`partition_rows`: one loop writing the keys that always move, collecting
those whose kinks lie in the bracket), chi2's keyed sums (:func:`chi2_sums_pass`), the rows'
range (:func:`u_range`), and the passes of a front that is not stored but recomputed from the
rows (:func:`front_moments`, :func:`b_keys`, :func:`kl_front`, :func:`chi2_front`: each row's
key ``y s - b`` with NumPy's operations, the rows out of the front weighed 0; the keys come
in row order, so these loops blend by 1 / 0 where the sorted keys' loops may branch).

Every kernel is compiled on first use (or loaded from numba's cache on disk: 0.3-1 s the
first time in a process: :func:`load`), only for views of at least :data:`KERNEL_MIN_KEYS`
keys, so a small problem never pays it. This module does not import otstab.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np

__all__ = ["HAVE_NUMBA", "USE_KERNEL", "KERNEL_MIN_KEYS", "CHUNK", "use_kernel", "load",
           "exp_into", "kl_sums", "window_partition", "chi2_sums_pass", "rows_ok",
           "partition_rows", "u_range", "front_moments", "b_keys", "kl_front", "chi2_front", "pair",
           "load_once", "compile_with",
           "moved_rows"]

#: numba is installed
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
#: use the compiled kernels (False: NumPy's blocks; set to compare the two)
USE_KERNEL = HAVE_NUMBA
#: the fewest keys a view needs for the kernels (loading them costs 0.3-0.6 s once per process)
KERNEL_MIN_KEYS = 1 << 17
#: keys per chunk of a kernel (the chunk's exponents and exponentials stay in the L1 cache)
CHUNK = 2048

_COMPILED: dict = {}
#: whether :func:`load` succeeded (None: not tried yet)
_LOADED: dict = {"ok": None}
#: the floating-point liberties of each compiled helper: the exp's polynomial in fused
#: multiply-adds (each one rounding: more accurate, and a fifth faster); the sums of a chunk
#: reassociated (several accumulators, vectorised: 2.5x faster). Nothing else is reordered:
#: the exp's reduction ``(x / ln 2 + 1.5 * 2^52) - 1.5 * 2^52`` depends on the order it is
#: written in
_FASTMATH = {"_exp_chunk": {"contract"}, "_kl_chunk": {"reassoc"},
             "_moments_chunk": {"reassoc"}}

# exp(x) = 2^k exp(r), k = round(x / ln 2), r = (x - k ln2_hi) - k ln2_lo (fdlibm's split of
# ln 2: k ln2_hi is exact for |k| < 2^11), |r| <= 0.35; exp(r) by its Taylor polynomial of
# degree 13 (the remainder is below 4e-18, a 30th of an ulp); 2^k from the bits of
# ``x / ln 2 + 1.5 * 2^52``, whose low bits hold k
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0  # 1.5 * 2^52: adding it rounds to an integer
_SHIFT_BITS = int(np.array([_SHIFT]).view(np.int64)[0])
_C = tuple(1.0 / math.factorial(k) for k in range(14))
_C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = _C[2:]
#: the exponents the kernels' exp takes (an evaluation's are within [-700, 0] up to rounding:
#: :meth:`~otstab_solvers.sorted_oracle.SortedTwoPiece._exponent_map`); clamped there
_X_MIN, _X_MAX = -708.0, 709.0


def use_kernel(size: int) -> bool:
    """Whether a view of ``size`` keys runs the compiled kernels: numba loaded them (on the
    first such call: :func:`load`; where that fails the NumPy blocks run from then on, with a
    warning on the "otstab" logger)."""
    if not (USE_KERNEL and size >= KERNEL_MIN_KEYS):
        return False
    return load_once(_LOADED, load, "the sorted oracle's kernels")


def load_once(state: dict, load_fn, what: str) -> bool:
    """Whether the compiled loops of a module are there: ``load_fn()`` runs on the first call
    (``state["ok"]`` None) and its outcome is kept in ``state``; where it fails (a broken
    numba installation), a warning on the "otstab" logger names ``what`` and the NumPy
    passes run from then on."""
    if state["ok"] is None:
        try:
            load_fn()
            state["ok"] = True
        except Exception as exc:  # pragma: no cover - a broken numba installation
            logging.getLogger("otstab").warning(
                "numba could not compile %s (%s: %s); the NumPy passes run instead", what,
                type(exc).__name__, exc)
            state["ok"] = False
    return bool(state["ok"])


def compile_with(fn, compiled: dict, namespace: dict, helpers, fastmath: dict,
                 error_model: Literal["python", "numpy"] = "python"):
    """``fn`` compiled by numba (cached on disk; compiled or loaded on first use) and kept in
    ``compiled``, after its ``helpers``, the ``(name, function)`` pairs its loops call by
    those names: each compiled once (with ``fastmath[name]``, else none) and bound in
    ``namespace`` (the globals of the module that defines the loops, where numba looks the
    names up). ``error_model="numpy"``: a division by zero gives inf / nan as NumPy's, no
    check in the loop (which would keep it from being vectorised). The compiled kernel
    modules share this."""
    got = compiled.get(fn.__name__)
    if got is None:
        import numba

        for name, py in helpers:
            if name not in compiled:  # (the loops call them by these names: compiled first)
                compiled[name] = numba.njit(cache=True, nogil=True, error_model=error_model,
                                            fastmath=fastmath.get(name, False))(py)
                namespace[name] = compiled[name]
        got = compiled[fn.__name__] = numba.njit(cache=True, nogil=True,
                                                 error_model=error_model)(fn)
    return got


def _kernel(fn):
    """The compiled ``fn`` (:func:`compile_with`)."""
    return compile_with(fn, _COMPILED, globals(), (
        ("_exp_chunk", _exp_chunk_py), ("_kl_chunk", _kl_chunk_py), ("_row_key", _row_key),
        ("_front_chunk", _front_chunk_py), ("_moments_chunk", _moments_chunk_py),
        ("_extremes", _extremes_py), ("_chi2_keys", _chi2_keys_py)), _FASTMATH)


def load() -> None:
    """Compile the kernels, or load them from numba's cache (what the first view of at least
    :data:`KERNEL_MIN_KEYS` keys in a process does: 0.3-1 s once, and some 40 MB of Python
    objects that tracemalloc counts). Nothing without numba."""
    if not HAVE_NUMBA:
        return
    x = np.zeros(4)
    exp_into(x, x)
    kl_sums(x, 0, 4, 1.0, 0.0, None, 0.0)
    window_partition(x, 0.0, 1.0, np.empty(4), 0, 0)
    chi2_sums_pass(x, 4, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0)
    for y in (np.ones(4, dtype=np.int8), np.ones(4)):  # (labels +-1 int8, targets float64)
        u_range(y, x, False)
        partition_rows(y, x, 1.0, False, 0.0, 1.0, np.empty(4))
        rows = (y, x, 1.0, False)
        front_moments(rows, 0.0)
        b_keys(rows, 0.0, 1.0, np.empty(4))
        kl_front(rows, 0.0, 1.0, 0.0, None, 0.0)
        chi2_front(rows, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0)


def _exp_chunk_py(x, out, scale, m):  # pragma: no cover - compiled
    """``exp(x[:m])`` into ``out[:m]`` (``scale[:m]``: scratch), within 1 ulp of NumPy's."""
    bits = scale.view(np.int64)
    for i in range(m):
        xi = x[i]
        if xi < _X_MIN:
            xi = _X_MIN
        if xi > _X_MAX:
            xi = _X_MAX
        kd = xi * _LOG2E + _SHIFT
        k = kd - _SHIFT
        r = (xi - k * _LN2_HI) - k * _LN2_LO
        p = _C13
        p = p * r + _C12
        p = p * r + _C11
        p = p * r + _C10
        p = p * r + _C9
        p = p * r + _C8
        p = p * r + _C7
        p = p * r + _C6
        p = p * r + _C5
        p = p * r + _C4
        p = p * r + _C3
        p = p * r + _C2
        p = p * r + 1.0
        p = p * r + 1.0
        out[i] = p
        scale[i] = kd
    for i in range(m):  # 2^k: the integer in kd's low bits moved to the exponent field
        bits[i] = (bits[i] - _SHIFT_BITS + 1023) << 52
    for i in range(m):
        out[i] *= scale[i]


#: :func:`_exp_chunk_py`, compiled once a kernel is (the kernels call it by this name)
_exp_chunk = _exp_chunk_py


def _exp_all(x, out):  # pragma: no cover - compiled
    n = x.size
    sc = np.empty(min(n, CHUNK))
    for s in range(0, n, CHUNK):
        m = min(CHUNK, n - s)
        _exp_chunk(x[s:s + m], out[s:s + m], sc, m)
    return out


def _kl_chunk_py(nu, s, m, xb, eb, c):  # pragma: no cover - compiled
    """The sums of one chunk of :func:`_kl_sums` (keys ``nu[s:s + m]``, exponents ``xb``,
    exponentials ``eb``)."""
    z = enu = ex = snu = s1 = s2 = s3 = 0.0
    for i in range(m):
        e = eb[i]
        v = nu[s + i]
        d = v - c
        ed = e * d
        z += e
        enu += e * v
        ex += e * xb[i]
        snu += v
        s1 += ed
        s2 += ed * d
        s3 += ed * d * d
    return z, enu, ex, snu, s1, s2, s3


#: :func:`_kl_chunk_py`, compiled once a kernel is
_kl_chunk = _kl_chunk_py


def _kl_sums(nu, start, stop, k1, k0, floor, c, piv):  # pragma: no cover - compiled
    """The sums of a KL pass over ``nu[start:stop]``: with ``x = max(k1 (nu - piv) + k0,
    floor)`` and
    ``e = exp(x)``: ``sum e``, ``sum e nu``, ``sum e x``, ``sum nu``, and ``sum e (nu - c)^j``
    for j = 1, 2, 3."""
    xb = np.empty(CHUNK)
    eb = np.empty(CHUNK)
    sc = np.empty(CHUNK)
    Z = Enu = Ex = Snu = S1 = S2 = S3 = 0.0
    for s in range(start, stop, CHUNK):
        m = min(CHUNK, stop - s)
        for i in range(m):
            x = k1 * (nu[s + i] - piv) + k0
            if x < floor:
                x = floor
            xb[i] = x
        _exp_chunk(xb, eb, sc, m)
        z, enu, ex, snu, s1, s2, s3 = _kl_chunk(nu, s, m, xb, eb, c)
        Z += z
        Enu += enu
        Ex += ex
        Snu += snu
        S1 += s1
        S2 += s2
        S3 += s3
    return Z, Enu, Ex, Snu, S1, S2, S3


def exp_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``exp(x)`` into ``out`` (float64, contiguous) with the kernels' exp."""
    return _kernel(_exp_all)(x, out)


def kl_sums(nu: np.ndarray, start: int, stop: int, k1: float, k0: float,
            floor: float | None, c: float, piv: float = 0.0) -> tuple[float, ...]:
    """:func:`_kl_sums` compiled (``floor`` None: none)."""
    fl = -math.inf if floor is None else float(floor)
    return _kernel(_kl_sums)(nu, int(start), int(stop), float(k1), float(k0), fl, float(c),
                             float(piv))


def _partition(nb, a_thr, c_thr, out, ia, ib):  # pragma: no cover - compiled
    """The keys ``nb`` of one block into ``out``: those below ``a_thr`` (``A``) from the front
    (position ``ia`` on), those in ``[a_thr, c_thr]`` (``B``) from the back (``ib`` of them
    there already, the last at ``out[-ib]``); the others are dropped. Returns the new ``(ia,
    ib)``; once ``out`` is full the keys are only counted (``ia + ib > out.size``: it was too
    small)."""
    size = out.size
    for i in range(nb.size):
        v = nb[i]
        # without branches on the key (2.5x faster on keys in row order): written to both
        # free ends, kept where its count moves on (a dropped key leaves free slots as they
        # were; with one free slot both ends are that slot)
        if ia + ib < size:
            out[ia] = v
            out[size - 1 - ib] = v
        a = v < a_thr
        ia += a
        ib += (v <= c_thr) & (not a)
    return ia, ib


def window_partition(nb, a_thr: float, c_thr: float, out, ia: int, ib: int):
    """:func:`_partition` compiled."""
    return _kernel(_partition)(nb, float(a_thr), float(c_thr), out, int(ia), int(ib))


def _row_key(y, s, i, residual):  # pragma: no cover - compiled
    """``u = y s`` (margin) or ``y - s`` (residual) of row ``i``: NumPy's arithmetic (``y``
    of any real type taken as float64, exactly, then one rounded operation)."""
    yi = float(y[i])
    return yi - s[i] if residual else yi * s[i]


def _partition_rows_py(y, s, b, residual, a_thr, c_thr, out):  # pragma: no cover - compiled
    """:func:`_partition` of the negated hinge keys ``u - b`` of every row (``u``:
    :func:`_row_key`; the numbers of :meth:`otstab_solvers.dual.AffineRows.negated_piece`),
    computed here instead of written block by block first."""
    size = out.size
    ia = ib = 0
    for i in range(s.size):
        v = _row_key(y, s, i, residual) - b
        if ia + ib < size:
            out[ia] = v
            out[size - 1 - ib] = v
        a = v < a_thr
        ia += a
        ib += (v <= c_thr) & (not a)
    return ia, ib


def _b_keys_py(y, s, b, residual, a_thr, c_thr, out):  # pragma: no cover - compiled
    """The negated keys in ``[a_thr, c_thr]`` of every row, in row order, into ``out`` (while
    they fit); returns how many there are."""
    size = out.size
    k = 0
    for i in range(s.size):
        v = _row_key(y, s, i, residual) - b
        if k < size:
            out[k] = v
        k += (v >= a_thr) & (v <= c_thr)
    return k


def b_keys(rows, a_thr: float, c_thr: float, out) -> int:
    """:func:`_b_keys_py` compiled (``rows = (y, s, b, residual)``)."""
    y, s, b, residual = rows
    return _kernel(_b_keys_py)(y, s, float(b), bool(residual), float(a_thr), float(c_thr),
                               out)


def _u_range_py(y, s, residual):  # pragma: no cover - compiled
    """(smallest, largest) ``u`` of every row (nan when a row's is nan, as NumPy's)."""
    lo = math.inf
    hi = -math.inf
    bad = False
    for i in range(s.size):
        v = _row_key(y, s, i, residual)
        bad |= v != v
        lo = min(lo, v)
        hi = max(hi, v)
    if bad:
        return math.nan, math.nan
    return lo, hi


def rows_ok(y, s) -> bool:
    """Whether the row kernels take these labels / targets and scores: 1-D, the scores
    contiguous float64, the labels of a real type (cast to float64 as NumPy casts them)."""
    return (isinstance(s, np.ndarray) and isinstance(y, np.ndarray) and s.ndim == y.ndim == 1
            and s.dtype == np.float64 and s.flags.c_contiguous and y.size == s.size
            and y.dtype.kind in "iubf" and y.dtype.itemsize <= 8)


def partition_rows(y, s, b: float, residual: bool, a_thr: float, c_thr: float, out):
    """:func:`_partition_rows_py` compiled."""
    return _kernel(_partition_rows_py)(y, s, float(b), bool(residual), float(a_thr),
                                       float(c_thr), out)


def u_range(y, s, residual: bool) -> tuple[float, float]:
    """:func:`_u_range_py` compiled."""
    return _kernel(_u_range_py)(y, s, bool(residual))


def _front_chunk_py(y, s, b, residual, a_thr, i0, m, keys):  # pragma: no cover - compiled
    """The negated keys below ``a_thr`` (the front's) of rows ``i0..i0 + m``, in row order,
    into ``keys``; returns how many (without branches on the key: each is written to the
    next free slot, kept when it is in the front)."""
    k = 0
    for i in range(m):
        v = _row_key(y, s, i0 + i, residual) - b
        keys[k] = v
        k += v < a_thr
    return k


def _moments_chunk_py(keys, m):  # pragma: no cover - compiled
    """(sum, sum of squares) of ``keys[:m]``."""
    s1 = s2 = 0.0
    for i in range(m):
        v = keys[i]
        s1 += v
        s2 += v * v
    return s1, s2


def _extremes_py(keys, m, lo, hi):  # pragma: no cover - compiled
    """(smallest, largest) of ``keys[:m]``, ``lo``, ``hi``: four of each at a time (one
    running minimum is a chain of dependent comparisons)."""
    l0 = l1 = l2 = l3 = lo
    h0 = h1 = h2 = h3 = hi
    i = 0
    while i + 4 <= m:
        l0 = min(l0, keys[i])
        l1 = min(l1, keys[i + 1])
        l2 = min(l2, keys[i + 2])
        l3 = min(l3, keys[i + 3])
        h0 = max(h0, keys[i])
        h1 = max(h1, keys[i + 1])
        h2 = max(h2, keys[i + 2])
        h3 = max(h3, keys[i + 3])
        i += 4
    while i < m:
        l0 = min(l0, keys[i])
        h0 = max(h0, keys[i])
        i += 1
    return min(min(l0, l1), min(l2, l3)), max(max(h0, h1), max(h2, h3))


#: :func:`_front_chunk_py`, :func:`_moments_chunk_py` and :func:`_extremes_py`, compiled
#: once a kernel is
_front_chunk = _front_chunk_py
_moments_chunk = _moments_chunk_py
_extremes = _extremes_py


def _front_moments_py(y, s, b, residual, a_thr):  # pragma: no cover - compiled
    """(count, sum of nu, sum of nu^2, smallest nu, largest nu) over the rows whose negated
    key ``nu = u - b`` is below ``a_thr`` (a window's front), summed per chunk of rows (the
    other rows' keys replaced by 0 in the sums and by -inf in the largest: no branches)."""
    raw = np.empty(CHUNK)
    keys = np.empty(CHUNK)
    high = np.empty(CHUNK)
    cnt = 0
    S1 = S2 = 0.0
    lo = math.inf
    hi = -math.inf
    n = s.size
    for i0 in range(0, n, CHUNK):
        m = min(CHUNK, n - i0)
        for i in range(m):
            v = _row_key(y, s, i0 + i, residual) - b
            a = v < a_thr
            cnt += a
            raw[i] = v
            keys[i] = v if a else 0.0
            high[i] = v if a else -math.inf
        s1, s2 = _moments_chunk(keys, m)
        S1 += s1
        S2 += s2
        # the smallest key of all is the front's (when it has one); its largest
        lo = min(lo, _extremes(raw, m, math.inf, -math.inf)[0])
        hi = _extremes(high, m, math.inf, hi)[1]
    return cnt, S1, S2, lo, hi


def _kl_front_py(y, s, b, residual, a_thr, k1, k0, floor, c,
                 piv):  # pragma: no cover - compiled
    """:func:`_kl_sums` over the front's keys, computed from the rows chunk by chunk: every
    row's exponential, those out of the front weighed 0 (no branch, no compaction: 1.3x the
    pass over stored keys, against 2x compacted)."""
    keys = np.empty(CHUNK)
    xb = np.empty(CHUNK)
    eb = np.empty(CHUNK)
    sc = np.empty(CHUNK)
    mask = np.empty(CHUNK)
    Z = Enu = Ex = Snu = S1 = S2 = S3 = 0.0
    n = s.size
    for i0 in range(0, n, CHUNK):
        m = min(CHUNK, n - i0)
        for i in range(m):
            v = _row_key(y, s, i0 + i, residual) - b
            a = v < a_thr
            mask[i] = 1.0 if a else 0.0
            v = v if a else 0.0
            keys[i] = v
            x = k1 * (v - piv) + k0
            if x < floor:
                x = floor
            xb[i] = x
        _exp_chunk(xb, eb, sc, m)
        for i in range(m):
            eb[i] *= mask[i]
            xb[i] *= mask[i]
        # (a row out of the front: key 0, weight 0: nothing in any sum)
        z, enu, ex, snu, s1, s2, s3 = _kl_chunk(keys, 0, m, xb, eb, c)
        Z += z
        Enu += enu
        Ex += ex
        Snu += snu
        S1 += s1
        S2 += s2
        S3 += s3
    return Z, Enu, Ex, Snu, S1, S2, S3


#: the front's passes over the rows run as two halves (split at a multiple of CHUNK, their
#: results combined in order), on two threads where there are two CPUs: the same numbers on
#: one thread or two. None: found on first use
_PAIR: dict = {"pool": None, "pid": None}


def _two_cpus() -> bool:
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:  # pragma: no cover - not Linux
        return (os.cpu_count() or 1) >= 2


def pair(first, second):
    """``(first(), second())``: ``second`` on a thread of its own where the process has two
    CPUs (for compiled loops, which release the GIL, and NumPy), in turn otherwise; inside
    such a thread, in turn. A forked child makes its own pool (the parent's threads are not
    in it)."""
    if not _two_cpus() or threading.current_thread().name.startswith("otstab"):
        return first(), second()
    if _PAIR["pool"] is None or _PAIR["pid"] != os.getpid():
        _PAIR["pool"] = ThreadPoolExecutor(1, thread_name_prefix="otstab-front")
        _PAIR["pid"] = os.getpid()
    other = _PAIR["pool"].submit(second)
    return first(), other.result()


def _halves(fn, rows, *args):
    """``(fn(first half), fn(second half))`` of the rows ``(y, s, b, residual)``: in
    parallel where there are two CPUs (the compiled loops release the GIL), else in turn.
    A forked child makes its own pool (the parent's threads are not in it)."""
    y, s, b, residual = rows
    n = s.size
    h = (n // 2) // CHUNK * CHUNK
    kern = _kernel(fn)
    lo = (y[:h], s[:h], float(b), bool(residual), *args)
    hi = (y[h:], s[h:], float(b), bool(residual), *args)
    if h == 0:
        return kern(*lo), kern(*hi)
    return pair(lambda: kern(*lo), lambda: kern(*hi))


def front_moments(rows, a_thr: float):
    """:func:`_front_moments_py` compiled (``rows = (y, s, b, residual)``), over two halves
    of the rows (:func:`_halves`)."""
    one, two = _halves(_front_moments_py, rows, float(a_thr))
    return (one[0] + two[0], one[1] + two[1], one[2] + two[2], min(one[3], two[3]),
            max(one[4], two[4]))


def kl_front(rows, a_thr: float, k1: float, k0: float, floor: float | None, c: float,
             piv: float = 0.0):
    """:func:`_kl_front_py` compiled (``floor`` None: none), over two halves of the rows."""
    fl = -math.inf if floor is None else float(floor)
    one, two = _halves(_kl_front_py, rows, float(a_thr), float(k1), float(k0), fl, float(c),
                       float(piv))
    return tuple(a + b for a, b in zip(one, two))


def _moved_rows_py(Xg, tg, v, out, d2):  # pragma: no cover - compiled
    """Moved rows ``x* = x + tg_i v`` into ``out`` and each one's squared move ``||x* -
    x||^2`` (the move as ``x* - x`` in floating point) into ``d2``: NumPy's ``Xg +
    np.multiply.outer(tg, v)`` element by element (two roundings each, no fused
    multiply-add; float32 rows taken as float64, exactly)."""
    m, d = Xg.shape
    for i in range(m):
        t = tg[i]
        acc = 0.0
        for j in range(d):
            x = float(Xg[i, j])
            xs = x + t * v[j]
            out[i, j] = xs
            df = xs - x
            acc += df * df
        d2[i] = acc


def moved_rows(Xg, tg, v, out, d2):
    """:func:`_moved_rows_py` compiled (the sampled audit's atoms of a margin / residual
    form, :func:`otstab.solve._piecewise._sample_check`)."""
    return _kernel(_moved_rows_py)(Xg, tg, v, out, d2)


def _chi2_keys_py(nu, s0, m, A, B, alpha, theta2, dA, dB):  # pragma: no cover - compiled
    """chi2's keyed sums over ``nu[s0:s0 + m]``, with the arithmetic of
    :meth:`~otstab_solvers.sorted_oracle.SortedTwoPiece.chi2_sums` per key."""
    two = 2.0 * theta2
    inv_two = 1.0 / two
    inv_four = 1.0 / (2.0 * two)
    w_ = wd_ = phi_ = t_ = ta_ = snu_ = 0.0
    for i in range(m):
        v0 = nu[s0 + i]
        lv = v0 * (-A) + B
        if lv < 0.0:
            lv = 0.0
        vv = lv + alpha
        wgt = vv * inv_two + 1.0
        if wgt < 0.0:
            wgt = 0.0
        db = v0 * (-dA) + dB
        # (selects, not branches: where half the weights are 0 a branch mispredicts)
        off = vv <= -two
        tv = -theta2 if off else vv * vv * inv_four + vv
        dv = -1.0 if off else vv * inv_two
        w_ += wgt
        snu_ += v0
        wd_ += wgt * db
        t_ += tv
        ta_ += abs(tv)
        phi_ += dv * dv
    return w_, wd_, phi_, t_, ta_, snu_


#: :func:`_chi2_keys_py`, compiled once a kernel is
_chi2_keys = _chi2_keys_py


def _chi2_pass(nu, p, A, B, alpha, theta2, dA, dB):  # pragma: no cover - compiled
    """chi2's keyed sums over the first ``p`` keys, summed per chunk."""
    W = WD = PHI = T = T_abs = Snu = 0.0
    for s in range(0, p, CHUNK):
        m = min(CHUNK, p - s)
        w_, wd_, phi_, t_, ta_, snu_ = _chi2_keys(nu, s, m, A, B, alpha, theta2, dA, dB)
        W += w_
        WD += wd_
        PHI += phi_
        T += t_
        T_abs += ta_
        Snu += snu_
    return W, WD, PHI, T, T_abs, Snu


def _chi2_front_py(y, s, b, residual, a_thr, A, B, alpha, theta2, dA,
                   dB):  # pragma: no cover - compiled
    """:func:`_chi2_pass` over the front's keys, computed from the rows: each row's terms
    times 1 in the front, 0 out of it (no branches)."""
    two = 2.0 * theta2
    inv_two = 1.0 / two
    inv_four = 1.0 / (2.0 * two)
    keys = np.empty(CHUNK)
    mask = np.empty(CHUNK)
    W = WD = PHI = T = T_abs = Snu = 0.0
    n = s.size
    for i0 in range(0, n, CHUNK):
        m = min(CHUNK, n - i0)
        for i in range(m):
            v = _row_key(y, s, i0 + i, residual) - b
            keys[i] = v
            mask[i] = 1.0 if v < a_thr else 0.0
        w_ = wd_ = phi_ = t_ = ta_ = snu_ = 0.0
        for i in range(m):
            v0 = keys[i]
            k = mask[i]
            # (the keys come in row order, where branches on them mispredict: blends by
            # 1.0 / 0.0, exact on finite numbers, x * 1 + y * 0 = x)
            lv = max(v0 * (-A) + B, 0.0)
            vv = lv + alpha
            wgt = max(vv * inv_two + 1.0, 0.0)
            db = v0 * (-dA) + dB
            o = 1.0 if vv <= -two else 0.0
            tv = (vv * vv * inv_four + vv) * (1.0 - o) + (-theta2) * o
            dv = (vv * inv_two) * (1.0 - o) + (-1.0) * o
            w_ += wgt * k
            snu_ += v0 * k
            wd_ += (wgt * db) * k
            t_ += tv * k
            ta_ += abs(tv) * k
            phi_ += (dv * dv) * k
        W += w_
        WD += wd_
        PHI += phi_
        T += t_
        T_abs += ta_
        Snu += snu_
    return W, WD, PHI, T, T_abs, Snu


def chi2_front(rows, a_thr: float, A, B, alpha, theta2, dA, dB) -> tuple[float, ...]:
    """:func:`_chi2_front_py` compiled, over two halves of the rows (:func:`_halves`)."""
    one, two = _halves(_chi2_front_py, rows, float(a_thr), float(A), float(B), float(alpha),
                       float(theta2), float(dA), float(dB))
    return tuple(a + b for a, b in zip(one, two))


def chi2_sums_pass(nu, p: int, A, B, alpha, theta2, dA, dB) -> tuple[float, ...]:
    """:func:`_chi2_pass` compiled."""
    return _kernel(_chi2_pass)(nu, int(p), float(A), float(B), float(alpha), float(theta2),
                               float(dA), float(dB))
