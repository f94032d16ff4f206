"""The two row passes of a binary 0/1 certificate as compiled loops per block (numba).

A 0/1 certificate of a binary linear classifier at large n reads its rows' move prices
``a_i = theta1 max(y_i s_i, 0)^2 / ||w||^2`` (0 where the row is misclassified), computed from
the scores block by block and never stored (``otstab.solve._zero_one.RowPrices``), in two
passes; in NumPy each is some thirty operations over every block (together 50-80 ms at
n = 1e6 on two threads). Here each block is one compiled call:

* :func:`window_block`: the window pass of the closed form (``RowPrices._window``): counts
  the prices at 0, at inf and above the window, sums the closed form's terms of the prices
  below the window (``lo``), writes the prices in the window with their rows and, for KL,
  keeps the rows below the window with the sums that Q*'s moved-rows pass needs (their
  exponential terms times the audit's moves: ``otstab.solve._zero_one_pass.below_block``);
* :func:`near_block`: the moved-rows pass (``otstab.solve._zero_one_pass._block``) for unit
  weights (theta2 = inf) and chi2's: the candidates ``a_i <= h (1 + tol)``, the tied ones
  among them, the sums of their weights, phi, and the audit's moves of the rows below h;
* :func:`price_rows`: the prices of a block of rows alone (the weighted dual's blocks read
  them at every evaluation).

Every row's price, weight, term and move is computed with the operations of the NumPy block,
in the same order (the same bits; the exponential terms with
:func:`otstab_solvers.sorted_kernels._exp_chunk_py`, within an ulp of NumPy's ``exp``). The
sums are taken per chunk of :data:`CHUNK` rows (reassociated across the vector lanes) and the
chunks' sums in row order: they agree with NumPy's to the rounding of the sums, and the
caller adds the blocks' sums in block order, so the numbers do not depend on the number of
threads. Where the moves' sums of a block are not finite the caller sums that block in NumPy.
Compiled on first use (or loaded from numba's cache) for at least
:data:`sorted_kernels.KERNEL_MIN_KEYS` rows. This module does not import otstab.
"""

from __future__ import annotations

import math

import numpy as np

from . import sorted_kernels

__all__ = ["USE_KERNEL", "MODE_SMALL", "MODE_EXP", "MODE_GAP", "MODE_CHI2", "N_OUT",
           "N_NEAR", "use_kernel", "load", "window_block", "near_block", "price_rows"]

#: use the compiled passes (False: NumPy's blocks; set to compare the two)
USE_KERNEL = sorted_kernels.HAVE_NUMBA
#: the terms summed below the window: ``expm1((lo - a) / theta2)`` (KL, every exponent
#: small), ``exp(max(-a / theta2, -700))`` (KL), ``lo - a`` (theta2 = inf) and also its
#: square and ``a`` (chi2)
MODE_SMALL, MODE_EXP, MODE_GAP, MODE_CHI2 = 0, 1, 2, 3
#: the length of :func:`window_block`'s results array (see there)
N_OUT = 18
#: the length of :func:`near_block`'s results array
N_NEAR = 13

_COMPILED: dict = {}
_LOADED: dict = {"ok": None}
#: the floating-point liberties of the compiled helpers: the exp's polynomial in fused
#: multiply-adds (as :mod:`sorted_kernels`), the chunks' sums reassociated (vectorised);
#: every row's own numbers are computed without any
_FASTMATH = {"_exp_chunk": {"contract"}, "_sums": {"reassoc"}, "_near_sums": {"reassoc"}}


def use_kernel(size: int) -> bool:
    """Whether the passes over ``size`` rows run compiled (numba loaded them: on the first
    such call, :func:`load`; where that fails, the NumPy blocks from then on with a warning
    on the "otstab" logger)."""
    if not (USE_KERNEL and sorted_kernels.USE_KERNEL and size >= sorted_kernels.KERNEL_MIN_KEYS):
        return False
    return sorted_kernels.load_once(_LOADED, load, "the 0/1 passes")


#: rows per chunk of the passes (their prices, terms and moves stay in the L1 cache)
CHUNK = 512
#: :func:`sorted_kernels._exp_chunk_py`, compiled once the pass is (the loop calls it by
#: this name)
_exp_chunk = sorted_kernels._exp_chunk_py


