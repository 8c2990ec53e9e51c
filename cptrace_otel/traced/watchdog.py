"""The render watchdog of the traced process's pipeline (:class:`cptrace_otel.traced.pipeline.Pipeline`): it has the
pipeline replace a drainer that is stuck rendering one record for the render budget, or that died.

Contract: :func:`watch` runs on the pipeline's watchdog thread until the pipeline stops and its drainer has ended; what
it reads and writes of the pipeline is :class:`Watched`.
It samples the drainer every :data:`WATCH_EVERY_S` while the drainer renders and for :data:`WATCH_QUIET_ROUNDS`
samples after; then it sleeps on the pipeline's ``watch`` flag until the drainer starts rendering (the drainer sets
the flag when it sees ``watch_idle``; the watchdog checks ``rendering`` after setting ``watch_idle``, so no
wake-up is lost) or ends (the drainer thread sets it on its way out), or :data:`WATCH_IDLE_S` passes. So a process
with nothing to render (the ring's records are never rendered in it) pays no periodic wake-up, and a stuck render is
still given up once the budget is spent, a dead drainer replaced within a sample. The pipeline's
``replace_drainer`` counts and reports the given-up record, has what the stuck drainer had rendered shipped, and
starts the next drainer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from .lifecycle import Flag

WATCH_EVERY_S = 0.25      # sampling period while the drainer renders
WATCH_QUIET_ROUNDS = 4    # after this many samples without rendering the watchdog sleeps until the drainer wakes it
WATCH_IDLE_S = 5.0        # (or this long: a backstop, well within the render budget)


class Watched(Protocol):
    """What the watchdog reads of the pipeline, and the one call it makes. ``gen``, ``rendering``, ``cur_items``:
    written by the drainer thread (and by ``replace_drainer``); ``watch_idle``: by the watchdog."""

    stop: bool
    drainer: threading.Thread
    gen: int
    rendering: bool
    cur_items: list
    watch: Flag
    watch_idle: bool

    def replace_drainer(self, stuck_items: list, why: str) -> None:
        """Start the next drainer generation; ``why`` (non-empty): the record it was stuck on is given up."""


def watch(p: Watched, budget_s: Callable[[], float]) -> None:
    """The watchdog loop over the pipeline ``p``; ``budget_s()``: how long one record's rendering may take
    (read at each check, so the pipeline's setting is the one in force)."""
    seen: tuple = ()
    since = time.monotonic()
    quiet = 0
    while not (p.stop and not p.drainer.is_alive()):
        if quiet < WATCH_QUIET_ROUNDS:
            time.sleep(WATCH_EVERY_S)
        else:
            p.watch_idle = True
            if not p.rendering and p.drainer.is_alive():
                p.watch.wait(WATCH_IDLE_S, consume=True)
            p.watch_idle = False
            quiet = 0
        if p.stop:
            continue
        now = time.monotonic()
        if not p.drainer.is_alive():
            p.replace_drainer([], "")
            continue
        mark = (p.gen, id(p.cur_items), len(p.cur_items)) if p.rendering else ()
        quiet = 0 if mark else quiet + 1
        if not mark or mark != seen:
            seen, since = mark, now
            continue
        budget = budget_s()
        if now - since >= budget:
            p.replace_drainer(p.cur_items, f"rendering a record's value blocked for more than {budget:g}s (a "
                              "__str__ that never returns?): that record is dropped and counted")
            seen = ()
