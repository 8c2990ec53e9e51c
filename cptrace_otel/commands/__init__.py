"""One module per ``cptrace-otel`` command, each with ``add_parser(sub)`` (its arguments) and ``run(args)`` (its
work, returning the exit code); :mod:`cptrace_otel.cli` is the table over them. A command module is imported only
when its command runs, so ``--help`` and ``--version`` load nothing heavy.
"""

from __future__ import annotations

import argparse


def add_progress_flags(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (``args.progress``: True, False, or None for "when stderr is a terminal")."""
    pg = p.add_mutually_exclusive_group()
    pg.add_argument("--progress", dest="progress", action="store_true", default=None,
                    help="show a progress bar on stderr while reading log files (default: when stderr is a terminal)")
    pg.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")
