"""Findings -> span marks: what an online finding puts on the span that holds its record (trace model v2).

Contract (:func:`stamp_findings`):

* span attributes from :func:`cptrace_otel.model.spans.violation_attributes` (``cptrace.violation`` comma-joined, plus
  ``cptrace.violation.<CODE>=true`` per code), ``cptrace.violation.rules``, ``cptrace.certainty``;
* status ERROR whose message holds every finding, in finding order: ``CODE: message [evidence: seq 171 backup op=5
  rank 3, ...]`` joined by ``"; "`` (the UI shows the status message, so no finding hides behind the first);
* one ``hicache.violation`` event per finding (code, rule, certainty, evidence_seq, message, evidence), at the time of
  its last evidence record held by the span (else the span's end);
* one OTLP span link per *other* span that holds evidence (``cptrace.link.kind=evidence``, the codes and seqs), found
  through ``refs`` (seq -> (trace id, span id, tag, op) of recent records, kept by the builder): e.g. HASH on a
  reload links to the backup's d2h span. Evidence older than the builder's memory is named by seq only.

Finding messages themselves are the checker's (``check`` prints the same text); the evidence description is added
here, on the span.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from . import semconv as sc
from .reqlink import LinkedSpan

if TYPE_CHECKING:
    from .attrs import EventAttrs

STATUS_ERROR = 2  # OTLP Status.code ERROR


def violation_attributes(codes: Iterable[str]) -> dict[str, Any]:
    """Span attributes for a span holding findings with ``codes``: ``cptrace.violation`` (sorted, comma-joined, as
    before) plus one boolean ``cptrace.violation.<CODE>=true`` per code, so a one-code tag search
    (``cptrace.violation.HASH=true``) finds the span whatever other codes it carries, and span metrics get one
    dimension per code. The one place these keys are made (the exporter's online checks use it; the watcher should,
    as ``cptrace_otel.model.spans.violation_attributes``)."""
    cs = sorted({str(c) for c in codes if c})
    out: dict[str, Any] = {sc.VIOLATION: ",".join(cs)}
    for c in cs:
        out[sc.VIOLATION_CODE_PREFIX + c] = True
    return out


def describe_evidence(seqs: list[int], refs: dict[int, tuple[bytes, bytes, str, Any]], rank: int) -> str:
    """``"seq 171 backup op=5 rank 3, seq 175 reload op=6 rank 3"``: the evidence records as far as known."""
    out = []
    for s in seqs:
        r = refs.get(s)
        if r is None:
            out.append(f"seq {s} rank {rank}")
        else:
            op = "" if r[3] is None else f" op={r[3]}"
            out.append(f"seq {s} {r[2]}{op} rank {rank}")
    return ", ".join(out)


class FindingSpan(LinkedSpan, Protocol):
    """What :func:`stamp_findings` reads and marks: a :class:`cptrace_otel.model.spans.Span` (a Protocol because that
    module imports this one)."""

    status_code: int
    status_message: str

    @property
    def findings(self) -> list[Any]: ...

    @property
    def events(self) -> list[tuple[int, str, EventAttrs | dict[str, Any]]]: ...

    @property
    def end(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def span_id(self) -> bytes: ...


def stamp_findings(sp: FindingSpan, refs: dict[int, tuple[bytes, bytes, str, Any]]) -> None:
    """Mark ``sp`` with its findings (see the module docstring)."""
    findings = sp.findings
    codes = [str(getattr(f, "code", "?")) for f in findings]
    rules = sorted({str(getattr(f, "rule", "")) for f in findings} - {""})
    certs = {str(getattr(f, "certainty", "")) for f in findings}
    sp.attrs.update(violation_attributes(codes))
    if rules:
        sp.attrs[sc.VIOLATION_RULES] = ",".join(rules)
    sp.attrs[sc.CERTAINTY] = "exact" if "exact" in certs else (sorted(certs)[0] if certs else "")
    sp.status_code = STATUS_ERROR
    ts_of_seq = {a.get(sc.SEQ): t for t, _, a in sp.events}
    messages = []
    linked: dict[bytes, tuple[bytes, list[str], list[int]]] = {}
    for f, code in zip(findings, codes, strict=False):
        ev_seqs = [int(x) for x in (getattr(f, "evidence", None) or []) if isinstance(x, int)]
        ts = sp.end
        for s in reversed(ev_seqs):
            if s in ts_of_seq:
                ts = ts_of_seq[s]
                break
        desc = describe_evidence(ev_seqs, refs, sp.rank)
        msg = str(getattr(f, "message", "") or code)
        messages.append(f"{code}: {msg}" + (f" [evidence: {desc}]" if desc else ""))
        sp.events.append((ts, sc.EVENT_VIOLATION, {
            sc.V_CODE: code,
            sc.V_RULE: str(getattr(f, "rule", "")),
            sc.V_CERTAINTY: str(getattr(f, "certainty", "")),
            sc.V_EVIDENCE: ",".join(str(s) for s in ev_seqs),
            sc.V_MESSAGE: str(getattr(f, "message", "")),
            sc.V_EVIDENCE_DESC: desc,
        }))
        for s in ev_seqs:
            r = refs.get(s)
            if r is None or r[1] == sp.span_id:
                continue
            tid, cs, ss = linked.setdefault(r[1], (r[0], [], []))
            if code not in cs:
                cs.append(code)
            if s not in ss:
                ss.append(s)
    sp.status_message = "; ".join(messages)
    for sid, (tid, cs, ss) in linked.items():
        sp.links.append((tid, sid, {sc.LINK_KIND: "evidence", sc.V_CODE: ",".join(cs),
                                    sc.V_EVIDENCE: ",".join(str(s) for s in ss)}))
