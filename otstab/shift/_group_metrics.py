"""Group metrics (SubpopBench, Yang et al., ICML 2023): per-group accuracy and the summary
metrics, optionally with stratified bootstrap confidence intervals. Formulas in
``docs/groups.md``."""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field
from numbers import Number
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from .._results import FrameResult
from .._validation import (
    as_one_dim,
    check_random_state,
    check_same_length,
    check_scalar,
    is_categorical,
    renamed_kwargs,
)
from ..errors import ValidationError

log = logging.getLogger(__name__)


#: Number of equal-width bins of the expected calibration error.
ECE_BINS = 10


_OVERALL = "overall"


_FRAME_COLUMNS = ("n", "share", "accuracy", "accuracy_lower", "accuracy_upper",
                  "cross_entropy", "brier", "ece")


def _labels_1d(v, name: str) -> np.ndarray:
    """A 1-D copy of a label vector (any hashable labels), rejecting missing values."""
    if v is None:
        raise ValidationError(f"{name} is required, got None")
    if isinstance(v, pd.DataFrame):
        if v.shape[1] != 1:
            raise ValidationError(
                f"{name} must be 1-D, got a DataFrame with {v.shape[1]} columns"
            )
        v = v.iloc[:, 0]
    if isinstance(v, (pd.Series, pd.Index, pd.Categorical)):
        arr = np.asarray(v, dtype=object).copy()
    elif isinstance(v, (str, bytes)) or np.ndim(v) == 0:
        raise ValidationError(f"{name} must be a 1-D array of labels, got a scalar {v!r}")
    else:
        try:
            arr = np.array(v, copy=True)
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"{name} must be a 1-D array of labels: {exc}") from exc
        if arr.dtype.kind in "USO" and arr.ndim == 1:
            # np.array([1, "a"]) silently turns 1 into "1": keep the caller's objects
            arr = np.empty(len(v), dtype=object)
            arr[:] = list(v)
    arr = as_one_dim(arr, name)
    missing = pd.isna(arr)
    if np.any(missing):
        i = int(np.argmax(missing))
        raise ValidationError(f"{name} contains a missing value (NaN/None) at index {i}")
    return arr


def _label_kind(x) -> str:
    """The family of a label: numbers (bool included) compare with numbers, text with text."""
    if isinstance(x, (Number, np.number, np.bool_)):
        return "number"
    if isinstance(x, (str, bytes)):
        return "text"
    return type(x).__name__


def _check_label_types(yt: np.ndarray, yp: np.ndarray) -> None:
    """Refuse y_true and y_pred whose labels are of disjoint kinds (e.g. "1" vs 1).

    No prediction could then be correct: the accuracy would be 0 because of an encoding
    mismatch, not because of the model.
    """
    kt = {_label_kind(v) for v in pd.unique(np.asarray(yt, dtype=object))}
    kp = {_label_kind(v) for v in pd.unique(np.asarray(yp, dtype=object))}
    if kt.isdisjoint(kp):
        raise ValidationError(
            f"y_true and y_pred hold labels of different types ({', '.join(sorted(kt))} vs "
            f"{', '.join(sorted(kp))}, e.g. {yt[0]!r} and {yp[0]!r}): no prediction can equal "
            "a true label; encode both the same way"
        )


def _sorted_levels(values) -> list:
    """Unique values, sorted when the values are comparable, else in order of appearance."""
    uniq = list(pd.unique(np.asarray(values, dtype=object)))
    try:
        return sorted(uniq)
    except TypeError:
        return uniq


def _encode(arr: np.ndarray, levels: list, name: str) -> np.ndarray:
    codes = pd.Index(levels, dtype=object).get_indexer(np.asarray(arr, dtype=object))
    if np.any(codes < 0):
        i = int(np.argmax(codes < 0))
        raise ValidationError(f"{name}[{i}] = {arr[i]!r} is not one of the labels {levels}")
    return codes.astype(np.intp)


def _levels_and_codes(v, name: str) -> tuple[list, np.ndarray]:
    """Levels (categorical levels kept even when unused) and integer codes of one column."""
    if is_categorical(v):
        cat = v if isinstance(v, pd.Categorical) else pd.Categorical(v)
        codes = np.asarray(cat.codes, dtype=np.intp).copy()
        if codes.size == 0:
            raise ValidationError(f"{name} is empty")
        if np.any(codes < 0):
            i = int(np.argmax(codes < 0))
            raise ValidationError(f"{name} contains a missing value (NaN/None) at index {i}")
        return list(cat.categories), codes
    arr = _labels_1d(v, name)
    levels = _sorted_levels(arr)
    return levels, _encode(arr, levels, name)


