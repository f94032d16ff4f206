"""A PyTorch backend of ``shift_cost``'s chunked dual (``device=``; issue 32).

:class:`TorchProblem` is :class:`otstab.shift._shift_cost._Problem` with its passes over the
``n x m`` pairs run by PyTorch on a device (a GPU for 1e5 x 1e5 samples): the smoothed
semi-dual and its gradient (L-BFGS stays on the host, in scipy), the exact c-transform, the
smoothed plan and the per-feature costs, all in float64, chunk by chunk of rows (never the
``n x m`` matrix unless it is small). Everything that makes the interval certified is the NumPy
path's own code, called on this problem: the lower end is ``_Problem.dual_value`` (the exact
dual at the final ``v``, with its rounding bound) on this class's exact c-transform, the upper
end ``_PlanBuilder`` (the repair of the plan and its price) on its chunks, through the array
hooks ``host``, ``dev``, ``where``, ``colmin`` and ``parts``.

The exact passes (the c-transform of the lower end, the costs that price the plan) compute the
squared distance by direct differences, feature by feature (no cancellation: its rounding is
relative to the distance itself); only the smoothed passes use the faster matrix product.
A DataCost is evaluated on the host by the NumPy rules (``pairwise_datacost``) and copied to
the device chunk by chunk: correct, but the speed-up is the encoded cost's.

torch is imported lazily, only when ``device=`` is passed.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ValidationError
from ._shift_cost import DENSE_MAX_PAIRS, _chunks, _Problem

__all__ = ["TorchProblem", "check_device", "DEVICE_CHUNK_ENTRIES"]

#: entries of one (rows x columns) float64 block on the device (2 GiB); the per-feature pass
#: divides it by the number of features
DEVICE_CHUNK_ENTRIES = 1 << 28


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValidationError("device= needs PyTorch (pip install torch); without it use "
                              "device=None (NumPy)") from None
    return torch


def check_device(device):
    """``device`` as a ``torch.device`` that exists here (a clear error before any work)."""
    torch = _torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValidationError(f"device must be a torch device such as 'cpu' or 'cuda', got "
                              f"{device!r} ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValidationError(f"device={device!r}: CUDA is not available to this PyTorch "
                              f"({torch.__version__})")
    return dev


class TorchProblem(_Problem):
    """One label class with its passes on ``device`` (see the module doc)."""

    def __init__(self, geo, cls, theta1, theta2, divergence, device):
        torch = _torch()
        self.torch = torch
        self.device = check_device(device)
        self.geo, self.c = geo, cls
        self.theta1, self.theta2, self.div = theta1, theta2, divergence
        self.zero_only = math.isinf(theta1)
        self.t1 = 1.0 if self.zero_only else theta1
        self._dense = None           # (the NumPy matrix: never, the chunks are tensors)
        self.chunk_entries = DEVICE_CHUNK_ENTRIES
        self.encoded = geo.kind == "encoded"
        self.p_t, self.q_t = self.dev(cls.p), self.dev(cls.q)
        n, m = len(cls.I), len(cls.J)
        if self.encoded:
            self.A = self.dev(geo.A[cls.I])
            self.B = self.dev(geo.B[cls.J])
            self.A2 = (self.A * self.A).sum(1)
            self.B2 = (self.B * self.B).sum(1)
            self.AT, self.BT = self.A.T.contiguous(), self.B.T.contiguous()  # per feature
        self._dense_t = None
        self._dense_exact = None
        if n * m <= DENSE_MAX_PAIRS:
            self._dense_exact = self._cost_t(0, n, exact=True)
            self._dense_t = self._dense_exact if not self.encoded else \
                self._cost_t(0, n, exact=False)

    #: the passes run in torch: L-BFGS-B's host BLAS can keep to one thread
    host_products = False

    # -- array hooks (see _Problem) ------------------------------------------------------
    @staticmethod
    def host(x) -> np.ndarray:
        if hasattr(x, "detach"):
            return x.detach().cpu().numpy()
        return np.asarray(x)

    def dev(self, x):
        return self.torch.as_tensor(np.asarray(x, dtype=np.float64), device=self.device)

    def where(self, cond, a, b):
        return self.torch.where(cond, a, b)

    def chunk_cost(self, C):
        """plan_rows yields the rows (s, e) of a chunk: its exact cost block, on demand (the
        passes that only need the plan's sums never compute it)."""
        return self._cost_t(*C, exact=True) if isinstance(C, tuple) else C

    def colmin(self, C):
        val, k = C.min(0)
        return self.host(k), self.host(val)

    def parts(self, rows, cols):
        rows = np.asarray(rows)
        cols = np.asarray(cols)
        if not self.encoded:
            return self.dev(self.geo.parts(self.c.I[rows], self.c.J[cols]))
        ri = self.torch.as_tensor(rows, device=self.device)
        ci = self.torch.as_tensor(cols, device=self.device)
        diff = self.A[ri].T[:, :, None] - self.B[ci].T[:, None, :]
        return diff * diff

    # -- the pair costs on the device ----------------------------------------------------
    def _cost_t(self, s: int, e: int, exact: bool = True):
        """theta1 d for local rows s:e against every column, a (e-s, m) float64 tensor (inf:
        forbidden). ``exact``: direct differences (else the matrix-product form, clipped at
        0, for the smoothed passes)."""
        torch = self.torch
        if self._dense_t is not None:
            return (self._dense_exact if exact else self._dense_t)[s:e]
        if not self.encoded:
            rows = self.c.I[s:e]
            D = self.dev(self.geo.exact_block(rows, self.c.J) if self.zero_only else
                         self.geo.block(rows, self.c.J))
        elif exact or self.zero_only:
            shape = (e - s, self.B.shape[0])
            D = torch.zeros(shape, dtype=torch.float64, device=self.device)
            diff = torch.empty(shape, dtype=torch.float64, device=self.device)
            for k in range(self.AT.shape[0]):
                torch.sub(self.AT[k, s:e, None], self.BT[k, None, :], out=diff)
                D.addcmul_(diff, diff)
        else:
            D = torch.addmm(self.B2[None, :], self.A[s:e], self.B.T, alpha=-2.0)
            D.add_(self.A2[s:e, None]).clamp_(min=0.0)
        if self.zero_only:
            return torch.where(D == 0.0, 0.0, math.inf)
        return D.mul_(self.t1)

    def cost_error(self) -> np.ndarray:
        """0: the exact passes (c-transform, plan prices) compute direct differences."""
        return np.zeros(len(self.c.I))

    def _cost(self, rows):
        rows = np.asarray(rows)
        if len(rows) == 1:
            return self._cost_t(int(rows[0]), int(rows[0]) + 1)
        return self._cost_t(0, len(self.c.I))[rows]

    def _bounds(self, width: int):
        n, m = len(self.c.I), len(self.c.J)
        step = max(1, self.chunk_entries // max(1, m * width))
        for s in range(0, n, step):
            yield s, min(n, s + step)

    def row_chunks(self):
        """(local rows, exact cost tensor) chunk by chunk."""
        for s, e in self._bounds(1):
            yield np.arange(s, e), self._cost_t(s, e)

    def cost_scale(self) -> float:
        # the NumPy path's chunk boundaries (its first temperature is a max of chunk means)
        # (from per-row sums of device-sized chunks: no sync per small NumPy chunk)
        torch = self.torch
        n, m = len(self.c.I), len(self.c.J)
        tot, cnt = np.zeros(n), np.zeros(n)
        for s, e in self._bounds(1):
            C = self._cost_t(s, e, exact=False)
            fin = torch.isfinite(C)
            tot[s:e] = self.host(torch.where(fin, C, 0.0).sum(1))
            cnt[s:e] = self.host(fin.sum(1))
        scale = 0.0
        for s, e in _chunks(n, m, 1 if n * m <= DENSE_MAX_PAIRS else self.geo.d):
            k = cnt[s:e].sum()
            if k:
                scale = max(scale, float(tot[s:e].sum() / k))
        return scale

    # -- the exact c-transform (the lower end: _Problem.dual_value calls it) -------------
    def ctransform(self, v) -> np.ndarray:
        v_t = self.dev(v)
        u = np.empty(len(self.c.I))
        for s, e in self._bounds(1):
            C = self._cost_t(s, e, exact=True)
            u[s:e] = self.host((v_t[None, :] - C).amax(1))
        return u

    # -- the smoothed semi-dual ----------------------------------------------------------
    def _smoothed_chunks(self, v_t, eps: float):
        """Per row chunk: (s, e, E, rowsum of E, u_eps), E = exp(Z - max Z) with
        Z = (v - theta1 d) / eps + log q. (Smoothing only: the encoded distance enters
        through one matrix product, unclipped; the certified ends use the exact passes.)"""
        torch = self.torch
        logq = torch.log(self.q_t)
        folded = self.encoded and self._dense_t is None
        if folded:  # Z = colterm_j - rowterm_i + (2 theta1 / eps) A_i . B_j: one product
            colterm = (v_t - self.t1 * self.B2) / eps + logq
            rowterm = (self.t1 / eps) * self.A2
        for s, e in self._bounds(1):
            if folded:
                Z = torch.addmm(colterm[None, :], self.A[s:e], self.B.T,
                                alpha=2.0 * self.t1 / eps)
                Z.sub_(rowterm[s:e, None])
            else:
                Z = self._cost_t(s, e, exact=False)
                if self._dense_t is not None:   # a view of the stored matrix: a copy
                    Z = Z.clone()
                Z.neg_().add_(v_t[None, :]).div_(eps).add_(logq[None, :])
            mx = Z.amax(1)
            mx = torch.where(torch.isfinite(mx), mx, 0.0)
            E = Z.sub_(mx[:, None]).exp_()
            tot = E.sum(1)
            u = eps * (torch.log(tot) + mx)
            yield s, e, E, tot, u

    def _row_mass_t(self, u, p):
        torch = self.torch
        fin = torch.isfinite(u)
        if math.isinf(self.theta2):
            return torch.where(fin, p, 0.0)
        x = torch.where(fin, u, 0.0) / self.theta2
        if self.div == "kl":
            w = torch.exp(x)
        else:
            w = torch.clamp(x / 2.0 + 1.0, min=0.0)
        return torch.where(fin, p * w, 0.0)

    def smooth(self, v, eps, want_grad=True):
        torch = self.torch
        v_t = self.dev(v)
        grad = self.q_t.clone()
        ueps = np.empty(len(self.c.I))
        for s, e, E, tot, u in self._smoothed_chunks(v_t, eps):
            ueps[s:e] = self.host(u)
            if want_grad:
                a = self._row_mass_t(u, self.p_t[s:e])
                wgt = torch.where(tot > 0, a / tot, 0.0)
                grad -= wgt @ E
        p, q = self.c.p, self.c.q
        if math.isinf(self.theta2):
            fin = np.isfinite(ueps)
            val = float(q @ v - p[fin] @ ueps[fin])
        else:
            val = self._dual_terms(q @ v, ueps)
        return val, self.host(grad), ueps

    def plan_rows(self, v, eps):
        """The smoothed plan chunk by chunk: (local rows, (s, e), plan tensor); ``(s, e)``
        gives the exact cost block through :meth:`chunk_cost`."""
        torch = self.torch
        v_t = self.dev(np.asarray(v, dtype=np.float64))
        for s, e, E, tot, u in self._smoothed_chunks(v_t, eps):
            a = self._row_mass_t(u, self.p_t[s:e])
            G = E.mul_(torch.where(tot > 0, a / tot, 0.0)[:, None])
            yield np.arange(s, e), (s, e), G
