"""What the request links cost at a ``rid_map`` site: the capture of SGLang's request span
(``request_fields``) and the way-back event (``note_node``) on SGLang's own request context, with SGLang's request
tracing on (its ``process_tracing_init``; the scheduler's copy of a request context, rebuilt from the pickled
tokenizer-side time stats as SGLang's processes hand it on) and off (``TraceNullContext``).

    PYTHONPATH=$PWD:$PWD/.sglang/0.5.20 python3 bench/reqlink_capture.py [--n 20000]

Prints the best of 5 repeats per call, in microseconds. The OTLP endpoint is a closed local port: nothing is sent
during the measurement (SGLang's batch processor exports later, in its own thread).
"""

from __future__ import annotations

import argparse
import os
import pickle
import timeit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000)
    n = p.parse_args().n
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    from sglang.srt.observability import trace as sgtrace
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats, SchedulerReqTimeStats

    from cptrace_otel.traced.sglang._reqlink import note_node, request_fields

    sgtrace.process_tracing_init("http://127.0.0.1:9/v1/traces", "sglang", trace_modules="request")
    sgtrace.trace_set_thread_info("Scheduler", tp_rank=0)
    api = APIServerReqTimeStats()
    api.init_trace_ctx("r1", None)
    api.set_created_time()

    class Req:
        def __init__(self, ts: object) -> None:
            self.time_stats = ts

    on = Req(SchedulerReqTimeStats.new_from_obj(pickle.loads(pickle.dumps(api))))
    off = Req(SchedulerReqTimeStats())
    assert request_fields(on) and not request_fields(off)
    for name, fn in [("request_fields, SGLang traces the request", lambda: request_fields(on)),
                     ("request_fields, SGLang tracing off", lambda: request_fields(off)),
                     ("note_node, SGLang traces the request", lambda: note_node(on, 5, "dev")),
                     ("note_node, SGLang tracing off", lambda: note_node(off, 5, "dev"))]:
        best = min(timeit.repeat(fn, number=n, repeat=5)) / n
        print(f"{name}: {best * 1e6:.2f} us")
        on.time_stats.trace_ctx.events_cache.clear()


if __name__ == "__main__":
    main()
