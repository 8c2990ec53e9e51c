"""``check -j N``: one run's log files checked by worker processes, with the same result as one process.

Split: the per-rank rules of each rank are independent of the other ranks, so each worker owns some of the run's
files (one rank each: the usual layout) and runs the log reader and the per-rank rules over them. The cross-rank
rules (C1-C5, the store fence, the epochs they compare) and the advisory localization read the ranks interleaved,
so they stay in the parent, which gets from the workers only what they read: the records whose tags are in
:data:`~cptrace_otel.checks.crossrank.READS` and the ``fwd_hash`` records, packed as tuples, each other run of
records as a count (:meth:`~cptrace_otel.checks.crossrank.CrossRank.skip`), plus the per-rank findings of each
chunk. Free and store records, which only the store fence of mode shared reads
(:data:`~cptrace_otel.checks.crossrank.FENCE_ONLY`), are counts too once the rank's config names another mode;
a chunk that counted some is replayed only while the group's mode is not shared (else the run is checked in one
process).

Same output, by construction: the one-process reader merges the files in chunks by the first ``ts`` of each chunk
(:func:`.sources.logs.read_log_events`); a worker reads its files in the same chunks and in the order that merge
reads them (the merge restricted to some files is the merge of those files), and sends one message per chunk read,
so the parent replays the merge over the chunks' summaries: the cross-rank stage sees the same records in the same
order, the per-rank findings come in the same order, malformed lines are reported in the same order. Layouts the
split cannot reproduce (a file holding several ranks, a rank in two files: the reader renumbers those in merge
order) are checked in one process; a worker that finds one late says so and the run is checked again in one
process (the warnings of the parallel attempt are held until it succeeds, so nothing is printed twice).

Processes: each worker is a fresh interpreter (``python -c``, :func:`serve`) that reads its task from its
standard input and writes one pickle per message to its standard output. Not ``fork``: the parent may run threads
(tqdm's monitor) and hold open files and a tuned collector. Not ``multiprocessing``'s ``spawn`` or
``forkserver`` either: both run the caller's ``__main__`` again in each worker, so a script without the
``if __name__ == "__main__"`` guard, or code read from standard input, fails there; a ``python -c`` child imports
only this package and starts clean whoever calls ``check``. A worker blocks when its pipe is full
(:data:`PIPE_BYTES`), so it holds its per-rank state and at most that much of messages: memory per worker is
bounded as in one process, and the parent holds the cross-rank state and one pipe's worth per worker. A worker
that fails or dies is :class:`WorkerFailed` (its message, exit 3), never a partial result.
"""

from __future__ import annotations

import heapq
import os
import pickle
from collections.abc import Callable
from typing import Any

from ..model.exits import CptraceError

PIPE_BYTES = 1 << 20     # each worker's pipe (Linux F_SETPIPE_SZ, else the default 64 KiB): how far it reads ahead
MIN_BYTES = 16 << 20     # without -j N, smaller runs are checked in one process (-j 2: 0.95x at 9 MiB, 1.21x at 17)
_LOC_TAG = "fwd_hash"    # the records the advisory localizer reads (Analysis observes them on each rank)


class WorkerFailed(CptraceError):
    """A worker process of ``check -j`` failed or died: the run has no result (exit 3, the worker's message)."""


class _Layout(Exception):
    """A run the split cannot reproduce (files not one rank each; a rank whose config names a mode other than shared
    in a group whose mode is shared): it is checked in one process."""


