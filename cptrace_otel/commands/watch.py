"""``cptrace-otel watch --jaeger URL``: check a Jaeger's new traces every ``--interval``, report each new finding
once, write it back into its trace (``--endpoint``) and post it to Alertmanager (``--alertmanager``).

Each poll searches the spans that started since the last good poll (less ``--lookback``, default 15 s, at least two
intervals: a span is sent when it closes, up to ``span_timeout_s`` after it started, plus the batching delays)
of ``--run-id``, or of every run among the newest traces of ``--service``, and hands them to the run's
:class:`.watch_state.RunWatch`, which feeds the rules what is new and contiguous. A finding is printed on stdout
(one line), written back (:class:`.watch_out.WriteBack`) unless its span already carries the code, and becomes or
refreshes an alert (:class:`.watch_out.Alerts`). A run whose traces have not changed for ``--idle`` is finished (the
rules' end-of-stream findings) and its state freed; with ``--once`` that happens after the first poll.

Jaeger down: exit 3 when it cannot be reached at the start; later, one line when it goes down and one when it is
back, and the polls go on (the window then reaches back to the last good poll). Exit codes: ``--once`` 0 clean,
1 findings; otherwise 0 (1 if any finding) when stopped with Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any, TextIO

from ..model.exits import EXIT_FINDINGS, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

_PFX = "cptrace-otel watch"
PAGE_STEP = 200   # traces between two feeds within one poll
MAX_WINDOW_S = 60.0   # windows of span starts grow to at most a day of these (sparse or old data)


def finding_line(run_id: str, f: Any, link: str) -> str:
    seq = f.evidence[-1] if f.evidence else "?"
    node = f"node {f.node_id}" if f.node_id is not None else "(no node)"
    return (f"{f.severity} {f.code} {f.rule} run {run_id} rank {f.rank} {node} (epoch {f.epoch}) seq {seq}: "
            f"{f.message}  {link}")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``watch`` subcommand's parser, added to ``sub`` (the ``cli`` subparsers)."""
    w = sub.add_parser("watch", help="check a Jaeger's new traces continuously: findings printed once, written back "
                                     "into their traces and posted to Alertmanager")
    w.add_argument("--jaeger", required=True, metavar="URL", help="Jaeger query base URL (e.g. http://127.0.0.1:16686)")
    w.add_argument("--interval", default="30s", metavar="DURATION", help="time between polls (default 30s)")
    w.add_argument("--endpoint", default=None, metavar="OTLP",
                   help="OTLP traces URL to write the findings back into their traces (e.g. Jaeger's :4318)")
    w.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "grpc"])
    w.add_argument("--alertmanager", default=None, metavar="URL", help="Alertmanager base URL to post findings to")
    w.add_argument("--alert-hold", default="1h", metavar="DURATION",
                   help="keep re-posting an alert this long after its last finding (default 1h)")
    w.add_argument("--run-id", default=None, help="watch this run only (default: every run of the service)")
    w.add_argument("--service", default=None, help="service name of the traces (default sglang-hicache)")
    w.add_argument("--since", default="1h", metavar="DURATION", help="the first poll reaches back this far (1h)")
    w.add_argument("--idle", default=None, metavar="DURATION",
                   help="a run whose traces did not change this long is finished (default 10 polls, at least 10m)")
    w.add_argument("--lookback", default="15s", metavar="DURATION",
                   help="each poll also re-reads spans that started this long before the last one (default 15s)")
    w.add_argument("-v", "--verbose", action="store_true", help="a line per poll and run: records checked, waiting")
    w.add_argument("--once", action="store_true", help="one poll, then finish every run seen and exit (0/1)")
    w.add_argument("--limit", type=int, default=None, help="traces per search (default 1000)")
    w.add_argument("--level", type=int, default=None, help="force the trace level instead of inferring it")
    w.add_argument("--jaeger-url", default=None, help="Jaeger base URL for the links (default --jaeger)")
    return w


