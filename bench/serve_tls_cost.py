"""What TLS, mutual TLS and the auth token cost one ``cptrace-otel serve`` replica: the same OTLP/HTTP requests sent
to a plaintext replica and to one with ``--tls-cert/--tls-key --tls-client-ca --auth-token-file``, side by side,
alternating, in one run.

The requests: the OTLP files of ``--runs`` simulator runs (4 ranks, seeds 0..runs-1, no fault), as protobuf. Each
replica is a fresh process; one keep-alive session sends every request (one TLS handshake), then SIGTERM (everything
held is checked). Reported per replica: the send's wall time and the replica's CPU seconds (user + system, from
``wait4``: its own CPU, whatever else the machine runs). The certificates are a throw-away PKI made here.

    python bench/serve_tls_cost.py               # 40 runs, 2 rounds
    python bench/serve_tls_cost.py --runs 10 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _bodies(tmp: Path, runs: int) -> list[bytes]:
    from tests.helpers.otlp_receiver import parse_json_line

    bodies: list[bytes] = []
    for seed in range(runs):
        out = tmp / f"demo{seed}"
        subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", "4", "--seed", str(seed),
                        "--out", str(out), "--json"], capture_output=True, check=False, cwd=ROOT)
        for f in sorted(out.glob("*.otlp.jsonl")):
            bodies += [parse_json_line(ln).SerializeToString() for ln in f.read_text().splitlines() if ln.strip()]
    return bodies


def _replica(tmp: Path, bodies: list[bytes], pki: dict[str, str] | None, token: str) -> tuple[float, float]:
    """(send wall seconds, replica CPU seconds) for one fresh replica, TLS + mTLS + token when ``pki`` is given."""
    import requests

    extra = (["--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"], "--tls-client-ca", pki["ca"],
              "--auth-token-file", str(tmp / "token")] if pki else [])
    err = tmp / "serve.err"
    p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "serve", "--listen", "127.0.0.1:0", "--idle",
                          "1h", "--queue", str(len(bodies) + 1), *extra], stdout=subprocess.DEVNULL,
                         stderr=open(err, "w"), cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (m := re.search(r"(https?)://127\.0\.0\.1:(\d+)/", err.read_text())):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the replica did not start: {err.read_text()[-500:]}")
        time.sleep(0.05)
    url = f"{m[1]}://127.0.0.1:{m[2]}/v1/traces"
    s = requests.Session()
    headers = {"Content-Type": "application/x-protobuf"}
    verify: str | bool = True
    if pki:
        s.cert = (pki["client_cert"], pki["client_key"])
        headers["Authorization"] = token
        verify = pki["ca"]   # per request: REQUESTS_CA_BUNDLE in the environment would win over Session.verify
    t0 = time.perf_counter()
    for b in bodies:
        r = s.post(url, data=b, headers=headers, verify=verify)
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {r.text[:200]}")
    wall = time.perf_counter() - t0
    s.close()
    p.send_signal(signal.SIGTERM)
    _pid, _status, ru = os.wait4(p.pid, 0)
    return wall, ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40, help="simulator runs whose requests are sent (default 40)")
    ap.add_argument("--rounds", type=int, default=2, help="plaintext/TLS pairs (default 2)")
    a = ap.parse_args()
    from tests.helpers.otlp_receiver import make_pki

    with tempfile.TemporaryDirectory(prefix="serve-tls-cost-") as d:
        tmp = Path(d)
        (tmp / "pki").mkdir()
        pki = make_pki(str(tmp / "pki"))
        token = "Bearer bench-token"
        (tmp / "token").write_text(token)
        bodies = _bodies(tmp, a.runs)
        print(f"{len(bodies)} requests, {sum(map(len, bodies)) / 2**20:.1f} MiB of OTLP protobuf")
        for rnd in range(a.rounds):
            for name, k in (("plaintext", None), ("TLS + mTLS + token", pki)):
                wall, cpu = _replica(tmp, bodies, k, token)
                print(f"round {rnd}: {name:<18} send {wall:6.2f} s wall, replica {cpu:6.2f} CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
