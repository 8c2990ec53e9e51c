"""The exporter worker: Records in, spans out to the sinks. Runs as ``python -m cptrace_otel.export.worker`` (one
subprocess per traced rank process, the default) or in a thread of the traced process (``CPTRACE_EXPORTER=thread``);
both run :func:`run_loop` on a queue of messages.

Messages from the traced process (pickled, framed ``<u32 length><pickle>`` on stdin in process mode):

* ``("init", info)``: ``info`` = dict(config=Config, resource=dict, instance=str, file=path|None,
  log_file=path|None, spool_dir=str), always first;
* ``("items", items, dropped)``: a batch of compact items ``(ts, level, tag, fields)`` (values int/str/float, see
  ``pipeline.compact_item``), completed here into Records (docs/ARCHITECTURE.md) with ``seq`` in arrival order, and
  the traced process's drop count; ``("rec", records, dropped)`` takes finished Records;
* ``("flush", flush_id, dropped, timeout_s)``: close open spans, deliver everything, answer
  ``("ack", flush_id, ok, stats)`` (on stdout in process mode);
* end of input (EOF): finish (end-of-stream checks, close spans), deliver within ``config.timeout_s``, exit. So the
  worker never outlives its traced process by more than that.

The worker ignores SIGINT (a Ctrl-C to the process group must not kill it before the traced process's exit flush).
"""

from __future__ import annotations

import gc
import os
import pickle
import queue
import signal
import struct
import sys
import threading
import time
from typing import Any, Callable

from .. import semconv as sc
from ..events import Event
from ..logline import Rng, fast_value
from ..pipeline import MAX_VALUE_CHARS, _cut, _render_other, render_record
from ..spans import SpanBuilder
from .otlp import encode_requests

HEADER = struct.Struct("<I")
EXPORT_EVERY_S = 0.2      # latency bound for finished spans
EXPORT_MIN_SPANS = 2048   # or earlier when this many spans are finished
FILE_FLUSH_EVERY_S = 1.0


def _checker_factory(cfg: Any) -> Callable[[int], Any] | None:
    """``rank -> RankChecker`` when the online checks are on and the checks package provides them."""
    if not cfg.checks:
        return None
    try:
        from ..checks import RankChecker  # type: ignore[attr-defined]
    except Exception:
        return None
    level = cfg.level
    return lambda rank: RankChecker(rank, level)


class _ResetCounter:
    """Epoch = number of ``reset`` records before this one (used when the checks package is not there)."""

    def __init__(self) -> None:
        self.epoch = 0

    def step(self, tag: str, fields: dict[str, Any]) -> int:
        ep = self.epoch
        if tag == "reset":
            self.epoch += 1
        return ep


def _epoch_tracker() -> Any:
    # The log reader numbers epochs with checks.epochs.EpochTracker; use the same rule so live records and log
    # lines get identical events.
    try:
        from ..checks.epochs import EpochTracker

        return EpochTracker()
    except Exception:
        return _ResetCounter()


try:
    from ..checks.epochs import EPOCH_TAGS as _EPOCH_TAGS, EpochTracker as _EpochTracker
except Exception:  # the checks package is optional here: the shortcut below then never applies
    _EpochTracker = None  # type: ignore[assignment,misc]
    _EPOCH_TAGS = frozenset()  # (without EpochTracker every record steps the _ResetCounter)

def _load_intake() -> Any:
    """The C intake (``_speedups.intake``: the same Events as :meth:`Exporter._item_event`) when it was built and
    the checks package provides EpochTracker (the tracker it creates), else None."""
    if _EpochTracker is None:
        return None
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


