"""Traced child processes for the exit-path faults, shared by ``tests/e2e/test_exit_paths.py`` (assertions)
and ``bench/exit_losses.py`` (figures). Each function returns the child's Python source; the child writes its
records to ``CPTRACE_FILE`` (OTLP JSON lines) and says what it emitted on stdout with ``os.write`` (safe inside a
signal handler), one line per batch: ``E <records emitted so far>``; ``READY`` when the parent may start the fault.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.otlp_receiver import read_jsonl

REPO = Path(__file__).resolve().parents[2]

PRELUDE = textwrap.dedent("""
    import faulthandler, os, signal, sys, threading, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent's stack dump of a hung child (storm)
    import cptrace_otel as ct
    from cptrace_otel.traced import pipeline
    def say(s):
        os.write(1, (s + "\\n").encode())
    def emit(n, start=0):
        for i in range(start, start + n):
            ct.cptrace(1, "evict", node_id=i % 500, i=i)
        say("E %d" % (start + n))
        return start + n
    def emit_each(n, start):
        # says after every record: a signal that ends the process mid-batch still leaves the count exact (+1)
        for i in range(start, start + n):
            ct.cptrace(1, "evict", node_id=i % 500, i=i)
            say("E %d" % (i + 1))
        return start + n
""")


def storm_child(frame: str, app_handler: bool) -> str:
    """A process that, once READY, keeps emitting and calling ``flush()`` (``frame="flush"``) or ``shutdown()``
    (``frame="shutdown"``) while its parent sends SIGTERM after SIGTERM. With ``app_handler`` the
    application installed its own handler before the first record (as SGLang does): it says ``APP`` and exits 7."""
    app = textwrap.dedent("""
        def on_term(signum, frame):
            say("APP")
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)
    """) if app_handler else ""
    batch, call = (200, "ct.flush(10)") if frame == "flush" else (2000, "ct.shutdown(10)")
    body = f"""
        n = emit(20000)
        say("READY")
        while True:
            n = emit_each({batch}, n)
            {call}
    """
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


def stuck_render_child(before: int = 50, after: int = 49) -> str:
    """A process whose drainer gets stuck on a value whose ``__str__`` never returns (``before`` records emitted
    before it, ``after`` after it) and that exits normally well within the watchdog's budget. On the buffer path
    (``CPTRACE_RING=0``) it waits until the drainer has rendered the ``before`` records of its batch and is stuck
    (the ``after`` are queued behind it); with the ring the drainer only ever sees the stuck record (the others are
    in the ring), so it waits until the drainer is stuck on it. An atexit handler registered before the package is
    imported (so it runs after the exit flush) prints the pipeline's final ``stats()`` as ``STATS <json>``."""
    return textwrap.dedent(f"""
        import atexit, json, os, threading, time
        atexit.register(lambda: os.write(1, ("STATS " + json.dumps(pipeline.stats(), default=str) + "\\n").encode()))
        import cptrace_otel as ct
        from cptrace_otel.traced import pipeline
        class Stuck:
            def __str__(self):
                threading.Event().wait()
        st = None
        for i in range({before}):
            ct.cptrace(1, "evict", node_id=i, i=i)
        ct.cptrace(1, "evict", node_id=1, i={before}, v=Stuck())
        for i in range({before} + 1, {before} + 1 + {after}):
            ct.cptrace(1, "evict", node_id=i, i=i)
        st = pipeline.current()
        rendered = {before} if st.ring is None else 0
        while not (st.rendering and len(st.cur_items) >= rendered):   # wait until the drainer is stuck there
            time.sleep(0.01)
    """)


def restart_child(n: int = 30000, kill_at: int = 10000, rate: int = 15000) -> str:
    """A process that emits ``n`` records at ``rate``/s and SIGKILLs its exporter worker after ``kill_at`` (the
    pipeline restarts it), then flushes."""
    return PRELUDE + textwrap.dedent(f"""
        def paced(n, start):
            t0 = time.monotonic()
            for i in range(start, start + n, 100):
                emit(100, i)
                ahead = (i - start) / {rate} - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        paced({kill_at}, 0)
        os.kill(pipeline.current().channel.proc.pid, signal.SIGKILL)
        paced({n} - {kill_at}, {kill_at})
        ct.flush(60)
    """)


def every_line_child(n: int = 5000) -> str:
    """A SIGTERM at every line the main thread runs inside ``flush()`` and ``shutdown()``, down to ``threading``'s
    and ``queue``'s own code (a ``sys.settrace`` hook sends it): whatever lock such a frame holds, the handler runs
    there. The application's handler counts its calls and returns, so the interrupted frame goes on. Prints
    ``KILLS k CALLS c FLUSH ok SHUTDOWN ok``."""
    return PRELUDE + textwrap.dedent(f"""
        from cptrace_otel.traced import lifecycle
        calls = [0]
        def on_term(signum, frame):
            calls[0] += 1
        signal.signal(signal.SIGTERM, on_term)
        n = emit({n})
        kills = [0]
        quiet = {{"on_term", "_on_sigterm", "_chain"}}
        def tracer(frame, event, arg):
            if frame.f_code.co_name in quiet:
                return None
            if event == "line" and not lifecycle._in_handler:
                kills[0] += 1
                os.kill(os.getpid(), signal.SIGTERM)
            return tracer
        sys.settrace(tracer)
        ok1 = ct.flush(30)
        sys.settrace(None)
        n = emit({n}, n)
        sys.settrace(tracer)
        ok2 = ct.shutdown(30)
        sys.settrace(None)
        say("KILLS %d CALLS %d FLUSH %s SHUTDOWN %s" % (kills[0], calls[0], ok1, ok2))
    """)


