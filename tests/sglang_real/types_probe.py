"""Which members of the Protocols of ``cptrace_otel.traced.sglang._types`` (the SGLang surface the instrumentation
reads) the real SGLang classes lack: run in a process whose ``sys.path`` has ``.sglang/<version>/``
(``runtime.sglang_env``); prints ``{protocol: [missing member, ...]}`` as JSON.

A member counts as present on a class when the class has it (a method, property, class attribute, ``NamedTuple`` or
dataclass field, an annotation in its body) or one of its classes in the MRO assigns ``self.<member>`` in its source
(an instance attribute). A Protocol stands for several SGLang classes where the instrumentation reads several
(the MHA and MLA pools): a member is missing when every one of them lacks it.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
import sys

# protocol -> the SGLang classes it stands for, per version ("module:Class", modules under sglang.srt)
COMMON = {
    "RadixKey": ["mem_cache.radix_cache:RadixKey"],
    "LayerDoneCounter": ["managers.cache_controller:LayerDoneCounter"],
    "LayerLoadingEvent": ["managers.cache_controller:LayerLoadingEvent"],
    "IndexKeyCache": ["mem_cache.index_key_cache:IndexKeyCache"],
    "KVPool": ["mem_cache.memory_pool:MHATokenToKVPool", "mem_cache.memory_pool:MLATokenToKVPool",
               "mem_cache.memory_pool:DSATokenToKVPool"],
    "HostKVCache": ["mem_cache.pool_host.mha:MHATokenToKVPoolHost", "mem_cache.pool_host.mla:MLATokenToKVPoolHost"],
    "Allocator": ["mem_cache.allocator.token:TokenToKVPoolAllocator"],
    "CacheOperation": ["managers.cache_controller:CacheOperation"],
    "LoadAck": ["managers.cache_controller:HiCacheAck"],
    "Request": ["managers.schedule_batch:Req"],
    "CacheParams": ["mem_cache.base_prefix_cache:MatchPrefixParams"],
}
CLASSES = {
    "0.5.20": {
        **COMMON,
        "TreeNode": ["mem_cache.radix_cache:TreeNode"],
        "CacheController": ["managers.cache_controller:HiCacheController"],
        "RadixCache": ["mem_cache.hiradix_cache:HiRadixCache"],
        "MatchResult": ["mem_cache.base_prefix_cache:MatchResult"],
        "StorageOperation": ["managers.cache_controller:StorageOperation"],
        "PrefetchOperation": ["managers.cache_controller:PrefetchOperation"],
    },
    "0.5.23": {
        **COMMON,
        "TreeNode": ["mem_cache.unified_cache.unified_tree_core:UnifiedTreeNode"],
        "ComponentData": ["mem_cache.unified_cache.components.base:ComponentData"],
        "TreeCore": ["mem_cache.unified_cache.unified_tree_core:UnifiedTreeCore"],
        "SidecarPool": ["mem_cache.memory_pool:DSATokenToKVPool"],
        "SwaKVPool": ["mem_cache.swa_memory_pool:SWAKVPool"],
        "MambaPoolHost": ["mem_cache.pool_host.mamba:MambaPoolHost"],
        "PoolName": ["mem_cache.hicache_storage:PoolName"],
        "PoolEntry": ["mem_cache.pool_host.group:PoolEntry"],
        "HostPoolGroup": ["mem_cache.pool_host.group:HostPoolGroup"],
        "SidecarSpec": ["mem_cache.hicache_storage:SidecarPoolSpec"],
        "PoolTransfer": ["mem_cache.hicache_storage:PoolTransfer"],
        "CacheController": ["mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController"],
        "TreeComponent": ["mem_cache.unified_cache.component_type:ComponentType"],
        "RadixCache": ["mem_cache.unified_radix_cache:UnifiedRadixCache"],
        "MatchResult23": ["mem_cache.base_prefix_cache:MatchResult"],
        # (HybridCacheController's own operations)
        "StorageOperation": ["mem_cache.hybrid_cache.hybrid_cache_controller:StorageOperation"],
        "PrefetchOperation": ["mem_cache.hybrid_cache.hybrid_cache_controller:PrefetchOperation"],
    },
}
KEPT_DUNDERS = ("__len__", "__getitem__", "__int__")
OURS = ("_cptrace_sg",)   # set by the instrumentation, not SGLang's


def members(proto: type) -> list[str]:
    """The attributes and methods a Protocol of ``_types`` declares (with its ``_types`` bases')."""
    out: list[str] = []
    for c in reversed(proto.__mro__):
        if c.__module__ != proto.__module__:
            continue
        for name in inspect.get_annotations(c):
            out.append(name)
        for name, v in c.__dict__.items():
            if inspect.isfunction(v) and (not name.startswith("__") or name in KEPT_DUNDERS):
                out.append(name)
    return [m for m in dict.fromkeys(out) if m not in OURS]


def has(cls: type, name: str) -> bool:
    if issubclass(cls, enum.Enum) and len(cls):   # (value, name: on the members, not the class)
        return hasattr(next(iter(cls)), name)
    if hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {}):
        return True
    assign = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=(?!=)|\bself\.{re.escape(name)}\s*,[^=\n]*=(?!=)")
    for c in cls.__mro__:
        if name in inspect.get_annotations(c):
            return True
        try:
            src = inspect.getsource(c)
        except (OSError, TypeError):
            continue
        if assign.search(src):
            return True
    return False


def main(version: str) -> int:
    from cptrace_otel.traced.sglang import _types

    missing: dict[str, list[str]] = {}
    for proto_name, specs in CLASSES[version].items():
        classes = []
        for spec in specs:
            mod, name = spec.split(":")
            classes.append(getattr(importlib.import_module("sglang.srt." + mod), name))
        proto = getattr(_types, proto_name)
        missing[proto_name] = [m for m in members(proto) if not any(has(c, m) for c in classes)]
    print(json.dumps(missing, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
