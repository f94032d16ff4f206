"""The trend report of a history of windows (issue 32): per window of one model version, R
with its certified and sampling intervals, S with its certified interval, the share used and a
projection of when S would reach R at the current rate; one self-contained HTML page (inline
CSS and figure, no JavaScript), as the certificate report (:mod:`otstab.reporting._report`).

:func:`gate_share` is the gate of ``otstab monitor --max-budget-used B`` (the exit codes of
``certify --fail-under``): ``pass`` when the share used is proven at most B (``S_upper <= B
R_lower``), ``below`` when proven above B (``S_lower > B R_upper``), ``not_certified`` when the
intervals leave it undecided.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .._results import jsonable
from ._report import _CSS, figure_png

__all__ = ["projection", "trend_html", "write_trend", "gate_share", "RECENT"]

#: the rate of change is fitted on this many most recent windows
RECENT = 4


# ------------------------------------------------------------------------------------------
# the numbers of the report


def gate_share(S_lower, S_upper, R_lower, R_upper, max_share) -> dict:
    """The gate on the share used: ``outcome`` pass / below / not_certified and the reason."""
    if max_share is None:
        return {"outcome": "pass", "reason": "no gate"}
    if math.isinf(R_lower) and math.isfinite(S_upper):
        return {"outcome": "pass", "reason": "R = inf: no allowed shift reaches r"}
    if S_upper <= max_share * R_lower:
        return {"outcome": "pass",
                "reason": f"share used <= {_pct(S_upper / R_lower) if R_lower > 0 else 'n/a'}"
                          f" <= {max_share:g} (S <= {S_upper:.6g}, R >= {R_lower:.6g})"}
    if S_lower > max_share * R_upper:
        share = S_lower / R_upper if R_upper > 0 else math.inf
        return {"outcome": "below",
                "reason": f"share used >= {_pct(share)} > {max_share:g} (S >= {S_lower:.6g}, "
                          f"R <= {R_upper:.6g})"}
    return {"outcome": "not_certified",
            "reason": f"the intervals of S [{S_lower:.6g}, {S_upper:.6g}] and R "
                      f"[{R_lower:.6g}, {R_upper:.6g}] leave the share on both sides of "
                      f"{max_share:g}"}


def projection(frame: pd.DataFrame, recent: int = RECENT) -> dict:
    """When S would reach R at the current rate.

    The rate is the least-squares slope of S (the certified upper end ``S_upper``) over the
    last ``recent`` windows (window index as time); R is the latest window's certified lower
    end. Returns ``{"rate", "windows_left", "text"}`` (``windows_left``: nan when S does not
    grow, 0 when it has already reached R)."""
    if len(frame) == 0:
        return {"rate": math.nan, "windows_left": math.nan, "text": "no windows yet"}
    last = frame.iloc[-1]
    R, S = float(last["R_lower"]), float(last["S_upper"])
    if not math.isfinite(S):
        return {"rate": math.nan, "windows_left": math.nan,
                "text": "the latest shift cannot be priced (S = inf)"}
    if math.isfinite(R) and S >= R:
        return {"rate": math.nan, "windows_left": 0.0,
                "text": "S has reached R: the tolerance is used up"}
    if len(frame) < 2:
        return {"rate": math.nan, "windows_left": math.nan,
                "text": "one window: no rate yet (the projection needs two)"}
    tail = frame.iloc[-recent:]
    s = tail["S_upper"].to_numpy(dtype=float)
    t = np.arange(len(frame))[-recent:].astype(float)
    ok = np.isfinite(s)
    if ok.sum() < 2:
        return {"rate": math.nan, "windows_left": math.nan, "text": "no rate (S = inf)"}
    rate = float(np.polyfit(t[ok], s[ok], 1)[0])
    if not math.isfinite(R):
        return {"rate": rate, "windows_left": math.nan,
                "text": "R = inf: no shift reaches r"}
    if rate <= 0:
        return {"rate": rate, "windows_left": math.nan,
                "text": f"S is not growing (rate {rate:.3g} per window over the last "
                        f"{int(ok.sum())} windows): no crossing projected"}
    left = (R - S) / rate
    return {"rate": rate, "windows_left": left,
            "text": f"at the current rate (+{rate:.3g} per window over the last "
                    f"{int(ok.sum())} windows) S would reach R = {R:.6g} in about "
                    f"{left:.1f} windows"}


def _pct(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.1%}"


def _fmt(x, digits=6) -> str:
    if x is None:
        return "&ndash;"
    if isinstance(x, str):
        return html.escape(x)
    v = float(x)
    if math.isnan(v):
        return "&ndash;"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}g}"


def _draw(frame: pd.DataFrame, proj: dict, max_share):
    def draw(ax):
        t = np.arange(len(frame))
        R = frame["R"].to_numpy(float)
        Rl, Ru = frame["R_lower"].to_numpy(float), frame["R_upper"].to_numpy(float)
        cl, ch = frame["R_ci_low"].to_numpy(float), frame["R_ci_high"].to_numpy(float)
        S = frame["S"].to_numpy(float)
        Sl, Su = frame["S_lower"].to_numpy(float), frame["S_upper"].to_numpy(float)
        fin = np.isfinite(R)
        if fin.any():
            ax.plot(t[fin], R[fin], "-o", color="#1b9e77", label="R (tolerance)")
            ax.fill_between(t, np.where(np.isfinite(Rl), Rl, np.nan),
                            np.where(np.isfinite(Ru), Ru, np.nan), color="#1b9e77",
                            alpha=0.25, label="R certified interval")
            if np.isfinite(cl).any():
                ax.fill_between(t, cl, ch, color="#1b9e77", alpha=0.1,
                                label="R sampling interval")
            if max_share is not None:
                ax.plot(t[fin], max_share * Rl[fin], ":", color="#d95f02",
                        label=f"gate: {max_share:g} x R")
        sf = np.isfinite(S)
        ax.errorbar(t[sf], S[sf], yerr=[S[sf] - Sl[sf], Su[sf] - S[sf]], fmt="s-",
                    color="#7570b3", capsize=3, label="S (observed shift)")
        left = proj.get("windows_left", math.nan)
        if math.isfinite(proj.get("rate", math.nan)) and math.isfinite(left) and left > 0 \
                and sf.any():
            horizon = min(left, 4 * max(len(frame), 1))
            x0 = t[-1]
            ax.plot([x0, x0 + horizon], [Su[-1], Su[-1] + proj["rate"] * horizon], "--",
                    color="#7570b3", alpha=0.7, label="S projected")
        ax.set_xticks(t)
        ax.set_xticklabels([str(w) for w in frame["window"]], rotation=30, ha="right",
                           fontsize=8)
        ax.set_xlabel("data window")
        ax.set_ylabel("OT cost (certificate units)")
        ax.legend(fontsize=7, loc="upper left")
        ax.set_ylim(bottom=0)
    return draw


def trend_html(frame: pd.DataFrame, *, title: str | None = None, max_share=None,
               gate: dict | None = None) -> str:
    """The trend report of one model version's windows (``History.windows(version)``): one
    self-contained HTML page (inline CSS and figure, no JavaScript)."""
    version = str(frame["model_version"].iloc[-1]) if len(frame) else ""
    title = title or f"Tolerance used: model {version}"
    proj = projection(frame)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title>", f"<style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    if len(frame) == 0:
        out.append("<p>No windows recorded.</p></body></html>")
        return "\n".join(out)
    last = frame.iloc[-1]
    ok = last["outcome"] == "certified_below_r"
    out.append(f'<div class="verdict{"" if ok else " warn"}" id="latest">Latest window '
               f'<strong>{html.escape(str(last["window"]))}</strong>: share of the tolerance '
               f'used <span class="value" id="share">{_pct(last["share"])}</span><br>'
               f'{html.escape(str(last["conclusion"]))}</div>')
    if gate is not None:
        cls = "pass" if gate["outcome"] == "pass" else "fail"
        out.append(f'<p class="policy" id="gate">Gate --max-budget-used {max_share:g}: '
                   f'<span class="{cls}">{gate["outcome"].upper().replace("_", " ")}</span> '
                   f'{html.escape(gate["reason"])}</p>')
    out.append(f'<p id="projection">{html.escape(proj["text"])}.</p>')
    png = figure_png(_draw(frame, proj, max_share), figsize=(7.2, 4.2))
    if png is not None:
        out.append(f'<figure><img alt="R and S per window" src="data:image/png;base64,{png}">'
                   "<figcaption>R (green: value, certified interval, sampling interval) and "
                   "S (purple: value and certified interval) per window; dashed: S "
                   "continued at its recent rate.</figcaption></figure>")
    out.append("<h2>Windows</h2>")
    head = ["window", "recorded", "R", "R certified", "R sampling", "S", "S certified",
            "moving / reweighting", "share used", "outcome"]
    rows = ['<table id="windows"><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for rec in frame.to_dict(orient="records"):
        cells = [html.escape(str(rec["window"])), html.escape(str(rec["created"])),
                 _fmt(rec["R"]), f"[{_fmt(rec['R_lower'])}, {_fmt(rec['R_upper'])}]",
                 f"[{_fmt(rec['R_ci_low'])}, {_fmt(rec['R_ci_high'])}]", _fmt(rec["S"]),
                 f"[{_fmt(rec['S_lower'])}, {_fmt(rec['S_upper'])}]",
                 f"{_fmt(rec['moving'], 4)} / {_fmt(rec['reweighting'], 4)}",
                 _pct(rec["share"]), html.escape(str(rec["outcome"]).replace("_", " "))]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    rows.append("</table>")
    out += rows
    first = frame.iloc[0]
    out.append("<h2>What the numbers mean</h2>")
    out.append(
        "<p>R(beta, r) is the certificate: the least optimal-transport cost of a change of the "
        "reference data (moving rows, priced by theta1, and reweighting them, priced by "
        "theta2) that brings the model's risk to r. S is the least cost, in the same units, "
        "of the change from the reference data to the window's data (labels never move). By "
        "the definition of R, a window whose S is certified below R has risk below r: the "
        "change that produced it is one of those R rules out. The share used is S / R on the "
        "safe side (S's upper end over R's lower end). The sampling interval of R is about "
        "a fresh reference sample; the guarantee is about the data at hand.</p>")
    out.append(f'<p class="small">loss {html.escape(str(first["loss"]))}, r = '
               f'{_fmt(first["r_threshold"])}, theta1 = {_fmt(first["theta1"])}, theta2 = '
               f'{_fmt(first["theta2"])}, divergence {html.escape(str(first["divergence"]))}, '
               f'cost {html.escape(str(first["cost"]))}.</p>')
    data = frame.drop(columns=["certificate", "shift"]).to_dict(orient="records")
    out.append('<details class="json"><summary>the windows as JSON</summary><pre>'
               + html.escape(json.dumps(jsonable(data, strict=True), indent=1)) +
               "</pre></details>")
    out.append("</body></html>")
    return "\n".join(out)


def write_trend(path, frame, **kwargs) -> Path:
    path = Path(path)
    path.write_text(trend_html(frame, **kwargs), encoding="utf-8")
    return path
