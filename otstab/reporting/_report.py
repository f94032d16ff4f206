"""A self-contained HTML report of a stability certificate.

One file, no external resources and no JavaScript: the figures are inlined as base64 PNG
(made with matplotlib when it is installed; without it the report has the tables only). It
shows the certificate (value, threshold, thetas, audit), the excess-risk decomposition, the
most sensitive features, the plots of :mod:`otstab.plot` and the certificate JSON itself.

Typical use::

    from otstab import certify, certificate, report
    res = certify(model, X, y, loss="zero_one", r=0.4)
    cert = certificate.make_certificate(res, model, X, y)
    report.write_report("report.html", cert, result=res, model=model, X=X, y=y)
"""

from __future__ import annotations

import base64
import functools
import html
import importlib
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..certificates import loss_from_spec, validate_certificate
from ..errors import ValidationError
from . import _plot as _plot

__all__ = ["render_html", "write_report", "figure_png", "write_pdf", "find_chromium",
           "model_card", "model_card_markdown", "raw_moves", "public_name", "cost_text",
           "datacost_changes", "policy_gate", "bounds_kind", "tighten_advice"]

# packages whose public modules may be imported to shorten a class path (others are used
# only when the user's program has already imported them)
_IMPORTABLE = ("sklearn", "otstab", "xgboost", "lightgbm")


def _resolve(module: str, attrs: list[str]):
    mod = sys.modules.get(module)
    if mod is None:
        if module.split(".")[0] not in _IMPORTABLE and module.split(".")[0] not in sys.modules:
            return None
        try:
            mod = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - any import failure: keep the path as written
            return None
    obj: Any = mod
    for a in attrs:
        obj = getattr(obj, a, None)
        if obj is None:
            return None
    return obj


