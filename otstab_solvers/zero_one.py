"""Exact 0/1-loss duals from the distances to the nearest misclassified point.

With ``a_i = theta1 * d*_i`` (``inf`` when a sample cannot be misclassified by moving, e.g.
theta1 = inf), the d-transform of the 0/1 loss is ``l_h(z_i) = (h - a_i)_+`` (MATH.md).

KL (closed form, O(n log n)): sort ``a``; on the segment where the first ``j`` sorted samples
are "moved" (``a_(j) < h < a_(j+1)``) the stationarity condition of
``F(h) = h r - theta2 log mean exp(l_h/theta2)`` reads

    exp(h/theta2) = r (n - j) / ((1 - r) sum_{i <= j} exp(-a_i/theta2)),

so the optimum is the first segment whose candidate does not exceed its right end: inside the
segment if the candidate is at least its left end, otherwise at the kink ``a_(j)``.
theta2 = inf: ``F'(h) = r - j/n`` on segment j, so ``h* = a_(ceil(r n))``.
chi2: the dual is piecewise quadratic; it is solved by the kink-exact dual solver on
:class:`DistanceOracle` (Newton on smooth segments, exact at breakpoints).
"""

from __future__ import annotations

import math
import time

import numpy as np

from .dual import solve_dual
from .result import FAILED, OPTIMAL, DualSolution
from .sorted_oracle import SortedTwoPiece, _Keys
from .weights import chi2_alpha, chi2_dual_term, kl_dual_term

__all__ = ["DistanceOracle", "solve_zero_one", "solve_window", "solve_window_chi2",
           "zero_one_objective"]


class DistanceOracle:
    """``l_h = (h - a_i)_+`` as a two-piece oracle (stay: 0, move: h - a_i).

    ``prefix`` is the sorted view ``solve_dual`` evaluates from (one sort of ``a``, skipped
    when ``presorted``): O(log n) per evaluation for chi2 and theta2 = inf.
    """

    h_max = math.inf

    def __init__(self, a, *, presorted: bool = False):
        self.a = np.asarray(a, dtype=np.float64)
        self.n = self.a.size
        # the keys u = -a in the ascending order of -u: a itself when presorted (no copy),
        # else one sorted copy (not -(-a) through a temporary: one n-vector less at the peak)
        nu = self.a if presorted else np.sort(self.a)
        self.prefix = SortedTwoPiece(None, "distance", _sorted=_Keys.of_sorted(nu))

    def evaluate(self, h, *, side="right", with_pieces=False):
        a = self.a
        lh = np.maximum(h - a, 0.0)
        k = (h > a) | ((h == a) & (side == "right"))
        d1 = k.astype(np.float64)
        d2 = np.zeros(self.n)
        if with_pieces:
            return lh, d1, d2, k.astype(np.intp)
        return lh, d1, d2

    def crossings(self, ka, kb, idx):
        return self.a[idx].copy()


def zero_one_objective(a, h, r, theta2, divergence):
    lh = np.maximum(h - np.asarray(a), 0.0)
    if divergence == "kl" or math.isinf(theta2):
        return h * r - kl_dual_term(lh, theta2)
    return h * r - chi2_dual_term(lh, theta2)


