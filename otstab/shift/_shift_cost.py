"""``shift_cost``: the cost of an observed shift, in the certificate's units (issue 32).

For a reference sample ``P_ref`` (the certificate's evaluation data) and a current labelled
sample ``P_cur``, the shift cost is

    S = inf { M_c(Q, P_ref x delta_1) : the W-weighted Z-marginal of Q equals P_cur }

with the certificate's lifted cost ``c((z, w), (z^, 1)) = theta1 w d(z, z^) + theta2 phi(w)``
(labels never move). By the definition of R, ``S < R(beta, r)`` proves that the model's risk on
``P_cur`` is below ``r`` (:func:`otstab.budget_used`). For empirical samples (reference masses
``p_i``, current masses ``q_j``) it is the convex transport problem (docs/math.md, "The cost
of an observed shift")

    S = min_{g >= 0}  theta1 sum_ij g_ij d_ij + theta2 sum_i p_i phi(a_i / p_i),
        a_i = sum_j g_ij,   sum_i g_ij = q_j,   g_ij = 0 unless y_i = y'_j,

with the dual ``S = max_v sum_j q_j v_j - theta2 sum_i p_i phi*(u_i(v) / theta2)``,
``u_i(v) = max_j (v_j - theta1 d_ij)``: every ``v`` gives a lower bound and every feasible
plan ``g`` an upper bound, so each answer carries a certified interval.

Solvers: ``"conic"`` (the program above through cvxpy + Clarabel, small samples),
``"dual"`` (an entropic semi-dual on ``v`` alone, maximised by L-BFGS with a decreasing
temperature, in row chunks: memory O(n + m), never the n x m matrix), ``"pot"`` (POT's
``sinkhorn_unbalanced`` for KL and ``emd`` for theta2 = inf, dense; optional dependency
``otstab[shift]``) and, for theta1 = inf, the closed form over identical rows. Whatever
produced ``v`` and ``g``, the bounds are recomputed here: the lower from the exact dual at
``v`` (every ``u_i`` an exact maximum), the upper from the plan made exactly feasible.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .._results import ResultMixin, jsonable
from ..errors import ValidationError
from ..modeling import _datacost as datacost
from ..modeling._datacost import _plain, _same
from ..modeling._threads import one_blas_thread
from ..solve._budget import _probe

__all__ = ["shift_cost", "ShiftCost", "pairwise_datacost", "SOLVERS"]

log = logging.getLogger(__name__)

SOLVERS = ("auto", "conic", "dual", "pot")
#: largest number of same-label pairs solved by the conic program under solver="auto"
CONIC_MAX_PAIRS = 40_000
#: a plan is kept (``res.plan``) when it has at most this many same-label pairs
PLAN_MAX_PAIRS = 1_000_000
#: target of the chunked evaluations: entries of one (rows x columns x features) block
CHUNK_ENTRIES = 1 << 22
#: a label class with at most this many pairs keeps its cost matrix (32 MB); larger ones are
#: recomputed chunk by chunk at every pass
DENSE_MAX_PAIRS = 4_000_000


# ------------------------------------------------------------------------------------------
# the divergences: phi, its conjugate phi* and the derivative of phi*

def _phi(t: np.ndarray, divergence: str) -> np.ndarray:
    t = np.asarray(t, dtype=np.float64)
    if divergence == "kl":
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(t > 0, t * np.log(np.where(t > 0, t, 1.0)) - t + 1.0, 1.0)
        return out
    return (t - 1.0) ** 2


def _phi_star(s: np.ndarray, divergence: str) -> np.ndarray:
    """phi*(s) = sup_{t >= 0} s t - phi(t): KL ``e^s - 1``; chi2 ``(s/2 + 1)_+^2 - 1``."""
    if divergence == "kl":
        with np.errstate(over="ignore"):  # inf: a point the line search backs off from
            return np.expm1(s)
    return np.maximum(s / 2.0 + 1.0, 0.0) ** 2 - 1.0


def _dphi_star(s: np.ndarray, divergence: str) -> np.ndarray:
    """(phi*)'(s): the weight t that attains phi*(s)."""
    if divergence == "kl":
        with np.errstate(over="ignore"):
            return np.exp(s)
    return np.maximum(s / 2.0 + 1.0, 0.0)


def _reweight_cost(a, p, theta2, divergence) -> float:
    """theta2 sum_i p_i phi(a_i / p_i) (p > 0)."""
    if math.isinf(theta2):
        return 0.0
    return float(theta2 * np.sum(p * _phi(a / p, divergence)))


# ------------------------------------------------------------------------------------------
# geometry: the pairwise cost d(x_i, x'_j) between reference and current rows


class _Encoded:
    """Squared Euclidean distance between rows of two float arrays."""

    kind = "encoded"

    def __init__(self, A: np.ndarray, B: np.ndarray, names: list[str]):
        # the distances are computed on copies centred at the reference mean: the expansion
        # |a|^2 + |b|^2 - 2 a.b rounds relative to |a|^2 + |b|^2 (see block_error), which an
        # offset far from 0 would make large; the originals stay for keys() (equality of rows)
        self.A_raw, self.B_raw, self.names = A, B, names
        center = A.mean(axis=0) if len(A) else np.zeros(A.shape[1])
        self.A, self.B = A - center, B - center
        self.A2 = np.einsum("ij,ij->i", self.A, self.A)
        self.B2 = np.einsum("ij,ij->i", self.B, self.B)
        self.d = A.shape[1]
        self._B2max = float(self.B2.max()) if len(self.B2) else 0.0

    def block(self, I, J) -> np.ndarray:
        D = self.A2[I][:, None] + self.B2[J][None, :] - 2.0 * (self.A[I] @ self.B[J].T)
        np.maximum(D, 0.0, out=D)
        return D

    def block_error(self, I) -> np.ndarray:
        """Per row of ``I``, a bound on ``|block(I, J) - d(x_i, x'_j)|`` over every column: the
        expansion ``|a|^2 + |b|^2 - 2 a.b`` cancels, its rounding is relative to
        ``|a|^2 + |b|^2``, not to the distance (each dot product within ``d`` ulps of
        ``sum |a_k b_k| <= (|a|^2 + |b|^2) / 2``, three more roundings for the sum; clipping at 0
        only moves it closer): ``(2 d + 8) eps (|a_i|^2 + max_j |b_j|^2)``."""
        return (2 * self.d + 8) * np.finfo(float).eps * (self.A2[I] + self._B2max)

    def exact_block(self, I, J) -> np.ndarray:
        """Direct differences (exact zeros for equal rows)."""
        diff = self.A[I][:, None, :] - self.B[J][None, :, :]
        return np.einsum("ijk,ijk->ij", diff, diff)

    def parts(self, I, J) -> np.ndarray:
        """Per-feature costs, shape (d, |I|, |J|)."""
        diff = self.A[I][:, None, :] - self.B[J][None, :, :]
        return np.moveaxis(diff * diff, 2, 0)

    def keys(self):
        return self.A_raw, self.B_raw


