"""Specialised solvers for the 1-D (KL) and 2-D (chi2) duals (MATH.md, Proposition 1).

The dual objective, as a function of the scalar ``h >= 0``, is concave:

- KL:   F(h) = h r - theta2 log mean_i exp(l_h(z_i)/theta2)
- chi2: F(h) = h r - [-alpha - theta2 + theta2 mean_i w_i^2] at the exact alpha(h)
  (alpha solves the piecewise-linear equation of Remark 5 by a sort)
- theta2 = inf (either divergence): F(h) = h r - mean_i l_h(z_i)

Its derivative (envelope theorem) is ``g(h) = r - E_w[d l_h/dh]`` with ``d l_h/dh`` the loss at
the maximiser; ``g`` is nonincreasing. We find the root of ``g`` by a safeguarded Newton method
inside a bracket ``[lo, hi]`` with ``g(lo) > 0 > g(hi)``. For the piecewise-linear reduced form
``l_h = max_k c1[i,k] h + c2[i,k] h^2`` the derivative jumps at "kinks" (a sample switches
piece); the solver locates them exactly: when the samples that switch between ``lo`` and ``hi``
all switch at one point, the root is that kink if ``g`` changes sign across it, else the
bracket is cut there. So optima at a kink (common for hinge and 0/1 losses) are found exactly,
not by slow bisection.

Every function evaluation is O(nK), computed over row blocks of ``block`` rows so that no
n x K temporary beyond one block is made.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .result import FAILED, OPTIMAL, DualSolution
from .weights import chi2_alpha, chi2_dual_term, kl_dual_term

__all__ = ["PiecewiseOracle", "solve_dual", "dual_objective", "DEFAULT_BLOCK"]

DEFAULT_BLOCK = 1 << 16


class PiecewiseOracle:
    """``l_h`` of the reduced form ``max_k c1[i,k] h + c2[i,k] h^2`` and its derivatives.

    ``evaluate(h)`` returns ``(l_h, right derivative, second derivative)``, each of shape (n,);
    at a tie the piece with the largest derivative is taken (the right derivative).
    """

    h_max = math.inf

    def __init__(self, c1, c2, *, block: int = DEFAULT_BLOCK):
        self.c1 = np.asarray(c1, dtype=np.float64)
        c2 = np.asarray(c2, dtype=np.float64)
        if c2.ndim == 1:
            c2 = c2[None, :]
        self.c2 = c2
        self.n, self.K = self.c1.shape
        self.block = int(block)
        self._rowwise_c2 = c2.shape[0] > 1

    def _blocks(self):
        for s in range(0, self.n, self.block):
            yield s, min(s + self.block, self.n)

    def _c2(self, s, e):
        return self.c2[s:e] if self._rowwise_c2 else self.c2

    def evaluate(self, h: float, *, side: str = "right", with_pieces: bool = False):
        n = self.n
        lh = np.empty(n)
        d1 = np.empty(n)
        d2 = np.empty(n)
        ks = np.empty(n, dtype=np.intp) if with_pieces else None
        for s, e in self._blocks():
            c1 = self.c1[s:e]
            c2 = np.broadcast_to(self._c2(s, e), c1.shape)
            V = c1 * h + c2 * (h * h)
            D = c1 + 2.0 * h * c2
            vmax = V.max(axis=1)
            if self.K == 1:
                k = np.zeros(e - s, dtype=np.intp)
            else:
                tol = 1e-12 * (1.0 + np.abs(vmax))
                tied = V >= (vmax - tol)[:, None]
                Dm = np.where(tied, D, -np.inf if side == "right" else np.inf)
                k = Dm.argmax(axis=1) if side == "right" else Dm.argmin(axis=1)
            rows = np.arange(e - s)
            lh[s:e] = vmax
            d1[s:e] = D[rows, k]
            d2[s:e] = 2.0 * c2[rows, k]
            if with_pieces:
                ks[s:e] = k
        if with_pieces:
            return lh, d1, d2, ks
        return lh, d1, d2

    def active(self, h: float, *, side: str = "right") -> np.ndarray:
        """Index of the active piece per sample (ties broken by the derivative, as evaluate)."""
        out = np.empty(self.n, dtype=np.intp)
        for s, e in self._blocks():
            c1 = self.c1[s:e]
            c2 = np.broadcast_to(self._c2(s, e), c1.shape)
            V = c1 * h + c2 * (h * h)
            if self.K == 1:
                out[s:e] = 0
                continue
            D = c1 + 2.0 * h * c2
            vmax = V.max(axis=1)
            tied = V >= (vmax - 1e-12 * (1.0 + np.abs(vmax)))[:, None]
            Dm = np.where(tied, D, -np.inf if side == "right" else np.inf)
            out[s:e] = Dm.argmax(axis=1) if side == "right" else Dm.argmin(axis=1)
        return out

    def crossings(self, ka: np.ndarray, kb: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The h > 0 where pieces ``ka[i]`` and ``kb[i]`` of sample ``idx[i]`` are equal."""
        c1 = self.c1[idx]
        c2 = np.broadcast_to(self.c2, self.c1.shape)[idx] if not self._rowwise_c2 else self.c2[idx]
        r = np.arange(idx.size)
        dc1 = c1[r, kb] - c1[r, ka]
        dc2 = c2[r, ka] - c2[r, kb]
        with np.errstate(divide="ignore", invalid="ignore"):
            hc = np.where(dc2 != 0.0, dc1 / dc2, np.nan)
        return hc


