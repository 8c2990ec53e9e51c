"""The C reader of OTLP JSON lines (``_speedups/otlpjson.c``) against its Python twin, ``json.loads`` and
:func:`~cptrace_otel.analyze.sources.otlpfile.collect` (through ``collect_guarded``): for every line C answers, the
same records (every Event field and value with its type, in the same order under the same keys, by rank and by
(run, rank)) and the same run ids, streams, levels, sampling, span count and malformed reports; where C leaves a line
to Python it says so (None) and the file is read by the twin.

Lines come from Hypothesis (requests with AnyValues of every shape and of wrong JSON kinds, range summaries in and
out of order, finding events, events without seq, keys in other orders, snake_case names, several resources), the
same lines cut, with a byte changed or junk inserted; and from a real demo run (our exporter's file sink in real rank
processes), every line of which C must read itself, and ``check`` must report the same with C and with the twin.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cptrace_otel._speedups import twin_off
from cptrace_otel.analyze.sources import otlpfile
from cptrace_otel.analyze.sources.otlpfile import NOT_JSON, OtlpInfo, add_rows, collect_file, collect_guarded, loads
from cptrace_otel.model import semconv as sc
from cptrace_otel.model.attrs import RNG_SUFFIXES
from tests.helpers.otlp_twins import assert_file_alike, events_snapshot, info_snapshot

C = otlpfile.c_reader()
needs_c = pytest.mark.skipif(C is None and not os.environ.get("CPTRACE_REQUIRE_SPEEDUPS"),
                             reason="the C speedups are not built")
SRC = "run/rank-0.otlp.jsonl"


# -- comparing ---------------------------------------------------------------------------------------------------
def _snap(info: OtlpInfo, per_rank: dict, n: int) -> Any:
    return n, events_snapshot(per_rank), info_snapshot(info)


def py_line(line: str, by_run: bool) -> Any:
    info = OtlpInfo()
    info.by_run = by_run
    per_rank: dict = {}
    req = loads(line, SRC, 3, info)
    n = 0 if req is NOT_JSON else collect_guarded(req, SRC, 3, info, per_rank)
    return _snap(info, per_rank, n)


def py_malformed(line: str) -> list:
    info = OtlpInfo()
    req = loads(line, SRC, 3, info)
    if req is not NOT_JSON:
        collect_guarded(req, SRC, 3, info, {})
    return info.malformed


def c_line(line: str | bytes, by_run: bool) -> Any:
    assert C is not None
    rows = C(line, SRC)
    if rows is None:
        return None
    info = OtlpInfo()
    info.by_run = by_run
    per_rank: dict = {}
    n = add_rows(rows, SRC, info, per_rank)
    return _snap(info, per_rank, n)


def utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_alike(line: str) -> bool:
    """Assert C reads ``line`` as the twin does wherever it answers, given as text and as the bytes a file holds
    (``collect_file`` hands C the bytes, and the twin their text decoded with replacement characters); whether it
    answered."""
    read = False
    raw = line.encode("utf-8", "surrogatepass")
    for by_run in (False, True):
        got = c_line(line, by_run)
        if got is not None:
            want = py_line(line, by_run)
            assert got == want
            assert not py_malformed(line), "C answered a line the twin reports as malformed"
            read = True
        got_b = c_line(raw, by_run)
        if utf8(raw):   # the same text: read alike, or left to Python alike
            assert got_b == got
        else:           # (a lone surrogate's bytes: the twin reads the text with replacement characters)
            assert got_b is None
    return read


# -- generated requests --------------------------------------------------------------------------------------------
CLEAN_FIELD_KEYS = [sc.field_key("node_id"), sc.field_key("dev"), sc.field_key("why"), sc.field_key("")]
FIELD_KEYS = CLEAN_FIELD_KEYS + ["hicache"] + [sc.field_key("dev") + s for s in RNG_SUFFIXES]
META_KEYS = [sc.SEQ, sc.EPOCH, sc.LEVEL, "otel.other", sc.RANK]
# texts as the exporter writes them (no character JSON escapes), and others
CLEAN_TEXTS = ["", "abc", "12", "007", "-0", "(cnt=2,min=1,max=2,first=1,last=2)", "[1, 2]", "[]", "1.5", "x y",
               "caf\u00e9", "(none)", "ack", "H1,C3", "True", "1e5", "[a, 2]", "(cnt=1)"]
TEXTS = st.sampled_from(CLEAN_TEXTS + ["a\"b", "tab\there", "\u2028", "back\\slash"])
INTS = st.one_of(st.integers(-5, 5), st.integers(-(2**63), 2**63 - 1), st.integers(2**63, 2**70))


def any_value(clean: bool, kind: str | None = None) -> st.SearchStrategy:
    """An AnyValue in proto3 JSON: of the kind asked (the exporter's shape), or, unless ``clean``, of any shape."""
    texts = st.sampled_from(CLEAN_TEXTS) if clean else TEXTS
    good = {"s": texts.map(lambda s: {"stringValue": s}), "i": INTS.map(lambda i: {"intValue": str(i)}),
            "d": st.floats(allow_nan=False, allow_infinity=False).map(lambda f: {"doubleValue": f}),
            "b": st.booleans().map(lambda b: {"boolValue": b})}
    if clean:
        return good[kind] if kind else st.one_of(*good.values())
    odd = st.one_of(
        st.sampled_from([{}, {"stringValue": None}, {"intValue": "abc"}, {"intValue": " 7"}, {"intValue": "+3"},
                         {"intValue": "1_0"}, {"intValue": ""}, {"intValue": 1.5}, {"intValue": True},
                         {"intValue": "9" * 4400}, {"doubleValue": "NaN"}, {"doubleValue": "1.5"},
                         {"doubleValue": 12345678901234567}, {"boolValue": "yes"}, {"stringValue": 5},
                         {"string_value": "x"}, {"int_value": "4"}, {"kvlistValue": {"values": []}},
                         {"bytesValue": "AAE="}, {"stringValue": "a", "intValue": "1"},
                         {"intValue": "2", "extra": 1}, {"arrayValue": {}}, {"arrayValue": None},
                         {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "x"}]}},
                         {"arrayValue": {"values": [{"arrayValue": {"values": [{"boolValue": False}]}}]}},
                         {"arrayValue": {"other": 1}}, None, [], "text", 7]),
        INTS.map(lambda i: {"intValue": i}))
    return st.one_of(*good.values(), odd)


