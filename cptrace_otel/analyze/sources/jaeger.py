"""Read cptrace traces back from Jaeger's query service (v1.76 / v2.13 and later) over HTTP.

Contract:

* :class:`JaegerClient` wraps three read APIs of ``jaeger_query`` (default ``http://127.0.0.1:16686``):

  - ``search(service, tags=..., start_us=..., end_us=..., limit=...)``: ``GET /api/traces`` (the UI's JSON API). Times
    are unix **microseconds**; tags are AND-ed exact matches, each key matched on one span (span, scope, resource or
    any of that span's event attributes), values compared as strings. ``limit`` is also the memory store's search
    depth and must not exceed its ``max_traces``. Returns Jaeger-JSON traces (``traceID``, ``spans``, ``processes``).
  - ``get_trace(trace_id)``: ``GET /api/traces/{id}``; ``None`` when Jaeger does not have it.
  - ``get_trace_v3(trace_id)``: ``GET /api/v3/traces/{id}``; OTLP/JSON ``{"resourceSpans": [...]}`` with every span
    event, its attributes and nanosecond timestamp, links with attributes, and the resource: the lossless form, used
    for read-back and re-checks. ``None`` when not found.
  - ``find_traces_v3(service, start_ns, end_ns, num_traces)``: ``GET /api/v3/traces`` (no attribute filter over HTTP
    at v1.76; both time bounds and ``num_traces`` are required there).

* Transport (:mod:`.httpio`): every request has a total deadline and a size bound (:class:`.httpio.Limits`, from the
  environment); ``user:password@`` in the base URL is sent as HTTP basic auth, only to that origin (a redirect to
  another origin is not followed), and never appears in :attr:`JaegerClient.base_url` or a message.
* Errors: a connection failure, a broken answer or the deadline raises :class:`JaegerUnreachable` (an ``OSError``)
  whose message carries the URL; an HTTP error other than 404, an answer too large, or a body that is not the expected
  JSON raises :class:`JaegerError` with the status and what came back (the server's message, or a short escaped
  excerpt of the body). The CLI maps both to exit status 3.
* Search answers are parsed as they stream in (:func:`iter_data`), one trace at a time: a trace whose text exceeds
  ``max_trace_bytes`` is not parsed but skipped and handed out as :class:`Unread` (its id, why, a sample of its span
  start times), so one huge trace costs itself only and memory stays bounded.
* :func:`events_from_otlp` turns api_v3 output into :class:`cptrace_otel.model.events.Event` objects (one per cptrace
  record; ``hicache.violation`` finding events are skipped), and :func:`findings_from_otlp` lists the stamped verdicts.
* :func:`run_events` fetches every record of one run (all ranks, all traces, at most ``limit`` traces) for the
  analyzer's re-checks; ``check --jaeger`` pages past that limit (:mod:`.jaegerquery`).

Standard library only; nothing heavy is imported.
"""

from __future__ import annotations

import base64
import codecs
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from ...model import semconv as sc
from ...model.attrs import attributes_to_fields
from ...model.config import mask_url
from ...model.events import Event
from ..links import normalize_base, trace_id_hex
from . import httpio
from .httpio import BackendError as JaegerError, BackendUnreachable as JaegerUnreachable, Limits, excerpt
from .jaegerstream import TraceText, Unread, data_list, iter_data

__all__ = [
    "JaegerClient",
    "JaegerError",
    "JaegerUnreachable",
    "Unread",
    "events_from_otlp",
    "findings_from_otlp",
    "iter_data",
    "mask_url",
    "run_events",
]

DEFAULT_URL = "http://127.0.0.1:16686"
STREAM_FACTOR = 16          # a streamed search answer may be this many times max_answer_bytes (skipped traces)


