"""``cptrace-otel demo``: the simulator with injected faults, through the real pipeline, then checked.

What it does:

1. computes the ground truth in-process: the whole deterministic run (all ranks, same seed) with an in-memory log
   emitter, whose oracle lists the findings each injected fault must cause;
2. starts one OS process per CP rank (``python -m cptrace_otel.sim.rank_main``); each runs the same simulation but
   emits only its own rank's records through ``cptrace_otel.cptrace``, with ``CPTRACE_CP_RANK``, ``CPTRACE_RUN_ID``,
   ``CPTRACE_LEVEL``, ``CPTRACE_FILE`` (OTLP JSON lines, the embedded default sink) and ``CPTRACE_LOG_FILE``
   (upstream log lines) set, plus the OTLP endpoint when one is given; each flushes before it exits;
3. checks the produced files twice, from the log files and from the OTLP files (the two must agree), and prints
   the findings next to the oracle: recall, false positives, missed faults, and per finding its node's trace id
   (with ``--jaeger-url``: the trace URL and a search URL).

Exit: 0 when every expected finding was found and nothing else (with ``--faults none``: no finding at all), 1
otherwise, 2 for bad arguments, 3 when the OTLP endpoint cannot be reached (the URL is printed).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, TextIO
from urllib.parse import urlsplit

from ..model.config import traces_url
from ..model.exits import EXIT_FINDINGS, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

RANK_TIMEOUT_S = 120.0


class _Progress:
    def __init__(self, err: TextIO, quiet: bool) -> None:
        self.err, self.quiet, self.t0 = err, quiet, time.monotonic()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[demo {time.monotonic() - self.t0:5.1f}s] {msg}", file=self.err, flush=True)


def _reachable(endpoint: str, protocol: str, timeout_s: float = 2.0) -> bool:
    u = urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
    port = u.port or (4317 if protocol == "grpc" else (443 if u.scheme == "https" else 4318))
    try:
        with socket.create_connection((u.hostname or "localhost", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _validate(args: argparse.Namespace) -> tuple[str, int, list, str | None]:
    """(mode, ranks, plans, error message)."""
    from ..sim.faults import FAULTS, MODES, POLICIES, parse_faults

    mode, policy = args.mode, args.policy
    if mode not in MODES:
        return mode, 0, [], f"--mode must be one of {', '.join(MODES)}"
    if policy not in POLICIES:
        return mode, 0, [], f"--policy must be one of {', '.join(POLICIES)}"
    if args.level not in (1, 2, 3):
        return mode, 0, [], "--level must be 1, 2 or 3"
    ranks = 1 if mode == "none" else args.ranks
    if not 1 <= ranks <= 16:
        return mode, ranks, [], "--ranks must be between 1 and 16"
    try:
        plans = parse_faults(args.faults, ranks)
    except ValueError as e:
        return mode, ranks, [], str(e)
    kinds = [p.kind for p in plans]
    if len(set(kinds)) != len(kinds):
        return mode, ranks, [], "each fault may be named once"
    for p in plans:
        spec = FAULTS[p.kind]
        if mode not in spec.modes:
            return mode, ranks, [], f"fault {p.kind} applies to --mode {'/'.join(spec.modes)}, not {mode}"
        if spec.policy != policy:
            return mode, ranks, [], f"fault {p.kind} runs under --policy {spec.policy} (given: {policy})"
        if p.kind in ("C1_div", "C2_round") and ranks < 2:
            return mode, ranks, [], f"fault {p.kind} needs --ranks 2 or more"
    return mode, ranks, plans, None


def _clean_out(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for pat in ("rank*.otlp.jsonl", "rank*.log"):
        for p in glob.glob(os.path.join(out, pat)):
            os.remove(p)   # the sinks append: start from empty files


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``demo`` subcommand's parser, added to ``sub`` (the ``cli`` subparsers)."""
    d = sub.add_parser("demo", help="simulate HiCache with injected faults through the real pipeline, then check")
    d.add_argument("--ranks", type=int, default=2, help="CP ranks (one process each)")
    d.add_argument("--faults", default="H1_ack,H2_release,HASH_flip", help="comma-separated fault names, or 'none'")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--mode", default="replicated", help="CP mode: none, replicated, sharded, dcp, layersplit, shared")
    d.add_argument("--policy", default="wt", help="write policy: wt, wts, wb")
    d.add_argument("--level", type=int, default=2)
    d.add_argument("--endpoint", default=None, help="OTLP traces URL (default: the embedded file sink)")
    d.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "grpc"])
    d.add_argument("--jaeger-url", default=None, help="Jaeger query base URL, for trace links")
    d.add_argument("--out", default="cptrace-out/demo", help="folder for the OTLP and log files")
    d.add_argument("--json", action="store_true")
    return d


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    from ..analyze.links import bad_link_base

    bad = bad_link_base(args)
    if bad:
        print(f"cptrace-otel demo: {bad}", file=err)
        return EXIT_USAGE
    mode, ranks, plans, problem = _validate(args)
    if problem:
        print(f"cptrace-otel demo: {problem}", file=err)
        return EXIT_USAGE
    progress = _Progress(err, quiet=False)
    endpoint = traces_url(args.endpoint, args.protocol) if args.endpoint else None
    if endpoint and not _reachable(endpoint, args.protocol):
        msg = f"cannot reach the OTLP endpoint {endpoint} ({args.protocol}); start a collector or Jaeger there, " \
              "or run without --endpoint to use the embedded file sink"
        if args.json:
            out.write(json.dumps({"ok": False, "error": "unreachable", "endpoint": endpoint}) + "\n")
        print(f"cptrace-otel demo: {msg}", file=err)
        return EXIT_UNREACHABLE

    from ..analyze.engine import Analysis
    from ..analyze.sources.logs import read_log_events
    from ..analyze.sources.otlpfile import OtlpInfo, read_otlp_events
    from ..sim.rank_main import build
    from ..sim.tracer import LogEmitter
    from ..sim.workload import expected_set, found_set

    t0 = time.monotonic()
    outdir = os.path.abspath(args.out)
    _clean_out(outdir)
    run_id = f"demo-{args.seed}-{int(time.time())}-{os.getpid()}"
    fault_spec = ",".join(f"{p.kind}@{p.rank}" if p.scope == "rank" else p.kind for p in plans) or "none"

    progress(f"simulating {ranks} rank(s), mode={mode}, policy={args.policy}, level={args.level}, "
             f"seed={args.seed}, faults={fault_spec}")
    ref = build(mode, ranks, args.policy, args.level, args.seed, fault_spec, LogEmitter(args.level, ranks))

    progress(f"running {ranks} rank process(es) through the pipeline "
             f"({'OTLP ' + endpoint + ' + ' if endpoint else ''}files under {outdir})")
    procs = []
    for r in range(ranks):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_", "SGLANG_CP_HICACHE"))}
        env.update(CPTRACE_CP_RANK=str(r), CPTRACE_TP_RANK=str(r), CPTRACE_RUN_ID=run_id,
                   CPTRACE_LEVEL=str(args.level), CPTRACE_FILE=os.path.join(outdir, f"rank{r}.otlp.jsonl"),
                   CPTRACE_LOG_FILE=os.path.join(outdir, f"rank{r}.log"),
                   CPTRACE_SPOOL_DIR=os.path.join(outdir, "spool", f"rank{r}"))
        if endpoint:
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
            env["OTEL_EXPORTER_OTLP_PROTOCOL"] = args.protocol
        cmd = [sys.executable, "-m", "cptrace_otel.sim.rank_main", "--rank", str(r), "--ranks", str(ranks),
               "--mode", mode, "--policy", args.policy, "--level", str(args.level), "--seed", str(args.seed),
               "--faults", fault_spec]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    failed = []
    deadline = time.monotonic() + RANK_TIMEOUT_S
    for r, p in enumerate(procs):
        try:
            _, perr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            _, perr = p.communicate()
        if p.returncode != 0:
            failed.append((r, p.returncode, (perr or "").strip()[-500:]))
    if failed:
        for r, rc, tail in failed:
            print(f"cptrace-otel demo: rank {r} exited {rc}{': ' + tail if tail else ''}", file=err)
        if endpoint and any(rc == 4 for _, rc, _ in failed):
            print(f"cptrace-otel demo: records did not reach {endpoint} (flush timed out)", file=err)
            return EXIT_UNREACHABLE
        return EXIT_FINDINGS

    progress("checking the log files and the OTLP files")
    logs = sorted(glob.glob(os.path.join(outdir, "rank*.log")))
    otlp = sorted(glob.glob(os.path.join(outdir, "rank*.otlp.jsonl")))
    res_logs = Analysis(None).run(read_log_events(logs))
    info = OtlpInfo()
    res_otlp = Analysis(None, info.levels).run(read_otlp_events(otlp, info))
    found = found_set(res_logs)
    agree = found == found_set(res_otlp)
    expected = expected_set(ref, args.level, res_logs)
    hit, missed, extra = found & expected, expected - found, found - expected
    recall = len(hit) / len(expected) if expected else 1.0
    events_ok = res_logs.stats.get("events") == res_otlp.stats.get("events") == sum(len(x) for x in ref.emitter.lines)
    ok = not missed and not extra and agree and events_ok
    elapsed = time.monotonic() - t0

    report = _report(args, mode, ranks, run_id, plans, ref, res_logs, res_otlp, expected, found, hit, missed, extra,
                     recall, agree, events_ok, ok, elapsed, logs, otlp)
    if args.json:
        out.write(json.dumps(report, default=str) + "\n")
    else:
        out.write(_text(report) + "\n")
    return EXIT_OK if ok else EXIT_FINDINGS


