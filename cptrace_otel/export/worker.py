"""The exporter worker: compact items in, spans out to the sinks. Runs in its own process
(:mod:`cptrace_otel.export.worker_process`, one per traced rank process, the default) or in a thread of the traced
process (``CPTRACE_EXPORTER=thread``); both run :func:`run_loop` on a queue of messages.

The messages, their framing on stdin/stdout in process mode and the acks are :mod:`cptrace_otel.export.protocol`.
Each compact item of an ``ITEMS`` batch becomes one span event (:class:`~cptrace_otel.model.spans.SpanBuilder`), ``seq``
in arrival order; ``FLUSH`` closes open spans, delivers everything and is answered with an ``ACK``; at end of input
the worker finishes (end-of-stream checks, close spans), delivers within ``config.timeout_s`` and exits, so it never
outlives its traced process by more than that. Its sinks come from :func:`cptrace_otel.export.stack.open_sinks`.
"""

from __future__ import annotations

import os
import queue
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .._speedups import twin_off
from ..checks.epochs import EPOCH_TAGS, EpochTracker
from ..checks.rank_checker import checker_factory
from ..model import semconv as sc
from ..model.events import Event
from ..model.logline import Rng, fast_value
from ..model.records import MAX_VALUE_CHARS, cut, render_other, render_record, tag_level
from ..model.spans import SpanBuilder
from .protocol import ACK, FLUSH, INIT, ITEMS, PREINIT, PROGRESS, SIDE
from .ringread import RingIntake
from .sinks import Sink
from .stack import SinkError, open_sinks

EXPORT_EVERY_S = 0.2      # latency bound for finished spans
PROGRESS_EVERY_S = 0.2    # how often the traced process hears how many of its records are safe
EXPORT_MIN_SPANS = 2048   # or earlier when this many spans are finished
FILE_FLUSH_EVERY_S = 1.0
RING_POLL_S = 0.02        # with the record ring: how often the worker looks for records when no message comes,
RING_POLL_MAX_S = 0.2     # doubling up to this while it finds none (an idle exporter costs little; a message resets it)
# A start (INIT) that fails is tried again after this long, doubling, this many times in all: a cause that passes (an
# import raced by another thread of the traced process in thread mode, a file descriptor limit met for a moment)
# must not lose the whole run; the records wait meanwhile as they do while the rank is unknown.
INIT_RETRY_S = 0.5
INIT_TRIES = 6


def _load_intake() -> Any:
    """The C intake (``_speedups.intake``: the same Events as :meth:`Exporter._item_event`) when it was built, else
    None."""
    from .._speedups.intake import load

    return load("live")


_parsed: dict[str, Any] = {}
_IMMUTABLE = (int, float, str, Rng)


def _value(v: str) -> Any:
    """``logline.fast_value`` (= ``parse_value``) with a cache for short repeated strings (only immutable results
    are shared)."""
    r = _parsed.get(v)
    if r is None:
        r = fast_value(v)
        if len(v) <= 96 and type(r) in _IMMUTABLE:
            if len(_parsed) > 50_000:
                _parsed.clear()
            _parsed[v] = r
    return r


_intake = _load_intake()


def c_intake() -> Any:
    """The C intake the worker takes items in with, or None (not built, or off: :func:`python_intake`)."""
    return _intake


def python_intake() -> AbstractContextManager[None]:
    """A block in which the worker takes items in with its Python intake alone (:meth:`Exporter._item_event`, the C
    intake's twin; tests run one input through each; :func:`cptrace_otel._speedups.twin_off`)."""
    return twin_off(globals(), "_intake")


