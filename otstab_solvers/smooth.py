"""Exact d-transforms of smooth losses of linear models (oracles for the 1-D dual).

The d-transform of ``h * loss`` is

    l_h(z_i) = max_x  h * loss(x, y_i) - theta1 * ||x - x_i||^2,

where only the coordinates in a feature mask may move. For a linear model the loss depends on
``x`` only through one score (binary: the margin ``m = y (w.x + b)``; regression: the residual
``e = y - (w.x + b)``) or through the ``K`` class scores (multinomial), so the maximisation
collapses to a 1-D (or ``K - 1``-dimensional) problem per sample:

* moving the margin by ``-t`` costs at least ``theta1 * t**2 / ||w_M||**2`` (``w_M`` = ``w`` on
  the mask), attained by ``delta = -y t w_M / ||w_M||**2``;
* so ``l_h = max_t  h * loss(m - t) - c t**2`` with ``c = theta1 / ||w_M||**2``.

Every oracle here follows the protocol consumed by :func:`otstab_solvers.dual.solve_dual`::

    oracle.n                      # number of samples
    oracle.h_max                  # l_h finite for 0 <= h < h_max
    oracle.evaluate(h) -> (l_h, dl_h/dh, d2l_h/dh2)   # each shape (n,)
    oracle.argmax(h) -> (n, d)    # the moved features (needs the features, see constructors)

``dl_h/dh`` is the loss at the maximiser (envelope theorem) and the second derivative comes from
implicit differentiation of the stationarity condition (it is undefined at the isolated ``h``
where two maximisers tie; there the value of the branch chosen is returned).

Exactness
---------
* :class:`LogisticOracle` and :class:`SquaredOracle` are exact (global maximisers, to machine
  precision): the logistic stationarity equation ``h sigmoid(t - m) = 2 c t`` has at most three
  roots, located on the monotone pieces of ``h sigmoid(t - m) - 2 c t`` (split at its two
  inflection points); every piece is solved by bracketed Newton and all local maxima compared.
* :class:`CrossEntropyOracle` is exact for two classes (it reduces to the logistic case) and,
  for ``K > 2`` classes, whenever ``h <= h_concave = 4 theta1 / sigma_max(A)**2`` (then the inner
  problem is strictly concave, because the softmax Hessian has eigenvalues <= 1/2). Above that
  threshold the inner problem may be nonconcave; the oracle returns the best of ``K`` local
  maxima found by damped Newton from the start point and from one start per wrong class (the
  far branch of the pairwise logistic problem), which is a lower bound on ``l_h`` and in practice
  the global maximum (tests compare it with random-restart search).
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy.special import expit

from . import cross_entropy_kernels
from .logistic_uniform import StepTable, two_branch_steps, uniform_steps
from .result import FAILED, INACCURATE, OPTIMAL, DualSolution

__all__ = [
    "LogisticOracle",
    "SquaredOracle",
    "CrossEntropyOracle",
    "SquaredAtPole",
    "solve_squared",
    "logistic_dtransform",
    "logistic_steps",
]


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _softplus(u: np.ndarray) -> np.ndarray:
    """log(1 + exp(u)), stable for all u."""
    return np.logaddexp(0.0, u)


def log1p_unit(q: np.ndarray) -> np.ndarray:
    """``log1p(q)`` of ``q`` in ``[0, 1]`` (NaN stays NaN) to an ulp or two from numpy's
    vectorised ``log``: ``log(v) - ((v - 1) - q) / v`` with ``v = 1 + q`` rounded (``v - 1``
    is exact, so ``(v - 1) - q`` is the rounding of ``v`` and ``log(1 - e / v) = -e / v`` to
    far below an ulp, ``|e / v| <= 2**-53``). numpy's ``log1p`` is a scalar loop, about twice
    the time of ``log`` and the three divisions and subtractions together (issue 31)."""
    v = np.add(q, 1.0)
    e = v - 1.0
    e -= q
    e /= v
    np.log(v, out=v)
    v -= e
    return v


def _softplus_at(u: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``log(1 + exp(u))`` from ``s = sigmoid(u)`` (to an ulp or two): ``max(u, 0) +
    log1p(q)`` with ``q = exp(-|u|)`` the ratio of the smaller of ``s`` and ``1 - s`` to the
    larger (``1 - s`` is exact where ``s >= 1/2``; where ``q`` is below the rounding of ``s``
    it is added to ``u``, far above it): one logarithm per sample (:func:`log1p_unit`)
    instead of ``logaddexp``'s exponential and logarithm."""
    r = np.subtract(1.0, s)
    q = np.minimum(s, r)
    np.maximum(s, r, out=r)
    q /= r
    q = log1p_unit(q)
    np.maximum(u, 0.0, out=r)
    q += r
    return q


def _as_vector(v, name: str, copy: bool = True) -> np.ndarray:
    """A finite float64 vector (a copy unless ``copy=False``, which keeps a float64 array)."""
    arr = (np.array(v, dtype=np.float64) if copy else np.asarray(v, dtype=np.float64)).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _per_sample(v, n: int, name: str, *, allow_inf: bool = False) -> np.ndarray:
    """A scalar or an (n,) array of nonnegative values broadcast to shape (n,) (a scalar as a
    read-only broadcast view: no n-vector is made for one value shared by every sample)."""
    arr = np.array(v, dtype=np.float64, copy=True)
    if arr.ndim == 0:
        val = float(arr)
        if math.isnan(val) or (not allow_inf and not math.isfinite(val)):
            raise ValueError(f"{name} contains NaN" + ("" if allow_inf else " or inf"))
        if val < 0:
            raise ValueError(f"{name} must be >= 0")
        return np.broadcast_to(arr, (n,))
    arr = arr.reshape(-1)
    if arr.shape != (n,):
        raise ValueError(f"{name} must be a scalar or have shape ({n},), got {arr.shape}")
    if np.any(np.isnan(arr)) or (not allow_inf and not np.all(np.isfinite(arr))):
        raise ValueError(f"{name} contains NaN" + ("" if allow_inf else " or inf"))
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0")
    return arr


def _check_theta1(theta1) -> float:
    try:
        t = float(theta1)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"theta1 must be a real number, got {type(theta1).__name__}") from exc
    if not t > 0:  # also rejects NaN
        raise ValueError(f"theta1 must be > 0 (math.inf allowed), got {theta1}")
    return t


def _check_h(h) -> float:
    h = float(h)
    if not (h >= 0 and math.isfinite(h)):
        raise ValueError(f"h must be finite and >= 0, got {h}")
    return h


def _bracketed_newton(fun, lo: np.ndarray, hi: np.ndarray, *, max_iter: int = 200,
                      start: np.ndarray | None = None):
    """Roots of decreasing functions on brackets [lo, hi] with fun(lo) >= 0 >= fun(hi).

    ``fun(t, idx)`` returns ``(f, f')`` at the points ``t`` of the problems ``idx``; vectorised
    over the bracket arrays. Newton steps that leave the current bracket are replaced by
    bisection, so convergence is guaranteed. ``start``: the first iterate (used where it lies
    strictly inside the bracket; else the midpoint). The unfinished problems are kept in
    compact arrays (no gather and scatter of the whole vector per step).
    """
    t = 0.5 * (lo + hi)
    if start is not None:
        inside = (start > lo) & (start < hi)
        t[inside] = start[inside]
    ix = np.arange(t.size)
    ti, li, hi_ = t.copy(), np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)
    for _ in range(max_iter):
        if ix.size == 0:
            break
        f, fp = fun(ti, ix)
        pos = f > 0
        li = np.where(pos, ti, li)
        hi_ = np.where(pos, hi_, ti)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = ti - f / fp
        ok = np.isfinite(newton) & (newton > li) & (newton < hi_)
        tn = np.where(ok, newton, 0.5 * (li + hi_))
        scale = 1.0 + np.abs(tn)
        root = f == 0
        done = root | (hi_ - li <= 4e-16 * scale) | (np.abs(tn - ti) <= 1e-15 * scale)
        tn = np.where(root, ti, tn)
        if done.any():
            t[ix[done]] = tn[done]
            keep = ~done
            ix, ti, li, hi_ = ix[keep], tn[keep], li[keep], hi_[keep]
        else:
            ti = tn
    if ix.size:  # max_iter reached: the last iterates
        t[ix] = ti
    return t


