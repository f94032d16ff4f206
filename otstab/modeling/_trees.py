"""Leaf layouts of XGBoost and LightGBM classifiers, read from their own dumps.

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
  that band. Tree ``i`` adds to class ``i mod num_tree_per_iteration``.
  Categorical splits, linear trees, averaged (random-forest) output and a missing-value rule
  for zeros that routes zero against its threshold are refused.

Missing values (NaN) are routed by the libraries' default directions; the certified bounds
perturb finite inputs only, so that routing is not needed here. Before any use the layout is
checked against the model's own raw margins (``output_margin=True`` / ``raw_score=True``) on
the evaluation rows and on inputs placed on both sides of every split threshold; a layout that
disagrees is refused (:class:`~otstab.errors.InputTypeError`), never guessed. CatBoost is
recognised by its class name and refused with a clear message (its oblivious trees are not
read yet).
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import InputTypeError

__all__ = ["library", "external_layout", "raw_margins", "compares_float32"]


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
    if lib == "xgboost":
        return True
    return not hasattr(model, "_predictors")


def raw_margins(model, X) -> np.ndarray:
    """The model's own raw scores, shape (n, K) (binary: the columns 0 and the margin)."""
    lib = library(model)
    if lib == "xgboost":
        out = np.asarray(model.predict(X, output_margin=True), dtype=np.float64)
    elif lib == "lightgbm":
        out = np.asarray(model.predict(X, raw_score=True), dtype=np.float64)
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
            if "categories" in node or "split_condition" not in node:
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
            if node.get("decision_type", "<=") != "<=":
                raise InputTypeError("LightGBM categorical splits are not supported by the "
                                     "certified tree bounds")
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


def external_layout(model, d: int):
    """Leaf boxes of an XGBoost or LightGBM classifier: ``(trees, K, f32)`` with ``trees`` a
    list of ``(lo list, hi list, leaf values, class column)`` per tree, ``K`` the number of
    score columns (2 for binary: column 1 holds the margin) and ``f32`` whether the boxes are
    on ``float32(x)``. Raises :class:`~otstab.errors.InputTypeError` for what it cannot read."""
    lib = library(model)
    if lib == "catboost":
        raise InputTypeError("CatBoost models are not supported by the certified tree bounds "
                             "(oblivious trees are not read yet); the value is an upper bound "
                             "only")
    classes = getattr(model, "classes_", None)
    if classes is None:
        raise InputTypeError(f"{type(model).__name__} is not a fitted classifier (no classes_)")
    K = len(classes)
    if lib == "xgboost":
        trees, f32 = _xgb_trees(model, d), True
    elif lib == "lightgbm":
        trees, f32 = _lgb_trees(model, d), False
    else:
        raise InputTypeError(f"{type(model).__name__} is not an XGBoost or LightGBM model")
    out = []
    for los, his, vals, cls in trees:
        col = cls + 1 if K == 2 else cls
        if not 0 <= col < K:
            raise InputTypeError(f"{lib}: a tree adds to class {cls} of {K}")
        V = np.zeros((len(vals), K))
        V[:, col] = vals
        out.append((los, his, list(V), col))
    return out, K, f32


def threshold_probes(lo, hi, f32: bool, X_row, limit=200):
    """Inputs on both sides of every finite threshold (``limit`` per feature), placed in a copy
    of ``X_row``: the rows on which a layout is checked against the model."""
    from ._perturbation import f32_first_input, f32_last_input  # noqa: PLC0415

    rows = []
    d = X_row.size
    for j in range(d):
        T = np.unique(np.r_[lo[:, j], hi[:, j]])
        T = T[np.isfinite(T)]
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
