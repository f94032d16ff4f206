"""The 1-D / 2-D dual from per-block partial sums: data that lives in blocks elsewhere.

:class:`BlockwiseDual` is a reduction oracle that :func:`otstab_solvers.dual.solve_dual` accepts
(it evaluates it like a :class:`~otstab_solvers.sorted_oracle.SortedTwoPiece`, through
``reduce`` and ``kinks_between``), whose every quantity is a sum of per-block partial sums: the
caller supplies ``run(func, *args)``, which applies ``func(block, *args)`` to every block
wherever the blocks live (a Dask cluster, a loop over arrays) and returns the list of results.
A *block* is an oracle for its rows (``evaluate(h, side=, with_pieces=True)`` and
``crossings``, as :class:`~otstab_solvers.dual.PiecewiseOracle`) with an attribute ``p``: the
rows' probabilities, or None for uniform rows (:func:`rows_of`: read from a
:class:`~otstab_solvers.weights.ScaledWeights` at each evaluation, so that the blocks hold no
n-vector of them). Only O(1) numbers per block come back per evaluation:

- theta2 = inf: ``sum p l_h``, ``sum p dl``, ``sum p d2l``;
- KL: per block the largest ``l_h / theta2`` (``M_b``) and the sums of ``p e``, ``p e dl``,
  ``p e dl^2``, ``p e d2l`` and ``p expm1`` with ``e = exp(l_h / theta2 - M_b)``, combined on
  the client by rescaling with ``exp(M_b - M)`` (the log-sum-exp of the blocks);
- chi2: alpha (MATH.md, Remark 5) by Newton's method on the convex, increasing, piecewise-linear
  ``f(alpha) = sum p (l + alpha + 2 theta2)_+ - 2 theta2 N`` started where every row is
  active (f >= 0 there): each step recomputes alpha from the active set of the last, the sets
  shrink, and the step whose active set does not change is exact. Each step is one pass of
  blockwise sums over the active rows (count, ``sum p``, ``sum p l``, ...); values are shifted
  by the largest ``l_h`` first, as :func:`otstab_solvers.weights.chi2_solution` does;
- the kinks strictly inside a bracket: count, smallest and largest crossing of the rows whose
  piece differs at the two ends (the middle returned is the midpoint of the two); an l_h
  without pieces (the smooth d-transforms, ``kinks=False``) has none, and no pass is made.

:class:`RowsBlock` makes a block of rows ``s..e`` of an oracle held in memory that evaluates
any subset of its rows (``transform_rows``: the smooth d-transforms of
:mod:`otstab_solvers.smooth`), so that an in-memory dual is summed over cache-sized blocks
instead of n-vectors of ``l_h`` and its derivatives.

This module imports neither otstab nor Dask.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .dual import AffineOracle, AffineRows, PiecewiseOracle
from .weights import BLOCK as WEIGHT_BLOCK
from .weights import ScaledWeights, WeightMap, kl_weight_map_blocks
from .zero_one import DistanceOracle

__all__ = ["BlockwiseDual", "RowsBlock", "piecewise_block", "affine_blocks", "distance_block",
           "price_block",
           "block_l", "in_memory", "weight_map_blocks", "rows_of", "CHI2_MAX_STEPS"]

#: bound on chi2's active-set steps per evaluation (each is one pass over the blocks)
CHI2_MAX_STEPS = 200


class _Rows:
    """Rows ``s..e`` of a :class:`~otstab_solvers.weights.ScaledWeights`, read when a block
    is evaluated (:func:`probs`)."""

    __slots__ = ("src", "s", "e")

    def __init__(self, src: ScaledWeights, s: int, e: int):
        self.src, self.s, self.e = src, s, e


def rows_of(p, s: int, e: int):
    """A block's ``p`` for rows ``s..e`` of the probabilities ``p`` (None: uniform): a view of
    an array; of a :class:`~otstab_solvers.weights.ScaledWeights`, a reference read at each
    evaluation (:func:`probs`: ``w[s:e] / total``, no n-vector kept across blocks)."""
    if p is None:
        return None
    if isinstance(p, ScaledWeights):
        return _Rows(p, s, e)
    return p[s:e]


def probs(block):
    """The probabilities of a block's rows (None: uniform), once per evaluation."""
    p = block.p
    return p.src[p.s:p.e] if isinstance(p, _Rows) else p