@st.composite
def attrs(draw: Any, keys: list[str], clean: bool, kinds: dict[str, str] | None = None) -> list:
    out = []
    for _ in range(draw(st.integers(0, 6))):
        key = draw(st.sampled_from(keys))
        kind = (kinds or {}).get(key)
        val = draw(any_value(clean, kind))
        a: Any = {"key": key, "value": val}
        if not clean:
            r = draw(st.integers(0, 30))
            if r == 0:
                a.pop(draw(st.sampled_from(["key", "value"])))
            elif r == 1:
                a = {"value": val, "key": key}
            elif r == 2:
                a["key"] = draw(st.sampled_from([None, 5, sc.field_key("n\u00e9")]))
            elif r == 3:
                a = draw(st.sampled_from([None, "x", [a]]))
        out.append(a)
    return out


META_KINDS = {sc.SEQ: "i", sc.EPOCH: "i", sc.LEVEL: "i", sc.RANK: "i", sc.CP_RANK: "i", sc.TRACE_LEVEL: "i",
              sc.RUN_ID: "s", sc.SERVICE_INSTANCE_ID: "s", sc.SAMPLE: "d"}


@st.composite
def events(draw: Any, clean: bool) -> Any:
    e: dict = {"timeUnixNano": str(draw(st.integers(0, 2**63))),
               "name": draw(st.sampled_from(["ack", "evict", "", sc.EVENT_VIOLATION, "caf\u00e9"]))}
    a = []
    if draw(st.integers(0, 4)):
        a.append({"key": sc.SEQ, "value": {"intValue": str(draw(st.integers(0, 50)))}})
    a += draw(attrs((CLEAN_FIELD_KEYS if clean else FIELD_KEYS) + META_KEYS, clean, META_KINDS))
    if draw(st.booleans()):   # a whole range summary in the exporter's order
        base = sc.field_key(draw(st.sampled_from(["dev", "idx"])))
        a += [{"key": base + s, "value": {"intValue": str(draw(st.integers(0, 9)))}} for s in RNG_SUFFIXES]
    if not clean and draw(st.integers(0, 5)) == 0:
        a = draw(st.permutations(a))
    e["attributes"] = a
    if not clean:
        r = draw(st.integers(0, 25))
        if r == 0:
            e.pop(draw(st.sampled_from(["timeUnixNano", "name", "attributes"])))
        elif r == 1:
            e["timeUnixNano"] = draw(st.sampled_from(["", "abc", " 5", None, 7, 1.5, "-3"]))
        elif r == 2:
            e["time_unix_nano"] = e.pop("timeUnixNano")
        elif r == 3:
            e["name"] = draw(st.sampled_from([None, 3, ["x"]]))
        elif r == 4:
            e = {k: e[k] for k in reversed(list(e))}
        elif r == 5:
            return draw(st.sampled_from([None, "e", 4]))
    return e


