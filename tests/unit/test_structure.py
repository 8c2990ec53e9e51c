"""Structural rules of the package, checked from its source (docs/ARCHITECTURE.md states them):

* no import cycle: the module graph built with ``ast`` is acyclic, both counting only the imports that run when a
  module is imported and counting the deferred ones (inside functions) too, and counting the type-only ones
  (``if TYPE_CHECKING:``) as well; the simulator's parts import neither its rank facade nor its driver;
* imports go one way between the package's parts (:data:`MAY_IMPORT`): ``commands`` -> ``analyze``/``export``/``sim``
  -> ``checks`` -> ``model``, and the traced process's side ``traced`` -> ``export`` -> ``model``; ``model`` imports
  nothing of the package outside itself;
* no module reaches into another: no ``from m import _name`` and no ``m._name`` of a package module bound by an
  import (a private submodule such as a C extension is a module, not a name), and no ``sys.modules`` lookup of the
  package's own modules (only of modules it must not import, such as ``torch``);
* no module over :data:`MAX_LINES` lines;
* the C code declares no attribute key of ``semconv.py`` and no record tag of ``events.LEVEL_OF_TAG``: it gets them
  from Python when it is loaded, so there is one declaration to change;
* ``cptrace_otel.__all__`` is the API the README documents, and every name in it exists;
* the hot path is import-light: importing ``cptrace_otel``, tracing through it (both exporter modes) and importing
  any module of the package outside the simulator and the Triton kernels loads none of :data:`HEAVY`.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import cptrace_otel
from cptrace_otel.model import events, semconv

PKG = Path(cptrace_otel.__file__).resolve().parent
ROOT = PKG.parent
NAME = PKG.name
MAX_LINES = 600
HEAVY = ("torch", "numpy", "numba", "triton", "grpc", "requests", "google.protobuf", "opentelemetry")
# Modules that need a heavy dependency by design (matched with their submodules), and which one.
HEAVY_BY_DESIGN = {
    f"{NAME}.sim": "numpy",                          # the simulator: KV pools and tensors are numpy arrays
    f"{NAME}.fingerprint.triton_kernels": "triton",  # the GPU kernels themselves (loaded only for CUDA tensors)
    # the SGLang instrumentation is an opentelemetry-instrumentation BaseInstrumentor (loaded only when SGLang
    # imports its HiCache tree with CPTRACE_SGLANG=1, or by a user's instrument() call)
    f"{NAME}.traced.sglang": "opentelemetry",
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (source file, is a package) of every Python module of the package."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


# -- import graph -------------------------------------------------------------------------------------------------
def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_only: bool = False) -> list[tuple[ast.stmt, str]]:
    """Import statements with where they run: ``""`` (at import), ``"in a function"`` (deferred: runs when called,
    not at import) or ``"type only"``. Class bodies run at import, so their imports are not deferred;
    ``if TYPE_CHECKING:`` bodies never run and are skipped, unless ``type_only`` (two modules that name each
    other's types still depend on each other)."""
    found: list[tuple[ast.stmt, str]] = []

    def visit(node: ast.AST, when: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.Import, ast.ImportFrom)):
                found.append((ch, when))
            elif isinstance(ch, ast.If) and _is_type_checking(ch.test):
                # (a branch's statements are visited as the body of a stand-in module, so that an import
                # directly in the branch is found too)
                if type_only:
                    visit(ast.Module(body=ch.body, type_ignores=[]), "type only")
                visit(ast.Module(body=ch.orelse, type_ignores=[]), when)
            else:
                fn = isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(ch, "in a function" if fn and not when else when)

    visit(tree, "")
    return found


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(deferred: bool, type_only: bool = False) -> dict[str, dict[str, str]]:
    """importer -> {imported module: "file:line"} over the package's own modules (``deferred``: with the imports
    inside functions; ``type_only``: with those under ``if TYPE_CHECKING:`` too). Importing ``a.b.c`` also runs
    the ``__init__`` of ``a`` and ``a.b``: an edge to each, except to the importer's own parent packages (they are
    already being imported when it runs). ``from pkg import name`` of a name defined in ``pkg/__init__.py`` is an
    edge to ``pkg`` even from inside it: the name exists only once that ``__init__`` has run far enough."""
    mods = _modules()
    graph: dict[str, dict[str, str]] = {}
    for mod, (path, is_pkg) in mods.items():
        edges: dict[str, str] = {}
        own_parents = set(_parents(mod))
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node, when in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path)), type_only):
            if when and not deferred:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}" + (f" ({when})" if when else "")
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                assert isinstance(node, ast.ImportFrom)
                if node.level:
                    pkg = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    pkg = node.module or ""
                for a in node.names:
                    sub = f"{pkg}.{a.name}"
                    if sub in mods:
                        targets.append(sub)
                    else:
                        targets.append(pkg)
                        if pkg in own_parents:
                            edges.setdefault(pkg, where)   # a name from a parent's __init__: see the docstring
            for t in targets:
                if not (t == NAME or t.startswith(NAME + ".")):
                    continue
                for m in [*_parents(t), t]:
                    if m in mods and m != mod and m not in own_parents:
                        edges.setdefault(m, where)
        graph[mod] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:   # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(sorted(c) for c in comps)


