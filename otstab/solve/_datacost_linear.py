"""The linear pieces shared by the exact DataCost certificates (:mod:`otstab.datacost_zero_one`,
:mod:`otstab.datacost_hinge`; :func:`otstab.datacost_certify.certify_datacost` dispatches).

A Pipeline whose final estimator is linear scores a raw row as ``s(x) = b + sum_v f_v(x_v)``
(each raw variable owns its encoded columns: :mod:`otstab.pipeline`). A numeric or integer
variable contributes ``a_v x_v`` plus a constant (``a_v``: the coefficients times the scaler's
slopes), a categorical or ordinal one ``f_v(level)``, read off the pipeline itself (one probe
row per level through its own ``transform``): :func:`linear_parts`.

A move of sample i changes its score by a sum over the variables; :func:`flip_problem` lists
each variable's options in gain units (the score change in a chosen direction) with their
costs:

* categorical / ordinal: each allowed level, gain ``-y (f_v(level) - f_v(x_v))``, cost
  ``price * switch`` or ``price * (rank change / scale)^2``;
* integer: ``k`` steps in the helpful direction (``sign(-y a_v)``), gain ``|a_v| k``, cost
  ``price (k / scale)^2``, ``k`` up to the bound (none in a forbidden direction);
* numeric: any move up to the bound, gain ``g``, cost ``price (g / (|a_v| scale))^2``.

:func:`moved_rows` turns chosen options back into raw rows (levels among the allowed ones,
integers integral, inside the bounds, immutables unchanged), and :class:`DataCostView` is
``res.to_frame(raw=True)`` of a certificate made of such rows.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from otstab_solvers.weights import weights_at

from ..errors import ValidationError
from ..modeling import _pipeline as pipeline
from ..modeling._datacost import ResolvedCost
from ..modeling._nonlinear import label_column
from . import _audit as audit

__all__ = ["linear_parts", "integer_step", "flip_problem", "moved_rows", "split_at_kink",
           "raw_frame", "selected_variables",
           "encode", "predict", "DataCostView"]


def encode(model, frame: pd.DataFrame) -> np.ndarray:
    """The final estimator's inputs for raw rows (the pipeline's own ``transform``)."""
    if getattr(model, "steps", None) and len(model.steps) > 1:
        Z = model[:-1].transform(frame)
        Z = Z.toarray() if hasattr(Z, "toarray") else Z
        return np.asarray(Z, dtype=np.float64)
    return frame.to_numpy(dtype=np.float64)


def predict(model, frame: pd.DataFrame) -> np.ndarray:
    """``model.predict`` on raw rows (a model fitted without column names gets an array)."""
    if getattr(model, "steps", None) or getattr(model, "feature_names_in_", None) is not None:
        return label_column(model.predict(frame))
    return label_column(model.predict(frame.to_numpy(dtype=np.float64)))


def linear_parts(model, prob, rc: ResolvedCost, frame: pd.DataFrame) -> dict:
    """Each variable's part of the linear scores (one column per row of the model's ``W``:
    K classes, or 1 for a binary classifier): ``{name: ("slope", a_v (K,))}`` for numeric and
    integer variables, ``{name: ("levels", f_levels (L, K), f_current (n, K))}`` for
    categorical and ordinal ones (contributions up to a constant shared by all rows)."""
    W = prob.scorer.W
    piped = bool(getattr(model, "steps", None)) and len(model.steps) > 1
    out: dict[str, tuple] = {}
    for v in rc.variables:
        cols = rc.map.variable(v.name).columns
        if v.kind in ("numeric", "integer"):
            if piped:
                sl = rc.map.slopes(v.name)
                if any(s is None for s in sl.values()):
                    raise ValidationError(
                        f"cost=DataCost: the pipeline maps {v.name!r} nonlinearly, so its score "
                        "is not linear in the raw variable; declare it categorical (kinds=) or "
                        "use cost='encoded'")
                out[v.name] = ("slope", sum(W[:, j] * s for j, s in sl.items()))
            else:
                out[v.name] = ("slope", W[:, cols[0]].copy())
            continue
        assert v.levels is not None  # categorical / ordinal: its levels
        probe = frame.iloc[[0] * len(v.levels)].reset_index(drop=True)
        probe[v.name] = pd.Series(list(v.levels), dtype=object)
        try:
            Zp = encode(model, probe)
        except Exception as exc:  # noqa: BLE001 - the user's preprocessing refused a level
            raise ValidationError(f"cost=DataCost: the pipeline could not encode the levels of "
                                  f"{v.name!r} ({exc})") from exc
        out[v.name] = ("levels", Zp[:, cols] @ W[:, cols].T, prob.X[:, cols] @ W[:, cols].T)
    return out


def _level_index(values, levels) -> np.ndarray:
    pos: dict = {}
    for k, lv in enumerate(levels):
        pos.setdefault(_key(lv), k)
    return np.array([pos.get(_key(x), -1) for x in values], dtype=np.intp)


def _key(x):
    x = x.item() if isinstance(x, np.generic) else x
    return ("nan",) if isinstance(x, float) and math.isnan(x) else (type(x).__name__, x) \
        if not isinstance(x, (int, float)) else ("num", float(x))


def integer_step(eta, a, q, K, t1: float, rel_tol: float, right: bool):
    """The best move ``k`` in ``0..K`` (per row) of an integer variable whose gain is
    ``eta a k`` and whose cost is ``t1 q k^2``: the integers either side of the free optimum
    ``eta a / (2 t1 q)``, the upper one on a tie within ``rel_tol`` when ``right``. Returns
    ``(k, eta a k - t1 q k^2)``."""
    kr = np.where(q > 0, eta * a / (2.0 * t1 * np.where(q > 0, q, 1.0)), 0.0)
    lo = np.clip(np.floor(kr), 0, K)
    hi = np.clip(np.floor(kr) + 1, 0, K)
    vlo = eta * a * lo - t1 * q * lo * lo
    vhi = eta * a * hi - t1 * q * hi * hi
    tol = rel_tol * (1.0 + np.abs(vlo) + np.abs(vhi))
    take_hi = (vhi > vlo + tol) | ((np.abs(vhi - vlo) <= tol) & right)
    return np.where(take_hi, hi, lo), np.where(take_hi, vhi, vlo)


def flip_problem(rc: ResolvedCost, parts: dict, frame: pd.DataFrame, coef: np.ndarray,
                 rows: np.ndarray):
    """The knapsack of the samples ``rows``: the options of every movable variable in gain
    units, the gain being the change of ``coef_i . scores`` (``coef`` (rows, K): ``-y_i`` for a
    binary classifier, ``e_k - e_{y_i}`` for class k of a multiclass one). Returns
    ``(finite, integer, continuous, layout)``; ``layout`` says which variable each list
    entry belongs to."""
    finite: list = []
    integer: list = []
    continuous: list = []
    layout: list[tuple] = []
    for v in rc.variables:
        if v.immutable or not math.isfinite(v.price):
            continue
        part = parts[v.name]
        if part[0] == "levels":
            fl, fc = part[1], part[2][rows]
            G = coef @ fl.T - np.einsum("ik,ik->i", coef, fc)[:, None]
            assert v.levels is not None  # categorical / ordinal: its levels
            cur = _level_index(frame[v.name].to_numpy()[rows], v.levels)
            L = len(v.levels)
            if v.kind == "categorical":
                if isinstance(v.switch, dict):
                    T: np.ndarray = np.array([[v.price * v.switch_cost(a, b) for b in v.levels]
                                  for a in v.levels] + [[math.inf] * L])
                    C = T[cur]
                else:
                    C = np.full((rows.size, L), v.price * float(v.switch))
            else:
                diff = np.arange(L)[None, :] - cur[:, None]
                C = v.price * (diff / v.scale) ** 2
                C[cur < 0] = math.inf
                if v.direction:
                    C[np.sign(diff) != v.direction] = math.inf
            have = np.flatnonzero(cur >= 0)
            C[have, cur[have]] = math.inf  # (staying is the implicit option)
            finite.append((G, C))
            layout.append(("finite", v))
            continue
        a = coef @ part[1]  # the gain per unit of the variable, per row
        if not np.any(a != 0.0):
            continue
        x = frame[v.name].to_numpy(dtype=np.float64)[rows]
        t = np.sign(a)
        room = np.where(t > 0, np.maximum(v.hi, x) - x, x - np.minimum(v.lo, x))
        if v.direction:
            room = np.where(t == v.direction, room, 0.0)
        alpha = np.abs(a)
        room = np.where(alpha > 0, room, 0.0)
        if v.kind == "integer":
            K = np.floor(room)
            integer.append((alpha, np.full(rows.size, v.price / v.scale ** 2), K))
            layout.append(("integer", v, t, x))
        else:
            with np.errstate(divide="ignore"):
                Q = np.where(alpha > 0, v.price / (v.scale * np.where(alpha > 0, alpha, 1.0))
                             ** 2, 1.0)
            continuous.append((Q, alpha * room))
            layout.append(("continuous", v, t, x, room, alpha))
    return finite, integer, continuous, layout


def moved_rows(out, rows, layout, choices, steps, gains, ok):
    """Write the cheapest flipping raw row of each sample ``rows[ok]`` into ``out``."""
    sel = rows[ok]
    fi = ii = ci = 0
    for entry in layout:
        kind, v = entry[0], entry[1]
        col = out[v.name]
        if kind == "finite":
            ch = choices[ok, fi]
            fi += 1
            go = ch >= 0
            if go.any():
                vals = col.to_numpy(dtype=object).copy()
                vals[sel[go]] = np.asarray(v.levels, dtype=object)[ch[go]]
                out[v.name] = pd.Series(vals, dtype=object) if not isinstance(
                    col.dtype, pd.CategoricalDtype) else pd.Categorical(
                        vals, categories=col.dtype.categories, ordered=col.dtype.ordered)
            continue
        vals = col.to_numpy(dtype=np.float64).copy()
        if kind == "integer":
            t, x = entry[2][ok], entry[3][ok]
            vals[sel] = x + t * steps[ok, ii]
            ii += 1
        else:
            t, x, room = entry[2][ok], entry[3][ok], entry[4][ok]
            alpha = entry[5][ok]
            g = gains[ok, ci]
            ci += 1
            move = np.minimum(g / np.where(alpha > 0, alpha, 1.0), room)
            # a move to the bound lands on it exactly (no rounding past it)
            full = (move > 0) & (move >= room) & np.isfinite(room)
            vals[sel] = np.where(full, np.where(t > 0, np.maximum(v.hi, x),
                                                np.minimum(v.lo, x)), x + t * move)
        if col.dtype.kind in "iu" and np.all(vals == np.round(vals)):
            out[v.name] = vals.astype(col.dtype)
        else:
            out[v.name] = vals
    return out


def selected_variables(features):
    items = np.atleast_1d(np.asarray(features, dtype=object)).tolist()
    for f in items:
        if not isinstance(f, str):
            raise ValidationError(f"features: with cost=DataCost name raw variables, got {f!r}")
    return items


def raw_frame(model, X, prob) -> pd.DataFrame:
    if isinstance(X, pd.DataFrame):
        frame = X.copy()
        frame.columns = [str(c) for c in frame.columns]
        names = pipeline.raw_column_names(model, frame.shape[1]) if getattr(model, "steps", None) \
            else None
        if names is not None and set(names) <= set(frame.columns):
            frame = frame[names]
        return frame.reset_index(drop=True)
    arr = np.array(X, copy=True)
    names = (pipeline.raw_column_names(model, arr.shape[1]) if getattr(model, "steps", None)
             else list(prob.feature_names))
    return pd.DataFrame(arr, columns=names)


class DataCostView(pipeline.RawView):
    """``res.to_frame(raw=True)`` of a DataCost certificate: every atom's raw row before and
    after (moved atoms: the cheapest flipping row), its cost under the DataCost."""

    def __init__(self, rc: ResolvedCost, X_raw: pd.DataFrame, X_moved: pd.DataFrame, moved,
                 atoms: pd.DataFrame | None = None):
        super().__init__(rc.map, X_raw)
        self.cost, self.X_moved, self.moved = rc, X_moved, np.asarray(moved, dtype=bool)
        self.atoms = atoms  # the raw row of every atom, when given whole (hinge)

    def star_rows(self, src) -> pd.DataFrame:
        """The raw rows of Q*'s atoms (sources ``src``)."""
        if self.atoms is not None:
            return self.atoms.reset_index(drop=True)
        src = np.asarray(src)
        out = self.X_raw.iloc[src].reset_index(drop=True)
        if self.moved.any():
            mv = np.flatnonzero(self.moved)
            moved = self.X_moved.iloc[src[mv]].reset_index(drop=True)
            for nm in out.columns:
                col = np.array(out[nm].astype(object).to_numpy(), dtype=object)
                col[mv] = moved[nm].astype(object).to_numpy()
                out[nm] = pd.Series(col).infer_objects()
        return out

    def frame(self, result) -> pd.DataFrame:
        src = np.asarray(result.source)
        raw0 = self.X_raw.iloc[src].reset_index(drop=True)
        raw1 = self.star_rows(src)
        data = {"source": src, "mass": np.asarray(result.mass)}
        if result.index is not None:
            data["index"] = np.asarray(result.index)[src]
        names = [v.name for v in self.cost.variables]
        for nm in names:
            data[nm] = raw0[nm].to_numpy()
        for nm in names:
            data[f"{nm}*"] = raw1[nm].to_numpy()
        data["weight"] = np.asarray(result.weights)
        data["loss"] = np.asarray(result.loss_base)[src]
        data["loss*"] = np.asarray(result.loss_star)
        data["cost"] = self.cost.cost(raw0, raw1)
        df = pd.DataFrame(data)
        df.attrs["note"] = ("raw rows before and after the move; cost: the DataCost of the move "
                            "(result.info['cost_description'])")
        return df


