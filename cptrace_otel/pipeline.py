"""The traced process's side of the pipeline: bounded buffer, drainer thread, exporter worker.

Contract (docs/ARCHITECTURE.md):

* :func:`start` returns the submit function that api installs as ``api._submit``: a bounded ``deque`` append of
  ``(time_ns, level, tag, fields)`` on the caller's thread. When the buffer holds ``config.queue_size`` records the
  new record is dropped and counted. It never blocks and never raises.
* A daemon drainer thread pops batches in order, resolves deferred fingerprints (``fingerprint.is_deferred/resolve``,
  waiting on their CUDA event), renders every value that is not already an int, str or float (bools as
  ``True``/``False``; anything else with upstream ``_fmt`` semantics; a value whose ``str`` raises becomes
  ``(err:<ExceptionType>)``; :func:`cptrace_otel.records.compact_item`) and ships batches of these compact items to
  the exporter worker, in order (messages and frames: :mod:`cptrace_otel.export.protocol`). The worker completes
  each with the same rendering (:mod:`cptrace_otel.records`), so the result is the same, but the traced process does
  the least work.
* The worker is a subprocess per traced process (``python -m cptrace_otel.export.worker``; not ``multiprocessing``,
  since SGLang rank processes may be daemonic), fed over its stdin and acking over its stdout; it exits after
  delivering once its stdin closes, so it never outlives the traced process for long. ``CPTRACE_EXPORTER=thread``
  runs the same worker loop in a thread instead (and a worker that cannot be spawned falls back to it).
* :func:`flush` returns True only when everything emitted before it is exported or written (open spans closed);
  False on timeout, while the backend is unreachable (records wait in the spool), or once records were lost because
  the worker died. :func:`stats` has the counters (``dropped`` is also exported as ``cptrace.dropped`` on the rank
  span at flush).
* Exit: an ``atexit`` hook flushes with a short timeout. Fork: :func:`_after_fork_in_child` (called by api's
  at-fork hook) forgets the parent's pipeline, so the child starts its own drainer and worker on its next record.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from .export.protocol import ACK, FLUSH, INIT, ITEMS, frame, read_frame
from .records import compact_item, load_deferred

BATCH = 4096              # records per message to the worker
IDLE_WAIT_S = 0.05        # drainer poll interval when the buffer is empty
EXIT_FLUSH_S = 5.0        # atexit flush budget

_lock = threading.Lock()
_state: "_State | None" = None
_fids = itertools.count(1)
_atexit_registered = False
_on_stop: Callable[[], None] | None = None   # start()'s caller's uninstall hook
_last_stats: dict[str, Any] = {}


# -- channels to the worker ----------------------------------------------------------------------------------------
class _ProcessChannel:
    """Worker subprocess: framed pickles on its stdin, acks from its stdout."""

    def __init__(self, st: "_State") -> None:
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cptrace_otel.export.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, close_fds=True, env=env, bufsize=0,
        )
        self._fd = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._st = st
        threading.Thread(target=self._read_acks, name="cptrace-acks", daemon=True).start()

    def send(self, msg: tuple) -> None:
        view = memoryview(frame(msg))
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _read_acks(self) -> None:
        f = self.proc.stdout
        try:
            while True:
                msg = read_frame(f)
                if msg is None:
                    break
                self._st.on_ack(msg)
        except Exception:
            pass
        self._st.on_worker_gone(f"exporter process exited (rc={self.proc.poll()})")

    def close(self, timeout_s: float) -> bool:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]  # EOF: the worker delivers and exits
        except OSError:
            pass
        try:
            self.proc.wait(timeout=max(0.0, timeout_s))
            return self.proc.returncode == 0
        except subprocess.TimeoutExpired:
            return False  # it keeps delivering on its own and exits within config.timeout_s

    def close_in_child(self) -> None:
        # After fork: drop this process's copy of the pipe so the parent's worker still sees EOF when the parent
        # exits. Never touch the Popen object (its lock may be held by a thread that does not exist here).
        try:
            os.close(self._fd)
        except OSError:
            pass


class _ThreadChannel:
    """The same worker loop in a thread of this process (``CPTRACE_EXPORTER=thread``)."""

    def __init__(self, st: "_State") -> None:
        import queue

        from .export.worker import run_loop

        self._q: Any = queue.Queue(maxsize=64)
        self._st = st
        self._rc: list[int] = []

        def body() -> None:
            try:
                self._rc.append(run_loop(lambda t: self._q.get(timeout=t), st.on_ack))
            except Exception as e:
                st.on_worker_gone(f"exporter thread failed: {e!r}")

        self._t = threading.Thread(target=body, name="cptrace-exporter", daemon=True)
        self._t.start()

    def send(self, msg: tuple) -> None:
        if not self._t.is_alive():
            raise BrokenPipeError("exporter thread is not running")
        self._q.put(msg)

    def close(self, timeout_s: float) -> bool:
        try:
            self._q.put(None, timeout=max(0.01, timeout_s))
        except Exception:
            return False
        self._t.join(timeout=max(0.0, timeout_s))
        return not self._t.is_alive() and self._rc == [0]

    def close_in_child(self) -> None:
        pass


# -- state ----------------------------------------------------------------------------------------------------------
class _State:
    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.buf: collections.deque = collections.deque()
        self.cap = max(1, int(cfg.queue_size))
        self.dropped = 0
        self.shipped = 0
        self.flush_reqs: collections.deque = collections.deque()
        self.waiters: dict[int, list[Any]] = {}
        self.wake = threading.Event()
        self.stop = False
        self.channel: Any = None
        self.gone: str | None = None
        self.lost = 0               # records that could not reach the worker (subset of dropped)
        self.stats: dict[str, Any] = {}
        self.pid = os.getpid()
        self.drainer = threading.Thread(target=self._drain, name="cptrace-drainer", daemon=True)

    # caller side ---------------------------------------------------------------------------------------------------
    def make_submit(self) -> Any:
        buf = self.buf
        cap = self.cap
        append = buf.append
        now = time.time_ns
        st = self

        def _submit(level: int, tag: str, fields: dict, _len: Any = len) -> None:
            try:
                if _len(buf) < cap:
                    append((now(), level, tag, fields))
                else:
                    st.dropped += 1
            except BaseException:  # noqa: BLE001 - the traced process must never see tracing fail
                pass

        return _submit

    # worker callbacks --------------------------------------------------------------------------------------------
    def on_ack(self, msg: tuple) -> None:
        if not msg or msg[0] != ACK:
            return
        _, fid, ok, stats = msg
        self.stats = stats or {}
        w = self.waiters.get(fid)
        if w is not None:
            w[1] = bool(ok)
            w[0].set()

    def on_worker_gone(self, why: str) -> None:
        if self.gone is None and not self.stop:
            self.gone = why
            print(f"cptrace_otel: {why}; further records are dropped and counted", file=sys.stderr, flush=True)
        elif self.gone is None:
            self.gone = why
        for w in list(self.waiters.values()):
            w[0].set()

    # drainer -------------------------------------------------------------------------------------------------------
    def _start_channel(self) -> None:
        info = {
            "config": self.cfg,
            "resource": self.cfg.resource(),
            "instance": f"{self.cfg.resource().get('service.instance.id', '')}",
            "file": self.cfg.expand(self.cfg.file) if self.cfg.file else None,
            "log_file": self.cfg.expand(self.cfg.log_file) if self.cfg.log_file else None,
            "spool_dir": self.cfg.spool_dir,
        }
        if self.cfg.exporter == "process":
            try:
                self.channel = _ProcessChannel(self)
                self.channel.send((INIT, info))
                return
            except Exception as e:
                print(f"cptrace_otel: cannot start the exporter process ({e!r}); exporting from a thread instead",
                      file=sys.stderr, flush=True)
        self.channel = _ThreadChannel(self)
        self.channel.send((INIT, info))

    def _ship(self, msg: tuple, n_records: int = 0) -> None:
        if self.gone is None:
            try:
                self.channel.send(msg)
                return
            except Exception as e:
                self.on_worker_gone(f"exporter unreachable ({type(e).__name__}: {e})")
        if n_records:
            self.dropped += n_records
            self.lost += n_records

    def _drain(self) -> None:
        try:
            self._start_channel()
        except Exception as e:
            self.on_worker_gone(f"exporter failed to start: {e!r}")
        is_deferred, resolve = load_deferred()
        buf = self.buf
        popleft = buf.popleft
        while True:
            self.wake.clear()
            reqs = []
            while self.flush_reqs:
                reqs.append(self.flush_reqs.popleft())
            busy = bool(reqs)
            while buf:
                busy = True
                n = min(len(buf), BATCH)
                items = []
                for _ in range(n):
                    item = popleft()
                    try:
                        items.append(compact_item(item, is_deferred, resolve))
                    except Exception:
                        self.dropped += 1  # unrenderable beyond repair (e.g. fields not a dict)
                self.shipped += len(items)
                self._ship((ITEMS, items, self.dropped), len(items))
            for fid, t_req, timeout_s in reqs:
                left = timeout_s - (time.monotonic() - t_req) - 0.05
                self._ship((FLUSH, fid, self.dropped, max(0.0, left)))
                if self.gone is not None:
                    w = self.waiters.get(fid)
                    if w is not None:
                        w[0].set()
            if self.stop and not buf and not self.flush_reqs:
                return
            if not busy:
                self.wake.wait(IDLE_WAIT_S)

    def flush(self, timeout_s: float) -> bool:
        if self.gone is not None and not self.drainer.is_alive():
            return False
        fid = next(_fids)
        w = [threading.Event(), False]
        self.waiters[fid] = w
        self.flush_reqs.append((fid, time.monotonic(), timeout_s))
        self.wake.set()
        got = w[0].wait(max(0.0, timeout_s))
        self.waiters.pop(fid, None)
        return bool(got and w[1] and self.gone is None and self.lost == 0)


# -- public (called by api.py) ---------------------------------------------------------------------------------------
def start(config: Any, on_stop: Callable[[], None] | None = None) -> Callable[[int, str, dict], None]:
    """Start the pipeline for ``config`` (idempotent) and return its submit function, for the caller to install.

    ``on_stop`` is called by :func:`shutdown` (also the exit hook's) right after the pipeline is detached, outside
    this module's lock: the caller uninstalls the submit function there, so a later record starts a new pipeline
    instead of reaching the stopped one. (A caller that installs under its own lock and uninstalls under the same
    lock never keeps a stopped pipeline's function installed.)"""
    global _state, _atexit_registered, _on_stop
    with _lock:
        if _state is None or _state.pid != os.getpid():
            st = _State(config)
            st.drainer.start()
            _state = st
            if not _atexit_registered:
                atexit.register(_at_exit)
                _atexit_registered = True
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
    global _state, _on_stop
    with _lock:
        st = _state
        if st is None:
            return True
        _state = None
        on_stop, _on_stop = _on_stop, None
    if on_stop is not None:
        on_stop()
    t0 = time.monotonic()
    ok = False
    try:
        ok = st.flush(timeout_s)
        st.stop = True
        st.wake.set()
        st.drainer.join(timeout=max(0.0, timeout_s - (time.monotonic() - t0)))
        if st.channel is not None:
            closed = st.channel.close(max(0.0, timeout_s - (time.monotonic() - t0)))
            ok = ok and closed
    except Exception:
        ok = False
    _remember(st)
    return ok


def stats() -> dict[str, Any]:
    """Counters of the running (or last) pipeline: ``dropped``, ``shipped``, ``queued``, ``exporter`` state and the
    worker's own figures from the last flush (events, spans, sent/spooled requests, ``backend_down``...)."""
    st = _state
    if st is None:
        return dict(_last_stats)
    return _stats_of(st)


def _stats_of(st: _State) -> dict[str, Any]:
    out = {"dropped": st.dropped, "shipped": st.shipped, "queued": len(st.buf), "lost": st.lost,
           "exporter": st.cfg.exporter, "worker_gone": st.gone}
    out.update({"worker": dict(st.stats)})
    return out


def _remember(st: _State) -> None:
    global _last_stats
    _last_stats = _stats_of(st)


def _at_exit() -> None:
    st = _state
    if st is None or st.pid != os.getpid():
        return
    shutdown(min(EXIT_FLUSH_S, float(getattr(st.cfg, "timeout_s", EXIT_FLUSH_S)) + 1.0))


def _after_fork_in_child() -> None:
    """Forget the parent's pipeline in a forked child (its threads do not exist here); start afresh lazily."""
    global _state, _lock, _on_stop
    st = _state
    _state = None
    _on_stop = None
    _lock = threading.Lock()
    if st is not None and st.channel is not None:
        st.channel.close_in_child()
