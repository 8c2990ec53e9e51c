"""One ``cptrace-otel serve`` replica's records per CPU second, side by side with ``cptrace-otel check`` over the same
records, in one run.

The records: the clean replicated-mode log of bench/check_throughput.py (``--lines`` per rank, ``--ranks`` ranks),
replayed into OTLP by ``cptrace-otel ingest --file`` (the exporter's span model: node traces, lanes, stage spans),
then encoded as protobuf requests. Each measurement is a fresh process (or N) whose CPU time (user + system, from
``wait4``) is what is reported, so the figure is per core of that process's own CPU whatever else the machine runs:

* ``serve x1``: a replica receives every request over OTLP/HTTP from this process, then SIGTERM (everything held is
  checked); records / its CPU seconds. ``--idle`` defaults to 1h here, so every record is checked once: with a
  short window, a node trace whose spans arrive further apart than it (a node reloaded long after its backup, or
  this loaded machine slowing the sender) is checked in parts and its later records are counted as late, not checked
  (the replica's summary says how many; this benchmark prints it). It includes HTTP, protobuf decoding (the C reader
  of ``_speedups/otlpin.c``), holding by trace and the rules (Python rule core).
* ``serve x1, Python intake``: the same with the intake's C reader off (the replica started through a one-line
  wrapper that sets ``analyze.otlp_intake._C`` to None): every request read through opentelemetry-proto, as before
  the C reader.
* ``serve xN`` (``--replicas``, default 2): N replicas fed at once, one sender thread each, every request cut by
  trace id as the collector's ``loadbalancing`` exporter routes it (a trace always to the same replica); each
  replica's records per CPU second, and the wall ratio x1 / xN (from the first request to the last replica's exit).
  The sender threads run in this process, on the same cores.
* ``check``: ``cptrace-otel check`` over the same OTLP JSON-lines file; records / its CPU seconds.

    python bench/serve_throughput.py                   # 50k lines per rank, 2 ranks
    python bench/serve_throughput.py --lines 100000 --no-check

The ratio serve/check says what the intake (HTTP + protobuf + per-trace holding) costs over check's file reading.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
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


def _split(bodies: list[bytes], n: int) -> list[list[bytes]]:
    """Each request's spans cut into ``n`` requests by trace id, as the collector's ``loadbalancing`` exporter
    (``routing_key: traceID``) routes them: a trace's spans always to the same replica, a replica's share of each
    request as one request (resource and scope kept)."""
    if n == 1:
        return [list(bodies)]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out: list[list[bytes]] = [[] for _ in range(n)]
    for b in bodies:
        parts = [ExportTraceServiceRequest() for _ in range(n)]
        for rs in ExportTraceServiceRequest.FromString(b).resource_spans:
            for ss in rs.scope_spans:
                dst = [None] * n
                for sp in ss.spans:
                    i = int.from_bytes(sp.trace_id, "big") % n
                    if dst[i] is None:
                        r = parts[i].resource_spans.add()
                        r.resource.CopyFrom(rs.resource)
                        dst[i] = r.scope_spans.add()
                        dst[i].scope.CopyFrom(ss.scope)
                    dst[i].spans.append(sp)
        for i, req in enumerate(parts):
            if req.resource_spans:
                out[i].append(req.SerializeToString())
    return out


# a replica whose intake reads every request through opentelemetry-proto (the Python twin: the C reader off)
_PY_INTAKE = ("import sys; import cptrace_otel.analyze.otlp_intake as m; m._C = None; "
              "from cptrace_otel.cli import main; sys.exit(main(sys.argv[1:]))")


def _post_all(url: str, bodies: list[bytes]) -> None:
    for b in bodies:
        while True:
            req = urllib.request.Request(url, data=b, headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
                break
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
                time.sleep(0.05)   # queue full: back off as the collector would


def serve_run(shares: list[list[bytes]], tmp: Path, env: dict[str, str], idle: str, python_intake: bool = False,
              ) -> tuple[list[tuple[int, int, int, float]], float]:
    """One replica per share, each fed its share by its own sender thread at once, then SIGTERM (everything held
    checked): per replica (exit status, records checked, late records, CPU seconds), and the wall seconds from the
    first request to the last replica's exit."""
    head = [sys.executable, "-c", _PY_INTAKE] if python_intake else [sys.executable, "-m", "cptrace_otel.cli"]
    procs, errs, urls = [], [], []
    # A journal of its own for every run: a replica started on another run's journal counts that run's traces
    # as finalised, so every record of the same stream would be "late" (a restarted replica's contract).
    run_dir = Path(tempfile.mkdtemp(dir=tmp, prefix="run"))
    for i in range(len(shares)):
        err = run_dir / f"serve{i}.err"
        errs.append(err)
        procs.append(subprocess.Popen([*head, "serve", "--listen", "127.0.0.1:0", "--idle", idle, "--queue", "256",
                                       "--state-dir", str(run_dir / f"state{i}")],   # the journal on, as by default
                                      stdout=subprocess.DEVNULL, stderr=open(err, "w"), env=env, cwd=ROOT))
    deadline = time.monotonic() + 60
    for p, err in zip(procs, errs, strict=True):
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)/", err.read_text())):
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start: {err.read_text()}")
            time.sleep(0.1)
        urls.append(f"http://127.0.0.1:{m[1]}/v1/traces")
    t0 = time.monotonic()
    senders = [threading.Thread(target=_post_all, args=(u, share)) for u, share in zip(urls, shares, strict=True)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    for p in procs:
        p.send_signal(signal.SIGTERM)
    out = []
    for p, err in zip(procs, errs, strict=True):
        rc, cpu = _cpu_of(p)
        summary = err.read_text().strip().splitlines()[-1]
        checked = int(re.search(r"(\d+) records checked", summary)[1])  # type: ignore[index]
        late = int(re.search(r"(\d+) late record", summary)[1])  # type: ignore[index]
        out.append((rc, checked, late, cpu))
    return out, time.monotonic() - t0


def _show(what: str, reps: list[tuple[int, int, int, float]], wall: float) -> float:
    """Print one serve measurement; its records per CPU second (all replicas' records over all their CPU)."""
    for i, (rc, checked, late, cpu) in enumerate(reps):
        name = what if len(reps) == 1 else f"{what} replica {i + 1}/{len(reps)}"
        print(f"{name}: {checked} records checked, {late} late (exit {rc}), {cpu:.2f} CPU s: "
              f"{checked / cpu:,.0f} records per CPU second")
    checked, cpu = sum(r[1] for r in reps), sum(r[3] for r in reps)
    if not checked:
        raise SystemExit(f"{what}: no record checked (see the replicas' summaries above)")
    print(f"{what}: {checked} records in {wall:.1f} s wall ({checked / wall:,.0f} records per wall second)")
    return checked / cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=50_000, help="log lines per rank (default 50000)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--idle", default="1h", help="the replicas' --idle (default 1h: every record checked once)")
    ap.add_argument("--replicas", type=int, default=2, help="replicas of the scaled run (default 2; 1: none)")
    ap.add_argument("--no-python-intake", action="store_true", help="leave out the replica with the Python intake")
    ap.add_argument("--no-check", action="store_true", help="leave out cptrace-otel check")
    ap.add_argument("--keep", default=None, help="folder to keep the generated files in")
    args = ap.parse_args(argv)

    from bench.check_throughput import generate

    tmp = Path(args.keep or tempfile.mkdtemp(prefix="serve-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    logs = generate(str(tmp / "rank{rank}.log"), args.lines, args.ranks)
    otlp = tmp / "run.otlp.jsonl"
    otlp.unlink(missing_ok=True)   # ingest --file appends
    subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", "--no-progress", "--file", str(otlp), *logs],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    bodies = _bodies(otlp)
    from cptrace_otel.analyze.otlp_intake import decode

    records = sum(decode(b).records for b in bodies)
    print(f"{records} records in {len(bodies)} requests ({sum(map(len, bodies)) / 1e6:.1f} MB protobuf), "
          f"{args.ranks} ranks")
    ok = True
    one, one_wall = serve_run([bodies], tmp, env, args.idle)
    rate = _show("serve x1", one, one_wall)
    ok &= one[0][1] == records
    if not args.no_python_intake:
        py, py_wall = serve_run([bodies], tmp, env, args.idle, python_intake=True)
        py_rate = _show("serve x1, Python intake", py, py_wall)
        print(f"ratio C intake / Python intake (records per CPU second): {rate / py_rate:.2f}")
        ok &= py[0][1] == records
    if args.replicas > 1:
        many, many_wall = serve_run(_split(bodies, args.replicas), tmp, env, args.idle)
        _show(f"serve x{args.replicas}", many, many_wall)
        print(f"ratio wall x1 / x{args.replicas}: {one_wall / many_wall:.2f} "
              f"({os.cpu_count()} CPUs; the sender threads share them)")
        ok &= sum(r[1] for r in many) == records
    if not args.no_check:
        t0 = time.monotonic()
        c = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "check", str(otlp)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        crc, check_cpu = _cpu_of(c)
        c_rate = records / check_cpu
        print(f"check: {records} records (exit {crc}), {check_cpu:.2f} CPU s ({time.monotonic() - t0:.1f} s wall): "
              f"{c_rate:,.0f} records per CPU second")
        print(f"ratio serve/check: {rate / c_rate:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
