"""Static validation of everything under deploy/: no Docker and no servers needed.

Every OTel pipeline names declared components; ports and host names agree between the Jaeger, collector,
Prometheus, Alertmanager, Tempo, Grafana and compose files; compose mounts files that exist; rule files pass
``promtool`` (check and unit tests) and the Alertmanager config passes ``amtool``.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# Components compiled into Jaeger v1.76.0 (cmd/jaeger/internal/components.go).
JAEGER_COMPONENTS = {
    "extensions": {"healthcheckv2", "pprof", "zpages", "basicauth", "sigv4auth", "jaeger_query", "jaeger_storage",
                   "remote_sampling", "expvar", "storage_cleaner", "remote_storage"},
    "receivers": {"otlp", "nop", "jaeger", "kafka", "zipkin"},
    "processors": {"batch", "memory_limiter", "tail_sampling", "attributes", "filter", "adaptive_sampling"},
    "exporters": {"debug", "otlp", "otlphttp", "nop", "jaeger_storage_exporter", "kafka", "prometheus"},
    "connectors": {"forward", "spanmetrics"},
}
HIGH_CARDINALITY = {"hicache.node_id", "hicache.new_id", "hicache.rid", "hicache.h", "hicache.hh", "hicache.khash",
                    "hicache.op", "cptrace.seq", "process.pid", "service.instance.id"}

_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value, env: dict[str, str] | None = None):
    """Resolve ``${env:X:-default}`` the way the collector does, recursively, with ``env`` (default: none set)."""
    env = env or {}
    if isinstance(value, dict):
        return {k: _expand(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, env) for v in value]
    if isinstance(value, str):
        full = _ENV_REF.fullmatch(value)
        out = _ENV_REF.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)
        if full:  # a value that is only a reference is typed like YAML
            return yaml.safe_load(out) if out else None
        return out
    return value


def _load(rel: str):
    with open(DEPLOY / rel) as f:
        return yaml.safe_load(f)


def _base(name: str) -> str:
    return name.split("/", 1)[0]


def pipeline_errors(cfg: dict, compiled: dict[str, set[str]] | None = None) -> list[str]:
    """Problems in an OTel Collector config's service section; [] when every name is declared and used sensibly."""
    errs = []
    declared = {k: set((cfg.get(k) or {}).keys()) for k in ("receivers", "processors", "exporters", "connectors",
                                                            "extensions")}
    svc = cfg.get("service") or {}
    for ext in svc.get("extensions") or []:
        if ext not in declared["extensions"]:
            errs.append(f"service extension {ext!r} not declared")
    pipelines = svc.get("pipelines") or {}
    if not pipelines:
        errs.append("no pipelines")
    conn_as_exp, conn_as_rcv = set(), set()
    for pname, p in pipelines.items():
        if not p.get("receivers"):
            errs.append(f"pipeline {pname}: no receivers")
        if not p.get("exporters"):
            errs.append(f"pipeline {pname}: no exporters")
        for r in p.get("receivers") or []:
            if r in declared["connectors"]:
                conn_as_rcv.add(r)
            elif r not in declared["receivers"]:
                errs.append(f"pipeline {pname}: receiver {r!r} not declared")
        for pr in p.get("processors") or []:
            if pr not in declared["processors"]:
                errs.append(f"pipeline {pname}: processor {pr!r} not declared")
        for e in p.get("exporters") or []:
            if e in declared["connectors"]:
                conn_as_exp.add(e)
            elif e not in declared["exporters"]:
                errs.append(f"pipeline {pname}: exporter {e!r} not declared")
    for c in declared["connectors"]:
        if (c in conn_as_exp) != (c in conn_as_rcv):
            errs.append(f"connector {c!r} must be an exporter in one pipeline and a receiver in another")
    if compiled:
        for kind, names in declared.items():
            for n in names:
                if _base(n) not in compiled[kind]:
                    errs.append(f"{kind[:-1]} {n!r} is not compiled into this distribution")
    return errs


def _port(endpoint: str) -> int:
    return int(str(endpoint).rsplit(":", 1)[1])


