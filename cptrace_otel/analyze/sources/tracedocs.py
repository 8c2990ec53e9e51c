"""Trace documents -> the per-rank event lists of each run: OTLP JSON-lines files, Jaeger's JSON (api_v2
``/api/traces``, the UI's downloads, api_v3 ``/api/v3/traces``, OTLP/JSON documents) and traces fetched from a Jaeger
query service, all through one collector (:func:`.otlpfile.collect`), so an event read from any of them is the
event the exporter wrote.

Contract:

* :class:`TraceDocs` accumulates ``per_rank`` (``(run id, rank)`` -> ``[(epoch, seq, ts, Event)]``; the run id is the
  resource's ``cptrace.run_id``, ``""`` for records whose resource has none: those are one run) plus
  :class:`.otlpfile.OtlpInfo` (run ids, levels, malformed lines) and, per source, the events it gave and the services
  it named.
* Runs are kept apart: :meth:`TraceDocs.runs` gives each run's stream on its own, and records of two runs never
  count as one record given twice (the same rank, epoch and seq recur in every run).
* api_v2 (Jaeger model) traces are mapped to OTLP/JSON first (:func:`v2_trace_to_otlp`): process -> resource
  (``serviceName`` -> ``service.name``), span tags -> attributes, logs -> events (the ``event`` field is the
  name; µs timestamps). Nothing the rules read is lost (tags keep their int/float/bool/string types).
* :meth:`TraceDocs.runs` returns each run's merged stream after :meth:`TraceDocs.dedupe`: records of one run and
  rank with the same (epoch, seq) and the same content are one record given twice (two files of the same run, a span
  stored twice) and are kept once. Events are ordered per rank by ``cptrace.seq``, never by the order a backend
  returned them.
* Memory is bounded by :data:`SPILL_AT`, not by the run's length: once OTLP JSON-lines files have added that many
  records, each (run, rank)'s records are sorted and written to an unnamed temporary file (a sorted run:
  :mod:`.sortedruns`) and dropped from memory; :meth:`TraceDocs.dedupe` and :meth:`TraceDocs.events` merge
  the runs lazily (a stable merge: the same order, and the same records kept, as one sort of everything).
  Runs are merged into longer ones as they accumulate (:meth:`.sortedruns.RunFile.compact`), so a merge reads few
  runs, each holding one chunk, however long the input.

Documents in Jaeger's ``{"data": [...]}`` layout are read trace by trace (a trace too large is skipped and reported);
others are parsed whole up to a bound (:meth:`TraceDocs.add_document_file`). The events kept are the run's, like
OTLP files.

A value of the wrong shape (a trace that is a list, tags that are numbers, nesting too deep for ``json``) is
recorded in ``info.malformed`` with its file and line (the line where its JSON value starts; 1 for a document
parsed whole) and adds nothing; the other traces of the document are read.
"""

from __future__ import annotations

import io
import itertools
import json
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from ...model import semconv as sc
from ...model.events import Event
from .inputs import open_text, truncated
from .logs import LogReadError
from .otlpfile import BAD_SHAPE, OtlpInfo, bad_shape, collect, collect_file, json_lines, merge_ranks, merge_streams
from .sortedruns import RECORD_KEY, Run, RunFile, SeqBits, merge

_JS_SAFE = 1 << 53
_EVENT = operator.itemgetter(3)   # a record ``(epoch, seq, ts, Event)``'s Event (in C: no Python frame a record)
SPILL_AT = 20_000   # records held in memory before they are sorted to disk (about 1.5 KiB each while held)
_FINGERPRINTS = ("hicache.h", "hicache.pfp")   # random 63-bit values: a round one is a rounded one
_Doc = TypeVar("_Doc")  # a parsed JSON document, as add_guarded's ``add`` takes it


