"""The record grammar (:mod:`cptrace_otel.model.grammar`) is the one source of the constants its encoders and
decoders share: the committed ``_speedups/grammar.h`` is what the spec generates, no C source or Python twin holds a
literal of its own for one, and the compiled ring encoder, log reader and Event builder behave as the spec says
(bytes read back with the spec's layout, limits probed on either side)."""

from __future__ import annotations

import ast
import collections
import dataclasses
import re
import struct
from pathlib import Path
from typing import Any

import pytest

import cptrace_otel
from cptrace_otel.model import grammar
from cptrace_otel.model.events import Event
from cptrace_otel.model.grammar import EVENT, LINE, RING, VALUE

PKG = Path(cptrace_otel.__file__).parent
SPEEDUPS = PKG / "_speedups"
_TOKEN = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_NUMBER = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)(?:[uUlL]*)(?![\w.])")
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+([^\n]+?)[ \t]*$", re.M)

# The C sources that read the record (fingerprint.c and idset.c hold no part of it).
GRAMMAR_C = ("ring.c", "ring.h", "hot.c", "logreader.c", "value.c", "value.h", "event.c", "event.h", "intake.c",
             "otlp.c")
# Numeric #defines these sources may keep: sizes private to one module, which no other code reads (why each).
PRIVATE_DEFINES = {
    "INTERN_SIZE": "logreader.c's table of interned keys and tags",
    "VC_SIZE": "value.c's cache of parsed value texts",
    "VC_MAXLEN": "the longest text value.c caches",
    "RNG_LABEL_MAX": "value.c's buffer of one rng label, checked against the Rng type's names at configure",
    "NAMES": "value.c's cache of the key and tag name strings the readers intern (a power of two: its hash mask)",
}
# String literals these sources may hold although the spec has the same text, each meaning something else (why).
OTHER_MEANING = {
    ("value.c", "rank"): "the name of an entry of the span readers' configure keys (its value is semconv.RANK, the "
                         "attribute key), not the record's rank field",
}
# The Python twins of the C modules, and the other Python readers and writers of the record.
TWINS = ("traced/ring.py", "export/ringread.py", "model/records.py", "model/logline.py", "traced/rendering.py",
         "analyze/sources/logs.py", "analyze/sources/detect.py", "export/file_sinks.py", "model/config.py",
         "_speedups/logreader.py", "_speedups/intake.py", "_speedups/hot.py", "_speedups/event.py",
         "_speedups/otlp.py")
WIRE_TWIN = "export/otlp_proto.py"   # the C OTLP encoder's twin: its bytes literals are the OTLP section's


def _distinctive_ints() -> set[int]:
    """Spec values too particular to turn up by chance in code that does not mean them."""
    return {RING.magic, RING.max_record, VALUE.max_value_chars, VALUE.max_int_digits}


def _spec_strings() -> tuple[set[str], set[str]]:
    """(texts no literal may contain, texts no literal may equal): the spec's markers, and its short names."""
    texts = {getattr(o, f.name) for o in grammar.SECTIONS.values() for f in dataclasses.fields(o)
             if isinstance(getattr(o, f.name), str) and not f.metadata["char"]}
    return {t for t in texts if not t.isalpha()}, {t for t in texts if t.isalpha()}


def _c_code(text: str) -> tuple[str, list[str]]:
    """A C source without its comments and literals (each literal left as a blank), and its string literals."""
    lits: list[str] = []

    def keep(m: re.Match[str]) -> str:
        t = m.group(0)
        if t.startswith('"'):
            lits.append(t[1:-1])
        return " " if t.startswith(("/", '"')) else "'?'" if t.startswith("'") else t

    return _TOKEN.sub(keep, text), lits


def _c_violations(name: str, text: str) -> list[str]:
    code, lits = _c_code(text)
    contain, equal = _spec_strings()
    bad = [f"{name}: the string {s!r} (the header's)" for s in lits
           if (s in equal or any(t in s for t in contain)) and (name, s) not in OTHER_MEANING]
    for d, value in _DEFINE.findall(code):
        if _NUMBER.fullmatch(value.strip("()")) and d not in PRIVATE_DEFINES:
            bad.append(f"{name}: #define {d} {value} (a number of its own: take it from grammar.h, or list it as "
                       "private with why)")
    nums = _distinctive_ints()
    bad += [f"{name}: the number {n}" for n in _NUMBER.findall(code) if int(n, 0) in nums]
    if name == "otlp.c":   # a hex number there is a protobuf tag, but for the varint and byte masks
        bad += [f"{name}: the tag {n}" for n in _NUMBER.findall(code)
                if n.lower().startswith("0x") and int(n, 16) not in (0x7F, 0x80, 0xFF)]
        bad += [f"{name}: the bytes {s!r}" for s in lits if "\\x" in s]
    if name == "ring.c":   # its value kinds are chars
        kinds = {f"'{getattr(RING, f.name)}'" for f in dataclasses.fields(RING) if f.metadata["char"]}
        bad += [f"{name}: the char {c}" for c in _TOKEN.findall(text) if c in kinds]
    return bad


