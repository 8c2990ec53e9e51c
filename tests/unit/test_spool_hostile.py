"""the spool reads only regular files it created. A symlink, FIFO or device planted in a spool folder (the
exporter's own, or a finished process's that it adopts) is reported and skipped: never read, never sent, never
blocks the sender; spool folders are 0700 and request files 0600. Real files, real FIFOs, a real loopback receiver."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from cptrace_otel.export.otlp_http import HttpTransport
from cptrace_otel.export.ownfiles import read_own_file, secure_dir
from cptrace_otel.export.spool import ReliableSender, Spool
from tests.helpers.otlp_receiver import HttpReceiver

SECRET = b"-----BEGIN PRIVATE KEY----- do not send me"
REPO = Path(__file__).resolve().parents[2]


def _orphan(root: Path, name: str, endpoint: str) -> Path:
    """A finished process's spool folder as an exporter leaves it (its lock free)."""
    d = root / name
    d.mkdir(parents=True, mode=0o700)
    (root / f"{name}.endpoint").write_text(endpoint)
    (root / f"{name}.lock").write_text("")
    return d


def _secret_file(tmp: Path) -> Path:
    p = tmp / "id_key"
    p.write_bytes(SECRET)
    p.chmod(0o600)
    return p


def _request_body() -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    return trace_service_pb2.ExportTraceServiceRequest().SerializeToString()


def test_links_fifos_and_devices_in_an_orphaned_spool_are_skipped_not_sent(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with HttpReceiver() as rx:
        t = HttpTransport(rx.url, [("x-api-key", "k-123456")], timeout_s=5.0)
        d = _orphan(root, "old-1", t.url)
        (d / "000000000001.otlp").write_bytes(_request_body())      # a real request: replayed
        os.symlink(_secret_file(tmp_path), d / "000000000002.otlp")  # the attack: POST the link's target
        os.mkfifo(d / "000000000003.otlp")                           # would block open() for ever
        os.symlink("/dev/zero", d / "000000000004.otlp")             # would never end
        reports: list[str] = []
        s = ReliableSender(t, str(root / "mine"), report=reports.append)
        done = threading.Event()
        threading.Thread(target=lambda: (s.adopt_orphans(), done.set()), daemon=True).start()
        assert done.wait(30), "adoption blocked on a FIFO"
        assert s.flush(10.0)
        st = s.stats()
        s.close(1.0)
        bodies = [n for _p, _h, n in rx.seen]
    assert st["sent_requests"] == 1 and st["spool_skipped_files"] == 3
    assert not rx.errors and len(bodies) == len(rx.requests) == 1  # only the real request went out
    skipped = [r for r in reports if "skipped" in r]
    assert len(skipped) == 3 and any("symbolic link" in r for r in skipped) and any("FIFO" in r for r in skipped)
    assert (d / "000000000003.otlp").exists()  # left alone, not deleted


def test_a_spool_file_replaced_by_a_link_or_fifo_is_skipped_and_counted(tmp_path: Path) -> None:
    sp = Spool(str(tmp_path / "s"))
    reports: list[str] = []
    sp.report = reports.append
    assert sp.push(b"a" * 10, records=4) and sp.push(b"b" * 10, records=5) and sp.push(b"c" * 10, records=6)
    names = [n for n, _b, _r in sp._names]
    os.unlink(names[0])
    os.symlink(_secret_file(tmp_path), names[0])
    os.unlink(names[1])
    os.mkfifo(names[1])
    assert sp.peek() == b"c" * 10  # the two planted files skipped without blocking
    assert sp.skipped == 2 and sp.dropped_records == 9 and sp.bytes == 10
    assert len(reports) == 2


def test_spool_folder_0700_and_files_0600(tmp_path: Path) -> None:
    sp = Spool(str(tmp_path / "root" / "run-1"))
    assert sp.push(b"x", 1)
    for d in (tmp_path / "root", tmp_path / "root" / "run-1"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    f = sp._names[0][0]
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    for side in (".lock", ".endpoint"):
        assert stat.S_IMODE(os.stat(str(tmp_path / "root" / "run-1") + side).st_mode) == 0o600


def test_an_existing_open_folder_is_tightened_and_a_linked_one_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o777)
    secure_dir(str(open_dir))
    assert stat.S_IMODE(open_dir.stat().st_mode) == 0o700
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, tmp_path / "linked")
    with pytest.raises(OSError, match="not a directory"):
        secure_dir(str(tmp_path / "linked"))
    sp = Spool(str(tmp_path / "linked"))
    reports: list[str] = []
    sp.report = reports.append
    assert sp.push(b"x", 1)  # kept in memory, said so; nothing written through the link
    assert list(target.iterdir()) == [] and "spooling in memory" in reports[0]


def test_read_own_file_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    os.symlink(_secret_file(tmp_path), tmp_path / "link")
    for name, why in (("fifo", "FIFO"), ("link", "symbolic link")):
        with pytest.raises(OSError, match=why):
            read_own_file(str(tmp_path / name))
    with pytest.raises(OSError, match="device"):
        read_own_file("/dev/null")


def test_the_exporter_process_never_posts_a_planted_link(tmp_path: Path) -> None:
    """End to end: a traced process whose exporter finds an orphaned spool holding a link to a 0600 file."""
    root = tmp_path / "spool"
    with HttpReceiver() as rx:
        d = _orphan(root, "run-99999", rx.url)
        os.symlink(_secret_file(tmp_path), d / "000000000001.otlp")
        os.mkfifo(d / "000000000002.otlp")
        code = textwrap.dedent("""
            import cptrace_otel as ct
            for i in range(100):
                ct.cptrace(1, "evict", node_id=i)
            assert ct.flush(20)
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
        env.update(PYTHONPATH=str(REPO), CPTRACE_LEVEL="1", CPTRACE_RUN_ID="run", CPTRACE_CP_RANK="0",
                   CPTRACE_SPOOL_DIR=str(root), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=rx.url)
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        events = sum(len(sp.events) for sp in rx.spans())
        # every POST was a real OTLP request (the secret's bytes would not decode: the receiver answers 400)
        assert not rx.errors and len(rx.seen) == len(rx.requests)
    assert events == 100
    assert p.stderr.count("skipped") == 2, p.stderr