# ----------------------------------------------------------------------------------------------
# logistic
# ----------------------------------------------------------------------------------------------


def logistic_steps(margins, c, h: float) -> np.ndarray:
    """Global maximisers ``t_i >= 0`` of ``h * log(1 + exp(t - m_i)) - c_i t**2``.

    Parameters
    ----------
    margins : array of shape (n,)
        Margins ``m_i = y_i (w.x_i + b)``.
    c : float or array of shape (n,)
        ``theta1 / ||w_M||**2`` per sample, in ``(0, inf]``; ``inf`` means the sample cannot
        move (then ``t_i = 0``).
    h : float
        Dual variable, ``h >= 0``.

    Returns
    -------
    ndarray of shape (n,)
        The margin decrease ``t_i`` of the maximiser (the moved margin is ``m_i - t_i``).

    Notes
    -----
    With ``u = t - m`` the stationarity condition is ``phi(t) = h sigmoid(t - m) - 2 c t = 0``.
    ``phi(0) > 0`` and ``phi(h / 2c) < 0``, so every root lies in ``(0, h / 2c)``. If
    ``h <= 8 c`` then ``phi`` is decreasing (the objective is concave) and the root is unique.
    Otherwise ``phi`` decreases, increases and decreases again, split at
    ``t = m -+ L`` where ``sigmoid'(L) = 2c/h``, ``L = 2 artanh(sqrt(1 - 8c/h))``; the local
    maxima of the objective are the roots on the two decreasing pieces, found by bracketed
    Newton and compared.
    """
    m = np.asarray(margins, dtype=np.float64).reshape(-1)
    n = m.size
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), (n,))
    h = _check_h(h)
    t = np.zeros(n)
    if h == 0.0:
        return t
    mov = np.isfinite(c) & (c > 0)
    if not np.any(mov):
        return t
    mm = m[mov]
    # one c for every sample (a broadcast scalar): kept as a number, not gathered per step
    cc = c[mov] if c.strides != (0,) else np.broadcast_to(c[:1], (mm.size,))
    T = h / (2.0 * cc)

    def g(tt, mm_, cc_):
        return h * _softplus(tt - mm_) - cc_ * tt * tt

    def make_fun(mm_, cc_):
        uniform = cc_.strides == (0,)
        c0 = float(cc_[0]) if uniform and cc_.size else 0.0

        def fun(tt, idx):
            s = expit(tt - mm_[idx])
            c2 = 2.0 * (c0 if uniform else cc_[idx])
            f = h * s - c2 * tt
            fp = h * s * (1.0 - s) - c2
            return f, fp
        return fun

    fun = make_fun(mm, cc)
    k = 2.0 * cc / h  # sigmoid'(u) = k at the inflection points of phi
    nonconcave = k < 0.25
    s = np.sqrt(np.clip(1.0 - 4.0 * k, 0.0, None))
    L = np.where(nonconcave, 2.0 * np.arctanh(np.minimum(s, 1.0 - 1e-16)), 0.0)
    t1 = mm - L
    t2 = mm + L
    # piece C (the far one; the only one when concave): [max(t2, 0), T] clipped
    lo_c = np.where(nonconcave, np.clip(t2, 0.0, T), 0.0)
    hi_c = T.copy()
    f_lo_c, fp_lo_c = fun(lo_c, np.arange(mm.size))
    valid_c = f_lo_c >= 0
    # first iterate on piece C: one Newton step from its left end (phi is decreasing there, so
    # the step goes right; where it leaves the bracket the midpoint is used)
    with np.errstate(divide="ignore", invalid="ignore"):
        start_c = lo_c - f_lo_c / fp_lo_c
    # piece A (the near one): [0, min(t1, T)], only if t1 > 0
    hi_a = np.clip(t1, 0.0, T)
    f_hi_a = fun(hi_a, np.arange(mm.size))[0]
    valid_a = nonconcave & (t1 > 0) & (f_hi_a <= 0)
    # at least one piece holds a root (phi(0) > 0 > phi(T)); guard against rounding
    none = ~valid_a & ~valid_c
    if np.any(none):
        lo_c[none] = 0.0
        valid_c[none] = True
    best_t = np.zeros(mm.size)
    best_g = np.full(mm.size, -np.inf)
    for valid, lo, hi, start in ((valid_c, lo_c, hi_c, start_c),
                                 (valid_a, np.zeros(mm.size), hi_a, None)):
        idx = np.nonzero(valid)[0]
        if idx.size == 0:
            continue
        sub = make_fun(mm[idx], cc[idx])
        root = _bracketed_newton(sub, lo[idx], hi[idx],
                                 start=None if start is None else start[idx])
        val = g(root, mm[idx], cc[idx])
        better = val > best_g[idx]
        best_t[idx[better]] = root[better]
        best_g[idx[better]] = val[better]
    t[mov] = best_t
    return t


def logistic_dtransform(margins, c, h: float):
    """``(l_h, dl_h/dh, d2l_h/dh2, t)`` of the binary logistic loss ``log(1 + exp(-m))``.

    See :func:`logistic_steps` for the arguments. ``c = inf`` (no move possible) gives
    ``l_h = h * loss(m)``, derivative ``loss(m)`` and second derivative 0.
    """
    m = np.asarray(margins, dtype=np.float64).reshape(-1)
    n = m.size
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), (n,))
    h = _check_h(h)
    c0 = float(c[0]) if n else math.inf
    if n and h > 0.0 and c.strides == (0,) and 0.0 < c0 < math.inf:
        return _uniform_dtransform(m, c0, h)
    t = logistic_steps(m, c, h)
    u = t - m
    loss_star = _softplus(u)
    fin = np.isfinite(c)
    cost = np.where(fin, np.where(fin, c, 0.0) * t * t, 0.0)
    lh = h * loss_star - cost
    s = expit(u)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = 2.0 * np.where(fin, c, 0.0) - h * s * (1.0 - s)
        d2 = np.where(fin & (c > 0), s * s / denom, 0.0)
    return lh, loss_star, d2, t


def _uniform_dtransform(m: np.ndarray, c: float, h: float, start=None, keep=None,
                        steps_only: bool = False, start_t=None, curvature: bool = True):
    """:func:`logistic_dtransform` for one price ``c`` (finite, > 0) and ``h > 0``: the lean
    Newton solve of :func:`~otstab_solvers.logistic_uniform.uniform_steps` (first iterates
    ``start``, or ``start_t`` as steps; default its own), and :func:`logistic_steps` for the
    samples it does not accept. ``keep(u, t, lh, loss)`` receives the roots ``u = t - m`` (a
    warm start for a later ``h``), the steps ``t`` (read again at the same ``h`` by
    :meth:`LogisticOracle.step_rows`), ``l_h`` and the loss at the maximiser (None with
    ``steps_only``). ``steps_only``: ``(None, None, None, t)``, the steps alone;
    ``curvature=False``: None in place of the second derivative."""
    u, s, rest = uniform_steps(m, c, h, start, start_t=start_t)
    T = h / (2.0 * c)
    t = s * T
    if rest.size:
        u[rest], s[rest], t[rest] = _robust_uniform(m[rest], c, h)
    if steps_only:
        if keep is not None:
            keep(u, t, None, None)
        return None, None, None, t
    loss_star = _softplus_at(u, s)
    lh = h * loss_star
    lh -= c * t * t
    d2 = uniform_d2(s, c, h) if curvature else None
    if keep is not None:
        keep(u, t, lh, loss_star)
    return lh, loss_star, d2, t