def piecewise_block(c1, c2, c1abs: float, p=None) -> PiecewiseOracle:
    """A :class:`PiecewiseOracle` for one block's rows whose tie tolerance uses ``c1abs``, the
    largest |c1| over all blocks (so that ties are decided as on the whole data)."""
    oracle = PiecewiseOracle(c1, c2, c1abs=c1abs)
    oracle.p = p
    return oracle


def affine_blocks(rows: AffineRows, c2, c1abs: float, p=None, size: int = 1 << 15):
    """In-memory blocks of rows of an :class:`AffineRows` reduced form (``c1 = a_k u + b_k``):
    :class:`AffineOracle` s over views of the scores and labels (no copy), whose pieces are
    computed at each evaluation, with the tie tolerance ``c1abs`` of all rows; ``p``: the
    sample probabilities (a view per block)."""
    out = []
    for s in range(0, rows.n, size):
        e = min(s + size, rows.n)
        block = AffineOracle(AffineRows(rows.s[s:e], rows.y[s:e], rows.kind, rows.a, rows.b),
                             c2, c1abs=c1abs)
        block.p = rows_of(p, s, e)
        out.append(block)
    return out


def distance_block(a, p=None) -> DistanceOracle:
    """The 0/1 block oracle ``l_h = (h - a_i)_+`` for one block's rows (no sort)."""
    a = np.asarray(a, dtype=np.float64)
    return _PriceBlock(a, 0, a.size, p)


class _PriceBlock(DistanceOracle):
    """:class:`DistanceOracle` of rows ``s..e`` of prices read at each evaluation."""

    def __init__(self, prices, s: int, e: int, p=None):
        self.prices, self.s, self.e = prices, s, e
        self.n = e - s
        self.prefix = None  # type: ignore[assignment]  # (no sorted view)
        self.p = rows_of(p, s, e)

    @property
    def a(self) -> np.ndarray:  # type: ignore[override]
        return np.asarray(self.prices[self.s:self.e], dtype=np.float64)

    def evaluate(self, h, *, side="right", with_pieces=False):
        """``(l_h, dl, d2l[, pieces])``, the pieces as booleans (move: True; the block sums
        read none, :meth:`kinks_in` finds the kinks); ``d2l`` is 0, one read-only array per
        size."""
        a = self.a
        k = _moving(a, h, side)
        lh = np.maximum(h - a, 0.0)
        d1 = k.astype(np.float64)
        d2 = _zeros(a.size)
        return (lh, d1, d2, k) if with_pieces else (lh, d1, d2)

    def kinks_in(self, h_lo, side_lo, h_hi, side_hi):
        """:func:`block_kinks` from one read of the prices (the crossings of ``(h - a_i)_+``
        are the prices themselves: the numbers ``evaluate`` and ``crossings`` give)."""
        a = self.a
        hc = a[_moving(a, h_lo, side_lo) != _moving(a, h_hi, side_hi)]
        hc = hc[np.isfinite(hc) & (hc > h_lo) & (hc < h_hi)]
        if not hc.size:
            return 0, math.inf, -math.inf
        return int(hc.size), float(hc.min()), float(hc.max())


def _moving(a, h, side):
    """Which rows of prices ``a`` are on the "move" piece at ``h`` (ties: right = move), as
    :meth:`DistanceOracle.evaluate` decides."""
    k = a < h
    if side == "right":
        k |= a == h
    return k


@functools.lru_cache(maxsize=4)
def _zeros(size: int) -> np.ndarray:
    out = np.zeros(size)
    out.setflags(write=False)
    return out


