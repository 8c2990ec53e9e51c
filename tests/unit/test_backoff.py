"""``Retry-After`` on 429/503 is honoured (seconds or an HTTP date) and new requests never cut a
pause short. Against a real local HTTP server (tests/otlp_receiver.py) answering 429/503 with Retry-After."""

from __future__ import annotations

import email.utils
import time
from pathlib import Path

import pytest

from cptrace_otel.export.otlp_http import MAX_RETRY_AFTER_S, HttpTransport, parse_retry_after
from cptrace_otel.export.otlp_proto import encode_requests
from cptrace_otel.export.spool import ReliableSender
from cptrace_otel.model.spans import Span
from tests.helpers.otlp_receiver import HttpReceiver


def _body(i: int) -> bytes:
    sp = Span(i.to_bytes(16, "big"), b"\x02" * 8, "hicache.node", 1, 2, ("k",), {"i": i})
    return encode_requests([({"service.name": "t"}, [sp])])[0]


def test_parse_retry_after() -> None:
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("100000") == MAX_RETRY_AFTER_S
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28.0 <= parse_retry_after(date, now=now) <= 31.0
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


@pytest.mark.parametrize("status,form", [(429, "seconds"), (503, "date")])
def test_retry_after_is_honoured_and_new_requests_do_not_shorten_it(status: int, form: str,
                                                                    tmp_path: Path) -> None:
    pause = 2.0
    value = "2" if form == "seconds" else email.utils.formatdate(time.time() + 3, usegmt=True)
    with HttpReceiver(fail_status=status, fail_count=1, retry_after=value) as rx:
        s = ReliableSender(HttpTransport(rx.url, timeout_s=5.0), str(tmp_path / "sp"), backoff_s=0.05,
                           max_backoff_s=0.1, report=lambda m: None)
        s.submit(_body(0))
        t0 = time.monotonic()
        # new requests keep arriving during the pause: they must wait behind it, not trigger retries
        while time.monotonic() - t0 < pause - 0.5:
            s.submit(_body(len(rx.attempts) + 1000))
            time.sleep(0.02)
        assert len(rx.attempts) == 1, f"retried {len(rx.attempts) - 1} times inside Retry-After"
        assert s.flush(15.0)
        s.close(1.0)
        assert rx.attempts[1] - rx.attempts[0] >= pause - 0.1
        ids = [sp.trace_id for sp in rx.spans()]
        assert int.from_bytes(bytes.fromhex(ids[0]) if isinstance(ids[0], str) else ids[0], "big") == 0


def test_exponential_backoff_is_not_cut_short_by_new_requests(tmp_path: Path) -> None:
    """503 without Retry-After: attempts are spaced by the backoff (0.4 s here), however many requests come in."""
    with HttpReceiver(fail_status=503) as rx:
        s = ReliableSender(HttpTransport(rx.url, timeout_s=5.0), str(tmp_path / "sp"), backoff_s=0.4,
                           max_backoff_s=0.8, report=lambda m: None)
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 1.5:
            s.submit(_body(i))
            i += 1
            time.sleep(0.005)
        n = len(rx.attempts)
        s.close(0.1)
        assert i > 100
        # attempts at ~0, 0.4, 1.2 (doubling): a handful, not one per new request
        assert 2 <= n <= 4, n
        gaps = [b - a for a, b in zip(rx.attempts, rx.attempts[1:], strict=False)]
        assert all(g >= 0.35 for g in gaps), gaps
