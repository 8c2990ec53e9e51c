"""config.py: from_env's precedence (override > cptrace variable > OTel signal-specific > OTel generic > default),
bad values warn once and fall back, the /v1/traces rule, the run id."""

from __future__ import annotations

import os
import tempfile
import warnings

import pytest

from cptrace_otel.model import config, semconv as sc
from cptrace_otel.model.config import DEFAULT_FILE, from_env, traces_url


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    config.forget_warnings()  # each test sees every warning once


def _warns(env: dict[str, str], **overrides):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cfg = from_env(env, **overrides)
    return cfg, [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]


def test_defaults() -> None:
    cfg, msgs = _warns({})
    assert msgs == []
    assert (cfg.level, cfg.endpoint, cfg.protocol, cfg.headers, cfg.timeout_s, cfg.compression) == \
        (0, None, "http/protobuf", (), 10.0, "gzip")
    assert cfg.file == DEFAULT_FILE and cfg.log_file is None  # no endpoint: the embedded file sink
    assert (cfg.cp_rank, cfg.tp_rank, cfg.dp_rank, cfg.queue_size, cfg.exporter) == (-1, -1, -1, 262144, "process")
    assert cfg.spool_dir == os.path.join(tempfile.gettempdir(), f"cptrace-spool-{os.getuid()}")
    assert (cfg.span_timeout_s, cfg.checks, cfg.service_name, cfg.resource_attributes) == \
        (1.0, True, "sglang-hicache", ())


def test_level_precedence() -> None:
    assert from_env({"SGLANG_CP_HICACHE_KV_TRACE": "2"}).level == 2
    assert from_env({"CPTRACE_LEVEL": "3", "SGLANG_CP_HICACHE_KV_TRACE": "2"}).level == 3
    assert from_env({"CPTRACE_LEVEL": "", "SGLANG_CP_HICACHE_KV_TRACE": "2"}).level == 2  # empty = unset
    assert from_env({"CPTRACE_LEVEL": " 1 "}).level == 1
    assert from_env({"CPTRACE_LEVEL": "3"}, level=0).level == 0  # an explicit override wins
    assert from_env({"CPTRACE_LEVEL": "3"}, level=None).level == 3  # None overrides nothing


@pytest.mark.parametrize("raw,why", [("high", "is not an integer"), ("-1", "is negative")])
def test_bad_level_warns_once_and_means_off(raw: str, why: str) -> None:
    cfg, msgs = _warns({"CPTRACE_LEVEL": raw})
    assert cfg.level == 0 and len(msgs) == 1 and why in msgs[0] and repr(raw) in msgs[0]
    _, again = _warns({"CPTRACE_LEVEL": raw})
    assert again == []  # once per value


@pytest.mark.parametrize("env,field,want,msg", [
    ({"CPTRACE_CP_RANK": "x"}, "cp_rank", -1, "CPTRACE_CP_RANK='x' is invalid; using -1"),
    ({"CPTRACE_QUEUE_SIZE": "0"}, "queue_size", 262144, "CPTRACE_QUEUE_SIZE='0' is invalid; using 262144"),
    ({"CPTRACE_SPAN_TIMEOUT_S": "-2"}, "span_timeout_s", 1.0, "CPTRACE_SPAN_TIMEOUT_S='-2' is invalid; using 1.0"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "protocol", "http/protobuf", "'http/json' is not supported"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "br"}, "compression", "gzip", "'br' is not supported"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "timeout_s", 10.0, "OTLP timeout 'soon' is invalid"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, "timeout_s", 10.0, "OTLP timeout '0' is invalid"),
    ({"CPTRACE_EXPORTER": "fork"}, "exporter", "process", "CPTRACE_EXPORTER='fork' is not process|thread"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "a=1,broken"}, "headers", (("a", "1"),), "malformed OTLP header entry"),
])
def test_bad_values_warn_and_fall_back(env: dict[str, str], field: str, want, msg: str) -> None:
    cfg, msgs = _warns(env)
    assert getattr(cfg, field) == want
    assert len(msgs) == 1 and msg in msgs[0] and msgs[0].startswith("cptrace_otel: ")