def _encode_groups(groups, n: int):
    """(codes, group index labels, attribute frame or None) of the ``groups`` argument."""
    if groups is None:
        raise ValidationError(
            "groups is required: a 1-D array of group labels or a DataFrame of attribute "
            "columns (e.g. pd.DataFrame({'y': y, 'a': a}) for SubpopBench groups)"
        )
    if isinstance(groups, pd.DataFrame) and groups.shape[1] == 1:
        groups = groups.iloc[:, 0]
    if not isinstance(groups, pd.DataFrame):
        levels, codes = _levels_and_codes(groups, "groups")
        check_same_length(y_true=np.empty(n), groups=codes)
        return codes, levels, None
    if groups.shape[1] == 0:
        raise ValidationError("groups is a DataFrame without columns")
    check_same_length(y_true=np.empty(n), groups=groups)
    cols = list(groups.columns)
    per_col = [_levels_and_codes(groups[c], f"groups[{c!r}]") for c in cols]
    code_mat = np.column_stack([codes for _, codes in per_col])
    if any(is_categorical(groups[c]) for c in cols):
        # like pandas groupby(observed=False): every combination of the levels
        combos = np.array(list(itertools.product(*[range(len(lv)) for lv, _ in per_col])),
                          dtype=np.intp)
        radix = np.cumprod([1] + [len(lv) for lv, _ in per_col[:0:-1]])[::-1]
        flat = code_mat @ radix
        codes = np.asarray(flat, dtype=np.intp)
    else:
        combos, codes = np.unique(code_mat, axis=0, return_inverse=True)
        codes = np.asarray(codes, dtype=np.intp).reshape(-1)
    labels = [
        ", ".join(f"{c}={per_col[j][0][k]}" for j, (c, k) in enumerate(zip(cols, combo)))
        for combo in combos
    ]
    attrs = pd.DataFrame(
        {c: [per_col[j][0][k] for k in combos[:, j]] for j, c in enumerate(cols)}
    )
    return codes, labels, attrs


def _prob_array(y_prob, n: int, classes: list, labels_given: bool):
    """Validate ``y_prob``; return (classes, P or p1, binary flag)."""
    try:
        P = np.array(y_prob, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"y_prob must be numeric probabilities: {exc}") from exc
    if P.ndim == 2 and P.shape[1] == 1:
        P = P.reshape(-1)
    if P.ndim not in (1, 2):
        raise ValidationError(
            f"y_prob must have shape (n,) (binary P(y=1)) or (n, n_classes), got {P.shape}"
        )
    if P.shape[0] != n:
        raise ValidationError(
            f"inconsistent numbers of samples: y_true has {n}, y_prob has {P.shape[0]}"
        )
    if not np.all(np.isfinite(P)):
        bad = np.argwhere(~np.isfinite(P))[0]
        raise ValidationError(f"y_prob contains NaN or inf (first at {tuple(bad)})")
    if np.any(P < 0) or np.any(P > 1):
        bad = np.argwhere((P < 0) | (P > 1))[0]
        raise ValidationError(
            f"y_prob must lie in [0, 1] (probabilities, not logits); got {P[tuple(bad)]} "
            f"at {tuple(bad)} (min {P.min():.4g}, max {P.max():.4g})"
        )
    K = 2 if P.ndim == 1 else P.shape[1]
    if P.ndim == 2:
        sums = P.sum(axis=1)
        if not np.allclose(sums, 1.0, rtol=0, atol=1e-4):
            i = int(np.argmax(np.abs(sums - 1.0)))
            raise ValidationError(
                f"rows of y_prob must sum to 1 (class probabilities); row {i} sums to "
                f"{sums[i]:.6g}. For a binary model pass P(y=1) as a 1-D array."
            )
    if K == 2:
        if len(classes) == 1 and not labels_given:
            only = classes[0]
            if isinstance(only, (bool, np.bool_, int, np.integer, float)) and only in (0, 1):
                classes = [0, 1]
            else:
                raise ValidationError(
                    f"y_prob is binary but only one class ({only!r}) occurs in y_true/y_pred; "
                    "pass labels=[negative, positive] so the positive class is known"
                )
        if len(classes) > 2:
            raise ValidationError(
                f"y_prob is binary (P(y=1)) but there are {len(classes)} classes "
                f"{classes[:6]}; pass an (n, n_classes) probability matrix"
            )
        if len(classes) < 2:
            raise ValidationError("labels must name two classes for binary y_prob")
        p1 = P if P.ndim == 1 else P[:, 1]
        return classes, p1, True
    if len(classes) != K:
        if not labels_given and all(
            isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_))
            and 0 <= c < K for c in classes
        ):
            classes = list(range(K))
        else:
            raise ValidationError(
                f"y_prob has {K} columns but there are {len(classes)} classes {classes[:6]}; "
                "pass labels= with one label per column of y_prob"
            )
    return classes, P, False


