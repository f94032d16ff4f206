"""pytest configuration of the benchmark suites (see benchmarks/_benchlib.py for the modes).

Adds to the pytest-benchmark JSON: the machine (CPU model from /proc/cpuinfo, cores, memory),
package versions, the mode, and every skipped or failed benchmark test with its reason, so that
``benchmarks/render.py`` can list them instead of silently dropping them.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import _benchlib as bl  # noqa: E402

_SESSION = {"skipped": [], "failed": [], "start": None, "limiter": None}
#: BLAS threads during the benchmarks. On a small machine shared with other processes, threaded
#: OpenBLAS turns a dot product of 1e5 floats from microseconds into milliseconds (threads wait
#: for busy cores), which would dominate every O(n) method; one thread gives stable timings.
BLAS_THREADS = int(os.environ.get("OTSTAB_BENCH_BLAS_THREADS", "1"))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """One process for the benchmarks: pyproject's ``-n auto`` spreads the tests over every
    core, but timings need the machine to themselves (and pytest-benchmark times nothing
    under xdist). ``-n 2`` on the command line still distributes them."""
    return 0


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: quick benchmark subset (< 2 min): -m quick")
    config.addinivalue_line("markers", "full: full-suite size; runs only with OTSTAB_BENCH=full")
    _SESSION["start"] = time.time()
    _limit_blas()


def _limit_blas():
    """Pin every BLAS loaded so far to BLAS_THREADS (called again after the heavy imports)."""
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        if bl.DEFAULT_BLAS_THREADS is None:  # what a user's process gets (before pinning)
            counts = [d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"]
            bl.DEFAULT_BLAS_THREADS = max(counts) if counts else None
        _SESSION["limiter"] = threadpool_limits(limits=BLAS_THREADS, user_api="blas")
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
            os.environ.setdefault(var, str(BLAS_THREADS))


def _threadpools() -> list:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover
        return [{"note": "threadpoolctl not installed; BLAS threads set through environment "
                         f"variables to {BLAS_THREADS}"}]
    return [{k: v for k, v in d.items() if k in ("user_api", "internal_api", "num_threads",
                                                  "version", "threading_layer")}
            for d in threadpool_info()]


@pytest.fixture(scope="session", autouse=True)
def _warm_imports():
    """Import cvxpy and run every available backend once on a tiny problem (not timed), so that
    one-time import costs are not billed to the first benchmark."""
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cvxpy  # noqa: F401
        import scipy.optimize  # noqa: F401
        import scipy.special  # noqa: F401
        from otstab_solvers.conic import BACKENDS, ConicProgram

        import otstab  # noqa: F401
        import otstab.modeling._models  # noqa: F401

        c1 = np.column_stack([np.zeros(10), 1.0 - np.linspace(-1, 2, 10)])
        c2 = np.array([[0.0, 0.25]])
        for div in ("kl", "chi2"):
            prog = ConicProgram(c1, c2, bl.THETA2, div)
            for name, backend in BACKENDS.items():
                if backend.availability()[0]:
                    prog.solve(name, 1.5 * float(np.mean(np.maximum(c1[:, 1], 0))))
    _limit_blas()
    yield


@pytest.fixture(autouse=True, scope="module")
def _clear_instances():
    yield
    bl.clear_cache()


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(
            report.longrepr)
        if reason.startswith("Skipped: "):
            reason = reason[len("Skipped: "):]
        _SESSION["skipped"].append({"test": report.nodeid, "reason": reason})
    elif report.failed and report.when == "call":
        msg = getattr(report.longrepr, "reprcrash", None)
        _SESSION["failed"].append({"test": report.nodeid,
                                   "reason": msg.message if msg else str(report.longrepr)[:500]})


def _proc_field(path: str, key: str) -> str | None:
    """The value after ``key:`` on the first such line of a /proc file (None if absent)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "nproc": os.cpu_count()}
    try:
        info["nproc_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    cpu = _proc_field("/proc/cpuinfo", "model name")
    if cpu is not None:
        info["cpu_model"] = cpu
    mem = _proc_field("/proc/meminfo", "MemTotal")
    if mem is not None:
        info["mem_total_gib"] = round(int(mem.split()[0]) / 2**20, 1)  # "<kB> kB"
    try:
        info["loadavg_at_end"] = list(os.getloadavg())
    except OSError:
        pass
    return info


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for pkg in ("otstab", "numpy", "scipy", "cvxpy", "clarabel", "ecos", "scs", "mosek",
                "pandas", "pytest-benchmark", "numba"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def pytest_benchmark_update_json(config, benchmarks, output_json):
    from otstab_solvers.conic import available_backends

    output_json["otstab"] = {
        "mode": bl.MODE,
        "blas_threads": BLAS_THREADS,
        "threadpools": _threadpools(),
        "markexpr": config.getoption("markexpr", default="") or "",
        "machine": _machine(),
        "versions": _versions(),
        "conic_backends": available_backends(),
        "tolerances": bl.TOL,
        "allowed_to_fail": sorted(bl.ALLOWED_TO_FAIL),
        "scs_time_limit_s": bl.SCS_TIME_LIMIT,
        "theta1": bl.THETA1,
        "theta2": bl.THETA2,
        "r_factor": bl.R_FACTOR,
        "skipped": _SESSION["skipped"],
        "failed": _SESSION["failed"],
        "session_wall_s": time.time() - (_SESSION["start"] or time.time()),
    }
