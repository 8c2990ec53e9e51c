"""The traced process's end of the pipe to its exporter worker: a subprocess (:class:`ProcessChannel`) or a thread of
this process (:class:`ThreadChannel`), each with the books of what it was shipped and what the worker reported.

A channel calls back into its owner (a :class:`ChannelOwner`: the :class:`~cptrace_otel.traced.pipeline.Pipeline`),
on the channel's own thread (the ack reader, or the worker thread): ``on_ack(msg, channel)`` for every message the
worker sends (ACK, PROGRESS) and ``on_worker_gone(why, channel)`` once the worker is gone. The pipeline holds either
kind as a :class:`Channel`. Messages and frames: :mod:`cptrace_otel.export.protocol`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any, Protocol

from ..export.protocol import frame, read_frame
from .ring import Ring

REAP_S = 5.0   # longest a restart waits for a killed worker to be reaped


class ChannelOwner(Protocol):
    """What a channel calls back, on its reader (or worker) thread."""

    def on_ack(self, msg: tuple, ch: Channel | None = None) -> None:
        """A message from the worker (ACK of a flush, PROGRESS of its books)."""

    def on_worker_gone(self, why: str, ch: Channel | None = None) -> None:
        """The worker is gone (its pipe closed, its thread failed, a send failed)."""


class Books:
    """One worker's accounting: records shipped to it, how many it reported safe and lost, its last seq/epochs."""

    def _init_books(self, seq0: int, ring: Ring | None = None) -> None:
        self.seq0 = seq0
        # the record ring (traced/ring.py) and how many of its records workers had taken when this one started
        self.ring = ring
        self.ring_base = ring.consumed() if ring is not None else 0
        self.shipped = 0
        self.safe = 0
        self.wlost = 0
        self.epochs: dict = {}
        self.dead = False
        self.why = ""

    def given(self) -> int:
        """Records this worker was given: shipped to it, and taken by it from the ring."""
        return self.shipped + (self.ring.consumed() - self.ring_base if self.ring is not None else 0)

    def in_flight(self) -> int:
        return max(0, self.given() - self.safe)


class Channel(Protocol):
    """A worker channel (:class:`ProcessChannel`, :class:`ThreadChannel`): its :class:`Books` (written by the
    drainer when it ships and restarts, by the reader on PROGRESS) and its operations."""

    seq0: int
    ring: Ring | None
    shipped: int
    safe: int
    wlost: int
    epochs: dict
    dead: bool
    why: str

    def given(self) -> int: ...

    def in_flight(self) -> int: ...

    def send(self, msg: tuple) -> None:
        """Hand ``msg`` to the worker (raises when it cannot go)."""

    def close(self, timeout_s: float) -> bool:
        """End of input: the worker delivers and exits; True when it exited cleanly within ``timeout_s``."""

    def finished(self, timeout_s: float) -> bool:
        """Whether the worker has ended and all it sent was read (only then is ``in_flight`` final)."""

    def reap(self, timeout_s: float = ...) -> None:
        """Before a replacement starts: make sure this worker reads nothing more."""

    def close_in_child(self) -> None:
        """After fork, in the child: drop this process's end without touching the parent's worker."""


class ProcessChannel(Books):
    """Worker subprocess: framed pickles on its stdin, acks from its stdout."""

    def __init__(self, owner: ChannelOwner, seq0: int = 0, ring: Ring | None = None) -> None:
        self._init_books(seq0, ring)
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cptrace_otel.export.worker_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, close_fds=True, env=env, bufsize=0,
            pass_fds=(ring.fd,) if ring is not None else (),   # the ring's memfd: the worker maps it
        )
        self._fd = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._owner = owner
        self._reader = threading.Thread(target=self._read_acks, name="cptrace-acks", daemon=True)
        self._reader.start()

    def send(self, msg: tuple) -> None:
        view = memoryview(frame(msg))
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _read_acks(self) -> None:
        f = self.proc.stdout
        try:
            assert f is not None   # (stdout=PIPE)
            while True:
                msg = read_frame(f)
                if msg is None:
                    break
                self._owner.on_ack(msg, self)
        except Exception:
            pass
        try:
            rc: int | None = self.proc.wait(1.0)
        except Exception:
            rc = self.proc.poll()
        self._owner.on_worker_gone(f"exporter process exited (rc={rc})", self)

    def finished(self, timeout_s: float) -> bool:
        """Whether the worker has exited and every message it sent was read (waiting up to ``timeout_s`` for the
        reader): only then is :meth:`~Books.in_flight` final."""
        if self.proc.poll() is None:
            return False
        self._reader.join(max(0.0, timeout_s))
        return not self._reader.is_alive()

    def reap(self, timeout_s: float = REAP_S) -> None:
        """Before a replacement starts: make sure this worker is gone. Its ack pipe can break (a frame it could not
        write, stdout closed by something it ran) while it still runs, reading its stdin and, with the record ring,
        the ring: left alive it would be a second reader of that ring, taking records from under its replacement.
        So it is killed and reaped (with the ring, the records it had read count as lost with it, in
        :meth:`Books.in_flight`, read once it can read no more)."""
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=timeout_s)
        except Exception:
            pass   # not reaped in time: the ring's reader token still keeps it from reading (export/ringread.py)
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass

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


class ThreadChannel(Books):
    """The same worker loop in a thread of this process (``CPTRACE_EXPORTER=thread``)."""

    MAX_QUEUED = 64

    def __init__(self, owner: ChannelOwner, seq0: int = 0, ring: Ring | None = None) -> None:
        import queue

        from ..export.worker import run_loop

        self._init_books(seq0, ring)
        # A SimpleQueue (C): put and get hold no Python-level lock a SIGTERM handler could find held (lifecycle).
        self._q: Any = queue.SimpleQueue()
        self._owner = owner
        self._rc: list[int] = []

        def body() -> None:
            try:
                on_msg = lambda m: owner.on_ack(m, self)  # noqa: E731
                self._rc.append(run_loop(lambda t: self._q.get(timeout=t), on_msg, on_msg))
            except BaseException as e:  # noqa: BLE001 - reported and restarted, never silent
                owner.on_worker_gone(f"exporter thread failed: {e!r}", self)

        self._t = threading.Thread(target=body, name="cptrace-exporter", daemon=True)
        self._t.start()

    def send(self, msg: tuple) -> None:
        # bounded like a pipe: wait while the worker is MAX_QUEUED messages behind (the buffer then fills and drops)
        while self._q.qsize() >= self.MAX_QUEUED and self._t.is_alive():
            time.sleep(0.002)
        if not self._t.is_alive():
            raise BrokenPipeError("exporter thread is not running")
        self._q.put(msg)

    def close(self, timeout_s: float) -> bool:
        self._q.put(None)
        self._t.join(timeout=max(0.0, timeout_s))
        return not self._t.is_alive() and self._rc == [0]

    def finished(self, timeout_s: float) -> bool:
        """Whether the worker loop has ended (its messages are delivered in its own thread, so none is pending)."""
        return not self._t.is_alive()

    def close_in_child(self) -> None:
        pass

    def reap(self, timeout_s: float = REAP_S) -> None:
        """A thread cannot be killed; a failed one has left its loop already (and it never reads the ring)."""
