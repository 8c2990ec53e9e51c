"""Paged KV pools (device or host) with the allocator discipline of SGLang's pools.

Slots are token-granular; allocation is page-granular. The free list hands out the most recently freed pages first,
so a recycled page is reused at once and a recycle race turns into corruption (as on a GPU stream). Double alloc and
double free raise, as ``pool_host/base.py`` asserts on ``slot_used``.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class PoolError(AssertionError):
    """A pool invariant broke (double alloc, double free, misaligned free)."""


class PagedPool:
    """``n_pages`` pages of ``page_size`` slots; ``data`` is ``uint8[n_slots, layers, width]``.

    ``alloc(n)`` returns ``n`` slot indices (``n`` a multiple of the page size) or None when not enough pages are
    free; ``free(idx)`` returns whole pages. ``owner[page]`` is the node id the page was allocated for (-1 free).
    """

    def __init__(self, n_pages: int, page_size: int, layers: int, width: int, name: str = "pool") -> None:
        self.name = name
        self.n_pages = n_pages
        self.page_size = page_size
        self.data = np.zeros((n_pages * page_size, layers, width), dtype=np.uint8)
        self.used = np.zeros(n_pages, dtype=bool)
        self.owner = np.full(n_pages, -1, dtype=np.int64)
        self._free: deque[int] = deque(range(n_pages))

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, n_tokens: int, owner: int = -1) -> np.ndarray | None:
        if n_tokens % self.page_size:
            raise PoolError(f"{self.name}: alloc of {n_tokens} tokens is not page-aligned")
        need = n_tokens // self.page_size
        if need > len(self._free):
            return None
        pages = [self._free.popleft() for _ in range(need)]
        for p in pages:
            if self.used[p]:
                raise PoolError(f"{self.name}: double alloc of page {p}")
            self.used[p] = True
            self.owner[p] = owner
        return self.slots_of(pages)

    def slots_of(self, pages: list[int]) -> np.ndarray:
        ps = self.page_size
        if not pages:
            return np.zeros(0, dtype=np.int64)
        return (np.asarray(pages, dtype=np.int64)[:, None] * ps + np.arange(ps, dtype=np.int64)[None, :]).reshape(-1)

    def pages_of(self, idx: np.ndarray) -> list[int]:
        a = np.asarray(idx, dtype=np.int64)
        ps = self.page_size
        if a.size % ps or (a.size and not np.array_equal(a.reshape(-1, ps) % ps,
                                                         np.tile(np.arange(ps), (a.size // ps, 1)))):
            raise PoolError(f"{self.name}: free of a range that is not whole pages")
        return (a.reshape(-1, ps)[:, 0] // ps).tolist() if a.size else []

    def free(self, idx: np.ndarray) -> None:
        pages = self.pages_of(idx)
        for p in pages:
            if not self.used[p]:
                raise PoolError(f"{self.name}: double free of page {p}")
        for p in reversed(pages):
            self.used[p] = False
            self.owner[p] = -1
            self._free.appendleft(p)  # prompt reuse: the next alloc gets these pages first, in order
