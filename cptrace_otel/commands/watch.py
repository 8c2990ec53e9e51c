"""``cptrace-otel watch --jaeger URL``: check a Jaeger's new traces every ``--interval``, report each new finding
once, write it back into its trace (``--endpoint``) and post it to Alertmanager (``--alertmanager``).

Each poll searches the spans that started since the last good poll (less ``--lookback``, default 15 s, at least two
intervals: a span is sent when it closes, up to ``span_timeout_s`` after it started, plus the batching delays)
of ``--run-id``, or of every run of ``--service`` (one paginated search of the service, its traces handed to their
runs: the requests of a poll grow with its traces / ``--limit``, not with the number of runs), and hands them to
the run's :class:`~cptrace_otel.analyze.incremental.RunWatch`, which feeds the rules what is new and contiguous. At most
:data:`MAX_RUNS` runs are watched at once (``CPTRACE_WATCH_MAX_RUNS``): past it, the least recently changed is
finished early, so memory does not grow with the number of runs. A finding is printed on stdout
(one line), written back (:class:`~cptrace_otel.analyze.finding_sinks.WriteBack`) unless its span already carries
the code, and becomes or refreshes an alert (:class:`~cptrace_otel.analyze.finding_sinks.Alerts`). A run whose
traces have not changed for ``--idle`` is finished (the
rules' end-of-stream findings) and its state freed; with ``--once`` that happens after the first poll.

Fail closed: every poll writes one line on stderr saying whether its window was checked (``window A .. B: checked
(N traces ...)``, ``checked, except K trace(s) that could not be read (trace ID: why)`` or ``NOT checked: why``).
A poll that could not read its window (Jaeger unreachable or past the request deadline, an HTTP error, an answer
cut short, not JSON or of the wrong shape) never counts as clean: with ``--once`` the watch ends there with exit 3;
a running watcher backs off (the wait doubles from ``--interval`` up to :data:`MAX_BACKOFF_S`) and reads the same
window again, so nothing is skipped while Jaeger is down; a window whose answer is bad :data:`GIVE_UP` times in a row
while Jaeger is reachable is skipped with a line saying so. A trace that cannot be read (wrong types, too large)
costs that trace only. Any answer of Jaeger or Alertmanager is survived. Exit 3 when Jaeger cannot be reached at the
start, and at the end (``--once``, Ctrl-C, SIGTERM) whenever some window or trace could not be read; otherwise 0
clean, 1 findings.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import TextIO

from ..model.exits import EXIT_FINDINGS, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

_PFX = "cptrace-otel watch"
PAGE_STEP = 200   # traces between two feeds within one poll
MAX_WINDOW_S = 30 * 86400.0   # the widest window of span starts (sparse or old data; a full page is split anyway)
MAX_BACKOFF_S = 300.0   # the longest wait after failed polls (doubling from --interval)
GIVE_UP = 5   # a window whose answer is bad this many times in a row (Jaeger reachable) is skipped, and said so
MAX_RETIRED = 1000   # finished runs whose watermarks are kept (a late record is not fed twice)


def _max_runs() -> int:
    import os

    try:
        return max(1, int(os.environ.get("CPTRACE_WATCH_MAX_RUNS", "") or 256))
    except ValueError:
        return 256


MAX_RUNS = _max_runs()   # runs watched at once: memory does not grow with the number of runs


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
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


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from ..analyze import jaeger_read
    from ..analyze.finding_sinks import FindingSinks, SinkSetupError
    from ..analyze.incremental import RunWatch
    from ..analyze.links import bad_link_base
    from ..analyze.sources.jaeger import JaegerClient, JaegerError, JaegerUnreachable
    from ..analyze.sources.jaegerquery import DEFAULT_LIMIT, PageTooSmall, Search, iso_us, parse_duration
    from ..analyze.sources.jaegerstream import TraceText
    from ..analyze.sources.otlpfile import BAD_SHAPE, bad_shape
    from ..model import semconv as sc
    from ..model.config import mask_url

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
        bad_base = bad_link_base(args)
        if bad_base:
            raise ValueError(bad_base)
        link_base = args.jaeger_url or client.base_url
    except ValueError as e:
        print(f"{_PFX}: {mask_url(str(e))}", file=err)
        return EXIT_USAGE
    given = mask_url(str(args.jaeger))
    base = client.base_url
    service = args.service or sc.DEFAULT_SERVICE_NAME
    try:
        client.services()
    except JaegerUnreachable as e:
        print(f"{_PFX}: cannot reach Jaeger at {given}: {e.reason}", file=err)
        return EXIT_UNREACHABLE
    except JaegerError as e:   # it answered: an error status (a 401/403 says "authentication failed")
        print(f"{_PFX}: Jaeger at {given}: {e}", file=err)
        return EXIT_UNREACHABLE
    try:
        sinks = FindingSinks(args, interval, link_base, out, note)
    except SinkSetupError as e:
        print(f"{_PFX}: {e}", file=err)
        return EXIT_UNREACHABLE
    except ValueError as e:   # --alert-hold
        print(f"{_PFX}: {e}", file=err)
        return EXIT_USAGE
    limit = args.limit or DEFAULT_LIMIT
    # the compiled reader indexes the answers and reads their traces from the bytes (its twin parses them)
    search = Search(client, service, limit, index=jaeger_read.index if jaeger_read.C_READER is not None else None)
    states: dict[str, RunWatch] = {}
    changed_at: dict[str, float] = {}
    retired: dict[str, dict[int, int]] = {}
    unchecked = [0]   # windows given up and traces that could not be read, over the whole watch
    stop = [False]

    def on_term(*_a: object) -> None:
        stop[0] = True

    old = signal.signal(signal.SIGTERM, on_term) if not args.once else None

    def finish(rid: str, why: str) -> None:
        st = states.pop(rid)
        sinks.report(rid, st, st.finish())
        retired[rid] = st.watermarks()
        changed_at.pop(rid, None)
        if len(retired) > MAX_RETIRED:
            retired.pop(next(iter(retired)))
        note(f"run {rid}: {st.events} records checked{why}: finished")

    def state(rid: str) -> RunWatch:
        st = states.get(rid)
        if st is None:
            if len(states) >= MAX_RUNS:   # memory does not grow with the number of runs
                oldest = min(changed_at, key=changed_at.__getitem__)
                finish(oldest, f"; more than {MAX_RUNS} runs at once (CPTRACE_WATCH_MAX_RUNS), the least recently "
                               "changed is finished early")
            st = states[rid] = RunWatch(rid, args.level, retired.pop(rid, None), note)
            changed_at[rid] = time.monotonic()
        return st

    def poll(a: int, b: int) -> tuple[int, dict[str, str]]:
        """Read and feed the traces with spans starting in [a, b]: (traces read, traces not read: id -> why)."""
        read = 0
        bad: dict[str, str] = {}
        touched: dict[str, RunWatch] = {}
        tags = {sc.RUN_ID: args.run_id} if args.run_id else None
        try:
            for tr in search.traces(tags, a, b, f"run {args.run_id}" if args.run_id else f"service {service}"):
                read += 1
                try:
                    run_ids, spans = jaeger_read.read(tr)
                except BAD_SHAPE as e:   # this trace only: the others are read
                    tid = tr.trace_id if isinstance(tr, TraceText) else tr.get("traceID")
                    bad[str(tid or "(no id)")] = bad_shape(e, "values of the wrong type")
                    continue
                rids = [args.run_id] if args.run_id else run_ids
                for i, rid in enumerate(rids):
                    st = state(rid)
                    if touched.get(rid) is not st:
                        st.new_records = 0
                        touched[rid] = st
                    # each run its own Events (a trace of several runs is read again for the next)
                    st.add_records(spans if i == 0 else jaeger_read.read(tr)[1])
                if read % PAGE_STEP == 0:   # feed as it arrives: memory holds a page, not a poll
                    for rid, st in touched.items():
                        if states.get(rid) is st:
                            sinks.report(rid, st, st.step(end_of_poll=False))
        finally:
            bad.update(search.unread)
            search.unread.clear()
            for rid, st in touched.items():
                if states.get(rid) is not st:   # finished early meanwhile (MAX_RUNS)
                    continue
                if st.new_records:
                    changed_at[rid] = time.monotonic()
                sinks.report(rid, st, st.step())
                if args.verbose:
                    note(f"run {rid}: {st.events} records checked, {st.pending()} waiting for earlier ones")
        return read, bad

    back = max(lookback, 2 * interval)   # each window reaches back this far before the end of the last one
    chunk = 4 * back   # the span-start window of the next poll (adapted to the traffic: about limit / 2 traces)
    win_start = int((time.time() - since) * 1e6)
    fails = 0        # polls in a row that could not read their window (the last one is counted if the watch ends)
    down = False
    try:
        while True:
            now_us = int(time.time() * 1e6)
            # a poll reads at most `chunk` of span starts: a watcher that fell behind catches up in steps, its memory
            # bounded by what one window holds, not by how far behind it is
            poll_end = min(now_us, win_start + int(chunk * 1e6))
            span = f"{iso_us(win_start)} .. {iso_us(poll_end)}"
            failed = None
            try:
                read, bad = poll(win_start, poll_end)
            except JaegerUnreachable as e:
                failed = f"Jaeger at {given} is unreachable ({e.reason})"
                if not down:
                    note(f"Jaeger at {given} is down ({e.reason}): its windows are read again when it is back")
                down = True
            except (JaegerError, PageTooSmall) as e:
                failed = f"Jaeger at {given}: {e}"
                if down:   # it answers again, if badly
                    note(f"Jaeger at {given} is back")
                down = False
            except Exception as e:   # an answer nobody foresaw: reported, the watcher goes on
                failed = f"reading Jaeger at {given} failed: {type(e).__name__}: {mask_url(str(e))[:300]}"
            if failed is None:
                fails = 0
                if down:
                    note(f"Jaeger at {given} is back")
                down = False
                if bad:
                    unchecked[0] += len(bad)
                    shown = "; ".join(f"trace {t}: {w}" for t, w in list(bad.items())[:5])
                    note(f"window {span}: checked, except {len(bad)} trace(s) that could not be read "
                         f"({shown}{'; ...' if len(bad) > 5 else ''})")
                else:
                    note(f"window {span}: checked ({read} traces, {len(states)} runs open)")
                win_start = poll_end - int(back * 1e6)
                # the next window: smaller after a busy one, larger after a quiet one (never below two lookbacks)
                if read > limit // 2:
                    chunk = max(2 * back, chunk / 2)
                elif read < limit // 8:
                    chunk = min(chunk * 4, MAX_WINDOW_S)
            else:
                fails += 1
                if args.once:   # (counted as unchecked at the end: fails > 0)
                    note(f"window {span}: NOT checked: {failed}")
                    break
                wait = min(interval * 2 ** min(fails - 1, 10), max(interval, MAX_BACKOFF_S))
                if fails > GIVE_UP and not down:   # the same answer again and again: skip it, say so
                    unchecked[0] += 1
                    note(f"window {span}: NOT checked: {failed}; given up after {fails} tries, going on")
                    win_start, fails = poll_end - int(back * 1e6), 0
                else:
                    note(f"window {span}: NOT checked: {failed}; trying again in {wait:g} s")
            now = time.monotonic()
            last = failed is None and poll_end >= now_us
            for rid in [r for r, t in changed_at.items() if (args.once and last) or now - t > idle]:
                if rid in states:
                    finish(rid, "" if args.once else f"; its traces did not change for {args.idle or 'a while'}")
            sinks.post_alerts()
            behind = failed is None and poll_end < now_us
            if (args.once and not behind) or stop[0]:
                break
            if behind:
                continue   # catching up: the next window at once
            t_end = time.monotonic() + (interval if failed is None else wait)
            while not stop[0] and time.monotonic() < t_end:
                time.sleep(min(0.5, interval))
    except KeyboardInterrupt:
        pass
    finally:
        if fails:   # stopped while the current window was still unread: not a clean end
            unchecked[0] += 1
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        sinks.close()
    if unchecked[0]:
        print(f"{_PFX}: {unchecked[0]} window(s) or trace(s) of {base} (service {service}) could not be read: "
              "not everything was checked", file=err)
        return EXIT_UNREACHABLE
    if args.once and not states and not retired and args.run_id:
        print(f"{_PFX}: no trace of run {args.run_id} in {base} (service {service})", file=err)
        return EXIT_UNREACHABLE
    return EXIT_FINDINGS if sinks.total else EXIT_OK
