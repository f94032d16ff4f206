"""The commands ``demo``, ``certify`` and ``verify``, the policy gate's exit code, and
``main``."""

from __future__ import annotations

import math
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ..scale._data import read_parquet_dir
from . import _monitor
from ._loaders import (
    SKOPS_SUFFIXES,
    _arg_for,
    _check_cost,
    _dask_client,
    auto_groups,
    data_cost,
    load_data,
    load_model,
    parse_feature_costs,
    split_weights,
)
from ._parser import (
    DEMO_THETA1,
    DEMO_THETA2,
    EXIT_BAD_INPUT,
    EXIT_BELOW,
    EXIT_INTERNAL,
    EXIT_MISMATCH,
    EXIT_NOT_CERTIFIED,
    EXIT_OK,
    EXIT_SOLVER,
    NO_RTOL,
    BadInput,
    _one_line,
    build_parser,
)


def _verify_command(cert, model, data, target, sample_weight=None) -> str:
    """The ``otstab verify`` command line that reproduces a certificate (``sample_weight``:
    the weight column of DATA, for a weighted certificate)."""
    import shlex

    trust = "" if Path(str(model)).suffix.lower() in SKOPS_SUFFIXES else " --trust-model"
    q = [shlex.quote(str(v)) for v in (cert, model, data, target)]
    weights = "" if sample_weight is None else f" --sample-weight {shlex.quote(sample_weight)}"
    return (f"otstab verify {q[0]} --model {q[1]} --data {q[2]} --target {q[3]}{weights}"
            f"{trust}")


#: exit code of each outcome of :func:`otstab.report.policy_gate`
GATE_EXIT = {"pass": EXIT_OK, "below": EXIT_BELOW, "not_certified": EXIT_NOT_CERTIFIED}


def gate(result, fail_under=None, *, require_exact=False, confidence=None) -> dict:
    """:func:`otstab.report.policy_gate` with the exit code of its outcome (``exit_code``)."""
    from ..reporting._report import policy_gate

    verdict = policy_gate(result, fail_under, require_exact=require_exact,
                          confidence=confidence, interface="cli")
    return {**verdict, "exit_code": GATE_EXIT[verdict["outcome"]]}


def _run_library(fn, *args, **kwargs):
    """Call into the library, turning user mistakes into BadInput."""
    from ..errors import SolverError

    try:
        return fn(*args, **kwargs)
    except SolverError:
        raise
    except (ValueError, TypeError) as exc:
        from ..errors import OtstabError, SolverNotAvailableError

        if isinstance(exc, (OtstabError, SolverNotAvailableError)):
            raise BadInput(_arg_for(str(exc)), str(exc)) from None
        raise


def _print_features(table, top, out) -> None:
    t = table.head(top)
    width = max([len(str(f)) for f in t["feature"]] + [7])
    print(f"  {'rank':>4}  {'feature':<{width}}  {'score':>10}  {'moving':>6}", file=out)
    for rec in t.to_dict(orient="records"):
        sm = rec.get("share_moving", math.nan)
        sm_txt = f"{sm:6.0%}" if isinstance(sm, float) and math.isfinite(sm) else "     -"
        print(f"  {rec.get('rank', ''):>4}  {str(rec['feature']):<{width}}  "
              f"{float(rec['score']):10.4g}  {sm_txt}", file=out)


def _report_grids(model, X, y, result):
    """Theta-split grid and R-against-r curve for the report (zero_one / fast paths), under
    the result's own cost (its resolved DataCost spec, else the encoded cost)."""
    from ..reporting import _plot as _plot

    cost = (result.info.get("cost") if isinstance(result.info, dict) else None) or "encoded"
    total = (0.0 if math.isinf(result.theta1) else 1 / result.theta1) + (
        0.0 if math.isinf(result.theta2) else 1 / result.theta2)
    grid = None
    if total > 0:
        grid = _plot.decomposition_grid(model, X, y, loss=result.loss, r=result.r, total=total,
                                        divergence=result.divergence, cost=cost)
    base, r = result.risk_base, result.r
    steps = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    r_grid = [base + (r - base) * s for s in steps] if r > base else [r]
    if result.loss == "zero_one":
        r_grid = [v for v in r_grid if v <= 1.0]
    curve = _plot.value_curve(model, X, y, loss=result.loss, r=r_grid, theta1=result.theta1,
                              theta2=result.theta2, divergence=result.divergence, cost=cost)
    return grid, curve


