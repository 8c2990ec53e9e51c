"""Jaeger's answers, written from its documented formats, built from a run's OTLP JSON-lines files, plus a fake
Jaeger query service (``/api/traces`` search and ``/api/services``) with the memory store's search semantics.

Formats (Jaeger v1.76 / v2.13):
* api_v3 ``GET /api/v3/traces``: ``{"result": {"resourceSpans": [...]}}``, OTLP/JSON with hex ids, several traces
  merged into one TracesData; Jaeger groups spans by trace, so the order of spans and events is its own.
* api_v2 ``GET /api/traces``: ``{"data": [trace], "total", "limit", "offset", "errors"}``; a trace is ``{traceID,
  spans, processes: {pN: {serviceName, tags}}, warnings}``; a span ``{traceID, spanID, operationName, references,
  startTime (µs), duration (µs), tags: [{key, type, value}], logs: [{timestamp (µs), fields}], processID,
  warnings}``; an event's name is the log field ``event``; resource ``service.name`` is ``serviceName``; scope and
  kind become tags ``otel.scope.name``/``otel.scope.version``/``span.kind``.
* Seen from the real v1.76 (raw=true): log fields after ``event`` sorted by key, logs of a span newest first.
* The memory store's search walks traces newest-first (by first arrival) until ``limit`` match; tags are AND-ed,
  each matched on one span (span tag, process tag or log field) as strings; ``start``/``end`` (µs, inclusive) bound
  a span's start time, on the same span; ``limit`` above ``max_traces`` is refused.
"""

from __future__ import annotations

