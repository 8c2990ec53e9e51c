"""OTLP over TLS with a private CA and with mTLS, for HTTP and gRPC, against the in-repo receiver
serving a throw-away PKI (tests/otlp_receiver.py ``make_pki``). A certificate problem is a configuration error
(``FATAL``, or a ``ConfigError`` at construction) with a clear message, never an outage that spools."""

from __future__ import annotations

from pathlib import Path

import pytest

from cptrace_otel.export.otlp_proto import encode_requests
from cptrace_otel.export.sinks import ConfigError, Outcome
from cptrace_otel.export.spool import ReliableSender
from cptrace_otel.export.stack import SinkError, open_sinks, open_transport
from cptrace_otel.model import config
from cptrace_otel.model.spans import Span
from tests.helpers.otlp_receiver import GrpcReceiver, HttpReceiver, ServerTls, make_pki

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def _body() -> bytes:
    sp = Span(b"\x01" * 16, b"\x02" * 8, "hicache.node", 1, 2, ("k",), {"hicache.rank": 0})
    return encode_requests([({"service.name": "t"}, [sp])])[0]


def _cfg(protocol: str, **tls: str | bool | None) -> config.Config:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    names = {"certificate": "CERTIFICATE", "client_certificate": "CLIENT_CERTIFICATE",
             "client_key": "CLIENT_KEY", "insecure": "INSECURE"}
    for k, v in tls.items():
        if v is not None:
            env["OTEL_EXPORTER_OTLP_TRACES_" + names[k]] = str(v).lower() if isinstance(v, bool) else v
    return config.from_env(env)


PROTOCOLS = [("http/protobuf", HttpReceiver), ("grpc", GrpcReceiver)]


@pytest.mark.parametrize("protocol,receiver", PROTOCOLS)
def test_env_variables_are_read(protocol: str, receiver: type, pki: dict[str, str]) -> None:
    cfg = _cfg(protocol, certificate=pki["ca"], client_certificate=pki["client_cert"], client_key=pki["client_key"],
               insecure=False)
    assert (cfg.certificate, cfg.client_certificate, cfg.client_key, cfg.insecure) == (
        pki["ca"], pki["client_cert"], pki["client_key"], False)
    generic = config.from_env({"OTEL_EXPORTER_OTLP_CERTIFICATE": pki["ca"]})
    assert generic.certificate == pki["ca"]


@pytest.mark.parametrize("mtls", [False, True], ids=["private-ca", "mtls"])
@pytest.mark.parametrize("protocol,receiver", PROTOCOLS)
def test_tls_delivers(protocol: str, receiver: type, mtls: bool, pki: dict[str, str]) -> None:
    """A private CA verifies the receiver; with mTLS the receiver requires our client certificate."""
    client = dict(client_certificate=pki["client_cert"], client_key=pki["client_key"]) if mtls else {}
    with receiver(tls=ServerTls(pki["server_cert"], pki["server_key"], client_ca=pki["ca"] if mtls else None)) as rx:
        t = open_transport(rx.url, protocol, _cfg(protocol, certificate=pki["ca"], **client))
        try:
            assert t.send(_body()) == (Outcome.OK, "")
        finally:
            t.close()
        assert len(rx.spans()) == 1


@pytest.mark.parametrize("protocol,receiver", PROTOCOLS)
def test_mtls_without_client_certificate_is_a_config_error(protocol: str, receiver: type,
                                                            pki: dict[str, str]) -> None:
    with receiver(tls=ServerTls(pki["server_cert"], pki["server_key"], client_ca=pki["ca"])) as rx:
        t = open_transport(rx.url, protocol, _cfg(protocol, certificate=pki["ca"]))
        try:
            # A TLS 1.3 server just closes the handshake: a few in a row (tls.TLS_STRIKES) are a config error
            results = [t.send(_body()) for _ in range(3)]
        finally:
            t.close()
        fatal = [d for r, d in results if r == Outcome.FATAL]  # the sender stops at the first
        assert fatal, results
        assert "TLS configuration error" in fatal[0]
        assert rx.spans() == []


@pytest.mark.parametrize("protocol,receiver", PROTOCOLS)
def test_untrusted_server_is_a_config_error_not_an_outage(protocol: str, receiver: type, pki: dict[str, str],
                                                          tmp_path: Path) -> None:
    """The server's certificate is not signed by the configured CA: reported once, nothing spooled or retried."""
    with receiver(tls=ServerTls(pki["server_cert"], pki["server_key"])) as rx:
        t = open_transport(rx.url, protocol, _cfg(protocol, certificate=pki["other_ca"]))
        reports: list[str] = []
        s = ReliableSender(t, str(tmp_path / "spool"), report=reports.append, backoff_s=0.05)
        for _ in range(5):
            s.submit(_body())
        assert s.flush(10.0) is False  # lost to a configuration error
        st = s.stats()
        s.close(1.0)
        assert st["failed_requests"] == 5 and st["spool_pending"] == 0 and st["spooled_requests"] == 0
        assert st["config_error"].startswith("TLS configuration error")
        assert not st["backend_down"]
        assert len(reports) == 1 and "not retrying" in reports[0]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_unreadable_or_bad_tls_files_fail_at_setup(protocol: str, pki: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    cases = [
        (dict(certificate=str(tmp_path / "missing.pem")), "cannot read"),
        (dict(certificate=str(bad)), "is not a PEM CA certificate"),
        (dict(client_certificate=pki["client_cert"]), "must be set together"),
        (dict(client_certificate=pki["client_cert"], client_key=pki["server_key"]), "do not load"),
    ]
    for tls, words in cases:
        with pytest.raises(ConfigError, match=words):
            open_transport("https://127.0.0.1:1/v1/traces", protocol, _cfg(protocol, **tls))
        errs: list[SinkError] = []
        sinks = open_sinks(_cfg(protocol, **tls), endpoint="https://127.0.0.1:1/v1/traces", protocol=protocol,
                           spool_dir=str(tmp_path / "sp"), on_error=errs.append)
        assert [e.kind for e in errs] == ["config"] and words in str(errs[0].cause)
        assert len(sinks) == 1 and sinks[0].flush(0.1) is False  # refuses, counts, never retries


def test_grpc_insecure_flag_for_a_scheme_less_endpoint(pki: dict[str, str]) -> None:
    from cptrace_otel.export.otlp_grpc import grpc_target

    assert grpc_target("127.0.0.1:4317") == ("127.0.0.1:4317", False)
    assert grpc_target("127.0.0.1:4317", insecure=True) == ("127.0.0.1:4317", False)
    assert grpc_target("127.0.0.1:4317", insecure=False) == ("127.0.0.1:4317", True)
    with GrpcReceiver(tls=ServerTls(pki["server_cert"], pki["server_key"])) as rx:
        t = open_transport(f"127.0.0.1:{rx.port}", "grpc", _cfg("grpc", certificate=pki["ca"], insecure=False))
        try:
            assert t.url.startswith("https://")
            assert t.send(_body()) == (Outcome.OK, "")
        finally:
            t.close()