class JaegerClient:
    """Read-only client of one Jaeger query service. Thread-safe (no shared state besides settings).

    ``user:password@`` in ``base_url`` is sent as HTTP basic auth and kept out of :attr:`base_url` (so out of every
    message and link). ``timeout_s`` is the per-read timeout; ``limits`` (default: from the environment,
    :func:`.httpio.limits_from_env`) bound every request."""

    def __init__(self, base_url: str = DEFAULT_URL, timeout_s: float = 10.0, limits: Limits | None = None) -> None:
        base = normalize_base(base_url)
        self.base_url, auth = httpio.split_userinfo(base)
        self._headers = {"Accept": "application/json"}
        if auth is not None:
            self._headers["Authorization"] = auth
        self.timeout_s = timeout_s
        self.limits = limits or httpio.limits_from_env(read_timeout_s=timeout_s)

    # -- transport ---------------------------------------------------------------------------------------------
    def _url(self, path: str, params: Iterable[tuple[str, str]] = ()) -> str:
        qs = urlencode(list(params), quote_via=quote)
        return f"{self.base_url}{path}" + (f"?{qs}" if qs else "")

    def _open(self, path: str, params: Iterable[tuple[str, str]] = (), max_bytes: int | None = None
              ) -> tuple[str, httpio.Answer | None]:
        """GET ``path``: (the URL, the open answer), the answer ``None`` on 404."""
        url = self._url(path, params)
        return url, httpio.request("GET", url, headers=self._headers, limits=self.limits, max_bytes=max_bytes)

    def _get(self, path: str, params: Iterable[tuple[str, str]] = (), max_bytes: int | None = None) -> Any:
        """GET ``path`` and decode JSON (read whole, within ``max_bytes``, default ``max_answer_bytes``); ``None`` on
        404."""
        url, ans = self._open(path, params, max_bytes)
        if ans is None:
            return None
        data = ans.read()
        try:
            return json.loads(data.decode("utf-8", "replace"))
        except RecursionError:
            raise JaegerError(url, ans.status, "JSON nested too deeply to read") from None
        except ValueError as e:
            raise JaegerError(url, ans.status, f"not JSON ({e}): the answer begins {excerpt(data)}") from None

    # -- internal JSON API (/api) ------------------------------------------------------------------------------
    def services(self) -> list[str]:
        """Service names Jaeger has seen (``GET /api/services``)."""
        url = self._url("/api/services")
        out = self._get("/api/services", max_bytes=self.limits.max_small_bytes) or {}
        data = out.get("data") if isinstance(out, dict) else None
        if not isinstance(data, (list, type(None))):
            raise JaegerError(url, 200, f"not a Jaeger service list: {excerpt(json.dumps(out))}")
        return sorted(str(s) for s in data or [])

    def search(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """:meth:`search_iter` (the same arguments) as a list of traces; a trace too large to parse raises
        :class:`JaegerError`."""
        out = []
        for tr in self.search_iter(*args, **kwargs):
            if isinstance(tr, Unread):
                raise JaegerError(self.base_url + "/api/traces", 200, f"trace {tr.trace_id}: {tr.reason}")
            out.append(tr)
        return out

    def search_iter(
        self,
        service: str = sc.DEFAULT_SERVICE_NAME,
        tags: Mapping[str, Any] | None = None,
        start_us: int | None = None,
        end_us: int | None = None,
        limit: int = 100,
        operation: str | None = None,
        lookback_s: float | None = None,
        raw: bool = False,
        with_text: bool = False,
        index: Callable[[bytes, int], list | None] | None = None,
    ) -> Iterator[Any]:
        """Traces of ``service`` with a span matching every tag (``GET /api/traces``), newest first.

        ``start_us``/``end_us`` bound span start times (unix µs); ``lookback_s`` sets ``start_us = now - lookback_s``
        when ``start_us`` is not given (Jaeger's own default is 48 h). Raises :class:`JaegerError` with Jaeger's
        message when the query is refused (e.g. ``limit`` above the memory store's ``max_traces``). ``raw=True`` skips
        Jaeger's read-time adjusters (span dedup, sorting of attributes and events, clock-skew warnings).

        The request is made (and refused, raising) before this returns; the answer is then parsed as it streams in,
        one trace at a time (:func:`iter_data`; ``with_text``: ``(trace, its JSON text)`` pairs); a trace larger than
        ``limits.max_trace_bytes`` comes out as :class:`Unread`. The connection is held until the iterator ends.

        ``index`` (``jaeger_read.index``, the compiled reader): an answer within ``limits.max_answer_bytes`` is read
        whole and handed to it; where it answers, the traces come out as :class:`TraceText` (not parsed), else the
        answer is parsed as above, from the same bytes."""
        params: list[tuple[str, str]] = [("service", service), ("limit", str(int(limit)))]
        if operation:
            params.append(("operation", operation))
        if start_us is None and lookback_s is not None:
            start_us = int((time.time() - lookback_s) * 1e6)
        if start_us is not None:
            params.append(("start", str(int(start_us))))
        if end_us is not None:
            params.append(("end", str(int(end_us))))
        if tags:
            params.append(("tags", json.dumps({k: _tag_str(v) for k, v in tags.items()}, separators=(",", ":"))))
        if raw:
            params.append(("raw", "true"))
        url, ans = self._open("/api/traces", params, self.limits.max_answer_bytes * STREAM_FACTOR)
        if ans is None:
            return iter(())
        if index is None:
            return iter_data(_texts(ans.chunks()), url, with_text, self.limits.max_trace_bytes)
        return self._indexed(ans, url, with_text, index)

    def _indexed(self, ans: httpio.Answer, url: str, with_text: bool, index: Callable[[bytes, int], list | None]
                 ) -> Iterator[Any]:
        """:meth:`search_iter` through the compiled ``index``: TraceText per trace where it answers; the stream
        parse of the same bytes where it does not (an answer past ``max_answer_bytes`` is streamed on, as before)."""
        chunks = ans.chunks()
        got: list[bytes] = []
        size = 0
        for c in chunks:
            got.append(c)
            size += len(c)
            if size > self.limits.max_answer_bytes:
                yield from iter_data(_texts(itertools.chain(got, chunks)), url, with_text, self.limits.max_trace_bytes)
                return
        body = b"".join(got)
        del got
        rows = index(body, self.limits.max_trace_bytes)
        if rows is None:
            yield from iter_data(_texts([body]), url, with_text, self.limits.max_trace_bytes)
            return
        for tid, starts, a, b in rows:
            yield TraceText(tid, starts, body[a:b])

    def get_trace(self, trace_id: str | bytes | int) -> dict[str, Any] | None:
        """One trace in Jaeger JSON (``GET /api/traces/{id}``), or ``None`` if Jaeger does not have it."""
        tid = trace_id_hex(trace_id)
        out = self._get(f"/api/traces/{tid}", max_bytes=self.limits.max_trace_bytes)
        if out is None:
            return None
        data = data_list(out, f"{self.base_url}/api/traces/{tid}")
        return data[0] if data else None

    # -- api_v3 (OTLP JSON) ------------------------------------------------------------------------------------
    def get_trace_v3(self, trace_id: str | bytes | int, raw: bool = False) -> dict[str, Any] | None:
        """One trace as OTLP/JSON ``{"resourceSpans": [...]}`` (``GET /api/v3/traces/{id}``), or ``None``.

        ``raw=True`` skips Jaeger's read-time adjusters (dedup, clock skew, sorting)."""
        tid = trace_id_hex(trace_id)
        params = [("raw_traces", "true")] if raw else []
        out = self._get(f"/api/v3/traces/{tid}", params, max_bytes=self.limits.max_trace_bytes)
        if out is None:
            return None
        td = out.get("result", out) if isinstance(out, dict) else None
        if not isinstance(td, dict):
            raise JaegerError(f"{self.base_url}/api/v3/traces/{tid}", 200,
                              f"not an api_v3 trace: {excerpt(json.dumps(out))}")
        if not td.get("resourceSpans"):
            return None
        return td

    def find_traces_v3(self, service: str, start_ns: int, end_ns: int, num_traces: int = 20,
                       operation: str | None = None) -> dict[str, Any]:
        """Traces of ``service`` with spans starting in [start_ns, end_ns], merged into one OTLP/JSON TracesData."""
        params = [
            ("query.service_name", service),
            ("query.start_time_min", _rfc3339(start_ns)),
            ("query.start_time_max", _rfc3339(end_ns)),
            ("query.num_traces", str(int(num_traces))),
        ]
        if operation:
            params.append(("query.operation_name", operation))
        out = self._get("/api/v3/traces", params)
        if out is None:
            return {"resourceSpans": []}
        td = out.get("result", out) if isinstance(out, dict) else None
        if not isinstance(td, dict):
            raise JaegerError(self._url("/api/v3/traces", params), 200,
                              f"not an api_v3 answer: {excerpt(json.dumps(out))}")
        return td


def _texts(chunks: Iterable[bytes]) -> Iterator[str]:
    """The UTF-8 text of a byte stream, piece by piece (a bad byte becomes U+FFFD)."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    for c in chunks:
        t = dec.decode(c)
        if t:
            yield t
    t = dec.decode(b"", True)
    if t:
        yield t


class RunEvents(list):
    """Events of a run (a list: per rank in seq order, ranks merged by ts, ready for the rules); ``traces`` fetched,
    ``truncated`` if the search hit its limit."""

    traces: int = 0
    truncated: bool = False


def run_events(client: JaegerClient, run_id: str, service: str = sc.DEFAULT_SERVICE_NAME,
               lookback_s: float = 7 * 86400, limit: int = 10_000) -> RunEvents:
    """Every cptrace record of run ``run_id`` stored in Jaeger: search the traces carrying the resource attribute
    ``cptrace.run_id`` (``limit`` at most, newest first; must be <= the memory store's ``max_traces``), then read each
    one back losslessly through api_v3. ``truncated`` is True when the search returned ``limit`` traces, i.e. some
    may be missing: raise ``limit`` rather than trust a partial re-check."""
    from .otlpfile import merge_ranks

    found = client.search(service, {sc.RUN_ID: run_id}, lookback_s=lookback_s, limit=limit)
    out = RunEvents()
    seen = set()
    per_rank: dict[int, list] = {}
    for tr in found:
        tid = tr.get("traceID", "")
        if tid in seen:
            continue
        seen.add(tid)
        td = client.get_trace_v3(tid)
        if td is not None:
            for e in events_from_otlp(td, src=f"{client.base_url}/trace/{tid}"):
                per_rank.setdefault(e.rank, []).append((e.epoch, e.seq, e.ts, e))
    # ranks merged by ts as the file sources do: the cross-rank rules need ranks side by side, not one after another
    out.extend(merge_ranks(per_rank))
    out.traces = len(seen)
    out.truncated = len(found) >= limit
    return out


def _tag_str(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _rfc3339(ns: int) -> str:
    secs, frac = divmod(int(ns), 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


# -- OTLP/JSON -> event model -------------------------------------------------------------------------------------
def otlp_value(v: Mapping[str, Any]) -> Any:
    """Python value of one OTLP/JSON ``AnyValue`` (int64 travels as a decimal string in OTLP/JSON)."""
    if "intValue" in v:
        return int(v["intValue"])
    if "stringValue" in v:
        return v["stringValue"]
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [otlp_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: otlp_value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def otlp_attrs(attrs: Iterable[Mapping[str, Any]] | None) -> list[tuple[str, Any]]:
    """``[(key, value)]`` of an OTLP/JSON attribute list, order kept."""
    return [(a["key"], otlp_value(a.get("value", {}))) for a in (attrs or [])]


def iter_spans(td: Mapping[str, Any]) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    """``(resource attributes, span)`` for every span of an OTLP/JSON TracesData."""
    for rs in td.get("resourceSpans", []) or []:
        res = dict(otlp_attrs((rs.get("resource") or {}).get("attributes")))
        for ss in rs.get("scopeSpans", []) or []:
            for span in ss.get("spans", []) or []:
                yield res, span


def events_from_otlp(td: Mapping[str, Any], src: str = "") -> list[Event]:
    """Every cptrace record held in ``td`` as an :class:`Event`, sorted by (rank, epoch, seq): one rank after the
    other, for read-back. To run the rules, merge the ranks by ts (:func:`run_events`, :mod:`.tracedocs`): fed one
    rank after another the cross-rank rules see ranks far apart and report false C1 findings.

    rank = the span's ``sglang.cp.rank`` (else the resource's), seq/epoch/level from the event attributes
    ``cptrace.seq``/``cptrace.epoch``/``cptrace.record.level``, ts = the event's time (ns since the epoch),
    fields = :func:`cptrace_otel.model.attrs.attributes_to_fields` of its attributes (exact inverse of the exporter)."""
    out: list[Event] = []
    for res, span in iter_spans(td):
        out += span_events(res, span, dict(otlp_attrs(span.get("attributes"))), src)
    out.sort(key=lambda e: (e.rank, e.epoch, e.seq))
    return out


def span_events(res: Mapping[str, Any], span: Mapping[str, Any], sattrs: Mapping[str, Any], src: str = ""
                ) -> list[Event]:
    """The cptrace records of one OTLP/JSON span (``res``: its resource's attributes, ``sattrs``: its own), read
    as :func:`events_from_otlp` says; finding events (``hicache.violation``) are not records."""
    rank = sattrs.get(sc.RANK, res.get(sc.CP_RANK, -1))
    out = []
    for ev in span.get("events", []) or []:
        name = ev.get("name", "")
        if name == sc.EVENT_VIOLATION:
            continue
        attrs = otlp_attrs(ev.get("attributes"))
        meta = dict(attrs)
        out.append(Event(
            tag=name,
            rank=int(rank) if isinstance(rank, int) else -1,
            seq=int(meta.get(sc.SEQ, 0)),
            ts=int(ev.get("timeUnixNano", 0)),
            epoch=int(meta.get(sc.EPOCH, 0)),
            fields=attributes_to_fields(attrs),
            level=int(meta.get(sc.LEVEL, 1)),
            src=src,
        ))
    return out


def findings_from_otlp(td: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The verdicts stamped by the online checks: one dict per ``hicache.violation`` event, with the span's trace id,
    span id, name, rank and ``cptrace.violation`` codes added (keys ``trace_id``, ``span_id``, ``span``, ``rank``,
    ``codes``, plus the event's own ``code``, ``rule``, ``certainty``, ``evidence_seq``, ``message``)."""
    out = []
    for res, span in iter_spans(td):
        sattrs = dict(otlp_attrs(span.get("attributes")))
        for ev in span.get("events", []) or []:
            if ev.get("name") != sc.EVENT_VIOLATION:
                continue
            f = dict(otlp_attrs(ev.get("attributes")))
            f.update(trace_id=hex_id(span.get("traceId", "")), span_id=hex_id(span.get("spanId", "")),
                     span=span.get("name", ""), rank=sattrs.get(sc.RANK, res.get(sc.CP_RANK, -1)),
                     codes=sattrs.get(sc.VIOLATION, ""))
            out.append(f)
    return out


def hex_id(v: str) -> str:
    """OTLP/JSON ids are hex (Jaeger's api_v3 and the OTLP JSON spec); tolerate base64 from protobuf-JSON writers."""
    if all(c in "0123456789abcdefABCDEF" for c in v):
        return v.lower()
    try:
        return base64.b64decode(v).hex()
    except ValueError:
        return v
