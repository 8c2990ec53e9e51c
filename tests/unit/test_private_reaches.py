"""Every reach from tests/ and bench/ into the project's private names is listed in docs/testing.md, and the list
stays true.

A reach is an attribute ``x._name`` (not on ``self``/``cls`` directly), a ``getattr``/``setattr``/``hasattr``/
``delattr`` (``monkeypatch`` too) with a private name as a string, or an import of a private name or through a
private module (``from cptrace_otel.traced.sglang._state import ...``). Each is put with its owner:

* ``ours``: the base is bound by an import of ``cptrace_otel`` or ``bench``, or it is an object (a local, a
  parameter) and the name is defined in the package or bench and not named in the SGLang row. These are listed file
  by file in docs/testing.md's table (file, names, why): a reach not listed fails, and so does a listed one that is
  gone.
* ``sglang``: an object's private name reached in tests/ that the package and bench do not define, or that the
  SGLang row names (the drivers inject faults at the SGLang method where the fault lives). They are one row of the
  same table; a new one must be named there, a named one that is no longer reached fails, and (where the SGLang
  wheels are installed) each one must be defined in SGLang's source.
* ``helpers`` (a test module's helper reached by another, a benchmark's by another) and ``foreign`` (``os._exit``,
  ``torch.cuda._sleep``, the OTel SDK's) are counted, not listed.

``python3 -m tests.unit.test_private_reaches`` prints the counts and every reach, grouped.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "bench")
OURS = ("cptrace_otel", "bench")   # bench: reached from tests, its helpers are ours
DOC = ROOT / "docs" / "testing.md"
SGLANG_ROW = "SGLang's private methods"
# where tests drive SGLang's own code: an object's private name there that is not ours is SGLang's
SGLANG_DIRS = ("tests/sglang_real/", "tests/e2e/")
ATTR_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@dataclass(frozen=True)
class Reach:
    file: str    # relative to the repository root
    line: int
    key: str     # what the docs table names: a dotted path without the cptrace_otel prefix, or ._name on an object
    owner: str   # ours | sglang | tests | foreign


def _absolute(module: str, level: int, pkg: str, siblings: set[str]) -> str:
    """The dotted path of an imported module: a relative one from ``pkg``; a bare one naming a file beside the
    importing script (a script's folder is on ``sys.path``) under that folder."""
    if level:
        up = pkg.split(".")
        up = up[:len(up) - (level - 1)] if level > 1 else up
        return ".".join([*up, module] if module else up)
    return f"{pkg}.{module}" if module.split(".")[0] in siblings else module


def _bindings(tree: ast.Module, module: str, siblings: set[str]) -> dict[str, str]:
    """Local name -> the dotted path an import binds it to (``from a import b as c``: c -> a.b)."""
    out: dict[str, str] = {}
    pkg = module.rsplit(".", 1)[0] if "." in module else ""
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.asname:
                    out[a.asname] = _absolute(a.name, 0, pkg, siblings)
                else:
                    root = a.name.split(".")[0]
                    out[root] = _absolute(root, 0, pkg, siblings)
        elif isinstance(n, ast.ImportFrom):
            base = _absolute(n.module or "", n.level, pkg, siblings)
            for a in n.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute) \
                and n.value.func.attr in ("importorskip", "import_module") and n.value.args \
                and isinstance(n.value.args[0], ast.Constant) and isinstance(n.value.args[0].value, str):
            out[n.targets[0].id] = n.value.args[0].value   # torch = pytest.importorskip("torch")
    return out


def _owner_of_path(dotted: str, rel: str) -> str:
    """ours (the package, or bench reached from tests), helpers (tests reaching tests, bench reaching bench or tests)
    or foreign."""
    top, own = dotted.split(".")[0], rel.split("/")[0]
    if top in OURS and not (top == own == "bench"):
        return "ours"
    return "helpers" if top in SCANNED else "foreign"


def _key(dotted: str) -> str:
    """The docs' name of a reach: the path up to its last private step, without the ``cptrace_otel.`` prefix
    (``api._STATE.drop`` -> ``traced.api._STATE``; ``_speedups._hot`` stays whole)."""
    steps = dotted.split(".")
    last = max((i for i, s in enumerate(steps) if _private(s)), default=len(steps) - 1)
    return ".".join(steps[:last + 1]).removeprefix("cptrace_otel.")


