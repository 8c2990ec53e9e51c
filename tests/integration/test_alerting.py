"""Get alerted on corruption, end to end with the real parts:

rank process emits a backup that read all-zero KV (the domain's ZERO bad example) -> the online check stamps
``cptrace.violation`` on the span -> Jaeger's spanmetrics connector counts it on :8889 -> Debian Prometheus scrapes it
and evaluates ``deploy/prometheus/rules.yml`` -> HiCacheKVInvariantViolated fires -> Alertmanager has it (API) and
delivers it to its webhook receiver. A clean rank process with its own service name runs alongside and must not alert.

Prometheus and Alertmanager run with 1 s intervals (test configs derived from the repo's); each rank process gets a
service name unique to this test, so the alert is identified by its ``service_name`` label.
"""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest

from tests.helpers.integration import SPANMETRICS_URL, get_json, rank_env, start_rank, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEV = "(cnt=32,min=512,max=543,first=512,last=543)"
HOST = "(cnt=32,min=64,max=95,first=64,last=95)"


def records(nz: int) -> list:
    return [
        [1, "config", {"cp_size": 1, "cp_rank": 0, "mode": "none", "page_size": 1, "policy": "wt"}],
        [1, "insert", {"node_id": 6, "parent": 0, "len": 32, "dev": DEV}],
        [1, "prepare", {"node_id": 6, "op": 20, "len": 32, "dev": DEV, "host": HOST, "policy": "wt"}],
        [1, "backup", {"op": 20, "node_id": 6, "dev": DEV, "host": HOST, "io": 1, "h": 111, "nz": nz}],
        [2, "ack", {"dir": "d2h", "op": 20, "node_id": 6, "blen": 32, "clen": 32, "pub": [6]}],
    ]


def _metric_lines(service: str) -> list[str]:
    import urllib.request

    with urllib.request.urlopen(SPANMETRICS_URL, timeout=5) as r:
        text = r.read().decode()
    return [ln for ln in text.splitlines()
            if ln.startswith("traces_span_metrics_calls_total{") and f'service_name="{service}"' in ln]


def test_violation_reaches_alertmanager(jaeger, alert_stack, run_id, tmp_path):
    bad_svc, clean_svc = f"cptrace-alert-{run_id}", f"cptrace-clean-{run_id}"
    bad = start_rank(tmp_path, "bad", rank_env(run_id, 0, jaeger.otlp_http, tmp=tmp_path, OTEL_SERVICE_NAME=bad_svc),
                     records(nz=0))
    clean = start_rank(tmp_path, "clean", rank_env(run_id + "-c", 0, jaeger.otlp_http, tmp=tmp_path,
                                                   OTEL_SERVICE_NAME=clean_svc), records(nz=4096))
    for run in (bad, clean):
        assert run.wait()["flushed"] is True, run.stderr

    # 1. the span carries the verdict (Jaeger tag search on the violation attribute)
    traces = wait_for(lambda: jaeger.client.search(bad_svc, {"cptrace.violation.ZERO": "true"}, lookback_s=3600), 30,
                      "the violation span in Jaeger")
    tags = {t["key"]: t["value"] for sp in traces[0]["spans"] for t in sp["tags"]}
    assert "ZERO" in tags["cptrace.violation"].split(",") and tags["hicache.node_id"] == 6

    # 2. spanmetrics exports a violation series for the bad process only
    lines = wait_for(lambda: [ln for ln in _metric_lines(bad_svc) if 'cptrace_violation_ZERO="true"' in ln], 40,
                     "a cptrace_violation_ZERO series on Jaeger's :8889")
    assert lines
    clean_lines = wait_for(lambda: _metric_lines(clean_svc), 40, "the clean process's series on :8889")
    assert not any(re.search(r'cptrace_violation_\w+="true"', ln) for ln in clean_lines), clean_lines

    # 3. Prometheus fires the repo's alert for it
    def firing():
        alerts = get_json(alert_stack.prom_url + "/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"].get("alertname") == "HiCacheKVInvariantViolated"
                and a["labels"].get("service_name") == bad_svc and a["state"] == "firing"]

    (alert,) = wait_for(firing, 60, f"HiCacheKVInvariantViolated firing in Prometheus for {bad_svc}", 0.5)
    assert alert["labels"]["code"] == "ZERO" and alert["labels"]["severity"] == "page"
    assert alert["labels"]["sglang_cp_rank"] == "0"

    # 4. Alertmanager received it (API) and routed it to the page receiver's webhook
    flt = urllib.parse.quote(f'service_name="{bad_svc}"')

    def in_am():
        return [a for a in get_json(f"{alert_stack.am_url}/api/v2/alerts?filter={flt}")
                if a["labels"].get("alertname") == "HiCacheKVInvariantViolated"]

    (am_alert,) = wait_for(in_am, 60, "the alert in Alertmanager's API", 0.5)
    assert am_alert["status"]["state"] == "active"
    assert {r["name"] for r in am_alert["receivers"]} == {"cptrace-page"}
    assert "ZERO" in am_alert["annotations"]["summary"]

    def delivered():
        return [body for path, body in alert_stack.webhook_hits if path == "/page"
                and any(a["labels"].get("service_name") == bad_svc for a in body["alerts"])]

    (body, *_) = wait_for(delivered, 60, "webhook delivery of the alert", 0.5)
    assert body["status"] == "firing", json.dumps(body)[:500]

    # the clean process never alerted
    alerts = get_json(alert_stack.prom_url + "/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in alerts if a["labels"].get("service_name") == clean_svc]