def pairwise_datacost(resolved, X0: pd.DataFrame, X1: pd.DataFrame):
    """A pairwise evaluator of a :class:`otstab.datacost.ResolvedCost` between the rows of
    ``X0`` and ``X1``: ``.block(I, J)`` is the matrix of ``resolved.cost`` for every pair
    (row ``I[a]`` of X0 moved to row ``J[b]`` of X1), vectorised per variable with the same
    rules (prices, scales, bounds, directions, integers, levels, switch matrices)."""
    return _DataCostGeometry(resolved, X0, X1)


class _DataCostGeometry:
    kind = "datacost"

    def __init__(self, resolved, X0: pd.DataFrame, X1: pd.DataFrame):
        self.resolved = resolved
        self.names = [v.name for v in resolved.variables]
        self.X0, self.X1 = X0, X1
        self.vars: list[tuple] = []
        for v in resolved.variables:
            a, b = X0[v.name].to_numpy(), X1[v.name].to_numpy()
            if v.kind in ("numeric", "integer"):
                self.vars.append(("num", v, a.astype(np.float64), b.astype(np.float64)))
                continue
            values: list = []
            index: dict = {}
            codes = []
            for col in (a, b):
                cc = np.empty(len(col), dtype=np.int64)
                for k, x in enumerate(col):
                    key = (type(_plain(x)).__name__, repr(_plain(x)))
                    if key not in index:
                        index[key] = len(values)
                        values.append(x)
                    cc[k] = index[key]
                codes.append(cc)
            L = len(values)
            pos = {_plain(lv): k for k, lv in enumerate(v.levels or [])}
            C = np.zeros((L, L))
            for s in range(L):
                for t in range(L):
                    if s == t or _same(values[s], values[t]):
                        continue
                    if v.immutable or not math.isfinite(v.price):
                        C[s, t] = math.inf
                        continue
                    tb = pos.get(_plain(values[t]))
                    if tb is None:
                        C[s, t] = math.inf
                    elif v.kind == "categorical":
                        C[s, t] = v.price * v.switch_cost(values[s], values[t])
                    else:
                        ta = pos.get(_plain(values[s]))
                        if ta is None or (v.direction and np.sign(tb - ta) != v.direction):
                            C[s, t] = math.inf
                        else:
                            C[s, t] = v.price * ((tb - ta) / v.scale) ** 2
            self.vars.append(("cat", v, codes[0], codes[1], C))
        self.d = len(self.vars)

    def _one(self, spec, I, J) -> np.ndarray:
        if spec[0] == "cat":
            _, v, ca, cb, C = spec
            return C[ca[I][:, None], cb[J][None, :]]
        _, v, a, b = spec
        a, b = a[I][:, None], b[J][None, :]
        moved = b != a
        d = b - a
        if math.isfinite(v.price):
            c = v.price * (d / v.scale) ** 2
        else:
            c = np.where(moved, math.inf, 0.0)
        bad = moved & bool(v.immutable)
        lo, hi = np.minimum(v.lo, a), np.maximum(v.hi, a)
        bad = bad | (moved & ((b < lo) | (b > hi)))
        if v.direction:
            bad = bad | (moved & (np.sign(d) != v.direction))
        if v.kind == "integer":
            bad = bad | (moved & (b != np.round(b)))
        return np.where(bad, math.inf, np.where(moved, c, 0.0))

    def block(self, I, J) -> np.ndarray:
        out = np.zeros((len(I), len(J)))
        for spec in self.vars:
            out += self._one(spec, I, J)
        return out

    exact_block = block

    def parts(self, I, J) -> np.ndarray:
        return np.stack([self._one(spec, I, J) for spec in self.vars]) if self.vars else \
            np.zeros((0, len(I), len(J)))

    def keys(self):
        cols = self.names
        return self.X0[cols], self.X1[cols]


# ------------------------------------------------------------------------------------------
# inputs


