"""The C reader of Jaeger search answers (``_speedups/jaegerin.c``) against its Python twin: the index of an answer
against :func:`~cptrace_otel.analyze.sources.jaegerstream.iter_data` (the same traces, ids, span starts and text, no
error or Unread where C answers), and each trace's rows against
:func:`~cptrace_otel.analyze.jaeger_read.records_py` (every Event field and value with its type, the span rows, the
run ids; no Python error where C answers), on Hypothesis-generated answers: tags of every type with values of the
matching and of other JSON kinds (int64 past 2^53 written as strings, as Jaeger writes them), record texts of every
value shape, range summaries in and out of the exporter's order, logs without seq, finding events, the checker's own
service, inline and missing processes; the same answers truncated, with a byte changed or junk inserted. Where C
leaves an answer to Python, :func:`~cptrace_otel.analyze.jaeger_read.read` must still give the twin's rows.

Our exporter's spans as the real Jaeger returns them are held equal in tests/integration/test_watch_reader.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cptrace_otel.analyze import jaeger_read
from cptrace_otel.analyze.incremental import WATCH_SERVICE
from cptrace_otel.analyze.jaeger_read import records_py
from cptrace_otel.analyze.sources.httpio import BackendError
from cptrace_otel.analyze.sources.jaegerstream import TraceText, Unread, iter_data
from cptrace_otel.model import semconv as sc
from cptrace_otel.model.attrs import RNG_SUFFIXES
from tests.unit.test_otlp_intake_c import typed

C = jaeger_read.C_READER
needs_c = pytest.mark.skipif(C is None and not os.environ.get("CPTRACE_REQUIRE_SPEEDUPS"),
                             reason="the C speedups are not built")
MAX_ITEM = 1 << 20


# -- comparing ---------------------------------------------------------------------------------------------------
def rows_snapshot(got: tuple[list[str], list]) -> Any:
    run_ids, rows = got

    def ev(e: Any) -> Any:
        return (e.tag, typed(e.rank), typed(e.seq), typed(e.ts), typed(e.epoch), typed(e.level), e.src, e.line_no,
                typed(e.fields))

    return (sorted(set(run_ids)), [tuple(typed(x) for x in r[:8]) + ([ev(e) for e in r[8]],) for r in rows])


def py_rows(trace: Any) -> Any:
    try:
        return rows_snapshot(records_py(trace))
    except Exception as e:   # noqa: BLE001 (the twin's error, whatever it is, must not be a C answer)
        return ("error", type(e).__name__)


def py_index(body: bytes) -> Any:
    """What the stream parse hands out for ``body``: [(item, text) | Unread], or ("error", message)."""
    try:
        return list(iter_data(body.decode("utf-8", "replace"), "u", True, MAX_ITEM))
    except BackendError as e:
        return ("error", str(e))


def check_alike(body: bytes) -> int:
    """Assert the C index and reader agree with the twins on ``body``; the traces C read itself."""
    assert C is not None
    idx = C.index(body, MAX_ITEM)
    py = py_index(body)
    read = 0
    if idx is not None:
        assert isinstance(py, list), py
        assert len(idx) == len(py)
        for (tid, starts, a, b), got in zip(idx, py, strict=True):
            assert not isinstance(got, Unread)
            item, _text = got
            assert json.loads(body[a:b].decode("utf-8", "replace")) == item
            assert tid == item.get("traceID")
            assert starts == [sp.get("startTime", 0) for sp in item.get("spans") or []]
    for got in py if isinstance(py, list) else ():
        if isinstance(got, Unread):
            continue
        item, text = got
        raw = text.encode()
        c = C.records(raw)
        want = py_rows(item)
        if c is not None:
            assert want[0] != "error", want
            assert rows_snapshot(c) == want
            read += 1
        # the path watch takes (C, or the twin where C leaves the text to Python) always gives the twin's rows
        try:
            via = rows_snapshot(jaeger_read.read(TraceText(item.get("traceID"), [], raw)))
        except Exception as e:   # noqa: BLE001
            via = ("error", type(e).__name__)
        assert via == want
    return read


# -- generated answers ---------------------------------------------------------------------------------------------
FIELD_KEYS = [sc.field_key("node_id"), sc.field_key("dev"), sc.field_key("why")] + \
    [sc.field_key("dev") + s for s in RNG_SUFFIXES] + [sc.field_key("host") + s for s in RNG_SUFFIXES]
META_KEYS = [sc.SEQ, sc.EPOCH, sc.LEVEL, "event", "event", "otel.other"]
TEXTS = st.sampled_from(["", "abc", "12", "007", "-0", "(cnt=2,min=1,max=2,first=1,last=2)", "[1, 2]", "[]",
                         "1.5", "x y", "caf\u00e9", "(none)", "a\"b", "ack", "evict", "H1,C3", "True"])


def tag_value(kind: str) -> st.SearchStrategy:
    ints = st.one_of(st.integers(-5, 5), st.integers(-(2**63), 2**63 - 1), st.integers(2**53, 2**64))
    good = {"string": TEXTS, "int64": st.one_of(ints, ints.map(str)), "float64": st.floats(allow_nan=False,
            allow_infinity=False) | st.integers(-9, 9), "bool": st.booleans()}
    return st.one_of(good.get(kind, TEXTS), st.none(), TEXTS, ints, st.booleans(), st.lists(st.integers(), max_size=2))


@st.composite
def tags(draw: Any, keys: list[str], clean: bool = False) -> list[dict]:
    out = []
    once = draw(st.permutations(keys))   # (the exporter writes each key once)
    for i in range(draw(st.integers(0, len(keys) if clean else 6))):
        kind = draw(st.sampled_from(["string", "int64", "float64", "bool", "float", ""]))
        good = clean or draw(st.integers(0, 9)) > 0
        key = once[i] if clean else draw(st.sampled_from(keys))
        if key in (sc.SEQ, sc.EPOCH, sc.LEVEL, sc.RANK, sc.CP_RANK, sc.TRACE_LEVEL) and good:
            kind = "int64"
        elif key in (sc.VIOLATION, sc.RUN_ID, "event") and good:
            kind = "string"
        fine = {"string": TEXTS.filter(lambda x: not clean or '"' not in x),
                "int64": st.integers(-3, 2**64).map(lambda i: str(i) if i > 2**53 else i),   # (as Jaeger writes)
                "float64": st.floats(allow_nan=False, allow_infinity=False), "bool": st.booleans()}
        val = draw(tag_value(kind) if not good else fine.get(kind, TEXTS))
        t = {"key": key, "type": kind, "value": val}
        if not clean and draw(st.integers(0, 20)) == 0:
            t.pop(draw(st.sampled_from(["key", "type", "value"])))
        out.append(t)
    return out


@st.composite
def logs(draw: Any, clean: bool = False) -> dict:
    name = draw(st.sampled_from(["ack", "evict", "", sc.EVENT_VIOLATION]))
    fields = [{"key": "event", "type": "string", "value": name}]
    if draw(st.integers(0, 4)):
        fields.append({"key": sc.SEQ, "type": "int64", "value": draw(st.integers(0, 50))})
    fields += draw(tags(FIELD_KEYS + META_KEYS, clean))
    if draw(st.booleans()):   # a whole range summary in the exporter's order
        base = sc.field_key(draw(st.sampled_from(["dev", "idx"])))
        fields += [{"key": base + s, "type": "int64", "value": draw(st.integers(0, 9))} for s in RNG_SUFFIXES]
    fields = draw(st.permutations(fields)) if not clean and draw(st.integers(0, 5)) == 0 else fields
    log: dict = {"timestamp": draw(st.integers(0, 2**52)), "fields": fields}
    if not clean and draw(st.integers(0, 10)) == 0:
        log.pop(draw(st.sampled_from(["timestamp", "fields"])))
    return log


@st.composite
def traces(draw: Any) -> dict:
    clean = draw(st.booleans())   # half the traces of the exporter's shape: C must read them itself
    tid = draw(st.sampled_from(["0af7651916cd43dd8448eb211c80319c", "", "ab"]))
    procs = {}
    for i in range(draw(st.integers(1 if clean else 0, 3))):
        procs[f"p{i + 1}"] = {"serviceName": draw(st.sampled_from([sc.DEFAULT_SERVICE_NAME, WATCH_SERVICE])),
                              "tags": draw(tags([sc.CP_RANK, sc.RUN_ID, sc.TRACE_LEVEL, "host.name"], clean))}
    spans = []
    for _ in range(draw(st.integers(0, 4))):
        sp: dict = {"traceID": tid, "spanID": draw(st.sampled_from(["b7ad6b7169203331", "00f067aa0ba902b7"])),
                    "operationName": "rank 0 \u00b7 node", "references": [], "startTime": draw(st.integers(0, 2**52)),
                    "duration": 5, "tags": draw(tags([sc.RANK, sc.VIOLATION, "span.kind"], clean)),
                    "logs": draw(st.lists(logs(clean), max_size=4)),
                    "processID": draw(st.sampled_from(["p1", "p2", "p3"][:max(1, len(procs)) if clean else 3])),
                    "warnings": None}
        if not clean and draw(st.integers(0, 15)) == 0:
            sp["process"] = procs.get("p1", {"serviceName": "x", "tags": []})
        if not clean and draw(st.integers(0, 15)) == 0:
            sp.pop(draw(st.sampled_from(["processID", "startTime", "logs", "tags", "traceID"])))
        spans.append(sp)
    return {"traceID": tid, "spans": spans, "processes": procs, "warnings": None}


def answer(trs: list[dict], compact: bool) -> bytes:
    doc = {"data": trs, "total": 0, "limit": 0, "offset": 0, "errors": None}
    return json.dumps(doc, separators=(",", ":") if compact else None, ensure_ascii=False).encode()


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@needs_c
@SETTINGS
@given(st.lists(traces(), max_size=3), st.booleans())
def test_generated_answers_read_alike(trs, compact):
    check_alike(answer(trs, compact))


@needs_c
@SETTINGS
@given(st.lists(traces(), min_size=1, max_size=2), st.data())
def test_broken_answers_read_or_refused_alike(trs, data):
    body = bytearray(answer(trs, data.draw(st.booleans())))
    how = data.draw(st.sampled_from(["cut", "byte", "junk", "text"]))
    i = data.draw(st.integers(0, len(body) - 1))
    if how == "cut":
        body = body[:i]
    elif how == "byte":
        body[i] = data.draw(st.integers(0, 255))
    elif how == "junk":
        body[i:i] = data.draw(st.sampled_from([b"NaN", b"\\u00e9", b",", b"]", b"{", b'"', b"\x00", b"\xff", b"01"]))
    else:
        body = bytearray(bytes(body).replace(b'"errors":null', b'"errors":[{"msg":"bad"}]').replace(
            b'"int64"', data.draw(st.sampled_from([b'"int"', b'"int64"']))))
    check_alike(bytes(body))


# -- shapes C must read itself -------------------------------------------------------------------------------------
def exporter_trace(seq0: int) -> dict:
    """A trace in the shape Jaeger returns our exporter's spans: processID, a run id and rank on the process, big
    fingerprints as strings, a range summary, a finding event, a log without seq."""
    dev = [{"key": sc.field_key("dev") + s, "type": "int64", "value": v}
           for s, v in zip(RNG_SUFFIXES, (4, 8, 11, 8, 11), strict=True)]
    rec = [{"key": "event", "type": "string", "value": "backup"},
           {"key": sc.field_key("node_id"), "type": "int64", "value": 7},
           {"key": sc.field_key("h"), "type": "int64", "value": "12345678901234567890"},
           {"key": sc.field_key("policy"), "type": "string", "value": "wt"},
           {"key": sc.field_key("pub"), "type": "string", "value": "[7,8]"}, *dev,
           {"key": sc.SEQ, "type": "int64", "value": seq0},
           {"key": sc.EPOCH, "type": "int64", "value": 0}, {"key": sc.LEVEL, "type": "int64", "value": 1}]
    finding = [{"key": "event", "type": "string", "value": sc.EVENT_VIOLATION},
               {"key": "code", "type": "string", "value": "H1"}]
    span = {"traceID": "0af7", "spanID": "b7ad", "operationName": "rank 1 \u00b7 d2h", "references": [],
            "startTime": 1796540285200792, "duration": 10, "processID": "p1", "warnings": None,
            "tags": [{"key": sc.RANK, "type": "int64", "value": 1},
                     {"key": sc.VIOLATION, "type": "string", "value": "H1,ZERO"},
                     {"key": "otel.status_code", "type": "string", "value": "ERROR"}],
            "logs": [{"timestamp": 1796540285200793, "fields": rec}, {"timestamp": 1796540285200794, "fields": finding},
                     {"timestamp": 1796540285200795, "fields": [{"key": "event", "type": "string", "value": "x"}]}]}
    proc = {"serviceName": sc.DEFAULT_SERVICE_NAME, "tags": [
        {"key": sc.CP_RANK, "type": "int64", "value": 1}, {"key": sc.RUN_ID, "type": "string", "value": "run-a"},
        {"key": sc.TRACE_LEVEL, "type": "int64", "value": 3}, {"key": "host.name", "type": "string", "value": "h"}]}
    return {"traceID": "0af7", "spans": [span], "processes": {"p1": proc}, "warnings": None}


@needs_c
def test_our_shape_is_read_in_c():
    body = answer([exporter_trace(5), exporter_trace(6)], compact=True)
    assert check_alike(body) == 2   # both traces read by C itself, equal to the twin
    run_ids, rows = C.records(json.dumps(exporter_trace(5)).encode())
    assert run_ids == ["run-a"]
    (service, rank, codes, _tid, _sid, _start, levels, seqs, events), = rows
    assert (service, rank, codes, levels, seqs) == (sc.DEFAULT_SERVICE_NAME, 1, "H1,ZERO", (1, 3), [5, None, None])
    (ev,) = events   # the finding event and the log without seq are no records
    assert ev.fields["h"] == 12345678901234567890 and ev.fields["pub"] == [7, 8] and ev.fields["dev"].cnt == 4


@needs_c
def test_what_c_leaves_to_python():
    """Shapes C does not read itself: it says so (None) rather than read them differently."""
    tr = exporter_trace(5)
    assert C.records(json.dumps(tr).encode()) is not None
    odd = json.loads(json.dumps(tr))
    odd["spans"][0]["logs"][0]["fields"][1]["value"] = "\u00e9\\n"   # an escape in a value C keeps
    assert C.records(json.dumps(odd).encode()) is None
    inline = json.loads(json.dumps(tr))
    inline["spans"][0]["process"] = inline["processes"]["p1"]
    assert C.records(json.dumps(inline).encode()) is None
    body = answer([tr], compact=True)
    assert C.index(body, MAX_ITEM) is not None
    assert C.index(body, 100) is None   # longer than max_item: the twin hands it out as Unread
    assert C.index(body.replace(b'"errors":null', b'"errors":[{"msg":"x"}]'), MAX_ITEM) is None
    assert C.index(b'{"total":0,"data":[]}', MAX_ITEM) is None   # another layout: parsed whole by the twin


@needs_c
def test_strings_are_scanned_alike_at_every_offset_of_a_16_byte_block():
    """The string scan takes 16 bytes at a time where it can (SSE2): a quote, a backslash escape, a raw control
    character or a non-ASCII byte at each position of strings up to 40 bytes long, ending at the answer's last bytes
    too, is read (or refused) as the Python twin reads it."""
    specials = ['\\"', "\\\\", "\\n", "\\u00e9", "\u00e9", "\x01", "\x1f", " ", "\x7f"]
    for n in range(0, 41, 3):
        for sp in specials:
            for at in sorted({0, n // 2, n}):
                text = "a" * at + sp + "b" * (n - at)
                for where in ("value", "key"):
                    tr = exporter_trace(5)
                    if where == "value":
                        raw = json.dumps(tr).replace('"value": "wt"', f'"value": "{text}"')
                    else:
                        raw = json.dumps(tr).replace('"host.name"', f'"{text}"')
                    check_alike(answer_text([raw]))
                    check_alike(answer_text([raw], tail=False))


def answer_text(traces: list[str], tail: bool = True) -> bytes:
    """An answer holding the traces' JSON texts as written (control characters unescaped included); without
    ``tail`` the answer ends at the last trace's closing bracket (no bytes for a 16-byte read past a string)."""
    body = '{"data":[' + ",".join(traces) + "]"
    return (body + (',"total":0,"limit":0,"offset":0,"errors":null}' if tail else "}")).encode()
