"""Render report :class:`~.report_model.Model` s as one self-contained HTML page.

Everything is in the file: the style sheet and the script (``report.css`` / ``report.js`` next to this module,
inlined), the timelines as inline SVG drawn here, and the drawn records as one JSON block the script reads for the
hover text. Nothing is fetched. What the page holds, for tools and tests that read its DOM:

* ``section.panel[data-epoch][data-node]``: one per epoch (or node and epoch), with ``g.lane[data-rank]`` per rank;
* ``rect.rec[data-i]``: a record (``data-ev``: the findings it is evidence of, its class ``ev``);
* ``rect.bar.b-d2h|b-h2d|b-l3b|b-l3p|b-dev|b-host`` (``open`` when its end record never came; ``l3b``/``l3p``:
  L3 backup / prefetch), ``rect.dens``: a density bucket;
* ``tr.finding[data-code][data-f]`` in the findings table and ``path.fmark[data-code][data-f]`` in the lanes;
* ``a.jlink``: a Jaeger link (per lane, per finding, per node) when a Jaeger URL was given.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

from .report_model import Bar, Lane, Model, Panel

WIDTH = 1400
LABEL = 150
PLOT = WIDTH - LABEL - 24
AXIS_H = 24
MARK_H = 12
ROW_H = 8
MAX_ROWS = 6
STAGE_KINDS = ("d2h", "h2d", "l3b", "l3p")   # bars packed on the stage rows (the holds have rows of their own)
_TAG_CLASS = re.compile(r"[^A-Za-z0-9_]")
_KNOWN_TAGS = frozenset(("config", "reset", "rid_map", "insert", "split", "prepare", "backup", "ack", "evict",
                         "free", "reload", "compose", "store", "fwd_hash"))


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _json_block(obj: object) -> str:
    # inside <script>, no value may end the element ("</script"), open a comment that swallows it ("<!--") or
    # start one ("<script" inside "<!--"): "<", ">" and "&" are written as JSON escapes, which parse to the same
    # strings and leave the element's text without any of them
    return (json.dumps(obj, separators=(",", ":"), default=str)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _dur(ns: float) -> str:
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def _ticks(span: int) -> list[int]:
    """Nice tick offsets (ns) from the panel start: about 8 over ``span``."""
    if span <= 0:
        return [0]
    raw = span / 8
    mag = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return list(range(0, span + 1, int(step)))


class _Scale:
    def __init__(self, t0: int, t1: int) -> None:
        self.t0, self.span = t0, max(1, t1 - t0)

    def x(self, ts: int) -> float:
        return LABEL + (ts - self.t0) * PLOT / self.span


def _pack(bars: list[Bar], sc: _Scale, t_end: int) -> list[tuple[Bar, int]]:
    """(bar, row): holds on rows of their own (dev, host), stage bars packed greedily, at most MAX_ROWS rows."""
    out: list[tuple[Bar, int]] = []
    hold_rows = [k for k in ("dev", "host") if any(b.kind == k for b in bars)]
    for b in bars:
        if b.kind in hold_rows:
            out.append((b, hold_rows.index(b.kind)))
    ends: list[float] = []
    base = len(hold_rows)
    for b in sorted((b for b in bars if b.kind in STAGE_KINDS), key=lambda b: b.start):
        x0 = sc.x(b.start)
        x1 = sc.x(b.end if b.end is not None else t_end)
        row = next((i for i, e in enumerate(ends) if e <= x0), None)
        if row is None:
            if base + len(ends) < MAX_ROWS:
                ends.append(x1)
                row = len(ends) - 1
            else:
                row = len(ends) - 1 if ends else 0
        if row < len(ends):
            ends[row] = max(ends[row], x1 + 1)
        out.append((b, base + row))
    return out


class _Page:
    def __init__(self, models: list[Model], meta: dict[str, Any]) -> None:
        self.models, self.meta = models, meta
        self.parts: list[str] = []
        self.findings: list[dict[str, Any]] = []     # all sections', in page order
        self.offsets: list[int] = []                 # first page-wide finding index of each model

    def render(self, records: list[list[Any]]) -> str:
        m = self.meta
        title = m["title"]
        self.parts.append(f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                          f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                          f'<link rel="icon" href="data:,"><title>{_e(title)}</title>'
                          f'<style>\n{_asset("report.css")}</style></head><body>\n')
        self.parts.append(f'<h1>{_e(title)}</h1>\n<div id="banner" hidden></div>\n')
        for mod in self.models:
            self.offsets.append(len(self.findings))
            for p in mod.findings:
                f = p.finding
                self.findings.append({"code": f.code, "rule": f.rule, "severity": f.severity, "rank": f.rank,
                                      "epoch": f.epoch, "node": f.node_id, "op": f.op, "message": f.message,
                                      "evidence": list(f.evidence), "records": list(p.evidence)})
        for k, mod in enumerate(self.models):
            self._section(mod, self.offsets[k])
        data = {"records": records, "findings": self.findings, "run_id": m.get("run_id"),
                "sources": m.get("sources", ""),
                "traces": {t: list(v) for mod in self.models for t, v in mod.trace_map.items()}}
        src = m.get("sources", "")
        src = src if len(src) <= 400 else src[:400] + " …"
        self.parts.append(f'<p class="meta">made by cptrace-otel {_e(m.get("version", ""))} from <code>{_e(src)}</code>'
                          "</p>\n")
        self.parts.append('<div id="tip" hidden></div>\n')
        self.parts.append(f'<script type="application/json" id="cptrace-data">{_json_block(data)}</script>\n')
        self.parts.append(f"<script>\n{_asset('report.js')}</script>\n</body></html>\n")
        return "".join(self.parts)

    # -- one model (one group of sources) ---------------------------------------------------------------------
    def _section(self, mod: Model, off: int) -> None:
        w = self.parts.append
        nf = sum(mod.codes.values())
        badges = "".join(f'<span class="badge bad">{_e(c)} × {n}</span>' for c, n in sorted(mod.codes.items())) \
            or '<span class="badge ok">no findings</span>'
        w(f'<section class="run" data-findings="{nf}"><h2>{_e(mod.title)}</h2>\n<p class="meta">')
        w(f"run id <b>{_e(mod.run_id or '(unknown)')}</b> · <b>{mod.events}</b> records · ranks "
          f"<b>{_e(', '.join(map(str, mod.ranks)) or '-')}</b> · {badges}</p>\n")
        if self.meta.get("unchecked"):
            w('<p class="meta">not checked (never a pass): ' + _e("; ".join(self.meta["unchecked"])) + "</p>\n")
        if mod.notes:
            w('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in mod.notes) + "</ul>\n")
        self._findings_table(mod, off)
        w(_legend())
        for panel in mod.panels:
            self._panel(panel, mod, off)
        if not mod.panels:
            w('<p class="muted">nothing to draw</p>\n')
        self._nodes_table(mod)
        w("</section>\n")

    def _findings_table(self, mod: Model, off: int) -> None:
        w = self.parts.append
        if not mod.findings:
            return
        total = sum(mod.codes.values())
        count = f"{len(mod.findings)} of {total}" if total > len(mod.findings) else f"{total}"
        w(f'<h2>Findings <span class="sub">({count}; click one to select its evidence)</span></h2>\n'
          '<div class="ftable"><table class="findings"><tr><th>#</th><th>code</th><th>severity</th><th>rank</th>'
          '<th>epoch</th>'
          '<th>node</th><th>op</th><th>message</th><th>evidence seq</th><th>trace</th></tr>\n')
        for k, p in enumerate(mod.findings):
            f, i = p.finding, off + k
            trace = ""
            if p.link:
                trace = f'<a class="jlink" href="{_e(p.link)}" target="_blank" rel="noopener">Jaeger</a>'
            elif p.trace_id:
                trace = f'<span class="mono">{_e(p.trace_id)}</span>'
            w(f'<tr class="finding {_e(f.severity)}" data-f="{i}" data-code="{_e(f.code)}"><td>{i + 1}</td>'
              f'<td class="code">{_e(f.code)}</td><td>{_e(f.severity)}</td><td>{f.rank}</td><td>{f.epoch}</td>'
              f'<td>{_e("" if f.node_id is None else f.node_id)}</td><td>{_e("" if f.op is None else f.op)}</td>'
              f'<td class="msg">{_e(f.message)}</td><td class="mono">{_e(",".join(map(str, f.evidence)))}</td>'
              f"<td>{trace}</td></tr>\n")
        w("</table></div>\n")

    def _nodes_table(self, mod: Model) -> None:
        w = self.parts.append
        if not mod.nodes or (not mod.summarised and not any(r.codes for r in mod.nodes)):
            return
        rows = mod.nodes if mod.summarised else [r for r in mod.nodes if r.codes]
        w(f'<h2>Top nodes <span class="sub">(by findings, then by activity: records that change the node)</span>'
          '</h2>\n<table class="nodes"><tr><th>epoch</th><th>node</th><th>ranks</th><th>records</th>'
          f'<th>activity</th><th>findings</th>{"<th>panel</th>" if mod.summarised else ""}<th>trace</th></tr>\n')
        for r in rows:
            panel = f'<a href="#{_e(r.panel)}">drawn</a>' if r.panel else ""
            panel = f"<td>{panel}</td>" if mod.summarised else ""
            trace = (f'<a class="jlink" href="{_e(r.link)}" target="_blank" rel="noopener">Jaeger</a>' if r.link
                     else f'<span class="mono">{_e(r.trace_id or "")}</span>')
            w(f'<tr data-node="{r.node}" data-epoch="{r.epoch}"><td>{r.epoch}</td><td>{r.node}</td>'
              f'<td>{_e(_ranks_text(r.ranks))}</td><td>{r.records}</td><td>{r.activity}</td>'
              f'<td class="code">{_e(", ".join(r.codes))}</td>{panel}<td>{trace}</td></tr>\n')
        w("</table>\n")

    # -- one panel: the SVG timeline ----------------------------------------------------------------------------
    def _panel(self, p: Panel, mod: Model, off: int) -> None:
        sc = _Scale(p.t0, p.t1)
        ev_of: dict[int, list[int]] = {}
        for k, pf in enumerate(mod.findings):
            for ri in pf.evidence:
                ev_of.setdefault(ri, []).append(off + k)
        lanes_svg: list[str] = []
        y = AXIS_H
        for lane in p.lanes:
            svg, h = self._lane(lane, p, mod, off, sc, y, ev_of)
            lanes_svg.append(svg)
            y += h
        height = y + 6
        link = (f' · <a class="jlink" href="{_e(p.link)}" target="_blank" rel="noopener">node trace in Jaeger</a>'
                if p.link else (f' · trace <span class="mono">{_e(p.trace_id)}</span>' if p.trace_id else ""))
        node_attr = "" if p.node is None else f' data-node="{p.node}"'
        self.parts.append(
            f'<section class="panel" id="{_e(p.pid)}" data-epoch="{p.epoch}"{node_attr}>'
            f'<h2>{_e(p.title)} <span class="sub">{_e(p.note)} · {_dur(p.t1 - p.t0)} from ts {p.t0}</span>{link}</h2>'
            f'<div class="scroll"><svg class="tl" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{height}" viewBox="0 0 {WIDTH} {height}">{_axis(sc, height)}{"".join(lanes_svg)}</svg></div>'
            "</section>\n")

    def _lane(self, lane: Lane, p: Panel, mod: Model, off: int, sc: _Scale, y0: int,
              ev_of: dict[int, list[int]]) -> tuple[str, int]:
        packed = _pack(lane.bars, sc, p.t1)
        rows = 1 + max((r for _, r in packed), default=-1)
        h = max(34 if lane.link else 26, 6 + MARK_H + 4 + rows * ROW_H + 4)
        out = [f'<g class="lane" data-rank="{lane.rank}" data-records="{lane.records}">'
               f'<rect class="lane-bg" x="0" y="{y0}" width="{WIDTH}" height="{h}"/>'
               f'<line class="lane-sep" x1="0" x2="{WIDTH}" y1="{y0 + h}" y2="{y0 + h}"/>'
               f'<text x="8" y="{y0 + 14}">rank {lane.rank}</text>'
               f'<text class="small" x="64" y="{y0 + 14}">{lane.records} rec</text>']
        if lane.link:
            out.append(f'<a href="{_e(lane.link)}" target="_blank" rel="noopener">'
                       f'<text class="jlink" x="8" y="{y0 + 28}">Jaeger ↗</text></a>')
        my = y0 + 6
        if lane.density:
            peak = max(c for _, c in lane.density)
            bw = PLOT / 240
            for k, c in lane.density:
                op = 0.15 + 0.85 * c / peak
                out.append(f'<rect class="dens" x="{LABEL + k * bw:.1f}" y="{my}" width="{bw + 0.3:.1f}" '
                           f'height="{MARK_H}" fill-opacity="{op:.2f}" data-tip="{c} records"/>')
        by = my + MARK_H + 4
        for b, row in packed:
            x0 = sc.x(b.start)
            x1 = sc.x(b.end if b.end is not None else p.t1)
            cls = f"bar b-{b.kind}" + (" open" if b.end is None else "")
            out.append(f'<rect class="{cls}" x="{x0:.1f}" y="{by + row * ROW_H}" width="{max(2.0, x1 - x0):.1f}" '
                       f'height="{ROW_H - 2}" data-tip="{_e(_bar_tip(b))}"/>')
        for i in lane.marks:
            r = self._rec(i)
            tag = r[0] if r[0] in _KNOWN_TAGS else "other"
            ev = ev_of.get(i)
            extra = f' ev" data-ev="{" ".join(map(str, ev))}' if ev else ""
            out.append(f'<rect class="rec t-{_TAG_CLASS.sub("_", tag)}{extra}" x="{sc.x(r[3]) - 1:.1f}" y="{my}" '
                       f'width="2.5" height="{MARK_H}" data-i="{i}"/>')
        for k in p.findings:
            pf = mod.findings[k]
            if pf.finding.rank != lane.rank or pf.ts is None:
                continue
            x = sc.x(pf.ts)
            f = pf.finding
            out.append(f'<line class="fline" x1="{x:.1f}" x2="{x:.1f}" y1="{y0 + 2}" y2="{y0 + h - 2}"/>'
                       f'<path class="fmark {_e(f.severity)}" d="M{x:.1f} {y0 + 1}l6 7l-6 7l-6-7z" '
                       f'data-f="{off + k}" data-code="{_e(f.code)}"/>')
        out.append("</g>")
        return "".join(out), h

    def _rec(self, i: int) -> list[Any]:
        return self.meta["records"][i]


def _axis(sc: _Scale, height: int) -> str:
    out = ['<g class="axis">']
    for t in _ticks(sc.span):
        x = sc.x(sc.t0 + t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{AXIS_H - 6}" y2="{height}"/>')
        if x < WIDTH - 56:   # a label that would be cut at the right edge is left out
            out.append(f'<text x="{x + 2:.1f}" y="{AXIS_H - 9}">+{_dur(t)}</text>')
    out.append("</g>")
    return "".join(out)


def _bar_tip(b: Bar) -> str:
    what = {"d2h": "d2h stage (prepare .. ack dir=d2h)", "h2d": "h2d stage (reload .. ack dir=h2d)",
            "l3b": "L3 backup (l3_backup .. l3_ack dir=backup)",
            "l3p": "L3 prefetch (l3_prefetch .. l3_ack dir=prefetch)",
            "dev": "device hold (device slots held)", "host": "host hold (host slots held)"}[b.kind]
    s = what + (f" op {b.op}" if b.op is not None else "")
    if b.nodes:
        s += " nodes " + ",".join(map(str, sorted(b.nodes)))
    s += f" · {_dur(b.end - b.start)}" if b.end is not None else " · open: no closing record"
    return s + " · seq " + ",".join(map(str, b.seqs[:12])) + ("…" if len(b.seqs) > 12 else "")


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _legend() -> str:
    tags = ["prepare", "backup", "ack", "reload", "insert", "split", "evict", "free", "rid_map", "compose", "store",
            "config", "fwd_hash", "l3_backup", "l3_hit", "kv_canary"]
    items = "".join(f'<span><svg width="12" height="10"><rect class="t-{t}" width="12" height="10"/></svg>{t}</span>'
                    for t in tags)
    bars = "".join(f"<span><i style='background:{c}'></i>{t}</span>" for c, t in (
        ("#1f77b4", "d2h stage"), ("#2ca02c", "h2d stage"), ("#ff7f0e", "L3 backup"), ("#17becf", "L3 prefetch"),
        ("#c5b0d5", "device hold"), ("#f7b6d2", "host hold"),
        ("#d62728", "finding (its evidence records outlined red)")))
    return f'<div class="legend">{items}{bars}</div>\n'


def render(models: list[Model], records: list[list[Any]], meta: dict[str, Any]) -> str:
    """The HTML page of ``models`` (one per source group). ``meta``: ``title``, ``run_id``, ``sources`` (the source
    paths as a shell word list, for the hint on undrawn nodes) and ``unchecked`` (texts)."""
    return _Page(models, dict(meta, records=records)).render(records)
