"""Shared result conventions: small dataclasses with ``to_dict``/``to_json``/``to_frame``,
``summary()``, a compact ``repr`` (shapes and headline numbers, never whole arrays: under
:data:`REPR_LIMIT` characters) and ``_repr_html_`` for notebooks.

``to_dict`` returns plain Python (lists, floats, dicts; pandas frames become lists of records),
``to_json`` encodes non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"`` so the
output is strict JSON.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from otstab_solvers.weights import ScaledWeights

__all__ = ["ResultMixin", "FrameResult", "jsonable", "brief", "REPR_LIMIT"]

#: the longest ``repr`` of a result
REPR_LIMIT = 1500


def jsonable(obj: Any, *, strict: bool = False) -> Any:
    """Convert numpy/pandas objects to plain Python; with ``strict`` encode inf/nan as strings."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v, strict=strict) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, strict=strict) for v in obj]
    if isinstance(obj, pd.DataFrame):
        return [jsonable(rec, strict=strict) for rec in obj.to_dict(orient="records")]
    if isinstance(obj, pd.Series):
        return jsonable(obj.tolist(), strict=strict)
    if isinstance(obj, ScaledWeights):  # (sample probabilities read from the weights)
        obj = obj.array()
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist(), strict=strict)
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if strict and not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        return x
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(
            {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.repr},
            strict=strict,
        )
    return obj


def brief(value: Any, width: int = 60) -> str:
    """A short description of ``value`` for a repr: numbers to 6 significant digits, arrays
    and frames by shape, long text and containers cut."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return repr(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    if isinstance(value, ScaledWeights):
        return f"<array {value.size} float64>"
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return brief(value.reshape(-1)[0].item(), width)
        return f"<array {'x'.join(map(str, value.shape))} {value.dtype}>"
    if isinstance(value, pd.DataFrame):
        return f"<DataFrame {value.shape[0]} rows x {value.shape[1]} columns>"
    if isinstance(value, pd.Series):
        return f"<Series {value.shape[0]} rows>"
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, dict) and len(value) > 4:
        return f"<dict of {len(value)}>"
    if isinstance(value, (list, tuple, dict)):
        text = repr(jsonable(value))
    elif isinstance(value, str):
        text = repr(value)
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[:width - 3] + "..."


class ResultMixin:
    """Mixin for result dataclasses. Fields declared with ``repr=False`` are left out of dicts
    and of the repr. Subclasses are declared ``@dataclass(repr=False)`` (a generated repr would
    print every array) and may set ``_repr_fields`` (the headline fields, in order)."""

    #: fields shown by ``repr`` (None: every field declared with ``repr=True``)
    _repr_fields: tuple | None = None
    #: set by @dataclass on each subclass (declared for type checkers: dataclasses.fields(self))
    __dataclass_fields__: ClassVar[dict[str, Any]]

    def _headline(self) -> list[tuple[str, Any]]:
        names: Sequence[str] | None = self._repr_fields
        if names is None:
            names = [f.name for f in dataclasses.fields(self) if f.repr]
        return [(nm, getattr(self, nm)) for nm in names]

    def __repr__(self) -> str:
        parts = [f"{nm}={brief(v)}" for nm, v in self._headline()]
        text = f"{type(self).__name__}({', '.join(parts)})"
        if len(text) > REPR_LIMIT:
            text = text[:REPR_LIMIT - 5] + " ...)"
        return text

    def summary(self) -> str:  # overridden where there is more to say
        return repr(self)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        """Notebook display: the summary, and the table of ``to_frame()`` (first 20 rows)."""
        out = [f"<pre>{html.escape(self.summary())}</pre>"]
        try:
            frame = self.to_frame()
        except Exception:  # noqa: BLE001 - a display must not raise
            frame = None
        if isinstance(frame, pd.DataFrame):
            out.append(frame.head(20).to_html(max_cols=20))
            if len(frame) > 20:
                out.append(f"<p>... {len(frame)} rows: see <code>to_frame()</code></p>")
        return "\n".join(out)

    def to_dict(self) -> dict:
        return jsonable(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        )

    def to_json(self, path=None, *, indent: int | None = 2) -> str:
        text = json.dumps(
            jsonable({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr},
                     strict=True),
            indent=indent,
        )
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    def to_frame(self) -> pd.DataFrame:  # pragma: no cover - overridden
        raise NotImplementedError


class FrameResult(ResultMixin):
    """A result whose content is one table (``table``, a DataFrame) and its settings.

    ``to_frame()`` returns a copy of the table with the settings in ``attrs`` (what these
    functions returned before they returned a result). For one release the result also
    answers the DataFrame's own attributes and indexing (``res["score"]``, ``res.iloc``,
    ``len(res)``...), each with a FutureWarning pointing to ``to_frame()``.
    """

    #: what the function was called (for the deprecation message)
    _function = "this function"

    def _attrs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.repr and f.name != "table"}

    def to_frame(self) -> pd.DataFrame:
        frame = self.table.copy()
        frame.attrs = {**self.table.attrs, **self._attrs()}
        return frame

    def to_dict(self) -> dict:
        return jsonable({"table": self.table.to_dict(orient="records"), **self._attrs()})

    def to_json(self, path=None, *, indent: int | None = 2) -> str:
        text = json.dumps(jsonable(
            {"table": self.table.to_dict(orient="records"), **self._attrs()}, strict=True),
            indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    def __len__(self) -> int:
        return len(self.table)

    def _frame_compat(self, what: str) -> pd.DataFrame:
        warnings.warn(f"{self._function} returns a {type(self).__name__} now, not a DataFrame; "
                      f"{what} on it is deprecated and will be removed in the next release: use "
                      f"res.to_frame(){'' if what.startswith('[') else '.'}{what}",
                      FutureWarning, stacklevel=3)
        return self.to_frame()

    def __getitem__(self, key):
        return self._frame_compat("[...]")[key]

    def __getattr__(self, name: str):
        # only reached for names the result does not have: the DataFrame's, for one release
        if name.startswith("_") or "table" not in self.__dict__ \
                or not hasattr(pd.DataFrame, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._frame_compat(name), name)
