"""Packaging contracts: the oldest-versions CI job tests what pyproject.toml promises.

.ci/run installs the package a second time with ``.ci/constraints-oldest.txt`` (every
dependency pinned to its lower bound) and runs the default tests; that file must pin exactly the
lower bounds that pyproject.toml states, for every core and test dependency.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lower_bounds(names_block: str) -> dict[str, str]:
    out = {}
    for req in re.findall(r'"([^"]+)"', names_block):
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?>=([0-9][0-9.]*)", req.strip())
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def _block(text: str, start: str) -> str:
    i = text.index(start)
    return text[i:text.index("]", text.index("[", i + len(start) - 1) + 1)]


def test_oldest_constraints_pin_the_stated_lower_bounds():
    text = (ROOT / "pyproject.toml").read_text()
    stated = _lower_bounds(_block(text, "dependencies = ["))
    stated |= _lower_bounds(_block(text, "test = ["))
    pins = {}
    for line in (ROOT / ".ci" / "constraints-oldest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    assert set(stated) <= set(pins), f"not pinned: {sorted(set(stated) - set(pins))}"
    for name, low in stated.items():
        pinned = pins[name].split(".")
        wanted = low.split(".")
        wanted += ["0"] * (len(pinned) - len(wanted))
        assert pinned == wanted, f"{name}: pyproject says >={low}, constraints pin {pins[name]}"


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    cmd = re.search(r"Run the tests:\s*```bash\n(.+?)\n```", readme, re.S).group(1).strip()
    assert cmd in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow  # a cold mypy run over the package takes about 20 s
def test_mypy_is_clean_on_the_package(tmp_path, monkeypatch):
    # py.typed ships: the package's own annotations must type-check under the [tool.mypy]
    # configuration of pyproject.toml (a bare `mypy` from the repository root)
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(ROOT)
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml"),
                                      "--cache-dir", str(tmp_path / "mypy_cache")])
    assert status == 0, stdout + stderr
    assert "Success: no issues found" in stdout


def test_ci_runs_every_test_file_that_needs_torch_or_numba():
    # the README's test command installs neither torch nor numba, so their tests skip there;
    # .ci/run installs both in its second step and must name every file that holds such tests
    ci = (ROOT / ".ci" / "run").read_text()
    needs = re.compile(r'importorskip\(\s*["\'](torch|numba)["\']')
    missing = [p.name for p in sorted((ROOT / "tests").glob("test_*.py"))
               if needs.search(p.read_text()) and f"tests/{p.name}" not in ci]
    assert not missing, f"not run by .ci/run after torch/numba are installed: {missing}"