def find_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One shortest cycle (modules, the first repeated last) through the first module of each strongly connected
    component."""
    cycles = []
    for comp in strongly_connected(graph):
        members = set(comp)
        start = min(comp)
        # breadth-first from start back to start, inside the component: a shortest cycle through it
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in members and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        v = prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        path.append(start)
        cycles.append(path[::-1])
    return cycles


def _describe(graph: dict[str, dict[str, str]], cycles: list[list[str]]) -> str:
    out = []
    for c, comp in zip(cycles, strongly_connected(graph), strict=False):
        out.append("  cycle: " + " -> ".join(c))
        out.append(f"  every import among its component ({', '.join(comp)}):")
        for a in comp:
            for b in sorted(graph[a]):
                if b in comp:
                    out.append(f"      {a} imports {b} at {graph[a][b]}")
    return "\n".join(out)


def test_import_graph_sees_the_package() -> None:
    g = import_graph(deferred=True)
    # `from ..model import config`
    assert f"{NAME}.traced.api" in g and f"{NAME}.model.config" in g[f"{NAME}.traced.api"]
    assert f"{NAME}.cli" in g


def test_find_cycles_reports_a_cycle() -> None:
    g = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:1"}, "c": {"a": "c.py:3"}, "d": {"a": "d.py:1"}}
    assert find_cycles(g) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b": ""}, "b": {}}) == []


# -- one-way layering ---------------------------------------------------------------------------------------------
# part of the package (its first name under the package; "" for the package's own __init__) -> the parts it may
# import, counting deferred imports. The traced process's side starts the exporter (``traced`` -> ``export``), the
# simulator is a traced application with an oracle that checks (``sim`` -> ``traced``, ``analyze``), the commands
# use everything below them; nothing below imports what is above it.
MAY_IMPORT: dict[str, set[str]] = {
    "model": set(),
    "fingerprint": {"_speedups"},   # the C kernel of CPU fingerprints (_speedups/fingerprint.py imports nothing)
    "checks": {"model", "_speedups"},   # the C twin of C1's state (_speedups/lockstep.py imports nothing)
    "_speedups": {"model", "checks"},
    "export": {"model", "checks", "_speedups", "_version"},
    "traced": {"model", "export", "fingerprint", "_speedups"},   # the C gate of cptrace (_speedups/hot.py)
    "analyze": {"model", "checks", "export", "_speedups"},
    "sim": {"model", "checks", "analyze", "traced", "fingerprint"},
    "commands": {"model", "checks", "analyze", "export", "sim", "_version"},
    "cli": {"model", "_version"},   # the commands are imported by name (importlib), one when it runs
    "": {"traced", "_version"},
    "_version": set(),
}


def _part(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def layering_violations(graph: dict[str, dict[str, str]]) -> list[str]:
    """Every import between two parts that :data:`MAY_IMPORT` does not allow, with where it is."""
    bad = []
    for a, edges in sorted(graph.items()):
        pa = _part(a)
        for b, where in sorted(edges.items()):
            pb = _part(b)
            if pb != pa and pb not in MAY_IMPORT.get(pa, set()):
                bad.append(f"{a} imports {b} at {where} ({pa or NAME} may import only "
                           f"{sorted(MAY_IMPORT.get(pa, set()))})")
    return bad


def test_layering_check_reports_an_upward_import() -> None:
    g = {f"{NAME}.model.spans": {f"{NAME}.checks.findings": "model/spans.py:9"},
         f"{NAME}.checks.rank_checker": {f"{NAME}.model.events": "checks/rank_checker.py:3"}}
    bad = layering_violations(g)
    assert len(bad) == 1 and bad[0].startswith(f"{NAME}.model.spans imports {NAME}.checks.findings")


def test_every_part_has_its_layer() -> None:
    parts = {_part(m) for m in _modules()}
    assert parts <= set(MAY_IMPORT), f"parts of the package with no entry in MAY_IMPORT: {parts - set(MAY_IMPORT)}"


def test_imports_go_one_way_between_the_parts() -> None:
    bad = layering_violations(import_graph(deferred=True))
    assert not bad, "imports against the layering:\n  " + "\n  ".join(bad)


# -- no reach-through ----------------------------------------------------------------------------------------------
def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reach_throughs(mod: str, is_pkg: bool, src: str, modules: set[str], path: str = "") -> list[str]:
    """The places where module ``mod`` (source ``src``) takes another module's private name: ``from m import _x``
    of a name that is not a submodule, ``m._x`` on a name an import bound to a package module, and any
    ``sys.modules`` lookup that is not of a literal name outside the package."""
    tree = ast.parse(src)
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    bound: dict[str, str] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            pkg = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            if not (pkg == NAME or pkg.startswith(NAME + ".")):
                continue
            for a in node.names:
                sub = f"{pkg}.{a.name}"
                is_module = sub in modules or (pkg + "." + a.name.lstrip("_")) in modules  # (a C extension)
                if is_module:
                    bound[a.asname or a.name] = sub
                elif _is_private(a.name) and pkg != mod:
                    out.append(f"{path}:{node.lineno}: from {pkg} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name.startswith(NAME + "."):
                    bound[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                and _is_private(node.attr):
            out.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr} ({bound[node.value.id]})")
        if isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            out.append(f"{path}:{node.lineno}: sys.modules")
    # allowed: sys.modules.get("<literal outside the package>")
    ok_lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "modules" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and not node.args[0].value.startswith(NAME):
            ok_lines.add(node.lineno)
    return [x for x in out if not (x.endswith(": sys.modules") and int(x.rsplit(":", 2)[1]) in ok_lines)]


def test_reach_through_check_reports_each_kind() -> None:
    mods = {f"{NAME}.a", f"{NAME}.b", f"{NAME}._speedups", f"{NAME}._speedups.intake"}
    src = ("import sys\nfrom . import b\nfrom .b import _hidden, shown\nx = b._state\n"
           f"p = sys.modules.get('{NAME}.b')\nt = sys.modules.get('torch')\nfrom ._speedups import _intake\n")
    got = reach_throughs(f"{NAME}.a", False, src, mods, "a.py")
    assert got == [f"a.py:3: from {NAME}.b import _hidden", f"a.py:4: b._state ({NAME}.b)",
                   "a.py:5: sys.modules"], got


def test_no_module_reaches_into_another() -> None:
    mods = _modules()
    names = set(mods)
    bad = []
    for mod, (path, is_pkg) in sorted(mods.items()):
        bad += reach_throughs(mod, is_pkg, path.read_text(encoding="utf-8"), names, str(path.relative_to(ROOT)))
    assert not bad, "modules reaching into another's private names or through sys.modules:\n  " + "\n  ".join(bad)


def test_no_import_cycle_at_import_time() -> None:
    """Imports that run when a module is imported: a cycle there hands one module the other half-initialised."""
    g = import_graph(deferred=False)
    cycles = find_cycles(g)
    assert not cycles, "import cycles among module-level imports:\n" + _describe(g, cycles)


def test_no_import_cycle_counting_deferred_imports() -> None:
    """Deferred imports (inside functions) keep ``import cptrace_otel`` light and do not fail at import time, but a
    cycle through them is still two modules that depend on each other: the layering (api -> pipeline -> export ->
    spans -> checks -> events) must go one way. Such a cycle was api -> pipeline -> export.worker -> pipeline
    (pipeline rebinding ``api._submit``, the worker importing the pipeline's private renderers)."""
    g = import_graph(deferred=True)
    cycles = find_cycles(g)
    assert not cycles, "import cycles (counting imports inside functions):\n" + _describe(g, cycles)


def test_type_only_imports_are_seen() -> None:
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\nelse:\n    import c\n"
    tree = ast.parse(src)
    assert [type(n).__name__ for n, _ in _imports(tree)] == ["ImportFrom", "Import"]   # typing, c
    got = [(getattr(n, "module", None), w) for n, w in _imports(tree, type_only=True)]
    assert got == [("typing", ""), ("b", "type only"), (None, "")], got


def test_no_import_cycle_counting_type_only_imports() -> None:
    """Type-only imports (``if TYPE_CHECKING:``) never run, but a cycle through them is two modules that know each
    other: the simulator's parts once held their rank facade and named its type, and it named theirs."""
    g = import_graph(deferred=True, type_only=True)
    cycles = find_cycles(g)
    assert not cycles, "import cycles (counting type-only imports):\n" + _describe(g, cycles)


# the simulator's facade (one rank) and its driver (the ranks in lockstep), and what drives the driver
SIM_FACADES = {f"{NAME}.sim.rank", f"{NAME}.sim.core"}
SIM_DRIVERS = {f"{NAME}.sim", f"{NAME}.sim.workload", f"{NAME}.sim.volume", f"{NAME}.sim.rank_main"}


def test_sim_parts_do_not_import_the_facade() -> None:
    """The simulator's parts (tree, memory, eviction, copies, compose views, records, fault hooks ...) are given
    the state they work on; none imports the rank facade or the driver, not even for a type."""
    g = import_graph(deferred=True, type_only=True)
    parts = [m for m in g if m.startswith(f"{NAME}.sim.") and m not in SIM_FACADES | SIM_DRIVERS]
    assert f"{NAME}.sim.tree" in parts and f"{NAME}.sim.copy_engine" in parts
    bad = [f"{m} imports {t} at {where}" for m in sorted(parts) for t, where in sorted(g[m].items())
           if t in SIM_FACADES | SIM_DRIVERS]
    assert not bad, "simulator parts importing the facade or the driver:\n  " + "\n  ".join(bad)


# -- sizes ---------------------------------------------------------------------------------------------------------
def test_no_module_over_600_lines() -> None:
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, (path, _) in _modules().items()}
    big = sorted((n, name) for name, n in sizes.items() if n > MAX_LINES)
    assert not big, f"modules over {MAX_LINES} lines: " + ", ".join(f"{name} ({n})" for n, name in big)


