"""fwd_hash localization (docs/domain.md §4, level 3): an advisory report, never a finding.

Contract
--------
:class:`Localizer` is fed ``fwd_hash`` records only (any other tag is ignored), per rank in seq order, as the rules
are. It pairs the forward of a *host-reload* request (``src=host``) with a *baseline* forward of the same prompt
(``src=miss``, a fresh compute, or ``src=dev``, a device hit) on the same CP rank, and ``report()`` returns one
entry (a dict) per reload forward, merged across ranks that agree:

* ``verdict="diverged"``: the first ``(layer, stage)`` of the reload forward, in its record order, whose ``h``
  differs from the baseline's while every earlier compared record matched (``layer``, ``stage`` set). The signature
  of R4: reload HASH clean, but the forward diverges at the first attention layer that reads the reloaded KV.
* ``verdict="match"``: every ``(layer, stage)`` the two forwards share has equal ``h``.
* ``verdict="noisy"`` (``reason`` says why): the pairing is not valid, so equal or unequal hashes mean nothing:
  a batch of several requests (``nreq != 1``: batch composition changes the kernels' reduction order), different
  row counts (the two forwards extended different token counts), two baseline forwards of the prompt that disagree
  with each other before any reload of it (kernels not deterministic), or no comparable record. A difference seen
  under noise is named in the reason, never reported as ``diverged``.
* ``verdict="unpaired"``: a reload forward with no baseline forward of its prompt before it on that rank (a device
  hit *after* a reload reads reloaded KV, so it is never used as a baseline).
* ``verdict="unpairable"`` (one entry per rank, ``count`` = records): records without ``pfp`` or with a ``src``
  outside {dev, host, miss}, as upstream emits them before the proposed fields exist. They are counted, never
  silently passed.

Keys: the prompt is ``(pfp, plen)``; the rank is ``cprank`` when >= 0, else the rank of the record (the prefix's
rank: ``cprank`` is -1 without a shared layout). A forward is the run of consecutive records of one rank with the
same ``rid`` and prompt; a repeated ``(layer, stage)`` starts the next forward (chunked prefill). Hash sentinels
(``h < 0``: failed or not a tensor) are skipped.

Memory: per prompt and rank, the baseline's ``(layer, stage) -> (h, rows)`` (layers x stages small ints); per rank,
the one forward in progress, with the set of ``(layer, stage)`` it has seen and a few counters. A reload forward is
decided as it streams (first mismatch) and becomes an entry when the next forward of its rank starts; entries past
``max_entries`` are counted only, and baselines past ``max_prompts`` drop the oldest prompt (then counted as such).
"""

from __future__ import annotations

from typing import Any

from ..model.events import Event

BASELINE_SRCS = ("miss", "dev")
RELOAD_SRC = "host"
_SRCS = frozenset((*BASELINE_SRCS, RELOAD_SRC))

# report order: the entries worth reading first
_VERDICT_ORDER = {"diverged": 0, "noisy": 1, "unpaired": 2, "unpairable": 3, "match": 4, "truncated": 5}


class _Baseline:
    """The first baseline forward of one prompt on one rank (``nondet``: why later baselines disagree with it)."""

    __slots__ = ("rid", "hashes", "noisy", "nondet", "reloaded")

    def __init__(self, rid: object) -> None:
        self.rid = rid
        self.hashes: dict[tuple, tuple[int, Any]] = {}
        self.noisy: str | None = None   # the baseline itself was batched (nreq != 1)
        self.nondet: str | None = None
        self.reloaded = False           # a reload of the prompt started: later device hits read reloaded KV


class _Forward:
    """The forward in progress on one rank: its identity, what it has seen, and (a reload) how it compares."""

    __slots__ = ("rank", "rid", "key", "src", "seen", "base", "building", "noise", "diff", "compared")

    def __init__(self, rank: int, rid: object, key: tuple, src: str, base: _Baseline | None, building: bool) -> None:
        self.rank = rank
        self.rid = rid
        self.key = key
        self.src = src
        self.seen: set[tuple] = set()
        self.base = base
        self.building = building        # this forward fills ``base`` (the prompt's first baseline)
        self.noise: str | None = None   # why the pairing is invalid
        self.diff: tuple | None = None  # first differing (layer, stage), decided once
        self.compared = 0


