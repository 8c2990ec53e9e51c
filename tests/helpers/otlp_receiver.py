"""In-repo OTLP receivers for tests: OTLP/HTTP (protobuf, gzip) and OTLP/gRPC, decoding the real request bytes with
``opentelemetry-proto``, plus a reader for OTLP JSON-lines files (parsed with ``google.protobuf.json_format``).

Usage::

    with HttpReceiver() as rx:            # or GrpcReceiver()
        ... export to rx.url ...
        spans = rx.spans()                # list[RxSpan], flattened with typed attribute values

``HttpReceiver(fail_status=503)`` answers every request with that status (outage tests; ``fail_count=N`` only the
first N, ``retry_after="5"`` adds that header); ``attempts`` holds the monotonic time of every POST and ``seen`` its
path, headers and body size. ``host="127.0.0.2"`` listens on another loopback address (another origin);
``redirect=LOCATION`` answers POSTs to ``redirect_from`` with ``redirect_status`` (307) and that ``Location``.
:meth:`stop` and :meth:`start` (same port) simulate a backend restart.

TLS: :func:`make_pki` writes a throw-away CA, a server certificate for 127.0.0.1/localhost and a client
certificate (PEM, made with ``cryptography``); ``HttpReceiver(tls=ServerTls(...))`` / ``GrpcReceiver(tls=...)``
serve TLS with them, and with ``client_ca`` set they require a client certificate signed by it (mTLS).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import ssl
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

from tests.helpers import free_port


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




@dataclass
class ServerTls:
    """A receiver's TLS: its certificate chain and key (PEM files); ``client_ca`` set = mTLS (client cert required)."""

    cert: str
    key: str
    client_ca: str | None = None


def make_pki(directory: str) -> dict[str, str]:
    """Write a test PKI into ``directory``: ``ca`` (the CA certificate), ``server_cert``/``server_key`` (for
    127.0.0.1 and localhost, signed by the CA), ``client_cert``/``client_key`` (signed by the CA) and ``other_ca``
    (a CA that signed nothing here: trusting only it must fail). Returns the paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(fname: str, data: bytes) -> str:
        path = os.path.join(directory, fname)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def key_pem(k: Any) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    def ca(cn: str) -> tuple[Any, Any]:
        k = ec.generate_private_key(ec.SECP256R1())
        c = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn)).public_key(k.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False),
                            critical=True)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()), critical=False)
             .sign(k, hashes.SHA256()))
        return k, c

    def leaf(cn: str, ca_k: Any, ca_c: Any, server: bool) -> tuple[Any, Any]:
        k = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_c.subject).public_key(k.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_k.public_key()), critical=False)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                   else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return k, b.sign(ca_k, hashes.SHA256())

    pem = serialization.Encoding.PEM
    ca_k, ca_c = ca("cptrace test CA")
    _ok, other_c = ca("cptrace other CA")
    s_k, s_c = leaf("127.0.0.1", ca_k, ca_c, True)
    c_k, c_c = leaf("cptrace test client", ca_k, ca_c, False)
    return {
        "ca": write("ca.pem", ca_c.public_bytes(pem)),
        "other_ca": write("other-ca.pem", other_c.public_bytes(pem)),
        "server_cert": write("server.pem", s_c.public_bytes(pem)),
        "server_key": write("server-key.pem", key_pem(s_k)),
        "client_cert": write("client.pem", c_c.public_bytes(pem)),
        "client_key": write("client-key.pem", key_pem(c_k)),
    }


class HttpReceiver(_Store):
    """OTLP/HTTP protobuf receiver on 127.0.0.1 (``/v1/traces``), plain or TLS (``tls``)."""

    def __init__(self, port: int = 0, fail_status: int | None = None, fail_count: int | None = None,
                 retry_after: str | None = None, tls: ServerTls | None = None, host: str = "127.0.0.1",
                 redirect: str | None = None, redirect_status: int = 307, redirect_from: str = "/v1/traces") -> None:
        super().__init__()
        self.host = host
        self.redirect = redirect
        self.redirect_status = redirect_status
        self.redirect_from = redirect_from
        self.seen: list[tuple[str, dict[str, str], int]] = []  # (path, headers, body bytes) of every POST
        self.port = port or free_port(host)
        self.fail_status = fail_status
        self.fail_count = fail_count
        self.retry_after = retry_after
        self.tls = tls
        self.attempts: list[float] = []
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/v1/traces"

    def start(self) -> None:
        store = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                store.attempts.append(time.monotonic())
                store.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, len(body)))
                if store.redirect is not None and self.path == store.redirect_from:
                    self.send_response(store.redirect_status)
                    self.send_header("Location", store.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if store.fail_status and (store.fail_count is None or len(store.attempts) <= store.fail_count):
                    self.send_response(store.fail_status)
                    if store.retry_after is not None:
                        self.send_header("Retry-After", store.retry_after)
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
        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda *a: None  # type: ignore[method-assign]  # failed handshakes: quiet
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls.cert, self.tls.key)
            if self.tls.client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(self.tls.client_ca)
            # handshake in the request thread, not in accept(): a failing client must not stall the server
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HttpReceiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class GrpcReceiver(_Store):
    """OTLP/gRPC receiver on 127.0.0.1 (``TraceService/Export``), plain or TLS (``tls``)."""

    def __init__(self, port: int = 0, tls: ServerTls | None = None) -> None:
        super().__init__()
        self.port = port or free_port()
        self.tls = tls
        self._server: Any = None
        self.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

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
        if self.tls is not None:
            def rd(p: str) -> bytes:
                with open(p, "rb") as f:
                    return f.read()

            creds = grpc.ssl_server_credentials(
                [(rd(self.tls.key), rd(self.tls.cert))],
                root_certificates=rd(self.tls.client_ca) if self.tls.client_ca else None,
                require_client_auth=bool(self.tls.client_ca))
            bound = self._server.add_secure_port(f"127.0.0.1:{self.port}", creds)
        else:
            bound = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        if bound != self.port:
            raise RuntimeError(f"cannot bind 127.0.0.1:{self.port}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> GrpcReceiver:
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


class AlertSink:
    """An in-test endpoint of Alertmanager's API: every POST answered 200, its (path, JSON body) kept in
    :attr:`posted`; :meth:`alerts` the alerts of every ``/api/v2/alerts`` post, in order. (The real Alertmanager is
    driven by the integration tests and bench/serve_latency.py.)"""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        posted: list[tuple[str, Any]] = []
        self.posted = posted

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                posted.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def alerts(self) -> list[Any]:
        return [a for path, body in list(self.posted) if path == "/api/v2/alerts" for a in body]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
