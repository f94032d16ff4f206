"""The logistic dual at the binned root: one exact pass, a Newton correction where needed.

The root ``h_c`` of the dual on binned margins (:mod:`otstab_solvers.logistic_binned`) is
within some 1e-11 of the exact root for KL and theta2 = inf, and for chi2 (whose weights have
a kink in the margin: the bins there are given margin by margin) some 1e-12, at n = 1e6
(issue 31). A bracketed search from it still
evaluates the exact dual at two or more points and Q*'s build solves every sample once more.
:func:`solve_at_root` instead evaluates the exact dual at ``h_c`` (one pass over the margins:
each sample's d-transform, summed over blocks) and

* accepts ``h_c`` when the derivative there is within :data:`G_RTOL` of ``r`` (the stopping
  rule of :func:`otstab_solvers.dual.solve_dual` on ``g``): the most sensitive distribution at
  ``h_c`` has the risk ``r - g``, and its cost is the dual value less ``h g``;
* otherwise takes a Newton step ``h + g / curv`` (the dual is smooth near its root away
  from switching points, so one step from an error of 1e-8 leaves some 1e-16) and evaluates
  there, up to :data:`MAX_NEWTON` steps, each within :data:`WINDOW` of ``h_c``;
* returns None when neither happens (a switching point of ``l_h`` near the root, a flat
  dual): the caller then runs the bracketed search.

The value at the returned ``h`` is the exact dual objective there (a lower bound on R by weak
duality); ``gap_bound`` is ``|h g|``, the distance from it to the cost of the most sensitive
distribution at ``h``; ``info["kl_weights"]`` (plain KL) the pass's normalisation of the
weights of Q*, ``(largest l_h / theta2, sum of exp(l_h / theta2 - largest), term)``. The
oracle (a :class:`~otstab_solvers.smooth.LogisticOracle` read in
slices, with warm starts) keeps each block's maximisers at the last ``h``, so that Q*'s build
at the returned ``h`` reads them instead of solving every sample again.

The KL reduction is the one of :func:`otstab_solvers.blockwise.block_kl` (per block the
largest ``l_h / theta2`` and the sums of ``e``, ``e dl``, ``e dl^2`` and ``e d2l``, combined
by the log-sum-exp of the blocks), its ``expm1`` sum only in the blocks whose ``l_h /
theta2`` lie within :data:`EXPM1_SPAN` of their largest (``e = expm1 + 1`` there): that sum
is only read when every ``l_h / theta2`` is close to the largest (the mean of ``e`` above
1/2, near the base risk), and is then computed for the other blocks from the kept ``l_h``
of the pass. theta2 = inf sums ``l_h``, ``dl`` and ``d2l``
(``info["unit_term"]``: the mean of ``l_h``). chi2 given the binned ``alpha`` sums its terms
in the same pass (``_Pass._chi2_at``: the rows surely active or not for any alpha within
:data:`CHI2_BAND` of it summed per block, the rows in that band kept one by one, alpha then
exact by the active-set steps of :meth:`~otstab_solvers.blockwise.BlockwiseDual.chi2` on those
sums; ``info["chi2_weights"]``: ``(shift, shifted alpha, term)``); without it, or when
alpha leaves the band, chi2 is reduced by :class:`~otstab_solvers.blockwise.BlockwiseDual`
over the kept ``l_h`` and derivatives. Sample probabilities ``p`` weight every sum as
:func:`~otstab_solvers.blockwise.block_kl` and ``block_top`` weight them (KL: the largest
``l_h / theta2`` over the rows of positive probability).

This module imports neither otstab nor Dask.
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import sorted_kernels
from .blockwise import CHI2_MAX_STEPS, BlockwiseDual, in_memory
from .logistic_kernels import MODE_CHI2, MODE_KL, MODE_MEAN
from .result import OPTIMAL, DualSolution
from .smooth import logistic_dtransform, uniform_d2

__all__ = ["solve_at_root", "G_RTOL", "MAX_NEWTON", "WINDOW"]

#: |g| accepted at a point, relative to r (as :func:`otstab_solvers.dual.solve_dual`)
G_RTOL = 1e-11
#: Newton steps from the binned root before the caller's bracketed search takes over
MAX_NEWTON = 3
#: the relative distance from the binned root within which the steps stay
WINDOW = 1e-2
#: rows per block of a pass
BLOCK = 1 << 13
#: KL: a block whose ``l_h / theta2`` all lie within this of the block's largest sums
#: ``expm1`` in the pass instead of ``exp`` (read when every ``l_h / theta2`` is close to the
#: largest: no second pass over the kept ``l_h`` then; elsewhere ``exp``, which costs half)
EXPM1_SPAN = 1.0
#: chi2's band of ``l_h - shift + alpha`` around ``-2 theta2`` whose rows a pass keeps one
#: by one, relative to ``2 theta2 + |alpha|`` (the guess of alpha is some 1e-12 off)
CHI2_BAND = 1e-7


class _Kept:
    """Block ``k`` of the last pass's ``l_h``, ``dl`` and ``d2l`` as a block of
    :class:`BlockwiseDual` (``p``: its rows' probabilities)."""

    def __init__(self, store, k, p):
        self.store, self.k, self.p = store, k, p

    def evaluate(self, h, side="right", with_pieces=True):
        return (*self.store[self.k], None)


class _Pass:
    """Exact passes of the logistic dual over the blocks of an oracle's rows. Each block's
    arrays of the last pass are kept as the oracle returned them (the oracle may keep the
    same arrays: no copy)."""

    def __init__(self, oracle, n, theta2, divergence, p, block, alpha=None):
        self.oracle, self.n, self.theta2, self.divergence, self.p = \
            oracle, n, theta2, divergence, p
        self.bounds = [(s, min(s + block, n)) for s in range(0, n, block)]
        # KL keeps l_h alone (for the expm1 sum), theta2 = inf nothing (its sums are plain);
        # chi2 (without a guess of alpha) every derivative
        self.plain_kl = divergence == "kl" and math.isfinite(theta2)
        self.plain_mean = math.isinf(theta2)
        self.store: list = [None] * len(self.bounds)
        self.passes = 0
        self.moved = math.nan
        self.kl_weights: tuple | None = None  # KL: (largest l_h / theta2, sum p e, term)
        self.unit_term: float | None = None  # theta2 = inf: the P0-mean of l_h
        #: chi2 (finite theta2) with a guess of alpha (not shifted): the sums of one pass
        #: (:meth:`_chi2_at`); ``chi2_weights`` the normalisation of its weights,
        #: ``(shift, shifted alpha, term)``
        self.chi2 = divergence == "chi2" and math.isfinite(theta2)
        self.alpha = alpha if self.chi2 and alpha is not None and math.isfinite(alpha) \
            else None
        self.chi2_weights: tuple | None = None
        #: ``(h, M, Z, mu)`` of a pass that did not sum the curvature (KL's largest value,
        #: normalisation and mean loss at the maximisers; None for theta2 = inf)
        self._lazy: tuple | None = None
        self.dual = None
        if not (self.plain_kl or self.plain_mean):
            blocks = [_Kept(self.store, k, None if p is None else p[s:e])
                      for k, (s, e) in enumerate(self.bounds)]
            self.dual = BlockwiseDual(in_memory(blocks), n, n if p is None else 1.0,
                                      kinks=False)

    def at(self, h, r):
        """``(F, g, curv, alpha)`` of the exact dual at ``h`` (and :attr:`moved`: the
        P0-mean loss at the maximisers). ``curv`` None: not summed in the pass (plain KL and
        theta2 = inf of an oracle that keeps its steps), :meth:`curvature` sums it."""
        self.passes += 1
        oracle = self.oracle
        self._lazy = None
        lazy = (self.plain_kl or self.plain_mean) and getattr(oracle, "keep_values", False) \
            and getattr(oracle, "curvature", None) is True and oracle.c.strides == (0,)
        if not lazy:
            return self._at(h, r, False)
        oracle.curvature = False  # (no second derivative per sample in this pass)
        try:
            return self._at(h, r, True)
        finally:
            oracle.curvature = True

    def curvature(self, h):
        """Minus the second derivative of the dual at ``h``, the last pass's (a pass that did
        not sum it: from the steps and losses the oracle kept, one read without solving
        again; the same formulas as the pass's sums: :func:`uniform_d2` from ``s = t / T``,
        KL's weights from ``l_h = h loss - c t^2`` as the d-transform computed it)."""
        if self._lazy is None:
            raise RuntimeError("no pass at h to take the curvature of")
        at, M, Z, mu = self._lazy
        assert at == h
        oracle, p = self.oracle, self.p
        c = float(oracle.c[0])
        T = h / (2.0 * c)
        sd2 = z2 = z3 = 0.0
        for s, e in self.bounds:
            loss, t = oracle.kept(h, slice(s, e))
            d2 = uniform_d2(t / T, c, h)
            pb = None if p is None else p[s:e]
            if self.plain_mean:
                sd2 += float(np.sum(d2)) if pb is None else float(np.dot(pb, d2))
                continue
            lb = h * loss
            lb -= c * t * t
            a = lb / self.theta2
            a -= M
            np.clip(a, -700.0, 0.0, out=a)
            ev = np.exp(a, out=a)
            if pb is not None:
                ev *= pb
            ed1 = ev * loss
            z2 += float(np.dot(ed1, loss))
            z3 += float(np.dot(ev, d2))
        if self.plain_mean:
            return sd2 / (float(self.n) if p is None else 1.0)
        return z3 / Z + max(z2 / Z - mu * mu, 0.0) / self.theta2

    def _fused_blocks(self, fused, h, *args) -> list:
        """``fused(h, block, *args)`` of every block (None where the compiled loop does not
        apply): the first here (it loads the loops and makes the oracle's kept vectors),
        then the others in two halves, the second on a thread of its own where there are two
        CPUs (:func:`otstab_solvers.sorted_kernels.pair`): each block's sums are the same
        on any thread, and the caller adds them in block order."""
        bounds = self.bounds
        out: list = [None] * len(bounds)
        if fused is None or not bounds:
            return out
        out[0] = fused(h, slice(*bounds[0]), *args)
        if out[0] is None or len(bounds) == 1:
            return out
        mid = 1 + (len(bounds) - 1) // 2

        def run(ks) -> None:
            for k in ks:
                out[k] = fused(h, slice(*bounds[k]), *args)

        sorted_kernels.pair(lambda: run(range(1, mid)), lambda: run(range(mid, len(bounds))))
        return out

    def _at(self, h, r, lazy):
        """:meth:`at`; ``lazy``: the pass sums no curvature (the oracle gives no second
        derivative), :meth:`curvature` does when asked."""
        oracle, store = self.oracle, self.store
        # one compiled loop per block (logistic_kernels; None: NumPy's blocks)
        fused = getattr(oracle, "fused_rows", None) if self.p is None else None
        if self.plain_mean:  # theta2 = inf: the means of l_h, dl and d2l
            sl = sd1 = sd2 = 0.0
            fused_got = self._fused_blocks(fused, h, MODE_MEAN, math.inf, lazy, 0.0)
            for (s, e), got in zip(self.bounds, fused_got):
                if got is not None:
                    sl += got[0]
                    sd1 += got[1]
                    sd2 += got[2]
                    continue
                lb, d1, d2 = oracle.transform_rows(h, slice(s, e))[:3]
                if self.p is None:
                    sl += float(np.sum(lb))
                    sd1 += float(np.sum(d1))
                    if not lazy:
                        sd2 += float(np.sum(d2))
                else:  # (sample probabilities: as BlockwiseDual.top sums them)
                    pb = self.p[s:e]
                    sl += float(np.dot(pb, lb))
                    sd1 += float(np.dot(pb, d1))
                    if not lazy:
                        sd2 += float(np.dot(pb, d2))
            N = float(self.n) if self.p is None else 1.0
            self.moved = sd1 / N
            self.unit_term = sl / N
            if lazy:
                self._lazy = (h, None, None, None)
            curv = None if lazy else sd2 / N
            return h * r - sl / N, r - sd1 / N, curv, None  # (as BlockwiseDual.reduce)
        if self.alpha is not None:
            got = self._chi2_at(h, r)
            if got is not None:
                return got
            self.passes += 1  # (one more pass, as before)
        if not self.plain_kl:
            moved = 0.0
            kept = getattr(oracle, "kept", None) if getattr(oracle, "keep_values", False) \
                else None
            for k, (s, e) in enumerate(self.bounds):
                lb, d1, d2 = oracle.transform_rows(h, slice(s, e))[:3]
                got = None if kept is None else kept(h, slice(s, e))
                if got is not None:  # (the same losses, in the oracle's kept n-vector: one copy)
                    d1 = got[0]
                store[k] = lb, d1, d2
                moved += float(np.sum(d1)) if self.p is None else float(np.dot(self.p[s:e], d1))
            term, mu, curv, alpha, _ = self.dual.reduce(h, "right", self.theta2,
                                                        self.divergence)
            self.moved = moved / self.n if self.p is None else moved
            return h * r - term, r - mu, curv, alpha
        theta2 = self.theta2
        parts = []
        moved = 0.0
        # (an oracle that keeps each block's loss and step at h gives l_h again for the
        # expm1 sum below: no n-vector of l_h kept here)
        kept = getattr(oracle, "kept", None) if getattr(oracle, "keep_values", False) else None
        p = self.p
        fused_got = self._fused_blocks(fused, h, MODE_KL, theta2, lazy, EXPM1_SPAN)
        for k, (s, e) in enumerate(self.bounds):
            got = fused_got[k]
            if got is not None:  # (its steps and losses kept by the oracle: l_h from them)
                store[k] = None
                moved += got[6]
                parts.append((got[0], got[1], got[2], 0.0 if lazy else got[3],
                              0.0 if lazy else got[4],
                              None if math.isnan(got[5]) else (got[5], float(e - s)), k))
                continue
            lb, d1, d2 = oracle.transform_rows(h, slice(s, e))[:3]
            store[k] = None if kept is not None and kept(h, slice(s, e)) is not None else lb
            a = lb / theta2
            if p is None:
                moved += float(np.sum(d1))
                m = float(a.max())
                a -= m
                low = float(a.min())
                if low < -700.0:  # (no subnormal terms, as dual._exp_shifted)
                    np.maximum(a, -700.0, out=a)
                em1 = None
                if low >= -EXPM1_SPAN:  # (then likely read: see below)
                    em1 = np.expm1(a, out=a)
                    sem1 = float(np.sum(em1))
                    ev = np.add(em1, 1.0, out=a)
                else:
                    ev = np.exp(a, out=a)
                ed1 = ev * d1
                parts.append((m, float(np.sum(ev)), float(np.sum(ed1)),
                              0.0 if lazy else float(np.dot(ed1, d1)),
                              0.0 if lazy else float(np.dot(ev, d2)),
                              None if em1 is None else (sem1, float(e - s)), k))
                continue
            # sample probabilities, as block_kl sums them: the largest over the rows of
            # positive probability, rows of zero probability above it capped at it
            pb = p[s:e]
            moved += float(np.dot(pb, d1))
            live = pb > 0
            if not live.any():
                continue
            m = float(a[live].max())
            a -= m
            np.clip(a, -700.0, 0.0, out=a)
            em1 = None
            if float(a.min()) >= -EXPM1_SPAN:
                em1 = np.expm1(a, out=a)
                sem1 = float(np.dot(pb, em1))
                ev = np.add(em1, 1.0, out=a)
            else:
                ev = np.exp(a, out=a)
            ev *= pb
            ed1 = ev * d1
            parts.append((m, float(np.sum(ev)), float(np.sum(ed1)),
                          0.0 if lazy else float(np.dot(ed1, d1)),
                          0.0 if lazy else float(np.dot(ev, d2)),
                          None if em1 is None else (sem1, float(np.sum(pb))), k))
        self.moved = moved / self.n if p is None else moved
        M = max(q[0] for q in parts)
        f = [math.exp(q[0] - M) for q in parts]
        Z, Z1, Z2, Z3 = (sum(fb * q[i] for fb, q in zip(f, parts)) for i in (1, 2, 3, 4))
        N = float(self.n) if p is None else 1.0
        if Z > 0.5 * N:  # every l / theta2 close to the largest: expm1 keeps the accuracy
            em1 = 0.0
            # the blocks that summed expm1 in the pass: sum_i expm1(a_i - M) = e^d sum_i
            # expm1(a_i - m_b) + expm1(d) P_b with d = m_b - M (as blockwise.BlockwiseDual.kl)
            done = set()
            for fb, q in zip(f, parts):
                if q[5] is not None:
                    em1 += fb * q[5][0] + math.expm1(q[0] - M) * q[5][1]
                    done.add(q[6])
            for k, lb in enumerate(store):
                if k in done:
                    continue
                if lb is None:  # h loss - c t^2, as the d-transform computed it
                    assert kept is not None
                    loss, t = kept(h, slice(*self.bounds[k]))
                    lb = h * loss
                    lb -= float(oracle.c[0]) * t * t
                x = np.maximum(lb / theta2 - M, -700.0)
                if p is None:
                    em1 += float(np.sum(np.expm1(x)))
                else:
                    np.minimum(x, 0.0, out=x)
                    em1 += float(np.dot(p[slice(*self.bounds[k])], np.expm1(x)))
            log_mean = math.log1p(em1 / N)
        else:
            log_mean = math.log(Z / N)
        mu = Z1 / Z
        var = max(Z2 / Z - mu * mu, 0.0)
        term = theta2 * (M + log_mean)
        self.kl_weights = (M, Z, term)
        if lazy:
            self._lazy = (h, M, Z, mu)
            return h * r - term, r - mu, None, None
        return h * r - term, r - mu, Z3 / Z + var / theta2, None


    def _shift(self, h):
        """``l_h`` at the smallest margin (the largest ``l_h``: it does not increase with the
        margin), the shift of chi2's values; the oracle's range of the margins is read once
        (:attr:`LogisticOracle.margin_range`, which its table of steps reads too)."""
        oracle = self.oracle
        if oracle.margin_range is None:
            lo = math.inf
            for s, e in self.bounds:
                lo = min(lo, float(np.min(oracle._margins_of(slice(s, e)))))
            hi = -math.inf
            for s, e in self.bounds:
                hi = max(hi, float(np.max(oracle._margins_of(slice(s, e)))))
            oracle.margin_range = (lo, hi)
        lo = np.array([oracle.margin_range[0]])
        return float(logistic_dtransform(lo, oracle.c[:1], h)[0][0])

    def _chi2_at(self, h, r):
        """chi2 at ``h`` in one pass from the guess :attr:`alpha` (module docstring):
        per block, the sums over the rows surely active whatever alpha within
        :data:`CHI2_BAND` of the guess (``s0 = l_h - shift + alpha0`` above
        ``-2 theta2 + band``; the rows below ``-2 theta2 - band`` are surely not), and the
        rows in between kept one by one. alpha then follows from the active-set steps of
        :meth:`BlockwiseDual.chi2` on those sums, and every sum at alpha from the sums at
        ``alpha0`` (``s = s0 + (alpha - alpha0)``: polynomials in the difference, some 1e-12
        of ``s``). None when alpha leaves the band (the caller then sums as before)."""
        self.chi2_weights = None
        oracle, p, theta2 = self.oracle, self.p, self.theta2
        two = 2.0 * theta2
        shift = self._shift(h)
        a0 = self.alpha + shift  # the guess, shifted
        band = CHI2_BAND * (two + abs(a0))
        hi_thr, lo_thr = -two + band, -two - band
        # over the surely active rows: k, P, (unused), s0, s0^2, d1, d1^2, s0 d1, d2, s0 d2
        # (each times p with sample weights)
        acc = np.zeros(10)
        moved = 0.0
        edge: list = []
        # one compiled loop per block (logistic_kernels; None: NumPy's blocks): the sums over
        # the surely active rows and the edge's rows, their l_h and derivatives from the kept
        # steps and losses (d2l from s = t / T, as :meth:`curvature`)
        fused = getattr(oracle, "fused_rows", None) if p is None else None
        c0 = float(oracle.c[0])
        fused_got = self._fused_blocks(fused, h, MODE_CHI2, theta2, False, 0.0,
                                       (shift, a0, hi_thr, lo_thr))
        for (s, e), got in zip(self.bounds, fused_got):
            if got is not None:
                sums, near_rows = got
                acc += sums[:10]
                moved += sums[10]
                if near_rows.size:
                    loss, t = oracle.kept(h, slice(s, e))
                    te, d1e = t[near_rows], loss[near_rows]
                    lbe = h * d1e
                    lbe -= c0 * te * te
                    lbe -= shift
                    edge.append((lbe, d1e, uniform_d2(te / (h / (2.0 * c0)), c0, h), None))
                continue
            lb, d1, d2 = oracle.transform_rows(h, slice(s, e))[:3]
            pb = None if p is None else p[s:e]
            moved += float(np.sum(d1)) if pb is None else float(np.dot(pb, d1))
            ls = lb - shift
            s0 = ls + a0
            act = s0 > hi_thr
            if pb is not None:
                act &= pb > 0
            k = int(np.count_nonzero(act))
            if k < act.size:
                near = s0 > lo_thr
                near &= ~act
                if pb is not None:
                    near &= pb > 0
                if near.any():
                    edge.append((ls[near], d1[near], d2[near],
                                 None if pb is None else pb[near]))
                if not k:
                    continue
                # the inactive rows count as zeros (weights 0 or 1: products, no gathers)
                pb = act.astype(np.float64) if pb is None else pb * act
            if pb is None:
                acc += (k, k, 0.0, np.sum(s0), np.dot(s0, s0), np.sum(d1), np.dot(d1, d1),
                        np.dot(s0, d1), np.sum(d2), np.dot(s0, d2))
            else:
                ps0 = pb * s0
                pd1 = pb * d1
                acc += (k, np.sum(pb), 0.0, np.sum(ps0), np.dot(ps0, s0), np.sum(pd1),
                        np.dot(pd1, d1), np.dot(ps0, d1), np.dot(pb, d2), np.dot(ps0, d2))
        N = float(self.n) if p is None else 1.0
        self.moved = moved / self.n if p is None else moved
        if edge:
            ls_e, d1_e, d2_e = (np.concatenate([q[i] for q in edge]) for i in range(3))
            p_e = None if p is None else np.concatenate([q[3] for q in edge])
        else:
            ls_e = d1_e = d2_e = np.empty(0)
            p_e = None if p is None else np.empty(0)
        # sum p (l - shift) = sum p s0 - alpha0 P: (no cancellation that matters: an error of
        # 1e-16 |alpha0| P moves alpha by 1e-16 of itself)
        k0, P0 = float(acc[0]), float(acc[1])
        SL0 = float(acc[3]) - a0 * P0

        def active(alpha):  # (rows of the edge active at alpha, count, P, sum p (l - shift))
            on = ls_e + alpha > -two
            ke = int(np.count_nonzero(on))
            if p_e is None:
                return on, k0 + ke, P0 + ke, SL0 + float(np.sum(ls_e[on]))
            return on, k0 + ke, P0 + float(np.sum(p_e[on])), SL0 + float(np.dot(p_e[on],
                                                                                 ls_e[on]))

        # alpha by the active-set steps of BlockwiseDual.chi2 from the guess
        alpha, count, warm = a0, None, True
        for _ in range(CHI2_MAX_STEPS):
            on, k, P, SL = active(alpha)
            if not P > 0.0:
                return None
            if count is not None and k >= count:
                break
            left = warm and SL + alpha * P + two * (P - N) < 0.0
            count, warm = (None if left else k), False
            alpha = (two * (N - P) - SL) / P
        else:  # pragma: no cover - the sets shrink at every step
            return None
        da = alpha - a0
        if not abs(da) < band:  # rows counted as surely (in)active may not be
            self.alpha = alpha - shift
            return None
        on, k, P, _ = active(alpha)
        Ps = P0  # the surely active rows' mass
        S = float(acc[3]) + da * Ps
        S2 = float(acc[4]) + da * (2.0 * float(acc[3]) + da * Ps)
        sd, sdd = float(acc[5]), float(acc[6])
        swd = (float(acc[7]) + da * sd) / two + sd
        swd2 = (float(acc[9]) + da * float(acc[8])) / two + float(acc[8])
        if np.any(on):  # the edge's active rows, as block_chi2 sums them
            se = ls_e[on] + alpha
            d1o, d2o = d1_e[on], d2_e[on]
            we = se / two + 1.0
            po = np.ones(se.size) if p_e is None else p_e[on]
            S += float(np.dot(po, se))
            S2 += float(np.dot(po * se, se))
            swd += float(np.dot(po * we, d1o))
            swd2 += float(np.dot(po * we, d2o))
            sd += float(np.dot(po, d1o))
            sdd += float(np.dot(po * d1o, d1o))
        term = (S + S2 / (2.0 * two) - theta2 * (N - P)) / N - alpha
        mu = swd / N
        curv = (swd2 + max(sdd - sd * sd / P, 0.0) / two) / N
        self.alpha = alpha - shift
        self.chi2_weights = (shift, alpha, term + shift)
        return h * r - (term + shift), r - mu, curv, alpha - shift


def solve_at_root(oracle, n: int, h_c: float, r: float, theta2: float, divergence: str, *,
                  p=None, block: int = BLOCK, g_rtol: float = G_RTOL,
                  keep_values: bool = False, alpha: float | None = None
                  ) -> DualSolution | None:
    """The exact dual of a logistic ``oracle`` (``transform_rows(h, rows)``) solved from the
    binned root ``h_c`` (module docstring), or None: the caller then searches. ``p``: the
    sample probabilities (None: uniform); ``g_rtol``: the derivative accepted, relative to r;
    ``keep_values``: the oracle keeps each block's loss at the maximiser with its steps
    (``LogisticOracle.keep_values``, one more n-vector, for Q*'s build).
    ``info``: ``passes`` (the exact passes made), ``g`` (the derivative at ``h``: the most
    sensitive distribution there has the risk ``r - g``), ``moved`` (the P0-mean loss at the
    maximisers), ``kl_weights``, ``chi2_weights`` and ``unit_term`` (theta2 = inf: the
    P0-mean of ``l_h``, the term of the unit weights). ``alpha``: chi2's
    multiplier at ``h_c`` (not shifted, e.g.
    :func:`otstab_solvers.logistic_binned.binned_solution`'s),
    with which each pass sums chi2's terms once (``_Pass._chi2_at``) instead of keeping
    ``l_h`` and its derivatives (three n-vectors) for the active-set steps."""
    t0 = time.perf_counter()
    if not (h_c > 0.0 and math.isfinite(h_c)):
        return None
    run = _Pass(oracle, n, theta2, divergence, p, block, alpha)
    if keep_values:
        oracle.keep_values = True
    try:
        return _newton(run, h_c, r, g_rtol, t0)
    finally:  # (the pass's arrays: BlockwiseDual refers to itself, so not freed at once)
        run.store.clear()


def _newton(run, h_c, r, g_rtol, t0):
    """The steps of :func:`solve_at_root` from ``h_c``."""
    h = h_c
    for _ in range(MAX_NEWTON + 1):
        F, g, curv, alpha = run.at(h, r)
        if not (math.isfinite(F) and math.isfinite(g)):
            return None
        if abs(g) <= g_rtol * abs(r):
            return DualSolution(
                h=h, alpha=alpha, value=F, status=OPTIMAL, solver="dual",
                native_status="optimal (exact pass at the binned root)",
                iterations=run.passes, gap_bound=abs(h * g),
                solve_time=time.perf_counter() - t0,
                info={"passes": run.passes, "kl_weights": run.kl_weights, "g": g,
                      "moved": run.moved, "chi2_weights": run.chi2_weights,
                      "unit_term": run.unit_term})
        if curv is None:  # (not summed in the pass: from its kept steps, now needed)
            curv = run.curvature(h)
        if not curv > 0.0:
            return None
        h = h + g / curv
        if not (h > 0.0 and abs(h - h_c) <= WINDOW * h_c):
            return None
    return None
