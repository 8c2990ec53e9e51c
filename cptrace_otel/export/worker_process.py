"""The exporter worker's process: ``python -m cptrace_otel.export.worker_process``, one per traced rank process (the
default exporter). Frames of :mod:`cptrace_otel.export.protocol` come on stdin and acks go out on stdout; the messages
are served by :func:`cptrace_otel.export.worker.run_loop`, as in thread mode. The process ignores SIGINT (a Ctrl-C to
the process group must not kill it before the traced process's exit flush), and once its traced process has ended it
lets go of the inherited stderr (:func:`_detach_later`)."""

from __future__ import annotations

import gc
import os
import queue
import signal
import sys
import threading

from .protocol import frame, read_frame
from .worker import Exporter, run_loop


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
                msg = read_frame(inp)
                if msg is None:
                    break
                q.put(msg)
        except Exception as e:
            print(f"cptrace_otel: exporter input error: {e!r}", file=sys.stderr, flush=True)
        q.put(None)

    threading.Thread(target=reader, name="cptrace-worker-input", daemon=True).start()
    out_lock = threading.Lock()

    def ack(msg: tuple) -> None:
        data = frame(msg)
        with out_lock:
            try:
                out.write(data)
                out.flush()
            except OSError:
                pass  # the traced process is gone; nothing to tell

    return run_loop(lambda t: q.get(timeout=t), ack, ack, _detach_later)


DETACH_AFTER_S = 1.0  # at end of input, the traced process's stderr is let go after this long


def _detach_later(exp: Exporter) -> None:
    """The traced process is done: if the final delivery takes longer than DETACH_AFTER_S, say so on the inherited
    stderr, then move this worker's stderr to a log file next to its spool, so that a ``cmd | tee`` or a
    ``subprocess.run(capture_output=True)`` of the traced process is not held open by this worker."""

    def detach() -> None:
        log = os.path.join(exp.spool_root, f"worker-{os.getpid()}.log")
        try:
            from .ownfiles import open_own, secure_dir

            secure_dir(exp.spool_root)
            fd = open_own(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except OSError:
            log, fd = os.devnull, os.open(os.devnull, os.O_WRONLY)
        try:
            print(f"cptrace_otel: the traced process exited; the exporter goes on delivering in the background "
                  f"(at most {exp.cfg.timeout_s:g}s); its messages go to {log}", file=sys.stderr, flush=True)
            os.dup2(fd, 2)
            os.close(fd)
        except OSError:
            pass

    t = threading.Timer(DETACH_AFTER_S, detach)
    t.daemon = True
    t.start()



if __name__ == "__main__":
    sys.exit(main())
