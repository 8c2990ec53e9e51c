"""``cptrace-otel watch`` against the real parts: a 4-rank sharded demo with the faults C1_div, C3_writer,
HASH_flip goes into a Jaeger with the repo's span metrics; ``watch --once`` reports the findings ``check`` reports,
writes the cross-rank ones back into their node traces (found by a Jaeger tag search on the code, linked to their
evidence spans), posts them to Alertmanager (one alert per code, rank and run, also when posted twice), and the
repo's Prometheus rule fires for a C-code through Alertmanager to a webhook with the run id and a Jaeger link. The
same demo without faults gives no finding and no alert. Jaeger unreachable at the start is exit 3; a Jaeger that
goes away while watch runs is a clear line, and watch goes on when it is back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest

from cptrace_otel.model.trace_ids import node_trace_id
from tests.helpers import free_port
from tests.helpers.integration import _BASE_ENV, ROOT, get_json, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS = "C1_div,C3_writer,HASH_flip"


def _env() -> dict[str, str]:
    return dict(_BASE_ENV, PYTHONPATH=str(ROOT) + os.pathsep + _BASE_ENV.get("PYTHONPATH", ""))


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cptrace_otel.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def demo(pj, out, faults: str) -> tuple[str, dict]:
    p = cli("demo", "--ranks", "4", "--mode", "sharded", "--faults", faults, "--endpoint", pj.otlp_http,
            "--out", str(out), "--json")
    assert p.returncode in (0, 1), p.stderr
    rep = json.loads(p.stdout)
    run_id, n = rep["run_id"], rep["events"]["simulated"]

    def all_there():   # the last spans reach Jaeger a moment after the ranks exit
        r = cli("check", "--json", "--jaeger", pj.query_url, "--run-id", run_id, "--since", "1h")
        return json.loads(r.stdout) if r.returncode in (0, 1) and json.loads(r.stdout)["stats"]["events"] == n \
            else None

    return run_id, wait_for(all_there, 60, f"all {n} records of {run_id} in Jaeger", interval_s=1.0)


def watch_once(pj, stack, run_id: str) -> subprocess.CompletedProcess:
    return cli("watch", "--jaeger", pj.query_url, "--run-id", run_id, "--once", "--endpoint", pj.otlp_http,
               "--alertmanager", stack.am_url, "--since", "1h")


def test_watch_writes_back_and_alerts(watch_stack, tmp_path):
    pj, stack = watch_stack
    run_id, checked = demo(pj, tmp_path / "bad", FAULTS)
    want = sorted((f["code"], f["rank"], f["node_id"], f["epoch"]) for f in checked["findings"])
    assert {"C1", "C3"} <= {c for c, *_ in want}, want

    w = watch_once(pj, stack, run_id)
    assert w.returncode == 1, w.stderr
    lines = w.stdout.splitlines()
    assert len(lines) == len(want), w.stdout   # each finding once, the same as check's
    for code, rank, node, epoch in want:
        tid = node_trace_id(run_id, epoch, node).hex()
        assert any(f" {code} " in ln and f"run {run_id} rank {rank} node {node} (epoch {epoch})" in ln
                   and ln.endswith(f"{pj.query_url}/trace/{tid}") for ln in lines), (code, w.stdout)

    # 1. the cross-rank findings are in their node traces, found by searching the code; linked to their evidence
    for code in ("C1", "C3"):
        traces = wait_for(lambda code=code: pj.client.search("cptrace-watch", {"cptrace.violation": code,
                                                                      "cptrace.run_id": run_id}, lookback_s=3600),
                          30, f"the {code} finding span in Jaeger")
        ids = {node_trace_id(run_id, e, n).hex() for c, _r, n, e in want if c == code}
        assert {t["traceID"] for t in traces} == ids
        for t in traces:
            mine = [s for s in t["spans"] if t["processes"][s["processID"]]["serviceName"] == "cptrace-watch"
                    and {"key": "cptrace.violation", "type": "string", "value": code} in s["tags"]]
            assert mine, t
            others = {s["spanID"] for s in t["spans"]}
            for s in mine:
                refs = s.get("references") or []
                assert refs, s   # a link to each evidence span; those of this node are in this trace
                assert all(r["traceID"] != t["traceID"] or r["spanID"] in others for r in refs)
                tags = {x["key"]: x["value"] for x in s["tags"]}
                assert tags["error"] is True and tags["sglang.cp.rank"] in {r for c, r, *_ in want if c == code}

    # the spans written back are no input: check reads the same findings as before, a second watch too
    again = cli("check", "--json", "--jaeger", pj.query_url, "--run-id", run_id, "--since", "1h")
    assert sorted((f["code"], f["rank"], f["node_id"], f["epoch"]) for f in json.loads(again.stdout)["findings"]) \
        == want

    # 2. watch's own alerts: one per (code, rank, run), still one after a second watch posts them again
    flt = urllib.parse.quote(f'run_id="{run_id}"')

    def am_watch():
        return [a for a in get_json(f"{stack.am_url}/api/v2/alerts?filter={flt}")
                if a["labels"]["alertname"] == "CptraceInvariantViolated"]

    keys = {(c, str(r)) for c, r, *_ in want}
    got = wait_for(lambda: (a := am_watch()) and len(a) == len(keys) and a, 30, "watch's alerts in Alertmanager")
    assert {(a["labels"]["code"], a["labels"]["rank"]) for a in got} == keys
    assert all(a["annotations"]["jaeger"].startswith(pj.query_url + "/trace/") and a["annotations"]["message"]
               for a in got)
    w2 = watch_once(pj, stack, run_id)
    assert w2.returncode == 1 and len(w2.stdout.splitlines()) == len(want), w2.stdout
    time.sleep(1)
    assert len(am_watch()) == len(keys)

    # 3. Prometheus fires the repo's rule for a C-code of this run through Alertmanager to the webhook
    def firing():
        alerts = get_json(stack.prom_url + "/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"].get("alertname") == "HiCacheKVInvariantViolated"
                and a["labels"].get("cptrace_run_id") == run_id and a["labels"].get("code") == "C3"
                and a["state"] == "firing"]

    (alert, *_) = wait_for(firing, 90, f"HiCacheKVInvariantViolated firing for C3 of {run_id}", 0.5)
    assert alert["labels"]["service_name"] == "cptrace-watch"
    assert run_id in alert["annotations"]["summary"]
    assert urllib.parse.quote(run_id) in alert["annotations"]["jaeger"]

    def delivered():
        return [a for path, body in stack.webhook_hits if path == "/page" for a in body["alerts"]
                if a["labels"].get("cptrace_run_id") == run_id and a["labels"].get("code") == "C3"]

    (hook, *_) = wait_for(delivered, 60, "webhook delivery of the C3 alert", 0.5)
    assert hook["status"] == "firing" and run_id in hook["annotations"]["summary"]
    assert hook["annotations"]["jaeger"].startswith("http://") and "cptrace.violation" in \
        urllib.parse.unquote(hook["annotations"]["jaeger"])

    # 4. the same demo without faults: no finding, nothing written, no alert
    clean_id, clean = demo(pj, tmp_path / "clean", "none")
    assert clean["findings"] == []
    w = watch_once(pj, stack, clean_id)
    assert w.returncode == 0 and w.stdout == "", (w.stdout, w.stderr)
    time.sleep(5)   # a few span-metric flushes and rule evaluations
    alerts = get_json(stack.prom_url + "/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in alerts if a["labels"].get("cptrace_run_id") == clean_id
                and a["labels"].get("alertname") == "HiCacheKVInvariantViolated"]
    flt = urllib.parse.quote(f'run_id="{clean_id}"')
    assert get_json(f"{stack.am_url}/api/v2/alerts?filter={flt}") == []
    assert pj.client.search("cptrace-watch", {"cptrace.run_id": clean_id}, lookback_s=3600) == []


def test_watch_unreachable_at_start_is_exit_3():
    url = f"http://127.0.0.1:{free_port()}"
    p = cli("watch", "--jaeger", url, "--once")
    assert p.returncode == 3 and url in p.stderr, p.stderr


def test_watch_keeps_going_across_a_jaeger_restart(private_jaeger, tmp_path):
    pj = private_jaeger
    run_id = f"watch-restart-{os.getpid()}"
    p = subprocess.Popen([sys.executable, "-m", "cptrace_otel.cli", "watch", "--jaeger", pj.query_url,
                          "--run-id", run_id, "--interval", "0.5s"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env())
    try:
        time.sleep(2)
        assert p.poll() is None
        pj.stop()
        time.sleep(3)
        pj.start()
        time.sleep(3)
        assert p.poll() is None   # still watching
    finally:
        p.send_signal(signal.SIGTERM)
        _out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert f"watch: Jaeger at {pj.query_url} is down" in err and f"watch: Jaeger at {pj.query_url} is back" in err, err
