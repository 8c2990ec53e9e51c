"""What hostile or huge backend answers cost ``check --jaeger`` and ``watch --once``: peak RSS, requests,
seconds and exit status of the command, run as a subprocess against a loopback server in this process that streams
its answers (never holding them whole).

    python bench/analyze_bounds.py trace --spans 1000000     # one trace of N spans (Jaeger JSON, ~800 bytes a span)
    python bench/analyze_bounds.py trace --watch              # the same through watch --once --since 10m
    python bench/analyze_bounds.py answer --mib 512          # one search answer of N MiB (traces without records)
    python bench/analyze_bounds.py runs --runs 1000          # watch --once over N small runs: searches and RSS
    python bench/analyze_bounds.py drip                      # a server sending one byte every 50 ms
    ... --tree /path/to/other/checkout                       # the same against another checkout (before/after)
    ... --timeout 600                                        # give up on the command after this (reported)

Peak RSS is the child's ``ru_maxrss`` (``os.wait4``). The request deadline is the default (120 s) unless
``CPTRACE_QUERY_DEADLINE_S`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUN = "bench-run"
SPAN = ('{"traceID":"%(t)s","spanID":"%(s)016x","operationName":"hicache.node","references":[],'
        '"startTime":%(st)d,"duration":1200,"tags":[{"key":"sglang.cp.rank","type":"int64","value":%(r)d},'
        '{"key":"hicache.node_id","type":"int64","value":%(n)d},{"key":"otel.scope.name","type":"string",'
        '"value":"cptrace_otel"},{"key":"span.kind","type":"string","value":"internal"}],"logs":[%(logs)s],'
        '"processID":"p1","warnings":null}')
LOG = ('{"timestamp":%(st)d,"fields":[{"key":"event","type":"string","value":"insert"},{"key":"cptrace.seq",'
       '"type":"int64","value":%(seq)d},{"key":"cptrace.epoch","type":"int64","value":0},{"key":"hicache.node_id",'
       '"type":"int64","value":%(n)d},{"key":"ts","type":"int64","value":%(seq)d}]}')
PROCS = ('"processes":{"p1":{"serviceName":"sglang-hicache","tags":[{"key":"cptrace.run_id","type":"string",'
         '"value":"%s"},{"key":"sglang.cp.rank","type":"int64","value":0}]}}')


def trace_pieces(tid: str, spans: int, t0: int, logs: bool, run: str = RUN) -> Iterator[bytes]:
    """One Jaeger-model trace of ``spans`` spans, in pieces of about 1 MiB."""
    yield (f'{{"traceID":"{tid}","spans":[').encode()
    buf: list[str] = []
    size = 0
    for j in range(spans):
        lg = LOG % {"st": t0 + j, "seq": j, "n": j} if logs else ""
        s = ("," if j else "") + SPAN % {"t": tid, "s": j + 1, "st": t0 + j, "r": 0, "n": j, "logs": lg}
        buf.append(s)
        size += len(s)
        if size >= 1 << 20:
            yield "".join(buf).encode()
            buf, size = [], 0
    yield ("".join(buf) + "]," + PROCS % run + ',"warnings":null}').encode()


class Server:
    """A loopback Jaeger whose ``/api/traces`` answer is ``body()`` (an iterator of byte pieces, chunked)."""

    def __init__(self, body: Callable[[dict], Iterator[bytes]], drip_s: float = 0.0) -> None:
        self.searches = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/api/services"):
                    data = b'{"data":["sglang-hicache"],"errors":null}'
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                outer.searches += 1
                from urllib.parse import parse_qs, urlsplit
                q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                try:
                    if drip_s:
                        data = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100_000
                        for i in range(len(data)):
                            time.sleep(drip_s)
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                        return
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for piece in body(q):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def run_cli(tree: str, argv: list[str], timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("CPTRACE_REQUIRE_SPEEDUPS", None)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", *argv], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env, cwd=tree)
    err: list[bytes] = []
    threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True).start()   # type: ignore[union-attr]
    status = rss = None
    while True:
        pid, st, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            status, rss = os.waitstatus_to_exitcode(st), ru.ru_maxrss
            break
        if time.monotonic() - t0 > timeout:
            rss = _vmhwm(p.pid)
            p.kill()
            os.wait4(p.pid, 0)
            status = f"still running after {timeout:g} s (killed)"
            break
        time.sleep(0.05)
    secs = time.monotonic() - t0
    time.sleep(0.2)
    text = b"".join(err).decode("utf-8", "replace").strip().splitlines()
    return {"exit": status, "peak_rss_mib": round((rss or 0) / 1024, 1), "seconds": round(secs, 1),
            "stderr_last": text[-1][:300] if text else ""}


def _vmhwm(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=["trace", "answer", "runs", "drip"])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--tree", default=str(ROOT))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--watch", action="store_true", help="trace: run watch --once instead of check")
    a = ap.parse_args()
    now = int(time.time() * 1e6)
    if a.case == "trace":
        srv = Server(lambda q: iter([b'{"data":[', *trace_pieces("ab" * 16, a.spans, now - 60_000_000, True),
                                     b'],"total":1,"errors":null}']))
        cmd = (["watch", "--jaeger", srv.url, "--once", "--run-id", RUN, "--since", "10m"] if a.watch else
               ["check", "--jaeger", srv.url, "--run-id", RUN, "--no-progress"])
        res = run_cli(a.tree, cmd, a.timeout)
    elif a.case == "answer":
        per = 2000   # spans a trace: about 1.3 MiB

        total = max(1, (a.mib << 20) // (per * 650))   # traces in all; trace i's spans start at t_i .. t_i + per

        def body(q: dict) -> Iterator[bytes]:   # the memory store's search: newest first, window, limit
            limit = int(q.get("limit", 1000))
            lo, hi = int(q.get("start", 0)), int(q.get("end", 1 << 62))
            yield b'{"data":['
            k = 0
            for i in range(total - 1, -1, -1):
                t = now - 600_000_000 + i * 10_000
                if t + per - 1 < lo or t > hi or k >= limit:
                    continue
                if k:
                    yield b","
                k += 1
                yield from trace_pieces(f"{i + 1:032x}", per, t, False)
            yield b'],"total":0,"errors":null}'

        srv = Server(body)
        res = run_cli(a.tree, ["check", "--jaeger", srv.url, "--run-id", RUN, "--no-progress", "--since", "1h"],
                      a.timeout)
    elif a.case == "runs":
        def body(q: dict) -> Iterator[bytes]:
            limit = int(q.get("limit", 1000))
            tags = json.loads(q.get("tags", "{}"))
            lo, hi = int(q.get("start", 0)), int(q.get("end", 1 << 62))
            want = tags.get("cptrace.run_id")
            yield b'{"data":['
            k = 0
            for i in range(a.runs - 1, -1, -1):   # newest first
                t0 = now - 1_800_000_000 + i * 1_000_000
                if not lo <= t0 <= hi or (want is not None and want != f"run-{i}") or k >= limit:
                    continue
                yield (b"," if k else b"") + b"".join(trace_pieces(f"{i + 1:032x}", 4, t0, True, f"run-{i}"))
                k += 1
            yield b'],"total":0,"errors":null}'

        srv = Server(body)
        res = run_cli(a.tree, ["watch", "--jaeger", srv.url, "--once", "--since", "1h"], a.timeout)
    else:
        srv = Server(lambda q: iter(()), drip_s=0.05)
        res = run_cli(a.tree, ["check", "--jaeger", srv.url, "--run-id", RUN], a.timeout)
    res["searches"] = srv.searches
    print(json.dumps({"case": a.case, "tree": a.tree, **res}))


if __name__ == "__main__":
    main()
