"""Tree ensembles in the data's own variables: leaf boxes under a :class:`otstab.DataCost`.

A tree ensemble behind a Pipeline splits on *encoded* columns (one-hot indicators, scaled
numbers). Under a :class:`~otstab.datacost.ResolvedCost` only valid raw rows may be reached, so
each leaf is rewritten as a region of the raw variables (:class:`RawTable`):

* a **numeric** or **integer** variable ``v`` read through one encoded column ``z(x)``
  (scalers, imputers, passthrough: ``z`` nondecreasing in ``x``) keeps an interval
  ``xlo < x <= xhi``: with ``X(t) = max {x float64 : c(z(x)) <= t}`` (``c``: the comparison
  the trees make, float32 rounding for scikit-learn's trees and XGBoost), the encoded leaf
  ``lo < c(z) <= hi`` holds exactly the raw values ``X(lo) < x <= X(hi)``. ``X(t)`` is found by
  bisection over the float64 numbers with the pipeline's own ``transform`` (no inverse formula
  is trusted); integers keep ``floor(X(lo)) < x <= floor(X(hi))``;
* a **categorical** or **ordinal** variable keeps the *set of levels* whose encoding (one row
  per level through the pipeline's ``transform``) lies in the leaf: a one-hot block is one
  level, never a fraction of several;
* leaves that no valid raw row reaches (two indicators of one block set, an empty integer
  range) are dropped.

Before use the raw table is checked against the encoded :class:`otstab.bounds.LeafTable`
(itself checked against the model's own scores): on the evaluation rows and on rows on both
sides of every raw edge and at every level, each row lies in exactly the leaves that hold its
encoding; a disagreement is refused (:class:`~otstab.errors.InputTypeError`).

The squared cost of a move is separable over the raw variables, so the cost from ``x_i`` to the
raw points of a box is a sum over variables: ``price_v (gap_v / scale_v)^2`` to the closure of
the interval (integers: to the nearest integer inside), the cheapest allowed level of the set
(``0`` for the current one). Bounds, ``increase_only`` / ``decrease_only`` and immutables
clip the search's root box per sample; a categorical level a sample may not take has an
infinite price. This is no relaxation: every term is the exact least cost of that variable over
the box, so the sum is the exact least cost to the box, and the best-first branch and bound of
:mod:`otstab.bounds` carries over unchanged (:func:`raw_tree_distances`): the smallest open key
is a certified lower bound on ``d*_i`` at any moment, a box meeting one leaf per tree is decided
at its cheapest raw row (by the leaf sums, or by the model's own ``predict`` within their
rounding), and a misclassified such row is a found point (an upper bound). Upper bounds come
first from a line search (every single-variable move to a raw edge or level, scored by the
model itself), then, for a sample without one, from a greedy dive (:func:`_dive`).
"""

from __future__ import annotations

import heapq
import math
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import InputTypeError, ValidationError
from . import _bounds as bounds
from ._datacost_linear import _key as level_key
from ._radius_key import radius_key
from ._refine import refine

__all__ = ["RawTable", "raw_table", "raw_tree_distances"]

_SIGN = np.int64(-0x8000000000000000)
_MAG = np.int64(0x7FFFFFFFFFFFFFFF)
_BIG = float(np.finfo(np.float64).max)
#: half-widths, in float64 steps, of the brackets of a raw edge tried around its estimate (the
#: affine estimate and one secant step) before the whole float64 line: a miss costs about 64
#: bisection steps, one transform each, for every variable
BRACKET_ULPS = (32, 1 << 16)


def _key(f: np.ndarray) -> np.ndarray:
    """Order-preserving int64 keys of float64 values (``-0.0`` and ``0.0`` share 0)."""
    b = np.asarray(f, dtype=np.float64).view(np.int64)
    return np.where(b >= 0, b, -(b & _MAG))


def _unkey(k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, dtype=np.int64)
    b = np.where(k >= 0, k, (-k) | _SIGN)
    return b.view(np.float64)