def _reduce(lh, d1, d2, theta2, divergence, n):
    """(divergence term, mean_w d1, curvature) at one h."""
    if math.isinf(theta2):
        return float(np.mean(lh)), float(np.mean(d1)), float(np.mean(d2)), None
    if divergence == "kl":
        a = lh / theta2
        m = a.max()
        e = np.exp(a - m)
        Z = e.sum()
        term = theta2 * (m + math.log(Z / n))
        s = e / Z
        mu = float(s @ d1)
        var = float(s @ (d1 - mu) ** 2)
        curv = float(s @ d2) + var / theta2
        return term, mu, curv, None
    alpha = chi2_alpha(lh, theta2)
    w = np.maximum((lh + alpha) / (2.0 * theta2) + 1.0, 0.0)
    term = float(-alpha - theta2 + theta2 * np.mean(w * w))
    mu = float(w @ d1) / n
    act = w > 0
    da = d1[act]
    curv = (float(w @ d2) + float(((da - da.mean()) ** 2).sum()) / (2.0 * theta2)) / n
    return term, mu, curv, alpha


def dual_objective(lh, h, r, theta2, divergence):
    """F(h) = h r - divergence term of ``l_h`` values (exact alpha for chi2)."""
    if divergence == "kl" or math.isinf(theta2):
        return h * r - kl_dual_term(lh, theta2)
    return h * r - chi2_dual_term(lh, theta2)


