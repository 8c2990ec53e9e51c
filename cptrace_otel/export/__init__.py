"""Export side of the pipeline (runs in the exporter worker, never on the traced thread).

* :mod:`.protocol`: the traced process <-> worker messages and their framing (the one module both sides import).
* :mod:`.worker`: the worker loop (in its own process, :mod:`.worker_process`, or a thread): compact items
  -> events -> spans (:mod:`cptrace_otel.model.spans`) -> sinks.
* :mod:`.sinks`: the sink and transport protocols, a transport's :class:`~.sinks.SendResult`, the network sink;
  :mod:`.stack`: :func:`~.stack.open_sinks`, the one builder of the sinks (worker and ``ingest``).
* :mod:`.otlp_proto`, :mod:`.otlp_json`: OTLP protobuf and OTLP/JSON encoding of spans, requests split below
  3.5 MiB.
* :mod:`.otlp_http`, :mod:`.otlp_grpc`: transports; :mod:`.spool`: delivery thread, disk spool and replay across
  backend outages.
* :mod:`.file_sinks`: OTLP JSON-lines file sink (Collector file-exporter format) and upstream log-lines sink.

Nothing here is imported by ``import cptrace_otel``.
"""