class TraceDocs:
    """The events of trace documents, before the merge (see the module doc)."""

    def __init__(self) -> None:
        self.info = OtlpInfo()
        self.info.by_run = True
        self.per_rank: dict[tuple[str, int], list[tuple[int, int, int, Event]]] = {}
        self.counts: dict[str, int] = {}           # source -> cptrace events it gave
        self.services: dict[str, set[str]] = {}    # source -> service names seen in it
        self.formats: dict[str, str] = {}          # source -> what it is ("api_v2", "api_v3", "OTLP/JSON" ...)
        self.rounded: dict[str, int] = {}          # source -> ints a browser seems to have rounded
        self.duplicates: Counter = Counter()       # (source kept, source dropped) -> records given twice
        self.conflicts: Counter = Counter()        # (source, source) -> same (rank, epoch, seq), other content
        self._line = 1                             # the line of the JSON value being read, for malformed records
        self._disk = RunFile()                     # the sorted runs' temporary file (shared with the views)
        self._runs: dict[tuple[str, int], list[Run]] = {}   # key -> its sorted runs on disk, oldest first
        self._held = 0                             # records added to per_rank since the last spill
        self._srcs: dict[tuple[str, int], set[str]] = {}   # key -> sources of its records on disk
        self._seqs: dict[tuple[str, int], SeqBits] = {}    # key -> the seqs of its records on disk
        self._only: set[str] | None = None         # a view's sources (:meth:`only`): records on disk filtered on read
        self._filtered_n: dict[tuple[str, int], int] = {}   # a view's records on disk per key, counted once

    # -- reading -----------------------------------------------------------------------------------------------
    def total(self) -> int:
        return sum(self._n(k) for k in self._keys())

    def _keys(self) -> set[tuple[str, int]]:
        return set(self.per_rank) | set(self._runs)

    def _n(self, key: tuple[str, int]) -> int:
        """Records of ``key`` (run id, rank), in memory and on disk (a view's on disk counted as read)."""
        if key in self._runs and self._only is not None:
            # a view is never changed once built: its filtered records are read once to be counted, not per call
            n = self._filtered_n.get(key)
            if n is None:
                n = self._filtered_n[key] = sum(1 for _t in self._sorted(key))
            return n
        return len(self.per_rank.get(key, ())) + sum(n for _o, n in self._runs.get(key, ()))

    def count(self, rank: int) -> int:
        """Records of ``rank``, all runs."""
        return sum(self._n(k) for k in self._keys() if k[1] == rank)

    def _maybe_spill(self, added: int) -> None:
        """After a line added ``added`` records: spill once :data:`SPILL_AT` are held. Counted, not summed over
        ``per_rank`` per line: its keys are (run, rank), so a file of many runs made that quadratic."""
        self._held += added
        if self._held >= SPILL_AT:
            self._spill()

    def _spill(self) -> None:
        """Each rank's records in memory -> one sorted run on disk (stable sort by (epoch, seq, ts))."""
        for rank, lst in self.per_rank.items():
            if not lst:
                continue
            lst.sort(key=RECORD_KEY)
            self._srcs.setdefault(rank, set()).update(t[3].src for t in lst)
            seen = self._seqs.get(rank)
            if seen is None:
                seen = self._seqs[rank] = SeqBits()
            seen.add(lst)
            runs = self._runs.setdefault(rank, [])
            runs.append(self._disk.write(lst))
            lst.clear()   # in place: collect_file holds this list's dict
            self._disk.compact(runs)
        self._held = 0

    def _sorted(self, key: tuple[str, int]) -> Iterator[tuple]:
        """The records of ``key`` sorted by (epoch, seq, ts): its runs on disk, then its records in memory, merged
        stably (ties keep the order they were read in)."""
        lst = self.per_rank.get(key, [])
        lst.sort(key=RECORD_KEY)
        runs = [self._disk.read(o, n) for o, n in self._runs.get(key, ())]
        if not runs:
            return iter(lst)
        merged = merge([*runs, iter(lst)])
        only = self._only
        return merged if only is None else (t for t in merged if t[3].src in only)

    def add_otlp_lines(self, path: str) -> int:
        """An OTLP JSON-lines file; returns the cptrace events it gave."""
        n0 = self.total()
        self._held = sum(len(v) for v in self.per_rank.values())   # (documents read before add to it)
        collect_file(path, self.info, self.per_rank, self._maybe_spill)
        self.formats[path] = "OTLP JSON lines"
        n = self._counted(path, n0)
        if n == 0:   # only to say what the file held instead: the services of its resources
            svc = self.services.setdefault(path, set())
            with open_text(path) as fh:
                for _line, req in json_lines(fh, path, OtlpInfo()):   # (malformed lines were recorded above)
                    if isinstance(req, dict):
                        try:
                            svc.update(_services(req))
                        except BAD_SHAPE:
                            pass
        return n

    def add_document_file(self, path: str) -> int:
        """A Jaeger/OTLP JSON document (or JSON lines of them); returns the cptrace events it gave. Raises
        :class:`LogReadError` when it cannot be read.

        Bounded memory: Jaeger's ``{"data": [...]}`` layout is read as a stream, one trace at a time
        (:func:`.jaeger.iter_data`); a trace larger than ``CPTRACE_QUERY_MAX_TRACE_BYTES`` is scanned past, not held,
        and recorded as malformed with its id. Any other layout is read whole up to ``CPTRACE_QUERY_MAX_BYTES``
        characters; a larger one is refused (LogReadError) rather than read into gigabytes."""
        from .httpio import limits_from_env
        from .jaegerstream import DATA_HEAD, JaegerError, Unread, iter_data

        n0 = self.total()
        lim = limits_from_env()
        try:
            with open_text(path) as fh:
                head = fh.read(64)
                if DATA_HEAD.match(head):
                    self._line = 1
                    self._format(path, "Jaeger JSON (api_v2 /api/traces)")
                    pieces = _pieces(head, fh, lim.max_answer_bytes * 16)
                    try:
                        for tr in iter_data(pieces, path, False, lim.max_trace_bytes):
                            if isinstance(tr, Unread):
                                self.info.malformed.append((path, 1, f"trace {tr.trace_id or '(no id)'}: {tr.reason}"))
                            elif isinstance(tr, dict):
                                self.add_guarded(tr, path, self.add_v2_trace)
                    except JaegerError as e:   # cut short, not JSON past some point: what was read is kept
                        self.info.malformed.append((path, 1, e.body))
                    why = pieces.why or truncated(fh)
                    if why:
                        self.info.malformed.append((path, 1, why))
                    return self._counted(path, n0)
                text = head + fh.read(lim.max_answer_bytes + 1 - len(head))
                if len(text) > lim.max_answer_bytes:
                    raise LogReadError(path, f"a JSON document of more than {lim.max_answer_bytes} characters that "
                                       "is not Jaeger's {\"data\": [...]} layout (read trace by trace): not read "
                                       "(CPTRACE_QUERY_MAX_BYTES raises the bound)")
                why = truncated(fh)
        except OSError as e:
            raise LogReadError(path, e.strerror or str(e)) from None
        if why:
            self.info.malformed.append((path, text.count("\n") + 1, why))
        for line, obj in _parse(text, path, self.info):
            self._line = line
            self.add_guarded(obj, path)
        return self._counted(path, n0)

    def add_guarded(self, obj: _Doc, src: str, add: Callable[[_Doc, str], None] | None = None) -> None:
        """``add(obj, src)`` (default :meth:`add_object`), except that a value of the wrong shape is recorded as
        malformed and adds no event."""
        main = self.per_rank
        self.per_rank = {}
        try:
            (add or self.add_object)(obj, src)
        except BAD_SHAPE as e:
            self.info.malformed.append((src, self._line, bad_shape(e)))
            self.per_rank = {}
        finally:
            staged, self.per_rank = self.per_rank, main
        for rank, lst in staged.items():
            main.setdefault(rank, []).extend(lst)

    def add_object(self, obj: object, src: str) -> None:
        """One parsed JSON value: an api_v2 response or trace, an api_v3 response, an OTLP TracesData, or a list."""
        if isinstance(obj, list):
            for x in obj:
                self.add_guarded(x, src)   # one bad trace of a list costs only itself
            return
        if not isinstance(obj, dict):
            self._format(src, "JSON of another kind")
            return
        if "data" in obj:
            self._format(src, "Jaeger JSON (api_v2 /api/traces)")
            for tr in obj.get("data") or []:
                if isinstance(tr, dict):
                    self.add_guarded(tr, src, self.add_v2_trace)
            errs = obj.get("errors") or []
            if errs and not obj.get("data"):
                self._format(src, "a Jaeger error response (" + "; ".join(
                    str(e.get("msg", e) if isinstance(e, dict) else e) for e in errs)[:200] + ")")
        elif "spans" in obj and ("traceID" in obj or "processes" in obj):
            self._format(src, "Jaeger JSON (api_v2 trace)")
            self.add_v2_trace(obj, src)
        elif isinstance(obj.get("result"), dict):
            self._format(src, "Jaeger JSON (api_v3 /api/v3/traces)")
            self.add_otlp(obj["result"], src)
        elif "resourceSpans" in obj or "resource_spans" in obj:
            self._format(src, "OTLP/JSON")
            self.add_otlp(obj, src)
        elif "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self._format(src, f"a Jaeger api_v3 error response ({str(msg)[:200]})")
        else:
            self._format(src, f"JSON of another kind (keys: {', '.join(list(map(str, obj))[:6]) or 'none'})")

    def add_otlp(self, td: dict, src: str) -> None:
        """An OTLP/JSON ``TracesData`` (api_v3 ``result``, or an ``ExportTraceServiceRequest``)."""
        self.services.setdefault(src, set()).update(_services(td))
        collect(td, src, self.info, self.per_rank, self._line)

    def add_v2_trace(self, trace: dict, src: str) -> None:
        """One trace in Jaeger's JSON model (``traceID``, ``spans``, ``processes``)."""
        td = v2_trace_to_otlp(trace, self, src)
        self.services.setdefault(src, set()).update(
            a["value"]["stringValue"] for rs in td["resourceSpans"] for a in rs["resource"]["attributes"][:1])
        collect(td, src, self.info, self.per_rank, self._line)

    def _format(self, src: str, what: str) -> None:
        self.formats.setdefault(src, what)

    def _counted(self, src: str, n0: int) -> int:
        n = self.total() - n0
        self.counts[src] = self.counts.get(src, 0) + n
        return n

    def describe(self, src: str) -> str:
        """What ``src`` held, for the message when it gave no cptrace record."""
        what = self.formats.get(src, "JSON")
        svc = sorted(self.services.get(src) or ())
        if svc:
            what += f" of service{'s' if len(svc) > 1 else ''} {', '.join(svc[:5])}" + (" ..." if len(svc) > 5 else "")
        return what

    # -- the stream --------------------------------------------------------------------------------------------
    def dedupe(self) -> None:
        """Sort each rank by (epoch, seq, ts) and keep one of the records given twice (see the module doc); counts go
        to :attr:`duplicates` and :attr:`conflicts`. With runs on disk, a rank whose records hold no seq twice
        (:class:`.sortedruns.SeqBits`) is not read at all, a rank that held a record twice has its kept records
        written as one new run, and the others keep their runs (merged when read: writing them again cost more than
        the merge)."""
        spilled = bool(self._runs)
        if spilled:
            self._spill()   # (the records still in memory become the last run of their rank)
        for rank in list(self._runs) if spilled else list(self.per_rank):
            if not spilled:
                kept = list(self._kept(rank, count=True))
                if len(kept) != len(self.per_rank[rank]):
                    self.per_rank[rank] = kept
                continue
            seqs = self._seqs.get(rank)
            if seqs is not None and not seqs.clash:
                continue   # every seq once: no two records share an (epoch, seq), so none to count or drop
            n = sum(1 for _t in self._kept(rank, count=True))
            if n != sum(k for _o, k in self._runs[rank]):   # (records dropped: the kept ones as one run)
                out = self._disk.writer()
                for t in self._kept(rank, count=False):
                    out.append(t)
                self._runs[rank] = [out.close()]

    def _kept(self, rank: tuple[str, int], count: bool) -> Iterator[tuple]:
        """The records of ``rank`` in order, one of each record given twice: a record with the (epoch, seq) of the
        record kept before it and the same tag and fields is dropped (counted in :attr:`duplicates` when ``count``);
        one with other content is kept (counted in :attr:`conflicts`)."""
        first = None   # the first kept record of the current (epoch, seq)
        for t in self._sorted(rank):
            if first is not None and t[0] == first[0] and t[1] == first[1]:
                a, b = first[3], t[3]
                if a.tag == b.tag and a.fields == b.fields:
                    if count:
                        self.duplicates[(a.src, b.src)] += 1
                    continue
                if count:
                    self.conflicts[(a.src, b.src)] += 1
            else:
                first = t
            yield t

    def runs(self) -> list[tuple[str, Iterator[Event]]]:
        """``(run id, events)`` per run, sorted by run id; each run's ranks merged by ts
        (:func:`.otlpfile.merge_ranks`; :func:`.otlpfile.merge_streams` of the sorted streams once on disk)."""
        by: dict[str, list[tuple[str, int]]] = {}
        for key in sorted(self._keys()):
            if self._n(key):
                by.setdefault(key[0], []).append(key)
        if not self._runs:
            return [(run, merge_ranks({k[1]: self.per_rank[k] for k in keys})) for run, keys in by.items()]
        return [(run, merge_streams([map(_EVENT, self._sorted(k)) for k in keys])) for run, keys in by.items()]

    def events(self) -> Iterator[Event]:
        """Every run's events, one run after the other (see :meth:`runs`)."""
        return itertools.chain.from_iterable(evs for _run, evs in self.runs())

    def run_ids(self) -> list[str]:
        """The runs that hold a record, sorted (``""``: records with no run id)."""
        return sorted({k[0] for k in self._keys() if self._n(k)})

    def keep_run(self, run: str) -> None:
        """Drop the records of every other run."""
        self.per_rank = {k: v for k, v in self.per_rank.items() if k[0] == run}
        self._runs = {k: v for k, v in self._runs.items() if k[0] == run}
        self._srcs = {k: v for k, v in self._srcs.items() if k[0] == run}

    def drop_sources(self, srcs: set[str], run: str | None = None) -> None:
        """Drop the records read from ``srcs`` (trace files not to be analysed), of ``run`` only when given. Records
        on disk are dropped by writing the rest as a new sorted run."""
        for key in list(self._keys()):
            if run is not None and key[0] != run:
                continue
            if key in self._runs:
                if not self._srcs.get(key, set()) & srcs and not any(t[3].src in srcs for t in
                                                                   self.per_rank.get(key, ())):
                    continue
                w = self._disk.writer()
                for t in self._sorted(key):
                    if t[3].src not in srcs:
                        w.append(t)
                self._runs[key] = [w.close()]
                self.per_rank.pop(key, None)
                self._srcs[key] = self._srcs.get(key, set()) - srcs
                continue
            lst = self.per_rank[key]
            kept = [t for t in lst if t[3].src not in srcs]
            if len(kept) != len(lst):
                self.per_rank[key] = kept

    def _view(self) -> TraceDocs:
        view = TraceDocs()
        view.info, view._disk = self.info, self._disk
        return view

    def only(self, srcs: set[str]) -> TraceDocs:
        """A view holding only the records read from ``srcs`` (shares :attr:`info` and the runs on disk, which it
        filters as it reads them)."""
        view = self._view()
        for key, lst in self.per_rank.items():
            kept = [t for t in lst if t[3].src in srcs]
            if kept:
                view.per_rank[key] = kept
        for key, runs in self._runs.items():
            if self._srcs.get(key, set()) & srcs:
                view._runs[key], view._srcs[key] = runs, self._srcs[key] & srcs
                view._only = srcs
        return view

    def by_run(self) -> dict[str, TraceDocs]:
        """A view per run (sharing :attr:`info` and the runs on disk), built in one pass."""
        out: dict[str, TraceDocs] = {}
        for key in self._keys():
            view = out.get(key[0])
            if view is None:
                view = out[key[0]] = self._view()
                view._only = self._only
            if key in self.per_rank:
                view.per_rank[key] = self.per_rank[key]
            if key in self._runs:
                view._runs[key], view._srcs[key] = self._runs[key], self._srcs.get(key, set())
        return out

    def sources(self) -> set[str]:
        """The sources that gave a record still held."""
        out = {t[3].src for lst in self.per_rank.values() for t in lst}
        for key in self._runs:
            out |= self._srcs.get(key, set())
        return out

    def ranks(self) -> set[int]:
        return {k[1] for k in self._keys() if self._n(k)}

    def sources_of(self, rank: int) -> list[str]:
        out = {t[3].src for k, lst in self.per_rank.items() if k[1] == rank for t in lst}
        for k in self._runs:
            if k[1] == rank:
                out |= self._srcs.get(k, set())
        return sorted(out)

    def head(self, rank: int, k: int) -> list[Event]:
        """The first ``k`` records of ``rank`` in seq order (after :meth:`dedupe`), of the first run that holds it."""
        for run in self.run_ids():
            key = (run, rank)
            if self._n(key):
                return [t[3] for t in itertools.islice(self._sorted(key), k)]
        return []


