"""The offline analyzer: event sources (``sources/``: upstream log files, OTLP JSON-lines files), the rules of
:mod:`cptrace_otel.checks` (per-rank H1-H4, ZERO, HASH and cross-rank C1-C5) combined by :class:`.engine.Analysis`,
rendered by :mod:`.report_html`, and the ``cptrace-otel check`` command (:mod:`cptrace_otel.commands.check`).

Programmatic use::

    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.analyze.sources.logs import read_log_events
    res = Analysis(level=None).run(read_log_events(["rank0.log", "rank1.log"]))
    res.findings, res.unchecked, res.stats
"""
