"""The splits the Rust tree core makes inside Rust, inferred from the paths its boundary returns, and the ``insert``
records read from an insert's result and its path (unit level: a stand-in core answering ``collect_path_info`` from a
table; tests/sglang_real/test_rust_boundary_real.py runs SGLang's own Rust core)."""

from __future__ import annotations

import types
from collections import namedtuple

import pytest

from cptrace_otel.traced.sglang import _rust23, _state

Info = namedtuple("Info", "node_id parent_id path_start path_end full_value_len num_children")


class Core:
    """``parents``: node id -> (parent id, path start, path end); the root is 0."""

    def __init__(self) -> None:
        self.nodes: dict[int, tuple[int, int, int]] = {}
        self.gone: set[int] = set()   # nodes without device value

    def collect_path_info(self, ids):
        out = []
        for nid in ids:
            if nid not in self.nodes:
                raise KeyError(nid)
            path = []
            while nid != 0:
                p, s, e = self.nodes[nid]
                path.insert(0, Info(nid, p, s, e, None if nid in self.gone else e - s, 0))
                nid = p
            out.append(tuple(path))
        return tuple(out)

    def build_storage_backup_spec(self, nid, with_hash):
        return None

    def get_component_device_value(self, nid, component):
        import torch

        _, s, e = self.nodes[nid]
        return None if nid in self.gone else torch.arange(100 + s, 100 + e)


@pytest.fixture
def st(monkeypatch):
    recs: list[dict] = []
    for mod in (_rust23, _state):   # (split records are _rust23's, insert records the shared State's)
        monkeypatch.setattr(mod, "cptrace", lambda lv, tag, **f: recs.append({"tag": tag, **f}))
    s = _rust23.RustState.__new__(_rust23.RustState)
    s.cache = types.SimpleNamespace(tree_core=Core())
    s.span, s.by_start, s.host_first, s.loads, s.gone = {}, {}, {}, {}, set()
    s.recs = recs
    return s


def splits(st) -> list[tuple[int, int, int, int]]:
    return [(r["node_id"], r["new_id"], r["pre_len"], r["split_len"]) for r in st.recs if r["tag"] == "split"]


def test_a_node_cut_twice_before_a_record_names_it_gives_both_fragments(st):
    core = st.cache.tree_core
    core.nodes[1] = (0, 0, 10)
    st.path(1)
    # Rust: 1 -> 2 [0,6) + 1 [6,10); then 2 -> 3 [0,3) + 2 [3,6)
    core.nodes.update({3: (0, 0, 3), 2: (3, 3, 6), 1: (2, 6, 10)})
    st.path(1)
    assert splits(st) == [(1, 3, 10, 3), (1, 2, 7, 3)]
    assert all(r.get("inf") == 1 for r in st.recs)
    assert st.span[1] == (2, 6, 10) and st.span[2] == (3, 3, 6) and st.span[3] == (0, 0, 3)
    st.path(1)
    assert len(splits(st)) == 2   # nothing new: written once


def test_a_prefix_seen_first_on_another_path_is_found_past_a_sibling_with_its_own_fragment(st):
    core = st.cache.tree_core
    core.nodes.update({5: (0, 0, 10), 1: (0, 0, 4)})   # siblings under the root, both starting at 0 (1 tried first)
    st.path(5)
    st.path(1)
    # Rust: 1 -> 8 [0,1) + 1; 5 -> 6 [0,2) + 5; a new leaf 7 under 6
    core.nodes.update({8: (0, 0, 1), 1: (8, 1, 4), 6: (0, 0, 2), 5: (6, 2, 10), 7: (6, 2, 5)})
    st.path(7)
    assert splits(st) == [(1, 8, 4, 1), (5, 6, 10, 2)], splits(st)
    assert st.span[7] == (6, 2, 5) and st.span[5] == (6, 2, 10) and st.span[1] == (8, 1, 4)


def test_a_node_that_left_the_tree_is_forgotten_not_split(st):
    core = st.cache.tree_core
    core.nodes[1] = (0, 0, 10)
    st.path(1)
    del core.nodes[1]
    core.nodes[4] = (0, 0, 5)   # a new node where the evicted one started
    st.path(4)
    assert splits(st) == [] and 1 not in st.span


def inserts(st) -> list[tuple[str, int, int, int, int]]:
    return [(r["kind"], r["node_id"], r["parent"], r["len"], r["dev"]) for r in st.recs if r["tag"] == "insert"]


def test_an_insert_names_its_new_leaf_and_the_evicted_nodes_it_walked(st):
    """The leaf starting at the result's ``prefix_len`` is new; a walked node an eviction left without device copy
    that has one again is revived (once), and so is the fragment split from it in the same insert."""
    core = st.cache.tree_core
    core.nodes.update({1: (0, 0, 10), 2: (1, 10, 16)})
    st.path(2)
    st.dev_evicted(2, "backuped", types.SimpleNamespace(device_frees={}))
    core.gone.add(2)
    # the insert walks 1, revives 2's first 4 tokens (Rust splits 2 -> 3 [10,14) + 2 [14,16)), adds leaf 4
    core.nodes.update({3: (1, 10, 14), 2: (3, 14, 16), 4: (3, 14, 20)})
    st.inserted(types.SimpleNamespace(last_device_node=4, prefix_len=14))
    assert splits(st) == [(2, 3, 6, 4)]
    assert inserts(st) == [("revive", 3, 1, 4, "(cnt=4,min=110,max=113,first=110,last=113)"),
                            ("new", 4, 3, 6, "(cnt=6,min=114,max=119,first=114,last=119)")], inserts(st)
    assert 2 in st.gone and 3 not in st.gone
    st.inserted(types.SimpleNamespace(last_device_node=3, prefix_len=14))   # fully matched: no new node
    assert len(inserts(st)) == 2


@pytest.mark.parametrize(("value", "python", "warned"), [(None, False, False), ("rust", False, False),
                                                         (" Python ", True, False), ("pyhton", False, True)])
def test_the_tree_core_option_reads_python_or_the_default(monkeypatch, caplog, value, python, warned):
    """``CPTRACE_SGLANG_TREE_CORE``: ``python`` is the option; unset or ``rust`` the default (the Rust core kept);
    another value is named in one warning and the default is used."""
    monkeypatch.delenv(_state.TREE_CORE_OPT, raising=False)
    if value is not None:
        monkeypatch.setenv(_state.TREE_CORE_OPT, value)
    with caplog.at_level("WARNING", logger="cptrace_otel.sglang"):
        assert _state.python_core_option() is python
    assert [r.getMessage() for r in caplog.records if "CPTRACE_SGLANG_TREE_CORE" in r.getMessage()] == \
        ([f"cptrace-otel: CPTRACE_SGLANG_TREE_CORE={value.strip().lower()!r} is neither 'rust' (the default: "
          "SGLang's tree core kept, the Rust one traced at its boundary) nor 'python' (switch to the Python core "
          "where SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND is unset); using the default"] if warned else [])
