"""The traced process's side of the pipeline: bounded buffer, drainer thread, exporter worker, as one object,
:class:`Pipeline`, and the module-level API that runs one per process (:func:`start`, :func:`flush`,
:func:`shutdown`, :func:`stats`, :func:`current`).

Contract (docs/ARCHITECTURE.md):

* :func:`start` returns the submit function that api installs (``api._STATE.submit``): a bounded ``deque`` append of
  ``(time_ns, level, tag, fields)`` on the caller's thread. When the buffer holds ``config.queue_size`` records, or an
  estimated ``config.queue_bytes`` bytes, the new record is dropped and counted. It never blocks and never raises (a
  signal handler's exit aside: api). The byte bound costs nothing while fewer than :data:`UNMEASURED` records wait
  (the normal case: the drainer keeps up); beyond that one record in 32 has its size estimated (:func:`_estimate`: the
  lengths of its string and list values plus a per-field constant), standing for the 32, so a stalled exporter holds
  about ``queue_bytes`` plus :data:`UNMEASURED` records (an estimate: sizes that vary wildly blur it).
* A daemon drainer thread (:mod:`.drainer`) pops batches in order (after shipping a partial batch it lingers
  :data:`~.drainer.LINGER_S` for more, so that records arriving a few per millisecond are not shipped one message each;
  a flush does not wait), resolves deferred fingerprints (``fingerprint.is_deferred/resolve``, waiting on their CUDA
  event), renders every value that is not already an int, str or float (bools as ``True``/``False``; anything else with
  upstream ``_fmt`` semantics; a value whose ``str`` raises becomes ``(err:<ExceptionType>)``;
  :func:`cptrace_otel.model.records.compact_item`) and ships batches of these compact items to the exporter worker, in
  order (messages and frames: :mod:`cptrace_otel.export.protocol`; the channel: :mod:`.channels`). The worker completes
  each with the same rendering (:mod:`cptrace_otel.model.records`), so the result is the same, but the traced process
  does the least work. With the record ring (default with the exporter process; off: ``CPTRACE_RING=0``) the submit
  function is its own (:mod:`.ring`) and the buffer carries only records of other shapes (SIDE: put at placeholders).
* Wake-ups: none while no record needs the threads. With the ring the drainer sleeps until a side record lands (C
  side path), a flush, a stop or a dead worker (backstop :data:`~.drainer.RING_IDLE_WAIT_S`; it polls while the
  rank is looked for); the deque path polls (:data:`~.drainer.IDLE_WAIT_S` doubling to
  :data:`~.drainer.IDLE_WAIT_MAX_S`); the ack reader blocks.
* The worker is a subprocess per traced process (``python -m cptrace_otel.export.worker``; not ``multiprocessing``,
  since SGLang rank processes may be daemonic), fed over its stdin and acking over its stdout; it exits after
  delivering once its stdin closes, so it never outlives the traced process for long. ``CPTRACE_EXPORTER=thread``
  runs the same worker loop in a thread instead (and a worker that cannot be spawned falls back to it).
* :func:`flush` returns True only when everything emitted before it is exported or written (open spans closed);
  False on timeout, while the backend is unreachable (records wait in the spool), or once any record was lost (a
  worker died holding it, the backend rejected it, it could not be traced, it was abandoned at shutdown, the ring or
  buffer was full: :mod:`.losses`, which names them on stderr, rate-limited). :func:`stats` has the counters
  (:class:`PipelineStats`): ``dropped`` counts every lost record, whoever lost it, and is exported as
  ``cptrace.dropped`` on the rank span.
* Worker death (kill -9, OOM): the worker reports, about every 0.2 s (``PROGRESS``), how many of the records it was
  sent reached a final state; the records shipped beyond that died with it and are counted as dropped (and named on
  stderr). It is restarted (at most :data:`~.drainer.MAX_RESTARTS` times, with backoff), told the seq to go on from
  and the dead worker's last epoch state (so trace ids stay the same); the online checks start over, which its rank span
  says (``cptrace.exporter.restarts``, ``cptrace.checks.restarted``).
* Rendering runs on the drainer thread: a value whose ``str`` raises costs only that value (records.py); one that
  blocks for :data:`RENDER_BUDGET_S` is given up by a watchdog thread: that record is dropped and counted, the
  records the stuck drainer had already rendered are shipped, and a new drainer carries on (reported on stderr).
  A drainer that dies anyway is reported and replaced the same way. The watchdog (:mod:`.watchdog`) samples only
  while the drainer renders; otherwise it sleeps until the drainer starts rendering or ends.
* Exit, signals, fork (:mod:`cptrace_otel.traced.lifecycle`): the exit shutdown, the SIGTERM flush (signal-safe:
  ``lifecycle.Flag``; :meth:`Pipeline.signal_flush`) and the fork-child reset (:meth:`Pipeline.forget_in_child`)
  are registered there when this module is imported; closing with the drainer stuck on a value ships what it had
  rendered and counts the stuck record (:meth:`Pipeline.close`).
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Any, TypedDict

from ..export.protocol import ACK, PROGRESS
from ..model.records import RESOLVE_TIMEOUT_S
from . import drainer as _drainer, lifecycle, losses, ring as _ring, watchdog as _watchdog
from .channels import Channel, ChannelOwner
from .rendering import estimate as _estimate, import_drainer_needs as _import_drainer_needs

if TYPE_CHECKING:
    from ..model.config import Config
    from .ranks import RankHold

EXIT_FLUSH_S = 5.0        # exit flush budget
RENDER_BUDGET_S = RESOLVE_TIMEOUT_S + 5.0  # one record's rendering may take this long (a GPU fingerprint waits 30 s)
UNMEASURED = 1024         # records buffered before the byte bound starts estimating sizes
SAMPLE_MASK = 31          # past that, one record in SAMPLE_MASK + 1 is measured (its estimate counts for all)

_lock = threading.Lock()
_state: Pipeline | None = None
_fids = itertools.count(1)
_on_stop: Callable[[], None] | None = None   # start()'s caller's uninstall hook
_closing: Pipeline | None = None   # the pipeline shutdown() is closing (a SIGTERM or the exit flush finishes it)
_last_stats: PipelineStats | None = None


class _Counters(TypedDict):
    """The keys every :class:`PipelineStats` has."""

    dropped: int                 # every record lost, whoever lost it (cptrace.dropped on the rank span)
    shipped: int                 # records handed to the worker (shipped by the drainer, taken from the ring)
    lost: int                    # records lost on their way (a subset of dropped: flush() is False once > 0)
    queued: int                  # records still in the buffer and the ring
    exporter: str                # "process" or "thread"
    worker_gone: str | None      # why no worker runs any more (None while one does)
    restarts: int                # workers started after one died
    stuck_renders: int           # records given up because rendering them blocked
    in_flight: int               # records the worker was given and has not reported settled
    queued_bytes_est: int        # the byte bound's estimate of the buffered records
    dropped_queue_bytes: int     # records dropped by the byte bound (a subset of dropped)
    worker: dict[str, Any]       # the worker's own figures at the last flush (events, spans, requests...)


class PipelineStats(_Counters, total=False):
    """:func:`stats` of a pipeline (a dict: index it as one); ``ring`` only with the record ring."""

    ring: _ring.RingStats


class Pipeline:
    """One traced process's pipeline: it owns its bounded buffer and submit function, its record ring (or None),
    the channel to its exporter worker, its drainer and watchdog threads, its flush requests and its counters.

    Life: ``Pipeline(config)``, :meth:`start` (the threads), :meth:`make_submit` (the function api installs), then
    :meth:`flush` any number of times, :meth:`shutdown` (or :meth:`close` alone, which a SIGTERM-interrupted
    shutdown reruns); in a forked child :meth:`forget_in_child` instead. Which thread touches what:

    * callers (the submit function): ``buf`` (append), ``qbytes``, ``measured``, ``dropped``, ``dropped_bytes``;
      :meth:`flush`: ``flush_reqs``, ``waiters``, ``wake``.
    * the drainer (:mod:`.drainer`, what it touches: :class:`~.drainer.Host`): ``buf`` (pop), ``cfg`` and ``hold``
      once the rank is found, ``channel`` (started, restarted), ``restarts``, ``prev_wlost``, ``gone``,
      ``cur_items``, ``rendering``, ``shipped``, ``dropped``, ``lost``.
    * the watchdog (:mod:`.watchdog`, :class:`~.watchdog.Watched`): ``watch_idle``; through
      :meth:`replace_drainer`: ``gen``, ``drainer``, ``stuck``, ``dropped``, ``lost``.
    * the channel's reader (or worker) thread: :meth:`on_ack` (``stats_of_worker``, the flush answers, the
      channel's books),
      :meth:`on_worker_gone` (``gone``, ``wake``).
    * the closing thread (``shutdown()``, the exit flush, a SIGTERM handler): ``stop``, ``exiting`` and, with the
      drainer stuck, what the watchdog would have done (:meth:`close`).

    The counters are plain ints bumped with ``+=`` from more than one thread (under the GIL; a lost increment
    would blur a figure, never block or raise)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.buf: collections.deque = collections.deque()
        self.cap = max(1, int(cfg.queue_size))
        self.max_bytes = max(1, int(getattr(cfg, "queue_bytes", 64 << 20)))
        self.qbytes = 0             # estimated bytes of the measured records still buffered (approximate)
        self.measured = 0           # how many records those are
        self.dropped_bytes = 0      # records dropped by the byte bound (subset of dropped)
        self.dropped = losses.START.take()   # (records lost while no pipeline could start: this one answers)
        self.shipped = 0
        self.flush_reqs: collections.deque = collections.deque()
        self.waiters: dict[int, list[Any]] = {}
        self.wake = lifecycle.Flag()   # (signal-safe: see lifecycle; a threading.Event could deadlock a SIGTERM)
        self.stop = False
        self.channel: Channel | None = None
        self.gone: str | None = None
        self.lost = 0               # records lost on their way (subset of dropped): flush() is False once it is > 0
        self.prev_wlost = 0         # records that dead workers reported lost (counted in dropped by them)
        self.restarts = 0
        self.stuck = 0              # records given up because rendering them blocked
        self.stats_of_worker: dict[str, Any] = {}
        self.pid = os.getpid()
        self.exiting = False        # at exit: the worker does not wait for a backend that is down
        self.gen = 0                # the running drainer's generation: an older drainer that wakes up stops
        self.hold: RankHold | None = None   # while the rank is not yet known (see drainer.run)
        self.cur_items: list = []   # the batch the drainer is rendering (the watchdog takes it over if stuck)
        self.rendering = False
        self.watch = lifecycle.Flag()   # wakes the idle watchdog: the drainer started rendering, or it ended
        self.watch_idle = False         # the watchdog sleeps on self.watch
        self.ring = _ring.create(cfg)   # the record ring (CPTRACE_RING), else None: the deque path
        self.loss_report = losses.LossReport("dropped (a full ring or buffer, a sink or worker lost them)")
        self.drainer = threading.Thread(target=_drainer.run, args=(self,), name="cptrace-drainer", daemon=True)
        self.watchdog = threading.Thread(target=_watchdog.watch, args=(self, lambda: RENDER_BUDGET_S),
                                         name="cptrace-watchdog", daemon=True)

    def start(self) -> None:
        """Start the drainer and the watchdog threads."""
        self.drainer.start()
        self.watchdog.start()

    # caller side ---------------------------------------------------------------------------------------------------
    def make_submit(self) -> Callable[[int, str, dict], None]:
        """The submit function api installs: ``submit(level, tag, fields)`` puts the record in the ring, or appends
        it to :attr:`buf` within the record and byte bounds (else drops and counts it); never blocks, never raises
        an ``Exception`` (see the module docstring). It runs on the caller's thread: nothing beyond the bound checks
        and the append belongs in it."""
        if self.ring is not None:   # records go to the ring; those of other shapes to self.buf (traced/ring.py)
            return self.ring.submit(self.buf, self.cap, self.max_bytes, self.wake.raw_set)
        buf = self.buf
        cap = self.cap
        append = buf.append
        now = time.time_ns
        st = self

        try:
            soft = min(cap, UNMEASURED)
        except TypeError:  # a test's odd capacity: let the submit's compare fail inside its guard
            soft = cap
        max_bytes = self.max_bytes
        k = SAMPLE_MASK + 1
        full = False  # over the byte bound at the last sample: written only here, on the callers' side

        def _sampled(level: int, tag: str, fields: dict, n: int) -> None:
            # Every k-th record past ``soft``, each record while over the byte bound, and at the record bound.
            nonlocal full
            if n >= cap:
                st.dropped += 1
                return
            if full:
                full = st.qbytes >= max_bytes  # the drainer may have made room since
            if not full:
                est = _estimate(fields) * k
                full = st.qbytes + est > max_bytes
                if not full:
                    st.qbytes += est
                    st.measured += k
                    append((now(), level, tag, fields))
                    return
            st.dropped += 1
            st.dropped_bytes += 1

        def _submit(level: int, tag: str, fields: dict, _len: Callable[[Sized], int] = len) -> None:
            try:
                n = _len(buf)
                if n < soft or (n & SAMPLE_MASK and not full and n < cap):
                    append((now(), level, tag, fields))
                else:
                    _sampled(level, tag, fields, n)
            except Exception:  # never BaseException: a SystemExit here is the app's SIGTERM handler's (lifecycle)
                pass               # run between two bytecodes; swallowed, its process ran on for ever

        return _submit

    def popped(self) -> None:
        """The drainer took records from the front: scale the byte estimate to the measured records that can still
        be buffered (they are the newest; uniform sizes assumed). Races with the caller's updates only blur it."""
        m = self.measured
        if m:
            left = len(self.buf)
            if left < m:
                self.qbytes = self.qbytes * left // m
                self.measured = left

    # worker callbacks --------------------------------------------------------------------------------------------
    def on_ack(self, msg: tuple, ch: Channel | None = None) -> None:
        if not msg:
            return
        if msg[0] == PROGRESS:
            if ch is not None:
                _, ch.safe, ch.wlost, _seq, ch.epochs = msg
            return
        if msg[0] != ACK:
            return
        _, fid, ok, stats = msg
        self.stats_of_worker = stats or {}
        w = self.waiters.get(fid)
        if w is not None:
            w[1] = bool(ok)
            w[0].set()

    def on_worker_gone(self, why: str, ch: Channel | None = None) -> None:
        """The worker's pipe closed (or a send failed). While running, the drainer restarts it
        (:func:`.drainer.restart`, which counts what died with it); pending flushes answer False."""
        if ch is not None:
            if ch is not self.channel or ch.dead:
                return
            ch.dead = True
            ch.why = why
        if (self.stop or ch is None) and self.gone is None:
            self.gone = why
        self.wake.set()
        for w in list(self.waiters.values()):
            w[0].set()

    def lose(self, n: int, why: str = "") -> None:
        """Count ``n`` records lost on their way (in ``dropped`` and ``lost``: every later flush answers False);
        ``why`` (when given) is said on stderr."""
        self.dropped += n
        self.lost += n
        if why:
            print(f"cptrace_otel: {why}", file=sys.stderr, flush=True)

    def total_dropped(self) -> int:
        ch = self.channel
        return self.up_dropped() + (ch.wlost if ch is not None else 0)

    def up_dropped(self) -> int:
        """Records lost on this side (the buffer's or the ring's drops, workers that died; once no worker runs, the
        ring's records none took), for the worker's stamp."""
        r = self.ring
        return self.dropped + self.prev_wlost + (r.dropped() + (r.pending() if self.gone else 0) if r else 0)

    def replace_drainer(self, stuck_items: list, why: str) -> None:
        """Start the next drainer generation (the old one stops if it ever returns; the watchdog calls this);
        ``why`` (non-empty): the stuck record given up, counted and reported, and ``stuck_items`` (what the stuck
        drainer had rendered) shipped first."""
        self.gen += 1
        self.rendering = False
        taken = list(stuck_items)
        if why:
            self.stuck += 1
            self.lose(1, f"{why}; delivery goes on in a new drainer thread")
            if self.ring is not None:   # the worker skips the given-up record's placeholder (ring order kept)
                self.shipped += len(taken)
                _drainer.ship_items(self, [*taken, None])
                taken = []
        self.drainer = _drainer.thread(self, self.gen, taken)
        self.drainer.start()

    # caller's thread: flush, close, stats ----------------------------------------------------------------------
    def flush(self, timeout_s: float) -> bool:
        """True once everything submitted before the call is exported or written; False on timeout or once any
        record was lost."""
        if self.gone is not None and not self.drainer.is_alive():
            return False
        fid = next(_fids)
        w: list[Any] = [lifecycle.Flag(), False]   # [set when answered, the answer]
        self.waiters[fid] = w
        self.flush_reqs.append((fid, time.monotonic(), timeout_s))
        self.wake.set()
        got = w[0].wait(max(0.0, timeout_s))
        self.waiters.pop(fid, None)
        self.loss_report.update(dropped := self.total_dropped())
        return bool(got and w[1] and self.gone is None and self.lost == 0 and self.prev_wlost == 0 and not dropped)

    def shutdown(self, timeout_s: float) -> bool:
        """Stop producing into the ring, :meth:`close`, release the ring (its memfd: the worker has its own mapping,
        and no worker starts after the close)."""
        _ring.detach(self.ring)   # (records put meanwhile are in the ring: the worker reads them to the end)
        ok = self.close(timeout_s)
        _ring.close(self.ring)
        return ok

    def close(self, timeout_s: float) -> bool:
        """Flush and close within ``timeout_s``: stop the drainer, count what is still queued if it cannot finish,
        close the worker. Safe to run again on a pipeline whose close was interrupted (by the application's SIGTERM
        handler raising SystemExit)."""
        t0 = time.monotonic()
        ok = False
        try:
            ok = self.flush(timeout_s) if not self.stop else True
            self.stop = True
            self.wake.set()
            self.drainer.join(timeout=max(0.0, timeout_s - (time.monotonic() - t0)))
            if self.drainer.is_alive():
                ok = self._abandon_queue(timeout_s) and ok
                ok = self._take_over_stuck() and ok
            if self.channel is not None:
                closed = self.channel.close(max(0.0, timeout_s - (time.monotonic() - t0)))
                settled = self._count_unsettled()   # (always run: a flush that failed does not excuse the count)
                ok = ok and closed and settled
        except Exception:
            ok = False
        return ok

    def _count_unsettled(self) -> bool:
        """After the worker ended: records it was given and never reported delivered, spooled or lost (a worker
        whose own start failed, one that died at the end) are lost; count them and say so. False when there were
        any. A worker still delivering in the background (a backend that hangs at exit) is not judged."""
        ch = self.channel
        try:
            if ch is None or not ch.finished(1.0):
                return True
            left = ch.in_flight()
        except Exception:
            return True
        if left:
            self.lose(left, f"the exporter ended without settling {left} records it was given; they are lost "
                      "(counted in cptrace.dropped)")
        return left == 0

    def _take_over_stuck(self) -> bool:
        """Closing with the drainer stuck rendering one value (the watchdog's budget not yet spent): ship what it
        had rendered, count the stuck record, and send the final drop count. False when a record was lost."""
        lost = self.rendering
        items: list = []
        if lost:
            self.gen += 1  # the stuck drainer stops if it ever returns
            self.rendering = False
            items = list(self.cur_items)
            self.stuck += 1
            self.lose(1, f"at shutdown the drainer was still rendering a value; that record is dropped (counted), "
                      f"the {len(items)} records it had rendered are delivered")
        if self.channel is not None and self.gone is None:
            self.shipped += len(items)
            _drainer.ship_items(self, items)
        elif items:
            self.lose(len(items))
        return not lost

    def _abandon_queue(self, timeout_s: float) -> bool:
        """The close ran out of time with records still queued: they are lost; count them and say so."""
        n = 0
        popleft = self.buf.popleft
        while True:  # popleft, not len+clear: a record the drainer takes meanwhile is not counted twice
            try:
                popleft()
            except IndexError:
                break
            n += 1
        if n:
            self.lose(n, f"shutdown timed out after {timeout_s:g}s with {n} records still queued; they are dropped "
                      "(counted)")
        return n == 0

    def signal_flush(self, budget_s: float, dies: bool) -> bool:
        """A SIGTERM's flush (on the main thread, maybe inside :meth:`flush` or :meth:`close`): deliver everything
        submitted within ``budget_s``; takes no lock an interrupted frame may hold (see lifecycle). ``dies``: the
        process ends right after, so the worker does not wait for a backend that is down."""
        if dies:
            self.exiting = True
        if not self.stop and self.drainer.is_alive():
            return self.flush(budget_s)
        # being closed: the drainer ships what is left and stops; the worker delivers at end of input
        t0 = time.monotonic()
        self.drainer.join(budget_s)
        ch = self.channel
        return ch is None or ch.close(max(0.0, budget_s - (time.monotonic() - t0)))

    def forget_in_child(self) -> None:
        """In a forked child: drop this process's ends of the parent's worker and ring (the threads do not exist
        here; the parent's worker must still see EOF when the parent exits)."""
        if self.channel is not None:
            self.channel.close_in_child()
        if self.ring is not None:
            self.ring.close_in_child()

    def stats(self) -> PipelineStats:
        """The counters (see :class:`PipelineStats`)."""
        ch = self.channel
        out: PipelineStats = {
            "dropped": self.total_dropped(),
            "shipped": self.shipped + (self.ring.counters()[4] if self.ring else 0),
            "lost": self.lost,
            "queued": len(self.buf) + (self.ring.pending() if self.ring is not None else 0),
            "exporter": self.cfg.exporter, "worker_gone": self.gone, "restarts": self.restarts,
            "stuck_renders": self.stuck, "in_flight": ch.in_flight() if ch is not None else 0,
            "queued_bytes_est": self.qbytes, "dropped_queue_bytes": self.dropped_bytes,
            "worker": dict(self.stats_of_worker)}
        if self.ring is not None:
            out["ring"] = self.ring.stats()
        return out