class _pieces:
    """The text of an open document in 1 MiB pieces, after its ``head``; stops past ``limit`` characters (``why``
    then says so)."""

    def __init__(self, head: str, fh: io.TextIOBase, limit: int) -> None:
        self.head, self.fh, self.limit, self.why, self.n = head, fh, limit, "", 0

    def __iter__(self) -> Iterator[str]:
        yield self.head
        self.n = len(self.head)
        while True:
            piece = self.fh.read(1 << 20)
            if not piece:
                return
            self.n += len(piece)
            if self.n > self.limit:
                self.why = f"document longer than {self.limit} characters: reading stopped there"
                return
            yield piece


def _services(td: dict) -> set[str]:
    out = set()
    for rs in td.get("resourceSpans") or td.get("resource_spans") or []:
        for a in (rs.get("resource") or {}).get("attributes") or []:
            if a.get("key") == sc.SERVICE_NAME:
                out.add(str((a.get("value") or {}).get("stringValue", "?")))
    return out


def _parse(text: str, path: str, info: OtlpInfo) -> Iterable[tuple[int, Any]]:
    """``(line, value)``: the whole text as one JSON value, or else one value per non-blank line (malformed lines
    are recorded in ``info``)."""
    try:
        return [(1, json.loads(text))]
    except (ValueError, RecursionError):
        pass
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((i, json.loads(line)))
            except RecursionError:
                info.malformed.append((path, i, "not JSON: nested too deeply"))
            except ValueError as e:
                info.malformed.append((path, i, f"not JSON: {e}"))
    return out