def _chain(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """The root of an attribute chain and the attribute names after it (``a.b._c`` -> (a, [b, _c]))."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return node, names[::-1]


def defined_private_names(tops: tuple[str, ...] = OURS) -> set[str]:
    """Every private name defined under ``tops``: functions, classes, assigned names and attributes."""
    out: set[str] = set()
    for top in tops:
        for p in (ROOT / top).rglob("*.py"):
            for n in ast.walk(ast.parse(p.read_text())):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    out.add(n.name)
                elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    out.add(n.id)
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                    out.add(n.attr)
                elif isinstance(n, ast.ImportFrom):
                    out.update(a.asname or a.name for a in n.names)
    return {x for x in out if _private(x)}


def _scanned_files() -> list[tuple[Path, str]]:
    return [(p, str(p.relative_to(ROOT))) for top in SCANNED for p in sorted((ROOT / top).rglob("*.py"))]


def reaches(ours_defined: set[str], sglang_named: set[str], tests_defined: set[str] | None = None,
            files: list[tuple[Path, str]] | None = None) -> Iterator[Reach]:
    """Every reach into a private name from ``files`` ((path, name relative to the root); by default every Python
    file of the scanned folders; see the module docstring)."""
    for path, rel in files if files is not None else _scanned_files():
        tree = ast.parse(path.read_text())
        module = rel.removesuffix(".py").replace("/", ".")
        bound = _bindings(tree, module, {p.stem for p in path.parent.glob("*.py")})

        def on_object(line: int, base: ast.expr, name: str, rel: str = rel,
                      bound: dict[str, str] = bound) -> Reach | None:
            root, names = _chain(base)
            if isinstance(root, ast.Name) and root.id in ("self", "cls") and not names:
                return None
            if isinstance(root, ast.Name) and root.id in bound:
                path_ = ".".join([bound[root.id], *names, name])
                return Reach(rel, line, _key(path_), _owner_of_path(path_, rel))
            # an object: whose it is, by the name (the SGLang row first where the drivers run SGLang)
            near_sglang = rel.startswith(SGLANG_DIRS)
            owner = ("sglang" if near_sglang and name in sglang_named else "ours" if name in ours_defined
                     else "helpers" if name in (tests_defined or ()) else "sglang" if near_sglang else "foreign")
            return Reach(rel, line, "." + name, owner)

        for n in ast.walk(tree):
            hit: Reach | None = None
            if isinstance(n, ast.Attribute) and _private(n.attr):
                hit = on_object(n.lineno, n.value, n.attr)
            elif isinstance(n, ast.Call) and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) \
                    and isinstance(n.args[1].value, str) and _private(n.args[1].value):
                fn = n.func
                fname = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if fname in ATTR_CALLS:
                    hit = on_object(n.lineno, n.args[0], n.args[1].value)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                for a in n.names:   # through a private module, or a private name
                    full = a.name if isinstance(n, ast.Import) else f"{bound[a.asname or a.name]}"
                    if isinstance(n, ast.Import):
                        full = _absolute(full, 0, module.rsplit(".", 1)[0], set())
                    owner = _owner_of_path(full, rel)
                    if owner != "foreign" and any(_private(part) for part in full.split(".")):
                        yield Reach(rel, n.lineno, full.removeprefix("cptrace_otel."), owner)
            if hit is not None:
                yield hit


_ROW = re.compile(r"^\|\s*(?P<files>[^|]*)\|\s*(?P<names>[^|]*)\|")


def listed() -> tuple[set[tuple[str, str]], set[str]]:
    """docs/testing.md's table of reaches: the (file, key) pairs of our rows, and the SGLang row's names.

    A row's first cell names one or more files (backquoted), its second cell the keys (backquoted) reached from every
    file of the row; the SGLang row's first cell starts with :data:`SGLANG_ROW`."""
    text = DOC.read_text()
    start = text.find("\n## Every reach into private state")
    if start == -1:
        return set(), set()
    end = text.find("\n## ", start + 1)
    ours: set[tuple[str, str]] = set()
    sglang: set[str] = set()
    for line in text[start:end if end != -1 else None].splitlines():
        m = _ROW.match(line)
        if not m or set(m["files"].strip()) <= {"-", " "} or m["files"].strip() == "files":
            continue
        names = re.findall(r"`([^`]+)`", m["names"])
        if m["files"].strip().startswith(SGLANG_ROW):
            sglang.update(n.lstrip(".") for n in names)
            continue
        for f in re.findall(r"`([^`]+)`", m["files"]):
            ours.update((f, n) for n in names)
    return ours, sglang


def _scan() -> tuple[list[Reach], set[tuple[str, str]], set[str]]:
    ours_listed, sglang_named = listed()
    found = reaches(defined_private_names(), sglang_named, defined_private_names(("tests",)))
    return list(found), ours_listed, sglang_named


def test_every_reach_into_our_private_names_is_listed_and_every_listed_one_is_there() -> None:
    found, ours_listed, _ = _scan()
    ours = {(r.file, r.key) for r in found if r.owner == "ours"}
    new = sorted(ours - ours_listed)
    gone = sorted(ours_listed - ours)
    assert not new, ("reaches into private state not listed in docs/testing.md (give the test a public seam, or list "
                     f"the reach with why): {new}")
    assert not gone, f"docs/testing.md lists reaches that are gone (take them off the list): {gone}"


def test_the_sglang_row_names_exactly_the_sglang_privates_reached() -> None:
    found, _, sglang_named = _scan()
    reached = {r.key.lstrip(".") for r in found if r.owner == "sglang"}
    unnamed = sorted(reached - sglang_named)
    assert not unnamed, f"SGLang private names reached but not in docs/testing.md's SGLang row: {unnamed}"
    assert not sglang_named - reached, f"the SGLang row names what no test reaches: {sorted(sglang_named - reached)}"


def test_the_sglang_row_names_sglang_s_own_privates() -> None:
    """Where the SGLang wheels are installed, each name in the SGLang row is defined in SGLang's source (so no name of
    ours hides in that row)."""
    import pytest

    trees = sorted((ROOT / ".sglang").glob("0.5.*/sglang/srt"))
    if not trees:
        pytest.skip("the SGLang wheels are not installed (deploy/sglang/install)")
    _, sglang_named = listed()
    text = "\n".join(p.read_text(errors="replace") for tree in trees for p in tree.rglob("*.py")
                     if "mem_cache" in p.parts or "managers" in p.parts or "model_executor" in p.parts)
    missing = [n for n in sorted(sglang_named)
               if not re.search(rf"(def {n}\b|\b{n}\s*[:=]|class {n}\b)", text)]
    assert not missing, f"not defined in SGLang's mem_cache/managers/model_executor source: {missing}"


def test_the_scanner_sees_each_kind_of_reach(tmp_path: Path) -> None:
    """The scanner's own rules on a made-up file: an attribute on a bound module, a string getattr, a private import,
    a private module path, an object's attribute (ours by definition, else SGLang's), self's own, a foreign one."""
    src = ("from cptrace_otel.traced import api\nfrom cptrace_otel.cli import _parser\n"
           "import cptrace_otel.traced.sglang._state as s\nimport os\n"
           "api._STATE.level\ngetattr(api, '_cptrace_py')\nos._exit\nobj._pending\nobj._page_transfer\n"
           "class A:\n    def f(self):\n        return self._x\n")
    path = tmp_path / "probe.py"
    path.write_text(src)
    got = {(r.key, r.owner) for r in reaches({"_pending"}, set(), files=[(path, "tests/sglang_real/probe.py")])}
    assert got == {("traced.api._STATE", "ours"), ("traced.api._cptrace_py", "ours"), ("cli._parser", "ours"),
                   ("traced.sglang._state", "ours"), ("._pending", "ours"), ("._page_transfer", "sglang"),
                   ("os._exit", "foreign")}


if __name__ == "__main__":
    all_found, _, _ = _scan()
    by_owner = Counter(r.owner for r in all_found)
    pairs = Counter(r.owner for r in {(r.file, r.key, r.owner): r for r in all_found}.values())
    print("occurrences:", dict(by_owner), " distinct (file, name):", dict(pairs))
    for owner in ("ours", "sglang", "helpers", "foreign"):
        print(f"\n[{owner}]")
        per: dict[str, Counter[str]] = {}
        for r in all_found:
            if r.owner == owner:
                per.setdefault(r.file, Counter())[r.key] += 1
        for f, c in sorted(per.items()):
            print(f"  {f}: " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(c.items())))
