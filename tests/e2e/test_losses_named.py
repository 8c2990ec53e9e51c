"""Every lost record is counted, makes ``flush()`` False and is named on stderr a bounded number of times.

Each case runs a real traced child process (the real pipeline, its exporter process, an OTLP JSON-lines file as the
sink), emits N records, flushes and prints ``stats()``; the test reads back the file and asserts
``delivered + counted == emitted``, ``flush() is False`` and a handful of stderr lines naming the loss (not one per
record): a pipeline that cannot start (no free file descriptor; no address space for a thread), a ring or buffer too
small for the rate, and (in-process, the real exporter with its real file sink) a sink whose write raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

N = 20_001


def _delivered(out: Path) -> int:
    n = 0
    for f in out.parent.glob(out.name.replace("{pid}", "*")) if "{pid}" in out.name else [out]:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        n += sum(1 for ev in sp.get("events", []) if ev.get("name") == "backup")
    return n


def _run(tmp: Path, prelude: str, n: int = N, **env: str) -> tuple[dict, bool, list[str], int]:
    """Run a traced child: ``prelude`` (e.g. an rlimit) after importing the API, then ``n`` records, flush, stats.
    Returns (stats, flush result, stderr lines, delivered events)."""
    out = tmp / "rank-{pid}.otlp.jsonl"
    code = f"""
import json, os, resource, sys
import cptrace_otel as c
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
{prelude}
for i in range({n}):
    c.cptrace(1, "backup", node_id=i, op=i, path="x" * 16)
