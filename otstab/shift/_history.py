"""A history of certificates and shift costs per model version and data window (issue 32).

An embedded SQLite database through the standard library's :mod:`sqlite3` (no server, one
file): ``History("history.db")``, ``History("sqlite:///history.db")`` or ``History(":memory:")``.
Each row is one data window of one model version: the certificate's R (value, certified
interval, sampling interval), the shift cost S from the reference data to that window's data
(value and certified interval), the share of the tolerance used and the conclusion
(:func:`otstab.budget_used`), with both results' JSON. The threshold r is the column
``r_threshold`` (SQLite's column names ignore case, and ``R`` is the certificate's value).
Other database URLs would need SQLAlchemy, which otstab does not require; they are refused with
a clear message.

``otstab monitor`` (:mod:`otstab.cli._monitor`) appends a window and renders the trend
report (:mod:`otstab.reporting._trend`).
"""

from __future__ import annotations

import json
import math
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .._results import jsonable
from ..errors import ValidationError
from ..solve._budget import budget_used

__all__ = ["History", "SCHEMA_VERSION", "COLUMNS"]

SCHEMA_VERSION = 1

#: the columns of a window (besides the row id), in order, with their SQL types
COLUMNS = {
    "model_version": "TEXT NOT NULL", "window": "TEXT NOT NULL", "created": "TEXT NOT NULL",
    "loss": "TEXT", "r_threshold": "REAL", "theta1": "REAL", "theta2": "REAL", "divergence": "TEXT",
    "cost": "TEXT", "R": "REAL", "R_lower": "REAL", "R_upper": "REAL", "R_ci_low": "REAL",
    "R_ci_high": "REAL", "R_status": "TEXT", "S": "REAL", "S_lower": "REAL", "S_upper": "REAL",
    "S_status": "TEXT", "moving": "REAL", "reweighting": "REAL", "share": "REAL",
    "outcome": "TEXT", "conclusion": "TEXT", "n_ref": "INTEGER", "n_cur": "INTEGER",
    "reference": "TEXT", "current": "TEXT", "certificate": "TEXT", "shift": "TEXT",
}


def _path(store) -> str:
    if isinstance(store, Path):
        return str(store)
    if not isinstance(store, str) or not store:
        raise ValidationError(f"store must be a file path or 'sqlite:///path', got {store!r}")
    if store.startswith("sqlite:///"):
        return store[len("sqlite:///"):] or ":memory:"
    if store == "sqlite://":
        return ":memory:"
    if "://" in store:
        raise ValidationError(f"store {store!r}: only SQLite is supported (a file path or "
                              "'sqlite:///path'); other databases would need SQLAlchemy, "
                              "which otstab does not require")
    return store


def _real(x):
    """A float for SQLite (inf is stored as such; nan becomes NULL)."""
    if x is None:
        return None
    v = float(x)
    return None if math.isnan(v) else v


