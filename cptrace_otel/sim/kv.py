"""KV bytes for the simulator: the content pattern, the upstream fingerprints on uint8 bytes, exact-set text.

The fingerprints are the project's own (:func:`cptrace_otel.fingerprint.cpu.khash_bytes`: upstream ``khash`` bit for
bit on the bytes of a slice in token order); ``knz`` = number of nonzero bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..fingerprint.cpu import khash_bytes


def knz(b: np.ndarray) -> int:
    """Upstream ``knz``: count of nonzero bytes."""
    return int(np.count_nonzero(b))


def page_hashes(b: np.ndarray, page_size: int) -> list[int]:
    """``hp``: khash of each page (``page_size`` consecutive tokens) of a token-ordered slice ``[tokens, ...]``."""
    return [khash_bytes(b[i:i + page_size]) for i in range(0, b.shape[0], page_size)]


def fingerprint(b: np.ndarray, page_size: int) -> dict[str, Any]:
    """The ``h``/``nz``/``hp`` fields of a record that hashes the token-ordered slice ``b``."""
    return {"h": khash_bytes(b), "nz": knz(b), "hp": page_hashes(b, page_size)}


def stripe_fingerprint(b: np.ndarray, owned: np.ndarray, page_size: int) -> dict[str, Any]:
    """The ``h``/``nz``/``hp`` of a rank's stripe of the token-ordered slice ``b`` (``owned``: mask of its rows),
    as ``traced/sglang/_shard.py`` writes them: ``h``/``nz`` of the owned rows in token order (``h=0``, ``nz=-1``
    where it owns none), ``hp`` one entry per page, 0 for a page another rank owns."""
    if not owned.any():
        return {"h": 0, "nz": -1, "hp": [0] * (-(-b.shape[0] // page_size))}
    mine = b[owned]
    hp = [khash_bytes(b[i:i + page_size]) if owned[i] else 0 for i in range(0, b.shape[0], page_size)]
    return {"h": khash_bytes(mine), "nz": knz(mine), "hp": hp}


def content(tokens: np.ndarray, positions: np.ndarray, layers: np.ndarray, width: int, shard: int) -> np.ndarray:
    """The KV a forward stores: ``uint8[len(tokens), len(layers), width]``, never zero, deterministic.

    It depends on the token, its position in the prompt, the (global) layer index and the shard (the CP coordinate
    in sharded/layersplit modes, 0 where ranks hold identical KV)."""
    t = np.asarray(tokens, dtype=np.uint64)[:, None, None]
    p = np.asarray(positions, dtype=np.uint64)[:, None, None]
    lay = np.asarray(layers, dtype=np.uint64)[None, :, None]
    j = np.arange(width, dtype=np.uint64)[None, None, :]
    with np.errstate(over="ignore"):
        x = (t * np.uint64(2654435761) + p * np.uint64(40503) + lay * np.uint64(97) + np.uint64(shard * 7919)
             + j * np.uint64(31))
        x ^= x >> np.uint64(13)
        x *= np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(29)
    return ((x % np.uint64(255)) + np.uint64(1)).astype(np.uint8)


def runs(idx: np.ndarray) -> str:
    """Exact set in run-length form ``a-b:c-d`` (inclusive runs, in the order given), ``(0)`` when empty."""
    a = np.asarray(idx).reshape(-1).tolist()
    if not a:
        return "(0)"
    out = []
    start = prev = a[0]
    for x in a[1:]:
        if x != prev + 1:
            out.append(f"{start}-{prev}")
            start = x
        prev = x
    out.append(f"{start}-{prev}")
    return ":".join(out)


def rng(idx: np.ndarray | None) -> str:
    """Upstream ``rng`` summary of an index array: ``(cnt=N,min=a,max=b,first=c,last=d)``, ``(0)``, ``(none)``."""
    if idx is None:
        return "(none)"
    a = np.asarray(idx).reshape(-1).tolist()   # (the node-sized arrays here are small: Python's min/max are faster)
    if not a:
        return "(0)"
    return f"(cnt={len(a)},min={min(a)},max={max(a)},first={a[0]},last={a[-1]})"
