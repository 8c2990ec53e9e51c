"""The invariant rules, streaming: per rank H1-H4, ZERO and HASH (docs/domain.md §3.4 and §4; this module's
:class:`RankChecker`), across ranks C1-C5 (§5; :class:`.crossrank.CrossRank`, imported from its module so
that the exporter, which runs only the per-rank rules, does not load it). Every rule id, with its code, level and
the tags it reads, is an entry of :mod:`.registry`; each has one method in a ``rules_*`` module (``impl``).

Stable API (the exporter, the analyzer and the simulator tests use exactly this)::

    from cptrace_otel.checks import RankChecker, Finding, Unchecked

    chk = RankChecker(rank, level=None)       # level: explicit int, else `config level=`, else inferred
    for ev in events_of_this_rank_in_seq_order:
        for f in chk.feed(ev):                # findings whose evidence completes at `ev`
            ...                               # (the exporter stamps them on the span holding `ev`)
    tail = chk.finish()                       # end of stream: H4-open (WARN)
    skipped = chk.unchecked()                 # list[Unchecked]: never a silent pass

``Finding``: ``code`` (H1 H2 H3 H4 ZERO HASH; C1-C5 come from :mod:`.crossrank`), ``rule``
(H1a H1b H2a H2b H2c H3 H4a H4b H4-open ZERO@backup ZERO@reload HASH), ``rank``, ``epoch``, ``node_id``, ``op``,
``certainty`` ("exact" | "interval"; interval-only findings have ``severity`` WARN), ``evidence`` (seqs, the last
one being where it completed), ``message``, ``src``/``line_no`` of the completing record, ``evidence_lines``.

``Unchecked``: ``kind="level"`` for a rule the stream's level cannot support (at level 1: H1b, H2b, H2c, H3, H4,
each ``need_level=2``); ``kind="skip"`` for counted instances a rule could not decide, by ``rule`` name:
``HASH-skipped(split)`` (split between backup and reload, no ``hp``), ``HASH-skipped(chain)``,
``HASH-skipped(no reload hash)``, ``HASH-skipped(no backup)``, ``HASH-skipped(no hash)``, ``HASH-skipped(sentinel)``;
``kind="undecidable"`` (``rule`` H4a, H4b, H2c or H3) for instances whose only breach was an overlap of ``rng``
summaries that cannot be decided.

Where each finding is reported (the record that proves it):
H1a at the ``split``; H1b at the ``ack dir=d2h``; H2a and H2b at the ``reload``; H2c at the ``ack dir=h2d``;
H3 at the stale ``compose hit=1``; H4a/H4b at the ``ack dir=d2h`` of the breached copy; ZERO@backup at the
``backup``; ZERO@reload at ``reload sync=1`` or the ``ack dir=h2d``; HASH at ``reload sync=1`` or ``ack dir=h2d``.

Conventions the rules rely on (what an emitter such as the simulator should log):

* Slot sets: ``rng`` summaries, plus exact run-length sets ``devx``/``hostx``/``idx_x`` (``a-b:c-d``, in token
  order). Without exact sets an overlap is proven only by what summaries prove (dense blocks, a shared member,
  counting); an overlap they cannot decide is no finding: it is counted per rule as an ``Unchecked`` of kind
  ``"undecidable"`` (H4a, H4b, H2c, H3; C5-fence in :mod:`.crossrank`).
* ``ack dir=h2d`` is one record per chain node (SGLang's ack names each load's last node): the first closes the
  load (H2c), every one is hashed; a chain node without one is listed ``HASH-skipped(no reload hash)``. A split of
  a chain node while its load is in flight is applied to the load (each fragment compares its slice of ``hp``).
* ``prepare``/``backup``/``ack`` are matched by ``node_id`` (and ``op`` when it is the same): a merged op may carry
  a new op id. ``ack dir=d2h`` is one record per acked node id; after a split it lists the fragments in ``pub``.
  Findings about a write (H1b, H4a/H4b, H4-open, ZERO@backup) name its ``prepare``'s op (the lowest op id known for
  it), not the id of the merged op that carried it, so one write is always reported under one op.
* ``reload`` carries the whole ``chain`` and the concatenated ``host``/``dev``; its ``h`` (with ``sync=1``) covers
  the whole chain and is compared only for a one-node chain (or per page via ``hp``). ``ack dir=h2d`` ``h``/``hp``
  cover the node named by its ``node_id``.
* HASH across a split needs per-page ``hp`` on the backup and the reload side. In mode ``shared`` the per-rank
  comparison uses ``hs[rank]`` of the backup when present (else it is left to C5).
* ``compose`` is keyed by ``key``; ``chain`` lists the nodes it derives from (default ``[node_id]``).
* Epochs: a ``reset`` record or a created node id (``split new_id``, ``insert kind=new``) that goes backwards
  starts a new epoch; state of the old epoch is dropped.
"""

from .findings import ERROR, WARN, Finding, Unchecked
from .rank_checker import RankChecker
from .registry import CODES, LEVEL2_RULES, RULE_LEVEL, RULES, STRUCTURAL, Rule

__all__ = [
           "CODES",
           "ERROR",
           "LEVEL2_RULES",
           "RULES",
           "RULE_LEVEL",
           "STRUCTURAL",
           "WARN",
           "Finding",
           "RankChecker",
           "Rule",
           "Unchecked",
]
