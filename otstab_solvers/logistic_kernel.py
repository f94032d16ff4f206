"""One exact pass of the logistic dual, compiled: every sample's d-transform and the sums.

:class:`otstab_solvers.logistic_pass` evaluates the exact dual at a point ``h`` by solving
every sample's inner problem (:func:`otstab_solvers.logistic_uniform.uniform_steps`, NumPy over
blocks of rows) and reducing ``l_h``, the loss at the maximiser and ``d2 l_h / dh2``. When the
maximisers need not be kept (``feature_stability``: one such pass per feature, issue 31) the
same work runs here as one compiled loop per block of rows (numba, blocks in parallel), with no
intermediate arrays:

* the margin ``m = y s`` is formed from the scores and labels as the row is read;
* the first iterate comes from the :class:`~otstab_solvers.logistic_uniform.StepTable` of
  ``h`` (the NumPy path's start), clipped to ``[-m, T - m]``;
* Halley's iterations on ``F(u) = T sigmoid(u) - u - m`` (the same formulas), per sample
  until its last step is below ``STEP_TOL (1 + |u|)``, or below ``TAYLOR_STEP`` with Newton's
  error estimate ``|q| step^2`` under a quarter ulp of 1 (the NumPy path's two stopping rules,
  applied per sample instead of to the worst sample of the block);
* a sample is accepted under the NumPy path's rules (converged, ``|F'| >= SLOPE_MIN``, ``u``
  in ``[-m, T - m]``); for ``T > 4`` a margin in the band of two local maxima is solved on both
  monotone branches (:func:`~otstab_solvers.logistic_uniform.two_branch_steps`'s Newton
  iterations and comparison) and accepted under its rules;
* ``l_h = h softplus(u) - c t^2``, ``loss* = softplus(u)`` (from ``sigmoid(u)`` as
  ``_softplus_at``) and ``d2 = s^2 / (2 c - h s (1 - s))`` as the NumPy path computes them.

A block with any sample not accepted is reported, and the caller recomputes that block with
the NumPy path (whose robust bracketed solve handles every sample): the values are the NumPy
path's, to rounding (the order of the sums differs). Per block the kernel returns the sums of
the reduction: for KL (``mode`` 0) the largest ``l_h / theta2`` and the sums of ``e``,
``e loss*``, ``e loss*^2``, ``e d2`` (``e = exp(l_h / theta2 - largest)``) and of ``loss*``;
for ``theta2 = inf`` (mode 1) the sums of ``l_h``, ``loss*`` and ``d2``; mode 2 writes
``l_h``, ``loss*`` and ``d2`` into the caller's arrays (chi2: reduced by
:class:`~otstab_solvers.blockwise.BlockwiseDual`) and sums ``loss*``.

This module imports neither otstab nor Dask; without numba :func:`available` is False and the
caller keeps the NumPy path.
"""

from __future__ import annotations

import math

import numpy as np

from .logistic_uniform import BRANCH_ITER, MAX_ITER, SLOPE_MIN, STEP_TOL, TAYLOR_STEP

try:
    import numba
except ImportError:  # pragma: no cover - numba is optional
    numba = None  # type: ignore[assignment]

__all__ = ["available", "block_sums", "KL", "MEAN", "ARRAYS"]

#: modes of :func:`block_sums`
KL, MEAN, ARRAYS = 0, 1, 2
#: columns of the per-block output (mode KL: largest, e, e loss, e loss^2, e d2, loss; mode
#: MEAN: l, loss, d2 in the first three; mode ARRAYS: loss in column 5); the last column is 1
#: where the block holds a sample not accepted
N_OUT = 7


def available() -> bool:
    """True when numba is importable (the kernel compiles on first use, cached on disk)."""
    return numba is not None


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True)
    _pjit = numba.njit(cache=True, nogil=True, parallel=True)
    _prange = numba.prange
