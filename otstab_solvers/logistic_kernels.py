"""Compiled loops of the logistic exact pass (numba; the NumPy path without it).

One exact pass of the logistic dual at ``h`` (:mod:`otstab_solvers.logistic_pass`) solves,
for every sample, the step of its maximiser (:func:`~otstab_solvers.logistic_uniform.
uniform_steps`: Halley iterations on ``T sigmoid(u) - u - m = 0`` from a warm start or the
table of steps), takes the loss there and ``l_h``, and sums them per block of rows (KL: the
largest ``l_h / theta2`` and the sums of ``e``, ``e dl``, ``e dl^2``, ``e d2l``, ``expm1``
where read; theta2 = inf: the sums of ``l_h``, ``dl`` and ``d2l``). In NumPy that is some
thirty passes over each block; :func:`solve_block` does it in one loop per row (two phases per
block: the steps, then the sums, which need the block's largest ``l_h / theta2``), with

* the same iteration, stopping rule and acceptance test per sample as
  :func:`~otstab_solvers.logistic_uniform.uniform_steps` (a sample's test is its own: NumPy's
  block iterates until every sample stops, which moves the others by less than an ulp);
* the loss at the maximiser ``max(u, 0) + log1p(q)`` with ``q`` the ratio of the smaller of
  ``s`` and ``1 - s`` to the larger (as :func:`~otstab_solvers.smooth._softplus_at`), libm's
  ``log1p``; ``exp`` and ``expm1`` libm's;
* the sums accumulated per :data:`CHUNK` rows and the chunks' sums in order (their rounding of
  the order of NumPy's blocked sums).

The samples the loop does not accept (the band of two local maxima, slow or unconverged
Newton) are returned by index; the caller solves them with the robust NumPy solve
(:func:`~otstab_solvers.logistic_uniform.two_branch_steps`, then
:func:`~otstab_solvers.smooth.logistic_steps`), writes them in and sums the block with
:func:`block_sums`: never a guess. Compiled on first use (numba's cache on disk), only for
oracles of at least :data:`~otstab_solvers.sorted_kernels.KERNEL_MIN_KEYS` samples
(:func:`use_kernel`; ``sorted_kernels.USE_KERNEL`` and :data:`USE_KERNEL` both switch them
off). This module imports neither otstab nor numba at import time.
"""

from __future__ import annotations

import math

import numpy as np

from . import sorted_kernels
from .logistic_uniform import MAX_ITER, SLOPE_MIN, STEP_TOL, TAYLOR_STEP

__all__ = ["USE_KERNEL", "CHUNK", "use_kernel", "load", "solve_block", "block_sums",
           "audit_sums", "bin_block", "moments", "MODE_KL", "MODE_MEAN", "MODE_CHI2"]

#: use the compiled loops (False: the NumPy path; set to compare the two)
USE_KERNEL = sorted_kernels.HAVE_NUMBA
#: rows per partial sum
CHUNK = 256
#: the sums :func:`solve_block` returns: KL's (finite theta2), theta2 = inf's, or chi2's
#: from a guess of alpha (:meth:`otstab_solvers.logistic_pass._Pass._chi2_at`)
MODE_KL, MODE_MEAN, MODE_CHI2 = 0, 1, 2
#: twelve zeros (the sums of a block whose rows are not all solved yet)
_ZEROS = (0.0,) * 12
#: the lower clamp of KL's shifted exponents (as the NumPy pass: no subnormal terms)
_A_MIN = -700.0
#: KL: a block whose ``l_h / theta2`` lie within this of its largest sums ``expm1``
#: (:data:`otstab_solvers.logistic_pass.EXPM1_SPAN`; passed by the caller)