def default_jobs() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where that is missing)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def idle_jobs(cpus: int, load: float | None) -> int:
    """Of ``cpus``, those the 1-minute ``load`` average leaves idle, rounded (at least 1; all of them when the load
    is unknown). Why not all of them: the workers and the cross-rank stage in this process are ``jobs + 1``
    processes that each need a core; on a 2-core machine whose load was 1.9-3.5, ``-j 2`` ran at 0.52-1.15x of
    ``-j 1``, and at 1.45-1.56x when it was idle (docs/performance.md)."""
    if load is None:
        return cpus
    return max(1, min(cpus, int(cpus - load + 0.5)))


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def jobs_for(args: Any, paths: list[str]) -> int:
    """How many workers ``check`` uses for the log files ``paths`` of one run: ``args.jobs`` when given (0: the
    CPUs available); by default (None, or a namespace without ``jobs``) the idle CPUs (:func:`idle_jobs`). Without
    an explicit ``-j N``, runs under :data:`MIN_BYTES` are checked in one process (the workers' start costs more
    than they save). At most one worker per file; 1 for standard input."""
    if "-" in paths or len(paths) < 2:
        return 1
    j = getattr(args, "jobs", None)
    if j is None or j == 0:
        try:
            if sum(os.path.getsize(p) for p in paths) < MIN_BYTES:
                return 1
        except OSError:
            return 1   # the one-process reader reports it
        j = default_jobs() if j == 0 else idle_jobs(default_jobs(), load_average())
    return max(1, min(j, len(paths)))


# -- worker side -------------------------------------------------------------------------------------------------

def _worker(q: Any, files: list[tuple[int, str]], level: int | None, prior: tuple[int, list] | None) -> None:
    """Process entry: read ``files`` ((position in the run, path)) and check their ranks, sending to ``q``: one
    ``("open",)`` (or ``("error", position, path, reason)``), then one ``("read", ...)`` per chunk read, in the
    order the one-process merge reads them, then ``("done", ...)``; ``("mixed", path)`` when a file holds another
    rank after its first chunk; ``("failed", text)`` on any other error."""
    try:
        _work(q, files, level, prior)
    except BaseException as e:   # a worker reports everything: the parent must never take silence for success
        import traceback

        q.put(("failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"))


