"""CPU seconds of other processes, from ``/proc`` (Linux): the benchmarks' exporter worker and the Jaeger they feed.

* :func:`cpu_s` is a process's user + system CPU seconds so far (``/proc/<pid>/stat``, clock-tick resolution), None
  when it cannot be read (gone, not Linux).
* :func:`children` lists a process's child pids (``/proc/<pid>/task/*/children``): the traced process's exporter
  worker.
* :func:`listener` is the pid of the process listening on a local TCP port (``/proc/net/tcp`` + each process's
  socket fds), None when none can be found (another user's process, no permission): the Jaeger behind an OTLP port.
* :func:`installed_env` is the environment a benchmark's subprocesses run in so that they pay what an installed
  package pays at start: the package's bytecode compiled once beforehand and read from its cache.
"""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    parts = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) ": state is parts[0], utime parts[11]
    return (int(parts[11]) + int(parts[12])) / _TICK


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def listener(port: int) -> int | None:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:   # 0A: LISTEN
                        inodes.add(f"socket:[{cols[9]}]")
        except (OSError, StopIteration):
            pass
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def installed_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) without ``PYTHONDONTWRITEBYTECODE``, after compiling the package's modules
    into their ``__pycache__`` (once; quiet). A pip-installed package has its bytecode compiled at install time;
    with the variable set (as some shells and CI images do) every fresh process compiles each module it imports from
    source instead: about 0.2 s of CPU for ``watch``'s 77 modules on the 2-core VM, and as much again in each
    ``check -j`` worker, a cost no user of an installed package pays."""
    import compileall
    from pathlib import Path

    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "cptrace_otel"), quiet=1)
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
