"""``logline.fast_value``, the grammar's one fast path (the log reader and the exporter worker call it), gives exactly
what the spec ``logline.parse_value`` gives: the same value, the same type at every level, a fresh list each call."""

from __future__ import annotations

import random

from cptrace_otel.model.logline import Rng, fast_value, parse_value

_TEXTS = ["", "0", "7", "-7", "007", "-0", "-07", "-", "--1", "+1", "1_0", "\u0661", "-\u0661", "1\u0661", "12a",
          "1.5", ".5", "-.5", "5.", "1e5", "nan", "inf", "-inf", "abc", "wt", "\u00e9", "_x", "(none)", "(0)",
          "(err:boom)", "(cnt=3,min=1,max=5,first=1,last=5)", "(cnt=1,min=-0,max=0,first=0,last=0)",
          "(cnt=01,min=1,max=1,first=1,last=1)", "(cnt=1,min=1,max=1,first=1,last=1)\n",
          "(cnt=2,min=0.5,max=1.5,first=0.5,last=1.5)", "(cnt=1,min=\u0661,max=1,first=1,last=1)", "(cnt",
          "[]", "[1]", "[1,2,3]", "[-1,0]", "[-0]", "[01]", "[1,]", "[,1]", "[1,[2,3]]", "[1.5]", "[a]", "[", "]",
          "[1,2]\n", "[\u0661]", str(1 << 70), str(-(1 << 70)), "9" * 5000, "[" + ",".join(["9" * 30] * 3) + "]"]


def _typed(v):
    if isinstance(v, (list, Rng)):
        return (type(v), [_typed(x) for x in v])
    return (type(v), v)


def _outcome(f, s: str):
    try:
        return _typed(f(s))
    except ValueError as e:   # int() of more digits than sys.get_int_max_str_digits(): both raise
        return (ValueError, str(e))


def _same(s: str) -> None:
    assert _outcome(fast_value, s) == _outcome(parse_value, s), s


def test_fast_value_equals_parse_value_on_odd_texts() -> None:
    for s in _TEXTS:
        _same(s)


def test_fast_value_equals_parse_value_fuzzed() -> None:
    rnd = random.Random(11)
    atoms = ["0", "1", "-1", "007", "-0", "42", str(1 << 64), "1.5", "x", "", "\u0661", "(none)"]

    def text(depth: int = 0) -> str:
        k = rnd.randrange(6)
        if k == 0:
            return rnd.choice(atoms)
        if k == 1:
            return str(rnd.randrange(-10**9, 10**9))
        if k == 2:
            return "(cnt={},min={},max={},first={},last={})".format(*(rnd.choice(atoms) for _ in range(5)))
        if k == 3 and depth < 2:
            return "[" + ",".join(text(depth + 1) for _ in range(rnd.randrange(0, 4))) + "]"
        return "".join(rnd.choice("0123456789-.,[]()=aeinf") for _ in range(rnd.randrange(1, 8)))

    for _ in range(20000):
        _same(text())


def test_fast_value_lists_are_fresh() -> None:
    a, b = fast_value("[1,2]"), fast_value("[1,2]")
    assert a == b == [1, 2] and a is not b
