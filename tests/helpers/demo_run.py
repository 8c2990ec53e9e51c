"""A demo run (real rank processes, log and OTLP files in one folder) and ``check`` called in-process, for the tests
of what ``check`` reads."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

from cptrace_otel.cli import parse_args
from cptrace_otel.commands import check as check_cmd

FAULTS = "C1_div,C3_writer,HASH_flip"


def demo(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
    """Run the installed ``cptrace-otel demo`` (the console script when it is on PATH, else the same entry point)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    script = shutil.which("cptrace-otel")
    cmd = [script] if script else [sys.executable, "-m", "cptrace_otel.cli"]
    return subprocess.run([*cmd, "demo", *args], capture_output=True, text=True, timeout=timeout, env=env)


def run_demo(out, ranks: int = 4, faults: str = FAULTS, seed: int = 1) -> dict:
    """``cptrace-otel demo --mode sharded`` into ``out``: its folder, run id, log files and OTLP files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    p = subprocess.run([sys.executable, "-m", "cptrace_otel.cli", "demo", "--ranks", str(ranks), "--mode", "sharded",
                        "--faults", faults, "--seed", str(seed), "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    return {"dir": str(out), "run_id": rep["run_id"],
            "logs": [os.path.join(out, f"rank{r}.log") for r in range(ranks)],
            "otlp": [os.path.join(out, f"rank{r}.otlp.jsonl") for r in range(ranks)]}


def check(*argv: str) -> tuple[int, str, str]:
    """``cptrace-otel check ARGV`` in-process: (exit code, stdout, stderr)."""
    args = parse_args(["check", *argv])
    out, err = io.StringIO(), io.StringIO()
    rc = check_cmd.run(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def core(out: str, keep_run: bool = False) -> list[dict]:
    """The findings of a --json report without where they were read from (the run's name too unless ``keep_run``:
    log files carry no run id, their run is named by its folder)."""
    drop = ("src", "line_no", "evidence_lines", "trace_id", "jaeger_url") + (() if keep_run else ("run",))
    return [{k: v for k, v in f.items() if k not in drop} for f in json.loads(out)["findings"]]
