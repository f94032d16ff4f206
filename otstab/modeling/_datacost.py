"""``DataCost``: a transport cost on the data's own variables (issue 28).

The paper's cost is the squared Euclidean distance in the model's *encoded* input space (after
one-hot encoding and scaling): one-hot indicators then move fractionally and integers become
fractions. ``DataCost`` prices a move of one raw row ``x -> x'`` variable by variable, in the
data's units, and allows only rows that can exist:

* **numeric**: ``price * ((x'_v - x_v) / scale_v)^2``; ``scale`` defaults to the pipeline's
  scaler (a StandardScaler's ``scale_``: the encoded cost's numbers) and else to the
  variable's standard deviation in the evaluation data (``ddof=0``; 1 for a constant);
* **integer** (integer dtypes, or numbers that are all integral): as numeric, and the moved
  value is an integer;
* **categorical**: changing the level costs ``price * switch_v`` (default 1: like a move of one
  scale of a numeric variable), or ``price * switch_v[from][to]`` from a level-to-level matrix
  (pairs it does not list cannot be switched); the new level is one of the variable's levels
  (the encoder's categories, else the data's);
* **ordinal** (an ``OrdinalEncoder``, an ordered pandas Categorical, or ``order=``): moves
  along the order, ``price * (rank change / scale)^2`` (scale: the pipeline's scaler of the
  code, else 1 rank).

Constraints: ``bounds={"age": (18, None)}`` (``None``: unbounded; ``"observed"`` for one
variable or ``bounds="observed"`` for every numeric one: the evaluation data's range),
``immutable=[...]``, ``increase_only=[...]``, ``decrease_only=[...]``; ``price={v: c}``
multiplies a variable's cost (``inf``: immutable). A value already outside its bounds may stay
or move towards them, never further out (the allowed range is widened to include it).

``DataCost(...).resolve(model, X)`` checks every name against the model's raw variables
(:mod:`otstab.pipeline`) and fills in what was inferred, giving a :class:`ResolvedCost`
whose ``to_dict()`` is an explicit ``DataCost`` spec (JSON-able; ``DataCost.from_dict``
rebuilds it) and whose ``cost(X0, X1)`` prices moved rows (``inf`` for a row that breaks a
constraint: the audit of a certificate recomputes its cost with it).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import ValidationError
from . import _pipeline as pipeline

__all__ = ["DataCost", "ResolvedCost", "Variable", "KINDS", "resolve_cost", "as_cost"]

KINDS = ("numeric", "integer", "categorical", "ordinal")
#: scalers whose slope gives a numeric variable's default scale
SCALERS = {"StandardScaler", "MinMaxScaler", "MaxAbsScaler", "RobustScaler"}


def _names(arg, what: str) -> list[str]:
    if arg is None:
        return []
    if isinstance(arg, str):
        return [arg]
    try:
        items = list(arg)
    except TypeError:
        raise ValidationError(f"{what} must be a list of column names, got {arg!r}") from None
    for it in items:
        if not isinstance(it, str):
            raise ValidationError(f"{what} must hold column names (str), got {it!r}")
    return items


def _mapping(arg, what: str) -> dict:
    if arg is None:
        return {}
    if not isinstance(arg, dict):
        raise ValidationError(f"{what} must be a dict {{column name: value}}, got "
                              f"{type(arg).__name__}")
    for k in arg:
        if not isinstance(k, str):
            raise ValidationError(f"{what}: keys must be column names (str), got {k!r}")
    return dict(arg)


def _positive(val, what: str, allow_inf: bool = True) -> float:
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, float, np.integer,
                                                                  np.floating)):
        raise ValidationError(f"{what} must be a number > 0, got {val!r}")
    v = float(val)
    if not v > 0.0 or math.isnan(v) or (not allow_inf and math.isinf(v)):
        raise ValidationError(f"{what} must be {'in (0, inf]' if allow_inf else 'finite and > 0'}"
                              f", got {v}")
    return v


def _plain(v):
    """A level as a plain Python value (JSON-able)."""
    return v.item() if isinstance(v, np.generic) else v


def _json_num(v):
    return "inf" if v == math.inf else ("-inf" if v == -math.inf else v)


def _from_json_num(v):
    """``"inf"`` / ``"-inf"`` as floats; anything else as it is (checked by the caller)."""
    if isinstance(v, str) and v in ("inf", "-inf"):
        return math.inf if v == "inf" else -math.inf
    return v


class DataCost:
    """A transport cost on the data's own variables (see the module doc).

    Parameters
    ----------
    scale : dict {column: float > 0}, optional
        Numeric, integer and ordinal variables: the move that costs 1.
    switch : dict {column: float > 0 or matrix}, optional
        Categorical variables: the cost of changing level (default 1), or a level-to-level
        matrix (a DataFrame with index "from" and columns "to", or ``{from: {to: cost}}``;
        pairs not listed, and ``inf``, cannot be switched).
    bounds : dict {column: (low, high) or "observed"} or "observed", optional
        Numeric and integer variables: the range a moved value must lie in (``None``: no
        bound).
    immutable, increase_only, decrease_only : lists of columns, optional
        Variables that cannot move, or move one way only (numeric, integer, ordinal).
    price : dict {column: float in (0, inf]}, optional
        Multiplies a variable's cost (``inf``: immutable); what ``feature_costs`` does for the
        encoded cost.
    kinds : dict {column: "numeric" | "integer" | "categorical" | "ordinal"}, optional
        Overrides the inferred kind.
    order : dict {column: list of levels}, optional
        An ordinal variable's levels in their order (makes it ordinal).
    levels : dict {column: list of levels}, optional
        The levels a categorical variable may take (default: the encoder's categories, else
        the data's).
    """

    def __init__(self, *, scale=None, switch=None, bounds=None, immutable=None,
                 increase_only=None, decrease_only=None, price=None, kinds=None, order=None,
                 levels=None):
        self.scale = {k: _positive(v, f"scale[{k!r}]", allow_inf=False)
                      for k, v in _mapping(scale, "scale").items()}
        self.switch = {}
        for k, v in _mapping(switch, "switch").items():
            self.switch[k] = _switch_spec(v, k)
        if isinstance(bounds, str):
            if bounds != "observed":
                raise ValidationError(f"bounds must be a dict or 'observed', got {bounds!r}")
            self.bounds = "observed"
        else:
            self.bounds = {k: _bounds_spec(v, k) for k, v in _mapping(bounds, "bounds").items()}
        self.immutable = _names(immutable, "immutable")
        self.increase_only = _names(increase_only, "increase_only")
        self.decrease_only = _names(decrease_only, "decrease_only")
        both = set(self.increase_only) & set(self.decrease_only)
        if both:
            raise ValidationError(f"increase_only and decrease_only both name {sorted(both)}: "
                                  "use immutable for a variable that cannot move")
        self.price = {k: _positive(v, f"price[{k!r}]")
                      for k, v in _mapping(price, "price").items()}
        self.kinds = _mapping(kinds, "kinds")
        for k, v in self.kinds.items():
            if v not in KINDS:
                raise ValidationError(f"kinds[{k!r}] must be one of {KINDS}, got {v!r}")
        self.order = {k: [_plain(x) for x in _names_any(v, f"order[{k!r}]")]
                      for k, v in _mapping(order, "order").items()}
        for k in self.order:
            if self.kinds.get(k, "ordinal") != "ordinal":
                raise ValidationError(f"order[{k!r}] makes {k!r} ordinal, but kinds says "
                                      f"{self.kinds[k]!r}")
        self.levels = {k: [_plain(x) for x in _names_any(v, f"levels[{k!r}]")]
                       for k, v in _mapping(levels, "levels").items()}

    def __repr__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in self.to_dict().items()
                 if k != "cost" and v not in ({}, [], None)]
        return f"DataCost({', '.join(parts)})"

    def __eq__(self, other) -> bool:
        return isinstance(other, DataCost) and self.to_dict() == other.to_dict()

    def to_dict(self) -> dict:
        """The spec as plain JSON-able data (``inf`` as the string ``"inf"``; a switch matrix
        as ``[[from, to, cost], ...]``); :meth:`from_dict` rebuilds it."""
        sw = {}
        for k, v in self.switch.items():
            sw[k] = _json_num(v) if isinstance(v, float) else \
                {"matrix": [[_plain(a), _plain(b), _json_num(c)] for (a, b), c in v.items()]}
        bounds = self.bounds if isinstance(self.bounds, str) else {
            k: (v if isinstance(v, str) else [None if x is None else _json_num(x) for x in v])
            for k, v in self.bounds.items()}
        return {"cost": "datacost", "scale": dict(self.scale), "switch": sw, "bounds": bounds,
                "immutable": list(self.immutable), "increase_only": list(self.increase_only),
                "decrease_only": list(self.decrease_only),
                "price": {k: _json_num(v) for k, v in self.price.items()},
                "kinds": dict(self.kinds), "order": {k: list(v) for k, v in self.order.items()},
                "levels": {k: list(v) for k, v in self.levels.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> DataCost:
        """The ``DataCost`` of a :meth:`to_dict` (e.g. read from a JSON cost file)."""
        if not isinstance(d, dict):
            raise ValidationError(f"a DataCost spec must be a dict, got {type(d).__name__}")
        known = {"cost", "scale", "switch", "bounds", "immutable", "increase_only",
                 "decrease_only", "price", "kinds", "order", "levels"}
        extra = set(d) - known
        if extra:
            raise ValidationError(f"unknown DataCost field(s) {sorted(extra)}; known: "
                                  f"{sorted(known)}")
        if d.get("cost", "datacost") != "datacost":
            raise ValidationError(f"not a DataCost spec: cost={d.get('cost')!r}")
        sw = {}
        for k, v in (d.get("switch") or {}).items():
            if isinstance(v, dict):
                rows = v.get("matrix", [])
                if not isinstance(rows, list) or not all(
                        isinstance(t, list) and len(t) == 3 for t in rows):
                    raise ValidationError(f"switch[{k!r}]: a matrix is a list of [from, to, "
                                          f"cost] triples, got {rows!r}")
                sw[k] = {(a, b): _from_json_num(c) for a, b, c in rows}
            else:
                sw[k] = _from_json_num(v)
        bounds = d.get("bounds")
        if isinstance(bounds, dict):
            bounds = {k: (v if isinstance(v, str) else
                          tuple(None if x is None else _from_json_num(x) for x in v))
                      for k, v in bounds.items()}
        return cls(scale=d.get("scale"), switch=sw, bounds=bounds, immutable=d.get("immutable"),
                   increase_only=d.get("increase_only"), decrease_only=d.get("decrease_only"),
                   price={k: _from_json_num(v) for k, v in (d.get("price") or {}).items()},
                   kinds=d.get("kinds"), order=d.get("order"), levels=d.get("levels"))

    def named(self) -> dict:
        """``{column: [argument names]}`` of every column this spec mentions."""
        out: dict = {}
        for arg in ("scale", "switch", "price", "kinds", "order", "levels"):
            for k in getattr(self, arg):
                out.setdefault(k, []).append(arg)
        if isinstance(self.bounds, dict):
            for k in self.bounds:
                out.setdefault(k, []).append("bounds")
        for arg in ("immutable", "increase_only", "decrease_only"):
            for k in getattr(self, arg):
                out.setdefault(k, []).append(arg)
        return out

    def describe(self) -> str:
        """The spec in plain words (what was given; :meth:`ResolvedCost.describe` adds what
        was inferred)."""
        if self.to_dict() == DataCost().to_dict():
            return ("DataCost (all inferred): numeric moves cost ((new - old) / scale)^2 with "
                    "the pipeline's scaler or the standard deviation as scale, integers stay "
                    "integers, a change of category costs 1")
        parts = [f"{k}: {', '.join(v)}" for k, v in self.named().items()]
        if self.bounds == "observed":
            parts.append("every numeric variable within its observed range")
        return "DataCost: " + "; ".join(parts)

    def resolve(self, model, X, encoded_names=None) -> ResolvedCost:
        """The cost on ``model``'s raw variables for the evaluation data ``X`` (a DataFrame):
        every name checked, every kind, scale, level list and bound made explicit."""
        return resolve_cost(self, model, X, encoded_names)


def _names_any(v, what):
    try:
        return list(v)
    except TypeError:
        raise ValidationError(f"{what} must be a list, got {v!r}") from None


def _switch_spec(v, k):
    if isinstance(v, pd.DataFrame):
        return {(_plain(a), _plain(b)): _positive(v.loc[a, b], f"switch[{k!r}][{a!r}][{b!r}]")
                for a in v.index for b in v.columns if not _same(a, b)
                and not (isinstance(v.loc[a, b], float) and math.isnan(v.loc[a, b]))}
    if isinstance(v, dict):
        out = {}
        for a, row in v.items():
            if isinstance(a, tuple) and len(a) == 2:  # {(from, to): cost}
                out[(_plain(a[0]), _plain(a[1]))] = _positive(row, f"switch[{k!r}][{a!r}]")
                continue
            if not isinstance(row, dict):
                raise ValidationError(f"switch[{k!r}] must be a number or a matrix "
                                      f"{{from: {{to: cost}}}}; row {a!r} is {row!r}")
            for b, c in row.items():
                if not _same(a, b):
                    out[(_plain(a), _plain(b))] = _positive(c, f"switch[{k!r}][{a!r}][{b!r}]")
        return out
    return _positive(v, f"switch[{k!r}]")


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable levels are different
        return False


def _bounds_spec(v, k):
    if isinstance(v, str):
        if v != "observed":
            raise ValidationError(f"bounds[{k!r}] must be (low, high) or 'observed', got {v!r}")
        return v
    try:
        lo, hi = v
    except (TypeError, ValueError):
        raise ValidationError(f"bounds[{k!r}] must be a pair (low, high) with None for no "
                              f"bound, got {v!r}") from None
    out = []
    for x, side in ((lo, "low"), (hi, "high")):
        if x is None:
            out.append(None)
            continue
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer,
                                                                  np.floating)) \
                or math.isnan(float(x)):
            raise ValidationError(f"bounds[{k!r}]: the {side} bound must be a number or None, "
                                  f"got {x!r}")
        out.append(float(x))
    if out[0] is not None and out[1] is not None and out[0] > out[1]:
        raise ValidationError(f"bounds[{k!r}]: low {out[0]} > high {out[1]}")
    return tuple(out)


@dataclass
class Variable:
    """One raw variable of a resolved cost."""

    name: str
    kind: str
    price: float = 1.0
    scale: float = 1.0
    levels: list | None = None  # categorical: allowed levels; ordinal: levels in order
    switch: float | dict = 1.0  # categorical: float or {(from, to): cost}
    lo: float = -math.inf
    hi: float = math.inf
    direction: int = 0  # +1 increase only, -1 decrease only
    immutable: bool = False
    notes: list = field(default_factory=list)

    def switch_cost(self, a, b) -> float:
        """Cost (before the price) of switching level ``a`` to ``b``."""
        if _same(a, b):
            return 0.0
        if isinstance(self.switch, dict):
            return self.switch.get((_plain(a), _plain(b)), math.inf)
        return float(self.switch)


class ResolvedCost:
    """A :class:`DataCost` made explicit for one model and data set (see the module doc)."""

    def __init__(self, variables: list[Variable], rmap, spec: DataCost):
        self.variables = variables
        self.map = rmap
        self.spec = spec

    def variable(self, name) -> Variable | None:
        return next((v for v in self.variables if v.name == name), None)

    def cost(self, X0: pd.DataFrame, X1: pd.DataFrame) -> np.ndarray:
        """The cost of moving each row of ``X0`` to the same row of ``X1`` (``inf`` where a
        move breaks a constraint: an immutable change, a value out of bounds or the wrong way,
        a fractional integer, a level outside the allowed ones). Computed from the rows alone,
        independently of any solver."""
        n = len(X0)
        total = np.zeros(n)
        for v in self.variables:
            a = X0[v.name].to_numpy()
            b = X1[v.name].to_numpy()
            if v.kind in ("numeric", "integer"):
                a = a.astype(np.float64)
                b = b.astype(np.float64)
                moved = b != a
                if not moved.any():
                    continue
                d = b - a
                c = v.price * (d / v.scale) ** 2 if math.isfinite(v.price) else \
                    np.where(moved, math.inf, 0.0)
                bad = v.immutable & moved if v.immutable else np.zeros(n, dtype=bool)
                lo, hi = np.minimum(v.lo, a), np.maximum(v.hi, a)
                bad |= moved & ((b < lo) | (b > hi))
                if v.direction:
                    bad |= moved & (np.sign(d) != v.direction)
                if v.kind == "integer":
                    bad |= moved & (b != np.round(b))
                total += np.where(bad, math.inf, np.where(moved, c, 0.0))
                continue
            moved = np.array([not _same(x, z) for x, z in zip(a, b)], dtype=bool)
            if not moved.any():
                continue
            if v.immutable or not math.isfinite(v.price):
                total[moved] = math.inf
                continue
            assert v.levels is not None  # categorical / ordinal: its levels
            pos = {_plain(lv): k for k, lv in enumerate(v.levels)}
            for i in np.flatnonzero(moved):
                tb = pos.get(_plain(b[i]))
                if tb is None:
                    total[i] = math.inf
                elif v.kind == "categorical":
                    total[i] += v.price * v.switch_cost(a[i], b[i])
                else:
                    ta = pos.get(_plain(a[i]))
                    if ta is None or (v.direction and np.sign(tb - ta) != v.direction):
                        total[i] = math.inf
                    else:
                        total[i] += v.price * ((tb - ta) / v.scale) ** 2
        return total

    def to_dict(self) -> dict:
        """An explicit :class:`DataCost` spec (JSON-able) that resolves to this cost on the
        same model and data."""
        kinds, scale, switch, bounds, price, order, levels = {}, {}, {}, {}, {}, {}, {}
        immutable, inc, dec = [], [], []
        for v in self.variables:
            kinds[v.name] = v.kind
            if v.immutable:
                immutable.append(v.name)
            if v.price != 1.0:
                price[v.name] = v.price
            if v.kind in ("numeric", "integer", "ordinal"):
                scale[v.name] = v.scale
            if v.kind in ("numeric", "integer") and (v.lo > -math.inf or v.hi < math.inf):
                bounds[v.name] = (None if v.lo == -math.inf else v.lo,
                                  None if v.hi == math.inf else v.hi)
            if v.direction > 0:
                inc.append(v.name)
            elif v.direction < 0:
                dec.append(v.name)
            if v.kind == "categorical":
                assert v.levels is not None  # categorical / ordinal: its levels
                switch[v.name] = v.switch
                levels[v.name] = [_plain(x) for x in v.levels]
            if v.kind == "ordinal":
                assert v.levels is not None
                order[v.name] = [_plain(x) for x in v.levels]
        return DataCost(scale=scale, switch=switch, bounds=bounds, immutable=immutable,
                        increase_only=inc, decrease_only=dec, price=price, kinds=kinds,
                        order=order, levels=levels).to_dict()

    def describe(self) -> str:
        """Every variable's cost in plain words."""
        lines = []
        for v in self.variables:
            if v.immutable or not math.isfinite(v.price):
                lines.append(f"{v.name}: {v.kind}, immutable")
                continue
            p = "" if v.price == 1.0 else f"{v.price:g} x "
            if v.kind in ("numeric", "integer"):
                text = f"{v.name}: {v.kind}, a move of d costs {p}(d / {v.scale:.4g})^2"
                if v.kind == "integer":
                    text += ", lands on integers"
                if v.lo > -math.inf or v.hi < math.inf:
                    text += f", within [{v.lo:g}, {v.hi:g}]"
            elif v.kind == "ordinal":
                assert v.levels is not None
                text = (f"{v.name}: ordinal over {len(v.levels)} levels, a move of k ranks "
                        f"costs {p}(k / {v.scale:.4g})^2")
            else:
                sw = "a level-to-level matrix (unlisted pairs forbidden)" \
                    if isinstance(v.switch, dict) else f"{p}{float(v.switch):g}"
                assert v.levels is not None
                text = f"{v.name}: categorical over {len(v.levels)} levels, a change costs {sw}"
            if v.direction:
                text += ", increase only" if v.direction > 0 else ", decrease only"
            text += "".join(f" ({nt})" for nt in v.notes)
            lines.append(text)
        return "\n".join(lines)


def _note_unlisted_levels(var: Variable, col: pd.Series) -> None:
    """Warn about, and note in the cost's description, rows of ``col`` at levels that
    ``var.levels`` does not list (e.g. a level the encoder never saw, encoded as all zeros
    under ``handle_unknown="ignore"``). Such a row keeps its level at no cost; a categorical
    one may switch to a listed level at the switch cost from it (a matrix lists no pair from
    it: it stays), an ordinal one has no rank and stays."""
    assert var.levels is not None
    listed = {_plain(lv) for lv in var.levels}
    counts = [(_plain(x), int(c)) for x, c in col.value_counts(dropna=True).items()]
    unlisted = [x for x, _ in counts if x not in listed]
    if not unlisted:
        return
    rows = sum(c for x, c in counts if x not in listed)
    shown = ", ".join(repr(x) for x in sorted(unlisted, key=repr)[:5]) + \
        (", ..." if len(unlisted) > 5 else "")
    then = ("they may switch to a listed level, never back" if var.kind == "categorical"
            and not isinstance(var.switch, dict) else "they cannot move")
    var.notes.append(f"{rows} row(s) at levels it does not list ({shown}): {then}")
    warnings.warn(f"DataCost: {var.name!r} has {rows} row(s) at levels outside its "
                  f"{len(var.levels)} levels ({shown}; e.g. levels the encoder never saw): "
                  f"{then}; pass levels={{{var.name!r}: [...]}} to list them", UserWarning,
                  stacklevel=4)


def _frame(model, X) -> pd.DataFrame:
    if isinstance(X, pd.DataFrame):
        out = X.copy()
        out.columns = [str(c) for c in out.columns]
        return out.reset_index(drop=True)
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise ValidationError(f"X must be 2-D, got shape {arr.shape}")
    names = pipeline.raw_column_names(model, arr.shape[1]) if getattr(model, "steps", None) \
        else None
    if names is None:
        names = [str(c) for c in (getattr(model, "feature_names_in_", None)
                                  or [f"x{j}" for j in range(arr.shape[1])])]
    return pd.DataFrame(arr, columns=names)


def _encoder_levels(rmap, name):
    """The encoder's categories of a one-hot or ordinal variable (in the encoder's order)."""
    cats = rmap.categories(name)
    if cats is None:
        return None
    return [_plain(c) for c in cats if not (isinstance(c, float) and math.isnan(c))]


def _has_scaler(rmap, name) -> bool:
    return any(s in SCALERS for s in rmap.step_names(name))


def _integral(col: pd.Series) -> bool:
    if col.dtype.kind in "iu":
        return True
    if col.dtype.kind != "f":
        return False
    vals = col.to_numpy(dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    return vals.size > 0 and bool(np.all(vals == np.round(vals)))


def resolve_cost(spec: DataCost, model, X, encoded_names=None) -> ResolvedCost:
    """:meth:`DataCost.resolve`."""
    frame = _frame(model, X)
    if encoded_names is None:
        encoded_names = list(frame.columns) if not getattr(model, "steps", None) else None
    if encoded_names is None:
        try:
            encoded_names = [str(c) for c in model[:-1].get_feature_names_out()]
        except Exception as exc:  # noqa: BLE001
            raise ValidationError(f"cost: cannot read the pipeline's encoded columns ({exc})") \
                from exc
    piped = bool(getattr(model, "steps", None)) and len(model.steps) > 1
    rmap = pipeline.raw_map(model, encoded_names) if piped else None
    if piped and rmap is None:
        raise ValidationError(
            "cost=DataCost needs preprocessing that maps each raw column to its own encoded "
            "columns (ColumnTransformer, OneHotEncoder, OrdinalEncoder, scalers, "
            "SimpleImputer, passthrough, drop); this pipeline's cannot be inverted column by "
            "column: use cost='encoded'")
    if rmap is None:  # a model without preprocessing: every column is a raw variable
        rmap = pipeline.RawMap(list(frame.columns), list(frame.columns),
                               [pipeline.RawVariable(c, "numeric", [j])
                                for j, c in enumerate(frame.columns)], [], [])
    missing = [c for c in rmap.raw_names if c not in frame.columns]
    if missing:
        raise ValidationError(f"X lacks the model's column(s) {missing[:5]}")
    read = [v for v in rmap.variables if v.kind != "dropped"]
    known = {v.name for v in read}
    dropped = {v.name for v in rmap.variables if v.kind == "dropped"}
    for name, args in spec.named().items():
        if name in known:
            continue
        if name in dropped:
            if set(args) <= {"immutable"}:
                continue
            raise ValidationError(f"{args[0]}: {name!r} is a column the model drops (its "
                                  "preprocessing never reads it), so it cannot move")
        raise ValidationError(f"{args[0]}: unknown variable {name!r}"
                              + (pipeline.suggest(name, rmap.raw_names)
                                 or f"; the model's variables are {sorted(known)[:12]}"))
    observed_all = spec.bounds == "observed"
    bounds = {} if observed_all else spec.bounds
    out = []
    for rv in read:
        name = rv.name
        col = frame[name]
        kind = spec.kinds.get(name)
        if kind is None:
            if name in spec.order or rv.kind == "ordinal":
                kind = "ordinal"
            elif rv.kind == "categorical":
                kind = "categorical"
            elif isinstance(col.dtype, pd.CategoricalDtype):
                kind = "ordinal" if col.dtype.ordered else "categorical"
            elif col.dtype.kind in "biuf" and col.dtype.kind != "b":
                kind = "integer" if _integral(col) else "numeric"
            else:
                kind = "categorical"
        if rv.kind == "categorical" and kind in ("numeric", "integer"):
            raise ValidationError(f"kinds[{name!r}] = {kind!r}, but the model one-hot encodes "
                                  f"{name!r}: it can only be categorical")
        var = Variable(name, kind, price=spec.price.get(name, 1.0))
        if name in spec.immutable or not math.isfinite(var.price):
            var.immutable = True
        if kind in ("categorical", "ordinal"):
            if isinstance(bounds, dict) and name in bounds:
                raise ValidationError(f"bounds[{name!r}]: {name!r} is {kind}; bounds apply "
                                          "to numeric and integer variables")
        if kind == "categorical":
            if name in spec.scale:
                raise ValidationError(f"scale[{name!r}]: {name!r} is categorical; price a "
                                      "change of level with switch")
            if name in spec.increase_only or name in spec.decrease_only:
                raise ValidationError(f"{name!r} is categorical: increase_only / decrease_only "
                                      "apply to numeric, integer and ordinal variables")
            levels = spec.levels.get(name) or _encoder_levels(rmap, name) or \
                sorted({_plain(x) for x in col.dropna().unique()}, key=repr)
            var.levels = list(levels)
            var.switch = spec.switch.get(name, 1.0)
            if isinstance(var.switch, dict):
                pos = {_plain(lv) for lv in var.levels}
                unknown = [p for pair in var.switch for p in pair if p not in pos]
                if unknown:
                    raise ValidationError(f"switch[{name!r}]: level {unknown[0]!r} is not one of "
                                          f"{name!r}'s levels {var.levels[:10]}")
        else:
            if name in spec.switch:
                raise ValidationError(f"switch[{name!r}]: {name!r} is {kind}; switch prices "
                                      "categorical variables (use scale)")
            if name in spec.levels:
                raise ValidationError(f"levels[{name!r}]: {name!r} is {kind}; levels apply to "
                                      "categorical variables (ordinal: order)")
            var.direction = 1 if name in spec.increase_only else \
                (-1 if name in spec.decrease_only else 0)
            slope = None
            if rv.columns and piped:
                sl = rmap.slopes(name)
                if all(s is not None for s in sl.values()):
                    slope = math.sqrt(sum(s * s for s in sl.values()))
            if name in spec.scale:
                var.scale = spec.scale[name]
            elif slope is not None and slope > 0 and _has_scaler(rmap, name):
                var.scale = 1.0 / slope
                var.notes.append("scale from the pipeline's scaler")
            elif kind == "ordinal":
                var.scale = 1.0
            else:
                sd = float(np.std(col.to_numpy(dtype=np.float64)))
                if sd > 0 and math.isfinite(sd):
                    var.scale = sd
                    var.notes.append("scale: standard deviation of the data")
                else:
                    var.scale = 1.0
                    var.notes.append("constant in the data: scale 1")
        if kind == "ordinal":
            order = spec.order.get(name) or _encoder_levels(rmap, name)
            if order is None and isinstance(col.dtype, pd.CategoricalDtype):
                order = [_plain(c) for c in col.dtype.categories]
            if order is None:
                raise ValidationError(f"kinds[{name!r}] = 'ordinal' needs the levels' order: "
                                      f"order={{{name!r}: [...]}}")
            var.levels = list(order)
        if kind in ("numeric", "integer"):
            if kind == "integer" and not _integral(col):
                raise ValidationError(f"kinds[{name!r}] = 'integer', but {name!r} has "
                                      "fractional values")
            b = bounds.get(name) if isinstance(bounds, dict) else None
            if b == "observed" or (b is None and observed_all):
                vals = col.to_numpy(dtype=np.float64)
                b = (float(np.nanmin(vals)), float(np.nanmax(vals)))
            if b is not None:
                var.lo = -math.inf if b[0] is None else float(b[0])
                var.hi = math.inf if b[1] is None else float(b[1])
        if var.levels is not None:
            _note_unlisted_levels(var, col)
        out.append(var)
    return ResolvedCost(out, rmap, spec)


def as_cost(cost) -> DataCost | None:
    """``cost=`` of certify: a :class:`DataCost`, ``"auto"`` (``DataCost()``: every kind,
    scale and level inferred), a dict spec (``DataCost.from_dict``), or None / ``"encoded"``
    (the paper's cost in the encoded space: returns None)."""
    if cost is None or isinstance(cost, DataCost):
        return cost
    if isinstance(cost, str):
        if cost.lower() == "encoded":
            return None
        if cost.lower() == "auto":
            return DataCost()
    if isinstance(cost, dict):
        return DataCost.from_dict(cost)
    raise ValidationError(f"cost must be 'auto', 'encoded', an otstab.DataCost or its "
                          f"to_dict(), got {cost!r}")
