"""Secrets never reach output. The endpoint's password and header values are masked in outage
lines, ``stats()``, warnings and ``ingest``'s messages (one helper: ``config.mask``); a header that can never be
sent (an encoded newline) is a configuration error reported once, not an outage retried every 10 s."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cptrace_otel.export.otlp_http import HttpTransport
from cptrace_otel.export.spool import ReliableSender
from cptrace_otel.export.stack import SinkError, open_sinks
from cptrace_otel.model import config
from tests.helpers import free_port

PASSWORD = "s3cretPassw0rd"
TOKEN = "tok-9f8e7d6c5b"


def test_outage_lines_and_stats_mask_the_url_password(tmp_path: Path) -> None:
    url = f"http://alice:{PASSWORD}@127.0.0.1:{free_port()}/v1/traces"  # nobody listens: an outage
    t = HttpTransport(url, [("authorization", f"Bearer {TOKEN}")], timeout_s=1.0)
    reports: list[str] = []
    s = ReliableSender(t, str(tmp_path / "spool"), report=reports.append, backoff_s=0.05, max_backoff_s=0.1,
                       report_every_s=0.0)
    s.submit(b"")
    s.flush(0.6)
    st = s.stats()
    s.close(0.2)
    text = "\n".join(reports) + repr(st)
    assert reports and "unreachable" in reports[0]
    assert PASSWORD not in text and TOKEN not in text
    assert "http://***@127.0.0.1" in st["url"]


def _traced_with_endpoint(url: str, tmp: Path, exporter: str, **more: int) -> subprocess.CompletedProcess:
    """A traced process exporting one record to ``url`` (nobody listens): it prints its stats and config."""
    extra = "".join(f", {k}={v!r}" for k, v in more.items())
    code = f"""
import cptrace_otel as c, cptrace_otel.traced.pipeline as p
c.configure(level=1, endpoint={url!r}, exporter={exporter!r}, timeout_s=0.5, spool_dir={str(tmp)!r}, run_id="t"{extra})
c.cptrace(1, "backup", node_id=1, op=1)
c.flush(3)
print(repr(p.stats()))
print(repr(c.get_config()))
c.shutdown(2)
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))})


def test_stats_of_the_pipeline_mask_the_password(tmp_path: Path) -> None:
    r = _traced_with_endpoint(f"http://bob:{PASSWORD}@127.0.0.1:{free_port()}/v1/traces", tmp_path, "thread")
    assert "unreachable" in r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    assert "***@127.0.0.1" in r.stdout


def test_malformed_header_entry_warning_hides_the_value() -> None:
    config.forget_warnings()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cfg = config.from_env({"OTEL_EXPORTER_OTLP_HEADERS": f"authorization:Bearer {TOKEN},x-ok=1"})
    assert cfg.headers == (("x-ok", "1"),)
    msgs = " ".join(str(x.message) for x in w)
    assert "malformed OTLP header" in msgs and TOKEN not in msgs


