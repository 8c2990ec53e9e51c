"""The two readers of OTLP JSON lines (the C reader, ``_speedups/otlpjson.c``, and its Python twin, json and
``otlpfile.collect``) held equal over a whole file: what tests of real runs call on the files they wrote."""

from __future__ import annotations

from typing import Any

from cptrace_otel._speedups import twin_off
from cptrace_otel.analyze.sources import otlpfile
from cptrace_otel.analyze.sources.otlpfile import OtlpInfo, collect_file
from tests.unit.test_otlp_intake_c import typed

_INFO = ("run_ids", "levels", "malformed", "spans", "streams", "sampled", "run_levels", "run_sampled")


def events_snapshot(per_rank: dict) -> Any:
    """``per_rank`` (key -> [(epoch, seq, ts, Event)]) with every part typed, keys in their order."""
    def ev(e: Any) -> Any:
        return (e.tag, typed(e.rank), typed(e.seq), typed(e.ts), typed(e.epoch), typed(e.level), e.src, e.line_no,
                typed(e.fields))

    return [(typed(k), [(typed(t[0]), typed(t[1]), typed(t[2]), ev(t[3])) for t in lst]) for k, lst in per_rank.items()]


def info_snapshot(info: OtlpInfo) -> Any:
    return typed({k: getattr(info, k) for k in _INFO})


def assert_file_alike(path: str) -> dict[str, Any]:
    """Read ``path`` with the C reader (where it answers) and with the twin alone, keyed by rank and by (run, rank);
    assert the two give the same records and reports. Returns ``lines`` (lines handed to C), ``answered`` (lines C
    read itself), ``events`` and ``malformed`` (the twin's reports)."""
    c = otlpfile.c_reader()
    assert c is not None, "the C reader of OTLP JSON lines is not built"
    seen = {"lines": 0, "answered": 0}

    def counted(line: str | bytes, src: str) -> Any:
        got = c(line, src)
        seen["lines"] += 1
        seen["answered"] += got is not None
        return got

    out: dict[str, Any] = {}
    for by_run in (False, True):
        snaps = []
        for reader in (counted, None):
            info, per_rank = OtlpInfo(), {}
            info.by_run = by_run
            with twin_off(vars(otlpfile), "C_READER"):
                otlpfile.C_READER = reader   # (None: the twin; twin_off puts the loaded reader back)
                collect_file(path, info, per_rank)
            snaps.append((events_snapshot(per_rank), info_snapshot(info)))
            out.update(events=sum(len(v) for v in per_rank.values()), malformed=info.malformed)
        assert snaps[0] == snaps[1]
    out.update(lines=seen["lines"] // 2, answered=seen["answered"] // 2)
    return out
