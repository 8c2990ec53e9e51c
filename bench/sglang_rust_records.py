"""Which of 0.5.23's records the sites write, and write right, over the Rust tree core
(``CPTRACE_SGLANG_TREE_CORE=rust``: the records written at the core's Python boundary, ``traced/sglang/_rust23``),
against the Python core's.

    python3 -m bench.sglang_rust_records [--requests 150] [--seed 3] [--policy write_back] [--dev-tokens 256]
        [--host-ratio 1.5]

Runs tests/sglang_real/rust_driver.py twice, the same request stream at level 2 with exact sets: on the Python core
(the reference: every record), and on the Rust core traced at its boundary. Both under the torch the Rust
core loads with (``.sglang/torch-2.14``). The two cores make the same cache decisions here (the driver checks the
same loads and host copies), but number their nodes differently, so per record tag (and tier, direction, kind or
pool) the table gives the count on each core and how many of the Rust core's records equal the Python core's (in
order, or per request where records name one) once node ids are left out; a record whose fields differ otherwise is
written wrong. The records whose sites raised are counted per site (``skipped``), and ``cptrace-otel check`` of
each run says its findings, how many nodes it checked and what it could not check. Needs deploy/sglang/install.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

from tests.sglang_real import runtime

IDS = ("node_id", "nodes", "new_id", "chain", "pub", "parent")   # fields that name nodes (numbered per core)
ONE_CORE = """
import json
from tests.sglang_real import rust_driver
from cptrace_otel.traced.sglang import _state
r = rust_driver.run({out!r}, exact=True, **json.loads({kw!r}))
print(json.dumps({{"core": r["stats"]["tree_core"], "corruption": len(r["corruption"]), "log": r["log"],
                  "skipped": dict(_state.failures)}}))
"""


def one_core(core: str, out: str, kw: dict) -> dict:
    env = runtime.sglang_env("0.5.23", rust=True, SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=core,
                             CPTRACE_SGLANG_TREE_CORE=core)
    code = ONE_CORE.format(out=out, kw=json.dumps(kw))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                       cwd=runtime.ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"the {core} core's run failed: {p.stderr[-3000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def records(log: str) -> dict[str, list[dict]]:
    """The log's records by ``tag [tier|dir|kind|pool]``, node ids left out, in order."""
    from cptrace_otel.model.logline import parse_line

    out: dict[str, list[dict]] = collections.defaultdict(list)
    with open(log, encoding="utf-8") as f:
        for line in f:
            pl = parse_line(line)
            if pl is None:
                continue
            sub = next((str(pl.fields[k]) for k in ("tier", "dir", "kind", "pool") if k in pl.fields), "")
            out[f"{pl.tag} {sub}".strip()].append({k: repr(v) for k, v in pl.fields.items() if k not in IDS})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--policy", default="write_back")
    p.add_argument("--dev-tokens", type=int, default=256)
    p.add_argument("--host-ratio", type=float, default=1.5)
    a = p.parse_args(argv)
    why = runtime.missing_reason("0.5.23", rust=True)
    if why:
        print(why, file=sys.stderr)
        return 2
    kw = dict(requests=a.requests, seed=a.seed, policy=a.policy, dev_tokens=a.dev_tokens, host_ratio=a.host_ratio)
    with tempfile.TemporaryDirectory(prefix="sglang-rust-records-") as out:
        runs = {c: one_core(c, os.path.join(out, c), kw) for c in ("python", "rust")}
        recs = {c: records(r["log"]) for c, r in runs.items()}
        chk = {c: runtime.check_json([r["log"]]) for c, r in runs.items()}
    print(f"sglang 0.5.23, {a.policy}, {a.requests} requests, seed {a.seed}: "
          + ", ".join(f"{c} core {r['core']} (driver's corruption {r['corruption']})" for c, r in runs.items()))
    print(f"  {'record':20s} {'python':>7s} {'rust':>7s} {'equal':>7s}  (in order or per rid, ids left out)")
    for k in sorted(set(recs["python"]) | set(recs["rust"])):
        py, ru = recs["python"].get(k, []), recs["rust"].get(k, [])
        if all("rid" in x for x in py + ru):   # per request (a record missing on one core shifts the order)
            by_rid = {x["rid"]: x for x in py}
            equal = sum(by_rid.get(y["rid"]) == y for y in ru)
        else:
            equal = sum(x == y for x, y in zip(py, ru, strict=False))
        print(f"  {k:20s} {len(py):7d} {len(ru):7d} {equal:7d}")
    print(f"  skipped on the rust core (the site raised): {runs['rust']['skipped']}")
    for c, res in chk.items():
        skipped = {u["rule"]: u["count"] for u in res["unchecked"]}
        print(f"  check of the {c} run: {len(res['findings'])} findings, {res['stats']['nodes']} nodes checked, "
              f"not checked: {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
