"""First-order solver of the stability dual for differentiable models (Algorithms 1 and 2).

The dual of the stability criterion (MATH.md, Proposition 1) is a concave problem in the scalar
``h >= 0`` once the d-transform

    l_h(z_i) = max_x  h * loss(x, y_i) - theta1 * ||x - x_i||^2      (masked coordinates move)

can be evaluated. For a nonlinear model the inner maximisation has no closed form; this module
solves it by gradient ascent (Adam, as in the paper) on all samples at once, given only a
function ``loss_and_grad(X, y) -> (loss (m,), grad_X (m, d))``.

Outer loop
----------
``outer="envelope"`` (default). By the envelope theorem ``d l_h(z_i)/dh = loss(z_i*(h))``, so
the dual derivative is ``g(h) = r - mean_i w_i(h) loss(z_i*(h))`` with the weights of the most
sensitive distribution (KL: ``n softmax(l_h/theta2)``; chi2: ``((l_h + alpha)/(2 theta2) + 1)_+``
with the exact ``alpha``). ``g`` is nonincreasing, and its root is found by a safeguarded
search: Newton steps on ``log(risk(h)) - log(r)`` with a slope estimate computed from
quantities already at hand (no extra evaluations), growth steps until a bracket
``g(lo) > 0 > g(hi)`` exists, then Newton kept inside the bracket, the bracket's secant when
Newton leaves it and bisection when ``|g|`` stalls. Inner solves are warm-started from the
nearest solved ``h`` (displacement rescaled by the ratio of the ``h`` values); by default the
other bracket end, the unmoved data and, for classification-like labels, a "shared direction"
start (every sample of a label moved along its label's mean loss gradient) are screened too,
keeping the best local maximum per sample. Far from the root the inner tolerance is loosened
(inexact Newton).

``outer="adam"`` is the paper's loop: a fixed number of warm-started inner Adam steps, then one
Adam ascent step on ``h`` along ``g(h)``. It is kept for comparison; it needs many more gradient
evaluations (see the tests and docs/nonlinear.md).

What the result means
---------------------
The inner problem is nonconcave for a nonlinear model (and for a linear one with a nonconvex
loss at large ``h``), so the inner solutions are local maxima: the ``l_h`` used are lower bounds
of the true d-transform and the reported ``value`` (the dual objective at the final ``h`` with
these ``l_h``) is a **local, inner-approximate estimate** of ``R``, not a certified bound; since
the dual objective decreases in ``l_h``, missed inner maxima bias it upwards (towards more
stability), and of two runs the lower value found better inner maxima. The
returned distribution ``Q*`` is nevertheless a genuine perturbation: its risk is brought to
``r`` by a final mass split between the two bracketing ``h`` values, so its OT cost
``primal_cost`` (recomputed from the moved points and weights) is an upper bound on the true
``R`` whenever ``risk >= r``.

Counting: ``n_grad_evals`` is the number of per-sample loss-and-gradient evaluations (the total
number of rows passed to ``loss_and_grad``); ``n_calls`` the number of calls.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np

from .smooth import _mask_vector
from .weights import chi2_alpha, chi2_dual_term, kl_dual_term, phi, pmean, support_max, weights_at

__all__ = ["FirstOrderSolution", "solve_first_order"]

_BETA1 = 0.9
_BETA2 = 0.999


@dataclass
class FirstOrderSolution:
    """Result of :func:`solve_first_order`.

    Attributes
    ----------
    h : float
        Dual multiplier at which ``value`` was attained.
    alpha : float or None
        chi2 only: the mass multiplier at ``h`` (exact for the ``l_h`` found).
    value : float
        Dual objective at ``h`` with the inner-approximate ``l_h``: a local estimate of ``R``.
    primal_cost : float
        OT cost of the returned distribution (moved points and weights); an upper bound on the
        true ``R`` when ``risk >= r`` (any feasible perturbation is).
    risk : float
        ``E_Q*[W loss]`` of the returned distribution (``r`` up to rounding after the split).
    risk_base : float
        Mean loss on the unmoved data (p-weighted with ``weights``).
    X_star, weights, loss_star, lh : ndarray
        Per sample at ``h``: maximisers (n, d), weights (n,), loss at the maximisers and
        the inner-approximate d-transform.
    atom_source, atom_share, atom_X, atom_weight, atom_loss : ndarray
        The returned distribution as atoms ``sum_a p_(src a) share_a delta_(atom_X_a,
        atom_weight_a)`` (``p`` the sample probabilities, 1/n without ``weights``):
        the n samples at ``h``, or, after a split, the 2n atoms of the mixture of the
        distributions at the two bracketing ``h`` values (``atom_source`` is the sample each
        atom comes from; its shares sum to 1 per sample).
    h_split : tuple of float or None
        The two ``h`` values mixed, if a split was needed.
    trace : dict of lists
        Per outer iteration: ``h``, ``risk`` (``E_Q(t)[W loss]``), ``value`` and cumulative
        ``n_grad_evals``.
    n_grad_evals, n_calls, iterations : int
    status : str
        ``"local_optimum"`` (the outer search converged; value is a local estimate),
        ``"max_iter"``, ``"unreachable"`` (the risk stayed below ``r`` as ``h`` grew) or
        ``"stopped"`` (the callback asked to stop).
    message : str
    """

    h: float
    alpha: float | None
    value: float
    primal_cost: float
    risk: float
    risk_base: float
    X_star: np.ndarray
    weights: np.ndarray
    loss_star: np.ndarray
    lh: np.ndarray
    atom_source: np.ndarray
    atom_share: np.ndarray
    atom_X: np.ndarray
    atom_weight: np.ndarray
    atom_loss: np.ndarray
    h_split: tuple | None
    trace: dict
    n_grad_evals: int
    n_calls: int
    iterations: int
    status: str
    outer: str
    message: str = ""
    info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------


def _scalar(x, name: str, *, low=None, low_open=False, allow_inf=False) -> float:
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real number, got bool")
    try:
        v = float(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}") from exc
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {x}")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {x}")
    return v


class _Counter:
    def __init__(self, fn, d):
        self.fn = fn
        self.d = d
        self.rows = 0
        self.calls = 0

    def __call__(self, Z, y):
        self.rows += Z.shape[0]
        self.calls += 1
        out = self.fn(Z.copy(), y)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("loss_and_grad must return a tuple (loss, grad_X)")
        loss = np.asarray(out[0], dtype=np.float64).reshape(-1)
        grad = np.asarray(out[1], dtype=np.float64)
        if loss.shape != (Z.shape[0],):
            raise ValueError(f"loss_and_grad returned loss of shape {loss.shape}, "
                             f"expected ({Z.shape[0]},)")
        if grad.shape != Z.shape:
            raise ValueError(f"loss_and_grad returned grad of shape {grad.shape}, "
                             f"expected {Z.shape}")
        return loss, grad


def _progress(total: int, enabled: bool, desc: str):
    """A tqdm bar when asked for and on a terminal; otherwise None (tqdm is optional)."""
    if not enabled:
        return None
    try:
        if not sys.stderr.isatty():
            return None
        from tqdm.auto import tqdm  # noqa: PLC0415 - optional dependency
    except Exception:
        return None
    try:
        return tqdm(total=total, desc=desc, leave=False)
    except Exception:
        return None


# ----------------------------------------------------------------------------------------------
# inner problem
# ----------------------------------------------------------------------------------------------


class _Inner:
    """Ascent of ``h loss(z) - theta1 ||z - x||^2`` for every row, all rows at once.

    ``method="adam"``: Adam (the paper's inner optimiser) with a per-row step size that starts
    at the size of a plain gradient step ``|G| / (2 theta1)`` (capped by ``lr``) and is halved
    whenever a step would lower that row's objective (the step is then rejected), so every row
    ascends monotonically. ``method="gradient"``: gradient ascent ``z += s G / (2 theta1)``
    with a per-row factor ``s`` (start 1, halved on a rejected step, grown by 1.5 on an
    accepted one, at most 4); for a locally linear loss the first step lands on the maximiser.
    """

    def __init__(self, lg, X0, y, mv, theta1, *, steps, lr, tol, xscale, method="adam",
                 screen=10):
        self.lg = lg
        self.X0 = X0
        self.y = y
        self.mv = mv
        self.theta1 = theta1
        self.steps = steps
        self.lr = lr
        self.tol = tol
        self.xscale = xscale
        self.method = method
        self.screen = screen
        self._tol = tol
        #: projection radius of the moves (None: none); set per inner solve
        self.radius: float | None = None

    def _project(self, Z, X0):
        """``Z`` moved onto the ball of :attr:`radius` around ``X0`` where it lies outside."""
        if self.radius is None or not math.isfinite(self.radius):
            return Z
        D = Z - X0
        nrm = np.sqrt(np.sum(D * D, axis=1))
        over = nrm > self.radius
        if not over.any():
            return Z
        return np.where(over[:, None], X0 + D * (self.radius / np.where(over, nrm, 1.0))[:, None],
                        Z)

    def solve(self, h: float, starts: list[np.ndarray], tol: float | None = None):
        """Best local maximum per sample over the start points. Returns (Z, loss, grad, J).

        ``starts[0]`` (the warm start) is run to convergence first. The other starts run
        ``screen`` steps; a sample continues from one of them only if it already beats the warm
        start's local maximum there (the objective increases monotonically along each run, so
        such a start ends at a better local maximum).
        """
        n = self.X0.shape[0]
        self._tol = self.tol if tol is None else max(tol, self.tol)
        st = self._init(h, starts[0], self.X0, self.y)
        self._run(h, st, self.steps)
        S = len(starts) - 1
        if S == 0:
            return st["Z"], st["loss"], st["grad"], st["J"]
        X0 = np.tile(self.X0, (S, 1))
        y = np.concatenate([self.y] * S)
        ex = self._init(h, np.concatenate(starts[1:], axis=0), X0, y)
        self._run(h, ex, min(self.screen, self.steps))
        Jx = ex["J"].reshape(S, n)
        k = np.argmax(Jx, axis=0)
        gain = Jx[k, np.arange(n)] - st["J"]
        win = np.nonzero(gain > 1e-12 * (1.0 + np.abs(st["J"])))[0]
        if win.size:
            pick = k[win] * n + win
            sub = {key: v[pick] for key, v in ex.items()}
            self._run(h, sub, self.steps)
            for key in ("Z", "loss", "grad", "J"):
                st[key][win] = sub[key]
        return st["Z"], st["loss"], st["grad"], st["J"]

    def _init(self, h, Z, X0, y) -> dict:
        th = self.theta1
        Z = self._project(Z.copy(), X0)
        loss, grad = self.lg(Z, y)
        D = Z - X0
        J = h * loss - th * np.sum(D * D, axis=1)
        G = (h * grad - 2.0 * th * D) * self.mv
        if self.method == "adam":
            lr = np.minimum(np.max(np.abs(G), axis=1) / (2.0 * th), self.lr)
        else:
            lr = np.ones(Z.shape[0])
        return {"Z": Z, "X0": X0, "y": y, "loss": loss, "grad": grad, "J": J, "G": G,
                "m": np.zeros_like(Z), "v": np.zeros_like(Z), "k": np.zeros(Z.shape[0]),
                "lr": lr}

    def _run(self, h, st: dict, steps: int) -> int:
        """Up to ``steps`` ascent steps on the rows of ``st`` (updated in place)."""
        th = self.theta1
        mv = self.mv
        Z, G, J, lr = st["Z"], st["G"], st["J"], st["lr"]
        m, v, k = st["m"], st["v"], st["k"]
        tol_g = self._tol * 2.0 * th * self.xscale
        active = np.nonzero(np.sqrt(np.sum(G * G, axis=1)) > tol_g)[0]
        done = 0
        for _ in range(max(int(steps), 0)):
            if active.size == 0:
                break
            done += 1
            a = active
            if self.method == "adam":
                k[a] += 1.0
                m[a] = _BETA1 * m[a] + (1.0 - _BETA1) * G[a]
                v[a] = _BETA2 * v[a] + (1.0 - _BETA2) * G[a] ** 2
                mh = m[a] / (1.0 - _BETA1 ** k[a])[:, None]
                vh = v[a] / (1.0 - _BETA2 ** k[a])[:, None]
                step = lr[a, None] * mh / (np.sqrt(vh) + 1e-30)
            else:
                step = (lr[a] / (2.0 * th))[:, None] * G[a]
            Zn = self._project(Z[a] + step * mv, st["X0"][a])
            ln, gn = self.lg(Zn, st["y"][a])
            Dn = Zn - st["X0"][a]
            Jn = h * ln - th * np.sum(Dn * Dn, axis=1)
            ok = np.isfinite(Jn) & (Jn >= J[a] - 1e-14 * (1.0 + np.abs(J[a])))
            acc = a[ok]
            Z[acc] = Zn[ok]
            st["loss"][acc] = ln[ok]
            st["grad"][acc] = gn[ok]
            J[acc] = Jn[ok]
            G[acc] = (h * gn[ok] - 2.0 * th * Dn[ok]) * mv
            lr[a[~ok]] *= 0.5  # overshoot: halve this row's step
            if self.method != "adam":
                lr[acc] = np.minimum(lr[acc] * 1.5, 4.0)
            gnorm = np.sqrt(np.sum(G[a] ** 2, axis=1))
            stalled = lr[a] <= (1e-14 * self.xscale if self.method == "adam" else 1e-12)
            active = a[(gnorm > tol_g) & ~stalled]
        return done


# ----------------------------------------------------------------------------------------------
# dual pieces
# ----------------------------------------------------------------------------------------------


def _slope(loss, grad_m, w, theta1, theta2, divergence, p=None) -> float:
    """Estimate of g'(h) = -d risk/dh from quantities at hand (no extra evaluations).

    Reweighting part (exact given d l_h/dh = loss*): KL ``Var_w(loss*)/theta2``; chi2
    ``P(A) Var_A(loss*) / (2 theta2)`` over the samples A with positive weight (``P(A) =
    |A| / n`` without sample probabilities ``p``). Moving part: ``mean_i w_i d2_i`` with
    ``d2_i ~= ||grad_M loss(z_i*)||^2 / (2 theta1)`` (exact for a locally linear loss, a lower
    bound for a locally convex one). Every mean is p-weighted when ``p`` is given.
    """
    part = 0.0
    if math.isfinite(theta2):
        if divergence == "kl":
            mu = pmean(w * loss, p)
            part += pmean(w * (loss - mu) ** 2, p) / theta2
        else:
            act = w > 0 if p is None else (w > 0) & (p > 0)
            if np.any(act) and p is None:
                la = loss[act]
                part += la.size * float(np.var(la)) / (2.0 * theta2 * loss.size)
            elif np.any(act):
                la, pa = loss[act], p[act] / float(np.sum(p[act]))
                part += float(np.sum(p[act])) * pmean((la - pa @ la) ** 2, pa) / (2.0 * theta2)
    if math.isfinite(theta1):
        part += pmean(w * np.sum(grad_m * grad_m, axis=1), p) / (2.0 * theta1)
    return -part


def _dual_value(lh, h, r, theta2, divergence, alpha=None, p=None):
    if divergence == "kl" or math.isinf(theta2):
        return h * r - kl_dual_term(lh, theta2, p)
    return h * r - chi2_dual_term(lh, theta2, alpha, p)


# ----------------------------------------------------------------------------------------------
# the solver
# ----------------------------------------------------------------------------------------------


def solve_first_order(loss_and_grad, X, y, *, r, theta1=1.0, theta2=0.25, divergence="kl",
                      mask=None, outer="envelope", inner_steps=None, inner_lr=None,
                      inner_tol=1e-5, max_outer=None, tol=1e-4, h_init=None, outer_lr=0.05,
                      starts="auto", random_starts=0, screen_steps=5, inner_method="adam",
                      h_cap=1e8, seed=0, verbose=False, callback=None,
                      weights=None, extra_starts=None, max_move=None) -> FirstOrderSolution:
    """Solve the stability dual with gradient-based inner maximisation.

    Parameters
    ----------
    loss_and_grad : callable
        ``loss_and_grad(X, y) -> (loss, grad_X)`` with shapes ``(m,)`` and ``(m, d)`` for any
        ``m`` rows (it is called on subsets and stacks of rows). It receives copies.
    X : array of shape (n, d)
        Evaluation features (not modified).
    y : array of shape (n,)
        Labels/targets, passed through to ``loss_and_grad`` row by row.
    r : float
        Risk threshold, ``>= 0``.
    theta1, theta2 : float in (0, inf]
        Prices of moving samples and of reweighting.
    divergence : {"kl", "chi2"}
    mask : boolean array of shape (d,) or column indices, optional
        Only these coordinates move (feature stability); default all.
    outer : {"envelope", "adam"}
        Envelope-derivative root search (default) or the paper's Adam step on ``h``.
    inner_steps : int, optional
        Maximum Adam steps per inner solve (default 300 for ``"envelope"``; 20 for
        ``"adam"``, the paper's ``T_in``).
    inner_lr : float, optional
        Maximum Adam step (per coordinate, in feature units); default ``0.1 * xscale`` with
        ``xscale`` the RMS standard deviation of the masked columns (1 if zero). Each row's
        step starts at the size of a plain gradient step ``|G| / (2 theta1)`` (capped) and is
        halved whenever a step lowers that row's objective.
    inner_tol : float
        A row is converged when ``||grad|| / (2 theta1) <= inner_tol * xscale`` (the distance to
        the maximiser in the concave regime).
    max_outer : int, optional
        Maximum outer iterations (default 60 for ``"envelope"``, 2000 for ``"adam"``).
    tol : float
        Outer tolerance: stop when ``|risk - r| <= tol * max(r, 1e-12)`` or the bracket on ``h``
        is narrower than ``tol * h``. The returned distribution's risk is then brought to ``r``
        exactly by the final mass split; the value, being stationary in ``h``, is accurate to
        about ``tol**2``.
    h_init : float, optional
        First ``h`` tried. Default: a Newton step from ``h = 0`` for ``"envelope"`` (no extra
        evaluation), 1 for ``"adam"`` (the paper's choice).
    outer_lr : float
        Adam learning rate on ``h`` for ``outer="adam"``.
    starts : {"auto", "warm"}
        ``"warm"``: the warm start only (the paper's choice): the solution at the nearest
        solved ``h``, its displacement rescaled by the ratio of the ``h`` values (for the
        envelope search the nearer bracket end; for ``"adam"`` the previous iterate).
        ``"auto"`` (default) adds the other bracket end, the unmoved data and, for at most 32
        distinct label values, the shared-direction start (each sample moved by
        ``h / (2 theta1)`` times its label's mean loss-gradient direction, scaled to the label's
        largest gradient); this reaches maxima that gradient ascent from the data cannot see,
        e.g. where the loss is flat at ``x_i`` (hinge beyond the margin).
    random_starts : int
        Extra random starts per inner solve (Gaussian, scaled like the current moves);
        drawn from ``numpy.random.default_rng(seed)``.
    screen_steps : int
        Steps given to the extra starts before they are compared with the converged warm start;
        a sample continues from an extra start only if it is already better there.
    inner_method : {"adam", "gradient"}
        The inner ascent: Adam (the paper's optimiser; default) or plain gradient ascent with
        step ``1 / (2 theta1)`` and per-row step control (often 2-3x fewer evaluations).
    h_cap : float
        ``h`` is never raised above this; a risk still below ``r`` there is "unreachable".
    seed : int
        Seed of the random starts (the rest is deterministic).
    verbose : bool
        Progress bar (tqdm, if installed and stderr is a terminal).
    callback : callable, optional
        ``callback(state)`` after each outer iteration with a dict (``iteration``, ``h``,
        ``risk``, ``value``, ``n_grad_evals``); returning ``True`` stops the solver.
    weights : array of shape (n,), optional
        Nonnegative sample weights: the evaluation distribution is ``sum_i p_i delta_{z_i}``
        with ``p = weights / sum(weights)`` (None: uniform). Every mean over samples (risk,
        dual terms, the weights of Q*, the slope estimate, the feature scale and the
        shared-direction start) is then p-weighted; integer weights give the same problem as
        the rows replicated that many times. The atoms' shares stay per sample: atom ``a``
        carries ``p[atom_source[a]] * atom_share[a]`` of P0.
    extra_starts : callable, optional
        ``extra_starts(h) -> list of (n, d) arrays``: more start points for the inner solve at
        ``h`` (screened like the other extra starts), e.g. hints from a certified bound.
    max_move : callable, optional
        ``max_move(h) -> float``: every iterate is projected onto the ball of this radius
        around its sample (projected ascent). Sound only when no maximiser of the inner
        problem lies beyond it, e.g. ``h G / theta1`` for a loss with Lipschitz constant
        ``G`` in the movable coordinates (beyond it ``h l - theta1 t^2 < h l(x_i)``).

    Returns
    -------
    FirstOrderSolution
    """
    if not callable(loss_and_grad):
        raise TypeError("loss_and_grad must be callable: loss_and_grad(X, y) -> (loss, grad_X)")
    X = np.array(X, dtype=np.float64, copy=True)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must be a non-empty 2-D array, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or inf")
    n, d = X.shape
    y = np.array(y, copy=True)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"y must have shape ({n},), got {y.shape}")
    r = _scalar(r, "r", low=0.0)
    theta1 = _scalar(theta1, "theta1", low=0.0, low_open=True, allow_inf=True)
    theta2 = _scalar(theta2, "theta2", low=0.0, low_open=True, allow_inf=True)
    if not isinstance(divergence, str) or divergence.lower() not in ("kl", "chi2"):
        raise ValueError(f"divergence must be 'kl' or 'chi2', got {divergence!r}")
    divergence = divergence.lower()
    if outer not in ("envelope", "adam"):
        raise ValueError(f"outer must be 'envelope' or 'adam', got {outer!r}")
    if inner_method not in ("adam", "gradient"):
        raise ValueError(f"inner_method must be 'adam' or 'gradient', got {inner_method!r}")
    screen_steps = int(_scalar(screen_steps, "screen_steps", low=0))
    if starts not in ("auto", "warm"):
        raise ValueError(f"starts must be 'auto' or 'warm', got {starts!r}")
    mv = _mask_vector(mask, d)
    if inner_steps is None:
        inner_steps = 300 if outer == "envelope" else 20
    if max_outer is None:
        max_outer = 60 if outer == "envelope" else 2000
    inner_steps = int(_scalar(inner_steps, "inner_steps", low=1))
    max_outer = int(_scalar(max_outer, "max_outer", low=1))
    random_starts = int(_scalar(random_starts, "random_starts", low=0))
    tol = _scalar(tol, "tol", low=0.0, low_open=True)
    inner_tol = _scalar(inner_tol, "inner_tol", low=0.0, low_open=True)
    if h_init is not None:
        h_init = _scalar(h_init, "h_init", low=0.0, low_open=True)
    elif outer == "adam":
        h_init = 1.0
    outer_lr = _scalar(outer_lr, "outer_lr", low=0.0, low_open=True)
    h_cap = _scalar(h_cap, "h_cap", low=0.0, low_open=True)
    if callback is not None and not callable(callback):
        raise TypeError("callback must be callable or None")
    for nm, fn in (("extra_starts", extra_starts), ("max_move", max_move)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{nm} must be callable or None")
    p = _probabilities(weights, n)

    sd = _std(X[:, mv > 0], p) if np.any(mv > 0) else np.zeros(0)
    xscale = float(np.sqrt(np.mean(sd ** 2))) if sd.size else 1.0
    if not xscale > 0:
        xscale = 1.0
    if inner_lr is None:
        inner_lr = 0.1 * xscale
    inner_lr = _scalar(inner_lr, "inner_lr", low=0.0, low_open=True)

    lg = _Counter(loss_and_grad, d)
    rng = np.random.default_rng(seed)
    can_move = math.isfinite(theta1) and bool(np.any(mv > 0))
    inner = _Inner(lg, X, y, mv, theta1 if can_move else 1.0, steps=inner_steps, lr=inner_lr,
                   tol=inner_tol, xscale=xscale, method=inner_method, screen=screen_steps)

    loss0, grad0 = lg(X, y)
    if not np.all(np.isfinite(loss0)):
        raise ValueError("loss_and_grad returned NaN or inf at the data")
    risk_base = pmean(loss0, p)

    # label groups for the shared-direction start
    groups = None
    if starts == "auto" and can_move:
        try:
            uniq, inv = np.unique(y, return_inverse=True)
            if uniq.size <= 32:
                groups = inv.reshape(-1)
        except TypeError:
            groups = None

    trace: dict[str, list] = {"h": [], "risk": [], "value": [], "n_grad_evals": []}
    n_solved = [0]

    def state_at(h: float, refs: list[dict], loose: float | None = None) -> dict:
        """Inner solve at h warm-started from the states ``refs`` and the dual quantities.

        ``loose`` is an inner tolerance allowed for this solve (never below ``inner_tol``).
        """
        n_solved[0] += 1
        if not can_move or h == 0.0:
            Z, loss, grad = X.copy(), loss0.copy(), grad0.copy()
            lh = h * loss
        else:
            inner.radius = None if max_move is None else float(max_move(h))
            Z, loss, grad, lh = inner.solve(h, start_points(h, refs), tol=loose)
        if not np.all(np.isfinite(lh)):
            # the inner problem diverged (unbounded d-transform): h is too large
            return {"h": h, "Z": Z, "loss": loss, "grad": grad, "lh": lh,
                    "w": np.ones(n), "alpha": None, "risk": math.inf, "value": -math.inf,
                    "g": -math.inf}
        w, alpha = weights_at(lh, theta2, divergence, p)
        risk = pmean(w * loss, p)
        value = float(_dual_value(lh, h, r, theta2, divergence, alpha, p))
        dg = _slope(loss, grad * mv, w, theta1 if can_move else math.inf, theta2, divergence,
                    p)
        return {"h": h, "Z": Z, "loss": loss, "grad": grad, "lh": lh, "w": w,
                "alpha": alpha, "risk": risk, "value": value, "g": r - risk, "dg": dg}

    def start_points(h: float, refs: list[dict]) -> list[np.ndarray]:
        pts: list[np.ndarray] = []
        for ref in refs if starts == "auto" else refs[:1]:
            if ref["h"] > 0 and np.all(np.isfinite(ref["Z"])):
                pts.append(X + (h / ref["h"]) * (ref["Z"] - X))
            else:
                pts.append(X.copy())
        if starts == "auto":
            if not any(np.array_equal(p, X) for p in pts):
                pts.append(X.copy())
            if groups is not None:
                D = _shared_direction(refs[0]["grad"] * mv, groups, p)
                if D is not None:
                    pts.append(X + (h / (2.0 * theta1)) * D)
        for _ in range(random_starts):
            ref = refs[0]
            scale = xscale
            if ref["h"] > 0:
                scale = (h / ref["h"]) * math.sqrt(
                    pmean(np.sum((ref["Z"] - X) ** 2, axis=1), p))
            scale = max(scale, 1e-3 * xscale)
            R = rng.standard_normal(X.shape) * mv * (scale / math.sqrt(max(mv.sum(), 1.0)))
            pts.append(X + R)
        if extra_starts is not None:
            for P in extra_starts(h):
                P = np.asarray(P, dtype=np.float64)
                if P.shape == X.shape and np.all(np.isfinite(P)):
                    pts.append(X + (P - X) * mv)
        return pts

    bar = _progress(max_outer, verbose, f"first-order ({outer})")
    status = "max_iter"
    message = ""
    iterations = 0

    def record(st: dict) -> bool:
        nonlocal iterations
        iterations += 1
        trace["h"].append(st["h"])
        trace["risk"].append(st["risk"])
        trace["value"].append(st["value"])
        trace["n_grad_evals"].append(lg.rows)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(h=f"{st['h']:.4g}", risk=f"{st['risk']:.4g}")
        if callback is not None:
            stop = callback({"iteration": iterations, "h": st["h"], "risk": st["risk"],
                             "value": st["value"], "n_grad_evals": lg.rows})
            return bool(stop)
        return False

    s0 = state_at(0.0, [])
    lo: dict | None = None
    hi: dict | None = None
    stopped = False
    try:
        if r <= risk_base:
            status = "local_optimum"
            message = "r <= base risk: R = 0, h = 0, Q* = P0"
            best = s0
            record(s0)
        elif not can_move and not math.isfinite(theta2):
            status = "unreachable"
            message = "theta1 = theta2 = inf: nothing may change and r > base risk"
            best = s0
            record(s0)
        elif not can_move and r >= support_max(loss0, p):
            status = "unreachable"
            message = (f"only reweighting acts (theta1 = inf or an empty mask) and r >= max loss "
                       f"{support_max(loss0, p):.6g}")
            best = s0
            record(s0)
        elif outer == "envelope":
            best, lo, hi, status, message, stopped = _envelope(
                state_at, record, s0, r, tol, h_init, h_cap, max_outer)
        else:
            best, lo, hi, status, message, stopped = _adam_outer(
                state_at, record, s0, r, tol, h_init, h_cap, max_outer, outer_lr)
    finally:
        if bar is not None:
            bar.close()
    if stopped:
        status = "stopped"

    # the returned distribution: the best state, or a mixture of the bracket ends hitting r
    h_split = None
    if (status != "unreachable" and lo is not None and hi is not None
            and math.isfinite(hi["risk"]) and lo["risk"] < r < hi["risk"]
            and abs(best["risk"] - r) > 1e-12 * max(r, 1.0)):
        lam = (hi["risk"] - r) / (hi["risk"] - lo["risk"])  # share of the lower state
        parts = [(lo, lam), (hi, 1.0 - lam)]
        h_split = (lo["h"], hi["h"])
    else:
        parts = [(best, 1.0)]
    src = np.concatenate([np.arange(n)] * len(parts))
    share = np.concatenate([np.full(n, s) for _, s in parts])
    AX = np.concatenate([p["Z"] for p, _ in parts], axis=0)
    AW = np.concatenate([p["w"] for p, _ in parts])
    AL = np.concatenate([p["loss"] for p, _ in parts])
    pm = share / n if p is None else share * p[src]  # each atom's P0-mass
    risk = float(np.sum(pm * AW * AL))
    moved2 = np.sum((AX - X[src]) ** 2, axis=1)
    move_cost = 0.0 if not can_move else theta1 * float(np.sum(pm * AW * moved2))
    rew_cost = 0.0 if math.isinf(theta2) else theta2 * float(
        np.sum(pm * phi(AW, divergence)))
    primal = move_cost + rew_cost if status != "unreachable" else math.nan
    value = best["value"] if status != "unreachable" else math.inf
    alpha = None
    if divergence == "chi2":
        alpha = best["alpha"]
        if alpha is None:
            alpha = 0.0 if math.isinf(theta2) else chi2_alpha(best["lh"], theta2, p)
    return FirstOrderSolution(
        h=float(best["h"]), alpha=alpha, value=float(value), primal_cost=float(primal),
        risk=risk, risk_base=risk_base, X_star=best["Z"].copy(), weights=best["w"].copy(),
        loss_star=best["loss"].copy(), lh=best["lh"].copy(), atom_source=src,
        atom_share=share, atom_X=AX, atom_weight=AW, atom_loss=AL, h_split=h_split,
        trace=trace, n_grad_evals=int(lg.rows), n_calls=int(lg.calls), iterations=iterations,
        status=status, outer=outer, message=message,
        info={"xscale": xscale, "inner_lr": inner_lr, "inner_steps": inner_steps,
              "inner_solves": n_solved[0]},
    )


def _probabilities(weights, n: int) -> np.ndarray | None:
    """``weights / sum(weights)`` after checking them (None stays None: uniform)."""
    if weights is None:
        return None
    w = np.array(weights, dtype=np.float64, copy=True)
    if w.shape != (n,):
        raise ValueError(f"weights must have shape ({n},), got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and >= 0")
    total = float(np.sum(w))
    if not total > 0:
        raise ValueError("weights must have a positive sum")
    return w / total


def _std(A: np.ndarray, p) -> np.ndarray:
    """Column standard deviations of ``A`` under the sample probabilities ``p``."""
    if p is None:
        return np.std(A, axis=0)
    mu = p @ A
    return np.sqrt(np.maximum(p @ (A - mu) ** 2, 0.0))


def _shared_direction(G: np.ndarray, groups: np.ndarray, p=None) -> np.ndarray | None:
    """Per label group: the mean loss-gradient direction times the group's largest gradient
    (samples of probability 0 take no part; the mean is p-weighted).

    For a linear model all nonzero gradients of a label are parallel (``-y w`` times a scalar),
    so ``x_i + h D_i / (2 theta1)`` is the "far" stationary point of the hinge loss (and close
    to that of the logistic loss): a start gradient ascent from ``x_i`` cannot reach when the
    loss is flat (or nearly so) at ``x_i``.
    """
    gn = np.sqrt(np.sum(G * G, axis=1))
    live = np.ones(gn.size, dtype=bool) if p is None else p > 0
    top = float(gn[live].max()) if np.any(live) else 0.0
    if not top > 0:
        return None
    D = np.zeros_like(G)
    for gi in np.unique(groups):
        sel = groups == gi
        act = sel & live & (gn > 1e-12 * top)
        if not np.any(act):
            continue
        mean = G[act].mean(axis=0) if p is None else p[act] @ G[act] / float(np.sum(p[act]))
        mn = float(np.sqrt(mean @ mean))
        if mn == 0:
            continue
        D[sel] = mean / mn * float(np.max(gn[act]))
    return D if np.any(D != 0) else None


def _take(st: dict, best: dict, lo: dict, hi: dict | None, r: float, tol: float):
    """Take a new outer state: keep the best dual value seen, move the bracket end on the
    side of ``g``'s sign, and say whether ``|g|`` is small enough to stop (the state is then
    the answer). Returns ``(best, lo, hi, converged)``; both outer loops use it."""
    if math.isfinite(st["value"]) and st["value"] >= best["value"]:
        best = st
    if st["g"] > 0:
        lo = st
    else:
        hi = st
    if abs(st["g"]) <= tol * max(r, 1e-12):
        return st, lo, hi, True
    return best, lo, hi, False


def _envelope(state_at, record, s0, r, tol, h_init, h_cap, max_outer):
    """Safeguarded root search on g(h) = r - risk(h). Returns (best, lo, hi, status, msg, stop).

    Newton steps on ``log(risk) - log(r)`` with the slope estimate of :func:`_slope`, rescaled
    by the secant calibration of :func:`_calibration` (the first step from ``h = 0``, halved,
    when ``h_init`` is None), kept inside the bracket ``g(lo) > 0 > g(hi)``; the secant of the
    bracket when Newton leaves it, and bisection when ``|g|`` does not halve every two steps.
    Before a bracket exists, ``h`` follows Newton lengthened by 20%, growing by a factor in
    [1.01, 10] per step (at least 2 after three steps). Inner solves far from the root use a
    looser tolerance (``min(1e-3, 0.01 |g| / r)``, inexact Newton); it tightens as ``g -> 0``.
    """
    lo = s0  # g(0) = r - base risk > 0
    hi = None
    best = s0
    status, message = "max_iter", ""
    h = h_init
    if h is None:
        h = 0.5 * _newton_from(s0, r, h_cap)
        if not (math.isfinite(h) and h > 0):
            h = 1.0
    gs: list[float] = []
    growths = 0
    last = s0
    for _ in range(max_outer):
        refs = [lo] if hi is None else ([lo, hi] if h - lo["h"] <= hi["h"] - h else [hi, lo])
        loose = min(1e-3, 0.01 * abs(last["g"]) / max(r, 1e-12)) \
            if math.isfinite(last["g"]) else 1e-3
        st = state_at(h, refs, loose)
        kappa = _calibration(st, last)
        last = st
        stop = record(st)
        best, lo, hi, converged = _take(st, best, lo, hi, r, tol)
        if converged:
            status = "local_optimum"
            break
        if stop:
            return best, lo, hi, status, message, True
        if hi is None:
            if h >= h_cap:
                status = "unreachable"
                message = (f"the risk stayed below r = {r:.6g} up to h = {h:.3g} "
                           f"(risk {st['risk']:.6g}); r looks unreachable")
                break
            # Newton, lengthened by 20% to bracket the root soon; at least x1.01 (x2 after three
            # growth steps, so an unreachable r is detected), at most x10
            h_new = _newton_from(st, r, h_cap, kappa)
            h_new = 4.0 * h if not math.isfinite(h_new) else h + 1.2 * (h_new - h)
            growths += 1
            h = min(max(h_new, (1.01 if growths <= 3 else 2.0) * h), 10.0 * h, h_cap)
            continue
        width = hi["h"] - lo["h"]
        gs.append(abs(st["g"]))
        if width <= tol * hi["h"]:
            status = "local_optimum"
            break
        if not math.isfinite(hi["g"]):
            h = 0.5 * (lo["h"] + hi["h"])
            continue
        cand = _newton_from(st, r, h_cap, kappa)
        margin = 0.01 * width
        if not (lo["h"] + margin <= cand <= hi["h"] - margin):
            cand = _secant(lo, hi, r)
            cand = min(max(cand, lo["h"] + margin), hi["h"] - margin)
        if len(gs) >= 3 and gs[-1] > 0.5 * gs[-3]:
            cand = (math.sqrt(lo["h"] * hi["h"]) if lo["h"] > 0 and hi["h"] > 2 * lo["h"]
                    else 0.5 * (lo["h"] + hi["h"]))
            gs.clear()
        h = float(cand)
    return best, lo, hi, status, message, False


def _calibration(st: dict, prev: dict | None) -> float:
    """Ratio of the observed secant slope of the risk between two states to the estimated one.

    The moving part of :func:`_slope` is exact only for a locally linear loss; near the onset
    of nonconcavity it underestimates ``d risk/dh``. The secant between the last two iterates
    measures the truth along the way; the ratio (clipped to [0.2, 20]) rescales the estimate.
    """
    if prev is None or prev["h"] == st["h"] or abs(st["h"] - prev["h"]) > 0.3 * st["h"]:
        return 1.0  # no secant, or one too long to describe the local slope
    vals = (st["risk"], prev["risk"], st.get("dg", math.nan), prev.get("dg", math.nan))
    if not all(math.isfinite(v) for v in vals):
        return 1.0
    observed = (st["risk"] - prev["risk"]) / (st["h"] - prev["h"])
    estimated = -0.5 * (st["dg"] + prev["dg"])
    if not (observed > 0 and estimated > 0):
        return 1.0
    return float(min(max(observed / estimated, 0.2), 20.0))


def _newton_from(st: dict, r: float, h_cap: float, kappa: float = 1.0) -> float:
    """Newton step on ``log(risk(h)) - log(r)`` from state ``st`` (slope from :func:`_slope`,
    times the calibration ``kappa``).

    The risk grows roughly exponentially in ``h`` at first (reweighting by ``exp(l_h/theta2)``),
    so Newton on its logarithm overshoots far less than on ``g`` itself. Returns nan when the
    step is not defined.
    """
    dg = st.get("dg", 0.0) * kappa
    risk = st["risk"]
    if not (math.isfinite(dg) and dg < 0 and math.isfinite(risk) and risk > 0 and r > 0):
        return math.nan
    return float(min(st["h"] - (math.log(risk) - math.log(r)) * risk / (-dg), h_cap))


def _secant(lo: dict, hi: dict, r: float) -> float:
    """Secant root of log(risk) - log(r) (or of g when a risk is not positive) on the bracket."""
    a, b = lo["h"], hi["h"]
    if lo["risk"] > 0 and hi["risk"] > 0 and r > 0:
        fa, fb = math.log(lo["risk"]) - math.log(r), math.log(hi["risk"]) - math.log(r)
    else:
        fa, fb = -lo["g"], -hi["g"]
    return a + (-fa) * (b - a) / (fb - fa)


def _adam_outer(state_at, record, s0, r, tol, h_init, h_cap, max_outer, outer_lr):
    """The paper's outer loop: Adam ascent on h along g(h), inner solves warm-started from the
    previous iterate (Algorithms 1 and 2). Keeps the latest states on either side of r."""
    h = h_init
    m = 0.0
    v = 0.0
    best = s0
    lo, hi = s0, None
    status, message = "max_iter", ""
    prev = s0
    for t in range(1, max_outer + 1):
        st = state_at(h, [prev])
        stop = record(st)
        best, lo, hi, converged = _take(st, best, lo, hi, r, tol)
        if converged:
            status = "local_optimum"
            break
        if stop:
            return best, lo, hi, status, message, True
        g = st["g"] if math.isfinite(st["g"]) else -abs(r)
        m = _BETA1 * m + (1 - _BETA1) * g
        v = _BETA2 * v + (1 - _BETA2) * g * g
        mh = m / (1 - _BETA1 ** t)
        vh = v / (1 - _BETA2 ** t)
        h = float(min(max(h + outer_lr * mh / (math.sqrt(vh) + 1e-12), 0.0), h_cap))
        prev = st
    return best, lo, hi, status, message, False
