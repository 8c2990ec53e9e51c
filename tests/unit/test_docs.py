"""docs/ARCHITECTURE.md matches the code: every module of the package has its line in the module table, every module
the table names exists, and the rule table is the one the registry generates."""

from __future__ import annotations

import re
from pathlib import Path

from cptrace_otel.checks import registry

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PKG = ROOT / "cptrace_otel"


def _module_table() -> str:
    text = DOC.read_text()
    start = text.index("## Modules")
    return text[start:text.index("\n## ", start + 3)]


def _named() -> set[str]:
    """Every module the table names, as package-relative paths without suffix. A bare name (``rules_h2``) means a
    sibling of the last path named before it on the same line (``checks/rules_h1``)."""
    names: set[str] = set()
    for line in _module_table().splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        folder = ""
        for tok in re.findall(r"`([^`]+)`", first):
            tok = tok.rstrip("/")
            if "/" in tok:
                folder = tok.rsplit("/", 1)[0]
                names.add(tok)
            else:
                names.add(f"{folder}/{tok}" if folder else tok)
    return names


def _modules() -> set[str]:
    out = set()
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG).with_suffix("").as_posix()
        if rel.endswith("/__init__") and rel != "__init__":
            rel = rel[: -len("/__init__")]
        if rel.endswith("/__main__"):
            continue
        if rel.startswith("_speedups/") or rel.startswith("fingerprint/"):
            rel = rel.split("/", 1)[0]   # packages described on one line
        out.add(rel)
    return out


def test_every_module_has_a_line_in_the_architecture_doc() -> None:
    missing = sorted(_modules() - _named())
    assert not missing, f"modules missing from docs/ARCHITECTURE.md's module table: {missing}"


def test_every_module_the_doc_names_exists() -> None:
    gone = sorted(n for n in _named() - _modules()
                  if not (PKG / n).with_suffix(".py").exists() and not (PKG / n).is_dir())
    assert not gone, f"docs/ARCHITECTURE.md names modules that do not exist: {gone}"


def test_architecture_rule_table_is_generated() -> None:
    text = DOC.read_text()
    assert registry.TABLE_BEGIN in text and registry.TABLE_END in text
    assert registry.splice_table(text) == text, \
        "docs/ARCHITECTURE.md's rule table is stale: regenerate it with registry.splice_table"
