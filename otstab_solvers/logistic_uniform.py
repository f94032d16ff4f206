"""The logistic d-transform when every sample shares one price ``c`` (the usual case).

:func:`otstab_solvers.smooth.logistic_steps` solves, per sample, for the global maximiser of
``h softplus(t - m) - c t**2`` by bracketed Newton on the monotone pieces of its stationarity
equation, gathering and scattering the unfinished samples at every step. When ``c`` is one
number (one ``||w_M||**2`` for every sample, as for any linear model without per-sample
directions), the problem has a shape that makes a leaner solve possible:

* in ``u = t - m`` (minus the moved margin) the stationarity condition reads
  ``F(u) = T sigmoid(u) - u - m = 0`` with ``T = h / (2 c)``, and the step is
  ``t = T sigmoid(u)`` (so ``0 < t < T`` and no cancellation in ``t = u + m``);
* ``F' = T sigmoid'(u) - 1``: for ``T <= 4`` (the concave case) ``F`` is decreasing and the
  root unique; for ``T > 4`` it decreases, increases on ``(-L, L)`` and decreases again
  (``sigmoid'(L) = 1 / T``), so a margin outside ``[F_m(-L), F_m(L)]``
  (``F_m(u) = T sigmoid(u) - u``, the margin whose root is ``u``) still has one root.

:func:`uniform_steps` runs plain Newton iterations on ``F`` over the whole block at once (in
place, no gathering), started one Newton step from ``t = 0``, until every step is below
``1e-11 (1 + |u|)`` (quadratic convergence then leaves an error far below one ulp). A sample
is *accepted* only if its last step was that small, ``|F'|`` there is at least ``1e-3`` (so
the quadratic regime holds and the root is simple), its ``u`` lies in ``[-m, T - m]`` (where
every root lies) and its margin has a unique root (concave case, or outside the band above).
Every other sample (the band of two local maxima, slow or unconverged ones) is returned for
the robust solve, which compares the local maxima: the result is the global maximiser either
way, to machine precision.

:func:`two_branch_steps` solves those returned samples first, vectorised: for ``T > 4`` the
stationary points that are local maxima lie on the two decreasing branches of ``F``, the left
one ``u < -L`` (``F`` convex there) and the right one ``u > L`` (``F`` concave); Newton's
method started at ``u = -m`` (where ``F > 0``) and at ``u = T - m`` (where ``F < 0``) stays on
its branch and converges monotonically to its root (the tangent of a convex decreasing
function lies below it, that of a concave one above). The two local maxima are compared as
:func:`otstab_solvers.smooth.logistic_steps` compares them (the far one, the right branch,
unless the near one is strictly larger). A sample is accepted when both roots converged
(last step below ``STEP_TOL (1 + |u|)``) and ``|F'|`` at the chosen one is at least
``SLOPE_MIN``; the others (near a fold of ``F``, where Newton slows down) go to the robust
bracketed solve.

:class:`StepTable` gives the first iterates of a block read at a new ``h``: the step ``t*(m)``
is one function of the margin (for one ``c`` and ``h``), so a table of the exact steps on
:data:`TABLE_POINTS` equally spaced margins, interpolated linearly, starts every sample within
some ``spacing^2 |t''| / 8`` of its root (mostly 1e-7 or less at spacing 1e-3; up to some
1e-5 where ``t*`` bends sharply, near ``T = 4``), where one or two Halley steps finish it (the
start only saves iterations: the acceptance rules above are unchanged). Where that bound,
read off the table's second differences, is above :data:`QUADRATIC_ABOVE` (a first Halley
step would not pass the Newton bound ``|q| step^2`` of the tests above, and every sample of
the block would take a second: e.g. ``T = 2.7``, max error 5e-8), the table interpolates
quadratically (through three nodes: ``spacing^3 |t'''| / 15``, some 1e-10 there, 2e-9 at
``T = 3.4``; four more operations per sample).

This module imports neither otstab nor the rest of otstab_solvers.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

__all__ = ["uniform_steps", "two_branch_steps", "StepTable", "TABLE_POINTS", "QUADRATIC_ABOVE"]

#: relative size of the last Newton step for a sample to count as converged
STEP_TOL = 1e-11
#: smallest |F'| at an accepted root (below it the root is near a fold of F: robust solve)
SLOPE_MIN = 1e-3
MAX_ITER = 6
#: largest step after which the Taylor estimate of the remaining error is trusted
TAYLOR_STEP = 1e-6
_EMPTY = np.zeros(0, dtype=np.intp)
_EMPTY.setflags(write=False)


def uniform_steps(m: np.ndarray, c: float, h: float, start: np.ndarray | None = None, *,
                  start_t: np.ndarray | None = None):
    """Newton on ``T sigmoid(u) - u - m = 0`` for every margin of ``m`` (one ``c``, finite and
    > 0; ``h > 0``).

    ``start``: first iterates (e.g. the roots at a nearby ``h``); ``start_t``: the same as
    steps ``t = u + m`` (:meth:`StepTable.start_t`, or the steps at a nearby ``h``: two
    operations per sample fewer); default one Newton step from ``t = 0``. Returns ``(u, s,
    rest)``: ``u`` the root (``t - m``), ``s = sigmoid(u)`` (the step is ``t = T s``), both of
    the shape of ``m``, and ``rest`` the indices of the samples not accepted (module
    docstring), whose entries of ``u`` and ``s`` are meaningless and must be recomputed by the
    robust solve.
    """
    T = h / (2.0 * c)
    n = m.size
    band = None
    if T > 4.0:  # two local maxima for the margins in the band [F_m(-L), F_m(L)]
        L = 2.0 * math.atanh(math.sqrt(1.0 - 4.0 / T))
        sl = 1.0 / (1.0 + math.exp(L))  # sigmoid(-L)
        lo_band = T * sl + L            # F_m(-L), the local minimum of F_m
        hi_band = T * (1.0 - sl) - L    # F_m(L), the local maximum
        pad = 1e-9 * (1.0 + abs(lo_band) + abs(hi_band))
        band = (m >= lo_band - pad) & (m <= hi_band + pad)
    if start_t is not None:  # a warm start as steps, clipped to [0, T]
        u = np.clip(start_t, 0.0, T)
        u -= m
        s = np.empty(n)
    elif start is not None:  # a warm start (the roots at a nearby h), clipped to [-m, T - m]
        u = np.add(start, m)
        np.clip(u, 0.0, T, out=u)
        u -= m
        s = np.empty(n)
    else:  # one Newton step from u = -m (t = 0), clipped to [-m, T - m]
        s = expit(-m)
        fp = s * (1.0 - s)
        fp *= -T
        fp += 1.0  # 1 - T sigmoid'(-m) = -F'(-m)
        np.maximum(fp, 0.25, out=fp)
        u = s * T
        u /= fp
        np.minimum(u, T, out=u)
        u -= m
    step = np.empty(n)
    q = np.empty(n)
    buf = np.empty(n)
    if band is not None:  # these go to the robust solve: keep them still, out of the way
        u[band] = 0.0
    big = None  # (the largest 1 + |u| possible: read when the two tests below fail)
    converged = False
    for _ in range(MAX_ITER):
        expit(u, out=s)
        # F = T s - u - m, F' = T s (1 - s) - 1, F'' = T s (1 - s) (1 - 2 s). Halley's step
        # is d / (1 - d q) with the Newton step d = F / F' and q = F'' / (2 F')
        np.multiply(s, T, out=step)
        np.subtract(1.0, s, out=buf)
        buf *= step                  # T s (1 - s)
        np.subtract(0.5, s, out=q)
        q *= buf                     # F'' / 2
        buf -= 1.0                   # F'
        step -= u
        step -= m                    # F
        with np.errstate(divide="ignore", invalid="ignore"):
            q /= buf                 # q
            step /= buf              # d
            np.multiply(step, q, out=buf)
            np.subtract(1.0, buf, out=buf)
            step /= buf              # Halley's step
        if band is not None:
            step[band] = 0.0
        u -= step
        np.abs(step, out=buf)
        worst = float(buf.max()) if n else 0.0
        if worst <= STEP_TOL:  # every step below STEP_TOL (1 + |u|) (NaN: not here)
            converged = True
            break
        if worst <= TAYLOR_STEP:
            # the error left after the step is below Newton's |q| step^2 (Halley's is smaller
            # still): under a quarter ulp of 1 for every sample, no confirming iteration
            buf *= buf
            np.abs(q, out=q)
            buf *= q
            if band is not None:
                buf[band] = 0.0
            if float(buf.max()) <= 2.5e-17:
                converged = True
                break
        if big is None:
            big = float(np.max(np.abs(m))) + T + 1.0 if n else 1.0
        if worst <= STEP_TOL * big and \
                not np.any(np.abs(step) > STEP_TOL * (1.0 + np.abs(u))):
            converged = True
            break
    # the accepted samples: small last step, |F'| >= SLOPE_MIN at the root, u in [-m, T - m]
    # (sigmoid at the new u to second order in the last step: its error is O(step^3), far
    # below an ulp)
    ds = s * (1.0 - s)
    # |F'| = 1 - T s (1 - s) >= 1 - T / 4: at least SLOPE_MIN for every sample when T is
    # below 4 (1 - 2 SLOPE_MIN) (no test needed)
    slope = T * ds - 1.0 if T > 4.0 * (1.0 - 2.0 * SLOPE_MIN) else None
    np.subtract(0.5, s, out=buf)
    buf *= step
    np.subtract(1.0, buf, out=buf)  # 1 - (1/2 - s) step
    buf *= step
    buf *= ds
    s -= buf  # s - s' step + s'' step^2 / 2
    # u in [-m, T - m]: |u + m - T / 2| <= T / 2 (every root lies inside, none on the ends).
    # Converged, every step was finite (the largest is, NaN is not below a bound)
    ok = np.add(u, m, out=buf)
    ok -= 0.5 * T
    np.abs(ok, out=ok)
    ok = ok <= 0.5 * T
    if not converged:
        ok &= np.abs(step) <= STEP_TOL * (1.0 + np.abs(u))
    if slope is not None:
        ok &= np.abs(slope) >= SLOPE_MIN
    if band is not None:
        ok &= ~band
    rest = _EMPTY if ok.all() else np.flatnonzero(~ok)
    return u, s, rest


#: Newton iterations of :func:`two_branch_steps` on each branch
BRANCH_ITER = 30


def _branch_root(m: np.ndarray, T: float, u: np.ndarray):
    """Newton on ``T sigmoid(u) - u - m`` from ``u`` (in place), on one monotone branch:
    ``(u, converged)``; only the unconverged samples are iterated (compacted)."""
    done = np.zeros(m.size, dtype=bool)
    ix = np.arange(m.size)
    ui, mi = u, m
    for _ in range(BRANCH_ITER):
        s = expit(ui)
        fp = T * s * (1.0 - s) - 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            step = (T * s - ui - mi) / fp
        ui = ui - step
        fin = np.abs(step) <= STEP_TOL * (1.0 + np.abs(ui))
        if fin.any():
            u[ix[fin]] = ui[fin]
            done[ix[fin]] = True
            keep = ~fin & np.isfinite(ui)
            ix, ui, mi = ix[keep], ui[keep], mi[keep]
        if not ix.size:
            break
    return u, done


def two_branch_steps(m: np.ndarray, c: float, h: float):
    """The global maximiser of ``h softplus(t - m) - c t**2`` (one ``c``, finite and > 0;
    ``h > 0``) for margins that may have two local maxima (module docstring): ``(u, s, ok)``
    with ``u = t - m``, ``s = sigmoid(u)`` and ``ok`` the accepted samples (the entries of the
    others are meaningless)."""
    T = h / (2.0 * c)
    m = np.asarray(m, dtype=np.float64)
    if T <= 4.0:  # one decreasing branch
        u, ok = _branch_root(m, T, T - m)
    else:
        # the left branch has a root iff m >= F_m(-L), the right one iff m <= F_m(L); a
        # sample within 1e-9 of either end goes to the robust solve (a fold: slow Newton)
        L = 2.0 * math.atanh(math.sqrt(1.0 - 4.0 / T))
        sl = 1.0 / (1.0 + math.exp(L))  # sigmoid(-L)
        lo_band, hi_band = T * sl + L, T * (1.0 - sl) - L
        pad = 1e-9 * (1.0 + abs(lo_band) + abs(hi_band))
        has_near = m >= lo_band + pad
        has_far = m <= hi_band - pad
        ok = has_near | has_far
        ok &= (np.abs(m - lo_band) > pad) & (np.abs(m - hi_band) > pad)
        u = np.zeros(m.size)
        v = np.full(m.size, -np.inf)
        for has, start in ((has_far, T - m), (has_near, -m)):
            idx = np.flatnonzero(has)
            if not idx.size:
                continue
            mi = m[idx]
            ui, conv = _branch_root(mi, T, start[idx])
            ok[idx[~conv]] = False
            with np.errstate(over="ignore", invalid="ignore"):
                vi = h * np.logaddexp(0.0, ui) - c * (ui + mi) ** 2
            # the far root first; the near one where strictly larger (as logistic_steps)
            better = vi > v[idx]
            u[idx[better]], v[idx[better]] = ui[better], vi[better]
    s = expit(u)
    ok &= np.abs(T * s * (1.0 - s) - 1.0) >= SLOPE_MIN
    ok &= (u >= -m) & (u <= T - m) & np.isfinite(u)
    return u, s, ok


#: margins of a :class:`StepTable`
TABLE_POINTS = (1 << 14) + 1
#: the largest error of the linear interpolation of a :class:`StepTable` (its second
#: differences / 8) above which it interpolates quadratically
QUADRATIC_ABOVE = 1e-8


class StepTable:
    """First iterates of :func:`uniform_steps` from the exact steps ``t`` at equally spaced
    margins ``lo + k (hi - lo) / (points - 1)`` (``steps(grid) -> t``: e.g. the lean solve
    itself), interpolated linearly, or quadratically where the linear error would be above
    :data:`QUADRATIC_ABOVE` (module docstring; ``quadratic`` forces either); margins outside
    ``[lo, hi]`` take the nearest segment's curve."""

    def __init__(self, lo: float, hi: float, steps, points: int = TABLE_POINTS,
                 quadratic: bool | None = None):
        self.lo = float(lo)
        span = float(hi) - self.lo
        self.points = int(points) if span > 0 else 2
        self.inv = (self.points - 1) / span if span > 0 else 0.0
        grid = self.lo + np.arange(self.points) * (span / (self.points - 1))
        t = np.asarray(steps(grid), dtype=np.float64)
        self.t = t[:-1]
        self.dt = np.diff(t)
        #: half the second difference of the nodes k, k + 1, k + 2 (the last segment: of the
        #: nodes before it), the quadratic term; None: linear
        self.half_d2: np.ndarray | None = None
        if self.points >= 3:
            d2 = np.diff(self.dt)
            if quadratic is None:  # (the linear error on a segment: |d2| / 8; NaN: quadratic)
                quadratic = not float(np.max(np.abs(d2))) / 8.0 <= QUADRATIC_ABOVE
            if quadratic:
                self.half_d2 = 0.5 * np.append(d2, d2[-1])

    def start(self, m: np.ndarray) -> np.ndarray:
        """The first iterates ``u = t - m`` of the margins ``m``."""
        u = self.start_t(m)
        u -= m
        return u

    def start_t(self, m: np.ndarray) -> np.ndarray:
        """The first iterates as steps ``t`` (``uniform_steps(..., start_t=)``)."""
        x = np.subtract(m, self.lo)
        x *= self.inv
        k = x.astype(np.intp)
        np.clip(k, 0, self.points - 2, out=k)
        x -= k  # the position within the segment (outside [0, 1] beyond the ends)
        if self.half_d2 is not None:  # t_k + x (dt_k + (x - 1) d2_k / 2)
            t = np.subtract(x, 1.0)
            t *= self.half_d2.take(k)
            t += self.dt.take(k)
        else:
            t = self.dt.take(k)
        t *= x
        t += self.t.take(k)
        return t