def _work(q: Any, files: list[tuple[int, str]], level: int | None, prior: tuple[int, list] | None) -> None:
    from ..checks import RankChecker
    from ..checks.crossrank import READS, sent_tags
    from ..checks.rules_l3 import L3Prior
    from .sources.inputs import consumed
    from .sources.logs import LogReadError, LogStats, file_chunks

    stats = LogStats()
    bad: list = []
    state: dict[int, list] = {}
    l3_prior = None
    if prior is not None:
        l3_prior = L3Prior(prior[0])
        for k, v in prior[1]:
            l3_prior.keys.put(k, v)
    handles, gens = [], []
    for i, p in files:
        try:
            fh, gen = file_chunks(p, i, bad.append, stats, state)
        except LogReadError as e:
            q.put(("error", i, e.path, e.reason))
            return
        handles.append(fh)
        gens.append(gen)
    q.put(("open",))
    sizes = [os.path.getsize(p) for _i, p in files]
    checkers: dict[int, RankChecker] = {}
    file_rank: dict[int, int] = {}
    file_mode: dict[int, str] = {}   # file -> the mode its rank's first config with one named (see below)
    loc: list = []

    def read(k: int) -> list | None:
        """The next chunk of file ``k`` (None at its end), its summary sent."""
        i, path = files[k]
        del bad[:]
        try:
            chunk = next(gens[k], None)
        except LogReadError as e:
            q.put(("error", i, e.path, e.reason))
            raise _Stop from None
        pos = consumed(handles[k])
        done = sizes[k] if pos is None else min(pos, sizes[k])
        if not chunk:
            q.put(("read", i, None, list(bad), done))
            return None
        rank = file_rank.setdefault(k, chunk[0].rank)
        items: list[tuple] = []
        found: list = []
        del loc[:]
        gap = glv = 0
        # Once this rank's config names a mode other than shared, its free and store records (FENCE_ONLY) go as
        # skips: the fence reads them only in mode shared, and the group's mode, set once by the first config the
        # merge meets, is this one or an earlier rank's. The parent checks that it is not shared (else the run is
        # checked in one process): in a run whose ranks agree on the mode, these are a quarter of what is sent
        send = sent_tags(file_mode.get(k))
        dropped = False
        chk = checkers.get(rank)
        if chk is None:
            chk = checkers[rank] = RankChecker(rank, level)
            chk.l3_prior = l3_prior
            chk.observe(_LOC_TAG, loc.append)
        feed = chk.feed_fast
        # the chunk through the rank's rules, then what the parent gets of it: each loop with its own code and data
        # in the CPU's caches (as Analysis.run does its two stages)
        for ev in chunk:
            if ev.rank != rank:
                q.put(("mixed", path))
                raise _Stop
            out = feed(ev)
            if out:
                found.extend(out)
        for ev in chunk:
            tag = ev.tag
            if tag in send:
                if gap:
                    items.append((gap, glv))
                    gap = glv = 0
                items.append((tag, ev.seq, ev.ts, ev.epoch, ev.fields, ev.level, ev.line_no))
                if tag == "config" and k not in file_mode:
                    m = ev.fields.get("mode")
                    if isinstance(m, str):   # (as CrossRank._config takes it)
                        file_mode[k] = m
                        send = sent_tags(m)
            else:
                if tag in READS:
                    dropped = True
                gap += 1
                if ev.level > glv:
                    glv = ev.level
        if gap:
            items.append((gap, glv))
        locs = [(e.tag, e.seq, e.ts, e.epoch, e.fields, e.level, e.line_no) for e in loc]
        q.put(("read", i, (chunk[0].ts, rank, len(chunk), items, found, locs, dropped), list(bad), done))
        return chunk

    try:
        heads = []
        for k in range(len(files)):
            c = read(k)
            if c:
                heads.append((c[0].ts, files[k][0], k))
        heapq.heapify(heads)
        while heads:   # the merge of read_log_events over these files, chunk by chunk
            k = heads[0][2]
            c = read(k)
            if c:
                heapq.heapreplace(heads, (c[0].ts, files[k][0], k))
            else:
                heapq.heappop(heads)
    except _Stop:
        return
    ranks = {r: (chk.finish(), chk.unchecked(), chk.level, chk.nodes_total, dict(chk._l3_ident),
                 list(chk._l3_keys.items())) for r, chk in checkers.items()}
    q.put(("done", ranks, stats.lines))


class _Stop(Exception):
    """The worker said why it stops (an error or a layout it cannot split) and ends."""


# -- parent side -------------------------------------------------------------------------------------------------

class _RankDone:
    """A worker's finished :class:`~cptrace_otel.checks.RankChecker`, as :class:`.engine.Analysis` reads it at the
    end (its end-of-stream findings, unchecked rules, level, nodes, and its L3 keys for the next run)."""

    def __init__(self, finish: list, unchecked: list, level: int, nodes: int, ident: dict, keys: list) -> None:
        self._finish, self._unchecked, self.level, self.nodes_total = finish, unchecked, level, nodes
        self._l3_ident, self._l3_keys = ident, dict(keys)

    def finish(self) -> list:
        return self._finish

    def unchecked(self) -> list:
        return self._unchecked


