"""``otstab monitor``: append a data window to a history, gate on the share of the tolerance
used, and render the trend report (issue 32).

One run certifies the model on the reference data (R), measures the shift from the reference
data to the current window (S, :func:`otstab.shift_cost`), puts them side by side
(:func:`otstab.budget_used`), appends the window to the store (:class:`otstab.History`) and
writes the trend report (:mod:`otstab.reporting._trend`).

Gate (``--max-budget-used B``), with the exit codes of ``certify --fail-under``:
0 when the share used is proven at most B (``S_upper <= B R_lower``), 5 when it is proven above
B (``S_lower > B R_upper``), 6 (not certified) when the intervals leave it undecided.

Registered by :func:`add_parser` (called from :func:`otstab.cli._parser.build_parser`); the
heavy imports wait for :func:`run`, so that ``otstab --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ._loaders import _check_cost, data_cost, load_data, load_model
from ._parser import BadInput, _add_debug, _level, _number, _tolerance

__all__ = ["add_parser", "run", "SHIFT_SOLVERS"]

#: the solvers of ``--shift-solver`` (:data:`otstab.shift._shift_cost.SOLVERS`; a test keeps
#: them equal)
SHIFT_SOLVERS = ("auto", "conic", "dual", "pot")


def add_parser(sub) -> None:
    """Register ``otstab monitor`` on the ``otstab`` subparsers."""
    from ..solve._core import DIVERGENCES

    p = sub.add_parser(
        "monitor", help="append a data window to a history and gate on the tolerance used",
        description="Certify MODEL on the REFERENCE data (R), measure the shift from REFERENCE "
                    "to CURRENT in the same units (S, the least OT cost that turns one into "
                    "the other, labels fixed), append the window to the SQLite STORE and "
                    "render the trend report. S < R proves the model's risk on CURRENT is "
                    "below r. Exit 0 when the share used S/R is proven at most "
                    "--max-budget-used, 5 when proven above, 6 when undecided.")
    p.add_argument("--model", required=True, metavar="MODEL",
                   help="fitted model (.skops, or joblib/pickle with --trust-model)")
    p.add_argument("--reference", required=True, metavar="DATA",
                   help="reference data (the certificate's evaluation data): .csv or .parquet")
    p.add_argument("--current", required=True, metavar="DATA",
                   help="this window's labelled data, same columns")
    p.add_argument("--target", required=True, metavar="COL", help="label column")
    p.add_argument("--trust-model", action="store_true",
                   help="allow loading a pickle/joblib MODEL (runs code from the file)")
    p.add_argument("--store", required=True, metavar="DB",
                   help="the history: an SQLite file (created if absent) or sqlite:///path")
    p.add_argument("--model-version", default=None, metavar="NAME",
                   help="model version (default: the first 12 digits of the model's "
                        "fingerprint)")
    p.add_argument("--window", default=None, metavar="NAME",
                   help="window name (default: the CURRENT file's name without suffix)")
    p.add_argument("--replace", action="store_true",
                   help="overwrite a window already recorded for this model version")
    p.add_argument("--loss", default="zero_one", help="loss (default zero_one)")
    p.add_argument("--r", type=_number(False), required=True, help="risk threshold")
    p.add_argument("--theta1", type=_number(True), default=1.0,
                   help="price of moving, > 0 or inf (default 1)")
    p.add_argument("--theta2", type=_number(True), default=0.25,
                   help="price of reweighting, > 0 or inf (default 0.25)")
    p.add_argument("--divergence", choices=DIVERGENCES, default="kl")
    p.add_argument("--cost", choices=("auto", "encoded"), default=None,
                   help="transport cost of both R and S: encoded (default) or auto (DataCost)")
    p.add_argument("--cost-file", metavar="SPEC.json", default=None,
                   help="a DataCost spec for both R and S")
    p.add_argument("--immutable", metavar="COLS", default=None,
                   help="raw columns that cannot move (a DataCost)")
    p.add_argument("--shift-solver", choices=SHIFT_SOLVERS, default="auto",
                   help="solver of S (default auto: exact conic up to 40,000 same-label "
                        "pairs per label, else the chunked dual)")
    p.add_argument("--rtol", type=_tolerance, default=1e-6,
                   help="relative width of S's certified interval the dual solver aims at "
                        "(default 1e-6)")
    p.add_argument("--confidence", type=_level, default=0.95, metavar="LEVEL",
                   help="level of R's sampling interval (default 0.95)")
    p.add_argument("--max-budget-used", type=_number(False), default=None, metavar="B",
                   help="gate: exit 5 when S/R is proven above B, 6 when undecided")
    p.add_argument("--html", metavar="OUT", default=None,
                   help="trend report (default: STORE's name with -trend.html)")
    p.add_argument("--no-html", action="store_true", help="skip the trend report")
    p.add_argument("--json", action="store_true",
                   help="print the window's record as JSON on stdout (messages to stderr)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    _add_debug(p)


def run(args) -> int:
    """``otstab monitor`` (see the module doc); returns the exit code."""
    from .._results import jsonable
    from ..certificates import hash_data, hash_model
    from ..errors import ValidationError
    from ..reporting._trend import gate_share, projection, write_trend
    from ..shift._history import History
    from ..shift._shift_cost import shift_cost
    from ..solve._budget import budget_used
    from ..solve._core import certify
    from ._commands import GATE_EXIT, _run_library

    if args.max_budget_used is not None and not args.max_budget_used > 0:
        raise BadInput("--max-budget-used", f"must be > 0, got {args.max_budget_used:g}")
    if args.html and not Path(args.html).parent.exists():
        raise BadInput("--html", f"folder {str(Path(args.html).parent)!r} does not exist")
    try:
        store = History(args.store)
    except ValidationError as exc:
        raise BadInput("--store", str(exc)) from None
    try:
        try:
            X_ref, y_ref = load_data(args.reference, args.target)
        except BadInput as exc:
            raise BadInput("--reference" if exc.arg == "--data" else exc.arg,
                           exc.message) from None
        try:
            X_cur, y_cur = load_data(args.current, args.target)
        except BadInput as exc:
            raise BadInput("--current" if exc.arg == "--data" else exc.arg,
                           exc.message) from None
        missing = [c for c in X_ref.columns if c not in X_cur.columns]
        if missing:
            raise BadInput("--current", f"lacks the reference column(s) {missing[:5]}")
        X_cur = X_cur[list(X_ref.columns)]
        cost, cost_arg = data_cost(args)
        model = load_model(args.model, trust_model=args.trust_model)
        _check_cost(cost, cost_arg, args, model, X_ref)
        version = args.model_version or hash_model(model)[:12]
        window = args.window or Path(args.current).name.split(".")[0]
        out = sys.stderr if args.json else sys.stdout
        say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=out))
        result = _run_library(certify, model, X_ref, y_ref, loss=args.loss, r=args.r,
                              theta1=args.theta1, theta2=args.theta2,
                              divergence=args.divergence,
                              cost="encoded" if cost is None else cost)
        shift = _run_library(shift_cost, X_ref, y_ref, X_cur, y_cur, theta1=args.theta1,
                             theta2=args.theta2, divergence=args.divergence, cost=cost,
                             model=model, solver=args.shift_solver, rtol=args.rtol)
        use = _run_library(budget_used, result, shift, level=args.confidence)
        try:
            store.record(model_version=version, window=window, result=result, shift=shift,
                         budget=use, reference=hash_data(X_ref, y_ref),
                         current=hash_data(X_cur, y_cur), replace=args.replace)
        except ValidationError as exc:
            raise BadInput("--window", str(exc)) from None
        frame = store.windows(version)
        verdict = gate_share(use.S_lower, use.S_upper, use.R_lower, use.R_upper,
                             args.max_budget_used)
        say(use.summary())
        say(f"  model version {version}, window {window!r}: {len(frame)} window(s) in "
            f"{args.store}")
        say(f"  {projection(frame)['text']}")
        if not args.no_html:
            path = Path(args.html) if args.html else \
                Path(str(Path(args.store).with_suffix("")) + "-trend.html")
            write_trend(path, frame, max_share=args.max_budget_used,
                        gate=None if args.max_budget_used is None else verdict)
            say(f"wrote {path}")
        if args.json:
            rec = frame.iloc[-1].drop(labels=["certificate", "shift"]).to_dict()
            print(json.dumps({**jsonable(rec, strict=True), "gate": verdict}, indent=2))
        code = GATE_EXIT[verdict["outcome"]]
        if args.max_budget_used is not None:
            if code == 0:
                say(f"gate passed: {verdict['reason']}")
            else:
                print(f"otstab monitor: gate failed (exit {code}): {verdict['reason']}",
                      file=sys.stderr)
        return code
    finally:
        store.close()
