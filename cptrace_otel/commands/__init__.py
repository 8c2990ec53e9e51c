"""One module per ``cptrace-otel`` command, each with ``add_parser(sub)`` (its arguments) and ``run(args)`` (its
work, returning the exit code); :mod:`cptrace_otel.cli` is the table over them. A command module is imported only
when its command runs, so ``--help`` and ``--version`` load nothing heavy.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """The young generation collected every 50,000 allocations instead of 700 while a command reads records: it
    allocates a few short-lived containers per record and keeps little (the default costs several percent of a
    check, and a third of an ingest that holds many open spans)."""
    old = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def add_progress_flags(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (``args.progress``: True, False, or None for "when stderr is a terminal")."""
    pg = p.add_mutually_exclusive_group()
    pg.add_argument("--progress", dest="progress", action="store_true", default=None,
                    help="show a progress bar on stderr while reading log files (default: when stderr is a terminal)")
    pg.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")
