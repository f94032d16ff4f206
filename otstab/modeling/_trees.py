"""Leaf layouts of XGBoost, LightGBM and CatBoost classifiers, read from their own dumps.

A gradient-boosted tree ensemble's raw margin is ``base + sum over trees of the value of the
leaf holding x``; each leaf is a box of the input space. This module reads those boxes from
the libraries' documented dumps, in the convention of :class:`otstab.bounds.LeafTable`
(``lo < c(x) <= hi`` per feature, with ``c`` the value the trees compare):

* **XGBoost** (``XGBClassifier``, ``get_booster().get_dump(dump_format="json")``): a node sends
  x to ``yes`` when ``float32(x) < split_condition`` (float32). On float32 values that is
  ``float32(x) <= t`` with ``t`` the float32 value just below the split condition, so the
  boxes use ``c = float32`` like scikit-learn's trees. The class of each tree comes from the
  model JSON's ``tree_info``. Only the ``gbtree`` booster with numerical splits is read.
* **LightGBM** (``LGBMClassifier``, ``booster_.dump_model()``): a node sends x left when
  ``x <= threshold`` in float64, except that inputs with ``|x| <= 1e-35`` (its
  ``kZeroThreshold``) are read as 0: a threshold in ``[-1e-35, 1e-35)`` becomes the edge of
  that band. Tree ``i`` adds to class ``i mod num_tree_per_iteration``. A categorical split
  (``decision_type "=="``, categories ``"c1||c2"``) sends x left when ``int(x)`` (truncated;
  negative goes right) is in the set: the left child gets one box per run of consecutive
  categories (``c <= x < c + 1``; ``-1 < x < 1`` for category 0), the right child one per gap
  between them, so a leaf may be several disjoint boxes of its tree. Linear trees, averaged
  (random-forest) output and a missing-value rule for zeros that routes zero against its
  threshold (or applies to a categorical split) are refused.
* **CatBoost** (``CatBoostClassifier``, binary and multiclass; ``save_model(path,
  format="json")``): oblivious trees, one float32 border per level; level ``k`` sets bit ``k``
  of the leaf index when ``float32(x) > border``, so the leaves are boxes on ``c = float32``
  with the borders themselves as edges (a leaf whose levels contradict each other is empty and
  dropped). A leaf holds one value per score column (one for binary, ``K`` for multiclass),
  multiplied by the model's ``scale``; its ``bias`` is the base, found by the margin check.
  Categorical features (one-hot splits, CTRs), text and embedding features and non-symmetric
  trees (``grow_policy`` ``"Depthwise"``/``"Lossguide"``) are refused.

Missing values (NaN): the certified bounds perturb finite inputs only (NaN rows are refused by
the validation), so the boxes hold finite values. CatBoost routes NaN per feature
(``nan_mode``: ``"Min"``, the default, sends NaN left at every border, ``"Max"`` right), which
:func:`fill_missing` reproduces by a value at most every border or above it (checked against
the model's own margins in the tests); XGBoost's and LightGBM's per-node default
directions are not reproduced. Before any use the layout is checked against the model's own
raw margins (``output_margin=True`` / ``raw_score=True`` / ``prediction_type="RawFormulaVal"``)
on the evaluation rows and on inputs placed on both sides of every split threshold; a layout
that disagrees is refused (:class:`~otstab.errors.InputTypeError`), never guessed.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from ..errors import InputTypeError

__all__ = ["library", "external_layout", "raw_margins", "compares_float32", "fill_missing"]


def library(model) -> str | None:
    """``"xgboost"``, ``"lightgbm"`` or ``"catboost"`` for those libraries' models, else None."""
    mod = type(model).__module__.split(".")[0]
    name = type(model).__name__
    if mod == "xgboost" or name.startswith("XGB"):
        return "xgboost"
    if mod == "lightgbm" or name.startswith("LGBM"):
        return "lightgbm"
    if mod == "catboost" or name.startswith("CatBoost"):
        return "catboost"
    return None


def compares_float32(model) -> bool:
    """Whether the trees compare ``float32(x)`` (scikit-learn's trees, XGBoost) rather than x
    in float64 (histogram gradient boosting, LightGBM)."""
    lib = library(model)
    if lib == "lightgbm":
        return False
    if lib in ("xgboost", "catboost"):
        return True
    return not hasattr(model, "_predictors")