def run(args: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from ..analyze import links
    from ..model import semconv as sc
    from ..model.config import traces_url
    from ..analyze.sources.jaeger import JaegerClient, JaegerError, JaegerUnreachable
    from ..model.config import mask_url
    from ..analyze.sources.jaegerquery import DEFAULT_LIMIT, Search, parse_duration
    from ..analyze.watch_out import Alerts, WriteBack, finding_trace
    from ..analyze.watch_state import RunWatch

    out = out or sys.stdout
    err = err or sys.stderr

    def note(text: str) -> None:
        print(f"watch: {text}", file=err, flush=True)

    try:
        interval = parse_duration(args.interval)
        idle = parse_duration(args.idle) if args.idle else max(600.0, 10 * interval)
        since = parse_duration(args.since)
        lookback = parse_duration(args.lookback)
        client = JaegerClient(str(args.jaeger), timeout_s=30.0)
    except ValueError as e:
        print(f"{_PFX}: {e}", file=err)
        return EXIT_USAGE
    given = mask_url(str(args.jaeger))
    base = client.base_url
    link_base = args.jaeger_url or base
    service = args.service or sc.DEFAULT_SERVICE_NAME
    try:
        client.services()
    except (JaegerUnreachable, JaegerError) as e:
        print(f"{_PFX}: cannot reach Jaeger at {given}: {getattr(e, 'reason', e)}", file=err)
        return EXIT_UNREACHABLE
    wb = None
    if args.endpoint:
        try:
            wb = WriteBack(traces_url(args.endpoint, args.protocol), args.protocol)
        except Exception as e:
            print(f"{_PFX}: cannot use OTLP endpoint {args.endpoint}: {e}", file=err)
            return EXIT_UNREACHABLE
    alerts = Alerts(args.alertmanager, interval, parse_duration(args.alert_hold), note) if args.alertmanager else None
    limit = args.limit or DEFAULT_LIMIT
    search = Search(client, service, limit)
    states: dict[str, RunWatch] = {}
    changed_at: dict[str, float] = {}
    retired: dict[str, dict[int, int]] = {}
    total = [0]
    stop = [False]

    def on_term(*_a: Any) -> None:
        stop[0] = True

    old = signal.signal(signal.SIGTERM, on_term) if not args.once else None

    def handle(rid: str, st: RunWatch, found: list) -> None:
        for f in found:
            link = links.trace_url(link_base, finding_trace(rid, f))
            print(finding_line(rid, f, link), file=out, flush=True)
            if alerts is not None:
                alerts.found(rid, f, link)
        total[0] += len(found)
        if wb is not None and found:
            wb.write(st, found)

    def finish(rid: str) -> None:
        st = states.pop(rid)
        handle(rid, st, st.finish())
        retired[rid] = st.watermarks()
        changed_at.pop(rid, None)
        if len(retired) > 1000:
            retired.pop(next(iter(retired)))
        why = "" if args.once else f"; its traces did not change for {args.idle or 'a while'}"
        note(f"run {rid}: {st.events} records checked{why}: finished")

    back = max(lookback, 2 * interval)   # each window reaches back this far before the end of the last one
    chunk = 4 * back   # the span-start window of the next poll (adapted to the traffic: about limit / 2 traces)
    win_start = int((time.time() - since) * 1e6)
    down = False
    try:
        while True:
            now_us = int(time.time() * 1e6)
            # a poll reads at most `chunk` of span starts: a watcher that fell behind catches up in steps, its memory
            # bounded by what one window holds, not by how far behind it is
            poll_end = min(now_us, win_start + int(chunk * 1e6))
            read = 0
            try:
                runs = [args.run_id] if args.run_id else search.run_ids(win_start, poll_end)
                for rid in runs:
                    st = states.get(rid)
                    if st is None:
                        st = states[rid] = RunWatch(rid, args.level, retired.pop(rid, None), note)
                        changed_at[rid] = time.monotonic()
                    st.new_records = 0
                    for i, tr in enumerate(search.run_traces(rid, win_start, poll_end), 1):
                        st.add_trace(tr)
                        read += 1
                        if i % PAGE_STEP == 0:   # feed as it arrives: memory holds a page, not a poll
                            handle(rid, st, st.step(end_of_poll=False))
                    if st.new_records:
                        changed_at[rid] = time.monotonic()
                    handle(rid, st, st.step())
                    if args.verbose:
                        note(f"run {rid}: {st.events} records checked, {st.pending()} waiting for earlier ones")
                if down:
                    note(f"Jaeger at {given} is back")
                down = False
                win_start = poll_end - int(back * 1e6)
                # the next window: smaller after a busy one, larger after a quiet one (never below two lookbacks)
                if read > limit // 2:
                    chunk = max(2 * back, chunk / 2)
                elif read < limit // 8:
                    chunk = min(chunk * 2, MAX_WINDOW_S * 1440)
            except (JaegerUnreachable, JaegerError) as e:
                if not down:
                    note(f"Jaeger at {given} is down ({getattr(e, 'reason', e)}): retrying every {args.interval}")
                down = True
            now = time.monotonic()
            last = not down and poll_end >= now_us
            for rid in [r for r, t in changed_at.items() if (args.once and last) or now - t > idle]:
                if rid in states:
                    finish(rid)
            if alerts is not None:
                alerts.post()
            behind = not down and poll_end < now_us
            if (args.once and not behind) or stop[0]:
                break
            if behind:
                continue   # catching up: the next window at once
            t_end = time.monotonic() + interval
            while not stop[0] and time.monotonic() < t_end:
                time.sleep(min(0.5, interval))
    except KeyboardInterrupt:
        pass
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        if wb is not None:
            if not wb.flush(30.0):
                note("some finding spans could not be delivered to the OTLP endpoint")
            wb.close(1.0)
    if args.once and not states and not retired and args.run_id:
        print(f"{_PFX}: no trace of run {args.run_id} in {base} (service {service})", file=err)
        return EXIT_UNREACHABLE
    return EXIT_FINDINGS if total[0] else EXIT_OK
