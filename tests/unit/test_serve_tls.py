"""``cptrace-otel serve`` with TLS, mutual TLS and a required auth header, as a process, for both receivers
(OTLP/HTTP and OTLP/gRPC): the project's own exporter transport (configured by the OTEL_EXPORTER_OTLP_* variables, as
a rank's exporter is) sends real OTLP bytes of a simulator run to it. Certificates made in the test
(tests/helpers/otlp_receiver.py ``make_pki``, with ``cryptography``). Accepted with the CA and the header; refused
without the header (401 / UNAUTHENTICATED, nothing queued), with another CA (a TLS configuration error) and, with
mTLS, without a client certificate. The token is never printed."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from cptrace_otel.export.sinks import Outcome, is_auth_failure
from cptrace_otel.export.stack import open_transport
from cptrace_otel.model import config
from tests.helpers import free_port
from tests.helpers.integration import ROOT
from tests.helpers.otlp_receiver import make_pki

pytest.importorskip("cryptography")

TOKEN = "Bearer s3cr3t-t0ken-f0r-serve"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def bodies(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    from tests.helpers.otlp_receiver import parse_json_line

    out = tmp_path_factory.mktemp("demo")
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "2", "--faults", "HASH_flip",
                        "--out", str(out), "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    lines = [ln for f in sorted(out.glob("*.otlp.jsonl")) for ln in f.read_text().splitlines() if ln.strip()]
    return [parse_json_line(ln).SerializeToString() for ln in lines[:3]]


class TlsServe:
    """A serve process with TLS (and mTLS / a token as asked), HTTP on an ephemeral port, gRPC on a free one."""

    def __init__(self, tmp: Path, pki: dict[str, str], *extra: str, mtls: bool = False) -> None:
        self.out, self.err = tmp / "serve.out", tmp / "serve.err"
        self.grpc_port = free_port()
        tls = ["--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"]]
        if mtls:
            tls += ["--tls-client-ca", pki["ca"]]
        env = {**os.environ, "SERVE_TOKEN": TOKEN}
        self.p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", "127.0.0.1:0",
                                   "--grpc", f"127.0.0.1:{self.grpc_port}", "--idle", "1h", *tls, *extra],
                                  stdout=open(self.out, "w"), stderr=open(self.err, "w"), cwd=ROOT, env=env)
        deadline = time.monotonic() + 30
        while not (m := re.search(r"https://127\.0\.0\.1:(\d+)/", self.err.read_text())) \
                or "receivers:" not in self.err.read_text():
            assert self.p.poll() is None and time.monotonic() < deadline, self.err.read_text()
            time.sleep(0.1)
        self.url = f"https://127.0.0.1:{m[1]}"
        self.ctx = ssl.create_default_context(cafile=pki["ca"])
        if mtls:
            self.ctx.load_cert_chain(pki["client_cert"], pki["client_key"])

    def endpoint(self, protocol: str) -> str:
        return f"{self.url}/v1/traces" if protocol == "http/protobuf" else f"https://127.0.0.1:{self.grpc_port}"

    def get(self, path: str, **headers: str) -> tuple[int, str]:
        req = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self) -> dict[str, float]:
        code, text = self.get("/metrics", Authorization=TOKEN)
        assert code == 200, text
        return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                if ln and not ln.startswith("#")}

    def stop(self) -> tuple[int, str]:
        self.p.send_signal(signal.SIGTERM)
        code = self.p.wait(timeout=60)
        return code, self.out.read_text() + self.err.read_text()


def _cfg(protocol: str, ca: str, header: bool, client: tuple[str, str] | None = None) -> config.Config:
    """The exporter's configuration as a rank's exporter reads it (the OTEL_EXPORTER_OTLP_* variables)."""
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": ca}
    if header:
        env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = "Authorization=" + TOKEN.replace(" ", "%20")
    if client:
        env["OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE"], env["OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"] = client
    return config.from_env(env)


def _send(s: TlsServe, protocol: str, cfg: config.Config, body: bytes) -> tuple[Outcome, str]:
    t = open_transport(s.endpoint(protocol), protocol, cfg)
    try:
        r = t.send(body)
        return r.outcome, r.detail
    finally:
        t.close()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_exporter_with_ca_and_header_accepted_without_header_or_with_other_ca_refused(
        tmp_path: Path, pki: dict[str, str], bodies: list[bytes], protocol: str) -> None:
    s = TlsServe(tmp_path, pki, "--auth-token-env", "SERVE_TOKEN")
    try:
        for b in bodies:
            assert _send(s, protocol, _cfg(protocol, pki["ca"], header=True), b) == (Outcome.OK, "")
        held = s.metrics()["cptrace_serve_spans_received_total"]
        assert held > 0

        outcome, detail = _send(s, protocol, _cfg(protocol, pki["ca"], header=False), bodies[0])
        assert outcome != Outcome.OK and is_auth_failure(detail), (outcome, detail)

        outcome, detail = _send(s, protocol, _cfg(protocol, pki["other_ca"], header=True), bodies[0])
        assert outcome == Outcome.FATAL and "TLS" in detail, (outcome, detail)

        m = s.metrics()
        assert m["cptrace_serve_spans_received_total"] == held, "a refused request queues nothing"
        assert m["cptrace_serve_requests_unauthorized_total"] == 1
        metrics_text = s.get("/metrics", Authorization=TOKEN)[1]
    finally:
        code, printed = s.stop()
    assert code == 1, printed   # the HASH fault of the accepted records was found
    for secret in (TOKEN, TOKEN.split()[1]):
        assert secret not in printed and secret not in metrics_text


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_mutual_tls_needs_the_client_certificate(tmp_path: Path, pki: dict[str, str], bodies: list[bytes],
                                                 protocol: str) -> None:
    s = TlsServe(tmp_path, pki, mtls=True)
    try:
        client = (pki["client_cert"], pki["client_key"])
        assert _send(s, protocol, _cfg(protocol, pki["ca"], header=False, client=client), bodies[0]) == (Outcome.OK, "")
        results = [_send(s, protocol, _cfg(protocol, pki["ca"], header=False), bodies[0]) for _ in range(3)]
        assert all(o != Outcome.OK for o, _ in results), results
        if protocol == "http/protobuf":   # the handshake let it through (for the probes); the request is refused
            assert all(is_auth_failure(d) for _, d in results), results
        assert s.metrics()["cptrace_serve_spans_received_total"] == _spans(bodies[0])
        # a probe without a client certificate (a kubelet's) still reads /healthz and /readyz, nothing else
        bare = ssl.create_default_context(cafile=pki["ca"])
        for path, want in (("/healthz", 200), ("/readyz", 200), ("/metrics", 401)):
            try:
                with urllib.request.urlopen(s.url + path, timeout=10, context=bare) as r:
                    got = r.status
            except urllib.error.HTTPError as e:
                got = e.code
            assert got == want, (path, got)
    finally:
        s.stop()


def _spans(body: bytes) -> int:
    from cptrace_otel.analyze.otlp_intake import decode

    return decode(body).spans_seen


def test_probes_stay_open_metrics_and_traces_need_the_token(tmp_path: Path, pki: dict[str, str]) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    s = TlsServe(tmp_path, pki, "--auth-token-file", str(token_file))
    try:
        assert s.get("/healthz")[0] == 200
        assert s.get("/readyz")[0] == 200
        code, text = s.get("/metrics")
        assert code == 401 and TOKEN not in text
        assert s.get("/metrics", Authorization="Bearer wrong")[0] == 401
        assert s.get("/metrics", Authorization=TOKEN)[0] == 200
        req = urllib.request.Request(s.url + "/v1/traces", data=b"x" * 10, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10, context=s.ctx)
        assert e.value.code == 401
        # plaintext to the TLS port: the handshake fails, that connection only; the server goes on
        with pytest.raises(OSError):
            urllib.request.urlopen(s.url.replace("https", "http") + "/healthz", timeout=10).read()
        assert s.get("/healthz")[0] == 200
    finally:
        _code, printed = s.stop()
    assert TOKEN not in printed and "Traceback" not in printed


@pytest.mark.parametrize("flags,says", [
    (["--tls-cert", "{cert}"], "--tls-cert and --tls-key go together"),
    (["--tls-client-ca", "{ca}"], "--tls-client-ca needs --tls-cert"),
    (["--tls-cert", "{cert}", "--tls-key", "{missing}"], "not a readable file"),
    (["--tls-cert", "{key}", "--tls-key", "{key}"], "--tls-cert/--tls-key/--tls-client-ca"),
    (["--auth-token-env", "CPTRACE_TEST_NO_SUCH_VAR"], "not set"),
    (["--auth-token-file", "{empty}"], "empty"),
    (["--auth-token-file", "{token}", "--auth-token-env", "SERVE_TOKEN"], "give one"),
])
def test_bad_settings_are_usage_errors_naming_no_secret(tmp_path: Path, pki: dict[str, str], flags: list[str],
                                                        says: str) -> None:
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "token").write_text(TOKEN)
    paths = {"cert": pki["server_cert"], "key": pki["server_key"], "ca": pki["ca"],
             "missing": str(tmp_path / "nope.pem"), "empty": str(tmp_path / "empty"), "token": str(tmp_path / "token")}
    env = {**os.environ, "SERVE_TOKEN": TOKEN}
    env.pop("CPTRACE_TEST_NO_SUCH_VAR", None)
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", "127.0.0.1:0",
                        *[f.format(**paths) for f in flags]], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=env)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and TOKEN not in p.stderr + p.stdout


@settings(max_examples=300, deadline=None)
@given(token=st.binary(min_size=1, max_size=64).filter(lambda b: b"\n" not in b and b"\r" not in b),
       other=st.binary(max_size=64))
def test_guard_allows_exactly_the_token(token: bytes, other: bytes) -> None:
    """The comparison: the token itself passes (as str or bytes), any other value or none is refused; the token
    does not appear in the guard's repr or description."""
    from cptrace_otel.analyze.serve_guard import Guard

    g = Guard(header="X-Token", token=token)
    assert g.allows(token) and g.allows(token.decode("latin-1"))   # as http.server hands a header value over
    assert g.allows(other) == (other == token)
    assert not g.allows(None)
    assert Guard().allows(None) and Guard().allows(other)   # no token asked for: everything passes
    shown = Guard(token=b"Bearer zz-unique-99")
    assert "zz-unique-99" not in repr(shown) + shown.describe()