def _prices(S, y, wrong, c0, m_len, nw, theta1, pa, pm):  # pragma: no cover - compiled
    """The prices and margins of rows ``c0:c0 + m_len`` into ``pa``, ``pm`` (NumPy's
    operations: maximum keeps a nan)."""
    for k in range(m_len):
        r = c0 + k
        m = y[r] * S[r]
        d = m if not m <= 0.0 else 0.0
        d = 0.0 if (d > 0.0) & wrong[r] else d
        d = d * d
        d = d / nw
        pa[k] = d * theta1
        pm[k] = m


def _moves(S, y, wrong, c0, m_len, nw, babs, mwv, push, tiny, pm, keep, pdd,
           pdl):  # pragma: no cover - compiled
    """The audit's moves of rows ``c0:c0 + m_len`` where ``keep`` (0 elsewhere): the squared
    move ``pdd`` and the change of the 0/1 loss ``pdl`` at the moved point, with the step
    ``c`` of :func:`otstab.solve._zero_one._binary_near` (its operations, in its order)."""
    for k in range(m_len):
        r = c0 + k
        m = pm[k]
        w_r = wrong[r]
        mr = m if not m <= 0.0 else 0.0
        t = abs(m)
        t = t + 1.0
        t = t + babs
        t = t * tiny
        c = mr * push
        c = c + t
        c = c + mr
        c = c / nw
        c = c * (y[r] * 1.0)
        c = 0.0 if w_r else c
        dd = c * c
        dd = dd * nw
        moved = c * mwv + S[r]
        lm = 1.0 if (moved > 0.0) != (y[r] > 0) else 0.0
        dl = lm - (1.0 if w_r else 0.0)
        pdd[k] = dd if keep[k] else 0.0
        pdl[k] = dl if keep[k] else 0.0


def _window_block_py(S, y, wrong, i, j, nw, theta1, lo, fin_hi, mode, theta2, fuse, b, wv,
                     push, tiny, kb, win_a, win_rows, out):  # pragma: no cover - compiled
    pa = np.empty(CHUNK)  # the chunk's prices, margins, exponents, terms and moves
    pm = np.empty(CHUNK)
    px = np.empty(CHUNK)
    pe = np.empty(CHUNK)
    scale = np.empty(CHUNK)
    pdd = np.empty(CHUNK)
    pdl = np.empty(CHUNK)
    plt = np.empty(CHUNK, dtype=np.bool_)
    cnt = np.zeros(5, dtype=np.int64)  # at 0, at inf, below lo, above fin_hi, misclassified
    acc = np.zeros(8)                  # below lo (:func:`_sums_py`)
    nwin = nkb = 0
    em1 = 0.0
    neg = -1.0 / theta2
    babs = abs(b)
    mwv = -wv
    for c0 in range(i, j, CHUNK):
        m_len = min(CHUNK, j - c0)
        _prices(S, y, wrong, c0, m_len, nw, theta1, pa, pm)
        for k in range(m_len):
            plt[k] = pa[k] < lo
        if mode == 1:  # exp(max(-a / theta2, -700)) of every row
            for k in range(m_len):
                x = pa[k] * neg
                px[k] = x if not x < -700.0 else -700.0
            _exp_chunk(px, pe, scale, m_len)
            for k in range(m_len):
                pe[k] = pe[k] if plt[k] else 0.0
        elif mode == 0:  # (KL with every exponent small: expm1 of the rows below lo, rare)
            for k in range(m_len):
                a = pa[k]
                pe[k] = 0.0
                if a < lo:
                    em1 += math.expm1((lo - a) / theta2)
        else:
            for k in range(m_len):
                a = pa[k]
                pe[k] = lo - a if a < lo else 0.0
        for k in range(m_len):  # the window's prices and rows (written always, kept when
            a = pa[k]            # in the window: no branch)
            win_a[nwin] = a
            win_rows[nwin] = c0 + k
            nwin += 1 if (a <= fin_hi) & (a >= lo) else 0
        if fuse:  # the rows below lo and the audit's moves of them
            for k in range(m_len):
                kb[nkb] = c0 + k - i
                nkb += 1 if plt[k] else 0
            _moves(S, y, wrong, c0, m_len, nw, babs, mwv, push, tiny, pm, plt, pdd, pdl)
        _sums(pa, pe, pdd, pdl, wrong, c0, m_len, lo, fin_hi, mode == 3, fuse, cnt, acc)
    for q in range(4):
        out[q] = cnt[q]
    out[4] = nwin
    out[5] = nkb
    out[6] = cnt[4]
    out[7] = em1
    out[8] = acc[0] if mode == 1 else 0.0  # (the exp terms' sum, or the gaps')
    out[9] = acc[0] if mode >= 2 else 0.0
    for q in range(1, 8):
        out[9 + q] = acc[q]
    out[17] = 1.0 if math.isfinite(acc[4]) and math.isfinite(acc[5]) and \
        math.isfinite(acc[6]) and math.isfinite(acc[7]) else 0.0


