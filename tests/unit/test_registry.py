"""The rule registry (cptrace_otel/checks/registry): every rule a checker can report is registered, the levels are
the domain reference's, the derived tables keep their values, and the rule table of docs/rules.md is the generated
one."""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from cptrace_otel import checks
from cptrace_otel.checks import registry
from cptrace_otel.checks.crossrank import CrossRank
from cptrace_otel.checks.registry import BY_ID, CROSS, RANK, RULES
from cptrace_otel.model.events import LEVEL_OF_TAG

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKS = ROOT / "cptrace_otel" / "checks"

# The lowest trace level of each rule, as docs/domain.md states it: §4 (H1a/H1c level 1, H1b level 2; H2a level 1,
# H2b and H2c level 2; H3 and H4 level 2; ZERO and HASH level 1 when nz / h are present); §7.3.3 (at level 1 the
# level-2 rules are listed as unchecked); §5 with §3.3: C2 reads `ack` records (level 2), the store fence `store`
# records (level 2); C1 projects structural records, C3 and C4 compare prepare/backup/reload fields, C5 the backup
# `h` (level 1).
DOMAIN_LEVEL = {"H1a": 1, "H1b": 2, "H1c": 1, "H2a": 1, "H2b": 2, "H2c": 2, "H3": 2, "H4": 2, "ZERO": 1, "HASH": 1,
                "C1": 1, "C2": 2, "C3": 1, "C4": 1, "C5": 1, "C5-fence": 2}
# Rules beyond the domain reference: SGLang's kv-canary lines carry no trace level (read at any level).
# The L3 tier: content round trip and writer rules read backups and hits (level 1); the in-flight rule the acks and
# frees (level 2), as H4 does. Sidecar pools: which pools a copy moves is on backup/reload (level 1); their content
# after a load on the h2d ack (level 2); after an L3 prefetch on its l3_ack (level 2, as L3b). Use before load reads
# the layer-wise load-back's records (level 2: completions and reads, as the acks). Host copies at rest: the audit
# records are level 2 (written with the acks they depend on). A hybrid tree's sliding-window pages: their content
# after a load is read at its h2d ack (level 2, as SIDE-hash); so is a Mamba tree's state.
BEYOND_DOMAIN_LEVEL = {"CANARY": 1, "L3a": 1, "L3b": 2, "L3c": 1, "L3d": 1, "SIDE-missing": 1, "SIDE-hash": 2,
                       "SIDE-l3": 2, "LOAD-early": 2, "REST-hash": 2, "REST-l3": 2, "SWA-hash": 2, "MAMBA-hash": 2,
                       "FOREIGN": 2}


def _emitted(rule_name: str) -> set[tuple[str, str]]:
    return {(r.code, e) for r in RULES for e in r.emits if e == rule_name}


def test_levels_agree_with_the_domain_reference():
    assert {r.id: r.level for r in RULES} == {**DOMAIN_LEVEL, **BEYOND_DOMAIN_LEVEL}


def test_derived_tables_keep_their_values():
    assert checks.RULE_LEVEL == {"H1a": 1, "H1b": 2, "H1c": 1, "H2a": 1, "H2b": 2, "H2c": 2, "H3": 2, "H4": 2,
                                 "ZERO": 1, "HASH": 1, "SIDE-missing": 1, "SIDE-hash": 2, "SIDE-l3": 2,
                                 "LOAD-early": 2, "REST-hash": 2, "REST-l3": 2, "SWA-hash": 2, "MAMBA-hash": 2,
                                 "CANARY": 1, "L3a": 1, "L3b": 2, "FOREIGN": 2}
    assert checks.LEVEL2_RULES == (("H1b", "H1"), ("H2b", "H2"), ("H2c", "H2"), ("H3", "H3"), ("H4", "H4"),
                                   ("SIDE-hash", "SIDE"), ("SIDE-l3", "SIDE"), ("LOAD-early", "LOAD"),
                                   ("REST-hash", "REST"), ("REST-l3", "REST"), ("SWA-hash", "SWA"),
                                   ("MAMBA-hash", "MAMBA"), ("L3b", "L3"), ("FOREIGN", "FOREIGN"))
    assert checks.CODES == ("H1", "H2", "H3", "H4", "ZERO", "HASH", "SIDE", "LOAD", "REST", "SWA", "MAMBA", "C1", "C2",
                            "C3", "C4", "C5", "CANARY", "L3", "FOREIGN")
    assert {"insert", "split", "prepare", "evict", "reload", "reset"} == checks.STRUCTURAL
    assert {"store", "backup", "evict", "free", "reset"} == registry.FENCE_TAGS
    assert [r.id for r in registry.unchecked_at(1, RANK)] == [
        "H1b", "H2b", "H2c", "H3", "H4", "SIDE-hash", "SIDE-l3", "LOAD-early", "REST-hash", "REST-l3", "SWA-hash",
        "MAMBA-hash", "L3b", "FOREIGN"]
    assert [r.id for r in registry.unchecked_at(1, CROSS)] == ["C2", "C5-fence"]
    assert registry.unchecked_at(2, RANK) == [] and registry.unchecked_at(3, CROSS) == []