else:  # pragma: no cover - numba is optional
    def _jit(f):
        return f
    _pjit = _jit
    _prange = range  # type: ignore[misc]


@_jit
def _expit(u):  # pragma: no cover - compiled
    if u >= 0.0:
        return 1.0 / (1.0 + math.exp(-u))
    e = math.exp(u)
    return e / (1.0 + e)


@_jit
def _branch(m, T, u):  # pragma: no cover - compiled
    """Newton on one monotone branch from ``u``: (root, converged)."""
    for _ in range(BRANCH_ITER):
        s = _expit(u)
        fp = T * s * (1.0 - s) - 1.0
        step = (T * s - u - m) / fp
        u = u - step
        if not math.isfinite(u):
            return u, False
        if abs(step) <= STEP_TOL * (1.0 + abs(u)):
            return u, True
    return u, False


@_jit
def _softplus(u):  # pragma: no cover - compiled
    if u > 0.0:
        return u + math.log1p(math.exp(-u))
    return math.log1p(math.exp(u))


@_jit
def _solve(m, c, h, T, band, lo_band, hi_band, pad, t0, inv, tab_t, tab_dt, npts):
    # pragma: no cover - compiled
    """(u, s, accepted) of one margin (module docstring)."""
    if band and m >= lo_band - pad and m <= hi_band + pad:
        has_near = m >= lo_band + pad
        has_far = m <= hi_band - pad
        if not (has_near or has_far) or abs(m - lo_band) <= pad or abs(m - hi_band) <= pad:
            return 0.0, 0.0, False
        best_u, best_v, have = 0.0, -math.inf, False
        if has_far:
            uf, ok = _branch(m, T, T - m)
            if not ok:
                return 0.0, 0.0, False
            best_u, best_v, have = uf, h * _softplus(uf) - c * (uf + m) ** 2, True
        if has_near:
            un, ok = _branch(m, T, -m)
            if not ok:
                return 0.0, 0.0, False
            vn = h * _softplus(un) - c * (un + m) ** 2
            if not have or vn > best_v:
                best_u = un
        u = best_u
        s = _expit(u)
        ok = abs(T * s * (1.0 - s) - 1.0) >= SLOPE_MIN and u >= -m and u <= T - m \
            and math.isfinite(u)
        return u, s, ok
    # the first iterate from the table of steps, clipped to [-m, T - m]
    x = (m - t0) * inv
    k = int(x)
    if x < 0.0:
        k = 0
    if k > npts - 2:
        k = npts - 2
    tt = tab_t[k] + tab_dt[k] * (x - k)
    if tt < 0.0:
        tt = 0.0
    elif tt > T:
        tt = T
    u = tt - m
    s = 0.0
    step = math.inf
    converged = False
    for _ in range(MAX_ITER):
        s = _expit(u)
        Ts = T * s
        b = Ts * (1.0 - s)
        qq = (0.5 - s) * b  # F'' / 2
        fp = b - 1.0        # F'
        F = Ts - u - m
        # Halley's step d / (1 - d q) with d = F / F', q = F'' / (2 F'), in one division
        step = F * fp / (fp * fp - F * qq)
        u -= step
        a = abs(step)
        if a <= STEP_TOL * (1.0 + abs(u)):
            converged = True
            break
        if a <= TAYLOR_STEP and a * a * abs(qq) <= 2.5e-17 * abs(fp):
            converged = True
            break
    if not (converged and math.isfinite(step)):
        return 0.0, 0.0, False
    ds = s * (1.0 - s)
    slope = T * ds - 1.0
    s -= ds * step * (1.0 - (0.5 - s) * step)
    ok = abs(slope) >= SLOPE_MIN and u >= -m and u <= T - m
    return u, s, ok


