"""``cptrace-otel ingest LOG...``: replay upstream ``[CPTRACE tag] k=v`` log files of all ranks as OTLP.

One run per ingest: log lines carry no run id; the files given are one run unless a rank recurs in the files of
several folders (two launches, as ``check`` reads them: :func:`~cptrace_otel.analyze.sources.overlap.log_runs`),
which is refused (exit 2): each folder is ingested on its own.

The same mapping as the live exporter: every line becomes one span event through :class:`~cptrace_otel.model.spans.
SpanBuilder` (one builder and one resource per rank, online checks stamped unless ``CPTRACE_CHECKS=0``), sent
through the same sinks: OTLP/HTTP or gRPC (``--endpoint``/``--protocol``, spooled and retried like live export) or an
OTLP JSON-lines file (``--file``; the default is ``cptrace-out/<run id>/ingest.otlp.jsonl`` when neither is given
and no ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set).

Timestamps: log ``ts=`` values are monotonic ns. Each file is anchored to wall time by its ``config mono= wall=``
record, else by the wall time in the logger prefix of its first trace line, else by the file's mtime.

Prints a summary (events, traces, spans, findings, malformed lines with ``file:line``). A line the span builder
cannot take (a value of the wrong type, such as ``op=[1,2]``) is such a malformed line: reported and skipped, the
rest is sent. Exit codes: 0 done, 3 a log cannot be read, holds no cptrace record (binary, protobuf, empty: as in
``check``, never a pass with "0 events"), the endpoint cannot be reached (message with the URL, no traceback), or it
refuses the credentials (HTTP 401/403, gRPC ``UNAUTHENTICATED``/``PERMISSION_DENIED``: "authentication failed"
with the URL). No message holds a credential, even where the backend's answer echoes one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ..model import semconv as sc

if TYPE_CHECKING:
    from ..analyze.sources.logs import LogStats, Malformed
    from ..model.config import Config
    from ..model.events import Event
    from ..model.spans import SpanBuilder

EXIT_OK, EXIT_UNREACHABLE = 0, 3
EXPORT_EVERY_EVENTS = 20_000
WALL_LIKE_NS = 10**17  # a ts above this is already Unix-epoch ns (after 1973)


def _err(msg: str) -> None:
    print(f"cptrace-otel ingest: {msg}", file=sys.stderr, flush=True)


def _derived_run_id(paths: list[str]) -> str:
    """The same id for the same files (re-ingesting them replaces, not duplicates, their traces); standard input
    (``-``) has no identity to derive one from, so a run that reads it gets a fresh id."""
    h = hashlib.blake2b(digest_size=6)
    if "-" in paths:
        h.update(f"stdin:{time.time_ns()}:{os.getpid()}".encode())
    for p in sorted(os.path.abspath(x) for x in paths):
        h.update(p.encode())
        try:
            h.update(str(os.stat(p).st_size).encode())
        except OSError:
            pass
    return "ingest-" + h.hexdigest()


def _prefix_wall_ns(path: str) -> int | None:
    """Wall time (ns, local time) from the logger prefix of the first trace line of ``path`` (None for standard
    input, which cannot be read twice)."""
    from ..model.logline import parse_prefix

    if path == "-":
        return None
    from ..analyze.sources.inputs import MAX_LINE

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(iter(lambda: f.readline(MAX_LINE), "")):   # a longer line is read in parts
                idx = line.find("[CPTRACE ")
                if idx >= 0:
                    wall = parse_prefix(line[:idx]).wall
                    if wall:
                        return _wall_to_ns(wall)
                    return None
                if i > 100_000:
                    return None
    except OSError:
        return None
    return None


def _wall_to_ns(wall: str) -> int | None:
    import datetime as dt

    try:
        d = dt.datetime.fromisoformat(wall.replace(",", "."))
    except ValueError:
        return None
    return int(d.timestamp() * 1e9)  # naive -> local time, like SGLang's logger


_MARKER = b"[CPTRACE "


def count_trace_lines(paths: list[str]) -> int | None:
    """The progress bar's total: ``[CPTRACE`` markers in the files (decompressed when gzip); None (unknown) when
    standard input is among them: it can be read only once."""
    from ..analyze.sources.inputs import STDIN, open_text

    if STDIN in paths:
        return None
    n = 0
    for p in paths:
        try:
            with open_text(p) as fh:
                tail = b""   # the end of the previous block: a marker split between two blocks counts once
                while True:
                    b = fh.buffer.read(1 << 22)  # type: ignore[attr-defined]
                    if not b:
                        break
                    n += (tail + b).count(_MARKER)   # (tail is shorter than a marker: none counted twice)
                    tail = b[-(len(_MARKER) - 1):]
        except OSError:
            pass
    return n


class _Clock:
    """Per source file: monotonic ``ts`` -> wall ns."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}

    def wall(self, ev: Event) -> int:
        off = self.offsets.get(ev.src)
        if off is None:
            off = self._anchor(ev)
            self.offsets[ev.src] = off
        return ev.ts + off

    def _anchor(self, ev: Event) -> int:
        if ev.ts >= WALL_LIKE_NS:
            return 0
        f = ev.fields
        mono, wall = f.get("mono"), f.get("wall")
        if ev.tag == "config" and isinstance(mono, int) and isinstance(wall, (int, float)):
            wall_ns = int(wall * 1e9) if wall < 1e11 else int(wall)  # seconds or ns
            return wall_ns - mono
        anchor = _prefix_wall_ns(ev.src)
        if anchor is None:
            try:
                anchor = int(os.stat(ev.src).st_mtime * 1e9)
            except OSError:
                anchor = time.time_ns()
        return anchor - ev.ts


