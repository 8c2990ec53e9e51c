"""The Mamba component of sglang 0.5.23's hybrid trees (``UnifiedRadixCache`` with the FULL and MAMBA components:
Qwen3-Next, Qwen3.5 GDN, Kimi-Linear, Nemotron-H, Falcon-H1, Granite-4.0-H style models): the ``mamba`` records of
its host round trips and the sites that make them (:data:`MAMBA_SITES23`).

What a node's Mamba component holds (``components/mamba.py``; docs/rules.md "Mamba trees" cites the lines): its
``value`` is one slot of the Mamba state pool (every Mamba layer's conv and SSM state after the node's last token),
its ``host_value`` one slot of the ``MambaPoolHost``. A backup copies the node's device slot into a new host slot;
a load-back copies the host slot into a new device slot for the node and, copy-on-write, into the request's own
slot (which the request's forward then advances: that copy is not fingerprinted, the node's is, from the same host
slot in the same op). A split leaves the new parent with no state on either tier: only nodes that end a cached
sequence have one. So a round trip is compared by content, per host slot: the state a backup wrote there is what a
later load of that slot must bring back, whatever device slots either side used. The FULL KV is recorded as for a
FULL-only tree (:mod:`._sites23`, the full-attention pool of the ``HybridLinearKVPool``).

Records (level 2, tag ``mamba``): ``dir=d2h`` when a backup's Mamba transfer is committed (the copy queued: ``op``
is its id, the node's ``backup`` op), ``dir=h2d`` at the ``ack dir=h2d`` of a load-back that restored the node's
state (its ``op``). Both carry ``node_id``, ``hostx`` and ``devx`` (the host slot and the node's device slot),
``page=1`` (one state per slot) and ``h``, ``nz``, ``hp`` of the state bytes of that device slot (every Mamba
layer's temporal (SSM) state, then each conv state, then the side states the host pool carries with them), read
when the backup was queued (what its copy reads: the node is pinned) and after the load completed; ``h2d`` adds
``cow``, how many request slots the load also filled. Rule ``MAMBA-hash`` (``checks.rules_mamba``) compares them
per host slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..api import cptrace
from ._state import exact_runs
from ._swa23 import ComponentBook, commit_site

if TYPE_CHECKING:
    from torch import Tensor

    from ._state import State
    from ._types import MambaPoolHost, PoolTransfer, RadixCache, TreeNode

MAMBA_COMP = "sglang.srt.mem_cache.unified_cache.components.mamba"
MAMBA = 2         # ComponentType.MAMBA


def mamba_host_pool(cache: RadixCache) -> MambaPoolHost | None:
    """The cache's ``MambaPoolHost`` (its host pool group's ``PoolName.MAMBA`` entry); None without one."""
    entries = getattr(cache.cache_controller.mem_pool_host, "entry_map", {})
    return next((e.host_pool for name, e in entries.items() if getattr(name, "value", name) == "mamba"), None)


def state_rows(hp: MambaPoolHost, slots: Tensor) -> Tensor:
    """``[slots, bytes]`` uint8: the Mamba state of each device slot, as the host pool copies it: every layer's
    temporal (SSM) state, then each conv state's layers, then the side states (``slot_state_device_tensors``)."""
    import torch

    tensors = [*hp.temporal_device_layers, *(t for layers in hp.conv_device_layers for t in layers),
               *hp.slot_state_device_tensors]
    idx = slots.reshape(-1).to(torch.long)
    return torch.cat([t[idx.to(t.device)].contiguous().view(torch.uint8).reshape(len(idx), -1) for t in tensors
                      if t.numel()], dim=1)


class MambaBook(ComponentBook):
    """The Mamba side of one traced hybrid cache: its host pool (which names the device state tensors) and the
    Mamba loads waiting for their ack (``(op, host slot, the node's device slot, request slots filled)``)."""

    def __init__(self, cache: RadixCache) -> None:
        super().__init__(cache)
        self.host = cast("MambaPoolHost", mamba_host_pool(cache))   # (untraceable() refuses a tree without one)

    def record(self, st: State, dir: str, op: int, node_id: int, host: Tensor, dev: Tensor, **extra: int) -> None:
        """One ``mamba`` record: the state at device slot ``dev`` as it is now, copied from or to host slot
        ``host``."""
        cptrace(2, "mamba", dir=dir, op=op, node_id=int(node_id), hostx=exact_runs(host), devx=exact_runs(dev),
                page=1, **extra, **st.fp_rows(state_rows(self.host, dev)))

    def backup(self, st: State, node: TreeNode, xfers: list[PoolTransfer]) -> None:
        """A backup's Mamba transfer committed (the copy queued, not run: the state hashed is the one it reads)."""
        xfer = xfers[0]
        if xfer.host_indices is None or xfer.device_indices is None or not len(xfer.host_indices):
            return
        op = self.cache.cache_controller.write_queue[-1]
        self.record(st, "d2h", op.id, node.id, xfer.host_indices, xfer.device_indices)

    def load(self, node: TreeNode, xfers: list[PoolTransfer]) -> None:
        """A load-back's Mamba transfers committed: the first restores the node's slot (SGLang's commit takes it as
        the node's value), the others fill request slots copy-on-write; remembered until the load's ack."""
        first = xfers[0]
        if first.host_indices is None or first.device_indices is None or not len(first.device_indices):
            return
        op = self.cache.cache_controller.load_queue[-1]
        self.loads.setdefault(node.id, []).append((op.id, first.host_indices.clone(), first.device_indices.clone(),
                                                   len(xfers) - 1))

    def acked(self, st: State, node_id: int, load: tuple) -> None:
        """The state the acked load restored into its node's slot."""
        op, host, dev, cow = load
        self.record(st, "h2d", op, node_id, host, dev, cow=cow)


# (module, "Class.method", wrapper): the Mamba component's sites
MAMBA_SITES23: list[tuple[str, str, Any]] = [
    (MAMBA_COMP, "MambaComponent.commit_hicache_transfer", commit_site("mamba")),
]
