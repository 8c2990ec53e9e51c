"""Event sources for the analyzer: upstream log files (:mod:`.logs`), OTLP JSON-lines files (:mod:`.otlpfile`),
Jaeger JSON exports and OTLP/JSON documents (:mod:`.tracedocs`), a Jaeger query service (:mod:`.jaeger`,
:mod:`.jaegerquery`); :mod:`.detect` tells files by content, :mod:`.overlap` finds a run given twice.

Every source yields :class:`cptrace_otel.model.events.Event` objects, per rank in seq order."""
