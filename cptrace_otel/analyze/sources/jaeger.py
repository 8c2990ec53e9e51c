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

* Errors: a connection failure or timeout raises :class:`JaegerUnreachable` (an ``OSError``) whose message carries
  the URL; the CLI maps it to exit status 3. An HTTP error other than 404 raises :class:`JaegerError` with the status
  and the start of the body.
* :func:`events_from_otlp` turns api_v3 output into :class:`cptrace_otel.model.events.Event` objects (one per cptrace
  record; ``hicache.violation`` finding events are skipped), and :func:`findings_from_otlp` lists the stamped verdicts.
* :func:`run_events` fetches every record of one run (all ranks, all traces, at most ``limit`` traces) for the
  analyzer's re-checks; ``check --jaeger`` pages past that limit (:mod:`.jaegerquery`).
* :func:`cptrace_otel.model.config.mask_url` hides the userinfo of a URL in messages; ``user:password@`` in the base
URL is sent as HTTP
  basic auth.

Standard library only (``urllib``); nothing heavy is imported.
"""

from __future__ import annotations

import base64
import codecs
import http.client
import json
import re
import time
import urllib.error
import urllib.request
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

from ...model import semconv as sc
from ...model.attrs import attributes_to_fields
from ...model.exits import CptraceError
from ...model.events import Event
from ..links import normalize_base, trace_id_hex

DEFAULT_URL = "http://127.0.0.1:16686"
READ_CHUNK = 1 << 20   # bytes per read of an answer


class JaegerUnreachable(CptraceError, ConnectionError):
    """Jaeger's query service could not be reached (refused, timed out, DNS). ``url`` is what was requested."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"Jaeger query service unreachable at {url}: {reason}")
        self.url = url
        self.reason = reason