def test_committed_header_is_the_generated_one() -> None:
    assert grammar.HEADER_PATH == SPEEDUPS / "grammar.h"
    assert grammar.HEADER_PATH.read_text(encoding="utf-8") == grammar.render_header(), \
        "grammar.h is stale: run python3 -m cptrace_otel.model.grammar --header (and rebuild the speedups)"
    from cptrace_otel.model.grammar.__main__ import main

    assert main(["--check"]) == 0


def test_header_holds_every_constant_under_its_section_name() -> None:
    text = grammar.render_header()
    defined = dict(_DEFINE.findall(text))
    assert defined["CPTRACE_RING_MAGIC"].split()[0] == f"{RING.magic:#x}ULL"
    assert defined["CPTRACE_LINE_MARKER"].split("/*")[0].strip() == f'"{LINE.marker}"'
    assert defined["CPTRACE_LINE_MARKER_LEN"].split()[0] == str(len(LINE.marker))
    assert defined["CPTRACE_RING_V_TRUE"].split()[0] == f"'{RING.v_true}'"
    assert defined["CPTRACE_EVENT_FIELDS_COUNT"].split()[0] == str(len(EVENT.fields))
    n = sum(len(dataclasses.fields(o)) for o in grammar.SECTIONS.values())
    assert len([d for d in defined if not d.endswith("_LEN")]) == n


def test_grammar_refuses_values_c_cannot_hold() -> None:
    @dataclasses.dataclass(frozen=True)
    class Bad:
        s: str = grammar._c("a quote", 'a"b')

    sections = dict(grammar.SECTIONS)
    try:
        grammar.SECTIONS["BAD"] = Bad()
        with pytest.raises(ValueError, match="plain C literal"):
            grammar.render_header()
    finally:
        grammar.SECTIONS.clear()
        grammar.SECTIONS.update(sections)


def test_scanner_sees_what_it_must() -> None:
    src = ('/* "[CPTRACE" 65536 */ #define MAXF 64\n#define ALIAS CPTRACE_RING_MAX_FIELDS\n'
           'x = find(s, "ATTN_CP", 7); y = PyUnicode_FromString("rank"); z = n < 65536; w = "ranks"; c = \'i\';'
           "if (c == ',') {}")
    got = _c_violations("ring.c", src)
    assert any("'ATTN_CP'" in b for b in got) and any("'rank'" in b for b in got)
    assert any("MAXF" in b for b in got) and not any("ALIAS" in b for b in got)
    assert sum("65536" in b for b in got) == 1 and not any("ranks" in b for b in got)
    assert any("the char 'i'" in b for b in got) and not any("','" in b for b in got)
    assert _c_violations("value.c", "#define VC_SIZE 4096\nint a = 0x32474e4952545043ULL;") == \
        ["value.c: the number 0x32474e4952545043"]
    assert _c_violations("otlp.c", 'p[n++] = 0x5a; v & 0x7F; put(b, "\\x0a\\x10", 2);') == \
        ["otlp.c: the tag 0x5a", "otlp.c: the bytes '\\\\x0a\\\\x10'"]


def test_c_sources_take_the_grammar_from_the_header() -> None:
    assert {p.name for p in SPEEDUPS.glob("*.[ch]")} >= set(GRAMMAR_C) | {"grammar.h"}
    bad = [b for n in GRAMMAR_C for b in _c_violations(n, (SPEEDUPS / n).read_text(encoding="utf-8"))]
    assert not bad, "C literals the record grammar declares (use grammar.h's names):\n  " + "\n  ".join(bad)
    users = [n for n in GRAMMAR_C if '#include "grammar.h"' in (SPEEDUPS / n).read_text(encoding="utf-8")]
    assert {"ring.c", "logreader.c", "value.c", "event.h", "intake.c"} <= set(users)


def _py_violations(rel: str, text: str | None = None, wire: bool = False) -> list[str]:
    """Literals of the spec in a Python module: markers, short names and distinctive numbers; with ``wire``, any
    bytes literal but the empty one (the protobuf tags and what follows them)."""
    tree = ast.parse((PKG / rel).read_text(encoding="utf-8") if text is None else text)
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    shifted = {id(n.left) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.LShift)}
    contain, equal = _spec_strings()
    nums = _distinctive_ints() | {RING.header_bytes}   # (256 is the size of a byte table in C: only checked here)
    bad = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Constant) or id(n) in docs:
            continue
        v = n.value
        if wire:
            if isinstance(v, bytes) and v:
                bad.append(f"{rel}:{n.lineno}: {v!r}")
        elif isinstance(v, str) and (v in equal - {LINE.rank_field, LINE.ts_field} or any(t in v for t in contain)):
            bad.append(f"{rel}:{n.lineno}: {v!r}")
        elif type(v) is int and v in nums and id(n) not in shifted:   # (256 << 10 is a size in KiB, not the header)
            bad.append(f"{rel}:{n.lineno}: {v}")
    return bad