def _host(endpoint: str) -> str:
    return str(endpoint).rsplit(":", 1)[0]


# -- Jaeger ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jaeger_raw():
    return _load("jaeger/config.yaml")


@pytest.fixture(scope="module")
def jaeger(jaeger_raw):
    return _expand(jaeger_raw)


def test_every_deploy_yaml_parses():
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))
    assert len(files) >= 10, files
    for p in files:
        docs = list(yaml.safe_load_all(p.read_text()))
        assert docs and all(d is not None for d in docs), p


def test_jaeger_pipelines_name_declared_compiled_components(jaeger):
    assert pipeline_errors(jaeger, JAEGER_COMPONENTS) == []


def test_pipeline_checker_catches_mistakes(jaeger):
    bad = copy.deepcopy(jaeger)
    bad["service"]["pipelines"]["traces"]["processors"].append("memory_limiter")   # used, not declared
    bad["service"]["pipelines"]["metrics/spanmetrics"]["receivers"] = ["otlp"]      # connector now one-sided
    bad["exporters"]["prometheusremotewrite"] = {}                                  # not compiled into Jaeger
    errs = "\n".join(pipeline_errors(bad, JAEGER_COMPONENTS))
    assert "processor 'memory_limiter' not declared" in errs
    assert "connector 'spanmetrics'" in errs
    assert "prometheusremotewrite" in errs


def test_jaeger_storage_references_and_memory_store(jaeger):
    backends = jaeger["extensions"]["jaeger_storage"]["backends"]
    assert jaeger["extensions"]["jaeger_query"]["storage"]["traces"] in backends
    assert jaeger["exporters"]["jaeger_storage_exporter"]["trace_storage"] in backends
    (mem,) = [b["memory"] for b in backends.values() if "memory" in b]
    assert isinstance(mem["max_traces"], int) and mem["max_traces"] > 0   # 0 is an error in v2, not "unlimited"
    text = (DEPLOY / "jaeger" / "config.yaml").read_text()
    assert "max_traces" in text and "evicted" in text                       # documented ring semantics
    assert _expand({"x": "${env:JAEGER_MAX_TRACES:-200000}"}, {"JAEGER_MAX_TRACES": "7"}) == {"x": 7}


def test_jaeger_binds_loopback_on_the_documented_ports(jaeger, jaeger_raw):
    ex = jaeger["extensions"]
    rc = jaeger["receivers"]["otlp"]["protocols"]
    got = {
        "otlp_grpc": rc["grpc"]["endpoint"], "otlp_http": rc["http"]["endpoint"],
        "query_http": ex["jaeger_query"]["http"]["endpoint"], "query_grpc": ex["jaeger_query"]["grpc"]["endpoint"],
        "health": ex["healthcheckv2"]["http"]["endpoint"], "spanmetrics": jaeger["exporters"]["prometheus"]["endpoint"],
    }
    want = {"otlp_grpc": 4317, "otlp_http": 4318, "query_http": 16686, "query_grpc": 16685, "health": 13133,
            "spanmetrics": 8889}
    assert {k: _port(v) for k, v in got.items()} == want
    assert {_host(v) for v in got.values()} == {"127.0.0.1"}
    # The compose file flips the bind address with JAEGER_LISTEN_HOST; every endpoint must follow it.
    opened = _expand(jaeger_raw, {"JAEGER_LISTEN_HOST": "0.0.0.0"})
    assert opened["extensions"]["jaeger_query"]["http"]["endpoint"] == "0.0.0.0:16686"
    assert opened["exporters"]["prometheus"]["endpoint"] == "0.0.0.0:8889"
    # up/down agree with the config
    up = (DEPLOY / "jaeger" / "up").read_text()
    for port in want.values():
        assert str(port) in up
    assert ":13133/status" in up and ex["healthcheckv2"]["http"]["status"]["path"] == "/status"