def _weights(w, n: int, what: str) -> np.ndarray:
    if w is None:
        return np.full(n, 1.0 / n)
    arr = np.asarray(w, dtype=np.float64).reshape(-1)
    if arr.shape[0] != n:
        raise ValidationError(f"{what} must have one weight per row ({n}), got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValidationError(f"{what} must be finite and >= 0")
    tot = float(arr.sum())
    if not tot > 0:
        raise ValidationError(f"{what} must have a positive sum")
    return arr / tot


def _labels(y, n: int, what: str) -> np.ndarray:
    arr = np.asarray(y).reshape(-1) if not isinstance(y, pd.Series) else y.to_numpy()
    if arr.shape[0] != n:
        raise ValidationError(f"{what} must have one label per row of X ({n}), got "
                              f"{arr.shape[0]}")
    if pd.isna(pd.Series(arr)).any():
        raise ValidationError(f"{what} has missing labels")
    return arr


def _positive(val, what: str) -> float:
    try:
        v = float(val)
    except (TypeError, ValueError):
        raise ValidationError(f"{what} must be a number in (0, inf], got {val!r}") from None
    if not v > 0 or math.isnan(v):
        raise ValidationError(f"{what} must be in (0, inf], got {val!r}")
    return v


def _encoded(model, X, what: str) -> tuple[np.ndarray, list[str]]:
    names = None
    if model is not None and getattr(model, "steps", None) and len(model.steps) > 1:
        Xt = model[:-1].transform(X)
        try:
            names = [str(c) for c in model[:-1].get_feature_names_out()]
        except Exception:  # noqa: BLE001 - names are cosmetic
            names = None
        X = Xt
    if hasattr(X, "toarray"):
        X = X.toarray()
    if isinstance(X, pd.DataFrame):
        names = names or [str(c) for c in X.columns]
        bad = [c for c in X.columns if X[c].dtype.kind not in "biuf"]
        if bad:
            raise ValidationError(f"{what} has non-numeric column(s) {bad[:5]}; the encoded "
                                  "cost needs numbers (pass model= a Pipeline that encodes "
                                  "them, or cost=otstab.DataCost())")
        arr = X.to_numpy(dtype=np.float64)
    else:
        arr = np.asarray(X, dtype=np.float64)
    if arr.ndim != 2:
        raise ValidationError(f"{what} must be 2-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValidationError(f"{what} has missing or infinite values")
    names = names if names is not None and len(names) == arr.shape[1] else \
        [f"x{j}" for j in range(arr.shape[1])]
    return np.ascontiguousarray(arr), names


def _try_encoded(model, X):
    if model is None:
        return None
    try:
        return _encoded(model, X, "X_ref")[0]
    except Exception:  # noqa: BLE001 - only a consistency probe
        return None


def _geometry(X_ref, X_cur, cost, model):
    spec = datacost.as_cost(cost)
    if spec is None:
        A, names = _encoded(model, X_ref, "X_ref")
        B, names_b = _encoded(model, X_cur, "X_cur")
        if A.shape[1] != B.shape[1]:
            raise ValidationError(f"X_ref and X_cur have different numbers of columns "
                                  f"({A.shape[1]} and {B.shape[1]})")
        return _Encoded(A, B, names), None
    if not isinstance(X_ref, pd.DataFrame) or not isinstance(X_cur, pd.DataFrame):
        raise ValidationError("cost=DataCost needs X_ref and X_cur as DataFrames (the raw "
                              "variables)")
    missing = [c for c in X_ref.columns if c not in X_cur.columns]
    if missing:
        raise ValidationError(f"X_cur lacks the column(s) {missing[:5]} of X_ref")
    X0 = X_ref.reset_index(drop=True)
    X1 = X_cur[list(X_ref.columns)].reset_index(drop=True)
    resolved = spec.resolve(model, X0)
    return _DataCostGeometry(resolved, X0, X1), resolved


# ------------------------------------------------------------------------------------------
# per label class: the bounds, and the solvers


@dataclass
class _Class:
    I: np.ndarray      # reference rows (indices into the kept rows)
    J: np.ndarray      # current rows
    p: np.ndarray      # their masses (of the whole problem)
    q: np.ndarray


def _chunks(nrows: int, ncols: int, d: int):
    step = max(1, CHUNK_ENTRIES // max(1, ncols * max(d, 1)))
    for s in range(0, nrows, step):
        yield s, min(nrows, s + step)


class _Problem:
    """One label class: c-transforms, the smoothed semi-dual, plans and their costs."""

    def __init__(self, geo, cls: _Class, theta1, theta2, divergence):
        self.geo, self.c = geo, cls
        self.theta1, self.theta2, self.div = theta1, theta2, divergence
        self.zero_only = math.isinf(theta1)
        self.t1 = 1.0 if self.zero_only else theta1
        self._dense = None
        if len(cls.I) * len(cls.J) <= DENSE_MAX_PAIRS:
            self._dense = self._cost(np.arange(len(cls.I)))

    def _cost(self, rows) -> np.ndarray:
        """theta1 d for rows ``rows`` (local indices) against every column (inf: forbidden)."""
        if self._dense is not None:
            return self._dense[rows]
        D = self.geo.exact_block(self.c.I[rows], self.c.J) if self.zero_only else \
            self.geo.block(self.c.I[rows], self.c.J)
        if self.zero_only:
            return np.where(D == 0.0, 0.0, math.inf)
        return self.t1 * D

    def cost_error(self) -> np.ndarray:
        """Per local row, a bound on the rounding of ``_cost`` (``theta1 d`` by the cancelling
        expansion of the encoded cost; 0 where the costs are computed directly)."""
        err = getattr(self.geo, "block_error", None)
        if self.zero_only or err is None:
            return np.zeros(len(self.c.I))
        return self.t1 * err(self.c.I)

    # -- array hooks: the chunk arrays are ndarrays here; a device backend
    # (otstab.shift._shift_torch) yields its own arrays and overrides these four, so that the
    # plan's repair and pricing (_PlanBuilder, _variable_shares) are written once
    chunk_entries = CHUNK_ENTRIES

    @staticmethod
    def host(x) -> np.ndarray:
        """A chunk result as a NumPy array."""
        return np.asarray(x)

    @staticmethod
    def dev(x):
        """A NumPy array as a chunk array (on the device of the chunks)."""
        return x

    @staticmethod
    def where(cond, a, b):
        return np.where(cond, a, b)

    def parts(self, rows, cols):
        """Per-feature costs of local rows x local columns, shape (d, |rows|, |cols|)."""
        return self.geo.parts(self.c.I[rows], self.c.J[cols])

    @staticmethod
    def chunk_cost(C):
        """The cost block of a chunk as ``rows_of`` yielded it (a device backend may yield a
        handle and compute the block only where it is used)."""
        return C

    def colmin(self, C) -> tuple[np.ndarray, np.ndarray]:
        """Per column of a chunk: the row of least cost and that cost."""
        k = np.argmin(C, axis=0)
        return k, C[k, np.arange(C.shape[1])]

    @property
    def host_products(self) -> bool:
        """Whether the passes make host BLAS products (the chunked, undense case)."""
        return self._dense is None

    def cost_scale(self) -> float:
        """The typical pair cost (largest mean of the finite costs over the row chunks): the
        dual's first temperature."""
        scale = 0.0
        for _, C in self.row_chunks():
            fin = C[np.isfinite(C)]
            if fin.size:
                scale = max(scale, float(np.mean(fin)))
        return scale

    def row_chunks(self):
        n, m = len(self.c.I), len(self.c.J)
        for s, e in _chunks(n, m, 1 if self._dense is not None else self.geo.d):
            rows = np.arange(s, e)
            yield rows, self._cost(rows)

    # -- the exact dual ---------------------------------------------------------------
    def ctransform(self, v) -> np.ndarray:
        u = np.empty(len(self.c.I))
        for rows, C in self.row_chunks():
            u[rows] = np.max(v[None, :] - C, axis=1)
        return u

    def dual_value(self, v) -> tuple[float, np.ndarray]:
        """The exact dual objective at ``v`` after the best constant shift (a lower bound)
        and the shifted ``v``."""
        v = np.asarray(v, dtype=np.float64)
        u = self.ctransform(v)
        p, q = self.c.p, self.c.q
        Q = float(q.sum())
        if math.isinf(self.theta2):
            if not np.all(np.isfinite(u)):
                return -math.inf, v
            val = float(q @ v - p @ u) - float(p @ self.cost_error())
            return val - self._rounding(v, u, np.ones(len(u)), 0.0), v
        t2 = self.theta2
        fin = np.isfinite(u)
        if not fin.any():
            return -math.inf, v
        if self.div == "kl":
            m = float(np.max(u[fin]))
            S = float(np.sum(p[fin] * np.exp((u[fin] - m) / t2)))
            c = t2 * (math.log(Q) - math.log(S)) - m
        else:
            c = self._chi2_shift(u[fin], p[fin], Q)
        v = v + c
        u = u + c
        w = np.zeros(len(u))
        w[fin] = _dphi_star(u[fin] / t2, self.div)
        star = np.abs(_phi_star(u[fin] / t2, self.div))
        val = self._dual_terms(q @ v, u)
        # the computed costs may be low by e_i (cost_error): the true u_i is at most u_i + e_i,
        # and phi* is increasing and convex, so the objective is low by at most
        # p_i phi*'((u_i + e_i) / theta2) e_i
        e = self.cost_error()
        if e.any():
            val -= float(np.sum(p[fin] * _dphi_star((u[fin] + e[fin]) / t2, self.div) * e[fin]))
        return val - self._rounding(v, np.where(fin, u, 0.0), w,
                                    t2 * float(p[fin] @ star)), v

    def _rounding(self, v, u, w, star_mass) -> float:
        """A bound on the floating-point rounding of the dual objective (so that the lower
        end stays a lower bound): the c-transform's differences (each rounded relative to
        |v_j| + theta1 d_ij <= 2 |v|_max + |u_i|, weighted by the row's mass p_i w_i), the
        sums q.v and theta2 sum p phi*, each to 64 ulps."""
        p, q = self.c.p, self.c.q
        vmax = float(np.max(np.abs(v))) if len(v) else 0.0
        mag = float(np.abs(q) @ np.abs(v)) + float((p * w) @ (np.abs(u) + 2 * vmax)) \
            + star_mass
        return 64 * np.finfo(float).eps * mag

    def _dual_terms(self, qv, u) -> float:
        p, t2 = self.c.p, self.theta2
        fin = np.isfinite(u)
        star = np.full(len(u), -1.0)            # phi*(-inf) = -1 for KL and chi2
        star[fin] = _phi_star(u[fin] / t2, self.div)
        return float(qv - t2 * np.sum(p * star))

    def _chi2_shift(self, u, p, Q) -> float:
        """The c maximising Q c - theta2 sum p phi*((u + c)/theta2) for chi2: the root of
        sum_i p_i (1 + (u_i + c)/(2 theta2))_+ = Q (piecewise linear, solved after a sort)."""
        t2 = self.theta2
        order = np.argsort(-u)
        us, ps = u[order], p[order]
        cp_ = np.cumsum(ps)
        cpu = np.cumsum(ps * us)
        # with the k+1 largest u_i active: sum p (1 + (u + c)/(2 theta2)) = Q
        cs = (2 * t2 * (Q - cp_) - cpu) / cp_
        nxt = np.append(us[1:], -np.inf)
        ok = (1 + (us + cs) / (2 * t2) > 0) & (1 + (nxt + cs) / (2 * t2) <= 0)
        k = int(np.argmax(ok)) if ok.any() else len(us) - 1
        return float(cs[k])

    # -- the smoothed semi-dual ---------------------------------------------------------
    def smooth(self, v, eps, want_grad=True):
        p, q = self.c.p, self.c.q
        logq = np.log(q)
        grad = q.copy()
        ueps = np.empty(len(p))
        for rows, C in self.row_chunks():
            Z = (v[None, :] - C) / eps + logq[None, :]
            mx = np.max(Z, axis=1)
            mx = np.where(np.isfinite(mx), mx, 0.0)
            E = np.exp(Z - mx[:, None])
            s = E.sum(axis=1)
            with np.errstate(divide="ignore"):
                ueps[rows] = eps * (np.log(s) + mx)
            if want_grad:
                a = self._row_mass(ueps[rows], p[rows])
                with np.errstate(invalid="ignore", divide="ignore"):
                    wgt = np.where(s > 0, a / s, 0.0)
                grad -= wgt @ E
        if math.isinf(self.theta2):
            fin = np.isfinite(ueps)
            val = float(q @ v - p[fin] @ ueps[fin])
        else:
            val = self._dual_terms(q @ v, ueps)
        return val, grad, ueps

    def _row_mass(self, u, p) -> np.ndarray:
        if math.isinf(self.theta2):
            return np.where(np.isfinite(u), p, 0.0)
        out = np.zeros(len(u))
        fin = np.isfinite(u)
        out[fin] = p[fin] * _dphi_star(u[fin] / self.theta2, self.div)
        return out

    def plan_rows(self, v, eps):
        """The smoothed plan, row chunk by row chunk: (rows, C, G)."""
        p, q = self.c.p, self.c.q
        logq = np.log(q)
        for rows, C in self.row_chunks():
            Z = (v[None, :] - C) / eps + logq[None, :]
            mx = np.max(Z, axis=1)
            mx = np.where(np.isfinite(mx), mx, 0.0)
            E = np.exp(Z - mx[:, None])
            s = E.sum(axis=1)
            with np.errstate(divide="ignore"):
                u = eps * (np.log(s) + mx)
            a = self._row_mass(u, p[rows])
            with np.errstate(invalid="ignore", divide="ignore"):
                G = E * np.where(s > 0, a / s, 0.0)[:, None]
            yield rows, C, G


# ------------------------------------------------------------------------------------------
# a feasible plan from an approximate one, and its cost


class _PlanBuilder:
    """Makes an approximate plan exactly feasible (columns sum to q; for theta2 = inf rows to
    p too) and prices it. ``rows_of(pass)`` re-yields the approximate plan chunk by chunk (so
    a large plan is never stored)."""

    def __init__(self, prob: _Problem, rows_of):
        self.prob, self.rows_of = prob, rows_of

    def build(self, keep: bool):
        prob = self.prob
        c = prob.c
        n, m = len(c.I), len(c.J)
        H = prob.host
        col = np.zeros(m)
        for _, _, G in self.rows_of():
            col += H(G.sum(0))
        # columns that received nothing: send q_j from the cheapest reference row
        empty = ~(col > 0)
        fix_rows = np.full(m, -1)
        if empty.any():
            best = np.full(m, math.inf)
            for rows, C, _ in self.rows_of():
                k, val = prob.colmin(prob.chunk_cost(C))
                better = val < best
                best[better] = val[better]
                fix_rows[better] = rows[k[better]]
            if np.any(empty & (fix_rows < 0)):
                return None
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(empty, 0.0, c.q / col)
        balanced = math.isinf(prob.theta2)
        if balanced:
            scale = np.minimum(scale, 1.0)
        rowsum = np.zeros(n)
        colsum = np.zeros(m)
        move = 0.0
        kept: list | None = [] if keep else None
        scale_d = prob.dev(scale)
        for rows, C, G in self.rows_of():
            C = prob.chunk_cost(C)
            G = G * scale_d[None, :]
            rowsum[rows] += H(G.sum(1))
            colsum += H(G.sum(0))
            with np.errstate(invalid="ignore"):
                move += float(prob.where(G > 0, G * C, 0.0).sum())
            if kept is not None:
                kept.append((rows, H(G)))
        extra = None
        balanced = math.isinf(prob.theta2)
        if empty.any() and not balanced:  # (theta2 = inf: the rank-one rounding fills them)
            jj = np.flatnonzero(empty)
            ii = fix_rows[jj]
            np.add.at(rowsum, ii, c.q[jj])
            colsum[jj] += c.q[jj]
            Cfix = np.array([float(prob._cost(np.array([i]))[0, j]) for i, j in zip(ii, jj)])
            move += float(np.sum(c.q[jj] * Cfix))
            extra = (ii, jj, c.q[jj].copy())
        rank1 = None
        if balanced:  # Altschuler-Weed-Rigollet rounding: add the missing mass er ec^T / s
            er = np.maximum(c.p - rowsum, 0.0)
            ec = np.maximum(c.q - colsum, 0.0)
            s = float(er.sum())
            if s > 0 and float(ec.sum()) > 0:
                acc = 0.0
                ec_d = prob.dev(ec)
                for rows, C, _ in self.rows_of():
                    if er[rows].any():
                        C = prob.chunk_cost(C)
                        with np.errstate(invalid="ignore"):
                            W = prob.dev(er[rows])[:, None] * ec_d[None, :] / s
                            acc += float(prob.where(W > 0, W * C, 0.0).sum())
                move += acc
                rowsum = rowsum + er * (float(ec.sum()) / s)
                rank1 = (er, ec, s)
        return _Plan(rowsum=rowsum, move=move, kept=kept, extra=extra, rank1=rank1)


@dataclass
class _Plan:
    rowsum: np.ndarray
    move: float
    kept: list | None
    extra: tuple | None
    rank1: tuple | None


# ------------------------------------------------------------------------------------------
# solvers


def _solve_conic(prob: _Problem, **options):
    import cvxpy as cp
    import scipy.sparse as sp

    c = prob.c
    C = prob._cost(np.arange(len(c.I)))
    ii, jj = np.nonzero(np.isfinite(C))
    E = len(ii)
    n, m = len(c.I), len(c.J)
    rows = sp.csr_matrix((np.ones(E), (ii, np.arange(E))), shape=(n, E))
    cols = sp.csr_matrix((np.ones(E), (jj, np.arange(E))), shape=(m, E))
    g = cp.Variable(E, nonneg=True)
    a = rows @ g
    colc = cols @ g == c.q
    cons = [colc]
    obj = C[ii, jj] @ g
    if math.isinf(prob.theta2):
        cons.append(a == c.p)
    elif prob.div == "kl":
        obj = obj + prob.theta2 * cp.sum(cp.rel_entr(a, c.p) - a + c.p)
    else:
        obj = obj + prob.theta2 * cp.sum(cp.multiply(1.0 / c.p, cp.square(a - c.p)))
    problem = cp.Problem(cp.Minimize(obj), cons)
    opts = {"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12,
            "tol_ktratio": 1e-10, **options}
    with warnings.catch_warnings():  # an inaccurate solve is fine: the bounds are recomputed
        warnings.simplefilter("ignore", UserWarning)
        problem.solve(solver="CLARABEL", **opts)
    if g.value is None:
        raise ValidationError(f"the conic solver failed ({problem.status})")
    G = np.zeros((n, m))
    G[ii, jj] = np.maximum(g.value, 0.0)
    y = np.asarray(colc.dual_value, dtype=np.float64).reshape(-1)
    return G, [y, -y], str(problem.status)


class _TimeUp(Exception):
    """The dual's time_limit has passed (raised from an evaluation, caught by _solve_dual)."""


def _solve_dual(prob: _Problem, rtol: float, max_stages: int = 12, maxiter: int = 500,
                time_limit: float | None = None):
    """The smoothed semi-dual by L-BFGS at decreasing temperatures. ``time_limit`` (seconds):
    stop L-BFGS once it has passed (keeping the best point evaluated) and start no further
    temperature; the interval is certified as always (status ``bounds`` if it is wider than
    ``rtol``)."""
    from scipy.optimize import minimize

    if time_limit is not None and not (isinstance(time_limit, (int, float))
                                       and time_limit > 0):
        raise ValidationError(f"time_limit must be a positive number of seconds, got "
                              f"{time_limit!r}")
    t_end = math.inf if time_limit is None else time.perf_counter() + float(time_limit)
    c = prob.c
    m = len(c.J)
    scale = max(prob.cost_scale(), 1e-12)
    eps = scale
    v = np.zeros(m)
    best = None
    history = []
    for _stage in range(max_stages):
        seen: dict = {"val": -math.inf, "x": v, "nit": 0}

        def fun(x, eps=eps, seen=seen):
            if time.perf_counter() > t_end:
                raise _TimeUp
            val, grad, _ = prob.smooth(x, eps)
            if val > seen["val"]:
                seen["val"], seen["x"] = val, x.copy()
            return -val, -grad

        def count(_, seen=seen):
            seen["nit"] += 1
        # the dense case makes no matrix products: BLAS threads would only busy-wait beside
        # L-BFGS-B's small vector operations (otstab.threads)
        with contextlib.nullcontext() if prob.host_products else one_blas_thread():
            # the gradient is q - (the smoothed plan's columns): a residual of the column
            # sums that the repair of the plan prices at about the typical cost, so it need
            # only be small against the interval this stage can reach (~ eps)
            gtol = 0.05 * max(rtol, min(1.0, eps / scale)) * float(c.q.sum()) / m
            try:
                res = minimize(fun, v, jac=True, method="L-BFGS-B", callback=count,
                               options={"maxiter": maxiter, "gtol": gtol, "ftol": 1e-15})
                v, nit = res.x, int(res.nit)
            except _TimeUp:
                v, nit = seen["x"], seen["nit"]
                log.info("shift_cost dual: time_limit reached at eps %.3g", eps)
        lower, vshift = prob.dual_value(v)
        plan = _PlanBuilder(prob, lambda v=v, eps=eps: prob.plan_rows(v, eps)).build(False)
        upper = math.inf if plan is None else \
            plan.move + _reweight_cost(plan.rowsum, c.p, prob.theta2, prob.div)
        history.append({"eps": eps, "lower": lower, "upper": upper, "iters": nit})
        log.info("shift_cost dual: eps %.3g lower %.10g upper %.10g (%d iterations)", eps,
                 lower, upper, nit)
        if best is None or upper - lower < best[1] - best[0]:
            best = (lower, upper, v.copy(), eps)
        if upper - lower <= rtol * max(abs(upper), 1e-300) or time.perf_counter() > t_end:
            break
        # the interval shrinks about linearly with eps: aim at half the target width, at
        # most 64 times lower per stage (L-BFGS starts from this stage's v)
        kappa = (upper - lower) / eps
        target = 0.5 * rtol * abs(upper) / kappa if kappa > 0 and math.isfinite(kappa) \
            else eps / 8.0
        eps = max(eps / 64.0, min(eps / 8.0, target))
    return best, history


def _solve_pot(prob: _Problem, reg: float | None = None):
    import ot  # POT, optional: pip install "otstab[shift]"

    c = prob.c
    C = prob._cost(np.arange(len(c.I)))
    big = np.where(np.isfinite(C), C, 0.0)
    if np.isinf(C).any():  # forbidden pairs: a price that no plan pays
        big = np.where(np.isfinite(C), C, 1e6 * max(1.0, float(np.max(big))))
    if math.isinf(prob.theta2):
        G, logd = ot.emd(c.p / c.p.sum(), c.q / c.q.sum(), big, log=True)
        G = G * c.p.sum()
        return G, [np.asarray(logd["v"], dtype=np.float64)]
    if prob.div != "kl":
        raise ValidationError("solver='pot' covers divergence='kl' and theta2=inf; use "
                              "solver='dual' or 'conic' for chi2")
    # POT's plain unbalanced Sinkhorn (its stabilised variant diverges with an exact
    # marginal, reg_m = inf, in POT 0.9.7); the entropy reg widens the certified interval
    reg = reg or 1e-2 * max(float(np.mean(big)), 1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        G = ot.sinkhorn_unbalanced(c.p, c.q, big, reg, (prob.theta2, math.inf),
                                   method="sinkhorn", numItermax=100000, stopThr=1e-12)
    G = np.asarray(G, dtype=np.float64)
    # a dual point from the plan's column structure: v_j = min_i (C_ij + theta2 log(a_i/p_i))
    a = G.sum(axis=1)
    with np.errstate(divide="ignore"):
        pot = prob.theta2 * np.log(np.maximum(a, 1e-300) / c.p)
    v = np.min(C + pot[:, None], axis=0)
    return G, [v]


# ------------------------------------------------------------------------------------------
# the result


@dataclass(repr=False)
class ShiftCost(ResultMixin):
    """The cost ``S`` of the shift from a reference sample to a current one (see the module
    doc).

    Attributes
    ----------
    value : float
        ``S``, the cost of the returned plan (``value_upper``): a shift of exactly this cost
        turns the reference sample into the current one; ``inf`` when no allowed shift does.
    value_lower, value_upper : float
        Certified interval: no plan is cheaper than ``value_lower`` (weak duality at the
        returned dual point); the returned plan costs ``value_upper``.
    moving, reweighting : float
        The plan's cost split: ``theta1 sum g d`` and ``theta2 sum p phi(a/p)``.
    status : str
        ``optimal`` (interval within ``rtol``), ``bounds`` (a wider interval), ``zero`` (the
        samples are the same distribution: ``S = 0``), ``unreachable`` (``S = inf``).
    variables : DataFrame
        Which variables moved: per variable, its share of the moving cost and the mass moved.
    groups : DataFrame
        Which groups were reweighted: per label class (and per ``by`` column's level), the
        reference mass, the mass the plan gives it and their ratio.
    """

    value: float
    value_lower: float
    value_upper: float
    moving: float
    reweighting: float
    status: str
    theta1: float
    theta2: float
    divergence: str
    cost: str
    solver: str
    n_ref: int
    n_cur: int
    gap: float = math.nan
    message: str = ""
    solve_time: float = 0.0
    variables: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    groups: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    weights: np.ndarray | None = field(default=None, repr=False)
    plan: pd.DataFrame | None = field(default=None, repr=False)
    info: dict = field(default_factory=dict, repr=False)

    _repr_fields = ("value", "status", "value_lower", "value_upper", "moving", "reweighting",
                    "theta1", "theta2", "divergence", "cost", "solver", "n_ref", "n_cur")

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["variables"] = self.variables.to_dict(orient="records")
        d["groups"] = self.groups.to_dict(orient="records")
        return {k: v for k, v in d.items()}

    def to_json(self, path=None, *, indent: int | None = 2) -> str:
        import json

        text = json.dumps(jsonable(self.to_dict(), strict=True), indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    def to_frame(self, what: str = "variables") -> pd.DataFrame:
        """``"variables"`` (default): which variables moved; ``"groups"``: which groups were
        reweighted; ``"plan"``: the plan's pairs (small problems)."""
        if what == "variables":
            return self.variables.copy()
        if what == "groups":
            return self.groups.copy()
        if what == "plan":
            if self.plan is None:
                raise ValidationError("the plan is kept only for problems with at most "
                                      f"{PLAN_MAX_PAIRS} same-label pairs")
            return self.plan.copy()
        raise ValidationError(f"what must be 'variables', 'groups' or 'plan', got {what!r}")

    def summary(self) -> str:
        lines = [f"Cost of the observed shift ({self.divergence}, theta1={self.theta1:g}, "
                 f"theta2={self.theta2:g}, {self.cost} cost)",
                 f"  S                    {self.value:.6g}   [{self.status}, solver "
                 f"{self.solver}]",
                 f"  certified interval   [{self.value_lower:.6g}, {self.value_upper:.6g}]",
                 f"  moving / reweighting {self.moving:.6g} / {self.reweighting:.6g}",
                 f"  samples              {self.n_ref} reference, {self.n_cur} current"]
        if len(self.variables) and self.moving > 0:
            top = self.variables.head(3)
            lines.append("  moved most           " + ", ".join(
                f"{r.variable} ({r.share:.0%})" for r in top.itertuples()))
        if len(self.groups):
            g = self.groups.head(3)
            lines.append("  reweighted most      " + ", ".join(
                f"{r.column}={r.group} (x{r.ratio:.3g})" for r in g.itertuples()))
        if self.message:
            lines.append(f"  note: {self.message}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html
        out = [f"<pre>{html.escape(self.summary())}</pre>"]
        if len(self.variables):
            out.append(self.variables.head(20).to_html(index=False))
        if len(self.groups):
            out.append(self.groups.head(20).to_html(index=False))
        return "\n".join(out)


# ------------------------------------------------------------------------------------------
# the entry point


def shift_cost(X_ref, y_ref, X_cur, y_cur, *, theta1: float = 1.0, theta2: float = 0.25,
               divergence: str = "kl", cost=None, model=None, sample_weight=None,
               sample_weight_cur=None, solver: str = "auto", rtol: float = 1e-6, by=None,
               device=None, **solver_options) -> ShiftCost:
    """The cost ``S`` of the shift from ``(X_ref, y_ref)`` to ``(X_cur, y_cur)``.

    Parameters
    ----------
    X_ref, y_ref : the reference sample (the certificate's evaluation data)
    X_cur, y_cur : the current labelled sample
    theta1, theta2 : float in (0, inf]
        The prices of moving and reweighting (those of the certificate).
    divergence : {"kl", "chi2"}
    cost : None or "encoded" (default), "auto", otstab.DataCost or its ``to_dict()``
        ``"encoded"``: squared Euclidean distance between the rows (after ``model``'s
        preprocessing when ``model`` is a Pipeline, as ``certify`` measures it). A DataCost:
        the cost on the raw variables (resolved on ``model`` and ``X_ref``, as ``certify``
        resolves it), pair by pair.
    model : fitted model or Pipeline, optional
        The certified model: its preprocessing defines the encoded space and the DataCost's
        scales. Without it the given columns are used as they are.
    sample_weight : array-like (n_ref,), optional
        The reference rows' weights (those passed to ``certify``).
    sample_weight_cur : array-like (n_cur,), optional
        The current rows' weights.
    solver : "auto", "conic", "dual" or "pot"
        ``auto``: the closed form for theta1 = inf, ``conic`` up to
        :data:`CONIC_MAX_PAIRS` same-label pairs per label class, else ``dual``.
    rtol : float
        Relative width of the certified interval at which ``dual`` stops (status
        ``optimal`` within it; ``bounds`` otherwise).
    by : column name of X_ref, a named Series aligned with its rows (e.g. age bands), or a
        list of them, optional
        Also summarise the reweighting by these groups (``res.groups``).
    device : None, "cpu", "cuda", "cuda:1", ... or a ``torch.device``, optional
        Run the ``dual`` solver's passes with PyTorch on this device (``None``: NumPy).
        Every pass is in float64 and the certified interval is computed by the same code
        as the NumPy path (docs/shift.md, "Large samples on a GPU"). Needs ``torch``;
        only the ``dual`` solver (explicit, or chosen by ``auto``) uses it.

    Returns
    -------
    ShiftCost
    """
    t0 = time.perf_counter()
    theta1 = _positive(theta1, "theta1")
    theta2 = _positive(theta2, "theta2")
    if not isinstance(divergence, str) or divergence.lower() not in ("kl", "chi2"):
        raise ValidationError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
    divergence = divergence.lower()
    if not isinstance(solver, str) or solver.lower() not in SOLVERS:
        raise ValidationError(f"solver must be one of {SOLVERS}, got {solver!r}")
    solver = solver.lower()
    if device is not None and solver in ("conic", "pot"):
        raise ValidationError(f"device= runs the 'dual' solver; solver={solver!r} does not "
                              "use it (pass solver='dual' or 'auto')")
    if device is not None:
        from ._shift_torch import check_device
        device = check_device(device)
    if not (isinstance(rtol, (int, float)) and 0 < rtol < 1):
        raise ValidationError(f"rtol must be in (0, 1), got {rtol!r}")
    n, m = len(X_ref), len(X_cur)
    if n == 0 or m == 0:
        raise ValidationError("X_ref and X_cur must have at least one row each")
    yr = _labels(y_ref, n, "y_ref")
    yc = _labels(y_cur, m, "y_cur")
    p_all = _weights(sample_weight, n, "sample_weight")
    q_all = _weights(sample_weight_cur, m, "sample_weight_cur")
    by_cols = [] if by is None else ([by] if isinstance(by, (str, pd.Series)) else list(by))
    for k, col in enumerate(by_cols):
        if isinstance(col, pd.Series):
            if len(col) != n:
                raise ValidationError(f"by: a Series must have one entry per row of X_ref "
                                      f"({n}), got {len(col)}")
            by_cols[k] = col.reset_index(drop=True).rename(str(col.name or f"by{k}"))
        elif not isinstance(X_ref, pd.DataFrame) or col not in X_ref.columns:
            raise ValidationError(f"by: {col!r} is not a column of X_ref")
    geo, resolved = _geometry(X_ref, X_cur, cost, model)
    cost_name = geo.kind
    codes, uniq = pd.factorize(pd.Series(np.concatenate([yr.astype(object),
                                                         yc.astype(object)])), sort=True)
    cr, cc = codes[:n], codes[n:]

    # zero-cost moves only: the closed form over identical rows (also an upper bound always)
    gkey = _group_keys(geo, cr, cc)
    zero_upper, zero_weights = _zero_cost(gkey[:n], gkey[n:], p_all, q_all, theta2,
                                          divergence)
    info: dict = {"labels": [str(u) for u in uniq]}
    if resolved is not None:
        info["cost_spec"] = resolved.to_dict()
    if sample_weight is not None:
        info["sample_weight"] = p_all
    A_enc = geo.A_raw if isinstance(geo, _Encoded) else _try_encoded(model, X_ref)
    if A_enc is not None:  # to check that R and S share the reference data (budget_used)
        info["ref_projection"] = A_enc @ _probe(A_enc.shape[1])
        info["ref_dim"] = A_enc.shape[1]
    if zero_upper == 0.0:
        return _finish(geo, theta1, theta2, divergence, cost_name, "exact", n, m, 0.0, 0.0,
                       0.0, 0.0, "zero", "the two samples are the same distribution", t0,
                       zero_weights, [], cr, yr, p_all, X_ref, by_cols, info, rtol)
    if math.isinf(theta1):
        status = "unreachable" if math.isinf(zero_upper) else "optimal"
        msg = ("theta1 = inf: only zero-cost moves; a current row has no identical reference "
               "row of its label" if math.isinf(zero_upper) else
               "theta1 = inf: the closed form over identical rows (theta2 sum P phi(Q/P))")
        return _finish(geo, theta1, theta2, divergence, cost_name, "exact", n, m, zero_upper,
                       zero_upper, 0.0, zero_upper, status, msg, t0, zero_weights, [], cr, yr,
                       p_all, X_ref, by_cols, info, rtol)

    keep_r = np.flatnonzero(p_all > 0)
    keep_c = np.flatnonzero(q_all > 0)
    classes = []
    lower = upper = move = rew = 0.0
    weights = np.zeros(n)
    pieces: list = []
    unreachable = ""
    solvers_used = set()
    for k in range(len(uniq)):
        I = keep_r[cr[keep_r] == k]
        J = keep_c[cc[keep_c] == k]
        P, Q = float(p_all[I].sum()), float(q_all[J].sum())
        if len(J) == 0:
            if len(I) == 0:
                continue
            if math.isinf(theta2):
                unreachable = f"label {uniq[k]!r} is absent from the current data and " \
                              "theta2 = inf cannot reweight"
                break
            c_k = theta2 * P  # every row of this class loses its mass: phi(0) = 1
            lower += c_k
            upper += c_k
            rew += c_k
            continue
        if len(I) == 0:
            unreachable = f"label {uniq[k]!r} occurs in the current data but not in the " \
                          "reference data (labels never move)"
            break
        if math.isinf(theta2) and abs(P - Q) > 1e-12 * max(P, Q):
            unreachable = (f"label {uniq[k]!r} has mass {P:.6g} in the reference data and "
                           f"{Q:.6g} in the current data; theta2 = inf cannot reweight")
            break
        q = q_all[J] * (P / Q) if math.isinf(theta2) else q_all[J]
        classes.append(_Class(I, J, p_all[I], q))
    if unreachable:
        return _finish(geo, theta1, theta2, divergence, cost_name, "none", n, m, math.inf,
                       math.inf, math.inf, 0.0, "unreachable", unreachable, t0, None, [], cr,
                       yr, p_all, X_ref, by_cols, info, rtol)
    history = []
    var_cost = np.zeros(geo.d)
    var_mass = np.zeros(geo.d)
    for cls in classes:
        prob: _Problem
        pairs = len(cls.I) * len(cls.J)
        name = solver
        if name == "auto":
            name = "conic" if pairs <= CONIC_MAX_PAIRS else "dual"
        if name == "dual" and device is not None:
            from ._shift_torch import TorchProblem
            prob = TorchProblem(geo, cls, theta1, theta2, divergence, device)
            solvers_used.add(f"dual[{device}]")
        else:
            prob = _Problem(geo, cls, theta1, theta2, divergence)
            solvers_used.add(name)
        keep = pairs <= PLAN_MAX_PAIRS
        if name in ("conic", "pot"):
            if name == "conic":
                G, duals, st = _solve_conic(prob, **solver_options)
            else:
                G, duals = _solve_pot(prob, **solver_options)
            lo, best_v = max((prob.dual_value(vv) for vv in duals), key=lambda t: t[0])
            rows_of = _dense_rows(prob, G)
        else:
            (lo, _, v, eps), hist = _solve_dual(prob, rtol, **solver_options)
            history.append(hist)
            rows_of = functools.partial(prob.plan_rows, v, eps)
        plan = _PlanBuilder(prob, rows_of).build(keep)
        if plan is None:
            return _finish(geo, theta1, theta2, divergence, cost_name, name, n, m, math.inf,
                           math.inf, math.inf, 0.0, "unreachable",
                           "a current row has no reference row of its label that it can be "
                           "reached from (every move to it is forbidden by the cost)", t0,
                           None, [], cr, yr, p_all, X_ref, by_cols, info, rtol)
        r_k = _reweight_cost(plan.rowsum, cls.p, theta2, divergence)
        lower += max(lo, 0.0)
        # the plan's cost is a sum of nonnegative terms (pairwise summation): 64 ulps
        # per doubling of the terms bounds its rounding
        upper += (plan.move + r_k) * (1 + 64 * np.finfo(float).eps * math.log2(pairs + 2)) \
            + float(plan.rowsum @ prob.cost_error())  # the costs' own rounding (cost_error)
        move += plan.move
        rew += r_k
        weights[cls.I] = plan.rowsum / cls.p
        vc, vm = _variable_shares(prob, rows_of, plan)
        var_cost += vc
        var_mass += vm
        if plan.kept is not None:
            pieces.append((cls, plan))
    if history:
        info["dual_history"] = history
    lower = min(lower, upper)
    status = "optimal" if upper - lower <= rtol * max(upper, 1e-300) else "bounds"
    variables = pd.DataFrame({"variable": list(geo.names), "cost": theta1 * var_cost,
                              "mass_moved": var_mass})
    tot = float(variables["cost"].sum())
    variables["share"] = variables["cost"] / tot if tot > 0 else 0.0
    variables = variables.sort_values("cost", ascending=False, kind="stable") \
        .reset_index(drop=True)
    res = _finish(geo, theta1, theta2, divergence, cost_name, "+".join(sorted(solvers_used)),
                  n, m, upper, lower, move, rew, status, "", t0, weights, pieces, cr, yr,
                  p_all, X_ref, by_cols, info, rtol)
    res.variables = variables
    return res


def _dense_rows(prob: _Problem, G: np.ndarray):
    def rows_of():
        for rows, C in prob.row_chunks():
            yield rows, C, G[rows]
    return rows_of


def _variable_shares(prob: _Problem, rows_of, plan: _Plan):
    """Per variable: sum g d_v (before theta1) and the mass moved (pairs where it differs)."""
    geo, c = prob.geo, prob.c
    vc = np.zeros(geo.d)
    vm = np.zeros(geo.d)
    if geo.d == 0:
        return vc, vm
    m = len(c.J)
    step = max(1, prob.chunk_entries // max(1, m * geo.d))
    H, where = prob.host, prob.where

    def add(I_loc, J_loc, G):
        parts = prob.parts(I_loc, J_loc)
        with np.errstate(invalid="ignore"):
            vc[:] += H(where(G[None] > 0, parts * G[None], 0.0).sum((1, 2)))
        vm[:] += H(where(parts > 0, G[None], 0.0).sum((1, 2)))

    scale = prob.dev(_col_scale(prob, rows_of, plan))
    for rows, _, G in rows_of():
        for s in range(0, len(rows), step):
            sub = rows[s:s + step]
            add(sub, np.arange(m), G[s:s + step] * scale[None, :])
    if plan.extra is not None:
        ii, jj, mass = plan.extra
        for i, j, w in zip(ii, jj, mass):
            add(np.array([i]), np.array([j]), prob.dev(np.array([[w]])))
    if plan.rank1 is not None:
        er, ec, s = plan.rank1
        ec_d = prob.dev(ec)
        for rows, _, _ in rows_of():
            if er[rows].any():
                add(rows, np.arange(m), prob.dev(er[rows])[:, None] * ec_d[None, :] / s)
    return vc, vm


def _col_scale(prob, rows_of, plan):
    cache = getattr(plan, "_scale", None)
    if cache is not None:
        return cache
    c = prob.c
    col = np.zeros(len(c.J))
    for _, _, G in rows_of():
        col += prob.host(G.sum(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(col > 0, c.q / col, 0.0)
    if math.isinf(prob.theta2):
        scale = np.minimum(scale, 1.0)
    plan._scale = scale
    return scale


def _group_keys(geo, cr, cc) -> np.ndarray:
    """One integer per row of [reference; current]: equal iff same label and same values of
    every variable of the cost (the pairs of zero cost)."""
    A, B = geo.keys()
    if isinstance(A, pd.DataFrame):
        both = pd.concat([A, B], ignore_index=True)
        both = both.astype(object).where(both.notna(), "__nan__")
        both["__label__"] = np.concatenate([cr, cc])
        return both.groupby(list(both.columns), sort=False, dropna=False).ngroup().to_numpy()
    both = np.concatenate([np.column_stack([A, cr]), np.column_stack([B, cc])])
    both = np.where(both == 0.0, 0.0, both)  # -0.0 and 0.0 are the same point
    _, inv = np.unique(both, axis=0, return_inverse=True)
    return inv.reshape(-1)


def _zero_cost(kr, kc, p, q, theta2, divergence):
    """S with zero-cost moves only: theta2 sum_k P_k phi(Q_k / P_k) over groups of identical
    rows, and the reference rows' weights (Q_k / P_k)."""
    K = int(max(kr.max(), kc.max())) + 1
    P = np.bincount(kr, weights=p, minlength=K)
    Q = np.bincount(kc, weights=q, minlength=K)
    w = np.where(P[kr] > 0, Q[kr] / np.where(P[kr] > 0, P[kr], 1.0), 0.0)
    if np.any((Q > 0) & (P == 0)):
        return math.inf, None
    if np.allclose(P, Q, rtol=1e-12, atol=0.0):
        return 0.0, np.ones(len(kr))
    if math.isinf(theta2):
        return math.inf, None
    has = P > 0
    return float(theta2 * np.sum(P[has] * _phi(Q[has] / P[has], divergence))), w


def _finish(geo, theta1, theta2, divergence, cost_name, solver, n, m, upper, lower, move, rew,
            status, message, t0, weights, pieces, cr, yr, p_all, X_ref, by_cols, info, rtol):
    gap = 0.0 if upper == lower else (
        (upper - lower) / upper if math.isfinite(upper) and upper > 0 else math.nan)
    groups = _groups_table(weights, cr, yr, p_all, X_ref, by_cols)
    plan = None
    if pieces:
        recs = []
        for cls, pl in pieces:
            for rows, G in pl.kept:
                ii, jj = np.nonzero(G > 0)
                recs.append(pd.DataFrame({"ref": cls.I[rows[ii]], "cur": cls.J[jj],
                                          "mass": G[ii, jj]}))
            if pl.extra is not None:
                ii, jj, w = pl.extra
                recs.append(pd.DataFrame({"ref": cls.I[ii], "cur": cls.J[jj], "mass": w}))
            if pl.rank1 is not None:
                er, ec, s = pl.rank1
                ii, jj = np.nonzero(er[:, None] * ec[None, :] > 0)
                recs.append(pd.DataFrame({"ref": cls.I[ii], "cur": cls.J[jj],
                                          "mass": er[ii] * ec[jj] / s}))
        plan = pd.concat(recs, ignore_index=True).groupby(["ref", "cur"], as_index=False)[
            "mass"].sum()
    info = {**info, "rtol": rtol}
    return ShiftCost(value=upper, value_lower=lower, value_upper=upper, moving=move,
                     reweighting=rew, status=status, theta1=theta1, theta2=theta2,
                     divergence=divergence, cost=cost_name, solver=solver, n_ref=n, n_cur=m,
                     gap=gap, message=message, solve_time=time.perf_counter() - t0,
                     variables=pd.DataFrame({"variable": list(geo.names),
                                             "cost": np.zeros(len(geo.names)),
                                             "mass_moved": np.zeros(len(geo.names)),
                                             "share": np.zeros(len(geo.names))}),
                     groups=groups, weights=weights, plan=plan, info=info)


def _groups_table(weights, cr, yr, p_all, X_ref, by_cols) -> pd.DataFrame:
    cols = ["column", "group", "reference", "transported", "ratio"]
    if weights is None:
        return pd.DataFrame(columns=cols)
    a = weights * p_all
    recs = []
    keys = [("label", pd.Series(yr))]
    for c in by_cols:
        keys.append((str(c.name), c) if isinstance(c, pd.Series) else
                    (c, X_ref[c].reset_index(drop=True)))
    for name, ser in keys:
        df = pd.DataFrame({"g": ser.astype(object).to_numpy(), "p": p_all, "a": a})
        agg = df.groupby("g", sort=True, dropna=False)[["p", "a"]].sum()
        for g, row in agg.iterrows():
            ratio = row["a"] / row["p"] if row["p"] > 0 else math.inf
            recs.append({"column": name, "group": g, "reference": float(row["p"]),
                         "transported": float(row["a"]), "ratio": float(ratio)})
    out = pd.DataFrame(recs, columns=cols)
    with np.errstate(divide="ignore"):
        order = np.argsort(-np.abs(np.log(np.maximum(out["ratio"].to_numpy(dtype=float),
                                                     1e-300))), kind="stable")
    return out.iloc[order].reset_index(drop=True)
