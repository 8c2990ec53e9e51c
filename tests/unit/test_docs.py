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


# -- README and the docs folder ------------------------------------------------------------------------------------
README = ROOT / "README.md"


def _config_table() -> str:
    text = README.read_text()
    start = text.index("## Configuration")
    section = text[start:text.index("\n## ", start + 3)]
    # `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` names both the generic and the traces-only variable
    return re.sub(r"(\w*)\[TRACES_\](\w+)", lambda m: f"{m.group(1)}{m.group(2)} {m.group(1)}TRACES_{m.group(2)}",
                  section)


def test_every_variable_the_config_reads_is_in_the_readme_table() -> None:
    src = (PKG / "model" / "config.py").read_text()
    read = {v for v in re.findall(r'"((?:CPTRACE|OTEL)_[A-Z_]*[A-Z])"', src)}
    assert len(read) >= 15
    table = _config_table()
    missing = sorted(v for v in read if not re.search(rf"`{v}`|\b{v}\b", table))
    assert not missing, f"variables config.py reads that README.md's configuration table does not list: {missing}"


def _doc_refs(text: str) -> set[str]:
    return set(re.findall(r"\bdocs/([\w.-]+\.md)\b", text))


def test_every_doc_named_exists_and_every_doc_is_reachable_from_the_readme() -> None:
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    named: dict[str, str] = {}
    for p in [README, *(ROOT / "docs").glob("*.md"), *PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        for ref in _doc_refs(p.read_text(encoding="utf-8")):
            named.setdefault(ref, str(p.relative_to(ROOT)))
    gone = sorted(f"{ref} (named in {where})" for ref, where in named.items() if ref not in docs)
    assert not gone, f"documents named that do not exist: {gone}"
    unread = sorted(docs - _doc_refs(README.read_text()))
    assert not unread, f"docs/ files the README's 'Where to read on' does not lead to: {unread}"


def test_readme_is_a_first_read() -> None:
    """One screen-ful of sections, the two commands a newcomer runs first, and the places to read on."""
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    assert "pip install -e . && cptrace-otel demo" in text and "bash .ci/run" in text
    for section in ("## Quick start", "## Drop it in", "## Configuration", "## Commands", "## Where to read on"):
        assert section in text, section


def test_every_domain_section_the_code_cites_exists() -> None:
    """``docs/domain.md §N`` in the package, the tests and the benchmarks names a heading of docs/domain.md."""
    headings = set(re.findall(r"(?m)^#+ (\d+(?:\.\d+)*)\.? ", (ROOT / "docs" / "domain.md").read_text()))
    cited: dict[str, str] = {}
    for p in [*PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py")]:
        text = p.read_text(encoding="utf-8")
        for m in re.finditer(r"docs/domain\.md ((?:§\d+(?:\.\d+)*(?:/| and |, )?)+)", text):
            for sec in re.findall(r"§(\d+(?:\.\d+)*)", m.group(1)):
                cited.setdefault(sec, f"{p.relative_to(ROOT)}")
    assert len(cited) >= 10, cited
    missing = sorted(f"§{s} (cited in {where})" for s, where in cited.items() if s not in headings)
    assert not missing, f"sections of docs/domain.md cited but absent: {missing}"
