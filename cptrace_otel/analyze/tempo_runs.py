"""``cptrace-otel check --tempo URL --run-id ID``: one run's traces read from Grafana Tempo and checked like its
files (:mod:`.sources.tempo`: TraceQL search on the run id, then each trace by id; the events go through the
collector of the OTLP files, :class:`.sources.tracedocs.TraceDocs`, so findings and exit codes are those of the
run's files). Untested against a live Tempo (AGPL, not run here): only against fixtures in its documented formats.

Exit 3 when Tempo cannot be reached or answers with an error, or when the window holds no trace or no cptrace record
of the run; exit 2 without ``--run-id``. A trace that cannot be read (too large, not JSON, values of the wrong type)
costs that trace only: the others are checked and reported, it is named, and the exit status is 3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from ..model.exits import EXIT_UNREADABLE, EXIT_USAGE
from .result_output import CHECK_PREFIX as _PFX, print_report

if TYPE_CHECKING:
    import argparse


def run_tempo(args: argparse.Namespace, level: int | None, out: TextIO, err: TextIO) -> int:
    from ..model.config import mask_url
    from .engine import analyze_traces
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
    unread: dict[str, str] = {}
    try:
        for tid in run_trace_ids(client, run_id, start_us // 1_000_000, end_us // 1_000_000 + 1,
                                 getattr(args, "limit", None) or DEFAULT_LIMIT):
            traces += 1
            try:
                td = client.trace(tid)
            except JaegerError as e:   # this trace only (too large, not JSON): the others are read
                unread[tid] = e.body
                continue
            docs.add_guarded(td, f"{base}/api/traces/{tid}", docs.add_otlp)
    except JaegerUnreachable as e:
        print(f"{_PFX}: cannot reach Tempo at {mask_url(given)}: {e.reason} (asked {e.url})", file=err)
        return EXIT_UNREADABLE
    except (JaegerError, ValueError) as e:
        print(f"{_PFX}: Tempo at {mask_url(given)}: {e}", file=err)
        return EXIT_UNREADABLE
    if not traces:
        print(f"{_PFX}: no trace of run {run_id} in Tempo at {base} ({run_query(run_id)})", file=err)
        return EXIT_UNREADABLE
    bad = [f"trace {t}: {why}" for t, why in unread.items()] + [f"{s}: {why}" for s, _l, why in docs.info.malformed]
    for line in bad[:20]:
        print(f"{_PFX}: not checked: {line}", file=err)
    if not docs.total():
        print(f"{_PFX}: {traces} trace(s) of run {run_id} in Tempo at {base} but no cptrace record in them", file=err)
        return EXIT_UNREADABLE
    print(f"check: read {traces} traces ({docs.total()} records) of run {run_id} from Tempo at {base}", file=err)
    docs.dedupe()
    res = analyze_traces(level, docs, err)
    links = getattr(args, "jaeger_url", None)
    rc = print_report(args, res, run_id, links, {"logs": [], "otlp": [], "tempo": [base]}, LogStats(), len(bad),
                      out, err)
    if bad:
        print(f"{_PFX}: {len(bad)} trace(s) of run {run_id} could not be read: the run was not checked whole",
              file=err)
        return EXIT_UNREADABLE
    return rc