class Exporter:
    """Worker core, shared by the subprocess and the thread modes."""

    def __init__(self, info: dict[str, Any]) -> None:
        cfg = info["config"]
        self.cfg = cfg
        self.resource: dict[str, Any] = info["resource"]
        self.rank = cfg.cp_rank
        self.builder = SpanBuilder(cfg.run_id, info.get("instance", ""), cfg.span_timeout_s,
                                   _checker_factory(cfg), track_traces=False)
        self.epochs: dict[int, Any] = {}
        self.records = 0
        self.next_seq = 0
        self.dropped_upstream = 0
        self._reported_dropped = 0
        self.sender = None
        self.file_sink = None
        self.log_sink = None
        self.errors: list[str] = []
        if cfg.endpoint:
            from .spool import ReliableSender

            try:
                if cfg.protocol == "grpc":
                    from .otlp_grpc import GrpcTransport

                    transport: Any = GrpcTransport(cfg.endpoint, cfg.headers, cfg.timeout_s, cfg.compression)
                else:
                    from .otlp_http import HttpTransport

                    transport = HttpTransport(cfg.traces_url(), cfg.headers, cfg.timeout_s, cfg.compression)
                spool_dir = os.path.join(info.get("spool_dir") or cfg.spool_dir,
                                         f"{_safe(cfg.run_id)}-{os.getpid()}")
                self.sender = ReliableSender(transport, spool_dir)
            except Exception as e:
                self._error(f"cannot set up the OTLP {cfg.protocol} sink for {cfg.endpoint}: {e!r}")
        if info.get("file"):
            from .files import OtlpJsonFileSink

            try:
                self.file_sink = OtlpJsonFileSink(info["file"])
            except OSError as e:
                self._error(f"cannot open the OTLP file {info['file']}: {e}")
        if info.get("log_file"):
            from .files import LogLinesSink

            try:
                self.log_sink = LogLinesSink(info["log_file"], cfg.cp_rank, cfg.tp_rank)
            except OSError as e:
                self._error(f"cannot open the log file {info['log_file']}: {e}")
        self._last_export = time.monotonic()
        self._last_file_flush = self._last_export

    def _error(self, msg: str) -> None:
        self.errors.append(msg)
        print(f"cptrace_otel: {msg}", file=sys.stderr, flush=True)

    # -- input -----------------------------------------------------------------------------------------------
    def add_items(self, items: list[tuple], dropped: int) -> None:
        if self.log_sink is None:
            self._add_items_fast(items, dropped)
            return
        seq = self.next_seq
        recs = []
        for i, item in enumerate(items):
            try:
                recs.append(render_record(seq + i, item))
            except Exception as e:  # should not happen: items are int/str/float by construction
                self._error(f"dropped an unrenderable record: {e!r}")
        self.next_seq = seq + len(items)
        self.add_records(recs, dropped)

    def _add_items_fast(self, items: list[tuple], dropped: int) -> None:
        """``add_records([render_record(seq, item) ...])`` in one pass (no log sink needs the Records): the same
        Events, without the intermediate Record tuples; the C intake builds them when it was built."""
        self.dropped_upstream = dropped
        seq = self.next_seq
        if _intake is not None:
            events = _intake(items, seq, self.rank, self.epochs, MAX_VALUE_CHARS, _value, self._item_event)
        else:
            item_event = self._item_event
            events = [ev for ev in map(item_event, items, range(seq, seq + len(items))) if ev is not None]
        add = self.builder.add
        for ev in events:
            add(ev)
        self.next_seq = seq + len(items)
        self.records += len(events)
        if len(self.builder._done) >= EXPORT_MIN_SPANS:
            self.export()

    def _item_event(self, item: tuple, seq: int) -> Event | None:
        """The Event of one compact item ``(ts, level, tag, fields)`` (None, reported, when it cannot be rendered).
        The Python intake, and the C intake's path for items of an unusual shape."""
        try:
            ts, level, tag, f = item
            # The fields dict is ours (unpickled here, or in thread mode the call's own **kwargs dict): convert
            # its values in place (same keys, same order) instead of copying it. Converting twice gives the same
            # values, should an item ever be converted again.
            for k, v in f.items():
                t = type(v)
                if t is int:
                    continue
                if t is str:
                    if " " in v or len(v) > MAX_VALUE_CHARS:
                        v = _cut(v.replace(" ", ""))
                    r = _parsed.get(v)
                    f[k] = _value(v) if r is None else r
                else:
                    r = _render_other(v, None, None)
                    f[k] = _value(r) if type(r) is str else r
            if type(tag) is not str or type(level) is not int:
                _, _, level, tag, _ = render_record(0, (ts, level, tag, {}))
        except Exception as e:  # should not happen: items are int/str/float by construction
            self._error(f"dropped an unrenderable record: {e!r}")
            return None
        r = f.get("rank")
        rank = r if type(r) is int and r >= 0 else self.rank
        tr = self.epochs.get(rank)
        if tr is None:
            tr = self.epochs[rank] = _epoch_tracker()
        # EpochTracker.step only moves on reset / split / insert or right after a reset; for every other
        # record it returns the current epoch unchanged (hint 0 never moves it), so skip the call.
        if tag in _EPOCH_TAGS or type(tr) is not _EpochTracker or tr._after_reset:
            ep = tr.step(tag, f)
        else:
            ep = tr.epoch
        return Event(tag, rank, seq, ts, ep, f, level, "live", 0)

    def add_records(self, records: list[tuple], dropped: int) -> None:
        self.dropped_upstream = dropped
        if self.log_sink is not None:
            try:
                self.log_sink.write(records)
            except Exception as e:
                self._error(f"log file write failed: {e!r}")
                self.log_sink = None
        b = self.builder
        epochs = self.epochs
        default_rank = self.rank
        for seq, ts, level, tag, fields in records:
            f = {k: (_value(v) if type(v) is str else v) for k, v in fields}
            r = f.get("rank")
            rank = r if type(r) is int and r >= 0 else default_rank
            tr = epochs.get(rank)
            if tr is None:
                tr = epochs[rank] = _epoch_tracker()
            b.add(Event(tag, rank, seq, ts, tr.step(tag, f), f, level, "live", 0))
        self.records += len(records)
        if len(b._done) >= EXPORT_MIN_SPANS:
            self.export()

    def tick(self) -> None:
        now = time.monotonic()
        self.builder.expire(time.time_ns())
        if self.builder._done and now - self._last_export >= EXPORT_EVERY_S:
            self.export()
        if now - self._last_file_flush >= FILE_FLUSH_EVERY_S:
            self._last_file_flush = now
            for s in (self.file_sink, self.log_sink):
                if s is not None:
                    try:
                        s.flush()
                    except Exception:
                        pass

    # -- output ----------------------------------------------------------------------------------------------
    def export(self) -> None:
        self._last_export = time.monotonic()
        spans = self.builder.take()
        if not spans:
            return
        groups = [(self.resource, spans)]
        if self.sender is not None:
            for body in encode_requests(groups):
                self.sender.submit(body)
        if self.file_sink is not None:
            try:
                self.file_sink.export(groups)
            except Exception as e:
                self._error(f"OTLP file write failed: {e!r}")
                self.file_sink = None

    def _stamp_dropped(self) -> None:
        if self.dropped_upstream != self._reported_dropped or self.builder._open.get((self.rank, "rank")):
            self.builder.annotate_rank(self.rank, {sc.DROPPED: self.dropped_upstream}, time.time_ns())
            self._reported_dropped = self.dropped_upstream

    def flush(self, timeout_s: float, dropped: int | None = None) -> bool:
        deadline = time.monotonic() + timeout_s
        if dropped is not None:
            self.dropped_upstream = dropped
        self._stamp_dropped()
        self.builder.close_all("flush")
        self.export()
        ok = not self.errors
        for s in (self.file_sink, self.log_sink):
            if s is not None:
                ok = s.flush() and ok
        if self.sender is not None:
            ok = self.sender.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def close(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        self._stamp_dropped()
        self.builder.finish()
        self.export()
        ok = True
        for s in (self.file_sink, self.log_sink):
            if s is not None:
                ok = s.close() and ok
        if self.sender is not None:
            ok = self.sender.close(max(0.0, deadline - time.monotonic())) and ok
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
        for s in (self.sender, self.file_sink, self.log_sink):
            if s is not None:
                st.update(s.stats())
        return st


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[:64] or "run"


def run_loop(get: Callable[[float], Any], ack: Callable[[tuple], None]) -> int:
    """Process messages from ``get(timeout)`` (``None`` = end of input, ``queue.Empty`` = idle) until end of input."""
    exp: Exporter | None = None
    while True:
        try:
            msg = get(0.1)
        except queue.Empty:
            if exp is not None:
                exp.tick()
            continue
        if msg is None:
            break
        kind = msg[0]
        try:
            if kind == "items":
                if exp is not None:
                    exp.add_items(msg[1], msg[2])
                    exp.tick()
            elif kind == "rec":
                if exp is not None:
                    exp.add_records(msg[1], msg[2])
                    exp.tick()
            elif kind == "flush":
                ok = exp.flush(msg[3], msg[2]) if exp is not None else False
                ack(("ack", msg[1], ok, exp.stats() if exp is not None else {}))
            elif kind == "init":
                exp = Exporter(msg[1])
        except Exception as e:  # keep serving: a bad batch must not take the exporter down
            print(f"cptrace_otel: exporter error on {kind!r}: {e!r}", file=sys.stderr, flush=True)
            if kind == "flush":
                ack(("ack", msg[1], False, {"errors": [repr(e)]}))
    if exp is None:
        return 0
    return 0 if exp.close(exp.cfg.timeout_s) else 1


def _read_exact(f: Any, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def main() -> int:
    """Subprocess entry point: frames on stdin, acks on stdout, diagnostics on stderr."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):
        pass
    # The exporter allocates many short-lived acyclic objects (events, attribute dicts, spans): collect young
    # objects less often, and keep the import-time heap out of every collection. A young collection costs about
    # the events still held by open and unexported spans, whatever the threshold: collecting every 100k allocations
    # (and the middle generation every 50th time) halves the collector's share (~3 -> ~1.5 us per event).
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but acks may reach the ack pipe
    q: queue.Queue = queue.Queue(maxsize=64)

    def reader() -> None:
        try:
            while True:
                h = _read_exact(inp, HEADER.size)
                if h is None:
                    break
                body = _read_exact(inp, HEADER.unpack(h)[0])
                if body is None:
                    break
                q.put(pickle.loads(body))
        except Exception as e:
            print(f"cptrace_otel: exporter input error: {e!r}", file=sys.stderr, flush=True)
        q.put(None)

    threading.Thread(target=reader, name="cptrace-worker-input", daemon=True).start()
    out_lock = threading.Lock()

    def ack(msg: tuple) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with out_lock:
            try:
                out.write(HEADER.pack(len(data)) + data)
                out.flush()
            except OSError:
                pass  # the traced process is gone; nothing to tell

    return run_loop(lambda t: q.get(timeout=t), ack)


if __name__ == "__main__":
    sys.exit(main())
