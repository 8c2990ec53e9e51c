"""Legal near-misses of docs/domain.md §7.3.2: each scripted sequence sits right next to a violation and must stay
silent,
at the level it was written for and at level 3."""

from __future__ import annotations

import glob
import os

import pytest

from tests.helpers.checks_util import FIXTURES, check_files

NEAR = sorted(glob.glob(os.path.join(FIXTURES, "nearmiss", "*.log")))


def test_all_six_near_misses_are_present():
    names = {os.path.basename(p)[:-4] for p in NEAR}
    assert names == {"free_after_ack", "host_evict_after_h2d_ack", "split_with_pub", "compose_refill_after_reload",
                     "wb_flush_before_free", "reload_split_node_host_p"}


@pytest.mark.parametrize("path", NEAR, ids=[os.path.basename(p) for p in NEAR])
@pytest.mark.parametrize("level", [None, 3])
def test_near_miss_is_silent(path, level):
    res = check_files([path], level=level)
    assert res.findings == [], [f.message for f in res.findings]
    assert not [u for u in res.unchecked if u.kind == "level"]  # checked at level 2, not skipped


@pytest.mark.parametrize("path,bad_line,rule", [
    ("free_after_ack", 5, "H4a"),                 # move the ack after the free
    ("host_evict_after_h2d_ack", 10, "H2c"),      # move the h2d ack after the host eviction
    ("compose_refill_after_reload", 12, "H3"),    # drop the refill
])
def test_near_miss_turns_into_a_finding_when_the_order_is_broken(tmp_path, path, bad_line, rule):
    lines = open(os.path.join(FIXTURES, "nearmiss", path + ".log")).read().splitlines()
    moved = lines.pop(bad_line - 1)
    if rule != "H3":
        # the ack (or h2d ack) now comes after the records it used to precede
        lines.insert(bad_line + (1 if rule == "H4a" else 3), moved)
    p = tmp_path / "x.log"
    p.write_text("\n".join(lines) + "\n")
    res = check_files([str(p)])
    assert rule in {f.rule for f in res.findings}