def _sums_py(pa, pe, pdd, pdl, wrong, c0, m_len, lo, fin_hi, chi2, fuse, cnt,
             acc):  # pragma: no cover - compiled
    """Add a chunk's counts and sums (the terms ``pe`` and moves ``pdd``, ``pdl`` are 0 above
    lo) to ``cnt`` and ``acc``: exp or gap terms, their squares, the prices below lo, then the
    kept rows' ``A``, ``WD2``, ``WDL``, ``QDL``, ``SDD`` (compiled with reassociation: each sum
    is split across the vector lanes)."""
    nz = ni = nb = above = nl = 0
    se = sq = sa = A = wd2 = wdl = qdl = sdd = 0.0
    for k in range(m_len):
        a = pa[k]
        e = pe[k]
        lt = a < lo
        nz += 1 if a == 0.0 else 0
        ni += 1 if a == math.inf else 0
        nb += 1 if lt else 0
        above += 0 if a <= fin_hi else 1
        se += e
    if chi2:
        for k in range(m_len):
            a = pa[k]
            e = pe[k]
            sq += e * e
            sa += a if a < lo else 0.0
    if fuse:
        for k in range(m_len):
            a = pa[k]
            e = pe[k]
            lt = a < lo
            nl += 1 if lt & wrong[c0 + k] else 0
            A += e * a if lt else 0.0
            wd2 += e * pdd[k]
            wdl += e * pdl[k]
            qdl += pdl[k]
            sdd += pdd[k]
    cnt[0] += nz
    cnt[1] += ni
    cnt[2] += nb
    cnt[3] += above
    cnt[4] += nl
    acc[0] += se
    acc[1] += sq
    acc[2] += sa
    acc[3] += A
    acc[4] += wd2
    acc[5] += wdl
    acc[6] += qdl
    acc[7] += sdd


#: :func:`_sums_py`, compiled once the pass is (the loop calls it by this name)
_sums = _sums_py


def _near_block_py(S, y, wrong, i, j, nw, theta1, thr, lim, chi2, h, alpha, theta2, red, b,
                   wv, push, tiny, kout, tied, out):  # pragma: no cover - compiled
    pa = np.empty(CHUNK)
    pm = np.empty(CHUNK)
    pw = np.empty(CHUNK)
    pdd = np.empty(CHUNK)
    pdl = np.empty(CHUNK)
    below = np.empty(CHUNK, dtype=np.bool_)
    cmask = np.empty(CHUNK, dtype=np.bool_)
    acc = np.zeros(7)  # (:func:`_near_sums_py`)
    kc = nt = 0
    nl = n_below = gain = 0
    two = 2.0 * theta2
    babs = abs(b)
    mwv = -wv
    for c0 in range(i, j, CHUNK):
        m_len = min(CHUNK, j - c0)
        _prices(S, y, wrong, c0, m_len, nw, theta1, pa, pm)
        for k in range(m_len):  # the candidates and, among them, the tied ones
            a = pa[k]
            cand = a <= thr
            bk = a < lim
            below[k] = bk
            cmask[k] = cand
            kout[kc] = c0 + k - i
            tied[nt] = kc
            nt += 1 if cand & (not bk) else 0
            kc += 1 if cand else 0
        for k in range(m_len):  # the weights of the candidates (0 elsewhere)
            a = pa[k]
            u = h - a
            u = u if not u < 0.0 else 0.0
            w = (u + alpha) / two + 1.0
            w = w if not w < 0.0 else 0.0
            w = w if chi2 else 1.0
            pw[k] = w if cmask[k] else 0.0
        if red:
            _moves(S, y, wrong, c0, m_len, nw, babs, mwv, push, tiny, pm, below, pdd, pdl)
        for k in range(m_len):
            lb = wrong[c0 + k]
            nl += 1 if cmask[k] & lb else 0
            n_below += 1 if below[k] else 0
            gain += 1 if below[k] & (not lb) else 0
        _near_sums(pw, pdd, pdl, wrong, below, cmask, c0, m_len, chi2, red, acc)
    out[0] = kc
    out[1] = nt
    out[2] = acc[0]  # w
    out[3] = acc[1]  # phi
    out[4] = acc[2]  # wl
    out[5] = nl
    out[6] = acc[3]  # w_gain
    out[7] = acc[4]  # wd2
    out[8] = acc[5]  # wdl
    out[9] = acc[6]  # qdl
    out[10] = n_below
    out[11] = gain
    out[12] = 1.0 if math.isfinite(acc[4]) and math.isfinite(acc[5]) and \
        math.isfinite(acc[6]) else 0.0


