"""Prove that two checkouts behave the same: ``check`` output and OTLP bytes compared byte for byte.

    python bench/same_behaviour.py --baseline 73354a77 [--out DIR] [--lines 20000] [--only SUBSTR] [--no-demo]
    python bench/same_behaviour.py --baseline-tree ../other-checkout

The baseline is a detached ``git worktree`` of ``merge-base(REV, HEAD)`` (``--exact``: REV itself) in a temporary
directory, or an existing tree (``--baseline-tree``); the current tree is this script's checkout (``--current``).
Both get their C extensions built in place and must load them (see ``_trees.py``). Every scenario runs once per
tree, each run in a fresh subprocess with ``PYTHONPATH`` = that tree, ``CPTRACE_REQUIRE_SPEEDUPS=1``, ``TZ=UTC``,
``PYTHONHASHSEED=0``, the same working directory path and the same input files, then everything the run produced
is compared byte for byte: exit status, stdout, stderr, every file it wrote, every OTLP/HTTP request body it sent.
One line per scenario: ``same`` or ``DIFFERS: <artifact> line N col C`` with both sides around the first difference.
Exit status 1 on any difference or failed scenario, 0 when everything is the same.

Inputs (generated once, shared by both trees): ``bench/check_throughput.generate`` (seed 7, ``--lines`` lines over 2
ranks); every file under ``tests/fixtures``; demo runs (``cptrace-otel demo``, run in the BASELINE tree, logs and
OTLP files) for a few (mode, policy, faults) triples.

Scenarios:

* ``check`` (``python -m cptrace_otel.cli check --json --no-progress``, and a few without ``--json``): over the
  generated logs, each fixture alone, all fixtures together, each demo's logs, OTLP files and both;
* ``ingest`` (span building and both encoders, fully deterministic: log time, ``--run-id`` given): the generated
  logs to an OTLP JSON-lines file, the same to OTLP/HTTP (uncompressed protobuf bodies captured raw by a receiver in
  this process), again with a span timeout short enough to close spans by ``timeout``, all fixtures, each demo's logs;
* ``live`` (the public API end to end: gate, buffer, drainer, worker protocol, intake, span builder, online checks,
  encoders, sinks): a fixed record stream (the generated logs' and the fixtures' lines as string fields, then values
  of every Python type the API renders) fed to ``cptrace_otel.cptrace`` in a child; once with the exporter thread
  (``CPTRACE_EXPORTER=thread``) into an OTLP file and OTLP/HTTP with gzip, once with the exporter subprocess into an
  OTLP file, an upstream log file (the worker's Record path) and uncompressed OTLP/HTTP;
* ``sim``: the simulator's record stream (``sim.rank_main.build`` with the in-memory ``LogEmitter``) and its oracle
  for every demo configuration.

What is made fixed instead of normalised: the run id (``CPTRACE_RUN_ID``, ``--run-id``); the resource attributes
that name the process (``host.name``, ``process.pid``, ``service.instance.id``) through ``OTEL_RESOURCE_ATTRIBUTES``,
which the API applies last (the span ids hash the instance id, so they are fixed too); the record timestamps of the
live stream: the API stamps ``time.time_ns()``, so the child replaces ``time.time_ns`` before importing the package
with a clock that advances 1 us per call on the main thread (the caller, where records are stamped) and returns the
current value on every other thread (the exporter's expiry "now", never moving by itself), starting in 2096 so the
exporter subprocess's real clock never times a span out (the record ring, which stamps in C, is given the same
clock through ``traced.ring.stamp_clock``); OTLP/HTTP compression is ``none`` where raw bytes are
compared. The live stream is cut into segments, each ended by ``flush()`` (which closes the open spans at a
known point of the stream): 400 records each for the replayed lines, then one segment per special case (a span
closed by its event count, one by its byte size, spans closed by ``timeout`` across a 2 s jump of the clock).

What is normalised, and why, exactly:

* request and line cuts of the live scenarios: the exporter ends a request (and an OTLP file line) at each export,
  and it also exports on a 0.2 s timer, so where the cuts fall depends on the machine's speed. For these two
  scenarios the compared form is the exact bytes of every resource, scope and span, in order, with the request
  envelope around them dropped (a resource or scope is written when it differs from the one before). ``ingest``
  never exports on a timer: its requests and file lines are compared whole;
* the gzip header of the OTLP/HTTP bodies in the gzip run (it holds the compression time): bodies are
  decompressed before they are compared.

Nothing else. Paths are the same in both runs (one scratch directory, cleared before each run; the spool directory
lives outside it, since its name holds the exporter's pid); the HTTP receiver's port, which ``ingest`` prints, is
the same for both trees (one receiver for the whole comparison).

Not covered: OTLP/gRPC bytes (the receiver gets a decoded message), deferred (CUDA) fingerprints, Jaeger.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _trees import add_tree_args, tree_env, trees  # noqa: E402  (stdlib only: the children load it too)

# (name, mode, policy, level, faults) of the demo runs whose files are checked; ranks 2, seed 1.
DEMOS = [
    ("sharded-c1c3hash", "sharded", "wt", 2, "C1_div,C3_writer,HASH_flip"),
    ("shared-none", "shared", "wt", 2, "none"),
    ("replicated-h2h4", "replicated", "wt", 2, "H2_stale,H4_nolock"),
    ("layersplit-zero", "layersplit", "wt", 2, "ZERO_nostore"),
    ("wb-noflush", "replicated", "wb", 2, "H4_wb_noflush"),
    ("replicated-l3", "replicated", "wt", 3, "H1_ack,HASH_flip"),
]
RUN_ID = "same-behaviour"
LIVE_CHUNK = 400
SHORT_SPAN_TIMEOUT_S = "0.000005"   # 5 us: the generated logs' records are 1 us apart, so spans close by timeout
# Level of each tag (docs/domain.md §3.2/§3.3), for the live stream's level argument; kept here, not imported, so the
# stream does not depend on the tree under test.
LEVEL_OF_TAG = {"config": 1, "reset": 1, "rid_map": 1, "insert": 1, "split": 1, "prepare": 1, "backup": 1,
                "evict": 1, "reload": 1, "ack": 2, "free": 2, "compose": 2, "store": 2, "fwd_hash": 3}


# == the receiver =====================================================================================================
class RawReceiver:
    """OTLP/HTTP receiver on 127.0.0.1 that keeps each request's path, headers that describe the body, and the body
    (gunzipped when ``Content-Encoding: gzip``: the gzip header holds a timestamp). Always answers 200."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str, bytes]] = []
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                enc = self.headers.get("Content-Encoding") or ""
                if enc == "gzip":
                    body = gzip.decompress(body)
                with rx.lock:
                    rx.requests.append((self.path, self.headers.get("Content-Type") or "", enc, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._srv.server_address[1]}/v1/traces"
        threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def take(self) -> list[tuple[str, str, str, bytes]]:
        with self.lock:
            out, self.requests = self.requests, []
        return out

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()


def _hexdump(body: bytes, width: int = 32) -> bytes:
    return b"".join(f"{i:08x} {body[i:i + width].hex()}\n".encode() for i in range(0, len(body), width))


# == request cuts ====================================================================================================
# The live exporter cuts its output into requests (and file lines) at each export, and it also exports on a 0.2 s
# timer, so where a cut falls depends on how fast the machine ran. For the live scenarios only, the compared form
# is the exact bytes of every resource, scope and span in order, without the request envelope around them: a
# resource or scope is written when it differs from the one before, then each span. (ingest exports every 20,000
# events, never on a timer: its requests and lines are compared whole.)

def _varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        if c < 0x80:
            return n, i
        shift += 7


def _pb_fields(b: bytes) -> Any:
    """``(field number, value bytes)`` of each field of one protobuf message, in wire order."""
    i = 0
    while i < len(b):
        tag, i = _varint(b, i)
        wt = tag & 7
        if wt == 0:
            j = _varint(b, i)[1]
        elif wt == 1:
            j = i + 8
        elif wt == 2:
            n, i = _varint(b, i)
            j = i + n
        elif wt == 5:
            j = i + 4
        else:
            raise ValueError(f"wire type {wt} at byte {i}")
        yield tag >> 3, b[i:j]
        i = j


def pb_parts(body: bytes) -> Any:
    """ExportTraceServiceRequest -> ``(name, bytes)``: resource_spans(1) { resource(1), scope_spans(2) { scope(1),
    spans(2) } }; any other field is kept under its number."""
    for f, v in _pb_fields(body):
        if f != 1:
            yield f"request.{f}", v
            continue
        for f2, v2 in _pb_fields(v):
            if f2 != 2:
                yield f"resource_spans.{f2}", v2
                continue
            for f3, v3 in _pb_fields(v2):
                yield ("span" if f3 == 2 else f"scope_spans.{f3}"), v3


_JSON_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")


def _json_end(s: str, i: int) -> int:
    """End of the JSON value that starts at ``s[i]`` (the C scanner finds it; the parsed value is not used)."""
    return _JSON_DECODER.raw_decode(s, i)[1]


def json_parts(s: str) -> list[tuple[str, str]]:
    """One OTLP/JSON request line -> ``(name, text)`` like :func:`pb_parts`, each part's text exactly as written.
    Containers are walked by index; only the parts themselves are scanned (once each)."""
    out: list[tuple[str, str]] = []

    def ws(j: int) -> int:
        return _WS.match(s, j).end()  # type: ignore[union-attr]

    def seq(i: int, close: str, item: Callable[[int], int]) -> int:
        j = ws(i + 1)
        while s[j] != close:
            j = ws(item(j))
            if s[j] == ",":
                j = ws(j + 1)
        return j + 1

    def obj(i: int, member: Callable[[str, int], int]) -> int:
        def one(j: int) -> int:
            k = _json_end(s, j)
            key = json.loads(s[j:k])
            j = ws(k)
            if s[j] != ":":
                raise ValueError(f"':' expected at {j}")
            return member(key, ws(j + 1))
        return seq(i, "}", one)

    def arr(i: int, item: Callable[[int], int]) -> int:
        return seq(i, "]", item)

    def part(name: str, j: int) -> int:
        k = _json_end(s, j)
        out.append((name, s[j:k]))
        return k

    def scope_spans(key: str, j: int) -> int:
        if key == "spans":
            return arr(j, lambda j: part("span", j))
        return part(f"scopeSpans.{key}", j)

    def resource_spans(key: str, j: int) -> int:
        if key == "scopeSpans":
            return arr(j, lambda j: obj(j, scope_spans))
        return part(f"resourceSpans.{key}", j)

    def request(key: str, j: int) -> int:
        if key == "resourceSpans":
            return arr(j, lambda j: obj(j, resource_spans))
        return part(f"request.{key}", j)

    obj(ws(0), request)
    return out


def without_cuts(parts: Any, show: Callable[[Any], bytes]) -> bytes:
    out: list[bytes] = []
    last: dict[str, Any] = {}
    for name, v in parts:
        if name == "span":
            out.append(b"span " + show(v))
            continue
        if last.get(name) != v:
            if name.startswith("resource"):   # a new resource: its scope is written again
                last = {k: x for k, x in last.items() if k.startswith("resource")}
            last[name] = v
            out.append(name.encode() + b" " + show(v))
    return b"".join(out)


def show_bytes(v: bytes) -> bytes:
    return f"({len(v)} bytes)\n".encode() + _hexdump(v)


def _show_text(v: str) -> bytes:
    return v.encode() + b"\n"


# == scenarios =======================================================================================================
class Scenario:
    """One comparison: ``argv`` run with ``python`` in a child of each tree (``{script}``, ``{url}`` and ``{run}``
    expand to this script, the receiver URL and the scratch directory)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None, cuts: bool = True) -> None:
        self.name, self.argv, self.env = name, argv, env or {}
        # exit statuses of a run that worked: the CLI exits 1 when it reports findings
        self.ok_rc = (0, 1) if argv[:2] == ["-m", "cptrace_otel.cli"] else (0,)
        self.cuts = cuts   # False: request and line cuts are run-dependent, compare without them


def _cli(*args: str) -> list[str]:
    return ["-m", "cptrace_otel.cli", *args]


def scenarios(inp: dict[str, Any], demo: bool) -> list[Scenario]:
    bench, fixtures, demos = inp["bench"], inp["fixtures"], inp["demos"] if demo else {}
    out: list[Scenario] = []
    chk = ("check", "--json", "--no-progress")
    out.append(Scenario("check --json: generated logs", _cli(*chk, *bench)))
    out.append(Scenario("check (text): generated logs", _cli("check", "--no-progress", *bench)))
    for name, path in fixtures:
        out.append(Scenario(f"check --json: fixture {name}", _cli(*chk, path)))
    allfx = [p for _, p in fixtures]
    out.append(Scenario("check --json: all fixtures", _cli(*chk, *allfx)))
    out.append(Scenario("check (text): all fixtures", _cli("check", "--no-progress", *allfx)))
    for name, d in demos.items():
        out.append(Scenario(f"check --json: demo {name} logs", _cli(*chk, *d["logs"])))
        out.append(Scenario(f"check --json: demo {name} otlp", _cli(*chk, *d["otlp"])))
        out.append(Scenario(f"check --json: demo {name} logs+otlp", _cli(*chk, *d["logs"], *d["otlp"])))
        out.append(Scenario(f"check (text): demo {name} logs+otlp", _cli("check", "--no-progress", *d["logs"],
                                                                          *d["otlp"])))
    ing = ("ingest", "--no-progress", "--run-id", RUN_ID)
    out.append(Scenario("ingest -> OTLP file: generated logs", _cli(*ing, "--file", "{run}/out.otlp.jsonl", *bench)))
    out.append(Scenario("ingest -> OTLP/HTTP (raw protobuf): generated logs",
                        _cli(*ing, "--endpoint", "{url}", *bench),
                        {"OTEL_EXPORTER_OTLP_COMPRESSION": "none", "CPTRACE_SPOOL_DIR": "{spool}"}))
    out.append(Scenario("ingest -> OTLP file, span timeout 5 us: generated logs",
                        _cli(*ing, "--file", "{run}/out.otlp.jsonl", *bench),
                        {"CPTRACE_SPAN_TIMEOUT_S": SHORT_SPAN_TIMEOUT_S}))
    for name, path in fixtures:   # one folder at a time: ingest refuses the folders' runs together (3 runs)
        out.append(Scenario(f"ingest -> OTLP file: fixture {name}", _cli(*ing, "--file", "{run}/out.otlp.jsonl",
                                                                          path)))
    for name, d in demos.items():
        out.append(Scenario(f"ingest -> OTLP file: demo {name} logs",
                            _cli(*ing, "--file", "{run}/out.otlp.jsonl", *d["logs"])))
    streams = [*bench, *allfx]
    live = {"CPTRACE_LEVEL": "3", "CPTRACE_RUN_ID": RUN_ID, "CPTRACE_CP_RANK": "0", "CPTRACE_TP_RANK": "1",
            "CPTRACE_DP_RANK": "2", "CPTRACE_SPOOL_DIR": "{spool}", "CPTRACE_FILE": "{run}/live.otlp.jsonl",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{url}",
            "OTEL_RESOURCE_ATTRIBUTES": "host.name=same-behaviour-host,process.pid=0,"
                                        "service.instance.id=same-behaviour:0"}
    out.append(Scenario("live API, exporter thread -> OTLP file + OTLP/HTTP (gzip)",
                        ["{script}", "--child", "live", *streams], {**live, "CPTRACE_EXPORTER": "thread"},
                        cuts=False))
    out.append(Scenario("live API, exporter process -> OTLP file + log file + OTLP/HTTP (raw)",
                        ["{script}", "--child", "live", *streams],
                        {**live, "CPTRACE_EXPORTER": "process", "CPTRACE_LOG_FILE": "{run}/live.log",
                         "OTEL_EXPORTER_OTLP_COMPRESSION": "none"}, cuts=False))
    if demo:
        specs = [f"{mode}:{policy}:{level}:{faults}" for _, mode, policy, level, faults in DEMOS]
        out.append(Scenario("sim record stream + oracle: demo configurations",
                            ["{script}", "--child", "sim", *specs]))
    return out


def run_one(sc: Scenario, tree: str, work: str, rx: RawReceiver) -> dict[str, bytes]:
    """Run ``sc`` in ``tree``; everything it produced, by artifact name."""
    run = os.path.join(work, "run")
    spool = os.path.join(work, "spool")
    for d in (run, spool):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    sub = {"{script}": os.path.abspath(__file__), "{url}": rx.url, "{run}": run, "{spool}": spool}

    def x(s: str) -> str:
        for k, v in sub.items():
            s = s.replace(k, v)
        return s

    env = tree_env(tree, **{k: x(v) for k, v in sc.env.items()})
    rx.take()
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, *map(x, sc.argv)], cwd=run, env=env, capture_output=True, timeout=900)
    arts: dict[str, bytes] = {"exit status": f"{r.returncode}\n".encode(), "stdout": r.stdout, "stderr": r.stderr}
    deadline = time.monotonic() + 5.0
    reqs = rx.take()
    while not reqs and "{url}" in " ".join(sc.argv + list(sc.env.values())) and time.monotonic() < deadline:
        time.sleep(0.05)   # the child waits for its acks, so this only guards against a slow handler thread
        reqs = rx.take()
    heads = [f"POST {path} content-type={ctype} content-encoding={enc or 'none'}" for path, ctype, enc, _ in reqs]
    if sc.cuts:
        for i, (head, (_, _, _, body)) in enumerate(zip(heads, reqs, strict=False)):
            arts[f"http request {i}"] = f"{head} bytes={len(body)}\n".encode() + _hexdump(body)
    elif reqs:
        arts["http requests (spans in order, request cuts removed)"] = "\n".join(sorted(set(heads))).encode() + \
            b"\n" + without_cuts((p for *_, body in reqs for p in pb_parts(body)), show_bytes)
    for dp, _, files in sorted(os.walk(run)):
        for f in sorted(files):
            p = os.path.join(dp, f)
            name = f"file {os.path.relpath(p, run)}"
            with open(p, "rb") as fh:
                data = fh.read()
            if not sc.cuts and f.endswith(".otlp.jsonl"):
                lines = data.decode("utf-8").splitlines()
                data = without_cuts((p for ln in lines for p in json_parts(ln)), _show_text)
                name += " (spans in order, line cuts removed)"
            arts[name] = data
    arts["_seconds"] = f"{time.monotonic() - t0:.2f}".encode()
    return arts


def first_difference(a: dict[str, bytes], b: dict[str, bytes]) -> str | None:
    """None when equal, else where the first difference is, with both sides around it."""
    names = [k for k in a if not k.startswith("_")]
    other = [k for k in b if not k.startswith("_")]
    if names != other:
        only_a = [k for k in names if k not in other]
        only_b = [k for k in other if k not in names]
        return f"artifacts differ: only in baseline {only_a[:5]}, only in current {only_b[:5]}"
    for k in names:
        x, y = a[k], b[k]
        if x == y:
            continue
        la, lb = x.split(b"\n"), y.split(b"\n")
        for i, (p, q) in enumerate(zip(la, lb, strict=False)):
            if p != q:
                col = next((j for j, (c, d) in enumerate(zip(p, q, strict=False)) if c != d), min(len(p), len(q)))
                lo = max(0, col - 60)
                return (f"{k} line {i + 1} col {col + 1}: baseline {p[lo:col + 80]!r} | "
                        f"current {q[lo:col + 80]!r}")
        return f"{k}: line count {len(la)} vs {len(lb)} (one is a prefix of the other)"
    return None


# == inputs ==========================================================================================================
def prepare_inputs(work: str, current: str, baseline: str, lines: int, demo: bool) -> dict[str, Any]:
    """Generate the shared inputs under ``work/inputs``: bench logs, fixture copies, demo runs (baseline tree)."""
    inp = os.path.join(work, "inputs")
    os.makedirs(inp, exist_ok=True)
    sys.path.insert(0, os.path.join(current, "bench"))
    from check_throughput import generate

    bench = generate(os.path.join(inp, "bench-rank{rank}.log"), lines // 2, 2, seed=7)
    fixtures = []
    fx_root = os.path.join(current, "tests", "fixtures")
    for dp, _, files in sorted(os.walk(fx_root)):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(dp, f), fx_root)
            dst = os.path.join(inp, "fixtures", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(dp, f), dst)
            fixtures.append((rel, dst))
    demos: dict[str, dict[str, list[str]]] = {}
    if demo:
        for name, mode, policy, level, faults in DEMOS:
            out = os.path.join(inp, f"demo-{name}")
            cmd = [sys.executable, "-m", "cptrace_otel.cli", "demo", "--mode", mode, "--policy", policy,
                   "--level", str(level), "--faults", faults, "--ranks", "2", "--seed", "1", "--out", out, "--json"]
            r = subprocess.run(cmd, cwd=inp, env=tree_env(baseline), capture_output=True, text=True, timeout=600)
            logs = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".log")) \
                if os.path.isdir(out) else []
            otlp = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".otlp.jsonl")) \
                if os.path.isdir(out) else []
            ok = (json.loads(r.stdout).get("ok") if r.stdout.strip().startswith("{") else None)
            print(f"  demo {name}: rc={r.returncode} ok={ok} ({len(logs)} logs, {len(otlp)} OTLP files)",
                  flush=True)
            if not logs or not otlp:
                raise SystemExit(f"demo {name} produced no files:\n{r.stderr[-2000:]}")
            demos[name] = {"logs": logs, "otlp": otlp}
    return {"bench": bench, "fixtures": fixtures, "demos": demos}


# == children (run with PYTHONPATH = the tree under test) ==========================================================
def _install_clock() -> Callable[[int], None]:
    """Replace ``time.time_ns`` (before the package is imported) by a clock that advances 1 us per call on the main
    thread and stands still on the others (see the module docstring); return its ``jump(ns)``."""
    import time as _time

    main = threading.main_thread()
    now = [4_000_000_000 * 10**9]
    current = threading.current_thread

    def time_ns() -> int:
        if current() is main:
            now[0] += 1000
        return now[0]

    def jump(ns: int) -> None:
        now[0] += ns

    _time.time_ns = time_ns
    return jump


class _Str:
    def __str__(self) -> str:
        return "custom object"


class _Bad:
    def __str__(self) -> str:
        raise ValueError("no text")

    __repr__ = __str__


JUMP = "jump"   # a stream item ``(JUMP, ns)``: the clock moves on by ns before the next record


def _typed_segments() -> list[list[tuple[Any, ...]]]:
    """Records with a value of every kind the API renders (and a few it must survive), and segments that close
    spans by ``limit`` (events, bytes) and by ``timeout``. Each segment ends with a flush."""
    big = "x" * 70_000
    vals: list[Any] = [0, -1, 7, 2**63 - 1, -(2**63), 2**64 + 5, 1.5, -0.0, 1e300, float("inf"), float("-inf"),
                       float("nan"), True, False, None, "", "a b c", " lead", "\u00fcn\u00efcode", big, "a b" * 40_000,
                       [1, 2, 3], [], [1, [2, 3]], (4, 5), ["a b", None, 1.25], {"k": 1}, _Str(), _Bad(), b"bytes",
                       "(cnt=3,min=1,max=3,first=1,last=3)", "(cnt=01,min=1,max=3,first=1,last=3)", "(none)", "(0)",
                       "(err:ValueError)", "[1,2,3]", "[01,2]", "[a,b]", "0x1f", "-0", "007", "1e5", "nan", "inf",
                       "k=v", "12abc", "-", "[", "]", "()", "(cnt=1)"]
    values: list[tuple[Any, ...]] = []
    for i, v in enumerate(vals):
        values.append((1, "backup", {"op": 900 + i, "node_id": 5000 + i % 7, "v": v, "ts": i}))
        values.append((2, "free", {"pool": "host", "idx": v, "node_id": 5000 + i % 7}))
    odd: list[tuple[Any, ...]] = [
        (1, "config", {"cp_size": 2, "cp_rank": 0, "mode": "replicated", "page_size": 16}),
        (1, "reset", {"why": "test"}),
        (1, "insert", {"node_id": 1, "parent": 0, "len": 16}),
        (1, "split", {"node_id": 1, "new_id": 2, "at": 8}),
        (3, "fwd_hash", {"rid": "r 1", "layer": 0, "stage": "attn", "h": 12345, "nz": 7, "rows": 3}),
        (1, "rid_map", {"rid": "r 1", "node_id": 1, "hit": "miss"}),
        (1, "prepare", {"node_id": 9, "op": 1, "rank": 1}),
        (1, "prepare", {"node_id": 9, "op": 2, "rank": "1"}),
        (1, "prepare", {"node_id": "9", "op": 3, "rank": -4}),
        (1, 12, {"node_id": 9}),
        (True, "ack", {"dir": "d2h", "op": 1, "node_id": 9}),
        (1, "unknown_tag", {"x": 1}),
        (1, "reset", {}),
        (2, "ack", {"dir": "h2d", "op": 4, "node_id": 10_000}),
    ]
    # one node's span past MAX_EVENTS (1,000 events), another's past MAX_SPAN_BYTES (1 MiB)
    by_count = [(2, "compose", {"key": f"L0:n77:{i}", "node_id": 77, "layer": 0, "gen": i, "hit": i % 2})
                for i in range(1200)]
    by_bytes = [(1, "backup", {"op": 7000, "node_id": 78, "blob": big}) for _ in range(20)]
    # spans open, then 2 s pass: the next record closes them by timeout. Only records that open a span of their own
    # come before the gap, so an expiry by the exporter's timer and one by the next record close the same spans.
    by_time: list[tuple[Any, ...]] = [(1, "insert", {"node_id": 800 + i, "parent": 0, "len": 16}) for i in range(6)]
    by_time += [(JUMP, 2 * 10**9), (1, "insert", {"node_id": 810, "parent": 0, "len": 16}),
                (1, "evict", {"tier": "dev", "node_id": 810, "kind": "backuped"})]
    return [values + odd, by_count, by_bytes, by_time]


def _log_records(paths: list[str]) -> list[tuple[Any, ...]]:
    """Upstream log lines as API calls: the ``k=v`` tokens as string fields (the exporter parses them as the log
    reader does), with this script's own minimal split, independent of the tree under test."""
    recs: list[tuple[Any, ...]] = []
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            for line in f:
                i = line.find("[CPTRACE ")
                if i < 0:
                    continue
                j = line.find("]", i)
                if j < 0:
                    continue
                tag = line[i + 9:j].strip()
                fields = {}
                for tok in line[j + 1:].split():
                    k, eq, v = tok.partition("=")
                    if eq and k and k not in ("level", "tag"):
                        fields[k] = v
                recs.append((LEVEL_OF_TAG.get(tag, 1), tag, fields))
    return recs


def child_live(paths: list[str]) -> int:
    jump = _install_clock()
    import time as _time

    import cptrace_otel as ct

    try:   # the record ring stamps in C: give it the same clock (a tree before stamp_clock stamps the real one)
        from cptrace_otel.traced.ring import stamp_clock
        stamp_clock(_time.time_ns)
    except ImportError:
        pass

    logs = _log_records(paths)
    segments = [logs[i:i + LIVE_CHUNK] for i in range(0, len(logs), LIVE_CHUNK)] + _typed_segments()
    results = []
    n = 0
    for seg in segments:
        for item in seg:
            if item[0] == JUMP:
                jump(item[1])
                continue
            level, tag, fields = item
            ct.cptrace(level, tag, **fields)
            n += 1
        results.append(ct.flush(120.0))
    ok = ct.shutdown(120.0)
    print(json.dumps({"records": n, "flushes": len(results), "flushes_false": results.count(False),
                      "shutdown": ok}))
    return 0


def child_sim(specs: list[str]) -> int:
    try:
        from cptrace_otel.sim.rank_main import build
    except ImportError:   # pragma: no cover - a restructured simulator may move it
        from cptrace_otel.commands.demo import build  # type: ignore[no-redef,attr-defined]
    from cptrace_otel.sim.tracer import LogEmitter

    for spec in specs:
        mode, policy, level_s, faults = spec.split(":")
        level = int(level_s)
        ranks = 1 if mode == "none" else 2
        ref = build(mode, ranks, policy, level, 1, faults, LogEmitter(level, ranks))
        print(f"=== {spec}")
        for r, lines in enumerate(ref.emitter.lines):
            print(f"--- rank {r}: {len(lines)} lines")
            for line in lines:
                print(line)
        print("--- injected")
        for x in ref.oracle.injected:
            print(tuple(x))
        print("--- expected")
        for e in ref.oracle.expected(level):
            print(tuple(e))
    return 0


# == main =============================================================================================================
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_args(ap)
    ap.add_argument("--out", metavar="DIR", help="keep inputs and both trees' outputs of every scenario here")
    ap.add_argument("--lines", type=int, default=20_000, help="lines of the generated logs (2 ranks together)")
    ap.add_argument("--only", metavar="SUBSTR", action="append", help="run only scenarios whose name contains it")
    ap.add_argument("--no-demo", action="store_true", help="skip the demo runs and the simulator scenario")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return {"live": child_live, "sim": child_sim}[a.child](a.rest)

    work = os.path.abspath(a.out) if a.out else tempfile.mkdtemp(prefix="cptrace-same-")
    os.makedirs(work, exist_ok=True)
    failures = 0
    t0 = time.monotonic()
    with trees(a) as (btree, _, current):
        print(f"work: {work}", flush=True)
        inp = prepare_inputs(work, current, btree, a.lines, not a.no_demo)
        rx = RawReceiver()
        try:
            todo = scenarios(inp, not a.no_demo)
            if a.only:
                todo = [s for s in todo if any(o in s.name for o in a.only)]
            for i, sc in enumerate(todo):
                res = {side: run_one(sc, tree, work, rx) for side, tree in (("baseline", btree),
                                                                             ("current", current))}
                diff = first_difference(res["baseline"], res["current"])
                rc = int(res["baseline"]["exit status"])
                if rc not in sc.ok_rc:   # the same failure in both trees would prove nothing
                    tail = res["baseline"]["stderr"].decode(errors="replace").strip().splitlines()[-1:]
                    diff = f"FAILED in the baseline tree (exit status {rc}): {' '.join(tail)}"
                secs = "/".join(res[s]["_seconds"].decode() for s in ("baseline", "current"))
                word = "same" if diff is None else (diff if diff.startswith("FAILED") else "DIFFERS: " + diff)
                print(f"{word}  [{sc.name}] ({secs} s)", flush=True)
                failures += diff is not None
                if a.out:
                    _save(os.path.join(work, "outputs", f"{i:03d}"), sc.name, res)
        finally:
            rx.stop()
    n = len(todo)
    print(f"{n - failures} of {n} scenarios the same, {failures} differ ({time.monotonic() - t0:.0f} s)")
    if not a.out:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def _save(folder: str, name: str, res: dict[str, dict[str, bytes]]) -> None:
    for side, arts in res.items():
        d = os.path.join(folder, side)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(folder, "scenario.txt"), "w") as f:
            f.write(name + "\n")
        for k, v in arts.items():
            with open(os.path.join(d, re.sub(r"[^\w.-]+", "_", k)), "wb") as f:
                f.write(v)


if __name__ == "__main__":
    sys.exit(main())