# -- one pipeline per process (called by api.py) ---------------------------------------------------------------------
def start(config: Config, on_stop: Callable[[], None] | None = None) -> Callable[[int, str, dict], None]:
    """Start the pipeline for ``config`` (idempotent) and return its submit function, for the caller to install.

    ``on_stop`` is called by :func:`shutdown` (also the exit hook's) right after the pipeline is detached, outside
    this module's lock: the caller uninstalls the submit function there, so a later record starts a new pipeline
    instead of reaching the stopped one. (A caller that installs under its own lock and uninstalls under the same
    lock never keeps a stopped pipeline's function installed.)"""
    global _state, _on_stop
    with _lock:
        if _state is None or _state.pid != os.getpid():
            _import_drainer_needs()
            p = Pipeline(config)
            p.start()
            _state = p
            lifecycle.install_exit_hook()   # api did at import (before the app's handlers); idempotent
            lifecycle.install_sigterm()
        _on_stop = on_stop
        return _state.make_submit()


def current() -> Pipeline | None:
    """This process's running pipeline (None before the first record, after :func:`shutdown`, in a forked child
    before its first record)."""
    p = _state
    return p if p is not None and p.pid == os.getpid() else None


def flush(timeout_s: float = 30.0) -> bool:
    """True once everything emitted before the call is exported or written; False on timeout or loss."""
    p = _state
    if p is None:
        return True
    try:
        return p.flush(timeout_s)
    except Exception:
        return False