import json
import random
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def read_requests(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        with open(p) as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return out


def _value(v: dict) -> Any:
    for k in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if k in v:
            return int(v[k]) if k == "intValue" else v[k]
    return None


def _tag(key: str, v: Any) -> dict:
    t = {bool: "bool", int: "int64", float: "float64"}.get(type(v), "string")
    return {"key": key, "type": t, "value": v}


def traces_of(reqs: list[dict]) -> dict[str, list[tuple[dict, dict]]]:
    """trace id -> [(resource, span)] in arrival order."""
    out: dict[str, list] = {}
    for req in reqs:
        for rs in req["resourceSpans"]:
            for ss in rs.get("scopeSpans", []):
                for sp in ss.get("spans", []):
                    out.setdefault(sp["traceId"], []).append((rs["resource"], sp))
    return out


def to_v3(reqs: list[dict], seed: int = 0) -> dict:
    """One api_v3 answer holding every trace: spans grouped by trace, spans and events in another order."""
    rnd = random.Random(seed)
    rss = []
    for _tid, items in traces_of(reqs).items():
        items = list(items)
        rnd.shuffle(items)
        for res, sp in items:
            sp = dict(sp, events=list(sp.get("events", [])))
            rnd.shuffle(sp["events"])
            rss.append({"resource": res, "scopeSpans": [{"scope": {"name": "cptrace_otel"}, "spans": [sp]}]})
    return {"result": {"resourceSpans": rss}}


def v2_traces(reqs: list[dict], seed: int = 0, service: str | None = None) -> list[dict]:
    """Jaeger-model traces (``data`` of /api/traces), in first-arrival order, logs in another order."""
    rnd = random.Random(seed)
    out = []
    for tid, items in traces_of(reqs).items():
        procs: dict[str, dict] = {}
        keys: dict[str, str] = {}
        spans = []
        for res, sp in items:
            attrs = [(a["key"], _value(a["value"])) for a in res.get("attributes", [])]
            key = json.dumps(attrs)
            if key not in keys:
                keys[key] = f"p{len(keys) + 1}"
                d = dict(attrs)
                procs[keys[key]] = {"serviceName": service or d.get("service.name", ""),
                                    "tags": [_tag(k, v) for k, v in attrs if k != "service.name"]}
            # as Jaeger v1.76 answers even with raw=true: the event name first, then the fields sorted by key
            logs = [{"timestamp": int(e["timeUnixNano"]) // 1000,
                     "fields": [{"key": "event", "type": "string", "value": e["name"]}]
                     + sorted((_tag(a["key"], _value(a["value"])) for a in e.get("attributes", [])),
                              key=lambda t: t["key"])}
                    for e in sp.get("events", [])]
            rnd.shuffle(logs)
            start = int(sp["startTimeUnixNano"]) // 1000
            spans.append({"traceID": tid, "spanID": sp["spanId"], "operationName": sp["name"], "references": [],
                          "startTime": start, "duration": max(0, int(sp["endTimeUnixNano"]) // 1000 - start),
                          "tags": [_tag(a["key"], _value(a["value"])) for a in sp.get("attributes", [])]
                          + [_tag("otel.scope.name", "cptrace_otel"), _tag("span.kind", "internal")],
                          "logs": logs, "processID": keys[key], "warnings": None})
        out.append({"traceID": tid, "spans": spans, "processes": procs, "warnings": None})
    return out


def to_v2(reqs: list[dict], seed: int = 0, service: str | None = None) -> dict:
    return {"data": v2_traces(reqs, seed, service), "total": 0, "limit": 0, "offset": 0, "errors": None}


class JsonServer:
    """A JSON-over-HTTP fake on a free loopback port (the base of the fake Jaeger and the fake Tempo): subclasses
    answer ``route(path, query, headers) -> (status, body)``; ``url`` is its base URL."""

    def _serve(self) -> None:
        route = self.route

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                u = urllib.parse.urlsplit(self.path)
                code, obj = route(u.path, urllib.parse.parse_qs(u.query), self.headers)
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, path: str, q: dict[str, list[str]], headers: Any) -> tuple[int, Any]:
        raise NotImplementedError

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


class FakeJaeger(JsonServer):
    """A query service over ``traces`` (Jaeger-model, oldest first) on a free loopback port; ``queries`` lists the
    parsed query strings of every search; ``max_traces`` bounds ``limit`` as the memory store does."""

    def __init__(self, traces: list[dict], max_traces: int = 100_000, user: str | None = None) -> None:
        self.traces = traces
        self.max_traces = max_traces
        self.queries: list[dict[str, list[str]]] = []
        self.auth: list[str | None] = []
        self._serve()

    def route(self, path: str, q: dict[str, list[str]], headers: Any) -> tuple[int, Any]:
        self.auth.append(headers.get("Authorization"))
        if path == "/api/services":
            return 200, {"data": sorted({p["serviceName"] for t in self.traces for p in t["processes"].values()})}
        if path == "/api/traces":
            self.queries.append(q)
            return self.search(q)
        return 404, {"errors": [{"code": 404, "msg": "not found"}]}

    def search(self, q: dict[str, list[str]]) -> tuple[int, dict]:
        limit = int(q.get("limit", ["100"])[0])
        if not 0 < limit <= self.max_traces:
            return 500, {"data": None, "errors": [{"code": 500, "msg": "search depth must be greater than 0 and "
                                                                      "less than max traces"}]}
        service = q["service"][0]
        tags = json.loads(q["tags"][0]) if "tags" in q else {}
        lo = int(q["start"][0]) if "start" in q else None
        hi = int(q["end"][0]) if "end" in q else None
        found = []
        for tr in reversed(self.traces):   # newest first
            if any(self._span_matches(tr, sp, service, tags, lo, hi) for sp in tr["spans"]):
                found.append(tr)
                if len(found) >= limit:
                    break
        return 200, {"data": found, "total": len(found), "limit": 0, "offset": 0, "errors": None}

    @staticmethod
    def _span_matches(tr: dict, sp: dict, service: str, tags: dict, lo: int | None, hi: int | None) -> bool:
        proc = tr["processes"][sp["processID"]]
        if proc["serviceName"] != service:
            return False
        if (lo is not None and sp["startTime"] < lo) or (hi is not None and sp["startTime"] > hi):
            return False
        kv = [(t["key"], str(t["value"])) for t in sp["tags"] + proc["tags"]]
        kv += [(f["key"], str(f["value"])) for lg in sp["logs"] for f in lg["fields"]]
        return all((k, str(v)) in kv for k, v in tags.items())
