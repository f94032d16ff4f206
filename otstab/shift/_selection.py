"""Model selection (SubpopBench): candidate runs chosen by a validation criterion, and the
gap to the oracle that picks the best test worst-group accuracy."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .._results import ResultMixin, brief
from .._validation import (
    positional_deprecated,
)
from ..errors import ValidationError
from ._group_metrics import _native

#: Selection criteria of SubpopBench App. B.4 / Table 12 -> direction ("max" or "min").
#: Each name is also a key of ``group_metrics(...).attrs["summary"]``.
CRITERIA: dict[str, str] = {
    "worst_class_accuracy": "max",
    "worst_group_accuracy": "max",
    "balanced_accuracy": "max",
    "class_accuracy_diff": "min",
    "class_recall_std": "min",
    "worst_f1": "max",
    "macro_f1": "max",
    "worst_precision": "max",
    "macro_precision": "max",
    "weighted_precision": "max",
    "adjusted_accuracy": "max",
    "average_accuracy": "max",
    "auroc": "max",
    "auprc": "max",
    "cross_entropy": "min",
    "brier": "min",
    "ece": "min",
}


@dataclass(repr=False)
class ModelSelection(ResultMixin):
    """Result of :func:`select_model`.

    Attributes
    ----------
    criteria : list of str
        The criteria evaluated.
    test_metric : str
        Column holding the test metric (default test worst-group accuracy).
    report : pandas.DataFrame
        One row per (``by`` group, criterion): ``selected`` (index label of the chosen run),
        ``validation_value``, ``test_value``, ``oracle`` (best test value in the group),
        ``gap`` = test_value - oracle (<= 0; in the units of the test column).
    criteria_table : pandas.DataFrame
        Per criterion: ``mean_gap``, ``std_gap`` (over ``by`` groups, ddof=1; NaN for one
        group), ``n_groups``; sorted best (largest mean gap) first. (Formerly the attribute
        ``summary``, which is now the method giving the text summary; indexing it still
        reaches this table for one release, with a FutureWarning.)
    by : list of str
        The ``by`` columns (empty: one selection over all records).
    """

    criteria: list
    test_metric: str
    report: pd.DataFrame
    criteria_table: pd.DataFrame
    by: list = field(default_factory=list)

    def __repr__(self) -> str:
        gaps = self.criteria_table["mean_gap"].round(4).head(12).to_dict()
        return (f"ModelSelection(criteria={brief(self.criteria)}, "
                f"test_metric={self.test_metric!r}, mean_gap={gaps})")

    @property
    def summary(self):
        """``summary()``: the text summary. (For one release ``summary[...]`` and the
        DataFrame's attributes still reach ``criteria_table``, with a FutureWarning.)"""
        return _SummaryOrTable(self)

    def _summary_text(self) -> str:
        head = (f"Model selection on {self.test_metric!r}"
                + (f" within {self.by}" if self.by else "")
                + f": {len(self.criteria)} criteria, best first")
        return head + "\n" + self.criteria_table.to_string()

    def _first(self, column):
        rows = self.report[self.report["criterion"] == self.criteria[0]]
        if not self.by:
            return _native(rows[column].iloc[0])
        return rows.set_index(self.by)[column]

    @property
    def selected(self):
        """Index label of the run chosen by the first criterion (a Series with ``by``)."""
        return self._first("selected")

    @property
    def gap(self):
        """Gap to the oracle of the first criterion (a Series with ``by``)."""
        return self._first("gap")

    def to_frame(self) -> pd.DataFrame:
        """The per-criterion report."""
        return self.report.copy()


@positional_deprecated(1, "criterion")
def select_model(records, *, criterion="worst_class_accuracy",
                 test_metric: str = "test_worst_group_accuracy", val_prefix: str = "val_",
                 by=None) -> ModelSelection:
    """Pick the run maximising a validation criterion; report the gap to the oracle.

    SubpopBench App. B.4 / Table 12: among candidate runs (hyper-parameters, checkpoints),
    select the one with the best validation criterion, report its test worst-group accuracy
    and the difference to the oracle, the run with the best test worst-group accuracy.

    Parameters
    ----------
    records : pandas.DataFrame or list of dict
        One row per candidate run. Must hold ``val_prefix + criterion`` for every criterion
        (e.g. ``val_worst_class_accuracy``; the names are the keys of
        ``group_metrics(...).attrs["summary"]``) and the ``test_metric`` column.
    criterion : str, list of str or "all", default "worst_class_accuracy"
        Criteria (keys of ``CRITERIA``; direction max or min as listed there). ``"all"``:
        every criterion whose validation column is present.
    test_metric : str, default "test_worst_group_accuracy"
        Column of the test metric to report (higher is better).
    val_prefix : str, default "val_"
        Prefix of the validation columns.
    by : str or list of str, optional
        Columns to select within (e.g. ``"dataset"`` or ``["dataset", "algorithm"]``); the
        summary averages the gaps over these groups, as SubpopBench's tables.

    Returns
    -------
    ModelSelection

    Notes
    -----
    Ties are broken by the first run in ``records`` order; runs with a NaN criterion are
    skipped (a group where all are NaN reports NaN). SubpopBench's reference: worst-class
    accuracy is the best criterion without attributes (-2.4 points, Table 12), overall
    accuracy (-10.2 on 12 data sets, -15.0 on the 6 of Table 5) and ECE (-17.9) the worst.
    """
    if records is None:
        raise ValidationError("records is required, got None")
    if isinstance(records, pd.DataFrame):
        df = records.copy()
    else:
        try:
            df = pd.DataFrame(records)
        except (TypeError, ValueError) as exc:
            raise ValidationError(
                f"records must be a DataFrame or a list of dicts: {exc}"
            ) from exc
    if len(df) == 0:
        raise ValidationError("records has no rows")
    if not isinstance(test_metric, str) or test_metric not in df.columns:
        raise ValidationError(
            f"test_metric {test_metric!r} is not a column of records; columns: "
            f"{list(df.columns)[:20]}"
        )
    if isinstance(criterion, str) and criterion == "all":
        crits = [c for c in CRITERIA if val_prefix + c in df.columns]
        if not crits:
            raise ValidationError(
                f"records has no validation column {val_prefix}<criterion> for any criterion "
                f"of {list(CRITERIA)}"
            )
    else:
        crits = [criterion] if isinstance(criterion, str) else list(criterion)
        if not crits:
            raise ValidationError("criterion is an empty list")
        for c in crits:
            if c not in CRITERIA:
                raise ValidationError(
                    f"criterion must be one of {list(CRITERIA)} or 'all', got {c!r}"
                )
            if val_prefix + c not in df.columns:
                raise ValidationError(
                    f"records has no column {val_prefix + c!r} for criterion {c!r}; "
                    f"columns: {list(df.columns)[:20]}"
                )
    numeric = [test_metric] + [val_prefix + c for c in crits]
    for col in numeric:
        try:
            df[col] = pd.to_numeric(df[col]).astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"records column {col!r} must be numeric: {exc}") from exc
    by_cols = [] if by is None else ([by] if isinstance(by, str) else list(by))
    for b in by_cols:
        if b not in df.columns:
            raise ValidationError(f"by column {b!r} is not a column of records")

    parts = df.groupby(by_cols, sort=True, dropna=False) if by_cols else [((), df)]
    rows = []
    for key, part in parts:
        key = key if isinstance(key, tuple) else (key,)
        test = part[test_metric].to_numpy()
        finite_test = np.isfinite(test)
        oracle = float(test[finite_test].max()) if finite_test.any() else math.nan
        for c in crits:
            val = part[val_prefix + c].to_numpy()
            ok = np.flatnonzero(np.isfinite(val))
            row = dict(zip(by_cols, key))
            row["criterion"] = c
            if ok.size == 0:
                row.update(selected=None, validation_value=math.nan, test_value=math.nan)
            else:
                vals = val[ok]
                pos = ok[int(np.argmax(vals) if CRITERIA[c] == "max" else np.argmin(vals))]
                row.update(selected=_native(part.index[pos]), validation_value=float(val[pos]),
                           test_value=float(test[pos]))
            row["oracle"] = oracle
            row["gap"] = row["test_value"] - oracle
            rows.append(row)
    report = pd.DataFrame(rows)
    summ = []
    for c in crits:
        gaps = report.loc[report["criterion"] == c, "gap"].to_numpy(dtype=np.float64)
        fin = gaps[np.isfinite(gaps)]
        summ.append({
            "criterion": c,
            "direction": CRITERIA[c],
            "mean_gap": float(fin.mean()) if fin.size else math.nan,
            "std_gap": float(fin.std(ddof=1)) if fin.size > 1 else math.nan,
            "n_groups": int(fin.size),
        })
    summary = (pd.DataFrame(summ).sort_values("mean_gap", ascending=False, kind="mergesort",
                                              na_position="last")
               .set_index("criterion"))
    return ModelSelection(criteria=crits, test_metric=test_metric, report=report,
                          criteria_table=summary, by=by_cols)


class _SummaryOrTable:
    """``ModelSelection.summary``: called, the text summary; indexed (the former DataFrame
    attribute), ``criteria_table`` with a FutureWarning."""

    def __init__(self, owner: ModelSelection):
        self._owner = owner

    def __call__(self) -> str:
        return self._owner._summary_text()

    def _table(self) -> pd.DataFrame:
        warnings.warn("ModelSelection.summary is a method now (the text summary); the table "
                      "is ModelSelection.criteria_table: indexing summary is deprecated and "
                      "will be removed in the next release", FutureWarning, stacklevel=3)
        return self._owner.criteria_table

    def __getitem__(self, key):
        return self._table()[key]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._table(), name)

    def __repr__(self) -> str:
        return self._owner._summary_text()
