"""Regenerate the signatures in docs/api.md from the code.

    python docs/make_api.py          # rewrite docs/api.md in place
    python docs/make_api.py --check  # exit 1 (and show what differs) when it is out of date

Every public entry point (``otstab._LAZY``'s functions and ``Bootstrap``) gets its signature
written from ``inspect.signature``: a ```` ```python ```` block in docs/api.md whose first line
starts with ``otstab.NAME(`` is replaced by the current signature, and the entry points that
have no such block are listed, with their signatures and the first line of their docstrings,
between the markers ``<!-- begin generated: entry points -->`` and
``<!-- end generated: entry points -->``. tests/test_vocabulary.py checks that the file is up
to date, so a parameter added to a public function cannot be missing from the reference.
"""

from __future__ import annotations

import difflib
import inspect
import re
import sys
from pathlib import Path

API = Path(__file__).resolve().parent / "api.md"
BEGIN = "<!-- begin generated: entry points -->"
END = "<!-- end generated: entry points -->"
WIDTH = 96


def entry_points() -> dict:
    """``{name: object}`` of every public callable entry point, in ``_LAZY``'s order."""
    import otstab

    out = {}
    for name in otstab._LAZY:
        obj = getattr(otstab, name)
        if inspect.isfunction(obj) or name == "Bootstrap":
            out[name] = obj
    return out


def _default(value) -> str:
    if isinstance(value, str):
        return '"' + value + '"'
    return repr(value)


def _parameters(obj) -> list[str]:
    sig = inspect.signature(obj)
    parts, star = [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={_default(p.default)}")
    return parts


def _returns(obj) -> str:
    if inspect.isclass(obj):
        return ""
    ann = inspect.signature(obj).return_annotation
    if ann is inspect.Signature.empty:
        return ""
    ann = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
    return " -> " + ann.replace("pd.", "pandas.")


def signature_text(name: str, obj=None) -> str:
    """``otstab.NAME(...) -> R`` wrapped at WIDTH columns, continuation lines aligned."""
    obj = entry_points()[name] if obj is None else obj
    head = f"otstab.{name}("
    parts = _parameters(obj)
    tail = ")" + _returns(obj)
    lines, line = [], head
    for i, part in enumerate(parts):
        piece = part + ("," if i < len(parts) - 1 else "")
        room = WIDTH - (len(tail) if i == len(parts) - 1 else 0)
        if line not in (head, " " * len(head)) and len(line) + 1 + len(piece) > room:
            lines.append(line.rstrip())
            line = " " * len(head)
        line += ("" if line.endswith("(") or line.strip() == "" else " ") + piece
    lines.append(line + tail)
    return "\n".join(lines)


def _summary(obj) -> str:
    """The docstring's first paragraph, its reST markup turned into Markdown."""
    doc = inspect.getdoc(obj) or ""
    text = doc.split("\n\n")[0].replace("\n", " ").strip()
    return re.sub(r":(?:func|class|mod|meth):", "", text).replace("``", "`")


_BLOCK = re.compile(r"```python\n(otstab\.(\w+)\(.*?)\n```", re.S)


def render(text: str) -> str:
    """``text`` (docs/api.md) with every signature block and the generated list rewritten."""
    eps = entry_points()
    shown = set()

    def block(m):
        name = m.group(2)
        if name not in eps:
            return m.group(0)
        shown.add(name)
        return "```python\n" + signature_text(name, eps[name]) + "\n```"

    if BEGIN in text and END in text:  # the generated part is rebuilt from scratch
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        text = before + BEGIN + "\n" + END + after
    text = _BLOCK.sub(block, text)
    missing = [n for n in eps if n not in shown]
    parts = [BEGIN, "",
             "The other entry points (signatures generated from the code by "
             "`docs/make_api.py`;\nthe parameters are described in each docstring, "
             "`help(otstab.NAME)`, and in the\nguides: [worst_case.md](worst_case.md), "
             "[groups.md](groups.md), [dro.md](dro.md),\n[inference.md](inference.md)):",
             ""]
    for name in missing:
        parts += ["```python", signature_text(name, eps[name]), "```", _summary(eps[name]), ""]
    parts.append(END)
    generated = "\n".join(parts)
    if BEGIN in text:
        before, rest = text.split(BEGIN, 1)
        return before + generated + rest.split(END, 1)[1]
    anchor = "\n## Losses\n"
    i = text.index(anchor)
    return text[:i] + "\n" + generated + "\n" + text[i:]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    old = API.read_text(encoding="utf-8")
    new = render(old)
    if "--check" in argv:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), new.splitlines(True), "docs/api.md", "generated"))
            return 1
        return 0
    API.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
