"""Files only this user's exporter made: the spool's folders, request files and side files (lock, endpoint, log).

A spool folder sits under a temp directory other users can write to, and the sender reads back and POSTs whatever
it finds there; so every path is treated as planted until checked. :func:`secure_dir` makes folders ``0700`` (an
existing one must be a real directory of this user; its mode is tightened), :func:`write_new` creates ``0600``
files with ``O_EXCL | O_NOFOLLOW``, :func:`read_own_file` and :func:`open_own` open without following a link and
without blocking on a FIFO, then ``fstat`` the descriptor: anything but a regular file of this user raises
:class:`NotOwnFile` (an ``OSError``), which the callers report and skip.
"""

from __future__ import annotations

import errno
import os
import stat

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
MAX_SIDE_FILE = 4096   # bytes read from a DIR.endpoint file


class NotOwnFile(OSError):
    """A path in the spool that is not a regular file of this user (a link, FIFO, device, socket, foreign file)."""


def owner_ok(st: os.stat_result) -> bool:
    return not hasattr(os, "geteuid") or st.st_uid == os.geteuid()


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def secure_dir(path: str) -> None:
    """Create ``path`` (and missing parents) with mode ``0700``; an existing ``path`` must be a directory (not a
    link) owned by this user, and its mode is tightened to ``0700``. Raises :class:`OSError` otherwise."""
    parent = os.path.dirname(path.rstrip(os.sep))
    if parent and not os.path.isdir(parent):
        secure_dir(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotOwnFile(errno.ENOTDIR, f"{kind_of(st.st_mode)}, not a directory", path)
    if not owner_ok(st):
        raise NotOwnFile(errno.EPERM, f"owned by uid {st.st_uid}, not by this user", path)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def read_own_file(path: str, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file owned by this user: opened without following a link and without
    blocking (a FIFO), checked with ``fstat``; :class:`NotOwnFile` for anything else. ``limit`` caps the bytes
    read."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW refused a link
            raise NotOwnFile(errno.ELOOP, "a symbolic link", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotOwnFile(errno.EINVAL, kind_of(st.st_mode), path)
        if not owner_ok(st):
            raise NotOwnFile(errno.EPERM, f"owned by uid {st.st_uid}, not by this user", path)
        want = st.st_size if limit is None else min(st.st_size, limit)
        chunks = []
        while want > 0:
            b = os.read(fd, min(want, 1 << 24))
            if not b:
                break
            chunks.append(b)
            want -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_own(path: str, flags: int) -> int:
    """``os.open`` of a spool side file (lock, endpoint, log) for writing: ``0600``, no link followed, no blocking
    open of a FIFO; the result must be a regular file of this user."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotOwnFile(errno.ELOOP, "a symbolic link", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not owner_ok(st):
            raise NotOwnFile(errno.EINVAL, kind_of(st.st_mode) if not stat.S_ISREG(st.st_mode) else "foreign", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_new(path: str, data: bytes) -> None:
    """Write ``data`` to a new file ``path`` (``0600``, ``O_EXCL``: nothing planted there is followed or reused)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)