class _PrefixSums:
    """``S(j) = sum_{i<j} x_i`` at any j in O(block) after one blocked pass (no full cumsum:
    a bisection needs only O(log n) of them). ``x`` is an array, or ``(values, size)`` with
    ``values(i, j)`` computing ``x[i:j]`` (no n-vector of x is made)."""

    BLOCK = 4096
    #: blocks computed at a time from ``values`` (temporaries of 512 KB)
    CHUNK = 16

    def __init__(self, x):
        if isinstance(x, tuple):
            self._values, size = x
        else:
            self._values, size = (lambda i, j: x[i:j]), x.size
        nb = size // self.BLOCK
        self.cum = np.zeros(nb + 1)
        if nb:
            sums = np.empty(nb)
            for b0 in range(0, nb, self.CHUNK):
                b1 = min(b0 + self.CHUNK, nb)
                xb = self._values(b0 * self.BLOCK, b1 * self.BLOCK)
                sums[b0:b1] = xb.reshape(b1 - b0, self.BLOCK).sum(axis=1)
            np.cumsum(sums, out=self.cum[1:])

    def __call__(self, j: int) -> float:
        b = min(j // self.BLOCK, self.cum.size - 1)
        return float(self.cum[b]) + float(self._values(b * self.BLOCK, j).sum())


def _sum_below(h: float, s: np.ndarray, j: int) -> float:
    """``sum_{i < j} (h - s_i)`` over blocks of :data:`_PrefixSums.BLOCK` prices (``s``
    ascending, ``s_i < h`` for ``i < j``: the samples with ``l_h = h - s_i > 0``)."""
    step = _PrefixSums.BLOCK * _PrefixSums.CHUNK
    buf = np.empty(min(step, j))
    total = 0.0
    for i in range(0, j, step):
        part = np.subtract(h, s[i:min(i + step, j)], out=buf[:min(step, j - i)])
        total += float(part.sum())
    return total


def solve_zero_one(a, r: float, theta2: float, divergence: str, *,
                   method: str = "closed_form", presorted: bool = False,
                   p=None, n: int | None = None) -> DualSolution:
    """Solve the 0/1 dual exactly. ``method``: "closed_form" (KL and theta2 = inf) or "dual".

    ``a`` must be nonnegative (``inf`` allowed). The caller decides reachability first
    (``r <= max loss`` when samples cannot move). ``presorted=True`` skips the sort when ``a``
    is already ascending (feature scores reuse one sort: d*_ij = m_i^2 / beta_j^2).
    ``p``: probabilities of the samples (None: uniform); the dual then depends on the samples
    of positive probability only and is solved by the kink-exact dual on them.
    ``n``: the number of samples when ``a`` holds only the smallest of their prices (ascending,
    every price up to ``a[-1]``; the closed form of KL and theta2 = inf with ``r < 1``, which
    moves at most ``r n`` samples, the cheapest). When the answer would need a price beyond
    those held, the status is FAILED with ``native_status`` "needs more prices".
    """
    t0 = time.perf_counter()
    a = np.asarray(a, dtype=np.float64)
    if p is not None:
        live = np.asarray(p) > 0
        a, p = a[live], np.asarray(p, dtype=np.float64)[live]
        method = "dual"
    partial = n is not None and n > a.size
    if partial and not (presorted and method == "closed_form" and r < 1.0 and p is None
                        and (divergence == "kl" or math.isinf(theta2))):
        raise ValueError("the smallest prices alone serve the KL or theta2 = inf closed form "
                         "with r < 1, sorted and uniform")
    n = a.size if n is None else int(n)
    more = DualSolution(math.nan, None, math.nan, FAILED, "zero_one_closed_form",
                        "needs more prices")
    if r >= 1.0 and np.all(np.isfinite(a)) and float(np.mean(a == 0)) < 1.0:
        # F'(h) = 1 - E_w[1{h > a_i}] >= 0, and = 0 once every sample moves: h* = max a. For
        # h >= max a, l_h = h - a and the divergence terms shift with h (T(l + c) = T(l) + c),
        # so F(h) = h - T(h - a) = -T(-a): computed in that form, without the cancellation of
        # two numbers of size h
        h = float(a.max())
        if divergence == "kl" or math.isinf(theta2):
            value = -kl_dual_term(-a, theta2, p)
            alpha = None if divergence == "kl" else 0.0
        else:
            alpha_neg = chi2_alpha(-a, theta2, p)
            value = -chi2_dual_term(-a, theta2, alpha_neg, p)
            alpha = alpha_neg - h  # the alpha of l_h = h - a
        return DualSolution(h, alpha, float(value), OPTIMAL,
                            "zero_one_closed_form", "r = 1: every sample moves", iterations=1,
                            gap_bound=0.0, solve_time=time.perf_counter() - t0,
                            info={"value_rounding": 4e-15 * (abs(value) + float(a.min()))})
    if method == "dual" or (divergence == "chi2" and not math.isinf(theta2)):
        sol = solve_dual(DistanceOracle(a, presorted=presorted), r, theta2, divergence, p=p)
        sol.solver = "zero_one_dual"
        return sol
    s = a if presorted else np.sort(a)
    j0 = int(s.searchsorted(0.0, side="right"))  # samples misclassified at zero cost
    if r <= j0 / n:
        return DualSolution(0.0, None if divergence == "kl" else 0.0, 0.0, OPTIMAL,
                            "zero_one_closed_form", "r <= base risk",
                            solve_time=time.perf_counter() - t0, gap_bound=0.0)
    n_fin = int(s.searchsorted(np.inf, side="left"))  # sorted: the infinite ones are last
    if math.isinf(theta2):
        J = int(math.ceil(r * n - 1e-12 * n))
        J = max(J, 1)
        if J > n_fin:
            if partial:
                return more
            return DualSolution(math.nan, None, math.inf, FAILED, "zero_one_closed_form",
                                "unreachable", solve_time=time.perf_counter() - t0)
        h = float(s[J - 1])
    else:
        if r >= 1.0:
            if n_fin < n:
                return DualSolution(math.nan, None, math.inf, FAILED, "zero_one_closed_form",
                                    "unreachable", solve_time=time.perf_counter() - t0)
            h = float(s[-1])
        else:
            # prefix sums S_j = sum_{i<=j} exp(-a_(i)/theta2), shifted by the first (largest)
            # term; the stationarity candidate of segment j is
            # h_j = theta2 (log(r (n - j) / (1 - r)) - log S_j), and the optimum lies in the
            # first segment whose candidate does not exceed its right end: found by bisection
            # over j (the condition is monotone), so beyond the sort the work is one exp and
            # one cumsum pass
            if n_fin == 0 or (partial and n_fin < 2):
                if partial:
                    return more
                return DualSolution(math.nan, None, math.inf, FAILED, "zero_one_closed_form",
                                    "unreachable", solve_time=time.perf_counter() - t0)
            # e_i = exp(-(a_(i) - a_(0))/theta2) in one buffer, in place; the bisection needs
            # the prefix sums S_j = sum_{i<j} e_i at O(log n) points only: from block sums
            b0 = -float(s[0]) / theta2
            clamp = (float(s[0]) - float(s[n_fin - 1])) / theta2 < -700.0

            def e_block(i, j):  # e_i of sorted positions i..j, computed where summed
                e = np.subtract(s[0], s[i:min(j, n_fin)])
                e *= 1.0 / theta2
                if clamp:
                    np.maximum(e, -700.0, out=e)
                return np.exp(e, out=e)

            prefix = _PrefixSums((e_block, n_fin))

            def cand(j):  # j = 1..n_fin samples moved
                return theta2 * (math.log(r * (n - j) / (1.0 - r)) - b0 - math.log(prefix(j))) \
                    if j < n else -math.inf

            def right_end(j):
                return float(s[j]) if j < n_fin else math.inf

            # search the first j with cand(j) <= right_end(j); with only the smallest prices
            # held, the last segment whose right end is known (a[-1])
            lo_j, hi_j = max(j0, 1), (n_fin - 1 if partial else n_fin)
            if lo_j > hi_j or not cand(hi_j) <= right_end(hi_j):
                if partial:
                    return more
                return DualSolution(math.nan, None, math.inf, FAILED, "zero_one_closed_form",
                                    "no segment holds the root",
                                    solve_time=time.perf_counter() - t0)
            jj = _first_root_segment(cand, right_end, lo_j, hi_j)
            hj = cand(jj)
            h = hj if hj >= s[jj - 1] else float(s[jj - 1])
            h = max(h, 0.0)
            # the value in closed form from the same prefix sum (no further pass)
            if math.isfinite(theta2):
                j_in = int(s.searchsorted(h, side="left"))  # samples with a_i < h
                n_tied = int(s.searchsorted(h, side="right")) - j_in
                # sum_i exp(l_h/theta2) = A + (n - j_in), A = exp(h/theta2) S_(j_in), in logs
                log_a = (h / theta2 + b0 + math.log(prefix(j_in))) if j_in > 0 \
                    else -math.inf
                log_tot = np.logaddexp(log_a, math.log(n - j_in)) if j_in < n else log_a
                if j_in > 0 and (h - float(s[0])) / theta2 < 0.5:
                    # every exponent is small (theta2 large against the distances): the mean
                    # of exp is close to 1 and its log would keep only rounding (times
                    # theta2); sum expm1 over the moved samples instead (O(j_in))
                    m1 = 0.0
                    for i in range(0, j_in, _PrefixSums.BLOCK * _PrefixSums.CHUNK):
                        x = np.subtract(h, s[i:min(i + _PrefixSums.BLOCK * _PrefixSums.CHUNK,
                                                   j_in)])
                        x /= theta2
                        m1 += float(np.sum(np.expm1(x, out=x)))
                    value = h * r - theta2 * math.log1p(m1 / n)
                else:
                    value = h * r - theta2 * (float(log_tot) - math.log(n))
                info = {  # what Q* looks like, in O(1): feature scores use it for the shares
                    "n_moved": j_in, "n_tied": n_tied,
                    "moved_weight": math.exp(log_a - log_tot),  # E_Q*[W 1(moved)]
                    "unit_weight": math.exp(-log_tot) * n,      # weight of an unmoved sample
                }
                return DualSolution(h, None if divergence == "kl" else 0.0, float(value),
                                    OPTIMAL, "zero_one_closed_form", "closed form",
                                    iterations=1, gap_bound=0.0,
                                    solve_time=time.perf_counter() - t0, info=info)
    alpha = None if divergence == "kl" else 0.0
    if math.isinf(theta2):
        # (partial: the samples not held have l_h = 0) the mean of l_h = (h - a)_+ over
        # blocks of the sorted prices below h (no n-vector of l_h: at r near 1 it was two)
        value = h * r - _sum_below(h, s, int(s.searchsorted(h, side="left"))) / n
    else:
        value = float(zero_one_objective(a, h, r, theta2, divergence))
    return DualSolution(h, alpha, value, OPTIMAL, "zero_one_closed_form", "closed form",
                        iterations=1, gap_bound=0.0, solve_time=time.perf_counter() - t0)


def _first_root_segment(cand, right_end, lo: int, hi: int) -> int:
    """The first segment ``j`` in ``[lo, hi]`` whose candidate root lies at or below its right
    end (``cand(j) <= right_end(j)``, which holds from some ``j`` on and at ``hi``), by
    bisection."""
    while lo < hi:
        mid = (lo + hi) // 2
        if cand(mid) <= right_end(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _window_prices(s, below: int, j0: int, n_fin: int):
    """``(price, right_end)`` of a window ``s`` of the sorted prices starting at position
    ``below``: ``price(j)``, the j-th smallest price (0-based: in the window, or 0 below the
    ``j0`` zero prices; IndexError elsewhere), and ``right_end(j)``, the right end of segment
    ``j`` (``inf`` from the ``n_fin``-th on: infinite prices)."""
    m = s.size

    def price(j):
        if below <= j < below + m:
            return float(s[j - below])
        if j < j0:
            return 0.0
        raise IndexError(j)

    def right_end(j):
        return price(j) if j < n_fin else math.inf

    return price, right_end


def _window_root(cand, right_end, price, *, j0, n_fin, below, hi_known, lo):
    """The optimal h of a window's closed form (:func:`solve_window`,
    :func:`solve_window_chi2`), or None when the window does not hold it: the first segment
    ``j`` (the j cheapest samples move) whose candidate ``cand(j)`` does not exceed its right
    end, by bisection over the segments the window knows, and the candidate or, below it, the
    segment's left end ``price(j - 1)``."""
    lo_j, hi_j = max(j0, 1), n_fin
    a_j, b_j = max(lo_j, below), min(hi_j, hi_known)
    if a_j > b_j:
        return None
    if a_j > lo_j and cand(a_j) <= right_end(a_j):
        return None  # the first such segment may lie below the window
    if not cand(b_j) <= right_end(b_j):
        return None  # beyond the window (or no segment holds the root: the full form says)
    jj = _first_root_segment(cand, right_end, a_j, b_j)
    if jj - 1 < below and jj - 1 >= j0:
        return None
    hj = cand(jj)
    left = price(jj - 1)
    h = max(hj if hj >= left else left, 0.0)
    if h <= 0.0 or (h < lo and below):
        return None
    return h


def solve_window(window, r: float, theta2: float, divergence: str, n: int, *, below: int,
                 below_exp: float, below_gap: float, lo: float, n_zero: int, n_fin: int,
                 top: bool, below_em1: float = math.nan) -> DualSolution | None:
    """The KL (or theta2 = inf) closed form of :func:`solve_zero_one` from a window of the
    sorted prices: the same segments and stationarity candidates, with the prices below the
    window summarised, so that only the window is sorted (the rest is one pass over the rows,
    by the caller).

    ``window``: the prices ``a_i`` in ``[lo, hi]``, ascending (finite); ``below``: how many
    prices are ``< lo`` (every one finite), ``below_exp`` the sum over them of
    ``exp(max(-a_i / theta2, -700))`` (the closed form's terms shifted by the smallest price,
    which is 0: ``n_zero >= 1`` prices are 0), ``below_gap`` the sum of ``lo - a_i`` over them
    (theta2 = inf); ``n_fin`` the number of finite prices; ``top``: the window holds every
    finite price ``>= lo``; ``below_em1`` the sum of ``expm1((lo - a_i) / theta2)`` over the
    prices below ``lo`` (NaN: not summed), for answers with every exponent small, where the
    closed form sums ``expm1((h - a_i) / theta2) = expm1(x) (1 + expm1(y_i)) + expm1(y_i)``
    with ``x = (h - lo) / theta2``, ``y_i = (lo - a_i) / theta2`` (terms of one sign).
    ``r < 1``, uniform samples.

    Returns None when the window does not hold the answer (the first segment whose candidate
    does not exceed its right end, and the price at its left end), or when the closed form
    would need the prices below the window one by one (every exponent small: its ``expm1``
    sum): the caller then widens it or sorts every price. Otherwise the same solution as
    :func:`solve_zero_one` on all sorted prices, up to the order of the sums.
    """
    t0 = time.perf_counter()
    s = np.asarray(window, dtype=np.float64)
    m = s.size
    if n_zero < 1 or not 0.0 <= r < 1.0 or m == 0:
        return None
    if lo <= 0.0 and below:
        raise ValueError("prices below a window starting at 0")
    j0 = n_zero
    if r <= j0 / n:  # (the caller checks the base risk first; kept as the full form does)
        return None
    hi_known = below + m if top else below + m - 1  # the largest j whose right end is known

    price, right_end = _window_prices(s, below, j0, n_fin)
    if math.isinf(theta2):
        J = max(int(math.ceil(r * n - 1e-12 * n)), 1)
        if J > n_fin:
            return None
        if not below <= J - 1 < below + m:
            return None
        h = float(s[J - 1 - below])
        # sum of (h - a_i) over a_i < h: the window's rows below h, and those below the
        # window as (h - lo) + (lo - a_i) (terms of one sign: no cancellation)
        k = int(s.searchsorted(h, side="left"))
        inside = float(np.sum(h - s[:k])) if k else 0.0
        total = inside + below * (h - lo) + below_gap if below else inside
        value = h * r - total / n
        return DualSolution(h, None if divergence == "kl" else 0.0, value, OPTIMAL,
                            "zero_one_closed_form", "closed form", iterations=1,
                            gap_bound=0.0, solve_time=time.perf_counter() - t0)
    cum = np.cumsum(np.exp(np.maximum(s * (-1.0 / theta2), -700.0)))

    def prefix(j):  # sum_{i<j} e_i, j >= below
        return below_exp + (float(cum[j - below - 1]) if j > below else 0.0)

    def cand(j):
        return theta2 * (math.log(r * (n - j) / (1.0 - r)) - math.log(prefix(j))) \
            if j < n else -math.inf

    h = _window_root(cand, right_end, price, j0=j0, n_fin=n_fin, below=below,
                     hi_known=hi_known, lo=lo)
    if h is None:
        return None
    j_in = below + int(s.searchsorted(h, side="left"))
    n_tied = below + int(s.searchsorted(h, side="right")) - j_in
    log_a = h / theta2 + math.log(prefix(j_in))
    log_tot = np.logaddexp(log_a, math.log(n - j_in)) if j_in < n else log_a
    if h / theta2 < 0.5:
        # every exponent small: the mean of exp is close to 1 and its log would keep only
        # rounding; sum expm1 over the moved prices instead (the full form's branch)
        if below and not math.isfinite(below_em1):
            return None
        x = np.subtract(h, s[:j_in - below])
        x /= theta2
        m1 = float(np.sum(np.expm1(x, out=x)))
        if below:
            m1 += math.expm1((h - lo) / theta2) * (below_em1 + below) + below_em1
        value = h * r - theta2 * math.log1p(m1 / n)
    else:
        value = h * r - theta2 * (float(log_tot) - math.log(n))
    info = {"n_moved": j_in, "n_tied": n_tied, "moved_weight": math.exp(log_a - log_tot),
            "unit_weight": math.exp(-log_tot) * n, "window": m}
    return DualSolution(h, None, float(value), OPTIMAL, "zero_one_closed_form", "closed form",
                        iterations=1, gap_bound=0.0, solve_time=time.perf_counter() - t0,
                        info=info)


def solve_window_chi2(window, r: float, theta2: float, n: int, *, below: int, lo: float,
                      d1: float, d2: float, a1: float, n_zero: int, n_fin: int,
                      top: bool) -> DualSolution | None:
    """The chi2 dual (finite theta2, ``r < 1``, uniform samples) in closed form from a window
    of the sorted prices, as :func:`solve_window` for KL.

    At the optimum every sample keeps a positive weight (Q* moves mass r < 1, so the unmoved
    samples, whose weight is the smallest, keep some), so ``alpha = -m`` with ``m`` the mean
    of ``l_h = (h - a)_+``, ``w_i = 1 + (l_i - m) / (2 theta2)`` and
    ``F(h) = h r - m - var(l_h) / (4 theta2)``; on the segment where the ``j`` cheapest
    samples move (``p = j / n``) ``F'(h) = r - p - m (1 - p) / (2 theta2)``, zero at
    ``m = 2 theta2 (r - p) / (1 - p)``. F is concave, so the optimum is in the first segment
    whose stationary point does not exceed its right end (at its left end, a kink, when the
    point lies below it), found by bisection over j.

    ``window``: the prices in ``[lo, hi]`` ascending (finite); ``below`` how many are below
    ``lo``, ``d1`` and ``d2`` the sums of ``lo - a_i`` and its square over them, ``a1`` the
    sum of their prices; ``n_zero``
    prices of 0 (at least one); ``n_fin`` finite prices; ``top``: the window holds every
    finite price ``>= lo``. None when the window does not hold the answer, or when the value
    would keep less than 1e-13 of its terms: the caller widens it or solves the dual on every
    price."""
    t0 = time.perf_counter()
    s = np.asarray(window, dtype=np.float64)
    m_w = s.size
    if n_zero < 1 or not 0.0 <= r < 1.0 or m_w == 0 or not 0.0 < theta2 < math.inf:
        return None
    if lo <= 0.0 and below:
        raise ValueError("prices below a window starting at 0")
    j0 = n_zero
    if r <= j0 / n:
        return None
    hi_known = below + m_w if top else below + m_w - 1
    # D1_j = sum_{i<j} (lo - a_i): below the window d1, then the window's (negative) terms
    cum = np.cumsum(lo - s)

    def dsum(j):  # D1_j, j >= below
        return d1 + (float(cum[j - below - 1]) if j > below else 0.0)

    price, right_end = _window_prices(s, below, j0, n_fin)
    def cand(j):  # the stationary point of segment j (j samples move)
        p = j / n
        if j >= n:
            return -math.inf
        mstar = 2.0 * theta2 * (r - p) / (1.0 - p)
        return lo + (n * mstar - dsum(j)) / j

    h = _window_root(cand, right_end, price, j0=j0, n_fin=n_fin, below=below,
                     hi_known=hi_known, lo=lo)
    if h is None:
        return None
    # the value as h (r - p) + mean(a 1[moved]) - var(l_h) / (4 theta2) (h r - m without its
    # cancellation), var about m: l_i - m = (h - lo - m) + (lo - a_i) below the window, h - a_i
    # - m in it, -m for the rows that stay
    j_in = below + int(s.searchsorted(h, side="left"))  # samples with a_i < h
    p = j_in / n
    delta = h - lo
    win = s[:j_in - below]
    lw = h - win
    m = (below * delta + d1 + float(np.sum(lw))) / n
    x = delta - m
    cw = lw - m
    v2 = below * x * x + 2.0 * x * d1 + d2 + float(np.dot(cw, cw)) + (n - j_in) * m * m
    var = v2 / n
    s1 = (a1 + float(np.sum(win))) / n
    value = h * (r - p) + s1 - var / (4.0 * theta2)
    # rounding of the terms (var's against the sum of the magnitudes of its terms)
    mag = below * x * x + 2.0 * abs(x) * d1 + d2 + float(np.dot(cw, cw)) + (n - j_in) * m * m
    err = 16.0 * np.finfo(float).eps * (abs(h * (r - p)) + s1 + mag / (4.0 * theta2 * n))
    if not (var >= 0.0 and err <= 1e-13 * abs(value)):
        return None
    return DualSolution(h, -m, float(value), OPTIMAL, "zero_one_closed_form",
                        "closed form (chi2)", iterations=1, gap_bound=0.0,
                        solve_time=time.perf_counter() - t0,
                        info={"moved": j_in, "window": m_w})
