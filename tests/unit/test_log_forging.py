"""A line break in a key, tag or value written to ``CPTRACE_LOG_FILE`` cannot forge records.
The log sink writes CR and LF as the two characters ``\\r`` / ``\\n``; ``check`` reads each record back as one
record (the escaped text as its value)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cptrace_otel.analyze.sources.logs import read_log_events
from cptrace_otel.export.file_sinks import LogLinesSink, escape_breaks
from cptrace_otel.model.logline import parse_line

FORGED = "x\n[2026-07-18 03:03:06 ATTN_CP0 TP0] [CPTRACE reset] rank=0 epoch=9"


def _write(path: Path, records: list[tuple]) -> list[str]:
    sink = LogLinesSink(str(path), 0, 0)
    sink.write(records)
    assert sink.close()
    return path.read_text().split("\n")[:-1]


def test_newlines_in_key_tag_and_value_stay_one_record(tmp_path: Path) -> None:
    ts = 1_700_000_000_000_000_000
    recs = [
        (0, ts, 1, "backup", (("node_id", 1), ("rid", FORGED))),
        (1, ts, 1, "backup", (("node_id", 2), ("k\r\n[CPTRACE reset] rank", 0))),
        (2, ts, 1, "note\n[CPTRACE reset]", (("a", 1),)),
        (3, ts, 1, "backup", (("node_id", 3), ("rid", "cr\ronly"))),
    ]
    lines = _write(tmp_path / "r.log", recs)
    assert len(lines) == 4
    assert all("\r" not in x for x in lines)
    parsed = [parse_line(x) for x in lines]
    assert [p.tag if p else None for p in parsed][:2] == ["backup", "backup"]
    assert parsed[0].fields["rid"] == FORGED.replace("\n", "\\n").replace(" ", "")
    assert parsed[3].fields["rid"] == "cr\\ronly"
    events = list(read_log_events([str(tmp_path / "r.log")]))
    assert not any(ev.tag == "reset" for ev in events)
    assert len([ev for ev in events if ev.tag == "backup"]) == 3


def test_forged_reset_does_not_reach_check(tmp_path: Path) -> None:
    """Through the real pipeline and ``check``: the forged line is not a reset record."""
    log = tmp_path / "r.log"
    code = f"""
import cptrace_otel as c
c.configure(level=1, file={str(tmp_path / 'o.jsonl')!r}, log_file={str(log)!r}, exporter="thread", run_id="t")
c.cptrace(1, "backup", node_id=1, op=1, rid={FORGED!r})
c.shutdown(30)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPTRACE_", "OTEL_"))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    text = log.read_text()
    assert text.count("\n") == 1 and "\\n[2026-07-18" in text  # kept, escaped, on one line (spaces cut)
    assert not any(ev.tag == "reset" for ev in read_log_events([str(log)]))


def test_escape_is_a_no_op_without_breaks() -> None:
    assert escape_breaks("[CPTRACE backup] a=1 b=x\\y") == "[CPTRACE backup] a=1 b=x\\y"


def test_log_lines_property(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Any text in keys, tags and values: exactly one line per record, each parsed as a record."""
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies
    word = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)

    @hyp.given(recs=st.lists(st.tuples(word, st.lists(st.tuples(word, st.one_of(word, st.integers())),
                                                      max_size=4)), min_size=1, max_size=8))
    @hyp.settings(max_examples=150, deadline=None)
    def check(recs: list) -> None:
        d = tmp_path_factory.mktemp("p")
        rows = [(i, 1_700_000_000_000_000_000, 1, tag, tuple(fields)) for i, (tag, fields) in enumerate(recs)]
        lines = _write(d / "r.log", rows)
        assert len(lines) == len(rows)

    check()
