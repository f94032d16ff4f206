"""Raw variables of a model: which encoded columns each of the user's columns became, and back.

A scikit-learn Pipeline perturbs the final estimator's inputs (standardised numbers, one-hot
indicators), but people think in the data's own columns ("amount", "purpose"). This module
reads the model's fitted preprocessing -- a ``ColumnTransformer`` (its ``transformers_`` and
``output_indices_``), ``OneHotEncoder``, ``OrdinalEncoder``, the scalers, ``SimpleImputer``,
``FunctionTransformer`` with an inverse, ``passthrough`` and ``drop``, alone or in
sub-pipelines -- and builds a :class:`RawMap`:

* ``groups()``: ``{raw column: [encoded columns]}`` for every raw column the model reads
  (``groups="auto"`` of :func:`otstab.feature_stability`, raw names in ``features=``);
* ``to_raw(Z, X_raw)``: encoded points mapped back to raw units. Scalers are inverted exactly;
  a one-hot block becomes the category whose indicator is largest after the move (the category
  it moved towards; the fractional indicator values are reported next to it, since a moved
  point generally is not a one-hot vector); an ordinal code is rounded to the nearest category;
  columns the model drops, and columns whose block did not move, keep their original values.

For a model without preprocessing, columns named ``"variable: level"`` (the bundled data sets)
form one categorical variable each (:func:`otstab.datasets.feature_groups`); every other column
is its own raw variable. Preprocessing this module cannot invert (PCA, feature selection,
polynomial features...) gives ``raw_map(...) is None``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ValidationError

__all__ = ["RawVariable", "RawMap", "raw_map", "RawView", "raw_view", "expand_features",
           "auto_groups", "raw_column_names"]

#: transformers applied column by column whose inverse is ``inverse_transform`` (or identity)
ELEMENTWISE = {"StandardScaler", "MinMaxScaler", "MaxAbsScaler", "RobustScaler",
               "PowerTransformer", "QuantileTransformer", "FunctionTransformer"}
#: transformers whose inverse on observed (non-missing) values is the identity
IDENTITY = {"SimpleImputer"}

#: a fractional indicator below this is not listed
_SHOWN = 5e-4


@dataclass
class RawVariable:
    """One of the user's columns and what the model sees of it.

    ``kind``: ``"numeric"`` (elementwise steps, inverted exactly), ``"categorical"`` (a one-hot
    block), ``"ordinal"`` (an ordinal code), ``"dropped"`` (the model never reads it).
    ``columns``: indices of its encoded columns; ``levels``: the level of each one-hot column.
    """

    name: str
    kind: str
    columns: list = field(default_factory=list)
    levels: list | None = None


@dataclass
class _Leaf:
    """A transformer chain acting on some raw columns and producing some encoded columns."""

    steps: list
    inputs: list  # raw names
    outputs: list  # encoded column indices


class RawMap:
    """The raw variables of a model and the inverse of its preprocessing (see module doc)."""

    def __init__(self, raw_names, encoded_names, variables, leaves, post):
        self.raw_names = list(raw_names)
        self.encoded_names = list(encoded_names)
        self.variables = list(variables)
        self._leaves = leaves
        self._post = post  # elementwise steps applied after the ColumnTransformer

    def __repr__(self) -> str:
        kinds = pd.Series([v.kind for v in self.variables]).value_counts().to_dict()
        return f"RawMap({len(self.raw_names)} raw columns, {kinds})"

    def variable(self, name: str) -> RawVariable | None:
        return next((v for v in self.variables if v.name == name), None)

    def slopes(self, name: str) -> dict:
        """``{encoded column index: dz/dx}`` of raw variable ``name``: how far its encoded
        column moves per unit of the raw variable (scalers are linear column by column; a
        one-hot indicator and an ordinal code move 1 per unit of themselves). None for a
        column the preprocessing maps nonlinearly (PowerTransformer, QuantileTransformer, a
        FunctionTransformer with a function)."""
        var = self.variable(name)
        leaf = next(lf for lf in self._leaves if name in lf.inputs)
        assert var is not None  # a leaf's input is a variable
        k = leaf.inputs.index(name)
        inner = 1.0
        if var.kind == "numeric":
            for step in leaf.steps:
                inner = _times(inner, _slope(step, k))
        out = {}
        for j in var.columns:
            s = inner
            for step in self._post:
                s = _times(s, _slope(step, j))
            out[j] = s
        return out

    def groups(self) -> dict:
        """``{raw column: [encoded column names]}`` for every raw column the model reads."""
        return {v.name: [self.encoded_names[j] for j in v.columns]
                for v in self.variables if v.columns}

    def categories(self, name: str) -> list | None:
        """The fitted categories of raw variable ``name`` in its encoder's order (the
        ``categories_`` of the one-hot or ordinal encoder ending its chain, missing values
        included as the encoder has them), or None when its chain ends in no such encoder."""
        leaf = self._leaf(name)
        if leaf is None or not leaf.steps:
            return None
        cats = getattr(leaf.steps[-1], "categories_", None)
        return None if cats is None else list(cats[leaf.inputs.index(name)])

    def step_names(self, name: str) -> list:
        """The class names of the steps that act on raw variable ``name``, in order: its own
        chain inside the ColumnTransformer, then the elementwise steps after it."""
        leaf = self._leaf(name)
        steps = list(leaf.steps if leaf is not None else []) + list(self._post)
        return [_name(s) for s in steps]

    def _leaf(self, name: str):
        return next((lf for lf in self._leaves if name in lf.inputs), None)

    def to_raw(self, Z, X_raw: pd.DataFrame, moved=None) -> tuple[pd.DataFrame, dict]:
        """Encoded rows ``Z`` (n x d) mapped back to the raw columns.

        Parameters
        ----------
        Z : array (n, d)
            Points in the final estimator's input space.
        X_raw : DataFrame (n, raw columns)
            The raw rows ``Z`` came from; kept where a variable did not move and for dropped
            columns.
        moved : array (n, d) of bool, optional
            Which encoded entries moved (default: all may have).

        Returns
        -------
        (DataFrame, dict)
            The raw rows; ``{categorical variable: [indicator text per row]}`` listing the
            fractional one-hot values of the rows where that block moved ("" elsewhere).
        """
        Z = np.asarray(Z, dtype=np.float64)
        for step in reversed(self._post):
            if _name(step) not in IDENTITY:
                Z = np.asarray(step.inverse_transform(Z), dtype=np.float64)
        out = X_raw.reset_index(drop=True).copy()
        indicators = {}
        for leaf in self._leaves:
            values, texts = _invert_leaf(leaf, Z[:, leaf.outputs])
            for k, name in enumerate(leaf.inputs):
                var = self.variable(name)
                assert var is not None  # a leaf's input is a variable
                rows = np.ones(len(out), dtype=bool) if moved is None else \
                    np.asarray(moved)[:, var.columns].any(axis=1)
                if not rows.any():
                    continue
                col = out[name].astype(object) if var.kind != "numeric" else \
                    out[name].astype(np.float64)
                col[rows] = values[rows, k]
                out[name] = col
                if name in texts:
                    # numpy's stubs type .any(axis=1) as a scalar: rows is an array here
                    indicators[name] = [t if m else "" for t, m in
                                        zip(texts[name], rows)]  # type: ignore[arg-type]
        return out, indicators


def _times(a, b):
    return None if a is None or b is None else a * b


def _slope(step, k: int):
    """``dz/dx`` of an elementwise step on its column ``k`` (a constant for the affine
    scalers), or None when the step is not affine."""
    name = _name(step)
    if name in IDENTITY or (name == "FunctionTransformer" and step.func is None):
        return 1.0
    scale: Any = getattr(step, "scale_", None)
    if name == "MinMaxScaler":
        return float(scale[k])
    if name in ("StandardScaler", "MaxAbsScaler", "RobustScaler"):
        return 1.0 if scale is None else 1.0 / float(scale[k])
    return None


def _name(step) -> str:
    return "OneHotEncoder" if isinstance(step, _NamedOneHot) else type(step).__name__


def _steps(trans) -> list:
    """A transformer as a list of steps (a Pipeline's steps, 'passthrough' as [])."""
    if trans is None or (isinstance(trans, str) and trans == "passthrough"):
        return []
    if hasattr(trans, "steps"):
        return [s for _, s in trans.steps if not (s is None or s == "passthrough")]
    return [trans]


def _invertible(step) -> bool:
    """An elementwise step with an exact inverse (identity for imputers on observed values)."""
    name = _name(step)
    if name in IDENTITY:
        return not getattr(step, "add_indicator", False)
    if name == "FunctionTransformer":
        return step.func is None or step.inverse_func is not None
    return name in ELEMENTWISE


def _encoder(steps):
    """A chain's kind: 'numeric', 'categorical' or 'ordinal'; None if not invertible."""
    if not steps:
        return "numeric"
    *head, last = steps
    kind = {"OneHotEncoder": "categorical", "OrdinalEncoder": "ordinal"}.get(_name(last))
    if kind is not None:
        return kind if all(_name(s) in IDENTITY and _invertible(s) for s in head) else None
    return "numeric" if all(_invertible(s) for s in steps) else None


def _onehot_widths(enc) -> list[int]:
    widths = getattr(enc, "_n_features_outs", None)
    if widths is not None:
        return [int(w) for w in widths]
    drop = getattr(enc, "drop_idx_", None)
    return [len(c) - (0 if drop is None or drop[i] is None else 1)
            for i, c in enumerate(enc.categories_)]


def _onehot_fill(enc, widths, blocks):
    """A valid one-hot matrix: ``blocks[i]`` (n,) = chosen column of feature i (-1: dropped)."""
    n = len(blocks[0])
    O = np.zeros((n, sum(widths)))
    start = 0
    for w, b in zip(widths, blocks):
        rows = np.flatnonzero(b >= 0)
        O[rows, start + b[rows]] = 1.0
        start += w
    return enc.inverse_transform(O)


def _levels(enc) -> list[list]:
    """The level of every one-hot output column, per input feature."""
    widths = _onehot_widths(enc)
    out: list = []
    for i, w in enumerate(widths):
        if w == 0:
            out.append([])
            continue
        blocks = [np.zeros(w, dtype=int) if widths[k] else np.full(w, -1)
                  for k in range(len(widths))]
        blocks[i] = np.arange(w)
        out.append(list(_onehot_fill(enc, widths, blocks)[:, i]))
    return out


def _indicator_text(row, levels, top=4) -> str:
    """The largest fractional one-hot values of a moved row, e.g. "car (new): 0.62, ..."."""
    pairs = sorted(((float(v), lv) for v, lv in zip(row, levels) if abs(v) >= _SHOWN),
                   key=lambda t: -t[0])
    text = ", ".join(f"{lv}: {v:.3g}" for v, lv in pairs[:top])
    return text + (f" (+{len(pairs) - top} more)" if len(pairs) > top else "")


def _dropped_level(enc, i):
    drop = getattr(enc, "drop_idx_", None)
    if drop is None or drop[i] is None:
        return None
    return enc.categories_[i][int(drop[i])]


def _invert_leaf(leaf: _Leaf, B: np.ndarray):
    """(values (n x inputs, object or float), {input: indicator texts}) of one leaf."""
    kind = _encoder(leaf.steps)
    steps = leaf.steps
    texts = {}
    if kind == "categorical":
        enc = steps[-1]
        widths = _onehot_widths(enc)
        levels = _levels(enc)
        chosen, start = [], 0
        for i, w in enumerate(widths):
            block = B[:, start:start + w]
            start += w
            pick = np.argmax(block, axis=1) if w else np.zeros(len(B), dtype=int)
            if _dropped_level(enc, i) is not None:  # the dropped level's implied indicator
                rest = 1.0 - block.sum(axis=1)
                pick = np.where(rest > block.max(axis=1, initial=-np.inf), -1, pick)
            chosen.append(pick)
            texts[leaf.inputs[i]] = [_indicator_text(row, levels[i]) for row in block]
        return np.asarray(_onehot_fill(enc, widths, chosen), dtype=object), texts
    if kind == "ordinal":
        enc = steps[-1]
        codes = B
        vals = np.empty(B.shape, dtype=object)
        for i, cats in enumerate(enc.categories_):
            k = np.clip(np.rint(codes[:, i]), 0, len(cats) - 1).astype(int)
            vals[:, i] = np.asarray(cats, dtype=object)[k]
            texts[leaf.inputs[i]] = [f"code {v:.3g}" for v in codes[:, i]]
        return vals, texts
    V = B
    for s in reversed(steps):
        if _name(s) in IDENTITY:
            continue
        V = np.asarray(s.inverse_transform(V), dtype=np.float64)
    return V, texts


def _ct_leaves(ct, raw_names):
    """Leaves of a fitted ColumnTransformer (its outputs numbered within the transformer)."""
    leaves, dropped = [], []
    idx_map = getattr(ct, "_transformer_to_input_indices", None) or {}
    for name, trans, cols in ct.transformers_:
        idx = idx_map.get(name)
        if idx is None:
            idx = _resolve_columns(cols, raw_names)
        inputs = [raw_names[int(i)] for i in idx]
        if not inputs:
            continue
        if isinstance(trans, str) and trans == "drop":
            dropped += inputs
            continue
        sl = ct.output_indices_.get(name, slice(0, 0))
        leaves.append(_Leaf(_steps(trans), inputs, list(range(sl.start, sl.stop))))
    return leaves, dropped


def _resolve_columns(cols, raw_names):
    if isinstance(cols, slice):
        return list(range(len(raw_names)))[cols]
    arr = np.atleast_1d(np.asarray(cols, dtype=object))
    if arr.dtype == bool or all(isinstance(c, (bool, np.bool_)) for c in arr):
        return [i for i, b in enumerate(arr) if b]
    pos = {n: i for i, n in enumerate(raw_names)}
    return [pos[str(c)] if not isinstance(c, (int, np.integer)) else int(c) for c in arr]


def _leaf_variables(leaf: _Leaf):
    """RawVariables of one leaf, or None when it cannot be inverted."""
    kind = _encoder(leaf.steps)
    if kind is None:
        return None
    if kind == "categorical":
        enc = leaf.steps[-1]
        widths = _onehot_widths(enc)
        if len(widths) != len(leaf.inputs) or sum(widths) != len(leaf.outputs):
            return None
        out, start = [], 0
        for name, w, lv in zip(leaf.inputs, widths, _levels(enc)):
            out.append(RawVariable(name, "categorical", leaf.outputs[start:start + w], lv))
            start += w
        return out
    if len(leaf.inputs) != len(leaf.outputs):
        return None
    return [RawVariable(name, kind, [j]) for name, j in zip(leaf.inputs, leaf.outputs)]


def raw_column_names(model, d=None) -> list | None:
    """The raw columns ``model`` was fitted on (``feature_names_in_``; ``x0, x1, ...`` for a
    model fitted on an array of ``n_features_in_`` (else ``d``) columns), or None when neither
    is known."""
    names = getattr(model, "feature_names_in_", None)
    if names is not None:
        return [str(c) for c in names]
    n = getattr(model, "n_features_in_", d)
    return None if n is None else [f"x{j}" for j in range(int(n))]


def raw_map(model, encoded_names) -> RawMap | None:
    """The :class:`RawMap` of ``model`` (see the module doc), or None when its preprocessing
    cannot be inverted column by column.

    Parameters
    ----------
    model : fitted estimator or Pipeline
    encoded_names : list of str
        The final estimator's input columns (``StabilityResult.feature_names``).
    """
    encoded_names = [str(c) for c in encoded_names]
    steps = getattr(model, "steps", None)
    if not steps or len(steps) < 2:
        return _name_map(encoded_names)
    pre = [s for _, s in steps[:-1] if not (s is None or s == "passthrough")]
    raw_names = raw_column_names(model, None)
    if raw_names is None:
        return None
    # [identity steps] [ColumnTransformer [elementwise steps]] or one chain on all columns
    k = 0
    while k < len(pre) and _name(pre[k]) in IDENTITY and _invertible(pre[k]):
        k += 1
    rest = pre[k:]
    if rest and _name(rest[0]) == "ColumnTransformer":
        leaves, dropped = _ct_leaves(rest[0], raw_names)
        post = rest[1:]
        if not all(_invertible(s) for s in post):
            return None
    else:
        leaves = [_Leaf(rest, raw_names, list(range(len(encoded_names))))]
        dropped, post = [], []
    variables = {}
    for leaf in leaves:
        vs = _leaf_variables(leaf)
        if vs is None:
            return None
        for v in vs:
            if v.name in variables:  # a column used by two transformers: not invertible
                return None
            variables[v.name] = v
    if sorted(j for v in variables.values() for j in v.columns) != list(
            range(len(encoded_names))):
        return None
    for name in dropped:
        variables.setdefault(name, RawVariable(name, "dropped"))
    for name in raw_names:  # remainder="drop" leaves no transformer entry in old versions
        variables.setdefault(name, RawVariable(name, "dropped"))
    ordered = [variables[n] for n in raw_names]
    return RawMap(raw_names, encoded_names, ordered, leaves, post)


def _name_map(names) -> RawMap:
    """Raw variables of a model without preprocessing: "variable: level" one-hot blocks."""
    from ..datasets import feature_groups  # noqa: PLC0415 - datasets is optional data

    groups = feature_groups(list(names))
    pos = {n: j for j, n in enumerate(names)}
    owner = {c: g for g, cols in groups.items() for c in cols}
    variables, seen = [], set()
    for n in names:
        g = owner.get(n)
        if g is None:
            variables.append(RawVariable(n, "numeric", [pos[n]]))
        elif g not in seen:
            seen.add(g)
            cols = groups[g]
            variables.append(RawVariable(g, "categorical", [pos[c] for c in cols],
                                         [c[len(g) + 2:] for c in cols]))
    leaves = [_NameLeaf(v) for v in variables]
    return RawMap([v.name for v in variables], names, variables, leaves, [])


class _NameLeaf(_Leaf):
    """A block of a model without preprocessing (numeric identity or a named one-hot block)."""

    def __init__(self, var: RawVariable):
        super().__init__([] if var.kind == "numeric" else [_NamedOneHot(var.levels)],
                         [var.name], var.columns)


class _NamedOneHot:
    """Stands in for a OneHotEncoder over columns named "variable: level"."""

    def __init__(self, levels):
        self.categories_ = [np.asarray(levels, dtype=object)]
        self.drop_idx_ = None
        self._n_features_outs = [len(levels)]

    def inverse_transform(self, O):
        return np.asarray(self.categories_[0], dtype=object)[np.argmax(O, axis=1)][:, None]


class RawView:
    """A result's raw rows and the :class:`RawMap` to map its points back (set by certify)."""

    def __init__(self, rmap: RawMap, X_raw: pd.DataFrame):
        self.map = rmap
        self.X_raw = X_raw

    def frame(self, result) -> pd.DataFrame:
        """``result.to_frame(raw=True)``: one row per atom in raw units."""
        src = np.asarray(result.source)
        X0 = np.asarray(result.X)[src]
        Xs = np.asarray(result.X_star)
        moved = Xs != X0
        raw0 = self.X_raw.iloc[src].reset_index(drop=True)
        raw1, texts = self.map.to_raw(Xs, raw0, moved)
        data = {"source": src, "mass": np.asarray(result.mass)}
        if result.index is not None:
            data["index"] = np.asarray(result.index)[src]
        for nm in self.map.raw_names:
            data[nm] = raw0[nm].to_numpy()
        for nm in self.map.raw_names:
            data[f"{nm}*"] = raw1[nm].to_numpy()
        for nm, t in texts.items():
            data[f"{nm}* indicators"] = t
        data["weight"] = np.asarray(result.weights)
        data["loss"] = np.asarray(result.loss_base)[src]
        data["loss*"] = np.asarray(result.loss_star)
        data["distance2"] = np.sum((Xs - X0) ** 2, axis=1)
        df = pd.DataFrame(data)
        df.attrs["note"] = (
            "raw units: moved points mapped back through the model's preprocessing (scalers "
            "inverted exactly; a moved one-hot block shown as the category with the largest "
            "indicator after the move, its fractional indicator values in '<variable>* "
            "indicators'; unmoved values and columns the model drops unchanged). distance2 is "
            "in the model's preprocessed space, where the cost is measured.")
        return df


def raw_view(model, X, encoded_names) -> RawView | None:
    """A :class:`RawView` of ``X`` for ``model`` (a copy of the raw rows is kept), or None."""
    rmap = raw_map(model, encoded_names)
    if rmap is None:
        return None
    if not getattr(model, "steps", None):  # no preprocessing: X holds the encoded columns
        Z = np.asarray(X, dtype=np.float64)
        blank = pd.DataFrame({nm: np.full(len(Z), np.nan, dtype=object)
                              for nm in rmap.raw_names})
        return RawView(rmap, rmap.to_raw(Z, blank)[0])
    if isinstance(X, pd.DataFrame):
        cols = [str(c) for c in X.columns]
        if set(rmap.raw_names) <= set(cols):
            frame = X.copy()
            frame.columns = cols
            frame = frame[rmap.raw_names]
        elif X.shape[1] == len(rmap.raw_names):
            frame = pd.DataFrame(X.to_numpy(copy=True), columns=rmap.raw_names)
        else:
            return None
    else:
        arr = np.array(X, copy=True)
        if arr.ndim != 2 or arr.shape[1] != len(rmap.raw_names):
            return None
        frame = pd.DataFrame(arr, columns=rmap.raw_names)
    return RawView(rmap, frame.reset_index(drop=True))


def suggest(name, candidates, n=3) -> str:
    """``"; did you mean 'a', 'b'?"`` for a misspelt or un-prefixed column name, or ""."""
    name = str(name)
    cands = list(dict.fromkeys(str(c) for c in candidates))
    hits = [c for c in cands if c.endswith("__" + name) or c.startswith(name + "_")]
    hits += [c for c in difflib.get_close_matches(name, cands, n=n, cutoff=0.6)
             if c not in hits]
    if not hits:
        return ""
    shown = ", ".join(repr(c) for c in hits[:n])
    more = f" (and {len(hits) - n} more)" if len(hits) > n else ""
    return f"; did you mean {shown}{more}?"


def expand_features(model, features, encoded_names):
    """``features`` with every raw column name replaced by its encoded columns.

    Encoded names and indices pass through; an unknown name raises
    :class:`~otstab.errors.ValidationError` with the closest names as suggestions.
    """
    if features is None:
        return None
    items = np.atleast_1d(np.asarray(features, dtype=object)).tolist()
    names = [str(c) for c in encoded_names]
    known = set(names)
    rmap = None
    out = []
    for f in items:
        if isinstance(f, (bool, np.bool_, int, np.integer)) or str(f) in known:
            out.append(f)
            continue
        if rmap is None:
            rmap = raw_map(model, names) or RawMap([], names, [], [], [])
        var = rmap.variable(str(f))
        if var is not None and var.columns:
            out += [names[j] for j in var.columns]
            continue
        if var is not None:
            raise ValidationError(f"features: {f!r} is a column the model drops (its "
                                  "preprocessing never reads it), so it cannot move")
        raise ValidationError(f"features: unknown feature {f!r}"
                              + suggest(f, [*rmap.raw_names, *names]))
    return out


def auto_groups(model, encoded_names) -> dict | None:
    """``{raw column: [encoded columns]}`` from the model's preprocessing (None if unknown).

    Every raw column the model reads is one group, named exactly as the user's column, with
    one-hot blocks as one variable; a column that is its own encoding is a one-column group.
    """
    rmap = raw_map(model, encoded_names)
    return None if rmap is None else rmap.groups()
