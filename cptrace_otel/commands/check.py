"""``cptrace-otel check [--json] [--level N] [--jaeger-url URL] [--run-id ID] [--[no-]progress] PATH...`` and
``cptrace-otel check --jaeger URL [--run-id ID] [--service S] [--since 1h | --start T --end T] [--limit N]``.

Reads upstream log files, OTLP JSON-lines files and Jaeger JSON exports (``/api/traces``, the UI's downloads,
``/api/v3/traces``), told apart by content (:mod:`.sources.detect`; plain or gzip; ``-`` is standard input), or
folders of them (every recognised file below, recursively), or one run's traces straight from a Jaeger query
service (:mod:`.sources.jaegerquery`). Runs the per-rank rules (H1-H4, ZERO, HASH) and the cross-rank rules
(C1-C5), and prints the findings, then the advisory fwd_hash localization (level 3; it never changes the exit code).

Exit codes: 0 clean, 1 findings, 2 usage error (also: the same run given twice in a way that cannot be counted
once), 3 a source cannot be read, holds no cptrace record (empty, binary, plain text, traces of another service:
the message names the file and what it looked like), or Jaeger cannot be reached (the URL is printed, its password
masked). A check never passes on input in which no record was found.

Runs: every rule judges one run; records of several runs given together are analysed run by run and reported
together (findings name their run; the text report says how many runs were read and lists those with findings). A
trace record's run is its resource's ``cptrace.run_id`` (records with none are one run, ``(no run id)``); records
given twice within a run (same rank, epoch and seq, same content) count once. Upstream log lines carry no run id: the
log files given together are one run unless a rank recurs in the files of two folders (two launches; each folder is
then a run: :func:`.sources.overlap.log_runs`). Log files and trace documents of the same folders holding the same
records (a run's logs and its OTLP files; with every trace file when the logs' folders hold none) are counted once,
from one of them (:mod:`.sources.overlap`; stderr says which), the logs' run then named by the trace files' run id;
holding other records, the log files are a run of their own, ``(no run id) FOLDER``. ``--run-id`` keeps one run: the
trace records of that run id, and the log files of it or of no known run (exit 3, naming the runs found, when nothing
matches). While log files are read, a byte progress bar goes to stderr when it is a terminal (``--progress`` /
``--no-progress`` force it on / off); a Jaeger fetch prints a line per search then.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from ..analyze.result_output import CHECK_PREFIX as _PFX
from ..model.exits import EXIT_UNREADABLE, EXIT_USAGE, CptraceError
from . import add_progress_flags, fewer_collections

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..analyze.sources.detect import Plan
    from ..analyze.sources.logs import Malformed
    from ..analyze.sources.tracedocs import TraceDocs
    from ..model.events import Event

NO_RUN_ID = "(no run id)"   # the start of the name of a run whose records carry no run id (log files)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``check`` subcommand's parser, added to ``sub`` (the ``cli`` subparsers)."""
    c = sub.add_parser("check", help="check invariants over log files, OTLP files, Jaeger JSON exports or a Jaeger",
                       description="Every rule judges one run. A trace record's run is its resource's cptrace.run_id "
                                   "(records with none are one run); log lines carry none: the log files given "
                                   "together are one run unless a rank recurs in two folders (two launches: a run "
                                   "per folder). Several runs are checked run by run and reported together.")
    c.add_argument("paths", nargs="*", metavar="PATH",
                   help="log files ([CPTRACE ...] lines), OTLP JSON-lines files, Jaeger JSON exports (/api/traces, "
                        "/api/v3/traces, the UI's downloads), or folders of them (read recursively); plain or gzip; "
                        "- reads standard input")
    c.add_argument("--json", action="store_true", help="print one JSON object (findings, unchecked, stats)")
    c.add_argument("--level", type=int, default=None, help="force the trace level instead of inferring it")
    c.add_argument("--jaeger-url", default=None, help="Jaeger query base URL, for trace links in the report")
    c.add_argument("--run-id", default=None,
                   help="check only this run: the run to read with --jaeger or --tempo; in files, the records whose "
                        "resource has this cptrace.run_id, and the log files (their lines carry no run id), which "
                        "it also names for trace links")
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
    c.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="worker processes for log files (default: the CPUs the 1-minute load average leaves idle, "
                        "one process for runs under 16 MiB; 0: every CPU available). "
                        "Each worker reads some rank files and runs their per-rank rules; this process runs the "
                        "cross-rank rules over what they send: the same output as -j 1. One file, standard input, "
                        "a file of several ranks, OTLP files, Jaeger and Tempo input: one process")
    add_progress_flags(c)
    return c


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    from ..analyze.links import bad_link_base

    bad = bad_link_base(args)
    if bad:
        print(f"cptrace-otel check: {bad}", file=err)
        return EXIT_USAGE
    paths = list(getattr(args, "paths", None) or [])
    level = getattr(args, "level", None)
    jaeger = getattr(args, "jaeger", None)
    tempo = getattr(args, "tempo", None)
    if tempo is not None and (jaeger is not None or paths):
        print(f"{_PFX}: give PATHs, --jaeger or --tempo, one of them", file=err)
        return EXIT_USAGE
    if tempo is not None:
        from ..analyze.tempo_runs import run_tempo
        return run_tempo(args, level, out, err)
    if jaeger is not None and paths:
        print(f"{_PFX}: give PATHs or --jaeger, not both", file=err)
        return EXIT_USAGE
    query_flags = ("since", "start", "end", "service", "limit")
    if jaeger is None and any(getattr(args, k, None) is not None for k in query_flags):
        print(f"{_PFX}: --service, --since, --start, --end and --limit select traces in Jaeger: they need --jaeger URL",
              file=err)
        return EXIT_USAGE
    if not paths and jaeger is None:
        print(f"{_PFX}: no PATH given", file=err)
        return EXIT_USAGE
    if paths.count("-") > 1:
        print(f"{_PFX}: standard input (-) can be given once", file=err)
        return EXIT_USAGE
    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs < 0:
        print(f"{_PFX}: -j must be 1 or more, or 0 (the CPUs available), not {jobs}", file=err)
        return EXIT_USAGE
    if level is not None and level not in (1, 2, 3):
        print(f"{_PFX}: --level must be 1, 2 or 3, not {level}", file=err)
        return EXIT_USAGE
    with fewer_collections():
        if jaeger is not None:
            from ..analyze.jaeger_runs import run_jaeger
            return run_jaeger(args, level, out, err)
        return _run(args, paths, level, out, err)


