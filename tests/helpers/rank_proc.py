"""One traced rank process for the integration tests (run as ``python tests/helpers/rank_proc.py SPEC.json``).

Configuration comes from the environment exactly as in production (``CPTRACE_*``, ``OTEL_EXPORTER_OTLP_*``), set by
the test. SPEC is a JSON object:

* ``records``: ``[[level, tag, {field: value}], ...]`` emitted in order through ``cptrace_otel.cptrace``;
* ``pace_s``: sleep between records (default 0), ``batch``: records per sleep (default 1);
* ``go_file``: if set, wait for this file to exist before emitting (so several ranks start together);
* ``progress_file``: if set, the number of records emitted so far is written there every batch;
* ``flush_timeout_s``: how long to wait for delivery at the end (default 60).

Prints one JSON object on stdout: ``emitted`` = ``[[tag, fields, t_before_ns, t_after_ns], ...]`` (wall clock around
each call, to check exported timestamps), ``flushed`` (the flush result), ``flush_s``, ``pid``.
Diagnostics of the pipeline (outage reports) go to stderr, which the test reads.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    import cptrace_otel as ct

    go = spec.get("go_file")
    if go:
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
    pace = float(spec.get("pace_s", 0))
    batch = int(spec.get("batch", 1))
    progress = spec.get("progress_file")
    emitted = []
    for i, (level, tag, fields) in enumerate(spec["records"]):
        t0 = time.time_ns()
        ct.cptrace(level, tag, **fields)
        emitted.append([tag, fields, t0, time.time_ns()])
        if (i + 1) % batch == 0:
            if progress:
                with open(progress + ".tmp", "w") as pf:
                    pf.write(str(i + 1))
                os.replace(progress + ".tmp", progress)
            if pace:
                time.sleep(pace)
    t = time.monotonic()
    flushed = ct.flush(timeout_s=float(spec.get("flush_timeout_s", 60)))
    flush_s = time.monotonic() - t
    ct.shutdown(timeout_s=10)
    json.dump({"emitted": emitted, "flushed": flushed, "flush_s": flush_s, "pid": os.getpid()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