def _report(args, mode, ranks, run_id, plans, ref, res_logs, res_otlp, expected, found, hit, missed, extra, recall,
            agree, events_ok, ok, elapsed, logs, otlp) -> dict[str, Any]:
    from ..analyze import links
    from ..model.trace_ids import node_trace_id, rank_trace_id

    jaeger = args.jaeger_url

    def tid(f) -> str:
        raw = node_trace_id(run_id, f.epoch, f.node_id) if f.node_id is not None else rank_trace_id(run_id, f.rank)
        return raw.hex()

    findings = []
    for f in res_logs.findings:
        key = (f.code, f.rank, f.node_id, f.op if f.op is None or f.op >= 0 else None)
        d = {"code": f.code, "rule": f.rule, "rank": f.rank, "epoch": f.epoch, "node_id": f.node_id, "op": f.op,
             "certainty": f.certainty, "severity": f.severity, "message": f.message, "trace_id": tid(f),
             "expected": key in expected}
        if jaeger:
            d["trace_url"] = links.trace_url(jaeger, d["trace_id"])
            if f.node_id is not None:
                d["search_url"] = links.node_search_url(jaeger, f.node_id, run_id=run_id, rank=f.rank)
        findings.append(d)
    by_fault: dict[str, list] = {}
    for e in ref.oracle.expected(args.level):
        by_fault.setdefault(e.fault, []).append(e)
    injected = [{"fault": k, "rank": r, "node_id": n, "op": o} for k, r, n, o in ref.oracle.injected]
    return {
        "ok": ok, "mode": mode, "ranks": ranks, "policy": args.policy, "level": args.level, "seed": args.seed,
        "run_id": run_id, "faults": [p.kind for p in plans], "injected": injected,
        "expected": [{"code": e.code, "rule": e.rule, "rank": e.rank, "node_id": e.node_id, "op": e.op,
                      "fault": e.fault, "found": (e.code, e.rank, e.node_id, e.op) in found}
                     for e in ref.oracle.expected(args.level)],
        "findings": findings, "recall": recall, "expected_count": len(expected), "found_count": len(found),
        "missed": sorted(missed, key=str), "false_positives": sorted(extra, key=str),
        "sources_agree": agree, "events_complete": events_ok,
        "events": {"logs": res_logs.stats.get("events"), "otlp": res_otlp.stats.get("events"),
                   "simulated": sum(len(x) for x in ref.emitter.lines)},
        "unchecked": sorted({u.rule for u in res_logs.unchecked}),
        "files": {"logs": logs, "otlp": otlp},
        "jaeger_search": links.search_url(jaeger, tags={"cptrace.run_id": run_id}) if jaeger else None,
        "elapsed_s": round(elapsed, 2),
    }


