"""SGLang's kv-canary violations, live: a logging handler that turns each violation SGLang logs into a ``kv_canary``
record of this process's trace (:mod:`cptrace_otel.model.canary`), so the exporter's online check (rule CANARY)
stamps it on the node that held the slot and ``watch`` sees it in the backend, without reading log files.

SGLang's ``ViolationReporter`` (``--kv-canary`` in mode ``log``) logs every violation as one WARNING of the logger
:data:`REPORTER_LOGGER` (``logging.getLogger(__name__)`` of ``sglang/srt/kv_canary/runner/violation_reporter.py``),
whose first line is the ``kv_canary violation: ...`` summary. :func:`install` adds :class:`CanaryHandler` to that
logger (idempotent; the logger's other handlers and propagation are untouched). In mode ``raise`` SGLang raises
instead of logging: those violations reach the server log through the scheduler's error report and are read from
the log files by ``check`` and ``ingest``.

The handler never raises and never blocks beyond :func:`cptrace_otel.traced.api.cptrace` (a gate, a timestamp and
an append): a violation it cannot parse is left to the log.
"""

from __future__ import annotations

import logging

from ..model.canary import MARKER, TAG, parse_canary_line

REPORTER_LOGGER = "sglang.srt.kv_canary.runner.violation_reporter"


class CanaryHandler(logging.Handler):
    """Each ``kv_canary violation:`` line of a log record becomes one ``kv_canary`` record (level 1)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if MARKER not in msg:
                return
            from . import api

            for line in msg.splitlines():
                p = parse_canary_line(line)
                if p is not None:
                    api.cptrace(1, TAG, **p[1])
        except Exception:   # tracing must never break the traced process's logging
            pass

    def handleError(self, record: logging.LogRecord) -> None:  # pragma: no cover - emit catches everything
        pass


def install(logger_name: str = REPORTER_LOGGER) -> CanaryHandler:
    """Attach a :class:`CanaryHandler` to ``logger_name`` (once: the one already there is returned)."""
    lg = logging.getLogger(logger_name)
    for h in lg.handlers:
        if isinstance(h, CanaryHandler):
            return h
    h = CanaryHandler()
    lg.addHandler(h)   # (the logger's level is left alone: SGLang's --log-level above warning silences both)
    return h


def uninstall(logger_name: str = REPORTER_LOGGER) -> None:
    """Remove the handlers :func:`install` added."""
    lg = logging.getLogger(logger_name)
    for h in [h for h in lg.handlers if isinstance(h, CanaryHandler)]:
        lg.removeHandler(h)