def _cmd_demo(args) -> int:
    import joblib
    from sklearn.linear_model import LogisticRegression

    from .. import certify, feature_stability
    from ..certificates import make_certificate, write_certificate
    from ..datasets import feature_groups, load_adult, train_eval_split
    from ..reporting._report import write_report

    t0 = time.perf_counter()
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput("--out", f"cannot create folder {str(out)!r}: {exc.strerror}") from None
    say = (lambda *a: None) if args.quiet else print
    df = load_adult()
    X_train, y_train, X_eval, y_eval = train_eval_split(df, "income", n_train=2000,
                                                        n_eval=2000, random_state=0)
    model = LogisticRegression(max_iter=1000).fit(X_train, y_train)
    model_path, data_path = out / "model.joblib", out / "eval.csv"
    joblib.dump(model, model_path)
    X_eval.assign(income=y_eval).to_csv(data_path, index=False)
    # certify the data exactly as `otstab verify` will read them back
    X, y = load_data(data_path, "income")
    say(f"Adult: logistic regression fitted on {len(X_train)} rows; evaluating on {len(X)} "
        f"rows x {X.shape[1]} features.")
    result = _run_library(certify, model, X, y, loss="zero_one", r=args.r, theta1=DEMO_THETA1,
                          theta2=DEMO_THETA2, cost="encoded")
    groups = feature_groups(X)
    table = _run_library(feature_stability, model, X, y, loss="zero_one", r=args.r,
                         theta1=DEMO_THETA1, theta2=DEMO_THETA2,
                         feature_groups=groups, cost="encoded").to_frame()
    cert = make_certificate(result, model, X, y, features=table, groups=groups,
                            target="income", model_file=model_path)
    cert_path = write_certificate(cert, out / "certificate.json")
    verify_cmd = _verify_command(cert_path, model_path, data_path, "income")
    say("")
    say(result.summary())
    say("")
    say(f"Most sensitive features (of {len(table)}; one-hot blocks scored as one variable; "
        "lower score = more sensitive):")
    if not args.quiet:
        _print_features(table, args.top, sys.stdout)
    written = [cert_path, model_path, data_path]
    if not args.no_html:
        grid, curve = _report_grids(model, X, y, result)
        html_path = write_report(out / "report.html", cert, result=result, features=table,
                                 grid=grid, curve=curve, y=y, verify_command=verify_cmd,
                                 title="otstab demo: logistic regression on Adult",
                                 interface="cli")
        written.insert(1, html_path)
    say("")
    for pth in written:
        print(f"wrote {pth}")
    say(f"reproduce with: {verify_cmd}")
    say(f"  (--trust-model lets verify unpickle {model_path}, the model file this demo has just "
        "written; never pass it for a model file from someone else)")
    say(f"done in {time.perf_counter() - t0:.1f} s")
    return EXIT_OK


def _write_frame(frame, path) -> Path:
    path = Path(path)
    if path.name.lower().endswith((".parquet", ".pq")):
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False, float_format="%.17g")
    return path