def test_jaeger_ui_assets_and_link_patterns(jaeger, jaeger_raw):
    import json
    from urllib.parse import unquote

    from cptrace_otel.model import semconv as sc

    ui = jaeger["extensions"]["jaeger_query"]["ui"]
    assert not ui.get("assets_path") and not ui.get("config_file")   # unset: the built-in assets, no UI config
    set_ = _expand(jaeger_raw, {"JAEGER_UI_ASSETS": "/x/build", "JAEGER_UI_CONFIG": "/y/ui-config.json"})
    assert set_["extensions"]["jaeger_query"]["ui"] == {"assets_path": "/x/build", "config_file": "/y/ui-config.json"}
    up = (DEPLOY / "jaeger" / "up").read_text()
    assert "shared/jaeger-ui/build" in up and "ui-config.json" in up
    assert "export JAEGER_UI_ASSETS JAEGER_UI_CONFIG" in up
    cfg = json.loads((DEPLOY / "jaeger" / "ui-config.json").read_text())
    pats = cfg["linkPatterns"]
    keys = {p["key"] for p in pats if "key" in p}
    assert {sc.NODE_ID, sc.RUN_ID, sc.CP_RANK} <= keys
    for p in pats:
        params = set(re.findall(r"#\{([^{}|]+)", p["url"] + p["text"]))
        if p["type"] == "traces":   # the trace's own link: to the run report, which resolves #trace=<id>
            assert params == {"traceID"} and p["url"].endswith("/report.html#trace=#{traceID}")
            continue
        assert p["key"] in params and params <= {sc.NODE_ID, sc.RUN_ID, sc.CP_RANK}
        assert p["url"].startswith(f"/search?service={sc.DEFAULT_SERVICE_NAME}&tags=")
        tags = json.loads(re.sub(r"#\{([^}]+)\}", r"V", unquote(p["url"].split("tags=")[1].split("&")[0])))
        assert set(tags) == params and "lookback=" in p["url"]   # searches exactly the tags it names
    js = (ROOT / "cptrace_otel" / "analyze" / "report.js").read_text()
    assert "#trace=" in js
    compose = _load("docker-compose.yml")["services"]["jaeger"]
    assert "./jaeger/ui-config.json:" + compose["environment"]["JAEGER_UI_CONFIG"] + ":ro" in compose["volumes"]


def test_spanmetrics_dimensions_alertable_and_low_cardinality(jaeger):
    sm = jaeger["connectors"]["spanmetrics"]
    dims = [d["name"] for d in sm["dimensions"]]
    assert "cptrace.violation.HASH" in dims and "cptrace.violation" not in dims  # one boolean dimension per code
    for d in dims + [d["name"] for d in sm.get("events", {}).get("dimensions", [])]:
        assert d not in HIGH_CARDINALITY, d
    assert sm.get("namespace") in (None, "traces.span.metrics")  # the rule's metric name depends on it
    # the alert names the run, so the run id is a dimension: one value per run, and the series of a run
    # that ended expire (the exporter's metric_expiration), so the series grow with the runs of a day, not a run's size
    assert "cptrace.run_id" in dims
    assert jaeger["exporters"]["prometheus"]["metric_expiration"] in ("24h", "1h", "12h")


# -- Prometheus / Alertmanager ----------------------------------------------------------------------------------------
def _targets(prom: dict) -> dict[str, list[str]]:
    return {sc["job_name"]: [t for s in sc["static_configs"] for t in s["targets"]] for sc in prom["scrape_configs"]}


