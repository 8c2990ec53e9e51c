"""No echoed secret: a backend that quotes the credential it was sent (in a 401 or 500 body, in a redirect's
``Location``, in gRPC status details; raw, percent-encoded or base64) never gets it printed. Real servers on
loopback ports (:mod:`tests.helpers.echo_secrets`), a real traced child process (its stderr, ``stats()``, its spool
and log files), ``cptrace-otel ingest`` (exit status and output), and ``check`` / ``watch`` against Jaeger, Tempo
and Alertmanager with basic auth. Plus a Hypothesis property of the masker (``model.config.mask``)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings, strategies as st

from cptrace_otel.model import config
from tests.helpers.echo_secrets import EchoGrpc, EchoHttp, forms

TOKEN = "S3CR+T/tok=en_123"           # '+', '/', '=': its percent-encoded forms differ from it
PASSWORD = "pa ss+w/rd:42"            # for basic auth (userinfo): a space, '+', '/', ':'
HEADERS = f"authorization=Bearer {TOKEN}"
ROOT = Path(__file__).resolve().parents[2]

# (case, protocol, path on the echo server, how the failure must be named in the traced process's stderr,
#  in ingest's message)
CASES = [
    ("401", "http/protobuf", "/m401/v1/traces", "authentication failed", "authentication failed"),
    ("500", "http/protobuf", "/m500/v1/traces", "HTTP 500", "HTTP 500"),
    ("redirect-other-origin", "http/protobuf", "/mother/v1/traces", "to another origin", "to another origin"),
    ("redirect-same-origin-401", "http/protobuf", "/msame/v1/traces", "authentication failed",
     "authentication failed"),
    ("grpc-unauthenticated", "grpc", "", "authentication failed", "authentication failed"),
]


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])   # this tree's package
    env.update(more)
    return env


def hits(text: str, secret: str = TOKEN) -> int:
    """How many times any form of ``secret`` (raw, percent-encoded, ``+`` for space, base64) occurs in ``text``."""
    return sum(text.count(f) for f in forms(secret))


def _files_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file())


def traced_child(endpoint: str, protocol: str, tmp: Path) -> tuple[str, dict, str]:
    """A traced process (exporter process, the default) sending one record to ``endpoint`` with the bearer header:
    (its stderr + stdout, its ``stats()``, the text of every file under its spool folder)."""
    code = """
import json, cptrace_otel as c, cptrace_otel.traced.pipeline as p
c.cptrace(1, "backup", node_id=1, op=1)
c.flush(5)
print("STATS " + json.dumps(p.stats(), default=str))
c.shutdown(5)
"""
    spool = tmp / "spool"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=tmp, env=_env(
        CPTRACE_LEVEL="1", CPTRACE_RUN_ID="echo", CPTRACE_SPOOL_DIR=str(spool), OTEL_EXPORTER_OTLP_TIMEOUT="3000",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_HEADERS=HEADERS, CPTRACE_FILE=str(tmp / "out.jsonl")))
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("STATS ")), "STATS {}")
    return r.stderr + r.stdout, json.loads(line[6:]), _files_text(spool) if spool.exists() else ""


def ingest(endpoint: str, protocol: str, tmp: Path) -> subprocess.CompletedProcess:
    log = tmp / "r.log"
    log.write_text("[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE backup] node_id=1 op=1\n")
    return subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", str(log), "--no-progress",
                           "--endpoint", endpoint, "--protocol", protocol], capture_output=True, text=True,
                          timeout=90, cwd=tmp, env=_env(OTEL_EXPORTER_OTLP_HEADERS=HEADERS,
                                                        OTEL_EXPORTER_OTLP_TIMEOUT="3000",
                                                        CPTRACE_SPOOL_DIR=str(tmp / "spool")))


@pytest.fixture(scope="module")
def echo_http():
    with EchoHttp() as srv:
        yield srv


@pytest.fixture(scope="module")
def echo_grpc():
    pytest.importorskip("grpc")
    with EchoGrpc() as srv:
        yield srv


def _endpoint(protocol: str, path: str, http: EchoHttp, grpc_srv: EchoGrpc) -> str:
    return grpc_srv.base if protocol == "grpc" else http.base + path


@pytest.mark.parametrize("case,protocol,path,named,_ingest_named", CASES, ids=[c[0] for c in CASES])
def test_the_traced_process_never_prints_an_echoed_token(tmp_path: Path, echo_http: EchoHttp, echo_grpc: EchoGrpc,
                                                        case: str, protocol: str, path: str, named: str,
                                                        _ingest_named: str) -> None:
    out, stats, spool = traced_child(_endpoint(protocol, path, echo_http, echo_grpc), protocol, tmp_path)
    assert stats, out
    worker = json.dumps(stats)
    assert hits(out) == 0, out
    assert hits(worker) == 0, worker
    assert hits(spool) == 0, spool
    assert hits(_files_text(tmp_path)) == 0   # the OTLP file, the exporter's log next to its spool: anything written
    assert named in out, out                   # and the failure is still named usefully
    assert "***" in out, out                   # (the server's words are kept, the token masked)
    werr = json.dumps(stats.get("worker", {}))
    assert "HTTP" in werr or "gRPC" in werr or "redirect" in werr, werr   # stats' last_error / config_error


@pytest.mark.parametrize("case,protocol,path,_named,named", CASES, ids=[c[0] for c in CASES])
def test_ingest_never_prints_an_echoed_token(tmp_path: Path, echo_http: EchoHttp, echo_grpc: EchoGrpc, case: str,
                                            protocol: str, path: str, _named: str, named: str) -> None:
    endpoint = _endpoint(protocol, path, echo_http, echo_grpc)
    r = ingest(endpoint, protocol, tmp_path)
    assert r.returncode == 3, r.stderr
    assert hits(r.stdout + r.stderr) == 0, r.stderr
    assert hits(_files_text(tmp_path)) == 0
    assert named in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "unreachable" not in r.stderr, r.stderr   # the backend answered: it is reachable
    assert endpoint.split("://")[1].split("/")[0] in r.stderr   # the URL is named


def test_ingest_with_userinfo_never_prints_the_echoed_password(tmp_path: Path, echo_http: EchoHttp) -> None:
    """The endpoint's ``user:password@`` goes out as basic auth; the 401 body echoes the password in every form."""
    r = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", "-", "--no-progress", "--endpoint",
                        _userinfo_url(echo_http.base, "/m401/v1/traces")], capture_output=True, text=True,
                       timeout=90, cwd=tmp_path, env=_env(), input="[CPTRACE backup] node_id=1 op=1\n")
    assert r.returncode == 3, r.stderr
    assert hits(r.stdout + r.stderr, PASSWORD) == 0, r.stderr
    assert "authentication failed" in r.stderr and "***@127.0.0.1" in r.stderr, r.stderr


