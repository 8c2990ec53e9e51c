"""``cptrace-otel`` command line. Exit codes: 0 clean, 1 findings, 2 usage error, 3 a source or backend unreachable.

An unexpected exception in a command is exit 3 with a one-line message on stderr (never 1, which a CI script reads
as findings); ``CPTRACE_DEBUG=1`` prints its traceback as well.

Each command is a module of :mod:`cptrace_otel.commands` (its parser and its work); this is the table over them.
Command modules import only light modules at import time (their heavy work is imported when they run), so
``--version`` and ``--help`` load nothing heavy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from ._version import __version__
from .model.exits import EXIT_UNREACHABLE, EXIT_USAGE, CptraceError

# The commands, in the order ``--help`` lists them: name -> module under ``cptrace_otel.commands``. Each module
# has ``add_parser(sub)`` (its arguments) and ``run(args) -> int`` (its work, the exit code).
COMMANDS: dict[str, str] = {
    "check": "check",
    "report": "report",
    "demo": "demo",
    "watch": "watch",
    "ingest": "ingest",
    "serve": "serve",
}


def _command(name: str) -> Any:
    return importlib.import_module(f"{__package__}.commands.{COMMANDS[name]}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cptrace-otel", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"cptrace-otel {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        _command(name).add_parser(sub)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` (without the program name) parsed as ``main`` parses it, for a caller that runs a command's ``run``
    itself (tests, a wrapper): argparse's usage error exits 2 as on the command line."""
    return _parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors and 0 on --help/--version
        return int(e.code or 0)
    if args.command is None:
        p.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(_command(args.command).run(args))
    except KeyboardInterrupt:
        return 130
    except CptraceError as e:   # an expected error no command turned into its own message: its text, its code
        print(f"cptrace-otel {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:   # a bug or an input nobody foresaw: exit 3, never 1 (that is "findings")
        return _crashed(args.command, e)


def _crashed(command: str, e: BaseException) -> int:
    """One line on stderr for an unexpected exception (the traceback too with ``CPTRACE_DEBUG=1``); exit 3."""
    import os

    if os.environ.get("CPTRACE_DEBUG", "") not in ("", "0"):
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    where = ""
    tb = e.__traceback__
    while tb is not None:   # the innermost frame of the package: where to look, without the whole traceback
        if "cptrace_otel" in tb.tb_frame.f_code.co_filename:
            where = f" at {tb.tb_frame.f_code.co_name}:{tb.tb_lineno}"
        tb = tb.tb_next
    msg = " ".join(str(e).split())[:300]
    print(f"cptrace-otel {command}: internal error{where}: {type(e).__name__}: {msg} (exit 3; a bug: rerun with "
          "CPTRACE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
    return EXIT_UNREACHABLE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
