"""Paged KV pools (device or host) with the allocator discipline of SGLang's pools.

Slots are token-granular; allocation is page-granular. Double alloc and double free raise, as ``pool_host/base.py``
asserts on ``slot_used``. Three free-list disciplines (``policy``):

* ``"lifo"`` (the default): the most recently freed pages are handed out first, so a recycled page is reused at once
  and a recycle race turns into corruption (as on a GPU stream); the scripted fault scenarios rely on it;
* ``"sorted"``: SGLang's paged device allocator (``PagedTokenToKVPoolAllocator``): freed pages are staged and, when
  the free list runs short, merged into it and sorted; an allocation takes the lowest free pages, so after frees a
  node gets scattered pages;
* ``"fifo"``: SGLang's host pool: freed slots are appended behind the free list when it runs short (unsorted), so a
  freed page comes back only after every page freed before it.

Owner classes (``classes`` R > 1, mode sharded): SGLang 0.5.23's ``PageInterleavePoolAllocator``. Page ``p`` belongs to
rank ``p % R``; an allocation of a chain's pages takes position-page ``j`` from class ``(start + j) % R``, each class
in the pool's discipline (the first free page of that class); a new chain's ``start`` is the least-full class (the
most free pages, the lowest class on a tie: ``least_full_class``).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class PoolError(AssertionError):
    """A pool invariant broke (double alloc, double free, misaligned free)."""


class PagedPool:
    """``n_pages`` pages of ``page_size`` slots; ``data`` is ``uint8[n_slots, layers, width]``.

    ``alloc(n)`` returns ``n`` slot indices (``n`` a multiple of the page size) or None when not enough pages are
    free (with owner classes: not enough of one class the run needs); ``free(idx)`` returns whole pages.
    ``owner[page]`` is the node id the page was allocated for (-1 free).
    """

    def __init__(self, n_pages: int, page_size: int, layers: int, width: int, name: str = "pool",
                 policy: str = "lifo", classes: int = 1) -> None:
        if policy not in ("lifo", "sorted", "fifo"):
            raise ValueError(f"unknown free-list policy {policy!r}")
        self.name = name
        self.policy = policy
        self.classes = classes
        self._staged: list[int] = []   # freed pages not yet merged into the free list (sorted, fifo)
        self.n_pages = n_pages
        self.page_size = page_size
        self.data = np.zeros((n_pages * page_size, layers, width), dtype=np.uint8)
        self.used = np.zeros(n_pages, dtype=bool)
        self.owner = np.full(n_pages, -1, dtype=np.int64)
        self._free: deque[int] = deque(range(n_pages))

    @property
    def free_pages(self) -> int:
        return len(self._free) + len(self._staged)

    def alloc(self, n_tokens: int, owner: int = -1, start: int = 0) -> np.ndarray | None:
        """``n_tokens`` slots for node ``owner``; with owner classes, position-page ``j`` of class
        ``(start + j) % classes``."""
        if n_tokens % self.page_size:
            raise PoolError(f"{self.name}: alloc of {n_tokens} tokens is not page-aligned")
        need = n_tokens // self.page_size
        want = [(start + j) % self.classes for j in range(need)]
        if not self._fits(want) and self._staged:   # merge the staged frees (sorted: the whole list sorted)
            merged = list(self._free) + self._staged
            self._staged = []
            self._free = deque(sorted(merged) if self.policy == "sorted" else merged)
        if not self._fits(want):
            return None
        if self.classes == 1:
            pages = [self._free.popleft() for _ in range(need)]
        else:
            pages = []
            for c in want:   # the first free page of the class (the pool's discipline within each class)
                p = next(x for x in self._free if x % self.classes == c)
                self._free.remove(p)
                pages.append(p)
        for p in pages:
            if self.used[p]:
                raise PoolError(f"{self.name}: double alloc of page {p}")
            self.used[p] = True
            self.owner[p] = owner
        return self.slots_of(pages)

    def _fits(self, want: list[int]) -> bool:
        """Whether the free list (staged frees not counted) holds the pages of classes ``want``."""
        if self.classes == 1:
            return len(want) <= len(self._free)
        have = np.bincount(np.asarray(list(self._free), dtype=np.int64) % self.classes, minlength=self.classes)
        return bool((np.bincount(np.asarray(want, dtype=np.int64), minlength=self.classes) <= have).all())

    def least_full_class(self) -> int:
        """The owner class a new chain starts at: the one with the most free pages (staged frees included), the
        lowest on a tie (SGLang's ``least_full_class``)."""
        pages = np.asarray(list(self._free) + self._staged, dtype=np.int64)
        counts = np.bincount(pages % self.classes, minlength=self.classes)
        return int(np.argmax(counts))   # (argmax takes the first of the maxima)

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
        for p in pages:
            self.used[p] = False
            self.owner[p] = -1
        if self.policy == "lifo":
            self._free.extendleft(reversed(pages))  # prompt reuse: the next alloc gets these pages first, in order
        else:
            self._staged.extend(pages)
