"""The pass of a binary 0/1 certificate that finds Q*'s moved rows and sums its weights.

Given h, one pass over the rows (in blocks of :attr:`RowPrices.BLOCK`) writes the candidate
rows (``a_i <= h + tol h``) and sums what Q*'s plan and audit need over them
(:meth:`otstab.solve._zero_one.RowPrices.near_weighted` documents the sums). Two things make
it cheap at large n:

- **Dense blocks without gathers.** Where most rows of a block are candidates (r in the
  middle or near the largest error rate), the weights, their phi and the reduced form's
  moves are computed on the whole block (contiguous slices) and the candidates' sums read
  through masks; a row above h has the weight of every row with ``l_h = 0`` (``base``), so
  the sums over the candidates are the block's sums less those rows' shares. Sparse blocks
  gather their candidates, as before.
- **Blocks on several threads.** The blocks are split into contiguous runs, one per worker
  thread (NumPy releases the GIL in its loops): the first run writes its candidates from the
  front of the output array, the second from the back (its blocks in reverse order), each
  reserving its block's range under a lock; the back part is moved up to the front part at
  the end (in chunks: no second array). Every block's sums are kept per block and added up in
  block order afterwards, so the numbers do not depend on the number of threads.
- **Compiled blocks.** With numba, from :data:`sorted_kernels.KERNEL_MIN_KEYS` rows, a block
  of unit or chi2 weights is one compiled call
  (:func:`otstab_solvers.zero_one_kernels.near_block`, :func:`kernel_args`), and so is each
  block of the window pass that keeps the rows below its window
  (:func:`otstab_solvers.zero_one_kernels.window_block`); KL's moved-rows blocks (rare:
  the window pass's kept rows serve most KL certificates) stay in NumPy.

No n-vector other than the candidates' indices is written; the tied candidates (``a_i`` within
the tolerance of h, which the plan may split) are returned as positions.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np
from otstab_solvers import zero_one_kernels

from ..modeling._fingerprint import _pool
from ..modeling._threads import usable_cpus

__all__ = ["near_pass", "pass_workers", "run_blocks", "kernel_args"]

#: worker threads of the passes (None: as many as the process may run on, at most
#: MAX_WORKERS: one run writes from the front, one from the back); rows below
#: PARALLEL_MIN_ROWS run on one thread
WORKERS: int | None = None
MAX_WORKERS = 2
PARALLEL_MIN_ROWS = 1 << 17
#: rows moved at a time when the back part is moved up (the overlap's temporary at most)
MOVE_CHUNK = 1 << 16

#: a block is summed whole (through masks) when at least this share of its rows are
#: candidates, else its candidates are gathered; KL's weights cost an exp per row, so that
#: the rows above h cost about what the gathers save below DENSE_SHARE_KL
DENSE_SHARE = 0.5
DENSE_SHARE_KL = 0.85

#: the sums of one block, in this order
KEYS = ("w", "phi", "wl", "l", "w_gain", "wd2", "wdl", "qdl", "n_below")


def pass_workers(n: int) -> int:
    """The worker threads of a pass over ``n`` rows."""
    if n < PARALLEL_MIN_ROWS or threading.current_thread().name.startswith("otstab-pass"):
        return 1
    if WORKERS is not None:
        return max(1, min(int(WORKERS), MAX_WORKERS))
    return max(1, min(usable_cpus(), MAX_WORKERS))


def run_blocks(runs, workers: int) -> None:
    """Call every function of ``runs`` (one per worker), on the pass's thread pool when
    there are several."""
    if workers == 1 or len(runs) == 1:
        for run in runs:
            run()
        return
    for f in [_pool(len(runs)).submit(run) for run in runs]:
        f.result()


class _Out:
    """The candidates' row indices, written from the front by the first run and from the
    back by the others (a lock reserves each block's range)."""

    def __init__(self, size: int, dtype):
        self.cand = np.empty(size, dtype=dtype)
        self.front, self.back = 0, size
        self.lock = threading.Lock()
        self.full = False

    def reserve(self, k: int, from_back: bool):
        with self.lock:
            if self.full or self.front + k > self.back:
                self.full = True
                return None
            if from_back:
                self.back -= k
                return self.back
            at = self.front
            self.front += k
            return at

    def compact(self) -> np.ndarray:
        """The front part, then the back part moved up to it, in one array."""
        cand, front, back = self.cand, self.front, self.back
        tail = cand.size - back
        for s in range(0, tail, MOVE_CHUNK):  # (ascending: a chunk's source is never
            e = min(s + MOVE_CHUNK, tail)      # overwritten before it is read)
            cand[front + s:front + e] = cand[back + s:back + e]
        cand.resize(front + tail, refcheck=False)
        return cand


def _block(rp, i, j, thr, lim, fn, loss0, divergence, reduced, base, phi_base, out=None,
           back=False):
    """``(count, tied, sums)`` of the rows i..j: how many are candidates (their indices
    written into ``out``, from the back with ``back``), the positions among them of the
    tied ones (None: none), and the block's sums (:data:`KEYS`); None when the block has no
    candidate, False when ``out`` is full."""
    from otstab_solvers.weights import phi

    a = rp[i:j]
    c = a <= thr
    kc = int(np.count_nonzero(c))
    if not kc:
        return None
    k = np.flatnonzero(c)
    at = out.reserve(kc, back)
    if at is None:
        return False
    np.add(k, i, out=out.cand[at:at + kc], casting="unsafe")
    lb = loss0[i:j]
    lb = lb if lb.dtype == bool else lb > 0
    m = a.size
    share = DENSE_SHARE_KL if getattr(fn, "gives_phi", False) and divergence is not None \
        else DENSE_SHARE
    if kc >= share * m:  # dense: the whole block, read through masks
        bf = a < lim
        tr = np.flatnonzero(np.greater(c, bf))  # candidates not below h (tied)
        tied = np.searchsorted(k, tr) if tr.size else None
        del k, tr  # (written: the block's temporaries are what each thread holds)
        rest = m - kc  # rows above the tolerance: weight ``base``, phi ``phi_base``
        if divergence is None:  # (unit weights, phi 0)
            wfull, sw, sphi = None, float(kc), 0.0
        else:
            if getattr(fn, "gives_phi", False):
                wfull, pf = fn(a, with_phi=True)
            else:
                wfull = fn(a)
                pf = phi(wfull, divergence)
            sw = float(np.sum(wfull)) - base * rest
            sphi = float(np.sum(pf)) - phi_base * rest
            del pf
        del a
        lc = lb & c  # (every misclassified row is a candidate at a price of 0)
        nl = int(np.count_nonzero(lc))
        g = np.greater(bf, lb)  # below h and classified correctly: they gain
        if wfull is None:
            wl, w_gain = float(nl), float(np.count_nonzero(g))
        else:  # (a dot with booleans is several times slower than their cast and a dot)
            wl, w_gain = _dot_mask(wfull, lc), _dot_mask(wfull, g)
        del lc, g
        red = (0.0, 0.0, 0.0, 0)
        if reduced is not None:
            lm, dd = reduced(slice(i, j))
            dlb = np.subtract(lm, lb, out=lm)
            bff = bf.astype(np.float64)
            wb = bff if wfull is None else np.multiply(wfull, bff, out=bff)
            red = (float(np.dot(wb, dd)), float(np.dot(wb, dlb)), _dot_mask(dlb, bf),
                   int(np.count_nonzero(bf)))
            if not all(math.isfinite(x) for x in red[:3]):  # (a row above h whose move
                kb = np.flatnonzero(bf)                         # is not finite: 0 * inf)
                red = _reduced_sums(reduced, lb, kb, i, None if wfull is None else wfull[kb])
        return kc, tied, (sw, sphi, wl, nl, w_gain) + red
    tied, sums = gathered(k + i, a[k], lim, fn, loss0, divergence, reduced)
    return kc, tied, sums


def gathered(rows, ak, lim, fn, loss0, divergence, reduced):
    """``(tied, sums)`` of the candidate rows ``rows`` (their prices ``ak``): the positions
    among them of the tied ones (None: none) and their sums (:data:`KEYS`)."""
    from otstab_solvers.weights import phi

    bk = ak < lim
    tied = np.flatnonzero(~bk)
    tied = tied if tied.size else None
    if divergence is None:
        wk, sphi = None, 0.0
    elif getattr(fn, "gives_phi", False):
        wk, pk = fn(ak, with_phi=True)
        sphi = float(np.sum(pk))
    else:
        wk = fn(ak)
        sphi = float(np.sum(phi(wk, divergence)))
    lk = loss0[rows]
    lk = lk if lk.dtype == bool else lk > 0
    nl = int(np.count_nonzero(lk))
    gain = bk & ~lk
    if wk is None:
        sw, wl, w_gain = float(ak.size), float(nl), float(np.count_nonzero(gain))
    else:
        sw, wl, w_gain = float(np.sum(wk)), _dot_mask(wk, lk), _dot_mask(wk, gain)
    red = (0.0, 0.0, 0.0, 0)
    if reduced is not None:
        rb = rows[bk]
        lm, dd = reduced(rb)
        dlb = lm - lk[bk]
        if wk is None:
            red = (float(np.sum(dd)), float(np.sum(dlb)), float(np.sum(dlb)), int(rb.size))
        else:
            wb = wk[bk]
            red = (float(np.dot(wb, dd)), float(np.dot(wb, dlb)), float(np.sum(dlb)),
                   int(rb.size))
    return tied, (sw, sphi, wl, nl, w_gain) + red


def _dot_mask(x, mask) -> float:
    """``sum(x[mask])`` for finite ``x``: a dot with the mask cast to floats (a dot with
    the booleans themselves takes a slow mixed-type loop)."""
    return float(np.dot(x, mask.astype(np.float64)))


def _reduced_sums(reduced, lb, kb, i, wb):
    """The moves' sums of the block rows ``kb`` (offsets from row ``i``; weights ``wb``,
    None: 1)."""
    lm, dd = reduced(kb + i)
    dlb = lm - lb[kb]
    if wb is None:
        return float(np.sum(dd)), float(np.sum(dlb)), float(np.sum(dlb)), int(kb.size)
    return float(np.dot(wb, dd)), float(np.dot(wb, dlb)), float(np.sum(dlb)), int(kb.size)


def _compiled(kargs, rp, i, j, thr, lim, fn, loss0, divergence, reduced, base, phi_base,
              out=None, back=False):
    """:func:`_block` in one compiled loop (:func:`otstab_solvers.zero_one_kernels.near_block`:
    unit or chi2 weights); NumPy's block where the moves' sums are not finite."""
    m = j - i
    idt = out.cand.dtype
    kout, tied, res = np.empty(m, dtype=idt), np.empty(m, dtype=np.intp), \
        np.empty(zero_one_kernels.N_NEAR)
    zero_one_kernels.near_block(rp.S, rp.y, rp.wrong, i, j, rp.nw, rp.theta1, thr, lim,
                                *kargs, kout, tied, res)
    if not res[12]:
        return _block(rp, i, j, thr, lim, fn, loss0, divergence, reduced, base, phi_base,
                      out=out, back=back)
    kc, nt = int(res[0]), int(res[1])
    if not kc:
        return None
    at = out.reserve(kc, back)
    if at is None:
        return False
    np.add(kout[:kc], i, out=out.cand[at:at + kc], casting="unsafe")
    del kout
    chi2 = bool(kargs[0])
    nl, nbl = int(res[5]), int(res[10])
    sw = float(res[2]) if chi2 else float(kc)
    wl = float(res[4]) if chi2 else float(nl)
    w_gain = float(res[6]) if chi2 else float(res[11])
    red = (0.0, 0.0, 0.0, 0)
    if reduced is not None:
        red = (float(res[7]), float(res[8]), float(res[9]), nbl)
    return kc, (tied[:nt].copy() if nt else None), \
        (sw, float(res[3]) if chi2 else 0.0, wl, nl, w_gain) + red


def kernel_args(rp, h, fn, loss0, divergence, reduced):
    """The arguments after the rows of :func:`~otstab_solvers.zero_one_kernels.near_block`
    for this pass (``chi2, h, alpha, theta2, red, b, wv, push, tiny``), or None where the
    compiled block does not serve it: KL weights, other losses than the prices' own
    misclassified rows, moves other than the binary ones, or no kernel."""
    if loss0 is not rp.wrong:
        return None
    chi2 = divergence == "chi2" and hasattr(fn, "alpha") and hasattr(fn, "theta2")
    if not (chi2 or (divergence is None and
                     np.array_equal(fn(np.array([0.0, h, 2.0 * h])), np.ones(3)))):
        return None  # (KL, or weights other than chi2's and theta2 = inf's unit ones)
    moves = rp.compiled_moves(None if reduced is None else (reduced, loss0))
    if moves is None:
        return None
    b, wv, push, tiny = moves
    alpha, theta2 = (float(fn.alpha), float(fn.theta2)) if chi2 else (0.0, 1.0)
    return (chi2, float(h), alpha, theta2, reduced is not None, b, wv, push, tiny)


def _run(rp, blocks, w, workers, out, results, args, kargs=None):
    """Run ``w`` of ``workers``: its contiguous blocks, the first run's from the front of
    ``out``, the others' from the back (their blocks in reverse order)."""
    nb = len(blocks)
    lo, hi = nb * w // workers, nb * (w + 1) // workers
    for b in (range(lo, hi) if w == 0 else range(hi - 1, lo - 1, -1)):
        if out.full:
            return
        i, j = blocks[b]
        got = _block(rp, i, j, *args, out=out, back=w > 0) if kargs is None else \
            _compiled(kargs, rp, i, j, *args, out=out, back=w > 0)
        if got is False:
            return
        results[b] = (0, None, None) if got is None else got


def near_pass(rp, h, fn, loss0, divergence, tol, reduced, size, index_dtype,
              workers: int | None = None):
    """``(cand, tied, sums)`` (see the module docstring): ``rp`` a
    :class:`~otstab.solve._zero_one.RowPrices`, ``fn`` the weight of a row of price ``a``,
    ``size`` the room for the candidates (None: counted first; a second pass with the count
    when it proves short)."""
    thr = h + tol * h
    lim = h - tol * h
    blocks = list(rp._blocks())
    nb = len(blocks)
    workers = pass_workers(rp.size) if workers is None else workers
    workers = max(1, min(workers, nb, MAX_WORKERS))
    if divergence is None:
        base, phi_base = 1.0, 0.0
    elif getattr(fn, "gives_phi", False):
        wb, pb = fn(np.array([h]), with_phi=True)
        base, phi_base = float(wb[0]), float(pb[0])
    else:
        from otstab_solvers.weights import phi

        base = float(fn(np.array([h]))[0])
        phi_base = float(phi(np.array([base]), divergence)[0])
    if size is None:
        size = sum(int(np.count_nonzero(rp[s:e] <= thr)) for s, e in blocks)
    kargs = kernel_args(rp, h, fn, loss0, divergence, reduced)
    for _ in range(2):
        out = _Out(size, index_dtype)
        results: list = [None] * nb
        args = (thr, lim, fn, loss0, divergence, reduced, base, phi_base)
        run_blocks([functools.partial(_run, rp, blocks, w, workers, out, results, args, kargs)
                    for w in range(workers)], workers)
        if not out.full:
            break
        size = sum(int(np.count_nonzero(rp[s:e] <= thr)) for s, e in blocks)
    else:  # pragma: no cover - sized by the count
        raise AssertionError("the counted candidates did not fit")
    cand = out.compact()
    del out
    totals = dict.fromkeys(KEYS, 0.0)
    totals["l"] = totals["n_below"] = 0
    tied_parts = []
    at = 0
    for kc, tied, sums in results:  # (in block order: the same sums on any thread count)
        if not kc:
            continue
        for key, x in zip(KEYS, sums):
            totals[key] += x
        if tied is not None:
            tied_parts.append(tied + at)
        at += kc
    tied = np.concatenate(tied_parts) if tied_parts else np.empty(0, dtype=np.intp)
    return cand, tied, totals


# ---------------------------------------------------------------------------------------------
# the window pass keeps the rows below its window (KL and theta2 = inf)

#: the window pass of the KL / theta2 = inf closed form writes the rows below its window and
#: sums their exponential terms times the audit's moves, so that the moved-rows pass reads
#: only the window's rows (False: the moved-rows pass reads every row)
FUSED = True
#: ... also for theta2 = inf (off: without exp terms the window pass saves little of the
#: moved-rows pass, and keeping the rows during the window pass raises the peak near r = 1)
FUSED_INF = False
#: ... and for chi2 (off for the same reason: its weights are linear in the price, measured
#: at n = 1e6: the same thread CPU in the middle and near r = 1, 0.03-0.1 n-vector more)
FUSED_CHI2 = False
#: the phi sum of the rows below the window from its terms is kept when it keeps 1e-13 of
#: them (it is taken back to the per-row pass where the weights are all close to 1)
PHI_CANCEL = 1e-3


class Below:
    """What the window pass keeps of the rows below its window ``[lo, hi]`` (``a_i < lo``):
    their indices ``cand`` (ascending, the candidates' dtype) and, with
    ``e_i = exp(-a_i / theta2)`` (1 for theta2 = inf): ``W`` = sum e_i (the window pass's
    ``below_exp``; their count for theta2 = inf), ``A`` = sum e_i a_i, ``NL`` the
    misclassified ones (a price of 0, e_i = 1), and with the audit's moves (``reduced``)
    ``WD2`` = sum e_i d2_i, ``WDL`` = sum e_i dl_i, ``QDL`` = sum dl_i; and the window's
    rows in row order. Q*'s weight of such a row at h is ``c e_i`` with
    ``c = uw exp(h / theta2)``, so every sum of the moved-rows pass over them is one of these
    times c (:func:`fused_near`). The window's prices are recomputed from its rows."""

    def __init__(self, lo, hi, theta2, reduced, loss0, cand, sums, rows, chi2=None):
        self.lo, self.hi, self.theta2 = lo, hi, theta2
        self.reduced, self.loss0 = reduced, loss0
        self.cand, self.rows = cand, rows
        self.W, self.A, self.NL, self.WD2, self.WDL, self.QDL, self.SDD = sums
        #: chi2: (d1, d2), the sums of lo - a and its square (the terms e are lo - a)
        self.chi2 = chi2


def below_block(i, a, lt, nb, e, lb, reduced, lo):
    """``(offsets, (A, NL, WD2, WDL, QDL, SDD))`` of the rows of block ``i`` below ``lo``
    (``lt``; ``nb`` of them): ``e`` the terms of every row of the block (``e.size ==
    a.size``; 0 above lo is not required) or of the rows below lo only, None for theta2 = inf
    (every term 1): KL's exp terms, chi2's ``lo - a``; ``lb`` the block's misclassified rows
    (booleans). ``SDD`` is the sum of the squared moves unweighted."""
    kb = np.flatnonzero(lt)
    nl = int(np.count_nonzero(lb & lt))
    dense = nb == a.size or (e is not None and e.size == a.size) or \
        (e is None and 2 * nb >= a.size)
    if dense:
        ltf = lt.astype(np.float64)
        if e is not None:  # (the caller has summed e: its terms below lo, in its buffer)
            e *= ltf
        eb = ltf if e is None else e
        A = 0.0 if e is None else float(np.dot(eb, np.minimum(a, lo)))
        red = (0.0, 0.0, 0.0, 0.0)
        if reduced is not None:
            lm, dd = reduced(slice(i, i + a.size))
            dl = np.subtract(lm, lb, out=lm)
            red = (float(np.dot(eb, dd)), float(np.dot(eb, dl)), float(np.dot(dl, ltf)),
                   float(np.dot(dd, ltf)))
            if all(math.isfinite(x) for x in red):
                return kb, (A, nl) + red
            e = None if e is None else e[kb]  # (a row above lo whose move is not finite:
            del eb, ltf                        # per row; e is 0 only above lo)
        else:
            return kb, (A, nl) + red
    es = e  # (aligned with kb)
    A = 0.0 if es is None else float(np.dot(es, a[kb]))
    red = (0.0, 0.0, 0.0, 0.0)
    if reduced is not None:
        lm, dd = reduced(kb + i)
        dl = np.subtract(lm, lb[kb], out=lm)
        q, sdd = float(np.sum(dl)), float(np.sum(dd))
        red = (sdd, q, q, sdd) if es is None else \
            (float(np.dot(es, dd)), float(np.dot(es, dl)), q, sdd)
    return kb, (A, nl) + red


def fused_near(rp, fz: Below, h, fn, loss0, divergence, tol, reduced):
    """:meth:`RowPrices.near_weighted` from what the window pass kept (:class:`Below`): the
    rows below the window by their sums, the window's rows one by one. None when they do not
    serve this ``h`` (a row below the window tied at h, candidates above the window, other
    weights or losses, or the phi sum too close to cancellation)."""
    thr = h + tol * h
    lim = h - tol * h
    if fz.reduced != reduced or fz.loss0 is not loss0 or not fz.lo <= lim or \
            not thr <= fz.hi or not h > 0.0:
        return None
    nB = int(fz.cand.size)
    if fz.chi2 is not None:
        below = _chi2_below(fz, h, fn, divergence, reduced, nB)
        if below is None:
            return None
        return _window_rows(rp, fz, below, thr, lim, fn, loss0, divergence, reduced, nB)
    if divergence is None:
        if not math.isinf(fz.theta2):
            return None
        c = 1.0
        sw, sphi = float(nB), 0.0
    else:
        if getattr(fn, "theta2", None) != fz.theta2 or divergence != "kl":
            return None
        c = float(fn(np.array([0.0]))[0])  # the weight of a row of price 0: uw exp(h / theta2)
        logc = fn.log_uw + h / fz.theta2
        sw = c * fz.W
        t1, t2 = c * logc * fz.W, c * fz.A / fz.theta2
        sphi = t1 - t2 - sw + nB
        if nB and not (math.isfinite(sphi) and sphi > PHI_CANCEL * (abs(t1) + t2 + sw + nB)):
            return None
    below = (sw, sphi, c * fz.NL, fz.NL, c * (fz.W - fz.NL) if divergence else
             float(nB - fz.NL), c * fz.WD2, c * fz.WDL, fz.QDL, nB if reduced is not None
             else 0)
    if not all(math.isfinite(x) for x in below):
        return None
    return _window_rows(rp, fz, below, thr, lim, fn, loss0, divergence, reduced, nB)


def _chi2_below(fz, h, fn, divergence, reduced, nB):
    """The sums (:data:`KEYS`) of chi2's rows below the window: with ``k = 1 / (2 theta2)``,
    ``x = h - lo - m`` (``alpha = -m``) and ``d = lo - a``, a row's weight is
    ``1 + k (x + d)``, its phi ``k^2 (x + d)^2``: every sum is one of ``count, sum d,
    sum d^2`` and the moves' ``sum d2, sum d d2, sum dl, sum d dl`` combined."""
    if divergence != "chi2" or getattr(fn, "theta2", None) != fz.theta2:
        return None
    d1, d2 = fz.chi2
    k = 0.5 / fz.theta2
    x = (h - fz.lo) + fn.alpha
    a0 = 1.0 + k * x
    if not a0 > 0.0:  # (every weight positive at the optimum: a clipped weight is not)
        return None
    sw = nB * a0 + k * d1
    sq = nB * x * x + 2.0 * x * d1 + d2
    if nB and not (sq >= 0.0 and sq > PHI_CANCEL * (nB * x * x + 2.0 * abs(x) * d1 + d2)):
        return None
    wl = fz.NL * (a0 + k * fz.lo)  # (a misclassified row: a price of 0, d = lo)
    below = (sw, k * k * sq, wl, fz.NL, sw - wl, a0 * fz.SDD + k * fz.WD2,
             a0 * fz.QDL + k * fz.WDL, fz.QDL, nB if reduced is not None else 0)
    return below if all(math.isfinite(v) for v in below) else None


def _window_rows(rp, fz, below, thr, lim, fn, loss0, divergence, reduced, nB):
    """:func:`fused_near`'s candidates and sums: the kept rows below the window (their sums
    ``below``), then the window's rows one by one."""
    wrows = fz.rows
    fz.rows = None
    cand = fz.cand
    fz.cand = None
    cand.resize(nB + wrows.size, refcheck=False)  # (room for every row of the window)
    totals = dict(zip(KEYS, below))
    tied_parts = []
    at = nB
    step = rp.BLOCK  # (the window's rows per block, their prices recomputed: cache-sized)
    for s in range(0, wrows.size, step):
        rb = wrows[s:s + step]
        ab = rp[rb]
        sel = ab <= thr
        rows, prices = rb[sel], ab[sel]
        del rb, ab, sel
        cand[at:at + rows.size] = rows
        tied_w, win = gathered(rows, prices, lim, fn, loss0, divergence, reduced)
        if tied_w is not None:
            tied_parts.append(tied_w + at)
        at += rows.size
        for key, x in zip(KEYS, win):
            totals[key] += x
    cand.resize(at, refcheck=False)
    tied = np.concatenate(tied_parts) if tied_parts else np.empty(0, dtype=np.intp)
    return cand, tied, totals