# -- C sources -----------------------------------------------------------------------------------------------------
_C_TOKEN = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


def c_string_literals(src: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every string literal in C source, outside comments, adjacent literals joined (as the
    compiler joins them), simple escapes decoded."""
    out: list[tuple[int, str]] = []
    last_end = -1
    for m in _C_TOKEN.finditer(src):
        tok = m.group()
        if not tok.startswith('"'):
            continue
        text = re.sub(r"\\(.)", lambda e: _C_ESCAPES.get(e.group(1), "\\" + e.group(1)), tok[1:-1])
        if out and src[last_end:m.start()].strip() == "":
            line, prev = out.pop()
            out.append((line, prev + text))
        else:
            out.append((src.count("\n", 0, m.start()) + 1, text))
        last_end = m.end()
    return out


def python_declared_names() -> dict[str, str]:
    """Text -> where Python declares it: every string constant of semconv (attribute keys, span and event names,
    the field prefix, the parts of a range summary) and every record tag."""
    out: dict[str, str] = {}
    for k, v in vars(semconv).items():
        if not k.isupper():
            continue
        for x in (v if isinstance(v, (tuple, list, frozenset)) else (v,)):
            if isinstance(x, str) and x:
                out.setdefault(x, f"semconv.{k}")
    for tag in events.LEVEL_OF_TAG:
        out.setdefault(tag, "events.LEVEL_OF_TAG")
    return out


def test_c_literal_scanner() -> None:
    src = '/* "hicache." */ static const char *a = "cptrace" ".seq"; // "reset"\nchar c = \'"\'; f("ack\\n");'
    assert c_string_literals(src) == [(1, "cptrace.seq"), (2, "ack\n")]


def test_c_sources_declare_no_python_key_or_tag() -> None:
    declared = python_declared_names()
    c_files = sorted(PKG.rglob("*.c"))
    assert c_files, "no C sources found under the package"
    bad = []
    for path in c_files:
        for line, text in c_string_literals(path.read_text(encoding="utf-8")):
            if text in declared:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {text!r} (declared in {declared[text]})")
    assert not bad, "C string literals that Python declares (pass them in when the module is loaded):\n  " + \
        "\n  ".join(bad)


# -- documented API ------------------------------------------------------------------------------------------------
def documented_api(readme: str) -> set[str]:
    """The names of the README's "Drop it in" section: its ``from cptrace_otel import ...`` line and every
    ``cptrace_otel.<name>`` it mentions that is not a submodule path (``cptrace_otel.fingerprint.x`` is not)."""
    m = re.search(r"^## Drop it in.*?$(.*?)(?=^## )", readme, re.S | re.M)
    assert m, 'README has no "## Drop it in" section'
    section = m.group(1)
    imp = re.search(rf"^from {NAME} import ([\w, ]+)$", section, re.M)
    assert imp, f'the "Drop it in" section has no "from {NAME} import ..." line'
    names = {n.strip() for n in imp.group(1).split(",")}
    names |= set(re.findall(rf"`{NAME}\.(\w+)(?![\w.])", section))
    return names


def test_all_is_the_documented_api() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    documented = documented_api(readme)
    exported = cptrace_otel.__all__
    assert len(exported) == len(set(exported)), "duplicate names in __all__"
    assert set(exported) == documented, (
        f"cptrace_otel.__all__ and the README's 'Drop it in' section differ: only in __all__ "
        f"{sorted(set(exported) - documented)}, only in the README {sorted(documented - set(exported))}")
    missing = [n for n in exported if not hasattr(cptrace_otel, n)]
    assert not missing, f"names in __all__ that cptrace_otel does not define: {missing}"


# -- import-light --------------------------------------------------------------------------------------------------
_PROBE = """
import json, sys
HEAVY = %r
def heavy():
    return sorted(h for h in HEAVY if h in sys.modules or any(m.startswith(h + ".") for m in sys.modules))
"""


def _run_probe(code: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in list(env):
        if k.startswith(("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE")):
            del env[k]
    r = subprocess.run([sys.executable, "-c", _PROBE % (HEAVY,) + code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_cptrace_otel_loads_nothing_heavy() -> None:
    got = _run_probe("import cptrace_otel\nprint(json.dumps(heavy()))")
    assert got == [], f"import cptrace_otel loads {got}"


def test_tracing_loads_nothing_heavy(tmp_path: Path) -> None:
    """The traced process's whole path, in both exporter modes (``thread`` runs the exporter, its encoders, sinks
    and online checks in the traced process itself): gate, record, fingerprints of non-tensors, flush, shutdown."""
    code = f"""
