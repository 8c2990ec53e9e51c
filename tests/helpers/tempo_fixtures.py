"""A fake Grafana Tempo query frontend, answering in Tempo's documented formats (written here from the API docs;
no Tempo code or data): ``GET /api/search?q=&start=&end=&limit=&spss=`` -> ``{"traces": [{"traceID",
"rootServiceName", "rootTraceName", "startTimeUnixNano", "durationMs", "spanSets": [{"spans": [{"spanID",
"startTimeUnixNano", "durationNanos", "attributes"}], "matched"}]}], "metrics": {...}}`` (start/end in unix seconds,
only the TraceQL ``{ resource.cptrace.run_id = "ID" }`` understood); ``GET /api/traces/<id>`` -> ``{"batches":
[ResourceSpans]}`` with base64 span and trace ids (protobuf JSON of bytes), spans in another order.
"""

from __future__ import annotations

import base64
import json
import random
import re
from typing import Any

from tests.helpers.jaeger_fixtures import JsonServer, traces_of

_Q = re.compile(r'^\{ resource\.cptrace\.run_id = "((?:[^"\\]|\\.)*)" \}$')


def _b64(hexid: str) -> str:
    return base64.b64encode(bytes.fromhex(hexid)).decode()


class FakeTempo(JsonServer):
    def __init__(self, reqs: list[dict], seed: int = 0) -> None:
        rnd = random.Random(seed)
        self.traces: dict[str, list[tuple[dict, dict]]] = traces_of(reqs)
        for items in self.traces.values():
            rnd.shuffle(items)
        self.queries: list[dict[str, list[str]]] = []
        self._serve()

    def route(self, path: str, q: dict[str, list[str]], headers: Any) -> tuple[int, Any]:
        if path == "/api/search":
            self.queries.append(q)
            return self.search(q)
        if path.startswith("/api/traces/"):
            return self.trace(path.rsplit("/", 1)[1])
        return 404, {"error": "not found"}

    def search(self, q: dict[str, list[str]]) -> tuple[int, dict]:
        m = _Q.match(q.get("q", [""])[0])
        if not m:
            return 400, {"error": f"unsupported TraceQL in this fake: {q.get('q')}"}
        run_id = m.group(1).replace('\\"', '"').replace("\\\\", "\\")
        start, end = int(q["start"][0]) * 10**9, int(q["end"][0]) * 10**9
        limit = int(q.get("limit", ["20"])[0])
        out = []
        for tid, items in self.traces.items():
            runs = {a["value"].get("stringValue") for res, _ in items for a in res.get("attributes", [])
                    if a["key"] == "cptrace.run_id"}
            starts = [int(sp["startTimeUnixNano"]) for _, sp in items]
            if run_id not in runs or not any(start <= s <= end for s in starts):
                continue
            first = min(items, key=lambda it: int(it[1]["startTimeUnixNano"]))[1]
            out.append({"traceID": tid, "rootServiceName": "sglang-hicache", "rootTraceName": first["name"],
                        "startTimeUnixNano": str(min(starts)),
                        "durationMs": (max(int(sp["endTimeUnixNano"]) for _, sp in items) - min(starts)) // 10**6,
                        "spanSets": [{"spans": [{"spanID": first["spanId"],
                                                 "startTimeUnixNano": first["startTimeUnixNano"],
                                                 "durationNanos": "0", "attributes": []}], "matched": len(items)}]})
        random.Random(len(self.queries)).shuffle(out)   # "first N" of a parallel search: no order
        return 200, {"traces": out[:limit], "metrics": {"inspectedTraces": len(self.traces), "completedJobs": 1,
                                                         "totalJobs": 1}}

    def trace(self, tid: str) -> tuple[int, dict]:
        items = self.traces.get(tid)
        if items is None:
            return 404, {"error": "trace not found"}
        batches: dict[str, tuple[dict, list]] = {}
        for res, sp in items:
            b = batches.setdefault(json.dumps(res, sort_keys=True), (res, []))
            b[1].append(dict(sp, traceId=_b64(sp["traceId"]), spanId=_b64(sp["spanId"])))
        return 200, {"batches": [{"resource": res, "scopeSpans": [{"scope": {"name": "cptrace_otel"}, "spans": spans}]}
                                 for res, spans in batches.values()]}
