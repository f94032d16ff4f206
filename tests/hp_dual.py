"""A high-precision 1-D dual of the two-piece forms, independent of otstab.

``l_h(z_i) = max(0, u_i h + c h^2)`` (hinge of a linear binary model: ``u_i = 1 - m_i``,
``c = ||beta||^2 / (4 theta1)``, ``m_i`` the margins from the model's own decision_function)
or ``l_h = (h - a_i)_+`` (0/1 loss from the move prices ``a_i = theta1 d*_i``). The inputs
(doubles) are converted exactly to :class:`decimal.Decimal` and everything after that is
computed with ``PREC`` significant digits: l_h, the divergence term (KL by exp/ln, chi2 by the
exact piecewise-linear alpha of Remark 5 over the sorted values) and the right derivative
``g(h+) = r - E_w[dl/dh(h+)]`` (envelope theorem). ``g`` is nonincreasing, so the maximiser
is found by bisection on its sign (no step rule, no tolerance on a rounded objective), and the
value is the objective there. Nothing here calls otstab.
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal

PREC = 50
ITERS = 400


def _ctx():
    ctx = decimal.Context(prec=PREC, Emin=-999999, Emax=999999)
    return decimal.localcontext(ctx)


def _pieces(kind, keys, c, h):
    """(l_h, dl/dh at h+) of every sample."""
    out_l, out_d = [], []
    for k in keys:
        if kind == "hinge":
            v = k * h + c * h * h
            d = k + 2 * c * h
        else:  # distance: l = h - a
            v = h - k
            d = Decimal(1)
        if v > 0 or (v == 0 and d > 0):
            out_l.append(max(v, Decimal(0)))
            out_d.append(d)
        else:
            out_l.append(Decimal(0))
            out_d.append(Decimal(0))
    return out_l, out_d


def _term_and_weights(lh, p, theta2, div):
    """(divergence term, weights w_i with sum p_i w_i = 1)."""
    n = len(lh)
    if theta2 is None:
        return sum(pi * li for pi, li in zip(p, lh)), [Decimal(1)] * n
    if div == "kl":
        m = max(li for li, pi in zip(lh, p) if pi > 0)
        e = [((li - m) / theta2).exp() for li in lh]
        z = sum(pi * ei for pi, ei in zip(p, e))
        return m + theta2 * z.ln(), [ei / z for ei in e]
    # chi2: sum_i p_i ((l_i + alpha) / (2 theta2) + 1)_+ = 1, the active set a top set of l
    two = 2 * theta2
    order = sorted((i for i in range(n) if p[i] > 0), key=lambda i: -lh[i])
    sp = sl = Decimal(0)
    alpha = None
    for k, i in enumerate(order):
        sp += p[i]
        sl += p[i] * lh[i]
        a = (two - sl - two * sp) / sp  # sum_{top} p (l + a + 2 theta2) = 2 theta2
        nxt = lh[order[k + 1]] if k + 1 < len(order) else None
        if lh[i] + a + two > 0 and (nxt is None or nxt + a + two <= 0):
            alpha = a
            break
    w = [max((li + alpha) / two + 1, Decimal(0)) for li in lh]
    term = -alpha - theta2 + theta2 * sum(pi * wi * wi for pi, wi in zip(p, w))
    return term, w


def dual(kind, keys, r, theta2, divergence="kl", *, c=0.0, p=None):
    """``(value, h)`` of ``sup_h h r - T(h)`` to about ``PREC`` digits (as floats).

    ``keys``: ``u_i`` (hinge) or ``a_i`` (distance); ``theta2``: ``math.inf`` for the
    moving-only dual; ``p``: sample probabilities (default uniform, ``1/n`` exactly)."""
    with _ctx():
        ks = [Decimal(float(k)) for k in keys]
        n = len(ks)
        pp = [Decimal(1) / n] * n if p is None else [Decimal(float(q)) for q in p]
        tot = sum(pp)
        pp = [q / tot for q in pp]
        cc = Decimal(float(c))
        rr = Decimal(float(r))
        t2 = None if math.isinf(theta2) else Decimal(float(theta2))

        def g(h):
            lh, d = _pieces(kind, ks, cc, h)
            _, w = _term_and_weights(lh, pp, t2, divergence)
            return rr - sum(pi * wi * di for pi, wi, di in zip(pp, w, d))

        def F(h):
            lh, _ = _pieces(kind, ks, cc, h)
            return h * rr - _term_and_weights(lh, pp, t2, divergence)[0]

        if g(Decimal(0)) <= 0:
            return 0.0, 0.0
        lo, hi = Decimal(0), Decimal(1) if kind == "distance" else Decimal("1e-30")
        while g(hi) > 0:
            lo, hi = hi, hi * 10
            if hi > Decimal("1e300"):
                raise ValueError("unbounded dual (r unreachable?)")
        for _ in range(ITERS):
            mid = (lo + hi) / 2
            if g(mid) > 0:
                lo = mid
            else:
                hi = mid
            if hi - lo <= hi * Decimal(10) ** (-PREC + 5):
                break
        best = max((lo, hi), key=F)
        return float(F(best)), float(best)
