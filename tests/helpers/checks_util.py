"""Helpers for the checker tests: run hand-written upstream lines through the log source and the analysis."""

from __future__ import annotations

import os

from cptrace_otel.analyze.engine import Analysis, Result
from cptrace_otel.analyze.sources.logs import read_log_events

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")


def R(lo: int, hi: int) -> str:
    """A dense ``rng`` summary of slots lo..hi (inclusive)."""
    return f"(cnt={hi - lo + 1},min={lo},max={hi},first={lo},last={hi})"


def check_lines(tmp_path, lines: list[str], level: int | None = None, name: str = "rank0.log") -> Result:
    p = tmp_path / name
    p.write_text("".join(x + "\n" for x in lines))
    return Analysis(level).run(read_log_events([str(p)]))


def write_ranks(tmp_path, per_rank: dict[int, list]) -> list[str]:
    """One ``rank<r>.log`` per rank; a line is a string (its ``ts`` is then its index, the same on every rank: ranks
    in lockstep) or a ``(ts, line)`` pair."""
    paths = []
    for r, lines in per_rank.items():
        p = tmp_path / f"rank{r}.log"
        p.write_text("".join(f"{x[1]} ts={x[0]}\n" if isinstance(x, tuple) else f"{x} ts={1000 + i}\n"
                             for i, x in enumerate(lines)))
        paths.append(str(p))
    return paths


def check_files(paths: list[str], level: int | None = None) -> Result:
    return Analysis(level).run(read_log_events(paths))


def rules(res: Result) -> set[str]:
    return {f.rule for f in res.findings}
