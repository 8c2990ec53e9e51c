"""The render watchdog of the traced process's pipeline (:mod:`cptrace_otel.traced.pipeline`): it replaces a drainer
that is stuck rendering one record for the render budget, or that died.

Contract: :func:`watch` runs on the pipeline's watchdog thread until the pipeline stops and its drainer has ended.
It samples the drainer every :data:`WATCH_EVERY_S` while the drainer renders and for :data:`WATCH_QUIET_ROUNDS`
samples after; then it sleeps on the state's ``watch`` flag until the drainer starts rendering (the drainer sets
the flag when it sees ``_watch_idle``; the watchdog checks ``_rendering`` after setting ``_watch_idle``, so no
wake-up is lost) or ends (the drainer thread sets it on its way out), or :data:`WATCH_IDLE_S` passes. So a process
with nothing to render (the ring's records are never rendered in it) pays no periodic wake-up, and a stuck render is
still given up once the budget is spent, a dead drainer replaced within a sample. :func:`new_drainer` counts and
reports the given-up record, has what the stuck drainer had rendered shipped, and starts the next drainer.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

WATCH_EVERY_S = 0.25      # sampling period while the drainer renders
WATCH_QUIET_ROUNDS = 4    # after this many samples without rendering the watchdog sleeps until the drainer wakes it
WATCH_IDLE_S = 5.0        # (or this long: a backstop, well within the render budget)


def watch(st: Any, budget_s: Callable[[], float]) -> None:
    """The watchdog loop over the pipeline state ``st``; ``budget_s()``: how long one record's rendering may take
    (read at each check, so the pipeline's setting is the one in force)."""
    seen: tuple = ()
    since = time.monotonic()
    quiet = 0
    while not (st.stop and not st.drainer.is_alive()):
        if quiet < WATCH_QUIET_ROUNDS:
            time.sleep(WATCH_EVERY_S)
        else:
            st._watch_idle = True
            if not st._rendering and st.drainer.is_alive():
                st.watch.wait(WATCH_IDLE_S, consume=True)
            st._watch_idle = False
            quiet = 0
        if st.stop:
            continue
        now = time.monotonic()
        if not st.drainer.is_alive():
            new_drainer(st, [], "")
            continue
        mark = (st.gen, id(st._cur_items), len(st._cur_items)) if st._rendering else ()
        quiet = 0 if mark else quiet + 1
        if not mark or mark != seen:
            seen, since = mark, now
            continue
        budget = budget_s()
        if now - since >= budget:
            new_drainer(st, st._cur_items, f"rendering a record's value blocked for more than {budget:g}s (a "
                        "__str__ that never returns?): that record is dropped and counted")
            seen = ()


def new_drainer(st: Any, stuck_items: list, why: str) -> None:
    """Start the next drainer generation (the old one stops if it ever returns); ``why`` (non-empty): the stuck
    record given up, counted and reported, and ``stuck_items`` (what the stuck drainer had rendered) shipped first."""
    st.gen += 1
    st._rendering = False
    taken = list(stuck_items)
    if why:
        st.stuck += 1
        st.dropped += 1
        st.lost += 1
        print(f"cptrace_otel: {why}; delivery goes on in a new drainer thread", file=sys.stderr, flush=True)
        if st.ring is not None:   # the worker skips the given-up record's placeholder (ring order kept)
            st.shipped += len(taken)
            st.ship_items([*taken, None])
            taken = []
    st.drainer = threading.Thread(target=st._drain_loop, args=(st.gen, taken), name="cptrace-drainer", daemon=True)
    st.drainer.start()