def shutdown(timeout_s: float = 30.0) -> bool:
    """Flush, stop the drainer, close the worker (it delivers and exits). A later record starts a new pipeline."""
    global _state, _on_stop, _closing, _last_stats
    with _lock:
        p = _state
        if p is None:
            return True
        _closing = p  # first: a SIGTERM between these lines still finds it (_pipeline_for_signal, _at_exit)
        _state = None
        on_stop, _on_stop = _on_stop, None
    if on_stop is not None:
        on_stop()
    ok = p.shutdown(timeout_s)
    _last_stats = p.stats()
    # (not reached when the application's SIGTERM handler raised SystemExit meanwhile: the exit flush finishes it)
    _closing = None
    return ok


def _pipeline_for_signal() -> Pipeline | None:
    """The pipeline a SIGTERM must flush: the running one, or the one shutdown() is closing."""
    p = _state if _state is not None else _closing
    return p if p is not None and p.pid == os.getpid() else None


def _signal_flush(budget_s: float, dies: bool) -> bool:
    """SIGTERM (lifecycle, on the main thread, maybe inside flush() or shutdown()): :meth:`Pipeline.signal_flush`
    of the pipeline running or being closed."""
    p = _pipeline_for_signal()
    return True if p is None else p.signal_flush(budget_s, dies)