@pytest.mark.parametrize("mode,auth", [("m401", True), ("m403", True), ("m500", False)])
def test_the_http_transport_names_401_and_403_an_authentication_failure(echo_http: EchoHttp, mode: str,
                                                                       auth: bool) -> None:
    from cptrace_otel.export.otlp_http import HttpTransport
    from cptrace_otel.export.sinks import Outcome, is_auth_failure

    t = HttpTransport(f"{echo_http.base}/{mode}/v1/traces", [("authorization", f"Bearer {TOKEN}")], timeout_s=5.0)
    try:
        res, detail = t.send(b"")
    finally:
        t.close()
    assert res == Outcome.DROP and is_auth_failure(detail) is auth, detail
    assert hits(detail) == 0 and "***" in detail, detail


# -- the analyzer's backends (basic auth in the URL) --------------------------------------------------------------
def _cli(args: list[str], tmp: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cptrace_otel.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp, env=_env(CPTRACE_QUERY_DEADLINE_S="10"))


def _userinfo_url(base: str, path: str) -> str:
    return base.replace("://", f"://alice:{quote(PASSWORD, safe='')}@") + path


@pytest.mark.parametrize("mode", ["m401", "m500", "msame"])
@pytest.mark.parametrize("backend", ["jaeger", "tempo"])
def test_check_against_an_echoing_backend_prints_no_password(tmp_path: Path, echo_http: EchoHttp, mode: str,
                                                             backend: str) -> None:
    url = _userinfo_url(echo_http.base, f"/{mode}")
    r = _cli(["check", f"--{backend}", url, "--run-id", "r1"], tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert hits(r.stdout + r.stderr, PASSWORD) == 0, r.stderr
    assert "unreachable" not in r.stderr and "cannot reach" not in r.stderr, r.stderr
    want = "HTTP 500" if mode == "m500" else "authentication failed"
    assert want in r.stderr and "127.0.0.1" in r.stderr, r.stderr


def test_watch_against_an_echoing_jaeger_prints_no_password(tmp_path: Path, echo_http: EchoHttp) -> None:
    r = _cli(["watch", "--jaeger", _userinfo_url(echo_http.base, "/m401"), "--once"], tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert hits(r.stdout + r.stderr, PASSWORD) == 0, r.stderr
    assert "authentication failed" in r.stderr and "cannot reach" not in r.stderr, r.stderr


def test_alertmanager_that_echoes_the_password_is_reported_masked(echo_http: EchoHttp) -> None:
    from types import SimpleNamespace

    from cptrace_otel.analyze.finding_sinks import Alerts

    notes: list[str] = []
    am = Alerts(_userinfo_url(echo_http.base, "/m401"), interval_s=30.0, note=notes.append)
    am.found("r1", SimpleNamespace(code="X1", rank=0, message="m", rule="r", node_id=1), "http://jaeger/trace/1")
    assert am.post() is False
    text = "\n".join(notes)
    assert hits(text, PASSWORD) == 0, text
    assert "authentication failed" in text and "127.0.0.1" in text, text


def test_report_links_carry_no_password(tmp_path: Path) -> None:
    """``report --jaeger-url`` with ``user:password@``: the page's links point at Jaeger without the credential."""
    log = tmp_path / "r.log"
    log.write_text("[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE backup] node_id=1 op=1 rank=0\n"
                   "[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE evict] node_id=1 tier=dev\n")
    r = _cli(["report", str(log), "-o", str(tmp_path / "out.html"), "--run-id", "r1", "--no-progress",
              "--jaeger-url", _userinfo_url("http://127.0.0.1:16686", "")], tmp_path)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "out.html").read_text()
    assert "http://127.0.0.1:16686/search?" in page   # the links are there
    assert hits(page + r.stdout + r.stderr, PASSWORD) == 0 and "alice" not in page


# -- the masker ----------------------------------------------------------------------------------------------------
_SECRET = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_characters="*@"),
                  min_size=config.MIN_SECRET_CHARS, max_size=24)
