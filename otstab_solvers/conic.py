"""Conic programs of Theorems 2 (KL, exponential cone) and 3 (chi2, SOCP), built with cvxpy.

The programs take the reduced form ``(c1, c2)`` (see the package docstring). They are built
vectorised over samples (one constraint block per piece k, no loop over samples) with the
threshold ``r`` and, optionally, ``c2`` as cvxpy Parameters, so a sweep over r or over features
compiles once (DPP).

KL (Theorem 2), variables h >= 0, q >= h^2, t, eta >= 0, p::

    minimize  -h r + t
    s.t.  (p_i - t, theta2, eta_i) in K_exp   i.e. theta2 exp((p_i - t)/theta2) <= eta_i
          c1[i,k] h + c2[i,k] q <= p_i        for all i, k
          mean(eta) <= theta2
    R = -(optimal value)

chi2 (Theorem 3), variables h >= 0, q >= h^2, alpha, eta >= 0::

    minimize  -h r - alpha - theta2 + (theta2/n) sum eta_i^2
    s.t.  c1[i,k] h + c2[i,k] q + alpha + 2 theta2 <= 2 theta2 eta_i

theta2 = inf (no reweighting) for either divergence::

    minimize  -h r + mean(p)   s.t.  c1[i,k] h + c2[i,k] q <= p_i

Sample weights (P0 = sum_i pi_i delta_{z_i}, ``weights=pi``): every mean over samples becomes
the pi-weighted sum (KL: ``sum_i pi_i eta_i <= 1``; chi2: ``theta2 sum_i pi_i eta_i^2``;
theta2 = inf: ``sum_i pi_i p_i``). Rows of zero weight enter no sum and are dropped (an eta
with no price in the objective would be unbounded).

Backends are small adapter classes with explicit status maps (after cvxpy's own
``reductions/solvers/conic_solvers``): each maps the solver's native status to one of
``optimal``, ``inaccurate``, ``infeasible``, ``unbounded``, ``failed``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import math
import os
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

from .errors import SolverNotAvailableError
from .result import FAILED, INACCURATE, INFEASIBLE, OPTIMAL, UNBOUNDED, DualSolution

__all__ = ["ConicProgram", "BACKENDS", "CONIC_ORDER", "get_backend", "available_backends",
           "captured_output"]

# cvxpy's own statuses, used where a solver's native status is not exposed
_CVXPY_MAP = {
    "optimal": OPTIMAL,
    "optimal_inaccurate": INACCURATE,
    "infeasible": INFEASIBLE,
    "infeasible_inaccurate": INACCURATE,
    "unbounded": UNBOUNDED,
    "unbounded_inaccurate": INACCURATE,
    "user_limit": FAILED,
    "solver_error": FAILED,
    "infeasible_or_unbounded": FAILED,
}


#: characters of a backend's own output kept in a solution (``info["backend_output"]``)
OUTPUT_CHARS = 2000
_CAPTURE_LOCK = threading.Lock()


_LIBC: list = []


def _flush_c_stdio() -> None:
    """Flush the C library's stdout / stderr buffers (a solver's printf to a file or pipe is
    block-buffered and would otherwise reach the terminal after the capture ends)."""
    try:
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None))
        _LIBC[0].fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - no C library to flush
        pass


@contextlib.contextmanager
def captured_output():
    """Capture what a backend writes to file descriptors 1 and 2 (SCS prints "ERROR: could
    not determine problem status." from C, whatever its verbosity) and the warnings it raises
    (cvxpy's "Solution may be inaccurate"), so that nothing reaches the user's terminal.
    Yields a dict that holds, on exit, ``"output"`` (text, at most :data:`OUTPUT_CHARS`
    characters) and ``"warnings"`` (their messages). The descriptors are process-wide: one
    thread captures at a time, and a solve that finds another capturing keeps only the
    warnings."""
    box = {"output": "", "warnings": []}
    owner = _CAPTURE_LOCK.acquire(blocking=False)
    saved = []
    tmp = None
    try:
        if owner:
            try:
                tmp = tempfile.TemporaryFile()
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                _flush_c_stdio()
                for fd in (1, 2):
                    saved.append((fd, os.dup(fd)))
                    os.dup2(tmp.fileno(), fd)
            except OSError:  # no descriptors to redirect (an embedded interpreter)
                pass
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield box
            finally:
                box["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    finally:
        if saved:
            _flush_c_stdio()
        for fd, old in saved:
            os.dup2(old, fd)
            os.close(old)
        if tmp is not None:
            tmp.seek(0)
            text = tmp.read(OUTPUT_CHARS + 1).decode("utf-8", errors="replace").strip()
            box["output"] = text if len(text) <= OUTPUT_CHARS else text[:OUTPUT_CHARS] + "..."
            tmp.close()
        if owner:
            _CAPTURE_LOCK.release()


def _said(box) -> dict:
    """``info`` entries of what the backend printed or warned (none when it was silent)."""
    out = {}
    if box["output"]:
        out["backend_output"] = box["output"]
    if box["warnings"]:
        out["backend_warnings"] = list(box["warnings"])
    return out


def _chatter(box) -> str:
    """A backend's output and warnings as one line (empty when it said nothing)."""
    parts = []
    if box["output"]:
        parts.append("backend output: " + " ".join(box["output"].split()))
    parts += box["warnings"]
    return "; ".join(parts)


class ConicBackend:
    """Adapter for one cvxpy solver."""

    name = ""
    cvxpy_name = ""
    module = ""
    pip = ""
    supports_exp_cone = True
    status_map: dict = {}
    default_options: dict = {}

    def availability(self) -> tuple[bool, str]:
        """(available, reason if not)."""
        try:
            importlib.import_module(self.module)
        except ImportError:
            return False, f"{self.name} is not installed; install it with `pip install {self.pip}`"
        import cvxpy as cp

        if self.cvxpy_name not in cp.installed_solvers():
            return False, f"cvxpy does not see {self.name}; reinstall with `pip install {self.pip}`"
        return True, ""

    #: key of the native status in cvxpy's ``solver_stats.extra_stats["info"]`` (None: not
    #: exposed, use cvxpy's status)
    info_status_key: str | None = None

    def native_status(self, problem) -> str:
        extra = problem.solver_stats.extra_stats
        if self.info_status_key is not None:
            try:
                value = extra["info"][self.info_status_key]
                return str(int(value)) if isinstance(value, (int, float)) else str(value)
            except (TypeError, KeyError):
                pass
        return str(problem.status)

    def map_status(self, native: str, cvxpy_status: str) -> str:
        if native in self.status_map:
            return self.status_map[native]
        return _CVXPY_MAP.get(cvxpy_status, FAILED)

    def options(self, user: dict) -> dict:
        opts = dict(self.default_options)
        opts.update(user)
        return opts


class ClarabelBackend(ConicBackend):
    name = "clarabel"
    cvxpy_name = "CLARABEL"
    module = "clarabel"
    pip = "clarabel"
    # cvxpy does not expose Clarabel's native status; cvxpy maps Solved -> optimal,
    # AlmostSolved -> optimal_inaccurate, MaxIterations/MaxTime -> user_limit,
    # NumericalError/InsufficientProgress -> solver_error
    status_map = {}
    # a shorter step fraction halves the InsufficientProgress failures seen on exp-cone
    # instances (23 -> 12 of 360 random hinge instances)
    default_options = {"max_iter": 400, "max_step_fraction": 0.9}


class EcosBackend(ConicBackend):
    name = "ecos"
    cvxpy_name = "ECOS"
    module = "ecos"
    pip = "ecos"
    # ECOS exitFlag codes
    status_map = {"0": OPTIMAL, "10": INACCURATE, "1": INFEASIBLE, "11": INACCURATE,
                  "2": UNBOUNDED, "12": INACCURATE, "-1": FAILED, "-2": FAILED, "-3": FAILED,
                  "-4": FAILED, "-7": FAILED}
    default_options = {"max_iters": 200}
    info_status_key = "exitFlag"


class ScsBackend(ConicBackend):
    name = "scs"
    cvxpy_name = "SCS"
    module = "scs"
    pip = "scs"
    status_map = {"solved": OPTIMAL, "solved_inaccurate": INACCURATE, "infeasible": INFEASIBLE,
                  "infeasible_inaccurate": INACCURATE, "unbounded": UNBOUNDED,
                  "unbounded_inaccurate": INACCURATE, "failure": FAILED,
                  "interrupted": FAILED}
    default_options = {"eps_abs": 1e-9, "eps_rel": 1e-9, "max_iters": 20000}
    info_status_key = "status"


class MosekBackend(ConicBackend):
    name = "mosek"
    cvxpy_name = "MOSEK"
    module = "mosek"
    pip = "otstab[mosek]"
    status_map = {}

    def availability(self) -> tuple[bool, str]:
        ok, why = super().availability()
        if not ok:
            return ok, why
        import mosek

        try:
            with mosek.Env() as env:
                env.checkoutlicense(mosek.feature.pts)
        except mosek.Error as exc:
            return False, (
                "MOSEK is installed but has no usable licence "
                f"({str(exc).strip() or type(exc).__name__}); get one at "
                "https://www.mosek.com/products/academic-licenses/ or use solver='clarabel'"
            )
        return True, ""


BACKENDS = {b.name: b for b in (ClarabelBackend(), MosekBackend(), EcosBackend(), ScsBackend())}
#: the order ``solver="auto"`` tries conic backends in: Clarabel (always installed, accurate
#: interior point), MOSEK (when licensed), ECOS (interior point), SCS (first-order; last resort)
CONIC_ORDER = ("clarabel", "mosek", "ecos", "scs")


def get_backend(name: str) -> ConicBackend:
    key = name.lower()
    if key not in BACKENDS:
        raise SolverNotAvailableError(
            f"unknown conic solver {name!r}; expected one of {sorted(BACKENDS)}"
        )
    return BACKENDS[key]


def available_backends() -> dict[str, str]:
    """Map every backend to "" (available) or the reason it is not."""
    return {name: b.availability()[1] for name, b in BACKENDS.items()}


class ConicProgram:
    """The conic program for a reduced form; ``r`` (and optionally ``c2``) are Parameters.

    Parameters
    ----------
    c1 : (n, K) array
    c2 : (1, K) or (n, K) nonnegative array
    theta2 : float in (0, inf]
    divergence : "kl" or "chi2"
    c2_parameter : bool
        Make ``c2`` a Parameter (for per-feature sweeps that only change c2).
    weights : (n,) nonnegative array, optional
        Probabilities of the samples (P0 = sum_i weights_i delta_{z_i}); None: uniform.
    """

    def __init__(self, c1, c2, theta2: float, divergence: str, *, c2_parameter: bool = False,
                 weights=None):
        import cvxpy as cp

        t0 = time.perf_counter()
        c1 = np.asarray(c1, dtype=np.float64)
        c2 = np.asarray(c2, dtype=np.float64)
        self._live = None
        pw = None
        if weights is not None:
            pw = np.asarray(weights, dtype=np.float64)
            self._live = pw > 0
            c1 = c1[self._live]
            if c2.shape[0] > 1:
                c2 = c2[self._live]
            pw = pw[self._live] / float(np.sum(pw[self._live]))
        n, K = c1.shape
        self.n, self.K = n, K
        self.divergence = divergence
        self.theta2 = theta2
        self.r = cp.Parameter(name="r")
        self.h = cp.Variable(nonneg=True, name="h")
        self.q = cp.Variable(nonneg=True, name="q")
        self.c2 = cp.Parameter(c2.shape, nonneg=True, name="c2", value=c2) if c2_parameter else c2
        self.alpha = None
        cons = [cp.square(self.h) <= self.q]
        h, q = self.h, self.q

        def piece(k):
            c2k = self.c2[:, k] if c2.shape[0] > 1 else self.c2[0, k]
            return c1[:, k] * h + c2k * q

        if math.isinf(theta2):
            p = cp.Variable(n, name="p")
            cons += [piece(k) <= p for k in range(K)]
            obj = -h * self.r + (cp.sum(p) / n if pw is None else pw @ p)
        elif divergence == "kl":
            p = cp.Variable(n, name="p")
            t = cp.Variable(name="t")
            eta = cp.Variable(n, nonneg=True, name="eta")
            cons += [piece(k) <= p for k in range(K)]
            # scaled form: exp((p_i - t)/theta2) <= eta_i, mean(eta) <= 1
            cons += [cp.ExpCone((p - t) / theta2, np.ones(n), eta),
                     (cp.sum(eta) / n if pw is None else pw @ eta) <= 1]
            obj = -h * self.r + t
        elif divergence == "chi2":
            self.alpha = cp.Variable(name="alpha")
            eta = cp.Variable(n, nonneg=True, name="eta")
            cons += [piece(k) + self.alpha + 2 * theta2 <= 2 * theta2 * eta for k in range(K)]
            square = ((theta2 / n) * cp.sum_squares(eta) if pw is None
                      else theta2 * cp.sum_squares(cp.multiply(np.sqrt(pw), eta)))
            obj = -h * self.r - self.alpha - theta2 + square
        else:
            raise ValueError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
        self.problem = cp.Problem(cp.Minimize(obj), cons)
        self.build_time = time.perf_counter() - t0
        self._compiled_for: set[str] = set()

    def solve(self, backend: ConicBackend | str, r: float, *, c2=None, **options) -> DualSolution:
        """Solve at threshold ``r`` (and ``c2`` if it is a Parameter) with one backend."""
        if isinstance(backend, str):
            backend = get_backend(backend)
        ok, why = backend.availability()
        if not ok:
            raise SolverNotAvailableError(why)
        self.r.value = float(r)
        if c2 is not None:
            if not hasattr(self.c2, "value"):
                raise ValueError("this program was built without c2_parameter=True")
            c2 = np.asarray(c2, dtype=np.float64)
            if self._live is not None and c2.ndim == 2 and c2.shape[0] == self._live.size > 1:
                c2 = c2[self._live]  # per-sample prices: the rows of positive weight
            self.c2.value = c2.reshape(self.c2.shape)
        first = backend.name not in self._compiled_for
        t0 = time.perf_counter()
        opts = backend.options(options)
        # the backend's own printing and warnings are kept in the solution (info and, when
        # it is not optimal, native_status: the solver log), not shown; verbose=True shows it
        quiet = contextlib.nullcontext({"output": "", "warnings": []}) if opts.get("verbose") \
            else captured_output()
        try:
            with quiet as box:
                self.problem.solve(solver=backend.cvxpy_name, **opts)
        except Exception as exc:  # cvxpy.error.SolverError and solver-internal errors
            wall = time.perf_counter() - t0
            said = _chatter(box)
            return DualSolution(math.nan, None, math.nan, FAILED, backend.name,
                                native_status=f"{type(exc).__name__}: {exc}"
                                + (f"; {said}" if said else ""),
                                solve_time=wall, info={"error": str(exc), **_said(box)})
        wall = time.perf_counter() - t0
        self._compiled_for.add(backend.name)
        stats = self.problem.solver_stats
        solve_time = float(stats.solve_time) if stats.solve_time is not None else wall
        compile_time = float(getattr(self.problem, "compilation_time", None) or 0.0)
        native = backend.native_status(self.problem)
        status = backend.map_status(native, str(self.problem.status))
        hv = self.h.value
        said = _chatter(box)
        if hv is None or self.problem.value is None or not np.isfinite(self.problem.value):
            status = FAILED if status == OPTIMAL else status
            return DualSolution(math.nan, None, math.nan, status, backend.name,
                                native + (f"; {said}" if said else ""),
                                solve_time=solve_time, compile_time=compile_time,
                                info=_said(box))
        if said and status != OPTIMAL:
            native = f"{native}; {said}"
        alpha = None if self.alpha is None or math.isinf(self.theta2) else float(
            self.alpha.value)  # type: ignore[arg-type]  # solved: the variable has a value
        if self.divergence == "chi2" and math.isinf(self.theta2):
            alpha = 0.0
        return DualSolution(
            h=max(float(hv), 0.0), alpha=alpha, value=-float(self.problem.value), status=status,
            solver=backend.name, native_status=native,
            iterations=int(stats.num_iters or 0), solve_time=solve_time,
            compile_time=compile_time,
            info={"first_solve": first, "wall_time": wall, "build_time": self.build_time,
                  **_said(box)},
        )