def _cmd_certify(args) -> int:
    import json

    from .. import certify, feature_stability
    from ..certificates import (
        make_certificate,
        validate_certificate,
        write_certificate,
        write_qstar,
    )
    from ..modeling._losses import epsilon_insensitive, pinball
    from ..reporting._report import (
        _for_interface,
        model_card,
        model_card_markdown,
        write_pdf,
        write_report,
    )
    from ..solve._inference import Bootstrap

    loss = args.loss
    m = re.fullmatch(r"\s*(pinball|epsilon_insensitive)\(\s*([^)]+)\)\s*", loss)
    if m:
        try:
            val = float(m.group(2))
        except ValueError:
            raise BadInput("--loss", f"cannot read the parameter of {loss!r}") from None
        loss = _run_library(pinball if m.group(1) == "pinball" else epsilon_insensitive, val)
    for opt in ("json", "html", "qstar", "pdf", "card", "qstar_raw"):
        dest = getattr(args, opt)
        if dest is not None and dest != "-" and not Path(dest).parent.exists():
            raise BadInput(f"--{opt.replace('_', '-')}",
                           f"folder {str(Path(dest).parent)!r} does not exist")
    for opt in ("qstar", "qstar_raw"):
        dest = getattr(args, opt)
        if dest and not dest.lower().endswith((".csv", ".csv.gz", ".parquet", ".pq")):
            raise BadInput(f"--{opt.replace('_', '-')}",
                           f"{dest!r} must end in .csv, .csv.gz or .parquet")
    if args.card and args.card != "-" and not args.card.lower().endswith((".json", ".md")):
        raise BadInput("--card", f"{args.card!r} must end in .json or .md (or be '-')")
    if args.json == "-" and args.card == "-":
        raise BadInput("--card", "only one of --json and --card can write to stdout ('-')")
    if args.dask is not None:  # DATA is a directory of Parquet files, read lazily
        _dask_client(args.dask)
        X, y = read_parquet_dir(args.data, args.target)
    else:
        X, y = load_data(args.data, args.target)
    weights = None
    if args.sample_weight is not None:
        if args.dask is not None:
            raise BadInput("--sample-weight", "sample weights are not supported with --dask")
        X, weights = split_weights(X, args.sample_weight)
    costs = None if args.feature_costs is None else parse_feature_costs(args.feature_costs)
    cost, cost_arg = data_cost(args)
    encoded_only = [flag for flag, given in (("--features", args.features),
                                             ("--grid", args.grid),
                                             ("--dask", args.dask is not None)) if given]
    if cost is not None and encoded_only:
        flag = encoded_only[0]
        raise BadInput(flag, f"{flag} is computed under the encoded cost and is not "
                             f"available with a DataCost ({cost_arg}) yet")
    # no --cost: the library's default (cost=None), as otstab.certify chooses it (a DataCost
    # for a Pipeline with encoders on raw columns where a DataCost path answers it, else the
    # encoded cost); flags computed under the encoded cost keep it
    chosen = cost if cost is not None else \
        ("encoded" if args.cost == "encoded" or encoded_only else None)
    model = load_model(args.model, trust_model=args.trust_model)
    _check_cost(cost, cost_arg, args, model, X)
    movable = None
    if args.movable:
        movable = [int(c) if re.fullmatch(r"-?\d+", c) else c for c in args.movable]
    level = 0.95 if args.confidence is None else args.confidence
    se = "analytic" if args.bootstrap is None else Bootstrap(n_resamples=max(args.bootstrap, 2))
    # the tree bound's budgets: recorded in the certificate's solver_options for verify
    options = {k: getattr(args, k) for k in ("max_nodes", "time_budget", "node_budget",
                                             "rtol") if getattr(args, k) is not None}
    if options.get("rtol") == NO_RTOL:  # --rtol none: rtol=None (recorded as null)
        options["rtol"] = None
    result = _run_library(certify, model, X, y, loss=loss, r=args.r, theta1=args.theta1,
                          theta2=args.theta2, divergence=args.divergence, solver=args.solver,
                          features=movable, se=se, feature_costs=costs,
                          sample_weight=weights, cost=chosen, **options)
    # with --json - / --card - stdout carries only that document
    out = sys.stderr if "-" in (args.json, args.card) else sys.stdout
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=out))
    say(_for_interface(result.summary(), "cli"))
    if result.info.get("cost") is not None:  # (a DataCost: given, or the default's choice)
        from ..certificates import hash_cost

        say(f"  cost on the data's own variables (DataCost, spec fingerprint "
            f"{hash_cost(result.info['cost'])[:12]}):")
        for line in str(result.info.get("cost_description", "")).splitlines():
            say(f"    {line}")
    if math.isfinite(result.value) and result.status == "bounds":
        say(f"  no {level:.0%} confidence bound for the certified side value_lower (the "
            "sampling SE of a non-exact answer is that of the found value value_upper)")
    elif math.isfinite(result.value):
        lcb = result.lower_confidence_bound(level)
        say(f"  with {level:.0%} confidence over evaluation samples, R >= {lcb:.6g}")
    verdict = gate(result, args.fail_under, require_exact=args.require_exact,
                   confidence=args.confidence)
    table, groups = None, None
    if args.features:
        if args.groups == "auto":
            groups = auto_groups(model, result.feature_names)
        table = _run_library(feature_stability, model, X, y, loss=loss, r=args.r,
                             theta1=args.theta1, theta2=args.theta2,
                             divergence=args.divergence, feature_groups=groups,
                             feature_costs=costs, sample_weight=weights, cost="encoded",
                             **options).to_frame()
        say(f"\nMost sensitive features (of {len(table)}; lower score = more sensitive):")
        if not args.quiet:
            _print_features(table, args.top, out)
    qinfo = write_qstar(result, args.qstar) if args.qstar else None
    written = []
    if args.qstar:
        written.append(Path(args.qstar))
    if args.qstar_raw:
        written.append(_write_frame(_run_library(result.to_frame, raw=True), args.qstar_raw))
    policy = None if args.fail_under is None and not args.require_exact else verdict
    cert: Any = None  # made when one of the outputs below needs it
    if args.json or args.html or args.pdf or args.card:
        cert = _run_library(make_certificate, result, model, X, y, features=table,
                            groups=groups, movable=movable, target=args.target,
                            model_file=args.model, qstar=qinfo, solver=args.solver, loss=loss,
                            solver_options=options or None, level=level,
                            extra=None if policy is None else {"policy": policy},
                            sample_weight=weights, sample_weight_source=args.sample_weight)
    if args.json == "-":
        validate_certificate(cert)
        print(json.dumps(cert, indent=2, allow_nan=False, ensure_ascii=False))
    elif args.json:
        written.append(write_certificate(cert, args.json))
    if args.html or args.pdf:
        grid = curve = None
        if args.grid:
            grid, curve = _report_grids(model, X, y, result)
        cmd = None
        if args.json and args.json != "-":
            cmd = _verify_command(args.json, args.model, args.data, args.target,
                                  args.sample_weight)
        html_path = Path(args.html) if args.html else Path(args.pdf).with_suffix(".html")
        write_report(html_path, cert, result=result, features=table, grid=grid, curve=curve,
                     verify_command=cmd, title=args.title, y=y, interface="cli")
        if args.html:
            written.append(html_path)
        if args.pdf:
            try:
                written.append(write_pdf(html_path, args.pdf))
            except RuntimeError as exc:
                raise BadInput("--pdf", str(exc)) from None
            finally:
                if not args.html:
                    html_path.unlink(missing_ok=True)
    if args.card:
        card = model_card(cert, verify_command=_verify_command(
            args.json, args.model, args.data, args.target, args.sample_weight)
            if args.json not in (None, "-") else None)
        if args.card == "-":
            print(json.dumps(card, indent=2, allow_nan=False, ensure_ascii=False))
        else:
            path = Path(args.card)
            text = model_card_markdown(card) if path.suffix.lower() == ".md" else \
                json.dumps(card, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
            path.write_text(text, encoding="utf-8")
            written.append(path)
    for pth in written:
        say(f"wrote {pth}")
    if policy is not None:
        if verdict["passed"]:
            say(f"gate passed: {verdict['reason']}")
        else:
            print(f"otstab certify: gate failed (exit {verdict['exit_code']}): "
                  f"{verdict['reason']}", file=sys.stderr)
    return verdict["exit_code"]


def _cmd_verify(args) -> int:
    import json

    from ..certificates import read_certificate, verify_certificate
    from ..errors import ValidationError

    try:
        cert = read_certificate(args.certificate)
    except ValidationError as exc:
        raise BadInput("CERT", str(exc)) from None
    target = args.target or cert["inputs"]["data"].get("target")
    if not target:
        raise BadInput("--target", "the certificate does not name the label column; pass "
                                   "--target")
    X, y = load_data(args.data, target)
    recorded = cert["inputs"].get("sample_weight")
    column = args.sample_weight or (recorded or {}).get("source")
    if recorded is not None and column is None:
        raise BadInput("--sample-weight", "the certificate was made with sample weights but "
                                          "does not name their column; pass --sample-weight COL")
    weights = None
    if column is not None:
        X, weights = split_weights(X, column)
    model = load_model(args.model, trust_model=args.trust_model)
    if args.qstar is not None and not Path(args.qstar).is_file():
        raise BadInput("--qstar", f"file {args.qstar!r} does not exist")
    expected = None
    if args.cost_file is not None:
        from ..certificates import read_cost_file

        try:
            expected = read_cost_file(args.cost_file)
        except ValidationError as exc:
            raise BadInput("--cost-file", str(exc)) from None
    try:
        report = _run_library(
            verify_certificate, cert, model, X, y, rtol=args.rtol, atol=args.atol,
            h_rtol=args.h_rtol, gap_tol=args.gap_tol, check_features=not args.no_features,
            qstar=args.qstar, model_file=args.model, sample_weight=weights, cost=expected)
    except BadInput as exc:
        if expected is not None and str(exc.message).startswith("cost:"):
            raise BadInput("--cost-file", f"{args.cost_file!r}: {exc.message}") from None
        raise
    if args.json:
        print(json.dumps(_report_dict(report, args.certificate), indent=2, allow_nan=False,
                         default=str))
        return EXIT_OK if report.ok else EXIT_MISMATCH
    if report.ok:
        print(report.summary())
        return EXIT_OK
    print(report.summary(), file=sys.stderr)
    return EXIT_MISMATCH


def _report_dict(report, certificate) -> dict:
    """``verify --json``: the verification report as strict JSON."""
    from .._results import jsonable

    res = report.recomputed
    return jsonable({
        "certificate": str(certificate), "ok": bool(report.ok),
        "exit_code": EXIT_OK if report.ok else EXIT_MISMATCH,
        "checked": list(report.checked), "notes": list(report.notes),
        "mismatches": [{"field": m.field, "expected": m.expected, "actual": m.actual,
                        "reason": m.reason} for m in report.mismatches],
        "tolerances": dict(report.tolerances),
        "recomputed": None if res is None else {"value": res.value, "status": res.status,
                                                "gap": res.gap},
    }, strict=True)


_COMMANDS = {"demo": _cmd_demo, "certify": _cmd_certify, "verify": _cmd_verify,
             "monitor": _monitor.run}


def main(argv=None) -> int:
    """Entry point of the ``otstab`` command; returns the exit code.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name (default ``sys.argv[1:]``).
    """
    from ..errors import SolverError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "otstab"
    debug = "--debug" in argv
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_BAD_INPUT
        prog = f"otstab {args.command}"
        return _COMMANDS[args.command](args)
    except BadInput as exc:
        print(exc.line(prog), file=sys.stderr)
        return EXIT_BAD_INPUT
    except SolverError as exc:
        print(f"{prog}: solver failure: {_one_line(exc)}", file=sys.stderr)
        return EXIT_SOLVER
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so in one line unless --debug
        if debug:
            traceback.print_exc()
        else:
            print(f"{prog}: internal error: {type(exc).__name__}: "
                  f"{_one_line(exc)} (run with --debug for the traceback)",
                  file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