_COMPILED: dict = {}
#: the floating-point liberties of the compiled helpers: the exp's polynomial in fused
#: multiply-adds (as sorted_kernels'), the chunk's sums reassociated (vectorised)
_FASTMATH = {"_exp_chunk": {"contract"}, "_kl_chunk": {"reassoc"}}
#: :func:`sorted_kernels._exp_chunk_py` and ``_extremes_py``, compiled once a kernel is
_exp_chunk = sorted_kernels._exp_chunk_py
_extremes = sorted_kernels._extremes_py
_LOADED: dict = {"ok": None}


def use_kernel(size: int) -> bool:
    """Whether an oracle of ``size`` samples runs the compiled pass (numba loaded it: on the
    first such call, :func:`load`; where that fails, the NumPy path from then on with a
    warning on the "otstab" logger)."""
    if not (USE_KERNEL and sorted_kernels.USE_KERNEL and size >= sorted_kernels.KERNEL_MIN_KEYS):
        return False
    return sorted_kernels.load_once(_LOADED, load, "the logistic pass")


def _kernel(fn):
    """The compiled ``fn`` (:func:`sorted_kernels.compile_with`, NumPy's error model)."""
    return sorted_kernels.compile_with(fn, _COMPILED, globals(), (
        ("_exp_chunk", sorted_kernels._exp_chunk_py), ("_extremes", sorted_kernels._extremes_py),
        ("_log1p_unit", _log1p_unit_py), ("_finish", _finish_py), ("_chi2", _chi2_py),
        ("_chunk_steps", _chunk_steps_py), ("_kl_chunk", _kl_chunk_py), ("_sums", _sums_py)),
        _FASTMATH, error_model="numpy")


def load() -> None:
    """Compile the loops, or load them from numba's cache (once per process). Nothing
    without numba."""
    if not sorted_kernels.HAVE_NUMBA:
        return
    m = np.array([-1.0, 0.0, 1.0, 2.0])
    tab = (np.zeros(2), np.ones(2), np.zeros(2))
    for s in (m, m.astype(np.float32)):  # (labels +-1 as int8; other types on first use)
        t, loss = np.empty(4), np.empty(4)
        solve_block(np.ones(4, dtype=np.int8), s, 0, 4, 1.0, 1.0, False, np.zeros(4), tab,
                    -2.0, 0.25, False, t, loss, MODE_KL, 1.0, True, 1.0)
        bin_block(np.ones(4, dtype=np.int8), s, 0, 4, -2.0, 1.0, np.zeros(8), np.zeros(8),
                  np.zeros(8))
    block_sums(t, loss, 1.0, 1.0, MODE_MEAN, 1.0, True, 1.0)
    block_sums(t, loss, 1.0, 1.0, MODE_CHI2, 1.0, False, 0.0, (0.0, 0.0, 1.0, -1.0))
    moments(m, np.array([0, 2]), np.array([2, 4]), np.zeros(2), np.ones(2), np.zeros((2, 9)))