def test_plain_values() -> None:
    cfg = from_env({"CPTRACE_CP_RANK": "3", "CPTRACE_TP_RANK": "1", "CPTRACE_DP_RANK": "0",
                    "CPTRACE_QUEUE_SIZE": "10", "CPTRACE_EXPORTER": " Thread ", "CPTRACE_SPAN_TIMEOUT_S": "0.5",
                    "CPTRACE_FILE": "o-{rank}.jsonl", "CPTRACE_LOG_FILE": "l.log", "CPTRACE_SPOOL_DIR": "/sp",
                    "OTEL_SERVICE_NAME": "svc", "OTEL_RESOURCE_ATTRIBUTES": "team=kv,zone=a%2Cb"})
    assert (cfg.cp_rank, cfg.tp_rank, cfg.dp_rank, cfg.queue_size, cfg.exporter) == (3, 1, 0, 10, "thread")
    assert (cfg.span_timeout_s, cfg.file, cfg.log_file, cfg.spool_dir) == (0.5, "o-{rank}.jsonl", "l.log", "/sp")
    assert cfg.service_name == "svc" and cfg.resource_attributes == (("team", "kv"), ("zone", "a,b"))
    assert cfg.expand(cfg.file) == "o-3.jsonl"
    res = cfg.resource()
    assert res[sc.SERVICE_NAME] == "svc" and res[sc.CP_RANK] == 3 and res["team"] == "kv"
    assert res[sc.PROCESS_PID] == os.getpid()
    assert from_env({"OTEL_RESOURCE_ATTRIBUTES": "service.name=mine"}).resource()[sc.SERVICE_NAME] == "mine"


@pytest.mark.parametrize("raw,want", [("0", False), ("false", False), ("no", False), ("off", False), ("1", True),
                                      ("yes", True), ("", True)])
def test_checks_switch(raw: str, want: bool) -> None:
    assert from_env({"CPTRACE_CHECKS": raw}).checks is want


def test_otel_signal_specific_before_generic() -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2,c=x%20y",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500",
           "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none"}
    cfg = from_env(env)
    assert cfg.protocol == "http/protobuf" and cfg.headers == (("b", "2"), ("c", "x y"))
    assert cfg.timeout_s == 2.5 and cfg.compression == "none"  # the OTel timeout is in milliseconds
    generic = from_env({k: v for k, v in env.items() if "TRACES" not in k})
    assert generic.protocol == "grpc" and generic.headers == (("a", "1"),) and generic.timeout_s == 1.0


def test_endpoint_rules() -> None:
    # the generic endpoint is a base URL: HTTP appends the traces path, gRPC uses it as is
    assert from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}).endpoint == "http://c:4318/v1/traces"
    assert from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/otlp"}).endpoint == "http://c:4318/otlp/v1/traces"
    assert from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317/",
                     "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}).endpoint == "http://c:4317"
    # the signal-specific endpoint is used as is, and wins
    assert from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1",
                     "OTEL_EXPORTER_OTLP_ENDPOINT": "http://g:2"}).endpoint == "http://t:1"
    cfg = from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"})
    assert cfg.traces_url() == cfg.endpoint == "http://t:1/x"
    # with an endpoint there is no default file (CPTRACE_FILE still adds one)
    assert cfg.file is None
    assert from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1", "CPTRACE_FILE": "f"}).file == "f"
    assert from_env({}, endpoint="http://o:1/v1/traces").file is None


@pytest.mark.parametrize("endpoint,protocol,base,want", [
    ("http://h:4318", "http/protobuf", False, "http://h:4318/v1/traces"),
    ("http://h:4318/", "http/protobuf", False, "http://h:4318/v1/traces"),
    ("h:4318", "http/protobuf", False, "http://h:4318/v1/traces"),
    ("http://h:4318/v1/traces", "http/protobuf", False, "http://h:4318/v1/traces"),
    ("https://h/custom", "http/protobuf", False, "https://h/custom"),
    ("h:4317", "grpc", False, "http://h:4317"),
    ("https://h:4317/", "grpc", False, "https://h:4317/"),
    ("http://h:4318", "http/protobuf", True, "http://h:4318/v1/traces"),
    ("http://h:4318/base/", "http/protobuf", True, "http://h:4318/base/v1/traces"),
    ("http://h:4317/", "grpc", True, "http://h:4317"),
])
def test_traces_url(endpoint: str, protocol: str, base: bool, want: str) -> None:
    assert traces_url(endpoint, protocol, base=base) == want


def test_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = from_env({"CPTRACE_RUN_ID": "r1", "TORCHELASTIC_RUN_ID": "te"})
    assert cfg.run_id == "r1" and cfg.run_id_given
    cfg = from_env({"TORCHELASTIC_RUN_ID": "abc"})
    assert cfg.run_id == "te-abc" and not cfg.run_id_given
    a, b = from_env({}), from_env({})
    assert a.run_id == b.run_id and a.run_id.startswith("auto-") and len(a.run_id) == len("auto-") + 12
    assert not a.run_id_given
    assert from_env({"CPTRACE_RUN_ID": ""}).run_id.startswith("auto-")  # empty = unset
    cfg = from_env({}, run_id="mine")
    assert cfg.run_id == "mine" and cfg.run_id_given


def test_unknown_settings_are_an_error() -> None:
    with pytest.raises(TypeError, match="unknown settings"):
        from_env({}, nonsense=1)
    with pytest.raises(TypeError):
        from_env({}, run_id_given=True)  # derived, not a setting
