"""Weights of the most sensitive distribution and the phi-divergence pieces of the dual.

For the KL divergence, ``w_i = exp(l_i/theta2) / mean_j exp(l_j/theta2)`` (a softmax times n);
for chi2, ``w_i = ((l_i + alpha)/(2 theta2) + 1)_+`` where ``alpha`` solves
``mean_i ((l_i + alpha)/(2 theta2) + 1)_+ = 1`` (Remark 5 of the paper), found exactly by a sort.
Both accept ``theta2 = inf`` (no reweighting: all weights 1).

Every function takes an optional ``p``: probabilities of the samples (sample weights
normalised to sum 1; None: uniform, 1/n each, computed by the plain means). With ``p`` every
mean over samples is the p-weighted sum (the evaluation distribution is sum_i p_i delta_{z_i}),
and the weights are likelihood ratios with respect to it: ``sum_i p_i w_i = 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

__all__ = [
    "ScaledWeights",
    "dense",
    "pmean",
    "support_max",
    "weights_at",
    "WeightMap",
    "weight_map",
    "kl_weight_map_blocks",
    "logmeanexp",
    "log_mean_shifted",
    "kl_weights",
    "kl_dual_term",
    "chi2_alpha",
    "chi2_weights",
    "chi2_solution",
    "chi2_dual_term",
    "chi2_term_at",
    "phi",
]


class ScaledWeights(NDArrayOperatorsMixin):
    """Sample probabilities ``p_i = w_i / total`` read from the weights ``w`` where they are
    needed: ``p[key]`` is ``w[key] / total`` (a slice, rows or a mask; the same bits as the
    n-vector ``w / total`` holds there), so that the solvers' passes over blocks of rows hold
    no n-vector of probabilities. ``array()``: the n-vector itself, built on first call and
    kept. Any other NumPy use (``np.asarray(p)``, ``p @ x``, ``p > 0``) reads that n-vector:
    the values are always right; the paths that keep memory low slice instead.
    ``w``: float64, 1-D; ``owned``: ``w`` is this object's own (else the caller's, read
    through a view), so that with ``total = 1.0`` it is the n-vector itself."""

    __hash__ = object.__hash__  # (the operators compare elementwise; identity hashes)

    def __init__(self, w: np.ndarray, total: float, *, owned: bool = False):
        self.w, self.total, self.owned = w, float(total), owned
        self._array: np.ndarray | None = None
        #: ``check(what)``, called before the n-vector is built (e.g. a check that the
        #: caller's ``w`` did not change since it was read; ``what``: the reading)
        self.check: Any = None

    @property
    def size(self) -> int:
        return int(self.w.size)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.w.shape

    ndim = 1
    dtype = np.dtype(np.float64)

    def __len__(self) -> int:
        return int(self.w.size)

    def __iter__(self):
        return iter(self.array())

    def __getitem__(self, key):
        if self._array is not None:
            return self._array[key]
        return self.w[key] / self.total

    def unchanged(self, what: str) -> None:
        """Run ``check(what)`` unless the n-vector is built (it holds the values read)."""
        if self._array is None and self.check is not None:
            self.check(what)

    def array(self) -> np.ndarray:
        """``w / total``: the probabilities as an n-vector (built once; read-only)."""
        if self._array is None:
            if self.check is not None:
                self.check("the sample probabilities")
            out = self.w if self.owned and self.total == 1.0 else self.w / self.total
            out.setflags(write=False)
            self._array = out
        return self._array

    def __array__(self, dtype=None, copy=None):
        out = self.array()
        out = out if dtype is None else out.astype(dtype, copy=False)
        return out.copy() if copy and out is self._array else out

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(x.array() if isinstance(x, ScaledWeights) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __getattr__(self, name):  # sum, max, copy, astype, ...: those of the n-vector
        if name.startswith("_") or name in ("w", "total", "owned", "check"):
            raise AttributeError(name)  # (private probes, e.g. pandas', build nothing)
        return getattr(self.array(), name)

    def __reduce__(self):  # pickled as the probabilities
        return (_unpickle, (self.array(),))

    def __repr__(self) -> str:
        return f"ScaledWeights(n={self.size}, total={self.total:.6g})"


def _unpickle(p):
    return ScaledWeights(p, 1.0, owned=True)


def dense(p):
    """``p`` as an n-vector of probabilities (None stays None): the n-vector of a
    :class:`ScaledWeights`, an array as it is."""
    return p.array() if isinstance(p, ScaledWeights) else p


#: rows per block of :func:`pmean` over a non-float array (the cast of each block)
PMEAN_BLOCK = 1 << 15


def pmean(x: np.ndarray, p: np.ndarray | None = None) -> float:
    """mean(x), or sum_i p_i x_i with probabilities ``p`` (over blocks of rows when ``x``
    is not float64, e.g. booleans: ``np.dot`` would cast all of it to one float copy; and
    when ``p`` is a :class:`ScaledWeights`, read by slices)."""
    if p is None:
        return float(np.mean(x))
    x = np.asarray(x)
    if x.ndim != 1 or (not isinstance(p, ScaledWeights) and (x.dtype == np.float64 or
                                                             x.size <= PMEAN_BLOCK)):
        return float(np.dot(p, x))
    return sum((float(np.dot(p[s:s + PMEAN_BLOCK], x[s:s + PMEAN_BLOCK]))
                for s in range(0, x.size, PMEAN_BLOCK)), 0.0)


def support_max(a: np.ndarray, p: np.ndarray | None) -> float:
    """The largest entry of ``a`` among the samples of positive probability."""
    if p is None:
        return float(np.max(a))
    return float(np.max(a[p > 0]))


def log_mean_shifted(a: np.ndarray, m: float, e: np.ndarray, p=None) -> float:
    """log(mean(exp(a - m))) given ``e = exp(a - m)`` (clamped at exp(-700)).

    When the mean is close to 1 (every ``a_i`` close to the largest, as when theta2 is huge
    against the losses) ``log(mean)`` keeps only the rounding of the mean: ``theta2 * log``
    then turns an error of 1e-16 into one of 1e-16 theta2. There the mean of ``expm1`` and
    ``log1p`` are used instead, which keep full relative accuracy.
    """
    s = pmean(e, p)
    if s > 0.5:
        return math.log1p(pmean(np.expm1(np.maximum(a - m, -700.0)), p))
    return math.log(s)


def logmeanexp(a: np.ndarray, p=None) -> float:
    """log(mean(exp(a))) computed stably (terms below exp(-700) of the largest are clamped
    there: they are far below rounding, and subnormal arithmetic is very slow), with full
    relative accuracy also when every term is close to the largest."""
    a = _on_support(np.asarray(a, dtype=np.float64), p)
    m = support_max(a, p)
    if not math.isfinite(m):
        return m
    return m + log_mean_shifted(a, m, np.exp(np.maximum(a - m, -700.0)), p)


def _on_support(a: np.ndarray, p) -> np.ndarray:
    """``a`` with the samples of zero probability at -inf: they are not part of P0, and an
    exponent of theirs far above the support's would overflow ``exp``."""
    return a if p is None else np.where(np.asarray(p) > 0, a, -np.inf)


