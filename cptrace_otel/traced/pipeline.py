"""The traced process's side of the pipeline: bounded buffer, drainer thread, exporter worker.

Contract (docs/ARCHITECTURE.md):

* :func:`start` returns the submit function that api installs (``api._STATE.submit``): a bounded ``deque`` append of
  ``(time_ns, level, tag, fields)`` on the caller's thread. When the buffer holds ``config.queue_size`` records, or an
  estimated ``config.queue_bytes`` bytes, the new record is dropped and counted. It never blocks and never raises (a
  signal handler's exit aside: api). The byte bound costs nothing while fewer than :data:`UNMEASURED` records wait
  (the normal case: the drainer keeps up); beyond that one record in 32 has its size estimated (:func:`_estimate`: the
  lengths of its string and list values plus a per-field constant), standing for the 32, so a stalled exporter holds
  about ``queue_bytes`` plus :data:`UNMEASURED` records (an estimate: sizes that vary wildly blur it).
* A daemon drainer thread pops batches in order (after shipping a partial batch it lingers :data:`LINGER_S` for more,
  so that records arriving a few per millisecond are not shipped one message each; a flush does not wait), resolves
  deferred fingerprints (``fingerprint.is_deferred/resolve``, waiting on their CUDA event), renders every value that
  is not already an int, str or float (bools as ``True``/``False``; anything else with upstream ``_fmt`` semantics; a
  value whose ``str`` raises becomes ``(err:<ExceptionType>)``; :func:`cptrace_otel.model.records.compact_item`) and
  ships batches of these compact items to the exporter worker, in order (messages and frames:
  :mod:`cptrace_otel.export.protocol`). The worker completes each with the same rendering
  (:mod:`cptrace_otel.model.records`), so the result is the same, but the traced process does the least work.
  With the record ring (default with the exporter process; off: ``CPTRACE_RING=0``) the submit function is its own
  (:mod:`.ring`) and the buffer carries only records of other shapes (SIDE: put at placeholders).
* Wake-ups: none while no record needs the threads. With the ring the drainer sleeps until a side record lands (C
  side path), a flush, a stop or a dead worker (backstop :data:`RING_IDLE_WAIT_S`; it polls while the rank is looked
  for); the deque path polls (:data:`IDLE_WAIT_S` doubling to :data:`IDLE_WAIT_MAX_S`); the ack reader blocks.
* The worker is a subprocess per traced process (``python -m cptrace_otel.export.worker``; not ``multiprocessing``,
  since SGLang rank processes may be daemonic), fed over its stdin and acking over its stdout; it exits after
  delivering once its stdin closes, so it never outlives the traced process for long. ``CPTRACE_EXPORTER=thread``
  runs the same worker loop in a thread instead (and a worker that cannot be spawned falls back to it).
* :func:`flush` returns True only when everything emitted before it is exported or written (open spans closed);
  False on timeout, while the backend is unreachable (records wait in the spool), or once any record was lost (a
  worker died holding it, the backend rejected it, it could not be traced, it was abandoned at shutdown, the ring or
  buffer was full: :mod:`.losses`, which names them on stderr, rate-limited). :func:`stats` has the counters:
  ``dropped`` counts every lost record, whoever lost it, and is exported as ``cptrace.dropped`` on the rank span.
* Worker death (kill -9, OOM): the worker reports, about every 0.2 s (``PROGRESS``), how many of the records it was
  sent reached a final state; the records shipped beyond that died with it and are counted as dropped (and named on
  stderr). It is restarted (at most :data:`MAX_RESTARTS` times, with backoff), told the seq to go on from and the
  dead worker's last epoch state (so trace ids stay the same); the online checks start over, which its rank span
  says (``cptrace.exporter.restarts``, ``cptrace.checks.restarted``).
* Rendering runs on the drainer thread: a value whose ``str`` raises costs only that value (records.py); one that
  blocks for :data:`RENDER_BUDGET_S` is given up by a watchdog thread: that record is dropped and counted, the
  records the stuck drainer had already rendered are shipped, and a new drainer carries on (reported on stderr).
  A drainer that dies anyway is reported and replaced the same way. The watchdog (:mod:`.watchdog`) samples only
  while the drainer renders; otherwise it sleeps until the drainer starts rendering or ends.
* Exit, signals, fork (:mod:`cptrace_otel.traced.lifecycle`): the exit shutdown, the SIGTERM flush (signal-safe:
  ``lifecycle.Flag``) and the fork-child reset are registered there when this module is imported; closing with the
  drainer stuck on a value ships what it had rendered and counts the stuck record (``lifecycle.close_state``).
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..export.protocol import ACK, FLUSH, INIT, ITEMS, PREINIT, PROGRESS, SIDE
from ..model.records import RESOLVE_TIMEOUT_S, compact_item
from . import lifecycle, losses, ring as _ring, watchdog as _watchdog
from .channels import ProcessChannel, ThreadChannel
from .rendering import estimate as _estimate, import_drainer_needs as _import_drainer_needs, load_deferred

BATCH = 4096              # records per message to the worker
IDLE_WAIT_S = 0.05        # drainer poll interval when the buffer is empty (the deque path: records do not wake it),
IDLE_WAIT_MAX_S = 0.4     # doubling up to this while nothing comes (the first record after a quiet spell may wait it)
RING_IDLE_WAIT_S = 2.0    # with the ring: side records, flushes, stops and a dead worker wake it; this is a backstop
LINGER_S = 0.02           # after shipping less than a full batch the drainer waits this long for more (_drain_body)
EXIT_FLUSH_S = 5.0        # exit flush budget
MAX_RESTARTS = 5          # exporter workers started after the first one died
RESTART_BACKOFF_S = 0.5   # before the first restart; doubles each time (the buffer holds the records meanwhile)
RENDER_BUDGET_S = RESOLVE_TIMEOUT_S + 5.0  # one record's rendering may take this long (a GPU fingerprint waits 30 s)
UNMEASURED = 1024         # records buffered before the byte bound starts estimating sizes
SAMPLE_MASK = 31          # past that, one record in SAMPLE_MASK + 1 is measured (its estimate counts for all)

_lock = threading.Lock()
_state: _State | None = None
_fids = itertools.count(1)
_on_stop: Callable[[], None] | None = None   # start()'s caller's uninstall hook
_closing: _State | None = None   # the pipeline shutdown() is closing (a SIGTERM or the exit flush finishes it)
_last_stats: dict[str, Any] = {}


# -- state ----------------------------------------------------------------------------------------------------------
class _State:
    def __init__(self, cfg: Any) -> None:
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
        self.channel: Any = None
        self.gone: str | None = None
        self.lost = 0               # records lost on their way (subset of dropped): flush() is False once it is > 0
        self.prev_wlost = 0         # records that dead workers reported lost (counted in dropped by them)
        self.restarts = 0
        self.stuck = 0              # records given up because rendering them blocked
        self.stats: dict[str, Any] = {}
        self.pid = os.getpid()
        self.exiting = False        # at exit: the worker does not wait for a backend that is down
        self.gen = 0                # the running drainer's generation: an older drainer that wakes up stops
        self.hold: Any = None       # cptrace_otel.traced.ranks.RankHold while the rank is not yet known (see _drain)
        self._cur_items: list = []  # the batch the drainer is rendering (the watchdog takes it over if stuck)
        self._rendering = False
        self.watch = lifecycle.Flag()   # wakes the idle watchdog: the drainer started rendering, or it ended
        self._watch_idle = False        # the watchdog sleeps on self.watch
        self.ring = _ring.create(cfg)   # the record ring (CPTRACE_RING), else None: the deque path
        self.loss_report = losses.LossReport("dropped (a full ring or buffer, a sink or worker lost them)")
        self.drainer = threading.Thread(target=self._drain, name="cptrace-drainer", daemon=True)
        self.watchdog = threading.Thread(target=_watchdog.watch, args=(self, lambda: RENDER_BUDGET_S),
                                         name="cptrace-watchdog", daemon=True)

    # caller side ---------------------------------------------------------------------------------------------------
    def make_submit(self) -> Any:
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

        def _submit(level: int, tag: str, fields: dict, _len: Any = len) -> None:
            try:
                n = _len(buf)
                if n < soft or (n & SAMPLE_MASK and not full and n < cap):
                    append((now(), level, tag, fields))
                else:
                    _sampled(level, tag, fields, n)
            except Exception:  # never BaseException: a SystemExit here is the app's SIGTERM handler's (lifecycle)
                pass               # run between two bytecodes; swallowed, its process ran on for ever

        return _submit

    def _popped(self) -> None:
        """The drainer took records from the front: scale the byte estimate to the measured records that can still
        be buffered (they are the newest; uniform sizes assumed). Races with the caller's updates only blur it."""
        m = self.measured
        if m:
            left = len(self.buf)
            if left < m:
                self.qbytes = self.qbytes * left // m
                self.measured = left

    # worker callbacks --------------------------------------------------------------------------------------------
    def on_ack(self, msg: tuple, ch: Any = None) -> None:
        if not msg:
            return
        if msg[0] == PROGRESS:
            if ch is not None:
                _, ch.safe, ch.wlost, _seq, ch.epochs = msg
            return
        if msg[0] != ACK:
            return
        _, fid, ok, stats = msg
        self.stats = stats or {}
        w = self.waiters.get(fid)
        if w is not None:
            w[1] = bool(ok)
            w[0].set()

    def on_worker_gone(self, why: str, ch: Any = None) -> None:
        """The worker's pipe closed (or a send failed). While running, the drainer restarts it (:meth:`_restart`,
        which counts what died with it); pending flushes answer False."""
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

    def total_dropped(self) -> int:
        ch = self.channel
        return self.up_dropped() + (ch.wlost if ch is not None else 0)

    def up_dropped(self) -> int:
        """Records lost on this side (the buffer's or the ring's drops, workers that died; once no worker runs, the
        ring's records none took), for the worker's stamp."""
        r = self.ring
        return self.dropped + self.prev_wlost + (r.dropped() + (r.pending() if self.gone else 0) if r else 0)

    # drainer -------------------------------------------------------------------------------------------------------
    def _info(self, resume: dict | None) -> dict:
        """The INIT (or, while the rank is unknown, PREINIT) message's dict for the configuration in force."""
        return {
            "config": self.cfg,
            "resource": self.cfg.resource(),
            "instance": f"{self.cfg.resource().get('service.instance.id', '')}",
            "file": self.cfg.expand(self.cfg.file) if self.cfg.file else None,
            "log_file": self.cfg.expand(self.cfg.log_file) if self.cfg.log_file else None,
            "spool_dir": self.cfg.spool_dir,
            "resume": resume,
            "ring": self.ring.info() if self.ring is not None else None,
        }

    def _start_channel(self, resume: dict | None = None) -> None:
        seq0 = resume["seq"] if resume else 0
        # While the rank is unknown the worker holds the records (PREINIT), so a process that ends meanwhile loses
        # nothing: the worker then exports them as rank-unknown; INIT, sent once the rank is found, labels them.
        init = (INIT if self.hold is None else PREINIT, self._info(resume))
        if self.cfg.exporter == "process":
            try:
                ch: Any = ProcessChannel(self, seq0, self.ring)
                self.channel = ch
                ch.send(init)
                return
            except Exception as e:
                print(f"cptrace_otel: cannot start the exporter process ({e!r}); exporting from a thread instead",
                      file=sys.stderr, flush=True)
        self.channel = ThreadChannel(self, seq0, self.ring)
        self.channel.send(init)

    def _restart(self) -> bool:
        """The worker died: count the records that died with it, start another (bounded, with backoff). False when
        no worker runs any more (records are then dropped and counted)."""
        old = self.channel
        old.reap()   # gone for good before it is counted and replaced: never two readers of the ring (channels.py)
        lost = old.in_flight()
        # The next worker numbers on from every seq the dead one may have given (to records it may have delivered
        # before it died but had not reported safe): a seq is never given to two records.
        next_seq = old.seq0 + old.given()
        self.dropped += lost
        self.lost += lost
        self.prev_wlost += old.wlost
        old.shipped, old.wlost, old.ring = old.safe, 0, None  # counted once
        if self.stop or self.restarts >= MAX_RESTARTS:
            self.gone = old.why
            print(f"cptrace_otel: {old.why}; {lost} records it held were lost; not restarting it (restarted "
                  f"{self.restarts} times); further records are dropped and counted", file=sys.stderr, flush=True)
            return False
        self.restarts += 1
        print(f"cptrace_otel: {old.why}; {lost} records it held were lost (counted in cptrace.dropped); restarting "
              f"the exporter ({self.restarts} of at most {MAX_RESTARTS}); its online checks start over",
              file=sys.stderr, flush=True)
        time.sleep(RESTART_BACKOFF_S * (1 << (self.restarts - 1)))
        try:
            self._start_channel({"seq": next_seq, "epochs": old.epochs, "restarts": self.restarts,
                                 "side_next": self.ring.side_shipped if self.ring is not None else 0})
        except Exception as e:
            self.gone = f"exporter failed to restart: {e!r}"
            print(f"cptrace_otel: {self.gone}; further records are dropped and counted", file=sys.stderr, flush=True)
            return False
        return True

    def _ship(self, msg: tuple, n_records: int = 0) -> None:
        """Send one message to the worker (restarting a dead one first); records that cannot go are counted."""
        while self.gone is None:
            ch = self.channel
            if ch.dead:
                if not self._restart():
                    break
                continue
            ch.shipped += n_records  # in flight until the worker reports them safe
            try:
                ch.send(msg)
            except Exception as e:
                self.on_worker_gone(f"exporter unreachable ({type(e).__name__}: {e})", ch)
            return
        if n_records:
            self.dropped += n_records
            self.lost += n_records

    def ship_items(self, items: list) -> None:
        """Ship a batch of compact items, with the drop count so far (the worker stamps it on the rank span). With the
        ring they are its side records (SIDE: the worker puts each at its placeholder)."""
        if self.ring is not None:
            self.ring.side_shipped += len(items)
        self._ship((ITEMS if self.ring is None else SIDE, items, self.up_dropped()), len(items))

    def _open(self) -> None:
        try:
            self._start_channel()
        except Exception as e:
            self.gone = f"exporter failed to start: {e!r}"
            print(f"cptrace_otel: {self.gone}; records are dropped and counted", file=sys.stderr, flush=True)

    def _drain(self) -> None:
        from .ranks import RankHold

        # While the rank is unknown the first records wait in the exporter worker (PREINIT; not here, where an
        # os._exit would lose them, nor on the caller) so that a rank learned from the config record, SGLang or
        # torch.distributed still labels them (cptrace_otel.traced.ranks.RankHold says when to stop looking). The
        # hold lives on the state, so a drainer started by the watchdog carries on with it.
        try:
            hold = RankHold(self.cfg, self.cfg.rank_wait_s, self.cap)
            if not hold.known:
                self.hold = hold
            self._open()
            self._drain_loop(0, [])
        finally:
            self.watch.set()   # the watchdog sees at once a drainer that ended (replaced unless stopping)

    def _drain_loop(self, gen: int, pending: list) -> None:
        """The drainer of generation ``gen`` (a newer one makes it stop); ``pending``: rendered items to ship first
        (those a stuck drainer had rendered)."""
        try:
            if pending:
                self.shipped += len(pending)
                if self.hold is not None:
                    self.hold.add(pending)
                self.ship_items(pending)
            self._drain_body(gen)
        except BaseException as e:  # noqa: BLE001 - reported; the watchdog starts a new drainer
            if self.gen == gen:
                print(f"cptrace_otel: the drainer thread failed ({e!r}); starting a new one", file=sys.stderr,
                      flush=True)
        finally:
            self.watch.set()

    def _drain_body(self, gen: int) -> None:
        is_deferred, resolve = load_deferred()
        buf = self.buf
        popleft = buf.popleft
        idle_s = IDLE_WAIT_S
        while True:
            self.wake.clear()
            ch = self.channel
            if ch is not None and ch.dead and self.gone is None and not self.stop:
                self._restart()
            reqs = []
            while self.flush_reqs:
                reqs.append(self.flush_reqs.popleft())
            busy = bool(reqs)
            while buf:
                busy = True
                n = min(len(buf), BATCH)
                items: list = []
                self._cur_items = items
                self._rendering = True
                if self._watch_idle:   # (the watchdog checks _rendering after setting _watch_idle: no lost wake)
                    self.watch.set()
                for _ in range(n):
                    try:
                        item = popleft()
                    except IndexError:  # a shutdown that timed out took the rest
                        break
                    try:
                        items.append(compact_item(item, is_deferred, resolve))
                    except BaseException:  # noqa: BLE001 - unrenderable beyond repair (e.g. fields not a dict)
                        self.dropped += 1
                        self.lost += 1
                    if self.gen != gen:
                        return  # given up as stuck: the watchdog shipped what was rendered, and counted this one
                self._rendering = False
                self._popped()
                self.shipped += len(items)
                if self.hold is not None:
                    self.hold.add(items)
                self.ship_items(items)
            hold = self.hold
            if hold is not None and hold.due(bool(reqs) or self.stop):
                self.cfg = hold.resolve()
                self.hold = None
                self._ship((INIT, self._info(None)))  # the worker starts exporting what it held, with the rank
            for fid, t_req, timeout_s in reqs:
                left = timeout_s - (time.monotonic() - t_req) - 0.05
                self._ship((FLUSH, fid, self.up_dropped(), max(0.0, left), self.exiting))
                if self.gone is not None:
                    w = self.waiters.get(fid)
                    if w is not None:
                        w[0].set()
            if self.stop and not buf and not self.flush_reqs:
                return
            if self.gen != gen:
                return
            self.loss_report.update(self.total_dropped())
            if not busy:
                # The deque path polls (its records are appended without a wake-up), less often the longer
                # nothing comes; with the ring every reason to run wakes the drainer (a side record lands in the
                # empty deque: ring.c, a flush, a stop, a dead worker), except the rank search while the rank is
                # unknown, which polls.
                if self.hold is not None:
                    wait_s = IDLE_WAIT_S
                elif self.ring is not None:
                    wait_s = RING_IDLE_WAIT_S
                else:
                    wait_s, idle_s = idle_s, min(idle_s * 2, IDLE_WAIT_MAX_S)
                self.wake.wait(wait_s, consume=True)
                continue
            idle_s = IDLE_WAIT_S
            if not reqs and len(buf) < BATCH:
                # Records trickle in (a few per ms): without a pause each round would ship one or two of them, and
                # every message costs a pickle, a write and the worker's wake-up, per record. A flush or a stop
                # wakes the drainer at once; a full batch is shipped without waiting.
                self._linger()

    def _linger(self) -> None:
        """Wait up to LINGER_S for more records; return early for a flush, a stop, a dead worker or a full batch
        (a side record's wake-up alone does not end it)."""
        end = time.monotonic() + LINGER_S
        while True:
            left = end - time.monotonic()
            if left <= 0 or not self.wake.wait(left, consume=True):
                return
            ch = self.channel
            if self.flush_reqs or self.stop or (ch is not None and ch.dead) or len(self.buf) >= BATCH:
                return

    def flush(self, timeout_s: float) -> bool:
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