def _robust_uniform(m: np.ndarray, c: float, h: float):
    """``(u, s, t)`` of the margins ``m`` that the lean solve did not accept (one price
    ``c``, ``h > 0``): both branches by Newton first
    (:func:`~otstab_solvers.logistic_uniform.two_branch_steps`), the robust bracketed solve
    (:func:`logistic_steps`) for what is left."""
    T = h / (2.0 * c)
    u, s, okb = two_branch_steps(m, c, h)
    t = T * s
    left = np.flatnonzero(~okb)
    if left.size:
        mr = m[left]
        tr = logistic_steps(mr, np.broadcast_to(c, (left.size,)), h)
        t[left] = tr
        u[left] = tr - mr
        s[left] = expit(u[left])
    return u, s, t


def uniform_d2(s: np.ndarray, c: float, h: float) -> np.ndarray:
    """The second derivative of ``l_h`` in ``h`` of the samples whose maximiser has
    ``s = sigmoid(t - m)`` (one price ``c``): ``s^2 / (2 c - h s (1 - s))``."""
    denom = s * (1.0 - s)
    denom *= -h
    denom += 2.0 * c
    with np.errstate(divide="ignore", invalid="ignore"):
        return s * s / denom


_NONE = np.zeros(1)  # (an array argument the compiled pass does not read)