import cptrace_otel as ct
out = {{}}
for mode in ("process", "thread"):
    ct.configure(level=3, run_id="light", exporter=mode, file={str(tmp_path)!r} + "/" + mode + "-{{pid}}.jsonl",
                 log_file={str(tmp_path)!r} + "/" + mode + ".log", cp_rank=0)
    ct.cptrace(1, "config", cp_size=1)
    ct.cptrace(1, "prepare", node_id=1, op=1, dev=ct.rng([1, 2, 3]), h=ct.khash(None), nz=ct.knz(None))
    ct.cptrace(2, "ack", dir="d2h", op=1, node_id=1, pub=[1])
    ct.fwd_hash(None, 0, "attn", None)
    out[mode] = [ct.flush(60), ct.shutdown(60), heavy()]
print(json.dumps(out))
"""
    got = _run_probe(code)
    assert got == {"process": [True, True, []], "thread": [True, True, []]}, got


def test_every_light_module_imports_nothing_heavy() -> None:
    """Every module outside :data:`HEAVY_BY_DESIGN`, imported one after another in one interpreter; a module that
    pulls in a heavy dependency is named with it."""
    light = [m for m in _modules() if not any(m == p or m.startswith(p + ".") for p in HEAVY_BY_DESIGN)]
    code = f"""
import importlib
blame = {{}}
for m in {light!r}:
    before, mods = set(heavy()), set(sys.modules)
    importlib.import_module(m)
    for h in set(heavy()) - before:
        blame[h] = [m] + sorted(x for x in set(sys.modules) - mods if x.startswith({NAME!r} + ".") and x != m)
print(json.dumps(blame))
"""
    got = _run_probe(code)
    assert got == {}, ("heavy dependencies loaded by light modules (dependency: [module imported, package modules "
                       f"it loaded with it]): {got}")


def test_heavy_by_design_modules_exist() -> None:
    """The exemptions above name modules that exist (a moved module must not leave a stale exemption behind)."""
    mods = _modules()
    for p in HEAVY_BY_DESIGN:
        assert any(m == p or m.startswith(p + ".") for m in mods), f"HEAVY_BY_DESIGN names {p}, which is gone"
