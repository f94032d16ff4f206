"""Linear bound propagation (CROWN-style) for feed-forward networks over L2 balls.

A network here is ``z_0 = x W_0 + b_0``, ``a_t = g_t(z_t)``, ``z_{t+1} = a_t W_{t+1} + b_{t+1}``
(weights ``(in, out)``), with an elementwise activation ``g_t`` per hidden layer (identity,
ReLU, LeakyReLU, tanh, logistic sigmoid, GELU with the exact erf form) and logits out. For a
ball ``||x - x_i||_2 <= rho`` over the movable coordinates:

* the first pre-activations are bounded exactly: ``z_0 +- rho ||W_0[mv, j]||``;
* every activation gets two linear functions over its pre-activation interval ``[l, u]``,
  ``k_lo z + c_lo <= g(z) <= k_hi z + c_hi`` (:func:`relax`): for ReLU/LeakyReLU the chord
  above and the better of the two pieces below (CROWN's adaptive choice); for the smooth ones
  the chord slope with both intercepts from the exact extremes of ``g(z) - k z`` over
  ``[l, u]`` (at the ends and the stationary points ``g'(z) = k``, which are closed forms for
  tanh and sigmoid and found by bracketed bisection for GELU, with the bracket's width charged);
* a linear function of the output ``C z_L`` is pulled back layer by layer to the input, taking
  the lower relaxation where its coefficient is positive and the upper one where it is
  negative (CROWN, Zhang et al. 2018), which gives ``C z_L >= a . (x - x_i) + c`` on the ball,
  hence ``>= c - rho' ||a_mv||`` on every ball of radius ``rho' <= rho`` (:func:`linear_lower`).
  Hidden pre-activation bounds of deeper layers come from the same pull-back.

A small rounding allowance (``1e-12`` relative to the size of the terms) is taken off every
lower bound; with identity activations there is no relaxation and the bound is the exact
linear one. The same code runs on NumPy arrays (scikit-learn MLPs) and on torch tensors on the
module's device (:class:`Ops`), in float64.

On top of it: :func:`certified_radius` (0/1 loss: a radius per sample inside which no margin
changes sign) and :func:`transform_upper` (smooth losses: an over-estimate of the d-transform
``l_h(z_i) = max_x h l(f(x), y) - theta1 ||x - x_i||^2`` from loss bounds on nested balls).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..modeling._costs import Rescaled

__all__ = ["Network", "as_network", "relax", "linear_lower", "margin_rows",
           "certified_radius", "transform_upper", "Ops"]

#: relative rounding allowance taken off every computed lower bound
ROUND = 1e-12

_SQRT2 = math.sqrt(2.0)


# ----------------------------------------------------------------------------------------------
# array backends
# ----------------------------------------------------------------------------------------------


class Ops:
    """The few array operations the propagation needs, on NumPy (``torch=None``) or torch."""

    def __init__(self, torch=None, device=None):
        self.torch, self.device = torch, device
        #: array elements per chunk of rows (an accelerator takes far larger batches)
        self.budget = 5e7 if device is not None and getattr(device, "type", "cpu") != "cpu" \
            else 4e6

    def asarray(self, a):
        if self.torch is None:
            return np.asarray(a, dtype=np.float64)
        if isinstance(a, self.torch.Tensor):
            return a.to(device=self.device, dtype=self.torch.float64)
        return self.torch.as_tensor(np.asarray(a, dtype=np.float64), device=self.device)

    def numpy(self, a):
        if self.torch is None:
            return np.asarray(a)
        return a.detach().cpu().numpy()

    def einsum(self, spec, *args):
        return (np.einsum if self.torch is None else self.torch.einsum)(spec, *args)

    def pos(self, a):
        return np.maximum(a, 0.0) if self.torch is None else self.torch.clamp(a, min=0.0)

    def neg(self, a):
        return np.minimum(a, 0.0) if self.torch is None else self.torch.clamp(a, max=0.0)

    def where(self, c, a, b):
        if self.torch is None:
            return np.where(c, a, b)
        t = self.torch
        a = a if isinstance(a, t.Tensor) else t.as_tensor(a, dtype=t.float64, device=self.device)
        b = b if isinstance(b, t.Tensor) else t.as_tensor(b, dtype=t.float64, device=self.device)
        return t.where(c, a, b)

    def maximum(self, a, b):
        if self.torch is None:
            return np.maximum(a, b)
        if not isinstance(b, self.torch.Tensor):
            return self.torch.clamp(a, min=float(b))
        return self.torch.maximum(a, b)

    def minimum(self, a, b):
        if self.torch is None:
            return np.minimum(a, b)
        if not isinstance(b, self.torch.Tensor):
            return self.torch.clamp(a, max=float(b))
        return self.torch.minimum(a, b)

    def clip(self, a, lo, hi):
        return self.minimum(self.maximum(a, lo), hi)

    def sqrt(self, a):
        return np.sqrt(a) if self.torch is None else self.torch.sqrt(a)

    def abs(self, a):
        return np.abs(a) if self.torch is None else self.torch.abs(a)

    def tanh(self, a):
        return np.tanh(a) if self.torch is None else self.torch.tanh(a)

    def atanh(self, a):
        return np.arctanh(a) if self.torch is None else self.torch.atanh(a)

    def exp(self, a):
        return np.exp(a) if self.torch is None else self.torch.exp(a)

    def erf(self, a):
        if self.torch is None:
            from scipy.special import erf  # noqa: PLC0415
            return erf(a)
        return self.torch.erf(a)

    def sum(self, a, axis):
        return a.sum(axis) if self.torch is None else a.sum(dim=axis)

    def amin(self, a, axis):
        return a.min(axis) if self.torch is None else a.min(dim=axis).values

    def amax(self, a, axis):
        return a.max(axis) if self.torch is None else a.max(dim=axis).values

    def stack(self, arrs, axis=0):
        return np.stack(arrs, axis) if self.torch is None else self.torch.stack(arrs, dim=axis)

    def full(self, shape, value):
        if self.torch is None:
            return np.full(shape, value, dtype=np.float64)
        return self.torch.full(shape, value, dtype=self.torch.float64, device=self.device)

    def eye(self, k):
        if self.torch is None:
            return np.eye(k)
        return self.torch.eye(k, dtype=self.torch.float64, device=self.device)


# ----------------------------------------------------------------------------------------------
# the network
# ----------------------------------------------------------------------------------------------


@dataclass
class Network:
    """Weights ``W[t]`` (in, out) and biases ``b[t]`` as arrays of ``ops``, one activation
    ``(name, parameter)`` per hidden layer, ``task`` (binary: one logit, class 1 iff > 0)."""

    W: list
    b: list
    acts: list
    task: str
    ops: Ops

    def outputs(self, X):
        """The logits, as NumPy (binary: shape (n,))."""
        o = self.ops
        Z = o.asarray(X)
        for t in range(len(self.W) - 1):
            Z = activation(o, self.acts[t], Z @ self.W[t] + self.b[t])
        out = o.numpy(Z @ self.W[-1] + self.b[-1])
        return out[:, 0] if self.task != "multiclass" else out

    @property
    def n_out(self) -> int:
        return int(self.W[-1].shape[1])


def activation(o: Ops, act, Z):
    name, par = act
    if name == "identity":
        return Z
    if name == "relu":
        return o.pos(Z)
    if name == "leaky_relu":
        return o.pos(Z) + par * o.neg(Z)
    if name == "tanh":
        return o.tanh(Z)
    if name == "logistic":
        return 0.5 * (1.0 + o.tanh(0.5 * Z))
    if name == "gelu":
        return 0.5 * Z * (1.0 + o.erf(Z / _SQRT2))
    raise ValueError(f"unknown activation {name!r}")  # pragma: no cover


def _derivative(o: Ops, name, Z):
    if name == "tanh":
        return 1.0 - o.tanh(Z) ** 2
    if name == "logistic":
        s = 0.5 * (1.0 + o.tanh(0.5 * Z))
        return s * (1.0 - s)
    if name == "gelu":
        return 0.5 * (1.0 + o.erf(Z / _SQRT2)) + Z * o.exp(-0.5 * Z * Z) / math.sqrt(2 * math.pi)
    raise ValueError(name)  # pragma: no cover


#: torch module class names and the activations they stand for
_TORCH_ACTS = {"ReLU": "relu", "LeakyReLU": "leaky_relu", "Tanh": "tanh", "Sigmoid": "logistic",
               "GELU": "gelu", "Identity": "identity"}


def as_network(adapter) -> Network | None:
    """``adapter`` as a :class:`Network`, or None when it is not a feed-forward network of the
    supported form: an otstab MLP adapter (``W``, ``b``, ``activation``: scikit-learn
    ``MLPClassifier``/``MLPRegressor``, NumPy), a :class:`~otstab.costs.Rescaled` around one
    (the first layer reads ``W_0 / s``), or a :class:`~otstab.nonlinear.TorchModel` whose module
    is an ``nn.Sequential`` of ``Linear`` layers with at most one elementwise activation
    (ReLU, LeakyReLU, Tanh, Sigmoid, GELU with ``approximate='none'``, Identity) between them,
    ``Dropout`` allowed (the identity in eval mode), logits out (torch, on the module's
    device). A binary module with two outputs is collapsed to the difference of its logits."""
    if isinstance(adapter, Rescaled):
        inner = as_network(adapter.inner)
        if inner is None:
            return None
        o = inner.ops
        s = o.asarray(adapter.s)
        return Network([inner.W[0] / s[:, None], *inner.W[1:]], list(inner.b), inner.acts,
                       inner.task, o)
    if hasattr(adapter, "W") and hasattr(adapter, "activation"):
        Wn = [np.asarray(w, dtype=np.float64) for w in adapter.W]
        bn = [np.asarray(v, dtype=np.float64) for v in adapter.b]
        return Network(Wn, bn, [(adapter.activation, 0.0)] * (len(Wn) - 1), adapter.task, Ops())
    module = getattr(adapter, "module", None)
    if module is None or type(module).__name__ != "Sequential":
        return None
    torch = adapter._torch
    o = Ops(torch, adapter.device)
    W: list = []
    b: list = []
    acts: list = []
    pending = None  # the activation after the last Linear, if any
    for layer in module.children():
        kind = type(layer).__name__
        if kind == "Linear":
            if W:
                acts.append(pending or ("identity", 0.0))
            pending = None
            W.append(layer.weight.detach().to(torch.float64).T.clone())
            b.append(layer.bias.detach().to(torch.float64).clone() if layer.bias is not None
                     else torch.zeros(layer.out_features, dtype=torch.float64,
                                      device=layer.weight.device))
        elif kind in _TORCH_ACTS:
            if not W or pending is not None:
                return None
            par = 0.0
            if kind == "LeakyReLU":
                par = float(layer.negative_slope)
            if kind == "GELU" and getattr(layer, "approximate", "none") != "none":
                return None
            pending = (_TORCH_ACTS[kind], par)
        elif kind != "Dropout":
            return None
    if len(W) < 2 or pending is not None:
        return None
    task = adapter.task
    if task == "binary" and W[-1].shape[1] == 2:
        W[-1] = (W[-1][:, 1] - W[-1][:, 0])[:, None]
        b[-1] = (b[-1][1] - b[-1][0]).reshape(1)
    elif task != "multiclass" and W[-1].shape[1] != 1:
        return None
    return Network([w.to(o.device) for w in W], [v.to(o.device) for v in b], acts, task, o)


# ----------------------------------------------------------------------------------------------
# relaxations
# ----------------------------------------------------------------------------------------------


def relax(o: Ops, act, lo, hi):
    """``(k_lo, c_lo, k_hi, c_hi)`` with ``k_lo z + c_lo <= g(z) <= k_hi z + c_hi`` for every
    ``z`` in ``[lo, hi]`` (elementwise, finite bounds)."""
    name, par = act
    if name == "identity":
        one = o.full(lo.shape, 1.0)
        zero = o.full(lo.shape, 0.0)
        return one, zero, one, zero
    if name in ("relu", "leaky_relu"):
        a = par if name == "leaky_relu" else 0.0
        width = hi - lo
        unstable = (lo < 0) & (hi > 0)
        safe = o.where(unstable, width, 1.0)
        chord = o.where(unstable, (hi - a * lo) / safe, o.where(hi <= 0, a, 1.0))
        c_hi = o.where(unstable, (a - 1.0) * hi * lo / safe, 0.0)  # chord through (lo, a lo)
        c_hi = c_hi + ROUND * o.abs(c_hi)
        # below: the piece with the larger share of the interval (CROWN's adaptive slope)
        k_lo = o.where(unstable, o.where(hi >= -lo, 1.0, a), o.where(hi <= 0, a, 1.0))
        return k_lo, o.full(lo.shape, 0.0), chord, c_hi
    # smooth activations: chord slope, intercepts from the extremes of g(z) - k z
    g = activation
    width = hi - lo
    mid = 0.5 * (lo + hi)
    wide = width > 1e-9 * (1.0 + o.abs(mid))
    k = o.where(wide, (g(o, act, hi) - g(o, act, lo)) / o.where(wide, width, 1.0),
                _derivative(o, name, mid))
    cands = [lo, hi]
    if name in ("tanh", "logistic"):
        kk = k if name == "tanh" else 4.0 * k  # logistic: s' = tanh'(z/2) / 4
        ok = (kk > 0) & (kk < 1)
        r = o.atanh(o.sqrt(o.clip(1.0 - o.where(ok, kk, 0.5), 0.0, 1.0)))
        r = r if name == "tanh" else 2.0 * r
        for z in (r, -r):
            cands.append(o.where(ok, o.clip(z, lo, hi), lo))
        slack = 0.0
    else:  # gelu: g' increasing on [-sqrt2, sqrt2], decreasing outside
        s2 = math.sqrt(2.0)
        slack = 0.0
        for a, b in ((-1e3, -s2), (-s2, s2), (s2, 1e3)):
            pa, pb = o.clip(lo, a, b), o.clip(hi, a, b)
            z, w = _bisect_root(o, lambda z: _derivative(o, "gelu", z) - k, pa, pb)
            cands.append(o.clip(z, lo, hi))
            slack = slack + w * (1.2 + o.abs(k))  # |g' - k| <= 1.13 + |k| on the bracket
    vals = o.stack([g(o, act, z) - k * z for z in cands], 0)
    vmin, vmax = o.amin(vals, 0), o.amax(vals, 0)
    tol = ROUND * (1.0 + o.abs(vmin) + o.abs(vmax) + o.abs(k) * (o.abs(lo) + o.abs(hi)))
    return k, vmin - tol - slack, k, vmax + tol + slack


def _bisect_root(o, f, a, b, iters=60):
    """A point of ``[a, b]`` next to the root of the monotone ``f`` (or an end when ``f`` has
    one sign) and the width of the last bracket."""
    fa, fb = f(a), f(b)
    inc = fb >= fa
    lo, hi = a, b
    for _ in range(iters):
        m = 0.5 * (lo + hi)
        fm = f(m)
        right = o.where(inc, fm < 0, fm > 0)
        lo = o.where(right, m, lo)
        hi = o.where(right, hi, m)
    return 0.5 * (lo + hi), hi - lo


# ----------------------------------------------------------------------------------------------
# bound propagation
# ----------------------------------------------------------------------------------------------


def _pullback(net: Network, Lam, j, rels, X, mv_idx):
    """Lower bound ``Lam z_j >= a . (x - x_i) + c`` with the relaxations ``rels[t]`` of the
    hidden layers ``t < j``. Returns ``(c, ||a_mv||, size)``: ``size`` is the magnitude of
    the summed terms (for the rounding allowance)."""
    o = net.ops
    const = 0.0
    size = 0.0
    for t in range(j, 0, -1):
        cb = o.einsum("nmo,o->nm", Lam, net.b[t])
        const, size = const + cb, size + o.abs(cb)
        A = o.einsum("nmo,io->nmi", Lam, net.W[t])
        kl, cl, ku, cu = rels[t - 1]
        Ap, An = o.pos(A), o.neg(A)
        Lam = Ap * kl[:, None, :] + An * ku[:, None, :]
        term = Ap * cl[:, None, :] + An * cu[:, None, :]
        const = const + o.sum(term, 2)
        size = size + o.sum(o.abs(term), 2)
    a = o.einsum("nmo,io->nmi", Lam, net.W[0])
    z0 = X @ net.W[0] + net.b[0]
    c = const + o.einsum("nmo,no->nm", Lam, z0)
    size = size + o.einsum("nmo,no->nm", o.abs(Lam), o.abs(z0))
    am = a if mv_idx is None else a[:, :, mv_idx]
    return c, o.sqrt(o.sum(am * am, 2)), size


def linear_lower(net: Network, X, rho, C, mv=None, optimize=0):
    """Lower bounds of ``C_i z_L(x)`` on the balls ``||x - X_i|| <= rho_i`` (movable coordinates
    ``mv``; arrays of ``net.ops``): returns ``(c, s)``, shapes ``(n, m)``, with
    ``C_i z_L(x) >= c - s rho'`` for ``||x - X_i|| = rho' <= rho_i``. ``C``: (n, m, n_out).
    ``optimize``: steps of projected gradient ascent on the lower slopes of unstable ReLUs
    (alpha-CROWN) for ``c - s rho`` (one hidden ReLU/LeakyReLU layer; any slope in range is
    sound, the best iterate is kept)."""
    o = net.ops
    mv_idx = None
    if mv is not None and not bool(np.all(mv)):
        mv_idx = o.asarray(np.flatnonzero(mv)).long() if o.torch is not None else \
            np.flatnonzero(mv)
    W0 = net.W[0] if mv_idx is None else net.W[0][mv_idx]
    z = X @ net.W[0] + net.b[0]
    zr = rho[:, None] * o.sqrt(o.sum(W0 * W0, 0))[None, :]
    rels: list = []
    for t in range(len(net.W) - 1):
        if t > 0:  # bounds of z_t from the pull-back of +-I
            H = net.W[t].shape[1]
            I = o.eye(H)
            Lam = o.stack([I, -I], 0).reshape(2 * H, H)
            Lam = Lam[None].expand(X.shape[0], -1, -1) if o.torch is not None else \
                np.broadcast_to(Lam[None], (X.shape[0], 2 * H, H))
            c, s, size = _pullback(net, Lam, t, rels, X, mv_idx)
            low = c - s * rho[:, None] - ROUND * (size + s * rho[:, None])
            lo_, hi_ = low[:, :H], -low[:, H:]
        else:
            lo_, hi_ = z - zr, z + zr
        rels.append(relax(o, net.acts[t], lo_, hi_))
    if (optimize and len(net.W) == 2 and net.acts[0][0] in ("relu", "leaky_relu")):
        c, s, size = _alpha_pullback(net, C, rels[0], X, rho, mv_idx, lo_, hi_, optimize)
    else:
        c, s, size = _pullback(net, C, len(net.W) - 1, rels, X, mv_idx)
    exact = all(a[0] == "identity" for a in net.acts)
    if not exact:
        c = c - ROUND * (size + s * rho[:, None])
    return c, s


def _alpha_pullback(net, C, rel, X, rho, mv_idx, lo, hi, iters):
    """:func:`_pullback` for one hidden ReLU layer with the lower slopes of the unstable
    units chosen by projected gradient ascent on ``c - s rho`` per row of ``C``."""
    o = net.ops
    kl, cl, ku, cu = rel
    leak = net.acts[0][1] if net.acts[0][0] == "leaky_relu" else 0.0
    A = o.einsum("nmo,io->nmi", C, net.W[1])  # (n, m, H)
    Ap, An = o.pos(A), o.neg(A)
    free = ((lo < 0) & (hi > 0))[:, None, :] & (A > 0)
    z0 = X @ net.W[0] + net.b[0]
    W0 = net.W[0] if mv_idx is None else net.W[0][mv_idx]
    const = o.einsum("nmo,o->nm", C, net.b[1]) + o.sum(An * cu[:, None, :], 2)
    size0 = o.abs(o.einsum("nmo,o->nm", C, net.b[1])) + o.sum(o.abs(An * cu[:, None, :]), 2)
    base = An * ku[:, None, :]
    alpha = kl[:, None, :] + 0.0 * A
    r = rho[:, None]

    def value(alpha):
        Lam = Ap * alpha + base
        a = o.einsum("nmh,dh->nmd", Lam, W0)
        s = o.sqrt(o.sum(a * a, 2))
        c = const + o.einsum("nmh,nh->nm", Lam, z0)
        return Lam, a, s, c

    Lam, a, s, c = value(alpha)
    best_obj, best_alpha = c - r * s, alpha
    step = 0.5
    for _ in range(iters):
        u = a / o.where(s > 0, s, 1.0)[:, :, None]
        grad = Ap * (z0[:, None, :] - r[:, :, None] * o.einsum("nmd,dh->nmh", u, W0))
        alpha = o.where(free, o.clip(alpha + step * o.where(grad > 0, 1.0, -1.0) *
                                     o.where(grad == 0, 0.0, 1.0), leak, 1.0), alpha)
        Lam, a, s, c = value(alpha)
        obj = c - r * s
        better = obj > best_obj
        best_obj = o.where(better, obj, best_obj)
        best_alpha = o.where(better[:, :, None], alpha, best_alpha)
        step *= 0.8
    Lam, a, s, c = value(best_alpha)
    size = size0 + o.einsum("nmh,nh->nm", o.abs(Lam), o.abs(z0))
    return c, s, size


def margin_rows(net: Network, yi):
    """Rows ``C_i`` of the margins (n, m, n_out): binary ``s f`` with ``s = +-1``
    (``yi`` 0/1); multiclass ``f_y - f_k`` for ``k != y``."""
    o = net.ops
    yi = np.asarray(yi, dtype=np.intp)
    if net.task == "binary":
        s = np.where(yi == 1, 1.0, -1.0)
        return o.asarray(s[:, None, None])
    K = net.n_out
    eye = np.eye(K)
    rows = np.array([eye[y][None, :] - np.delete(eye, y, axis=0) for y in yi])
    return o.asarray(rows.reshape(len(yi), K - 1, K))


# ----------------------------------------------------------------------------------------------
# 0/1 loss: certified radii
# ----------------------------------------------------------------------------------------------


def _phi(net, X, C, rho, mv, optimize=0):
    """The radius certified by the relaxation at ``rho``: ``min_k c_k / s_k`` (0 when a
    ``c_k <= 0``); only radii up to ``rho`` are certified by it."""
    o = net.ops
    c, s = linear_lower(net, X, rho, C, mv, optimize)
    pos = c > 0
    ratio = o.where(pos & (s > 0), c / o.where(s > 0, s, 1.0), o.where(pos, math.inf, 0.0))
    return o.numpy(o.amin(ratio, 1))


def certified_radius(net: Network, X, yi, *, upper=None, mask=None, steps=20, chunk=None,
                     deadline=None, optimize=20):
    """Certified radii ``rho_i``: no point closer than ``rho_i`` to ``X_i`` (movable
    coordinates ``mask``) changes the network's prediction; 0 for misclassified samples.
    ``upper``: known squared distances (the search's); the radius is sought below
    ``sqrt(upper)``. Every relaxation radius tried gives a certificate, ``min(rho_b,
    phi(rho_b))``; bisection on ``rho_b`` looks for the fixed point ``phi(rho) = rho``.
    Returns NumPy radii (n,)."""
    o = net.ops
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    up = np.full(n, np.inf) if upper is None else np.asarray(upper, dtype=np.float64)
    out = np.zeros(n)
    if n == 0:
        return out
    F = np.asarray(net.outputs(X), dtype=np.float64)
    F = F[:, None] if F.ndim == 1 else F
    Cn = np.asarray(o.numpy(margin_rows(net, yi)))
    M = np.einsum("nmk,nk->nm", Cn, F)
    pos = np.all(M > 0, axis=1)
    if not mv.any():
        return np.where(pos, np.inf, 0.0)
    chunk = chunk or max(1, int(o.budget // max(1, Cn.shape[1] * max(w.shape[0] for w in net.W)
                                                 * max(w.shape[1] for w in net.W))))
    for s in range(0, n, chunk):
        sl = np.arange(s, min(n, s + chunk))
        sl = sl[pos[sl]]
        if sl.size == 0:
            continue
        Xt, Ct = o.asarray(X[sl]), o.asarray(Cn[sl])
        hi = np.sqrt(up[sl])
        if not np.all(np.isfinite(hi)):  # no known point: a start from a tiny ball, doubled
            tiny = _phi(net, Xt, Ct, o.asarray(np.full(sl.size, 1e-9)), mv)
            guess = np.where(np.isfinite(tiny), 2.0 * tiny, 1.0)
            hi = np.where(np.isfinite(hi), hi, np.maximum(guess, 1e-9))
        best = np.zeros(sl.size)
        lo = np.zeros(sl.size)
        for it in range(steps + 1):
            rb = hi if it == 0 else 0.5 * (lo + hi)
            ph = _phi(net, Xt, Ct, o.asarray(rb), mv, optimize)
            best = np.maximum(best, np.minimum(rb, ph))
            if it == 0:
                continue
            good = ph >= rb
            lo = np.where(good, rb, lo)
            hi = np.where(good, hi, rb)
            if deadline is not None and time.perf_counter() > deadline:
                break
            if np.all(best >= hi * (1 - 1e-7)):
                break
        out[sl] = best
    return out


# ----------------------------------------------------------------------------------------------
# smooth losses: over-estimates of the d-transform
# ----------------------------------------------------------------------------------------------


def _loss_upper(task, m):
    """Upper bound of the logistic / cross-entropy loss from margin lower bounds ``m``
    (n, K-1, ...): ``log(1 + sum_k exp(-m_k))`` (binary: ``log(1 + exp(-m))``)."""
    z = np.concatenate([np.zeros((m.shape[0], 1) + m.shape[2:]), -m], axis=1)
    return np.logaddexp.reduce(z, axis=1)


class TransformUpper:
    """Over-estimate ``u_i(h) >= l_h(z_i)`` of the d-transform of the logistic or cross-entropy
    loss from nested balls of radii ``rho_1 < ... < rho_J`` (``rho_0 = 0``).

    On the ball of radius ``rho_j`` the margins satisfy ``m(x) >= c_j - s_j t`` at distance
    ``t`` (:func:`linear_lower`), so on the shell ``rho_{j-1} <= t <= rho_j`` the loss is at
    most ``A_ij + g_ij (t - rho_{j-1})`` with ``A_ij`` the loss bound at ``t = rho_{j-1}`` and
    ``g_ij = max_k s_jk (1 - e^{-l(c_j - s_j rho_j)})`` a bound on its slope in ``t`` (the
    loss is convex and decreasing in each margin, with ``|dl/dm_k| <= e^{-m_k} / (1 + sum
    e^{-m})``), and at most ``B_ij``, its bound over the whole ball. The objective
    ``h l - theta1 t^2`` on the shell is therefore at most the smaller of
    ``max_t h (A + g (t - rho_{j-1})) - theta1 t^2`` (a concave quadratic in t) and
    ``h B - theta1 rho_{j-1}^2``. Beyond ``rho_J`` the loss grows at most by ``G`` (a global
    Lipschitz constant) per unit of distance: ``sup_{t >= rho_J} h (B_iJ + G (t - rho_J)) -
    theta1 t^2``. ``u_i`` is the maximum over the shells and the tail.
    """

    def __init__(self, A, g, B, radii, theta1, G):
        self.A, self.g, self.B, self.radii = A, g, B, radii
        self.t1, self.G = float(theta1), float(G)
        self.n = A.shape[0]
        self.inner = np.concatenate([np.zeros((self.n, 1)), radii[:, :-1]], axis=1)
        self.h_max = math.inf

    def evaluate(self, h):
        h = float(h)
        t1, a, b = self.t1, self.inner, self.radii
        if not math.isfinite(t1):  # no move: the loss itself
            return h * self.A[:, 0], self.A[:, 0], np.zeros(self.n)
        t = np.clip(h * self.g / (2 * t1), a, b)
        lin = h * (self.A + self.g * (t - a)) - t1 * t * t
        lin_d1 = self.A + self.g * (t - a)
        lin_d2 = np.where((t > a) & (t < b), self.g * self.g / (2 * t1), 0.0)
        flat = h * self.B - t1 * a * a
        use_lin = lin <= flat
        pieces = np.where(use_lin, lin, flat)
        j = np.argmax(pieces, axis=1)
        r = np.arange(self.n)
        val = pieces[r, j]
        d1 = np.where(use_lin, lin_d1, self.B)[r, j]
        d2 = np.where(use_lin, lin_d2, 0.0)[r, j]
        # the tail beyond rho_J
        rJ, BJ, G = self.radii[:, -1], self.B[:, -1], self.G
        tt = np.maximum(rJ, h * G / (2 * t1))
        tv = h * (BJ + G * (tt - rJ)) - t1 * tt * tt
        td1 = BJ + G * (tt - rJ)
        td2 = np.where(h * G / (2 * t1) > rJ, G * G / (2 * t1), 0.0)
        use = tv > val
        return np.where(use, tv, val), np.where(use, td1, d1), np.where(use, td2, d2)

    def argmax_radius(self, h):
        """Per sample, the distance ``t`` from ``x_i`` at which the over-estimate of
        ``h l - theta1 t^2`` is largest (a hint for the search: where the bound says a better
        point may lie, never a claim that one does)."""
        h = float(h)
        t1, a, b = self.t1, self.inner, self.radii
        if not math.isfinite(t1):
            return np.zeros(self.n)
        t = np.clip(h * self.g / (2 * t1), a, b)
        lin = h * (self.A + self.g * (t - a)) - t1 * t * t
        flat = h * self.B - t1 * a * a
        use_lin = lin <= flat
        pieces = np.where(use_lin, lin, flat)
        j = np.argmax(pieces, axis=1)
        r = np.arange(self.n)
        val, tj = pieces[r, j], np.where(use_lin, t, a)[r, j]
        rJ, BJ, G = self.radii[:, -1], self.B[:, -1], self.G
        tt = np.maximum(rJ, h * G / (2 * t1))
        tv = h * (BJ + G * (tt - rJ)) - t1 * tt * tt
        return np.where(tv > val, tt, tj)


def transform_upper(net: Network, loss: str, X, y, theta1, *, G, h_ref, mask=None, n_radii=24,
                    optimize=0):
    """The :class:`TransformUpper` of the network for the logistic / cross-entropy loss with
    internal labels ``y`` (-1/+1 binary, 0..K-1 multiclass).

    ``G``: a global Lipschitz constant of the loss in x. ``h_ref``: the dual's h near which
    the bound matters (the search's): the largest radius is ``2 h_ref G / theta1``, beyond
    which the quadratic penalty at ``h <= 4 h_ref`` outgrows any loss increase, and the radii
    are spread quadratically, finer near the center."""
    o = net.ops
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    mv = np.ones(d, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    y = np.asarray(y)
    yi = (y > 0).astype(np.intp) if net.task == "binary" else y.astype(np.intp)
    Cm = o.numpy(margin_rows(net, yi))
    reach = np.full(n, 2.0 * h_ref * G / theta1 + 1e-12)
    if not (math.isfinite(theta1) and theta1 > 0) or not mv.any():
        reach = np.full(n, 1e-12)
    frac = (np.arange(1, n_radii + 1) / n_radii) ** 2
    radii = reach[:, None] * frac[None, :]
    A, g, B = _ball_bounds(net, X, Cm, radii, mv, optimize)
    return TransformUpper(A, g, B, radii, theta1, G)


def _ball_bounds(net, X, Cm, radii, mv, optimize):
    """Per sample and radius ``rho_j``: ``A`` (the loss bound at distance ``rho_{j-1}``), ``g``
    (its slope bound on the shell), ``B`` (the loss bound on the whole ball)."""
    o = net.ops
    n, J = radii.shape
    A, g, B = np.empty((n, J)), np.empty((n, J)), np.empty((n, J))
    chunk = max(1, int(o.budget / 2 // max(1, Cm.shape[1] * max(w.shape[0] for w in net.W)
                                  * max(w.shape[1] for w in net.W))))
    for s in range(0, n, chunk):
        sl = slice(s, min(n, s + chunk))
        Xt, Ct = o.asarray(X[sl]), o.asarray(Cm[sl])
        cs, ss = [], []
        for j in range(J):
            c, sj = linear_lower(net, Xt, o.asarray(radii[sl, j]), Ct, mv, optimize)
            cs.append(o.numpy(c))
            ss.append(o.numpy(sj))
        cs, ss = np.stack(cs, -1), np.stack(ss, -1)  # (n, m, J)
        r = radii[sl, None, :]
        inner = np.concatenate([np.zeros_like(r[..., :1]), r[..., :-1]], axis=-1)
        # the whole ball: every relaxation built for a radius >= rho_j bounds it
        low = np.empty(cs.shape)
        for k in range(J):
            low[..., k] = (cs[..., k:] - ss[..., k:] * r[..., k:k + 1]).max(axis=-1)
        Bs = _loss_upper(net.task, low)
        A[sl] = _loss_upper(net.task, cs - ss * inner)
        g[sl] = ss.max(axis=1) * -np.expm1(-_loss_upper(net.task, cs - ss * r))
        B[sl] = np.maximum.accumulate(Bs, axis=1)
    up = 1 + 1e-10
    return A * up + ROUND, g * up, B * up + ROUND


def network_lipschitz(net: Network, mask=None) -> float:
    """A global L2 Lipschitz constant of the output map in the movable coordinates: the exact
    norm of the collapsed linear map for identity activations, else the product of the layers'
    spectral norms and of the activations' largest slopes."""
    W = [np.asarray(net.ops.numpy(w), dtype=np.float64) for w in net.W]
    if mask is not None:
        W[0] = W[0][np.asarray(mask, dtype=bool)]
    if W[0].shape[0] == 0:
        return 0.0
    if all(a[0] == "identity" for a in net.acts):
        M = W[0]
        for w in W[1:]:
            M = M @ w
        return float(np.linalg.norm(M, 2))
    slope = {"identity": 1.0, "relu": 1.0, "tanh": 1.0, "logistic": 0.25, "gelu": 1.13}
    out = 1.0
    for w in W:
        out *= float(np.linalg.norm(w, 2))
    for name, par in net.acts:
        out *= max(1.0, abs(par)) if name == "leaky_relu" else slope[name]
    return out


def smooth_oracle(adapter, loss: str, X, y, theta1, *, mask=None, h_ref=None, n_radii=24):
    """The over-estimate of the d-transform (:class:`TransformUpper`) of a network that
    :func:`as_network` reads, or None. ``y``: internal labels / regression targets;
    ``h_ref``: the dual's h of the found solution (where the radii are placed)."""
    net = as_network(adapter)
    if net is None or net.task == "regression" or loss not in ("logistic", "cross_entropy"):
        return None
    G = network_lipschitz(net, mask) * (_SQRT2 if net.task == "multiclass" else 1.0)
    if h_ref is None or not math.isfinite(h_ref) or h_ref <= 0:
        h_ref = 1.0
    return transform_upper(net, loss, X, y, theta1, G=G, h_ref=h_ref, mask=mask,
                           n_radii=n_radii)


class MinOracle:
    """The smaller of two over-estimating d-transform oracles, sample by sample (both sound,
    so their minimum is; it is not convex in h, which the dual's h search does not need: any
    h gives a lower bound)."""

    def __init__(self, a, b):
        self.a, self.b, self.n = a, b, a.n
        self.h_max = max(a.h_max, b.h_max)

    def evaluate(self, h):
        parts = []
        for o in (self.a, self.b):
            if h <= o.h_max:
                parts.append(o.evaluate(h))
        if len(parts) == 1:
            return parts[0]
        (va, da, sa), (vb, db, sb) = parts
        use = vb < va
        return np.where(use, vb, va), np.where(use, db, da), np.where(use, sb, sa)


def lower_distances(net: Network, X, yi, *, mask=None, upper=None, previous=None, steps=20,
                    time_budget=None, optimize=20):
    """Certified ``dlow_i <= d*_i`` (0/1 loss) from :func:`certified_radius`; ``yi``: class
    indices (binary 0/1). ``previous``: other certified bounds (their maximum is kept).
    Returns ``(dlow, info)``."""
    t0 = time.perf_counter()
    deadline = None if time_budget is None else t0 + float(time_budget)
    rho = certified_radius(net, X, yi, upper=upper, mask=mask, steps=steps, deadline=deadline,
                           optimize=optimize)
    dlow = rho * rho
    if previous is not None:
        dlow = np.maximum(dlow, previous)
    if upper is not None:
        dlow = np.minimum(dlow, np.asarray(upper, dtype=np.float64))
    return dlow, {"time": time.perf_counter() - t0,
                  "method": "linear bound propagation (CROWN, network)", "deadline": deadline}

