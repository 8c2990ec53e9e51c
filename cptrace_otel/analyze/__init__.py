"""The offline analyzer: event sources (``sources/``: upstream log files, OTLP JSON-lines files), the per-rank
rules of :mod:`cptrace_otel.checks` plus the cross-rank rules C1-C5 (:mod:`.crossrank`), combined by
:class:`.engine.Analysis`, rendered by :mod:`.report`, and the ``cptrace-otel check`` command (:mod:`.check_cmd`).

Programmatic use::

    from cptrace_otel.analyze.engine import Analysis
    from cptrace_otel.analyze.sources.logs import read_log_events
    res = Analysis(level=None).run(read_log_events(["rank0.log", "rank1.log"]))
    res.findings, res.unchecked, res.stats
"""
