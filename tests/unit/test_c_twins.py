"""Each C module of ``cptrace_otel/_speedups`` names its Python twin and the tests that hold the two equal, and the
names stay true.

The header comment of every ``.c`` file carries, in this form (one ``Twin:`` line per twin, dotted path):

    * Twin: cptrace_otel.model.logline.parse_line
    * Held equal by: tests/unit/test_logc.py

A file without both lines fails; every twin must resolve (import its module, then each attribute); every test file
named must exist and mention the twin's name; docs/ARCHITECTURE.md's ``_speedups/`` row must list each pair.

And the value grammar (``value.c``, shared by the C log reader and the C intake) against its twin
``model.logline.parse_value``, value by value over generated texts (Hypothesis): the other pairs have their equality
tests in the files their headers name.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

import cptrace_otel

PKG = Path(cptrace_otel.__file__).resolve().parent
ROOT = PKG.parent
C_DIR = PKG / "_speedups"
_TWIN = re.compile(r"^\s*\*\s*Twin:\s*(\S+)\s*$", re.M)
_HELD = re.compile(r"^\s*\*\s*Held equal by:\s*(.+?)\s*$", re.M)


def pairing(source: str) -> tuple[list[str], list[str]]:
    """The twins' dotted paths and the test files the first comment of a C source names (empty when it names none)."""
    m = re.match(r"\s*/\*.*?\*/", source, re.S)
    head = m.group(0) if m else ""
    held = [t.strip() for line in _HELD.findall(head) for t in line.split(",") if t.strip()]
    return _TWIN.findall(head), held


def resolve(dotted: str) -> object:
    """The object a dotted path names: the longest importable module prefix, then attribute by attribute."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module in {dotted!r}")


C_FILES = sorted(C_DIR.glob("*.c"))


def test_there_are_c_modules() -> None:
    assert {p.name for p in C_FILES} >= {"ring.c", "idset.c", "value.c", "hot.c", "intake.c", "logreader.c", "otlp.c",
                                         "fingerprint.c", "event.c"}


@pytest.mark.parametrize("path", C_FILES, ids=lambda p: p.name)
def test_each_c_module_names_its_twin_and_the_tests_that_hold_them_equal(path: Path) -> None:
    twins, held = pairing(path.read_text())
    assert twins and held, f"{path.name}: its header comment needs 'Twin: <dotted path>' and 'Held equal by: <tests>'"
    texts = {}
    for t in held:
        p = ROOT / t
        assert p.is_file(), f"{path.name}: {t} does not exist"
        texts[t] = p.read_text()
    for twin in twins:
        assert callable(resolve(twin)), f"{path.name}: {twin} is not a function or type"
        name = twin.rsplit(".", 1)[-1]
        assert any(re.search(rf"\b{re.escape(name)}\b", text) for text in texts.values()), \
            f"{path.name}: none of {held} mentions its twin {twin}"


def test_the_pairing_check_fails_for_a_file_without_the_lines() -> None:
    assert pairing("/* The value grammar. */\n#include <x.h>\n") == ([], [])
    assert pairing("/* a\n * Twin: a.b\n * Held equal by: t1.py, t2.py\n */\n/* * Twin: not.this */") == \
        (["a.b"], ["t1.py", "t2.py"])
    with pytest.raises(AttributeError):
        resolve("cptrace_otel.model.logline.no_such_twin")


def test_architecture_lists_each_pair() -> None:
    row = next(line for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()
               if line.startswith("| `_speedups/`"))
    for path in C_FILES:
        twins, held = pairing(path.read_text())
        assert f"`{path.name}`" in row, path.name
        for x in [*(t.removeprefix("cptrace_otel.") for t in twins), *(Path(t).name for t in held)]:
            assert x in row, f"docs/ARCHITECTURE.md's _speedups row does not name {x} ({path.name})"


# -- value.c against model.logline.parse_value ---------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given, settings, strategies as st  # noqa: E402

from cptrace_otel.analyze.sources import logs  # noqa: E402
from cptrace_otel.model.logline import Rng, parse_value  # noqa: E402

_C = logs.c_reader()

_INT = st.one_of(st.integers(-10**6, 10**6), st.integers(), st.sampled_from(["0", "-0", "007", "+1", "1_0", "\u0661"]))
_ATOM = st.one_of(_INT.map(str), st.floats(allow_nan=True).map(repr), st.sampled_from(["True", "False", "None", "wt",
                                                                                       "nan", "inf", "1e5", ""]),
                  st.text(alphabet="abcxyz019_-.:", min_size=1, max_size=6))
_RNG = st.lists(_ATOM, min_size=5, max_size=5).map(
    lambda p: "(cnt={},min={},max={},first={},last={})".format(*p))
_LIST = st.recursive(st.lists(_ATOM, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
                     lambda inner: st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"), max_leaves=6)
_VALUE = st.one_of(_ATOM, _RNG, _LIST, st.text(alphabet="([,])=cntmiaxfrsl0123-", max_size=24))


def _typed(v: object) -> object:
    """A value with its exact type at every level (1 != 1.0 != True; an Rng is not a tuple)."""
    if isinstance(v, Rng):
        return ("Rng", [_typed(x) for x in v])
    if isinstance(v, list):
        return ("list", [_typed(x) for x in v])
    return (type(v).__name__, repr(v))


@pytest.mark.skipif(_C is None and os.environ.get("CPTRACE_REQUIRE_SPEEDUPS") != "1", reason="_logreader not built")
@settings(max_examples=1500, deadline=None)
@given(text=_VALUE)
@example(text="(cnt=64,min=100,max=163,first=100,last=163)")
@example(text="[1,[2,3]]")
@example(text="9" * 4001)
def test_value_grammar_equals_parse_value(text: str) -> None:
    """Every value the C grammar reads (a line ``k=<text>`` the C parser accepts) is ``parse_value(text)``, type for
    type at every level; a text parse_value rejects is left to Python."""
    assert _C is not None, "CPTRACE_REQUIRE_SPEEDUPS=1 but cptrace_otel._speedups._logreader is missing"
    if any(c.isspace() for c in text):
        return
    try:
        want = parse_value(text)
    except ValueError:   # more digits than int() takes: C must not accept the line
        assert _C.parse_line(f"[CPTRACE t] k={text}") is None
        return
    got = _C.parse_line(f"[CPTRACE t] k={text}")
    if got is not None:
        assert _typed(got[2]["k"]) == _typed(want), text


def test_the_c_value_grammar_decides_most_values_itself() -> None:
    """The equality above is not vacuous: the C parser accepts the common shapes rather than leaving them all to
    Python."""
    if _C is None:
        pytest.skip("_logreader not built")
    texts = ["12", "-3", "wt", "(cnt=2,min=0,max=1,first=0,last=1)", "[1,2,3]", "[]", "True"]
    accepted = [t for t in texts if _C.parse_line(f"[CPTRACE t] k={t}") is not None]
    assert accepted == texts