def signal_in_submit_child(k: int) -> str:
    """A SIGTERM at the ``k``-th trace event (call, line, return) of the submit functions one ``cptrace`` call runs
    (the pipeline's ``_submit``/``_sampled``, the sampler's ``submit``), sent from a ``sys.settrace`` hook, after
    the application installed a handler that says ``APP`` and exits 7: the handler's SystemExit is raised right
    there. Prints ``RAN ON <events> <armed>`` if the process went on after that record (``armed``: ``k`` was past the
    call's last event, so no signal was sent)."""
    return PRELUDE + textwrap.dedent(f"""
        def on_term(signum, frame):
            say("APP")
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)
        n = emit(100)  # the pipeline runs (its SIGTERM handler chains this one)
        names = {{"_submit", "_sampled", "submit"}}
        seen, armed = [0], [True]
        def tracer(frame, event, arg):
            if not armed[0] or frame.f_code.co_name not in names:
                return None
            if seen[0] == {k}:
                armed[0] = False
                os.kill(os.getpid(), signal.SIGTERM)
            seen[0] += 1
            return tracer
        sys.settrace(tracer)
        ct.cptrace(1, "evict", node_id=10**6, i=n)
        sys.settrace(None)
        say("RAN ON %d %s" % (seen[0], armed[0]))
    """)


# -- running them --------------------------------------------------------------------------------------------------
def child_env(tmp: str | Path, **extra: str) -> dict[str, str]:
    """The children's environment: level 1, checks off, records to ``tmp/out-<pid>.jsonl``, this tree first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CPTRACE_"))}
    env.update(PYTHONPATH=str(REPO), CPTRACE_LEVEL="1", CPTRACE_RUN_ID="exits", CPTRACE_CHECKS="0",
               CPTRACE_FILE=f"{tmp}/out-{{pid}}.jsonl", CPTRACE_SPOOL_DIR=f"{tmp}/spool")
    env.update(extra)
    return env


def delivered(tmp: str | Path) -> list:
    """Every span event with an ``i`` in the children's OTLP files."""
    return [e for sp in read_jsonl(sorted(glob.glob(f"{tmp}/out-*.jsonl"))) for e in sp.events
            if "hicache.i" in e.attrs]


def wait_delivered(tmp: str | Path, want: int, timeout_s: float = 60.0) -> set[int]:
    """The distinct ``i`` delivered, once ``want`` of them are there (the exporter outlives a process that ended
    with ``os._exit`` and writes on) or ``timeout_s`` passed: waits for that state, polling."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = {e.attrs["hicache.i"] for e in delivered(tmp)}
        if len(got) >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@dataclass
class Storm:
    rc: int | str
    app_ran: bool
    signals: int
    emitted: int
    got: set[int] = field(default_factory=set)
    dump: str = ""   # a hung child's stacks (faulthandler; py-spy's too, with its exporter's, where installed)


def _stacks(p: subprocess.Popen, err_path: Path) -> str:
    """The stacks of a hung child: py-spy's of the child and its exporter worker where py-spy is installed, and the
    child's own faulthandler dump (SIGUSR1, registered by PRELUDE; written by C code, so it comes however the
    interpreter is stuck), read from its stderr file."""
    out = []
    spy = shutil.which("py-spy")
    if spy:
        pids = [p.pid]
        try:
            pids += [int(x) for x in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]
        except OSError:
            pass
        for pid in pids:
            r = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
            out.append(f"py-spy dump of {pid}:\n{r.stdout}{r.stderr}")
    before = last = err_path.stat().st_size
    p.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # polls (bounded) until the dump was written and stopped growing
        time.sleep(0.1)
        now = err_path.stat().st_size
        if before != now == last:
            break
        last = now
    out.append("child's stderr (faulthandler dump at the end):\n" + err_path.read_text(errors="replace")[-20000:])
    return "\n".join(out)


def storm(code: str, tmp: str | Path, signals: int = 200, gap_s: float = 0.001, **env: str) -> Storm:
    """Start ``code`` (a :func:`storm_child`), wait for READY, send it up to ``signals`` SIGTERMs ``gap_s`` apart
    while it lives, then collect: exit status (``"HUNG"`` if it did not end within 60 s: a deadlock), whether the
    application's handler ran, how many records it emitted and which were delivered; a hung child's stacks are in
    ``dump``."""
    err_path = Path(tmp) / "child-stderr.txt"
    with open(err_path, "wb") as err:
        p = subprocess.Popen([sys.executable, "-c", code], env=child_env(tmp, **env), stdout=subprocess.PIPE,
                             stderr=err)
    out = b""
    while b"READY" not in out:
        chunk = p.stdout.read1(4096)  # type: ignore[union-attr]
        if not chunk:
            break
        out += chunk
    sent = 0
    for _ in range(signals):
        if p.poll() is not None:
            break
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(gap_s)  # the storm's pace (not a wait for a state)
    dump = ""
    try:
        rest, _ = p.communicate(timeout=60)
        rc: int | str = p.returncode
    except subprocess.TimeoutExpired:
        dump = _stacks(p, err_path)
        p.kill()
        rest, _ = p.communicate()
        rc = "HUNG"
    out += rest
    text = out.decode(errors="replace")
    emitted = max([int(x.split()[1]) for x in text.splitlines() if x.startswith("E ")] or [0])
    got = wait_delivered(tmp, emitted, timeout_s=30.0)
    return Storm(rc, "APP" in text, sent, emitted, got, dump)
