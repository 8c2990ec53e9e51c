"""The repo's Jaeger configuration (``deploy/jaeger/config.yaml``) moved onto loopback ports of its own, for a Jaeger
process that is not the shared one: the private Jaeger of the integration tests (``tests/helpers/integration.py``) and
the Jaeger of ``bench/watch_memory.py``. Needs PyYAML only (no pytest), so a bench can import it too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "jaeger" / "config.yaml"
PORTS = ("grpc", "http", "query", "query_grpc", "health", "metrics")   # the keys of ``ports`` below
LOOPBACK = "127.0.0.1"


def private_config(ports: dict[str, int], storage: dict[str, Any] | None = None,
                   spanmetrics: str | None = None) -> dict[str, Any]:
    """The config with every listener on ``LOOPBACK`` at ``ports`` (keys :data:`PORTS`: OTLP gRPC and HTTP, query
    HTTP and gRPC, health, Jaeger's own metrics); the storage backend ``mem`` replaced by ``storage`` when given
    (e.g. ``{"badger": {...}}``), else the repo's memory store; span metrics served at ``spanmetrics``
    (``host:port``, flushed every second) or, without it, turned off."""
    import yaml

    cfg = yaml.safe_load(CONFIG.read_text())
    otlp = cfg["receivers"]["otlp"]["protocols"]
    otlp["grpc"]["endpoint"] = f"{LOOPBACK}:{ports['grpc']}"
    otlp["http"]["endpoint"] = f"{LOOPBACK}:{ports['http']}"
    ext = cfg["extensions"]
    ext["jaeger_query"]["http"]["endpoint"] = f"{LOOPBACK}:{ports['query']}"
    ext["jaeger_query"]["grpc"]["endpoint"] = f"{LOOPBACK}:{ports['query_grpc']}"
    ext["healthcheckv2"]["http"]["endpoint"] = f"{LOOPBACK}:{ports['health']}"
    if storage is not None:
        ext["jaeger_storage"]["backends"] = {"mem": storage}
    if spanmetrics:
        cfg["exporters"]["prometheus"]["endpoint"] = spanmetrics
        cfg["connectors"]["spanmetrics"]["metrics_flush_interval"] = "1s"
    else:
        del cfg["connectors"], cfg["exporters"]["prometheus"], cfg["service"]["pipelines"]["metrics/spanmetrics"]
        cfg["service"]["pipelines"]["traces"]["exporters"] = ["jaeger_storage_exporter"]
    cfg["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"] = {
        "host": LOOPBACK, "port": ports["metrics"]}
    return cfg