@_pjit
def _blocks(scores, signs, c, h, theta2, mode, block, t0, inv, tab_t, tab_dt, out, arr_l,
            arr_d1, arr_d2):  # pragma: no cover - compiled
    n = scores.shape[0]
    nb = out.shape[0]
    T = h / (2.0 * c)
    band = T > 4.0
    lo_band = hi_band = pad = 0.0
    if band:
        L = 2.0 * math.atanh(math.sqrt(1.0 - 4.0 / T))
        sl = 1.0 / (1.0 + math.exp(L))
        lo_band = T * sl + L
        hi_band = T * (1.0 - sl) - L
        pad = 1e-9 * (1.0 + abs(lo_band) + abs(hi_band))
    npts = tab_t.shape[0] + 1
    for b in _prange(nb):
        s0 = b * block
        e0 = min(s0 + block, n)
        lb = np.empty(e0 - s0)
        l1 = np.empty(e0 - s0)
        l2 = np.empty(e0 - s0)
        bad = False
        for i in range(s0, e0):
            m = float(signs[i]) * float(scores[i])
            u, s, ok = _solve(m, c, h, T, band, lo_band, hi_band, pad, t0, inv, tab_t, tab_dt,
                              npts)
            if not ok:
                bad = True
                break
            t = T * s
            r = 1.0 - s
            if s < r:
                lo_, hi_ = s, r
            else:
                lo_, hi_ = r, s
            loss = (u if u > 0.0 else 0.0) + math.log1p(lo_ / hi_)
            lb[i - s0] = h * loss - c * t * t
            l1[i - s0] = loss
            l2[i - s0] = s * s / (2.0 * c - h * s * r)
        for j in range(N_OUT):
            out[b, j] = 0.0
        if bad:
            out[b, N_OUT - 1] = 1.0
            continue
        k = e0 - s0
        if mode == 0:
            mx = -math.inf
            for i in range(k):
                a = lb[i] / theta2
                if a > mx:
                    mx = a
            z = z1 = z2 = z3 = sm = 0.0
            for i in range(k):
                a = lb[i] / theta2 - mx
                if a < -700.0:
                    a = -700.0
                ev = math.exp(a)
                ed = ev * l1[i]
                z += ev
                z1 += ed
                z2 += ed * l1[i]
                z3 += ev * l2[i]
                sm += l1[i]
            out[b, 0] = mx
            out[b, 1] = z
            out[b, 2] = z1
            out[b, 3] = z2
            out[b, 4] = z3
            out[b, 5] = sm
        elif mode == 1:
            sl_ = sd1 = sd2 = 0.0
            for i in range(k):
                sl_ += lb[i]
                sd1 += l1[i]
                sd2 += l2[i]
            out[b, 0] = sl_
            out[b, 1] = sd1
            out[b, 2] = sd2
            out[b, 5] = sd1
        else:
            sd1 = 0.0
            for i in range(k):
                arr_l[s0 + i] = lb[i]
                arr_d1[s0 + i] = l1[i]
                arr_d2[s0 + i] = l2[i]
                sd1 += l1[i]
            out[b, 5] = sd1


_EMPTY = np.empty(0)


def block_sums(scores, signs, c: float, h: float, theta2: float, mode: int, block: int,
               table, arrays=None) -> np.ndarray:
    """The per-block sums (module docstring) of the rows ``0..n`` in blocks of ``block`` rows:
    an array of shape ``(blocks, N_OUT)``; column ``N_OUT - 1`` is 1 for a block the caller
    must recompute. ``table``: the :class:`~otstab_solvers.logistic_uniform.StepTable` of
    ``h``; ``arrays``: ``(l_h, loss*, d2)`` n-vectors written in mode ARRAYS."""
    n = scores.shape[0]
    nb = -(-n // block)
    out = np.empty((nb, N_OUT))
    al, a1, a2 = arrays if arrays is not None else (_EMPTY, _EMPTY, _EMPTY)
    _blocks(scores, signs, float(c), float(h), float(theta2) if math.isfinite(theta2) else 1.0,
            int(mode), int(block), table.lo, table.inv, table.t, table.dt, out, al, a1, a2)
    return out
