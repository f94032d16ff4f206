"""Progress bars on stderr for long calls, and the package's loggers.

Long entry points (``compare``, ``feature_stability``, ``stability_curve``,
``worst_subpopulation``, ``conditional_shift``, ``harden``) take ``progress=None|True|False``:
None (the default) shows a bar only when stderr is a terminal, True always, False never. The bar
is tqdm's when tqdm is installed (the ``test`` extra has it), else one plain line on stderr
rewritten in place. Library code never prints: messages go to the standard ``logging`` module,
under the ``"otstab"`` logger (each module logs to ``otstab.<module>``); configure it with
``logging.basicConfig(level=logging.INFO)`` or ``logging.getLogger("otstab")``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from .errors import InputTypeError

__all__ = ["check_progress", "progress_bar", "logger"]

#: the package's logger; modules log to its children (``logging.getLogger(__name__)``)
logger = logging.getLogger("otstab")
logger.addHandler(logging.NullHandler())


def check_progress(progress) -> bool:
    """``progress`` as a decision: None -> whether stderr is a terminal; True/False as given."""
    if progress is None:
        stream = sys.stderr
        try:
            return bool(stream is not None and stream.isatty())
        except (AttributeError, ValueError):  # a closed or replaced stream
            return False
    if isinstance(progress, bool):
        return progress
    raise InputTypeError(f"progress must be None, True or False, got {progress!r}")


class _PlainBar:
    """A minimal stand-in for tqdm: ``desc: i/total`` on stderr, rewritten at most every
    0.2 s, with a final newline."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n = int(total), desc, 0
        self._last = 0.0
        self._t0 = time.perf_counter()
        self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        stream = sys.stderr
        if stream is None:
            return
        stream.write(f"\r{self.desc}: {self.n}/{self.total} ({now - self._t0:.0f} s)")
        stream.flush()

    def update(self, k: int = 1) -> None:
        self.n += k
        self._draw(force=self.n >= self.total)

    def close(self) -> None:
        self._draw(force=True)
        if sys.stderr is not None:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _NoBar:
    n = 0

    def update(self, k: int = 1) -> None:
        self.n += k

    def close(self) -> None:
        pass


class progress_bar:
    """Context manager: a bar of ``total`` steps with ``update(k)``; nothing when ``show`` is
    False (``show`` as returned by :func:`check_progress`)."""

    def __init__(self, total: int, desc: str, show: bool):
        self.total, self.desc, self.show = int(total), desc, bool(show)
        self._bar: Any = None

    def __enter__(self):
        if not self.show or self.total <= 0:
            self._bar = _NoBar()
            return self._bar
        try:
            from tqdm import tqdm
        except ImportError:  # no tqdm: the plain line
            self._bar = _PlainBar(self.total, self.desc)
        else:
            self._bar = tqdm(total=self.total, desc=self.desc, file=sys.stderr,
                             dynamic_ncols=True)
        return self._bar

    def __exit__(self, *exc) -> None:
        self._bar.close()