def _chunk_steps_py(y, sc, i0, kk, warm, tprev, j0, tab_t, tab_dt, tab_hd2, quad,
                    tab_lo, tab_inv, T, band, lo_b, hi_b, mb, ub, sb, stb, done, bad, xb, eb,
                    scb):  # pragma: no cover - compiled
    """The Halley iterations of :func:`~otstab_solvers.logistic_uniform.uniform_steps` on
    the ``kk`` rows ``i0..`` (block-local ``j0..``), every row at once (each stops at its own
    test: ``done``); ``bad``: in the band of two local maxima (not iterated). Leaves the
    margins in ``mb``, the roots in ``ub``, sigmoid before the last step in ``sb``, the last
    step in ``stb``."""
    pts2 = tab_t.size - 1  # (the last segment's index)
    for j in range(kk):
        i = i0 + j
        m = float(y[i]) * float(sc[i])  # (exact: a label +-1)
        if warm:
            t0 = tprev[j0 + j]
        else:  # StepTable.start_t
            x = (m - tab_lo) * tab_inv
            if x >= 0.0 and x < pts2:
                k = int(x)
            elif x >= 0.0:
                k = pts2
            else:
                k = 0
            x -= k
            if quad:
                t0 = ((x - 1.0) * tab_hd2[k] + tab_dt[k]) * x + tab_t[k]
            else:
                t0 = tab_dt[k] * x + tab_t[k]
        t0 = min(max(t0, 0.0), T)
        mb[j] = m
        inb = band and m >= lo_b and m <= hi_b
        ub[j] = 0.0 if inb else t0 - m
        done[j] = inb
        bad[j] = inb
        sb[j] = 0.0
        stb[j] = 0.0
    for _ in range(MAX_ITER):
        for j in range(kk):
            xb[j] = -abs(ub[j])
        _exp_chunk(xb, eb, scb, kk)
        for j in range(kk):  # (below exp's range: libm's, subnormal or 0, as expit's)
            if xb[j] < -708.0:
                eb[j] = math.exp(xb[j])
        left = 0
        for j in range(kk):
            e = eb[j]
            u = ub[j]
            m = mb[j]
            s = (1.0 if u >= 0.0 else e) / (1.0 + e)  # sigmoid(u), as expit
            st = s * T
            b = (1.0 - s) * st              # T s (1 - s)
            q2 = (0.5 - s) * b              # F'' / 2
            fp = b - 1.0                    # F'
            f = st - u - m                  # F
            # Halley's step d / (1 - d q), d = F / F', q = F'' / (2 F'): one division
            step = (f * fp) / (fp * fp - f * q2)
            un = u - step
            a = abs(step)
            # stopped: the step below STEP_TOL (1 + |u|), or below TAYLOR_STEP with Newton's
            # bound |q| step^2 on the error left under a quarter ulp of 1
            conv = (a <= STEP_TOL * (1.0 + abs(un))) | \
                ((a <= TAYLOR_STEP) & (a * a * abs(q2) <= 2.5e-17 * abs(fp)))
            dn = done[j]
            # (a row that stopped keeps its values: selects, no branches, vectorised)
            ub[j] = u if dn else un
            sb[j] = sb[j] if dn else s
            stb[j] = stb[j] if dn else step
            done[j] = dn | conv
            left += not (dn | conv)
        if left == 0:
            break


_chunk_steps = _chunk_steps_py

# log1p(w) = 2 atanh(z), z = w / (2 + w): 2 z (1 + z^2 / 3 + z^4 / 5 + ...), |z| <= 1/5 for
# w in [-1/4, 1/2]: the terms after z^22 / 23 are below 2e-17 of the sum
_ATANH = tuple(1.0 / (2 * k + 1) for k in range(12))
_A0, _A1, _A2, _A3, _A4, _A5, _A6, _A7, _A8, _A9, _A10, _A11 = _ATANH
#: ln 2 in two parts (fdlibm's): ``hi`` exact in 33 bits
_LN2_HI = sorted_kernels._LN2_HI
_LN2_LO = sorted_kernels._LN2_LO


def _log1p_unit_py(q):  # pragma: no cover - compiled
    """``log1p(q)`` of ``q`` in ``[0, 1]`` within two ulps (no libm call: vectorised):
    ``q >= 1/2`` as ``ln 2 + log1p((q - 1) / 2)`` (``q - 1`` exact there), the rest by the
    series of ``2 atanh(w / (2 + w))``."""
    big = q >= 0.5
    w = (q - 1.0) * 0.5 if big else q
    z = w / (2.0 + w)
    z2 = z * z
    p = _A11
    p = p * z2 + _A10
    p = p * z2 + _A9
    p = p * z2 + _A8
    p = p * z2 + _A7
    p = p * z2 + _A6
    p = p * z2 + _A5
    p = p * z2 + _A4
    p = p * z2 + _A3
    p = p * z2 + _A2
    p = p * z2 + _A1
    lg = 2.0 * z + (2.0 * z) * (z2 * p)  # (p's leading 1 apart: 2 z exact, added last)
    return (_LN2_HI + (lg + _LN2_LO)) if big else lg


