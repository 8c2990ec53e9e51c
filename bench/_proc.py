"""CPU seconds of other processes, from ``/proc`` (Linux): the benchmarks' exporter worker and the Jaeger they feed.

* :func:`cpu_s` is a process's user + system CPU seconds so far (``/proc/<pid>/stat``, clock-tick resolution), None
  when it cannot be read (gone, not Linux).
* :func:`children` lists a process's child pids (``/proc/<pid>/task/*/children``): the traced process's exporter
  worker.
* :func:`listener` is the pid of the process listening on a local TCP port (``/proc/net/tcp`` + each process's
  socket fds), None when none can be found (another user's process, no permission): the Jaeger behind an OTLP port.
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