# -- public (called by api.py) ---------------------------------------------------------------------------------------
def start(config: Any, on_stop: Callable[[], None] | None = None) -> Callable[[int, str, dict], None]:
    """Start the pipeline for ``config`` (idempotent) and return its submit function, for the caller to install.

    ``on_stop`` is called by :func:`shutdown` (also the exit hook's) right after the pipeline is detached, outside
    this module's lock: the caller uninstalls the submit function there, so a later record starts a new pipeline
    instead of reaching the stopped one. (A caller that installs under its own lock and uninstalls under the same
    lock never keeps a stopped pipeline's function installed.)"""
    global _state, _on_stop
    with _lock:
        if _state is None or _state.pid != os.getpid():
            _import_drainer_needs()
            st = _State(config)
            st.drainer.start()
            st.watchdog.start()
            _state = st
            lifecycle.install_exit_hook()   # api did at import (before the app's handlers); idempotent
            lifecycle.install_sigterm()
        _on_stop = on_stop
        return _state.make_submit()


def flush(timeout_s: float = 30.0) -> bool:
    """True once everything emitted before the call is exported or written; False on timeout or loss."""
    st = _state
    if st is None:
        return True
    try:
        return st.flush(timeout_s)
    except Exception:
        return False


def shutdown(timeout_s: float = 30.0) -> bool:
    """Flush, stop the drainer, close the worker (it delivers and exits). A later record starts a new pipeline."""
    global _state, _on_stop, _closing
    with _lock:
        st = _state
        if st is None:
            return True
        _closing = st  # first: a SIGTERM between these lines still finds it (_pipeline_for_signal, _at_exit)
        _state = None
        on_stop, _on_stop = _on_stop, None
    if on_stop is not None:
        on_stop()
    _ring.detach(st.ring)   # (records put meanwhile are in the ring: the worker reads them to the end)
    ok = lifecycle.close_state(st, timeout_s)
    _ring.close(st.ring)    # its memfd (the worker has its own mapping; no worker starts after the close)
    _remember(st)
    # (not reached when the application's SIGTERM handler raised SystemExit meanwhile: the exit flush finishes it)
    _closing = None
    return ok