_log1p_unit = _log1p_unit_py


def _kl_chunk_py(tv, lv, c0, kk, eb, em, use_em1, lazy, two_c, h, T):  # pragma: no cover
    """KL's sums over rows ``c0..c0 + kk`` (steps ``tv``, losses ``lv``) with their ``e``
    in ``eb`` (and ``expm1`` in ``em`` where ``use_em1``)."""
    z = z1 = z2 = z3 = e1 = sd1 = 0.0
    for j in range(kk):
        ev = eb[j]
        d1 = lv[c0 + j]
        ed1 = ev * d1
        z += ev
        z1 += ed1
        z2 += ed1 * d1
        sd1 += d1
        if use_em1:
            e1 += em[j]
        if not lazy:  # (d2 from s = t / T, as logistic_pass's curvature from kept steps)
            s = tv[c0 + j] / T
            z3 += ev * (s * s / (two_c - s * (1.0 - s) * h))
    return z, z1, z2, z3, e1, sd1


_kl_chunk = _kl_chunk_py


def _chi2_py(tv, lv, k, c, h, cpar, edge):  # pragma: no cover - compiled
    """chi2's sums of a block from a guess of alpha (``_Pass._chi2_at``; ``cpar = (shift,
    shifted guess a0, upper threshold, lower threshold)``): with ``s0 = l_h - shift + a0``,
    over the rows with ``s0`` above the upper threshold (surely active) the count (twice),
    0, and the sums of ``s0``, ``s0^2``, ``dl``, ``dl^2``, ``s0 dl``, ``d2l``, ``s0 d2l``;
    then the sum of ``dl`` over every row and the count of the rows between the thresholds
    (the edge), whose indices go to ``edge``."""
    shift, a0, hi_thr, lo_thr = cpar[0], cpar[1], cpar[2], cpar[3]
    two_c = 2.0 * c
    T = h / two_c
    K = S0 = S00 = D1 = D11 = S0D1 = D2 = S0D2 = MV = 0.0
    ne = 0
    for c0 in range(0, k, CHUNK):
        kk = min(CHUNK, k - c0)
        cnt = s0s = s00 = d1s = d11 = s0d1 = d2s = s0d2 = mv = 0.0
        for j in range(kk):
            t = tv[c0 + j]
            d1 = lv[c0 + j]
            s0 = ((h * d1 - c * t * t) - shift) + a0
            s = t / T
            d2 = s * s / (two_c - s * (1.0 - s) * h)
            w = 1.0 if s0 > hi_thr else 0.0  # (surely active: weight 1, else 0)
            ws0 = w * s0
            wd1 = w * d1
            cnt += w
            s0s += ws0
            s00 += ws0 * s0
            d1s += wd1
            d11 += wd1 * d1
            s0d1 += ws0 * d1
            d2s += w * d2
            s0d2 += ws0 * d2
            mv += d1
        for j in range(kk):
            t = tv[c0 + j]
            s0 = ((h * lv[c0 + j] - c * t * t) - shift) + a0
            if s0 > lo_thr and not s0 > hi_thr:
                edge[ne] = c0 + j
                ne += 1
        K += cnt
        S0 += s0s
        S00 += s00
        D1 += d1s
        D11 += d11
        S0D1 += s0d1
        D2 += d2s
        S0D2 += s0d2
        MV += mv
    return K, K, 0.0, S0, S00, D1, D11, S0D1, D2, S0D2, MV, float(ne)


_chi2 = _chi2_py