def stats() -> PipelineStats | losses.StartStats:
    """Counters of the running (or last) pipeline (:class:`PipelineStats`): ``dropped``, ``shipped``, ``queued``,
    ``exporter`` state and the worker's own figures from the last flush (events, spans, sent/spooled requests,
    ``backend_down``...); before any pipeline started, the records dropped meanwhile, if any."""
    p = _state
    if p is None:
        if _last_stats is not None:
            return _last_stats.copy()
        return losses.START.stats()   # (no pipeline ever started: its drops all the same)
    return p.stats()


def _at_exit(budget_s: float = EXIT_FLUSH_S) -> None:
    """Exit (atexit, end of a multiprocessing child): shut down within ``budget_s``; the worker does not wait for a
    backend that is down (its requests stay in the spool for the next run). A SIGTERM meanwhile waits for it."""
    global _closing, _last_stats
    p = _state if _state is not None else _closing
    if p is None or p.pid != os.getpid():
        return
    p.exiting = True
    lifecycle.exit_flush_running(True)
    try:
        b = min(budget_s, float(getattr(p.cfg, "timeout_s", budget_s)) + 1.0)
        if p is _state:
            shutdown(b)
        else:  # a shutdown() cut short (the application's SIGTERM handler raised SystemExit in it)
            p.close(b)
            _last_stats = p.stats()
            _closing = None
    finally:
        lifecycle.exit_flush_running(False)
    lifecycle.run_deferred()


def _after_fork_in_child() -> None:
    """Forget the parent's pipeline in a forked child (its threads do not exist here); start afresh lazily."""
    global _state, _lock, _on_stop, _closing
    p = _state
    _state = None
    _closing = None
    _on_stop = None
    _lock = threading.Lock()
    if p is not None:
        p.forget_in_child()


lifecycle.set_handlers(_at_exit, _signal_flush)
lifecycle.on_fork_child(_after_fork_in_child)


if TYPE_CHECKING:
    def _conforms(p: Pipeline) -> tuple[_drainer.Host, _watchdog.Watched, ChannelOwner]:
        """(For mypy: a Pipeline is what its drainer, its watchdog and its channels take it for.)"""
        return p, p, p
