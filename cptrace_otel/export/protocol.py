"""The traced process <-> exporter worker protocol: message types and their framing, for both sides of the pipe.

In process mode (``python -m cptrace_otel.export.worker_process``) every message is one frame, ``<u32 little-endian
length><pickle>``: the traced process writes them to the worker's stdin, the worker writes its acks to its stdout. In
thread mode the same message tuples go through a ``queue.Queue`` unframed. Messages, traced process -> worker:

* ``(INIT, info)``: always first; ``info`` = dict(config=Config, resource=dict, instance=str, file=path|None,
  log_file=path|None, spool_dir=str, resume=dict|None). ``resume`` is set when this worker replaces one that died:
  dict(seq=the seq of the first record it gets, epochs={rank: (epoch, after_reset, max_new)} as the dead worker
  last reported them, restarts=how many workers died so far).
* ``(PREINIT, info)``: instead of INIT while the traced process does not know its rank yet: the worker holds the
  ITEMS it gets until INIT (with the resolved configuration: rank, resource, file names) arrives, and exports them
  with ``info`` (rank unknown) if its input ends first (the traced process ended: nothing is lost waiting).
* ``(ITEMS, items, dropped)``: a batch of compact items ``(ts, level, tag, fields)`` (values int/str/float, see
  :func:`cptrace_otel.model.records.compact_item`), in emission order, and the traced process's drop count so far.
* ``(SIDE, items, dropped)``: with the record ring (``info["ring"]`` = dict(fd, size) in INIT/PREINIT, and
  ``resume["side_next"]``): compact items of the records that went to the side deque, in order, each to be put at its
  placeholder in the ring (:mod:`cptrace_otel.export.ringread`); ``None`` for one the traced process gave up.
* ``(FLUSH, flush_id, dropped, timeout_s)``: close open spans and deliver everything within ``timeout_s``.
* end of input (EOF on stdin; ``None`` on the thread queue): finish, deliver, exit.

Worker -> traced process: ``(ACK, flush_id, ok, stats)``, one per FLUSH; ``(PROGRESS, safe, lost, seq, epochs)``
about every 0.2 s when it changed, before each ACK and once at the end: ``safe`` = how many of the records it was
sent reached a final state (delivered, written, spooled to disk, or lost and counted), ``lost`` = how many of those
it lost (counted), ``seq`` and ``epochs`` = its seq and epoch state after the last record it took (for a restart's
``resume``).

Imports nothing but the standard library: the traced process loads it with the pipeline.
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

INIT = "init"
PREINIT = "preinit"
ITEMS = "items"
SIDE = "side"
FLUSH = "flush"
ACK = "ack"
PROGRESS = "progress"

HEADER = struct.Struct("<I")  # the frame's body length


def frame(msg: tuple) -> bytes:
    """One message as a frame (header + pickle)."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def read_exact(f: IO[bytes], n: int) -> bytes | None:
    """``n`` bytes from the binary stream ``f`` (a raw pipe: reads may be short); None at end of input."""
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(f: IO[bytes]) -> Any:
    """The next message from ``f``; None at end of input (also when it ends inside a frame). Raises on a frame
    that does not unpickle."""
    h = read_exact(f, HEADER.size)
    if h is None:
        return None
    body = read_exact(f, HEADER.unpack(h)[0])
    if body is None:
        return None
    return pickle.loads(body)
