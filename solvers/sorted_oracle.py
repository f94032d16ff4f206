"""Sorted two-piece oracles: each dual evaluation from prefix sums over one sort.

Two reduced forms that matter most have the shape ``l_h(z_i) = (A(h) u_i + B(h))_+``
("stay" is the zero piece, "move" is linear in a per-sample key ``u_i``):

- ``kind="hinge"``: a binary linear model with the hinge loss, ``u_i = 1 - m_i`` and
  ``l_h = max(0, u_i h + c h^2)`` with ``c = ||beta||^2 / (4 theta1)`` (``A = h, B = c h^2``);
- ``kind="distance"``: the 0/1 loss from distances, ``u_i = -a_i`` and
  ``l_h = (h - s a_i)_+`` with a scale ``s > 0`` (``A = s, B = h``; feature scores rescale one
  sorted array: ``a_ij = theta1 m_i^2 / beta_j^2``).

With ``u`` sorted once in decreasing order the samples on the "move" piece at any ``h`` are a
prefix, found by binary search, and the samples that switch piece between two values of ``h``
are a contiguous range. So:

- theta2 = inf and chi2 evaluations are O(log n): every sum they need (``sum l``, ``sum l^2``,
  ``sum l dl/dh``, ...) is a polynomial in ``A, B`` and the prefix sums of ``u`` and ``u^2``;
  chi2's ``alpha`` (MATH.md, Remark 5) is found by a binary search over the (already sorted)
  active set instead of a sort per evaluation;
- KL evaluations are one exp pass over the active prefix only;
- the kinks between two points are read off the sorted keys in O(1).

:func:`otstab_solvers.dual.solve_dual` evaluates a :class:`SortedTwoPiece` directly, and uses
an oracle's ``prefix`` attribute (one of these) when it has one.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SortedTwoPiece", "KL_BLOCK"]

#: keys per block of a KL evaluation (two buffers of 128 KB, kept in cache)
KL_BLOCK = 1 << 14


class _Keys:
    """The sorted keys of a :class:`SortedTwoPiece` (shared by its rescaled copies) and their
    prefix sums, computed on first use (KL evaluations away from ``A = 0`` never need them)."""

    @classmethod
    def of_sorted(cls, nu) -> _Keys:
        """The keys of an ascending ``nu`` (``-inf`` keys, i.e. ``+inf`` in nu, sort last)."""
        n_fin = int(np.searchsorted(nu, math.inf, side="left"))
        # the largest |key| is at one end of the finite, sorted keys
        umax = max(abs(float(nu[0])), abs(float(nu[n_fin - 1]))) if n_fin else 0.0
        return cls(nu, n_fin, umax)

    def __init__(self, nu, n_fin, umax):
        self.nu, self.n_fin, self.umax = nu, n_fin, umax
        self._prefix = None
        self.buffers = None  # the KL evaluations' scratch (SortedTwoPiece._kl_buffers)

    def u(self, k: int) -> float:
        """The k-th largest key (0-based): ``-nu[k]`` (negation is exact)."""
        return -float(self.nu[k])

    def head(self, q: int) -> np.ndarray:
        """The q largest keys in decreasing order (a new array ``-nu[:q]``)."""
        return np.negative(self.nu[:q])

    def prefix(self):
        """Prefix sums of the keys and of their squares (``cu[q]``: the sum of the first q),
        computed from ``nu`` in the output arrays (no n-sized temporary): the sums of
        ``-nu`` are the negated sums of ``nu``, exactly, and ``u^2 = nu^2``."""
        if self._prefix is None:
            n_fin, n = self.n_fin, self.nu.size
            nf = self.nu[:n_fin]
            cu = np.zeros(n + 1)
            cu2 = np.zeros(n + 1)
            np.cumsum(nf, out=cu[1:n_fin + 1])
            np.negative(cu, out=cu)
            np.square(nf, out=cu2[1:n_fin + 1])
            np.cumsum(cu2[1:n_fin + 1], out=cu2[1:n_fin + 1])
            self._prefix = (cu, cu2)
        return self._prefix


class SortedTwoPiece:
    """Prefix-sum reductions of ``l_h(z_i) = (A(h) u_i + B(h))_+`` (see the module docstring).

    It is itself an oracle :func:`otstab_solvers.dual.solve_dual` accepts (``n``, ``h_max``).

    Parameters
    ----------
    u : array (n,)
        The per-sample keys (``-inf`` allowed for samples that never move).
    kind : "hinge" or "distance"
    c : float
        The quadratic coefficient of the hinge kind (``>= 0``); unused for distances.
    scale : float
        The scale ``s > 0`` of the distance kind; unused for the hinge kind.
    presorted : bool
        ``u`` is already in decreasing order (skips the sort).
    tie : float
        Relative tolerance under which a sample counts as tied between its pieces (as
        :class:`otstab_solvers.dual.PiecewiseOracle`; for distances, relative to ``max(1, h)``).
    """

    h_max = math.inf

    def __init__(self, u, kind: str, c: float = 0.0, *, scale: float = 1.0, tie: float = 1e-12,
                 presorted: bool = False, _sorted=None):
        if kind not in ("hinge", "distance"):
            raise ValueError(f"kind must be 'hinge' or 'distance', got {kind!r}")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.kind = kind
        self.c = float(c)
        self.scale = float(scale)
        self.tie = tie
        if _sorted is None:
            nu = -np.asarray(u, dtype=np.float64)  # ascending -u
            if not presorted:
                nu.sort()
            _sorted = _Keys.of_sorted(nu)
        self._sorted = _sorted
        self.nu, self.n_fin, self.umax = _sorted.nu, _sorted.n_fin, _sorted.umax
        self.n = self.nu.size

    @classmethod
    def from_negated(cls, nu: np.ndarray, kind: str, c: float = 0.0, *, scale: float = 1.0,
                     tie: float = 1e-12) -> SortedTwoPiece:
        """The view of the keys ``u = -nu``, given negated in a float64 array that the view
        takes over and sorts in place (no copy: one n-vector in all)."""
        nu.sort()
        return cls(nu, kind, c, scale=scale, tie=tie, _sorted=_Keys.of_sorted(nu))

    @property
    def us(self) -> np.ndarray:
        """The keys in decreasing order (a new array ``-nu``: scalar reads use
        ``self._sorted.u(k)``, prefixes ``self._sorted.head(q)``)."""
        return self._sorted.head(self.n)

    @property
    def cu(self) -> np.ndarray:
        """Prefix sums of the sorted keys (``cu[q]``: the sum of the first q; built on first
        use, shared with the oracles made by :meth:`with_c` / :meth:`with_scale`)."""
        return self._sorted.prefix()[0]

    @property
    def cu2(self) -> np.ndarray:
        """Prefix sums of the squared sorted keys."""
        return self._sorted.prefix()[1]

    def with_c(self, c: float) -> SortedTwoPiece:
        """The same sorted keys with another hinge coefficient ``c`` (no new sort)."""
        return SortedTwoPiece(None, self.kind, c, scale=self.scale, tie=self.tie,
                              _sorted=self._sorted)

    def with_scale(self, scale: float) -> SortedTwoPiece:
        """The same sorted keys with another distance scale ``s`` (no new sort)."""
        return SortedTwoPiece(None, self.kind, self.c, scale=scale, tie=self.tie,
                              _sorted=self._sorted)

    # -- the pieces ---------------------------------------------------------------------------
    def coefficients(self, h: float):
        """``(A, B, A', B', d2)``: l = A u + B, dl/dh = A' u + B', d2l/dh2 = d2 on the prefix."""
        if self.kind == "hinge":
            c = self.c
            return h, c * h * h, 1.0, 2.0 * c * h, 2.0 * c
        return self.scale, h, 0.0, 1.0, 0.0

    def count(self, h: float, side: str = "right") -> int:
        """How many samples are on the "move" piece at ``h`` (ties: right = move, left = stay)."""
        A, B, dA, dB, _ = self.coefficients(h)
        nu = self.nu[:self.n_fin]
        if A == 0.0:  # every l is B = 0: the piece with the larger (right) derivative wins
            if dA == 0.0:
                return self.n_fin if (dB > 0) == (side == "right") else 0
            return int(np.searchsorted(nu, dB / dA, side="left")) if side == "right" else 0
        if self.kind == "hinge":
            tol = self.tie * (1.0 + h * self.umax + self.c * h * h)
        else:  # a kink h = s * nu_i need not give back nu_i exactly when divided by s
            tol = self.tie * max(1.0, h)
        if side == "right":  # A u + B >= -tol  <=>  -u <= (B + tol) / A
            return int(np.searchsorted(nu, (B + tol) / A, side="right"))
        return int(np.searchsorted(nu, (B - tol) / A, side="left"))

    def kink(self, i: int) -> float:
        """The h at which sample ``i`` (in sorted order) switches piece."""
        v = float(self.nu[i])
        return v / self.c if self.kind == "hinge" else v * self.scale

    def kinks_between(self, p_lo: int, p_hi: int, h_lo: float, h_hi: float):
        """(count, smallest, largest, middle) of the kinks strictly inside ``(h_lo, h_hi)`` of
        the samples that switch between the two points (sorted positions ``p_lo..p_hi``)."""
        if p_hi <= p_lo or (self.kind == "hinge" and self.c <= 0.0):
            return 0, math.nan, math.nan, math.nan
        seg = self.nu[p_lo:p_hi]
        f = self.c if self.kind == "hinge" else 1.0 / self.scale  # kink > h <=> nu > f h
        i0 = p_lo + int(np.searchsorted(seg, h_lo * f, side="right"))
        i1 = p_lo + int(np.searchsorted(seg, h_hi * f, side="left"))
        while i0 < i1 and not self.kink(i0) > h_lo:
            i0 += 1
        while i1 > i0 and not self.kink(i1 - 1) < h_hi:
            i1 -= 1
        if i1 <= i0:
            return 0, math.nan, math.nan, math.nan
        return i1 - i0, self.kink(i0), self.kink(i1 - 1), self.kink((i0 + i1 - 1) // 2)

    # -- prefix sums --------------------------------------------------------------------------
    def _head_sums(self, q: int):
        """(sum, sum of squares) of the first q sorted keys: from the prefix sums when they
        exist, else directly (one pass over the q keys, no n-sized arrays)."""
        if self._sorted._prefix is not None:
            return float(self.cu[q]), float(self.cu2[q])
        head = self.nu[:q]  # -u
        return -float(np.sum(head)), float(np.dot(head, head))

    def _sums(self, q: int, A, B, dA, dB):
        """Sums over the first q sorted samples of l, l^2, d, d^2 and l d, where l = A u + B
        and d = A' u + B'."""
        s1, s2 = float(self.cu[q]), float(self.cu2[q])
        sl = A * s1 + q * B
        sl2 = A * A * s2 + 2.0 * A * B * s1 + q * B * B
        sd = dA * s1 + q * dB
        sd2 = dA * dA * s2 + 2.0 * dA * dB * s1 + q * dB * dB
        sld = A * dA * s2 + (A * dB + B * dA) * s1 + q * B * dB
        return sl, max(sl2, 0.0), sd, max(sd2, 0.0), sld

    def reduce(self, h: float, side: str, theta2: float, divergence: str):
        """``(term, mu, curv, alpha, p)`` at ``h``: the dual's divergence term, the weighted
        mean derivative ``E_w[dl/dh]``, the dual's curvature, chi2's alpha and the prefix
        length ``p`` (the kink key). Same quantities as the dense reduction in ``dual``."""
        n = self.n
        p = self.count(h, side)
        A, B, dA, dB, d2 = self.coefficients(h)
        if math.isinf(theta2):
            sl, _, sd, _, _ = self._sums(p, A, B, dA, dB)
            return sl / n, sd / n, d2 * p / n, None, p
        if divergence == "kl":
            return (*self._kl(p, A, B, dA, dB, d2, theta2), None, p)
        return (*self._chi2(p, A, B, dA, dB, d2, theta2), p)

    def _kl(self, p, A, B, dA, dB, d2, theta2):
        """KL's ``(term, mu, curv)`` from one pass over the active prefix in blocks of
        :data:`KL_BLOCK` keys (two cache-sized buffers, no n-sized temporary): per block the
        exponents ``(l - max l) / theta2``, their exps and the sums ``Z1 = sum e``,
        ``sum e (nu - c)`` and ``sum e (nu - c)^2`` about the prefix's middle key ``c`` (the
        curvature, which only steers Newton, from these); a second pass sums ``expm1`` only
        when every weight is close to one (``Z > n / 2``)."""
        n = self.n
        if p == 0:
            return 0.0, 0.0, 0.0
        nu_all = self.nu  # -u, increasing: the passes work on it (no copy of u)
        top = (-A * float(nu_all[0]) + B) / theta2  # largest l / theta2 (u is decreasing)
        M = max(top, 0.0)
        c = float(nu_all[(p - 1) // 2])
        if A == 0.0:
            e_val = math.exp(max(B / theta2 - M, -700.0))
            s1, s2 = self._head_sums(p)  # sums of u and u^2
            Z1 = e_val * p
            S1 = e_val * (-s1 - p * c)  # sum e (nu - c)
            S2 = e_val * (s2 + 2.0 * c * s1 + p * c * c)
        else:
            x, e = self._kl_buffers()
            Z1 = S1 = S2 = 0.0
            for s in range(0, p, KL_BLOCK):
                nb = nu_all[s:min(s + KL_BLOCK, p)]
                xb, eb = self._exponents(nb, A, B, theta2, M, x), e[:nb.size]
                np.exp(xb, out=eb)
                Z1 += float(eb.sum())
                dev = np.subtract(nb, c, out=xb)
                S1 += float(eb @ dev)
                np.multiply(eb, dev, out=eb)
                S2 += float(eb @ dev)
        e0 = math.exp(max(-M, -700.0))
        Z = Z1 + (n - p) * e0
        Zu = -(S1 + c * Z1)  # sum e u
        mu = (dA * Zu + dB * Z1) / Z
        if Z > 0.5 * n:
            # every l / theta2 is close to the largest: log(Z / n) would keep only the rounding
            # of Z / n ~ 1 (times theta2); sum expm1 instead (one more pass over the prefix)
            if A == 0.0:
                zm1 = p * math.expm1(max(B / theta2 - M, -700.0))
            else:
                zm1 = 0.0
                for s in range(0, p, KL_BLOCK):
                    nb = nu_all[s:min(s + KL_BLOCK, p)]
                    xb = self._exponents(nb, A, B, theta2, M, x)
                    zm1 += float(np.sum(np.expm1(xb, out=xb)))
            log_mean = math.log1p((zm1 + (n - p) * math.expm1(-M)) / n)
        else:
            log_mean = math.log(Z / n)
        # the spread of dl/dh = dA u + dB = dA (c - nu) + (dB - dA c) about mu under the
        # weights: the prefix's (about c), then the stay samples' (dl/dh = 0)
        t0 = dB - dA * c - mu  # dl/dh - mu at nu = c
        var_p = dA * dA * S2 - 2.0 * dA * t0 * S1 + t0 * t0 * Z1
        var = (max(var_p, 0.0) + (n - p) * e0 * mu * mu) / Z
        term = theta2 * (M + log_mean)
        curv = d2 * Z1 / Z + var / theta2
        return term, mu, curv

    def _kl_buffers(self):
        """Two scratch buffers of :data:`KL_BLOCK` floats, kept between evaluations."""
        buf = self._sorted.buffers
        if buf is None:
            buf = self._sorted.buffers = (np.empty(KL_BLOCK), np.empty(KL_BLOCK))
        return buf

    @staticmethod
    def _exponents(nb, A, B, theta2, M, buf):
        """``(l - max l) / theta2`` of the keys ``nb`` (``l = A u + B``, ``u = -nb``), clamped
        to [-700, 0] (rounding can put the largest a hair above 0), in ``buf``."""
        x = np.multiply(nb, -A, out=buf[:nb.size])
        x += B
        x /= theta2
        x -= M
        np.clip(x, -700.0, 0.0, out=x)
        return x

    def _v(self, k: int, p: int, A, B, theta2):
        """The k-th largest (1-based) of l / (2 theta2)."""
        return (A * self._sorted.u(k - 1) + B) / (2.0 * theta2) if k <= p else 0.0

    def _chi2(self, p, A, B, dA, dB, d2, theta2):
        n = self.n
        two = 2.0 * theta2

        def alpha_at(k):
            # with the top k active: sum_{top k} (l_i + alpha + 2 theta2) = 2 theta2 n (in
            # alpha itself: beta = alpha / (2 theta2) + 1 rounds near 1 for large theta2)
            q = min(k, p)
            return (two * (n - k) - (A * float(self.cu[q]) + q * B)) / k

        def valid(k):
            # l_k + alpha_k + 2 theta2 > 0  <=>  2 theta2 n > sum_{top k} l - k l_k (exact at k=1)
            q = min(k, p)
            lk = A * self._sorted.u(k - 1) + B if k <= p else 0.0
            return two * n > (A * float(self.cu[q]) + q * B) - k * lk

        # the weights are positive on the top-kk values; validity is monotone in k
        if valid(n):
            kk = n
        else:
            lo, hi = 1, n
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if valid(mid):
                    lo = mid
                else:
                    hi = mid
            kk = lo
        alpha = alpha_at(kk)
        b = alpha / two + 1.0
        q = min(kk, p)
        sl, sl2, sd, sd2, sld = self._sums(q, A, B, dA, dB)
        # theta2 (w^2 - 1) = (l + alpha) + (l + alpha)^2 / (4 theta2) on the active samples,
        # -theta2 on the others: no cancellation for large theta2
        s_act = sl + kk * alpha
        s2_act = max(sl2 + 2.0 * alpha * sl + kk * alpha * alpha, 0.0)
        term = (s_act + s2_act / (2.0 * two) - theta2 * (n - kk)) / n - alpha
        mu = (sld / two + b * sd) / n
        sw = sl / two + q * b
        var_sum = max(sd2 - sd * sd / kk, 0.0)
        curv = (d2 * sw + var_sum / two) / n
        return term, mu, curv, alpha

    # -- the most sensitive distribution, summarised ------------------------------------------
    def weights_prefix(self, h: float, q: int, theta2: float, divergence: str) -> np.ndarray:
        """The weights ``w_i`` (mean one over all n samples) of the first ``q`` sorted samples
        at ``h``, where ``q`` is at least the number on the "move" piece."""
        p = self.count(h, "right")
        A, B, dA, dB, d2 = self.coefficients(h)
        u = self._sorted.head(q)
        lh = np.maximum(u * A + B, 0.0) if q else np.zeros(0)
        if math.isinf(theta2):
            return np.ones(q)
        if divergence == "kl":
            term = self._kl(p, A, B, dA, dB, d2, theta2)[0]
            # w_i = exp(l_i / theta2) / mean_j exp(l_j / theta2) = exp((l_i - term) / theta2)
            return np.exp(np.maximum((lh - term) / theta2, -700.0))
        alpha = self._chi2(p, A, B, dA, dB, d2, theta2)[3]
        return np.maximum((lh + alpha) / (2.0 * theta2) + 1.0, 0.0)

    def risk_parts(self, h: float, theta2: float, divergence: str):
        """``(lo, hi, moved_lo, moved_hi)``: the risk of the most sensitive distribution at
        ``h`` (weighted mean loss of the moved points) with every tied sample staying (lo) or
        moving (hi), and the same means without the weights (moving alone)."""
        n = self.n
        p_l, p_r = self.count(h, "left"), self.count(h, "right")
        if p_r == 0:
            return 0.0, 0.0, 0.0, 0.0
        _, _, dA, dB, _ = self.coefficients(h)
        d = self._sorted.head(p_r) * dA + dB  # loss at the moved point of the moving samples
        w = self.weights_prefix(h, p_r, theta2, divergence)
        wd = w * d
        lo, tie_w = float(wd[:p_l].sum()), float(wd[p_l:].sum())
        mlo, tie_m = float(d[:p_l].sum()), float(d[p_l:].sum())
        return lo / n, (lo + tie_w) / n, mlo / n, (mlo + tie_m) / n
