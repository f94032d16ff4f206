"""The parser of the ``otstab`` command, its exit codes and the user-mistake exception."""

from __future__ import annotations

import argparse
import math

EXIT_OK = 0


EXIT_MISMATCH = 1


EXIT_BAD_INPUT = 2


EXIT_SOLVER = 3


EXIT_INTERNAL = 4


EXIT_BELOW = 5


EXIT_NOT_CERTIFIED = 6


DEMO_R = 0.4


DEMO_THETA1 = 1.0


DEMO_THETA2 = 0.25


class BadInput(Exception):
    """A user mistake; ``arg`` names the command-line argument at fault."""

    def __init__(self, arg: str | None, message: str, prog: str | None = None):
        super().__init__(message)
        self.arg = arg
        self.message = message
        self.prog = prog

    def line(self, prog: str) -> str:
        where = f"argument {self.arg}: " if self.arg else ""
        return f"{self.prog or prog}: error: {where}{_one_line(self.message)}"


#: characters of an error message printed (then an ellipsis): a message may quote a hostile
#: input, which must not be echoed whole
MESSAGE_CHARS = 4000


def _one_line(message) -> str:
    """``message`` on one line, cut to :data:`MESSAGE_CHARS` characters."""
    text = str(message)
    cut = len(text) > MESSAGE_CHARS
    text = " ".join(text[:MESSAGE_CHARS].split())
    return text + "..." if cut else text


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors become :class:`BadInput` (one line, exit 2)."""

    def error(self, message):  # noqa: D401 - argparse API
        raise BadInput(None, f"{message} (see {self.prog} --help)", prog=self.prog)


def _number(allow_inf: bool):
    def parse(text: str) -> float:
        t = text.strip().lower()
        if t in ("inf", "+inf", "infinity", "+infinity"):
            if allow_inf:
                return math.inf
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        try:
            v = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number{' or inf' if allow_inf else ''}, got {text!r}") from None
        if math.isnan(v) or (math.isinf(v) and not allow_inf):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return v

    parse.__name__ = "number"
    return parse


def _level(text: str) -> float:
    v = _number(False)(text)
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"expected a confidence level in (0, 1), got {text!r}")
    return v


def _tolerance(text: str) -> float:
    """A verification tolerance: a finite number >= 0."""
    v = _number(False)(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


_tolerance.__name__ = "tolerance"

#: ``--rtol none``: the tree search's ``rtol=None`` (every sample gets --max-nodes boxes)
NO_RTOL = "none"


def _rtol(text: str):
    """``--rtol``: a number >= 0, or ``none`` (``rtol=None``)."""
    if text.strip().lower() == NO_RTOL:
        return NO_RTOL
    return _tolerance(text)


_rtol.__name__ = "rtol"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``otstab`` command."""
    from .. import __version__
    from ..modeling._losses import LOSS_NAMES
    from ..solve._core import DIVERGENCES, SOLVERS

    p = _Parser(
        prog="otstab",
        description="OT stability certificates for ML models (Blanchet, Cui, Li, Liu, ICML "
                    "2024): how much must the data change (moving samples, priced by theta1, "
                    "and reweighting them, priced by theta2) before the model's risk reaches "
                    "r?",
        epilog="Exit codes: 0 ok (gate passed), 1 verification mismatch, 2 bad input, 3 solver "
               "failure, 4 internal error, 5 below the --fail-under threshold, 6 not certified "
               "(not exact and the gate cannot be proven, or --require-exact).",
    )
    p.add_argument("--version", action="version", version=f"otstab {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="show the Python traceback of unexpected errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser(
        "demo", help="certify a logistic regression on the bundled Adult data",
        description="Fit a logistic regression on the bundled UCI Adult data (2,000 training "
                    "and 2,000 evaluation rows, seed 0), certify it for the 0/1 loss at "
                    f"r = {DEMO_R} (theta1 = {DEMO_THETA1:g}, theta2 = {DEMO_THETA2:g}), score "
                    "the features (one-hot blocks scored as one variable) and write "
                    "certificate.json, report.html, model.joblib and eval.csv to DIR.")
    demo.add_argument("--out", metavar="DIR", default="otstab-demo",
                      help="output folder (default: ./otstab-demo)")
    demo.add_argument("--r", type=_number(False), default=DEMO_R,
                      help=f"error-rate threshold (default {DEMO_R})")
    demo.add_argument("--top", type=_positive_int, default=10,
                      help="number of features to print (default 10)")
    demo.add_argument("--no-html", action="store_true", help="skip the HTML report")
    demo.add_argument("--quiet", action="store_true", help="print only the output paths")
    _add_debug(demo)

    cert = sub.add_parser(
        "certify", help="certify a saved model on a data file",
        description="Compute the stability criterion R(beta, r) of a saved scikit-learn model "
                    "(or Pipeline) on evaluation data and write a certificate. A pickle/joblib "
                    "MODEL is loaded only with --trust-model (unpickling runs code from the "
                    "file); a .skops MODEL loads safely without it.")
    _add_inputs(cert)
    cert.add_argument("--dask", nargs="?", const="local", default=None, metavar="ADDRESS",
                      help="read DATA (a directory of Parquet files) with Dask, computing "
                           "blockwise; with ADDRESS connect to that distributed scheduler "
                           "(docs/scale.md)")
    cert.add_argument("--loss", default="zero_one",
                      help=f"loss: one of {', '.join(LOSS_NAMES)}, pinball(TAU) or "
                           "epsilon_insensitive(EPS) (default zero_one)")
    cert.add_argument("--r", type=_number(False), required=True,
                      help="risk threshold (for zero_one an error rate in [0, 1])")
    cert.add_argument("--theta1", type=_number(True), default=1.0,
                      help="price of moving samples, > 0 or inf (default 1)")
    cert.add_argument("--theta2", type=_number(True), default=0.25,
                      help="price of reweighting, > 0 or inf (default 0.25)")
    cert.add_argument("--divergence", choices=DIVERGENCES, default="kl",
                      help="reweighting divergence (default kl)")
    cert.add_argument("--solver", choices=SOLVERS, default="auto", help="solver (default auto)")
    cert.add_argument("--movable", nargs="+", metavar="COL", default=None,
                      help="only these features may move (names after the model's "
                           "preprocessing, or indices)")
    cert.add_argument("--feature-costs", metavar="PRICES", default=None,
                      help="per-feature move prices in (0, inf] (inf: immutable): "
                           "'age=inf,duration=2', a JSON object or a JSON file; names are "
                           "the data's raw columns (priced per raw unit) or the model's input "
                           "columns, integers are column indices")
    cert.add_argument("--sample-weight", metavar="COL", default=None,
                      help="column of DATA holding the rows' weights (survey weights); it is "
                           "removed from the features")
    cert.add_argument("--time-budget", type=_tolerance, default=None, metavar="SECONDS",
                      help="tree ensembles (any supported loss): stop the certified lower "
                           "bound's branch and bound after SECONDS (the certificate records it; "
                           "verify recomputes without it and checks recorded <= recomputed)")
    cert.add_argument("--node-budget", type=_positive_int, default=None, metavar="N",
                      help="tree ensembles (any supported loss): at most N boxes in all for the "
                           "certified lower bound (deterministic: verify reproduces it)")
    cert.add_argument("--max-nodes", type=_positive_int, default=None, metavar="N",
                      help="tree ensembles (any supported loss): at most N boxes per sample for "
                           "the certified lower bound (default 200 for 0/1, 16384 for "
                           "logistic / cross_entropy)")
    cert.add_argument("--rtol", type=_rtol, default=None, metavar="R",
                      help="tree ensembles (any supported loss): stop refining the certified "
                           "lower bound once value_lower >= (1 - R) value_upper (default 0.01; 0: "
                           "refine every sample that enters the dual up to --max-nodes; "
                           "'none': every sample gets --max-nodes boxes in one round, "
                           "Python's rtol=None)")
    cert.add_argument("--cost", choices=("auto", "encoded"), default=None,
                      help="transport cost: 'encoded' (squared distance in the model's "
                           "input space, the paper's cost) or 'auto' (a DataCost on the "
                           "data's own variables, every kind, scale and level inferred; Q* is "
                           "then a valid data set). Default: as otstab.certify's cost=None, "
                           "'auto' for a Pipeline with encoders on raw columns where a "
                           "DataCost path answers its model and loss, else 'encoded' (also "
                           "with --features, --grid or --dask); the output names the cost "
                           "used")
    cert.add_argument("--cost-file", metavar="SPEC.json", default=None,
                      help="a DataCost spec (otstab.DataCost(...).to_dict() as JSON, e.g. "
                           "versioned next to the model): the cost on the data's own variables")
    cert.add_argument("--immutable", metavar="COLS", default=None,
                      help="comma-separated raw columns that cannot move (e.g. 'age,sex'), "
                           "added to the DataCost (--cost auto unless --cost-file)")
    cert.add_argument("--confidence", type=_level, default=None, metavar="LEVEL",
                      help="confidence level of the sampling interval of R and of its "
                           "one-sided lower bound, recorded in the certificate (default "
                           "0.95); when given, --fail-under gates on that lower confidence "
                           "bound")
    cert.add_argument("--fail-under", type=_number(False), default=None, metavar="VALUE",
                      help="policy threshold: exit 5 when R is proven below VALUE, 6 when "
                           "not certified (a non-exact answer whose certified lower end "
                           "value_lower is below VALUE while its upper end is not); gates on "
                           "value_lower for non-exact answers and on the lower confidence "
                           "bound with --confidence")
    cert.add_argument("--require-exact", action="store_true",
                      help="exit 6 (not certified) unless the answer is exact (status "
                           "optimal, zero or unreachable; not 'bounds')")
    cert.add_argument("--title", default=None, help="title of the HTML report")
    cert.add_argument("--pdf", metavar="OUT",
                      help="also print the HTML report to PDF with headless Chromium")
    cert.add_argument("--card", metavar="OUT",
                      help="write a model-card summary for governance tooling (.json or .md; "
                           "'-' for JSON on stdout)")
    cert.add_argument("--qstar-raw", metavar="OUT",
                      help="write Q* in the data's raw columns and units (.csv or .parquet; "
                           "res.to_frame(raw=True))")
    cert.add_argument("--bootstrap", type=_positive_int, default=None, metavar="N",
                      help="estimate the sampling uncertainty with N bootstrap replicates "
                           "(seed 0) instead of the influence function")
    cert.add_argument("--features", action="store_true",
                      help="also score every feature's stability (feature_stability)")
    cert.add_argument("--groups", choices=("auto", "none"), default="auto",
                      help="with --features: score each one-hot block (columns named "
                           "'variable: level', or a Pipeline's OneHotEncoder outputs) as one "
                           "feature (auto, the default) or every column alone (none)")
    cert.add_argument("--top", type=_positive_int, default=10,
                      help="number of features to print (default 10)")
    cert.add_argument("--json", metavar="OUT",
                      help="write the certificate (JSON) here; '-' prints it on stdout (the "
                           "other messages then go to stderr)")
    cert.add_argument("--html", metavar="OUT", help="write an HTML report here")
    cert.add_argument("--grid", action="store_true",
                      help="with --html: add the corruption/reweighting split over theta and "
                           "R against r (about 18 more certifications)")
    cert.add_argument("--qstar", metavar="OUT",
                      help="write the most sensitive distribution Q* (.csv or .parquet)")
    cert.add_argument("--quiet", action="store_true",
                      help="print nothing on success (errors and a failed gate still go to "
                           "stderr)")
    _add_debug(cert)

    ver = sub.add_parser(
        "verify", help="recompute a certificate and compare",
        description="Recompute a certificate from the model and the data and check every "
                    "field: the data and model blocks against DATA and MODEL, every figure of "
                    "the results against a new certify run (and the feature table against a "
                    "new feature_stability run) within the tolerances, the fields that follow "
                    "from others (gap, excess risk, ranks) for consistency, and with --qstar "
                    "every column of the Q* file; timings, versions and the creation time are "
                    "informational (docs/guarantees.md). Exit 0 when everything reproduces, 1 "
                    "with the reasons when not. A pickle/joblib MODEL is loaded only with "
                    "--trust-model (unpickling runs code from the file).")
    ver.add_argument("certificate", metavar="CERT.json", help="the certificate file")
    _add_inputs(ver, target_required=False)
    ver.add_argument("--qstar", metavar="FILE",
                     help="also audit this Q* file (cost, risk and mass recomputed)")
    ver.add_argument("--sample-weight", metavar="COL", default=None,
                     help="column of DATA holding the rows' weights of a weighted certificate "
                          "(default: the column it records, inputs.sample_weight.source); it "
                          "is removed from the features")
    ver.add_argument("--cost-file", metavar="SPEC.json", default=None,
                     help="also require the certificate's cost spec (inputs.cost, which verify "
                          "always recomputes under) to be this DataCost spec file's, resolved "
                          "on MODEL and DATA")
    ver.add_argument("--rtol", type=_tolerance, default=None,
                     help="relative tolerance for the figures, >= 0 (default 1e-6)")
    ver.add_argument("--atol", type=_tolerance, default=None,
                     help="absolute tolerance for the figures, >= 0 (default 1e-9)")
    ver.add_argument("--h-rtol", type=_tolerance, default=None,
                     help="relative tolerance for the dual multipliers, >= 0 (default 1e-5)")
    ver.add_argument("--gap-tol", type=_tolerance, default=None,
                     help="largest accepted primal-dual gap, >= 0 (default 1e-5)")
    ver.add_argument("--no-features", action="store_true",
                     help="do not recompute the feature-stability scores")
    ver.add_argument("--json", action="store_true",
                     help="print the verification report as JSON on stdout (ok, checked, "
                          "mismatches, notes, tolerances); the exit code is unchanged")
    _add_debug(ver)
    from ._monitor import add_parser as add_monitor
    add_monitor(sub)  # otstab monitor: its code lives in otstab.cli._monitor (issue 32)
    return p


def _add_debug(p) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the Python traceback of unexpected errors")


def _add_inputs(p, *, target_required=True) -> None:
    p.add_argument("--model", required=True, metavar="MODEL",
                   help="fitted scikit-learn estimator or Pipeline saved with skops (.skops, "
                        "loaded safely) or joblib/pickle (.joblib, .pkl: needs "
                        "--trust-model)")
    p.add_argument("--data", required=True, metavar="DATA",
                   help="evaluation data: .csv, .csv.gz, .tsv or .parquet with a header row")
    p.add_argument("--target", required=target_required, metavar="COL",
                   help="label column of DATA" + (
                       "" if target_required else " (default: the certificate's)"))
    p.add_argument("--trust-model", action="store_true",
                   help="allow loading a pickle/joblib MODEL, which runs code stored in the "
                        "file: pass it only for a file you trust (e.g. a model you saved "
                        "yourself); for a .skops MODEL, also trust the types skops does not "
                        "know")