def _text(rep: dict[str, Any]) -> str:
    lines = [f"cptrace-otel demo  mode={rep['mode']} ranks={rep['ranks']} policy={rep['policy']} "
             f"level={rep['level']} seed={rep['seed']}  run_id={rep['run_id']}"]
    if rep["injected"]:
        lines.append("injected:")
        for i in rep["injected"]:
            where = f"node {i['node_id']}" + (f" op {i['op']}" if i["op"] is not None else "")
            lines.append(f"  {i['fault']:<14} rank {i['rank']}  {where}")
    else:
        lines.append("injected: nothing (a clean run: every finding would be a false positive)")
    lines.append(f"findings ({len(rep['findings'])}):")
    for f in rep["findings"]:
        mark = "ok " if f["expected"] else "FP "
        where = f"rank {f['rank']} epoch {f['epoch']} node {f['node_id']}"
        where += f" op {f['op']}" if f["op"] is not None else ""
        lines.append(f"  {mark}{f['code']:<5}{f['rule']:<12}{where}  trace {f['trace_id']}")
        lines.append(f"       {f['message']}")
        if f.get("trace_url"):
            lines.append(f"       {f['trace_url']}")
        if f.get("search_url"):
            lines.append(f"       {f['search_url']}")
    for m in rep["missed"]:
        lines.append(f"  MISSED {m[0]} rank {m[1]} node {m[2]} op {m[3]}")
    lines.append(f"recall {round(rep['recall'] * 100)}% ({rep['expected_count'] - len(rep['missed'])}/"
                 f"{rep['expected_count']} expected findings), false positives {len(rep['false_positives'])}")
    ev = rep["events"]
    lines.append(f"sources: log files and OTLP files {'agree' if rep['sources_agree'] else 'DISAGREE'}; "
                 f"events simulated {ev['simulated']}, from logs {ev['logs']}, from OTLP {ev['otlp']}")
    if rep["unchecked"]:
        lines.append(f"unchecked at this level: {', '.join(rep['unchecked'])}")
    if rep["jaeger_search"]:
        lines.append(f"Jaeger: {rep['jaeger_search']}")
    lines.append(f"files: {', '.join(rep['files']['otlp'] + rep['files']['logs'])}")
    lines.append(f"{'PASS' if rep['ok'] else 'FAIL'} in {rep['elapsed_s']} s")
    return "\n".join(lines)