@st.composite
def spans(draw: Any, clean: bool) -> Any:
    sp: dict = {"traceId": "41daf77b1a75767521b05e6f1928baec", "spanId": "15f38ccc7817e782",
                "name": "rank 0 \u00b7 node", "kind": 1, "startTimeUnixNano": "1784343786000000000",
                "attributes": draw(attrs([sc.RANK, "cptrace.span.kind", "hicache.node_id"], clean, META_KINDS)),
                "events": draw(st.lists(events(clean), max_size=4)), "status": {}}
    if not clean:
        r = draw(st.integers(0, 12))
        if r == 0:
            sp = {k: sp[k] for k in reversed(list(sp))}   # the events before the attributes
        elif r == 1:
            sp.pop(draw(st.sampled_from(["attributes", "events"])))
        elif r == 2:
            sp[draw(st.sampled_from(["attributes", "events"]))] = draw(st.sampled_from([None, {}, "x"]))
        elif r == 3:
            return draw(st.sampled_from([None, 1, []]))
    return sp


@st.composite
def requests(draw: Any) -> tuple[Any, bool]:
    """``(request, clean)``: half the requests in the exporter's shape (clean), which C must read itself."""
    clean = draw(st.booleans())
    out = []
    for _ in range(draw(st.integers(0 if not clean else 1, 3))):
        res = {"attributes": draw(attrs([sc.CP_RANK, sc.RUN_ID, sc.TRACE_LEVEL, sc.SAMPLE, sc.SERVICE_INSTANCE_ID,
                                         "service.name"], clean, META_KINDS))}
        scopes = [{"scope": {"name": "cptrace_otel", "version": "0.1.0"},
                   "spans": draw(st.lists(spans(clean), max_size=3))} for _ in range(draw(st.integers(1, 2)))]
        rs: Any = {"resource": res, "scopeSpans": scopes}
        if not clean:
            r = draw(st.integers(0, 12))
            if r == 0:
                rs = {"scopeSpans": scopes, "resource": res, "schemaUrl": ""}   # the spans first
            elif r == 1:
                rs = {"resource": res, "scope_spans": scopes}
            elif r == 2:
                rs = {"resource": draw(st.sampled_from([None, [], {}, "r"])), "scopeSpans": scopes}
            elif r == 3:
                rs = draw(st.sampled_from([None, [], 3]))
            elif r == 4:
                scopes.append(draw(st.sampled_from([{}, {"spans": None}, {"spans": {}}, "s"])))
        out.append(rs)
    req: Any = {"resourceSpans": out}
    if not clean and draw(st.integers(0, 15)) == 0:
        req = draw(st.sampled_from([{"resource_spans": out}, {"resourceSpans": None}, {}, [req], "x"]))
    return req, clean


