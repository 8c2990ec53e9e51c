"""The traced process's side: what runs inside SGLang (or any process that calls ``cptrace_otel.cptrace``).

* :mod:`.api`: the gate and the public functions (``cptrace``, ``rng``, ``khash`` ...), re-exported by the package;
* :mod:`.pipeline`: the bounded buffer, its drainer and the exporter it feeds (a subprocess or a thread);
* :mod:`.channels`: the traced process's end of the pipe to the exporter; :mod:`.lifecycle`: exit, signal and fork
  hooks;
* :mod:`.ranks`: the process's CP rank and the run id all ranks agree on;
* :mod:`.sglang_shim`: the ``CPTRACE_SGLANG`` alias of ``sglang.srt.mem_cache.cp_hicache_trace``.

The record rendering and the sampling decision it shares with the exporter and the checks live in
:mod:`cptrace_otel.model`. Imports only :mod:`cptrace_otel.model` and the standard library at import time (the
exporter is loaded when the first enabled record starts the pipeline; fingerprints when a tensor is fingerprinted).
"""