_FILLER = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters="*@"), max_size=30)


def _encoded(s: str) -> list[str]:
    raw = s.encode()
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(s, safe=""))
    return [s, quote(s, safe=""), quote(s), quote_plus(s), lower_hex,
            base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
            base64.b64encode(raw).decode().rstrip("=")]


@settings(max_examples=300, deadline=None)
@given(token=_SECRET, user=_SECRET, pw=_SECRET, fill=st.lists(_FILLER, min_size=6, max_size=6),
       pick=st.lists(st.integers(0, 100), min_size=5, max_size=5))
def test_mask_property_no_form_of_any_credential_survives(token: str, user: str, pw: str, fill: list[str],
                                                          pick: list[int]) -> None:
    url = f"http://{quote(user, safe='')}:{quote(pw, safe='')}@host:4318/v1/traces"
    basic = base64.b64encode(f"{pw}:{token}".encode()).decode()   # a Basic header's user and password
    secrets = config.secrets_of(url, [("authorization", f"Bearer {token}"), ("proxy-authorization",
                                                                             f"Basic {basic}")])
    pieces = [token, user, pw, f"{user}:{pw}", f"{pw}:{token}"]
    chosen = [(_encoded(p)[i % 8]) for p, i in zip(pieces, pick, strict=False)]
    text = fill[0] + "".join(c + f for c, f in zip(chosen, fill[1:], strict=False))
    out = config.mask(text, secrets)
    for p in pieces:
        for f in _encoded(p):
            if len(f) >= config.MIN_SECRET_CHARS:
                assert f not in out, (f, out)


@settings(max_examples=300, deadline=None)
@given(token=_SECRET, text=_FILLER)
def test_mask_property_text_without_a_secret_is_unchanged(token: str, text: str) -> None:
    secrets = config.secrets_of("http://host:4318", [("authorization", f"Bearer {token}")])
    if any(f in text for f in secrets):
        return   # (the filler happened to hold a form of the token: the other property's case)
    assert config.mask(text, secrets) == text


def test_mask_leaves_short_pieces_and_the_scheme_word() -> None:
    """A credential piece under MIN_SECRET_CHARS is not masked (it would garble text); the scheme word is text."""
    secrets = config.secrets_of("http://ab:cd@h", [("authorization", "Bearer xyz")])
    assert config.mask("Bearer tokens: ab cd xyz", secrets) == "Bearer tokens: ab cd xyz"
    secrets = config.secrets_of(None, [("authorization", "Basic " + base64.b64encode(b"alice:hunter22").decode())])
    assert config.mask("user alice, password hunter22", secrets) == "user ***, password ***"


def test_a_refusing_backend_is_named_a_bounded_number_of_times(tmp_path) -> None:  # noqa: ANN001
    """Every request refused with a 401: the refusal is named at its first occurrence and then at most every report
    interval, with a running count, not once per request; every record is counted."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from cptrace_otel.export.otlp_http import HttpTransport
    from cptrace_otel.export.spool import ReliableSender

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b"invalid token"
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:  # noqa: ANN002
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        t = HttpTransport(f"http://127.0.0.1:{srv.server_address[1]}/v1/traces", [("authorization", "Bearer tok")],
                          timeout_s=2.0)
        reports: list[str] = []
        s = ReliableSender(t, str(tmp_path / "spool"), report=reports.append, report_every_s=3600.0)
        for _ in range(20):
            s.submit(b"", records=2)
        s.flush(10.0)
        st = s.stats()
        s.close(1.0)
    finally:
        srv.shutdown()
    assert st["lost_records"] == 40
    assert len(reports) == 1 and "authentication failed" in reports[0]
