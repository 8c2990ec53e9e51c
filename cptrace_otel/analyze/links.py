"""Jaeger URLs for people: the page of one trace, and a search for a node id or a request id.

Everything that prints a node (reports, demo output) calls these when a Jaeger base URL is known::

    from cptrace_otel.analyze import links
    links.trace_url("http://127.0.0.1:16686", trace_id_hex)
        -> "http://127.0.0.1:16686/trace/<32 hex>"
    links.search_url("http://127.0.0.1:16686", "sglang-hicache", {"hicache.node_id": 17})
        -> "http://127.0.0.1:16686/search?service=sglang-hicache&tags=%7B%22hicache.node_id%22%3A%2217%22%7D&lookback=1h&limit=20"
    links.node_search_url(base, node_id=17, run_id="r1")   # narrows to one run (resource attribute cptrace.run_id)
    links.rid_search_url(base, "req-42")

Facts these rely on (Jaeger v1.76 / v2.13): ``/trace/<id>`` takes the 32-hex-digit trace id; the search page reads
``service``, ``tags`` (a JSON object, values compared as strings, all keys AND-ed, each key matched on one span),
``lookback`` (a UI parameter: ``1h``, ``2d`` ...; the HTTP API uses ``start``/``end`` instead) and ``limit``.
Pure string work: no imports beyond the standard library, no network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ..model import semconv as sc

if TYPE_CHECKING:
    import argparse

_HEX32 = re.compile(r"[0-9a-f]{32}")
_LOOKBACK = re.compile(r"\d+[mhd]")


_SCHEME_ONLY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:(?!\d)")


def normalize_base(base: str) -> str:
    """``base`` without a trailing slash; a bare ``host:port`` gets ``http://``. Raises ValueError on an empty one
    and on any scheme but http(s) (``javascript:``, ``data:``, ``file://``: a link base makes every link, and a
    report's links must only ever open a web page)."""
    b = (base or "").strip()
    if not b:
        raise ValueError("empty Jaeger base URL")
    if "://" not in b:
        host = b.split("/", 1)[0]
        if "@" not in host and _SCHEME_ONLY.match(b):
            raise ValueError(f"not an http(s) URL: {_shown(b)}")
        b = "http://" + b
    if b.split("://", 1)[0].lower() not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {_shown(b)}")
    return b.rstrip("/")


def bad_link_base(args: argparse.Namespace) -> str | None:
    """Check ``args.jaeger_url`` (the base of every link a command prints or writes) and normalize it in place: None
    when it is absent or http(s), else the message for a usage error (``javascript:``, ``data:``, ``file:``)."""
    base = getattr(args, "jaeger_url", None)
    if not base:
        return None
    try:
        args.jaeger_url = normalize_base(base)
    except ValueError as e:
        return f"--jaeger-url: {e}"
    return None


def _shown(url: str) -> str:
    from ..model.config import mask_url

    return ascii(mask_url(url)[:80])


def trace_id_hex(trace_id: str | bytes | int) -> str:
    """The 32-lowercase-hex form Jaeger uses in URLs, from 16 bytes, an int, or hex text (short hex is zero-padded).

    Raises ValueError for anything that is not a valid, non-zero 128-bit trace id."""
    if isinstance(trace_id, (bytes, bytearray)):
        if len(trace_id) != 16:
            raise ValueError(f"a trace id is 16 bytes, got {len(trace_id)}")
        h = bytes(trace_id).hex()
    elif isinstance(trace_id, int) and not isinstance(trace_id, bool):
        if not 0 < trace_id < 1 << 128:
            raise ValueError(f"trace id {trace_id} is out of the 128-bit range")
        h = f"{trace_id:032x}"
    elif isinstance(trace_id, str):
        h = trace_id.strip().lower()
        if h.startswith("0x"):
            h = h[2:]
        if not h or len(h) > 32 or any(c not in "0123456789abcdef" for c in h):
            raise ValueError(f"not a hex trace id: {trace_id!r}")
        h = h.rjust(32, "0")
    else:
        raise ValueError(f"not a trace id: {trace_id!r}")
    if not _HEX32.fullmatch(h) or h == "0" * 32:
        raise ValueError(f"invalid trace id: {trace_id!r}")
    return h


def trace_url(base: str, trace_id: str | bytes | int) -> str:
    """``<base>/trace/<32-hex id>``: the Jaeger page of one trace (e.g. one node lineage)."""
    return f"{normalize_base(base)}/trace/{trace_id_hex(trace_id)}"


def _tag_value(v: object) -> str:
    # Jaeger compares tag values as strings (int 17 matches "17"); bools as Go renders them.
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def search_url(
    base: str,
    service: str = sc.DEFAULT_SERVICE_NAME,
    tags: Mapping[str, Any] | None = None,
    lookback: str = "1h",
    limit: int = 20,
) -> str:
    """The Jaeger search page for ``service`` with ``tags`` (AND-ed, exact match) over the last ``lookback``.

    ``lookback`` is ``<n>m``, ``<n>h`` or ``<n>d`` (what the UI offers); ``limit`` the number of traces listed."""
    if not service:
        raise ValueError("a Jaeger search needs a service name")
    if not _LOOKBACK.fullmatch(lookback):
        raise ValueError(f"lookback {lookback!r} is not like 30m, 1h or 2d")
    if limit <= 0:
        raise ValueError("limit must be > 0")
    params: list[tuple[str, str]] = [("service", service)]
    if tags:
        params.append(("tags", json.dumps({k: _tag_value(v) for k, v in tags.items()}, separators=(",", ":"))))
    params += [("lookback", lookback), ("limit", str(limit))]
    return f"{normalize_base(base)}/search?{urlencode(params, quote_via=quote)}"


def node_search_url(
    base: str,
    node_id: int,
    run_id: str | None = None,
    rank: int | None = None,
    service: str = sc.DEFAULT_SERVICE_NAME,
    lookback: str = "1h",
) -> str:
    """Search for the traces of ``node_id`` (tag ``hicache.node_id``), narrowed to a run and/or a CP rank.

    Node ids restart per rank and per ``reset``, so without ``run_id`` the search may list several lineages."""
    tags: dict[str, Any] = {sc.NODE_ID: node_id}
    if run_id:
        tags[sc.RUN_ID] = run_id
    if rank is not None and rank >= 0:
        tags[sc.CP_RANK] = rank
    return search_url(base, service, tags, lookback)


def rid_search_url(base: str, rid: str, run_id: str | None = None, service: str = sc.DEFAULT_SERVICE_NAME,
                   lookback: str = "1h") -> str:
    """Search for the traces that carry request id ``rid`` (tag ``hicache.rid``: its request trace and node spans)."""
    tags: dict[str, Any] = {sc.RID: rid}
    if run_id:
        tags[sc.RUN_ID] = run_id
    return search_url(base, service, tags, lookback)


def node_trace_url(base: str, run_id: str, epoch: int, node_id: int) -> str:
    """The trace page of one node lineage, from the deterministic trace id
    (:func:`cptrace_otel.model.trace_ids.node_trace_id`)."""
    from ..model.trace_ids import node_trace_id

    return trace_url(base, node_trace_id(run_id, epoch, node_id))


def request_trace_url(base: str, run_id: str, rid: str) -> str:
    """The trace page of one request (``fwd_hash`` records, links to the node traces its ``rid_map`` named)."""
    from ..model.trace_ids import request_trace_id

    return trace_url(base, request_trace_id(run_id, rid))