def kl_dual_term(lh: np.ndarray, theta2: float, p=None) -> float:
    """theta2 * log mean exp(lh / theta2); the mean of lh when theta2 = inf."""
    if math.isinf(theta2):
        return pmean(lh, p)
    return theta2 * logmeanexp(np.asarray(lh) / theta2, p)


def kl_weights(lh: np.ndarray, theta2: float, p=None) -> np.ndarray:
    """Weights w_i = n softmax_i(lh / theta2), so that mean(w) = 1 (with ``p``:
    exp(lh_i/theta2) / sum_j p_j exp(lh_j/theta2), so that sum p w = 1)."""
    return weight_map(lh, theta2, "kl", p)(lh)


def chi2_alpha(lh: np.ndarray, theta2: float, p=None) -> float:
    """The alpha solving mean_i ((lh_i + alpha)/(2 theta2) + 1)_+ = 1, exactly (O(n log n)).

    With u_i = lh_i / (2 theta2) and beta = alpha / (2 theta2) + 1, the equation is
    mean_i (u_i + beta)_+ = 1. The left side is piecewise linear and increasing in beta; if
    the top-k values of u are the active ones, beta = (n - sum_{top k} u) / k, valid when
    beta + u_(k) > 0 >= beta + u_(k+1).
    """
    lh = np.asarray(lh, dtype=np.float64)
    n = lh.size
    if math.isinf(theta2):
        return 0.0
    if p is not None:
        return _chi2_alpha_weighted(lh, theta2, p)
    # in alpha itself (not beta = alpha / (2 theta2) + 1, whose rounding near 1 would cost
    # 2 theta2 eps): with the top k active, sum_{top k} (lh_i + alpha + 2 theta2) = 2 theta2 n
    u = np.sort(lh)[::-1]
    k = np.arange(1, n + 1)
    csum = np.cumsum(u)
    alpha = (2.0 * theta2 * (n - k) - csum) / k
    # u_k + alpha_k + 2 theta2 > 0, i.e. 2 theta2 n > sum_{i<=k} (u_i - u_k): written so that
    # k = 1 is valid exactly (the sum is 0), whatever the size of u against theta2
    valid = 2.0 * theta2 * n > csum - k * u
    kk = int(np.nonzero(valid)[0][-1])
    a = float(alpha[kk])
    # one Newton step on mean(w) = 1 (w is linear in alpha on the active set): removes the
    # rounding of the closed form when the losses are large against theta2
    w = np.maximum((lh + a) / (2.0 * theta2) + 1.0, 0.0)
    k_act = int(np.count_nonzero(w))
    if k_act:
        a -= 2.0 * theta2 * (float(np.mean(w)) - 1.0) * n / k_act
    return a


