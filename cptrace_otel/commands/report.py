"""``cptrace-otel report [-o FILE] [--node N [--epoch E]] [--jaeger-url URL] [--run-id ID] PATH...``

Writes one self-contained HTML file (no network: style, script and data inline) from the sources ``check`` reads
(upstream log files and/or OTLP JSON-lines files, plain or gzip, ``-`` for standard input), read and analyzed by
the same code as ``check`` (:func:`.check.analyze_sources`). The page has a time axis with one swimlane per CP
rank, one panel per epoch, the stage bars (d2h, h2d) and, for a node, its device and host holds; a mark per record
with its fields on hover; every finding in red with its evidence records outlined; and, with ``--jaeger-url``, a
Jaeger link per lane, per finding and per node (trace ids: :func:`cptrace_otel.model.trace_ids.node_trace_id`).
``--node N`` draws one node (every epoch it appears in, or ``--epoch E``), in memory bounded by the run's structure
(:mod:`cptrace_otel.analyze.report_model`). A run with more than ``--max-records`` records is
summarised (see :mod:`cptrace_otel.analyze.report_model`). ``-o -`` writes the page to standard output.

Exit codes as ``check``: 0 clean, 1 findings (the report is written either way), 2 usage error (also: the node is
not in the sources), 3 a source cannot be read or the output cannot be written.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import TYPE_CHECKING, TextIO

from ..model.exits import EXIT_FINDINGS, EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE
from . import add_progress_flags, fewer_collections

if TYPE_CHECKING:
    from ..analyze.engine import Result

DEFAULT_OUT = os.path.join("cptrace-out", "report.html")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``report`` subcommand's parser, added to ``sub`` (the ``cli`` subparsers)."""
    r = sub.add_parser("report", help="write one self-contained HTML report (a swimlane per rank, stages, findings) "
                                      "of a run or of one node, from the sources check reads")
    r.add_argument("paths", nargs="+", metavar="PATH", help="log files and/or OTLP JSON-lines files, as for check")
    r.add_argument("-o", "--out", default=None, metavar="FILE",
                   help="the HTML file to write (default: cptrace-out/report.html; - for standard output)")
    r.add_argument("--node", type=int, default=None, help="draw this node id only (every epoch it appears in)")
    r.add_argument("--epoch", type=int, default=None, help="with --node: only this epoch")
    r.add_argument("--jaeger-url", default=None, help="Jaeger query base URL: a Jaeger link per lane, finding, node")
    r.add_argument("--run-id", default=None, help="run id for trace ids of log-file sources (OTLP files name theirs)")
    r.add_argument("--level", type=int, default=None, help="force the trace level instead of inferring it")
    r.add_argument("--max-records", type=int, default=None,
                   help="draw a run whole up to this many records, summarise it above (default 5000)")
    r.add_argument("--top", type=int, default=None, help="node panels in a summarised run (default 12)")
    add_progress_flags(r)
    return r


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    from ..analyze.links import bad_link_base

    bad = bad_link_base(args)
    if bad:
        print(f"cptrace-otel report: {bad}", file=err)
        return EXIT_USAGE
    paths = list(getattr(args, "paths", None) or [])
    level = getattr(args, "level", None)
    node, epoch = getattr(args, "node", None), getattr(args, "epoch", None)
    dest = getattr(args, "out", None) or DEFAULT_OUT
    why = None
    if not paths:
        why = "no PATH given"
    elif paths.count("-") > 1:
        why = "standard input (-) can be given once"
    elif level is not None and level not in (1, 2, 3):
        why = f"--level must be 1, 2 or 3, not {level}"
    elif epoch is not None and node is None:
        why = "--epoch needs --node"
    if why:
        print(f"cptrace-otel report: {why}", file=err)
        return EXIT_USAGE
    t_start = time.perf_counter()
    from .check import SourceError, analyze_sources

    with fewer_collections():
        try:
            res, run_id, groups = analyze_sources(args, paths, level, err, keep=True, pfx="cptrace-otel report")[:3]
        except SourceError as e:
            return e.exit_code
        page, models = build_page(res, run_id, groups, paths, node=node, epoch=epoch,
                                  jaeger_url=getattr(args, "jaeger_url", None),
                                  full_limit=getattr(args, "max_records", None), top=getattr(args, "top", None))
    if node is not None and not any(m.panels for m in models):
        where = f"epoch {epoch}" if epoch is not None else "any epoch"
        print(f"cptrace-otel report: node {node} has no record in {where} of the sources", file=err)
        return EXIT_USAGE
    try:
        if dest == "-":
            out.write(page)
        else:
            parent = os.path.dirname(os.path.abspath(dest))
            os.makedirs(parent, exist_ok=True)
            tmp = f"{dest}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(page)
            os.replace(tmp, dest)
    except OSError as e:
        print(f"cptrace-otel report: cannot write {dest}: {e.strerror or e}", file=err)
        return EXIT_UNREADABLE
    if dest != "-":
        drawn = sum(len(m.panels) for m in models)
        dense = any(ln.density for m in models for p in m.panels for ln in p.lanes)
        how = "summarised" if any(m.summarised for m in models) else "as densities" if dense else "drawn whole"
        print(f"report: {dest} ({len(page.encode('utf-8')) / 1e6:.2f} MB, {res.stats.get('events', 0)} records, "
              f"{len(res.findings)} finding(s), {drawn} panel(s), {how}, {time.perf_counter() - t_start:.2f} s)",
              file=out)
    return EXIT_FINDINGS if res.findings else EXIT_OK


def build_page(res: Result, run_id: str | None, groups: list, paths: list[str], node: int | None = None,
               epoch: int | None = None, jaeger_url: str | None = None, full_limit: int | None = None,
               top: int | None = None) -> tuple[str, list]:
    """``(html, models)`` for the analyzed ``groups`` of :func:`.check.analyze_sources` (one model each)."""
    from .._version import __version__
    from ..analyze.report_html import render
    from ..analyze.report_model import FULL_LIMIT, TOP_NODES, Builder, Records

    records = Records()
    builder = Builder(records, run_id, jaeger_url, full_limit if full_limit is not None else FULL_LIMIT,
                      top if top is not None else TOP_NODES)
    from ..analyze.result_output import run_name

    models = []
    for result, events in groups:   # one per run: a run's node ids are its own
        name = run_name(result.stats.get("run", "")) if len(groups) > 1 else ""
        what = f"node {node}" + (f", epoch {epoch}" if epoch is not None else "") if node is not None else "run"
        title = f"{what} · {name}" if name else what
        run = result.stats.get("run")
        if len(groups) > 1 and run is not None:   # trace links are made of each run's own run id
            builder.run_id = res.links.get(run, run) or run_id
        models.append(builder.build(events, result.findings, title, node=node, epoch=epoch))
    unchecked = [f"{u.rule} ({u.reason})" if u.reason else u.rule for u in res.unchecked]
    if node is not None:
        head = f"cptrace-otel report: node {node}" + (f", epoch {epoch}" if epoch is not None else "")
    else:
        head = "cptrace-otel report" + (f": {len(groups)} runs" if len(groups) > 1 else f": run {run_id}" if run_id
                                        else "")
    meta = {"title": head, "run_id": run_id, "sources": shlex.join(paths), "unchecked": unchecked,
            "version": __version__}
    return render(models, records.rows, meta), models