def _sums_py(tv, lv, k, c, h, mode, theta2, lazy, span, cpar,
             edge):  # pragma: no cover - compiled
    """The sums of a block of ``k`` rows with the steps ``tv`` and the losses ``lv`` at
    their maximisers (``l_h = h loss - c t^2`` from them, as the NumPy pass); returns twelve
    numbers: KL ``(largest a, sum e, sum e dl, sum e dl^2, sum e d2l, sum expm1 (nan: exp
    was summed), sum dl, 0, ...)`` with ``a = l_h / theta2``; theta2 = inf ``(sum l_h, sum
    dl, sum d2l, 0, ...)``; chi2 :func:`_chi2_py`'s."""
    two_c = 2.0 * c
    T = h / two_c
    if mode == 2:
        return _chi2(tv, lv, k, c, h, cpar, edge)
    if mode == 1:
        SL = SD1 = SD2 = 0.0
        for c0 in range(0, k, CHUNK):
            sl = sd1 = sd2 = 0.0
            for i in range(c0, min(c0 + CHUNK, k)):
                t = tv[i]
                d1 = lv[i]
                sl += h * d1 - c * t * t
                sd1 += d1
                if not lazy:
                    s = t / T
                    sd2 += s * s / (two_c - s * (1.0 - s) * h)
            SL += sl
            SD1 += sd1
            SD2 += sd2
        return SL, SD1, SD2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    xb = np.empty(CHUNK)
    eb = np.empty(CHUNK)
    em = np.empty(CHUNK)
    scb = np.empty(CHUNK)
    mx = -math.inf
    lo = math.inf
    for c0 in range(0, k, CHUNK):
        kk = min(CHUNK, k - c0)
        for j in range(kk):
            t = tv[c0 + j]
            xb[j] = (h * lv[c0 + j] - c * t * t) / theta2
        l0, m0 = _extremes(xb, kk, math.inf, -math.inf)
        mx = max(mx, m0)
        lo = min(lo, l0)
    use_em1 = lo - mx >= -span
    Z = Z1 = Z2 = Z3 = E = SD1 = 0.0
    for c0 in range(0, k, CHUNK):
        kk = min(CHUNK, k - c0)
        for j in range(kk):
            t = tv[c0 + j]
            a = (h * lv[c0 + j] - c * t * t) / theta2 - mx
            xb[j] = a if a >= _A_MIN else _A_MIN
        if use_em1:  # (e = expm1 + 1 there, as the NumPy pass)
            for j in range(kk):
                em[j] = math.expm1(xb[j])
                eb[j] = em[j] + 1.0
        else:
            _exp_chunk(xb, eb, scb, kk)
        z, z1, z2, z3, e1, sd1 = _kl_chunk(tv, lv, c0, kk, eb, em, use_em1, lazy, two_c, h,
                                           T)
        Z += z
        Z1 += z1
        Z2 += z2
        Z3 += z3
        E += e1
        SD1 += sd1
    return mx, Z, Z1, Z2, Z3, (E if use_em1 else math.nan), SD1, 0.0, 0.0, 0.0, 0.0, 0.0


_sums = _sums_py


def _finish_py(sb, stb, ub, out_t, out_loss, c0, kk, T):  # pragma: no cover - compiled
    """The steps and losses of rows ``c0..c0 + kk`` from their roots ``ub``, the sigmoid
    before the last step ``sb`` and that step ``stb`` (as uniform_steps and _softplus_at)."""
    for jj in range(kk):
        s = sb[jj]
        step = stb[jj]
        ds = s * (1.0 - s)
        s -= (1.0 - (0.5 - s) * step) * step * ds  # sigmoid at the new u
        r = 1.0 - s
        out_t[c0 + jj] = s * T
        out_loss[c0 + jj] = max(ub[jj], 0.0) + _log1p_unit(min(s, r) / max(s, r))


_finish = _finish_py