# -- Jaeger's JSON model (api_v2) -> OTLP/JSON ----------------------------------------------------------------------
def v2_trace_to_otlp(trace: dict, docs: TraceDocs | None = None, src: str = "") -> dict:
    """The OTLP/JSON ``TracesData`` holding what ``collect`` reads from one Jaeger-model trace: one resource per
    process, spans with their tags as attributes and their logs as events."""
    procs = trace.get("processes") or {}
    groups: dict[str, tuple[dict, list]] = {}
    for span in trace.get("spans") or []:
        if not isinstance(span, dict):
            continue
        proc = span.get("process")
        pid = span.get("processID") or ""
        if not isinstance(proc, dict):
            proc = procs.get(pid) or {}
        else:
            pid = id(proc)
        g = groups.get(pid)
        if g is None:
            res = [{"key": sc.SERVICE_NAME, "value": {"stringValue": str(proc.get("serviceName", ""))}}]
            res.extend(_attrs(proc.get("tags"), docs, src))
            g = groups[pid] = ({"attributes": res}, [])
        events = []
        for log in span.get("logs") or []:
            name = ""
            fields = []
            for f in log.get("fields") or []:
                if f.get("key") == "event" and not name:
                    name = str(f.get("value", ""))
                else:
                    fields.append(f)
            ts = log.get("timestamp", 0)
            events.append({"timeUnixNano": int(ts) * 1000 if isinstance(ts, (int, float, str)) else 0,
                           "name": name, "attributes": _attrs(fields, docs, src)})
        g[1].append({"traceId": span.get("traceID", trace.get("traceID", "")), "spanId": span.get("spanID", ""),
                     "name": span.get("operationName", ""), "attributes": _attrs(span.get("tags"), docs, src),
                     "events": events})
    return {"resourceSpans": [{"resource": res, "scopeSpans": [{"spans": spans}]}
                              for res, spans in groups.values()]}


