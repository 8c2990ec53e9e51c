"""``cptrace-otel check --tempo URL --run-id ID``: one run's traces read from Grafana Tempo and checked like its
files (:mod:`.sources.tempo`: TraceQL search on the run id, then each trace by id; the events go through the
collector of the OTLP files, :class:`.sources.tracedocs.TraceDocs`, so findings and exit codes are those of the
run's files). Untested against a live Tempo (AGPL, not run here): only against fixtures in its documented formats.

Exit 3 when Tempo cannot be reached or answers with an error, or when the window holds no trace or no cptrace record
of the run; exit 2 without ``--run-id``.
"""

from __future__ import annotations

from typing import Any, TextIO

from ..model.exits import EXIT_UNREADABLE, EXIT_USAGE
from .check_output import CHECK_PREFIX as _PFX
from .check_output import print_report


def run_tempo(args: Any, level: int | None, out: TextIO, err: TextIO) -> int:
    from .engine import Analysis
    from ..model.config import mask_url
    from .sources.jaeger import JaegerError, JaegerUnreachable
    from .sources.jaegerquery import open_query
    from .sources.logs import LogStats
    from .sources.tempo import DEFAULT_LIMIT, TempoClient, run_query, run_trace_ids
    from .sources.tracedocs import TraceDocs

    given = str(args.tempo)
    run_id = getattr(args, "run_id", None)
    if not run_id:
        print(f"{_PFX}: --tempo needs --run-id (the TraceQL search is {run_query('ID')})", file=err)
        return EXIT_USAGE
    try:
        client, start_us, end_us = open_query(TempoClient, given, args)
    except ValueError as e:
        print(f"{_PFX}: {e}", file=err)
        return EXIT_USAGE
    base = client.base_url
    docs = TraceDocs()
    traces = 0
    try:
        for tid in run_trace_ids(client, run_id, start_us // 1_000_000, end_us // 1_000_000 + 1,
                                 getattr(args, "limit", None) or DEFAULT_LIMIT):
            traces += 1
            docs.add_otlp(client.trace(tid), f"{base}/api/traces/{tid}")
    except JaegerUnreachable as e:
        print(f"{_PFX}: cannot reach Tempo at {mask_url(given)}: {e.reason} (asked {e.url})", file=err)
        return EXIT_UNREADABLE
    except (JaegerError, ValueError) as e:
        print(f"{_PFX}: Tempo at {mask_url(given)}: {e}", file=err)
        return EXIT_UNREADABLE
    if not traces:
        print(f"{_PFX}: no trace of run {run_id} in Tempo at {base} ({run_query(run_id)})", file=err)
        return EXIT_UNREADABLE
    if not docs.total():
        print(f"{_PFX}: {traces} trace(s) of run {run_id} in Tempo at {base} but no cptrace record in them", file=err)
        return EXIT_UNREADABLE
    print(f"check: read {traces} traces ({docs.total()} records) of run {run_id} from Tempo at {base}", file=err)
    docs.dedupe()
    res = Analysis(level, docs.info.levels).run(docs.events())
    links = getattr(args, "jaeger_url", None)
    return print_report(args, res, run_id, links, {"logs": [], "otlp": [], "tempo": [base]}, LogStats(), 0, out, err)