def _solve_block_py(y, sc, i0, i1, c, h, warm, tprev, tab_t, tab_dt, tab_hd2, quad, tab_lo,
                    tab_inv, out_t, out_loss, rest, mode, theta2, lazy, span, cpar,
                    edge):  # pragma: no cover - compiled
    """Rows ``i0..i1`` (margins ``y[i] sc[i]``, labels +-1 times scores): the
    steps from ``tprev`` (``warm``: the steps of the last ``h``) or the table, into ``out_t``
    and ``out_loss`` (block-local); the indices not
    accepted into ``rest``. Returns ``(count not accepted, the block's sums)``: the sums only
    where every row was accepted (else the caller's :func:`block_sums` after the robust
    solve)."""
    T = h / (2.0 * c)
    band = T > 4.0
    lo_b = hi_b = 0.0
    if band:
        L = 2.0 * math.atanh(math.sqrt(1.0 - 4.0 / T))
        sl = 1.0 / (1.0 + math.exp(L))
        lo_band = T * sl + L
        hi_band = T * (1.0 - sl) - L
        pad = 1e-9 * (1.0 + abs(lo_band) + abs(hi_band))
        lo_b = lo_band - pad
        hi_b = hi_band + pad
    slope_test = T > 4.0 * (1.0 - 2.0 * SLOPE_MIN)
    k = i1 - i0
    mb = np.empty(CHUNK)
    ub = np.empty(CHUNK)
    sb = np.empty(CHUNK)
    stb = np.empty(CHUNK)
    xb = np.empty(CHUNK)
    eb = np.empty(CHUNK)
    scb = np.empty(CHUNK)
    done = np.empty(CHUNK, dtype=np.bool_)
    bad = np.empty(CHUNK, dtype=np.bool_)
    nr = 0
    for c0 in range(0, k, CHUNK):
        kk = min(CHUNK, k - c0)
        _chunk_steps(y, sc, i0 + c0, kk, warm, tprev, c0, tab_t, tab_dt, tab_hd2, quad,
                     tab_lo, tab_inv, T, band, lo_b, hi_b, mb, ub, sb, stb, done, bad, xb, eb,
                     scb)
        for jj in range(kk):
            s = sb[jj]
            u = ub[jj]
            # accepted: converged, |F'| >= SLOPE_MIN at the root, u in [-m, T - m]
            ok = done[jj] & (not bad[jj]) & (abs(u + mb[jj] - 0.5 * T) <= 0.5 * T)
            if slope_test:
                ok = ok & (abs(T * (s * (1.0 - s)) - 1.0) >= SLOPE_MIN)
            done[jj] = ok
        # (every row: those not accepted are written again by the caller; two outputs, so
        # that the loop is vectorised)
        _finish(sb, stb, ub, out_t, out_loss, c0, kk, T)
        for jj in range(kk):
            if not done[jj]:
                rest[nr] = c0 + jj
                nr += 1
    if nr:
        return nr, _ZEROS
    return 0, _sums(out_t, out_loss, k, c, h, mode, theta2, lazy, span, cpar, edge)


def solve_block(y, sc, i0: int, i1: int, c: float, h: float, warm: bool, tprev, table,
                tab_lo: float, tab_inv: float, quad: bool, out_t, out_loss, mode: int,
                theta2: float, lazy: bool, span: float, rest=None, chi2=None):
    """:func:`_solve_block_py` compiled: ``(rest, sums, edge)`` with ``rest`` the
    block-local indices of the rows not accepted (empty: ``sums`` are the block's; else the
    caller solves those rows, writes them into ``out_t`` and ``out_loss`` and sums the block
    by :func:`block_sums`) and ``edge`` chi2's rows between its thresholds. ``table``:
    ``(t, dt, half_d2)`` of a :class:`~otstab_solvers.logistic_uniform.StepTable`
    (``half_d2`` read where ``quad``); ``tprev``: the steps of the last ``h`` (read where
    ``warm``; may be ``out_t`` itself); ``out_t`` / ``out_loss``: the block's steps and losses
    (contiguous float64); ``chi2``: ``(shift, shifted guess of alpha, upper threshold, lower
    threshold)`` (:data:`MODE_CHI2`)."""
    k = int(i1) - int(i0)
    rest = np.empty(k, dtype=np.intp) if rest is None else rest
    cpar = np.array(chi2 if chi2 is not None else (0.0,) * 4, dtype=np.float64)
    edge = np.empty(k if mode == MODE_CHI2 else 0, dtype=np.intp)
    nr, sums = _kernel(_solve_block_py)(
        y, sc, int(i0), int(i1), float(c), float(h), bool(warm), tprev, table[0], table[1],
        table[2], bool(quad), float(tab_lo), float(tab_inv), out_t, out_loss, rest,
        int(mode), float(theta2), bool(lazy), float(span), cpar, edge)
    return rest[:nr], sums, edge[:int(sums[11])] if mode == MODE_CHI2 and not nr else edge[:0]