class History:
    """The store (see the module doc). Use as a context manager, or call :meth:`close`."""

    def __init__(self, store="history.db"):
        self.path = _path(store)
        if self.path != ":memory:" and not Path(self.path).parent.exists():
            raise ValidationError(f"store: folder {str(Path(self.path).parent)!r} does not "
                                  "exist")
        try:
            self.db = sqlite3.connect(self.path)
            self._init()
        except sqlite3.DatabaseError as exc:
            raise ValidationError(f"store {self.path!r} is not an otstab history (SQLite "
                                  f"error: {exc})") from None

    def _init(self) -> None:
        cols = ", ".join(f'"{k}" {t}' for k, t in COLUMNS.items())
        with self.db:
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            self.db.execute(f"CREATE TABLE IF NOT EXISTS windows (id INTEGER PRIMARY KEY "
                            f"AUTOINCREMENT, {cols}, UNIQUE(model_version, window))")
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'") \
                .fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise ValidationError(f"store {self.path!r} has schema version {row[0]}, this "
                                      f"otstab reads version {SCHEMA_VERSION}")

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def __repr__(self) -> str:
        n = self.db.execute("SELECT COUNT(*) FROM windows").fetchone()[0]
        return f"History({self.path!r}, windows={n})"

    def record(self, *, model_version: str, window: str, result, shift, budget=None,
               reference: str = "", current: str = "", created: str | None = None,
               replace: bool = False) -> int:
        """Append one window: the certificate ``result`` (:class:`otstab.StabilityResult`),
        the shift cost ``shift`` (:class:`otstab.shift.ShiftCost`) and their comparison
        ``budget`` (:func:`otstab.budget_used`; computed when not given). ``reference`` and
        ``current`` identify the data (e.g. file fingerprints). Returns the row id. A window
        already recorded for this model version is refused unless ``replace``."""
        for name, val in (("model_version", model_version), ("window", window)):
            if not isinstance(val, str) or not val:
                raise ValidationError(f"{name} must be a non-empty string, got {val!r}")
        if budget is None:
            budget = budget_used(result, shift)
        lo, hi = budget.R_ci
        cert = {k: getattr(result, k, None) for k in (
            "value", "value_lower", "value_upper", "status", "r", "loss", "theta1", "theta2",
            "divergence", "risk_base", "solver", "message")}
        cert["n"] = getattr(result, "n", None)
        cert["ci"] = [lo, hi]
        cert["level"] = budget.level
        row = {
            "model_version": model_version, "window": window,
            "created": created or datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "loss": str(getattr(result, "loss", "")), "r_threshold": _real(result.r),
            "theta1": _real(result.theta1), "theta2": _real(result.theta2),
            "divergence": str(result.divergence), "cost": shift.cost,
            "R": _real(budget.R), "R_lower": _real(budget.R_lower),
            "R_upper": _real(budget.R_upper), "R_ci_low": _real(lo), "R_ci_high": _real(hi),
            "R_status": str(result.status), "S": _real(shift.value),
            "S_lower": _real(shift.value_lower), "S_upper": _real(shift.value_upper),
            "S_status": shift.status, "moving": _real(shift.moving),
            "reweighting": _real(shift.reweighting), "share": _real(budget.share),
            "outcome": budget.outcome, "conclusion": budget.conclusion,
            "n_ref": int(shift.n_ref), "n_cur": int(shift.n_cur), "reference": reference,
            "current": current,
            "certificate": json.dumps(jsonable(cert, strict=True)),
            "shift": shift.to_json(indent=None),
        }
        names = ", ".join(f'"{k}"' for k in row)
        marks = ", ".join("?" for _ in row)
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        try:
            with self.db:
                cur = self.db.execute(f"{verb} INTO windows ({names}) VALUES ({marks})",
                                      tuple(row.values()))
        except sqlite3.IntegrityError:
            raise ValidationError(f"window {window!r} of model version {model_version!r} is "
                                  "already in the store (replace=True to overwrite it)") \
                from None
        return int(cur.lastrowid or 0)

    def windows(self, model_version: str | None = None) -> pd.DataFrame:
        """The recorded windows (one row each, in the order they were recorded), of one model
        version or of all; NULL reads as nan."""
        query = "SELECT * FROM windows"
        args: tuple = ()
        if model_version is not None:
            query += " WHERE model_version = ?"
            args = (model_version,)
        frame = pd.read_sql_query(query + " ORDER BY id", self.db, params=args)
        for k, t in COLUMNS.items():
            if t == "REAL":
                frame[k] = pd.to_numeric(frame[k], errors="coerce").astype(float)
        return frame

    def model_versions(self) -> list[str]:
        return [r[0] for r in self.db.execute(
            "SELECT model_version FROM windows GROUP BY model_version ORDER BY MIN(id)")]

    def shift(self, model_version: str, window: str) -> dict:
        """The stored shift cost of a window (its ``to_dict()``)."""
        row = self.db.execute("SELECT shift FROM windows WHERE model_version = ? AND "
                              "window = ?", (model_version, window)).fetchone()
        if row is None:
            raise ValidationError(f"no window {window!r} of model version {model_version!r}")
        return json.loads(row[0])