def split_at_kink(frame, rows, layout, left, right, lh, r, p, theta2, divergence):
    """Q*'s raw atoms at the dual's optimal h, shared by the exact hinge and logistic paths:
    the weights ``w`` at ``lh``, every sample at its left maximiser and, where the risk needs
    it, part of its mass at its right maximiser (in order, until the risk is r). ``left`` and
    ``right``: the oracle's answers (values at [1], moves at [3:6]). Returns ``(w, src, mass,
    star, X0)``: per atom its source row, its mass, its raw row, and its source's raw row."""
    n = len(rows)
    w = weights_at(lh, theta2, divergence, p)[0]
    pw = w / n if p is None else w * p  # each sample's share of the risk per unit loss
    risk_left = float(np.sum(pw * left[1]))
    gain = pw * (right[1] - left[1])
    kinked = np.flatnonzero(gain > 0)
    share = audit.shares_in_order(gain[kinked], r - risk_left)
    frac = np.zeros(n)
    frac[kinked] = share
    XL = moved_rows(frame.copy(), rows, layout, left[3], left[4], left[5],
                    np.ones(n, dtype=bool))
    XR = moved_rows(frame.copy(), rows, layout, right[3], right[4], right[5],
                    np.ones(n, dtype=bool))
    # atoms: every sample at its left maximiser (mass 1 - frac), the split samples also at
    # their right maximiser (mass frac); a sample moved whole goes to the right one
    whole = np.flatnonzero(frac >= 1.0)
    split = np.flatnonzero((frac > 0) & (frac < 1.0))
    src = np.concatenate([rows, split])
    mass = np.concatenate([np.where(frac >= 1.0, 1.0, 1.0 - frac), frac[split]])
    first = XL.copy()
    if whole.size:
        for c in first.columns:
            col = np.array(first[c].astype(object).to_numpy(), dtype=object)
            col[whole] = XR[c].astype(object).to_numpy()[whole]
            first[c] = pd.Series(col).astype(frame[c].dtype) if frame[c].dtype.kind in "iuf" \
                else pd.Series(col)
    star = pd.concat([first, XR.iloc[split]], ignore_index=True)
    X0 = frame.iloc[src].reset_index(drop=True)
    return w, src, mass, star, X0
