"""The C speedups declare no name that Python declares: every attribute key, span or event name and value of
:mod:`cptrace_otel.model.semconv`, and every record tag, reaches the C code from Python when its module is loaded
(``cptrace_otel/_speedups/*.py``). So a renamed key or tag cannot leave a stale copy in C.

Checked on the string literals of the C sources (comments may name them to explain the code): none may equal such
a name, hold a dotted key, or hold a tag or a plain name as a word of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cptrace_otel
from cptrace_otel.checks.epochs import EPOCH_TAGS
from cptrace_otel.model import semconv
from cptrace_otel.model.events import LEVEL_OF_TAG

SPEEDUPS = Path(cptrace_otel.__file__).parent / "_speedups"
_TOKEN = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def _c_strings(text: str) -> list[str]:
    """The string literals of a C source, comments skipped (a quote inside a comment starts nothing)."""
    return [t[1:-1] for t in _TOKEN.findall(text) if t.startswith('"')]


def _semconv_strings() -> set[str]:
    """Every str constant assigned in semconv.py (tuples included; docstrings are not assignments)."""
    tree = ast.parse(Path(semconv.__file__).read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            out |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return out


def _forbidden() -> set[str]:
    return _semconv_strings() | set(LEVEL_OF_TAG) | set(EPOCH_TAGS)


def _holds(literal: str, name: str) -> bool:
    if "." in name:   # a key or key prefix: anywhere in the literal
        return name in literal
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", literal) is not None


def test_the_checker_sees_literals_and_skips_comments() -> None:
    src = '/* "hicache.op" reset */ x = "a \\" b"; // "cnt"\nchar c = \'"\'; y = "(cnt=";'
    assert _c_strings(src) == ['a \\" b', "(cnt="]
    assert _holds("(cnt=", "cnt") and _holds("x hicache.op", "hicache.") and not _holds("pending_reset", "reset")
    assert {"hicache.", "cptrace.seq", "cnt", "last", "reset", "fwd_hash"} <= _forbidden()


def test_c_sources_declare_no_key_or_tag_of_python() -> None:
    sources = sorted(SPEEDUPS.glob("*.[ch]"))
    assert {p.name for p in sources} >= {"otlp.c", "logreader.c", "intake.c", "value.c", "event.c"}
    names = _forbidden()
    bad = [(p.name, lit, name) for p in sources for lit in _c_strings(p.read_text(encoding="utf-8"))
           for name in names if _holds(lit, name)]
    assert not bad, bad