def _target(args: argparse.Namespace, cfg: Config, run_id: str) -> tuple[str | None, str, str | None]:
    """``(endpoint, protocol, out_file)``: the command line's endpoint or file, else the environment's endpoint,
    else the default file. An HTTP endpoint without a path gets the OTLP traces path."""
    from ..model.config import traces_url

    endpoint, protocol = args.endpoint, args.protocol
    if not endpoint and not args.file and cfg.endpoint:
        endpoint, protocol = cfg.endpoint, cfg.protocol
    if endpoint:
        return traces_url(endpoint, protocol), protocol, None
    return None, protocol, args.file or os.path.join("cptrace-out", run_id, "ingest.otlp.jsonl")


def _open_sinks(cfg: Config, endpoint: str | None, protocol: str, out_file: str | None, run_id: str) -> Any:
    """The sinks (:func:`~cptrace_otel.export.stack.open_sinks`, the backend probed first), or None when they
    cannot be set up (reported)."""
    from ..export.stack import SinkError, open_sinks

    try:
        return open_sinks(cfg, endpoint=endpoint, protocol=protocol, file=out_file, probe=True,
                          spool_dir=os.path.join(cfg.spool_dir, f"{run_id}-ingest-{os.getpid()}"))
    except SinkError as e:
        if e.kind == "auth":
            _err(f"OTLP endpoint {e.target} refused the credentials: authentication failed ({e.cause}); check "
                 "OTEL_EXPORTER_OTLP_[TRACES_]HEADERS or the endpoint's user:password")
        elif e.kind == "unreachable":
            _err(f"OTLP endpoint {e.target} is unreachable ({e.cause})")
        elif e.kind == "otlp":
            _err(f"cannot use OTLP endpoint {e.target}: {e.cause}")
        elif e.kind == "config":
            _err(f"cannot use OTLP endpoint {e.target}: configuration error: {e.cause}")
        else:
            _err(f"cannot write {e.target}: {e.cause}")
        return None


def _summary(n: int, logs: list[str], builders: dict[int, SpanBuilder], stats: LogStats, malformed: list[str],
             run_id: str, target: str) -> None:
    spans = sum(b.spans for b in builders.values())
    traces = len(set().union(*(b.traces for b in builders.values()))) if builders else 0
    findings = sum(b.findings for b in builders.values())
    print(f"ingested {n} events from {len(logs)} file(s), {len(builders)} rank(s): {spans} spans in {traces} "
          f"traces, {findings} findings stamped; run id {run_id} -> {target}")
    if stats.malformed:
        print(f"{stats.malformed} malformed line(s):")
        for m in malformed:
            print(f"  {m}")
        if stats.malformed > len(malformed):
            print(f"  ... and {stats.malformed - len(malformed)} more")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``ingest`` subcommand's parser, added to ``sub`` (the ``cli`` subparsers)."""
    g = sub.add_parser("ingest", help="replay upstream log files (all ranks) as OTLP")
    g.add_argument("logs", nargs="+", metavar="LOG",
                   help="upstream log files of one run, plain or gzip; - reads standard input (log lines carry no run "
                        "id: files whose ranks recur in several folders are several runs, and refused)")
    tgt = g.add_mutually_exclusive_group()
    tgt.add_argument("--endpoint", default=None, help="OTLP traces URL")
    tgt.add_argument("--file", default=None, help="OTLP JSON-lines output file")
    g.add_argument("--protocol", default="http/protobuf", choices=["http/protobuf", "grpc"])
    g.add_argument("--run-id", default=None, help="the run id the replayed run gets (default: derived from the files)")
    g.add_argument("--no-progress", action="store_true")
    return g