class LogisticOracle:
    """Exact d-transform of the binary logistic loss of a linear classifier.

    Parameters
    ----------
    margins : array of shape (n,)
        ``m_i = y_i (w.x_i + b)`` with ``y_i`` in ``{-1, +1}``.
    direction_norm2 : float or array of shape (n,)
        ``||w_M||**2``, the squared norm of the coefficients on the feature mask (0: no
        masked coordinate matters, the samples cannot move the margin).
    theta1 : float
        Transport cost of moving features, in ``(0, inf]``.
    X : array of shape (n, d), optional
        Features (needed by :meth:`argmax` only).
    signs : array of shape (n,), optional
        Labels in ``{-1, +1}`` (needed by :meth:`argmax`).
    direction : array of shape (d,), optional
        ``w_M``: ``w`` with the non-masked coordinates set to zero (needed by :meth:`argmax`).
    cache : bool
        Keep the last evaluation (four n-vectors); False for an oracle read in blocks
        (:meth:`transform_rows`).

    Notes
    -----
    The maximiser moves sample ``i`` to ``x_i - t_i y_i w_M / ||w_M||**2``, which lowers the
    margin by ``t_i`` at cost ``theta1 t_i**2 / ||w_M||**2`` (:func:`logistic_steps`).
    ``h_max`` is ``inf``: the loss grows linearly, the cost quadratically. ``switching``: l_h
    may have switching points (two maximisers of the same value, where the nonconcave inner
    problem jumps from one local maximum to the other).
    """

    switching = True

    def __init__(self, margins, direction_norm2, theta1, *, X=None, signs=None, direction=None,
                 cache: bool = True):
        margins = _as_vector(margins, "margins")
        self._margins: np.ndarray | None = margins
        self._scores: np.ndarray | None = None
        self._score_signs: np.ndarray | None = None
        self._setup(margins.size, direction_norm2, theta1, cache)
        self._X = None if X is None else np.array(X, dtype=np.float64, copy=True)
        self._signs = None if signs is None else _as_vector(signs, "signs")
        self._direction = None if direction is None else _as_vector(direction, "direction")
        if self._X is not None and self._X.shape[0] != self.n:
            raise ValueError(f"X has {self._X.shape[0]} rows but margins has {self.n}")
        if self._signs is not None and self._signs.size != self.n:
            raise ValueError(f"signs has {self._signs.size} entries but margins has {self.n}")

    def _setup(self, n, direction_norm2, theta1, cache):
        """What both constructors set: the prices ``c = theta1 / ||w_M||^2`` (one number when
        every sample shares ``||w_M||^2``), nothing cached, no features."""
        self.n = n
        self.direction_norm2 = _per_sample(direction_norm2, n, "direction_norm2")
        self.theta1 = _check_theta1(theta1)
        a = self.direction_norm2
        if a.strides == (0,):  # one ||w_M||^2 for every sample: c is one number too
            a = a[:1]
        with np.errstate(divide="ignore"):
            c = np.where((a > 0) & math.isfinite(self.theta1),
                         self.theta1 / np.where(a > 0, a, 1.0), np.inf)
        self.c = np.broadcast_to(c, (n,)) if c.size != n else c
        self.cache = bool(cache)  # keep the last evaluation (False: an oracle read in blocks)
        self.h_max = math.inf
        self._X = self._signs = self._direction = None
        self._cache: tuple | None = None
        self._warm: dict | None = None  # block (start, stop) -> (h, its steps t)
        #: (smallest, largest margin): the range of the table of steps (computed on first
        #: need; a caller that knows it may set it)
        self.margin_range: tuple | None = None
        self._step_table: tuple | None = None  # (h, StepTable)
        #: (steps, losses) n-vectors the kept blocks are slices of (:attr:`keep_values`)
        self._kept_buf: tuple | None = None

    @classmethod
    def of_scores(cls, scores, signs, direction_norm2, theta1, *,
                  cache: bool = False, warm: bool = True) -> LogisticOracle:
        """The oracle of the margins ``m = y s`` of finite ``scores`` and labels ``signs`` in
        {-1, +1} (int8 is enough), computed for the rows each evaluation reads: neither array
        is copied and no n-vector of margins is kept (:attr:`margins` builds one). ``warm``:
        :meth:`transform_rows` of a slice of rows starts from the roots of that slice at the
        last ``h`` when it was within 10% (an n-vector in all; :meth:`release`)."""
        scores = np.asarray(scores)
        if scores.ndim != 1 or np.shape(signs) != scores.shape:
            raise ValueError(f"scores and signs must be vectors of one length, got "
                             f"{scores.shape} and {np.shape(signs)}")
        self = object.__new__(cls)
        self._margins, self._scores, self._score_signs = None, scores, signs
        self._setup(scores.size, direction_norm2, theta1, cache)
        if warm:  # blocks of rows read at a sequence of h: each started from its last roots
            self._warm = {}
        return self

    @property
    def margins(self) -> np.ndarray:
        """The margins ``y s`` (built on each read when the oracle was made from scores)."""
        return self._margins_of(slice(None))

    def _margins_of(self, rows) -> np.ndarray:
        if self._margins is not None:
            return self._margins[rows]
        assert self._scores is not None and self._score_signs is not None  # made from scores
        # (float64 whatever the scores' type: float32 margins would keep the solves' roots
        # in float32, NumPy's promotion rules)
        return np.multiply(self._score_signs[rows], self._scores[rows], dtype=np.float64)

    @classmethod
    def from_linear(cls, X, y_signs, coef, intercept, theta1, mask=None) -> LogisticOracle:
        """Build from features, labels in {-1, +1}, coefficients ``w`` and intercept ``b``.

        ``mask`` (boolean of shape (d,), or indices) restricts the coordinates that may move.
        """
        X = np.array(X, dtype=np.float64, copy=True)
        w = _as_vector(coef, "coef")
        if X.ndim != 2 or X.shape[1] != w.size:
            raise ValueError(f"X must have shape (n, {w.size}), got {X.shape}")
        ys = _as_vector(y_signs, "y_signs")
        if not np.all(np.isin(ys, (-1.0, 1.0))):
            raise ValueError("y_signs must contain only -1 and +1")
        wm = w * _mask_vector(mask, w.size)
        margins = ys * (X @ w + float(intercept))
        return cls(margins, float(wm @ wm), theta1, X=X, signs=ys, direction=wm)

    def _eval(self, h: float):
        h = _check_h(h)
        if self._cache is not None and self._cache[0] == h:
            return self._cache[1]
        out = logistic_dtransform(self.margins, self.c, h)
        if self.cache:
            self._cache = (h, out)
        return out

    def transform_rows(self, h: float, rows):
        """``(l_h, dl_h/dh, d2l_h/dh2, step)`` of the samples ``rows`` (a slice or indices),
        nothing kept: ``step`` is the margin decrease ``t`` of each maximiser, so that the
        maximiser is ``x - (y t / ||w_M||^2) w_M`` and its squared move ``t^2 / ||w_M||^2``."""
        m = self._margins_of(rows)
        if self.c.strides == (0,):  # one price for every sample: the lean uniform solve
            c0 = float(self.c[0])
            h = _check_h(h)
            if self._warm is not None and isinstance(rows, slice) and h > 0.0 and m.size \
                    and 0.0 < c0 < math.inf:
                return self._warm_rows(m, c0, h, (rows.start, rows.stop))
            return logistic_dtransform(m, np.broadcast_to(c0, m.shape), h)
        return logistic_dtransform(m, self.c[rows], h)

    def step_rows(self, h: float, rows: slice):
        """``(None, None, None, step)``: the fourth output of :meth:`transform_rows` alone
        (for Q*'s build: no loss nor derivatives computed)."""
        if self.c.strides == (0,) and self._warm is not None:
            c0 = float(self.c[0])
            h = _check_h(h)
            m = self._margins_of(rows)
            if h > 0.0 and m.size and 0.0 < c0 < math.inf:
                return self._warm_rows(m, c0, h, (rows.start, rows.stop), steps_only=True)
        return self.transform_rows(h, rows)

    def _warm_rows(self, m, c, h, key, steps_only: bool = False):
        """The lean solve of a block of rows started from the roots it had at the last ``h``
        when that was within 10% (kept in float64: the search's last steps move h by some
        1e-9 or less, so the start is within about that of the root, and one Halley step
        finishes it with Newton's error estimate far below an ulp: no confirming step).
        ``steps_only`` at the very ``h`` of the last solve: its steps, as they were kept."""
        assert self._warm is not None
        last = self._warm.get(key)
        if steps_only and last is not None and last[0] == h:
            return None, None, None, last[1]  # this h's maximisers (Q*'s build after a pass)
        if last is not None and abs(h - last[0]) <= 0.1 * h:
            start = last[1]  # (its steps: uniform_steps clips a copy)
        else:  # a block read at a new h: from the table of this h's steps
            start = self._table(c, h).start_t(m)

        def keep(u, t, lh, loss):
            assert self._warm is not None
            if not self.keep_values:  # (not written to after this call)
                self._warm[key] = (h, t, None)
                return
            # the steps and the loss where asked, in two n-vectors of the oracle (each block
            # its slice: Q*'s build takes them whole, :meth:`kept_vectors`, with no copy)
            if self._kept_buf is None:
                self._kept_buf = (np.empty(self.n), np.empty(self.n))
            tb, lb = self._kept_buf
            s, e = key
            tb[s:e] = t
            lv = None
            if loss is not None:
                lb[s:e] = loss
                lv = lb[s:e]
            self._warm[key] = (h, tb[s:e], lv)
        return _uniform_dtransform(m, c, h, None, keep, steps_only, start_t=start,
                                   curvature=self.curvature)

    def fused_rows(self, h: float, rows: slice, mode: int, theta2: float, lazy: bool,
                   span: float, chi2=None):
        """The sums of one exact pass over the slice ``rows`` at ``h`` in one compiled loop
        (:func:`otstab_solvers.logistic_kernels.solve_block`: ``mode`` KL or theta2 = inf,
        ``lazy``: no second derivative, ``span``: KL's expm1 span; chi2: ``chi2`` its
        thresholds, and the sums are ``(sums, edge rows)``), keeping the steps and
        losses as :meth:`transform_rows` keeps them (:attr:`keep_values`); the rows the loop
        does not accept are solved by the robust NumPy solve first. None where it does not
        apply (numba absent or the oracle below the kernels' size, several prices, no warm
        starts or kept values, h = 0): the caller then reads :meth:`transform_rows`."""
        from . import logistic_kernels as lk

        c0 = float(self.c[0])
        if not (self.keep_values and self._warm is not None and self.c.strides == (0,)
                and 0.0 < c0 < math.inf and h > 0.0 and rows.stop > rows.start
                and lk.use_kernel(self.n)):
            return None
        y, sc = self._score_signs, self._scores  # (warm starts: an oracle of scores)
        if not (isinstance(sc, np.ndarray) and sc.dtype in (np.float64, np.float32)
                and isinstance(y, np.ndarray) and y.dtype.kind in "iuf"
                and y.dtype.itemsize <= 8):
            return None
        key = (rows.start, rows.stop)
        s, e = key
        last = self._warm.get(key)
        warm = last is not None and abs(h - last[0]) <= 0.1 * h
        if self._kept_buf is None:
            self._kept_buf = (np.empty(self.n), np.empty(self.n))
        tb, lb = self._kept_buf
        table: tuple
        if warm and last is not None:
            tprev, table, lo, inv, quad = last[1], (_NONE, _NONE, _NONE), 0.0, 0.0, False
        else:  # a block read at a new h: from the table of this h's steps
            tab = self._table(c0, h)
            quad = tab.half_d2 is not None
            tprev, lo, inv = _NONE, tab.lo, tab.inv
            table = (tab.t, tab.dt, tab.half_d2 if quad else tab.dt)
        tk, lk_ = tb[s:e], lb[s:e]
        rest, sums, edge = lk.solve_block(y, sc, s, e, c0, h, warm, tprev, table, lo, inv,
                                          quad, tk, lk_, mode, theta2, lazy, span,
                                          chi2=chi2)
        if rest.size:  # the robust solve, then the block's sums
            mr = self._margins_of(rest + s)
            u, sg, t = _robust_uniform(mr, c0, h)
            tk[rest], lk_[rest] = t, _softplus_at(u, sg)
            sums, edge = lk.block_sums(tk, lk_, c0, h, mode, theta2, lazy, span, chi2)
        self._warm[key] = (h, tk, lk_)
        return (sums, edge) if mode == lk.MODE_CHI2 else sums

    def _table(self, c: float, h: float) -> StepTable:
        """The :class:`~otstab_solvers.logistic_uniform.StepTable` of ``h`` over the range
        of the margins (one per ``h``: the last is kept)."""
        if self._step_table is not None and self._step_table[0] == h:
            return self._step_table[1]
        if self.margin_range is None:
            lo, hi = math.inf, -math.inf
            for s in range(0, self.n, 1 << 16):
                mb = self._margins_of(slice(s, min(s + (1 << 16), self.n)))
                lo, hi = min(lo, float(mb.min())), max(hi, float(mb.max()))
            self.margin_range = (lo, hi)
        lo, hi = self.margin_range
        table = StepTable(lo, hi, lambda g: _uniform_dtransform(g, c, h, steps_only=True)[3])
        self._step_table = (h, table)
        return table

    #: :meth:`transform_rows` of a slice keeps its loss at the maximiser with its steps (one
    #: more n-vector), for :meth:`kept` (set by the caller)
    keep_values = False
    #: :meth:`transform_rows` of a slice (warm starts, one price) gives the second derivative;
    #: False: None in its place (a caller that sums it from the kept steps only when it needs
    #: it, :mod:`otstab_solvers.logistic_pass`; set by that caller)
    curvature = True

    def kept(self, h: float, rows: slice, *, drop: bool = False):
        """``(loss at the maximiser, step)`` of the slice ``rows`` as its last read at ``h``
        kept them (:attr:`keep_values`), or None. ``drop``: forget them (read once)."""
        if self._warm is None:
            return None
        key = (rows.start, rows.stop)
        last = self._warm.get(key)
        if last is None or last[0] != h or last[2] is None:
            return None
        if drop:
            del self._warm[key]
        return last[2], last[1]

    def kept_vectors(self, h: float):
        """``(loss at the maximiser, step)`` of every sample as n-vectors, when the last read
        of every row (slices tiling ``0..n``) was at ``h`` and kept both
        (:attr:`keep_values`), else None. The caller takes them: the oracle forgets them and
        its warm starts."""
        buf, warm = self._kept_buf, self._warm
        if buf is None or not warm:
            return None
        end = 0
        for (s, e), last in sorted(warm.items()):
            if s != end or last[0] != h or last[2] is None:
                return None
            end = e
        if end != self.n:
            return None
        warm.clear()
        self._kept_buf = None
        return buf[1], buf[0]

    def may_switch(self, h: float) -> bool:
        """Whether ``l_h`` may have a switching point at ``h``: only where the inner problem
        is not concave for some sample, ``h > 8 c_i`` (``T > 4``, :func:`logistic_steps`)."""
        c = self.c[:1] if self.c.strides == (0,) else self.c
        return bool(c.size) and h > 8.0 * float(np.min(c))

    def release(self) -> None:
        """Drop the warm starts of :meth:`transform_rows` (an n-vector)."""
        if self._warm is not None:
            self._warm.clear()
        self._step_table = None
        self._kept_buf = None

    def evaluate(self, h: float):
        """``(l_h, dl_h/dh, d2l_h/dh2)`` at ``h``, each of shape (n,)."""
        lh, d1, d2, _ = self._eval(h)
        return lh.copy(), d1.copy(), d2.copy()

    def steps(self, h: float) -> np.ndarray:
        """The margin decrease ``t_i`` of each sample's maximiser at ``h``."""
        return self._eval(h)[3].copy()

    def loss(self) -> np.ndarray:
        """The logistic loss at the unmoved samples."""
        return _softplus(-self.margins)

    def argmax(self, h: float) -> np.ndarray:
        """Moved features ``x_i - t_i y_i w_M / ||w_M||**2``, shape (n, d)."""
        if self._X is None or self._signs is None or self._direction is None:
            raise ValueError("argmax needs X, signs and direction: pass them to the "
                             "constructor or use LogisticOracle.from_linear")
        t = self.steps(h)
        a = self.direction_norm2
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(a > 0, t * self._signs / np.where(a > 0, a, 1.0), 0.0)
        return self._X - scale[:, None] * self._direction[None, :]