def _near_sums_py(pw, pdd, pdl, wrong, below, cmask, c0, m_len, chi2, red,
                  acc):  # pragma: no cover - compiled
    """Add a chunk's sums of the candidates' weights ``pw`` (0 elsewhere) to ``acc``: the
    weights, phi_chi2 of them, those of the misclassified rows and of the correct rows below
    h, then the moves' (compiled with reassociation)."""
    sw = sphi = wl = wg = wd2 = wdl = qdl = 0.0
    for k in range(m_len):
        w = pw[k]
        lb = wrong[c0 + k]
        sw += w
        wl += w if lb else 0.0
        wg += w if below[k] & (not lb) else 0.0
    if chi2:
        for k in range(m_len):
            w = pw[k]
            q = w - 1.0
            sphi += q * q if cmask[k] else 0.0
    if red:
        for k in range(m_len):
            w = pw[k]
            wd2 += w * pdd[k]
            wdl += w * pdl[k]
            qdl += pdl[k]
    acc[0] += sw
    acc[1] += sphi
    acc[2] += wl
    acc[3] += wg
    acc[4] += wd2
    acc[5] += wdl
    acc[6] += qdl


#: :func:`_near_sums_py`, compiled once the pass is
_near_sums = _near_sums_py


def near_block(S, y, wrong, i: int, j: int, nw: float, theta1: float, thr: float, lim: float,
               chi2: bool, h: float, alpha: float, theta2: float, red: bool, b: float,
               wv: float, push: float, tiny: float, kout, tied, out) -> None:
    """One block ``i:j`` of the moved-rows pass (``otstab.solve._zero_one_pass._block``) for
    unit weights (theta2 = inf) or chi2's ``max((max(h - a, 0) + alpha) / (2 theta2) + 1,
    0)``: the candidates (``a <= thr``, offsets from ``i``) into ``kout``, the positions
    among them of the tied ones (``a >= lim``) into ``tied``; ``out`` (:data:`N_NEAR`
    floats): the counts of candidates and tied ones, the sums of the weights, their phi
    (chi2), the misclassified candidates' weights and count, the weights of the correct rows
    below lim, with ``red`` the moves' ``wd2``, ``wdl``, ``qdl`` over the rows below lim and
    their count, the count of the correct rows below lim, and 1 when the moves' sums are
    finite (else the caller sums the block in NumPy)."""
    _kernel(_near_block_py)(S, y, wrong, int(i), int(j), float(nw), float(theta1), float(thr),
                            float(lim), bool(chi2), float(h), float(alpha), float(theta2),
                            bool(red), float(b), float(wv), float(push), float(tiny), kout,
                            tied, out)


def _kernel(fn):
    """The compiled ``fn`` (:func:`sorted_kernels.compile_with`, NumPy's error model: a
    division by zero gives inf / nan as NumPy's)."""
    return sorted_kernels.compile_with(fn, _COMPILED, globals(), (
        ("_exp_chunk", sorted_kernels._exp_chunk_py), ("_sums", _sums_py),
        ("_near_sums", _near_sums_py), ("_prices", _prices), ("_moves", _moves)),
        _FASTMATH, error_model="numpy")


