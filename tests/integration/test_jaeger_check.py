"""``check --jaeger`` against the real Jaeger: a 4-rank sharded demo with the faults C1_div, C3_writer,
HASH_flip exported into Jaeger gives exactly the findings ``check`` reports on the same run's files, also through
small search pages; Jaeger's own JSON answers saved as files check the same; a Jaeger export of another service is
exit 3 with the reason.

The demo picks its own run id (``demo-<seed>-<time>-<pid>``), so the shared Jaeger may hold other runs at the same
time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from tests.helpers.integration import _BASE_ENV, ROOT, get_json, wait_for

pytestmark = pytest.mark.integration

FAULTS = "C1_div,C3_writer,HASH_flip"
DROP = ("src", "line_no", "evidence_lines")


def _env() -> dict[str, str]:
    return dict(_BASE_ENV, PYTHONPATH=str(ROOT) + os.pathsep + _BASE_ENV.get("PYTHONPATH", ""))


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cptrace_otel.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def findings(stdout: str) -> list[dict]:
    return [{k: v for k, v in f.items() if k not in DROP} for f in json.loads(stdout)["findings"]]


@pytest.fixture(scope="module")
def demo_in_jaeger(jaeger, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-jaeger")
    p = cli("demo", "--ranks", "4", "--mode", "sharded", "--faults", FAULTS, "--endpoint", jaeger.otlp_http,
            "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    run_id, n = rep["run_id"], rep["events"]["simulated"]

    def all_there():   # Jaeger's batch processor: the last spans arrive a moment after the ranks exit
        r = cli("check", "--json", "--jaeger", jaeger.query_url, "--run-id", run_id, "--since", "1h")
        return r if r.returncode in (0, 1) and json.loads(r.stdout)["stats"]["events"] == n else None

    first = wait_for(all_there, 60, f"all {n} records of {run_id} in Jaeger", interval_s=1.0)
    return {"dir": str(out), "run_id": run_id, "events": n, "check": first,
            "otlp": sorted(str(out / f) for f in os.listdir(out) if f.endswith(".otlp.jsonl")),
            "logs": sorted(str(out / f) for f in os.listdir(out) if f.endswith(".log"))}


def test_check_from_jaeger_reports_exactly_the_findings_of_the_files(jaeger, demo_in_jaeger):
    d = demo_in_jaeger
    url = jaeger.query_url
    files = cli("check", "--json", "--jaeger-url", url, "--run-id", d["run_id"], *d["otlp"])
    logs = cli("check", "--json", "--jaeger-url", url, "--run-id", d["run_id"], *d["logs"])
    folder = cli("check", "--json", "--jaeger-url", url, d["dir"])
    got = d["check"]
    assert files.returncode == logs.returncode == folder.returncode == got.returncode == 1, got.stderr
    want = findings(files.stdout)
    assert {f["code"] for f in want} >= {"C1", "C3", "HASH"}
    assert findings(got.stdout) == want == findings(logs.stdout) == findings(folder.stdout)
    assert "counted once" in folder.stderr and json.loads(folder.stdout)["stats"]["events"] == d["events"]
    assert all(f["src"].startswith(url + "/trace/") for f in json.loads(got.stdout)["findings"])
    # the text report too: the OTLP files' table, trace ids and links included
    t_files = cli("check", "--jaeger-url", url, "--run-id", d["run_id"], *d["otlp"])
    t_jaeger = cli("check", "--jaeger", url, "--run-id", d["run_id"], "--since", "1h")
    assert t_jaeger.returncode == 1 and t_jaeger.stdout == t_files.stdout, t_jaeger.stderr
    assert "Traceback" not in t_jaeger.stderr


def test_small_search_pages_find_the_whole_run(jaeger, demo_in_jaeger):
    d = demo_in_jaeger
    r = cli("check", "--json", "--jaeger", jaeger.query_url, "--run-id", d["run_id"], "--since", "1h",
            "--limit", "9", "--progress")
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["stats"]["events"] == d["events"]
    assert findings(r.stdout) == findings(d["check"].stdout)
    n_searches = int(re.search(r"in (\d+) search\(es\)", r.stderr).group(1))
    assert n_searches > 3, r.stderr


def test_small_pages_of_the_real_store_come_out_oldest_first_and_each_once(jaeger, demo_in_jaeger):
    """Jaeger's memory store answers newest first; run_traces hands the run's traces out in first-span-start order
    (what keeps watch's waiting records within a page), each once, however small the pages."""
    from cptrace_otel.analyze.sources.jaeger import JaegerClient
    from cptrace_otel.analyze.sources.jaegerquery import Search

    search = Search(JaegerClient(jaeger.query_url), limit=7)
    now_us = int(time.time() * 1e6)
    got = list(search.run_traces(demo_in_jaeger["run_id"], now_us - 3600 * 10**6, now_us))
    firsts = [min(int(sp["startTime"]) for sp in tr["spans"]) for tr in got]
    ids = [tr["traceID"] for tr in got]
    assert len(ids) == len(set(ids)) > 7 and search.searches > 2
    assert firsts == sorted(firsts)
    records = sum(1 for tr in got for sp in tr["spans"] for lg in sp.get("logs") or ()
                  if any(f.get("key") == "cptrace.seq" for f in lg.get("fields") or ()))
    assert records == demo_in_jaeger["events"]


def test_without_a_run_id_the_runs_are_listed_or_the_only_one_used(jaeger, demo_in_jaeger):
    d = demo_in_jaeger
    r = cli("check", "--jaeger", jaeger.query_url, "--since", "10m")
    if r.returncode == 2:   # the shared Jaeger holds other runs too
        assert "several runs (" in r.stderr and d["run_id"] in r.stderr
    else:
        assert r.returncode == 1 and f"run id {d['run_id']}" in r.stderr


def test_jaegers_json_answers_saved_as_files_check_the_same(jaeger, demo_in_jaeger, tmp_path):
    d = demo_in_jaeger
    url = jaeger.query_url
    tags = urllib.request.quote(json.dumps({"cptrace.run_id": d["run_id"]}))
    start = int((time.time() - 3600) * 1e6)
    v2 = urllib.request.urlopen(f"{url}/api/traces?service=sglang-hicache&tags={tags}&start={start}&limit=1000",
                                timeout=30).read()
    (tmp_path / "api_traces.json").write_bytes(v2)
    ids = [t["traceID"] for t in json.loads(v2)["data"]]
    with open(tmp_path / "api_v3.jsonl", "w") as f:    # each /api/v3/traces/{id} answer, one per line
        for tid in ids:
            f.write(json.dumps(get_json(f"{url}/api/v3/traces/{tid}")) + "\n")
    want = findings(d["check"].stdout)
    for name in ("api_traces.json", "api_v3.jsonl"):
        r = cli("check", "--json", "--jaeger-url", url, str(tmp_path / name))
        assert r.returncode == 1 and findings(r.stdout) == want, (name, r.stderr)
        assert json.loads(r.stdout)["stats"]["events"] == d["events"]


def test_a_jaeger_export_of_another_service_is_exit_3(jaeger, tmp_path):
    svc = f"shop-frontend-{uuid.uuid4().hex[:8]}"
    now = time.time_ns()
    body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": svc}}]},
                               "scopeSpans": [{"spans": [{
                                   "traceId": uuid.uuid4().hex, "spanId": uuid.uuid4().hex[:16], "name": "GET /cart",
                                   "kind": 2, "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 10**6),
                                   "events": [{"name": "cache miss", "timeUnixNano": str(now + 1000)}]}]}]}]}
    req = urllib.request.Request(jaeger.otlp_http + "/v1/traces", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()
    start = int((time.time() - 600) * 1e6)

    def exported():
        data = urllib.request.urlopen(f"{jaeger.query_url}/api/traces?service={svc}&start={start}&limit=10",
                                      timeout=10).read()
        return data if json.loads(data)["data"] else None

    path = tmp_path / "traces-frontend.json"
    path.write_bytes(wait_for(exported, 30, f"the {svc} trace in Jaeger"))
    r = cli("check", str(path))
    assert r.returncode == 3 and r.stdout == ""
    assert f"{path}: no cptrace record found: Jaeger JSON (api_v2 /api/traces) of service {svc}" in r.stderr
    r = cli("check", "--jaeger", jaeger.query_url, "--service", svc, "--since", "10m")
    assert r.returncode == 3 and "no trace with a cptrace.run_id" in r.stderr