def dumps(req: Any, how: int) -> str:
    """The request as one line: compact, spaced, or with every non-ASCII character escaped."""
    if how == 0:
        return json.dumps(req, separators=(",", ":"), ensure_ascii=False) + "\n"
    if how == 1:
        return " " + json.dumps(req, ensure_ascii=False) + " \r\n"
    return json.dumps(req) + "\n"


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@needs_c
@SETTINGS
@given(requests(), st.integers(0, 2))
def test_generated_lines_read_alike(req_clean, how):
    req, clean = req_clean
    read = check_alike(dumps(req, how))
    if clean and how < 2:   # (escaped non-ASCII texts are left to the twin)
        assert read, "C left a line of the exporter's shape to Python"


@needs_c
@SETTINGS
@given(requests(), st.data())
def test_broken_lines_read_or_refused_alike(req_clean, data):
    line = dumps(req_clean[0], data.draw(st.integers(0, 2)))
    how = data.draw(st.sampled_from(["cut", "char", "junk", "dup", "nan"]))
    i = data.draw(st.integers(0, max(0, len(line) - 1)))
    if how == "cut":
        line = line[:i]
    elif how == "char":
        line = line[:i] + data.draw(st.sampled_from(['"', "\\", "{", "]", ",", "0", "\x00", "\ufffd", " "])) + \
            line[i + 1:]
    elif how == "junk":
        line = line[:i] + data.draw(st.sampled_from(["NaN", "\\u00e9", ",", "01", "\x01", "\ud800"])) + line[i:]
    elif how == "dup":   # a key given twice: json keeps the last
        line = line.replace('"attributes":', '"attributes":[],"attributes":', 1)
    else:
        line = line.replace('{"doubleValue":', '{"doubleValue":NaN,"x":', 1)
    check_alike(line)


# bytes between JSON delimiters: no quote, backslash or control character
TEXT_BYTES = st.binary(max_size=12).map(lambda b: bytes(x for x in b if x >= 0x20 and x not in b'"\\'))


@needs_c
@settings(max_examples=600, deadline=None)
@given(TEXT_BYTES, st.sampled_from([b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xed\xa0\x80",
                                    b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xc3", b"\xff", b""]))
def test_bytes_are_read_exactly_when_they_are_utf8(junk, odd):
    """A line given as bytes is read by C only when it is UTF-8 as Python's strict decoder takes it (no overlong
    forms, no encoded surrogates, nothing past U+10FFFF, no cut sequence); else Python decodes its text."""
    text = junk + odd + junk
    line = b'{"x":"' + text + b'","resourceSpans":[]}'
    assert (C(line, SRC) is not None) == utf8(text), text
    if utf8(text):
        assert C(line, SRC) == C(line.decode(), SRC) == []


BREAKS = st.sampled_from(["\n", "\r\n", "\r", ""])
FILE_LINES = st.lists(st.tuples(st.sampled_from(["", " ", "\x1c", "\u00a0", "\t", "x", "{}", "caf\u00e9",
                                                 "\ud800", "{\"a\":1}"]), BREAKS), max_size=12)


@settings(max_examples=300, deadline=None)
@given(parts=FILE_LINES, invalid=st.booleans(), block=st.sampled_from([1, 2, 3, 7, 4 << 20]))
def test_lines_read_as_bytes_are_the_text_lines_of_the_file(parts, invalid, block, tmp_path_factory):
    """collect_file reads a file's bytes (byte_lines): its lines, numbered and split (at \\n, \\r\\n, \\r) and
    decoded (replacement characters for what is not UTF-8) as text_lines reads the same file's text, blank lines
    left out alike, whatever the size of the blocks it reads the file in."""
    from cptrace_otel.analyze.sources.inputs import open_text
    from cptrace_otel.analyze.sources.otlpfile import byte_lines, text_lines

    data = "".join(a + b for a, b in parts).encode("utf-8", "surrogatepass") + (b"\xff\xfe" if invalid else b"")
    p = tmp_path_factory.mktemp("lines") / "f.jsonl"
    p.write_bytes(data)
    with open_text(str(p)) as fh:
        want = list(text_lines(fh, str(p), OtlpInfo()))
    with open_text(str(p)) as fh:
        got = [(n, str(b, "utf-8", "replace")) for n, b in byte_lines(fh.buffer, str(p), OtlpInfo(), block)]
    assert [(n, t) for n, t in got if t.strip()] == want


def _readline_lines(data: bytes, limit: int) -> tuple[list, list]:
    """The lines and the too-long lines' numbers of ``data`` as byte_lines read them with ``readline(limit)``, one
    bytes object a line (the specification of its rule for long lines)."""
    fh, out, long_ones, n = io.BytesIO(data), [], [], 0
    while raw := fh.readline(limit):
        if len(raw) >= limit and raw[-1] != 10:
            n += 1
            long_ones.append(n)
            while raw and raw[-1] != 10:
                raw = fh.readline(limit)
            continue
        for line in raw.splitlines(keepends=True) if b"\r" in raw else (raw,):
            n += 1
            out.append((n, line))
    return out, long_ones


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([b"\n", b"\r\n", b"\r", b"", b"x\ry\n"])),
                      max_size=10),
       limit=st.integers(1, 24), block=st.integers(1, 24))