def _price_rows_py(S, y, wrong, i, j, nw, theta1, out):  # pragma: no cover - compiled
    """The prices of rows ``i:j`` into ``out``: :func:`_prices` chunk by chunk (its margins
    into a scratch buffer)."""
    pm = np.empty(CHUNK)
    for c0 in range(i, j, CHUNK):
        m_len = min(CHUNK, j - c0)
        _prices(S, y, wrong, c0, m_len, nw, theta1, out[c0 - i:c0 - i + m_len], pm)


def price_rows(S, y, wrong, i: int, j: int, nw: float, theta1: float, out) -> None:
    """The move prices ``theta1 max(y s, 0)^2 / nw`` (0 where ``wrong``) of rows ``i:j``
    into ``out`` (``nw > 0``, ``theta1`` finite): one compiled loop, the operations of the
    NumPy block in the same order (the same bits)."""
    _kernel(_price_rows_py)(S, y, wrong, int(i), int(j), float(nw), float(theta1), out)


def window_block(S, y, wrong, i: int, j: int, nw: float, theta1: float, lo: float,
                 fin_hi: float, mode: int, theta2: float, fuse: bool, b: float, wv: float,
                 push: float, tiny: float, kb, win_a, win_rows, out) -> None:
    """One block ``i:j`` of the window pass (see the module docstring): ``S`` the scores
    (float64), ``y`` the labels +-1, ``wrong`` the misclassified rows (booleans), ``nw`` =
    ``||w||^2 > 0``, ``lo <= fin_hi`` the window, ``mode`` one of the ``MODE_*`` constants;
    with ``fuse`` (KL: :data:`MODE_EXP`), the rows below ``lo`` (offsets from ``i``) into
    ``kb`` and their sums, with the audit's step ``((max(m, 0) push + (|m| + 1 + |b|) tiny)
    + max(m, 0)) / nw y`` and the score's change along the move ``-wv`` per unit of step.
    ``win_a``, ``win_rows``: the prices in ``[lo, fin_hi]`` and their rows (room for
    ``j - i``). ``out`` (:data:`N_OUT` floats): the counts at 0, at inf, below lo, above
    fin_hi, in the window, written to ``kb``, misclassified below lo; the sums of the expm1,
    exp and gap terms, the gaps' squares and the prices below lo; the kept rows' ``A``,
    ``WD2``, ``WDL``, ``QDL``, ``SDD`` (``zero_one_pass.Below``); and 1 when those are finite
    (else the caller sums the block in NumPy)."""
    _kernel(_window_block_py)(S, y, wrong, int(i), int(j), float(nw), float(theta1), float(lo),
                              float(fin_hi), int(mode), float(theta2), bool(fuse), float(b),
                              float(wv), float(push), float(tiny), kb, win_a, win_rows, out)


def load() -> None:
    """Compile the pass, or load it from numba's cache (once per process), for the label
    types of a certificate (+-1 as int8 or float64) and int32 and int64 rows. Nothing without
    numba."""
    if not sorted_kernels.HAVE_NUMBA:
        return
    S = np.array([-1.0, 0.5, 2.0, 3.0])
    wrong = np.array([True, False, False, False])
    out = np.empty(N_OUT)
    for y in (np.array([1, 1, 1, 1], dtype=np.int8), np.ones(4)):
        for it in (np.int32, np.intp):
            kb, rows = np.empty(4, dtype=it), np.empty(4, dtype=it)
            window_block(S, y, wrong, 0, 4, 1.0, 1.0, 1.0, 4.0, MODE_EXP, 1.0, True, 0.0,
                         1.0, 1e-9, 1e-13, kb, np.empty(4), rows, out)
            near_block(S, y, wrong, 0, 4, 1.0, 1.0, 1.0, 1.0, True, 1.0, 0.0, 1.0, True, 0.0,
                       1.0, 1e-9, 1e-13, kb, np.empty(4, dtype=np.intp), np.empty(N_NEAR))
        price_rows(S, y, wrong, 0, 4, 1.0, 1.0, np.empty(4))