def _pipeline_for_signal() -> _State | None:
    """The pipeline a SIGTERM must flush: the running one, or the one shutdown() is closing."""
    st = _state if _state is not None else _closing
    return st if st is not None and st.pid == os.getpid() else None


def _signal_flush(budget_s: float, dies: bool) -> bool:
    """SIGTERM (lifecycle, on the main thread, maybe inside flush() or shutdown()): deliver everything emitted within
    ``budget_s``. Takes no lock an interrupted frame may hold (see lifecycle). ``dies``: the process ends right
    after, so the worker does not wait for a backend that is down."""
    st = _pipeline_for_signal()
    if st is None:
        return True
    if dies:
        st.exiting = True
    if not st.stop and st.drainer.is_alive():
        return st.flush(budget_s)
    # being closed: the drainer ships what is left and stops; the worker delivers at end of input
    t0 = time.monotonic()
    st.drainer.join(budget_s)
    ch = st.channel
    return ch is None or ch.close(max(0.0, budget_s - (time.monotonic() - t0)))


def stats() -> dict[str, Any]:
    """Counters of the running (or last) pipeline: ``dropped``, ``shipped``, ``queued``, ``exporter`` state and the
    worker's own figures from the last flush (events, spans, sent/spooled requests, ``backend_down``...)."""
    st = _state
    if st is None:
        return dict(_last_stats) or losses.START.stats()   # (no pipeline ever started: its drops all the same)
    return _stats_of(st)


