"""The record grammar in one place: every constant that more than one encoder or decoder of a record must agree on.

A record is one ``cptrace(level, tag, **fields)`` call. It is written and read in several places: the Python record
builder (:mod:`cptrace_otel.model.records`), the C ring encoder and its reader (``_speedups/ring.c``, the traced
process's :mod:`cptrace_otel.traced.ring`, the worker's :mod:`cptrace_otel.export.ringread`), the upstream log line
(:mod:`cptrace_otel.model.logline`, the C reader ``_speedups/logreader.c`` and ``value.c``, the Python reader
:mod:`cptrace_otel.analyze.sources.logs`), the C Event builder (``_speedups/event.c``) and the OTLP protobuf encoders
(:mod:`cptrace_otel.export.otlp_proto` and its C twin ``_speedups/otlp.c``: the field tags, checked against
opentelemetry-proto's schema by the tests). Each of them takes its constants from here:

* Python modules import the section objects below (``RING.header_bytes``, ``LINE.marker``, ``OTLP.span_events``,
  ...) and declare no second literal of them.
* The C sources include ``_speedups/grammar.h``, generated from these tables by
  ``python3 -m cptrace_otel.model.grammar --header`` and committed; every constant is there as
  ``CPTRACE_<SECTION>_<FIELD>`` (a str as a C string literal, a one-character value marked ``char`` as a C char
  literal, an int as a number, a protobuf tag in hex; a tuple as its length, ``..._COUNT``). setup.py makes the
  extensions depend on it, so a changed header rebuilds them.
* ``tests/unit/test_grammar.py`` fails when the committed header is not what these tables generate, when a C
  source holds a literal that should have come from the header, or when a Python twin disagrees with the spec.

To change a field or a limit: change it here, run ``python3 -m cptrace_otel.model.grammar --header``, rebuild
(``python3 setup.py build_ext --inplace``) and run ``tests/unit/test_grammar.py`` with the C/Python equality tests.

What is not here: attribute keys, span and event names (:mod:`cptrace_otel.model.semconv`, passed to the C code at
load time), record tags (:data:`cptrace_otel.model.events.LEVEL_OF_TAG`), and sizes private to one C module (its
caches), which no other code reads.

Imports only the standard library (dataclasses): cheap at import time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _c(doc: str, default: Any, char: bool = False) -> Any:
    """A grammar constant: its value, what it means (the header's comment) and whether C reads it as a char."""
    return field(default=default, metadata={"doc": doc, "char": char})


def _tag(message: str, name: str, tag: int) -> Any:
    """A protobuf field tag, ``field number << 3 | wire type``: the OTLP message (its full name under
    ``opentelemetry.proto.``) and field it belongs to, which the tests look up in opentelemetry-proto's schema."""
    return field(default=tag, metadata={"doc": f"{message}.{name}", "char": False, "proto": (message, name)})


@dataclass(frozen=True)
class LineGrammar:
    """The upstream log line ``<logger prefix>[CPTRACE <tag>] k=v ...`` (:mod:`.logline`, ``logreader.c``)."""

    marker: str = _c("what starts a record in a log line; a space, the tag and ']' follow", "[CPTRACE")
    rank_prefix: str = _c("SGLang's logger prefix names the rank as this text and its digits", "ATTN_CP")
    ts_field: str = _c("the field whose int value is the record's timestamp (else the line number)", "ts")
    rank_field: str = _c("the field whose int value >= 0 is the record's rank", "rank")
    max_other_markers: int = _c("other line markers (read by Python) the C reader can be told of", 4)

    @property
    def opening(self) -> str:
        """The marker and the space before the tag: where a well-formed record starts."""
        return self.marker + " "


@dataclass(frozen=True)
class ValueGrammar:
    """How a field value is written as text and read back (:mod:`.logline`, :mod:`.records`, ``value.c``)."""

    true_text: str = _c("a bool True as a value's text", "True")
    false_text: str = _c("a bool False as a value's text", "False")
    rng_parts: int = _c("the parts of an rng summary (cnt, min, max, first, last)", 5)
    max_int_digits: int = _c("the C readers leave longer digit runs to Python (int() refuses over 4300)", 4000)
    max_value_chars: int = _c("longer rendered values are cut, with a ...(cut:N) marker", 65536)


@dataclass(frozen=True)
class SideEstimate:
    """The estimate of a record's bytes that bounds the deque of records waiting for the drainer (deque path:
    ``traced/rendering.py``; the ring's side deque: ``ring.c``): a constant per record and per field, plus the
    length of each str and bytes value and a constant per list or tuple item."""

    base: int = _c("bytes counted for every record", 200)
    per_field: int = _c("bytes counted for every field", 64)
    per_item: int = _c("bytes counted for every item of a list or tuple value", 16)


@dataclass(frozen=True)
class RingLayout:
    """The shared-memory record ring (``ring.c``; the layout is described at the top of that file)."""

    magic: int = _c('the first u64 of a ring buffer: "CPTRING2" read little-endian', 0x32474E4952545043)
    header_bytes: int = _c("bytes before the records: magic and cap, the producer's line, the consumer's line", 256)
    producer_line: int = _c("offset of the producer's cache line (write_pos, dropped, side_next, written)", 64)
    consumer_line: int = _c("offset of the consumer's cache line (read_pos, consumed, free_pos, reader)", 128)
    min_cap: int = _c("the smallest data capacity (bytes, a power of two)", 64)
    min_bytes: int = _c("the smallest ring the traced process makes (CPTRACE_RING_BYTES' floor)", 4096)
    align: int = _c("every record starts at a multiple of this", 8)
    record_header: int = _c("u32 size, u16 kind, u16 nfields", 8)
    placeholder_bytes: int = _c("a PH record: its header and the u64 side id", 16)
    kind_rec: int = _c("record kind: an encoded record", 1)
    kind_ph: int = _c("record kind: a placeholder of a side record", 2)
    kind_pad: int = _c("record kind: padding to the end of the buffer", 3)
    max_fields: int = _c("records with more fields take the side path", 64)
    max_list: int = _c("lists or tuples of ints with more items take the side path", 64)
    max_record: int = _c("larger records take the side path ...", 65536)
    max_record_share: int = _c("... as do records larger than the ring's capacity divided by this", 8)
    v_int: str = _c("value kind: i64", "i", char=True)
    v_float: str = _c("value kind: f64", "f", char=True)
    v_str: str = _c("value kind: varint length and UTF-8", "s", char=True)
    v_true: str = _c("value kind: True (read back as the true text)", "T", char=True)
    v_false: str = _c("value kind: False (read back as the false text)", "F", char=True)


@dataclass(frozen=True)
class EventLayout:
    """:class:`cptrace_otel.model.events.Event`'s fields in constructor order, which ``event.c`` fills."""

    fields: tuple[str, ...] = _c("Event's constructor arguments", ("tag", "rank", "seq", "ts", "epoch", "fields",
                                                                    "level", "src", "line_no"))


@dataclass(frozen=True)
class OtlpWire:
    """The protobuf tags (one byte each) of the OTLP fields the encoders write (``export/otlp_proto.py`` and its C
    twin ``otlp.c``), and the fixed sizes and values they write with them."""

    kv_key: int = _tag("common.v1.KeyValue", "key", 0x0A)
    kv_value: int = _tag("common.v1.KeyValue", "value", 0x12)
    any_string: int = _tag("common.v1.AnyValue", "string_value", 0x0A)
    any_bool: int = _tag("common.v1.AnyValue", "bool_value", 0x10)
    any_int: int = _tag("common.v1.AnyValue", "int_value", 0x18)
    any_double: int = _tag("common.v1.AnyValue", "double_value", 0x21)
    span_trace_id: int = _tag("trace.v1.Span", "trace_id", 0x0A)
    span_span_id: int = _tag("trace.v1.Span", "span_id", 0x12)
    span_parent: int = _tag("trace.v1.Span", "parent_span_id", 0x22)
    span_name: int = _tag("trace.v1.Span", "name", 0x2A)
    span_kind: int = _tag("trace.v1.Span", "kind", 0x30)
    span_start: int = _tag("trace.v1.Span", "start_time_unix_nano", 0x39)
    span_end: int = _tag("trace.v1.Span", "end_time_unix_nano", 0x41)
    span_attributes: int = _tag("trace.v1.Span", "attributes", 0x4A)
    span_events: int = _tag("trace.v1.Span", "events", 0x5A)
    span_links: int = _tag("trace.v1.Span", "links", 0x6A)
    span_status: int = _tag("trace.v1.Span", "status", 0x7A)
    event_time: int = _tag("trace.v1.Span.Event", "time_unix_nano", 0x09)
    event_name: int = _tag("trace.v1.Span.Event", "name", 0x12)
    event_attributes: int = _tag("trace.v1.Span.Event", "attributes", 0x1A)
    link_trace_id: int = _tag("trace.v1.Span.Link", "trace_id", 0x0A)
    link_span_id: int = _tag("trace.v1.Span.Link", "span_id", 0x12)
    link_attributes: int = _tag("trace.v1.Span.Link", "attributes", 0x22)
    status_message: int = _tag("trace.v1.Status", "message", 0x12)
    status_code: int = _tag("trace.v1.Status", "code", 0x18)
    request_resource_spans: int = _tag("collector.trace.v1.ExportTraceServiceRequest", "resource_spans", 0x0A)
    resource_spans_resource: int = _tag("trace.v1.ResourceSpans", "resource", 0x0A)
    resource_spans_scope_spans: int = _tag("trace.v1.ResourceSpans", "scope_spans", 0x12)
    resource_attributes: int = _tag("resource.v1.Resource", "attributes", 0x0A)
    scope_spans_scope: int = _tag("trace.v1.ScopeSpans", "scope", 0x0A)
    scope_spans_spans: int = _tag("trace.v1.ScopeSpans", "spans", 0x12)
    scope_name: int = _tag("common.v1.InstrumentationScope", "name", 0x0A)
    scope_version: int = _tag("common.v1.InstrumentationScope", "version", 0x12)
    trace_id_bytes: int = _c("bytes of a trace id", 16)
    span_id_bytes: int = _c("bytes of a span id", 8)
    kind_internal: int = _c("Span.kind of every span written: SPAN_KIND_INTERNAL", 1)


LINE = LineGrammar()
VALUE = ValueGrammar()
SIDE = SideEstimate()
RING = RingLayout()
EVENT = EventLayout()
OTLP = OtlpWire()

SECTIONS: dict[str, Any] = {"LINE": LINE, "VALUE": VALUE, "SIDE": SIDE, "RING": RING, "EVENT": EVENT, "OTLP": OTLP}
"""Every section, by the name its constants take in C (``CPTRACE_<SECTION>_<FIELD>``)."""

HEADER_PATH = Path(__file__).resolve().parent.parent.parent / "_speedups" / "grammar.h"


def _c_str(s: str) -> str:
    if not s.isascii() or not s.isprintable() or any(c in s for c in "\"\\'"):
        raise ValueError(f"grammar: {s!r} cannot be written as a plain C literal")
    return s


def c_constants() -> list[tuple[str, str, str]]:
    """``(C name, C value, doc)`` of every constant, in section and field order."""
    out = []
    for sec, obj in SECTIONS.items():
        for f in dataclasses.fields(obj):
            v, doc = getattr(obj, f.name), f.metadata["doc"]
            name = f"CPTRACE_{sec}_{f.name.upper()}"
            if "*/" in doc:
                raise ValueError(f"grammar: the doc of {name} would end the header's comment")
            if isinstance(v, tuple):
                out.append((name + "_COUNT", str(len(v)), doc + ": " + ", ".join(v)))
            elif isinstance(v, str):
                if f.metadata["char"]:
                    if len(v) != 1:
                        raise ValueError(f"grammar: {name} is a char and {v!r} is not one character")
                    out.append((name, f"'{_c_str(v)}'", doc))
                else:
                    out.append((name, f'"{_c_str(v)}"', doc))
                    out.append((name + "_LEN", str(len(v.encode())), f"bytes of {name}"))
            elif type(v) is int and "proto" in f.metadata:
                out.append((name, f"{v:#04x}", doc))
            elif type(v) is int:
                out.append((name, f"{v:#x}ULL" if v > 0x7FFFFFFF else str(v), doc))
            else:
                raise ValueError(f"grammar: {name} has a value of type {type(v).__name__}")
    return out


def render_header() -> str:
    """The text of ``_speedups/grammar.h`` for the tables above."""
    lines = [
        "/* Generated by `python3 -m cptrace_otel.model.grammar --header` from cptrace_otel/model/grammar/__init__.py:",
        " * do not edit; change the grammar there and regenerate (tests/unit/test_grammar.py compares). */",
        "#ifndef CPTRACE_GRAMMAR_H",
        "#define CPTRACE_GRAMMAR_H",
        "",
    ]
    width = max(len(n) + len(v) for n, v, _ in c_constants()) + 9
    for name, value, doc in c_constants():
        line = f"#define {name} {value}".ljust(width) + f" /* {doc} */"
        lines += [line] if len(line) <= 120 else [f"/* {doc} */", f"#define {name} {value}"]
    lines += ["", "#endif", ""]
    return "\n".join(lines)
