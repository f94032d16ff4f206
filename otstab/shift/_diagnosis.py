"""Shift diagnosis (SubpopBench): how strongly a training set shows each of the four shift
types, from its (class y, attribute a) count table. Formulas in ``docs/groups.md``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .._results import ResultMixin
from .._validation import (
    as_float_matrix,
    check_same_length,
    check_scalar,
    non_numeric_columns,
)
from ..errors import InputTypeError, ValidationError
from ._group_metrics import _levels_and_codes, _native

#: The four shift types, in the priority order used to name the dominant one.
SHIFT_TYPES = (
    "attribute_generalization",
    "spurious_correlation",
    "attribute_imbalance",
    "class_imbalance",
)


#: Default thresholds of :func:`diagnose_shift`: a shift type is reported when its score
#: reaches the threshold. Scores: spurious correlation = Cramer's V; attribute imbalance =
#: 1 - normalized attribute entropy; class imbalance = 1 - normalized class entropy;
#: attribute generalization = the flag (any (y, a) group without training samples).
SHIFT_THRESHOLDS: dict[str, float] = {
    "spurious_correlation": 0.2,
    "attribute_imbalance": 0.1,
    "class_imbalance": 0.1,
}


@dataclass(repr=False)
class ShiftDiagnosis(ResultMixin):
    """How strongly a (y, a) training distribution shows each SubpopBench shift type.

    Attributes
    ----------
    mi : float
        Mutual information I(A; Y) in nats.
    nmi : float
        2 I / (H(A) + H(Y)) (sklearn ``normalized_mutual_info_score``, arithmetic mean);
        0 when exactly one of A, Y is constant, NaN when both are.
    cramers_v, tschuprows_t : float
        sqrt(chi2 / (n min(r-1, k-1))) and sqrt(chi2 / (n sqrt((r-1)(k-1)))), chi2 without
        continuity correction over the r rows and k columns with non-zero totals (NaN when
        r < 2 or k < 2).
    class_entropy, attribute_entropy : float
        Entropies of Y and A in bits.
    class_normalized_entropy, attribute_normalized_entropy : float
        H / log(number of levels) (1 = uniform); NaN for a single level.
    class_spread, attribute_spread : float
        p_max - p_min over the levels.
    attribute_generalization : bool
        Some (y, a) group has no training samples but test samples (with ``test``), or -- no
        test table given -- some cell of the training table is empty.
    shift_types : tuple of str
        Shift types whose score reaches its threshold, in the priority order of
        ``SHIFT_TYPES`` (attribute generalization, spurious correlation, attribute imbalance,
        class imbalance).
    dominant : str or None
        ``shift_types[0]``: the type SubpopBench would file the data set under.
    scores : dict
        Degree of each shift type (see ``SHIFT_THRESHOLDS``).
    thresholds : dict
        Thresholds used.
    n : float
        Number of training samples.
    chi2 : float
        Pearson chi-square statistic of the training table.
    missing_groups : list of tuple
        (y, a) cells counted as unseen in training.
    counts : pandas.DataFrame
        The training count table (rows y, columns a); left out of ``to_dict``.
    test_counts : pandas.DataFrame or None
        The test table aligned to ``counts``; left out of ``to_dict``.
    """

    mi: float
    nmi: float
    cramers_v: float
    tschuprows_t: float
    class_entropy: float
    class_normalized_entropy: float
    class_spread: float
    attribute_entropy: float
    attribute_normalized_entropy: float
    attribute_spread: float
    attribute_generalization: bool
    shift_types: tuple
    dominant: str | None
    scores: dict
    thresholds: dict
    n: float
    chi2: float
    missing_groups: list
    counts: pd.DataFrame = field(repr=False)
    test_counts: pd.DataFrame | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return (
            f"ShiftDiagnosis(mi={self.mi:.3f}, nmi={self.nmi:.3f}, "
            f"cramers_v={self.cramers_v:.3f}, class_entropy={self.class_entropy:.3f}, "
            f"attribute_entropy={self.attribute_entropy:.3f}, "
            f"attribute_generalization={self.attribute_generalization}, "
            f"shift_types={self.shift_types})"
        )

    def summary(self) -> str:
        lines = [f"Shift diagnosis of {self.n:g} training samples: "
                 f"{', '.join(self.shift_types) or 'no shift type reaches its threshold'}"]
        for k, v in self.scores.items():
            t = self.thresholds.get(k)
            lines.append(f"  {k:<26} {v:.4g}   (threshold {t:g})"
                         if isinstance(v, (int, float)) and not isinstance(v, bool)
                         and isinstance(t, (int, float)) else f"  {k:<26} {v}")
        lines.append(f"  mutual information {self.mi:.4g} nats, NMI {self.nmi:.4g}, "
                     f"Cramer's V {self.cramers_v:.4g}")
        if self.missing_groups:
            lines.append(f"  unseen (y, a) groups: {self.missing_groups[:10]}")
        return "\n".join(lines)

    def to_frame(self) -> pd.DataFrame:
        """One row with the scalar diagnostics (``shift_types`` joined by commas)."""
        keys = ["mi", "nmi", "cramers_v", "tschuprows_t", "class_entropy",
                "class_normalized_entropy", "class_spread", "attribute_entropy",
                "attribute_normalized_entropy", "attribute_spread", "attribute_generalization",
                "dominant", "n", "chi2"]
        row = {k: getattr(self, k) for k in keys}
        row["shift_types"] = ",".join(self.shift_types)
        return pd.DataFrame([row])


def _count_table(obj, name: str, y: str, a: str) -> pd.DataFrame:
    """A (y x a) count DataFrame from a count table or raw (y, a) columns."""
    if obj is None:
        raise ValidationError(f"{name} is required, got None")
    raw = None
    if isinstance(obj, tuple):
        if len(obj) != 2:
            raise ValidationError(
                f"{name} as a tuple must be (y, a) raw columns, got a tuple of length {len(obj)}"
            )
        raw = obj
    elif isinstance(obj, pd.DataFrame) and y in obj.columns and a in obj.columns:
        raw = (obj[y], obj[a])
    if raw is not None:
        y_levels, y_codes = _levels_and_codes(raw[0], f"{name} y")
        a_levels, a_codes = _levels_and_codes(raw[1], f"{name} a")
        check_same_length(**{f"{name}_y": y_codes, f"{name}_a": a_codes})
        counts = np.zeros((len(y_levels), len(a_levels)))
        np.add.at(counts, (y_codes, a_codes), 1.0)
        return pd.DataFrame(counts, index=pd.Index(y_levels, dtype=object, name="y"),
                            columns=pd.Index(a_levels, dtype=object, name="a"))
    if isinstance(obj, pd.DataFrame):
        bad = non_numeric_columns(obj)
        if bad:
            raise ValidationError(
                f"{name} has non-numeric column(s) {bad[:5]}: a count table must be numeric; "
                f"raw columns must be named {y!r} and {a!r} (or pass y=..., a=...)"
            )
        index, columns = obj.index, obj.columns
    elif isinstance(obj, pd.Series) or np.ndim(obj) == 1:
        raise ValidationError(
            f"{name} must be a 2-D (y x a) count table, a DataFrame with columns {y!r} and "
            f"{a!r}, or a tuple (y, a) of raw columns; got a 1-D array"
        )
    else:
        index = columns = None
    mat = as_float_matrix(obj, name)
    if np.any(mat < 0):
        raise ValidationError(f"{name} is a count table and must be >= 0, got {mat.min()}")
    if mat.sum() <= 0:
        raise ValidationError(f"{name} has no samples (all counts are 0)")
    index = pd.RangeIndex(mat.shape[0]) if index is None else index
    columns = pd.RangeIndex(mat.shape[1]) if columns is None else columns
    return pd.DataFrame(mat, index=pd.Index(index, dtype=object, name="y"),
                        columns=pd.Index(columns, dtype=object, name="a"))


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def diagnose_shift(train_counts_or_frame, test=None, *, y: str = "y", a: str = "a",
                   thresholds: Mapping[str, float] | None = None) -> ShiftDiagnosis:
    """Quantify the SubpopBench shift types of a training set (Sec. 5.1, App. D.1).

    Parameters
    ----------
    train_counts_or_frame : array-like, pandas.DataFrame or tuple
        Either a (y x a) count table -- rows classes, columns attribute values; a DataFrame
        keeps its labels, an array uses positions 0, 1, ... -- or raw columns: a DataFrame with
        columns ``y`` and ``a``, or a tuple ``(y, a)`` of 1-D arrays (categorical levels
        without samples are kept). Lists and arrays are read as count tables, tuples as raw
        columns.
    test : same formats, optional
        Test data; aligned to the training table by labels. Used only for the
        attribute-generalization flag.
    y, a : str
        Column names of the raw-columns DataFrame form.
    thresholds : mapping, optional
        Overrides of ``SHIFT_THRESHOLDS`` (keys ``spurious_correlation``,
        ``attribute_imbalance``, ``class_imbalance``).

    Returns
    -------
    ShiftDiagnosis

    Notes
    -----
    A shift type is reported when its score reaches the threshold:

    * spurious correlation: Cramer's V >= 0.2 (between the conventional "small" 0.1 and
      "medium" 0.3 association levels);
    * attribute imbalance: 1 - normalized attribute entropy >= 0.1 (normalized entropy <= 0.9);
    * class imbalance: 1 - normalized class entropy >= 0.1;
    * attribute generalization: the flag (score: share of test samples in unseen groups,
      or without ``test`` the share of empty training cells).

    With these thresholds the Waterbirds training table gives (spurious correlation,
    attribute imbalance, class imbalance) and CelebA (spurious correlation, class imbalance),
    the marks of SubpopBench Table 2. The number of levels in the normalized entropy and the
    spread is the number of rows (columns) of the table, so a declared level without samples
    counts as imbalance.
    """
    th = dict(SHIFT_THRESHOLDS)
    if thresholds is not None:
        if not isinstance(thresholds, Mapping):
            raise InputTypeError(f"thresholds must be a mapping, got {type(thresholds).__name__}")
        for key, v in thresholds.items():
            if key not in SHIFT_THRESHOLDS:
                raise ValidationError(
                    f"thresholds has unknown key {key!r}; expected one of {list(SHIFT_THRESHOLDS)}"
                )
            th[key] = check_scalar(v, f"thresholds[{key!r}]", low=0.0)
    T = _count_table(train_counts_or_frame, "train_counts_or_frame", y, a)
    O = T.to_numpy()
    n = float(O.sum())
    P = O / n
    py, pa = P.sum(axis=1), P.sum(axis=0)
    h_y, h_a = _entropy(py), _entropy(pa)
    nz = P > 0
    mi = float(np.sum(P[nz] * np.log(P[nz] / np.outer(py, pa)[nz])))
    mi = max(mi, 0.0)
    nmi = 2 * mi / (h_y + h_a) if h_y + h_a > 0 else math.nan

    rows, cols = O.sum(axis=1) > 0, O.sum(axis=0) > 0
    r, k = int(rows.sum()), int(cols.sum())
    Osub = O[np.ix_(rows, cols)]
    E = np.outer(Osub.sum(axis=1), Osub.sum(axis=0)) / n
    chi2 = float(((Osub - E) ** 2 / E).sum())
    if r >= 2 and k >= 2:
        cramers_v = math.sqrt(chi2 / (n * min(r - 1, k - 1)))
        tschuprows_t = math.sqrt(chi2 / (n * math.sqrt((r - 1) * (k - 1))))
    else:
        cramers_v = tschuprows_t = math.nan

    def _norm(h, levels):
        return h / math.log(levels) if levels > 1 else math.nan

    test_T = None
    if test is not None:
        test_T = _count_table(test, "test", y, a)
        idx = T.index.append(test_T.index.difference(T.index, sort=False))
        col = T.columns.append(test_T.columns.difference(T.columns, sort=False))
        T_al = T.reindex(index=idx, columns=col, fill_value=0.0)
        test_T = test_T.reindex(index=idx, columns=col, fill_value=0.0)
        unseen = (T_al.to_numpy() == 0) & (test_T.to_numpy() > 0)
        ag_score = float(test_T.to_numpy()[unseen].sum() / test_T.to_numpy().sum())
        cells = T_al
    else:
        unseen = O == 0
        ag_score = float(unseen.mean())
        cells = T
    missing = [(_native(cells.index[i]), _native(cells.columns[j]))
               for i, j in zip(*np.nonzero(unseen))]
    ag = bool(unseen.any())

    class_norm = _norm(h_y, O.shape[0])
    attr_norm = _norm(h_a, O.shape[1])
    scores = {
        "attribute_generalization": ag_score,
        "spurious_correlation": cramers_v,
        "attribute_imbalance": 1.0 - attr_norm,
        "class_imbalance": 1.0 - class_norm,
    }
    present = []
    for t in SHIFT_TYPES:
        if t == "attribute_generalization":
            if ag:
                present.append(t)
        elif np.isfinite(scores[t]) and scores[t] >= th[t]:
            present.append(t)
    return ShiftDiagnosis(
        mi=mi, nmi=float(nmi), cramers_v=float(cramers_v), tschuprows_t=float(tschuprows_t),
        class_entropy=h_y / math.log(2), class_normalized_entropy=float(class_norm),
        class_spread=float(py.max() - py.min()),
        attribute_entropy=h_a / math.log(2), attribute_normalized_entropy=float(attr_norm),
        attribute_spread=float(pa.max() - pa.min()),
        attribute_generalization=ag, shift_types=tuple(present),
        dominant=present[0] if present else None, scores=scores, thresholds=th, n=n,
        chi2=chi2, missing_groups=missing, counts=T, test_counts=test_T,
    )