def test_prometheus_scrapes_jaeger_spanmetrics_and_rules_match_the_metric(jaeger):
    prom = _load("prometheus/prometheus.yml")
    t = _targets(prom)
    assert t["jaeger-spanmetrics"] == [jaeger["exporters"]["prometheus"]["endpoint"]]
    telemetry = jaeger["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert t["jaeger"] == [f"{telemetry['host']}:{telemetry['port']}"]
    for rf in prom["rule_files"]:
        assert (DEPLOY / "prometheus" / rf).is_file()
    am_targets = [t for a in prom["alerting"]["alertmanagers"] for s in a["static_configs"] for t in s["targets"]]
    am_up = (DEPLOY / "alertmanager" / "up").read_text()
    assert am_targets == [re.search(r"AM_LISTEN:-([0-9.:]+)", am_up).group(1)]
    rules = _load("prometheus/rules.yml")
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    dims = [d["name"] for d in jaeger["connectors"]["spanmetrics"]["dimensions"]]
    codes = [d.rsplit(".", 1)[1] for d in dims if d.startswith("cptrace.violation.")]
    assert {"H1", "H2", "H3", "H4", "ZERO", "HASH", "C1", "C5"} <= set(codes)
    from cptrace_otel.checks.registry import CODES
    assert set(CODES) <= set(codes), set(CODES) - set(codes)   # every code the rules report is alertable
    for code in codes:  # one term per spanmetrics code dimension, labelled with its code
        label = f"cptrace.violation.{code}".replace(".", "_")
        assert f'traces_span_metrics_calls_total{{{label}="true"}}' in exprs and f'"code", "{code}"' in exprs
    assert "offset 5m" in exprs and "unless" in exprs           # the new-series pitfall is handled
    jobs = re.findall(r'job="([^"]+)"', exprs)
    assert jobs and set(jobs) <= set(t)


def test_prometheus_compose_variant_agrees(jaeger):
    loop, comp = _load("prometheus/prometheus.yml"), _load("prometheus/prometheus.compose.yml")
    compose = _load("docker-compose.yml")
    assert comp["rule_files"] == loop["rule_files"]
    tl, tc = _targets(loop), _targets(comp)
    assert set(tl) <= set(tc)
    for job, targets in tl.items():
        assert [_port(x) for x in targets] == [_port(x) for x in tc[job]], job
    for targets in tc.values():
        for x in targets:
            assert _host(x) in compose["services"], x
    am = [t for a in comp["alerting"]["alertmanagers"] for s in a["static_configs"] for t in s["targets"]]
    assert [_host(x) for x in am] == ["alertmanager"] and [_port(x) for x in am] == [9093]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (Debian: prometheus / prometheus-alertmanager; .ci/run installs them)")
    return path


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=DEPLOY, capture_output=True, text=True, timeout=120)


