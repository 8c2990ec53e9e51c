"""cptrace_otel.analyze.links: Jaeger trace and search URLs for people, and the Jaeger client's offline behaviour."""

from __future__ import annotations

import json
import socket
from urllib.parse import parse_qs, urlsplit

import pytest

from cptrace_otel.analyze import links
from cptrace_otel.analyze.sources import jaeger as jsrc

TID = "0af7651916cd43dd8448eb211c80319c"


def test_trace_url_accepts_hex_bytes_and_int():
    base = "http://127.0.0.1:16686"
    assert links.trace_url(base, TID) == f"{base}/trace/{TID}"
    assert links.trace_url(base + "/", TID.upper()) == f"{base}/trace/{TID}"
    assert links.trace_url(base, bytes.fromhex(TID)) == f"{base}/trace/{TID}"
    assert links.trace_url(base, int(TID, 16)) == f"{base}/trace/{TID}"
    assert links.trace_url("jaeger:16686", "ab") == "http://jaeger:16686/trace/" + "0" * 30 + "ab"


@pytest.mark.parametrize("bad", ["", "xyz", "0" * 32, "1" * 33, b"\x01" * 8, 0, -5, 1 << 128, None, 1.5])
def test_trace_url_rejects_invalid_ids(bad):
    with pytest.raises(ValueError):
        links.trace_url("http://h:16686", bad)


def test_search_url_encodes_tags_as_a_json_object_of_strings():
    url = links.search_url("http://127.0.0.1:16686", "sglang-hicache", {"hicache.node_id": 17, "ok": True},
                           lookback="2h", limit=5)
    parts = urlsplit(url)
    assert parts.path == "/search"
    q = parse_qs(parts.query)
    assert q["service"] == ["sglang-hicache"]
    assert json.loads(q["tags"][0]) == {"hicache.node_id": "17", "ok": "true"}  # Jaeger compares strings
    assert q["lookback"] == ["2h"] and q["limit"] == ["5"]
    assert "%7B%22hicache.node_id%22%3A%2217%22" in url  # the form the Jaeger UI itself produces
    assert " " not in url and "+" not in url


def test_search_url_validates_arguments():
    with pytest.raises(ValueError):
        links.search_url("http://h", "", {})
    with pytest.raises(ValueError):
        links.search_url("http://h", "s", {}, lookback="1 hour")
    with pytest.raises(ValueError):
        links.search_url("http://h", "s", {}, limit=0)
    with pytest.raises(ValueError):
        links.search_url("", "s", {})


def test_node_and_rid_search_urls_narrow_to_the_run():
    q = parse_qs(urlsplit(links.node_search_url("http://h:1", 5, run_id="r1", rank=2)).query)
    assert json.loads(q["tags"][0]) == {"hicache.node_id": "5", "cptrace.run_id": "r1", "sglang.cp.rank": "2"}
    q = parse_qs(urlsplit(links.node_search_url("http://h:1", 5)).query)
    assert json.loads(q["tags"][0]) == {"hicache.node_id": "5"}
    q = parse_qs(urlsplit(links.rid_search_url("http://h:1", "req 42", run_id="r1")).query)
    assert json.loads(q["tags"][0]) == {"hicache.rid": "req 42", "cptrace.run_id": "r1"}


def test_node_trace_url_is_the_exporters_trace_id():
    from cptrace_otel.model import spans

    url = links.node_trace_url("http://h:16686", "run-a", 0, 17)
    assert url == "http://h:16686/trace/" + spans.node_trace_id("run-a", 0, 17).hex()
    assert links.node_trace_url("http://h:16686", "run-a", 1, 17) != url
    want = spans.request_trace_id("run-a", "r9").hex()
    assert links.request_trace_url("http://h:16686", "run-a", "r9").endswith(want)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_client_unreachable_error_carries_the_url():
    port = _closed_port()
    c = jsrc.JaegerClient(f"http://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(jsrc.JaegerUnreachable) as ei:
        c.search("sglang-hicache", {"hicache.node_id": 1})
    assert f"127.0.0.1:{port}/api/traces" in str(ei.value) and ei.value.url.startswith(f"http://127.0.0.1:{port}")
    assert isinstance(ei.value, OSError)  # callers mapping "cannot reach a source" to exit 3 can catch OSError


def test_events_from_otlp_json_inverts_the_attribute_mapping():
    td = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "sglang-hicache"}},
                                    {"key": "sglang.cp.rank", "value": {"intValue": "1"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": TID, "spanId": "00f067aa0ba902b7", "name": "hicache.h2d",
            "attributes": [{"key": "hicache.node_id", "value": {"intValue": "5"}},
                           {"key": "sglang.cp.rank", "value": {"intValue": "1"}},
                           {"key": "cptrace.violation", "value": {"stringValue": "HASH"}}],
            "events": [
                {"name": "ack", "timeUnixNano": "1700000000000000123",
                 "attributes": [{"key": "hicache.dir", "value": {"stringValue": "h2d"}},
                                {"key": "hicache.node_id", "value": {"intValue": "5"}},
                                {"key": "hicache.dev.cnt", "value": {"intValue": "64"}},
                                {"key": "hicache.dev.min", "value": {"intValue": "900"}},
                                {"key": "hicache.dev.max", "value": {"intValue": "963"}},
                                {"key": "hicache.dev.first", "value": {"intValue": "900"}},
                                {"key": "hicache.dev.last", "value": {"intValue": "963"}},
                                {"key": "hicache.h", "value": {"intValue": "-9223372036854775807"}},
                                {"key": "cptrace.seq", "value": {"intValue": "7"}},
                                {"key": "cptrace.epoch", "value": {"intValue": "0"}},
                                {"key": "cptrace.record.level", "value": {"intValue": "2"}}]},
                {"name": "hicache.violation", "timeUnixNano": "1700000000000000124",
                 "attributes": [{"key": "code", "value": {"stringValue": "HASH"}},
                                {"key": "message", "value": {"stringValue": "reload hash != backup hash"}}]},
            ]}]}]}]}
    (ev,) = jsrc.events_from_otlp(td, src="http://j")
    assert (ev.tag, ev.rank, ev.seq, ev.epoch, ev.level, ev.ts) == ("ack", 1, 7, 0, 2, 1700000000000000123)
    assert ev.fields["dir"] == "h2d" and ev.fields["node_id"] == 5 and ev.fields["h"] == -9223372036854775807
    assert tuple(ev.fields["dev"]) == (64, 900, 963, 900, 963)
    (f,) = jsrc.findings_from_otlp(td)
    assert f["code"] == "HASH" and f["trace_id"] == TID and f["codes"] == "HASH" and f["rank"] == 1