# ----------------------------------------------------------------------------------------------
# squared
# ----------------------------------------------------------------------------------------------


class SquaredOracle:
    """Exact d-transform of the squared loss ``e**2`` of a linear regressor.

    Parameters
    ----------
    residuals : array of shape (n,)
        ``e_i = y_i - (beta.x_i + b)``.
    direction_norm2 : float or array of shape (n,)
        ``||beta_M||**2`` on the feature mask.
    theta1 : float
        In ``(0, inf]``.
    X : array of shape (n, d), optional
        Features (for :meth:`argmax`).
    direction : array of shape (d,), optional
        ``beta_M`` (for :meth:`argmax`).
    copy : bool
        False keeps a float64 ``residuals`` array as given (the caller gives it up).

    Notes
    -----
    ``max_s h (e + s)**2 - theta1 s**2 / a`` (``a = ||beta_M||**2``) is attained at
    ``s = h a e / (theta1 - h a)``, giving ``l_h = h e**2 theta1 / (theta1 - h a)`` for
    ``h < h_max = theta1 / a``, and ``+inf`` beyond (for ``e != 0``; a zero residual still has an
    unbounded d-transform for ``h > h_max``). The derivative is the squared residual at the
    maximiser, ``e**2 theta1**2 / (theta1 - h a)**2``, the second derivative
    ``2 a e**2 theta1**2 / (theta1 - h a)**3``. The maximiser is
    ``x_i - h e_i beta_M / (theta1 - h a)``. The maximiser is unique: no switching points
    (``switching``).
    """

    switching = False

    def __init__(self, residuals, direction_norm2, theta1, *, X=None, direction=None,
                 copy: bool = True):
        self.residuals = _as_vector(residuals, "residuals", copy)
        self.n = self.residuals.size
        self.direction_norm2 = _per_sample(direction_norm2, self.n, "direction_norm2")
        self.theta1 = _check_theta1(theta1)
        a = self.direction_norm2
        if math.isinf(self.theta1):
            self.a_eff = np.broadcast_to(0.0, (self.n,))
        elif a.strides == (0,):  # one ||beta_M||^2 for every sample
            self.a_eff = np.broadcast_to(a[:1] / self.theta1, (self.n,))
        else:
            self.a_eff = a / self.theta1  # h_max_i = 1 / a_eff_i
        amax = float(np.max(self.a_eff)) if self.n else 0.0
        self.h_max = math.inf if amax == 0 else 1.0 / amax
        self._X = None if X is None else np.array(X, dtype=np.float64, copy=True)
        self._direction = None if direction is None else _as_vector(direction, "direction")
        if self._X is not None and self._X.shape[0] != self.n:
            raise ValueError(f"X has {self._X.shape[0]} rows but residuals has {self.n}")

    @classmethod
    def from_linear(cls, X, y, coef, intercept, theta1, mask=None) -> SquaredOracle:
        """Build from features, targets, coefficients ``beta`` and intercept ``b``."""
        X = np.array(X, dtype=np.float64, copy=True)
        beta = _as_vector(coef, "coef")
        if X.ndim != 2 or X.shape[1] != beta.size:
            raise ValueError(f"X must have shape (n, {beta.size}), got {X.shape}")
        y = _as_vector(y, "y")
        bm = beta * _mask_vector(mask, beta.size)
        res = y - (X @ beta + float(intercept))
        return cls(res, float(bm @ bm), theta1, X=X, direction=bm)

    def evaluate(self, h: float):
        """``(l_h, dl_h/dh, d2l_h/dh2)``; ``inf`` where ``h >= 1 / a_eff_i``."""
        return self.transform_rows(h, slice(None))[:3]

    def transform_rows(self, h: float, rows):
        """``(l_h, dl_h/dh, d2l_h/dh2, step)`` of the samples ``rows`` (a slice or indices):
        ``step`` is the residual increase ``s = h a e / (theta1 - h a)`` of each maximiser, so
        that the maximiser is ``x - (s / ||beta_M||^2) beta_M`` and its squared move
        ``s^2 / ||beta_M||^2`` (``inf`` where ``h >= 1 / a_eff_i``)."""
        h = _check_h(h)
        e = self.residuals[rows]
        a_eff = self.a_eff[rows]
        e2 = e ** 2
        q = 1.0 - h * a_eff  # (theta1 - h a) / theta1
        ok = q > 0
        qs = np.where(ok, q, 1.0)
        lh = np.where(ok, h * e2 / qs, np.inf)
        d1 = np.where(ok, e2 / (qs * qs), np.inf)
        d2 = np.where(ok, 2.0 * a_eff * e2 / (qs * qs * qs), np.inf)
        step = np.where(ok, h * a_eff * e / qs, np.inf)
        return lh, d1, d2, step

    def argmax(self, h: float) -> np.ndarray:
        """Moved features ``x_i - h e_i beta_M / (theta1 - h a)``; needs ``h < h_max``."""
        if self._X is None or self._direction is None:
            raise ValueError("argmax needs X and direction: pass them to the constructor "
                             "or use SquaredOracle.from_linear")
        h = _check_h(h)
        if h >= self.h_max:
            raise ValueError(f"h = {h} >= h_max = {self.h_max}: the d-transform is unbounded")
        if math.isinf(self.theta1):
            return self._X.copy()
        scale = h * self.residuals / (self.theta1 * (1.0 - h * self.a_eff))
        return self._X - scale[:, None] * self._direction[None, :]