def test_byte_lines_reads_long_lines_in_any_block_size_as_readline_did(parts, limit, block):
    """Lines longer than the limit (with or without an end, at the file's end too) are reported once, with their
    number, and skipped to their end; the others are given whole, however the blocks cut them."""
    from cptrace_otel.analyze.sources.otlpfile import byte_lines

    data = b"".join(b"a" * k + end for k, end in parts)
    want, long_ones = _readline_lines(data, limit)
    info = OtlpInfo()
    got = [(n, bytes(b)) for n, b in byte_lines(io.BytesIO(data), "f.jsonl", info, block, limit)]
    assert got == want
    assert [line for _p, line, _why in info.malformed] == long_ones


# -- shapes C must read itself, and those it leaves ---------------------------------------------------------------
def exporter_line(seq0: int = 5, rank: int = 1) -> dict:
    """A request in the exporter's shape: a resource with run id, rank, level and sampling; a span with a finding
    event, a record with a range summary, a big fingerprint, a list text, a float, and an event without seq."""
    iv = lambda v: {"intValue": str(v)}   # noqa: E731
    dev = [{"key": sc.field_key("dev") + s, "value": iv(v)} for s, v in zip(RNG_SUFFIXES, (4, 8, 11, 8, 11),
                                                                             strict=True)]
    rec = [{"key": sc.field_key("node_id"), "value": iv(7)},
           {"key": sc.field_key("h"), "value": iv(9223372036854775807)},
           {"key": sc.field_key("policy"), "value": {"stringValue": "wt"}},
           {"key": sc.field_key("pub"), "value": {"stringValue": "[7,8]"}},
           {"key": sc.field_key("ratio"), "value": {"doubleValue": 0.25}}, *dev,
           {"key": sc.SEQ, "value": iv(seq0)}, {"key": sc.EPOCH, "value": iv(2)}, {"key": sc.LEVEL, "value": iv(2)}]
    span = {"traceId": "0af7", "spanId": "b7ad", "name": "rank 1 \u00b7 node", "kind": 1,
            "startTimeUnixNano": "1784343786000000000", "endTimeUnixNano": "1784343786000000000",
            "attributes": [{"key": sc.RANK, "value": iv(rank)},
                           {"key": sc.VIOLATION, "value": {"stringValue": "H1"}}],
            "events": [{"timeUnixNano": "1784343786000000001", "name": "backup", "attributes": rec},
                       {"timeUnixNano": "1784343786000000002", "name": sc.EVENT_VIOLATION,
                        "attributes": [{"key": "code", "value": {"stringValue": "H1"}}]},
                       {"timeUnixNano": "1784343786000000003", "name": "x", "attributes": []}],
            "status": {"code": 2}}
    res = {"attributes": [{"key": "service.name", "value": {"stringValue": "sglang-hicache"}},
                          {"key": sc.SERVICE_INSTANCE_ID, "value": {"stringValue": "host:1"}},
                          {"key": sc.CP_RANK, "value": iv(rank)}, {"key": sc.RUN_ID, "value": {"stringValue": "r-a"}},
                          {"key": sc.TRACE_LEVEL, "value": iv(2)}, {"key": sc.SAMPLE, "value": {"doubleValue": 0.5}}]}
    return {"resourceSpans": [{"resource": res, "scopeSpans": [{"scope": {"name": "cptrace_otel"}, "spans": [span]}]}]}