@dataclass
class RawTable:
    """Every leaf of a tree ensemble as a region of the raw variables.

    ``lo``/``hi`` (leaves, p): the interval ``lo < x <= hi`` of each numeric or integer variable
    (``num``; integer ones have integer ends); ``mask`` (leaves, levels): the allowed levels of
    each categorical or ordinal variable (``cat``), variable ``k``'s levels in columns
    ``start[k]:start[k + 1]`` (``levels[k]``). ``tree``, ``value``, ``base``, ``tol``,
    ``n_trees``, ``scale``: as in :class:`otstab.bounds.LeafTable` (the kept leaves).
    """

    num: list
    is_int: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    cat: list
    levels: list
    start: np.ndarray
    mask: np.ndarray
    tree: np.ndarray
    value: np.ndarray
    base: np.ndarray
    tol: float
    n_trees: int
    scale: float
    #: per numeric variable: the sorted raw edges (``X(t)`` of its thresholds, integers floored)
    edges: list
    #: per categorical variable: the encoded rows of its levels (levels, its columns)
    level_codes: list

    def members(self, frame: pd.DataFrame) -> np.ndarray:
        """(rows, leaves) booleans: the leaves holding each raw row."""
        n = len(frame)
        inside = np.ones((n, self.lo.shape[0]), dtype=bool)
        for j, v in enumerate(self.num):
            x = frame[v.name].to_numpy(dtype=np.float64)
            sel = np.flatnonzero(np.isfinite(self.lo[:, j]) | np.isfinite(self.hi[:, j]))
            if sel.size:
                inside[:, sel] &= (x[:, None] > self.lo[sel, j]) & (x[:, None] <= self.hi[sel, j])
        for k, v in enumerate(self.cat):
            pos = _positions(frame[v.name].to_numpy(), self.levels[k])
            if np.any(pos < 0):
                raise ValidationError(f"{v.name!r}: a level outside the table's levels")
            block = self.mask[:, self.start[k]:self.start[k + 1]]
            inside &= block[:, pos].T
        return inside


def _positions(values, levels) -> np.ndarray:
    pos: dict = {}
    for k, lv in enumerate(levels):
        pos.setdefault(level_key(lv), k)
    return np.array([pos.get(level_key(x), -1) for x in values], dtype=np.intp)