def solve_squared(dual, r: float, a: float, theta2: float, divergence: str, *,
                  tol: float = 1e-13, max_iter: int = 200) -> DualSolution:
    """The dual of the squared loss of a linear regressor, solved in the distance to its pole.

    With one ``a = ||beta_M||**2 / theta1`` for every sample (so ``h_max = 1 / a``), the
    d-transform is ``l_h = h e**2 / (1 - h a) = g e**2`` with ``g = h / (1 - h a)``, i.e.
    ``h = g / (1 + a g)``: in ``g`` every ``l_h`` is linear, and the dual is

        Phi(g) = r g / (1 + a g) - T(g e**2),     g in [0, inf),

    concave (a concave increasing function of ``g`` less a convex one; ``T`` is the
    divergence term: mean, KL log-mean-exp or chi2). Its derivative
    ``r / (1 + a g)**2 - mu(g)`` (``mu``: the reweighted mean of ``e**2``, increasing from the
    base risk ``E``) changes sign at most once. In ``h`` the optimum sits at relative distance
    ``q = 1 - h a`` about ``sqrt(E / r)`` from the pole, which double precision cannot resolve
    once ``E / r`` is below some 1e-16 (a regressor that fits the data nearly exactly); in
    ``g`` it is ``g*`` of size ``sqrt(r / E) / a``, as precise as any number.

    * ``E = 0`` (every residual of positive probability is 0): ``Phi`` increases for ever;
      the supremum is at the pole, ``h = 1 / a``, where ``l_h = 0`` for every zero residual
      (``max_s (h - theta1 / ||beta_M||^2) s^2 = 0``), so ``R = r / a`` (the W2 ball:
      ``theta1 r / ||beta_M||^2``); every sample moves its residual by ``sqrt(r)``, weights 1.
    * ``E > 0``: the root lies in ``[0, g_inf]``, ``g_inf = (sqrt(r / E) - 1) / a`` the root
      of theta2 = inf (where ``mu = E``; elsewhere ``mu >= E`` puts the root below it), found
      by safeguarded Newton steps; theta2 = inf is the closed form
      ``R = (sqrt(r) - sqrt(E))**2 / a``.

    ``dual`` evaluates ``T`` at the losses ``g e**2``: anything with
    ``reduce(g, side, theta2, divergence) -> (T, mu, dmu/dg, alpha, key)``, e.g. a
    :class:`~otstab_solvers.blockwise.BlockwiseDual` over a ``SquaredOracle`` with
    ``theta1 = inf`` (``l = g e**2``). The solution's ``h`` is ``g / (1 + a g)``,
    ``info["g"]`` is ``g`` (``inf`` at the pole); ``gap_bound`` bounds ``R - value`` by the
    tangents at the bracket's ends. Build Q* from ``g`` (:class:`SquaredAtPole`), not from ``h``.
    """
    t0 = time.perf_counter()
    evals = 0
    kl_like = divergence == "kl" or math.isinf(theta2)

    def at(g):
        nonlocal evals
        evals += 1
        term, mu, curv, alpha, _ = dual.reduce(g, "right", theta2, divergence)
        q = 1.0 / (1.0 + a * g)  # 1 - h a, without the cancellation of 1 - h a
        h = g * q
        return {"g": g, "h": h, "F": h * r - term, "d": r * q * q - mu,
                "dd": -2.0 * a * r * q ** 3 - curv, "alpha": None if kl_like else alpha,
                "scale": r * q * q + abs(mu), "mu": mu}

    def finish(pt, status, gap, note, **info):
        return DualSolution(h=pt["h"], alpha=pt["alpha"], value=pt["F"], status=status,
                            solver="dual", native_status=note, iterations=evals,
                            gap_bound=gap, solve_time=time.perf_counter() - t0,
                            info={"g": pt["g"], **info})

    p0 = at(0.0)
    base = p0["mu"]  # the base risk
    if not p0["d"] > 0.0:
        p0["F"] = 0.0
        return finish(p0, OPTIMAL, 0.0, "r <= base risk")
    if not base > 0.0:  # every residual 0: the supremum at the pole
        pole = {"g": math.inf, "h": 1.0 / a, "F": r / a, "alpha": None if kl_like else 0.0}
        return finish(pole, OPTIMAL, 0.0, "supremum at the pole h = theta1 / ||beta_M||^2 "
                      "(every residual is 0)", pole=True)
    g_inf = (math.sqrt(r / base) - 1.0) / a
    hi = at(g_inf)
    lo = p0
    for _ in range(60):  # mu(g_inf) >= E puts d <= 0 there; rounding may leave d > 0
        if hi["d"] <= 0.0:
            break
        lo, hi = hi, at(2.0 * hi["g"] + 1.0 / a)
    else:
        return finish(lo, FAILED, math.nan, "could not bracket the root in g")

    def gap_of(lo, hi):
        """Concavity: Phi* lies below both tangents; their crossing less the better end."""
        dl, dh = lo["d"], hi["d"]
        if dl - dh <= 0.0:
            return 0.0
        gx = (hi["F"] - lo["F"] + dl * lo["g"] - dh * hi["g"]) / (dl - dh)
        top = lo["F"] + dl * (gx - lo["g"])
        return max(top - max(lo["F"], hi["F"]), 0.0)

    last = hi
    width = hi["g"] - lo["g"]
    for it in range(max_iter):
        if last["d"] == 0.0:
            return finish(last, OPTIMAL, 0.0, "optimal")
        best = lo if abs(lo["d"]) / lo["scale"] < abs(hi["d"]) / hi["scale"] else hi
        gap = gap_of(lo, hi)
        if abs(best["d"]) <= 1e-13 * best["scale"] and gap <= tol * max(abs(best["F"]), 1e-300):
            return finish(best, OPTIMAL, gap, "optimal")
        if hi["g"] - lo["g"] <= 4e-16 * hi["g"]:  # the bracket is a few ulps wide
            return finish(best, OPTIMAL, gap, "optimal (bracket at machine precision)")
        g = last["g"] - last["d"] / last["dd"] if last["dd"] < 0 else math.nan
        if not (lo["g"] < g < hi["g"]) or (it % 3 == 2 and hi["g"] - lo["g"] > 0.5 * width):
            g = 0.5 * (lo["g"] + hi["g"])
        if it % 3 == 2:
            width = hi["g"] - lo["g"]
        last = at(g)
        if last["d"] > 0.0:
            lo = last
        else:
            hi = last
    best = lo if abs(lo["d"]) / lo["scale"] < abs(hi["d"]) / hi["scale"] else hi
    return finish(best, INACCURATE, gap_of(lo, hi), "iteration limit")


class SquaredAtPole:
    """The maximisers of a :class:`SquaredOracle` (one ``||beta_M||^2`` for every sample) at
    the solution ``g`` of :func:`solve_squared`, as an oracle for the rows: ``transform_rows``
    returns ``(l_h, dl_h/dh, d2l_h/dh2, step)`` at ``h = g / (1 + a g)`` computed from ``g``
    (the residual ``e`` moves to ``e (1 + a g)``, by the step ``a g e``), whatever ``h`` it is
    given (the ``h`` of the solution, whose ``1 - h a`` may have lost every digit). At the pole
    (``g = inf``, every residual of positive probability 0) every residual moves by
    ``sqrt(r)`` away from 0 (the loss is ``r`` at every atom)."""

    switching = False

    def __init__(self, oracle: SquaredOracle, g: float, r: float):
        self.oracle, self.g, self.r = oracle, float(g), float(r)
        self.n, self.h_max = oracle.n, oracle.h_max
        self.a = float(oracle.a_eff[0]) if oracle.n else 0.0

    def transform_rows(self, h, rows):
        e = self.oracle.residuals[rows]
        a, g = self.a, self.g
        if math.isinf(g):
            step = np.where(e < 0, -1.0, 1.0) * math.sqrt(self.r)
            moved = e + step
            lh = (e * e + 2.0 * np.abs(e) * math.sqrt(self.r)) / a
            return lh, moved * moved, np.full(e.size, np.inf), step
        up = 1.0 + a * g  # 1 / (1 - h a)
        step = a * g * e
        moved = e * up
        return g * e * e, moved * moved, 2.0 * a * e * e * up ** 3, step


# ----------------------------------------------------------------------------------------------
# multinomial cross-entropy
# ----------------------------------------------------------------------------------------------


def _mask_vector(mask, d: int) -> np.ndarray:
    """A float 0/1 vector of length d from a boolean mask, indices or None (all ones)."""
    if mask is None:
        return np.ones(d)
    m = np.asarray(mask)
    if m.dtype == bool:
        if m.shape != (d,):
            raise ValueError(f"mask must have shape ({d},), got {m.shape}")
        return m.astype(np.float64)
    if not np.issubdtype(m.dtype, np.integer):
        raise TypeError("mask must be a boolean array or integer column indices")
    idx = m.reshape(-1)
    if idx.size and (idx.min() < -d or idx.max() >= d):
        raise ValueError(f"mask indices out of range for {d} features")
    out = np.zeros(d)
    out[idx] = 1.0
    return out