@needs_c
def test_our_shape_is_read_in_c():
    line = json.dumps(exporter_line(), separators=(",", ":"), ensure_ascii=False) + "\n"
    assert check_alike(line)
    (res, spans_n, ranks, records), = C(line, SRC)
    assert (res[sc.RUN_ID], spans_n, ranks, list(records)) == ("r-a", 1, [1], [1])
    (epoch, seq, ts, ev), = records[1]   # the finding event and the event without seq are no records
    assert (epoch, seq, ts, ev.tag, ev.src) == (2, 5, 1784343786000000001, "backup", SRC)
    assert ev.fields["h"] == 9223372036854775807 and ev.fields["pub"] == [7, 8] and ev.fields["dev"].cnt == 4
    assert ev.fields["ratio"] == 0.25 and type(ev.fields["node_id"]) is int


@needs_c
def test_list_values_are_read_in_c_whole():
    """A field written as an ``arrayValue`` (what another producer writes for a list): C reads every value of it,
    nested lists too, as the twin does."""
    req = exporter_line()
    rec = req["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"][0]["attributes"]
    iv = lambda v: {"intValue": str(v)}   # noqa: E731
    rec.append({"key": sc.field_key("pub"), "value": {"arrayValue": {"values": [iv(7), iv(8), iv(9)]}}})
    rec.append({"key": sc.field_key("hp"), "value": {"arrayValue": {"values": [
        {"stringValue": "a"}, {"arrayValue": {"values": [iv(1), {"boolValue": True}]}}, {"arrayValue": {}}]}}})
    line = json.dumps(req)
    assert check_alike(line)
    (_res, _n, _ranks, records), = C(line, SRC)
    ev = records[1][0][3]
    assert ev.fields["pub"] == [7, 8, 9] and ev.fields["hp"] == ["a", [1, True], []]


@needs_c
def test_what_c_leaves_to_python():
    """Shapes C does not read itself: it says so (None) rather than read them differently."""
    base = exporter_line()
    line = json.dumps(base)
    assert C(line, SRC) is not None
    for old, new in [('"wt"', '"w\\u0074"'),                          # an escape in a value C keeps
                     ('"resourceSpans"', '"resource_spans"'),         # the original field names
                     ('"intValue": "7"', '"intValue": " 7"'),         # int() of a padded text
                     ('{"doubleValue": 0.25}', '{"doubleValue": "NaN"}'),
                     ('"name": "backup"', '"name": "backup", "name": "b"')]:   # a key twice: json keeps the last
        odd = line.replace(old, new, 1)
        assert odd != line and C(odd, SRC) is None, old
        check_alike(odd)
    assert C(line + " x", SRC) is None and C("[1]", SRC) is None and C("{", SRC) is None


@needs_c
@pytest.mark.parametrize("key", [sc.SEQ, sc.EPOCH, sc.LEVEL, "rank", "cp_rank", sc.TRACE_LEVEL, sc.RUN_ID, sc.SAMPLE])
@pytest.mark.parametrize("value", [{"boolValue": True}, {"doubleValue": 1.0}, {"stringValue": "1"},
                                   {"intValue": "-1"}, {"arrayValue": {"values": [{"intValue": "1"}]}}])