def _attrs(tags: Any, docs: TraceDocs | None, src: str) -> list[dict]:
    return [{"key": t.get("key"), "value": _value(t, docs, src)} for t in tags or () if isinstance(t, dict)]


def _value(tag: dict, docs: TraceDocs | None, src: str) -> dict:
    """A Jaeger tag ``{key, type, value}`` as an OTLP ``AnyValue`` (the type is inferred when missing)."""
    v = tag.get("value")
    t = str(tag.get("type", "")).lower()
    if t in ("int64", "int") or (not t and type(v) is int):
        try:
            v = int(v)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):   # (OverflowError: Infinity, which Python's json reads)
            return {"stringValue": str(v)}
        if docs is not None and abs(v) > _JS_SAFE and tag.get("key") in _FINGERPRINTS and _js_rounded(v):
            docs.rounded[src] = docs.rounded.get(src, 0) + 1
        return {"intValue": v}
    if t in ("float64", "float") or (not t and type(v) is float):
        return {"doubleValue": v}
    if t == "bool" or (not t and type(v) is bool):
        return {"boolValue": v if type(v) is bool else str(v).lower() == "true"}
    return {"stringValue": v if isinstance(v, str) else json.dumps(v)}


def _js_rounded(v: int) -> bool:
    """True when ``v`` is what JavaScript prints for the double nearest some int64 (JSON.stringify in a browser, e.g.
    the Jaeger UI's "Download Results"): the shortest decimal of that double, padded with zeros. A genuine 63-bit
    value looks like that about once in a thousand."""
    from decimal import Decimal

    return int(Decimal(repr(float(v)))) == v
