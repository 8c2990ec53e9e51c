"""Exit codes shared by every command (``cptrace-otel check``, ``report``, ``demo``, ``ingest``, ...).

0 clean, 1 findings, 2 usage (bad arguments, or input that cannot be taken as given), 3 a source or backend that
cannot be read or reached (the path or URL is printed, never a traceback), 4 (``check``) no finding, but the
cross-rank rules were not run because some streams have an unknown rank (findings still exit 1).

:class:`CptraceError` is the root of the errors that end a command with one of these codes."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_UNREADABLE: Final = EXIT_UNREACHABLE   # the same code, named for file sources
EXIT_INCOMPLETE: Final = 4


class CptraceError(Exception):
    """The root of the errors a command can stop on: a source that cannot be read, a backend that cannot be reached,
    a sink that cannot be set up. ``exit_code`` is the exit status the command ends with when one reaches
    :func:`cptrace_otel.cli.main` (which prints its message, never a traceback); the message holds no secret.
    Anything else escaping a command is a bug (exit 3 with "internal error")."""

    exit_code: int = EXIT_UNREACHABLE