def test_python_twins_take_the_grammar_from_the_spec() -> None:
    # (the fields "ts" and "rank" are read by name across the checks; here only their markers and numbers count)
    bad = [b for rel in TWINS for b in _py_violations(rel)] + _py_violations(WIRE_TWIN, wire=True)
    assert not bad, "literals the record grammar declares (import them from cptrace_otel.model.grammar):\n  " + \
        "\n  ".join(bad)


def test_python_scanner_sees_what_it_must() -> None:
    src = ('"""doc [CPTRACE"""\nA = "[CPTRACE x]"\nB = 65536\nC = 256 << 10\nD = "True"\nE = "rank"\nF = x[256]\n'
           'G = b""\nH = b"\\x5a"\n')
    assert _py_violations("p.py", src) == ["p.py:2: '[CPTRACE x]'", "p.py:3: 65536", "p.py:5: 'True'",
                                           "p.py:7: 256"]
    assert _py_violations("p.py", src, wire=True) == ["p.py:9: b'Z'"]


def test_event_layout_is_events() -> None:
    assert tuple(f.name for f in dataclasses.fields(Event)) == EVENT.fields
    from cptrace_otel._speedups.event import event_slots

    assert event_slots() == EVENT.fields


# -- the compiled modules against the spec ---------------------------------------------------------------------------

def _varint(b: bytes, i: int) -> tuple[int, int]:
    n = s = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return n, i


def _records(mm: bytes) -> list[tuple[int, int, bytes]]:
    """``(kind, nfields, body)`` of each record in a ring that has not wrapped, read with the spec's layout."""
    magic, cap = struct.unpack_from("<QQ", mm, 0)
    assert magic == RING.magic
    (write_pos,) = struct.unpack_from("<Q", mm, RING.producer_line)
    assert cap >= RING.min_cap and write_pos <= cap
    out, pos = [], 0
    while pos < write_pos:
        size, kind, nf = struct.unpack_from("<IHH", mm, RING.header_bytes + pos)
        assert size % RING.align == 0 and size >= RING.record_header
        out.append((kind, nf, bytes(mm[RING.header_bytes + pos + RING.record_header:RING.header_bytes + pos + size])))
        pos += size
    return out


def _ring() -> tuple[Any, collections.deque]:
    pytest.importorskip("cptrace_otel._speedups._hot")
    from cptrace_otel.traced.ring import Ring

    r = Ring(1 << 16)
    side: collections.deque = collections.deque()
    r.submit(side, 1 << 20, 1 << 40)
    return r, side


def test_ring_bytes_follow_the_spec() -> None:
    from cptrace_otel._speedups import _hot

    r, side = _ring()
    try:
        _hot.ring_put(2, "evict", {"a": -5, "b": 2.5, "c": "xy", "d": True, "e": False, "f": [1, 2]})
        _hot.ring_put(1, "evict", {"o": object()})   # another shape: a placeholder, the record in the side deque
        recs = _records(r.mm)
    finally:
        r.detach()
    assert [k for k, _, _ in recs] == [RING.kind_rec, RING.kind_ph] and len(side) == 1
    _, nf, body = recs[0]
    ts, level = struct.unpack_from("<qq", body, 0)
    assert nf == 6 and level == 2 and ts > 0
    n, i = _varint(body, 16)
    assert body[i:i + n] == b"evict"
    i += n
    kinds, values = [], []
    for _ in range(nf):
        n, i = _varint(body, i)
        kinds.append(chr(body[i + n]))
        i += n + 1
        if kinds[-1] in (RING.v_int, RING.v_float):
            values.append(struct.unpack_from("<q" if kinds[-1] == RING.v_int else "<d", body, i)[0])
            i += 8
        elif kinds[-1] == RING.v_str:
            n, i = _varint(body, i)
            values.append(body[i:i + n].decode())
            i += n
    assert kinds == [RING.v_int, RING.v_float, RING.v_str, RING.v_true, RING.v_false, RING.v_str]
    assert values == [-5, 2.5, "xy", "[1,2]"]
    assert len(recs[1][2]) + RING.record_header == RING.placeholder_bytes
    assert struct.unpack_from("<Q", recs[1][2], 0) == (0,)   # the first side id