def public_name(qualified) -> str:
    """The public import path of a class path such as a certificate's ``model.class``.

    ``"sklearn.linear_model._logistic.LogisticRegression"`` becomes
    ``"sklearn.linear_model.LogisticRegression"``: private module components (a leading
    underscore) are dropped when the public parent module exports the same object. A path
    that cannot be checked (the package is not installed) is returned unchanged.
    """
    if not isinstance(qualified, str) or "." not in qualified:
        return qualified
    parts = qualified.split(".")
    if not any(p.startswith("_") and not p.startswith("__") for p in parts[:-1]):
        return qualified
    for k in range(len(parts) - 1, 0, -1):     # where the module path ends
        modparts, attrs = parts[:k], parts[k:]
        if any(a.startswith("_") for a in attrs):
            continue
        public = [p for p in modparts if not p.startswith("_")]
        if public == modparts:
            continue
        original = _resolve(".".join(modparts), attrs)
        if original is None:
            continue
        for j in range(1, len(public) + 1):    # the shortest public parent that exports it
            cand = public[:j]
            if modparts[:len(cand)] != cand:
                break
            if _resolve(".".join(cand), attrs) is original:
                return ".".join(cand + attrs)
        return qualified
    return qualified

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:62em;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ddd;
padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-size:1.1em;background:#f6f8fa;border-left:4px solid #1b9e77;padding:.6em 1em}
.value{font-size:1.4em;font-weight:bold}
.warn{border-left-color:#d95f02}
figure{margin:1em 0}figcaption{font-size:.88em;color:#555}
img{max-width:100%;height:auto}
pre{background:#f6f8fa;padding:.8em;overflow:auto;font-size:.8em}
code{background:#f6f8fa;padding:0 .2em}
.small{font-size:.85em;color:#555}
pre{white-space:pre-wrap;overflow-wrap:anywhere}
.pass,.fail{font-weight:bold;padding:.1em .5em;border-radius:3px;color:#fff}
.pass{background:#1b7e4a}.fail{background:#b3261e}
.policy{border-left:4px solid #555;padding:.5em 1em;background:#fafafa}
dl.explain dt{font-weight:bold;margin-top:.5em}dl.explain dd{margin-left:1.2em}
.print-only{display:none}
@page{size:A4;margin:14mm 12mm 16mm;
@bottom-right{content:"page " counter(page) " of " counter(pages);font-size:8pt;color:#555}}
@media print{
body{max-width:none;margin:0;padding:0;font-size:10.5pt}
h1,h2,h3,dt,p.lead{break-after:avoid;page-break-after:avoid;break-inside:avoid}
h2::after,h3::after,dt::after,p.lead::after{content:"";display:block;height:45mm;
margin-bottom:-45mm}
h2+*,h2+p+*{break-before:avoid;page-break-before:avoid}
.json{display:none}.print-only{display:block}
table,figure,pre.command,.verdict,.policy,dl.explain dd{break-inside:avoid;page-break-inside:avoid}
pre{overflow:visible;white-space:pre-wrap;overflow-wrap:anywhere;font-size:7.5pt}
details>summary{display:none}
img{max-width:100%;max-height:120mm}
a{color:inherit;text-decoration:none}
}
"""


def _fmt(x, digits=6) -> str:
    if x is None:
        return "&ndash;"
    if isinstance(x, str):
        return html.escape(x)
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    try:
        v = float(x)
    except (TypeError, ValueError):
        return html.escape(str(x))
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}g}"


def _num(x) -> float:
    if x is None:
        return math.nan
    return float(x)


def _table(rows, header=None) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>")
    for row in rows:
        cells = []
        for k, v in enumerate(row):
            if k == 0 and header is None:
                cells.append(f"<th>{html.escape(str(v))}</th>")
            else:
                is_num = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
                    v, bool)
                cls = ' class="num"' if is_num else ""
                cells.append(f"<td{cls}>{_fmt(v)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def figure_png(draw, *, figsize=(6.4, 4.4), dpi=110) -> str | None:
    """Render ``draw(ax)`` on a fresh matplotlib Figure and return it as a base64 PNG string.

    Uses :class:`matplotlib.figure.Figure` directly (no pyplot, no GUI backend). Returns None
    when matplotlib is not installed.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    draw(ax)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(png: str | None, caption: str, alt: str) -> str:
    if png is None:
        return ""
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _uncertainty_text(unc: dict, *, exact: bool = True, upper=None, interface="python") -> str:
    """The sampling uncertainty of R in plain words.

    For a non-exact answer (status ``bounds``) the recorded SE (influence function or
    bootstrap alike) is that of the found value ``value_upper``, not of R nor of the certified
    ``value_lower``: the text says so and calls the certified side's confidence bound not
    available, rather than offering the found value's bound as something to gate on."""
    lv = f"{100 * float(unc['level']):g}%"
    how = ("a bootstrap over the evaluation rows" if unc["method"] == "bootstrap"
           else "the influence function (normal approximation)")
    if exact:
        conf = f"{float(unc['level']):g}"
        text = (f"R was computed on a sample of evaluation data; another sample of the same "
                f"size from the same population would give a somewhat different value. By "
                f"{how}, R would typically move by about {_fmt(_num(unc['se']), 3)} (one "
                f"standard error); with {lv} confidence R in the population lies between "
                f"{_fmt(_num(unc['ci_low']))} and {_fmt(_num(unc['ci_high']))}, and is at "
                f"least {_fmt(_num(unc['lower_bound']))} (a gate asked for {lv} confidence, "
                f"{_code(_setting('confidence', conf, interface))}, compares this bound with "
                "its threshold).")
    else:
        found = "" if upper is None else f" = {_fmt(_num(upper))}"
        redo = "on every resample" if unc["method"] == "bootstrap" else "from its weights"
        text = (f"Confidence bound of the certified side (value_lower): <strong>not "
                f"available</strong>. The sampling standard error recorded here, by {how}, "
                f"is that of the found value value_upper{found} (the cost of the returned Q*, "
                f"recomputed {redo}), not of R and not of the certified value_lower; no "
                "sampling interval for the certified side is computed, so a gate asked for "
                "confidence reports this answer as not certified. For reference only, the "
                f"found value would typically move by about {_fmt(_num(unc['se']), 3)} on "
                f"another sample (one standard error; {lv} interval "
                f"{_fmt(_num(unc['ci_low']))} to {_fmt(_num(unc['ci_high']))}).")
    note = unc.get("note") or ""
    if not exact:  # a bootstrap would only re-estimate the found value: no advice to run one
        note = "; ".join(p for p in note.split("; ") if p != "prefer se='bootstrap'")
    if note:
        text += f" Caution: {html.escape(_for_interface(note, interface))}."
    return text


def _code(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


#: ``certify`` keywords and the ``otstab certify`` flags that set them
_CLI_FLAGS = {"confidence": "--confidence", "max_nodes": "--max-nodes",
              "time_budget": "--time-budget", "loss": "--loss", "solver": "--solver",
              "se": "--bootstrap", "rtol": "--rtol", "steps": "--steps"}


@functools.lru_cache(maxsize=1)
def _cli_certify_flags() -> frozenset:
    """The option strings ``otstab certify`` accepts (read from its parser)."""
    import argparse

    from ..cli._parser import build_parser  # noqa: PLC0415 (the CLI imports this module)

    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return frozenset(o for a in sub.choices["certify"]._actions for o in a.option_strings)


def _setting(name: str, value: str, interface: str = "python") -> str:
    """How to set one option, in the reader's interface: ``certify(..., name=value)`` from
    Python, ``--flag value`` in a report made by the CLI (or, where the CLI has no such flag,
    that it has none and the Python call)."""
    py = f"otstab.certify(..., {name}={value})"
    if interface != "cli":
        return py if name != "confidence" else f"policy_gate(..., confidence={value})"
    flag = _CLI_FLAGS.get(name)
    if flag is None or flag not in _cli_certify_flags():
        return f"otstab certify has no flag for {name}; from Python {py}"
    if name == "se":
        return "--bootstrap N (e.g. --bootstrap 200)"
    return f"{flag} {value.strip(chr(39))}"


def _for_interface(text: str, interface: str) -> str:
    """A library message with its Python settings written as CLI flags in a CLI report."""
    if interface != "cli":
        return text
    return text.replace("se='bootstrap'", _setting("se", "'bootstrap'", "cli"))


def bounds_kind(message: str = "", estimator: str = "") -> str:
    """What proved the certified side of a non-exact answer, read from the solver message
    (``res.message`` or the certificate's ``solver.message``): ``"tree"`` (branch and bound
    over a tree ensemble's leaves), ``"mlp"`` (bounds of a network over each sample's ball,
    0/1 loss), ``"mlp_smooth"`` (nested-ball and global Lipschitz over-estimate, smooth
    losses), ``"first_order_linear"``
    (the first-order path of a linear model, which has an exact path), ``"first_order"`` (the
    first-order path, no lower bound, the model unknown), ``"none"`` (no certified lower bound
    for this model: ``value_lower = 0``) or ``"other"``."""
    message = message or ""
    if "tree ensemble" in message:
        return "tree"
    if "global Lipschitz" in message or "nested balls" in message:
        return "mlp_smooth"
    if "local-Lipschitz (MLP)" in message or "linear bound propagation" in message:
        return "mlp"
    if "first-order" in message and "no certified lower bound" in message:
        linear = any(k in estimator for k in ("linear_model", "svm", "LinearModel"))
        return "first_order_linear" if linear else "first_order"
    if "no certified lower bound" in message:
        return "none"
    return "other"


def tighten_advice(kind: str, interface: str = "python", *, ratio=None, options=None,
                   complete=None, stopped=None) -> str:
    """Plain-text advice on narrowing a non-exact answer's interval, for the model at hand
    (``kind`` from :func:`bounds_kind`), with settings in the reader's interface.
    ``options``: the ``certify`` options used, when known; ``complete``: whether the tree
    search finished for every sample, when known; ``stopped``: what stopped the tree search
    (``"rtol"``, ``"time_budget"``, ``"node_budget"``), when known."""
    options = options or {}
    if ratio is not None and ratio >= 1 - 1e-6:
        return ("the interval is already tight (value_lower / value_upper = "
                f"{ratio:.7g}: the gap is the rounding margin of the certified side); nothing "
                "to tighten")
    if kind == "tree" and complete:
        return ("the branch and bound finished for every sample, so value_lower is R itself "
                "up to rounding; value_upper is higher because the returned Q* does not yet "
                "use the closer points that search found (docs/bounds.md, Limitations): no "
                "setting narrows the interval, and a gate on value_lower loses nothing")
    if kind == "tree" and stopped == "rtol":
        rtol = float(options.get("rtol", 0.01))
        return ("the branch and bound stopped once value_lower reached (1 - rtol) value_upper "
                f"(rtol = {rtol:g}: the samples that decide R were refined first); a smaller "
                f"rtol narrows the interval: {_setting('rtol', f'{rtol / 10:g}', interface)} "
                "(docs/bounds.md)")
    if kind == "tree":
        used = [f"{k} = {options[k]:g}" for k in ("max_nodes", "time_budget") if k in options]
        nodes = int(options.get("max_nodes", 200))
        text = ("a tree ensemble has no exact path at this size; the branch and bound behind "
                "value_lower stops at its budget (max_nodes, boxes per sample, default 200; "
                "time_budget, seconds for all samples, default none"
                f"{'; this run: ' + ', '.join(used) if used else ''}). A larger budget narrows "
                f"the interval: {_setting('max_nodes', str(max(10 * nodes, 2000)), interface)}")
        if "time_budget" in options:
            longer = f"{10 * float(options['time_budget']):g}"
            text += f", and a larger time budget: {_setting('time_budget', longer, interface)}"
        return text + " (docs/bounds.md)"
    if kind == "mlp":
        text = ("a network has no exact path in general: value_lower comes from bounds of the "
                "network over each sample's ball (a local Lipschitz bound and linear bound "
                "propagation; for one hidden ReLU layer also its activation regions, exact for "
                "samples with at most 8 units that can switch, 8192 regions in all; "
                "docs/bounds.md)")
        if "time_budget" in options:
            longer = f"{10 * float(options['time_budget']):g}"
            return (text + ". This run's time budget stopped that search early; a larger one "
                    f"narrows the interval: {_setting('time_budget', longer, interface)}")
        return (text + ", and no otstab setting closes this gap further. Gate on value_lower; "
                "a threshold at or below it is certified, one above it is not certifiable "
                "for this model with this bound")
    if kind == "mlp_smooth":
        return ("value_lower comes from an over-estimate of the smooth loss over nested balls "
                "around each sample (linear bound propagation) and a global Lipschitz "
                "over-estimate beyond them, which no setting tightens; the 0/1 loss has a "
                "much tighter bound: "
                f"{_setting('loss', repr('zero_one'), interface)} (docs/bounds.md)")
    if kind == "first_order_linear":
        return ("the first-order path gives no certified lower bound (value_lower = 0), and "
                "this linear model has an exact path: "
                f"{_setting('solver', repr('auto'), interface)}")
    if kind == "first_order":
        return ("the first-order path gives no certified lower bound for this model "
                "(value_lower = 0); if the model is linear it has an exact path "
                f"({_setting('solver', repr('auto'), interface)}), otherwise no positive "
                "threshold can pass (certified lower bounds exist for scikit-learn tree "
                "ensembles and MLPs: docs/bounds.md)")
    if kind == "none":
        return ("otstab has no certified lower bound for this model (value_lower = 0), so no "
                "positive threshold can pass; certified lower bounds exist for scikit-learn "
                "tree ensembles and MLPs (docs/bounds.md)")
    return "see docs/bounds.md for what bounds R for this model"


def _result_kind(result) -> str:
    """:func:`bounds_kind` of a result object (or anything with ``message`` and ``solver``)."""
    return bounds_kind(getattr(result, "message", "") or "")


def _search_stopped(result):
    """What stopped the tree search (``"rtol"``, a budget; None when unknown or complete)."""
    info = (getattr(result, "info", None) or {}).get("lower_bound")
    return info.get("stopped") if isinstance(info, dict) else None


def _search_complete(result):
    """Whether the tree search finished for every sample (None when unknown)."""
    info = (getattr(result, "info", None) or {}).get("lower_bound")
    if not info or info.get("exact") is None:
        return None
    return bool(np.all(np.asarray(info["exact"], dtype=bool)))


def policy_gate(result, fail_under=None, *, require_exact=False, confidence=None,
                interface="python") -> dict:
    """Pass/fail of a result against a policy threshold on R (the CI gate of ``otstab
    certify --fail-under``; docs/ci_gating.md).

    The gated value is the certified lower side of R: ``value`` for an exact answer,
    ``value_lower`` for a non-exact one (status ``bounds``: ``value_lower <= R <=
    value_upper``), and with ``confidence`` the smaller of that and the one-sided lower
    confidence bound of R at that level (a statement about the population, not only this
    sample). A non-exact answer has no such bound for its certified side (its sampling SE is
    that of the found value ``value_upper``): with ``confidence`` it is ``"not_certified"``
    unless even ``value_upper`` is below the threshold (``"below"``).

    ``interface`` (``"python"`` or ``"cli"``) is how the advice in ``reason`` names settings
    (``certify(..., max_nodes=...)`` or ``--max-nodes``).

    Returns
    -------
    dict
        ``outcome``: ``"pass"`` (gated value >= threshold, or no threshold), ``"below"`` (the
        gated value is below the threshold and so is R's upper side, or the answer is exact),
        ``"not_certified"`` (a non-exact answer straddling the threshold, a confidence bound
        that is not available, or ``require_exact`` with a non-exact answer); ``passed``,
        ``gated_on``, ``gated_value``, ``threshold``, ``status``, ``reason``.
    """
    exact = result.status != "bounds"
    lower = result.value if exact else result.value_lower
    upper = result.value if exact else result.value_upper
    out = {"threshold": fail_under, "require_exact": bool(require_exact),
           "status": result.status, "confidence": confidence,
           "gated_on": "value" if exact else "value_lower", "gated_value": lower}

    def verdict(outcome, reason):
        return {**out, "outcome": outcome, "passed": outcome == "pass", "reason": reason}

    if confidence is not None and math.isfinite(result.value):
        if not exact:
            if fail_under is not None and upper < fail_under:
                return verdict("below", f"value_upper = {upper:.6g} < {fail_under:g}: even "
                                        "the found value is below the threshold")
            return verdict("not_certified",
                           f"no {confidence:g} lower confidence bound of the certified side "
                           "value_lower is available (the sampling SE of a non-exact answer "
                           "is that of the found value value_upper)")
        lcb = result.lower_confidence_bound(confidence)
        if math.isnan(lcb):
            return verdict("not_certified", f"the {confidence:g} lower confidence bound of R "
                                            "is not available")
        if lcb < lower:
            lower = lcb
            out.update(gated_on=f"lower_confidence_bound({confidence:g})", gated_value=lcb)
    if require_exact and not exact:
        return verdict("not_certified",
                       f"the answer is not exact (status bounds: R in [{result.value_lower:.6g}"
                       f", {result.value_upper:.6g}]) and an exact answer is required")
    if fail_under is None:
        return verdict("pass", "no threshold")
    said = f"{out['gated_on']} = {lower:.6g}"
    if lower >= fail_under:
        return verdict("pass", f"{said} >= {fail_under:g}")
    if exact or upper < fail_under:  # R (or its confidence bound) is below the threshold
        return verdict("below", f"{said} < {fail_under:g}")
    advice = tighten_advice(_result_kind(result), interface, complete=_search_complete(result),
                            stopped=_search_stopped(result))
    return verdict("not_certified",
                   f"{said} < {fail_under:g} <= value_upper = {upper:.6g}: R may be on either "
                   f"side; {advice}")


def _policy_html(policy: dict | None, results=None) -> str:
    """The gate in one sentence: what is required, which value decides (for a non-exact
    answer the certified lower end, not the found value), and the verdict."""
    if not policy or policy.get("threshold") is None and not policy.get("require_exact"):
        return ""
    ok = bool(policy.get("passed"))
    badge = f'<span class="{"pass" if ok else "fail"}">{"PASS" if ok else "FAIL"}</span>'
    thr = policy.get("threshold")
    what = (f"R must be at least {_fmt(thr)}" if thr is not None else "an exact answer")
    both = " and exact" if thr is not None and policy.get("require_exact") else ""
    on = str(policy.get("gated_on"))
    val = _fmt(_num(policy.get("gated_value")))
    if on == "value_lower":
        up = (results or {}).get("value_upper")
        found = "" if up is None else f" = {_fmt(_num(up))}"
        decided = (f"decided on the certified lower end value_lower = {val} (no perturbation "
                   f"cheaper than it reaches r), not on the found value_upper{found}")
    elif on == "value":
        decided = f"decided on R = {val}"
    else:
        decided = f"decided on {html.escape(on)} = {val}"
    reason = str(policy.get("reason", ""))
    either = "R may be on either side; "
    if on == "value_lower" and either in reason:  # its advice is the section that follows
        reason = reason.split(either)[0] + "R may be on either side (see Narrowing the interval)"
    text = (f"Policy: {what}{both}, {decided}: {badge} "
            f"({html.escape(str(policy.get('outcome', '')).replace('_', ' '))}: "
            f"{html.escape(reason)}).")
    return f'<p class="policy" id="policy">{text}</p>'


def _space_text(cert: dict) -> str:
    """Where the cost is measured: the final estimator's input columns, in words."""
    model = cert["inputs"]["model"]
    d = cert["inputs"]["data"]["n_features"]
    est = html.escape(str(public_name(model.get("estimator") or model.get("class"))))
    if model.get("pipeline"):
        steps = " &rarr; ".join(html.escape(str(s["name"])) for s in model["pipeline"][:-1])
        return (f"the model's preprocessed feature space: the input columns of the final "
                f"estimator <code>{est}</code> after the pipeline's preprocessing ({steps}) "
                "&mdash; a standardised column moves in standard deviations of the training "
                "data, a one-hot indicator between 0 and 1 (a whole category change costs 2 "
                f"squared units), raw columns the model drops never move; the raw data has "
                f"{d} columns")
    return (f"the {d} input columns of <code>{est}</code> as given (no preprocessing), in "
            "those columns' own units")


def _explanation(cert: dict) -> str:
    """The plain-language "what this means" section."""
    inputs, solver = cert["inputs"], cert["solver"]
    t1, t2 = _fmt(_num(inputs["theta1"])), _fmt(_num(inputs["theta2"]))
    div = inputs["divergence"]
    phi = "t log t - t + 1 (KL)" if div == "kl" else "(t - 1)<sup>2</sup> (chi-square)"
    exact = solver["status"] != "bounds"
    items = [
        ("What is measured",
         "How much the evaluation data would have to change before the model's average "
         f"{html.escape(inputs['loss']['name'])} loss reaches the threshold r = "
         f"{_fmt(_num(inputs['r']))} (for the 0/1 loss: the error rate). Two kinds of change "
         "are priced: moving samples (data corruption, measurement drift) and reweighting them "
         "(some kinds of cases becoming more frequent). Labels never change."),
        ("The cost and its units",
         (_datacost_html(inputs["cost"]) if inputs.get("cost") else
          f"Moving a sample from x to x' costs theta1 &times; ||x' - x||<sup>2</sup>, the "
          f"<em>squared Euclidean distance</em> in {_space_text(cert)}, weighted by the "
          "sample's weight. ")
         + f"Reweighting a sample to weight w costs theta2 &times; phi(w) with phi(t) = "
         f"{phi}, averaged over the samples. R is the total of both, so it has no physical "
         "unit: it compares models and thresholds on the same data and the same prices."),
        ("R", "R(beta, r): the smallest cost of a change that brings the risk to r. Larger = "
              "more stable. R = 0: the data already reach r; R = inf: no allowed change can."),
        ("r", "The risk threshold: the level of loss (error rate) that counts as failure."),
        ("theta1, theta2", f"The prices of moving ({t1}) and of reweighting ({t2}); "
                           "inf forbids that kind of change. Halving a price doubles how far "
                           "that kind of change may go for the same cost."),
        ("h (and alpha)", "The dual multipliers: h is the marginal cost of risk, raising r by a "
                          "small amount d raises R by about h &times; d; alpha (chi-square "
                          "only) keeps the total weight at 1."),
        ("E_P0[l] and risk under Q*", "The average loss on the evaluation data as given, and "
                                      "under the most sensitive distribution Q* (which "
                                      "reaches r)."),
        ("Mass of Q*", "The total weight of Q* (it must equal 1: Q* is a reweighting, not a "
                       "way to add or remove data)."),
        ("Q*", "The most sensitive distribution: the cheapest change itself, every evaluation "
               "sample with where it moves and its new weight. It shows which cases and which "
               "columns the model is fragile to."),
        ("What is guaranteed",
         ("The answer is exact and audited: no change cheaper than R reaches r (the dual "
          "value is a proven lower bound), and Q* reaches r at cost R (the primal cost "
          "recomputed from Q* matches within the relative gap shown). ") if exact else
         ("The answer is not exact: R lies between value_lower (no cheaper change reaches r) "
          "and value_upper (the audited Q* reaches r at that cost); gate on value_lower. ")
         + "The guarantee is about this evaluation sample, this model and these prices; the "
           "sampling interval (when shown) says how much R would vary on another sample of "
           "the same population. Changes of a kind the cost does not price (e.g. labels, or "
           "columns outside the movable set) are not covered. `otstab verify` recomputes "
           "every figure from the model and the data."),
    ]
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    return ('<h2 id="explanation">What this means</h2>'
            f'<dl class="explain">{body}</dl>')


def cost_text(cert: dict) -> str:
    """The certificate's transport cost in plain words (one line per variable under a
    DataCost: ``inputs.cost.description``), plain text."""
    block = cert["inputs"].get("cost")
    if not block:
        return ("the encoded cost: theta1 x the squared Euclidean distance in the model's "
                "input space (after its preprocessing)")
    return ("a cost on the data's own variables (DataCost, spec fingerprint "
            f"{block['sha256'][:12]}), theta1 x the sum over variables of:\n"
            + block["description"])


def _datacost_html(block: dict) -> str:
    lines = "".join(f"<li>{html.escape(t)}</li>" for t in block["description"].splitlines())
    return ("Moving a sample from x to x' costs theta1 &times; c(x, x'), a cost on the "
            "<em>data's own variables</em> (a DataCost, spec fingerprint "
            f"<code>{html.escape(block['sha256'][:12])}</code>), weighted by the sample's "
            "weight; c is the sum over the variables of:"
            f'<ul class="cost" id="cost-description">{lines}</ul>'
            "A move to a row that cannot exist (a level outside the variable's levels, a "
            "fractional integer, a value out of bounds, an immutable variable changed) is not "
            "allowed: every row of Q* is a row the model can score, and the audit re-scores "
            "Q*'s raw rows with the model and re-prices them with this cost. ")


def _units(v) -> str:
    """A number in the data's units: thousands separated, integers whole."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isfinite(x) and x == round(x) and abs(x) < 1e15:
        return f"{int(round(x)):,}"
    return f"{x:,.6g}" if abs(x) < 1e6 else f"{x:,.0f}"


def datacost_changes(result, top: int = 10):
    """Q* of a result certified under a DataCost, in the data's units:
    ``(frame, shares, changes)`` as :func:`raw_moves` (``shares``: the share of the DataCost
    of the moves per raw variable; ``changes``: ``(sample, weight, text)`` of the most moved
    atoms, e.g. ``"purpose: car (new) -> radio/television; amount 1,169 -> 1,402"``, plain
    text). None when the result was not certified under a DataCost."""
    from ..solve._datacost_linear import DataCostView

    view = (result.info or {}).get("raw_view")
    if not isinstance(view, DataCostView):
        return None
    frame = result.to_frame(raw=True)
    rc = view.cost
    names = [v.name for v in rc.variables]
    raw0 = frame[names].reset_index(drop=True)
    raw1 = frame[[f"{nm}*" for nm in names]].reset_index(drop=True)
    raw1.columns = names
    wm = np.asarray(result.weights, dtype=float) * np.asarray(result.mass, dtype=float)
    cost = frame["cost"].to_numpy(dtype=float)
    per = {}
    for v in rc.variables:
        nm = v.name
        if v.kind in ("numeric", "integer"):
            a = pd.to_numeric(raw0[nm], errors="coerce").to_numpy(float)
            b = pd.to_numeric(raw1[nm], errors="coerce").to_numpy(float)
            changed = b != a
        else:
            changed = raw0[nm].astype(str).to_numpy() != raw1[nm].astype(str).to_numpy()
        if not changed.any():
            per[nm] = 0.0
            continue
        one = raw0.copy()
        one[nm] = raw1[nm]
        per[nm] = float(wm[changed] @ rc.cost(raw0.iloc[np.flatnonzero(changed)].reset_index(
            drop=True), one.iloc[np.flatnonzero(changed)].reset_index(drop=True)))
    total = sum(per.values())
    shares = pd.Series({k: (c / total if total > 0 else 0.0) for k, c in per.items()})
    shares = shares.sort_values(ascending=False, kind="stable")
    order = np.argsort(-(wm * np.where(np.isfinite(cost), cost, 0.0)), kind="stable")[:top]
    src = np.asarray(result.source)
    changes = []
    for a in order:
        if not cost[a] > 0:
            break
        parts = []
        for nm in shares.index:
            before, after = raw0[nm].iloc[a], raw1[nm].iloc[a]
            # nm is one of the variables (the index of shares)
            if rc.variable(nm).kind in ("numeric", "integer"):  # type: ignore[union-attr]
                if float(before) != float(after):
                    parts.append(f"{nm} {_units(before)} -> {_units(after)}")
            elif str(before) != str(after):
                parts.append(f"{nm}: {before} -> {after}")
        label = frame["index"].iloc[a] if "index" in frame.columns else src[a]
        changes.append((str(label), _short(float(wm[a])), "; ".join(parts)))
    return frame, shares, changes


def raw_moves(result, top: int = 10):
    """Q* in the data's raw columns: ``(frame, shares, changes)``.

    ``frame`` is ``result.to_frame(raw=True)``; ``shares`` the share of the moving cost per
    raw column (``sum_a mass_a w_a ||x*_a - x_a||^2`` over that column's encoded columns,
    normalised to 1), largest first; ``changes`` one line per most-moved atom, e.g.
    ``"amount 1169 -> 1402; purpose radio/television -> car (new)"``. None when the model's
    preprocessing cannot be mapped back.
    """

    try:
        frame = result.to_frame(raw=True)
    except ValidationError:
        return None
    rmap = result.raw_view().map
    src = np.asarray(result.source)
    X0 = np.asarray(result.X)[src]
    dx2 = (np.asarray(result.X_star) - X0) ** 2
    wm = np.asarray(result.weights, dtype=float) * np.asarray(result.mass, dtype=float)
    cost = {v.name: float(wm @ dx2[:, v.columns].sum(axis=1)) for v in rmap.variables
            if v.columns}
    total = sum(cost.values())
    shares = pd.Series({k: (c / total if total > 0 else 0.0) for k, c in cost.items()})
    shares = shares.sort_values(ascending=False, kind="stable")
    order = np.argsort(-(wm * dx2.sum(axis=1)), kind="stable")[:top]
    changes = []
    for a in order:
        if dx2[a].sum() == 0:
            break
        parts = []
        for name in shares.index:
            before, after = frame[name].iloc[a], frame[f"{name}*"].iloc[a]
            if isinstance(after, float) and isinstance(before, (int, float, np.number)):
                if not np.isclose(float(before), after, rtol=1e-9, atol=0):
                    parts.append(f"{html.escape(name)} {_short(before)} &rarr; "
                                 f"{_short(after)}")
            elif before != after:
                parts.append(f"{html.escape(name)}: {html.escape(str(before))} &rarr; "
                             f"{html.escape(str(after))}")
        label = frame["index"].iloc[a] if "index" in frame.columns else src[a]
        changes.append((str(label), _short(float(wm[a])), "; ".join(parts[:4]) or
                        "(small moves of one-hot indicators only)"))
    return frame, shares, changes


def _short(v) -> str:
    v = float(v)
    return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"


#: a categorical axis of the raw Q* plot shows at most this many levels (the most frequent;
#: the others are drawn together as "(other)") so that its labels stay legible
RAW_PLOT_LEVELS = 12


def _raw_plot(ax, frame, a, b, wm, y=None, drawn=None):
    """Q* on two raw columns: crosses = data, discs = Q* (area ~ weight), arrows = the moves
    that change a shown value (at most 300). ``drawn``, a list, receives the number of arrows."""
    def coord(name):
        v0, v1 = frame[name], frame[f"{name}*"]
        if pd.api.types.is_numeric_dtype(v0) and pd.api.types.is_numeric_dtype(v1):
            return v0.to_numpy(float), v1.to_numpy(float), None
        s0, s1 = v0.astype(str).to_numpy(), v1.astype(str).to_numpy()
        counts = pd.Series(np.concatenate([s0, s1])).value_counts(sort=True)
        if len(counts) > RAW_PLOT_LEVELS:
            kept = set(counts.index[:RAW_PLOT_LEVELS - 1])
            s0 = np.where(np.isin(s0, list(kept)), s0, "(other)")
            s1 = np.where(np.isin(s1, list(kept)), s1, "(other)")
            levels = sorted(kept) + ["(other)"]
        else:
            levels = sorted(counts.index)
        pos = {lv: k for k, lv in enumerate(levels)}
        jit = np.random.default_rng(0).uniform(-0.25, 0.25, len(v0))  # fixed seed
        return (np.array([pos[t] for t in s0]) + jit,
                np.array([pos[t] for t in s1]) + jit, levels)
    x0, x1, lx = coord(a)
    y0, y1, ly = coord(b)
    ax.scatter(x0, y0, s=8, marker="x", color="#999999", alpha=0.5, linewidths=0.7,
               label="evaluation data")
    size = 30.0 * wm / max(float(np.max(wm)), 1e-300) * 4
    moved = (x0 != x1) | (y0 != y1)
    ax.scatter(x1, y1, s=size, color="#d95f02", alpha=0.55, edgecolors="none",
               label="Q* (area = weight)")
    arrows = np.flatnonzero(moved)
    arrows = arrows[np.argsort(-wm[arrows], kind="stable")][:300]
    for k in arrows:
        ax.annotate("", (x1[k], y1[k]), (x0[k], y0[k]),
                    arrowprops=dict(arrowstyle="->", color="#1b9e77", lw=0.6, alpha=0.7))
    if drawn is not None:
        drawn.append(len(arrows))
    for axis, levels in ((ax.xaxis, lx), (ax.yaxis, ly)):
        if levels is not None:
            axis.set_ticks(range(len(levels)))
            axis.set_ticklabels([lv if len(lv) <= 22 else lv[:20] + "..." for lv in levels],
                                fontsize=7)
    if lx is not None:
        for t in ax.get_xticklabels():
            t.set_rotation(35)
            t.set_ha("right")
            t.set_rotation_mode("anchor")
    ax.set_xlabel(f"{a} (raw units)")
    ax.set_ylabel(f"{b} (raw units)")
    ax.legend(loc="best", fontsize=8)
    return ax


def _count_arrows(ax) -> int:
    """How many arrows :func:`otstab.plot.sensitive_distribution` drew on ``ax``."""
    from matplotlib.quiver import Quiver

    return int(sum(np.size(c.U) for c in ax.collections if isinstance(c, Quiver)))


def _arrow_caption(n_arrows: int, moved: bool = True) -> str:
    if not moved:
        return "no sample moves (reweighting only), so no arrows are drawn"
    if n_arrows:
        return (f"arrows: the {n_arrows:,} largest-weight moves that change a shown value"
                if n_arrows >= 300 else f"arrows: the {n_arrows:,} moves that change a "
                "shown value")
    return ("no arrows: no sample's shown value changes (the moves are too small to change "
            "a category or are in other columns)")


def _raw_section(result, top=8) -> list[str]:
    got = datacost_changes(result, top=top)
    if got is not None:
        return _datacost_section(result, *got)
    got = raw_moves(result, top=top)
    if got is None:
        return []
    frame, shares, changes = got
    intro = (f"<p>{result.n_atoms} atoms over {result.n} samples. The moves of Q* mapped back "
             "to the raw columns and units of the data "
             "(scalers inverted exactly; a moved one-hot block is shown as the category whose "
             "indicator is largest after the move &mdash; a moved point generally has "
             "fractional indicators, listed in the Q* file's '&lt;column&gt;* indicators' "
             "columns). Share of moving cost: how much of the cost of moving samples falls on "
             "each raw column.</p>")
    rows = "".join(f"<tr><td>{html.escape(i)}</td><td class=\"num\">{w}</td><td>{c}</td></tr>"
                   for i, w, c in changes)
    top2 = list(shares.index[:2])  # the two raw columns with the largest share (or first)
    many = [c for c in top2 if not pd.api.types.is_numeric_dtype(frame[c])
            and frame[c].astype(str).nunique() > RAW_PLOT_LEVELS]
    other = (f" Of {' and '.join(many)}, the {RAW_PLOT_LEVELS - 1} most frequent "
             "categories are shown; the others are drawn together as (other)."
             if many else "")
    return _qstar_parts(result, frame, shares, intro=intro, word="raw column",
                        changes_lead="weighted squared move", changes_rows=rows,
                        changes_id="", top2=top2,
                        moved=bool(np.nansum(shares.to_numpy(float)) > 0), other=other)


def _datacost_section(result, frame, shares, changes) -> list[str]:
    """The raw Q* section of a result certified under a DataCost: moves in the data's
    units, the share of the cost per variable, the most moved samples."""
    intro = (f"<p>{result.n_atoms} atoms over {result.n} samples. Q* is a data set: every "
             "moved row takes levels among its variable's levels, integers stay integers, "
             "values stay inside their bounds and immutable variables do not change; the "
             "audit re-scored these rows with the model and re-priced them with the cost. "
             "Share of moving cost: how much of the cost of moving samples (the DataCost) "
             "falls on each variable.</p>")
    rows = "".join(f"<tr><td>{html.escape(i)}</td><td class=\"num\">{w}</td><td>"
                   f"{html.escape(c).replace('-&gt;', '&rarr;')}</td></tr>"
                   for i, w, c in changes)
    return _qstar_parts(result, frame, shares, intro=intro, word="variable",
                        changes_lead="weighted cost of the move", changes_rows=rows,
                        changes_id=' id="raw-changes"',
                        top2=list(shares[shares > 0].index[:2]), moved=True, other="")


def _qstar_parts(result, frame, shares, *, intro, word, changes_lead, changes_rows,
                 changes_id, top2, moved, other) -> list[str]:
    """The raw Q* section: heading, intro, the share of moving cost per column, the most
    moved samples and the figure on the two columns that carry most of the cost."""
    parts = ['<h2 id="raw-qstar">Most sensitive distribution Q*, in the data\'s own columns'
             '</h2>', intro]
    shown = shares[shares > 0].head(10)
    if len(shown):
        parts.append(_table([(k, float(v)) for k, v in shown.items()],
                            header=[word, "share of moving cost"]))
    if changes_rows:
        parts.append(f'<p class="lead">The most moved samples ({changes_lead}):</p>')
        parts.append(f"<table{changes_id}><tr><th>sample</th><th>weight</th><th>change</th>"
                     f"</tr>{changes_rows}</table>")
    if len(top2) == 2:
        wm = np.asarray(result.weights, dtype=float) * np.asarray(result.mass, dtype=float)
        drawn: list[int] = []
        png = figure_png(lambda ax: _raw_plot(ax, frame, top2[0], top2[1], wm, drawn=drawn),
                         figsize=(7.0, 5.0))
        arrows = _arrow_caption(drawn[0], moved) if drawn else "arrows: moves"
        plural = "raw columns" if word == "raw column" else "variables"
        parts.append(_figure(png, f"Q* on the two {plural} that carry most of the moving "
                                  f"cost: {top2[0]} and {top2[1]}. Crosses: evaluation data; "
                                  f"discs: Q* (area proportional to weight); {arrows}.{other}",
                             "Q* on raw columns"))
    return parts


def _interval_headline(res: dict, inputs: dict, loss: str, r: float, base: float) -> str:
    """The headline of a non-exact answer: the interval, its certified and its found end."""
    lo, up = _num(res.get("value_lower", 0.0)), _num(res.get("value_upper", res["value"]))
    ratio = f" (value_lower / value_upper = {lo / up:.3g})" if up > 0 and math.isfinite(up) \
        else ""
    return (f'R lies in the interval <span class="value" id="interval">[<span '
            f'id="value_lower">{_fmt(lo)}</span>, <span id="value_upper">{_fmt(up)}</span>]'
            f"</span>{ratio}: R is not computed exactly for this model. No perturbation "
            f"cheaper than {_fmt(lo)} reaches r = {_fmt(r)} (certified); one of cost "
            f"{_fmt(up)} does (found: the returned Q*, audited). A gate is decided on the "
            f"certified lower end, {_fmt(lo)}. Base {html.escape(loss)} risk {_fmt(base)}; "
            f'theta1 = {_fmt(_num(inputs["theta1"]))}, theta2 = '
            f'{_fmt(_num(inputs["theta2"]))}, {inputs["divergence"]}.')


def _advice_html(cert: dict, result, interface: str) -> str:
    """How to narrow a non-exact answer's interval, for the model at hand."""
    res, inputs = cert["results"], cert["inputs"]
    kind = bounds_kind(cert["solver"].get("message", ""),
                       str(inputs["model"].get("estimator") or ""))
    lo, up = _num(res.get("value_lower")), _num(res.get("value_upper"))
    ratio = lo / up if up > 0 and math.isfinite(up) and math.isfinite(lo) else None
    text = tighten_advice(kind, interface, ratio=ratio,
                          options=inputs.get("solver_options") or {},
                          complete=_search_complete(result),
                          stopped=_search_stopped(result))
    done = ""
    info = (getattr(result, "info", None) or {}).get("lower_bound") if result is not None \
        else None
    if kind == "tree" and info is not None and info.get("exact") is not None:
        ex = np.asarray(info["exact"], dtype=bool)
        done = (f" The search finished (exact distance) for {int(ex.sum()):,} of {ex.size:,} "
                "samples.")
    return ('<h2 id="advice">Narrowing the interval</h2>'
            f"<p>{html.escape(text[0].upper() + text[1:])}.{done}</p>")


def _time_rows(timings: dict) -> list:
    """Wall time of the whole ``certify`` call (and the final solver's share of it)."""
    wall, solve = timings.get("wall_s"), timings.get("solve_s")
    if wall is None:  # a certificate from before the whole call was timed
        return [("solver time [s] (the final solver only)", _num(solve))]
    return [("wall time of certify [s]", _num(wall)),
            ("of which the final solver [s]", _num(solve))]


def render_html(cert: dict, *, result=None, features=None, grid=None, curve=None, trace=None,
                y=None, title=None, top=15, verify_command=None, policy=None,
                interface="python") -> str:
    """Render a certificate (and optional extras) as one self-contained HTML page.

    Parameters
    ----------
    cert : dict
        A certificate from :func:`otstab.certificate.make_certificate`.
    result : StabilityResult, optional
        The result the certificate was made from: adds the plot of Q* (and the first-order
        trace when it has one).
    features : DataFrame, optional
        Feature-stability table (default: the one in the certificate, if any).
    grid : DataFrame, optional
        :func:`otstab.plot.decomposition_grid` output: adds the Figure 3a-style plot.
    curve : DataFrame, optional
        ``R`` against ``r`` (:func:`otstab.stability_curve`): adds its plot.
    trace : optional
        A first-order trace (see :func:`otstab.plot.convergence_trace`).
    y : array-like, optional
        Labels, to colour Q* by class.
    title : str, optional
    top : int
        Number of features listed and drawn.
    verify_command : str, optional
        The command line that reproduces the certificate (shown verbatim).
    policy : dict, optional
        A :func:`policy_gate` verdict shown as PASS/FAIL (default: the certificate's
        ``extra.policy``, written by ``otstab certify --fail-under``).
    interface : {"python", "cli"}
        Who made the report: the advice names settings as ``otstab.certify(..., name=...)``
        or, in a report made by ``otstab certify``, as that command's flags.

    Returns
    -------
    str
        The HTML document.
    """

    validate_certificate(cert)
    inputs, res, solver = cert["inputs"], cert["results"], cert["solver"]
    loss = inputs["loss"]["name"]
    value = _num(res["value"])
    r = _num(inputs["r"])
    title = title or f"Stability certificate: {loss} loss at r = {_fmt(r)}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="small">otstab certificate format {cert["version"]}, created '
        f'{html.escape(cert["created"])}; OT stability criterion of Blanchet, Cui, Li and Liu '
        "(ICML 2024).</p>",
    ]
    # verdict
    base = _num(res["risk_base"])
    status = solver["status"]
    if status == "unreachable" or math.isinf(value):
        verdict = (f"The threshold r = {_fmt(r)} cannot be reached by perturbations of the "
                   f"allowed kind: R = inf. {html.escape(solver.get('message', ''))}")
        cls = "verdict warn"
    elif status == "bounds":
        verdict = _interval_headline(res, inputs, loss, r, base)
        cls = "verdict warn"
    elif value == 0:
        verdict = (f"The risk on the evaluation data ({_fmt(base)}) already reaches "
                   f"r = {_fmt(r)}: R = 0.")
        cls = "verdict warn"
    else:
        verdict = (f"Raising the {html.escape(loss)} risk from {_fmt(base)} to r = {_fmt(r)} "
                   f"needs a perturbation of OT cost at least <span class=\"value\" "
                   f'id="value">{_fmt(value)}</span> (theta1 = {_fmt(_num(inputs["theta1"]))},'
                   f' theta2 = {_fmt(_num(inputs["theta2"]))}, {inputs["divergence"]}). '
                   "Larger means more stable.")
        cls = "verdict"
    if 'id="value"' not in verdict and status != "bounds":
        verdict += f' <span class="value" id="value">R = {_fmt(value)}</span>'
    parts.append(f'<p class="{cls}">{verdict}</p>')
    parts.append(_policy_html(policy or (cert.get("extra") or {}).get("policy"), res))
    unc = res.get("uncertainty")
    if unc:
        said = _uncertainty_text(unc, exact=status != "bounds", upper=res.get("value_upper"),
                                 interface=interface)
        parts.append(f'<p id="uncertainty">{said}</p>')
    elif status == "bounds":
        parts.append('<p id="uncertainty">Confidence bound of the certified side (value_lower): '
                     "<strong>not available</strong>: no sampling uncertainty was computed "
                     "for this certificate.</p>")
    if status == "bounds":
        parts.append(_advice_html(cert, result, interface))

    # certificate table
    parts.append("<h2>Certificate</h2>")
    rows = [
        ("R(beta, r) (dual value)", _num(res["value"])) if status != "bounds" else
        ("value_upper: cost of the found Q* (R <= this)", _num(res["value_upper"])),
        ("cost of Q* (primal)", _num(res["primal_cost"])),
        ("interval for R [certified lower, found upper]" if status == "bounds" else
         "certified interval for R", f"[{_fmt(_num(res.get('value_lower', res['value'])))}, "
                                     f"{_fmt(_num(res.get('value_upper', res['value'])))}]"),
        ("relative gap", _num(res["gap"])),
        ("threshold r", r),
        ("base risk E_P0[l]", base),
        ("risk under Q*", _num(res["risk_star"])),
        ("mass of Q*", _num(res["total_mass"])),
        ("dual multiplier h", _num(res["h"])),
        ("loss", loss),
        ("theta1 (price of moving)", _num(inputs["theta1"])),
        ("theta2 (price of reweighting)", _num(inputs["theta2"])),
        ("divergence", inputs["divergence"]),
        ("solver / status", f"{solver['name']} / {status}"),
        *_time_rows(cert.get("timings") or {}),
    ]
    if res.get("alpha") is not None:
        rows.insert(8, ("dual multiplier alpha", _num(res["alpha"])))
    if status == "bounds":
        rows.insert(0, ("value_lower: certified (no cheaper change reaches r)",
                        _num(res["value_lower"])))
    if unc and status == "bounds":
        lv = f"{100 * float(unc['level']):g}%"
        rows[2:2] = [
            (f"{lv} lower confidence bound of value_lower", "not available (the SE below is "
                                                            "that of value_upper)"),
            ("standard error of value_upper (sampling)", _num(unc["se"])),
        ]
    elif unc:
        lv = f"{100 * float(unc['level']):g}%"
        rows[1:1] = [
            ("standard error of R (sampling)", _num(unc["se"])),
            (f"{lv} interval for R", f"[{_fmt(_num(unc['ci_low']))}, "
                                     f"{_fmt(_num(unc['ci_high']))}]"),
            (f"{lv} lower bound for R", _num(unc["lower_bound"])),
            ("uncertainty method", unc["method"] + (
                f" ({unc.get('n_boot', 0)} replicates, {unc.get('interval')})"
                if unc["method"] == "bootstrap" else "")),
        ]
    parts.append(_table(rows))
    if solver.get("message"):
        parts.append(f'<p class="small">Note: {html.escape(solver["message"])}</p>')

    parts.append(_explanation(cert))

    # decomposition
    dec = res.get("decomposition") or {}
    parts.append("<h2>Excess-risk decomposition</h2>")
    parts.append(
        "<p>The risk under Q* splits into the base risk, the part due to moving samples "
        "(I, data corruption) and the part due to reweighting them (II, sub-population "
        "shift), as in the paper's eq. (4).</p>")
    parts.append(_table([
        ("base risk", _num(dec.get("base"))),
        ("I: corruption (moving samples)", _num(dec.get("corruption"))),
        ("II: reweighting", _num(dec.get("reweighting"))),
        ("cost of moving", _num(dec.get("cost_moving"))),
        ("cost of reweighting", _num(dec.get("cost_reweighting"))),
    ]))
    if grid is not None:
        png = figure_png(lambda ax: _plot.decomposition(grid, ax=ax), figsize=(7.0, 4.2))
        parts.append(_figure(png, "Excess risk under Q* split into corruption (I) and "
                             "reweighting (II) as the budget 1/theta1 + 1/theta2 is shared "
                             "between moving (right) and reweighting (left).",
                             "decomposition over the theta split"))
        g = pd.DataFrame(grid)
        parts.append(_table(
            [(float(s), float(t1), float(t2), _num(v), float(c), float(w)) for s, t1, t2, v, c, w
             in zip(g["split"], g["theta1"], g["theta2"], g["value"], g["corruption"],
                    g["reweighting"])],
            header=["split", "theta1", "theta2", "R", "corruption", "reweighting"]))

    # features
    fs = features
    if fs is None and res.get("feature_stability"):
        fs = pd.DataFrame(res["feature_stability"]["table"])
    if fs is not None:
        fs = pd.DataFrame(fs.to_frame() if hasattr(fs, "to_frame") else fs).copy()
        fs["score"] = pd.to_numeric(fs["score"], errors="coerce")
        fs = fs.sort_values("score", kind="stable")
        parts.append("<h2>Most sensitive features</h2>")
        parts.append(
            "<p>Stability score R<sub>j</sub>: the criterion when only feature j (or one "
            "categorical variable's one-hot block) may move, with reweighting allowed. Lower "
            "means more sensitive.</p>")
        cols = [c for c in ("rank", "feature", "score", "h", "share_moving",
                            "share_reweighting") if c in fs.columns]
        if {"share_moving", "share_reweighting"} <= set(cols):
            parts.append(
                "<p class=\"small\">share_moving / share_reweighting: fractions of the excess "
                "risk under that feature's Q* due to moving the feature and to reweighting."
                "</p>")
        parts.append(_table([tuple(rec[c] for c in cols) for rec in
                             fs.head(top).to_dict(orient="records")], header=cols))
        png = figure_png(lambda ax: _plot.feature_stability(fs, ax=ax, top=top),
                         figsize=(7.0, max(2.5, 0.32 * min(top, len(fs)) + 1.3)))
        parts.append(_figure(png, "Feature stability (paper, Figure 4 style): the "
                             f"{min(top, len(fs))} most sensitive features.",
                             "feature stability bars"))

    # Q*
    if result is not None:
        raw = _raw_section(result)
        if raw:  # Q* on the raw columns that moved most, in the data's units
            parts += raw
        else:
            drawn: list[int] = []

            def draw_qstar(ax):
                _plot.sensitive_distribution(result, ax=ax, y=y)
                drawn.append(_count_arrows(ax))

            png = figure_png(draw_qstar, figsize=(7.0, 5.0))
            if not drawn:
                arrows = ""
            elif drawn[0]:
                arrows = (f"; arrows: moves x &rarr; x* (the {drawn[0]:,} largest weighted "
                          "moves)" if drawn[0] >= 300 else "; arrows: moves x &rarr; x*")
            else:
                arrows = "; no sample moves (reweighting only), so no arrows are drawn"
            parts.append("<h2>Most sensitive distribution Q*</h2>")
            parts.append(
                f"<p>{result.n_atoms} atoms over {result.n} samples. Crosses: evaluation data; "
                f"discs: Q*, area proportional to weight{arrows}. For more than two features "
                "the two most moved coordinates are shown.</p>")
            parts.append(_figure(png, "Most sensitive distribution Q*.", "most sensitive "
                                 "distribution"))
        tr = trace if trace is not None else (result.info or {}).get("trace")
        if tr is not None:
            trace = tr
    if curve is not None:
        parts.append("<h2>Stability against the threshold</h2>")
        png = figure_png(lambda ax: _plot.stability_curve(curve, ax=ax, highlight=r))
        parts.append(_figure(png, "R(beta, r) as the risk threshold r grows.", "value vs r"))
    if trace is not None:
        parts.append("<h2>First-order solver trace</h2>")
        png = figure_png(lambda ax: _plot.convergence_trace(trace, ax=ax, r=r))
        parts.append(_figure(png, "Risk under Q(t) and the dual value over the outer "
                             "iterations.", "convergence trace"))

    # inputs
    data, model = inputs["data"], inputs["model"]
    parts.append("<h2>Inputs</h2>")
    drows = [
        ("evaluation data", f"{data['n_samples']} samples x {data['n_features']} features"),
        ("target", data.get("target") or "-"),
        ("label counts", ", ".join(f"{k}: {v}" for k, v in
                                   (data.get("label_counts") or {}).items()) or "-"),
        (f"data SHA-256 ({data['hash_method']})", data["sha256"]),
        ("model", public_name(model["class"])),
        ("final estimator", public_name(model["estimator"])),
        (f"model SHA-256 ({model['hash_method']})", model["sha256"]),
    ]
    if model.get("pipeline"):
        drows.insert(5, ("pipeline", " -> ".join(s["name"] for s in model["pipeline"])))
    if model.get("file"):
        drows.append(("model file / SHA-256", f"{model['file']} / {model['file_sha256']}"))
    if inputs.get("movable_features"):
        drows.append(("movable features", ", ".join(map(str, inputs["movable_features"]))))
    if inputs.get("cost"):
        drows.append((f"transport cost ({inputs['cost']['hash_method']})",
                       f"DataCost on the data's own variables, spec SHA-256 "
                       f"{inputs['cost']['sha256']}"))
    parts.append(_table(drows))
    env = cert.get("environment") or {}
    parts.append('<p class="small">Versions: ' + html.escape(
        ", ".join(f"{k} {v}" for k, v in env.items())) + "</p>")
    if verify_command:
        parts.append("<h2>Reproduce</h2>")
        parts.append(f'<pre class="command" id="command">{html.escape(verify_command)}</pre>')
    blob = json.dumps(cert, indent=2)
    parts.append(
        "<h2>Certificate JSON</h2>"
        '<p class="print-only small">The certificate JSON ('
        f"{blob.count(chr(10)) + 1:,} lines) is not printed: it is in this report's HTML file "
        "(open it in a browser) and in the certificate file that <code>otstab verify</code> "
        "reads.</p>"
        '<div class="json"><details open><summary>hide / show</summary><pre>'
        + html.escape(blob) + "</pre></details></div>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write_report(path, cert: dict, *, result=None, model=None, X=None, y=None, features=None,
                 grid=None, curve=None, theta_grid=False, r_grid=None, **kwargs) -> Path:
    """Write :func:`render_html` to ``path``, optionally computing the extra figures.

    Parameters
    ----------
    path : path-like
    cert : dict
    result, features, grid, curve : see :func:`render_html`.
    model, X, y : optional
        Needed only to compute ``grid`` (``theta_grid=True``) or ``curve`` (``r_grid``).
    theta_grid : bool
        Compute :func:`otstab.plot.decomposition_grid` (11 certifications with
        the certificate's budget ``1/theta1 + 1/theta2`` kept fixed).
    r_grid : sequence of float, optional
        Thresholds for the ``R``-against-``r`` curve.
    **kwargs
        Passed to :func:`render_html` (``title``, ``top``, ``verify_command``, ...).

    Returns
    -------
    pathlib.Path
    """

    inputs = cert["inputs"]
    if (theta_grid or r_grid is not None) and (model is None or X is None or y is None):
        raise ValidationError("theta_grid and r_grid need model, X and y")
    loss = loss_from_spec(inputs["loss"])
    t1, t2 = _num(inputs["theta1"]), _num(inputs["theta2"])
    if theta_grid and grid is None:
        total = (0.0 if math.isinf(t1) else 1 / t1) + (0.0 if math.isinf(t2) else 1 / t2)
        grid = _plot.decomposition_grid(model, X, y, loss=loss, r=_num(inputs["r"]),
                                        total=total, divergence=inputs["divergence"])
    if r_grid is not None and curve is None:
        curve = _plot.value_curve(model, X, y, loss=loss, r=r_grid, theta1=t1, theta2=t2,
                                  divergence=inputs["divergence"])
    text = render_html(cert, result=result, features=features, grid=grid, curve=curve,
                       y=y, **kwargs)
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# PDF (headless Chromium) and the model card

#: executables tried by :func:`find_chromium` (after ``$OTSTAB_CHROMIUM``)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
                  "chrome")
#: flags of every headless Chromium run: no sandbox (containers), no GPU, no network chatter
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--hide-scrollbars")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable (``$OTSTAB_CHROMIUM`` first), or None."""
    import os
    import shutil

    env = os.environ.get("OTSTAB_CHROMIUM")
    if env:
        return shutil.which(env) or (env if Path(env).is_file() else None)
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def run_chromium(args, *, timeout=120.0) -> None:
    """Run headless Chromium with :data:`CHROMIUM_FLAGS`, a fresh profile and ``args``."""
    import subprocess
    import tempfile

    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no Chromium found (install chromium, or set OTSTAB_CHROMIUM to "
                           "the executable)")
    with tempfile.TemporaryDirectory(prefix="otstab-chromium-") as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *map(str, args)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"Chromium did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.split()[-40:])
        raise RuntimeError(f"Chromium failed (exit {proc.returncode}): {tail}")


def write_pdf(html_path, pdf_path, *, timeout=120.0) -> Path:
    """Print an HTML report to PDF with headless Chromium (the report's print stylesheet:
    A4, nothing cut, the certificate JSON expanded).

    Chromium rather than a Python PDF library: it is the engine that renders the report on
    screen, so the PDF is what the reader sees, and it adds no Python dependency (WeasyPrint
    needs Pango/Cairo and lays pages out differently). Raises RuntimeError when no Chromium
    is installed or printing fails.
    """
    html_path, pdf_path = Path(html_path).resolve(), Path(pdf_path)
    if not html_path.is_file():
        raise ValidationError(f"html_path {str(html_path)!r} does not exist")
    pdf_path.unlink(missing_ok=True)
    run_chromium(["--no-pdf-header-footer", f"--print-to-pdf={pdf_path.resolve()}",
                  html_path.as_uri()], timeout=timeout)
    if not pdf_path.is_file() or pdf_path.stat().st_size == 0:
        raise RuntimeError(f"Chromium wrote no PDF to {str(pdf_path)!r}")
    return pdf_path


def model_card(cert: dict, *, verify_command=None) -> dict:
    """A model-card style summary of a certificate, to paste into governance tooling.

    Plain JSON: what was certified (model, data fingerprints), the answer (R, status, base
    risk, threshold, prices), the sampling uncertainty, the policy verdict when the
    certificate has one, the most sensitive features, and how to reproduce it.
    """

    validate_certificate(cert)
    inputs, res, solver = cert["inputs"], cert["results"], cert["solver"]
    data, model = inputs["data"], inputs["model"]
    unc = res.get("uncertainty") or {}
    fs = (res.get("feature_stability") or {}).get("table") or []
    card = {
        "schema": "otstab-model-card/1",
        "title": f"OT stability of {public_name(model.get('estimator') or model.get('class'))}",
        "created": cert["created"],
        "model": {"class": public_name(model["class"]),
                  "estimator": public_name(model.get("estimator")),
                  "sha256": model["sha256"], "file": model.get("file"),
                  "pipeline": [s["name"] for s in model.get("pipeline") or []] or None},
        "data": {"rows": data["n_samples"], "columns": data["n_features"],
                 "target": data.get("target"), "sha256": data["sha256"]},
        "criterion": {"loss": inputs["loss"]["name"], "r": inputs["r"],
                      "theta1": inputs["theta1"], "theta2": inputs["theta2"],
                      "divergence": inputs["divergence"],
                      "movable_features": inputs.get("movable_features"),
                      "cost": (f"DataCost on the data's own variables ("
                               f"{inputs['cost']['hash_method']} "
                               f"{inputs['cost']['sha256'][:12]})") if inputs.get("cost")
                      else "encoded (squared distance in the model's input space)"},
        "result": {"R": res["value"], "status": solver["status"], "exact": res.get("exact"),
                   "base_risk": res["risk_base"], "risk_under_qstar": res["risk_star"],
                   "gap": res["gap"], "solver": solver["name"]},
        "uncertainty": None if not unc else {
            "level": unc.get("level"), "se": unc.get("se"), "lower_bound": unc.get(
                "lower_bound"), "interval": [unc.get("ci_low"), unc.get("ci_high")],
            "method": unc.get("method")},
        "policy": (cert.get("extra") or {}).get("policy"),
        "most_sensitive_features": [{"feature": r["feature"], "score": r["score"]}
                                    for r in fs[:5]],
        "interpretation": (
            "R is the smallest optimal-transport cost (theta1 x squared distance in the "
            "model's preprocessed feature space, plus theta2 x divergence of the reweighting) "
            "of a change of the evaluation data that raises the risk to r; larger is more "
            "stable."),
        "reproduce": verify_command,
        "reference": "Blanchet, Cui, Li, Liu: Stability evaluation through distributional "
                     "perturbation analysis, ICML 2024",
    }
    return json.loads(json.dumps(card, allow_nan=False, default=str))


def model_card_markdown(card: dict) -> str:
    """:func:`model_card` as Markdown (a table per block)."""
    def cell(v):
        return "-" if v is None else str(v).replace("|", "\\|")

    lines = [f"# {card['title']}", "", f"Created {card['created']} with otstab. "
             + card["interpretation"], ""]
    for block in ("model", "data", "criterion", "result", "uncertainty", "policy"):
        val = card.get(block)
        if not val:
            continue
        lines += [f"## {block.capitalize()}", "", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {cell(v)} |" for k, v in val.items()]
        lines.append("")
    if card.get("most_sensitive_features"):
        lines += ["## Most sensitive features", "", "| feature | score |", "|---|---|"]
        lines += [f"| {cell(r['feature'])} | {cell(r['score'])} |"
                  for r in card["most_sensitive_features"]]
        lines.append("")
    if card.get("reproduce"):
        lines += ["## Reproduce", "", "```", card["reproduce"], "```", ""]
    lines.append(f"Reference: {card['reference']}.")
    return "\n".join(lines) + "\n"
