"""Exit codes shared by every command (``cptrace-otel check``, ``report``, ``demo``, ``ingest``, ...).

0 clean, 1 findings, 2 usage (bad arguments, or input that cannot be taken as given), 3 a source or backend that
cannot be read or reached (the path or URL is printed, never a traceback), 4 (``check``) no finding, but the
cross-rank rules were not run because some streams have an unknown rank (findings still exit 1)."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_UNREADABLE: Final = EXIT_UNREACHABLE   # the same code, named for file sources
EXIT_INCOMPLETE: Final = 4
