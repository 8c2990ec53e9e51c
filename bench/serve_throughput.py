"""One ``cptrace-otel serve`` replica's records per CPU second, side by side with ``cptrace-otel check`` over the same
records, in one run.

The records: the clean replicated-mode log of bench/check_throughput.py (``--lines`` per rank, ``--ranks`` ranks),
replayed into OTLP by ``cptrace-otel ingest --file`` (the exporter's span model: node traces, lanes, stage spans),
then encoded as protobuf requests. Two measurements, each a fresh process whose CPU time (user + system, from
``wait4``) is what is reported, so the figure is per core of that process's own CPU whatever else the machine runs:

* ``serve``: a replica receives every request over OTLP/HTTP from this process, then SIGTERM (everything held is
  checked); records / its CPU seconds. ``--idle`` defaults to 1h here, so every record is checked once: with a
  short window, a node trace whose spans arrive further apart than it (a node reloaded long after its backup, or
  this loaded machine slowing the sender) is checked in parts and its later records are counted as late, not checked
  (the replica's summary says how many; this benchmark prints it). It includes
  HTTP, protobuf decoding, holding by trace and the rules (Python rule core).
* ``check``: ``cptrace-otel check`` over the same OTLP JSON-lines file; records / its CPU seconds.

    python bench/serve_throughput.py                   # 50k lines per rank, 2 ranks
    python bench/serve_throughput.py --lines 200000

The ratio serve/check says what the intake (HTTP + protobuf + per-trace holding) costs over check's file reading.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def _cpu_of(p: subprocess.Popen) -> tuple[int, float]:
    """Wait for ``p``; (exit status, user + system CPU seconds of the process and its waited-for children). Both
    measured processes pay the interpreter's start and imports (about 0.3-0.5 CPU s here) inside that figure."""
    _pid, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, ru.ru_utime + ru.ru_stime


def _bodies(otlp_file: Path, spans_per_request: int = 1000) -> list[bytes]:
    """The file's spans as protobuf requests of ``spans_per_request`` spans each (as a collector's batches), the
    ranks' requests interleaved (ranks send at once: a rank's node traces are not finished before the next starts)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tests.helpers.otlp_receiver import parse_json_line

    per: dict[bytes, list[bytes]] = {}   # resource (a rank's stream) -> its requests
    with open(otlp_file) as fh:
        for line in fh:
            if not line.strip():
                continue
            for rs in parse_json_line(line).resource_spans:
                out = per.setdefault(rs.resource.SerializeToString(), [])
                for ss in rs.scope_spans:
                    for i in range(0, len(ss.spans), spans_per_request):
                        req = ExportTraceServiceRequest()
                        r = req.resource_spans.add()
                        r.resource.CopyFrom(rs.resource)
                        s = r.scope_spans.add()
                        s.scope.CopyFrom(ss.scope)
                        s.spans.extend(ss.spans[i:i + spans_per_request])
                        out.append(req.SerializeToString())
    return [b for group in itertools.zip_longest(*per.values()) for b in group if b is not None]


def _serve(bodies: list[bytes], tmp: Path, env: dict[str, str], idle: str,
           state: str) -> tuple[int, float, float, int, int]:
    """One replica (``--state-dir state``) fed every request over HTTP, then SIGTERM: (exit, CPU s, wall s,
    records checked, late records)."""
    err = tmp / "serve.err"
    p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", "127.0.0.1:0", "--idle",
                          idle, "--queue", "256", "--state-dir", state], stdout=subprocess.DEVNULL,
                         stderr=open(err, "w"), env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (m := re.search(r"http://127\.0\.0\.1:(\d+)/", err.read_text())):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"serve did not start: {err.read_text()}")
        time.sleep(0.1)
    url = f"http://127.0.0.1:{m[1]}/v1/traces"
    t0 = time.monotonic()
    for b in bodies:
        while True:
            req = urllib.request.Request(url, data=b, headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
                break
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
                time.sleep(0.05)   # queue full: back off as the collector would
    p.send_signal(signal.SIGTERM)
    rc, serve_cpu = _cpu_of(p)
    serve_wall = time.monotonic() - t0
    summary = err.read_text().strip().splitlines()[-1]
    checked = int(re.search(r"(\d+) records checked", summary)[1])  # type: ignore[index]
    late = int(re.search(r"(\d+) late record", summary)[1])  # type: ignore[index]
    return rc, serve_cpu, serve_wall, checked, late


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=50_000, help="log lines per rank (default 50000)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--idle", default="1h", help="the replica's --idle (default 1h: every record checked once)")
    ap.add_argument("--keep", default=None, help="folder to keep the generated files in")
    args = ap.parse_args(argv)

    from bench.check_throughput import generate

    tmp = Path(args.keep or tempfile.mkdtemp(prefix="serve-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    logs = generate(str(tmp / "rank{rank}.log"), args.lines, args.ranks)
    otlp = tmp / "run.otlp.jsonl"
    subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", "--no-progress", "--file", str(otlp), *logs],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    bodies = _bodies(otlp)
    from cptrace_otel.analyze.otlp_intake import decode

    records = sum(decode(b).records for b in bodies)
    print(f"{records} records in {len(bodies)} requests ({sum(map(len, bodies)) / 1e6:.1f} MB protobuf), "
          f"{args.ranks} ranks")

    runs = {}
    for label, state in (("serve (no journal)", "off"), ("serve (journal)", str(tmp / "state"))):
        shutil.rmtree(tmp / "state", ignore_errors=True)
        runs[label] = _serve(bodies, tmp, env, args.idle, state)
        rc, serve_cpu, serve_wall, checked, late = runs[label]
        print(f"{label}: {checked} records checked, {late} late (exit {rc}), {serve_cpu:.2f} CPU s "
              f"({serve_wall:.1f} s wall): {checked / serve_cpu:,.0f} records per CPU second")
    (rc, serve_cpu, serve_wall, checked, late), off = runs["serve (journal)"], runs["serve (no journal)"]
    print(f"journal cost: {(serve_cpu - off[1]) / len(bodies) * 1e3:+.2f} CPU ms per request of "
          f"{records // len(bodies)} records ({(serve_cpu - off[1]) / off[1] * 100:+.1f}% of the replica's CPU)")
    # check
    t0 = time.monotonic()
    c = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "check", str(otlp)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    crc, check_cpu = _cpu_of(c)
    check_wall = time.monotonic() - t0

    s_rate, c_rate = checked / serve_cpu, records / check_cpu
    print(f"check: {records} records (exit {crc}), {check_cpu:.2f} CPU s ({check_wall:.1f} s wall): "
          f"{c_rate:,.0f} records per CPU second")
    print(f"ratio serve/check: {s_rate / c_rate:.2f}")
    return 0 if checked == records else 1


if __name__ == "__main__":
    sys.exit(main())
