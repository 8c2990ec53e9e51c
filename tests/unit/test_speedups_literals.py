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
    """Every str constant assigned in semconv.py (tuples included; docstrings are not assignments), and every str
    value the module ends up with: a name composed of parts (``CONFIG_STAMP + "."``) counts whole, its parts not
    (a lone ``"."`` is no name)."""
    tree = ast.parse(Path(semconv.__file__).read_text(encoding="utf-8"))
    out: set[str] = set()
    parts: set[int] = set()   # the constants inside a composed value
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.JoinedStr)):
            parts |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            out |= {c.value for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and id(c) not in parts}
    for v in vars(semconv).values():
        out |= {v} if isinstance(v, str) else {x for x in v if isinstance(x, str)} if isinstance(v, tuple) else set()
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


# Literals of another system's format that happen to spell one of our names (file, literal): why each is not ours.
FOREIGN = {
    ("jaegerin.c", "process"): "Jaeger's JSON key of a span's process object (semconv's stage word is another name)",
}


def test_c_sources_declare_no_key_or_tag_of_python() -> None:
    sources = sorted(SPEEDUPS.glob("*.[ch]"))
    assert {p.name for p in sources} >= {"otlp.c", "logreader.c", "intake.c", "value.c", "event.c"}
    names = _forbidden()
    bad = [(p.name, lit, name) for p in sources for lit in _c_strings(p.read_text(encoding="utf-8"))
           for name in names if _holds(lit, name) and (p.name, lit) not in FOREIGN]
    assert not bad, bad
    found = {(p.name, lit) for p in sources for lit in _c_strings(p.read_text(encoding="utf-8"))}
    assert set(FOREIGN) <= found, "a FOREIGN entry no C source holds any more: drop it"
