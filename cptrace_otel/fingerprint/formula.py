"""The fingerprint formula as plain integer arithmetic (no torch, no numpy).

Upstream ``khash`` is ``((S1 ^ (S0 * 1000003) ^ n) & (2**63 - 1))`` in int64 wraparound arithmetic, with
``S0 = sum(b_i)`` and ``S1 = sum(b_i * (i + 1))`` over the tensor's bytes ``b``. Addition and multiplication are ring
homomorphisms mod 2**64 and XOR/AND act on bit patterns, so every fast path computes the two sums mod 2**64 in any
split and order and finishes here. For a tile starting at 0-based byte offset ``o`` with local index ``j``:

    S1 = sum over tiles of (o + 1) * S0_tile + W_tile,   W_tile = sum_j b[o + j] * j.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
MASK63 = (1 << 63) - 1
MULT = 1000003


def finish(s0: int, s1: int, n: int) -> int:
    """``khash`` from the two sums (any representative mod 2**64, signed or unsigned) and the byte count."""
    return ((s1 & MASK64) ^ ((s0 * MULT) & MASK64) ^ (n & MASK64)) & MASK63


def combine_tile(s1: int, s0_tile: int, w_tile: int, offset: int) -> int:
    """Fold one tile's narrow partial sums into ``S1`` (mod 2**64). ``offset`` is the tile's 0-based byte offset."""
    return (s1 + (offset + 1) * s0_tile + w_tile) & MASK64


def to_signed64(v: int) -> int:
    """The int64 reading of a 64-bit pattern."""
    v &= MASK64
    return v - (1 << 64) if v >> 63 else v
