"""Event sources for the analyzer: upstream log files (:mod:`.logs`) and OTLP JSON-lines files (:mod:`.otlpfile`).

Every source yields :class:`cptrace_otel.events.Event` objects, per rank in seq order."""
