"""``cptrace-otel`` command line. Exit codes: 0 clean, 1 findings, 2 usage error, 3 a source or backend unreachable.

An unexpected exception in a command is exit 3 with a one-line message on stderr (never 1, which a CI script reads
as findings); ``CPTRACE_DEBUG=1`` prints its traceback as well.

Each subcommand's work lives in its own module, imported only when that subcommand runs, so ``--version`` and
``--help`` load nothing heavy.
"""

from __future__ import annotations

import argparse
import sys

from ._version import __version__

from .exits import EXIT_UNREACHABLE, EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cptrace-otel", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"cptrace-otel {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("check", help="check invariants over log files, OTLP files, Jaeger JSON exports or a Jaeger")
    c.add_argument("paths", nargs="*", metavar="PATH",
                   help="log files ([CPTRACE ...] lines), OTLP JSON-lines files, Jaeger JSON exports (/api/traces, "
                        "/api/v3/traces, the UI's downloads), or folders of them (read recursively); plain or gzip; "
                        "- reads standard input")
    c.add_argument("--json", action="store_true", help="print one JSON object (findings, unchecked, stats)")
    c.add_argument("--level", type=int, default=None, help="force the trace level instead of inferring it")
    c.add_argument("--jaeger-url", default=None, help="Jaeger query base URL, for trace links in the report")
    c.add_argument("--run-id", default=None,
                   help="run id: the run to read with --jaeger; for log files, the one used for trace links")
    j = c.add_argument_group("reading the run from Jaeger instead of files")
    j.add_argument("--jaeger", default=None, metavar="URL",
                   help="Jaeger query base URL (e.g. http://127.0.0.1:16686; user:password@ allowed) to read the "
                        "run's traces from")
    j.add_argument("--tempo", default=None, metavar="URL",
                   help="Grafana Tempo query URL (e.g. http://127.0.0.1:3200) to read the run (--run-id) from with "
                        "TraceQL; untested against a live Tempo")
    j.add_argument("--service", default=None, help="service name of the traces (default sglang-hicache)")
    j.add_argument("--since", default=None, metavar="DURATION",
                   help="traces with spans that started in this last while (30m, 1h, 2d; default 7d)")
    j.add_argument("--start", default=None, metavar="TIME", help="window start: ISO 8601 (UTC unless given) or unix s")
    j.add_argument("--end", default=None, metavar="TIME", help="window end (default now)")
    j.add_argument("--limit", type=int, default=None,
                   help="traces per search (the memory store's search depth, at most its max_traces; default 1000)")
    _progress_flags(c)

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
    _progress_flags(r)

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

    g = sub.add_parser("ingest", help="replay upstream log files (all ranks) as OTLP")
    g.add_argument("logs", nargs="+", metavar="LOG", help="upstream log files, plain or gzip; - reads standard input")
    tgt = g.add_mutually_exclusive_group()
    tgt.add_argument("--endpoint", default=None, help="OTLP traces URL")
    tgt.add_argument("--file", default=None, help="OTLP JSON-lines output file")
    g.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "grpc"])
    g.add_argument("--run-id", default=None)
    g.add_argument("--no-progress", action="store_true")
    return p


def _progress_flags(p: argparse.ArgumentParser) -> None:
    pg = p.add_mutually_exclusive_group()
    pg.add_argument("--progress", dest="progress", action="store_true", default=None,
                    help="show a progress bar on stderr while reading log files (default: when stderr is a terminal)")
    pg.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors and 0 on --help/--version
        return int(e.code or 0)
    if args.command is None:
        p.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "jaeger_url", None):   # the base of every link a command prints or writes: http(s) only
        from .links import normalize_base

        try:
            args.jaeger_url = normalize_base(args.jaeger_url)
        except ValueError as e:
            print(f"cptrace-otel {args.command}: --jaeger-url: {e}", file=sys.stderr)
            return EXIT_USAGE
    if args.command == "check":
        from .analyze import check_cmd as mod
    elif args.command == "report":
        from .analyze import report_cmd as mod
    elif args.command == "watch":
        from .analyze import watch_cmd as mod
    elif args.command == "demo":
        from .sim import demo as mod
    else:
        from . import ingest as mod
    try:
        return int(mod.run(args))
    except KeyboardInterrupt:
        return 130
    except Exception as e:   # a bug or an input nobody foresaw: exit 3, never 1 (that is "findings")
        return _crashed(args.command, e)


def _crashed(command: str, e: BaseException) -> int:
    """One line on stderr for an unexpected exception (the traceback too with ``CPTRACE_DEBUG=1``); exit 3."""
    import os

    if os.environ.get("CPTRACE_DEBUG", "") not in ("", "0"):
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    where = ""
    tb = e.__traceback__
    while tb is not None:   # the innermost frame of the package: where to look, without the whole traceback
        if "cptrace_otel" in tb.tb_frame.f_code.co_filename:
            where = f" at {tb.tb_frame.f_code.co_name}:{tb.tb_lineno}"
        tb = tb.tb_next
    msg = " ".join(str(e).split())[:300]
    print(f"cptrace-otel {command}: internal error{where}: {type(e).__name__}: {msg} (exit 3; a bug: rerun with "
          "CPTRACE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
    return EXIT_UNREACHABLE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
