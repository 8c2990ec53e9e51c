"""``cptrace-otel check [--json] [--level N] [--jaeger-url URL] [--run-id ID] [--[no-]progress] PATH...``

Reads upstream log files and/or OTLP JSON-lines files (told apart by content; plain or gzip; ``-`` is standard
input), runs the per-rank rules (H1-H4,
ZERO, HASH) and the cross-rank rules (C1-C5), and prints the findings, then the advisory fwd_hash localization
(level 3; it never changes the exit code). Exit codes: 0 clean, 1 findings, 2 usage
error, 3 a source cannot be read. Log files and OTLP files given together are analyzed as two separate runs
(their ranks would otherwise collide) and reported together. While log files are read, a byte progress bar goes
to stderr when it is a terminal (``--progress`` / ``--no-progress`` force it on / off).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3


def run(args: Any, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    paths = list(getattr(args, "paths", None) or [])
    level = getattr(args, "level", None)
    if not paths:
        print("cptrace-otel check: no PATH given", file=err)
        return EXIT_USAGE
    if paths.count("-") > 1:
        print("cptrace-otel check: standard input (-) can be given once", file=err)
        return EXIT_USAGE
    if level is not None and level not in (1, 2, 3):
        print(f"cptrace-otel check: --level must be 1, 2 or 3, not {level}", file=err)
        return EXIT_USAGE
    import gc
    # The analysis allocates a few short-lived containers per event and keeps little: collect the young generation
    # less often (the default, every 700 allocations, costs several percent of a check).
    old_threshold = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    try:
        return _run(args, paths, level, out, err)
    finally:
        gc.set_threshold(*old_threshold)


def _run(args: Any, paths: list[str], level: int | None, out: TextIO, err: TextIO) -> int:
    from .report import to_json, to_text
    from .sources.logs import LogReadError

    try:
        res, run_id, _ = analyze_sources(args, paths, level, err)
    except LogReadError as e:
        print(f"cptrace-otel check: {e}", file=err)
        return EXIT_UNREADABLE
    jaeger = getattr(args, "jaeger_url", None)
    if getattr(args, "json", False):
        out.write(to_json(res, run_id, jaeger) + "\n")
    else:
        out.write(to_text(res, run_id, jaeger) + "\n")
    return EXIT_FINDINGS if res.findings else EXIT_OK


def analyze_sources(args: Any, paths: list[str], level: int | None, err: TextIO,
                    keep: bool = False) -> tuple[Any, str | None, list[tuple[Any, list]]]:
    """Read ``paths`` as ``check`` does and analyze them: ``(merged Result, run id or None, groups)``.

    Log files and OTLP files are two groups (two runs, analyzed apart); ``groups`` holds one ``(Result, events)``
    per group read, ``events`` being every Event of the group in the order the rules saw it when ``keep`` is true
    (the HTML report draws them), else an empty list. The run id is ``args.run_id`` or the one run id the OTLP files
    name. Reader warnings (malformed lines, interleaving) go to ``err``. Raises
    :class:`~.sources.logs.LogReadError` when a source cannot be read."""
    from .engine import Analysis, Result
    from .sources.logs import LogStats, read_log_events
    from .sources.otlpfile import OtlpInfo, looks_like_otlp, read_otlp_events

    otlp = [p for p in paths if looks_like_otlp(p)]
    logs = [p for p in paths if p not in otlp]
    results: list[Result] = []
    groups: list[tuple[Result, list]] = []
    run_id = getattr(args, "run_id", None)
    stats = LogStats()
    info = OtlpInfo()
    if logs:
        bar = _progress_bar(args, err, logs)

        def on_bad(m: Any) -> None:
            if stats.malformed <= 20:
                if bar is not None:
                    bar.clear()
                print(f"warning: {m.path}:{m.line_no}: malformed line ({m.reason})", file=err)
        kept: list = []
        try:
            evs = read_log_events(logs, on_bad, stats, bar.to if bar is not None else None)
            results.append(Analysis(level).run(_Kept(evs, kept) if keep else evs))
        finally:
            if bar is not None:
                bar.close()
        groups.append((results[-1], kept))
    if otlp:
        kept = []
        evs = read_otlp_events(otlp, info)
        results.append(Analysis(level, info.levels).run(_Kept(evs, kept) if keep else evs))
        groups.append((results[-1], kept))
        if run_id is None and len(info.run_ids) == 1:
            run_id = next(iter(info.run_ids))
        for path, line_no, why in info.malformed[:20]:
            print(f"warning: {path}:{line_no}: malformed line ({why})", file=err)
    res = _merge(results)
    res.stats["malformed"] = stats.malformed + len(info.malformed)
    res.stats["lines"] = stats.lines
    res.stats["sources"] = {"logs": logs, "otlp": otlp}
    if stats.malformed > 20:
        print(f"warning: {stats.malformed} malformed lines in all (first 20 shown)", file=err)
    if stats.disordered():
        print(f"warning: {stats.behind} records of {', '.join(sorted(stats.behind_src))} come after records of "
              "another rank with a later ts: the ranks in one stream are not interleaved in time (concatenated "
              "logs?); the cross-rank rules (C1-C5) expect ranks within a few hundred records of each other and "
              "may report false findings: give each rank's log as its own file (files are merged by ts)", file=err)
    res.stats["out_of_order"] = stats.behind
    return res, run_id, groups


class _Kept:
    """``events`` passed through unchanged while each one is appended to ``into`` (keeps the ``ranks`` hint of the
    log reader, which the cross-rank rules read before the first event)."""

    def __init__(self, events: Any, into: list) -> None:
        self.ranks = getattr(events, "ranks", None)
        self._events, self._into = events, into

    def __iter__(self) -> Any:
        keep = self._into.append
        for ev in self._events:
            keep(ev)
            yield ev


class _Bar:
    """A tqdm byte bar the log reader moves with ``to(done, total)`` (absolute positions, once per chunk)."""

    def __init__(self, err: TextIO) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc="check", file=err,
                         mininterval=0.5, dynamic_ncols=True)

    def to(self, done: int, total: int) -> None:
        b = self._bar
        if b.total != total:
            b.total = total
        if done > b.n:
            b.update(done - b.n)

    def clear(self) -> None:
        self._bar.clear()

    def close(self) -> None:
        self._bar.close()


def _progress_bar(args: Any, err: TextIO, paths: list[str]) -> _Bar | None:
    """The bar when ``--progress`` asks for it, or by default when ``err`` is a terminal; None for ``--no-progress``
    and when standard input is read (its length is not known)."""
    if "-" in paths:
        return None
    want = getattr(args, "progress", None)
    if want is None:
        want = bool(getattr(err, "isatty", lambda: False)())
    return _Bar(err) if want else None


def _merge(results: list) -> Any:
    from ..checks import Finding
    from .engine import Result

    if len(results) == 1:
        return results[0]
    findings = [f for r in results for f in r.findings]
    findings.sort(key=Finding.sort_key)
    unchecked = [u for r in results for u in r.unchecked]
    stats: dict[str, Any] = {"events": sum(r.stats["events"] for r in results),
                             "nodes": sum(r.stats["nodes"] for r in results),
                             "ranks": sorted({x for r in results for x in r.stats["ranks"]}),
                             "levels": {}}
    for r in results:
        stats["levels"].update(r.stats.get("levels", {}))
    return Result(findings, unchecked, stats, [e for r in results for e in r.localization])