def _run(args: argparse.Namespace, paths: list[str], level: int | None, out: TextIO, err: TextIO) -> int:
    try:
        a = analyze_sources(args, paths, level, err)
    except SourceError as e:
        return e.exit_code
    from ..analyze.result_output import print_report

    return print_report(args, a.res, a.run_id, getattr(args, "jaeger_url", None), a.sources, a.stats, a.doc_malformed,
                  out, err)


class SourceError(CptraceError):
    """Reading the sources stopped with exit code ``exit_code``; the reason was already printed."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.exit_code = code


class Analyzed(NamedTuple):
    """What :func:`analyze_sources` read: the merged result, the run id, one ``(Result, events)`` per run (its
    ``stats["run"]`` names it; when ``keep``, its events in the order the rules saw them, to be iterated once: read
    anew from the files or the trace documents, a list only for standard input), the sources read per kind, the log
    reader's stats and the trace documents' malformed count."""

    res: Any
    run_id: str | None
    groups: list[tuple[Any, Any]]
    sources: dict[str, Any]
    stats: Any
    doc_malformed: int


def analyze_sources(args: argparse.Namespace, paths: list[str], level: int | None, err: TextIO, keep: bool = False,
                    pfx: str = _PFX) -> Analyzed:
    """Read ``paths`` as ``check`` does and analyze them (every rule, per-rank and cross-rank).

    Every run is analyzed apart (see the module doc); with ``keep`` each run's events, in the order the rules saw
    them, are given again in ``groups`` (one per run; :class:`Analyzed`) for the HTML report to draw. Reader
    warnings go to ``err``. Raises :class:`SourceError` (after printing why, prefixed with ``pfx``) when
    a source cannot be read, holds no record, or the sources overlap in a way that cannot be counted once."""
    from ..analyze.engine import Analysis, Result, Runs, analyze_traces
    from ..analyze.parallel import WorkerFailed, check_logs, jobs_for
    from ..analyze.sources.detect import expand
    from ..analyze.sources.logs import LogReadError, LogStats, read_log_events
    from ..analyze.sources.tracedocs import TraceDocs
    from ..checks.rules_l3 import L3Prior

    try:
        plan = expand(paths)
    except OSError as e:
        print(f"{pfx}: cannot read {e.filename or paths[0]}: {e.strerror or e}", file=err)
        raise SourceError(EXIT_UNREADABLE) from None
    if plan.rejected or plan.empty_dirs:
        for s in plan.rejected:
            print(f"{pfx}: {_name(s.path)}: no cptrace record found: {s.what}", file=err)
        for d in plan.empty_dirs:
            print(f"{pfx}: {d}: no cptrace input in this folder{_skipped_list(plan, d)}", file=err)
        raise SourceError(EXIT_UNREADABLE)
    _notes(plan, err)
    logs, otlp, docfiles = plan.logs, plan.otlp, plan.docs
    results: list[Result] = []
    groups: list[tuple[Result, Any]] = []
    run_id = getattr(args, "run_id", None)
    stats = LogStats()
    docs = TraceDocs()
    info = docs.info
    try:
        empty = [p for p in otlp if docs.add_otlp_lines(p) == 0]
        empty += [p for p in docfiles if docs.add_document_file(p) == 0]
        if empty:
            for p in empty:
                bad = [m for m in info.malformed if m[0] == p]
                first = f"; the first, line {bad[0][1]}: {bad[0][2]}" if bad else ""
                print(f"{pfx}: {_name(p)}: no cptrace record found: {docs.describe(p)}"
                      + (f" ({len(bad)} malformed line(s){first})" if bad else ""), file=err)
            raise SourceError(EXIT_UNREADABLE)
        docs.dedupe()
        _dup_notes(docs, err)
        log_groups = _log_runs(logs, docs, otlp + docfiles, pfx, err)
        if run_id is not None:
            log_groups = _select_run(run_id, docs, log_groups, pfx, err)
        held = docs.sources()
        otlp, docfiles = [p for p in otlp if p in held], [p for p in docfiles if p in held]
        logs = [p for _label, group in log_groups for p in group]
        runs = Runs()
        l3_prior = L3Prior()   # each run's L3 backups serve the runs read after it (FOREIGN, L3a): nothing else
        if logs:
            bar = _progress_bar(args, err, logs)

            def on_bad(m: Malformed) -> None:
                if stats.malformed <= 20:
                    if bar is not None:
                        bar.clear()
                    print(f"warning: {m.path}:{m.line_no}: malformed line ({m.reason})", file=err)
            try:
                for label, group in log_groups:   # (their lines hold no run id: log_runs)
                    jobs = 1 if keep else jobs_for(args, group)
                    if jobs > 1:   # worker processes, the same result (None: files not one rank each)
                        one = check_logs(group, jobs, level, l3_prior, label, on_bad, stats,
                                         bar.to if bar is not None else None)
                        if one is not None:
                            runs.add(label, one)
                            one.stats["run"] = label
                            groups.append((one, []))
                            continue
                    evs = read_log_events(group, on_bad, stats, bar.to if bar is not None else None)
                    # the report reads files again (nothing held); standard input's events are kept as they pass
                    kept: Any = _Reread(group) if keep and "-" not in group else []
                    one = Analysis(level, l3_prior=l3_prior, run=label).run(
                        _Kept(evs, kept) if keep and isinstance(kept, list) else evs)
                    runs.add(label, one)
                    one.stats["run"] = label
                    groups.append((one, kept))
            finally:
                if bar is not None:
                    bar.close()
            results.append(runs.result())
            results[-1].links.update((label, "") for label, _g in log_groups if label.startswith(NO_RUN_ID))
        if docs.total():
            results.append(analyze_traces(level, docs, err, l3_prior=l3_prior))
            found: dict[str, list] = {}
            for f in results[-1].findings:
                found.setdefault(f.run, []).append(f)
            if keep:   # one group per run: the report draws each run apart, from its records read anew
                for run, again in docs.runs():
                    groups.append((Result(found.get(run, []), [], {"run": run}), again))
        if run_id is None and len(info.run_ids) == 1:   # (the trace files' run id also when the logs were chosen)
            run_id = next(iter(info.run_ids))
        doc_malformed = info.malformed if otlp or docfiles else []
        for path, line_no, why in doc_malformed[:20]:
            print(f"warning: {path}:{line_no}: malformed line ({why})", file=err)
    except (LogReadError, WorkerFailed) as e:
        print(f"{pfx}: {e}", file=err)
        raise SourceError(EXIT_UNREADABLE) from None
    res = _merge(results)
    unknown = sum(r.stats.get("unknown_rank_streams", 0) for r in results)
    if unknown:
        res.stats["unknown_rank_streams"] = unknown
    if not res.stats.get("events"):
        read = logs + otlp + docfiles
        why = "; ".join(f"{_name(p)}: {plan.notes[p]}" for p in read if p in plan.notes)
        print(f"{pfx}: no cptrace record found in {', '.join(map(_name, read))}"
              + (f" ({stats.malformed} malformed [CPTRACE lines)" if stats.malformed else "")
              + (f" ({why})" if why else ""), file=err)
        raise SourceError(EXIT_UNREADABLE)
    sources: dict[str, Any] = {"logs": logs, "otlp": otlp}
    if docfiles:
        sources["jaeger"] = docfiles
    return Analyzed(res, run_id, groups, sources, stats, len(doc_malformed))


class _Reread:
    """The events of log files, read anew each time it is iterated (malformed lines skipped silently: the first
    reading reported them)."""

    def __init__(self, paths: list[str]) -> None:
        self._paths = paths

    def __iter__(self) -> Any:
        from ..analyze.sources.logs import read_log_events
        return iter(read_log_events(self._paths))


class _Kept:
    """``events`` passed through unchanged while each one is appended to ``into`` (keeps the ``ranks`` hint of the
    log reader, which the cross-rank rules read before the first event)."""

    def __init__(self, events: Iterable[Event], into: list) -> None:
        self.ranks = getattr(events, "ranks", None)
        self._events, self._into = events, into

    def __iter__(self) -> Any:
        keep = self._into.append
        for ev in self._events:
            keep(ev)
            yield ev


def _log_runs(logs: list[str], docs: TraceDocs, doc_files: list[str], pfx: str,
              err: TextIO) -> list[tuple[str, list[str]]]:
    """The runs of the log files: ``(run, files)`` (upstream log lines carry no run id: see
    :func:`.sources.overlap.log_runs`). Each run's logs are compared with the trace files of the same folders (with
    every trace file when those folders hold none; run by run when they hold several, the logs read once) by
    :func:`.sources.overlap.decide`: the
    same records are counted once (the log files' run is then named by the trace files' run id, or the trace files
    are dropped from ``docs``); other records are another run, named ``(no run id) FOLDER``. Raises
    :class:`SourceError` when a run is split in a way that cannot be counted once."""
    import os

    from ..analyze.sources.overlap import decide, log_heads, log_runs

    folders = log_runs(logs)
    out = []
    for folder, group in folders.items():
        dirs = {os.path.dirname(p) or "." for p in group}
        mine = [p for p in doc_files if (os.path.dirname(p) or ".") in dirs]
        view = docs.only(set(mine)) if mine else docs
        views = view.by_run()
        matched = None
        if len(views) > 1 and "-" not in group:   # trace files of several runs beside the logs: find the logs' run
            heads = log_heads(group, view.ranks())
            for rid, one in views.items():
                choice = decide(group, one, mine or doc_files, heads)
                if choice is not None:
                    view, matched = one, rid
                    break
        else:
            choice = decide(group, view, mine or doc_files)
        label = f"{NO_RUN_ID} {folder}"
        if choice is not None:
            if choice.use == "refuse":
                print(f"{pfx}: {choice.message}", file=err)
                raise SourceError(EXIT_USAGE)
            print(f"check: {choice.message}", file=err)
            if choice.use == "docs":
                continue
            ids = view.run_ids()
            if len(ids) == 1 and ids[0]:
                label = ids[0]
            docs.drop_sources(set(mine or doc_files), matched)
        out.append((label, group))
    return out


def _select_run(run_id: str, docs: TraceDocs, log_groups: list, pfx: str, err: TextIO) -> list:
    """``--run-id`` on files: keep the trace records of that run and the log files of it (log files of no known run
    are named by it, as their lines hold none); say so when it matches no record (:class:`SourceError`, exit 3,
    naming the runs the sources hold)."""
    have = sorted(set(docs.run_ids()) | {label for label, _g in log_groups if not label.startswith(NO_RUN_ID)})
    shown = ", ".join(r or NO_RUN_ID for r in have[:10]) + (f" and {len(have) - 10} more" if len(have) > 10 else "")
    docs.keep_run(run_id)
    kept = [(run_id if label.startswith(NO_RUN_ID) else label, g) for label, g in log_groups
            if label == run_id or label.startswith(NO_RUN_ID)]
    if not kept and not docs.total():
        print(f"{pfx}: run id {run_id} matches no record of the sources"
              + (f" (they hold {len(have)} run(s): {shown})" if have else ""), file=err)
        raise SourceError(EXIT_UNREADABLE)
    if run_id not in have and have:   # checked: the log files of no known run, named by it
        print(f"check: run id {run_id} matches no trace record (the sources hold {len(have)} run(s): {shown}); "
              "checking the log files of no known run", file=err)
    return kept


def _name(path: str) -> str:
    return "standard input" if path == "-" else path


def _skipped_list(plan: Plan, folder: str) -> str:
    import os

    inside = [s for s in plan.skipped if os.path.commonpath([os.path.abspath(s.path), os.path.abspath(folder)])
              == os.path.abspath(folder)]
    if not inside:
        return " (no files)"
    shown = "; ".join(f"{os.path.relpath(s.path, folder)}: {s.what}" for s in inside[:5])
    return f" ({len(inside)} files: {shown}{'; ...' if len(inside) > 5 else ''})"


def _notes(plan: Plan, err: TextIO) -> None:
    """What the folders held besides cptrace input, and files reached twice (stderr, one line each)."""
    if plan.skipped:
        shown = "; ".join(f"{s.path}: {s.what}" for s in plan.skipped[:5])
        more = f"; and {len(plan.skipped) - 5} more" if len(plan.skipped) > 5 else ""
        print(f"check: skipped {len(plan.skipped)} file(s) in the folders that hold no cptrace record ({shown}{more})",
              file=err)
    if plan.twice:
        print(f"check: given more than once, read once: {', '.join(plan.twice)}", file=err)


def _dup_notes(docs: TraceDocs, err: TextIO) -> None:
    for (a, b), n in sorted(docs.duplicates.items()):
        both = f"{a} holds {n} record(s) twice" if a == b else f"{a} and {b} hold the same {n} record(s)"
        print(f"check: {both}: counted once", file=err)
    for (a, b), n in sorted(docs.conflicts.items()):
        print(f"warning: {a} and {b} hold {n} different record(s) under the same rank, epoch and seq (two runs, or a "
              "restarted rank?): both are analysed", file=err)
    for src, n in sorted(docs.rounded.items()):
        print(f"warning: {src}: {n} integer(s) above 2^53 look rounded by a browser (the Jaeger UI's downloads pass "
              "values through JavaScript): hashes compared by HASH and C5 may be off; export with the API instead "
              "(curl .../api/traces/ID or .../api/v3/traces/ID)", file=err)


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


def _progress_bar(args: argparse.Namespace, err: TextIO, paths: list[str]) -> _Bar | None:
    """The bar when ``--progress`` asks for it, or by default when ``err`` is a terminal; None for ``--no-progress``
    and when standard input is read (its length is not known)."""
    if "-" in paths:
        return None
    want = getattr(args, "progress", None)
    if want is None:
        want = bool(getattr(err, "isatty", lambda: False)())
    return _Bar(err) if want else None


def _merge(results: list) -> Any:
    from ..analyze.engine import Runs

    if len(results) == 1:
        return results[0]
    runs = Runs()
    for r in results:
        runs.add(None, r)
    return runs.result()