class _Pool:
    """The workers of one run, each a ``python -c`` child reading its task from its standard input and writing
    pickled messages to its standard output; :meth:`get` is the next message of one worker, raising
    :class:`WorkerFailed` when it failed or died."""

    def __init__(self, paths: list[str], jobs: int, level: int | None, prior: Any) -> None:
        import subprocess
        import sys

        sizes = []
        for i, path in enumerate(paths):
            try:
                sizes.append((os.path.getsize(path), i))
            except OSError:
                sizes.append((0, i))
        shares: list[list[int]] = [[] for _ in range(jobs)]
        load = [0] * jobs
        for size, i in sorted(sizes, reverse=True):   # largest first, onto the least loaded worker
            w = load.index(min(load))
            shares[w].append(i)
            load[w] += size + 1
        shares = [sorted(s) for s in shares if s]
        packed = None if prior is None or not len(prior.keys) else (prior.keys.cap, list(prior.keys.items()))
        self.owner = {i: w for w, s in enumerate(shares) for i in s}
        self.files = [[paths[i] for i in s] for s in shares]
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.procs: list[Any] = []
        try:
            for s in shares:
                proc = subprocess.Popen([sys.executable, "-c", _ENTRY], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, bufsize=PIPE_BYTES)
                self.procs.append(proc)
                _grow_pipe(proc.stdout)
                task = proc.stdin
                assert task is not None   # (stdin=PIPE)
                pickle.dump(([(i, paths[i]) for i in s], level, packed), task, protocol=pickle.HIGHEST_PROTOCOL)
                task.close()
        except BaseException:
            self.close()
            raise

    def get(self, w: int) -> tuple:
        p = self.procs[w]
        try:
            msg = pickle.load(p.stdout)
        except (EOFError, pickle.UnpicklingError, OSError):
            raise WorkerFailed(f"a check worker (reading {', '.join(self.files[w])}) ended with exit code "
                               f"{p.wait()} without a result") from None
        if msg[0] == "failed":
            raise WorkerFailed(f"a check worker (reading {', '.join(self.files[w])}) failed: {msg[1].strip()}")
        return msg

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
            p.stdout.close()


def _grow_pipe(fh: Any) -> None:
    """The pipe behind ``fh`` holds :data:`PIPE_BYTES` (Linux; elsewhere, or when refused, it keeps its size)."""
    try:
        import fcntl

        fcntl.fcntl(fh.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError):
        pass