# Row reductions over a few columns (K classes, q coordinates): NumPy's reductions along a
# short last axis cost some 10-30x more than a loop over the columns (or one dot product)


def _row_max(S: np.ndarray) -> np.ndarray:
    out = S[:, 0].copy()
    for k in range(1, S.shape[1]):
        np.maximum(out, S[:, k], out=out)
    return out


def _row_sum(S: np.ndarray) -> np.ndarray:
    out = S[:, 0].copy()
    for k in range(1, S.shape[1]):
        out += S[:, k]
    return out


def _row_dot(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """sum_j A[i, j] B[i, j] per row."""
    return np.einsum("ij,ij->i", A, B)


def _logsumexp_rows(S: np.ndarray) -> np.ndarray:
    mx = _row_max(S)
    return mx + np.log(_row_sum(np.exp(S - mx[:, None])))


def _softmax_rows(S: np.ndarray) -> np.ndarray:
    E = np.exp(S - _row_max(S)[:, None])
    return E / _row_sum(E)[:, None]


class CrossEntropyOracle:
    """d-transform of the multinomial cross-entropy of a linear classifier.

    Parameters
    ----------
    scores : array of shape (n, K)
        Class scores ``s_i = W x_i + b`` (softmax logits), ``K >= 2``.
    labels : array of shape (n,)
        Integer class indices in ``0 .. K-1``.
    W_masked : array of shape (K, d_M)
        The columns of ``W`` on the feature mask.
    theta1 : float
        In ``(0, inf]``.
    X : array of shape (n, d), optional
        Features, for :meth:`argmax`.
    mask : boolean array of shape (d,) or indices, optional
        The masked coordinates (columns of ``X`` matching the columns of ``W_masked``), for
        :meth:`argmax`; default all.
    tol : float
        Stationarity tolerance of the inner Newton solves (relative).
    max_iter : int
        Maximum Newton iterations per start.

    Notes
    -----
    ``CE(s) = logsumexp(s) - s_y`` is invariant to adding a constant to all scores, so a move
    ``delta`` matters only through ``P W_M delta`` (``P`` centres the scores). With the SVD
    ``P W_M = U S V^T`` (rank ``q <= K - 1``), ``delta = V c`` and the inner problem becomes
    ``max_c f(c) = h CE(s + A c) - theta1 ||c||**2`` with ``A = U S`` (``K x q``).

    * ``K = 2``: solved exactly as the logistic case (margin ``s_y - s_other``).
    * ``h <= h_concave = 4 theta1 / sigma_max(A)**2``: ``f`` is strictly concave; damped Newton
      finds the global maximiser (exact).
    * Above: ``f`` may have several local maxima. The oracle runs damped Newton (with
      Levenberg regularisation and backtracking, so each run ascends to a local maximum) from
      ``c = 0`` and from one start per wrong class ``k`` (the far stationary point of the
      1-D problem along the direction that raises ``s_k - s_y``), and keeps the best. This is a
      lower bound on the true ``l_h``; ``exact_at(h)`` says where the guarantee holds.
    """

    #: above ``h_concave`` the inner problem may jump between local maxima (switching points)
    switching = True

    def __init__(self, scores, labels, W_masked, theta1, *, X=None, mask=None, tol=1e-12,
                 max_iter=100, copy: bool = True, cache: bool = True):
        S = np.array(scores, dtype=np.float64) if copy else np.asarray(scores, dtype=np.float64)
        if S.ndim != 2 or S.shape[1] < 2:
            raise ValueError(f"scores must have shape (n, K) with K >= 2, got {S.shape}")
        if not np.all(np.isfinite(S)):
            raise ValueError("scores contains NaN or inf")
        self.scores = S
        self.n, self.K = S.shape
        lab = np.asarray(labels)
        if lab.shape != (self.n,):
            raise ValueError(f"labels must have shape ({self.n},), got {lab.shape}")
        if not np.issubdtype(lab.dtype, np.integer):
            if not np.all(np.equal(np.mod(lab, 1), 0)):
                raise ValueError("labels must be integer class indices")
        lab = lab.astype(np.int64)
        if lab.min() < 0 or lab.max() >= self.K:
            raise ValueError(f"labels must lie in 0..{self.K - 1}")
        self.labels = lab
        W = np.array(W_masked, dtype=np.float64, copy=True)
        if W.ndim == 1:
            W = W[:, None]
        if W.ndim != 2 or W.shape[0] != self.K:
            raise ValueError(f"W_masked must have shape ({self.K}, d_M), got {W.shape}")
        if not np.all(np.isfinite(W)):
            raise ValueError("W_masked contains NaN or inf")
        self.W_masked = W
        self.theta1 = _check_theta1(theta1)
        self.tol = float(tol)
        self.max_iter = int(max_iter)
        self.h_max = math.inf
        # reduced coordinates
        P = np.eye(self.K) - 1.0 / self.K
        B = P @ W
        if W.shape[1] == 0:
            U, sv, Vt = np.zeros((self.K, 0)), np.zeros(0), np.zeros((0, 0))
        else:
            U, sv, Vt = np.linalg.svd(B, full_matrices=False)
        wscale = float(np.linalg.norm(W, 2)) if W.size else 0.0
        keep = sv > 1e-12 * wscale
        self.A = U[:, keep] * sv[keep]          # (K, q)
        self.V = Vt[keep].T                     # (d_M, q)
        self.q = int(self.A.shape[1])
        # a_k a_k^T of each row a_k of A, flattened (K, q * q)
        self._outer = np.einsum("kq,kr->kqr", self.A, self.A).reshape(self.K, -1)
        smax = float(sv[keep][0]) if self.q else 0.0
        if self.q == 0 or math.isinf(self.theta1):
            self.h_concave = math.inf
        else:
            self.h_concave = 4.0 * self.theta1 / smax ** 2
        self._X = None if X is None else np.array(X, dtype=np.float64, copy=True)
        self._mask = None
        if self._X is not None:
            mv = _mask_vector(mask, self._X.shape[1]).astype(bool)
            if int(mv.sum()) != W.shape[1]:
                raise ValueError(f"mask selects {int(mv.sum())} features but W_masked has "
                                 f"{W.shape[1]} columns")
            if self._X.shape[0] != self.n:
                raise ValueError(f"X has {self._X.shape[0]} rows but scores has {self.n}")
            self._mask = mv
        self._cache: tuple | None = None
        self.cache = bool(cache)  # keep the last evaluation (False: read in blocks of rows)
        self._logistic = None
        if self.K == 2 and self.q > 0 and math.isfinite(self.theta1):
            # margin of the true class against the other one
            other = 1 - self.labels
            rows = np.arange(self.n)
            margins = S[rows, self.labels] - S[rows, other]
            diff = W[1] - W[0]
            # moving the margin s_y - s_other by -t costs theta1 t^2 / ||w_1 - w_0||^2
            self._logistic = logistic_dtransform, margins, self.theta1 / float(diff @ diff)

    def loss(self, rows=None) -> np.ndarray:
        """Cross-entropy of the unmoved samples (of ``rows``, an index array; default all)."""
        rows = np.arange(self.n) if rows is None else rows
        S = self.scores[rows]
        return _logsumexp_rows(S) - S[np.arange(rows.size), self.labels[rows]]

    def exact_at(self, h: float) -> bool:
        """Whether the returned ``l_h`` is guaranteed to be the global maximum at ``h``."""
        return self.K == 2 or self.q == 0 or float(h) <= self.h_concave

    # -- inner solver -----------------------------------------------------------------------

    def _f_grad_hess(self, C: np.ndarray, rows: np.ndarray, h: float):
        """Objective, gradient and Hessian at C (m, q) for samples ``rows``."""
        S = self.scores[rows] + C @ self.A.T
        lse = _logsumexp_rows(S)
        y = self.labels[rows]
        ar = np.arange(rows.size)
        ce = lse - S[ar, y]
        p = _softmax_rows(S)
        pe = p.copy()
        pe[ar, y] -= 1.0
        g_ce = pe @ self.A                                   # (m, q)
        f = h * ce - self.theta1 * _row_dot(C, C)
        grad = h * g_ce - 2.0 * self.theta1 * C
        # A^T (diag p - p p^T) A: sum_k p_k a_k a_k^T as one product with the K outer
        # products a_k a_k^T (a GEMM, not an einsum over (m, K, q))
        q = self.q
        M = (p @ self._outer).reshape(rows.size, q, q)
        pa = p @ self.A                                      # (m, q)
        M -= pa[:, :, None] * pa[:, None, :]
        H = h * M - 2.0 * self.theta1 * np.eye(self.q)[None]
        return f, grad, H, ce, g_ce

    def _newton(self, C0: np.ndarray, rows: np.ndarray, h: float) -> np.ndarray:
        """Damped (Levenberg) Newton ascent from C0, per sample, to a local maximum."""
        C = C0.copy()
        active = np.arange(rows.size)
        f, grad, H, _, _ = self._f_grad_hess(C, rows, h)
        gscale = h * (1.0 + np.max(np.abs(self.A))) + 2.0 * self.theta1
        for _ in range(self.max_iter):
            if active.size == 0:
                break
            ga = grad[active]
            Ca = C[active]
            conv = np.sqrt(_row_dot(ga, ga)) <= self.tol * gscale * (
                1.0 + np.sqrt(_row_dot(Ca, Ca)))
            active = active[~conv]
            if active.size == 0:
                break
            Ha = H[active]
            ga = grad[active]
            step = None
            if h < self.h_concave * (1.0 - 5e-4):
                # H <= 2 theta1 (h / h_concave - 1) I < -1e-3 theta1 I: the shift below would be
                # 0, so the step is the plain Newton step (a batched solve, several times faster
                # than the eigendecomposition)
                try:
                    step = np.linalg.solve(Ha, -ga[:, :, None])[:, :, 0]
                except np.linalg.LinAlgError:
                    step = None
            if step is None:
                # shift the Hessian to be negative definite
                evals, evecs = np.linalg.eigh(Ha)
                lam_max = evals[:, -1]
                mu = np.where(lam_max >= -1e-3 * self.theta1, lam_max + self.theta1, 0.0)
                proj = np.einsum("mqr,mq->mr", evecs, ga)
                step = -np.einsum("mqr,mr->mq", evecs, proj / (evals - mu[:, None]))
            # backtracking on the objective
            t = np.ones(active.size)
            fa = f[active]
            newC = C[active] + step
            for _ in range(60):
                fn, gn, Hn, _, _ = self._f_grad_hess(newC, rows[active], h)
                ok = fn >= fa - 1e-15 * (1.0 + np.abs(fa))
                if np.all(ok):
                    break
                t = np.where(ok, t, 0.5 * t)
                newC = np.where(ok[:, None], newC, C[active] + t[:, None] * step)
            C[active] = np.where(ok[:, None], newC, C[active])
            f[active] = np.where(ok, fn, fa)
            grad[active] = np.where(ok[:, None], gn, grad[active])
            H[active] = np.where(ok[:, None, None], Hn, H[active])
            Ca = C[active]
            small = ~ok | (t * np.sqrt(_row_dot(step, step))
                           <= 1e-15 * (1.0 + np.sqrt(_row_dot(Ca, Ca))))
            active = active[~small]
        return C

    def _solve(self, h: float):
        h = _check_h(h)
        if self._cache is not None and self._cache[0] == h:
            return self._cache[1]
        out = self._solve_rows(h, np.arange(self.n))
        if self.cache:
            self._cache = (h, out)
        return out

    def transform_rows(self, h: float, rows):
        """``(l_h, dl_h/dh, d2l_h/dh2, C)`` of the samples ``rows`` (a slice or indices),
        nothing kept: ``C`` (m, q) holds each maximiser's reduced coordinates, its move being
        ``V C`` on the masked features (:meth:`moves`)."""
        rows = np.arange(*rows.indices(self.n)) if isinstance(rows, slice) else \
            np.asarray(rows)
        return self._solve_rows(_check_h(h), rows)

    def _solve_rows(self, h: float, rows: np.ndarray):
        m = rows.size
        if self._logistic is not None:
            fn, margins, c = self._logistic
            lh, d1, d2, t = fn(margins[rows], c, h)
            # c-space solution: the move lowers s_y - s_other by t; in c-coordinates the
            # direction is A^T (e_other - e_y) normalised, length t / ||A^T (e_o - e_y)||
            lab = self.labels[rows]
            ar = np.arange(m)
            E = np.zeros((m, self.K))
            E[ar, 1 - lab] = 1.0
            E[ar, lab] -= 1.0
            G = E @ self.A
            gn2 = _row_dot(G, G)
            C = G * (t / gn2)[:, None]
            return lh, d1, d2, C
        if h > 0.0 and self.q > 0 and math.isfinite(self.theta1) and \
                cross_entropy_kernels.use_kernel(self.n):
            # (the same algorithm row by row in one compiled loop: the same maximisers)
            return cross_entropy_kernels.solve_rows(
                self.scores, self.labels, np.asarray(rows, dtype=np.int64), self.A,
                self.theta1, h, self.h_concave, self.tol, self.max_iter)
        ce0 = self.loss(rows)
        if h == 0.0 or self.q == 0 or math.isinf(self.theta1):
            C = np.zeros((m, self.q))
            return h * ce0, ce0, np.zeros(m), C
        starts = [np.zeros((m, self.q))]
        if h > self.h_concave:
            for k in range(self.K):
                E = -np.eye(self.K)[self.labels[rows]]
                E[:, k] += 1.0
                G = E @ self.A                                  # raises s_k - s_y
                gn = np.sqrt(_row_dot(G, G))
                with np.errstate(divide="ignore", invalid="ignore"):
                    U = np.where(gn[:, None] > 0, G / np.where(gn > 0, gn, 1.0)[:, None], 0.0)
                # far stationary point of h * softplus(s_k - s_y + gn tau) - theta1 tau^2
                tau = h * gn / (2.0 * self.theta1)
                starts.append(U * tau[:, None])
        best_C = None
        best_f = None
        for C0 in starts:
            C = self._newton(C0, rows, h)
            f = self._f_grad_hess(C, rows, h)[0]
            if best_C is None:
                best_C, best_f = C, f
            else:
                better = f > best_f
                best_C = np.where(better[:, None], C, best_C)
                best_f = np.where(better, f, best_f)
        assert best_C is not None  # starts is never empty
        f, _, H, ce, g_ce = self._f_grad_hess(best_C, rows, h)
        # d2 = g^T (-H)^{-1} g  with g = A^T (p - e_y)
        try:
            sol = np.linalg.solve(-H, g_ce[:, :, None])[:, :, 0]
            d2 = _row_dot(g_ce, sol)
        except np.linalg.LinAlgError:
            d2 = np.full(m, np.nan)
        return f, ce, d2, best_C

    def evaluate(self, h: float):
        """``(l_h, dl_h/dh, d2l_h/dh2)`` at ``h``, each of shape (n,)."""
        lh, d1, d2, _ = self._solve(h)
        return lh.copy(), d1.copy(), d2.copy()

    def moves(self, h: float) -> np.ndarray:
        """The masked-coordinate displacement of each maximiser, shape (n, d_M)."""
        C = self._solve(h)[3]
        return C @ self.V.T

    def argmax(self, h: float) -> np.ndarray:
        """Moved features, shape (n, d) (needs ``X`` at construction)."""
        if self._X is None:
            raise ValueError("argmax needs X (and mask): pass them to the constructor")
        out = self._X.copy()
        out[:, self._mask] += self.moves(h)
        return out