def price_block(prices, s: int, e: int, p=None) -> DistanceOracle:
    """The 0/1 block oracle ``l_h = (h - a_i)_+`` of rows ``s..e`` of ``prices``: an array,
    or any object whose slices compute them (prices from a model's scores), read at each
    evaluation, as the probabilities ``p`` (:func:`rows_of`): the blocks hold no n-vector."""
    return _PriceBlock(prices, s, e, p)


class RowsBlock:
    """Rows ``s..e`` of an oracle with ``transform_rows(h, rows) -> (l_h, dl, d2l, ...)`` as a
    block of :class:`BlockwiseDual` (``p``: the rows' probabilities, None for uniform rows).

    A smooth ``l_h`` has no pieces (the piece returned is None). ``keep``: the last evaluation
    is kept, for chi2, which sums the same ``h`` over several passes (its active-set steps);
    KL and theta2 = inf read each ``h`` once and keep nothing.
    """

    def __init__(self, oracle, s: int, e: int, p=None, *, keep: bool = False):
        self.oracle, self.rows, self.p, self.keep = oracle, slice(s, e), p, keep
        self._last: tuple | None = None

    def evaluate(self, h: float, side: str = "right", with_pieces: bool = True):
        if self._last is not None and self._last[0] == h:
            return self._last[1]
        lh, d1, d2 = self.oracle.transform_rows(h, self.rows)[:3]
        out = (lh, d1, np.zeros_like(lh) if d2 is None else d2, None)
        if self.keep:
            self._last = (h, out)
        return out


def in_memory(blocks):
    """The ``run`` of :class:`BlockwiseDual` for blocks held in this process: a loop."""
    def run(func, *args):
        return [func(b, *args) for b in blocks]
    return run


class _ValuesBlock:
    """Rows ``s..e`` of values ``l_h`` given by ``values(s, e)`` as a block of
    :class:`BlockwiseDual` (derivatives 0: for the weights at one h, not for a solve)."""

    def __init__(self, values, s, e, p=None):
        self.values, self.s, self.e, self.p = values, s, e, p

    def evaluate(self, h, side="right", with_pieces=True):
        lh = np.asarray(self.values(self.s, self.e), dtype=np.float64)
        zero = np.zeros(lh.size)
        return lh, zero, zero, None


def weight_map_blocks(values, n: int, theta2: float, divergence: str, p=None,
                      top: float | None = None, alpha: float | None = None) -> WeightMap:
    """The :class:`~otstab_solvers.weights.WeightMap` of the ``n`` values of ``l_h`` given by
    ``values(s, e)`` (rows s..e), over blocks of rows: ``l_h`` itself is never held in memory.
    KL and theta2 = inf: :func:`~otstab_solvers.weights.kl_weight_map_blocks` (``top``: the
    largest value over the support, when known); chi2: alpha exact by the active-set steps of
    :meth:`BlockwiseDual.chi2` (one pass each; ``alpha``: a guess to start them from, e.g.
    the dual solution's). The same weights as
    :func:`~otstab_solvers.weights.weight_map` of the whole vector, up to the order of sums."""
    if divergence not in ("kl", "chi2"):
        raise ValueError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
    if divergence == "kl" or math.isinf(theta2):
        wm = kl_weight_map_blocks(values, n, theta2, top=top, p=p)
        if divergence == "chi2":  # theta2 = inf: unit weights, alpha 0
            wm = WeightMap("chi2", theta2, 0.0, 1.0, 0.0, wm.term, p is not None)
        return wm
    size = WEIGHT_BLOCK
    blocks = [_ValuesBlock(values, s, min(s + size, n), rows_of(p, s, min(s + size, n)))
              for s in range(0, n, size)]
    dual = BlockwiseDual(in_memory(blocks), n, float(n) if p is None else 1.0, kinks=False)
    term, _, _, alpha, shift, alpha_s = dual.chi2(0.0, "right", theta2, start=alpha)
    return WeightMap("chi2", theta2, shift, alpha_s, alpha, term, p is not None)