ok = c.flush(20)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))   # (the stats module may need a file to import)
import cptrace_otel.traced.pipeline as p
st = p.stats()
sys.stdout.write(json.dumps({{"ok": ok, "stats": st}}, default=str) + "\\n")
sys.stdout.flush()
c.shutdown(5)
"""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    full.update(CPTRACE_LEVEL="1", CPTRACE_RUN_ID="loss", CPTRACE_FILE=str(out), CPTRACE_SPOOL_DIR=str(tmp / "sp"),
                **env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=full)
    assert r.stdout.strip(), f"the child printed nothing: rc={r.returncode} stderr={r.stderr[-3000:]}"
    res = json.loads(r.stdout.strip().splitlines()[-1])
    lines = [x for x in r.stderr.splitlines() if x.startswith("cptrace_otel")]
    return res["stats"], res["ok"], lines, _delivered(out)


NOFILE = """
n_open = len(os.listdir("/proc/self/fd")) - 1   # (the listing's own descriptor is closed again)
resource.setrlimit(resource.RLIMIT_NOFILE, (n_open, hard))
"""

ADDRESS_SPACE = """
with open("/proc/self/status") as f:
    vm = [int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:")][0]
resource.setrlimit(resource.RLIMIT_AS, (vm + (12 << 20), resource.RLIM_INFINITY))
"""


@pytest.mark.parametrize("case", ["no-free-fd", "no-address-space"])
def test_a_pipeline_that_cannot_start_counts_and_names_its_losses(tmp_path: Path, case: str) -> None:
    st, ok, lines, delivered = _run(tmp_path, NOFILE if case == "no-free-fd" else ADDRESS_SPACE)
    assert ok is False
    assert delivered + st["dropped"] == N, (delivered, st)
    assert delivered == 0
    assert 1 <= len(lines) <= 5, lines     # said once (and the ring's set-up failure once), not once per record
    assert any("cannot start" in x for x in lines), lines


@pytest.mark.parametrize("env", [{"CPTRACE_RING_BYTES": "4096"}, {"CPTRACE_RING": "0", "CPTRACE_QUEUE_SIZE": "100"}],
                         ids=["tiny-ring", "tiny-buffer"])
def test_a_full_ring_or_buffer_makes_flush_false_and_is_named(tmp_path: Path, env: dict[str, str]) -> None:
    n = 200_000
    st, ok, lines, delivered = _run(tmp_path, "", n, **env)
    assert st["dropped"] > 0, st
    assert delivered + st["dropped"] == n, (delivered, st)
    assert ok is False
    named = [x for x in lines if "records dropped" in x]
    assert 1 <= len(named) <= 5, lines     # rate-limited, with the running count
    assert f"{st['dropped']} in all" in named[-1] or len(named) >= 1


def test_a_sink_that_fails_keeps_counting_its_losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real exporter with its real OTLP file sink as the only sink; the sink's write raises MemoryError from
    the 3rd batch on (as under a tight RLIMIT_AS): the sink leaves the list, and every record it lost from then on
    is counted in ``lost()`` (stats, cptrace.dropped), and flush() is False."""
    from cptrace_otel.export import file_sinks
    from cptrace_otel.export.worker import Exporter
    from cptrace_otel.model import config

    calls = {"n": 0}
    real = file_sinks.OtlpJsonFileSink.export

    def flaky(self, groups):  # noqa: ANN001
        calls["n"] += 1
        if calls["n"] >= 3:
            raise MemoryError
        return real(self, groups)

    monkeypatch.setattr(file_sinks.OtlpJsonFileSink, "export", flaky)
    from cptrace_otel.model import semconv as sc

    out = tmp_path / "o.otlp.jsonl"
    cfg = config.from_env({}, level=1, run_id="loss", cp_rank=0, checks=False, span_timeout_s=3600.0)
    exp = Exporter(dict(config=cfg, resource={sc.SERVICE_NAME: "t", sc.CP_RANK: 0}, instance="i", file=str(out),
                        log_file=None, spool_dir=""))
    per_batch, batches = 100, 10
    for b in range(batches):
        items = [(0, 1, "backup", {"node_id": b * per_batch + i, "op": i}) for i in range(per_batch)]
        exp.add_items(items, 0)
        exp.flush(5.0)
    st = exp.stats()
    delivered = _delivered(out)
    assert calls["n"] >= 3
    assert exp.lost() == per_batch * batches - delivered, (exp.lost(), delivered)
    assert st["lost_records"] == exp.lost()
    assert exp.flush(1.0) is False
    exp.close(1.0)


def test_a_ring_or_buffer_larger_than_the_machine_allows_is_cut_and_said_once(
        monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder) -> None:
    """``CPTRACE_RING_BYTES=2**40`` (and a byte bound as large) on this machine: each is cut to at most 1/8 of the
    smaller of physical memory and the cgroup limit (the ring to a power of two), with the reason said once."""
    from cptrace_otel.model import config

    limit, why = config.memory_limit()
    assert limit > 0 and why
    cfg = config.from_env({"CPTRACE_RING_BYTES": str(2**40), "CPTRACE_QUEUE_BYTES": str(2**41)})
    assert 4096 <= cfg.ring_bytes <= limit // config.MEMORY_FRACTION
    assert cfg.ring_bytes & (cfg.ring_bytes - 1) == 0
    assert cfg.queue_bytes <= limit // config.MEMORY_FRACTION
    said = [str(w.message) for w in recwarn if "1/8" in str(w.message)]
    assert len(said) == 2 and why in said[0]
    config.from_env({"CPTRACE_RING_BYTES": str(2**40)})
    assert len([w for w in recwarn if "1/8" in str(w.message)]) == 2   # once
    small = config.from_env({"CPTRACE_RING_BYTES": str(1 << 20)})
    assert small.ring_bytes == 1 << 20                                  # what fits is left alone


def test_the_loss_line_is_rate_limited_with_a_running_count(capsys: pytest.CaptureFixture[str]) -> None:
    from cptrace_otel.traced.losses import LossReport

    now = [0.0]
    rep = LossReport("dropped", every_s=10.0, clock=lambda: now[0])
    for total in range(1, 1001):
        now[0] += 0.01
        rep.update(total)
    now[0] += 10.0
    rep.update(1500)
    rep.update(1500)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and rep.lines == 2
    assert lines[0].startswith("cptrace_otel: 1 records dropped (1 in all")
    assert "1499 records dropped (1500 in all" in lines[1]


BROKEN_EXPORTER = """
import cptrace_otel.export.worker as w
def _cannot(info):
    raise OSError(24, "Too many open files")
w.Exporter = _cannot   # the exporter's own start fails, after the pipeline started (as with no descriptor left)
"""


def test_records_given_to_an_exporter_that_never_started_are_counted_at_shutdown(tmp_path: Path) -> None:
    """The pipeline starts, but its (thread) exporter fails to build: the records it was given are never settled.
    At shutdown they are counted as lost and named, not left as 'in flight'."""
    out = tmp_path / "rank-{pid}.otlp.jsonl"
    code = f"""
import json, sys
import cptrace_otel as c
import cptrace_otel.traced.pipeline as p
{BROKEN_EXPORTER}
for i in range(5000):
    c.cptrace(1, "backup", node_id=i, op=i)
ok = c.flush(10)
down = c.shutdown(5)
sys.stdout.write(json.dumps({{"ok": ok, "down": down, "stats": p.stats()}}, default=str) + "\\n")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env.update(CPTRACE_LEVEL="1", CPTRACE_RUN_ID="loss", CPTRACE_FILE=str(out), CPTRACE_EXPORTER="thread")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["ok"] is False and res["down"] is False
    assert res["stats"]["dropped"] == 5000 and _delivered(out) == 0
    assert "without settling 5000 records" in r.stderr
