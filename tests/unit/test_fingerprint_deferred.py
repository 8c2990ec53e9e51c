"""Deferred values: forcing, timed waits, sentinels, release of pooled resources (fake events, no GPU)."""

from __future__ import annotations

import threading

from cptrace_otel.fingerprint import deferred, formula
from cptrace_otel.fingerprint.deferred import Deferred, Pending, is_deferred, resolve


class FakeEvent:
    def __init__(self, done: bool = False):
        self.done = done
        self.syncs = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.syncs += 1
        self.done = True


class FakeHost:
    """Stands in for the pinned host row; counts reads."""

    def __init__(self, row):
        self.row = row
        self.reads = 0

    def tolist(self):
        self.reads += 1
        return list(self.row)


def _pair(done: bool = False, bad: int = 0):
    ev = FakeEvent(done)
    host = FakeHost([6, 14, 3, bad])
    released = []
    p = Pending(ev, host, keep=object(), on_done=lambda dropped: released.append(1 + dropped))
    h = Deferred("khash", p, lambda v: -1 if v[3] else formula.finish(v[0], v[1], 3), -1)
    nz = Deferred("knz", p, lambda v: -1 if v[3] else v[2], -1)
    return ev, host, released, h, nz


def test_int_str_index_format_force_the_value() -> None:
    ev, host, released, h, nz = _pair()
    assert not h.ready()
    want = 14 ^ 6000018 ^ 3
    assert int(h) == want and ev.syncs == 1
    assert str(h) == str(want) and f"{h}" == str(want) and [0] * nz.__index__() + [0] == [0] * 4
    assert int(nz) == 3 and list(range(10))[nz] == 3
    assert host.reads == 1 and released == [1]  # one read, slot returned once


def test_resolve_waits_and_times_out_with_sentinel() -> None:
    ev, host, released, h, nz = _pair(done=False)
    assert resolve(h, 0.005) == -1  # not ready in time: the sentinel, no sync
    assert ev.syncs == 0 and host.reads == 0 and released == []
    ev.done = True
    assert h.ready()
    assert resolve(h, 1.0) == 14 ^ 6000018 ^ 3
    assert resolve(nz, 0) == 3
    assert ev.syncs == 0 and released == [1]


def test_resolve_passes_plain_values_through() -> None:
    for v in (0, -1, "x", None, 3.5, [1]):
        assert resolve(v, 0.1) == v
        assert not is_deferred(v)
    assert is_deferred(_pair()[3])


def test_bad_flag_gives_upstream_failure_sentinel() -> None:
    _, _, _, h, nz = _pair(done=True, bad=2)
    assert int(h) == -1 and int(nz) == -1


def test_event_that_breaks_gives_sentinel() -> None:
    class Broken(FakeEvent):
        def synchronize(self) -> None:
            raise RuntimeError("device lost")

    p = Pending(Broken(False), FakeHost([0, 0, 0, 0]))
    d = Deferred("rng", p, lambda v: "(cnt=1)", "(err:fingerprint result not ready)")
    assert str(d) == "(err:fingerprint result not ready)"


def test_concurrent_forcing_reads_once() -> None:
    for _ in range(50):
        _ev, host, released, h, nz = _pair(done=True)
        out = []
        threads = [threading.Thread(target=lambda d=d, out=out: out.append(int(d))) for d in (h, nz, h, nz)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(out) == sorted([14 ^ 6000018 ^ 3, 3] * 2)
        assert host.reads == 1 and released == [1]


def test_wait_without_timeout_syncs() -> None:
    ev, _, _, h, _ = _pair(done=False)
    assert h.wait(None) and ev.syncs == 1 and h.value() == 14 ^ 6000018 ^ 3
    assert repr(h).startswith("Deferred(khash=")


def test_poll_bounds_are_small() -> None:
    assert deferred.POLL_MAX_S <= 0.01


def test_dropping_unread_returns_the_slot_flagged() -> None:
    import gc

    got = []
    p = Pending(FakeEvent(False), FakeHost([0, 0, 0, 0]), on_done=got.append)
    d = Deferred("knz", p, lambda v: v[2], -1)
    del p, d
    gc.collect()
    assert got == [True]  # dropped: possibly still running, so the pool must check the event first
    p = Pending(FakeEvent(True), FakeHost([0, 0, 5, 0]), on_done=got.append)
    assert Deferred("knz", p, lambda v: v[2], -1).value() == 5
    del p
    gc.collect()
    assert got == [True, False]  # read once, released once, never again on collection