def raw_margins(model, X) -> np.ndarray:
    """The model's own raw scores, shape (n, K) (binary: the columns 0 and the margin)."""
    lib = library(model)
    if lib == "xgboost":
        out = np.asarray(model.predict(X, output_margin=True), dtype=np.float64)
    elif lib == "lightgbm":
        out = np.asarray(model.predict(X, raw_score=True), dtype=np.float64)
    elif lib == "catboost":
        out = np.asarray(model.predict(X, prediction_type="RawFormulaVal"), dtype=np.float64)
    else:  # pragma: no cover - callers check the library first
        raise InputTypeError(f"no raw margins for {type(model).__name__}")
    if out.ndim == 1:
        out = np.column_stack([np.zeros(out.size), out])
    return out


def _f32_below(s: float) -> float:
    """The float32 value just below the float32 value of ``s``."""
    return float(np.nextafter(np.float32(s), np.float32(-np.inf)))


def _xgb_trees(model, d: int):
    booster = model.get_booster()
    raw = json.loads(booster.save_raw("json"))
    gb = raw["learner"]["gradient_booster"]
    if gb.get("name") != "gbtree":
        raise InputTypeError(f"XGBoost booster {gb.get('name')!r}: only 'gbtree' is read by the "
                             "certified tree bounds")
    tree_class = [int(c) for c in gb["model"]["tree_info"]]
    names = booster.feature_names
    fmap = {str(n): j for j, n in enumerate(names)} if names else {}
    dumps = booster.get_dump(dump_format="json")
    if len(dumps) != len(tree_class):
        raise InputTypeError("XGBoost dump and tree_info disagree")

    def feature(name):
        if name in fmap:
            return fmap[name]
        if name.startswith("f") and name[1:].isdigit():
            return int(name[1:])
        raise InputTypeError(f"XGBoost split on unknown feature {name!r}")

    trees = []
    for js, cls in zip(dumps, tree_class):
        root = json.loads(js)
        los, his, vals = [], [], []
        stack = [(root, np.full(d, -np.inf), np.full(d, np.inf))]
        while stack:
            node, lo, hi = stack.pop()
            if "leaf" in node:
                los.append(lo)
                his.append(hi)
                vals.append(float(node["leaf"]))
                continue
            # categorical: "categories", or (XGBoost >= 3) a list of categories as condition
            if "categories" in node or not isinstance(node.get("split_condition"),
                                                      (int, float)):
                raise InputTypeError("XGBoost categorical splits are not supported by the "
                                     "certified tree bounds")
            j = feature(str(node["split"]))
            if not 0 <= j < d:
                raise InputTypeError(f"XGBoost split on feature {j}, the data has {d}")
            t = _f32_below(float(node["split_condition"]))
            kids = {int(c["nodeid"]): c for c in node["children"]}
            yes, no = kids[int(node["yes"])], kids[int(node["no"])]
            hl, lr = hi.copy(), lo.copy()
            hl[j] = min(hl[j], t)
            lr[j] = max(lr[j], t)
            stack.append((yes, lo, hl))
            stack.append((no, lr, hi))
        trees.append((los, his, vals, cls))
    return trees


#: LightGBM reads inputs with ``|x| <= kZeroThreshold`` (the float32 value of 1e-35) as 0
LGB_ZERO = float(np.float32(1e-35))


def _lgb_x_threshold(t: float) -> float:
    """The threshold on x of LightGBM's ``c(x) <= t``, where ``c(x) = 0`` for
    ``|x| <= kZeroThreshold`` (its dense-row reader drops those values) and ``x`` otherwise."""
    if 0.0 <= t < LGB_ZERO:
        return LGB_ZERO
    if -LGB_ZERO <= t < 0.0:
        return float(np.nextafter(-LGB_ZERO, -np.inf))
    return t


