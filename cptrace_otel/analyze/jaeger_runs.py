"""``cptrace-otel check --jaeger URL``: one run's traces read from a Jaeger query service and checked like its files.

The traces are found by :class:`.sources.jaegerquery.Search` (api_v2 tag search on the run id, paginated by time
windows), turned into events by :class:`.sources.tracedocs.TraceDocs` (the collector of the OTLP files: the same
events, ordered per rank by ``cptrace.seq``, records stored twice counted once), and analysed by the same engine as
files, so the findings, the report and the exit code are those of the run's OTLP files (a finding's ``src`` is the
trace's Jaeger URL instead of a file). Trace links in the report point at the same Jaeger unless ``--jaeger-url``
names another.

Fail closed: exit 3 when Jaeger cannot be reached, answers with an error, a body that is not Jaeger's JSON, or not
within the deadline (the URL is printed without credentials, with what came back: the status and an escaped excerpt),
when the window holds no trace of the run, or when its traces hold no cptrace record; exit 2 when no ``--run-id`` is
given and the window holds several runs (they are listed). A trace that cannot be read (wrong types, too large to
parse: see :class:`.sources.jaegerquery.Search`) costs that trace only: the others are checked and reported, the
trace is named with its id and why, and the exit status is 3 (the run was not read whole), never 0.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

from ..model.exits import EXIT_UNREADABLE, EXIT_USAGE
from .result_output import CHECK_PREFIX as _PFX, print_report

if TYPE_CHECKING:
    import argparse


def run_jaeger(args: argparse.Namespace, level: int | None, out: TextIO, err: TextIO) -> int:
    from ..model import semconv as sc
    from ..model.config import mask_url
    from .engine import analyze_traces
    from .sources.jaeger import JaegerClient, JaegerError, JaegerUnreachable
    from .sources.jaegerquery import DEFAULT_LIMIT, PageTooSmall, Search, open_query
    from .sources.logs import LogStats
    from .sources.tracedocs import TraceDocs

    given = str(args.jaeger)
    try:
        client, start_us, end_us = open_query(JaegerClient, given, args)
    except ValueError as e:
        print(f"{_PFX}: {e}", file=err)
        return EXIT_USAGE
    base = client.base_url
    service = getattr(args, "service", None) or sc.DEFAULT_SERVICE_NAME
    limit = getattr(args, "limit", None) or DEFAULT_LIMIT
    if limit < 1:
        print(f"{_PFX}: --limit must be at least 1", file=err)
        return EXIT_USAGE
    show = _want_progress(args, err)
    last = [0.0]

    def progress(traces: int, searches: int) -> None:
        now = time.monotonic()
        if show and now - last[0] >= 0.5:
            last[0] = now
            print(f"check: jaeger: {traces} traces after {searches} search(es)", file=err, flush=True)

    search = Search(client, service, limit, progress)
    docs = TraceDocs()
    run_id = getattr(args, "run_id", None)
    traces = 0
    try:
        if run_id is None:
            ids = search.run_ids(start_us, end_us)
            if len(ids) != 1:
                what = (f"several runs ({', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''}; newest first): "
                        "pick one with --run-id") if ids else "no trace with a cptrace.run_id: is it the right service?"
                print(f"{_PFX}: {mask_url(given)}: service {service}, {_when(start_us, end_us)}: {what}", file=err)
                return EXIT_USAGE if ids else EXIT_UNREADABLE
            run_id = ids[0]
            print(f"check: run id {run_id} (the only run among the newest traces of {service})", file=err)
        for tr in search.run_traces(run_id, start_us, end_us):
            traces += 1
            docs.add_guarded(tr, f"{base}/trace/{tr.get('traceID', '')}", docs.add_v2_trace)
    except JaegerUnreachable as e:
        print(f"{_PFX}: cannot reach Jaeger at {mask_url(given)}: {e.reason} (asked {e.url})", file=err)
        return EXIT_UNREADABLE
    except JaegerError as e:
        print(f"{_PFX}: Jaeger at {mask_url(given)}: {e}", file=err)
        return EXIT_UNREADABLE
    except PageTooSmall as e:
        print(f"{_PFX}: {mask_url(given)}: {e}", file=err)
        return EXIT_UNREADABLE
    for note in dict.fromkeys(search.notes):
        print(f"check: {note}", file=err)
    n = docs.total()
    where = f"{base} (service {service}, {_when(start_us, end_us)})"
    if not traces and search.unread:
        for line in _unread_lines(search.unread, [])[:20]:
            print(f"{_PFX}: not checked: {line}", file=err)
        print(f"{_PFX}: no trace of run {run_id} in {where} could be read", file=err)
        return EXIT_UNREADABLE
    if not traces:
        print(f"{_PFX}: no trace of run {run_id} in {where}", file=err)
        return EXIT_UNREADABLE
    if not n:
        print(f"{_PFX}: {traces} trace(s) of run {run_id} in {where} but no cptrace record in them", file=err)
        return EXIT_UNREADABLE
    print(f"check: read {traces} traces ({n} records) of run {run_id} from {base} in {search.searches} search(es)",
          file=err)
    docs.dedupe()
    if docs.duplicates:
        print(f"check: {sum(docs.duplicates.values())} record(s) are stored twice in Jaeger (spans exported twice): "
              "counted once", file=err)
    if docs.conflicts:
        print(f"warning: {sum(docs.conflicts.values())} record(s) of run {run_id} share rank, epoch and seq with "
              "another of other content (a restarted rank reusing the run id?): both are analysed", file=err)
    res = analyze_traces(level, docs, err)
    links = getattr(args, "jaeger_url", None) or base
    bad = _unread_lines(search.unread, docs.info.malformed)
    rc = print_report(args, res, run_id, links, {"logs": [], "otlp": [], "jaeger": [base]}, LogStats(), len(bad),
                      out, err)
    if bad:
        for line in bad[:20]:
            print(f"{_PFX}: not checked: {line}", file=err)
        more = f" ({len(bad) - 20} more not shown)" if len(bad) > 20 else ""
        print(f"{_PFX}: {len(bad)} trace(s) of run {run_id} could not be read{more}: the run was not checked whole",
              file=err)
        return EXIT_UNREADABLE
    return rc


def _unread_lines(unread: dict[str, str], malformed: list) -> list[str]:
    """One line per trace that was not read: the search's (too large, wrong shape) and the collector's (values of
    the wrong type: ``(source URL, line, why)``, the URL naming the trace)."""
    out = [f"trace {tid}: {why}" for tid, why in unread.items()]
    out += [f"{src}: {why}" for src, _line, why in malformed]
    return out


def _when(start_us: int, end_us: int) -> str:
    from .sources.jaegerquery import iso_us

    return f"spans starting {iso_us(start_us)} .. {iso_us(end_us)}"


def _want_progress(args: argparse.Namespace, err: TextIO) -> bool:
    want = getattr(args, "progress", None)
    return bool(getattr(err, "isatty", lambda: False)()) if want is None else bool(want)