def _chi2_alpha_weighted(lh, theta2, p):
    """:func:`chi2_alpha` with probabilities ``p``: with the top k (in decreasing ``lh``, over
    the samples of positive probability) active, P_k = sum_{top k} p and S_k = sum_{top k} p lh,
    alpha = (2 theta2 (1 - P_k) - S_k) / P_k, valid when 2 theta2 > S_k - lh_(k) P_k."""
    live = p > 0
    order = np.argsort(-lh[live], kind="stable")
    u = lh[live][order]
    q = p[live][order]
    P = np.cumsum(q)
    S = np.cumsum(q * u)
    valid = 2.0 * theta2 > S - u * P
    kk = int(np.nonzero(valid)[0][-1])
    # 1 - P_k as the mass of the inactive samples (0 when all are active), not as 1 - P_k:
    # the rounding of the cumulative sum P_k near 1, times 2 theta2, would be alpha's error
    rest = float(np.sum(q[kk + 1:]))
    a = float((2.0 * theta2 * rest - S[kk]) / P[kk])
    w = np.maximum((lh + a) / (2.0 * theta2) + 1.0, 0.0)
    p_act = float(np.sum(p[w > 0]))
    resid = float(np.dot(p, w)) - 1.0
    # one Newton step on E_p[w] = 1 when the residual is above the rounding of the sum itself
    # (below it the step would only add that rounding, times 2 theta2)
    if p_act > 0 and abs(resid) > 8.0 * np.finfo(float).eps:
        a -= 2.0 * theta2 * resid / p_act
    return a


def chi2_weights(lh: np.ndarray, theta2: float, alpha: float | None = None) -> np.ndarray:
    """w_i = ((lh_i + alpha)/(2 theta2) + 1)_+; mean(w) = 1 at the exact alpha.

    Without ``alpha`` the weights come from :func:`chi2_solution` (shifted by the largest
    ``lh``, accurate also when ``lh`` is large against theta2)."""
    lh = np.asarray(lh, dtype=np.float64)
    if math.isinf(theta2):
        return np.ones_like(lh)
    if alpha is None:
        return chi2_solution(lh, theta2)[0]
    return np.maximum((lh + alpha) / (2.0 * theta2) + 1.0, 0.0)


def chi2_solution(lh: np.ndarray, theta2: float, p=None):
    """``(w, alpha, term)``: the chi2 weights, alpha and the dual's subtracted term, computed
    on ``lh - max(lh)`` (the weights depend on ``lh + alpha`` only, and the term shifts with
    ``lh``). Without the shift, ``lh + alpha`` cancels two numbers of the size of ``lh``, and
    when those are large against theta2 the weights lose their accuracy (a total mass off by
    1e-6 with ``lh ~ 1e6``, theta2 = 1e-6)."""
    lh = np.asarray(lh, dtype=np.float64)
    if math.isinf(theta2):
        return np.ones_like(lh), 0.0, pmean(lh, p)
    m = support_max(lh, p)
    ls = lh - m
    a = chi2_alpha(ls, theta2, p)
    w = np.maximum((ls + a) / (2.0 * theta2) + 1.0, 0.0)
    return w, a - m, chi2_term_at(ls, theta2, a, p) + m