def test_entries_are_well_formed():
    assert len(BY_ID) == len(RULES)
    for r in RULES:
        assert r.scope in (RANK, CROSS) and r.code in checks.CODES and r.summary and r.emits, r
        assert r.tags and set(r.tags) <= set(LEVEL_OF_TAG), r
        # its level is that of a record it reads (a level-2 rule reads an ack/free/compose/store record)
        assert any(LEVEL_OF_TAG[t] == r.level for t in r.tags), r
        mod, _, attr = r.impl.partition(":")
        cls, _, meth = attr.partition(".")
        obj = getattr(importlib.import_module(f"cptrace_otel.checks.{mod}"), cls)
        assert callable(getattr(obj, meth)), r.impl
    # the per-rank rules are RankChecker's, the cross-rank ones CrossRank's (or the store fence's)
    for r in RULES:
        mod, _, attr = r.impl.partition(":")
        owner = getattr(importlib.import_module(f"cptrace_otel.checks.{mod}"), attr.partition(".")[0])
        if r.scope == RANK:
            assert issubclass(checks.RankChecker, owner), r
        else:
            assert issubclass(CrossRank, owner) or mod == "fence", r


_FINDING = re.compile(r'(?:self\._finding|Finding|self\._add)\(\s*"([\w@-]+)",\s*"([\w@-]+)"')
_UNCHECKED = re.compile(r'(?:Unchecked|self\._skip)\(\s*"([\w@()\- ]+)",\s*"(\w+)"')


def test_every_finding_a_checker_source_builds_is_registered():
    """Every (code, rule) literal in a finding constructor of checks/ names a registered rule of that code, and
    every unchecked/skip name is a registered id or skip of its code."""
    found, skips = set(), set()
    for p in CHECKS.rglob("*.py"):
        text = p.read_text()
        found |= set(_FINDING.findall(text))
        skips |= {(code, rule) for rule, code in _UNCHECKED.findall(text)}
    assert {("H1", "H1a"), ("H4", "H4-open"), ("C5", "C5-fence"), ("ZERO", "ZERO@reload")} <= found
    for code, rule in found:
        assert (code, rule) in _emitted(rule), (code, rule)
    known = {(r.code, x) for r in RULES for x in (r.id, *r.skips)}
    assert {("C3", "C3-io"), ("HASH", "HASH-skipped(split)")} <= skips
    assert skips <= known, skips - known


@pytest.mark.parametrize("level", [1, 3])
def test_every_finding_of_the_fault_matrix_is_registered(level):
    from cptrace_otel.sim.faults import FAULTS
    from cptrace_otel.sim.workload import analyze, run_fault

    names = {(r.code, x) for r in RULES for x in (*r.emits, r.id, *r.skips)}
    seen = set()
    for kind, spec in FAULTS.items():
        for mode in spec.modes[:3]:
            res = analyze(run_fault(kind, mode, level=level))
            got = {(f.code, f.rule) for f in res.findings} | {(u.code, u.rule) for u in res.unchecked}
            assert got <= names, got - names
            seen |= got
    assert len(seen) >= 8


def test_rules_doc_table_is_generated():
    doc = (ROOT / "docs" / "rules.md").read_text()
    assert doc.count(registry.TABLE_BEGIN) == 1 and doc.count(registry.TABLE_END) == 1
    assert registry.splice_table(doc) == doc, \
        "docs/rules.md's rule table is stale: regenerate it with python -m cptrace_otel.checks.registry"


def test_the_table_command_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "cptrace_otel.checks.registry"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout == registry.render_table() and out.stderr == ""