def block_sums(out_t, out_loss, c: float, h: float, mode: int, theta2: float, lazy: bool,
               span: float, chi2=None) -> tuple:
    """:func:`_sums_py` compiled (a block whose rows the caller completed): ``(sums,
    edge)``."""
    cpar = np.array(chi2 if chi2 is not None else (0.0,) * 4, dtype=np.float64)
    edge = np.empty(out_t.size if mode == MODE_CHI2 else 0, dtype=np.intp)
    sums = _kernel(_sums_py)(out_t, out_loss, out_t.size, float(c), float(h), int(mode),
                             float(theta2), bool(lazy), float(span), cpar, edge)
    return sums, edge[:int(sums[11])] if mode == MODE_CHI2 else edge[:0]


_NO_NEAR = np.empty(0)


def _audit_py(loss, z, g, h, theta1, theta2, shift, scale, kl_log, near_one, mode,
              near):  # pragma: no cover - compiled
    """The audit's sums over a block of Q*'s atoms on the score path, each its sample at its
    step ``z`` at h (mass 1) with the loss ``loss`` there (the arithmetic of
    ``otstab.solve._smooth._audit_rows``' plain loop): ``d2 = (z g) z``; theta2 = inf
    (``mode`` 1): ``(sum loss, 0, 0, sum d2, 0, 0)``; KL: with ``a = max((h loss - theta1
    d2) / theta2 - shift, -700)`` and ``w = exp(a) scale``, ``(sum loss, sum w loss, sum w,
    sum w d2, sum of w (a + kl_log) - w + 1 over the weights not within ``near_one`` of 1,
    count of those)``, those weights into ``near``; chi2 (``mode`` 2) the same sums with
    its weights and ``phi = (w - 1)^2`` (count 0)."""
    k = loss.size
    xb = np.empty(CHUNK)
    eb = np.empty(CHUNK)
    scb = np.empty(CHUNK)
    MR = R = TOT = MV = PH = 0.0
    nn = 0
    for c0 in range(0, k, CHUNK):
        kk = min(CHUNK, k - c0)
        mr = r = tot = mv = ph = 0.0
        if mode == 1:
            for j in range(kk):
                zz = z[c0 + j]
                mr += loss[c0 + j]
                mv += zz * g * zz
            MR += mr
            MV += mv
            continue
        if mode == 2:  # chi2: w = max(((l_h - shift) + scale) / (2 theta2) + 1, 0)
            for j in range(kk):
                zz = z[c0 + j]
                d2 = zz * g * zz
                ls = loss[c0 + j]
                w = (((h * ls - theta1 * d2) - shift) + scale) / (2.0 * theta2) + 1.0
                w = max(w, 0.0)
                mr += ls
                r += w * ls
                tot += w
                mv += w * d2
                ph += (w - 1.0) ** 2
            MR += mr
            R += r
            TOT += tot
            MV += mv
            PH += ph
            continue
        for j in range(kk):
            zz = z[c0 + j]
            d2 = zz * g * zz
            a = (h * loss[c0 + j] - theta1 * d2) / theta2 - shift
            xb[j] = a if a >= _A_MIN else _A_MIN
        _exp_chunk(xb, eb, scb, kk)
        for j in range(kk):
            zz = z[c0 + j]
            d2 = zz * g * zz
            ls = loss[c0 + j]
            w = eb[j] * scale
            a = xb[j]
            mr += ls
            r += w * ls
            tot += w
            mv += w * d2
            if abs(w - 1.0) < near_one:  # (phi's series, by the caller)
                near[nn] = w
                nn += 1
            else:
                ph += (((a + kl_log) * w) - w) + 1.0
        MR += mr
        R += r
        TOT += tot
        MV += mv
        PH += ph
    return MR, R, TOT, MV, PH, nn


