"""SGLang 0.5.23's kv-canary over real HiCache load-backs, on CPU: ``driver.Driver23``'s scheduler steps with the
canary's own stamp and verify code (``sglang.kernels.ops.kv_canary``: its byte-equal torch references, the path
SGLang itself takes on a device that is not CUDA, ``_dispatch.use_torch_reference``) on canary buffers attached to
the device KV pool by SGLang's own MHA attacher (``pool_patcher.adapters.mha.attach_mha``).

What the forward does for the canary (``CanaryManager``'s HEAD launches, K half): before a request's extend it
verifies every prefix slot (its stamp's position, and its chain hash against the predecessor slot's stamp), then it
stamps the new tokens' slots, the chain seeded by the last prefix slot (real-KV hashing and the token check off:
``--kv-canary-real-data none``, no token oracle). The driver's KV check sees the device KV of
the same prefixes; load-backs are SGLang's own (``init_load_back`` into fresh device slots).

``run_canary(version, out, **kw)``: one :func:`driver.run` with that canary; the summary adds ``canary``:
``verified`` slots, ``violations`` (each ``{slot, position, reason, loaded}``: ``reason`` SGLang's ``FailReason``
bits, ``loaded`` when a load-back filled the slot and no forward stamped it since), ``loaded_slots_verified`` (the
slots verified right after the load-back that filled them).
"""

from __future__ import annotations

import sys
from typing import Any

from tests.sglang_real import driver

RING = 1 << 16


class CanaryDriver23(driver.Driver23):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        import torch
        from sglang.kernels.ops.kv_canary.consts import VIOLATION_FIELDS, RealKvHashMode
        from sglang.kernels.ops.kv_canary.verify import CanaryLaunchTag, VerifyOrWriteContext
        from sglang.srt.kv_canary.pool_patcher.adapters.mha import attach_mha

        (group,) = attach_mha(pool=self.kv, device=torch.device("cpu"), read_bytes=0,
                              kv_token_id_vs_position_offset=0)
        ring = torch.zeros(RING, VIOLATION_FIELDS, dtype=torch.int64)
        idx = torch.zeros(1, dtype=torch.int32)

        def ctx(tag: Any) -> Any:
            return VerifyOrWriteContext(canary_buf=group.k_head, kernel_kind=tag, violation_ring=ring,
                                        violation_write_index=idx, slot_run_counter=torch.zeros(1, dtype=torch.int64),
                                        kernel_run_counter=torch.zeros(1, dtype=torch.int64), real_kv_sources=(),
                                        real_kv_hash_mode=RealKvHashMode.NONE,
                                        enable_chain_position_assert=torch.ones(1, dtype=torch.int32))

        self.ctx = ctx(CanaryLaunchTag.HEAD_K_FULL)
        self.ring, self.ring_idx = ring, idx
        # SGLang's own reporter (mode log) logs each violation; the instrumentation's handler on its logger turns
        # each into a kv_canary record of the trace, as with CPTRACE_SGLANG=1
        from types import SimpleNamespace

        from sglang.srt.kv_canary.config import CanaryMode
        from sglang.srt.kv_canary.runner.violation_reporter import ViolationReporter

        from cptrace_otel.traced import canary_hook

        canary_hook.install()
        self.reporter = ViolationReporter(
            config=SimpleNamespace(mode=CanaryMode.LOG),   # (the reporter reads its mode only)
            device_state=SimpleNamespace(violation_log=SimpleNamespace(violation_ring=ring,
                                                                       violation_write_index=idx)))
        self.canary = {"verified": 0, "loaded_slots_verified": 0, "violations": []}
        self._seed = -1
        self._reloaded: set[int] = set()   # device slots a load-back filled, not stamped since
        orig = self.cache.init_load_back

        def init_load_back(params: Any) -> Any:
            res = orig(params)
            n = res[0] if isinstance(res, tuple) else 0
            if n:
                params.req.loaded_tokens = getattr(params.req, "loaded_tokens", 0) + int(n)
            return res

        self.cache.init_load_back = init_load_back

    def check_prefix(self, req: Any) -> None:
        """The forward's HEAD verify of the prefix slots, then the driver's own KV check."""
        import torch
        from sglang.kernels.ops.kv_canary.verify import VerifyPlan
        from sglang.kernels.ops.kv_canary.verify_ref import launch_canary_verify_kernel_torch_reference

        slots = [int(x) for x in req.prefix_idx.tolist()]
        loaded = getattr(req, "loaded_tokens", 0)
        req.loaded_tokens = 0
        self._seed = slots[-1] if slots else -1
        if slots:
            n = len(slots)
            plan = VerifyPlan.allocate(verify_capacity=n, device=torch.device("cpu"))
            plan.verify_slot_indices.copy_(torch.tensor(slots))
            plan.verify_expected_tokens.fill_(-1)
            plan.verify_expected_positions.copy_(torch.arange(n))
            plan.verify_prev_slot_indices.copy_(torch.tensor([-1, *slots[:-1]]))
            plan.verify_num_valid.fill_(n)
            before = int(self.ring_idx[0])
            launch_canary_verify_kernel_torch_reference(context=self.ctx, plan=plan,
                                                        check_verify_expected_token=False)
            self.canary["verified"] += n
            self._reloaded.update(slots[n - loaded:])
            self.canary["loaded_slots_verified"] += loaded
            by_slot = {s: i for i, s in enumerate(slots)}
            self.reporter.log_or_raise_violation(outer_step_counter=self.copies.step)
            for row in self.ring[before:int(self.ring_idx[0])].tolist():
                self.canary["violations"].append({"slot": row[1], "position": by_slot.get(row[1], -1),
                                                  "reason": row[7], "loaded": row[1] in self._reloaded})
        super().check_prefix(req)

    def store(self, idx: Any, tokens: list[int], start: int) -> None:
        """The forward's KV write, then its HEAD stamp of the new tokens' slots (seeded by the last prefix slot)."""
        import torch
        from sglang.kernels.ops.kv_canary.write import WritePlan
        from sglang.kernels.ops.kv_canary.write_ref import launch_canary_write_kernel_torch_reference

        super().store(idx, tokens, start)
        self._reloaded.difference_update(int(x) for x in idx.tolist())
        n = len(idx)
        if n == 0:
            return
        plan = WritePlan.allocate(write_req_capacity=1, device=torch.device("cpu"))
        plan.write_offsets.copy_(torch.tensor([0, n]))
        plan.write_seed_slot_indices.fill_(self._seed)
        plan.write_num_valid_reqs.fill_(1)
        launch_canary_write_kernel_torch_reference(
            context=self.ctx, plan=plan, input_ids=torch.tensor(tokens[start:], dtype=torch.int64),
            positions=torch.arange(start, start + n, dtype=torch.int64),
            out_cache_loc=idx.to(torch.int64), enable_write_input_assert=False, expected_input_tokens=None,
            expected_input_positions=None)
        self._seed = -1


def run_canary(version: str, out: str, l3_store: str | None = None, **kw: Any) -> dict:
    """One :func:`driver.run` with the canary (``l3_store``: unused, the CLI's)."""
    box: dict = {}

    def make(*a: Any, **k: Any) -> CanaryDriver23:
        d = box["d"] = CanaryDriver23(*a, **k)
        return d

    res = driver.run(version, out, make_driver=make, **kw)
    res["canary"] = box["d"].canary
    return res


if __name__ == "__main__":
    from tests.sglang_real import l3_driver

    sys.exit(l3_driver.main(run=run_canary, versions=("0.5.23",), doc=__doc__))