class JaegerError(CptraceError, RuntimeError):
    """Jaeger answered with an HTTP error (not 404) or a body that is not the expected JSON."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"Jaeger query {url} failed: HTTP {status}: {body[:300]}")
        self.url = url
        self.status = status
        self.body = body


class JaegerClient:
    """Read-only client of one Jaeger query service. Thread-safe (no shared state besides settings).

    ``user:password@`` in ``base_url`` is sent as HTTP basic auth and kept out of :attr:`base_url` (so out of every
    message and link)."""

    def __init__(self, base_url: str = DEFAULT_URL, timeout_s: float = 10.0) -> None:
        self.base_url = normalize_base(base_url)
        self._headers = {"Accept": "application/json"}
        parts = urlsplit(self.base_url)
        if parts.username is not None or parts.password is not None:
            cred = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
            self._headers["Authorization"] = "Basic " + base64.b64encode(cred).decode()
            self.base_url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        self.timeout_s = timeout_s

    # -- transport ---------------------------------------------------------------------------------------------
    def _get_text(self, path: str, params: Iterable[tuple[str, str]] = ()) -> tuple[str, list[str] | None]:
        """GET ``path``: (the URL, the body as text in pieces of about :data:`READ_CHUNK` characters), the body
        ``None`` on 404. The whole body is read before this returns (no connection is held while the caller works),
        and as pieces: each bytes chunk is freed once decoded, so the body is never held twice."""
        qs = urlencode(list(params), quote_via=quote)
        url = f"{self.base_url}{path}" + (f"?{qs}" if qs else "")
        req = urllib.request.Request(url, headers=self._headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                dec = codecs.getincrementaldecoder("utf-8")("replace")
                parts = []
                while True:
                    chunk = resp.read(READ_CHUNK)
                    if not chunk:
                        break
                    parts.append(dec.decode(chunk))
                parts.append(dec.decode(b"", True))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return url, None
            text = e.read().decode("utf-8", "replace") if e.fp is not None else ""
            raise JaegerError(url, e.code, text) from None
        except urllib.error.URLError as e:
            raise JaegerUnreachable(url, str(e.reason)) from None
        except (TimeoutError, ConnectionError) as e:  # a timeout while reading the body
            raise JaegerUnreachable(url, repr(e)) from None
        except (ValueError, http.client.HTTPException) as e:  # a URL urllib cannot use, a broken HTTP answer
            raise JaegerUnreachable(url, str(e) or type(e).__name__) from None
        return url, parts

    def _get(self, path: str, params: Iterable[tuple[str, str]] = ()) -> Any:
        """GET ``path`` and decode JSON; ``None`` on 404."""
        url, parts = self._get_text(path, params)
        if parts is None:
            return None
        text = "".join(parts)
        try:
            return json.loads(text)
        except (ValueError, RecursionError):   # not JSON, or nested too deeply for json
            raise JaegerError(url, 200, text) from None

    # -- internal JSON API (/api) ------------------------------------------------------------------------------
    def services(self) -> list[str]:
        """Service names Jaeger has seen (``GET /api/services``)."""
        out = self._get("/api/services") or {}
        return sorted(out.get("data") or [])

    def search(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """:meth:`search_iter` (the same arguments) as a list of traces."""
        return list(self.search_iter(*args, **kwargs))

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
    ) -> Iterator[Any]:
        """Traces of ``service`` with a span matching every tag (``GET /api/traces``), newest first.

        ``start_us``/``end_us`` bound span start times (unix µs); ``lookback_s`` sets ``start_us = now - lookback_s``
        when ``start_us`` is not given (Jaeger's own default is 48 h). Raises :class:`JaegerError` with Jaeger's
        message when the query is refused (e.g. ``limit`` above the memory store's ``max_traces``). ``raw=True`` skips
        Jaeger's read-time adjusters (span dedup, sorting of attributes and events, clock-skew warnings).

        The request is made (and refused, raising) before this returns; the answer is then held as text, not as a
        page of parsed traces (which takes several times the memory), and each trace is parsed when the iterator
        reaches it (:func:`iter_data`; ``with_text``: ``(trace, its JSON text)`` pairs)."""
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
        url, parts = self._get_text("/api/traces", params)
        return iter_data(parts or ["{}"], url, with_text)

    def get_trace(self, trace_id: str | bytes | int) -> dict[str, Any] | None:
        """One trace in Jaeger JSON (``GET /api/traces/{id}``), or ``None`` if Jaeger does not have it."""
        tid = trace_id_hex(trace_id)
        out = self._get(f"/api/traces/{tid}")
        if out is None:
            return None
        data = _data(out, f"{self.base_url}/api/traces/{tid}")
        return data[0] if data else None

    # -- api_v3 (OTLP JSON) ------------------------------------------------------------------------------------
    def get_trace_v3(self, trace_id: str | bytes | int, raw: bool = False) -> dict[str, Any] | None:
        """One trace as OTLP/JSON ``{"resourceSpans": [...]}`` (``GET /api/v3/traces/{id}``), or ``None``.

        ``raw=True`` skips Jaeger's read-time adjusters (dedup, clock skew, sorting)."""
        tid = trace_id_hex(trace_id)
        params = [("raw_traces", "true")] if raw else []
        out = self._get(f"/api/v3/traces/{tid}", params)
        if out is None:
            return None
        td = out.get("result", out) if isinstance(out, dict) else None
        if not isinstance(td, dict):
            raise JaegerError(f"{self.base_url}/api/v3/traces/{tid}", 200, json.dumps(out)[:300])
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
        return out.get("result", out)


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


def _tag_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _data(out: Any, url: str) -> list[dict[str, Any]]:
    if not isinstance(out, dict):
        raise JaegerError(url, 200, json.dumps(out)[:300])
    errs = out.get("errors")
    if errs:
        raise JaegerError(url, 200, "; ".join(str(e.get("msg", e)) for e in errs))
    return list(out.get("data") or [])


_DATA_HEAD = re.compile(r'\s*\{\s*"data"\s*:\s*\[\s*')
_SEP = re.compile(r"\s*(,|\])\s*")
_AHEAD = 1 << 18   # characters kept ahead of the parse position: most traces parse at the first try


def iter_data(parts: str | list[str], url: str, with_text: bool = False) -> Iterator[Any]:
    """The elements of the ``data`` array of a Jaeger ``/api/...`` answer (text, or text in pieces), parsed one at
    a time, then its ``errors`` checked (:class:`JaegerError`, as :func:`_data` does); ``with_text``: ``(element,
    its JSON text)`` pairs. Pieces are joined only as far as the parse has got, so the text is held about once.
    Jaeger writes ``data`` first (``{"data":[...],"total":..,"errors":..}``); an answer of another layout is parsed
    whole. JSON that does not parse raises JaegerError."""
    todo = [parts] if isinstance(parts, str) else parts[::-1]   # popped from the end
    buf, pos = "", 0

    def ahead(n: int) -> None:   # at least n characters after pos in buf, unless the text ends first
        nonlocal buf, pos
        if len(buf) - pos < n and todo:
            got = [buf[pos:]]
            size = len(got[0])
            while todo and size < n:
                got.append(todo.pop())
                size += len(got[-1])
            buf, pos = "".join(got), 0

    ahead(64)
    m = _DATA_HEAD.match(buf, pos)
    if m is None:
        text = buf[pos:] + "".join(todo[::-1])
        try:
            out = json.loads(text)
        except (ValueError, RecursionError):
            raise JaegerError(url, 200, text) from None
        for item in _data(out, url):
            yield (item, json.dumps(item)) if with_text else item
        return
    pos = m.end()
    dec = json.JSONDecoder()
    ahead(1)
    if buf.startswith("]", pos):
        pos += 1
    else:
        while True:
            ahead(_AHEAD)
            try:
                item, end = dec.raw_decode(buf, pos)
            except ValueError:
                if todo:   # the trace may go on in the next pieces: twice the text ahead (linear in all)
                    ahead(2 * (len(buf) - pos) + READ_CHUNK)
                    continue
                raise JaegerError(url, 200, buf[pos:pos + 300]) from None
            except RecursionError:
                raise JaegerError(url, 200, buf[pos:pos + 300]) from None
            yield (item, buf[pos:end]) if with_text else item
            pos = end
            ahead(64)
            sep = _SEP.match(buf, pos)
            if sep is None:
                raise JaegerError(url, 200, buf[pos:pos + 300])
            pos = sep.end()
            if sep.group(1) == "]":
                break
    rest = (buf[pos:] + "".join(todo[::-1])).lstrip()
    try:
        tail = json.loads("{" + rest[1:] if rest.startswith(",") else rest or "{}")
    except (ValueError, RecursionError):
        raise JaegerError(url, 200, rest[:300]) from None
    _data(dict(tail, data=None) if isinstance(tail, dict) else tail, url)


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
        sattrs = dict(otlp_attrs(span.get("attributes")))
        rank = sattrs.get(sc.RANK, res.get(sc.CP_RANK, -1))
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
    out.sort(key=lambda e: (e.rank, e.epoch, e.seq))
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
            f.update(trace_id=_hex_id(span.get("traceId", "")), span_id=_hex_id(span.get("spanId", "")),
                     span=span.get("name", ""), rank=sattrs.get(sc.RANK, res.get(sc.CP_RANK, -1)),
                     codes=sattrs.get(sc.VIOLATION, ""))
            out.append(f)
    return out


def _hex_id(v: str) -> str:
    """OTLP/JSON ids are hex (Jaeger's api_v3 and the OTLP JSON spec); tolerate base64 from protobuf-JSON writers."""
    if all(c in "0123456789abcdefABCDEF" for c in v):
        return v.lower()
    try:
        return base64.b64decode(v).hex()
    except ValueError:
        return v
