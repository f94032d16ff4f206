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
