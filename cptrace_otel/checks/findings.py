"""What a check reports: :class:`Finding` (a violation) and :class:`Unchecked` (a rule that could not run)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .registry import CODES  # noqa: F401  (re-exported: the finding codes, in report order)

ERROR, WARN = "ERROR", "WARN"
UNDECIDABLE = "undecidable"   # Unchecked.kind of an overlap the rng summaries cannot decide
_SEVERITY_RANK = {ERROR: 0, WARN: 1}


@dataclasses.dataclass(slots=True)
class Finding:
    """One violation. ``evidence`` are the seqs (in ``rank``'s stream) of the records that prove it, the last one
    being the record at which it completed (the exporter stamps the finding on the span holding that record).
    ``certainty`` is "exact" or "interval"; an interval-only finding is a WARN, never an ERROR (docs/domain.md §3.1)."""

    code: str
    rule: str
    rank: int
    epoch: int
    node_id: int | None
    op: int | None
    certainty: str
    evidence: list[int]
    message: str
    severity: str = ERROR
    src: str = ""                      # file (or "live", or a URL) of the record that completed the finding
    line_no: int = 0                   # its line in ``src`` (0 when unknown)
    evidence_lines: list[int] = dataclasses.field(default_factory=list)  # line numbers of ``evidence`` (0 unknown)
    run: str = ""                      # the run it was found in (set by the analysis: every rule judges one run)

    def __post_init__(self) -> None:
        if self.certainty != "exact" and self.severity == ERROR:
            self.severity = WARN

    def sort_key(self) -> tuple:
        return (_SEVERITY_RANK.get(self.severity, 9), self.epoch, self.node_id if self.node_id is not None else -1,
                self.rank, self.evidence[-1] if self.evidence else -1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(slots=True)
class Unchecked:
    """A rule that did not run (``kind="level"``: the stream's trace level is below ``need_level``), or instances of
    a rule that were skipped for lack of data (``kind="skip"``, e.g. ``HASH-skipped(split)``), or instances whose
    only breach was an overlap of ``rng`` summaries that cannot be decided (``kind="undecidable"``, ``rule`` the
    rule id: H4a, H4b, H2c, H3, C5-fence). Never a pass."""

    rule: str
    code: str
    rank: int | None
    need_level: int
    reason: str
    kind: str = "level"
    count: int = 1
    examples: list[int | None] = dataclasses.field(default_factory=list)  # a few node ids (None: not known)
    runs: int = 1                      # runs it applies to (the same entry of several runs is listed once)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