def _pw(p, x):
    """sum_i p_i x_i over a block (plain sum for uniform rows, ``p`` None)."""
    return float(np.sum(x)) if p is None else float(np.dot(p, x))


def _live(p):
    return None if p is None else p > 0


def block_l(block, h: float, side: str):
    """(l_h, dl, d2l, piece) of a block at ``h``."""
    return block.evaluate(h, side=side, with_pieces=True)


def block_top(block, h, side):
    """(largest l_h over the rows of positive probability or -inf, sum p, sum p l_h, sum p dl,
    sum p d2l, number of such rows)."""
    lh, d1, d2, _ = block_l(block, h, side)
    p = probs(block)
    live = _live(p)
    lv = lh if live is None else lh[live]
    top = float(lv.max()) if lv.size else -math.inf
    mass = float(lh.size) if p is None else float(np.sum(p))
    return top, mass, _pw(p, lh), _pw(p, d1), _pw(p, d2), int(lv.size)


def block_kl(block, h, side, theta2):
    """KL partial sums of a block (see the module docstring)."""
    lh, d1, d2, _ = block_l(block, h, side)
    a = lh / theta2
    p = probs(block)
    live = _live(p)
    av = a if live is None else a[live]
    if not av.size:
        return -math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    m = float(av.max())
    x = np.clip(a - m, -700.0, 0.0)  # rows of zero probability above the top are capped
    e = np.exp(x)
    pe = e if p is None else p * e
    mass = float(lh.size) if p is None else float(np.sum(p))
    return (m, float(np.sum(pe)), float(np.dot(pe, d1)), float(np.dot(pe, d1 * d1)),
            float(np.dot(pe, d2)), _pw(p, np.expm1(x)), mass)


def block_chi2_active(block, h, side, theta2, shift, alpha):
    """The part of :func:`block_chi2` that the active-set steps of alpha need: (count,
    sum p, sum p (l - shift)) over the active rows (the same rows as :func:`block_chi2`)."""
    lh = block_l(block, h, side)[0]
    ls = lh - shift
    act = ls + alpha > -2.0 * theta2
    p = probs(block)
    live = _live(p)
    if live is not None:
        act &= live
    k = int(np.count_nonzero(act))
    if p is None:
        return k, float(k), float(np.dot(ls, act))
    pa = np.where(act, p, 0.0)
    return k, float(np.sum(pa)), float(np.dot(pa, ls))


def block_chi2(block, h, side, theta2, shift, alpha):
    """chi2 partial sums over the active rows (``l - shift + alpha + 2 theta2 > 0``, rows of
    positive probability): (count, sum p, sum p s, sum p s^2, sum p w dl, sum p w d2l,
    sum p dl, sum p dl^2, sum p (l - shift)) with ``s = l - shift + alpha`` and
    ``w = s / (2 theta2) + 1``."""
    lh, d1, d2, _ = block_l(block, h, side)
    ls = lh - shift
    s = ls + alpha
    act = s > -2.0 * theta2
    p = probs(block)
    live = _live(p)
    if live is not None:
        act &= live
    k = int(np.count_nonzero(act))
    if k < act.size:  # the inactive rows count as zeros (a select, cheaper than a gather)
        s, d1, d2, ls = (np.where(act, x, 0.0) for x in (s, d1, d2, ls))
    w = s / (2.0 * theta2)
    w += act  # s / (2 theta2) + 1 on the active rows, 0 elsewhere
    pw = w if p is None else p * w
    ps = s if p is None else p * s
    pd1 = d1 if p is None else p * d1

    def tot(x):
        return float(np.sum(x)) if p is None else float(np.dot(p, x))

    mass = float(k) if p is None else float(np.dot(p, act))
    return (k, mass, float(np.sum(ps)), float(np.dot(ps, s)), float(np.dot(pw, d1)),
            float(np.dot(pw, d2)), float(np.sum(pd1)), float(np.dot(pd1, d1)), tot(ls))


