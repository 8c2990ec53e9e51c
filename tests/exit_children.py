"""Traced child processes for the exit-path faults of issue 21, shared by ``tests/test_exit_paths.py`` (assertions)
and ``bench/exit_losses.py`` (figures). Each function returns the child's Python source; the child writes its
records to ``CPTRACE_FILE`` (OTLP JSON lines) and says what it emitted on stdout with ``os.write`` (safe inside a
signal handler), one line per batch: ``E <records emitted so far>``; ``READY`` when the parent may start the fault.
"""

from __future__ import annotations

import textwrap

PRELUDE = textwrap.dedent("""
    import os, signal, sys, threading, time
    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline
    def say(s):
        os.write(1, (s + "\\n").encode())
    def emit(n, start=0):
        for i in range(start, start + n):
            ct.cptrace(1, "evict", node_id=i % 500, i=i)
        say("E %d" % (start + n))
        return start + n
""")


def storm_child(frame: str, app_handler: bool) -> str:
    """A process that, once READY, keeps calling ``flush()`` (``frame="flush"``) or ends with ``shutdown()`` after
    emitting (``frame="shutdown"``) while its parent sends SIGTERM after SIGTERM. With ``app_handler`` the
    application installed its own handler before the first record (as SGLang does): it says ``APP`` and exits 7."""
    app = textwrap.dedent("""
        def on_term(signum, frame):
            say("APP")
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)
    """) if app_handler else ""
    body = {
        "flush": """
            n = emit(20000)
            say("READY")
            while True:
                n = emit(200, n)
                ct.flush(10)
        """,
        "shutdown": """
            n = emit(20000)
            say("READY")
            while True:
                n = emit(2000, n)
                ct.shutdown(10)
        """,
    }[frame]
    return PRELUDE + app + textwrap.dedent(body)


def early_exit_child(n: int = 30000, after_s: float = 1.0) -> str:
    """A process whose rank is unknown (no CPTRACE_CP_RANK) that emits ``n`` records and ends with ``os._exit``
    ``after_s`` seconds after its first record, before the rank wait is over."""
    return PRELUDE + textwrap.dedent(f"""
        t0 = time.monotonic()
        n = emit({n})
        left = {after_s} - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
        os._exit(0)
    """)


def fork_child(n: int = 5000, pace_s: float = 0.002) -> str:
    """A process that traces one record, forks, and whose child (plain ``os.fork``, no multiprocessing) emits ``n``
    records, ten at a time ``pace_s`` apart (about a second), and ends with ``os._exit`` right after the last; the
    parent waits for it and exits normally."""
    return PRELUDE + textwrap.dedent(f"""
        emit(1)
        pid = os.fork()
        if pid == 0:
            for k in range(1, {n} + 1, 10):
                emit(10, k)
                time.sleep({pace_s})
            os._exit(0)
        os.waitpid(pid, 0)
    """)
