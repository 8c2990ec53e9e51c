"""The Protocols of ``cptrace_otel.traced.sglang._types`` (the SGLang surface the instrumentation reads) against the
real SGLang 0.5.20 and 0.5.23 classes they stand for (the wheels in .sglang/<version>/, :mod:`types_probe`).

Every member a Protocol declares exists on its SGLang class in both versions, except the members only one version
has (:data:`ONLY`, as each Protocol's comments say): a member SGLang renamed or dropped, or one the Protocol names
wrongly, fails here; so does a member listed as one version's that the other version has after all.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.sglang_real import runtime

pytestmark = pytest.mark.sglang

# protocol -> the members only that version's SGLang class has (read only through that version's code)
ONLY = {
    "0.5.20": {
        "TreeNode": ["value", "host_value", "lock_ref", "host_ref_counter"],   # 0.5.23: per component
        "RadixCache": ["is_eagle", "kv_cache", "token_to_kv_pool_host", "evictable_host_leaves",
                       "_clamp_prefetch_result"],
    },
    "0.5.23": {
        "TreeNode": ["component_data"],
        "RadixCache": ["tree_core", "tree_components", "linker", "sidecar_pool_specs"],
        "CacheController": ["transfer_layer_id_max"],   # the layer-wise load-back
        "PrefetchOperation": ["handle"],   # the key of 0.5.23's ongoing_prefetch
    },
}


@pytest.mark.parametrize("version", runtime.VERSIONS)
def test_protocol_members_exist_in_sglang(version: str) -> None:
    runtime.need(version)
    p = subprocess.run(runtime.module_cmd("types_probe", version), env=runtime.sglang_env(version),
                       capture_output=True, text=True, timeout=300, cwd=runtime.ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    missing = json.loads(p.stdout.strip().splitlines()[-1])
    other = next(v for v in runtime.VERSIONS if v != version)
    assert {k: v for k, v in missing.items() if v} == ONLY[other]
