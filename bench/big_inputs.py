"""Peak memory and seconds of ``check``, ``report --node`` and ``ingest`` over one big run, before vs after.

Generates, in a temporary folder, one rank's upstream log of ``--events`` records of one node (its insert and
backup, then evict / free / reload / h2d ack / compose cycles: :func:`one_node_log`) and the same
records as an OTLP JSON-lines file (``--per-line`` span events per line, one span per line, as an exporter's
batches write them). Each command then runs as a child process under ``/usr/bin/time -v`` (peak RSS: its maximum
resident set size) for each tree given (``--tree``: a checkout whose package the child imports, e.g. the main
branch as "before" and this one as "after"), and one table row per command prints both side by side.

    python bench/big_inputs.py                                      # 1e6 events, this tree only
    python bench/big_inputs.py --tree before=../main --tree after=.  # side by side
    python bench/big_inputs.py --events 100000 --only check-otlp

A child that runs past ``--timeout`` seconds is stopped and its row says so (with the RSS it had reached unknown).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def one_node_log(path: str, n: int) -> None:
    """``n`` records of one node (id 1) on rank 0: its insert and write-through backup, then evict/free/reload
    cycles until ``n`` records: the volume grows, the structure (one node, one slot each tier) does not."""
    from check_throughput import _r, _x
    d, h, lines = _r(0, 64), _r(100_000, 64), []
    ts = [1_000_000_000]

    def emit(body: str) -> None:
        ts[0] += 1000
        lines.append(f"[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE {body} rank=0 ts={ts[0]}\n")

    with open(path, "w") as fh:
        emit("config] cp_size=1 cp_rank=0 mode=replicated page_size=16 policy=wt level=2")
        emit(f"insert] node_id=1 parent=0 len=64 dev={d} devx={_x(0, 64)} kind=new")
        emit(f"prepare] node_id=1 op=1 len=64 dev={d} host={h} policy=wt parent=0 pbk=1 hostx={_x(100_000, 64)} "
             f"devx={_x(0, 64)}")
        emit(f"backup] op=1 node_id=1 dev={d} host={h} io=1 h=77 nz=8192 hp=[1,2,3,4]")
        emit("ack] dir=d2h op=1 node_id=1 blen=64 clen=64 pub=[1] hh=77")
        op, count = 1, 5
        while count < n:
            op += 1
            for body in (f"evict] tier=dev node_id=1 kind=backuped dev={d}",
                         f"free] pool=dev idx={d} idx_x={_x(0, 64)} node_id=1 why=evict",
                         f"rid_map] rid=q{op} node_id=1 hit=host dlen=0 hlen=64",
                         f"reload] node_id=1 chain=[1] op={op} host={h} dev={d} hostx={_x(100_000, 64)} "
                         f"devx={_x(0, 64)}",
                         f"ack] dir=h2d op={op} node_id=1 h=77 nz=8192",
                         f"compose] key=L0:n1 node_id=1 layer=0 src={d} gen={op} hit=0"):
                if count < n:
                    emit(body)
                    count += 1
            if len(lines) >= 10_000:
                fh.writelines(lines)
                lines.clear()
        fh.writelines(lines)


def dense_log(path: str, n: int, nodes: int = 20_000) -> None:
    """``n`` records on rank 0 all within ``n`` ns (1 ns apart: far inside any span timeout) of ``nodes`` nodes: each
    node's insert, then its request's ``rid_map`` (a request span of its own per node) over and over, node after
    node. The structure (nodes, requests) is fixed, the volume grows: what a replay holds open grows with the records
    unless it is bounded otherwise than by time."""
    from check_throughput import _r

    ts = 1_000_000_000
    with open(path, "w") as fh:
        fh.write(f"[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE config] cp_size=1 cp_rank=0 mode=replicated "
                 f"page_size=16 policy=wt level=2 rank=0 ts={ts}\n")
        lines = []
        for i in range(n - 1):
            node = 2 + i % nodes
            if i < nodes:
                body = f"insert] node_id={node} parent=0 len=64 dev={_r((i % 4096) * 64, 64)} kind=new"
            else:
                body = f"rid_map] rid=q{node} node_id={node} hit=dev dlen=64 hlen=0"
            ts += 1
            lines.append(f"[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE {body} rank=0 ts={ts}\n")
            if len(lines) >= 10_000:
                fh.writelines(lines)
                lines.clear()
        fh.writelines(lines)


def _any(v: object) -> dict:
    if type(v) is int:
        return {"intValue": str(v)}
    if type(v) is float:
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def write_otlp(log: str, out: str, per_line: int) -> int:
    """The records of ``log`` as OTLP JSON lines (``per_line`` span events per line); returns the records."""
    from cptrace_otel.analyze.sources.logs import read_log_events
    from cptrace_otel.model import semconv as sc
    from cptrace_otel.model.attrs import fields_to_attributes

    n = 0
    batch: list[dict] = []
    res = {"attributes": [{"key": sc.CP_RANK, "value": _any(0)}, {"key": sc.RUN_ID, "value": _any("big-run")},
                          {"key": sc.TRACE_LEVEL, "value": _any(2)}, {"key": "service.name", "value": _any("sglang")}]}

    def flush(fh) -> None:
        span = {"traceId": f"{len(batch):032x}", "spanId": f"{n:016x}", "name": "cptrace.batch", "events": batch}
        fh.write(json.dumps({"resourceSpans": [{"resource": res, "scopeSpans": [{"spans": [span]}]}]}) + "\n")

    with open(out, "w") as fh:
        for ev in read_log_events([log]):
            attrs = fields_to_attributes(ev.fields)
            attrs.update({sc.SEQ: ev.seq, sc.EPOCH: ev.epoch, sc.LEVEL: ev.level})
            batch.append({"name": ev.tag, "timeUnixNano": str(ev.ts),
                          "attributes": [{"key": k, "value": _any(v)} for k, v in attrs.items()]})
            n += 1
            if len(batch) >= per_line:
                flush(fh)
                batch = []
        if batch:
            flush(fh)
    return n


def run_child(tree: str, args: list[str], timeout: float) -> tuple[float | None, float, int | str]:
    """(peak RSS MiB, seconds, exit code or 'timeout') of ``python -m cptrace_otel.cli ARGS`` run in ``tree``."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "cptrace_otel.cli", *args]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)   # its own group: a timeout stops the command, not only `time`
    try:
        _out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None, time.perf_counter() - t0, "timeout"
    dt = time.perf_counter() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    return (int(m.group(1)) / 1024.0 if m else None), dt, p.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--per-line", type=int, default=1000)
    ap.add_argument("--tree", action="append", default=None, help="NAME=PATH of a checkout (default: this one)")
    ap.add_argument("--only", nargs="*", default=None, help="rows to run (check-otlp check-log report-otlp ...)")
    ap.add_argument("--node", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--keep", default=None, help="folder for the inputs (kept; reused when present)")
    a = ap.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = [t.split("=", 1) for t in (a.tree or [f"this={here}"])]
    tmp = a.keep or tempfile.mkdtemp(prefix="cptrace-big-")
    os.makedirs(tmp, exist_ok=True)
    log = os.path.join(tmp, f"big-{a.events}.log")
    otlp = os.path.join(tmp, f"big-{a.events}.otlp.jsonl")
    if not os.path.exists(otlp):
        one_node_log(log, a.events)
        n = write_otlp(log, otlp, a.per_line)
        print(f"inputs: {n} records; log {os.path.getsize(log) >> 20} MiB, OTLP JSON {os.path.getsize(otlp) >> 20} MiB"
              f" in {tmp}")
    dense = os.path.join(tmp, f"dense-{a.events}.log")
    if not os.path.exists(dense) and (not a.only or "ingest-dense" in a.only):
        dense_log(dense, a.events)
    out = os.path.join(tmp, "out")
    rows = {
        "check-otlp": ["check", otlp],
        "check-log": ["check", log],
        "report-otlp": ["report", "--node", str(a.node), "-o", out + ".html", otlp],
        "report-log": ["report", "--node", str(a.node), "-o", out + ".html", log],
        "ingest-log": ["ingest", "--file", out + ".jsonl", "--no-progress", log],
        "ingest-dense": ["ingest", "--file", out + ".jsonl", "--no-progress", dense],
    }
    print(f"{'command':<12}" + "".join(f" | {name + ' MiB'} {name + ' s'} {'rc':>7}" for name, _ in trees))
    for row, args in rows.items():
        if a.only and row not in a.only:
            continue
        cells = []
        for _name, tree in trees:
            rss, dt, rc = run_child(os.path.abspath(tree), args, a.timeout)
            shown = "?" if rss is None else f"{rss:.0f}"
            cells.append(f" | {shown:>{len(_name) + 4}} {dt:>{len(_name) + 2}.1f} {rc!s:>7}")
        print(f"{row:<12}" + "".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