class Exporter:
    """Worker core, shared by the subprocess and the thread modes: compact items in (:meth:`add_items`), spans out
    to the sinks (:meth:`export`, :meth:`tick`, :meth:`flush`, :meth:`close`), counters (:meth:`stats`).

    ``info`` is the ``INIT`` message's dict (:mod:`.protocol`). A sink that cannot be set up is reported (stderr and
    :meth:`stats` ``errors``; every later flush then answers False) and left out; the others still work."""

    def __init__(self, info: dict[str, Any]) -> None:
        from .otlp_proto import sizer  # (lazily: thread mode imports this module in the traced process)

        cfg = info["config"]
        self.cfg = cfg
        self.resource: dict[str, Any] = info["resource"]
        self.rank = cfg.cp_rank
        self.builder = SpanBuilder(cfg.run_id, info.get("instance", ""), cfg.span_timeout_s,
                                   checker_factory(cfg.checks, cfg.level), track_traces=False, sizer=sizer)
        self.builder.on_config = self._stamp_config
        self.epochs: dict[int, EpochTracker] = {}
        self.records = 0
        # monotonic time of the last ITEMS batch: the tick expires spans by wall clock only once the stream has been
        # idle for span_timeout_s (a worker lagging behind its records must not cut spans whose records are queued)
        self._last_items = 0.0
        self.next_seq = 0
        self.dropped_upstream = 0
        self._reported_dropped = 0
        self.errors: list[str] = []
        self.bad = 0               # records that could not be turned into span events (reported, counted)
        self.exported = 0          # span events handed to the sinks
        self._failed_sinks: list[Callable[[], int]] = []   # per failed sink: the records it has lost
        self._flushed = 0          # ... of which the file sinks have flushed to the OS (they survive a kill)
        self.spool_root = info.get("spool_dir") or cfg.spool_dir
        spool_dir = os.path.join(self.spool_root, f"{_safe(cfg.run_id)}-{os.getpid()}")
        # the sinks (:class:`~.sinks.Sink`), in the order they were opened: OTLP, OTLP file, log file
        self.sinks: list[Any] = open_sinks(
            cfg, endpoint=cfg.traces_url(), protocol=cfg.protocol, spool_dir=spool_dir, file=info.get("file"),
            log_file=info.get("log_file"), adopt_orphans=True, on_error=self._sink_error)
        resume = info.get("resume")
        if resume:
            self._resume(resume)
        self._last_export = time.monotonic()
        self._last_file_flush = self._last_export

    def _resume(self, resume: dict[str, Any]) -> None:
        """Carry on where a dead worker stopped: seq numbering, the epoch trackers (so node trace ids stay the
        same); the online checks start over, which the rank span says."""
        self.next_seq = int(resume.get("seq", 0))
        for rank, state in (resume.get("epochs") or {}).items():
            self.epochs[rank] = EpochTracker.from_state(state)
        self.builder.annotate_rank(self.rank, {sc.EXPORTER_RESTARTS: int(resume.get("restarts", 1)),
                                               sc.CHECKS_RESTARTED: True})

    def _stamp_config(self, ev: Event) -> None:
        """A config record: carried from now on by the resource of every request (every span of this rank, on
        whichever ``serve`` replica its trace lands: :mod:`~cptrace_otel.model.config_stamp`). The spans finished
        and not yet exported go with it too; a new dict, as the sinks may hold the old one."""
        from ..model.config_stamp import restamp

        self.resource = restamp(self.resource, ev)

    def epoch_state(self) -> dict[int, tuple[int, bool, int]]:
        """Each rank's epoch tracker state (for a replacement worker's ``resume``)."""
        return {r: t.state() for r, t in self.epochs.items()}

    def _drop_sink(self, sink: Sink, e: BaseException, since: Callable[[], int]) -> None:
        """A sink that failed: reported and left out from now on (the others go on). It keeps counting as a sink that
        loses: every record from the failed batch on (``since()``: how many that is now) is lost for it, on top of
        what it had lost already."""
        self._error(f"{sink.what} write failed: {e!r}")
        self.sinks = [s for s in self.sinks if s is not sink]
        prior = self._sink_lost(sink)
        self._failed_sinks.append(lambda: prior + since())

    @staticmethod
    def _sink_lost(s: Sink) -> int:
        try:
            if hasattr(s, "settled_records"):
                return int(s.stats().get("lost_records", 0))
            return int(getattr(s, "dropped_records", 0))
        except Exception:  # a sink broken enough to fail its own stats: what it lost before is unknown, not negative
            return 0

    def lost(self) -> int:
        """Records this worker lost, all counted: unrenderable ones and those its sinks rejected or dropped (a record
        two sinks lost counts once: the most any sink lost), a sink that failed included (it loses everything from its
        failed batch on)."""
        per_sink = [self._sink_lost(s) for s in self.sinks]
        per_sink += [lost() for lost in self._failed_sinks]
        return self.bad + max(per_sink, default=0)

    def _files_flushed(self) -> int:
        """Span events handed to the sinks whose lines the file sinks have written (not still waiting for room)."""
        return self.exported - max((s.pending_records() for s in self.sinks if hasattr(s, "pending_records")),
                                   default=0)

    def safe(self) -> int:
        """Records that reached a final state: delivered (or written), spooled to disk, or lost and counted. A sink
        that counts its own (the network one) says; the files' records are settled once flushed to the OS."""
        counted = [s.settled_records() for s in self.sinks if hasattr(s, "settled_records")]
        return self.bad + (min(counted) if counted else self._flushed)

    def _bad_record(self, e: BaseException) -> None:
        self.bad += 1
        if self.bad <= 10 or self.bad % 1000 == 0:
            self._error(f"dropped a record that cannot be traced ({self.bad} so far): {e!r}")

    def _error(self, msg: str) -> None:
        self.errors.append(msg)
        print(f"cptrace_otel: {msg}", file=sys.stderr, flush=True)

    def _sink_error(self, err: SinkError) -> None:
        if err.kind == "file":
            self._error(f"cannot open the OTLP file {err.target}: {err.cause}")
        elif err.kind == "log":
            self._error(f"cannot open the log file {err.target}: {err.cause}")
        elif err.kind == "config":
            self._error(f"OTLP {self.cfg.protocol} sink for {err.target} not set up, configuration error: {err.cause}; "
                        f"its spans are dropped and counted, nothing is retried")
        else:
            self._error(f"cannot set up the OTLP {self.cfg.protocol} sink for {err.target}: {err.cause!r}")

    # -- input -----------------------------------------------------------------------------------------------
    def add_items(self, items: list[Any], dropped: int) -> None:
        """One ``ITEMS`` batch: each compact item becomes one Event (seq counting on from the last batch; an item
        that cannot be rendered is reported and dropped, its seq skipped), fed to the span builder. The items' Records
        (:func:`~cptrace_otel.model.records.render_record`) go to the sinks that take them (``write``), first: an item
        that cannot be rendered as a Record is not traced either. The items are left as they came. The C intake
        builds the Events when it was built, :meth:`_item_event` otherwise (and for items of an unusual shape):
        the same Events."""
        self.dropped_upstream = dropped
        seq = self.next_seq
        item_event: Callable[[Any, int], Event | None] = self._item_event
        if any(hasattr(s, "write") for s in self.sinks):
            bad = self._write_records(items, seq)
            if bad:
                items = [None if i in bad else it for i, it in enumerate(items)]
                item_event = _skip_none(item_event)
        if _intake is not None:
            events = _intake(items, seq, self.rank, self.epochs, MAX_VALUE_CHARS, _value, item_event)
        else:
            events = [ev for ev in map(item_event, items, range(seq, seq + len(items))) if ev is not None]
        add = self.builder.add
        it = iter(events)
        while True:
            try:
                for ev in it:
                    add(ev)
                break
            except Exception as e:  # this record only (e.g. an unhashable op): the loop goes on with the next
                self._bad_record(e)
        self.builder.flush_checks()   # (the batch's online checks, run over it in one go: SpanBuilder.add)
        self.next_seq = seq + len(items)
        self.records += len(events)
        self.bad += len(items) - len(events)  # (reported where they were found)
        self._last_items = time.monotonic()
        if self.builder.finished_spans >= EXPORT_MIN_SPANS:
            self.export()

    def _write_records(self, items: list[tuple], seq: int) -> set[int]:
        """Write the items' Records to the sinks that take them; the indices of those that could not be rendered
        (reported; the intake then skips them and they are counted as bad)."""
        recs = []
        bad: set[int] = set()
        for i, item in enumerate(items):
            try:
                recs.append(render_record(seq + i, item))
            except Exception as e:  # should not happen: items are int/str/float by construction
                self._error(f"dropped an unrenderable record: {e!r}")
                bad.add(i)
        for s in [s for s in self.sinks if hasattr(s, "write")]:
            try:
                s.write(recs)
            except Exception as e:
                self._drop_sink(s, e, lambda: self.next_seq - seq)   # (records received from this batch on)
        return bad

    def _item_event(self, item: tuple, seq: int) -> Event | None:
        """The Event of one compact item ``(ts, level, tag, fields)`` (None, reported, when it cannot be rendered).
        The Python intake, and the C intake's path for items of an unusual shape."""
        try:
            ts, level, tag, given = item
            # the Event's own fields dict (same keys, same order): the item is left as it came (in thread mode its
            # fields are the call's own **kwargs dict)
            f = {}
            for k, v in given.items():
                t = type(v)
                if t is int:
                    f[k] = v
                elif t is str:
                    if " " in v or len(v) > MAX_VALUE_CHARS:
                        v = cut(v.replace(" ", ""))
                    r = _parsed.get(v)
                    f[k] = _value(v) if r is None else r
                else:
                    r = render_other(v, None, None)
                    f[k] = _value(r) if type(r) is str else r
            if type(tag) is not str or type(level) is not int:
                tag, level = tag_level(tag, level)
        except Exception as e:  # should not happen: items are int/str/float by construction
            self._error(f"dropped an unrenderable record: {e!r}")
            return None
        r = f.get("rank")
        rank = r if type(r) is int and r >= 0 else self.rank
        tr = self.epochs.get(rank)
        if tr is None:
            tr = self.epochs[rank] = EpochTracker()
        # EpochTracker.step only moves on reset / split / insert or right after a reset; for every other
        # record it returns the current epoch unchanged (hint 0 never moves it), so skip the call.
        ep = tr.step(tag, f) if tag in EPOCH_TAGS or tr.pending else tr.epoch
        return Event(tag, rank, seq, ts, ep, f, level, "live", 0)

    def tick(self) -> None:
        """Idle or between batches: expire spans (after span_timeout_s without records), export finished ones every
        EXPORT_EVERY_S, flush the files."""
        now = time.monotonic()
        if now - self._last_items >= self.cfg.span_timeout_s:
            # idle: close what has been open span_timeout_s by the wall clock. While records flow, the builder
            # closes spans by record time (SpanBuilder.add), so a backlog does not cut its stage spans.
            self.builder.expire(time.time_ns())
        if self.builder.finished_spans and now - self._last_export >= EXPORT_EVERY_S:
            self.export()
        if now - self._last_file_flush >= FILE_FLUSH_EVERY_S:
            self._last_file_flush = now
            for s in self.sinks:
                if not s.waits:
                    try:
                        s.flush(0.0)
                    except Exception:
                        pass
            self._flushed = self._files_flushed()

    # -- output ----------------------------------------------------------------------------------------------
    def export(self) -> None:
        """Hand the finished spans to the sinks (a sink that fails is reported and dropped)."""
        self._last_export = time.monotonic()
        spans = self.builder.take()
        if not spans:
            return
        groups = [(self.resource, spans)]
        before = self.exported
        self.exported += sum(len(sp.events) for sp in spans)
        for s in self.sinks:
            try:
                s.export(groups)
            except Exception as e:
                self._drop_sink(s, e, lambda: self.exported - before)   # (span events: one a record)

    def _stamp_dropped(self) -> None:
        total = self.dropped_upstream + self.lost()  # the traced process's losses and this worker's
        if total != self._reported_dropped or self.builder.rank_span_open(self.rank):
            self.builder.annotate_rank(self.rank, {sc.DROPPED: total})
            self._reported_dropped = total

    def _in_flush_order(self) -> list[Any]:
        """The sinks in the order they are flushed and closed: those that never wait first (the files), then those
        that may wait on a backend."""
        return sorted(self.sinks, key=lambda s: s.waits)

    def flush(self, timeout_s: float, dropped: int | None = None, exiting: bool = False) -> bool:
        """Close every open span and deliver everything; True when all of it reached every sink (and no error was
        ever reported and no record ever lost), within ``timeout_s``. ``exiting``: the traced process is exiting,
        so a backend that is down is not waited for."""
        deadline = time.monotonic() + timeout_s
        if dropped is not None:
            self.dropped_upstream = dropped
        self._stamp_dropped()
        self.builder.close_all("flush")
        self.export()
        ok = not self.errors
        for s in self._in_flush_order():
            left = max(0.0, deadline - time.monotonic())
            if exiting and s.waits and s.stats().get("backend_down"):
                left = 0.0  # the traced process is exiting: what waits is in the spool, for the next run
            ok = s.flush(left) and ok
        self._flushed = self._files_flushed()
        return ok and self.lost() == 0

    def close(self, timeout_s: float) -> bool:
        """End of input: end-of-stream checks, close every span, deliver within ``timeout_s``, close the sinks."""
        deadline = time.monotonic() + timeout_s
        self._stamp_dropped()
        self.builder.finish()
        self.export()
        ok = True
        self._flushed = self.exported
        for s in self._in_flush_order():
            ok = s.close(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def stats(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "records": self.records,
            "events": self.builder.events,
            "spans": self.builder.spans,
            "findings": self.builder.findings,
            "dropped_upstream": self.dropped_upstream,
            "errors": list(self.errors),
        }
        for s in self.sinks:
            st.update(s.stats())
        lost = self.lost()
        if lost or "lost_records" in st:
            st["lost_records"] = lost  # (listed once there is a sink that can lose, or a loss)
        if self.bad:
            st["bad_records"] = self.bad
        return st

    def progress(self) -> tuple:
        """The PROGRESS message (:mod:`.protocol`)."""
        return (PROGRESS, self.safe(), self.lost(), self.next_seq, self.epoch_state())


def _skip_none(item_event: Callable[[Any, int], Event | None]) -> Callable[[Any, int], Event | None]:
    """``item_event`` for a batch whose unrenderable items were replaced by None (already reported)."""
    return lambda item, seq: None if item is None else item_event(item, seq)


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[:64] or "run"


def run_loop(get: Callable[[float], Any], ack: Callable[[tuple], None],
             progress: Callable[[tuple], None] | None = None,
             at_eof: Callable[[Exporter], None] | None = None) -> int:
    """Process messages from ``get(timeout)`` (``None`` = end of input, ``queue.Empty`` = idle) until end of input;
    0 when everything was delivered at the end. ``ack`` gets the ACKs, ``progress`` (when given) the PROGRESS
    messages: about every PROGRESS_EVERY_S when it changed, before each ACK and once at the end. ``at_eof(exporter)``
    is called at end of input, before the final delivery."""
    exp: Exporter | None = None
    pre: dict[str, Any] | None = None   # PREINIT's info: the rank is not known yet, ITEMS wait in ``held``
    held: list[tuple[list, int]] = []
    ring: RingIntake | None = None      # the record ring (CPTRACE_RING), named in INIT / PREINIT
    dropped = 0                         # the traced process's drop count, as its last message said

    def begin(info: dict[str, Any]) -> Exporter:
        """The Exporter for ``info``, fed the batches held while the rank was unknown (PREINIT's resume kept)."""
        if pre is not None and not info.get("resume") and pre.get("resume"):
            info = dict(info, resume=pre["resume"])
        e = Exporter(info)
        for items, d in held:
            e.add_items(items, d)
        held.clear()
        return e

    init_tries = 0                      # failed starts of the INIT in ``pre`` (0: none failed)
    init_next = 0.0                     # monotonic time of its next try

    def start(info: dict[str, Any], final: bool = False) -> None:
        """Begin exporting for ``info`` (an INIT's); when that fails, hold the records and try again later
        (:data:`INIT_RETRY_S`, :data:`INIT_TRIES`), then (or at once when ``final``: the input has ended) give up
        on them (the traced process counts them lost)."""
        nonlocal exp, pre, init_tries, init_next
        try:
            exp = begin(info)
            pre, init_tries = None, 0
            return
        except Exception as e:
            init_tries += 1
            if final or init_tries >= INIT_TRIES:
                print(f"cptrace_otel: exporter could not start ({e!r}), tried {init_tries} times; the records it "
                      "was given are lost (counted in cptrace.dropped)", file=sys.stderr, flush=True)
                pre = None
                held.clear()
                return
            pre = info
            init_next = time.monotonic() + INIT_RETRY_S * 2 ** (init_tries - 1)
            print(f"cptrace_otel: exporter could not start ({e!r}); its records wait, trying again in "
                  f"{init_next - time.monotonic():.1f}s", file=sys.stderr, flush=True)

    def retry_due() -> None:
        """Try the held INIT again when a failed start's wait is over (from the feed and from the idle poll)."""
        if exp is None and pre is not None and init_tries and time.monotonic() >= init_next:
            start(pre)

    def feed(items: list, d: int) -> None:
        retry_due()
        if exp is not None:
            exp.add_items(items, d)
            exp.tick()
        elif pre is not None:
            held.append((items, d))

    def open_ring(info: dict[str, Any]) -> None:
        nonlocal ring
        if ring is None and info.get("ring"):
            ring = RingIntake(info["ring"], int((info.get("resume") or {}).get("side_next", 0)))

    def pull(final: bool = False) -> int:
        """The ring's readable records into the exporter (or the PREINIT hold), in order; how many there were."""
        if ring is not None and (exp is not None or pre is not None):
            try:
                items = ring.take(final)
            except ValueError as e:  # counted by the traced process's books as taken and never made safe
                print(f"cptrace_otel: exporter error reading the record ring: {e}", file=sys.stderr, flush=True)
                return 0
            if items:
                feed(items, dropped)
            return len(items)
        return 0

    def report(e: Exporter) -> tuple:
        p = e.progress()
        return p if ring is None else (p[0], p[1] + ring.skipped, *p[2:])   # given-up side items are safe

    last_progress = 0.0
    last_sent: tuple = ()
    poll_s = RING_POLL_S
    while True:
        try:
            msg = get(0.1 if ring is None else poll_s)
        except queue.Empty:
            msg = ()
        if progress is not None and exp is not None and time.monotonic() - last_progress >= PROGRESS_EVERY_S:
            last_progress = time.monotonic()
            try:
                p = report(exp)
                if p != last_sent:   # an unchanged report is not sent: an idle traced process is not woken for it
                    progress(p)
                    last_sent = p
            except Exception:
                pass
        if msg == ():
            retry_due()
            poll_s = RING_POLL_S if pull() else min(poll_s * 2, RING_POLL_MAX_S)
            if exp is not None:
                exp.tick()
            continue
        if msg is None:
            if exp is None and pre is not None:  # ended before its rank was known (or while a start failed)
                try:
                    pull(True)
                except Exception as e:
                    print(f"cptrace_otel: exporter error at end of input: {e!r}", file=sys.stderr, flush=True)
                start(pre, final=True)
            else:
                pull(True)
            if at_eof is not None and exp is not None:
                at_eof(exp)
            break
        poll_s = RING_POLL_S
        kind = msg[0]
        try:
            if kind == ITEMS:
                dropped = msg[2]
                feed(msg[1], msg[2])
            elif kind == SIDE:
                dropped = msg[2]
                if ring is not None:
                    ring.add_side(msg[1])
                pull()
            elif kind == FLUSH:
                if exp is None and pre is not None:  # (the traced process sends INIT first; never wait here)
                    start(pre)
                dropped = msg[2]
                pull()   # everything emitted before the flush is in the ring, its side items already came
                ok = exp.flush(msg[3], msg[2], len(msg) > 4 and bool(msg[4])) if exp is not None else False
                if exp is not None and progress is not None:
                    progress(report(exp))  # before the ACK: the flushed records are safe by then
                ack((ACK, msg[1], ok, exp.stats() if exp is not None else {}))
            elif kind == INIT:
                open_ring(msg[1])
                if exp is None:  # (a second INIT, after a restart, is the same configuration)
                    start(msg[1])
                pull()
            elif kind == PREINIT:
                pre = msg[1]
                open_ring(msg[1])
        except Exception as e:  # keep serving: a bad batch must not take the exporter down
            print(f"cptrace_otel: exporter error on {kind!r}: {e!r}", file=sys.stderr, flush=True)
            if kind == FLUSH:
                ack((ACK, msg[1], False, {"errors": [repr(e)]}))
    if exp is None:
        return 0
    ok = exp.close(exp.cfg.timeout_s)
    if progress is not None:
        try:
            progress(report(exp))
        except Exception:
            pass
    lost = exp.lost()
    if lost:
        print(f"cptrace_otel: exporter lost {lost} records (counted in cptrace.dropped)", file=sys.stderr, flush=True)
    return 0 if ok else 1
