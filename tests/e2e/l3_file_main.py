"""The L3 simulator (cptrace_otel.sim.l3_tier) over stock SGLang's ``file`` storage backend: every page is written to,
looked up in and read back from real files by SGLang's own ``HiCacheFile`` (run by tests/e2e/test_l3_sglang_file.py with
``.sglang/<version>`` on PYTHONPATH; never imported by the test process).

    python tests/e2e/l3_file_main.py MODE RANKS SEED FAULT|- DIR

writes the ranks' logs to DIR/logs/rank<r>.log and the oracle (expected rule names, the fault's rank, the storage
files written) to DIR/oracle.json. Each rank has its own ``HiCacheFile`` over DIR/store, configured as SGLang
configures it for that rank (``attn_cp_rank``/``attn_cp_size`` in mode sharded, so it suffixes keys with
``_cp<r>_<size>``); fault ``same_keys`` gives every rank the configuration of CP rank 0 of 1 (a backend that does not
tell ranks apart), fault ``flip`` flips a bit in the stored file.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

from cptrace_otel.sim.l3_tier import L3Sim


class FileStorage:
    """:class:`cptrace_otel.sim.l3_tier.MemoryStorage`'s methods over one ``HiCacheFile`` per rank in ``root``."""

    def __init__(self, ranks: int, per_rank: bool, root: str, shape: tuple[int, ...]) -> None:
        os.makedirs(root, exist_ok=True)
        self.root, self.shape = root, shape
        self.backends = [HiCacheFile(HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=r if per_rank else 0,
            attn_cp_size=ranks if per_rank else 1, is_mla_model=False, enable_storage_metrics=False,
            is_page_first_layout=False, model_name="m"), file_path=root) for r in range(ranks)]

    def key(self, r: int, page_hash: str) -> str:
        return self.backends[r]._get_suffixed_key(page_hash)   # the file's name: what storage calls the object

    def exists(self, r: int, page_hash: str) -> bool:
        return self.backends[r].exists(page_hash)

    def set(self, r: int, page_hash: str, page: np.ndarray) -> None:
        assert self.backends[r].batch_set([page_hash], [torch.from_numpy(np.ascontiguousarray(page))])

    def get(self, r: int, page_hash: str) -> np.ndarray:
        out = torch.empty(int(np.prod(self.shape)), dtype=torch.uint8)
        (got,) = self.backends[r].batch_get([page_hash], [out])
        assert got is not None, page_hash
        return got.numpy().reshape(self.shape)

    def corrupt(self, r: int, page_hash: str) -> None:
        with open(os.path.join(self.root, f"{self.key(r, page_hash)}.bin"), "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([b[0] ^ 0x40]))


def main() -> int:
    mode, ranks, seed, fault, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    page_size, layers, width = 4, 2, 4
    store = os.path.join(out, "store")
    sim = L3Sim(mode, ranks, seed, None if fault == "-" else fault, page_size=page_size, layers=layers, width=width,
                storage=lambda n, per_rank: FileStorage(n, per_rank, store, (page_size, layers, width)))
    expected = sim.run(40)
    sim.emitter.write(os.path.join(out, "logs"))
    files = sorted(f for f in os.listdir(store) if f.endswith(".bin"))
    with open(os.path.join(out, "oracle.json"), "w", encoding="utf-8") as f:
        json.dump({"expected": sorted(expected), "fault_rank": sim.fault_rank, "files": files}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