def test_header_with_an_encoded_newline_fails_fast(tmp_path: Path) -> None:
    cfg = config.from_env({"OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={TOKEN}%0A",
                           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{free_port()}/v1/traces"})
    with pytest.raises(SinkError) as ei:
        open_sinks(cfg, endpoint=cfg.endpoint, spool_dir=str(tmp_path / "s"))
    assert ei.value.kind == "config" and "x-api-key" in str(ei.value) and TOKEN not in str(ei.value)
    errs: list[SinkError] = []
    (sink,) = open_sinks(cfg, endpoint=cfg.endpoint, spool_dir=str(tmp_path / "s"), on_error=errs.append)
    assert len(errs) == 1
    sink.export([({}, [object(), object()])])
    st = sink.stats()
    assert sink.flush(0.1) is False and st["otlp_dropped_spans"] == 2 and TOKEN not in repr(st)


def test_header_newline_through_the_pipeline_is_reported_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env.update(OTEL_EXPORTER_OTLP_HEADERS=f"x-api-key={TOKEN}%0A", CPTRACE_EXPORTER="thread",
               OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{free_port()}/v1/traces",
               CPTRACE_SPOOL_DIR=str(tmp_path), CPTRACE_RUN_ID="t")
    code = """
import time, cptrace_otel as c, cptrace_otel.traced.pipeline as p
c.configure(level=1)
for i in range(100):
    c.cptrace(1, "backup", node_id=i, op=1)
print(c.flush(5))
time.sleep(1.0)
print(p.stats()["worker"].get("otlp_dropped_spans"), p.stats()["dropped"])
c.shutdown(2)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    out = r.stdout.split()
    assert out[0] == "False" and int(out[1]) >= 1 and int(out[2]) == 100  # every record counted as dropped
    assert r.stderr.count("configuration error") == 1, r.stderr
    assert "InvalidHeader" not in r.stderr and TOKEN not in r.stderr + r.stdout
    assert not any(Path(tmp_path).rglob("*.otlp"))  # nothing spooled


def test_ingest_masks_the_password(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text("[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE backup] node_id=1 op=1\n")
    url = f"http://carol:{PASSWORD}@127.0.0.1:{free_port()}/v1/traces"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    r = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", str(log), "--endpoint", url],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0
    assert "unreachable" in r.stderr and "***@127.0.0.1" in r.stderr
    assert PASSWORD not in r.stdout + r.stderr


def test_ingest_with_an_endpoint_that_is_no_url_is_a_usage_error_without_the_password(tmp_path: Path) -> None:
    """An endpoint urllib cannot parse (an unclosed IPv6 bracket) is a clear usage error (exit 2), never an internal
    error, and its message masks the password."""
    log = tmp_path / "r.log"
    log.write_text("[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE backup] node_id=1 op=1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    r = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", str(log), "--endpoint",
                        f"http://carol:{PASSWORD}@[::1/v1/traces"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 2, r.stderr
    assert "bad OTLP endpoint" in r.stderr and "internal error" not in r.stderr
    assert PASSWORD not in r.stdout + r.stderr


def test_mask_property() -> None:
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.given(user=st.text("abcdefghij", min_size=1, max_size=8),
               pw=st.text("ABCDEFGHIJ0123456789!$&'()+,;=-._~", min_size=3, max_size=20),
               hv=st.text(st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="*"),
                          min_size=3, max_size=30))
    @hyp.settings(max_examples=200, deadline=None)
    def check(user: str, pw: str, hv: str) -> None:
        url = f"http://{user}:{pw}@host:4318/v1/traces"
        secrets = config.secrets_of(url, [("authorization", hv)])
        out = config.mask(f"POST {url} failed: header authorization={hv} rejected", secrets)
        assert pw not in out and hv not in out
        assert config.mask_url(url) == "http://***@host:4318/v1/traces"

    check()


# -- credentials go only to the origin they were configured for -----------------------------------------
def _send_through(url: str, headers: list[tuple[str, str]], tmp: Path) -> tuple[dict, list[str]]:
    t = HttpTransport(url, headers, timeout_s=5.0)
    reports: list[str] = []
    s = ReliableSender(t, str(tmp / "spool"), report=reports.append, backoff_s=0.05, max_backoff_s=0.1)
    s.submit(b"", records=3)
    s.flush(5.0)
    st = s.stats()
    s.close(1.0)
    return st, reports


@pytest.mark.parametrize("status", [307, 308, 302])
def test_a_redirect_to_another_origin_is_not_followed_and_sends_no_credentials(tmp_path: Path, status: int) -> None:
    """A 307/308 (or any redirect) to another loopback address is another origin: the spans and the headers stay
    home; the refusal is reported once (masked) and the request's records are counted as lost."""
    from tests.helpers.otlp_receiver import HttpReceiver

    with HttpReceiver(host="127.0.0.2") as other, \
            HttpReceiver(redirect=None) as origin_rx:
        origin_rx.redirect = other.url
        origin_rx.redirect_status = status
        url = f"http://alice:{PASSWORD}@127.0.0.1:{origin_rx.port}/v1/traces"
        st, reports = _send_through(url, [("x-api-key", TOKEN)], tmp_path)
        assert other.seen == [] and other.spans() == []          # nothing reached the other origin
        assert len(origin_rx.seen) == 1                          # the origin got the request, with its credentials
        hdrs = origin_rx.seen[0][1]
        assert hdrs["x-api-key"] == TOKEN and hdrs["authorization"].startswith("Basic ")
    assert st["redirects_refused"] == 1 and st["lost_records"] == 3 and st["config_error"]
    text = "\n".join(reports) + repr(st)
    assert "not followed" in text and "127.0.0.2" in text
    assert PASSWORD not in text and TOKEN not in text


def test_a_same_origin_307_is_followed_with_the_body_and_credentials(tmp_path: Path) -> None:
    from tests.helpers.otlp_receiver import HttpReceiver

    with HttpReceiver(redirect="/v1/traces", redirect_from="/old") as rx:
        url = f"http://alice:{PASSWORD}@127.0.0.1:{rx.port}/old"
        st, reports = _send_through(url, [("x-api-key", TOKEN)], tmp_path)
        paths = [p for p, _h, _n in rx.seen]
        assert paths == ["/old", "/v1/traces"]
        assert all(h["x-api-key"] == TOKEN and h["authorization"].startswith("Basic ") for _p, h, _n in rx.seen)
    assert st["sent_requests"] == 1 and st["redirects_refused"] == 0 and not reports


@pytest.mark.parametrize("shape", ["http://alice:{pw}/x@127.0.0.1:{port}/v1/traces",
                                   "http://alice:{pw}@@127.0.0.1:{port}/v1/traces",
                                   "http://alice:{pw} x@127.0.0.1:{port}/v1/traces",
                                   "alice:{pw}@127.0.0.1:{port}"])
def test_a_malformed_endpoint_is_never_printed_with_its_password(tmp_path: Path, shape: str) -> None:
    """Whatever the endpoint's shape, the exporter's messages (set-up errors, outage lines, stats, the config's
    repr) never hold its password."""
    r = _traced_with_endpoint(shape.format(pw=PASSWORD, port=free_port()), tmp_path, "process", cp_rank=0)
    out = r.stdout + r.stderr
    assert "Config(" in out, out
    assert PASSWORD not in out, out