def test_ring_reads_bools_back_as_the_spec_texts() -> None:
    from cptrace_otel.export.ringread import RingIntake

    r, _side = _ring()
    try:
        from cptrace_otel._speedups import _hot

        _hot.ring_put(1, "evict", {"t": True, "f": False})
        got = RingIntake(r.info()).take(final=True)
    finally:
        r.detach()
    assert got[0][3] == {"t": VALUE.true_text, "f": VALUE.false_text}


@pytest.mark.parametrize("limit", ["fields", "list"])
def test_ring_limits_are_the_spec_limits(limit: str) -> None:
    from cptrace_otel._speedups import _hot

    def record(n: int) -> dict:
        return {f"k{i}": i for i in range(n)} if limit == "fields" else {"chain": list(range(n))}

    cap = RING.max_fields if limit == "fields" else RING.max_list
    r, side = _ring()
    try:
        _hot.ring_put(1, "evict", record(cap))
        _hot.ring_put(1, "evict", record(cap + 1))
        kinds = [k for k, _, _ in _records(r.mm)]
    finally:
        r.detach()
    assert kinds == [RING.kind_rec, RING.kind_ph] and len(side) == 1


def test_c_log_reader_limits_are_the_spec_limits() -> None:
    _logreader = pytest.importorskip("cptrace_otel._speedups._logreader")
    from cptrace_otel._speedups.logreader import load

    assert load() is not None
    line = LINE.opening + "evict] " + LINE.ts_field + "={}"
    ok = _logreader.parse_line(line.format("1" * VALUE.max_int_digits))
    assert ok is not None and ok[2][LINE.ts_field] == int("1" * VALUE.max_int_digits)
    assert _logreader.parse_line(line.format("1" * (VALUE.max_int_digits + 1))) is None   # Python decides
    from cptrace_otel.checks.epochs import EPOCH_TAGS, EpochTracker
    from cptrace_otel.model.logline import Rng

    try:
        with pytest.raises(TypeError, match=f"at most {LINE.max_other_markers}"):
            _logreader.configure(Rng, Event, EpochTracker, EPOCH_TAGS, None,
                                 tuple(f"m{i}" for i in range(LINE.max_other_markers + 1)))
        _logreader.configure(Rng, Event, EpochTracker, EPOCH_TAGS, None,
                             tuple(f"m{i}" for i in range(LINE.max_other_markers)))
    finally:
        load()   # the loader's own configuration back


def test_log_reader_takes_ts_and_rank_where_the_spec_says(tmp_path: Path) -> None:
    pytest.importorskip("cptrace_otel._speedups._logreader")
    from cptrace_otel.analyze.sources import logs

    p = tmp_path / "x.log"
    p.write_text(f"[x {LINE.rank_prefix}3 TP3] {LINE.opening}evict] node_id=1 {LINE.ts_field}=7\n"
                 f"[x {LINE.rank_prefix}5 TP5] {LINE.opening}evict] node_id=2 {LINE.rank_field}=9 "
                 f"{LINE.ts_field}=8\n[x] {LINE.opening}evict] node_id=3\n", encoding="utf-8")
    assert sorted((e.rank, e.ts) for e in logs.read_log_events([str(p)])) == sorted(
        [(3, 7), (9, 8), (logs.default_rank(str(p), 0), 3)])


def _wire_type(fd: Any) -> int:
    """The protobuf wire type of a (non-packed) field: length-delimited, 64-bit, 32-bit or varint."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
        return 2
    return {F.TYPE_FIXED64: 1, F.TYPE_DOUBLE: 1, F.TYPE_SFIXED64: 1, F.TYPE_FIXED32: 5, F.TYPE_FLOAT: 5}.get(fd.type, 0)


def test_otlp_tags_are_opentelemetry_proto_s() -> None:
    from google.protobuf import descriptor_pool
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401 - registers the messages
    from opentelemetry.proto.trace.v1 import trace_pb2

    pool = descriptor_pool.Default()
    checked = 0
    for f in dataclasses.fields(grammar.OTLP):
        if "proto" not in f.metadata:
            continue
        message, name = f.metadata["proto"]
        fd = pool.FindMessageTypeByName("opentelemetry.proto." + message).fields_by_name[name]
        assert getattr(grammar.OTLP, f.name) == fd.number << 3 | _wire_type(fd), (message, name)
        checked += 1
    assert checked >= 30
    assert grammar.OTLP.kind_internal == trace_pb2.Span.SPAN_KIND_INTERNAL
    span = trace_pb2.Span(trace_id=b"t" * grammar.OTLP.trace_id_bytes, span_id=b"s" * grammar.OTLP.span_id_bytes)
    assert span.SerializeToString().startswith(bytes((grammar.OTLP.span_trace_id, grammar.OTLP.trace_id_bytes)))
