"""The same run given twice: log files and trace documents (OTLP files, Jaeger JSON) that hold the same records.

A demo or an instrumented server writes each rank's records twice, as upstream log lines and as OTLP, often into
one folder. Analysing both would count every event, and so every finding, twice. :func:`decide` compares, for each
rank that both kinds of source hold, the first :data:`HEAD` records (tag and typed fields, ``ts`` included: the
record's own monotonic clock, so two different runs never match) and answers:

* ``None``: no rank in common, or the common ranks hold different records (different runs that reuse rank
  numbers): both are analysed, as separate runs;
* ``Choice("logs" | "docs")``: the same records; the kind that holds every rank of the other is analysed alone, the
  other is dropped. When both hold the same ranks, the one with more records wins (the OTLP path can drop records
  under backpressure; a log can be cut), the log files on a tie (their findings point at file:line);
* ``Choice("refuse")``: the same run split in a way that cannot be counted once (some common ranks match and others
  do not, or each kind has ranks the other lacks); ``message`` names the files.

Which log files are one run (:func:`log_runs`) is decided here too: log lines carry no run id.

Only the heads of the log files are parsed here (and their markers counted when both kinds hold the same ranks):
the logs are then read by the analysis itself, or not at all.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

from .detect import count_markers
from .inputs import STDIN
from .logs import read_log_events
from .tracedocs import TraceDocs

HEAD = 64                 # records per rank compared
_MAX_EVENTS = 200_000     # at most this many log records are read to find HEAD of every common rank


@dataclasses.dataclass
class Choice:
    use: str                  # "logs", "docs" or "refuse"
    message: str
    ranks: list[int]          # the ranks found in both


def log_heads(logs: list[str], doc_ranks: set[int]) -> tuple[dict[int, list], dict[int, set[str]], set[int]]:
    """``(heads, sources, ranks)`` of the log files: the first :data:`HEAD` records of each rank (read until those
    of ``doc_ranks`` are complete), the files each rank's head came from, the ranks seen."""
    heads: dict[int, list] = {}
    log_src: dict[int, set[str]] = {}
    stream = read_log_events(logs)
    log_ranks = set(stream.ranks)
    # the ranks each log file starts with are known now; stop once every one of them the documents hold is covered
    target = (doc_ranks & log_ranks) or doc_ranks
    for ev in itertools.islice(stream, _MAX_EVENTS):
        log_ranks.add(ev.rank)
        h = heads.setdefault(ev.rank, [])
        if len(h) < HEAD:
            h.append((ev.tag, ev.fields))
            log_src.setdefault(ev.rank, set()).add(ev.src)
        if len(h) == HEAD and all(len(heads.get(r, ())) >= HEAD for r in target):
            break
    return heads, log_src, log_ranks


def decide(logs: list[str], docs: TraceDocs, doc_files: list[str],
           heads_of_logs: tuple | None = None) -> Choice | None:
    """See the module doc; ``heads_of_logs``: :func:`log_heads` of ``logs`` when already read (comparing one log
    folder with several runs reads the logs once)."""
    doc_ranks = docs.ranks()
    if not logs or not doc_ranks or STDIN in logs:   # standard input can be read only once: not compared
        return None
    heads, log_src, log_ranks = heads_of_logs or log_heads(logs, doc_ranks)
    common = sorted(log_ranks & doc_ranks)
    if not common:
        return None
    same = [r for r in common if _same_head(heads.get(r, []), docs.head(r, HEAD))]
    if not same:
        return None

    def pairs(ranks: list[int]) -> str:
        shown = "; ".join(f"rank {r}: {_names(log_src.get(r, ()))} = {_names(docs.sources_of(r))}" for r in ranks[:4])
        return shown + ("; ..." if len(ranks) > 4 else "")

    if len(same) < len(common):
        differ = [r for r in common if r not in same]
        return Choice("refuse", f"the log files and the trace files hold the same records for ranks {_span(same)} "
                                f"({pairs(same)}) but other records for ranks {_span(differ)}: give one run once",
                      common)
    only_logs, only_docs = sorted(log_ranks - doc_ranks), sorted(doc_ranks - log_ranks)
    if only_logs and only_docs:
        return Choice("refuse", f"the log files and the trace files hold the same records for ranks {_span(same)} "
                                f"({pairs(same)}), and ranks {_span(only_logs)} only in the log files, ranks "
                                f"{_span(only_docs)} only in the trace files: give each rank of the run once", common)
    n_logs = sum(count_markers(p) for p in logs)
    n_docs = sum(docs.count(r) for r in doc_ranks)
    if only_docs or (not only_logs and n_docs > n_logs):
        use, dropped = "docs", logs
    else:
        use, dropped = "logs", doc_files
    counts = f"{n_logs} records in the log files, {n_docs} in the trace files"
    return Choice(use, f"the log files and the trace files hold the same records for ranks {_span(same)} "
                       f"({pairs(same)}; {counts}): counted once, from the {'log' if use == 'logs' else 'trace'} "
                       f"files; not read: {_names(dropped)}", common)


def _same_head(a: list, b: list) -> bool:
    n = min(len(a), len(b))
    return n > 0 and all(a[i][0] == b[i].tag and a[i][1] == b[i].fields for i in range(n))


def _names(paths) -> str:
    names = [os.path.basename(p) or p for p in sorted(paths)]
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _span(ranks: list[int]) -> str:
    """``0-3`` for a run of consecutive ranks, else ``0, 2, 5``."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def log_runs(paths: list[str]) -> dict[str, list[str]]:
    """The runs of log files given together: a name -> its files, in the order given.

    Upstream log lines carry no run id, so the run is inferred from where a rank's records are: the files given
    together are one run (one launch's ranks, wherever each rank's file was copied to) unless the same rank is found
    in the files of two folders, which only two launches give (a launch writes each rank once; a rotated rank's
    files stay in one folder): then each folder is one run. The name is the folder (``.`` for the current one,
    ``standard input`` for ``-``), or for one run of several folders their common folder. A rank is read from each
    file's first chunk of records (as :func:`read_log_events` does), so deciding costs one chunk per file."""
    folders: dict[str, list[str]] = {}
    for p in paths:
        folders.setdefault("standard input" if p == STDIN else os.path.dirname(p) or ".", []).append(p)
    if len(folders) < 2 or STDIN in paths:   # standard input can be read once only: a folder of its own
        return folders
    where: dict[int, str] = {}
    per_file = read_log_events(paths).per_file
    for p, ranks in zip(paths, per_file, strict=False):
        folder = os.path.dirname(p) or "."
        for r in ranks:
            if r >= 0 and where.setdefault(r, folder) != folder:
                return folders   # a rank in two folders: two launches
    try:
        common = os.path.commonpath(list(folders)) or "."
    except ValueError:   # relative and absolute folders mixed
        common = ", ".join(folders)
    return {common: list(paths)}
