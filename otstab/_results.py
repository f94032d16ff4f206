"""Shared result conventions: small dataclasses with ``to_dict``/``to_json``/``to_frame``.

``to_dict`` returns plain Python (lists, floats, dicts; pandas frames become lists of records),
``to_json`` encodes non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"`` so the
output is strict JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["ResultMixin", "jsonable"]


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


class ResultMixin:
    """Mixin for result dataclasses. Fields declared with ``repr=False`` are left out of dicts."""

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
