"""BLAS threads for the passes that follow a linear model's scores.

A certificate of a linear model makes one pass over X for the scores (``X @ coef``: BLAS
spreads it over the cores) and then works on vectors of the size of the data, in blocks of a
few thousand numbers: the dual's sums, Q*'s weights, the audit's sums, the model's scores of
a few hundred sampled rows. BLAS threads a dot product above 10,000 numbers (OpenBLAS) and a
matrix-vector product above about 9,000 entries, and its worker threads then busy-wait beside
the single-threaded NumPy passes that follow, slowing every one of them. On this project's
2-core machine a hinge certificate at n = 1e6, d = 50 took 75 ms with BLAS at its default two
threads after the scores and 41 ms with one (docs/scale.md).

:func:`one_blas_thread` limits BLAS to one thread for the duration of those passes
(threadpoolctl, a core dependency, imported on first use). The limit is process-wide while it
lasts: BLAS calls made meanwhile by other threads of the same process also run on one thread.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["one_blas_thread", "blas_threads", "usable_cpus"]

_CONTROLLER: list = []  # the threadpoolctl controller, made on first use (it scans the libraries)


def _controller():
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover - a core dependency
            _CONTROLLER.append(None)
        else:
            _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


def one_blas_thread():
    """A context manager that limits BLAS to one thread (a no-op without threadpoolctl)."""
    ctl = _controller()
    return contextlib.nullcontext() if ctl is None else ctl.limit(limits=1, user_api="blas")


def blas_threads() -> int:
    """The number of threads BLAS would use now (the largest over the loaded BLAS libraries;
    1 without threadpoolctl or when none is found)."""
    ctl = _controller()
    if ctl is None:  # pragma: no cover - a core dependency
        return 1
    counts = [int(lib.num_threads) for lib in ctl.select(user_api="blas").lib_controllers]
    return max(counts, default=1)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system reports it): the
    threads of a pass that runs while BLAS is limited to one thread (:func:`blas_threads`
    then says 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