def test_promtool_checks_configs_and_rules():
    promtool = _tool("promtool")
    for cfg in ("prometheus/prometheus.yml", "prometheus/prometheus.compose.yml"):
        r = _run(promtool, "check", "config", cfg)
        assert r.returncode == 0, r.stdout + r.stderr
    r = _run(promtool, "check", "rules", "prometheus/rules.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_rule_unit_tests_pass():
    promtool = _tool("promtool")
    r = _run(promtool, "test", "rules", "prometheus/rules_test.yml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_rule_tests_fail_for_the_naive_increase_rule(tmp_path):
    """The rule tests really test the pitfall: with `increase() > 0` alone they must fail."""
    promtool = _tool("promtool")
    rules = _load("prometheus/rules.yml")
    rules["groups"][0]["rules"][0]["expr"] = (
        'label_replace(sum by (service_name, sglang_cp_rank) '
        '(increase(traces_span_metrics_calls_total{cptrace_violation_HASH="true"}[5m])), "code", "HASH", "", "") or '
        'label_replace(sum by (service_name, sglang_cp_rank) '
        '(increase(traces_span_metrics_calls_total{cptrace_violation_H4="true"}[5m])), "code", "H4", "", "")')
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(DEPLOY / "prometheus" / "rules_test.yml", tmp_path / "rules_test.yml")
    r = subprocess.run([promtool, "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr


def test_amtool_checks_alertmanager_config():
    amtool = _tool("amtool")
    r = _run(amtool, "check-config", "alertmanager/alertmanager.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    am = _load("alertmanager/alertmanager.yml")
    names = {r["name"] for r in am["receivers"]}
    assert am["route"]["receiver"] in names and all(r["receiver"] in names for r in am["route"].get("routes", []))
    assert "code" in am["route"]["group_by"]
    # the page route matches the severity the rule sets
    rules = _load("prometheus/rules.yml")
    sev = {r["labels"]["severity"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert any(f'severity="{s}"' in m for s in sev for rt in am["route"]["routes"] for m in rt["matchers"])


# -- collector -------------------------------------------------------------------------------------------------------
def test_collector_routes_by_trace_id_to_jaeger_shards(jaeger):
    col = _load("collector/config.yaml")
    assert pipeline_errors(col) == []
    lb = col["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    compose = _load("docker-compose.yml")
    jaeger_otlp_grpc = _port(jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    for hp in lb["resolver"]["static"]["hostnames"]:
        assert _host(hp) in compose["services"] and _port(hp) == jaeger_otlp_grpc, hp
    assert "traces" in col["service"]["pipelines"]
    assert "loadbalancing" in col["service"]["pipelines"]["traces"]["exporters"]


def test_collector_tempo_variant_is_the_base_plus_tempo():
    base, tempo = _load("collector/config.yaml"), _load("collector/config-tempo.yaml")
    assert pipeline_errors(tempo) == []
    extra = copy.deepcopy(tempo)
    del extra["exporters"]["otlp/tempo"]
    extra["service"]["pipelines"]["traces"]["exporters"].remove("otlp/tempo")
    assert extra == base
    tcfg = _load("tempo/tempo.yaml")
    assert _port(tempo["exporters"]["otlp/tempo"]["endpoint"]) == _port(
        tcfg["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    assert _host(tempo["exporters"]["otlp/tempo"]["endpoint"]) in _load("docker-compose.yml")["services"]


# -- compose, Tempo, Grafana -------------------------------------------------------------------------------------------
def test_compose_mounts_existing_files_and_ports_agree(jaeger):
    compose = _load("docker-compose.yml")
    services = compose["services"]
    assert {"jaeger", "collector", "prometheus", "alertmanager", "tempo", "grafana"} <= set(services)
    mounts: dict[str, dict[str, str]] = {}
    for name, svc in services.items():
        assert "build" not in svc, f"{name}: compose pulls images; nothing is built (Tempo/Grafana are AGPL)"
        for vol in svc.get("volumes", []):
            src, dst = vol.split(":")[:2]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), f"{name} mounts missing {src}"
                mounts.setdefault(name, {})[dst] = src
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown {dep}"
    # every service's command names a config file it mounts
    for name, svc in services.items():
        cmd = " ".join(svc.get("command", []))
        for path in re.findall(r"(/etc/[\w/.\-]+\.ya?ml)", cmd):
            assert path in mounts.get(name, {}), f"{name}: {path} not mounted"
    col_cmd = " ".join(services["collector"]["command"])
    default_col = re.search(r"\$\{CPTRACE_COLLECTOR_CONFIG:-([\w.\-]+)\}", col_cmd).group(1)
    assert f"/etc/otelcol/{default_col}" in mounts["collector"]
    assert "/etc/otelcol/config-tempo.yaml" in mounts["collector"]

    def published(svc: str) -> set[int]:
        return {int(p.split(":")[-1]) for p in services[svc].get("ports", [])}

    def hosts(svc: str) -> set[str]:
        return {p.rsplit(":", 2)[0] for p in services[svc].get("ports", [])}

    assert all(hosts(s) == {"127.0.0.1"} for s in services if services[s].get("ports"))
    assert services["jaeger"]["environment"]["JAEGER_LISTEN_HOST"] == "0.0.0.0"
    jq = jaeger["extensions"]["jaeger_query"]
    assert {_port(jq["http"]["endpoint"]), _port(jaeger["exporters"]["prometheus"]["endpoint"])} <= published("jaeger")
    col = _load("collector/config.yaml")["receivers"]["otlp"]["protocols"]
    assert {_port(col["grpc"]["endpoint"]), _port(col["http"]["endpoint"])} == published("collector")
    tcfg = _load("tempo/tempo.yaml")
    assert published("tempo") == {tcfg["server"]["http_listen_port"]}
    assert published("prometheus") == {9090} and published("alertmanager") == {9093}
    # Tempo remote-writes span metrics into Prometheus: that needs the receiver flag there
    rw = tcfg["metrics_generator"]["storage"]["remote_write"][0]["url"]
    assert rw.startswith("http://prometheus:9090/")
    assert "--web.enable-remote-write-receiver" in services["prometheus"]["command"]
    assert set(services["tempo"]["profiles"]) == set(services["grafana"]["profiles"]) == {"tempo"}
    # The Jaeger image is the same release as the pinned module (v1.76.0 == v2.13.0).
    assert services["jaeger"]["image"].endswith(":2.13.0")
    assert "github.com/jaegertracing/jaeger v1.76.0" in (DEPLOY / "jaeger" / "go.mod").read_text()


def test_tempo_and_grafana_point_at_compose_services():
    compose = _load("docker-compose.yml")["services"]
    tcfg = _load("tempo/tempo.yaml")
    dims = tcfg["metrics_generator"]["processor"]["span_metrics"]["dimensions"]
    assert "cptrace.violation.HASH" in dims and not set(dims) & HIGH_CARDINALITY
    ds = _load("grafana/provisioning/datasources/cptrace.yaml")["datasources"]
    uids = {d["uid"] for d in ds}
    for d in ds:
        m = re.fullmatch(r"http://([\w\-]+):(\d+)", d["url"])
        assert m and m.group(1) in compose, d["url"]
        published = {int(p.split(":")[-1]) for p in compose[m.group(1)].get("ports", [])}
        assert int(m.group(2)) in published | {9090, 16686, 3200}, d["url"]
    alerting = _load("grafana/provisioning/alerting/cptrace.yaml")
    for g in alerting["groups"]:
        for r in g["rules"]:
            for q in r["data"]:
                assert q["datasourceUid"] in uids | {"__expr__"}
            assert r["condition"] in {q["refId"] for q in r["data"]}
    rule_expr = alerting["groups"][0]["rules"][0]["data"][0]["model"]["expr"]
    assert "offset 5m" in rule_expr and "cptrace_violation_HASH" in rule_expr


# -- scripts and the Go module --------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", ["jaeger/up", "jaeger/down", "prometheus/up", "prometheus/down",
                                    "alertmanager/up", "alertmanager/down", "seaweedfs/up", "seaweedfs/down"])
def test_scripts_are_executable_bash(script):
    p = DEPLOY / script
    assert os.access(p, os.X_OK), f"{script} is not executable"
    r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_go_module_pins_jaeger_as_a_tool():
    gomod = (DEPLOY / "jaeger" / "go.mod").read_text()
    assert re.search(r"^tool github\.com/jaegertracing/jaeger/cmd/jaeger$", gomod, re.M)
    assert re.search(r"^go 1\.(2[4-9]|[3-9]\d)", gomod, re.M)
    gosum = (DEPLOY / "jaeger" / "go.sum").read_text()
    assert "github.com/jaegertracing/jaeger v1.76.0 h1:" in gosum
    ignored = (ROOT / ".gitignore").read_text()
    assert "/deploy/jaeger/bin/" in ignored and "/deploy/jaeger/.run/" in ignored


def test_go_module_pins_seaweedfs_and_its_scripts_leave_nothing_running(tmp_path):
    """deploy/seaweedfs: the weed module's version pinned in go.mod/go.sum, its outputs git-ignored; ``down`` with
    nothing started (an empty run folder) exits 0 and says so."""
    gomod = (DEPLOY / "seaweedfs" / "go.mod").read_text()
    pin = re.search(r"^\tgithub\.com/seaweedfs/seaweedfs (v\S+)", gomod, re.M)
    assert pin and f"github.com/seaweedfs/seaweedfs {pin.group(1)} h1:" in (DEPLOY / "seaweedfs" / "go.sum").read_text()
    ignored = (ROOT / ".gitignore").read_text()
    assert "/deploy/seaweedfs/bin/" in ignored and "/deploy/seaweedfs/.run/" in ignored
    r = subprocess.run(["bash", str(DEPLOY / "seaweedfs" / "down")], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "SEAWEEDFS_RUN_DIR": str(tmp_path)})
    assert r.returncode == 0 and "not running" in r.stdout, (r.stdout, r.stderr)


def test_jaeger_down_is_idempotent_without_a_running_server(tmp_path):
    # A copy of the script in an empty folder: no pid file -> exit 0 and say so; never touches a real server.
    (tmp_path / "down").write_text((DEPLOY / "jaeger" / "down").read_text())
    r = subprocess.run(["bash", str(tmp_path / "down")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "not running" in r.stdout