def audit_sums(loss, z, g: float, h: float, theta1: float, theta2: float, shift: float,
               scale: float, kl_log: float, near_one: float, near=None,
               chi2: bool = False) -> tuple:
    """:func:`_audit_py` compiled (``theta2`` inf: the sums of theta2 = inf; ``chi2``: chi2's
    weights ``max(((l_h - shift) + scale) / (2 theta2) + 1, 0)`` and ``phi = (w - 1)^2``, the
    WeightMap's ``shift`` and ``scale``); ``near``: room for ``loss.size`` weights (KL)."""
    mode = MODE_MEAN if math.isinf(theta2) else MODE_CHI2 if chi2 else MODE_KL
    near = _NO_NEAR if near is None else near
    return _kernel(_audit_py)(loss, z, float(g), float(h), float(theta1),
                              1.0 if mode == MODE_MEAN else float(theta2), float(shift),
                              float(scale), float(kl_log), float(near_one), mode, near)


def _bin_block_py(y, sc, i0, i1, lo, scale, bins, count, first,
                  second):  # pragma: no cover - compiled
    """The binning of :class:`otstab_solvers.logistic_binned._Bins` (no sample
    probabilities) of rows ``i0..i1`` (margins ``y sc``) added into ``count``, ``first`` and
    ``second``: row by row, as ``np.bincount`` adds them."""
    top = bins - 1
    for i in range(i0, i1):
        k = (float(y[i]) * float(sc[i]) - lo) * scale
        j = int(k)
        if j > top:
            j = top
        off = (k - j) - 0.5
        count[j] += 1.0
        first[j] += off
        second[j] += off * off


def bin_block(y, sc, i0: int, i1: int, lo: float, scale: float, count, first,
              second) -> None:
    """:func:`_bin_block_py` compiled (``count``, ``first``, ``second``: float64 of the bins,
    added to)."""
    _kernel(_bin_block_py)(y, sc, int(i0), int(i1), float(lo), float(scale), count.size,
                           count, first, second)


def _moments_py(ms, starts, stops, centre, inv, mom):  # pragma: no cover - compiled
    """The Chebyshev moments of :class:`otstab_solvers.logistic_quadrature.MarginQuadrature`:
    for each bin ``b`` (its sorted margins ``ms[starts[b]:stops[b]]``, position
    ``x = clip((m - centre_b) inv_b, -1, 1)``) ``mom[b, k] = sum T_k(x)`` for k >= 1 (the
    recurrence ``T_k = (2 x) T_{k-1} - T_{k-2}`` with NumPy's operations, summed row by row
    in row order)."""
    p = mom.shape[1] - 1
    t = np.empty(p + 1)
    for b in range(starts.size):
        c, s = centre[b], inv[b]
        for k in range(1, p + 1):
            mom[b, k] = 0.0
        for i in range(starts[b], stops[b]):
            x = (ms[i] - c) * s
            x = -1.0 if x < -1.0 else (1.0 if x > 1.0 else x)
            t[0] = 1.0
            t[1] = x
            for k in range(2, p + 1):
                t[k] = 2.0 * x * t[k - 1] - t[k - 2]
            for k in range(1, p + 1):
                mom[b, k] += t[k]


def moments(ms, starts, stops, centre, inv, mom) -> None:
    """:func:`_moments_py` compiled (``mom`` (bins, degree + 1) float64, its columns from 1
    written)."""
    _kernel(_moments_py)(ms, starts, stops, centre, inv, mom)
