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

A *window* (:meth:`SortedTwoPiece.window`) serves the evaluations (chi2's when its front ends
before chi2's active set does: :class:`WindowMiss` otherwise) at the
``h`` of one bracket ``[h_lo, h_hi]`` only, without sorting every key: the samples that move at
every ``h`` of the bracket (``A``) are kept unsorted in front, those that switch piece inside it
(``B``) sorted after them, and those that move at none (``C``) are only counted. Every count,
sum and kink inside the bracket is then the one of the fully sorted view; one sort of ``B``
replaces the sort of all n keys (:func:`otstab_solvers.dual.solve_two_piece`). With the
compiled kernels ``A`` need not be stored either (:class:`_Front`: its keys recomputed from
the rows where a pass reads them; the view holds ``B`` alone).

:func:`otstab_solvers.dual.solve_dual` evaluates a :class:`SortedTwoPiece` directly, and uses
an oracle's ``prefix`` attribute (one of these) when it has one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import sorted_kernels as kernels
from .weights import phi

__all__ = ["SortedTwoPiece", "KeyRule", "KL_BLOCK", "window_thresholds", "WindowMiss"]

#: keys per block of a KL evaluation (two buffers of 128 KB, kept in cache)
KL_BLOCK = 1 << 14
#: keys per block of the blocked prefix sums (:meth:`_Keys.at`): one sum per block is kept,
#: and the keys up to a position inside a block are summed when asked (at most this many)
PREFIX_BLOCK = 256
#: the sums of this many recent KL passes are kept for :meth:`SortedTwoPiece.moving_sums`
_KL_SUMS_KEPT = 4
#: a KL evaluation sums ``expm1`` in a second pass (instead of taking ``log(Z / n)``) only when
#: ``Z / n``, the mean of the shifted weights, is within this share of one (see :meth:`_kl`)
EXPM1_SHARE = 1.0 / 16.0


class WindowMiss(ValueError):
    """A window cannot evaluate a point: chi2's active set ends inside its unsorted front, or
    a key it needs lies in a front computed from the rows (not stored)."""


@dataclass
class _Front:
    """A window's front (the keys below ``a_thr``: moving at every ``h`` of its bracket)
    computed from the rows where it is read instead of stored: ``rows = (y, s, b,
    residual)``, the negated keys ``y s - b`` (or ``(y - s) - b``) of every row
    (:func:`otstab_solvers.sorted_kernels.partition_rows`'s arithmetic); its count, sums of
    ``nu`` and ``nu^2``, smallest and largest key from the pass that found it."""

    rows: tuple
    a_thr: float
    count: int
    sum_nu: float
    sum_nu2: float
    nu_min: float
    nu_max: float

    def blocks(self):
        """``(position, keys)``: the front's keys in row order, a block of rows at a time
        (NumPy: ``AffineRows.negated_piece``'s operations), positions from 0."""
        y, s, b, residual = self.rows
        buf = np.empty(KL_BLOCK)
        pos = 0
        for i in range(0, s.size, KL_BLOCK):
            j = min(i + KL_BLOCK, s.size)
            out = buf[:j - i]
            if residual:
                np.subtract(y[i:j], s[i:j], out=out)
            else:
                np.multiply(y[i:j], s[i:j], out=out)
            out -= b
            nb = out[out < self.a_thr]
            if nb.size:
                yield pos, nb
                pos += nb.size


class _Keys:
    """The sorted keys of a :class:`SortedTwoPiece` (shared by its rescaled copies) and their
    prefix sums, computed on first use (KL evaluations away from ``A = 0`` never need them)."""

    @classmethod
    def of_sorted(cls, nu) -> _Keys:
        """The keys of an ascending ``nu`` (``-inf`` keys, i.e. ``+inf`` in nu, sort last)."""
        n_fin = int(nu.searchsorted(math.inf, side="left"))
        # the largest |key| is at one end of the finite, sorted keys
        umax = max(abs(float(nu[0])), abs(float(nu[n_fin - 1]))) if n_fin else 0.0
        return cls(nu, n_fin, umax)

    def __init__(self, nu, n_fin, umax, front_max=None, sorted_from=0, front=None):
        self.nu, self.n_fin, self.umax = nu, n_fin, umax
        # a window's unsorted front: its length and its largest key (0 and None: every key
        # sorted)
        self.sorted_from, self.front_max = sorted_from, front_max
        #: a front computed from the rows instead of stored (:class:`_Front`; None: stored,
        #: ``nu`` holds it): ``nu`` then holds the sorted keys alone, the positions from
        #: ``base`` on
        self.front = front
        self.base = sorted_from if front is not None else 0
        self._prefix = None
        self._blocked = None  # (sums of the keys and squares before each block, the front's)
        self.buffers = None  # the KL evaluations' scratch (SortedTwoPiece._kl_buffers)

    def u(self, k: int) -> float:
        """The k-th largest key (0-based): ``-nu[k]`` (negation is exact)."""
        if k < self.base:  # (WindowMiss: a window's solve then sorts every key instead)
            raise WindowMiss(f"key {k} is in a front computed from the rows (not stored)")
        return -float(self.nu[k - self.base])

    def head(self, q: int) -> np.ndarray:
        """The q largest keys in decreasing order (a new array ``-nu[:q]``)."""
        if self.base:
            raise WindowMiss("the keys of a front computed from the rows are not stored")
        return np.negative(self.nu[:q])

    def prefix(self):
        """Prefix sums of the keys and of their squares (``cu[q]``: the sum of the first q),
        computed from ``nu`` in the output arrays (no n-sized temporary): the sums of
        ``-nu`` are the negated sums of ``nu``, exactly, and ``u^2 = nu^2``. A window's are
        those of its sorted part, after the sums of its front (:meth:`at`)."""
        if self._prefix is None:
            if self.base:
                raise ValueError("the keys of a front computed from the rows are not stored")
            lo, n_fin = self.sorted_from, self.n_fin
            nf = self.nu[lo:n_fin]
            cu = np.zeros(n_fin - lo + 1 if lo else self.nu.size + 1)
            cu2 = np.zeros(cu.size)
            np.cumsum(nf, out=cu[1:nf.size + 1])
            np.negative(cu, out=cu)
            np.square(nf, out=cu2[1:nf.size + 1])
            np.cumsum(cu2[1:nf.size + 1], out=cu2[1:nf.size + 1])
            front = self.nu[:lo]
            self._front = (-float(np.sum(front)), float(np.dot(front, front)))
            self._prefix = (cu, cu2)
        return self._prefix

    def blocked(self):
        """Blocked prefix sums: the sums of the keys ``u`` and of their squares before each
        block of :data:`PREFIX_BLOCK` sorted keys (a window: of its sorted part), and the
        front's sums; ``n / 128`` numbers instead of the ``2 n`` of :meth:`prefix`."""
        if self._blocked is None:
            lo, n_fin = self.sorted_from, self.n_fin
            nf = self.nu[lo - self.base:n_fin - self.base]
            nb = nf.size // PREFIX_BLOCK
            full = nf[:nb * PREFIX_BLOCK].reshape(nb, PREFIX_BLOCK)
            c1 = np.zeros(nb + 1)
            c2 = np.zeros(nb + 1)
            np.cumsum(full.sum(axis=1), out=c1[1:])
            np.negative(c1, out=c1)  # sums of u = -nu
            np.cumsum(np.einsum("ij,ij->i", full, full), out=c2[1:])
            if self.front is not None:  # (its sums from the pass that found it)
                fs = (-self.front.sum_nu, self.front.sum_nu2)
            else:
                front = self.nu[:lo]
                fs = (-float(np.sum(front)), float(np.dot(front, front)))
            self._blocked = (c1, c2, fs)
        return self._blocked

    def at(self, q: int, squares: bool = True) -> tuple[float, float]:
        """``(sum u, sum u^2)`` over the first ``q`` keys (of a window: ``q`` at least its
        front, which every count inside its bracket is), from the blocked prefix sums and at
        most :data:`PREFIX_BLOCK` keys (``squares=False``: the second is 0.0, not summed)."""
        c1, c2, front = self.blocked()
        lo = self.sorted_from
        if lo and q < lo:
            raise ValueError(f"the sums of the first {q} keys of a window that sorts from {lo}")
        k = q - lo
        if k > self.n_fin - lo:  # (as the full prefix arrays: 0 past the finite keys)
            return 0.0, 0.0
        j = k // PREFIX_BLOCK
        rest = self.nu[lo - self.base + j * PREFIX_BLOCK:lo - self.base + k]
        s1 = float(c1[j]) - float(np.sum(rest))
        s2 = float(c2[j]) + float(np.dot(rest, rest)) if squares else 0.0
        if not lo:
            return s1, s2
        return front[0] + s1, front[1] + s2


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
        :class:`otstab_solvers.dual.PiecewiseOracle`; for distances, relative to ``h``).

    A window (:meth:`window`) also has ``domain = (h_lo, h_hi)``, the total ``n`` (beyond the
    keys it holds) and ``sorted_from`` (its unsorted front ``A``); the full view has
    ``domain = None`` and ``sorted_from = 0``.
    """

    domain: tuple[float, float] | None = None
    sorted_from = 0

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
        #: positions before ``nu[0]`` (a front computed from the rows: :class:`_Front`)
        self._base = _sorted.base
        #: the sums of recent KL passes that :meth:`moving_sums` reads again (``_kl``)
        self._kl_sums: dict = {}
        #: the local model of recent KL evaluations that :meth:`model_step` reads
        #: (``(h, side) -> (p, slope of the curvature, jump of mu per kink)``)
        self._kl_models: dict = {}

    @classmethod
    def window(cls, fill, n: int, c: float, h_lo: float, h_hi: float, umax: float, *,
               size: int | None = None, block: int = KL_BLOCK, tie: float = 1e-12,
               front_below: float | None = None, rows=None,
               front_rows: bool = False) -> SortedTwoPiece:
        """The hinge view ``l_h = max(0, u h + c h^2)`` for ``h`` in ``[h_lo, h_hi]`` only
        (``0 < h_lo < h_hi``, ``c > 0``), built without sorting all n keys.

        ``fill(i, j, out)`` writes the negated keys ``-u`` of samples ``i..j`` into ``out``;
        ``umax`` is the largest ``|u|`` over all samples (the scale of the tie tolerance, as in
        the full view). One pass over blocks of samples writes ``A`` (always moving in the
        bracket; unsorted, its smallest key first) and ``B`` (sorted afterwards) into one
        array; the ``C`` samples, moving nowhere in the bracket, are only counted (like
        ``-inf`` keys of the full view). ``size``: an estimate of ``|A| + |B|`` (from a
        subsample) the array is allocated with; without it, or when it proves too small, a
        counting pass comes first. Evaluations outside the bracket raise ``ValueError``.
        ``front_below``: only the keys ``nu`` below it (and below ``A``'s threshold) go to the
        unsorted front, the others of ``A`` are sorted with ``B`` (chi2: the keys where its
        active set may end, :meth:`_chi2`). ``rows = (y, s, b, residual)``: the keys that
        ``fill`` writes are ``y s - b`` (or ``(y - s) - b``) of each row, which the compiled
        partition computes itself (:func:`otstab_solvers.sorted_kernels.partition_rows`: the
        same numbers, no block written first). ``front_rows`` (with ``rows`` and the kernels):
        the front is not stored but computed from the rows where a pass reads it
        (:class:`_Front`): the view holds ``B`` alone (up to 0.9 n fewer keys at n = 1e6).
        """
        if not (0.0 < h_lo < h_hi < math.inf) or not c > 0.0:
            raise ValueError(f"a window needs 0 < h_lo < h_hi < inf and c > 0, got "
                             f"[{h_lo}, {h_hi}], c = {c}")
        a_thr, c_thr = window_thresholds(c, h_lo, h_hi, umax, tie)
        if front_below is not None:
            a_thr = min(a_thr, float(front_below))
        m = min(block, n)
        buf, ina, le = np.empty(m), np.empty(m, dtype=bool), np.empty(m, dtype=bool)
        spans = [(i, min(i + block, n)) for i in range(0, n, block)]

        def count():
            total = 0
            for i, j in spans:
                total += int(np.count_nonzero(fill(i, j, buf[:j - i]) <= c_thr))
            return total

        def write(size):
            """(keys, |A|) in an array of ``size`` keys, or None when they do not fit."""
            nu = np.empty(size)
            ia, b_parts = 0, []
            for i, j in spans:
                nb = fill(i, j, buf[:j - i])
                a, b = ina[:j - i], le[:j - i]
                np.less(nb, a_thr, out=a)
                k = int(np.count_nonzero(a))
                if ia + k > size:
                    return None
                if k:
                    np.compress(a, nb, out=nu[ia:ia + k])
                    ia += k
                np.less_equal(nb, c_thr, out=b)
                if int(np.count_nonzero(b)) > k:  # B = (nu <= c_thr) and not A (A is in it)
                    np.not_equal(b, a, out=b)
                    b_parts.append(nb[b])
            n_b = sum(part.size for part in b_parts)
            if ia + n_b > size:
                return None
            if n_b:
                nu[ia:ia + n_b] = np.concatenate(b_parts)
            nu.resize(ia + n_b, refcheck=False)  # the estimate's spare room given back
            return nu, ia

        def partition(size):
            """:func:`write` by the compiled partition (``B`` written from the back of the
            array, in reverse, then moved behind ``A``: one loop over each block)."""
            nu = np.empty(size)
            ia = ib = 0
            for i, j in spans:
                ia, ib = kernels.window_partition(fill(i, j, buf[:j - i]), a_thr, c_thr, nu,
                                                  ia, ib)
                if ia + ib > size:
                    return None
            if ib:
                nu[ia:ia + ib] = nu[size - ib:size]  # (overlapping: NumPy copies through a buffer)
            nu.resize(ia + ib, refcheck=False)
            return nu, ia

        def partition_rows(size):
            """:func:`partition` over the rows themselves (one compiled loop)."""
            nu = np.empty(size)
            y, s, b, residual = rows
            ia, ib = kernels.partition_rows(y, s, b, residual, a_thr, c_thr, nu)
            if ia + ib > size:
                return None
            if ib:
                nu[ia:ia + ib] = nu[size - ib:size]
            nu.resize(ia + ib, refcheck=False)
            return nu, ia

        def count_rows():
            y, s, b, residual = rows
            return sum(kernels.partition_rows(y, s, b, residual, a_thr, c_thr, np.empty(0)))

        if front_rows and rows is not None and kernels.use_kernel(n):
            return cls._window_front_rows(rows, n, c, h_lo, h_hi, umax, a_thr, c_thr, size,
                                          tie)
        if kernels.use_kernel(n):
            write = partition  # noqa: F811 - the same keys, in one compiled loop per block
            if rows is not None:
                write, count = partition_rows, count_rows  # noqa: F811
        got = write(size) if size is not None and size >= 0 else None
        if got is None:
            got = write(count())
        nu, n_a = got
        nu[n_a:].sort()
        front_max = None
        if n_a:
            front_max = float(nu[:n_a].max())
            k = int(np.argmin(nu[:n_a]))  # the largest key first: the KL pass reads its
            nu[0], nu[k] = nu[k], nu[0]    # largest l_h there
        view = cls(nu, "hinge", c, tie=tie,
                   _sorted=_Keys(nu, nu.size, float(umax), front_max, n_a))
        view.n, view.sorted_from, view.domain = int(n), n_a, (float(h_lo), float(h_hi))
        return view

    @classmethod
    def _window_front_rows(cls, rows, n, c, h_lo, h_hi, umax, a_thr, c_thr, size,
                           tie) -> SortedTwoPiece:
        """:meth:`window` with its front computed from the rows (:class:`_Front`)."""
        n_a, sum_nu, sum_nu2, nu_min, nu_max = kernels.front_moments(rows, a_thr)
        room = max((size if size is not None and size >= 0 else n) - n_a, 0) + 1024
        nu = np.empty(min(room, n))
        n_b = kernels.b_keys(rows, a_thr, c_thr, nu)
        if n_b > nu.size:  # (the estimate was too small: the count is exact now)
            nu = np.empty(n_b)
            kernels.b_keys(rows, a_thr, c_thr, nu)
        nu.resize(n_b, refcheck=False)
        nu.sort()
        front = _Front(rows, float(a_thr), int(n_a), float(sum_nu), float(sum_nu2),
                       float(nu_min), float(nu_max)) if n_a else None
        view = cls(nu, "hinge", c, tie=tie,
                   _sorted=_Keys(nu, n_a + n_b, float(umax), float(nu_max) if n_a else None,
                                 n_a, front))
        view.n, view.sorted_from, view.domain = int(n), n_a, (float(h_lo), float(h_hi))
        return view

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
        self._whole("cu")
        return self._sorted.prefix()[0]

    @property
    def cu2(self) -> np.ndarray:
        """Prefix sums of the squared sorted keys."""
        self._whole("cu2")
        return self._sorted.prefix()[1]

    def with_c(self, c: float) -> SortedTwoPiece:
        """The same sorted keys with another hinge coefficient ``c`` (no new sort)."""
        self._whole("with_c")
        return SortedTwoPiece(None, self.kind, c, scale=self.scale, tie=self.tie,
                              _sorted=self._sorted)

    def with_scale(self, scale: float) -> SortedTwoPiece:
        """The same sorted keys with another distance scale ``s`` (no new sort)."""
        self._whole("with_scale")
        return SortedTwoPiece(None, self.kind, self.c, scale=scale, tie=self.tie,
                              _sorted=self._sorted)

    def _whole(self, what: str) -> None:
        """Refuse an operation that needs every key sorted on a window."""
        if self.domain is not None:
            raise ValueError(f"{what} needs the fully sorted view, not a window")

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
        lo = self.sorted_from
        if self.domain is not None and not self.domain[0] <= h <= self.domain[1]:
            raise ValueError(f"h = {h!r} is outside this window's bracket {self.domain}")
        nu = self.nu[lo - self._base:self.n_fin - self._base]
        if A == 0.0:  # every l is B = 0: the piece with the larger (right) derivative wins
            if dA == 0.0:
                return self.n_fin if (dB > 0) == (side == "right") else 0
            return lo + int(nu.searchsorted(dB / dA, side="left")) if side == "right" \
                else 0
        left, right = self.thresholds(h)
        if side == "right":
            return lo + int(nu.searchsorted(right, side="right"))
        return lo + int(nu.searchsorted(left, side="left"))

    def thresholds(self, h: float) -> tuple[float, float]:
        """``(left, right)`` at ``h > 0``: a sample is on the "move" piece on both sides of
        ``h`` when its negated key ``nu < left``, on the right side when ``nu <= right``
        (tied between ``left`` and ``right``): ``A u + B`` above ``tol``, or at least
        ``-tol``, the tie tolerance of :class:`otstab_solvers.dual.PiecewiseOracle`."""
        A, B = self.coefficients(h)[:2]
        if self.kind == "hinge":
            # relative to the size of the terms of ``u h + c h^2`` (no absolute part: at a
            # small h an absolute tolerance would tie samples whose kinks lie far from h)
            tol = self.tie * (h * self.umax + self.c * h * h)
        else:  # a kink h = s * nu_i need not give back nu_i exactly when divided by s
            tol = self.tie * h
        return (B - tol) / A, (B + tol) / A

    def kink(self, i: int) -> float:
        """The h at which sample ``i`` (in sorted order) switches piece."""
        if i < self._base:
            raise ValueError(f"key {i} is in a front computed from the rows (not stored)")
        v = float(self.nu[i - self._base])
        return v / self.c if self.kind == "hinge" else v * self.scale

    def kinks_between(self, p_lo: int, p_hi: int, h_lo: float, h_hi: float):
        """(count, smallest, largest, middle) of the kinks strictly inside ``(h_lo, h_hi)`` of
        the samples that switch between the two points (sorted positions ``p_lo..p_hi``)."""
        if p_hi <= p_lo or (self.kind == "hinge" and self.c <= 0.0):
            return 0, math.nan, math.nan, math.nan
        seg = self.nu[p_lo - self._base:p_hi - self._base]
        f = self.c if self.kind == "hinge" else 1.0 / self.scale  # kink > h <=> nu > f h
        i0 = p_lo + int(seg.searchsorted(h_lo * f, side="right"))
        i1 = p_lo + int(seg.searchsorted(h_hi * f, side="left"))
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
        if self._sorted._blocked is not None or self._base:
            return self._sorted.at(q)
        head = self.nu[:q]  # -u
        return -float(np.sum(head)), float(np.dot(head, head))

    def _sums(self, q: int, A, B, dA, dB):
        """Sums over the first q sorted samples of l, l^2, d, d^2 and l d, where l = A u + B
        and d = A' u + B'."""
        s1, s2 = self._sorted.at(q)
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
            term, mu, curv = self._kl(p, A, B, dA, dB, d2, theta2)
            if self._kl_last is not None:
                if len(self._kl_models) >= _KL_SUMS_KEPT:
                    self._kl_models.pop(next(iter(self._kl_models)))
                self._kl_models[(h, side)] = (p, *self._kl_last)
            return term, mu, curv, None, p
        return (*self._chi2(p, A, B, dA, dB, d2, theta2), p)

    def _kl(self, p, A, B, dA, dB, d2, theta2):
        """KL's ``(term, mu, curv)`` from one pass over the active prefix in blocks of
        :data:`KL_BLOCK` keys (two cache-sized buffers, no n-sized temporary): per block the
        exponents ``(l - max l) / theta2``, their exps and the sums ``Z1 = sum e``,
        ``sum e (nu - c)`` and ``sum e (nu - c)^2`` about the prefix's middle key ``c`` (the
        curvature, which only steers Newton, from these); a second pass sums ``expm1`` only
        when every weight is close to one (``Z > n / 2``)."""
        n = self.n
        self._kl_last = None
        if p == 0:
            return 0.0, 0.0, 0.0
        nu_all = self.nu  # -u, increasing: the passes work on it (no copy of u)
        top = (-A * self._nu_first() + B) / theta2  # largest l / theta2 (u is decreasing)
        M = max(top, 0.0)
        c = self._nu_near((p - 1) // 2)
        front = self._sorted.front
        if A == 0.0:
            e_val = math.exp(max(B / theta2 - M, -700.0))
            s1, s2 = self._head_sums(p)  # sums of u and u^2
            Z1 = e_val * p
            S1 = e_val * (-s1 - p * c)  # sum e (nu - c)
            S2 = e_val * (s2 + 2.0 * c * s1 + p * c * c)
            S3 = math.nan  # (h = 0: no model step)
        else:
            x, e = self._kl_buffers()
            k1, k0, floor, piv = self._exponent_map(p, A, B, theta2, M)
            Z1 = S1 = S2 = S3 = Enu = Ex = Snu = 0.0
            if front is not None:  # the front's from the rows, then the sorted keys'
                sums = [a + b for a, b in zip(
                    kernels.kl_front(front.rows, front.a_thr, k1, k0, floor, c, piv),
                    kernels.kl_sums(nu_all, 0, p - self._base, k1, k0, floor, c, piv))]
                Z1, Enu, Ex, Snu, S1, S2, S3 = sums
            elif kernels.use_kernel(n):  # the same sums in one compiled loop
                Z1, Enu, Ex, Snu, S1, S2, S3 = kernels.kl_sums(nu_all, 0, p, k1, k0, floor, c,
                                                               piv)
            for s in range(0, p if not kernels.use_kernel(n) and front is None else 0,
                           KL_BLOCK):
                nb = nu_all[s:min(s + KL_BLOCK, p)]
                xb, eb = _exponents(nb, k1, k0, floor, x, piv), e[:nb.size]
                np.exp(xb, out=eb)
                Z1 += float(eb.sum())
                # (what moving_sums sums at this h: read there instead of a pass of its own)
                Enu += float(eb @ nb)
                Ex += float(eb @ xb)
                Snu += float(nb.sum())
                dev = np.subtract(nb, c, out=xb)
                S1 += float(eb @ dev)
                np.multiply(eb, dev, out=eb)
                S2 += float(eb @ dev)
                np.multiply(eb, dev, out=eb)  # (the third moment: model_step's slope)
                S3 += float(eb @ dev)
        if A != 0.0:
            if len(self._kl_sums) >= _KL_SUMS_KEPT:
                self._kl_sums.pop(next(iter(self._kl_sums)))
            self._kl_sums[(p, A, B, theta2)] = (M, Z1, Enu, Ex, Snu)
        e0 = math.exp(max(-M, -700.0))
        Z = Z1 + (n - p) * e0
        Zu = -(S1 + c * Z1)  # sum e u
        mu = (dA * Zu + dB * Z1) / Z
        if Z > (1.0 - EXPM1_SHARE) * n:
            # every l / theta2 is close to the largest: log(Z / n) would keep only the rounding
            # of Z / n ~ 1 (times theta2); sum expm1 instead (one more pass over the prefix, at
            # 2.5 times the cost of the exp pass). log(Z / n) is off by a few ulps of 1 (Z's
            # relative rounding), log1p of the expm1 sums by a few ulps of |log(Z / n)|, and
            # both are added to M: further from one (|log(Z / n)| > EXPM1_SHARE, so M >
            # EXPM1_SHARE too) the pass would shrink the rounding of M + log(Z / n) by a
            # factor of at most about 1 + c / EXPM1_SHARE (c: the few ulps), and near the
            # base risk (M ~ 0.18, Z / n ~ 0.87 at theta2 = 0.25, n = 1e6) it took 12 ms of an
            # evaluation's 22
            if A == 0.0:
                zm1 = p * math.expm1(max(B / theta2 - M, -700.0))
            else:
                zm1 = 0.0
                for _, nb in self._key_blocks(p):
                    xb = _exponents(nb, k1, k0, floor, x, piv)
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
        if A != 0.0:
            # for model_step: the slope of the curvature, d curv / dh = 3 d2 mu (1 - Z1 / Z)
            # / theta2 + k3 / theta2^2 (k3 the third central moment of dl/dh under the
            # weights; dl/dh - mu = t0 - dA (nu - c) on the prefix, -mu on the rest), and
            # the jump of mu when one more sample starts moving at its kink (weight e0,
            # dl/dh = dB - dA B / A there)
            try:
                k3 = (t0 ** 3 * Z1 - 3.0 * t0 * t0 * dA * S1 + 3.0 * t0 * dA * dA * S2
                      - dA ** 3 * S3 - (n - p) * e0 * mu ** 3) / Z
                slope = 3.0 * d2 * mu * (1.0 - Z1 / Z) / theta2 + k3 / (theta2 * theta2)
            except (OverflowError, ZeroDivisionError):  # (no model step there)
                slope = math.nan
            self._kl_last = (slope, e0 / Z if Z > 0.0 else math.nan, mu, theta2)
        return term, mu, curv

    def model_step(self, h: float, side: str, g: float, curv: float) -> float:
        """The root of the local model of ``g = r - mu`` at a point ``h`` of a KL evaluation
        of this hinge view (nan: none recorded there, or distances; ``g``, ``curv`` as
        evaluated there).

        Newton's step ``g / curv`` sees the smooth part of ``mu`` only: each sample that
        starts moving between ``h`` and the root adds a jump of ``mu`` (its weight at its
        kink ``h_k``, ``e0 / Z exp(-mu (h_k - h) / theta2)`` to first order, times its
        ``dl/dh`` there, and from there on a jump of the curvature: its ``d2`` and the
        change of the variance of ``dl/dh``), and the curvature changes along the step
        (:meth:`_kl`). The model ``g(h') = g - curv D - curv' D^2 / 2 - (the jumps of the
        kinks between h and h')`` (``D = h' - h``; the kinks read off the sorted keys) is
        solved by bisection in
        the direction of Newton's step, up to twice its length; nan when it does not change
        sign there. It only proposes the next point: the search (``dual.solve_dual``)
        evaluates it exactly and keeps its safeguards. At n = 1e6 (the grid's data) from the
        subsample's ``h`` its error was 2e-13 (near the base risk) and 2.5e-7 (middle) of
        ``h``, against Newton's 6e-7 and 5e-5."""
        got = self._kl_models.get((h, side)) if self.kind == "hinge" else None
        if got is None or not (curv > 0.0) or not math.isfinite(g) or g == 0.0:
            return math.nan
        p, slope, e0z, mu, theta2 = got
        if not (math.isfinite(slope) and math.isfinite(e0z) and math.isfinite(mu)) or \
                not self.c > 0.0:
            return math.nan
        lo_dom, hi_dom = self.domain if self.domain is not None else (0.0, math.inf)
        a, b = h, h + 2.0 * g / curv
        if not lo_dom <= b <= hi_dom:
            return math.nan
        # the kinks between h and b: sorted keys i0..i1-1 (the hinge: kink h_k = nu / c,
        # dl/dh there = c h_k = nu); their jumps summed once (at most n / 8 of them)
        qb = self.count(b, "right")
        i0, i1 = min(p, qb), max(p, qb)
        if i1 - i0 > max(self.n // 32, 64):  # (5 arrays of them: at most 0.16 n-vectors)
            return math.nan
        nu = self.nu[i0 - self._base:i1 - self._base]
        cum = np.zeros((3, nu.size + 1))
        w, t = cum[1, 1:], cum[2, 1:]  # (scratch: the prefix sums are taken last)
        np.multiply(nu, 1.0 / self.c, out=t)  # the kinks h_k
        np.subtract(t, h, out=w)
        w *= -mu / theta2
        if w.size and not float(np.max(np.abs(w))) <= 50.0:
            return math.nan  # (a step of many theta2 / mu: the model's weights are off)
        np.exp(w, out=w)
        w *= e0z  # the weight / Z of each at its kink
        # the jumps of mu (its weight times dl/dh = nu there), and of its slope: the
        # sample's d2, and the variance of dl/dh with its dl/dh moved from 0 to nu
        ck = np.subtract(nu, 2.0 * mu)
        ck *= nu
        ck *= 1.0 / theta2
        ck += 2.0 * self.c
        ck *= w
        np.multiply(nu, w, out=cum[0, 1:])
        np.multiply(ck, t, out=t)  # C_k h_k
        w[:] = ck
        del ck
        np.cumsum(cum[:, 1:], axis=1, out=cum[:, 1:])

        c_jump, c_s, c_sh = cum  # (rows: scalar reads below)
        # count(hh, "right") for hh in (a, b), inside the domain (the bisection reads it some
        # fifty times): the same thresholds, computed inline
        c, tie, umax, lo = self.c, self.tie, self.umax, self.sorted_from
        keys = self.nu[lo - self._base:self.n_fin - self._base]

        def count_right(hh):
            if not hh > 0.0:
                return self.count(hh, "right")
            tol = tie * (hh * umax + c * hh * hh)
            return lo + int(keys.searchsorted((c * hh * hh + tol) / hh, side="right"))

        def model(hh):
            dh = hh - h
            q, q0 = count_right(hh) - i0, p - i0
            # (below h the differences are negative: the kinks undone; the same numbers as
            # the arrays' differences, read as floats)
            jump = float(c_jump[q]) - float(c_jump[q0])
            cs = float(c_s[q]) - float(c_s[q0])
            csh = float(c_sh[q]) - float(c_sh[q0])
            kinks = jump + hh * cs - csh
            return g - curv * dh - 0.5 * slope * dh * dh - kinks

        fb = model(b)
        if not (fb < 0.0 if g > 0.0 else fb > 0.0):  # no sign change: no model root
            return math.nan
        for _ in range(100):
            m = 0.5 * (a + b)
            if not (min(a, b) < m < max(a, b)):
                break
            fm = model(m)
            if fm == 0.0:
                return m
            if (fm > 0.0) == (g > 0.0):
                a = m
            else:
                b = m
        return 0.5 * (a + b)

    def _nu_first(self) -> float:
        """The smallest negated key (the largest key ``u``: a window's front holds it)."""
        if self._base:
            return self._sorted.front.nu_min
        return float(self.nu[0])

    def _nu_near(self, k: int) -> float:
        """The negated key at sorted position ``k``, or (in a front computed from the rows,
        whose keys are not stored) the front's mean: a centre for the KL pass's moments."""
        if k >= self._base:
            return float(self.nu[k - self._base])
        return self._sorted.front.sum_nu / self._base

    def _key_blocks(self, q: int):
        """``(position, keys)``: the first ``q`` keys in blocks of at most :data:`KL_BLOCK`
        (a front computed from the rows first, block by block in row order)."""
        base = self._base
        if base:
            yield from self._sorted.front.blocks()
        for s in range(base, q, KL_BLOCK):
            yield s, self.nu[s - base:min(s + KL_BLOCK, q) - base]

    def _kl_buffers(self):
        """Two scratch buffers of :data:`KL_BLOCK` floats, kept between evaluations."""
        buf = self._sorted.buffers
        if buf is None:
            buf = self._sorted.buffers = (np.empty(KL_BLOCK), np.empty(KL_BLOCK))
        return buf

    def _exponent_map(self, p, A, B, theta2, M):
        """``(k1, k0, floor, piv)``: the exponents ``l / theta2 - M`` of the first ``p`` keys
        are ``k1 (nu - piv) + k0`` (``l = A u + B``, ``u = -nu``); ``floor`` is -700 when the
        smallest of them falls below it, where they are clamped (terms below 1e-304 are far
        under the rounding of any sum they enter; subnormal exponentials are 10-100x slower),
        else None. See :meth:`_pivot_map`."""
        k1, k0, piv = self._pivot_map(A, B, theta2, M)
        lo = self.sorted_from
        nu_max = float(self.nu[p - 1 - self._base]) if p > lo else self._sorted.front_max
        if nu_max is None:  # p = 0 (no key: no exponent to clamp)
            return k1, k0, None, piv
        return k1, k0, (-700.0 if k1 * (nu_max - piv) + k0 < -700.0 else None), piv

    def _pivot_map(self, A, B, theta2, M):
        """``(k1, k0, piv)``: ``l / theta2 - M = k1 (nu - piv) + k0`` about the first key
        ``piv`` (the largest ``l``): ``k0 = top - M`` with ``top`` its ``l / theta2`` (0 when
        ``M = top``), so that the largest exponent is ``k0`` exactly and the others differ from
        it by ``k1 (nu - piv)``, each with a relative rounding. (``k1 nu + (B / theta2 - M)``
        would cancel two terms as large as ``A |nu| / theta2``: at theta1 = 1e12 and theta2 =
        1e-6 those are 1e19, and the exponents were off by some 1e3.)"""
        piv = self._nu_first()
        k1 = -A / theta2
        top = (-A * piv + B) / theta2
        return k1, top - M, piv

    def _v(self, k: int, p: int, A, B, theta2):
        """The k-th largest (1-based) of l / (2 theta2)."""
        return (A * self._sorted.u(k - 1) + B) / (2.0 * theta2) if k <= p else 0.0

    def _chi2(self, p, A, B, dA, dB, d2, theta2):
        """chi2's ``(term, mu, curv, alpha)`` at a point with ``p`` samples moving: its
        active set (the ``kk`` largest ``l``, MATH.md Remark 5) by a binary search over the
        sorted keys. On a window the active set must not end inside the unsorted front (the
        search starts at the front's end, whose validity its largest key decides); where it
        does, :class:`WindowMiss` is raised (``solve_two_piece`` then sorts every key)."""
        n = self.n
        two = 2.0 * theta2
        front = self.sorted_from

        def cu(q):  # the sum of the q largest keys (blocked prefix sums)
            return self._sorted.at(q, squares=False)[0]

        def alpha_at(k):
            # with the top k active: sum_{top k} (l_i + alpha + 2 theta2) = 2 theta2 n (in
            # alpha itself: beta = alpha / (2 theta2) + 1 rounds near 1 for large theta2)
            q = min(k, p)
            return (two * (n - k) - (A * cu(q) + q * B)) / k

        def valid(k):
            # l_k + alpha_k + 2 theta2 > 0  <=>  2 theta2 n > sum_{top k} l - k l_k (exact at k=1)
            q = min(k, p)
            if k <= p:  # every l = A u + B: B cancels (it may be 1e13 against 2 theta2 = 0.5)
                return two * n > A * (cu(q) - k * self._sorted.u(k - 1))
            return two * n > (A * cu(q) + q * B)

        # the weights are positive on the top-kk values; validity is monotone in k
        if valid(n):
            kk = n
        else:
            lo, hi = max(front, 1), n
            if front:  # a window: the top ``front`` keys are its front, the smallest of them
                # -front_max (its u(front - 1)); in front of every key it sorted
                u_last = -float(self._sorted.front_max)
                ok = two * n > A * (cu(front) - front * u_last) if front <= p else \
                    two * n > (A * cu(p) + p * B)
                if not ok:
                    raise WindowMiss(f"chi2's active set ends inside the window's unsorted "
                                     f"front ({front} keys) at h = {A!r}")
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
        if kk <= p:
            return self._chi2_moving(kk, A, alpha, dA, dB, d2, theta2)
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

    def _chi2_moving(self, k, A, alpha, dA, dB, d2, theta2):
        """:meth:`_chi2` when every active sample (the top ``k``) moves, ``l = A u + B``: the
        weights are ``w_i = A (u_i - ubar) / (2 theta2) + n / k`` (``ubar`` the mean key of the
        top k), free of ``B = c h^2``, which at large r is many orders of magnitude above
        ``2 theta2`` (the sums ``sum l^2 + 2 alpha sum l + k alpha^2`` would cancel it in
        double precision: at r = 1e7, theta2 = 0.25 the derivative lost 4 digits). So
        ``sum (l + alpha) = 2 theta2 (n - k)``, ``sum (l + alpha)^2 = A^2 V + (2 theta2 (n -
        k))^2 / k`` with ``V = sum (u_i - ubar)^2``, ``sum w dl/dh = A A' V / (2 theta2) + (n /
        k) sum dl/dh``, ``sum w = n``."""
        n = self.n
        two = 2.0 * theta2
        s1, s2 = self._sorted.at(k)
        V = max(s2 - s1 * s1 / k, 0.0)
        ex = two * (n - k)
        s2_act = A * A * V + ex * ex / k
        term = (ex + s2_act / (2.0 * two) - theta2 * (n - k)) / n - alpha
        sd = dA * s1 + k * dB
        mu = (A * dA * V / two + (n / k) * sd) / n
        curv = d2 + dA * dA * V / (two * n)
        return term, mu, curv, alpha

    # -- the most sensitive distribution, summarised ------------------------------------------
    def weights_prefix(self, h: float, q: int, theta2: float, divergence: str) -> np.ndarray:
        """The weights ``w_i`` (mean one over all n samples) of the first ``q`` sorted samples
        at ``h``, where ``q`` is at least the number on the "move" piece."""
        self._whole("weights_prefix")
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
        self._whole("risk_parts")
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

    def moving_sums(self, h: float, theta2: float, *, phi_atol: float = 0.0):
        """The most sensitive distribution at ``h`` (KL, or theta2 = inf) as a rule on the keys
        and its sums, from one pass over the samples that move (no pass over the others).

        Returns ``(rule, sums)``: ``rule`` a :class:`KeyRule` (which samples move or are tied
        at ``h``, their weights and losses at the moved points, from their keys), ``sums`` a
        dict of ``p_l``, ``p_r`` (samples moving on both sides / on the right side: the tied
        ones are the sorted positions ``p_l..p_r``) and, over the ``p_l`` samples that move,
        ``w`` (sum of weights), ``wd`` (of weight times loss at the moved point), ``d`` (of
        that loss) and ``phi`` (of ``phi_KL(weight)``). The weights have mean one over all n
        samples with the tied ones moving (the right side), as the dual's term at ``h``.
        ``T`` is that divergence term with every sample's ``l_h`` clipped at the zero piece
        (tied samples count 0): the dual objective at ``h`` is ``h r - T``, evaluated apart
        from the solver's sums (the audit's weak-duality check).
        ``sum phi`` is summed from the pass's sums when their cancellation is below
        ``phi_atol`` (absolute, on the sum), else per sample by
        :func:`otstab_solvers.weights.phi` in a second pass.
        """
        if self.kind != "hinge":
            raise ValueError("moving_sums serves the hinge kind")
        n = self.n
        p_l, p_r = self.count(h, "left"), self.count(h, "right")
        A, B, dA, dB, _ = self.coefficients(h)
        left, right = self.thresholds(h)
        nu = self.nu
        if math.isinf(theta2):
            rule = KeyRule(left, right, 0.0, 0.0, 0.0, 1.0, dA, dB, unit=True)
            s_u = self._head_sums(p_l)[0] if p_l else 0.0
            d_sum = dA * s_u + dB * p_l if p_l else 0.0
            # the divergence term mean l_h over the samples that move (each A u + B > tol)
            T = (A * s_u + B * p_l) / n if p_l else 0.0
            return rule, {"p_l": p_l, "p_r": p_r, "w": float(p_l), "wd": d_sum, "d": d_sum,
                          "phi": 0.0, "T": T}
        M = max((-A * self._nu_first() + B) / theta2, 0.0) if p_r else 0.0
        front = self._sorted.front
        # every exponent at least that of l_h = 0 (x0): a tied sample's l_h (within the tie
        # tolerance of 0) counts as 0, as the scan of the pieces takes it; this also clamps
        # the exponents at -700
        k1, k0, piv = self._pivot_map(A, B, theta2, M) if p_r else (0.0, -M, 0.0)
        x0 = max(-M, -700.0)
        x, e = self._kl_buffers()
        Z = E1 = Enu = Ex = Snu = 0.0
        known = self._kl_sums.get((p_r, A, B, theta2)) if p_l == p_r else None
        if known is not None and known[0] == M:
            # the solver's pass at this very h (no tied sample: every one of the p samples
            # moves on both sides) summed the same blocks with the same exponents (the floor
            # x0 binds no moving sample: their l_h exceeds the tie tolerance, far above the
            # rounding of x), so its sums are these, bit for bit
            _, Z, Enu, Ex, Snu = known
            E1 = Z
        kernel = kernels.use_kernel(n) or front is not None
        if kernel and known is None:  # the same sums in compiled loops (sorted_kernels)
            base = self._base
            E1, Enu, Ex, Snu = kernels.kl_sums(nu, 0, p_l - base, k1, k0, x0, 0.0, piv)[:4]
            if front is not None:  # (the front's from the rows: every one moves)
                E1, Enu, Ex, Snu = (a + b for a, b in zip(
                    (E1, Enu, Ex, Snu),
                    kernels.kl_front(front.rows, front.a_thr, k1, k0, x0, 0.0, piv)[:4]))
            Z = E1 + kernels.kl_sums(nu, p_l - base, p_r - base, k1, k0, x0, 0.0, piv)[0]
        for s in range(0, p_r if known is None and not kernel else 0, KL_BLOCK):
            stop = min(s + KL_BLOCK, p_r)
            nb = nu[s:stop]
            xb, eb = _exponents(nb, k1, k0, x0, x, piv), e[:nb.size]
            np.exp(xb, out=eb)
            Z += float(eb.sum())
            if s < p_l:  # the samples that move on both sides (the tied ones come last)
                q = min(stop, p_l) - s
                E1 += float(eb[:q].sum())
                Enu += float(eb[:q] @ nb[:q])
                Ex += float(eb[:q] @ xb[:q])
                Snu += float(nb[:q].sum())
        Z += (n - p_r) * math.exp(x0)
        scale = n / Z
        rule = KeyRule(left, right, k1, k0, x0, scale, dA, dB, kernel=kernel, piv=piv)
        # sum phi(w) = sum (w log w - w + 1), log w = x + log(scale): from the sums, unless
        # their cancellation (weights near one: large theta2) could exceed phi_atol
        L = math.log(scale)
        phi_sum = scale * (Ex + (L - 1.0) * E1) + p_l
        bound = 8.0 * np.finfo(float).eps * (scale * (-Ex + abs(L) * E1 + E1) + p_l)
        if bound > phi_atol:
            phi_sum = 0.0
            for _, nb in self._key_blocks(p_l):
                xb, eb = _exponents(nb, k1, k0, x0, x, piv), e[:nb.size]
                if kernel:
                    kernels.exp_into(xb, eb)
                else:
                    np.exp(xb, out=eb)
                eb *= scale
                phi_sum += float(np.sum(phi(eb, "kl")))
        return rule, {"p_l": p_l, "p_r": p_r, "w": scale * E1,
                      "wd": scale * (dB * E1 - dA * Enu), "d": dB * p_l - dA * Snu,
                      "phi": phi_sum, "T": theta2 * (M - L)}

    def chi2_sums(self, h: float, theta2: float):
        """:meth:`moving_sums` for chi2 (the full view, or a window: :meth:`_chi2`): the same
        ``(rule, sums)``, the weights ``((l_h + alpha) / (2 theta2) + 1)_+`` at the view's own
        ``alpha`` at ``h`` (the right side, as the dual's term), in one pass over the samples
        that move
        (no exp; the weights of the others are that of ``l_h = 0``). ``sums`` also holds
        ``alpha`` and ``T_abs`` (the sum of the absolute terms of ``T``, its rounding scale).
        """
        if self.kind != "hinge":
            raise ValueError("chi2_sums serves the hinge kind")
        n = self.n
        p_l, p_r = self.count(h, "left"), self.count(h, "right")
        A, B, dA, dB, d2 = self.coefficients(h)
        alpha = float(self._chi2(p_r, A, B, dA, dB, d2, theta2)[3])
        left, right = self.thresholds(h)
        rule = KeyRule(left, right, 0.0, 0.0, 0.0, 1.0, dA, dB, alpha=alpha, A=A, B=B,
                       theta2=theta2)
        two = 2.0 * theta2
        x, e = self._kl_buffers()
        t3, flag = np.empty(x.size), np.empty(x.size, dtype=bool)  # (no block temporaries)
        W = WD = PHI = T = T_abs = Snu = 0.0
        nu = self.nu
        front = self._sorted.front
        kernel = kernels.use_kernel(n) or front is not None
        if kernel:  # the same per-key arithmetic in one compiled loop
            W, WD, PHI, T, T_abs, Snu = kernels.chi2_sums_pass(nu, p_l - self._base, A, B,
                                                               alpha, theta2, dA, dB)
            if front is not None:  # (the front's from the rows)
                W, WD, PHI, T, T_abs, Snu = (a + b for a, b in zip(
                    (W, WD, PHI, T, T_abs, Snu),
                    kernels.chi2_front(front.rows, front.a_thr, A, B, alpha, theta2, dA, dB)))
        for _, nb in (self._key_blocks(p_l) if not kernel else ()):
            wb = _chi2_weights(nb, A, B, alpha, theta2, e)
            W += float(wb.sum())
            Snu += float(nb.sum())
            db = np.multiply(nb, -dA, out=x[:nb.size])  # the loss at the moved point
            db += dB
            WD += float(wb @ db)
            # T's terms theta2 (w^2 - 1) = v + v^2 / (4 theta2) (v = l + alpha; -theta2 where
            # the weight is 0), and phi = (w - 1)^2, written without w - 1 ~ 0 cancelling
            v = np.multiply(nb, -A, out=x[:nb.size])
            v += B
            np.maximum(v, 0.0, out=v)
            v += alpha
            off = np.less_equal(v, -two, out=flag[:nb.size])  # weight 0
            tv = np.multiply(v, v, out=t3[:nb.size])
            tv *= 1.0 / (2.0 * two)
            tv += v
            np.copyto(tv, -theta2, where=off)
            T += float(tv.sum())
            T_abs += float(np.abs(tv, out=tv).sum())
            dv = np.multiply(v, 1.0 / two, out=tv)  # w - 1
            np.copyto(dv, -1.0, where=off)
            PHI += float(dv @ dv)
        v0 = alpha  # every other sample: l_h = 0
        t0 = v0 + v0 * v0 / (2.0 * two) if v0 + two > 0.0 else -theta2
        T = (T + (n - p_l) * t0) / n - alpha
        T_abs = (T_abs + (n - p_l) * abs(t0)) / n + abs(alpha)
        return rule, {"p_l": p_l, "p_r": p_r, "w": W, "wd": WD, "d": dB * p_l - dA * Snu,
                      "phi": PHI, "T": T, "T_abs": T_abs, "alpha": alpha}


@dataclass(frozen=True)
class KeyRule:
    """The most sensitive distribution at one ``h`` of a hinge-shaped form as a rule on each
    sample's negated key ``nu = -u`` (:meth:`SortedTwoPiece.moving_sums`), so that its atoms
    can be built from the keys of any rows, in any order, with the numbers of the sums.

    A sample moves when ``nu < left``, is tied (moves or not, as the split decides) when
    ``left <= nu <= right`` and stays otherwise. Its weight is ``scale exp(x)`` with the
    exponent ``x = max(k1 (nu - piv) + k0, x0)``, ``x0`` that of ``l_h = 0`` (all one when ``unit``:
    theta2 = inf); its loss at the moved point ``dA u + dB`` (0 where it stays: the zero
    piece).
    """

    left: float
    right: float
    k1: float
    k0: float
    x0: float
    scale: float
    dA: float
    dB: float
    unit: bool = False
    #: chi2 (:meth:`SortedTwoPiece.chi2_sums`): the weight is ``((l_h + alpha) / (2 theta2) +
    #: 1)_+`` with ``l_h = max(A u + B, 0)``; None: KL or unit weights
    alpha: float | None = None
    A: float = 0.0
    B: float = 0.0
    theta2: float = math.inf
    #: the weights' exponentials by :func:`otstab_solvers.sorted_kernels.exp_into` (the exp of
    #: the compiled sums the rule came from), not NumPy's
    kernel: bool = False
    #: the key the exponents are taken about (:meth:`SortedTwoPiece._pivot_map`)
    piv: float = 0.0

    def moving(self, nu: np.ndarray) -> np.ndarray:
        return nu < self.left

    def tied(self, nu: np.ndarray) -> np.ndarray:
        return (nu >= self.left) & (nu <= self.right)

    def weights(self, nu: np.ndarray) -> np.ndarray:
        """The weights of samples with keys ``nu``."""
        if self.unit:
            return np.ones(np.shape(nu))
        if self.alpha is not None:
            return _chi2_weights(nu, self.A, self.B, self.alpha, self.theta2,
                                 np.empty(np.shape(nu)))
        x = _exponents(nu, self.k1, self.k0, self.x0, np.empty(np.shape(nu)), self.piv)
        if self.kernel:
            kernels.exp_into(x, x)
        else:
            np.exp(x, out=x)
        x *= self.scale
        return x

    def stay_weight(self) -> float:
        if self.alpha is not None:
            return max(self.alpha / (2.0 * self.theta2) + 1.0, 0.0)
        return 1.0 if self.unit else self.scale * math.exp(self.x0)

    def loss_moved(self, nu: np.ndarray) -> np.ndarray:
        """``dA u + dB`` (``u = -nu``): the loss at the moved point of a moving sample."""
        return self.dB - self.dA * nu


def _chi2_weights(nu, A, B, alpha, theta2, buf):
    """chi2 weights ``((l + alpha) / (2 theta2) + 1)_+`` of the keys ``nu`` in ``buf``, with
    ``l = max(A u + B, 0)`` (``u = -nu``; the arithmetic of the keyed sums)."""
    w = np.multiply(nu, -A, out=buf[:np.size(nu)])
    w += B
    np.maximum(w, 0.0, out=w)
    w += alpha
    w *= 1.0 / (2.0 * theta2)
    w += 1.0
    np.maximum(w, 0.0, out=w)
    return w


def _exponents(nu, k1, k0, floor, buf, piv=0.0):
    """The exponents ``k1 (nu - piv) + k0`` of the keys ``nu`` in ``buf``, at least ``floor``
    (None: no floor)."""
    x = buf[:np.size(nu)]
    if piv != 0.0:
        np.subtract(nu, piv, out=x)
        x *= k1
    else:
        np.multiply(nu, k1, out=x)
    x += k0
    if floor is not None:
        np.maximum(x, floor, out=x)
    return x


def window_thresholds(c: float, h_lo: float, h_hi: float, umax: float, tie: float):
    """``(a_thr, c_thr)`` of a window over ``[h_lo, h_hi]``: a negated key ``nu < a_thr``
    moves at every ``h`` of the bracket on both sides, ``nu > c_thr`` at none.

    A sample counts as moving at ``h`` (right side) when ``nu <= c h + tol / h`` and (left
    side) when ``nu < c h - tol / h``, with ``tol = tie (h umax + c h^2)``
    (:meth:`SortedTwoPiece.count`); the thresholds leave four times the largest ``tol / h``
    of the bracket, plus rounding of ``c h``, on either side, so a key near an end of the
    bracket is in the sorted part ``B``."""
    tol = tie * (h_hi * umax + c * h_hi * h_hi)
    eps = 4.0 * tol / h_lo + 1e-14 * (umax + c * h_hi)
    return c * h_lo - eps, c * h_hi + eps
