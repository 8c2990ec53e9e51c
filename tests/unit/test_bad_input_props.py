"""Property tests (Hypothesis) over the input of ``check`` and ``ingest``: whatever bytes a log holds and
whatever JSON an OTLP file holds, the command raises nothing, exits 0/1/2/3, reports each malformed record with
``file:line``, and still reads the good record after the bad ones. Example counts are small (CI runs on 2 cores)."""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402
from test_bad_input import GOOD, otlp_line  # noqa: E402

from cptrace_otel.analyze.sources import logs  # noqa: E402
from cptrace_otel.cli import parse_args  # noqa: E402
from cptrace_otel.commands import ingest  # noqa: E402
from tests.helpers.demo_run import check  # noqa: E402

SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
BIG = "9" * 4400

# -- log lines ---------------------------------------------------------------------------------------------------
_word = st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=12)
_value = st.one_of(
    st.integers().map(str), st.just(BIG), st.just("-" + BIG), _word,
    st.lists(st.one_of(st.integers().map(str), st.just(BIG), st.just("[1,2]")), max_size=4).map(
        lambda xs: "[" + ",".join(xs) + "]"),
    st.builds(lambda a, b: f"(cnt={a},min={b},max={a},first={b},last={a})", st.integers(), st.integers()),
    st.sampled_from(["[1,2]", '"[1,2]"', "[[1],[2]]", "1.5e999", "nan", "-0", "00", "(cnt=1)", "[", "]", "="]))
_key = st.one_of(st.sampled_from(["node_id", "op", "rank", "ts", "seq", "chain", "h", "pub", "epoch", "ok", "n"]),
                 _word)
_tag = st.one_of(st.sampled_from(["prepare", "backup", "reload", "ack", "free", "reset", "split", "insert",
                                  "config", "compose", "evict"]), _word)
_record = st.builds(lambda pre, tag, toks: f"{pre}[CPTRACE {tag}] " + " ".join(f"{k}={v}" for k, v in toks),
                    st.sampled_from(["", "[2025-01-01 00:00:00 ATTN_CP1] ", "x "]), _tag,
                    st.lists(st.tuples(_key, _value), max_size=6)).map(str.encode)
_line = st.one_of(_record, st.binary(max_size=60), st.binary(max_size=20).map(lambda b: b"[CPTRACE" + b))
_log = st.lists(_line, max_size=8).map(lambda ls: b"start\n" + b"\n".join(ls) + b"\n" + GOOD.encode())

@contextlib.contextmanager
def _file(name: str, data: bytes) -> Iterator[Path]:
    """``data`` in a fresh folder as ``name`` (a Hypothesis example gets its own: no pytest fixture per example)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_bytes(data)
        yield p


_WARN = re.compile(r"^warning: (.*?):(\d+): malformed line \(", re.M)


def _line_ends(data: bytes) -> int:
    """Line ends as the log readers count them (they read with ``newline=""``, universal newlines): ``\\n``,
    ``\\r\\n`` and a lone ``\\r`` each end a line."""
    return len(re.findall(rb"\r\n|\r|\n", data))


def _warned_at(err: str, path: str) -> list[int]:
    lines = [int(n) for p, n in _WARN.findall(err) if p == path]
    assert len(lines) == err.count("malformed line ("), err   # every report names its file and line
    return lines


@settings(max_examples=150, **SETTINGS)
@given(_log)
def test_check_reads_any_log_bytes(data):
    with _file("rank0.log", data) as p:
        rc, out, err = check("--json", str(p))
        assert rc in (0, 1), err
        assert json.loads(out)["stats"]["events"] >= 1   # the good record after the bad ones was read
        for n in _warned_at(err, str(p)):
            assert 1 <= n <= _line_ends(data) + 1


@settings(max_examples=50, **SETTINGS)
@given(_log)
def test_the_python_log_reader_reads_any_log_bytes(data):
    with logs.python_reader(), _file("rank0.log", data) as p:
        rc, out, err = check("--json", str(p))
        assert rc in (0, 1), err
        assert json.loads(out)["stats"]["events"] >= 1
        _warned_at(err, str(p))


@settings(max_examples=30, **SETTINGS)
@given(_log)
def test_ingest_replays_any_log_bytes(data):
    with _file("rank0.log", data) as p:
        out = p.parent / "o.jsonl"
        args = parse_args(["ingest", "--no-progress", "--file", str(out), str(p)])
        assert ingest.run(args) == 0
        assert '"hicache.node_id","value":{"intValue":"7"}' in out.read_text()   # the good record was sent


# -- OTLP JSON ---------------------------------------------------------------------------------------------------
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
                     | st.just(BIG), lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8),
                                                                                             kids, max_size=3),
                     max_leaves=8)


@st.composite
def _mutated_request(draw) -> str:
    """A valid request with one value somewhere inside replaced by any JSON (or the line replaced by any text)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(st.characters(exclude_characters="\n\r"), max_size=40))
    req = json.loads(otlp_line(0))
    node, parent, key = req, None, None
    for _ in range(draw(st.integers(0, 12))):   # walk down a random path
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            break
        k = draw(st.sampled_from(keys))
        parent, key, node = node, k, node[k]
    if parent is None:
        return json.dumps(draw(_json))
    parent[key] = draw(_json)
    return json.dumps(req)


@settings(max_examples=150, **SETTINGS)
@given(st.lists(_mutated_request(), min_size=1, max_size=3))
@example(lines=["\x00"])   # a NUL on a later line once made the whole file "binary data" (found by this test)
@example(lines=['{"resourceSpans": [{"resource": {"attributes": [{"key": "sglang.cp.rank", "value": {"intValue": '
                'Infinity}}]}, "scopeSpans": []}]}'])   # int(inf): a traceback (found by this test)
@example(lines=["[CPTRACE"])   # the log marker on a later line once made the file a log: exit 3 (found by this test)
@example(lines=["\ud800"])   # a lone surrogate (undecodable bytes in the file; the test could not write it before)
def test_check_reads_any_otlp_json(lines):
    # (surrogatepass: a lone surrogate drawn in a text line is written as the bytes no UTF-8 decoder accepts)
    text = otlp_line(0) + "\n".join(lines) + "\n" + otlp_line(1)
    with _file("rank0.otlp.jsonl", text.encode("utf-8", "surrogatepass")) as p:
        rc, out, err = check("--json", str(p))
        assert rc in (0, 1), err
        assert json.loads(out)["stats"]["events"] >= 2
        for n in _warned_at(err, str(p)):
            assert 2 <= n <= len(lines) + 1
