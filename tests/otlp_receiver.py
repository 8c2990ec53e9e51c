"""In-repo OTLP receivers for tests: OTLP/HTTP (protobuf, gzip) and OTLP/gRPC, decoding the real request bytes with
``opentelemetry-proto``, plus a reader for OTLP JSON-lines files (parsed with ``google.protobuf.json_format``).

Usage::

    with HttpReceiver() as rx:            # or GrpcReceiver()
        ... export to rx.url ...
        spans = rx.spans()                # list[RxSpan], flattened with typed attribute values

``HttpReceiver(fail_status=503)`` answers every request with that status (outage tests); :meth:`stop` and
:meth:`start` (same port) simulate a backend restart.
"""

from __future__ import annotations

import base64
import gzip
import json
import socket
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2


def any_value(v: common_pb2.AnyValue) -> Any:
    """Typed Python value of an OTLP ``AnyValue`` (int stays int, double float, ...)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attrs(kvs: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def attr_list(kvs: Iterable[common_pb2.KeyValue]) -> list[tuple[str, Any]]:
    return [(kv.key, any_value(kv.value)) for kv in kvs]


@dataclass
class RxEvent:
    name: str
    time_ns: int
    attrs: dict[str, Any]
    attr_list: list[tuple[str, Any]]


@dataclass
class RxSpan:
    resource: dict[str, Any]
    scope: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    events: list[RxEvent]
    links: list[tuple[str, str, dict[str, Any]]]
    status_code: int
    status_message: str
    kind: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def flatten(req: trace_service_pb2.ExportTraceServiceRequest) -> list[RxSpan]:
    out = []
    for rs in req.resource_spans:
        res = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append(RxSpan(
                    resource=res, scope=ss.scope.name, trace_id=sp.trace_id.hex(), span_id=sp.span_id.hex(),
                    parent_span_id=sp.parent_span_id.hex(), name=sp.name, start_ns=sp.start_time_unix_nano,
                    end_ns=sp.end_time_unix_nano, attrs=attrs(sp.attributes),
                    events=[RxEvent(e.name, e.time_unix_nano, attrs(e.attributes), attr_list(e.attributes))
                            for e in sp.events],
                    links=[(lk.trace_id.hex(), lk.span_id.hex(), attrs(lk.attributes)) for lk in sp.links],
                    status_code=sp.status.code, status_message=sp.status.message, kind=sp.kind))
    return out


class _Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.raw_sizes: list[int] = []
        self.headers: list[dict[str, str]] = []

    def add(self, req: trace_service_pb2.ExportTraceServiceRequest, size: int, headers: dict[str, str]) -> None:
        with self.lock:
            self.requests.append(req)
            self.raw_sizes.append(size)
            self.headers.append(headers)

    def spans(self) -> list[RxSpan]:
        with self.lock:
            reqs = list(self.requests)
        out: list[RxSpan] = []
        for r in reqs:
            out.extend(flatten(r))
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpReceiver(_Store):
    """OTLP/HTTP protobuf receiver on 127.0.0.1 (``/v1/traces``)."""

    def __init__(self, port: int = 0, fail_status: int | None = None) -> None:
        super().__init__()
        self.port = port or free_port()
        self.fail_status = fail_status
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def start(self) -> None:
        store = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                if store.fail_status:
                    self.send_response(store.fail_status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    elif self.headers.get("Content-Encoding") == "deflate":
                        body = zlib.decompress(body)
                    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                except Exception as e:  # a decode failure is a test failure: answer 400 and remember it
                    store.errors.append(repr(e))
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                store.add(req, len(body), {k.lower(): v for k, v in self.headers.items()})
                resp = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(resp)))
                self.end_headers()
                self.wfile.write(resp)

        self.errors: list[str] = getattr(self, "errors", [])
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "HttpReceiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class GrpcReceiver(_Store):
    """OTLP/gRPC receiver on 127.0.0.1 (``TraceService/Export``)."""

    def __init__(self, port: int = 0) -> None:
        super().__init__()
        self.port = port or free_port()
        self._server: Any = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        store = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
                md = {k: v for k, v in (context.invocation_metadata() or ())}
                store.add(request, request.ByteSize(), md)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self._server)
        bound = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        if bound != self.port:
            raise RuntimeError(f"cannot bind 127.0.0.1:{self.port}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> "GrpcReceiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# -- OTLP JSON-lines files ------------------------------------------------------------------------------------------
def _hex_ids_to_b64(d: Any) -> Any:
    """OTLP/JSON carries trace/span ids as hex; ``json_format`` expects proto3 JSON bytes (base64)."""
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                out[k] = base64.b64encode(bytes.fromhex(v)).decode()
            else:
                out[k] = _hex_ids_to_b64(v)
        return out
    if isinstance(d, list):
        return [_hex_ids_to_b64(x) for x in d]
    return d


def parse_json_line(line: str) -> trace_service_pb2.ExportTraceServiceRequest:
    """One OTLP JSON line -> the proto message, validated by ``json_format`` against the schema."""
    from google.protobuf import json_format

    return json_format.ParseDict(_hex_ids_to_b64(json.loads(line)), trace_service_pb2.ExportTraceServiceRequest())


def _json_any(v: dict[str, Any]) -> Any:
    x = v.get("intValue")
    if x is not None:
        return int(x)
    x = v.get("stringValue")
    if x is not None:
        return x
    x = v.get("doubleValue")
    if x is not None:
        return float(x)
    x = v.get("arrayValue")
    if x is not None:
        return [_json_any(y) for y in x.get("values", [])]
    return next(iter(v.values()), None)


def _json_attr_list(kvs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(kv["key"], _json_any(kv["value"])) for kv in kvs]


def _flatten_json(d: dict[str, Any]) -> list[RxSpan]:
    """Direct JSON -> RxSpan (json_format is too slow for 100k-event files; it validates the first line)."""
    out = []
    for rs in d.get("resourceSpans", []):
        res = dict(_json_attr_list(rs.get("resource", {}).get("attributes", [])))
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                evs = []
                for e in sp.get("events", []):
                    al = _json_attr_list(e.get("attributes", []))
                    evs.append(RxEvent(e["name"], int(e["timeUnixNano"]), dict(al), al))
                st = sp.get("status", {})
                out.append(RxSpan(
                    resource=res, scope=ss.get("scope", {}).get("name", ""), trace_id=sp["traceId"],
                    span_id=sp["spanId"], parent_span_id=sp.get("parentSpanId", ""), name=sp["name"],
                    start_ns=int(sp["startTimeUnixNano"]), end_ns=int(sp["endTimeUnixNano"]),
                    attrs=dict(_json_attr_list(sp.get("attributes", []))), events=evs,
                    links=[(lk["traceId"], lk["spanId"], dict(_json_attr_list(lk.get("attributes", []))))
                           for lk in sp.get("links", [])],
                    status_code=int(st.get("code", 0)), status_message=st.get("message", ""), kind=sp.get("kind", 0)))
    return out


def read_jsonl(paths: Iterable[str], validate_lines: int = 1) -> list[RxSpan]:
    """Spans of OTLP JSON-lines files. Up to ``validate_lines`` lines (under 1 MB) of each file are also parsed with
    ``json_format`` against the proto schema and must give the same spans."""
    out: list[RxSpan] = []
    for p in paths:
        checked = 0
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                spans = _flatten_json(json.loads(line))
                if checked < validate_lines and len(line) < (1 << 20):
                    checked += 1
                    ref = flatten(parse_json_line(line))
                    assert [(s.span_id, s.name, s.attrs, [(e.name, e.time_ns, e.attr_list) for e in s.events])
                            for s in ref] == \
                        [(s.span_id, s.name, s.attrs, [(e.name, e.time_ns, e.attr_list) for e in s.events])
                         for s in spans], f"{p}:{i + 1}: JSON differs from its json_format reading"
                out.extend(spans)
    return out