class Localizer:
    """Streaming fwd_hash localization; see the module docstring for the contract."""

    def __init__(self, max_prompts: int = 65536, max_entries: int = 10000) -> None:
        self.max_prompts = max_prompts
        self.max_entries = max_entries
        self.records = 0
        self._bases: dict[tuple, _Baseline] = {}        # (pfp, plen, cprank) -> first baseline forward
        self._open: dict[int, _Forward] = {}            # rank -> forward in progress
        self._unpairable: dict[int, int] = {}           # rank -> records without pfp/src
        self._entries: list[dict[str, Any]] = []        # one per closed reload forward (per rank)
        self._dropped_entries = 0
        self._dropped_prompts = 0

    @property
    def held(self) -> tuple[int, int]:
        """What it holds now: forwards in progress (at most one per rank) and prompts with a baseline (at most
        ``max_prompts``)."""
        return len(self._open), len(self._bases)

    # -- feeding ------------------------------------------------------------------------------------------------
    def feed(self, ev: Event) -> None:
        """One record; returns None so it can sit in a rule dispatch table (it never produces findings)."""
        if ev.tag != "fwd_hash":
            return None
        self.records += 1
        f = ev.fields
        pfp, src = f.get("pfp"), f.get("src")
        if pfp is None or src not in _SRCS:
            self._unpairable[ev.rank] = self._unpairable.get(ev.rank, 0) + 1
            return None
        cp = f.get("cprank")
        key = (pfp, f.get("plen"), cp if type(cp) is int and cp >= 0 else ev.rank)
        ls = (f.get("layer"), f.get("stage"))
        rid = f.get("rid")
        cur = self._open.get(ev.rank)
        if cur is None or cur.rid != rid or cur.key != key or cur.src != src or ls in cur.seen:
            if cur is not None:
                self._close(cur)
            cur = self._open[ev.rank] = self._start(ev.rank, rid, key, src)
        cur.seen.add(ls)
        nreq = f.get("nreq")
        if nreq != 1 and cur.noise is None:
            cur.noise = f"nreq={nreq} in {src} forward rid {rid} (batch composition differs)"
            if cur.building and cur.base is not None:
                cur.base.noisy = f"nreq={nreq} in baseline forward rid {rid} (batch composition differs)"
        h = f.get("h")
        if type(h) is not int or h < 0:
            return None   # hash failed or not a tensor: nothing to compare
        if cur.building:
            cur.base.hashes.setdefault(ls, (h, f.get("rows")))  # type: ignore[union-attr]
        elif cur.base is not None:
            self._compare(cur, ls, h, f.get("rows"))
        return None

    def _start(self, rank: int, rid: object, key: tuple, src: str) -> _Forward:
        base = self._bases.get(key)
        building = False
        if base is None and src != RELOAD_SRC:
            if len(self._bases) >= self.max_prompts:
                del self._bases[next(iter(self._bases))]   # oldest prompt first
                self._dropped_prompts += 1
            base = self._bases[key] = _Baseline(rid)
            building = True
        elif base is not None:
            if src == RELOAD_SRC:
                base.reloaded = True
            elif base.reloaded:
                base = None   # a device hit on reloaded KV: neither a baseline nor evidence of (non)determinism
        return _Forward(rank, rid, key, src, base, building)

    def _compare(self, cur: _Forward, ls: tuple, h: int, rows: object) -> None:
        """One record of a forward against the prompt's baseline; the first difference is kept, the rest ignored."""
        if cur.diff is not None:
            return
        ref = cur.base.hashes.get(ls)  # type: ignore[union-attr]
        if ref is None:
            return   # the baseline has no such (layer, stage): nothing to compare
        cur.compared += 1
        if ref[1] != rows and cur.noise is None:
            cur.noise = f"rows differ at layer {ls[0]} stage {ls[1]} ({rows} vs {ref[1]} in the baseline)"
        if ref[0] != h:
            cur.diff = ls

    def _close(self, cur: _Forward) -> None:
        """The forward is complete: a reload becomes an entry; a later baseline only vouches for determinism."""
        if cur.src != RELOAD_SRC:
            base = cur.base
            if not cur.building and base is not None and cur.diff is not None and base.nondet is None \
                    and cur.noise is None and base.noisy is None:
                base.nondet = (f"baseline forwards rid {base.rid} and rid {cur.rid} disagree at layer {cur.diff[0]} "
                               f"stage {cur.diff[1]} (kernels not deterministic?)")
            return
        self._add(self._entry(cur))

    def _entry(self, cur: _Forward) -> dict[str, Any]:
        pfp, plen, rank = cur.key
        e: dict[str, Any] = {"verdict": "", "pfp": pfp, "plen": plen, "ranks": [rank], "reload_rid": cur.rid,
                             "base_rid": None, "layer": None, "stage": None, "reason": None}
        base = cur.base
        if base is None:
            e["verdict"] = "unpaired"
            e["reason"] = "no fresh or device-hit forward of this prompt before the reload on this rank"
            return e
        e["base_rid"] = base.rid
        noise = cur.noise or base.noisy or base.nondet
        if noise is None and cur.compared == 0:
            noise = "no (layer, stage) record in common with the baseline"
        if noise is not None:
            e["verdict"] = "noisy"
            seen = f"; h differs first at layer {cur.diff[0]} stage {cur.diff[1]}" if cur.diff is not None else ""
            e["reason"] = noise + seen
        elif cur.diff is not None:
            e["verdict"] = "diverged"
            e["layer"], e["stage"] = cur.diff
        else:
            e["verdict"] = "match"
        return e

    def _add(self, e: dict[str, Any]) -> None:
        if len(self._entries) >= self.max_entries:
            self._dropped_entries += 1
            return
        self._entries.append(e)

    # -- result -------------------------------------------------------------------------------------------------
    def report(self) -> list[dict[str, Any]]:
        """The entries so far (open forwards included, as if they ended now), ranks with identical outcomes merged
        into one entry, most telling first. Calling it does not disturb further feeding."""
        entries = list(self._entries)
        for cur in self._open.values():
            if cur.src == RELOAD_SRC:
                entries.append(self._entry(cur))
        merged: dict[tuple, dict[str, Any]] = {}
        for e in entries:
            k = (e["verdict"], e["pfp"], e["plen"], e["reload_rid"], e["base_rid"], e["layer"], e["stage"],
                 e["reason"])
            m = merged.get(k)
            if m is None:
                merged[k] = dict(e, ranks=list(e["ranks"]))
            else:
                m["ranks"] = sorted(set(m["ranks"]) | set(e["ranks"]))
        out = sorted(merged.values(), key=lambda e: (_VERDICT_ORDER[e["verdict"]], str(e["pfp"]),
                                                     str(e["reload_rid"]), e["ranks"]))
        for rank in sorted(self._unpairable):
            out.append({"verdict": "unpairable", "ranks": [rank], "count": self._unpairable[rank],
                        "reason": "fwd_hash records without pfp/src (upstream without the proposed fields)"})
        if self._dropped_entries or self._dropped_prompts:
            out.append({"verdict": "truncated", "ranks": [], "count": self._dropped_entries,
                        "reason": f"{self._dropped_entries} reload forwards past {self.max_entries} entries not "
                                  f"reported; {self._dropped_prompts} oldest prompts' baselines dropped "
                                  f"(over {self.max_prompts})"})
        out.sort(key=lambda e: _VERDICT_ORDER[e["verdict"]])   # stable: keeps the order within a verdict
        return out