#: rows per block of the blockwise sums (cache-sized temporaries, no n-vector is allocated)
BLOCK = 1 << 15


def weights_at(lh: np.ndarray, theta2: float, divergence: str, p=None):
    """``(w, alpha)``: the weights of the most sensitive distribution at the values ``lh`` of
    l_h, and chi2's alpha (None for KL; 0 when theta2 = inf)."""
    wm = weight_map(lh, theta2, divergence, p)
    return wm(lh), wm.alpha


@dataclass(frozen=True)
class WeightMap:
    """The weights of the most sensitive distribution as a function of ``l_h``, with the
    normalisation fixed by all n values: ``wm(lh_rows)`` gives the weights of any subset of
    rows (a block), equal to those :func:`weights_at` gives for the whole vector.

    ``term`` is the dual's subtracted term at these ``l_h`` (so F(h) = h r - term) and
    ``alpha`` chi2's multiplier (None for KL, 0 when theta2 = inf).
    """

    divergence: str
    theta2: float
    shift: float  # KL: the largest l_h / theta2; chi2: the largest l_h
    scale: float  # KL: n / sum exp(.) (uniform) or sum p exp(.) (weighted); chi2: shifted alpha
    alpha: float | None
    term: float
    weighted: bool = False

    def __call__(self, lh: np.ndarray) -> np.ndarray:
        lh = np.asarray(lh, dtype=np.float64)
        if math.isinf(self.theta2):
            return np.ones_like(lh)
        if self.divergence == "kl":
            if self.weighted:
                # a sample of zero probability above the support's top is capped at the top
                # weight (its weight enters no sum)
                return np.exp(np.clip(lh / self.theta2 - self.shift, -700.0, 0.0)) / self.scale
            # clamp: weights below 1e-304 stay normal numbers (subnormal arithmetic is slow)
            return np.exp(np.maximum(lh / self.theta2 - self.shift, -700.0)) * self.scale
        return np.maximum(((lh - self.shift) + self.scale) / (2.0 * self.theta2) + 1.0, 0.0)


def weight_map(lh: np.ndarray, theta2: float, divergence: str, p=None) -> WeightMap:
    """The :class:`WeightMap` of ``l_h`` values ``lh`` (``p``: sample probabilities).

    KL sums over blocks of rows (:func:`kl_weight_map_blocks`), so that no temporary of the
    size of ``lh`` is made (a second pass, of ``expm1``, when every term is close to the
    largest and ``log`` of the mean would keep only its rounding, see
    :func:`log_mean_shifted`).
    """
    lh = np.asarray(lh, dtype=np.float64)
    if divergence not in ("kl", "chi2"):
        raise ValueError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
    if math.isinf(theta2):
        return WeightMap(divergence, theta2, 0.0, 1.0, None if divergence == "kl" else 0.0,
                         pmean(lh, p), p is not None)
    if divergence == "chi2":
        m = support_max(lh, p)
        ls = lh - m
        a = chi2_alpha(ls, theta2, p)
        return WeightMap("chi2", theta2, m, a, a - m, chi2_term_at(ls, theta2, a, p) + m,
                         p is not None)
    return kl_weight_map_blocks(lambda s, e: lh[s:e], lh.size, theta2, p=p)