def run(args: argparse.Namespace) -> int:
    from . import fewer_collections

    with fewer_collections():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from ..analyze.sources.logs import LogReadError, LogStats, Malformed, read_log_events
    from ..analyze.sources.overlap import log_runs
    from ..checks.rank_checker import checker_factory
    from ..model import config as _config, config_stamp
    from ..model.spans import SpanBuilder

    env_cfg = _config.from_env()
    logs = list(args.logs)
    try:
        folders = log_runs(logs)
    except LogReadError as e:
        _err(str(e))
        return EXIT_UNREACHABLE   # (3: the same code as an unreadable file below)
    if len(folders) > 1:   # one run id per ingest: two launches' logs would be merged into one run
        from ..model.exits import EXIT_USAGE

        _err(f"these log files are {len(folders)} runs (their lines carry no run id, and ranks recur in the files of "
             f"several folders: {', '.join(list(folders)[:5])}{' ...' if len(folders) > 5 else ''}); ingest each "
             "folder on its own")
        return EXIT_USAGE
    run_id = args.run_id or (env_cfg.run_id if env_cfg.run_id_given else "") or _derived_run_id(logs)
    endpoint, protocol, out_file = _target(args, env_cfg, run_id)
    sinks = _open_sinks(env_cfg, endpoint, protocol, out_file, run_id)
    if sinks is None:
        return EXIT_UNREACHABLE
    net = next((s for s in sinks if s.waits), None)   # the OTLP sink, when there is one

    # -- replay ---------------------------------------------------------------------------------------------------
    checkers = checker_factory(env_cfg.checks, None)  # level None: inferred per stream
    builders: dict[int, SpanBuilder] = {}
    stats = LogStats()
    malformed: list[str] = []

    def on_malformed(m: Malformed) -> None:
        if len(malformed) < 20:
            malformed.append(f"{m.path}:{m.line_no}: {m.reason}")

    stamps: dict[int, dict[str, Any]] = {}   # rank -> its config record's stamp (model.config_stamp), as the exporter

    def resource(rank: int) -> dict[str, Any]:
        return {sc.SERVICE_NAME: env_cfg.service_name, sc.SERVICE_INSTANCE_ID: f"ingest:{run_id}:{rank}",
                sc.CP_RANK: rank, sc.RUN_ID: run_id, **dict(env_cfg.resource_attributes), **stamps.get(rank, {})}

    def on_config(ev: Event) -> None:
        stamps[ev.rank] = config_stamp.stamp(ev)

    def export() -> None:
        groups = [(resource(r), b.take()) for r, b in sorted(builders.items())]
        groups = [g for g in groups if g[1]]
        if not groups:
            return
        for s in sinks:
            s.export(groups)

    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=count_trace_lines(logs), unit="ev", file=sys.stderr, desc="ingest", mininterval=0.5)
    clock = _Clock()
    n = 0
    try:
        for ev in read_log_events(logs, on_malformed=on_malformed, stats=stats):
            b = builders.get(ev.rank)
            if b is None:
                b = builders[ev.rank] = SpanBuilder(run_id, f"ingest:{ev.rank}", env_cfg.span_timeout_s, checkers)
                b.on_config = on_config
            ev.ts = clock.wall(ev)
            try:
                b.add(ev)
            except Exception as e:   # a field of a type the builder cannot use: that record only is lost
                bad = Malformed(ev.src, ev.line_no, f"not replayed: {type(e).__name__}: {str(e)[:160]}", "")
                stats.add(bad)
                on_malformed(bad)
                continue
            n += 1
            if n % EXPORT_EVERY_EVENTS == 0:
                export()
                if bar is not None:
                    bar.update(EXPORT_EVERY_EVENTS)
        for b in builders.values():
            b.finish()
        export()
    except LogReadError as e:
        _err(str(e))
        return EXIT_UNREACHABLE
    finally:
        if bar is not None:
            bar.update(n % EXPORT_EVERY_EVENTS)
            bar.close()

    ok = True
    for s in sinks:
        if s.waits:   # the backend: everything delivered (or spooled) within the budget, then let go
            ok = s.flush(max(60.0, env_cfg.timeout_s * 6)) and ok
            s.close(1.0)
        else:
            ok = s.close(0.0) and ok

    target = net.url if net is not None else out_file
    _summary(n, logs, builders, stats, malformed, run_id, target)  # type: ignore[arg-type]
    if n == 0:   # binary, protobuf, empty, or text without [CPTRACE lines: an error, as in check, never "0 events"
        names = ", ".join("standard input" if p == "-" else p for p in logs)
        if out_file and os.path.isfile(out_file) and os.path.getsize(out_file) == 0:
            os.unlink(out_file)   # no empty output left behind to be mistaken for a replayed run
        _err(f"no cptrace record found in {names}"
             + (f" ({stats.malformed} malformed [CPTRACE line(s))" if stats.malformed else
                " (not upstream log lines: binary, protobuf or empty input?)"))
        return EXIT_UNREACHABLE
    if not ok:
        _err(f"not everything was delivered to {target}" + (f" (spool: {net.spool_dir})" if net is not None else ""))
        return EXIT_UNREACHABLE
    return EXIT_OK
