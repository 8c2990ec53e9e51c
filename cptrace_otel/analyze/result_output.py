"""Render an analysis :class:`~cptrace_otel.analyze.engine.Result`: one JSON object, or a table grouped by node.

JSON: ``{"findings": [...], "unchecked": [...], "stats": {...}, "localization": [...]}`` (``localization``: the
advisory fwd_hash entries of :mod:`.localize`, ``[]`` when there are none); each finding has ``code, rule, rank, epoch,
node_id, op, certainty, severity, evidence, message, src, line_no`` and, when a run id is known, ``trace_id`` (the
node's trace: ``blake2b(f"{run_id}|{epoch}|{node_id}", digest_size=16)``) plus ``jaeger_url`` when a Jaeger base
URL is given, and ``run`` (the run it was found in: every rule judges one run). ``stats`` has ``runs`` (how many were
read) and ``runs_with_findings`` (run -> findings). The text report groups findings by run and node; when several runs
were read it says how many, lists the runs with findings (the first :data:`RUNS_SHOWN`) and prints the findings of
those runs only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TextIO

from ..checks import Finding, Unchecked
from ..model.exits import EXIT_FINDINGS, EXIT_INCOMPLETE, EXIT_OK

if TYPE_CHECKING:
    import argparse

    from .engine import Result
    from .sources.logs import LogStats


def node_trace_id(run_id: str, epoch: int, node_id: int) -> str:
    """Hex trace id of a node lineage, as the exporter assigns it
    (:func:`cptrace_otel.model.trace_ids.node_trace_id`)."""
    from ..model.trace_ids import node_trace_id as raw

    return raw(run_id, epoch, node_id).hex()


def finding_dict(f: Finding, run_id: str | None = None, jaeger_url: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "code": f.code, "rule": f.rule, "rank": f.rank, "epoch": f.epoch, "node_id": f.node_id, "op": f.op,
        "certainty": f.certainty, "severity": f.severity, "evidence": list(f.evidence), "message": f.message,
    }
    if f.src:
        d["src"] = f.src
        d["line_no"] = f.line_no
        if any(f.evidence_lines):
            d["evidence_lines"] = list(f.evidence_lines)
    if run_id is not None and isinstance(f.node_id, int) and f.node_id >= 0:
        tid = node_trace_id(run_id, f.epoch, f.node_id)
        d["trace_id"] = tid
        if jaeger_url:
            from . import links
            try:
                d["jaeger_url"] = links.trace_url(jaeger_url, tid)
            except ValueError:   # a base that is not http(s): no link rather than a javascript: one
                pass
    return d


def link_run(result: Result, f: Finding, run_id: str | None) -> str | None:
    """The run id the trace id of ``f``'s node is made of: its run's (``result.links`` maps a run named otherwise,
    e.g. a folder of log files, to it, ``""`` for none), else ``run_id`` (``--run-id``, or the only run of the
    files)."""
    return getattr(result, "links", {}).get(f.run, f.run) or run_id


def to_json(result: Result, run_id: str | None = None, jaeger_url: str | None = None) -> str:
    def one(f: Finding) -> dict[str, Any]:
        d = finding_dict(f, link_run(result, f, run_id), jaeger_url)
        d["run"] = f.run
        return d

    obj = {
        "findings": [one(f) for f in result.findings],
        "unchecked": [u.to_dict() for u in result.unchecked],
        "stats": result.stats,
        "localization": list(getattr(result, "localization", None) or []),
    }
    return json.dumps(obj, indent=None, sort_keys=False, default=str)


def _unchecked_line(u: Unchecked) -> str:
    who = ("all ranks" if u.rank is None else f"rank {u.rank}") + (f" of {u.runs} runs" if u.runs > 1 else "")
    if u.kind == "level":
        return f"  UNCHECKED {u.rule:<22} {who}: needs level {u.need_level} ({u.reason})"
    ex = f" e.g. nodes {u.examples}" if u.examples else ""
    if u.kind == "undecidable":
        return f"  UNDECIDED {u.rule:<22} {who}: {u.count}x ({u.reason}){ex}"
    return f"  SKIPPED   {u.rule:<22} {who}: {u.count}x ({u.reason}){ex}"


def to_text(result: Result, run_id: str | None = None, jaeger_url: str | None = None) -> str:
    """A table grouped by (run, epoch, node), groups ordered by their most severe finding; of several runs, the
    findings of the first :data:`RUNS_SHOWN` runs with findings (the others are counted, see --json)."""
    out: list[str] = []
    groups: dict[tuple, list[Finding]] = {}
    for f in result.findings:
        groups.setdefault((f.run, f.epoch, f.node_id), []).append(f)

    def gkey(item: tuple) -> tuple:
        (run, epoch, nid), fs = item
        return (min(f.sort_key()[0] for f in fs), run, epoch, nid if nid is not None else -1)

    st = result.stats
    n_runs = st.get("runs", 1)
    out.append(f"cptrace-otel check: {st.get('events', 0)} events, {len(st.get('ranks', []))} ranks, "
               f"{st.get('nodes', 0)} nodes, {st.get('malformed', 0)} malformed lines"
               + (f", {n_runs} runs" if n_runs > 1 else ""))
    bad_runs = st.get("runs_with_findings") or {}
    shown_runs = set(sorted(bad_runs)[:RUNS_SHOWN])
    if n_runs > 1:
        listed = ", ".join(f"{run_name(r)} ({bad_runs[r]})" for r in sorted(shown_runs))
        more = f", and {len(bad_runs) - RUNS_SHOWN} more (see --json)" if len(bad_runs) > RUNS_SHOWN else ""
        out.append(f"runs with findings: {len(bad_runs)} of {n_runs}" + (f": {listed}{more}" if bad_runs else ""))
    if not result.findings:
        out.append("no findings")
    else:
        n_err = sum(1 for f in result.findings if f.severity == "ERROR")
        out.append(f"{len(result.findings)} findings ({n_err} ERROR, {len(result.findings) - n_err} WARN) "
                   f"on {len(groups)} nodes")
        out.append(f"  {'SEV':<5} {'CODE':<6} {'RULE':<12} {'RANK':>4} {'OP':>6} {'CERT':<8} {'WHERE':<24} MESSAGE")
        for (run, epoch, nid), fs in sorted(groups.items(), key=gkey):
            if n_runs > 1 and run not in shown_runs:
                continue
            head = f"node {nid} (epoch {epoch})" if nid is not None else f"(no node) (epoch {epoch})"
            if n_runs > 1:
                head = f"run {run_name(run)}: {head}"
            link = link_run(result, fs[0], run_id)
            if link is not None and isinstance(nid, int) and nid >= 0:
                tid = node_trace_id(link, epoch, nid)
                head += f"  trace {tid}"
                if jaeger_url:
                    from . import links
                    try:
                        head += f"  {links.trace_url(jaeger_url, tid)}"
                    except ValueError:   # not an http(s) base: no link
                        pass
            out.append(head)
            for f in sorted(fs, key=Finding.sort_key):
                if f.src and f.line_no:
                    where = f"{_short(f.src)}:{f.line_no}"
                else:
                    where = f"seq {f.evidence[-1] if f.evidence else '?'}"
                op = "" if f.op is None else str(f.op)
                out.append(f"  {f.severity:<5} {f.code:<6} {f.rule:<12} {f.rank:>4} {op:>6} {f.certainty:<8} "
                           f"{where:<24} {f.message}")
    if result.unchecked:
        out.append("not checked:")
        out.extend(_unchecked_line(u) for u in result.unchecked)
    out.extend(localization_lines(getattr(result, "localization", None) or []))
    return "\n".join(out)


CHECK_PREFIX = "cptrace-otel check"   # the start of every message of check (files, --jaeger, --tempo)
RUNS_SHOWN = 20   # runs with findings listed (and their findings printed) in the text report; --json has them all


def run_name(run: str) -> str:
    """How a run is named in reports: its run id, ``(no run id)`` for records that carry none."""
    return run or "(no run id)"
_LOC_SHOWN = 20   # entries printed in the text report; --json has them all


def localization_lines(entries: list[dict[str, Any]]) -> list[str]:
    """The text section of the fwd_hash localization: nothing when there is no entry, matches as one count."""
    if not entries:
        return []
    out = ["fwd_hash localization (advisory, not a finding):"]
    rest = [e for e in entries if e["verdict"] != "match"]
    several = len({e.get("run", "") for e in entries}) > 1   # entries of several runs: each names its run
    for e in rest[:_LOC_SHOWN]:
        out.append("  " + (f"run {run_name(e.get('run', ''))}: " if several else "") + _loc_line(e))
    if len(rest) > _LOC_SHOWN:
        out.append(f"  ... {len(rest) - _LOC_SHOWN} more (see --json)")
    n_match = len(entries) - len(rest)
    if n_match:
        out.append(f"  {n_match} host-reload forward(s) match their baseline forward")
    return out


def _loc_line(e: dict[str, Any]) -> str:
    v = e["verdict"]
    ranks = ",".join(str(r) for r in e.get("ranks", []))
    if v in ("unpairable", "truncated"):
        return f"{v.upper():<10} rank {ranks or '-'}: {e.get('count', 0)}x {e.get('reason', '')}"
    head = f"{v.upper():<10} prompt pfp={e['pfp']} plen={e['plen']} rank {ranks}: reload rid {e['reload_rid']}"
    if v == "diverged":
        return (f"{head} vs rid {e['base_rid']}: first divergence at layer {e['layer']} stage {e['stage']} "
                "(every earlier record matches)")
    if v == "noisy":
        return f"{head} vs rid {e['base_rid']}: noisy, {e['reason']}"
    return f"{head}: {e['reason']}"


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def print_report(args: argparse.Namespace, res: Result, run_id: str | None, jaeger: str | None,
                 sources: dict[str, Any], stats: LogStats,
                 doc_malformed: int, out: TextIO, err: TextIO) -> int:
    """Finish the stats, warn about disordered logs, print the report; the exit code (0 clean, 1 findings, 4 no
    finding but the cross-rank rules were not run: streams with an unknown rank)."""
    res.stats["malformed"] = stats.malformed + doc_malformed
    res.stats["lines"] = stats.lines
    res.stats["sources"] = sources
    if stats.malformed > 20:
        print(f"warning: {stats.malformed} malformed lines in all (first 20 shown)", file=err)
    if stats.disordered():
        print(f"warning: {stats.behind} records of {', '.join(sorted(stats.behind_src))} come after records of "
              "another rank with a later ts: the ranks in one stream are not interleaved in time (concatenated "
              "logs?); the cross-rank rules (C1-C5) expect ranks within a few hundred records of each other and "
              "may report false findings: give each rank's log as its own file (files are merged by ts)", file=err)
    res.stats["out_of_order"] = stats.behind
    if getattr(args, "json", False):
        out.write(to_json(res, run_id, jaeger) + "\n")
    else:
        out.write(to_text(res, run_id, jaeger) + "\n")
    if res.findings:
        return EXIT_FINDINGS
    return EXIT_INCOMPLETE if res.stats.get("unknown_rank_streams") else EXIT_OK