def _div(num, den, fill=np.nan):
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, fill, dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _auroc_binary(y: np.ndarray, s: np.ndarray) -> float:
    """Mann-Whitney AUROC (ties count 1/2); NaN unless both classes occur."""
    npos = int(y.sum())
    nneg = y.size - npos
    if npos == 0 or nneg == 0:
        return math.nan
    r = rankdata(s)
    return float((r[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def _average_precision(y: np.ndarray, s: np.ndarray) -> float:
    """Average precision, sum_n (R_n - R_{n-1}) P_n over distinct thresholds (= sklearn)."""
    npos = int(y.sum())
    if npos == 0:
        return math.nan
    order = np.argsort(-s, kind="mergesort")
    s_sorted = s[order]
    y_sorted = y[order]
    last = np.r_[np.flatnonzero(np.diff(s_sorted)), s.size - 1]
    tps = np.cumsum(y_sorted)[last]
    precision = tps / (last + 1.0)
    recall = tps / npos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def _ece(conf: np.ndarray, hit: np.ndarray) -> float:
    """sum_m |B_m|/n |acc(B_m) - conf(B_m)|, ECE_BINS equal-width bins of [0, 1]."""
    n = conf.size
    if n == 0:
        return math.nan
    b = np.minimum((conf * ECE_BINS).astype(np.intp), ECE_BINS - 1)
    s_conf = np.bincount(b, weights=conf, minlength=ECE_BINS)
    s_hit = np.bincount(b, weights=hit.astype(np.float64), minlength=ECE_BINS)
    return float(np.abs(s_hit - s_conf).sum() / n)


def _prob_metrics(yt: np.ndarray, prob: np.ndarray, binary: bool, C: int) -> dict:
    """cross_entropy, brier, ece (and auroc, auprc unless ``C == 0``) of one sample set."""
    n = yt.size
    if n == 0:
        return {"cross_entropy": math.nan, "brier": math.nan, "ece": math.nan}
    eps = np.finfo(np.float64).eps
    if binary:
        y1 = yt == 1
        pc = np.clip(prob, eps, 1 - eps)
        ce = -float(np.mean(np.where(y1, np.log(pc), np.log1p(-pc))))
        brier = float(np.mean((prob - y1) ** 2))
        ece = _ece(prob, y1)
        out = {"cross_entropy": ce, "brier": brier, "ece": ece}
        if C:
            out["auroc"] = _auroc_binary(y1, prob)
            out["auprc"] = _average_precision(y1, prob)
        return out
    py = np.clip(prob[np.arange(n), yt], eps, 1.0)
    ce = -float(np.mean(np.log(py)))
    sq = (prob ** 2).sum(axis=1) - 2 * prob[np.arange(n), yt] + 1.0
    brier = float(np.mean(sq))
    ece = _ece(prob.max(axis=1), prob.argmax(axis=1) == yt)
    out = {"cross_entropy": ce, "brier": brier, "ece": ece}
    if C:
        aucs, aps = [], []
        for k in range(C):
            yk = yt == k
            if 0 < yk.sum() < n:
                aucs.append(_auroc_binary(yk, prob[:, k]))
            if yk.any():
                aps.append(_average_precision(yk, prob[:, k]))
        out["auroc"] = float(np.mean(aucs)) if aucs else math.nan
        out["auprc"] = float(np.mean(aps)) if aps else math.nan
    return out


def _core(yt, yp, g, C, G, prob, binary):
    """Summary metrics, per-group accuracy and per-class table for coded inputs."""
    n = yt.size
    correct = yt == yp
    g_n = np.bincount(g, minlength=G)
    g_acc = _div(np.bincount(g, weights=correct, minlength=G), g_n)
    nonempty = g_n > 0
    tp = np.bincount(yt[correct], minlength=C).astype(np.float64)
    true_n = np.bincount(yt, minlength=C)
    pred_n = np.bincount(yp, minlength=C)
    recall = _div(tp, true_n)
    precision = _div(tp, pred_n, fill=0.0)  # zero_division=0, as SubpopBench / sklearn report
    seen = (true_n > 0) | (pred_n > 0)
    f1 = np.where(seen, _div(2 * tp, true_n + pred_n, fill=0.0), np.nan)
    present = true_n > 0
    r = recall[present]
    s: dict[str, Any] = {
        "average_accuracy": float(correct.mean()),
        "worst_group_accuracy": float(g_acc[nonempty].min()),
        "adjusted_accuracy": float(g_acc[nonempty].mean()),
        "balanced_accuracy": float(r.mean()),
        "worst_class_accuracy": float(r.min()),
        "class_accuracy_diff": float(np.abs(r[:, None] - r[None, :]).sum() / 2.0),
        "class_recall_std": float(r.std()),
        "macro_precision": float(precision[seen].mean()),
        "worst_precision": float(precision[seen].min()),
        "weighted_precision": float((true_n * precision).sum() / n),
        "macro_f1": float(f1[seen].mean()),
        "worst_f1": float(f1[seen].min()),
    }
    if prob is not None:
        s.update(_prob_metrics(yt, prob, binary, C))
    per_class = {"n": true_n, "n_predicted": pred_n, "recall": recall,
                 "precision": np.where(seen, precision, np.nan), "f1": f1}
    return s, g_acc, per_class


def _native(x):
    return x.item() if isinstance(x, np.generic) else x


def _quantiles(values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return math.nan, math.nan
    q = np.quantile(v, [lo, hi])
    return float(q[0]), float(q[1])


@dataclass(repr=False)
class GroupMetrics(FrameResult):
    """The answer of :func:`group_metrics`.

    ``table`` (``to_frame()``): one row per group and a last row ``"overall"`` (columns
    ``n``, ``share``, ``accuracy``, ...). ``metrics``: the summary metrics (worst-group,
    balanced, worst-class accuracy...); ``intervals``: metric -> ``[lower, upper]`` with
    ``n_resamples``; ``per_class``: columnar per-class table (``per_class_frame()``).
    """

    table: pd.DataFrame
    metrics: dict
    per_class: dict
    intervals: dict = field(default_factory=dict)
    level: float = 0.95
    n_resamples: int = 0

    _function = "otstab.group_metrics"

    def _attrs(self) -> dict:  # the frame's attrs as group_metrics wrote them
        out = {"summary": self.metrics, "per_class": self.per_class}
        if self.n_resamples > 0:
            out["summary_ci"] = self.intervals
            out["ci"] = {"level": self.level, "n_resamples": self.n_resamples,
                         "n_boot": self.n_resamples,
                         "method": "percentile, resampling within groups"}
        return out

    def to_dict(self) -> dict:
        from .._results import jsonable
        return jsonable({"table": self.table.reset_index().to_dict(orient="records"),
                         "metrics": self.metrics, "per_class": self.per_class,
                         "intervals": self.intervals, "level": self.level,
                         "n_resamples": self.n_resamples})

    def summary_frame(self) -> pd.DataFrame:
        """The summary metrics (and intervals) as a frame (:func:`summary_frame`)."""
        return summary_frame(self)

    def per_class_frame(self) -> pd.DataFrame:
        """The per-class table (:func:`per_class_frame`)."""
        return per_class_frame(self)

    def summary(self) -> str:
        m = self.metrics
        head = (f"Group metrics: {m['n_samples']} samples, {m['n_groups']} groups, "
                f"{m['n_classes']} classes; average accuracy {m['average_accuracy']:.4g}, "
                f"worst group {m['worst_group']!r} {m['worst_group_accuracy']:.4g}, "
                f"worst class {m['worst_class_accuracy']:.4g}")
        if self.n_resamples:
            head += f" ({100 * self.level:g}% intervals, {self.n_resamples} resamples)"
        return head + "\n" + self.table.head(30).to_string()

    def _headline(self):
        m = self.metrics
        return [("n_groups", m["n_groups"]), ("n_samples", m["n_samples"]),
                ("average_accuracy", m["average_accuracy"]),
                ("worst_group", m["worst_group"]),
                ("worst_group_accuracy", m["worst_group_accuracy"]),
                ("worst_class_accuracy", m["worst_class_accuracy"]),
                ("level", self.level), ("n_resamples", self.n_resamples)]


@renamed_kwargs(n_boot="n_resamples", ci="level")
def group_metrics(y_true, y_pred, groups, *, y_prob=None, labels=None, n_resamples: int = 0,
                  level: float = 0.95, random_state=None) -> GroupMetrics:
    """Per-group accuracy and the SubpopBench summary metrics (App. B.3).

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n,)
        True and predicted class labels (any hashable labels). All inputs are aligned by
        position (pandas indexes are ignored).
    groups : array-like of shape (n,) or pandas.DataFrame
        Group of each sample: a 1-D array of labels, or a DataFrame of attribute columns whose
        combination defines the group (e.g. ``race`` x ``sex``; for SubpopBench groups
        g = (y, a) pass ``pd.DataFrame({"y": y_true, "a": a})``). Categorical levels without
        samples are kept as rows with ``n = 0`` and NaN accuracy (pandas
        ``groupby(observed=False)`` semantics); they do not enter the summary metrics.
    y_prob : array-like of shape (n,) or (n, K), optional
        Predicted probabilities: P(positive class) for binary problems (the positive class is
        the larger label, or ``labels[1]``), else one column per class (rows sum to 1).
        Enables ``auroc``, ``auprc``, ``cross_entropy``, ``brier`` and ``ece``.
    labels : sequence, optional
        Class labels; with ``y_prob`` of shape (n, K) the label of each column, in order.
        Default: the sorted union of ``y_true`` and ``y_pred`` (or ``0..K-1`` for integer
        labels when ``y_prob`` has K columns).
    n_resamples : int, default 0
        Number of bootstrap replicates for percentile confidence intervals (0: none; formerly
        ``n_boot``). Samples are resampled with replacement within each group (stratified
        bootstrap), so every group keeps its size and the worst group stays defined in every
        replicate.
    level : float, default 0.95
        Confidence level of the intervals (formerly ``ci``).
    random_state : None, int, numpy Generator or RandomState
        The bootstrap's random numbers.

    Returns
    -------
    GroupMetrics
        ``metrics`` (the summary dict below), ``intervals``, ``per_class``; ``to_frame()`` is
        the table below, with the metadata in its ``attrs``. One row per group (index name
        ``"group"``; for DataFrame ``groups`` the labels read ``"race=White, sex=Male"`` and the
        attribute columns are included) and a last row ``"overall"``. Columns: ``n``, ``share``
        (n / total), ``accuracy``; with ``n_resamples`` ``accuracy_lower`` / ``accuracy_upper``;
        with ``y_prob`` ``cross_entropy``, ``brier``, ``ece`` per row. Metadata in ``df.attrs``
        (plain Python values):

        * ``"summary"``: dict of the summary metrics -- ``average_accuracy``,
          ``worst_group_accuracy``, ``worst_group`` (its label), ``adjusted_accuracy``
          (mean of group accuracies), ``balanced_accuracy`` (mean recall),
          ``worst_class_accuracy`` (min recall), ``class_accuracy_diff``
          (sum_{i<j} |recall_i - recall_j|), ``class_recall_std``, ``macro_precision``,
          ``worst_precision``, ``weighted_precision``, ``macro_f1``, ``worst_f1``, with
          ``y_prob`` also ``auroc``, ``auprc``, ``cross_entropy``, ``brier``, ``ece``;
          and the counts ``n_samples``, ``n_groups``, ``n_empty_groups``, ``n_classes``;
        * ``"per_class"``: columnar dict (``label``, ``n``, ``n_predicted``, ``recall``,
          ``precision``, ``f1``); ``pd.DataFrame(df.attrs["per_class"])`` or
          :func:`per_class_frame` gives the table;
        * ``"summary_ci"`` (with ``n_resamples``): metric -> ``[lower, upper]``, and
          ``"ci"``: ``{"level", "n_resamples", "method"}``.

        :func:`summary_frame` turns the summary (and intervals) into a frame.

    Notes
    -----
    Conventions for undefined values (never an exception): precision of a class never
    predicted is 0 (``zero_division=0``); recall of a class absent from ``y_true`` is NaN and
    does not enter balanced / worst-class accuracy; precision and F1 averages run over the
    classes occurring in ``y_true`` or ``y_pred`` (scikit-learn's default labels). AUROC is
    NaN when ``y_true`` has a single class; AUPRC is NaN without positives. Multiclass AUROC
    and AUPRC are one-vs-rest macro averages over the classes where they are defined;
    multiclass Brier is mean_i sum_k (p_ik - 1[y_i = k])^2 and binary Brier mean_i
    (p_i - y_i)^2 (as scikit-learn); multiclass ECE bins the top-label confidence and checks
    the argmax of ``y_prob``. Cross-entropy clips probabilities to [eps, 1 - eps].
    Bootstrap replicates where a metric is NaN are left out of its interval.

    Examples
    --------
    >>> import numpy as np
    >>> from otstab import group_metrics
    >>> res = group_metrics([0, 0, 1, 1], [0, 1, 1, 1], ["a", "b", "a", "b"])
    >>> res.to_frame()["accuracy"].tolist()
    [1.0, 0.5, 0.75]
    >>> res.metrics["worst_group_accuracy"]
    0.5
    """
    yt_raw = _labels_1d(y_true, "y_true")
    yp_raw = _labels_1d(y_pred, "y_pred")
    n = check_same_length(y_true=yt_raw, y_pred=yp_raw)
    _check_label_types(yt_raw, yp_raw)
    g, g_labels, g_attrs = _encode_groups(groups, n)
    if _OVERALL in g_labels:
        raise ValidationError(f"groups must not contain the label {_OVERALL!r} (reserved "
                              "for the overall row)")
    G = len(g_labels)

    labels_given = labels is not None
    if labels_given:
        classes = list(_labels_1d(labels, "labels"))
        if len(set(map(_hashable_key, classes))) != len(classes):
            raise ValidationError(f"labels must be distinct, got {classes}")
    else:
        classes = _sorted_levels(np.concatenate([yt_raw.astype(object),
                                                 yp_raw.astype(object)]))
    prob, binary = None, False
    if y_prob is not None:
        classes, prob, binary = _prob_array(y_prob, n, classes, labels_given)
    C = len(classes)
    yt = _encode(yt_raw, classes, "y_true")
    yp = _encode(yp_raw, classes, "y_pred")

    nb = check_scalar(n_resamples, "n_resamples", low=0)
    if nb != int(nb):
        raise ValidationError(f"n_resamples must be a non-negative integer, got {n_resamples}")
    n_boot = int(nb)
    level = check_scalar(level, "level", low=0.0, high=1.0, low_inclusive=False,
                         high_inclusive=False)
    rng = check_random_state(random_state) if n_boot > 0 else None

    summary, g_acc, per_class = _core(yt, yp, g, C, G, prob, binary)
    g_n = np.bincount(g, minlength=G)

    index = pd.Index(list(g_labels) + [_OVERALL], dtype=object, name="group")
    frame = pd.DataFrame(index=index)
    if g_attrs is not None:
        clash = [c for c in g_attrs.columns if c in _FRAME_COLUMNS]
        if clash:
            raise ValidationError(
                f"groups columns {clash} clash with the metric columns {_FRAME_COLUMNS}; "
                "rename them"
            )
        for c in g_attrs.columns:  # object dtype keeps the labels' types; None on "overall"
            frame[c] = pd.Series(list(g_attrs[c]) + [None], index=index, dtype=object)
    frame["n"] = np.r_[g_n, n].astype(np.int64)
    frame["share"] = np.r_[g_n / n, 1.0]
    frame["accuracy"] = np.r_[g_acc, summary["average_accuracy"]]

    ci_summary: dict[str, list[float]] = {}
    if n_boot > 0:
        members = [np.flatnonzero(g == k) for k in range(G) if g_n[k] > 0]
        keys = [k for k in summary]
        boot = np.full((n_boot, len(keys)), np.nan)
        boot_g = np.full((n_boot, G), np.nan)
        assert rng is not None  # made above when n_boot > 0
        for b in range(n_boot):
            idx = np.concatenate([m[rng.integers(0, m.size, m.size)] for m in members])
            pb = None if prob is None else prob[idx]
            s_b, gacc_b, _ = _core(yt[idx], yp[idx], g[idx], C, G, pb, binary)
            boot[b] = [s_b[k] for k in keys]
            boot_g[b] = gacc_b
        lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
        ci_summary = {k: list(_quantiles(boot[:, j], lo, hi)) for j, k in enumerate(keys)}
        g_ci = np.array([_quantiles(boot_g[:, k], lo, hi) for k in range(G)]).reshape(G, 2)
        frame["accuracy_lower"] = np.r_[g_ci[:, 0], ci_summary["average_accuracy"][0]]
        frame["accuracy_upper"] = np.r_[g_ci[:, 1], ci_summary["average_accuracy"][1]]

    if prob is not None:
        rows = [_prob_metrics(yt[g == k], prob[g == k], binary, 0) for k in range(G)]
        rows.append({k: summary[k] for k in ("cross_entropy", "brier", "ece")})
        for key in ("cross_entropy", "brier", "ece"):
            frame[key] = [r[key] for r in rows]

    nonempty = np.flatnonzero(g_n > 0)
    worst = nonempty[int(np.argmin(g_acc[nonempty]))]
    summary = {k: float(v) for k, v in summary.items()}
    summary["worst_group"] = _native(g_labels[worst])
    summary.update(n_samples=int(n), n_groups=int(G), n_empty_groups=int((g_n == 0).sum()),
                   n_classes=int(C))
    per_class_cols = {
        "label": [_native(c) for c in classes],
        **{k: [_native(x) for x in np.asarray(v).tolist()] for k, v in per_class.items()},
    }
    return GroupMetrics(frame, metrics=summary, per_class=per_class_cols,
                        intervals=ci_summary, level=level, n_resamples=n_boot)


def _hashable_key(x):
    return x.item() if isinstance(x, np.generic) else x


def _metrics_attrs(metrics) -> dict:
    """The ``attrs`` of a :func:`group_metrics` frame, or of the result itself."""
    if isinstance(metrics, GroupMetrics):
        return metrics._attrs()
    return getattr(metrics, "attrs", {}) if metrics is not None else {}


def summary_frame(metrics) -> pd.DataFrame:
    """The summary metrics of a :func:`group_metrics` result as a DataFrame.

    Parameters
    ----------
    metrics : GroupMetrics or pandas.DataFrame
        The result of :func:`group_metrics` or its ``to_frame()`` (``attrs`` intact).

    Returns
    -------
    pandas.DataFrame
        Index ``metric``; column ``value`` and, when bootstrap intervals were computed,
        ``lower`` and ``upper``. Count entries (``n_samples`` ...) and ``worst_group`` are
        left out.
    """
    attrs = _metrics_attrs(metrics)
    summary = attrs.get("summary")
    if summary is None:
        raise ValidationError(
            "metrics has no attrs['summary']: pass the frame returned by group_metrics "
            "(some pandas operations drop attrs)"
        )
    skip = {"worst_group", "n_samples", "n_groups", "n_empty_groups", "n_classes"}
    keys = [k for k in summary if k not in skip]
    out = pd.DataFrame({"value": [float(summary[k]) for k in keys]},
                       index=pd.Index(keys, name="metric"))
    cis = attrs.get("summary_ci")
    if cis:
        out["lower"] = [cis[k][0] for k in keys]
        out["upper"] = [cis[k][1] for k in keys]
    return out


def per_class_frame(metrics) -> pd.DataFrame:
    """The per-class table (n, n_predicted, recall, precision, f1) of :func:`group_metrics`.

    Parameters
    ----------
    metrics : GroupMetrics or pandas.DataFrame
        The result of :func:`group_metrics` or its ``to_frame()``.

    Returns
    -------
    pandas.DataFrame
        One row per class, indexed by class label.
    """
    per_class = _metrics_attrs(metrics).get("per_class")
    if per_class is None:
        raise ValidationError(
            "metrics has no attrs['per_class']: pass the frame returned by group_metrics"
        )
    return pd.DataFrame(per_class).set_index("label")