def test_values_of_another_type_where_collect_reads_them(key, value):
    """A seq, epoch, level, rank, run id, trace level or sampling fraction of another type than the exporter's
    (a bool is no int there, an int no float): C reads the line itself, as collect does."""
    req = exporter_line()
    rs = req["resourceSpans"][0]
    where = {"rank": rs["scopeSpans"][0]["spans"][0]["attributes"],
             "cp_rank": rs["resource"]["attributes"]}.get(key)
    if where is None:
        where = (rs["scopeSpans"][0]["spans"][0]["events"][0]["attributes"]
                 if key in (sc.SEQ, sc.EPOCH, sc.LEVEL) else rs["resource"]["attributes"])
    name = {"rank": sc.RANK, "cp_rank": sc.CP_RANK}.get(key, key)
    for a in where:
        if a["key"] == name:
            a["value"] = value
    assert check_alike(json.dumps(req))


@needs_c
def test_the_spans_before_their_resource_and_the_events_before_their_attributes():
    """Keys in another order than the encoders write them (the rank of a span is only known after its attributes
    and its resource) are read in C all the same."""
    req = exporter_line()
    rs = req["resourceSpans"][0]
    sp = rs["scopeSpans"][0]["spans"][0]
    rs["scopeSpans"][0]["spans"][0] = {k: sp[k] for k in reversed(list(sp))}
    req["resourceSpans"][0] = {"scopeSpans": rs["scopeSpans"], "resource": rs["resource"]}
    assert check_alike(json.dumps(req))


# -- files ---------------------------------------------------------------------------------------------------------
@needs_c
def test_a_file_with_bad_lines_reads_alike(tmp_path):
    """Blank, not-JSON, wrong-shape, over-long and CRLF lines among good ones: the same records and reports."""
    good = [json.dumps(exporter_line(seq, rank)) for seq, rank in ((1, 0), (2, 1), (3, 0))]
    lines = [good[0], "", "not json", '{"resourceSpans": [1]}', good[1] + "\r", "  ", good[2], '{"resourceSpans":']
    p = tmp_path / "f.otlp.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = assert_file_alike(str(p))
    assert got["answered"] == 3 and got["events"] == 3 and len(got["malformed"]) == 3


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from tests.helpers.demo_run import run_demo

    return run_demo(tmp_path_factory.mktemp("demo"), ranks=2)


@needs_c
def test_a_real_runs_files_are_read_in_c_alike(demo):
    """Our exporter's file sink in real rank processes: C reads every line itself, as the twin reads it."""
    for path in demo["otlp"]:
        got = assert_file_alike(path)
        assert got["events"] > 100 and got["answered"] == got["lines"], got


@needs_c
def test_check_reports_the_same_with_either_reader(demo):
    """``check`` over the run's OTLP files: the same report (findings with their evidence, stats, unchecked) with
    the C reader and with the Python twin, and the run's faults are found."""
    from tests.helpers.demo_run import check

    rc, out, _err = check("--json", *demo["otlp"])
    with twin_off(vars(otlpfile), "C_READER"):
        rc_py, out_py, _err_py = check("--json", *demo["otlp"])
    assert (rc, json.loads(out)) == (rc_py, json.loads(out_py))
    assert rc == 1 and json.loads(out)["findings"]


def test_the_twin_alone_reads_a_file(tmp_path):
    """Without the C reader (a machine without a compiler), collect_file reads the same file by itself."""
    p = tmp_path / "f.otlp.jsonl"
    p.write_text(json.dumps(exporter_line()) + "\n", encoding="utf-8")
    with twin_off(vars(otlpfile), "C_READER"):
        info, per_rank = OtlpInfo(), {}
        collect_file(str(p), info, per_rank)
    (ev,) = [t[3] for lst in per_rank.values() for t in lst]
    assert (ev.tag, ev.rank, ev.seq) == ("backup", 1, 5) and info.run_ids == {"r-a"}