def test_deploy_checker_up_starts_a_tls_replica(tmp_path: Path, pki: dict[str, str]) -> None:
    """deploy/checker/up with CHECKER_TLS_* and CHECKER_TOKEN_FILE: the replica and the run checker serve https with
    mutual TLS and the token, their readiness checked over https with the given CA; down stops them."""
    import socket

    for port in (4331, 4341, 4351, 4361):   # the script's fixed loopback ports
        with socket.socket() as sk:
            if sk.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"127.0.0.1:{port} is in use (a replica of deploy/checker/up is running)")
    (tmp_path / "token").write_text(TOKEN + "\n")
    env = {**os.environ, "CHECKER_REPLICAS": "1", "CHECKER_RUN_DIR": str(tmp_path / "run"),
           "CHECKER_TLS_CERT": pki["server_cert"], "CHECKER_TLS_KEY": pki["server_key"], "CHECKER_TLS_CA": pki["ca"],
           "CHECKER_TLS_CLIENT_CA": pki["ca"], "CHECKER_TOKEN_FILE": str(tmp_path / "token"), "PYTHON": sys.executable}
    deploy = ROOT / "deploy" / "checker"
    up = subprocess.run(["bash", str(deploy / "up")], capture_output=True, text=True, timeout=90, env=env, cwd=ROOT)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "https://127.0.0.1:4341/readyz" in up.stdout and "https://127.0.0.1:4361/readyz" in up.stdout
        ctx = ssl.create_default_context(cafile=pki["ca"])
        ctx.load_cert_chain(pki["client_cert"], pki["client_key"])
        req = urllib.request.Request("https://127.0.0.1:4341/metrics", headers={"Authorization": TOKEN})
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            assert "cptrace_serve_requests_unauthorized_total 0" in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen("https://127.0.0.1:4341/metrics", timeout=10, context=ctx)
        assert e.value.code == 401
    finally:
        down = subprocess.run(["bash", str(deploy / "down")], capture_output=True, text=True, timeout=60, env=env)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    assert down.stdout.count("stopped") == 2, down.stdout
    logs = "".join((tmp_path / "run" / f"checker-{n}.log").read_text() for n in ("a", "run-a"))
    assert TOKEN not in up.stdout + up.stderr + logs
    assert "each run checked whole, every rule" in logs