def block_kinks(block, h_lo, side_lo, h_hi, side_hi):
    """(count, smallest, largest) crossing strictly inside ``(h_lo, h_hi)`` of the rows whose
    piece differs at the two ends."""
    own = getattr(block, "kinks_in", None)  # (a block that finds them from one read of its rows)
    if own is not None:
        return own(h_lo, side_lo, h_hi, side_hi)
    kept = getattr(block, "pieces_at", None)  # (a block that keeps its last pieces)
    if kept is not None:
        k_lo, k_hi = kept(h_lo, side_lo), kept(h_hi, side_hi)
    else:
        k_lo = block.evaluate(h_lo, side=side_lo, with_pieces=True)[3]
        k_hi = block.evaluate(h_hi, side=side_hi, with_pieces=True)[3]
    sw = np.nonzero(k_lo != k_hi)[0]
    if not sw.size:
        return 0, math.inf, -math.inf
    hc = block.crossings(k_lo[sw], k_hi[sw], sw)
    hc = hc[np.isfinite(hc) & (hc > h_lo) & (hc < h_hi)]
    if not hc.size:
        return 0, math.inf, -math.inf
    return int(hc.size), float(hc.min()), float(hc.max())


def _add(parts):
    return [sum(col) for col in zip(*parts)]


class BlockwiseDual:
    """Reduction oracle of the dual over blocks (see the module docstring).

    ``run(func, *args)`` returns ``[func(block, *args) for every block]``; ``n`` the number of
    rows; ``total`` the P0-mass normaliser: ``n`` for uniform rows, ``1`` when the blocks carry
    probabilities ``p`` (summing to 1 over all blocks). ``passes`` counts the calls of ``run``.
    """

    def __init__(self, run, n: int, total: float, *, kinks: bool = True,
                 h_max: float = math.inf):
        self._run = run
        self.n = int(n)
        self.total = float(total)
        self.kinks = bool(kinks)  # False: l_h has no pieces (smooth), so no kinks
        self.h_max = float(h_max)  # l_h finite for 0 <= h < h_max
        self.passes = 0
        self.prefix = self  # solve_dual evaluates an oracle's ``prefix`` by ``reduce``
        self._alpha: float | None = None  # chi2's alpha at the last evaluation

    def run(self, func, *args):
        self.passes += 1
        return self._run(func, *args)

    def top(self, h: float, side: str = "right"):
        """(largest l_h, sum p l_h, sum p dl, sum p d2l) over all blocks."""
        parts = self.run(block_top, h, side)
        return (max(q[0] for q in parts), *_add([q[2:5] for q in parts]))

    def reduce(self, h: float, side: str, theta2: float, divergence: str):
        """``(term, mu, curv, alpha, key)`` as ``SortedTwoPiece.reduce``; ``key`` = (h, side)."""
        N = self.total
        if math.isinf(theta2):
            _, sl, sd, sd2 = self.top(h, side)
            return sl / N, sd / N, sd2 / N, None, (h, side)
        if divergence == "kl":
            return (*self.kl(h, side, theta2), None, (h, side))
        # alpha moves little between the search's points: the last one starts the steps
        term, mu, curv, alpha = self.chi2(h, side, theta2, start=self._alpha)[:4]
        self._alpha = alpha
        return term, mu, curv, alpha, (h, side)

    def kl(self, h, side, theta2):
        """(term, mu, curv) of the KL dual at ``h``."""
        N = self.total
        parts = [q for q in self.run(block_kl, h, side, theta2) if math.isfinite(q[0])]
        M = max(q[0] for q in parts)
        f = [math.exp(q[0] - M) for q in parts]
        Z, Z1, Z2, Z3 = (sum(fb * q[i] for fb, q in zip(f, parts)) for i in (1, 2, 3, 4))
        if Z > 0.5 * N:  # every l / theta2 close to the largest: expm1 keeps the accuracy
            em1 = sum(fb * q[5] + math.expm1(q[0] - M) * q[6] for fb, q in zip(f, parts))
            log_mean = math.log1p(em1 / N)
        else:
            log_mean = math.log(Z / N)
        mu = Z1 / Z
        var = max(Z2 / Z - mu * mu, 0.0)  # steers Newton only
        return theta2 * (M + log_mean), mu, Z3 / Z + var / theta2

    def chi2(self, h, side, theta2, start: float | None = None):
        """(term, mu, curv, alpha, shift, alpha of the shifted values) of the chi2 dual at
        ``h`` (alpha exact, see the module docstring; the values are shifted by ``shift``,
        the largest ``l_h``, and the weights are ``((l_h - shift) + alpha_s) / (2 theta2) + 1``
        where positive). ``start``: a guess of alpha (e.g. the dual's, for Q*'s weights): the
        steps start there when it is below the all-active start, so that a good guess takes
        two steps. Newton on the convex ``f`` from the left of its root lands on its right (the
        tangent lies below ``f``), from where the steps shrink the active set as usual."""
        N = self.total
        two = 2.0 * theta2
        shift, sl, _, _ = self.top(h, side)
        alpha = cold = -(sl - shift * N) / N  # every row active: sum p (l - shift + a) = 0
        warm = start is not None and math.isfinite(start) and start + shift < cold
        if warm:
            alpha = start + shift
        count = None
        for _ in range(CHI2_MAX_STEPS):
            # the steps need three sums; the others come from one pass at the final alpha
            k, P, SL = _add(self.run(block_chi2_active, h, side, theta2, shift, alpha))
            if not P > 0.0:  # a guess below every row: start again from all rows
                alpha, count, warm = cold, None, False
                continue
            if count is not None and k >= count:
                # the active set alpha was computed from did not shrink: alpha is exact (a set
                # larger by rounding adds rows of weight ~0)
                break
            # f(alpha) = sum_A p (l - shift + alpha + 2 theta2) - 2 theta2 N < 0 at the guess:
            # it was left of the root and the next set may be larger, so no stop next step
            left = warm and SL + alpha * P + two * (P - N) < 0.0
            count, warm = (None if left else k), False
            # sum_A p (l - shift + alpha' + 2 theta2) = 2 theta2 N, from the sums of l - shift
            # (not alpha + (2 theta2 (N - P) - S) / P: the first alpha, from every row, may be
            # 1e4 against 2 theta2 = 2e-6, whose rounding would stay in alpha)
            alpha = (two * (N - P) - SL) / P  # (N - P first: no 2 theta2 N to cancel)
        else:  # pragma: no cover - the sets shrink at every step
            raise RuntimeError("chi2 alpha: the active set did not settle in "
                               f"{CHI2_MAX_STEPS} steps")
        k, P, S, S2, swd, swd2, sd, sdd, SL = _add(self.run(block_chi2, h, side, theta2, shift,
                                                           alpha))
        term = (S + S2 / (2.0 * two) - theta2 * (N - P)) / N - alpha
        mu = swd / N
        curv = (swd2 + max(sdd - sd * sd / P, 0.0) / two) / N
        return term + shift, mu, curv, alpha - shift, shift, alpha

    def kinks_between(self, key_lo, key_hi, h_lo: float, h_hi: float):
        """(count, smallest, largest, middle) of the kinks strictly inside ``(h_lo, h_hi)``."""
        if not self.kinks:
            return 0, math.nan, math.nan, math.nan
        parts = self.run(block_kinks, key_lo[0], key_lo[1], key_hi[0], key_hi[1])
        cnt = sum(q[0] for q in parts)
        if not cnt:
            return 0, math.nan, math.nan, math.nan
        lo = min(q[1] for q in parts)
        hi = max(q[2] for q in parts)
        return cnt, lo, hi, 0.5 * (lo + hi)
