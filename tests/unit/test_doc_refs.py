"""Every cross-reference in the package's docstrings and comments, and every dotted ``cptrace_otel.`` path in the
docs, names something that exists.

Resolved statically (nothing imported): the package's modules are parsed with :mod:`ast` into the names each one
defines (top level: functions, classes, assignments, imports; per class: methods, class attributes and the
``self.x`` it assigns). A reference is resolved as Sphinx would look it up: ``~`` dropped; an absolute path by its
longest module prefix and then names inside it; a path with a leading dot relative to the current module and then
each package above it; a bare name in the current module, its classes, the packages above it, or the builtins.
"""

from __future__ import annotations

import ast
import builtins
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "cptrace_otel"
ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc|obj):`~?(\.?[A-Za-z_][\w.]*)`")
DOTTED = re.compile(r"(?<![\w./-])(cptrace_otel(?:\.[A-Za-z_]\w*)+)")


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_of(p): p for p in PKG.rglob("*.py")}
# the C extensions (``_speedups/NAME.c`` builds ``_speedups._NAME``) resolve as modules with no names known
C_EXTENSIONS = {f"cptrace_otel._speedups._{c.stem}" for c in (PKG / "_speedups").glob("*.c")}


def _class_names(cls: ast.ClassDef) -> dict[str, ast.AST | None]:
    out: dict[str, ast.AST | None] = {}
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = None
        elif isinstance(node, ast.ClassDef) and node is not cls:
            out[node.name] = node
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            out[node.attr] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = None
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out[n.id] = None
    return out


@cache
def _names(mod: str) -> dict[str, ast.AST | None]:
    """Top-level name -> its ClassDef (to look inside), or None."""
    tree = ast.parse(MODULES[mod].read_text())
    out: dict[str, ast.AST | None] = {}
    for node in ast.walk(tree):   # also names bound under if/try (optional speedups, TYPE_CHECKING)
        if isinstance(node, ast.ClassDef):
            out.setdefault(node.name, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.setdefault((a.asname or a.name).split(".")[0], None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, None)
    return out


def _foreign_base(cls: ast.AST | None, mod: str) -> bool:
    """Whether ``cls`` (a ClassDef of ``mod``) has a base class defined outside the package."""
    if not isinstance(cls, ast.ClassDef):
        return False
    local = {n for n, v in _names(mod).items() if isinstance(v, ast.ClassDef)}
    generic = {"NamedTuple", "Protocol", "Enum", "IntEnum", "Exception", "object", "Generic", "TypedDict"}
    return any(isinstance(b, (ast.Name, ast.Attribute)) and ast.unparse(b) not in local | generic
               and not ast.unparse(b).startswith(".") for b in cls.bases)


def _resolve_abs(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        if mod in C_EXTENSIONS:
            return True
        if mod not in MODULES:
            continue
        rest = parts[i:]
        if not rest:
            return True
        scope: dict[str, ast.AST | None] = _names(mod)
        node_of: ast.AST | None = None
        for k, a in enumerate(rest):
            if a not in scope:
                # a member a base class from outside the module may give (OpenTelemetry's BaseInstrumentor)
                return k > 0 and _foreign_base(node_of, mod)
            node_of = scope[a]
            node = scope[a]
            if k + 1 < len(rest):
                if not isinstance(node, ast.ClassDef):
                    return True   # an attribute of a value: not followed
                scope = _class_names(node)
        return True
    return False


def resolve(ref: str, mod: str) -> bool:
    """Whether ``ref`` (as written after the role, ``~`` dropped) names something, read from module ``mod``."""
    up = mod.split(".")
    bases = [".".join(up[:i]) for i in range(len(up), 0, -1)]
    if ref.startswith("."):
        return any(_resolve_abs(b + ref) for b in bases)
    if _resolve_abs(ref) or any(_resolve_abs(f"{b}.{ref}") for b in bases):
        return True
    head = ref.split(".")[0]
    if "." not in ref:
        if hasattr(builtins, ref):
            return True
        # a bare method or attribute of a class of this module (``:meth:`close``` inside the class)
        return any(isinstance(n, ast.ClassDef) and ref in _class_names(n) for n in _names(mod).values())
    return hasattr(builtins, head)


def _refs() -> list[tuple[str, int, str, str]]:
    out = []
    for mod, path in sorted(MODULES.items()):
        for ln, line in enumerate(path.read_text().splitlines(), 1):
            for m in ROLE.finditer(line):
                out.append((str(path.relative_to(ROOT)), ln, m.group(1), mod))
            if "getLogger(" in line:   # a logger's name, not a module path
                continue
            for m in DOTTED.finditer(line):
                out.append((str(path.relative_to(ROOT)), ln, m.group(1), mod))
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for ln, line in enumerate(doc.read_text().splitlines(), 1):
            for m in DOTTED.finditer(line):
                out.append((str(doc.relative_to(ROOT)), ln, m.group(1), "cptrace_otel"))
    return out


def test_the_resolver_tells_a_broken_reference() -> None:
    assert resolve("cptrace_otel.analyze.engine.Runs.add", "cptrace_otel.cli")
    assert resolve(".sources.overlap.log_runs", "cptrace_otel.analyze.engine")
    assert resolve("OSError", "cptrace_otel.cli")
    assert not resolve("cptrace_otel.logline.parse_value", "cptrace_otel.cli")   # a module from before the regrouping
    assert not resolve(".rank.RankChecker", "cptrace_otel.checks.epochs")
    assert not resolve("cptrace_otel.analyze.engine.Runs.no_such_method", "cptrace_otel.cli")


def test_every_reference_resolves() -> None:
    refs = _refs()
    assert len(refs) > 500   # the scan found the references (not vacuous)
    bad = [f"{p}:{ln}: {ref}" for p, ln, ref, mod in refs if not resolve(ref.rstrip("."), mod)]
    assert not bad, "references to nothing:\n" + "\n".join(bad)


ISSUE = re.compile(r"\b[Ii]ssue #?\d+")


def test_no_issue_number_is_cited() -> None:
    """The project's own issue numbers mean nothing to a reader of the tree (its history is git's); SGLang's
    (``#31600`` of sgl-project/sglang) are cited by their number alone or by URL."""
    hits = []
    for path in [*PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py"),
                 ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        if path == Path(__file__).resolve():
            continue
        for ln, line in enumerate(path.read_text().splitlines(), 1):
            if ISSUE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{ln}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)
