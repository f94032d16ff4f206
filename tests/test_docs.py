"""Every ```python block of README.md and docs/*.md runs.

The blocks of one file run in order in one fresh namespace (a later block may use what an
earlier one defined), in a temporary working directory. A block that cannot run here says so
with an HTML comment on the line before its fence, naming the reason:

    <!-- no-run: needs a MOSEK licence -->
    ```python

Files whose blocks take minutes are in ``SLOW`` (marked ``slow``); the default part takes
seconds. ``EXCLUDED`` names the files whose blocks are not examples (docs/api.md lists the
signatures).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# file -> why it is slow (measured on the 2-core development machine)
SLOW = {
    "worst_case.md": "cross-fitted regressions on German credit (minutes)",
    "shift.md": "certifies Adult and prices four drift windows (about 20 s)",
}

# file -> why its blocks are not run here
EXCLUDED = {
    "api.md": "a generated listing of the signatures, checked against the code elsewhere",
}

FENCE = re.compile(r"^```python[ \t]*$")
NO_RUN = re.compile(r"^<!--\s*no-run:\s*(?P<reason>\S.*?)\s*-->\s*$")


def blocks(path: Path) -> list[tuple[int, str | None, str]]:
    """(line number, no-run reason or None, source) of each ```python block of a file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                raise AssertionError(f"{path.name}:{start}: unclosed ```python block")
            prev = lines[i - 1] if i > 0 else ""
            m = NO_RUN.match(prev.strip())
            out.append((start, m.group("reason") if m else None, "\n".join(lines[start:j])))
            i = j + 1
        else:
            i += 1
    return out


def _param(path: Path):
    marks = [pytest.mark.slow] if path.name in SLOW else []
    return pytest.param(path, id=path.relative_to(ROOT).as_posix(), marks=marks)


DOC_FILES = [f for f in FILES if f.name not in EXCLUDED and blocks(f)]


@pytest.mark.parametrize("path", [_param(f) for f in DOC_FILES])
def test_code_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": f"docs_{path.stem}"}
    ran = 0
    for line, reason, source in blocks(path):
        if reason is not None:
            # a skipped block must still be valid Python
            compile(source, f"{path.name}:{line}", "exec")
            continue
        code = compile(source, f"{path.name}:{line}", "exec")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                exec(code, namespace)
            except Exception as exc:  # name the block that failed
                raise AssertionError(
                    f"{path.relative_to(ROOT)}: the block at line {line} raised "
                    f"{type(exc).__name__}: {exc}") from exc
        ran += 1
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")
    assert ran or all(r for _, r, _ in blocks(path))


def test_markers_are_used_sparingly():
    """A no-run marker names its reason, and most blocks run."""
    total = skipped = 0
    for f in DOC_FILES:
        for line, reason, _ in blocks(f):
            total += 1
            if reason is not None:
                skipped += 1
                assert len(reason) >= 8, f"{f.name}:{line}: say why the block does not run"
    assert total >= 20
    assert skipped <= total // 4, (skipped, total)
    # a marker applies to the block right below it: one anywhere else is a mistake
    for f in FILES:
        lines = f.read_text(encoding="utf-8").splitlines()
        for k, line in enumerate(lines):
            if "no-run" in line:
                assert NO_RUN.match(line.strip()) and k + 1 < len(lines) and \
                    FENCE.match(lines[k + 1]), f"{f.name}:{k + 1}: misplaced no-run marker"


def test_marker_parser(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n<!-- no-run: needs a GPU -->\n```python\nimport x\n```\n\n"
                   "```python\ny = 1\n```\n```bash\nls\n```\n", encoding="utf-8")
    got = blocks(doc)
    assert got == [(3, "needs a GPU", "import x"), (7, None, "y = 1")]


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("MPLBACKEND", "Agg")
    raise SystemExit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------------ docs/examples/dro_adult.py

def _load_example(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  ROOT / "docs" / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _figures_state():
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size)
            for p in (ROOT / "docs" / "figures").glob("*")}


@pytest.mark.parametrize("argv, where", [(["--quick"], "temporary"), (["--quick", "--out"], "out"),
                                         ([], "docs")])
def test_dro_example_writes_figures_where_asked(argv, where, tmp_path, monkeypatch):
    """--quick never writes into docs/figures (the tracked figures of the full run)."""
    mod = _load_example("dro_adult")
    written = []
    monkeypatch.setattr(mod, "fit_models", lambda *a, **k: {})
    monkeypatch.setattr(mod, "section42", lambda *a, **k: None)
    monkeypatch.setattr(mod, "dro_example", lambda *a, **k: None)
    monkeypatch.setattr(mod, "figure3", lambda *a: written.append(a[-1]))
    if argv[-1:] == ["--out"]:
        argv = [*argv, str(tmp_path / "figs")]
    out = mod.main(argv)
    assert [p.name for p in written] == ["adult_compare_fig3.png", "german_compare_fig3.png"]
    assert all(p.parent == out for p in written)
    docs_figures = (ROOT / "docs" / "figures").resolve()
    if where == "docs":
        assert out.resolve() == docs_figures
    else:
        assert out.resolve() != docs_figures and out.is_dir()
        if where == "out":
            assert out == tmp_path / "figs"


@pytest.mark.slow
def test_dro_example_quick_run_leaves_docs_figures_alone(tmp_path):
    """The whole --quick run (about 3 minutes) writes its figures to --out only."""
    import subprocess

    before = _figures_state()
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "dro_adult.py"),
                           "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["adult_compare_fig3.png",
                                                               "german_compare_fig3.png"]
    assert _figures_state() == before
