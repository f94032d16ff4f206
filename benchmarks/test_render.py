"""The report renderer works, and docs/benchmarks.md is exactly what it makes of the committed
results (so the published numbers are regenerated, never typed in)."""

from __future__ import annotations

import os

import pytest
from _benchlib import quick

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")

pytestmark = quick


def _render(src, tmp_path):
    import render

    out = tmp_path / "docs" / "benchmarks.md"
    figs = tmp_path / "docs" / "figures"
    text = render.render(src, str(out), str(figs))
    return text, figs


@pytest.mark.parametrize("name", ("quick.json", "full.json"))
def test_render_runs(tmp_path, name):
    src = os.path.join(RESULTS, name)
    if not os.path.exists(src):
        pytest.skip(f"benchmarks/results/{name} not present")
    text, figs = _render(src, tmp_path)
    assert "## The run" in text and "## Conventions" in text
    assert any(p.startswith("bench_") and p.endswith(".png") for p in os.listdir(figs))


def test_published_doc_is_generated(tmp_path):
    src = os.path.join(RESULTS, "full.json")
    if not (os.path.exists(src) and os.path.exists(DOC)):
        pytest.skip("benchmarks/results/full.json or docs/benchmarks.md not present")
    text, _ = _render(src, tmp_path)
    with open(DOC) as fh:
        published = fh.read()
    assert published == text, (
        "docs/benchmarks.md differs from what benchmarks/render.py makes of "
        "benchmarks/results/full.json: regenerate it with "
        "`python benchmarks/render.py benchmarks/results/full.json`")


def test_grid_table_keeps_the_largest_n(tmp_path):
    """A grid run without ``-m full`` records the quick size as well: the rendered section is
    the same as for the large size alone (its n, its points, one feature_stability line)."""
    import copy
    import json

    import render

    if not os.path.exists(render.GRID_JSON):
        pytest.skip("benchmarks/results/grid_1e6.json not present")
    with open(render.GRID_JSON) as fh:
        data = json.load(fh)
    small = []
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if info.get("suite") == "grid" and "n" in info:
            c = copy.deepcopy(b)
            c["extra_info"]["n"] = 300_000
            c["stats"]["min"] = b["stats"]["min"] * (0.1 if info.get("role") == "baseline"
                                                     else 3.0)
            small.append(c)
    assert small
    mixed = dict(data, benchmarks=[x for pair in zip(small, data["benchmarks"])
                                   for x in pair])
    path = tmp_path / "grid_mixed.json"
    path.write_text(json.dumps(mixed))
    assert render.section_grid(str(path)) == render.section_grid(render.GRID_JSON)
    assert len(render.grid_points(mixed)) == len(render.grid_points(data))
