"""Throughput of ``cptrace-otel watch --once`` over a run already in Jaeger: records/s of the watcher's own CPU, side
by side with the peers, in one run on one loaded Jaeger.

Setup (once): a Jaeger of the bench's own (``bench/watch_memory.py``'s: the repo's config, free loopback ports,
memory store, span metrics off); the simulator's volume run (``cptrace_otel.sim.volume.volume_workload``: healthy,
``--ranks`` ranks, many nodes, level 2, about ``--records`` records in all) written as upstream log lines and sent
into Jaeger with ``cptrace-otel ingest --endpoint`` (the exporter's span mapping and OTLP sink).

Then, each in a fresh subprocess against the same Jaeger, ``--repeat`` times in turn:

* ``fetch+json``: what a Python consumer of Jaeger's API pays before any check: the same paginated
  ``/api/traces`` searches (``raw=true``, the run's tag, ``--limit`` traces each, a full page split as ``watch``
  splits it) with the
  standard library's ``urllib`` and ``json.loads`` of each answer; no event is built, no rule runs (a floor, not a
  checker).
* ``watch (python)``: ``watch --once`` on its pure-Python reader (the compiled Jaeger reader switched off with
  ``cptrace_otel._speedups.twin_off``): the code path before the compiled reader, and its reference twin.
* ``watch``: ``watch --once`` as shipped (the compiled reader when it was built).

Each peer starts as an installed package does, its bytecode read from the cache (``_proc.installed_env``). Printed
per peer: wall seconds, the peer's own CPU (user + sys of its process, from ``/proc``), Jaeger's CPU over the
same interval, the records it checked (``watch`` says so on stderr; ``fetch+json`` counts the span logs), records/s
of wall and of its own CPU, the findings line, and the ratio of ``watch`` to each peer. The load average is printed
before and after (2 cores shared: a busy machine slows every peer, not their ratio).

    python bench/watch_throughput.py                     # 100,000 records of 4 ranks, 3 rounds
    python bench/watch_throughput.py --records 20000 --repeat 1 --profile watch.prof
Needs the Jaeger binary (deploy/jaeger/up builds deploy/jaeger/bin/jaeger; or JAEGER_BIN).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _proc  # (bench/: this script's own directory, first on sys.path)
from watch_memory import ROOT, start_jaeger

_PY_WATCH = ("import sys; from cptrace_otel import cli; from cptrace_otel._speedups import twin_off; "
             "import cptrace_otel.analyze.jaeger_read as m\n"
             "with twin_off(vars(m), 'C_READER'):\n    sys.exit(cli.main(sys.argv[1:]))")

_FETCH = r'''
import json, sys, urllib.parse, urllib.request
q, service, run_id = sys.argv[1:4]
limit, a, b = (int(x) for x in sys.argv[4:7])
seen, logs, todo = set(), 0, [(a, b)]
while todo:
    a, b = todo.pop()
    qs = urllib.parse.urlencode({"service": service, "limit": limit, "start": a, "end": b, "raw": "true",
                                 "tags": json.dumps({"cptrace.run_id": run_id})})
    with urllib.request.urlopen(f"{q}/api/traces?{qs}", timeout=120) as r:
        data = json.loads(r.read())["data"]
    if len(data) >= limit:   # the windows watch searches next (jaegerquery.Search._split), the oldest last
        starts = sorted(s["startTime"] for t in data for s in t["spans"] if a <= s["startTime"] <= b)
        m = starts[len(starts) // 2] if starts else (a + b) // 2
        if not a < m < b:
            m = (a + b) // 2
        w, t, wins = (starts[-1] - m if starts else 0), m, [(m, b)]
        while len(wins) < 8 and 0 < w < t - a:
            wins.append((t - w, t))
            t -= w
        todo += wins + [(a, t)]
        continue
    for t in data:
        if t["traceID"] not in seen:
            seen.add(t["traceID"])
            logs += sum(len(s.get("logs") or ()) for s in t["spans"])
print(f"{logs} records checked (span logs read), {len(seen)} traces", file=sys.stderr)
'''


def load(query: str, otlp: str, records: int, ranks: int, seed: int, tmp: Path) -> tuple[str, int]:
    """Simulate a healthy volume run and ingest it into Jaeger: (run id, records sent)."""
    from cptrace_otel.sim.volume import volume_workload

    t0 = time.perf_counter()
    sim = volume_workload(seed, "replicated", ranks, "wt", max(1, records // ranks), level=2)
    paths = sim.emitter.write(str(tmp / "logs"))
    n = sum(len(x) for x in sim.emitter.lines)
    del sim
    # the simulator anchors its clock at a fixed wall time: move the anchor (the config record's wall=) so that the
    # run ends a minute ago, as a run just finished would
    last = max(int(m) for path in paths for m in re.findall(r" ts=(\d+)", Path(path).read_text()[-4000:]))
    for path in paths:
        text = Path(path).read_text()
        mono = int(re.search(r" mono=(\d+)", text).group(1))
        wall = time.time_ns() - 60 * 10**9 - (last - mono)
        Path(path).write_text(re.sub(r" wall=\d+", f" wall={wall}", text, count=1))
    run_id = f"watch-tput-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "ingest", *paths, "--endpoint", otlp,
                          "--run-id", run_id, "--no-progress"], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"ingest failed ({out.returncode}): {out.stderr[-2000:]}")
    print(f"loaded: {n} records of {ranks} ranks (simulator volume run, seed {seed}) into Jaeger in "
          f"{time.perf_counter() - t0:.1f} s; ingest: {out.stdout.strip().splitlines()[-1] if out.stdout else ''}",
          flush=True)
    return run_id, n


def one(name: str, cmd: list[str], jaeger_pid: int | None, env: dict[str, str], tmp: Path) -> dict:
    """Run ``cmd`` to its end: wall, its own CPU (``wait4``'s rusage: user + sys), Jaeger's CPU meanwhile, records
    checked, its output."""
    j0 = _proc.cpu_s(jaeger_pid) if jaeger_pid else None
    out, err = tmp / "peer.out", tmp / "peer.err"
    t0 = time.perf_counter()
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, env=env)
        _pid, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    j1 = _proc.cpu_s(jaeger_pid) if jaeger_pid else None
    stderr = err.read_text()
    m = [int(x) for x in re.findall(r"(\d+) records checked", stderr)]
    return {"name": name, "rc": os.waitstatus_to_exitcode(status), "wall": wall, "cpu": ru.ru_utime + ru.ru_stime,
            "jaeger_cpu": (j1 - j0) if j0 is not None and j1 is not None else None, "records": sum(m),
            "stdout": out.read_text(), "stderr": stderr}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000, help="records of the run, all ranks together")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the peers, in turn")
    ap.add_argument("--limit", type=int, default=1000, help="watch --limit (traces per search)")
    ap.add_argument("--max-traces", type=int, default=400_000, help="memory-store slots of the bench's Jaeger")
    ap.add_argument("--profile", default=None, metavar="FILE", help="also run watch once under cProfile into FILE")
    ap.add_argument("--json", default=None, metavar="FILE")
    a = ap.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs",
          flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="watch-tput-"))
    jproc, query, otlp = start_jaeger(tmp, a.max_traces)
    # each peer starts as an installed package does: its bytecode read from the cache, not compiled from source
    env = _proc.installed_env(dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    rows: list[dict] = []
    try:
        run_id, n = load(query, otlp, a.records, a.ranks, a.seed, tmp)
        time.sleep(2.0)   # the last batch lands in the store
        since = "1h"
        watch = ["watch", "--jaeger", query, "--run-id", run_id, "--once", "--since", since, "--limit", str(a.limit)]
        now_us = int(time.time() * 1e6)
        peers = {
            "fetch+json": [sys.executable, "-c", _FETCH, query, "sglang-hicache", run_id, str(a.limit),
                           str(now_us - 3600 * 10**6), str(now_us + 60_000_000)],
            "watch (python)": [sys.executable, "-c", _PY_WATCH, *watch],
            "watch": [sys.executable, "-m", "cptrace_otel.cli", *watch],
        }
        if a.profile:
            subprocess.run([sys.executable, "-m", "cProfile", "-o", a.profile, "-m", "cptrace_otel.cli", *watch],
                           capture_output=True, env=env)
            print(f"profile of watch --once written to {a.profile}", flush=True)
        for _ in range(a.repeat):
            for name, cmd in peers.items():
                r = one(name, cmd, jproc.pid, env, tmp)
                rows.append(r)
                fl = next((ln for ln in r["stderr"].splitlines() if "finding" in ln.lower()), "")
                print(f"  {name:<15} rc={r['rc']} wall {r['wall']:6.2f} s  own CPU {r['cpu']:6.2f} s  Jaeger CPU "
                      f"{(r['jaeger_cpu'] or 0):5.2f} s  records {r['records']:>7}  "
                      f"{r['records'] / r['wall']:>9,.0f} rec/s wall  {r['records'] / max(r['cpu'], 1e-9):>9,.0f} "
                      f"rec/s own CPU  {fl.strip()[:80]}", flush=True)
                if r["rc"] not in (0, 1):
                    print(r["stderr"][-1500:])
    finally:
        jproc.terminate()
        jproc.wait(30)
    best = {}
    for r in rows:
        if r["records"] and (r["name"] not in best or r["cpu"] < best[r["name"]]["cpu"]):
            best[r["name"]] = r
    if "watch" in best:
        w = best["watch"]
        ours = w["records"] / max(w["cpu"], 1e-9)
        print(f"watch --once: {w['records']} of {n} records checked; best of {a.repeat}: {ours:,.0f} records/s of "
              f"its own CPU ({w['records'] / w['wall']:,.0f} wall; Jaeger {w['jaeger_cpu'] or 0:.2f} s CPU)")
        for name, r in best.items():
            if name != "watch":
                peer = r["records"] / max(r["cpu"], 1e-9)
                print(f"  ratio watch / {name}: {ours / peer:.2f}x of own CPU, "
                      f"{(w['records'] / w['wall']) / (r['records'] / r['wall']):.2f}x of wall")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        Path(a.json).write_text(json.dumps([{k: v for k, v in r.items() if k not in ("stdout", "stderr")}
                                            for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
