"""Four rank processes started by ``torch.multiprocessing.spawn`` with a gloo process group on CPU, each driving the
simulator's stream of its rank (``cptrace_otel.sim.rank_main.build``) through the public API. The rank is never
given to cptrace_otel: no ``CPTRACE_*_RANK``, and the ``config`` record's ``cp_rank`` is left out, so the exporter
must take it from ``torch.distributed``. Nor is the run id given: the ranks agree on one through the process group's
store. Each rank writes ``rank<r>.json``: its torch rank, the run id and rank cptrace_otel settled on, the records
it emitted per tag, and whether the flush delivered everything.

``python torchdist_main.py OUT_DIR PORT MODE FAULTS``
"""

from __future__ import annotations

import collections
import json
import os
import sys

WORLD = 4


def worker(rank: int, out: str, port: int, mode: str, faults: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    import cptrace_otel
    from cptrace_otel.sim.rank_main import build
    from cptrace_otel.sim.tracer import ApiEmitter

    counts: collections.Counter = collections.Counter()

    class Emitter(ApiEmitter):
        def emit(self, r: int, level: int, tag: str, /, **fields):   # type: ignore[override]
            if r == self.rank and level <= self.level:
                counts[tag] += 1
                fields.pop("cp_rank", None)   # the rank must come from torch.distributed
            super().emit(r, level, tag, **fields)

    build(mode, WORLD, "wt", 2, 7, faults, Emitter(dist.get_rank(), 2))
    ok = cptrace_otel.flush(60.0)
    cfg = cptrace_otel.get_config()
    cptrace_otel.shutdown(10.0)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"torch_rank": dist.get_rank(), "run_id": cfg.run_id, "flushed": ok, "counts": counts}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    out, port, mode, faults = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    mp.spawn(worker, args=(out, port, mode, faults), nprocs=WORLD, join=True)