def _lgb_category_intervals(threshold: str, missing_type) -> list[tuple[float, float]]:
    """The inputs a LightGBM categorical split sends left, as float64 intervals ``(a, b]``.

    LightGBM reads the category as ``int(x)`` (truncation toward 0; a negative one, NaN
    aside, goes right) and sends x left when it is in the set ``"c1||c2||..."``. Category
    ``c >= 1`` is ``c <= x < c + 1``, i.e. ``(prev(c), prev(c + 1)]`` in float64; category 0
    is ``-1 < x < 1``; runs of consecutive categories merge."""
    if missing_type == "Zero":
        raise InputTypeError("LightGBM categorical split with zeros as missing: not supported "
                             "by the certified tree bounds")
    try:
        cats = sorted({int(c) for c in threshold.split("||")})
    except ValueError as exc:
        raise InputTypeError(f"LightGBM categorical split {threshold!r} not read") from exc
    if not cats or cats[0] < 0 or cats[-1] >= 2 ** 31 - 1:
        raise InputTypeError(f"LightGBM categorical split {threshold!r} not read")
    runs: list[list[int]] = []
    for c in cats:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return [(-1.0 if a == 0 else float(np.nextafter(float(a), -np.inf)),
             float(np.nextafter(float(b + 1), -np.inf))) for a, b in runs]


