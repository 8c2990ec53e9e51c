"""One SGLang scheduler's log with kv-canary violations, made by stock SGLang's own code (run by
tests/e2e/test_canary_sglang.py with ``.sglang/<version>`` on PYTHONPATH; never imported by the test process).

    python tests/e2e/canary_sglang_main.py MODE OUT

MODE ``log``: SGLang's ``configure_logger`` (its prefix ``[date time ATTN_CP1 TP1] ``) on standard error, HiCache
trace lines logged as the upstream ``cp_hicache_trace`` logs them, then SGLang's ``ViolationReporter`` in mode log
over a real ``ViolationLog`` holding three violations (slot 101 of node 7, slot 999 of no node, a sliding-window
slot). MODE ``raise``: the same in mode raise; the ``RuntimeError`` is reported as SGLang's scheduler reports an
exception (``Scheduler hit an exception: <traceback>``). MODE ``live``: the same violations in mode log with the
kv-canary hook installed and the trace records sent through ``cptrace_otel``'s live pipeline to the OTLP file OUT.
"""

from __future__ import annotations

import logging
import sys
import traceback
from types import SimpleNamespace

import torch
from sglang.kernels.ops.kv_canary.consts import FailReason
from sglang.kernels.ops.kv_canary.verify import CanaryLaunchTag
from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode
from sglang.srt.kv_canary.runner import violation_reporter
from sglang.srt.kv_canary.state import ViolationLog
from sglang.srt.utils.common import configure_logger

from cptrace_otel.model.logline import render_line

ROWS = [  # kernel_kind, slot_idx, position, stored_token, expected_token, stored_chain_hash, expected_aux, fail bits
    (CanaryLaunchTag.HEAD_K_FULL, 101, 1, 11, 0, 0x1111, 0x2222,
     FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_REAL_KV_HASH_MISMATCH),
    (CanaryLaunchTag.TAIL_V_FULL, 999, 5, 12, 0, 0x3333, 0x4444, FailReason.VERIFY_POSITION_MISMATCH),
    (CanaryLaunchTag.HEAD_K_SWA, 102, 2, 13, 0, 0x5555, 0x6666, FailReason.VERIFY_CHAIN_HASH_MISMATCH),
]
RECORDS = [
    ("insert", {"node_id": 7, "parent": 0, "len": 4, "dev": "(cnt=4,min=100,max=103,first=100,last=103)",
                "devx": "100-103", "kind": "new", "rank": 1}),
    ("insert", {"node_id": 8, "parent": 7, "len": 4, "dev": "(cnt=4,min=200,max=203,first=200,last=203)",
                "devx": "200-203", "kind": "new", "rank": 1}),
]


def reporter(mode: CanaryMode) -> violation_reporter.ViolationReporter:
    vlog = ViolationLog.allocate(ring_capacity=8, device=torch.device("cpu"))
    for i, (kind, *vals, bits) in enumerate(ROWS):
        vlog.violation_ring[i] = torch.tensor([int(kind), *vals, int(bits)], dtype=torch.int64)
    vlog.violation_write_index[0] = len(ROWS)
    config = CanaryConfig(mode=mode, ring_capacity=8, sweep_interval=0, real_kv_hash_mode=0,
                          enable_write_input_assert=False, enable_verify_token_assert=False,
                          stats_print_every_n_steps=0)
    # the reporter reads only the device state's violation log (the kernels' output ring)
    return violation_reporter.ViolationReporter(config=config, device_state=SimpleNamespace(violation_log=vlog))


def main() -> int:
    mode, out = sys.argv[1], sys.argv[2]
    configure_logger(SimpleNamespace(log_level="info"), prefix=" ATTN_CP1 TP1")
    sched = logging.getLogger("sglang.srt.managers.scheduler")
    if mode == "live":
        from cptrace_otel.traced import api, canary_hook

        assert violation_reporter.logger.name == canary_hook.REPORTER_LOGGER, violation_reporter.logger.name
        api.configure(level=1, run_id="sglang-canary", cp_rank=1, exporter="thread", file=out, spool_dir=out + ".spool")
        canary_hook.install()
        for tag, f in RECORDS:
            api.cptrace(1, tag, **f)
        reporter(CanaryMode.LOG).log_or_raise_violation(outer_step_counter=3)
        ok = api.flush(30)
        api.shutdown(10)
        return 0 if ok else 1
    trace_log = logging.getLogger("sglang.srt.mem_cache.cp_hicache_trace")
    for tag, f in RECORDS:
        trace_log.info(render_line(tag, f))
    if mode == "log":
        reporter(CanaryMode.LOG).log_or_raise_violation(outer_step_counter=3)
    else:
        try:
            reporter(CanaryMode.RAISE).log_or_raise_violation(outer_step_counter=3)
        except RuntimeError:
            sched.error(f"Scheduler hit an exception: {traceback.format_exc()}")
    sched.info("Prefill batch. #new-seq: 1, #new-token: 4, #cached-token: 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
