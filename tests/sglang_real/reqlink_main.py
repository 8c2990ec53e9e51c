"""SGLang's own request tracing and the instrumented HiCache in one process (run by test_reqlink_real.py with
``.sglang/<version>`` on PYTHONPATH):

    python -m tests.sglang_real.reqlink_main VERSION OTLP_URL MODE [RUN_ID]   (from the repository root)

SGLang's tracing is set up by SGLang's ``process_tracing_init`` (opentelemetry-sdk, its ``BatchSpanProcessor`` and
OTLP/HTTP exporter, ``--trace-modules request``), and cptrace-otel exports to the same OTLP receiver. Each request
goes the way SGLang's processes hand it on: the tokenizer's ``APIServerReqTimeStats`` starts the request span
(``set_created_time``) and is pickled to the scheduler, which builds a real ``Req`` (``SchedulerReqTimeStats.
new_from_obj`` rebuilds the context there) and marks its stages (wait queue, forward, prefill done, completion);
the tokenizer then finishes the request span.

MODE ``cache`` (sglang 0.5.20, the instrumented HiRadixCache): the scheduler's cache calls run through the
driver's ``Driver.admit``/``finish`` (``match_prefix`` records ``rid_map`` at its real site). MODE ``capture`` (a
version the instrumentation does not cover yet, 0.5.23): no cache; the record is made by calling the capture helpers
the sites call, with that version's real request objects, so its tracing module is what is tested.

Prints one JSON line: the rids and the run id.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import tempfile

from tests.sglang_real import runtime

RUN_ID = "reqlink-real"
PROMPTS = [[11, 12, 13, 14, 15, 16, 17, 18], [11, 12, 13, 14, 21, 22], [11, 12, 13, 14, 15, 16, 17, 18, 31, 32],
           [41, 42, 43, 44], [11, 12, 13, 14, 15, 16, 17, 18, 51]]


def main(version: str, url: str, mode: str, run_id: str = RUN_ID) -> None:
    runtime.use_sglang(version)
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    from array import array

    from opentelemetry import trace
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.observability import trace as sgtrace
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats
    from sglang.srt.sampling.sampling_params import SamplingParams

    import cptrace_otel

    sgtrace.process_tracing_init(url, "sglang", trace_modules="request")
    sgtrace.trace_set_thread_info("Scheduler", tp_rank=0)
    cptrace_otel.configure(level=1, endpoint=url, exporter="thread", cp_rank=0, run_id=run_id, checks=False)

    def new_request(rid: str, tokens: list[int]) -> tuple[object, object]:
        api = APIServerReqTimeStats()
        api.init_trace_ctx(rid, None)
        assert api.trace_ctx.tracing_enable, "SGLang's request tracing is not on"
        api.set_created_time()
        api.set_tokenize_finish_time()
        api.set_api_server_dispatch_time()
        wire = pickle.dumps(api)           # what the tokenizer sends the scheduler
        api.set_api_server_dispatch_finish_time()
        req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=1), time_stats=pickle.loads(wire))
        req.tokens = tokens                # (what the driver reads)
        req.time_stats.set_wait_queue_entry_time()
        return api, req

    def done(api: object, req: object) -> None:
        ts = req.time_stats
        ts.set_forward_entry_time()
        ts.set_prefill_finished_time()
        ts.set_completion_time()
        api.set_finished_time()

    rids = [f"req{i}" for i in range(len(PROMPTS))]
    if mode == "cache":
        from cptrace_otel.traced.sglang import SGLangInstrumentor
        from tests.sglang_real import driver

        SGLangInstrumentor().instrument()
        cp, tp = driver._init_group(1, 0, tempfile.mktemp(prefix="cptrace-gloo-"))
        if version == "0.5.23":
            cache, kv, alloc = driver.build23("write_through", 1, 256, 3.0, cp, tp)
        else:
            cache, kv, alloc = driver.build(version, "write_through", 1, 256, 3.0, cp, tp)
        copies = runtime.Copies(1, 1)
        copies.install()
        drv = (driver.Driver23 if version == "0.5.23" else driver.Driver)(cache, kv, alloc, copies, 0, 1)
        # one request per step: each later one matches the earlier ones' nodes
        for rid, toks in zip(rids, PROMPTS, strict=False):
            api, req = new_request(rid, toks)
            copies.tick()
            cache.check_hicache_events()
            (admitted,) = drv.admit([req])
            drv.finish(admitted)
            done(api, req)
        drv.settle()
    else:
        from cptrace_otel.traced.sglang._reqlink import note_node, request_fields

        for i, (rid, toks) in enumerate(zip(rids, PROMPTS, strict=False)):
            api, req = new_request(rid, toks)
            node = 100 + (i % 2)
            cptrace_otel.cptrace(1, "rid_map", rid=rid, node_id=node, hit="dev", **request_fields(req))
            note_node(req, node, "dev")
            done(api, req)
    trace.get_tracer_provider().force_flush(30_000)
    cptrace_otel.flush(60)
    cptrace_otel.shutdown(60)
    print(json.dumps({"rids": rids, "run_id": run_id}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