def kl_weight_map_blocks(block, n: int, theta2: float, top: float | None = None,
                         p=None) -> WeightMap:
    """The KL :class:`WeightMap` (or, for theta2 = inf, the unit weights') of the ``n`` values
    of l_h given by ``block(s, e)`` (rows s..e), over blocks of :data:`BLOCK` rows: l_h itself
    need not be held in memory (two passes, one when ``top``, the largest l_h over the rows of
    positive probability, is given; one more, of ``expm1``, when every term is close to the
    largest). ``p``: the sample probabilities (None: uniform); the same numbers as
    :func:`weight_map` up to the order of the sums."""
    bounds = [(s, min(s + BLOCK, n)) for s in range(0, n, BLOCK)]
    N = float(n) if p is None else 1.0

    def psum(x, s, e):
        return float(np.sum(x)) if p is None else float(np.dot(p[s:e], x))

    if math.isinf(theta2):
        return WeightMap("kl", theta2, 0.0, 1.0, None,
                         sum(psum(block(s, e), s, e) for s, e in bounds) / N, p is not None)
    if top is None:
        top = -math.inf
        for s, e in bounds:
            v = block(s, e)
            if p is not None:
                v = v[p[s:e] > 0]
            if v.size:
                top = max(top, float(np.max(v)))
    # max(lh) / theta2 == max(lh / theta2): division by theta2 > 0 is monotone
    m = float(top) / theta2

    def shifted(s, e):  # l_h / theta2 - m, clamped (rows of zero probability above: at 0)
        x = np.maximum(block(s, e) / theta2 - m, -700.0)
        return x if p is None else np.minimum(x, 0.0, out=x)

    z = sum(psum(np.exp(shifted(s, e)), s, e) for s, e in bounds)
    if z > 0.5 * N:
        zm1 = sum(psum(np.expm1(shifted(s, e)), s, e) for s, e in bounds)
        log_mean = math.log1p(zm1 / N)
    else:
        log_mean = math.log(z / N)
    return WeightMap("kl", theta2, m, n / z if p is None else z, None,
                     theta2 * (m + log_mean), p is not None)


def chi2_dual_term(lh: np.ndarray, theta2: float, alpha: float | None = None,
                   p=None) -> float:
    """The chi2 dual's subtracted term: -alpha - theta2 + theta2 mean(w^2) at the best alpha.

    So the chi2 dual objective at h is ``h r - chi2_dual_term(l_h, theta2)``.
    theta2 = inf gives mean(lh) (weights all one).
    """
    lh = np.asarray(lh, dtype=np.float64)
    if math.isinf(theta2):
        return pmean(lh, p)
    if alpha is None:
        alpha = chi2_alpha(lh, theta2, p)
    return chi2_term_at(lh, theta2, alpha, p)


def chi2_term_at(lh: np.ndarray, theta2: float, alpha: float, p=None) -> float:
    """-alpha - theta2 + theta2 mean(w^2) at a given alpha, written without cancellation:
    with v = (lh + alpha) / (2 theta2), an active sample (w = 1 + v > 0) contributes
    theta2 (w^2 - 1) = (lh + alpha) + theta2 v^2 and an inactive one -theta2."""
    s = np.asarray(lh, dtype=np.float64) + alpha
    v = s / (2.0 * theta2)
    act = v > -1.0
    return pmean(np.where(act, s + theta2 * v * v, -theta2), p) - alpha


#: Taylor coefficients of phi_KL(1 + t) = sum_{k>=2} (-1)^k t^k / (k (k - 1)), highest first,
#: divided by t^2: enough terms for full precision at |t| < NEAR_ONE ((2e-3)^8 < 1e-16 t^2)
_KL_SERIES = np.array([(-1.0) ** k / (k * (k - 1)) for k in range(10, 1, -1)])
_TINY = float(np.finfo(np.float64).tiny)
#: below this |w - 1| the direct formula loses more than 1e-10 of phi's relative accuracy
NEAR_ONE = 2e-3


def phi(w: np.ndarray, divergence: str) -> np.ndarray:
    """phi_KL(t) = t log t - t + 1 (with 0 log 0 = 0), phi_chi2(t) = (t - 1)^2.

    phi_KL is evaluated with full relative accuracy also for weights close to 1 (where
    ``t log t - t + 1`` cancels to rounding noise, and ``theta2 * phi`` with a large price
    would turn that noise into cost): below ``|t - 1| < 2e-3`` a Taylor series is summed.
    """
    w = np.asarray(w, dtype=np.float64)
    if divergence == "kl":
        # w log w - w + 1 in one buffer; w = 0 gives 0 log(tiny) - 0 + 1 = 1 (0 log 0 = 0)
        out = np.maximum(w, _TINY)
        np.log(out, out=out)
        out *= w
        out -= w
        out += 1.0
        if not np.all(w >= 0.0):  # not a weight (negative or NaN): phi is 1 there, as at 0
            out[~(w >= 0.0)] = 1.0
        dist = w - 1.0
        np.abs(dist, out=dist)
        near = np.flatnonzero(dist < NEAR_ONE)
        if near.size:
            tn = w[near] - 1.0
            out[near] = np.polyval(_KL_SERIES, tn) * tn * tn
        return out
    if divergence == "chi2":
        return (w - 1.0) ** 2
    raise ValueError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
