"""The traced process's side: what runs inside SGLang (or any process that calls ``cptrace_otel.cptrace``).

* :mod:`.api`: the gate and the public functions (``cptrace``, ``rng``, ``khash`` ...), re-exported by the package;
* :mod:`.pipeline`: the bounded buffer, its drainer and the exporter it feeds (a subprocess or a thread);
* :mod:`.channels`, :mod:`.records`: how records travel to the exporter; :mod:`.lifecycle`: exit and fork hooks;
* :mod:`.ranks`, :mod:`.sampling`: the process's CP rank and run id, the per-node sampling decision;
* :mod:`.sglang_shim`: the ``CPTRACE_SGLANG`` alias of ``sglang.srt.mem_cache.cp_hicache_trace``.

Imports only :mod:`cptrace_otel.model` and the standard library at import time (the exporter is loaded when the
first enabled record starts the pipeline).
"""
