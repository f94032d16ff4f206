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
import html
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import ValidationError

__all__ = ["render_html", "write_report", "figure_png"]

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


def _uncertainty_text(unc: dict) -> str:
    """The sampling uncertainty of R in plain words."""
    lv = f"{100 * float(unc['level']):g}%"
    how = ("a bootstrap over the evaluation rows" if unc["method"] == "bootstrap"
           else "the influence function (normal approximation)")
    text = (f"R was computed on a sample of evaluation data; another sample of the same size "
            f"from the same population would give a somewhat different value. By {how}, R "
            f"would typically move by about {_fmt(_num(unc['se']), 3)} (one standard error); "
            f"with {lv} confidence R in the population lies between "
            f"{_fmt(_num(unc['ci_low']))} and {_fmt(_num(unc['ci_high']))}, and is at least "
            f"{_fmt(_num(unc['lower_bound']))} (the value to compare with a pass/fail "
            "threshold).")
    if unc.get("note"):
        text += f" Caution: {html.escape(unc['note'])}."
    return text


def render_html(cert: dict, *, result=None, features=None, grid=None, curve=None, trace=None,
                y=None, title=None, top=15, verify_command=None) -> str:
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

    Returns
    -------
    str
        The HTML document.
    """
    from . import plot as _plot
    from .certificate import validate_certificate

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
        lo, up = _num(res.get("value_lower", 0.0)), _num(res.get("value_upper", value))
        verdict = (f"R is not computed exactly for this model; it is bracketed: no perturbation "
                   f"cheaper than <span class=\"value\" id=\"value_lower\">{_fmt(lo)}</span> "
                   f"reaches r = {_fmt(r)} (certified); one of cost <span class=\"value\" "
                   f'id="value">{_fmt(up)}</span> does (found: the returned Q*, audited). '
                   f"Base {html.escape(loss)} risk {_fmt(base)}; theta1 = "
                   f'{_fmt(_num(inputs["theta1"]))}, theta2 = {_fmt(_num(inputs["theta2"]))}, '
                   f'{inputs["divergence"]}.')
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
    if 'id="value"' not in verdict:
        verdict += f' <span class="value" id="value">R = {_fmt(value)}</span>'
    parts.append(f'<p class="{cls}">{verdict}</p>')
    unc = res.get("uncertainty")
    if unc:
        parts.append(f'<p id="uncertainty">{_uncertainty_text(unc)}</p>')

    # certificate table
    parts.append("<h2>Certificate</h2>")
    rows = [
        ("R(beta, r) (dual value)", _num(res["value"])),
        ("cost of Q* (primal)", _num(res["primal_cost"])),
        ("certified interval for R", f"[{_fmt(_num(res.get('value_lower', res['value'])))}, "
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
        ("solve time [s]", _num((cert.get("timings") or {}).get("solve_s"))),
    ]
    if res.get("alpha") is not None:
        rows.insert(8, ("dual multiplier alpha", _num(res["alpha"])))
    if unc:
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
        fs = pd.DataFrame(fs).copy()
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
        parts.append("<h2>Most sensitive distribution Q*</h2>")
        parts.append(
            f"<p>{result.n_atoms} atoms over {result.n} samples. Crosses: evaluation data; "
            "discs: Q*, area proportional to weight; arrows: moves x &rarr; x* (the largest "
            "ones). For more than two features the two most moved coordinates are shown.</p>")
        png = figure_png(lambda ax: _plot.sensitive_distribution(result, ax=ax, y=y),
                         figsize=(7.0, 5.0))
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
        ("model", model["class"]),
        ("final estimator", model["estimator"]),
        (f"model SHA-256 ({model['hash_method']})", model["sha256"]),
    ]
    if model.get("pipeline"):
        drows.insert(5, ("pipeline", " -> ".join(s["name"] for s in model["pipeline"])))
    if model.get("file"):
        drows.append(("model file / SHA-256", f"{model['file']} / {model['file_sha256']}"))
    if inputs.get("movable_features"):
        drows.append(("movable features", ", ".join(map(str, inputs["movable_features"]))))
    parts.append(_table(drows))
    env = cert.get("environment") or {}
    parts.append('<p class="small">Versions: ' + html.escape(
        ", ".join(f"{k} {v}" for k, v in env.items())) + "</p>")
    if verify_command:
        parts.append("<h2>Reproduce</h2>")
        parts.append(f"<pre>{html.escape(verify_command)}</pre>")
    parts.append("<h2>Certificate JSON</h2><details><summary>show</summary><pre>"
                 + html.escape(json.dumps(cert, indent=2)) + "</pre></details>")
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
    from . import plot as _plot
    from .certificate import _loss_from_spec

    inputs = cert["inputs"]
    if (theta_grid or r_grid is not None) and (model is None or X is None or y is None):
        raise ValidationError("theta_grid and r_grid need model, X and y")
    loss = _loss_from_spec(inputs["loss"])
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
