"""The drainer thread of the traced process's pipeline (:class:`cptrace_otel.traced.pipeline.Pipeline`): it takes the
records the callers put in the pipeline's buffer, renders them, and ships them to the exporter worker over the
pipeline's channel, which it starts and, when the worker dies, restarts.

Contract (the pipeline's module docstring has the whole of it):

* :func:`run` is the drainer thread's body (the pipeline starts it); :func:`loop` is the body of a drainer that the
  watchdog started in place of a stuck or dead one (generation ``gen``: a drainer whose generation is no longer the
  pipeline's stops). What it reads and writes of the pipeline is :class:`Host`.
* While the rank is unknown the first records wait in the exporter worker (PREINIT), and INIT follows once the
  rank is found (:class:`cptrace_otel.traced.ranks.RankHold`).
* :func:`ship_items` and :func:`ship` are the one way records go to the worker (also from the watchdog's
  replacement and from the pipeline's close); records that cannot go are counted as lost.
* :func:`restart` counts what a dead worker held (its books: :class:`~.channels.Books`) and starts the next one,
  at most :data:`MAX_RESTARTS` times, with backoff; it numbers on past every seq the dead one was given.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from ..export.protocol import FLUSH, INIT, ITEMS, PREINIT, SIDE
from ..model.records import compact_item
from .channels import Channel, ProcessChannel, ThreadChannel
from .lifecycle import Flag
from .losses import LossReport
from .rendering import load_deferred
from .ring import Ring

if TYPE_CHECKING:
    from ..model.config import Config
    from .ranks import RankHold

BATCH = 4096              # records per message to the worker
IDLE_WAIT_S = 0.05        # drainer poll interval when the buffer is empty (the deque path: records do not wake it),
IDLE_WAIT_MAX_S = 0.4     # doubling up to this while nothing comes (the first record after a quiet spell may wait it)
RING_IDLE_WAIT_S = 2.0    # with the ring: side records, flushes, stops and a dead worker wake it; this is a backstop
LINGER_S = 0.02           # after shipping less than a full batch the drainer waits this long for more (_body)
MAX_RESTARTS = 5          # exporter workers started after the first one died
RESTART_BACKOFF_S = 0.5   # before the first restart; doubles each time (the buffer holds the records meanwhile)
START_TRIES = 4           # the first start of the worker, tried this many times ...
START_RETRY_S = 0.2       # ... waiting this long after the first failure, doubling


class Host(Protocol):
    """What the drainer reads and writes of its pipeline (and, as the channels' owner, what a channel calls back).
    Written only by the drainer thread: ``cfg`` and ``hold`` (once the rank is found), ``channel`` and ``restarts``
    (the first worker, its replacements), ``cur_items`` and ``rendering`` (the batch being rendered, for the
    watchdog), ``prev_wlost``; shared with the other threads (counted with ``+=`` under the GIL): ``shipped``,
    ``gone``, the losses (:meth:`lose`). ``buf``, ``flush_reqs``: the callers append, the drainer pops."""

    cfg: Config
    hold: RankHold | None
    ring: Ring | None
    channel: Channel | None
    buf: collections.deque
    flush_reqs: collections.deque
    waiters: dict[int, list[Any]]
    wake: Flag
    watch: Flag
    stop: bool
    exiting: bool
    gone: str | None
    gen: int
    cur_items: list
    rendering: bool
    watch_idle: bool
    shipped: int
    prev_wlost: int
    restarts: int
    cap: int
    loss_report: LossReport

    def popped(self) -> None: ...

    def lose(self, n: int, why: str = "") -> None: ...

    def up_dropped(self) -> int: ...

    def total_dropped(self) -> int: ...

    def on_ack(self, msg: tuple, ch: Channel | None = None) -> None: ...

    def on_worker_gone(self, why: str, ch: Channel | None = None) -> None: ...


# -- the worker: start, restart, ship -------------------------------------------------------------------------------
def _info(p: Host, resume: dict | None) -> dict:
    """The INIT (or, while the rank is unknown, PREINIT) message's dict for the configuration in force."""
    return {
        "config": p.cfg,
        "resource": p.cfg.resource(),
        "instance": f"{p.cfg.resource().get('service.instance.id', '')}",
        "file": p.cfg.expand(p.cfg.file) if p.cfg.file else None,
        "log_file": p.cfg.expand(p.cfg.log_file) if p.cfg.log_file else None,
        "spool_dir": p.cfg.spool_dir,
        "resume": resume,
        "ring": p.ring.info() if p.ring is not None else None,
    }


def start_channel(p: Host, resume: dict | None = None) -> None:
    """Start a worker (a subprocess, or a thread where that cannot be spawned or is asked for) and send it INIT, or
    PREINIT while the rank is unknown; ``resume``: the dead worker's seq, epochs and restarts to go on from."""
    seq0 = resume["seq"] if resume else 0
    # While the rank is unknown the worker holds the records (PREINIT), so a process that ends meanwhile loses
    # nothing: the worker then exports them as rank-unknown; INIT, sent once the rank is found, labels them.
    init = (INIT if p.hold is None else PREINIT, _info(p, resume))
    if p.cfg.exporter == "process":
        try:
            ch: Channel = ProcessChannel(p, seq0, p.ring)
            p.channel = ch
            ch.send(init)
            return
        except Exception as e:
            print(f"cptrace_otel: cannot start the exporter process ({e!r}); exporting from a thread instead",
                  file=sys.stderr, flush=True)
    p.channel = ThreadChannel(p, seq0, p.ring)
    p.channel.send(init)


def restart(p: Host) -> bool:
    """The worker died: count the records that died with it, start another (bounded, with backoff). False when
    no worker runs any more (records are then dropped and counted)."""
    old = p.channel
    assert old is not None   # (only a started channel dies)
    old.reap()   # gone for good before it is counted and replaced: never two readers of the ring (channels.py)
    lost = old.in_flight()
    # The next worker numbers on from every seq the dead one may have given (to records it may have delivered
    # before it died but had not reported safe): a seq is never given to two records.
    next_seq = old.seq0 + old.given()
    p.lose(lost)
    p.prev_wlost += old.wlost
    old.shipped, old.wlost, old.ring = old.safe, 0, None  # counted once
    if p.stop or p.restarts >= MAX_RESTARTS:
        p.gone = old.why
        print(f"cptrace_otel: {old.why}; {lost} records it held were lost; not restarting it (restarted "
              f"{p.restarts} times); further records are dropped and counted", file=sys.stderr, flush=True)
        return False
    p.restarts += 1
    print(f"cptrace_otel: {old.why}; {lost} records it held were lost (counted in cptrace.dropped); restarting "
          f"the exporter ({p.restarts} of at most {MAX_RESTARTS}); its online checks start over",
          file=sys.stderr, flush=True)
    time.sleep(RESTART_BACKOFF_S * (1 << (p.restarts - 1)))
    try:
        start_channel(p, {"seq": next_seq, "epochs": old.epochs, "restarts": p.restarts,
                          "side_next": p.ring.side_shipped if p.ring is not None else 0})
    except Exception as e:
        p.gone = f"exporter failed to restart: {e!r}"
        print(f"cptrace_otel: {p.gone}; further records are dropped and counted", file=sys.stderr, flush=True)
        return False
    return True


def ship(p: Host, msg: tuple, n_records: int = 0) -> None:
    """Send one message to the worker (restarting a dead one first); records that cannot go are counted."""
    while p.gone is None:
        ch = p.channel
        assert ch is not None   # (gone is set when no channel could start)
        if ch.dead:
            if not restart(p):
                break
            continue
        ch.shipped += n_records  # in flight until the worker reports them safe
        try:
            ch.send(msg)
        except Exception as e:
            p.on_worker_gone(f"exporter unreachable ({type(e).__name__}: {e})", ch)
        return
    if n_records:
        p.lose(n_records)


def ship_items(p: Host, items: list) -> None:
    """Ship a batch of compact items, with the drop count so far (the worker stamps it on the rank span). With the
    ring they are its side records (SIDE: the worker puts each at its placeholder)."""
    if p.ring is not None:
        p.ring.side_shipped += len(items)
    ship(p, (ITEMS if p.ring is None else SIDE, items, p.up_dropped()), len(items))


def _open(p: Host) -> None:
    """Start the worker; a start that fails is tried again (:data:`START_TRIES`, waiting :data:`START_RETRY_S`,
    doubling: a cause that passes, such as an import that another thread of the traced process raced, must not lose
    the run; the records wait in the buffer or the ring meanwhile, on this thread, never the caller's); then the
    pipeline is gone: its records are dropped and counted."""
    for i in range(START_TRIES):
        try:
            start_channel(p)
            return
        except Exception as e:
            err = e
        if i + 1 == START_TRIES or p.stop:
            break
        print(f"cptrace_otel: exporter failed to start ({err!r}); trying again in {START_RETRY_S * 2 ** i:g}s",
              file=sys.stderr, flush=True)
        time.sleep(START_RETRY_S * 2 ** i)
    p.gone = f"exporter failed to start: {err!r}"
    print(f"cptrace_otel: {p.gone}; records are dropped and counted", file=sys.stderr, flush=True)


# -- the drainer thread ---------------------------------------------------------------------------------------------
def run(p: Host) -> None:
    """The first drainer's body: look for the rank, start the worker, drain until the pipeline stops."""
    from .ranks import RankHold

    # While the rank is unknown the first records wait in the exporter worker (PREINIT; not here, where an
    # os._exit would lose them, nor on the caller) so that a rank learned from the config record, SGLang or
    # torch.distributed still labels them (cptrace_otel.traced.ranks.RankHold says when to stop looking). The
    # hold lives on the pipeline, so a drainer started by the watchdog carries on with it.
    try:
        hold = RankHold(p.cfg, p.cfg.rank_wait_s, p.cap)
        if not hold.known:
            p.hold = hold
        _open(p)
        loop(p, 0, [])
    finally:
        p.watch.set()   # the watchdog sees at once a drainer that ended (replaced unless stopping)


def thread(p: Host, gen: int, pending: list) -> threading.Thread:
    """A (not yet started) thread for the drainer of generation ``gen`` (:func:`loop`)."""
    return threading.Thread(target=loop, args=(p, gen, pending), name="cptrace-drainer", daemon=True)


def loop(p: Host, gen: int, pending: list) -> None:
    """The drainer of generation ``gen`` (a newer one makes it stop); ``pending``: rendered items to ship first
    (those a stuck drainer had rendered)."""
    try:
        if pending:
            p.shipped += len(pending)
            if p.hold is not None:
                p.hold.add(pending)
            ship_items(p, pending)
        _body(p, gen)
    except BaseException as e:  # noqa: BLE001 - reported; the watchdog starts a new drainer
        if p.gen == gen:
            print(f"cptrace_otel: the drainer thread failed ({e!r}); starting a new one", file=sys.stderr,
                  flush=True)
    finally:
        p.watch.set()


def _body(p: Host, gen: int) -> None:
    is_deferred, resolve = load_deferred()
    buf = p.buf
    popleft = buf.popleft
    idle_s = IDLE_WAIT_S
    while True:
        p.wake.clear()
        ch = p.channel
        if ch is not None and ch.dead and p.gone is None and not p.stop:
            restart(p)
        reqs = []
        while p.flush_reqs:
            reqs.append(p.flush_reqs.popleft())
        busy = bool(reqs)
        while buf:
            busy = True
            n = min(len(buf), BATCH)
            items: list = []
            p.cur_items = items
            p.rendering = True
            if p.watch_idle:   # (the watchdog checks rendering after setting watch_idle: no lost wake)
                p.watch.set()
            for _ in range(n):
                try:
                    item = popleft()
                except IndexError:  # a shutdown that timed out took the rest
                    break
                try:
                    items.append(compact_item(item, is_deferred, resolve))
                except BaseException:  # noqa: BLE001 - unrenderable beyond repair (e.g. fields not a dict)
                    p.lose(1)
                if p.gen != gen:
                    return  # given up as stuck: the watchdog shipped what was rendered, and counted this one
            p.rendering = False
            p.popped()
            p.shipped += len(items)
            if p.hold is not None:
                p.hold.add(items)
            ship_items(p, items)
        hold = p.hold
        if hold is not None and hold.due(bool(reqs) or p.stop):
            p.cfg = hold.resolve()
            p.hold = None
            ship(p, (INIT, _info(p, None)))  # the worker starts exporting what it held, with the rank
        for fid, t_req, timeout_s in reqs:
            left = timeout_s - (time.monotonic() - t_req) - 0.05
            ship(p, (FLUSH, fid, p.up_dropped(), max(0.0, left), p.exiting))
            if p.gone is not None:
                w = p.waiters.get(fid)
                if w is not None:
                    w[0].set()
        if p.stop and not buf and not p.flush_reqs:
            return
        if p.gen != gen:
            return
        p.loss_report.update(p.total_dropped())
        if not busy:
            # The deque path polls (its records are appended without a wake-up), less often the longer
            # nothing comes; with the ring every reason to run wakes the drainer (a side record lands in the
            # empty deque: ring.c, a flush, a stop, a dead worker), except the rank search while the rank is
            # unknown, which polls.
            if p.hold is not None:
                wait_s = IDLE_WAIT_S
            elif p.ring is not None:
                wait_s = RING_IDLE_WAIT_S
            else:
                wait_s, idle_s = idle_s, min(idle_s * 2, IDLE_WAIT_MAX_S)
            p.wake.wait(wait_s, consume=True)
            continue
        idle_s = IDLE_WAIT_S
        if not reqs and len(buf) < BATCH:
            # Records trickle in (a few per ms): without a pause each round would ship one or two of them, and
            # every message costs a pickle, a write and the worker's wake-up, per record. A flush or a stop
            # wakes the drainer at once; a full batch is shipped without waiting.
            _linger(p)


def _linger(p: Host) -> None:
    """Wait up to LINGER_S for more records; return early for a flush, a stop, a dead worker or a full batch
    (a side record's wake-up alone does not end it)."""
    end = time.monotonic() + LINGER_S
    while True:
        left = end - time.monotonic()
        if left <= 0 or not p.wake.wait(left, consume=True):
            return
        ch = p.channel
        if p.flush_reqs or p.stop or (ch is not None and ch.dead) or len(p.buf) >= BATCH:
            return