def _complement(parts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals ``(a, b]`` covering the real line outside the sorted disjoint ``parts``."""
    out, start = [], -np.inf
    for a, b in parts:
        if a > start:
            out.append((start, a))
        start = b
    out.append((start, np.inf))
    return out


def _lgb_trees(model, d: int):
    dump = model.booster_.dump_model()
    if dump.get("average_output"):
        raise InputTypeError("LightGBM random-forest mode (averaged output) is not supported by "
                             "the certified tree bounds")
    per = int(dump["num_tree_per_iteration"])
    trees = []
    for i, info in enumerate(dump["tree_info"]):
        los, his, vals = [], [], []
        stack = [(info["tree_structure"], np.full(d, -np.inf), np.full(d, np.inf))]
        while stack:
            node, lo, hi = stack.pop()
            if "leaf_value" in node:
                if "leaf_coeff" in node or "leaf_features" in node:
                    raise InputTypeError("LightGBM linear trees are not supported by the "
                                         "certified tree bounds")
                los.append(lo)
                his.append(hi)
                vals.append(float(node["leaf_value"]))
                continue
            if node.get("decision_type", "<=") == "==":  # categorical: a union of intervals
                j = int(node["split_feature"])
                if not 0 <= j < d:
                    raise InputTypeError(f"LightGBM split on feature {j}, the data has {d}")
                left = _lgb_category_intervals(str(node["threshold"]),
                                               node.get("missing_type"))
                for child, parts in ((node["left_child"], left),
                                     (node["right_child"], _complement(left))):
                    for a, b in parts:
                        a, b = max(lo[j], a), min(hi[j], b)
                        if a < b:
                            cl, ch = lo.copy(), hi.copy()
                            cl[j], ch[j] = a, b
                            stack.append((child, cl, ch))
                continue
            if node.get("decision_type", "<=") != "<=":
                raise InputTypeError(f"LightGBM split type {node.get('decision_type')!r} is "
                                     "not supported by the certified tree bounds")
            j = int(node["split_feature"])
            t = _lgb_x_threshold(float(node["threshold"]))
            if not 0 <= j < d:
                raise InputTypeError(f"LightGBM split on feature {j}, the data has {d}")
            if node.get("missing_type") == "Zero" and bool(node.get("default_left")) != (0 <= t):
                raise InputTypeError("LightGBM treats zeros as missing and routes them against "
                                     "the threshold at a split: not supported by the certified "
                                     "tree bounds")
            hl, lr = hi.copy(), lo.copy()
            hl[j] = min(hl[j], t)
            lr[j] = max(lr[j], t)
            stack.append((node["left_child"], lo, hl))
            stack.append((node["right_child"], lr, hi))
        trees.append((los, his, vals, i % per))
    return trees


def catboost_json(model) -> dict:
    """The model's own JSON export (``save_model(path, format="json")``, in a temporary
    directory that is removed afterwards)."""
    if not callable(getattr(model, "save_model", None)):
        raise InputTypeError(f"{type(model).__name__}: a CatBoost model without save_model; its "
                             "trees cannot be read by the certified tree bounds")
    with tempfile.TemporaryDirectory(prefix="otstab-catboost-") as tmp:
        path = os.path.join(tmp, "model.json")
        try:
            model.save_model(path, format="json")
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        except Exception as exc:  # noqa: BLE001 - an export this module cannot read
            raise InputTypeError(f"{type(model).__name__}: CatBoost's JSON export failed "
                                 f"({exc}); no certified lower bound") from exc


def _f32_atmost(b: float) -> float:
    """The largest float32 value ``<= b``: ``float32(x) <= b`` iff ``float32(x) <= this``."""
    t = np.float32(b)
    if float(t) > b:
        t = np.nextafter(t, np.float32(-np.inf))
    return float(t)


def _cb_refuse(what: str):
    raise InputTypeError(f"CatBoost {what} are not supported by the certified tree bounds; the "
                         "value is an upper bound only")


def _cb_trees(model, d: int, js: dict | None = None):
    """CatBoost's oblivious trees as ``(lo list, hi list, values (leaves, dim), None)`` per
    tree (``dim`` score columns: 1 for binary, K for multiclass) and the float feature map."""
    js = catboost_json(model) if js is None else js
    info = js.get("features_info", {})
    for key, what in (("categorical_features", "categorical features (one-hot and CTR splits)"),
                      ("text_features", "text features"),
                      ("embedding_features", "embedding features")):
        if info.get(key):
            _cb_refuse(what)
    if js.get("ctr_data"):
        _cb_refuse("CTR features")
    if "oblivious_trees" not in js:
        _cb_refuse("non-symmetric trees (grow_policy 'Depthwise' or 'Lossguide')")
    flat = {int(f["feature_index"]): int(f.get("flat_feature_index", f["feature_index"]))
            for f in info.get("float_features", [])}
    scale, bias = js["scale_and_bias"]
    dim = len(bias) if isinstance(bias, list) else 1
    scale = float(scale)
    trees = []
    for tree in js["oblivious_trees"]:
        levels = []
        for sp in tree.get("splits", []):
            if sp.get("split_type") != "FloatFeature":
                _cb_refuse(f"{sp.get('split_type')} splits")
            j = flat.get(int(sp["float_feature_index"]))
            if j is None or not 0 <= j < d:
                raise InputTypeError(f"CatBoost split on float feature "
                                     f"{sp['float_feature_index']}, the data has {d} features")
            levels.append((j, _f32_atmost(float(sp["border"]))))
        vals = np.asarray(tree["leaf_values"], dtype=np.float64)
        if vals.size != dim << len(levels):
            raise InputTypeError("CatBoost tree: leaf values and depth disagree")
        vals = scale * vals.reshape(1 << len(levels), dim)
        los, his, vs = [], [], []
        for leaf in range(1 << len(levels)):
            lo, hi = np.full(d, -np.inf), np.full(d, np.inf)
            for k, (j, t) in enumerate(levels):
                if (leaf >> k) & 1:  # float32(x) > border
                    lo[j] = max(lo[j], t)
                else:
                    hi[j] = min(hi[j], t)
            if np.any(lo >= hi):  # contradictory levels: no input reaches this leaf
                continue
            los.append(lo)
            his.append(hi)
            vs.append(vals[leaf])
        trees.append((los, his, vs, None))
    return trees, dim, js


def fill_missing(model, X) -> np.ndarray:
    """A copy of ``X`` with every NaN replaced by a finite value the model routes exactly as it
    routes NaN (CatBoost: ``nan_value_treatment`` ``AsTrue``, from ``nan_mode="Max"``, goes
    right at every border: the float32 value above its largest border, +inf when that border
    is the largest float32 (``nan_mode="Max"`` adds it); ``AsFalse``/``AsIs`` goes left: its
    smallest border itself, ``-FLT_MAX`` under ``nan_mode="Min"``). Only CatBoost routes NaN
    per feature; other models raise :class:`~otstab.errors.InputTypeError`."""
    if library(model) != "catboost":
        raise InputTypeError(f"fill_missing reads CatBoost's per-feature NaN routing; "
                             f"{type(model).__name__} routes NaN per node")
    X = np.array(X, dtype=np.float64)
    js = catboost_json(model)
    for f in js.get("features_info", {}).get("float_features", []):
        j = int(f.get("flat_feature_index", f["feature_index"]))
        if j >= X.shape[1]:
            continue
        b = np.asarray(f.get("borders") or [0.0], dtype=np.float32)
        if f.get("nan_value_treatment") == "AsTrue":  # above every border (+inf above FLT_MAX)
            with np.errstate(over="ignore"):
                v = np.nextafter(b.max(), np.float32(np.inf))
        else:  # the smallest border itself is not "> border": left at every border
            v = b.min()
        X[np.isnan(X[:, j]), j] = float(v)
    return X


def external_layout(model, d: int):
    """Leaf boxes of an XGBoost, LightGBM or CatBoost classifier: ``(trees, K, f32)`` with
    ``trees`` a list of ``(lo list, hi list, leaf values, class column)`` per tree (class column
    None when a tree adds to every column: CatBoost multiclass), ``K`` the number of score
    columns (2 for binary: column 1 holds the margin) and ``f32`` whether the boxes are on
    ``float32(x)``. Raises :class:`~otstab.errors.InputTypeError` for what it cannot read."""
    lib = library(model)
    classes = getattr(model, "classes_", None)
    if classes is None:
        raise InputTypeError(f"{type(model).__name__} is not a fitted classifier (no classes_)")
    K = len(classes)
    if lib == "xgboost":
        trees, f32 = _xgb_trees(model, d), True
    elif lib == "lightgbm":
        trees, f32 = _lgb_trees(model, d), False
    elif lib == "catboost":
        return _cb_layout(model, d, K)
    else:
        raise InputTypeError(f"{type(model).__name__} is not an XGBoost, LightGBM or CatBoost "
                             "model")
    out = []
    for los, his, vals, cls in trees:
        col = cls + 1 if K == 2 else cls
        if not 0 <= col < K:
            raise InputTypeError(f"{lib}: a tree adds to class {cls} of {K}")
        V = np.zeros((len(vals), K))
        V[:, col] = vals
        out.append((los, his, list(V), col))
    return out, K, f32


def _cb_layout(model, d: int, K: int):
    trees, dim, js = _cb_trees(model, d)
    names = js.get("model_info", {}).get("class_params", {}).get("class_names")
    classes = list(model.classes_)
    if names is not None and (len(names) != len(classes) or not all(
            a == b or str(a) == str(b) for a, b in zip(names, classes))):
        raise InputTypeError("CatBoost: the classes of the model's JSON export "
                             f"{names} are not its classes_ {classes}")
    if (K == 2 and dim != 1) or (K > 2 and dim != K):
        raise InputTypeError(f"CatBoost: {dim} score columns for {K} classes (a "
                             "multi-label or one-vs-all loss?) are not read")
    out = []
    for los, his, vals, _ in trees:
        V = np.zeros((len(vals), K))
        if K == 2:
            V[:, 1] = [v[0] for v in vals]
        elif vals:
            V[:] = np.asarray(vals)
        out.append((los, his, list(V), 1 if K == 2 else None))
    return out, K, True


def threshold_probes(lo, hi, f32: bool, X_row, limit=200):
    """Inputs on both sides of every finite threshold (``limit`` per feature), placed in a copy
    of ``X_row``: the rows on which a layout is checked against the model."""
    from ._perturbation import f32_first_input, f32_last_input  # noqa: PLC0415

    rows = []
    d = X_row.size
    for j in range(d):
        T = np.unique(np.r_[lo[:, j], hi[:, j]])
        T = T[np.isfinite(T)]
        if f32:  # CatBoost's NaN borders at +-FLT_MAX: no finite float32 lies beyond them
            T = T[np.abs(T) < float(np.finfo(np.float32).max)]
        if T.size > limit:
            T = T[np.linspace(0, T.size - 1, limit).astype(int)]
        if T.size == 0:
            continue
        sides = (f32_first_input(T), f32_last_input(T)) if f32 else (np.nextafter(T, np.inf), T)
        for v in sides:
            Z = np.repeat(X_row[None, :], v.size, axis=0)
            Z[:, j] = v
            rows.append(Z)
    return np.concatenate(rows) if rows else np.zeros((0, d))