def _comparable(table, Z):
    """``table.comparable(Z)`` (far probes overflow float32 to inf on purpose)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return table.comparable(np.asarray(Z, dtype=np.float64))


def _encoded_members(table: bounds.LeafTable, Z: np.ndarray) -> np.ndarray:
    """(rows, leaves) booleans of the encoded table (constraints taken column by column)."""
    C = _comparable(table, np.asarray(Z, dtype=np.float64))
    inside = np.ones((C.shape[0], table.lo.shape[0]), dtype=bool)
    for j in range(C.shape[1]):
        sel = np.flatnonzero(np.isfinite(table.lo[:, j]) | np.isfinite(table.hi[:, j]))
        if sel.size:
            c = C[:, j:j + 1]
            inside[:, sel] &= (c > table.lo[sel, j]) & (c <= table.hi[sel, j])
    return inside


def _probe_frame(base_row: pd.DataFrame, m: int) -> pd.DataFrame:
    return base_row.iloc[[0] * m].reset_index(drop=True)


def _with_values(frame: pd.DataFrame, name: str, values) -> pd.DataFrame:
    """``frame[name] = values`` (numeric columns as float64, others in their own dtype)."""
    col = frame[name]
    if isinstance(col.dtype, pd.CategoricalDtype):
        frame[name] = pd.Categorical(list(values), categories=col.dtype.categories,
                                     ordered=col.dtype.ordered)
    elif col.dtype.kind in "iuf":
        frame[name] = np.asarray(values, dtype=np.float64)
    else:
        try:
            frame[name] = pd.Series(list(values), dtype=col.dtype)
        except (TypeError, ValueError):
            frame[name] = pd.Series(list(values), dtype=object)
    return frame


def _encode_blocks(encode, base_row: pd.DataFrame, blocks):
    """One ``transform`` of stacked probe rows: block ``(name, values)`` is the base row with
    variable ``name`` set to each value. Returns ``(frame, Z, offsets)``."""
    sizes = [len(vals) for _, vals in blocks]
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.intp)
    m = int(offsets[-1])
    frame = _probe_frame(base_row, m)
    if m == 0:
        return frame, np.zeros((0, 0)), offsets
    per: dict = {}
    for (name, vals), s in zip(blocks, offsets[:-1]):
        if name not in per:
            col = frame[name]
            per[name] = (np.full(m, float(col.iloc[0])) if col.dtype.kind in "iuf" and not
                         isinstance(col.dtype, pd.CategoricalDtype)
                         else np.array(col.astype(object).to_numpy(), dtype=object))
        arr = per[name]
        if arr.dtype == object:
            for q, v in enumerate(vals):
                arr[s + q] = v
        else:
            arr[s:s + len(vals)] = np.asarray(vals, dtype=np.float64)
    for name, arr in per.items():
        _with_values(frame, name, arr)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Z = encode(frame)
    return frame, np.asarray(Z, dtype=np.float64), offsets


def _raw_edges(encode, base_row, table, num_vars, cols, thresholds):
    """``X(t)`` for every threshold of every numeric variable (bisection over float64 keys with
    the pipeline's own ``transform``, from a bracket of a few ulps around the affine estimate,
    else the whole float64 line; see the module doc). Returns one array per variable."""
    if not num_vars:
        return []
    names = [v.name for v in num_vars]
    _, Z, off = _encode_blocks(encode, base_row, [(nm, [0.0, 1.0]) for nm in names])
    z0 = np.array([Z[off[k], j] for k, j in enumerate(cols)])
    z1 = np.array([Z[off[k] + 1, j] for k, j in enumerate(cols)])

    def holds(keys):
        """``c(z(x)) <= t`` at the inputs with these keys (one transform for all variables)."""
        _, Zp, offs = _encode_blocks(encode, base_row,
                                     [(nm, _unkey(k)) for nm, k in zip(names, keys)])
        C = _comparable(table, Zp) if Zp.size else Zp
        return [C[offs[q]:offs[q + 1], j] <= t if t.size else np.zeros(0, dtype=bool)
                for q, (j, t) in enumerate(zip(cols, thresholds))]

    ests = []
    for k, t in enumerate(thresholds):
        e = bounds.f32_edge(t) if table.f32 else t
        with np.errstate(all="ignore"):
            est = (e - z0[k]) / (z1[k] - z0[k])
        ests.append((e, np.where(np.isfinite(est), np.clip(est, -_BIG, _BIG), 0.0)))
    if any(est.size for _, est in ests):
        # one secant step (the slope from the two probes loses ~1e-12 to cancellation)
        _, Ze, offe = _encode_blocks(encode, base_row,
                                     [(nm, est) for nm, (_, est) in zip(names, ests)])
        for k, (j, (e, est)) in enumerate(zip(cols, ests)):
            with np.errstate(all="ignore"):
                step = (Ze[offe[k]:offe[k + 1], j] - e) / (z1[k] - z0[k])
                new = est - step
            ests[k] = (e, np.where(np.isfinite(new), np.clip(new, -_BIG, _BIG), est))
    kes = [_key(est) for _, est in ests]
    full_lo, full_hi = _key(np.array(-_BIG)), _key(np.array(_BIG))
    lo = [np.full(ke.size, full_lo) for ke in kes]
    hi = [np.full(ke.size, full_hi) for ke in kes]
    done = [np.zeros(ke.size, dtype=bool) for ke in kes]
    for width in BRACKET_ULPS:
        lo_s = [np.maximum(ke - width, full_lo) for ke in kes]
        hi_s = [np.minimum(ke + width, full_hi) for ke in kes]
        ok_lo, ok_hi = holds(lo_s), holds(hi_s)
        for k in range(len(kes)):
            good = ok_lo[k] & ~ok_hi[k] & ~done[k]
            lo[k][good], hi[k][good] = lo_s[k][good], hi_s[k][good]
            # a bracket that misses the flip (last width): the whole float64 line on that side
            rest = ~done[k] & ~good
            lo[k][rest] = np.where(ok_lo[k], lo_s[k], full_lo)[rest]
            hi[k][rest] = np.where(ok_hi[k], full_hi, hi_s[k])[rest]
            done[k] |= good
        if all(dn.all() for dn in done):
            break
    ends_lo, ends_hi = holds(lo), holds(hi)
    for _ in range(70):
        open_ = [h - 1 > lo_ for lo_, h in zip(lo, hi)]
        if not any(o.any() for o in open_):
            break
        mid = [np.where(o, (lo_ >> 1) + (h >> 1) + (lo_ & h & 1), lo_)
               for lo_, h, o in zip(lo, hi, open_)]
        res = holds(mid)
        for k in range(len(lo)):
            lo[k] = np.where(open_[k] & res[k], mid[k], lo[k])
            hi[k] = np.where(open_[k] & ~res[k], mid[k], hi[k])
    out = []
    for k in range(len(lo)):
        x = _unkey(lo[k])
        # no float64 input at or below t: -inf; every input: +inf
        x = np.where(ends_hi[k], np.inf, np.where(ends_lo[k], x, -np.inf))
        out.append(x)
    return out


def raw_table(final, rc, frame: pd.DataFrame, encode, Z: np.ndarray) -> RawTable:
    """The :class:`RawTable` of the tree classifier ``final`` (the Pipeline's last step)
    reading ``encode(raw rows)``, under the resolved cost ``rc``; ``frame``: the raw
    evaluation rows, ``Z`` their encoding."""
    d = Z.shape[1]
    table = bounds.leaf_table(final, d, Z)
    nL = table.lo.shape[0]
    base_row = frame.iloc[[0]].reset_index(drop=True)
    num, cols, cat, cat_cols = [], [], [], []
    covered = set()
    for v in rc.variables:
        rv = rc.map.variable(v.name)
        if rv is None or not rv.columns:
            continue
        covered.update(rv.columns)
        if v.kind in ("numeric", "integer"):
            if len(rv.columns) != 1:
                raise InputTypeError(f"cost=DataCost with a tree model: {v.name!r} feeds "
                                     f"{len(rv.columns)} encoded columns; one is supported")
            sl = rc.map.slopes(v.name) if getattr(rc.map, "_leaves", None) else {rv.columns[0]:
                                                                                  1.0}
            s = next(iter(sl.values()))
            if s is None or not s > 0:
                raise InputTypeError(f"cost=DataCost with a tree model: the pipeline maps "
                                     f"{v.name!r} {'nonlinearly' if s is None else 'decreasingly'}"
                                     "; declare it categorical (kinds=) or use cost='encoded'")
            num.append(v)
            cols.append(rv.columns[0])
        else:
            cat.append(v)
            cat_cols.append(list(rv.columns))
    split_on = np.isfinite(table.lo) | np.isfinite(table.hi)
    used = set(np.flatnonzero(split_on.any(axis=0)).tolist())
    if used - covered:
        raise InputTypeError("cost=DataCost: the trees split on encoded columns that no raw "
                             "variable owns; use cost='encoded'")
    for v in num:
        x = frame[v.name].to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValidationError(f"X[{v.name!r}] has missing or infinite values: the tree path "
                                  "under a DataCost moves finite values only")
    # numeric variables: raw edges of every threshold
    thresholds = []
    for j in cols:
        T = np.unique(np.r_[table.lo[:, j], table.hi[:, j]])
        thresholds.append(T[np.isfinite(T)])
    Xt = _raw_edges(encode, base_row, table, num, cols, thresholds)
    p = len(num)
    lo = np.full((nL, p), -np.inf)
    hi = np.full((nL, p), np.inf)
    is_int = np.array([v.kind == "integer" for v in num], dtype=bool)
    edges = []
    for k, (j, T, E) in enumerate(zip(cols, thresholds, Xt)):
        if is_int[k]:
            E = np.floor(E)
        for src, dst in ((table.lo[:, j], lo), (table.hi[:, j], hi)):
            fin = np.isfinite(src)
            dst[fin, k] = E[np.searchsorted(T, src[fin])]
        edges.append(np.unique(E[np.isfinite(E)]))
    # categorical / ordinal variables: the levels each leaf allows
    levels, starts, blocks, codes = [], [0], [], []
    for v in cat:
        lv = list(v.levels or [])
        seen = set(map(_lvl, lv))
        extra = [x for x in pd.unique(frame[v.name]) if _lvl(x) not in seen]
        if any(isinstance(x, float) and math.isnan(x) for x in extra) or \
                frame[v.name].isna().any():
            raise ValidationError(f"X[{v.name!r}] has missing values: the tree path under a "
                                  "DataCost moves valid levels only")
        levels.append(lv + extra)
    _, Zp, offs = _encode_blocks(encode, base_row, [(v.name, lv) for v, lv in zip(cat, levels)])
    for q, (lv, cc) in enumerate(zip(levels, cat_cols)):
        Zl = Zp[offs[q]:offs[q + 1]][:, cc]
        Cl = _comparable(table, Zl)
        M = np.ones((nL, len(lv)), dtype=bool)
        for c_, j in enumerate(cc):
            cl = Cl[None, :, c_]
            M &= (cl > table.lo[:, j:j + 1]) & (cl <= table.hi[:, j:j + 1])
        starts.append(starts[-1] + len(lv))
        blocks.append(M)
        codes.append(Zl)
    mask = np.concatenate(blocks, axis=1) if blocks else np.zeros((nL, 0), dtype=bool)
    start = np.asarray(starts, dtype=np.intp)
    keep = np.all(lo < hi, axis=1)
    for k in range(len(cat)):
        keep &= mask[:, start[k]:start[k + 1]].any(axis=1)
    raw = RawTable(num=num, is_int=is_int, lo=lo[keep], hi=hi[keep], cat=cat, levels=levels,
                   start=start, mask=mask[keep], tree=table.tree[keep], value=table.value[keep],
                   base=table.base.copy(), tol=float(table.tol), n_trees=table.n_trees,
                   scale=table.scale, edges=edges, level_codes=codes)
    raw.__dict__["_encoded"] = table
    raw.__dict__["_cols"] = (cols, cat_cols)
    raw.__dict__["_encode"] = encode
    raw.__dict__["_base_row"] = base_row
    _check(raw, table, keep, frame, encode, base_row)
    return raw


def _lvl(x):
    return level_key(x)


def _check(raw: RawTable, table, keep, frame, encode, base_row):
    """Each checked raw row lies in exactly the raw leaves whose encoded leaves hold its
    encoding (evaluation rows; rows on both sides of every raw edge; every level)."""
    blocks = []
    for k, v in enumerate(raw.num):
        E = raw.edges[k]
        if E.size > 400:
            E = E[np.linspace(0, E.size - 1, 400).astype(int)]
        after = E + 1.0 if raw.is_int[k] else np.nextafter(E, np.inf)
        vals = np.r_[E, after]
        blocks.append((v.name, vals[np.isfinite(vals) & (np.abs(vals) < _BIG)]))
    for k, v in enumerate(raw.cat):
        blocks.append((v.name, raw.levels[k]))
    R, Z, _ = _encode_blocks(encode, base_row, blocks)
    R0 = frame.iloc[:256].reset_index(drop=True)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Z0 = np.asarray(encode(R0), dtype=np.float64)
    for RR, ZZ in ((R0, Z0), (R, Z)):
        for s in range(0, len(RR), 256):
            enc = _encoded_members(table, ZZ[s:s + 256])
            mine = raw.members(RR.iloc[s:s + 256])
            if enc[:, ~keep].any() or not np.array_equal(enc[:, keep], mine):
                raise InputTypeError("cost=DataCost: the tree leaves rewritten in the raw "
                                     "variables disagree with the encoded leaves on some rows; "
                                     "no certified bound (use cost='encoded')")


# ----------------------------------------------------------------------------------------------
# per sample: costs, line search, branch and bound
# ----------------------------------------------------------------------------------------------


def sample_costs(raw: RawTable, rc, frame: pd.DataFrame):
    """Per sample: ``(x (n, p), w (p,), root lo/hi (n, p), level costs c (n, levels))``. The
    root box holds the values a move may reach (bounds widened to the sample's own value,
    the allowed direction, immutables fixed); ``c`` is the cost of taking each level
    (``0`` for the current one, ``inf`` for a level it may not take)."""
    n = len(frame)
    p = len(raw.num)
    X = np.empty((n, p))
    w = np.empty(p)
    rlo = np.empty((n, p))
    rhi = np.empty((n, p))
    for k, v in enumerate(raw.num):
        x = frame[v.name].to_numpy(dtype=np.float64)
        X[:, k] = x
        w[k] = v.price / v.scale ** 2 if math.isfinite(v.price) else 0.0
        lo_b, hi_b = np.minimum(v.lo, x), np.maximum(v.hi, x)
        if raw.is_int[k]:
            lo_open, hi_c = np.ceil(lo_b) - 1.0, np.floor(hi_b)
            fixed_lo = x - 1.0
        else:
            lo_open, hi_c = np.nextafter(lo_b, -np.inf), hi_b
            fixed_lo = np.nextafter(x, -np.inf)
        if v.immutable or not math.isfinite(v.price):
            lo_open, hi_c = fixed_lo, x
        elif v.direction > 0:
            lo_open = np.maximum(lo_open, fixed_lo)
        elif v.direction < 0:
            hi_c = np.minimum(hi_c, x)
        rlo[:, k] = lo_open
        rhi[:, k] = hi_c
    L = int(raw.start[-1])
    c = np.full((n, L), np.inf)
    for k, v in enumerate(raw.cat):
        lv = raw.levels[k]
        s = raw.start[k]
        cur = _positions(frame[v.name].to_numpy(), lv)
        listed = list(v.levels or [])
        nlist = len(listed)
        rows = np.arange(n)
        if v.immutable or not math.isfinite(v.price):
            pass
        elif v.kind == "categorical":
            for b in range(nlist):
                if isinstance(v.switch, dict):
                    c[:, s + b] = [v.price * v.switch_cost(lv[a], lv[b]) if a < nlist else math.inf
                                   for a in cur]
                else:
                    c[:, s + b] = v.price * float(v.switch)
        else:  # ordinal: rank moves
            diff = np.arange(nlist)[None, :] - cur[:, None]
            C = v.price * (diff / v.scale) ** 2
            C[cur >= nlist] = math.inf
            if v.direction:
                C[np.sign(diff) != v.direction] = math.inf
            c[:, s:s + nlist] = C
        c[rows, s + cur] = 0.0
    return X, w, rlo, rhi, c


class _RawSample:
    """One sample's branch and bound over raw boxes (the counterpart of
    :class:`otstab.bounds._Sample`)."""

    def __init__(self, raw: RawTable, x, w, c, y: int, upper: float, decide):
        self.raw, self.x, self.w, self.c, self.y = raw, x, w, c, y
        self.upper = upper
        self.best = None  # (cost, numeric values, level positions) of the best found point
        self.decide = decide
        V = raw.value
        others = [k for k in range(V.shape[1]) if k != y]
        self.marg = V[:, [y]] - V[:, others]
        self.base = raw.base[y] - raw.base[others]
        size = float(np.max(np.abs(raw.base), initial=0)) + raw.scale
        self.size = size
        self.tol = 4 * (raw.n_trees + 2) * np.finfo(np.float64).eps * size + 1e-15 + raw.tol
        self.cs = raw.start[:-1]
        self.ncat = len(raw.cat)

    def _cat_min(self, M):
        """Per row of level masks: the sum over variables of the cheapest allowed level."""
        if self.ncat == 0:
            return np.zeros(M.shape[0])
        C = np.where(M, self.c[None, :], np.inf)
        return np.minimum.reduceat(C, self.cs, axis=1).sum(axis=1)

    def _num_gap(self, lo, hi):
        a = np.where(self.raw.is_int, lo + 1.0, lo)
        return np.maximum(np.maximum(a - self.x, self.x - hi), 0.0)

    def evaluate(self, alive, blo, bhi, bmask):
        raw = self.raw
        lo = np.maximum(raw.lo[alive], blo)
        hi = np.minimum(raw.hi[alive], bhi)
        meet = np.all(lo < hi, axis=1)
        if self.ncat:
            M = raw.mask[alive] & bmask
            meet &= np.logical_or.reduceat(M, self.cs, axis=1).all(axis=1)
            M = M[meet]
        else:
            M = np.zeros((int(meet.sum()), 0), dtype=bool)
        alive, lo, hi = alive[meet], lo[meet], hi[meet]
        gap = self._num_gap(lo, hi)
        dist = (gap * gap) @ self.w + self._cat_min(M)
        near = dist < self.upper
        alive, dist, lo, hi, M = alive[near], dist[near], lo[near], hi[near], M[near]
        if alive.size == 0:
            return None
        got = bounds.tree_bound(raw.tree[alive], raw.n_trees, self.marg[alive], self.base)
        if got is None:
            return None
        starts, mins, bound = got
        key = float(np.max(np.minimum.reduceat(dist, starts)))
        if np.all(bound > self.tol):
            return None
        key = max(key, radius_key(dist, starts, self.marg[alive], self.base, self.tol,
                                  self.size))
        single = starts.size == alive.size
        if single:
            rlo, rhi = lo.max(axis=0), hi.min(axis=0)
            rM = M.all(axis=0) if self.ncat else np.zeros(0, dtype=bool)
            if np.any(rlo >= rhi) or (self.ncat and not np.logical_or.reduceat(
                    rM, self.cs).all()):
                return None
            pt = self._point(rlo, rhi, rM)
            closure = float((self._num_gap(rlo[None], rhi[None])[0] ** 2) @ self.w
                            + self._cat_min(rM[None])[0])
            if not closure < self.upper:
                return None
            if not np.any(bound < -self.tol) and self.decide(pt):
                return None  # the model's own predict: right
            if pt[0] < self.upper:  # a misclassified valid raw row: the best found so far
                self.upper, self.best = pt[0], pt
            key = max(key, closure)
        return key, alive, single, (mins, starts, lo, hi, M, bound)

    def _point(self, rlo, rhi, rM):
        """The cheapest raw point of a region: ``(cost, numeric values, level positions)``."""
        x = self.x
        first = np.where(self.raw.is_int, rlo + 1.0, np.nextafter(rlo, np.inf))
        v = np.where(x <= rlo, first, np.where(x > rhi, rhi, x))
        cost = float(((v - x) ** 2) @ self.w)
        pos = []
        for k in range(self.ncat):
            s, e = self.raw.start[k], self.raw.start[k + 1]
            C = np.where(rM[s:e], self.c[s:e], np.inf)
            b = int(np.argmin(C))
            pos.append(b)
            cost += float(C[b])
        return cost, v, np.asarray(pos, dtype=np.intp)

    def split(self, blo, bhi, bmask, alive, info):
        mins, starts, lo, hi, M, bound = info
        worst, _ = bounds.worst_leaf(self.marg, alive, mins, starts, bound)
        best, choice = -np.inf, None
        x = self.x
        is_int = self.raw.is_int
        # numeric cuts: at the worst leaf's ends inside the box; score: the cost of its side
        for j in range(x.size):
            for cut, upper_side in ((lo[worst, j], True), (hi[worst, j], False)):
                if not (blo[j] < cut < bhi[j]):
                    continue
                a, b = (cut, bhi[j]) if upper_side else (blo[j], cut)
                a = a + 1.0 if is_int[j] else a
                g = max(a - x[j], x[j] - b, 0.0)
                score = self.w[j] * g * g
                if score > best:
                    best, choice = score, ("num", j, cut)
        wl = self.raw.mask[alive[worst]]
        for q in range(self.ncat):
            s, e = self.raw.start[q], self.raw.start[q + 1]
            inside = bmask[s:e] & wl[s:e]
            outside = bmask[s:e] & ~wl[s:e]
            if not (inside.any() and outside.any()):
                continue
            score = float(np.min(np.where(inside, self.c[s:e], np.inf)))
            if score > best:
                best, choice = score, ("cat", s, e, inside)
        if choice is None:  # pragma: no cover - a tree with 2+ leaves here has an inner edge
            raise AssertionError("no split found")
        if choice[0] == "num":
            _, j, cut = choice
            hi1 = bhi.copy()
            hi1[j] = cut
            lo2 = blo.copy()
            lo2[j] = cut
            return (blo, hi1, bmask), (lo2, bhi, bmask)
        _, s, e, inside = choice
        m1, m2 = bmask.copy(), bmask.copy()
        m1[s:e] = inside
        m2[s:e] = bmask[s:e] & ~inside
        return (blo, bhi, m1), (blo, bhi, m2)


def _dive(smp: _RawSample, root, max_nodes: int) -> int:
    """A greedy descent for a first found point: from the root, split and follow the child
    whose margin bound is lowest (the likeliest to hold a misclassified row) until a box meets
    one leaf per tree (``evaluate`` records it when the model misclassifies its cheapest raw
    row). Returns the boxes examined."""
    box, ev, nodes = root, smp.evaluate(np.arange(smp.raw.lo.shape[0]), *root), 1
    while ev is not None and not ev[2] and nodes + 2 <= max_nodes:
        kids = []
        blo, bhi, bmask = box  # a box: lower and upper ends, level mask
        for child in smp.split(blo, bhi, bmask, ev[1], ev[3]):
            nodes += 1
            cev = smp.evaluate(ev[1], *child)
            if cev is not None:
                kids.append((float(np.min(cev[3][5])), cev[0], child, cev))
        if not kids:
            break
        _, _, box, ev = min(kids, key=lambda k: (k[0], k[1]))
    return nodes


def _search(smp: _RawSample, root, max_nodes: int, deadline: float):
    """Best-first search: ``(lower bound, exact, boxes, timed out)`` (see
    :func:`otstab.bounds._branch_and_bound`); ``smp.best`` holds the best found point."""
    ev = smp.evaluate(np.arange(smp.raw.lo.shape[0]), *root)
    if ev is None:
        return smp.upper, True, 1, False
    heap = [(ev[0], 0, root, ev)]
    counter, nodes = 1, 1
    while heap:
        key, _, box, ev = heap[0]
        if key >= smp.upper:
            return smp.upper, True, nodes, False
        if ev[2]:
            return min(key, smp.upper), True, nodes, False
        if nodes >= max_nodes:
            return min(key, smp.upper), False, nodes, False
        if time.perf_counter() > deadline:
            return min(key, smp.upper), False, nodes, True
        heapq.heappop(heap)
        blo, bhi, bmask = box  # a box: lower and upper ends, level mask
        for child in smp.split(blo, bhi, bmask, ev[1], ev[3]):
            nodes += 1
            cev = smp.evaluate(ev[1], *child)
            if cev is not None:
                heapq.heappush(heap, (max(cev[0], key), counter, child, cev))
                counter += 1
    return smp.upper, True, nodes, False


def line_search(raw: RawTable, Z: np.ndarray, X, w, rlo, rhi, c, wrong_fn, limit=256):
    """Upper bounds from single-variable moves: for every sample, its ``limit`` cheapest moves
    of one variable to a raw edge (the edge, and the next value past it) or to a level it may
    take, scored by the model itself on their encodings. Returns ``(cost (n,), moves)``, with
    ``moves[i] = (kind, variable index, value)`` or None."""
    n = Z.shape[0]
    cols, cat_cols = raw.__dict__["_cols"]
    z_of = []  # per numeric variable: candidate raw values and their encoded values
    for k in range(len(raw.num)):
        E = raw.edges[k]
        after = E + 1.0 if raw.is_int[k] else np.nextafter(E, np.inf)
        vals = np.unique(np.r_[E, after])
        vals = vals[np.isfinite(vals) & (np.abs(vals) < _BIG)]
        z_of.append(vals)
    enc_num = raw.__dict__.get("_enc_num")
    if enc_num is None:
        enc_num = raw.__dict__["_enc_num"] = _encode_values(raw, z_of)
    cand_i, cand_cost, cand_kind, cand_var, cand_val = [], [], [], [], []
    for k in range(len(raw.num)):
        vals = z_of[k]
        if vals.size == 0 or w[k] == 0:
            continue
        dv = vals[None, :] - X[:, [k]]
        cost = w[k] * dv * dv
        ok = (vals[None, :] > rlo[:, [k]]) & (vals[None, :] <= rhi[:, [k]]) & (dv != 0)
        ii, jj = np.nonzero(ok)
        cand_i.append(ii)
        cand_cost.append(cost[ii, jj])
        cand_kind.append(np.zeros(ii.size, dtype=np.intp))
        cand_var.append(np.full(ii.size, k))
        cand_val.append(jj)
    for q in range(len(raw.cat)):
        s, e = raw.start[q], raw.start[q + 1]
        C = c[:, s:e]
        ok = np.isfinite(C) & (C > 0)
        ii, jj = np.nonzero(ok)
        cand_i.append(ii)
        cand_cost.append(C[ii, jj])
        cand_kind.append(np.ones(ii.size, dtype=np.intp))
        cand_var.append(np.full(ii.size, q))
        cand_val.append(jj)
    best = np.full(n, np.inf)
    moves: list = [None] * n
    if not cand_i:
        return best, moves
    ci, cc, ck, cv, cl = (np.concatenate(a) for a in (cand_i, cand_cost, cand_kind, cand_var,
                                                       cand_val))
    order = np.lexsort((cc, ci))
    ci, cc, ck, cv, cl = ci[order], cc[order], ck[order], cv[order], cl[order]
    first = np.searchsorted(ci, np.arange(n))
    rank = np.arange(ci.size) - first[ci]
    keep = rank < limit
    ci, cc, ck, cv, cl = ci[keep], cc[keep], ck[keep], cv[keep], cl[keep]
    for s in range(0, ci.size, 65536):
        sl = slice(s, s + 65536)
        Zc = Z[ci[sl]].copy()
        for k in np.unique(cv[sl][ck[sl] == 0]):
            sel = np.flatnonzero((ck[sl] == 0) & (cv[sl] == k))
            Zc[sel, cols[k]] = enc_num[k][cl[sl][sel]]
        for q in np.unique(cv[sl][ck[sl] == 1]):
            sel = np.flatnonzero((ck[sl] == 1) & (cv[sl] == q))
            Zc[np.ix_(sel, cat_cols[q])] = raw.level_codes[q][cl[sl][sel]]
        bad = wrong_fn(Zc, ci[sl])
        for t in np.flatnonzero(bad):
            i = ci[sl][t]
            if cc[sl][t] < best[i]:
                best[i] = cc[sl][t]
                kind = int(ck[sl][t])
                var = int(cv[sl][t])
                val = z_of[var][cl[sl][t]] if kind == 0 else int(cl[sl][t])
                moves[i] = (kind, var, val)
    return best, moves


def _encode_values(raw, z_of):
    encode, base_row = raw.__dict__["_encode"], raw.__dict__["_base_row"]
    cols, _ = raw.__dict__["_cols"]
    _, Z, offs = _encode_blocks(encode, base_row, [(v.name, z_of[k])
                                                   for k, v in enumerate(raw.num)])
    return [Z[offs[k]:offs[k + 1], cols[k]] if offs[k + 1] > offs[k] else np.zeros(0)
            for k in range(len(raw.num))]


def _progress(done, total, t0, stream=sys.stderr):
    bounds._progress(done, total, t0, stream)


def raw_tree_distances(raw: RawTable, rc, frame, Z, yi, wrong_fn, decide_fn, *, max_nodes=200,
                       time_budget=None, node_budget=None, progress=False, rtol=None,
                       duals=None):
    """Certified lower bounds and found upper bounds on every sample's ``d*_i`` under the
    DataCost (module doc). ``yi``: class positions; ``wrong_fn(Zc, rows)``: whether the model
    misclassifies the encoded rows ``Zc`` of samples ``rows``; ``decide_fn(i, values,
    positions)``: whether the model classifies sample i's moved raw row rightly. ``rtol``,
    ``duals``: the stopping rule of :func:`otstab.solve._refine.refine` (``duals`` on these
    samples).

    Returns ``(dlow, dup, moved, info)``: ``moved[i]`` a dict ``{variable: new value}`` of the
    found point (None: none found, ``dup = inf``)."""
    X, w, rlo, rhi, c = sample_costs(raw, rc, frame)
    n = len(frame)
    up, moves = line_search(raw, Z, X, w, rlo, rhi, c, wrong_fn)
    found: list = [None] * n
    for i in range(n):
        if moves[i] is not None:
            kind, var, val = moves[i]
            found[i] = {(raw.num[var] if kind == 0 else raw.cat[var]).name:
                        (float(val) if kind == 0 else raw.levels[var][val])}
    t0 = time.perf_counter()
    deadline = math.inf if time_budget is None else t0 + float(time_budget)
    dup = up.copy()

    def search(i, budget, dl, upper):
        smp = _RawSample(raw, X[i], w, c[i], int(yi[i]), upper,
                         lambda pt: decide_fn(i, _as_row(raw, pt)))
        root = (rlo[i].copy(), rhi[i].copy(), np.isfinite(c[i]))
        dived = 0
        if not math.isfinite(upper) and budget > 2:  # no point found yet: dive for one
            dived = _dive(smp, root, min(budget // 2, 64))
        low, exact, used, timed_out = _search(smp, root, budget, dl)
        used += dived
        if smp.best is not None and smp.best[0] < dup[i]:
            dup[i] = smp.best[0]
            found[i] = _as_row(raw, smp.best)
        return low, exact, used, timed_out, float(dup[i])

    def bar(done):
        if progress and (done % 50 == 0 or done == n):
            _progress(min(done, n), n, t0)

    dlow, exact, info = refine(n, search, dup, duals, rtol=rtol, max_nodes=max_nodes,
                               node_budget=node_budget, deadline=deadline, progress=bar)
    return dlow, dup, found, {"exact": exact, "time": time.perf_counter() - t0, **info}


def _as_row(raw: RawTable, pt) -> dict:
    """``{variable: value}`` of a point ``(cost, numeric values, level positions)``."""
    _, vals, pos = pt
    out = {v.name: float(vals[k]) for k, v in enumerate(raw.num)}
    for q, v in enumerate(raw.cat):
        out[v.name] = raw.levels[q][int(pos[q])]
    return out
