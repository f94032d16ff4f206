"""Exact 0/1 certificates of linear models under a :class:`otstab.DataCost`.

A Pipeline whose final estimator is linear scores a raw row as ``s(x) = b + sum_v f_v(x_v)``
(each raw variable owns its encoded columns: :mod:`otstab.pipeline`). A numeric or integer
variable contributes ``a_v x_v`` plus a constant (``a_v``: the coefficients times the scaler's
slopes), a categorical or ordinal one ``f_v(level)``, read off the pipeline itself (one probe
row per level through its own ``transform``).

The distance of sample i to misclassification under the cost is then the cheapest mixed move
whose score change in the flipping direction (``-y_i`` times the change) reaches the margin
``m_i = y_i s_i``: a multiple-choice knapsack with quadratic continuous tails, solved exactly
per sample by :mod:`otstab_solvers.knapsack`. The options of each variable, in gain units:

* categorical / ordinal: each allowed level, gain ``-y (f_v(level) - f_v(x_v))``, cost
  ``price * switch`` or ``price * (rank change / scale)^2``;
* integer: ``k`` steps in the helpful direction (``sign(-y a_v)``), gain ``|a_v| k``, cost
  ``price (k / scale)^2``, ``k`` up to the bound (none in a forbidden direction);
* numeric: any move up to the bound, gain ``g``, cost ``price (g / (|a_v| scale))^2``.

The need is the margin plus the 0/1 path's push past the boundary (a relative 1e-9 of the
margin plus a few hundred ulps of the score's terms), so the moved row is misclassified by the
model's own rule; ``d*_i`` is the exact least cost of that need. A multiclass classifier solves
one such knapsack per other class k (the gain being the change of ``s_k - s_y``, the need
``s_y - s_k`` plus the push) and keeps the cheapest. The distances go to the exact
0/1 dual of :mod:`otstab.zero_one`; Q* moves each chosen sample to its cheapest flipping *raw
row* (levels among the allowed ones, integers integral, inside the bounds, immutables
unchanged), and the audit re-scores these raw rows with ``model.predict`` and re-prices them
with :meth:`ResolvedCost.cost` (no solver output is trusted): an answer whose Q* is not
misclassified by the model, or costs other than the value, is refused.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
from otstab_solvers.knapsack import solve_batch

from . import audit, inference, pipeline
from .datacost import DataCost, ResolvedCost
from .errors import SolverError, ValidationError
from .losses import PiecewiseLinear, ZeroOne, zero_one
from .models import resolve_model
from .params import check_options
from .results import Lazy
from .zero_one import _solve_and_build, move_prices

__all__ = ["certify_datacost", "linear_parts", "flip_problem", "DataCostView"]

PUSH = 1e-9
EPS = float(np.finfo(float).eps)


def _encode(model, frame: pd.DataFrame) -> np.ndarray:
    """The final estimator's inputs for raw rows (the pipeline's own ``transform``)."""
    if getattr(model, "steps", None) and len(model.steps) > 1:
        Z = model[:-1].transform(frame)
        Z = Z.toarray() if hasattr(Z, "toarray") else Z
        return np.asarray(Z, dtype=np.float64)
    return frame.to_numpy(dtype=np.float64)


def _predict(model, frame: pd.DataFrame) -> np.ndarray:
    """``model.predict`` on raw rows (a model fitted without column names gets an array)."""
    if getattr(model, "steps", None) or getattr(model, "feature_names_in_", None) is not None:
        return np.asarray(model.predict(frame))
    return np.asarray(model.predict(frame.to_numpy(dtype=np.float64)))


def linear_parts(model, prob, rc: ResolvedCost, frame: pd.DataFrame) -> dict:
    """Each variable's part of the linear scores (one column per row of the model's ``W``:
    K classes, or 1 for a binary classifier): ``{name: ("slope", a_v (K,))}`` for numeric and
    integer variables, ``{name: ("levels", f_levels (L, K), f_current (n, K))}`` for
    categorical and ordinal ones (contributions up to a constant shared by all rows)."""
    W = prob.scorer.W
    piped = bool(getattr(model, "steps", None)) and len(model.steps) > 1
    out = {}
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
        probe = frame.iloc[[0] * len(v.levels)].reset_index(drop=True)
        probe[v.name] = pd.Series(list(v.levels), dtype=object)
        try:
            Zp = _encode(model, probe)
        except Exception as exc:  # noqa: BLE001 - the user's preprocessing refused a level
            raise ValidationError(f"cost=DataCost: the pipeline could not encode the levels of "
                                  f"{v.name!r} ({exc})") from exc
        out[v.name] = ("levels", Zp[:, cols] @ W[:, cols].T, prob.X[:, cols] @ W[:, cols].T)
    return out


def _level_index(values, levels) -> np.ndarray:
    pos = {}
    for k, lv in enumerate(levels):
        pos.setdefault(_key(lv), k)
    return np.array([pos.get(_key(x), -1) for x in values], dtype=np.intp)


def _key(x):
    x = x.item() if isinstance(x, np.generic) else x
    return ("nan",) if isinstance(x, float) and math.isnan(x) else (type(x).__name__, x) \
        if not isinstance(x, (int, float)) else ("num", float(x))


def flip_problem(rc: ResolvedCost, parts: dict, frame: pd.DataFrame, coef: np.ndarray,
                 rows: np.ndarray):
    """The knapsack of the samples ``rows``: the options of every movable variable in gain
    units, the gain being the change of ``coef_i . scores`` (``coef`` (rows, K): ``-y_i`` for a
    binary classifier, ``e_k - e_{y_i}`` for class k of a multiclass one). Returns
    ``(finite, integer, continuous, layout)``; ``layout`` says which variable each list
    entry belongs to."""
    finite, integer, continuous, layout = [], [], [], []
    for v in rc.variables:
        if v.immutable or not math.isfinite(v.price):
            continue
        part = parts[v.name]
        if part[0] == "levels":
            fl, fc = part[1], part[2][rows]
            G = coef @ fl.T - np.einsum("ik,ik->i", coef, fc)[:, None]
            cur = _level_index(frame[v.name].to_numpy()[rows], v.levels)
            L = len(v.levels)
            if v.kind == "categorical":
                if isinstance(v.switch, dict):
                    T = np.array([[v.price * v.switch_cost(a, b) for b in v.levels]
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


def _needs(prob, rows, k=None):
    """Margin plus push of the correctly classified ``rows`` (see the module doc): binary,
    or against class ``k`` of a multiclass classifier (``s_y - s_k``)."""
    sc = prob.scorer
    if k is None:
        m = prob.y[rows] * prob.scores[rows]
        terms = np.abs(prob.X[rows]) @ np.abs(sc.W[0]) + abs(float(sc.b[0]))
    else:
        y = prob.y[rows].astype(np.intp)
        S = prob.scores[rows]
        m = S[np.arange(rows.size), y] - S[:, k]
        A = np.abs(prob.X[rows])
        terms = np.einsum("ij,ij->i", A, np.abs(sc.W[y])) + A @ np.abs(sc.W[k]) + \
            np.abs(sc.b[y]) + abs(float(sc.b[k]))
    return m + PUSH * m + 512.0 * EPS * (1.0 + m + terms)


def _moved_rows(out, rows, layout, choices, steps, gains, ok):
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


def _distances(prob, rc, parts, frame, rows, need):
    """``(d*, moved raw rows)`` of the correctly classified ``rows`` (``need`` filled in):
    binary, or the cheapest over the other classes of a multiclass classifier."""
    out = frame.copy()
    if prob.scorer.task == "binary":
        need[rows] = _needs(prob, rows)
        coef = -prob.y[rows].astype(np.float64)[:, None]
        fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rows)
        c, choices, steps, gains = solve_batch(need[rows], fin, ints, conts)
        _moved_rows(out, rows, layout, choices, steps, gains, np.isfinite(c))
        return c, out
    y = prob.y[rows].astype(np.intp)
    K = prob.scorer.W.shape[0]
    best = np.full(rows.size, math.inf)
    which = np.full(rows.size, -1)
    solved = {}
    for k in range(K):
        sel = np.flatnonzero(y != k)
        if not sel.size:
            continue
        rk = rows[sel]
        coef = -np.eye(K)[y[sel]]
        coef[:, k] += 1.0
        nk = _needs(prob, rk, k)
        fin, ints, conts, layout = flip_problem(rc, parts, frame, coef, rk)
        c, choices, steps, gains = solve_batch(nk, fin, ints, conts)
        better = c < best[sel]
        best[sel[better]] = c[better]
        which[sel[better]] = k
        need[rk[better]] = nk[better]
        solved[k] = (sel, rk, layout, choices, steps, gains)
    for k, (sel, rk, layout, choices, steps, gains) in solved.items():
        _moved_rows(out, rk, layout, choices, steps, gains, which[sel] == k)
    return best, out


def certify_datacost(model, X, y, *, loss, r, theta1, theta2, divergence, solver, features,
                     se, feature_costs, sample_weight, t_start, cost: DataCost,
                     **solver_options):
    """``certify(..., cost=DataCost)`` (called by :func:`otstab.certify`; see the module
    doc)."""
    hinge = isinstance(loss, PiecewiseLinear) and loss.name == "hinge"
    if not (isinstance(loss, ZeroOne) or hinge):
        raise ValidationError(
            f"cost=DataCost is exact for loss='zero_one' and loss='hinge' of linear models in "
            f"this version; loss={loss.name!r} needs cost='encoded'")
    if feature_costs is not None:
        raise ValidationError("feature_costs prices the encoded cost; with cost=DataCost use "
                              "DataCost(price={...})")
    if solver not in ("auto", "dual", "closed_form"):
        raise ValidationError(f"solver={solver!r} does not apply to loss='zero_one' (use "
                              "'auto', 'closed_form' or 'dual')")
    check_options(solver_options, (), "the exact 0/1 path under a DataCost")
    if r > 1.0 and not hinge:
        raise ValidationError(f"r is an error rate for loss='zero_one' and must be in [0, 1], "
                              f"got {r}")
    spec = inference.resolve_se(se)
    if spec not in ("analytic", None):
        raise ValidationError("se='bootstrap' is not available with cost=DataCost yet; use "
                              "se='analytic' or None")
    prob = resolve_model(model, X, y, loss=loss, sample_weight=sample_weight)
    if prob.scorer is None or prob.scorer.task not in ("binary", "multiclass"):
        raise ValidationError(
            "cost=DataCost is exact for linear classifiers (a Pipeline ending in one) in this "
            "version; use cost='encoded' for other models")
    frame = _raw_frame(model, X, prob)
    if features is not None:
        keep = set(_feature_names(features))
        extra = sorted(nm for nm in keep if nm not in frame.columns)
        if extra:
            raise ValidationError(f"features: unknown variable {extra[0]!r}"
                                  + pipeline.suggest(extra[0], frame.columns))
        d = cost.to_dict()
        d["immutable"] = sorted(set(d["immutable"]) | {c for c in frame.columns
                                                      if c not in keep})
        cost = DataCost.from_dict(d)
    rc = cost.resolve(model, frame, prob.feature_names)
    parts = linear_parts(model, prob, rc, frame)
    if hinge:
        if prob.scorer.task != "binary":
            raise ValidationError("loss='hinge' needs a binary classifier")
        from .datacost_hinge import certify_datacost_hinge  # noqa: PLC0415

        res = certify_datacost_hinge(model, prob, rc, parts, frame, r=r, theta1=theta1,
                                     theta2=theta2, divergence=divergence, t_start=t_start)
        res.info["cost"] = rc.to_dict()
        res.info["cost_description"] = rc.describe()
        res.inference = (lambda: inference.analytic(res)) if spec == "analytic" else None
        return res
    wrong = zero_one.values(prob.scores, prob.y) > 0
    n = prob.n
    rows = np.flatnonzero(~wrong)
    need = np.zeros(n)
    dstar = np.zeros(n)
    Xs = frame
    if rows.size and math.isfinite(theta1):
        dstar[rows], Xs = _distances(prob, rc, parts, frame, rows, need)
    elif rows.size:  # theta1 = inf: nothing moves
        dstar[rows] = math.inf
    loss0 = wrong
    a = move_prices(dstar, theta1)
    res = _solve_and_build(a, loss0, r, theta1, theta2, divergence, solver, None, None, None,
                           lambda Xm, ym: None, list(prob.feature_names), prob.index, t_start,
                           dstar, p=prob.p)
    _raw_audit(res, model, prob, rc, frame, Xs)
    res.info["cost"] = rc.to_dict()
    res.info["cost_description"] = rc.describe()
    if prob.p is not None:  # as certify's other paths: for the certificate and inference
        res.info["sample_weight"] = prob.p
    res.info["need"] = need
    res.info["wall_time"] = time.perf_counter() - t_start
    if spec == "analytic":
        res.inference = lambda: inference.analytic(res)
    else:
        res.inference = None
    return res


def _feature_names(features):
    items = np.atleast_1d(np.asarray(features, dtype=object)).tolist()
    for f in items:
        if not isinstance(f, str):
            raise ValidationError(f"features: with cost=DataCost name raw variables, got {f!r}")
    return items


def _raw_frame(model, X, prob) -> pd.DataFrame:
    if isinstance(X, pd.DataFrame):
        frame = X.copy()
        frame.columns = [str(c) for c in frame.columns]
        names = pipeline._raw_names(model, frame.shape[1]) if getattr(model, "steps", None) \
            else None
        if names is not None and set(names) <= set(frame.columns):
            frame = frame[names]
        return frame.reset_index(drop=True)
    arr = np.array(X, copy=True)
    names = (pipeline._raw_names(model, arr.shape[1]) if getattr(model, "steps", None)
             else list(prob.feature_names))
    return pd.DataFrame(arr, columns=names)


def _raw_audit(res, model, prob, rc, frame, Xs):
    """Re-score Q*'s moved raw rows with the model and re-price them with the cost; refuse an
    answer the model or the cost refutes."""
    if res.status not in ("optimal", "bounds"):
        res.X, res.feature_names = prob.X, list(prob.feature_names)
        res.info["raw_view"] = DataCostView(rc, frame, Xs, np.zeros(res.n_atoms, dtype=bool))
        return
    src = np.asarray(res.source)
    mass = np.asarray(res.mass, dtype=np.float64)
    w = np.asarray(res.weights, dtype=np.float64)
    loss_base = np.asarray(prob.losses(prob.X), dtype=np.float64)
    moved = np.asarray(res.loss_star) > loss_base[src]
    loss_star = loss_base[src].copy()
    moved2 = np.zeros(src.size)
    if moved.any():
        ms = src[moved]
        X1 = Xs.iloc[ms].reset_index(drop=True)
        pred = _predict(model, X1)
        loss_star[moved] = (pred != np.asarray(prob.y_original)[ms]).astype(np.float64)
        moved2[moved] = rc.cost(frame.iloc[ms].reset_index(drop=True), X1)
    sums = audit.audit_sums(loss_base, loss_star, moved2, mass, w, res.theta1, res.theta2,
                            res.divergence, res.value, prob.p, src)
    for key in ("risk_base", "risk_star", "total_mass", "primal_cost", "gap",
                "decomposition"):
        setattr(res, key, sums[key])
    res.loss_star = loss_star
    res.loss_base = loss_base
    res.info["moved2"] = moved2
    res.info["audit"] = {**(res.info.get("audit") or {}), "method": "raw rows re-scored",
                         "sample": int(np.count_nonzero(moved))}
    why = audit.problems(res)
    if why:
        raise SolverError("the 0/1 certificate under the DataCost failed its audit on the "
                          "model's own predictions of Q*'s raw rows: " + "; ".join(why))
    res.X, res.feature_names = prob.X, list(prob.feature_names)
    view = DataCostView(rc, frame, Xs, moved)
    res.info["raw_view"] = view
    res.X_star = Lazy(lambda: _encode(model, view.star_rows(src)))


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
