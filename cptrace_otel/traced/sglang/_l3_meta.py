"""What a stored L3 page's writer was: the run's storage identity and the metadata file the instrumentation keeps
beside each object of a backend that stores files (SGLang's ``file`` backend), so that a storage hit on an object
another run wrote (persisted storage; SGLang's keys name neither the KV dtype nor the layout, and the ``file``
backend names the served model name, not the weights) can be judged (rule ``FOREIGN``,
:mod:`cptrace_otel.checks.rules_l3`). Field names and formats: :mod:`cptrace_otel.model.l3`.

SGLang's own files are never touched: the metadata file is ``<object key>.cptrace`` (the backend reads, scans and
evicts ``.bin`` files only), written once the backup's ack says the object is on disk, and only where the object
file was written by this backup (its mtime is not older than the backup's start) or its metadata file describes an
older object file. Reads and writes run on the scheduler thread (the ack drain, the prefetch's ack), one small file
per page; every error costs the metadata only (the record goes out without it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Protocol

from ...model.l3 import META_EXT, ident_str


class CacheState(Protocol):
    """What :func:`identity` reads of a cache's state (``._state.State``, which imports this module)."""

    page_size: int

    def kv_pool(self) -> Any: ...

    def host_pool(self) -> Any: ...

PENDING_KEPT = 4096        # backups awaiting their ack whose metadata is still to be written (oldest dropped)
META_MAX = 4096            # bytes read of a metadata file (one holds a few hundred)
MTIME_SLACK_NS = 20_000_000   # file times come from the kernel's coarse clock: up to a tick behind time.time_ns()


def identity(st: CacheState) -> dict[str, Any]:
    """The run's storage identity (``model``, ``kv_dtype``, ``layout``, ``page_size``; a field left out where it
    cannot be read), for the ``config`` record and the metadata files."""
    from ._cpmode import server_args

    out: dict[str, Any] = {}
    model = getattr(server_args(), "model_path", None)
    if model:
        out["model"] = str(model)
    dt = getattr(st.kv_pool(), "dtype", None)
    if dt is not None:
        out["kv_dtype"] = str(dt).removeprefix("torch.")
    layout = getattr(st.host_pool(), "layout", None)
    if layout is not None:
        out["layout"] = str(layout)
    out["page_size"] = st.page_size
    return out


def folder(backend: object) -> str | None:
    """The folder a file-storing backend keeps its ``<key>.bin`` objects in; None for any other backend."""
    p = getattr(backend, "file_path", None)
    return p if type(p) is str and hasattr(backend, "_get_suffixed_key") else None


def _stat(path: str) -> list[int] | None:
    try:
        s = os.stat(path)
    except OSError:
        return None
    return [s.st_size, s.st_mtime_ns]   # (no inode: a store copied with its times kept stays described)


def _read(root: str, key: str) -> dict | None:
    try:
        fd = os.open(os.path.join(root, key + META_EXT), os.O_RDONLY)
        try:
            m = json.loads(os.read(fd, META_MAX))
        finally:
            os.close(fd)
    except (OSError, ValueError):   # none, or one being written (a partial JSON object never parses)
        return None
    return m if type(m) is dict else None


def write(root: str, keys: list[str], fps: list[int], ident: dict, since_ns: int) -> int:
    """After a backup's ack: the metadata file of each page key whose object this backup wrote (its object file
    not older than ``since_ns``, the backup's start, or its metadata describing another object file). Returns how
    many were written."""
    wid = ident_str(ident)
    n = 0
    for k, fp in zip(keys, fps, strict=False):
        st = _stat(os.path.join(root, k + ".bin"))
        if st is None:
            continue   # not stored (the backend refused it, or evicted it already)
        old = _read(root, k)
        if old is not None and old.get("bin") == st:
            continue   # the object is the one its metadata describes: SGLang skipped the rewrite of an existing key
        if old is None and st[1] < since_ns - MTIME_SLACK_NS:
            continue   # an object from before this backup (SGLang skips existing keys): its writer is unknown
        # one write of a few hundred bytes (a temporary file and a rename cost 8x on ext4): a reader meeting it half
        # written cannot parse it and takes it for none
        fd = os.open(os.path.join(root, k + META_EXT), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps({"fp": fp, "id": wid, "bin": st}).encode())
        finally:
            os.close(fd)
        n += 1
    return n


def read(root: str, keys: list[str]) -> tuple[list[int], list[str]] | None:
    """Per page key, ``(fingerprint, writer identity)`` from its metadata file (``-1``/``""`` where there is none, or
    where it describes another object file than the one stored now); None when no key has one."""
    wfp: list[int] = []
    wid: list[str] = []
    for k in keys:
        m = _read(root, k)
        ok = m is not None and m.get("bin") == _stat(os.path.join(root, k + ".bin"))
        fp = m.get("fp") if ok and m is not None else None
        wfp.append(fp if type(fp) is int else -1)
        w = m.get("id") if ok and m is not None else None
        wid.append(w if type(w) is str else "")
    return (wfp, wid) if any(wid) or any(x >= 0 for x in wfp) else None


def now_ns() -> int:
    return time.time_ns()