class _Out:
    """A worker's message stream: one pickle per message on its standard output, flushed as it is written (the
    pipe's buffer is the bound on how far a worker runs ahead of the parent)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def put(self, msg: tuple) -> None:
        pickle.dump(msg, self._fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._fh.flush()


def serve() -> None:
    """The worker process: its task from standard input, its messages to standard output (see :func:`_worker`)."""
    import sys

    files, level, prior = pickle.load(sys.stdin.buffer)
    _worker(_Out(sys.stdout.buffer), files, level, prior)


# the worker's program: the collector tuned as the command tunes its own (the worker allocates as check does)
# (python -c puts the working directory first on sys.path, before PYTHONPATH: a folder named cptrace_otel there would
# be the workers' package instead of the parent's; -P, which leaves it out, needs Python 3.11)
_ENTRY = ("import sys\n"
          "if sys.path and sys.path[0] == '':\n    del sys.path[0]\n"
          "from cptrace_otel.commands import fewer_collections\n"
          "from cptrace_otel.analyze.parallel import serve\n"
          "with fewer_collections():\n    serve()\n")


def check_logs(paths: list[str], jobs: int, level: int | None, l3_prior: Any, run: str,
               on_bad: Callable[[Any], None], stats: Any, progress: Callable[[int, int], None] | None) -> Any:
    """The :class:`.engine.Result` of ``Analysis(level, l3_prior=l3_prior, run=run).run(read_log_events(paths,
    on_bad, stats, progress))`` computed by ``jobs`` worker processes (at least two; ``paths`` at least two files,
    no standard input): the same findings in the same order, unchecked list, stats and localization; the same
    malformed lines, reported through ``on_bad`` and counted in ``stats`` in the same order (once the run is
    read, not while it is); ``l3_prior`` absorbs the run's L3 backups as :meth:`.engine.Analysis.run` does.
    Returns None, having printed and counted nothing, when the files are not one rank each (check them in one
    process). Raises :class:`.sources.logs.LogReadError` for a file that cannot be read (after reporting the
    malformed lines read before it, as the one-process reader does) and :class:`WorkerFailed`."""
    from .sources.logs import LogReadError, LogStats

    mine = LogStats()
    bad: list = []
    pool = _Pool(paths, jobs, level, l3_prior)
    try:
        res = _replay(pool, paths, level, l3_prior, run, mine, bad, progress)
    except _Layout:
        return None
    except LogReadError:
        _hand_over(mine, bad, stats, on_bad)
        raise
    finally:
        pool.close()
    _hand_over(mine, bad, stats, on_bad)
    return res


def _hand_over(mine: Any, bad: list, stats: Any, on_bad: Callable[[Any], None]) -> None:
    """The counts and malformed lines of the parallel read, reported as the one-process reader reports them."""
    stats.lines += mine.lines
    stats.events += mine.events
    for m in bad:
        stats.add(m)
        on_bad(m)


def _replay(pool: _Pool, paths: list[str], level: int | None, l3_prior: Any, run: str, mine: Any, bad: list,
            progress: Callable[[int, int], None] | None) -> Any:
    from ..model.events import Event
    from .engine import Analysis
    from .sources.logs import LogReadError

    n = len(paths)
    errors = []
    for w in range(len(pool.procs)):   # every file is opened before any is read, as read_log_events does
        msg = pool.get(w)
        if msg[0] == "error":
            errors.append(msg)
    if errors:
        _i, path, why = min(errors)[1:]
        raise LogReadError(path, why)
    done = [0] * n
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass

    def read(i: int) -> tuple | None:
        msg = pool.get(pool.owner[i])
        if msg[0] == "mixed":
            raise _Layout
        if msg[0] == "error":
            raise LogReadError(msg[2], msg[3])
        _tag, at, summary, lines, pos = msg
        assert at == i, f"worker message for file {at}, expected {i}"
        bad.extend(lines)
        done[i] = pos
        return summary

    firsts = [read(i) for i in range(n)]
    per_file = [{s[1]} if s else set() for s in firsts]
    ranks: set[int] = set().union(*per_file)
    if sum(len(x) for x in per_file) != len(ranks):
        raise _Layout   # a rank in two files: the reader numbers its records in merge order
    an = Analysis(level, l3_prior=l3_prior, run=run)
    if ranks:
        an.cross.expect_ranks(ranks)
    xr = an.cross
    cross, skip, localize, found = xr.feed, xr.skip, an.localizer.feed, an.findings
    order: list[int] = []   # ranks in the order their first chunk was merged (the order Analysis met them)
    events = 0
    heads = [(s[0], i, s) for i, s in enumerate(firsts) if s]
    heapq.heapify(heads)
    while heads:
        _ts, i, (_t0, rank, count, items, fnd, locs, dropped) = heads[0]
        if progress is not None:
            progress(sum(done), total)
        if rank not in order:
            order.append(rank)
        src = paths[i]
        events += count
        if fnd:
            found.extend(fnd)
        for it in locs:
            localize(Event(it[0], rank, it[1], it[2], it[3], it[4], it[5], src, it[6]))
        for it in items:
            if len(it) == 2:
                skip(rank, it[0], it[1])
            else:
                cross(Event(it[0], rank, it[1], it[2], it[3], it[4], it[5], src, it[6]))
        if dropped and not (xr.disabled or (xr.mode is not None and xr.mode != "shared")):
            raise _Layout   # the worker skipped free/store records the store fence reads: ranks differ in mode
        nxt = read(i)
        if nxt:
            heapq.heapreplace(heads, (nxt[0], i, nxt))
        else:
            heapq.heappop(heads)
    if progress is not None:
        progress(total, total)
    checkers: dict[int, Any] = {}
    for w in range(len(pool.procs)):
        msg = pool.get(w)
        if msg[0] == "mixed":
            raise _Layout
        _tag, rank_done, lines = msg
        mine.lines += lines
        for r, vals in rank_done.items():
            checkers[r] = _RankDone(*vals)
    an.checkers = {r: checkers[r] for r in order}
    an.events = events
    mine.events = events
    res = an.result()
    if l3_prior is not None:
        l3_prior.absorb(run, an.checkers.values())
    return res