def solve_dual(oracle, r: float, theta2: float, divergence: str, *, tol: float = 1e-13,
               max_iter: int = 200, h_init: float | None = None) -> DualSolution:
    """Maximise the concave dual over ``h >= 0`` given an oracle for ``l_h``.

    The oracle has ``n``, ``h_max`` and ``evaluate(h) -> (l_h, dl_h/dh, d2l_h/dh2 or None)``;
    piecewise oracles (with ``active``/``crossings``) get exact kink handling. Returns a
    :class:`DualSolution` with ``gap_bound`` from the final bracket (concavity: F* is below the
    tangent at either end of the bracket).
    """
    t0 = time.perf_counter()
    n = oracle.n
    kinks = hasattr(oracle, "crossings")
    evals = 0

    def at(h, side="right"):
        nonlocal evals
        evals += 1
        k = None
        if kinks:
            lh, d1, d2, k = oracle.evaluate(h, side=side, with_pieces=True)
        else:
            lh, d1, d2 = oracle.evaluate(h)
        if d2 is None:
            d2 = np.zeros_like(lh)
        term, mu, curv, alpha = _reduce(lh, d1, d2, theta2, divergence, n)
        return {"h": h, "F": h * r - term, "g": r - mu, "curv": curv, "alpha": alpha, "k": k}

    def finish(p, status, lo, hi, note=""):
        gap = 0.0
        if lo is not None and hi is not None and hi["h"] > lo["h"]:
            w = hi["h"] - lo["h"]
            ub = min(lo["F"] + max(lo["g"], 0.0) * w, hi["F"] + max(-hi["g"], 0.0) * w)
            gap = max(ub - p["F"], 0.0)
        return DualSolution(
            h=p["h"], alpha=p["alpha"], value=p["F"], status=status, solver="dual",
            native_status=note or status, iterations=evals, gap_bound=gap,
            solve_time=time.perf_counter() - t0,
        )

    p0 = at(0.0, "right")
    if divergence == "chi2" and p0["alpha"] is None:
        p0["alpha"] = 0.0 if not math.isinf(theta2) else 0.0
    if p0["g"] <= 0.0:
        p0["F"] = 0.0
        return finish(p0, OPTIMAL, None, None, "r <= base risk")
    lo = p0
    # bracket: grow h until g < 0
    h = h_init if h_init and h_init > 0 else max(1.0 / max(p0["curv"], 1e-300), 1e-8)
    h = min(h, 1e6) if math.isfinite(h) else 1.0
    hi = None
    for _ in range(400):
        if h >= oracle.h_max:
            h = 0.5 * (lo["h"] + oracle.h_max)
        p = at(h)
        if not math.isfinite(p["F"]):
            return finish(lo, FAILED, None, None, "non-finite dual objective while bracketing")
        if p["g"] < 0.0:
            hi = p
            break
        lo = p
        if p["g"] == 0.0:
            return finish(p, OPTIMAL, None, None)
        # Newton guess from lo, at least doubling
        step = p["g"] / p["curv"] if p["curv"] > 0 else math.inf
        h = max(2.0 * h, h + step if math.isfinite(step) else 4.0 * h)
    if hi is None:
        return finish(lo, FAILED, None, None, "could not bracket the root (threshold unreachable?)")

    if kinks and hi["h"] > 0:
        hi = at(hi["h"], "left")
    for _ in range(max_iter):
        width = hi["h"] - lo["h"]
        if width <= tol * max(1.0, hi["h"]):
            break
        hc = np.empty(0)
        if kinks:
            sw = np.nonzero(lo["k"] != hi["k"])[0]
            if sw.size:
                hc = oracle.crossings(lo["k"][sw], hi["k"][sw], sw)
                hc = hc[np.isfinite(hc) & (hc > lo["h"]) & (hc < hi["h"])]
            if hc.size and hc.max() - hc.min() <= 1e-12 * max(1.0, hc.max()):
                # one kink left in the bracket: the root is there iff g changes sign across it
                hk = float(np.median(hc))
                left, right = at(hk, "left"), at(hk, "right")
                if left["g"] >= 0.0 >= right["g"]:
                    best = right if abs(right["g"]) <= abs(left["g"]) else left
                    return finish(best, OPTIMAL, None, None, "optimum at a kink")
                if right["g"] > 0:
                    lo = right
                else:
                    hi = left
                continue
        cur = lo if abs(lo["g"]) < abs(hi["g"]) else hi
        h_new, at_kink = None, False
        if cur["curv"] > 0:
            cand = cur["h"] + cur["g"] / cur["curv"]
            if lo["h"] < cand < hi["h"]:
                h_new = cand
        if h_new is None and hc.size:
            h_new, at_kink = float(np.median(hc)), True
        if h_new is None:
            denom = lo["g"] - hi["g"]
            cand = lo["h"] + lo["g"] * width / denom if denom > 0 else math.nan
            if lo["h"] < cand < hi["h"] and min(cand - lo["h"], hi["h"] - cand) > 0.05 * width:
                h_new = cand
            else:
                h_new = 0.5 * (lo["h"] + hi["h"])
        p = at(h_new, "right")
        if p["g"] > 0:
            lo = p
        elif p["g"] == 0:
            return finish(p, OPTIMAL, None, None)
        else:
            hi = at(h_new, "left") if at_kink else p
            if hi["g"] > 0:  # the root is exactly at this kink
                return finish(p if abs(p["g"]) <= abs(hi["g"]) else hi, OPTIMAL, None, None,
                              "optimum at a kink")
        # guard against slow one-sided Newton progress
        if hi["h"] - lo["h"] > 0.5 * width and not at_kink:
            mid = at(0.5 * (lo["h"] + hi["h"]), "right")
            if mid["g"] > 0:
                lo = mid
            else:
                hi = mid
        cur = lo if abs(lo["g"]) < abs(hi["g"]) else hi
        if abs(cur["g"]) <= tol * (1.0 + abs(r)):
            return finish(cur, OPTIMAL, lo, hi)
    best = lo if lo["F"] >= hi["F"] else hi
    status = OPTIMAL if hi["h"] - lo["h"] <= 1e-9 * max(1.0, hi["h"]) else FAILED
    return finish(best, status, lo, hi, "" if status == OPTIMAL else "max_iter reached")


def refine(oracle, h: float, r: float, theta2: float, divergence: str, *, steps: int = 4):
    """Iterative refinement of an approximate dual solution (e.g. from a conic solver).

    Takes up to ``steps`` Newton steps on the exact dual derivative from ``h``, keeping a step
    only if it raises the dual objective. Interior-point solvers determine ``h`` to about the
    square root of their tolerance because the dual is flat near its optimum; the risk of Q*
    depends on the derivative, so the refined ``h`` is what makes the primal audit close.
    Returns ``(h, F(h), alpha, n_accepted_steps)``.
    """
    n = oracle.n

    def at(hh):
        lh, d1, d2 = oracle.evaluate(hh)[:3]
        term, mu, curv, alpha = _reduce(lh, d1, np.zeros_like(lh) if d2 is None else d2,
                                        theta2, divergence, n)
        return hh * r - term, r - mu, curv, alpha

    F, g, curv, alpha = at(h)
    accepted = 0
    for _ in range(steps):
        if curv <= 0 or g == 0:
            break
        cand = max(h + g / curv, 0.0)
        if cand >= oracle.h_max:
            break
        F2, g2, curv2, alpha2 = at(cand)
        if not F2 > F:
            break
        h, F, g, curv, alpha = cand, F2, g2, curv2, alpha2
        accepted += 1
    return h, F, alpha, accepted