def _stats_of(st: _State) -> dict[str, Any]:
    ch = st.channel
    out = {"dropped": st.total_dropped(), "shipped": st.shipped + (st.ring.counters()[4] if st.ring else 0),
           "lost": st.lost,
           "queued": len(st.buf) + (st.ring.pending() if st.ring is not None else 0),
           "exporter": st.cfg.exporter, "worker_gone": st.gone, "restarts": st.restarts, "stuck_renders": st.stuck,
           "in_flight": ch.in_flight() if ch is not None else 0,
           "queued_bytes_est": st.qbytes, "dropped_queue_bytes": st.dropped_bytes}
    out.update({"worker": dict(st.stats)})
    if st.ring is not None:
        out["ring"] = st.ring.stats()
    return out


def _remember(st: _State) -> None:
    global _last_stats
    _last_stats = _stats_of(st)


def _at_exit(budget_s: float = EXIT_FLUSH_S) -> None:
    """Exit (atexit, end of a multiprocessing child): shut down within ``budget_s``; the worker does not wait for a
    backend that is down (its requests stay in the spool for the next run). A SIGTERM meanwhile waits for it."""
    global _closing
    st = _state if _state is not None else _closing
    if st is None or st.pid != os.getpid():
        return
    st.exiting = True
    lifecycle.exit_flush_running(True)
    try:
        b = min(budget_s, float(getattr(st.cfg, "timeout_s", budget_s)) + 1.0)
        if st is _state:
            shutdown(b)
        else:  # a shutdown() cut short (the application's SIGTERM handler raised SystemExit in it)
            lifecycle.close_state(st, b)
            _remember(st)
            _closing = None
    finally:
        lifecycle.exit_flush_running(False)
    lifecycle.run_deferred()


def _after_fork_in_child() -> None:
    """Forget the parent's pipeline in a forked child (its threads do not exist here); start afresh lazily."""
    global _state, _lock, _on_stop, _closing
    st = _state
    _state = None
    _closing = None
    _on_stop = None
    _lock = threading.Lock()
    if st is not None and st.channel is not None:
        st.channel.close_in_child()
    if st is not None and st.ring is not None:
        st.ring.close_in_child()


lifecycle.set_handlers(_at_exit, _signal_flush)
lifecycle.on_fork_child(_after_fork_in_child)
