"""Triton kernels for exact fingerprints, and thin launchers that write into caller-provided result buffers.

Every kernel accumulates into a per-slot *state* row (int64: ``[S0, S1, nz, counter, min, max, bad, -]``) with
atomics and the last program to finish (counter reaches the grid size) moves the totals to the slot's *out* row
(``[S0, S1, nz, bad]`` or ``[min, max, first, last]``) and resets the state, so a slot is ready for its next use
without a memset launch. Inside a tile of at most 4096 bytes all per-byte work is int32 (``W_tile <= 255*4095*4096/2
< 2**31``); each tile is widened once: ``S1 += (o + 1) * S0_tile + W_tile`` in int64, which wraps mod 2**64 exactly
like upstream's int64 sums, whatever the tile or atomic order.

The launchers take torch tensors on any device Triton can address; under ``TRITON_INTERPRET=1`` that includes CPU
tensors, which is how CI checks the kernels bit for bit against :mod:`.reference`. Triton must be imported after
``TRITON_INTERPRET`` is set, so this module is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    import torch

TILE = 4096
# Sub-tiles per step of the contiguous kernels: 4 x 4096 bytes per program iteration keeps several 16-byte loads per
# thread in flight (memory-level parallelism) while each sub-tile's int32 sums stay exact.
SUB = 4
# Bytes per step of the gather kernel (items x power-of-two columns), and the widest item.
GATHER_LANES = 16384
GATHER_COLS = 512
STATE_COLS = 8
OUT_COLS = 4
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
# Columns of a state row.
S_S0, S_S1, S_NZ, S_CNT, S_MIN, S_MAX, S_BAD = range(7)


@triton.jit
def _publish_hash(state_ptr, out_ptr, slot, acc0, acc1, accn, bad, nprog):
    sp = state_ptr + slot * 8
    tl.atomic_add(sp + 0, acc0)
    tl.atomic_add(sp + 1, acc1)
    tl.atomic_add(sp + 2, accn)
    tl.atomic_add(sp + 6, bad)
    done = tl.atomic_add(sp + 3, 1, sem="acq_rel")
    if done == nprog - 1:
        # Last program: read-and-reset with atomics so the totals come from L2, not a stale cache line.
        t0 = tl.atomic_xchg(sp + 0, 0)
        t1 = tl.atomic_xchg(sp + 1, 0)
        tn = tl.atomic_xchg(sp + 2, 0)
        tb = tl.atomic_xchg(sp + 6, 0)
        tl.atomic_xchg(sp + 3, 0)
        op = out_ptr + slot * 4
        tl.store(op + 0, t0)
        tl.store(op + 1, t1)
        tl.store(op + 2, tn)
        tl.store(op + 3, tb)


@triton.jit
def _tile_sums(x_ptr, o, n16, start, SUB: tl.constexpr, BLOCK: tl.constexpr):
    """Partial (S0, S1, nz) of bytes x[o : o + SUB*BLOCK] clipped to n16, as SUB sub-tiles of BLOCK bytes.

    ``n16`` is a multiple of 16 (the compiler can see it), so the mask is constant over 16-byte groups and the loads
    vectorize. Per byte: int32 only. Each sub-tile is widened once: (start + offset + 1) * S0_sub + W_sub, int64."""
    r = tl.arange(0, SUB)
    j = tl.arange(0, BLOCK)
    sub = o + r.to(tl.int64) * BLOCK  # 0-based offset of each sub-tile
    m = (sub[:, None] + j[None, :]) < n16
    b = tl.load(x_ptr + sub[:, None] + j[None, :], mask=m, other=0).to(tl.int32)
    s0 = tl.sum(b, axis=1)
    w = tl.sum(b * j[None, :], axis=1)
    nz = tl.sum((b != 0).to(tl.int32), axis=1)
    p0 = tl.sum(s0.to(tl.int64), axis=0)
    p1 = tl.sum((start + sub + 1) * s0.to(tl.int64) + w.to(tl.int64), axis=0)
    pn = tl.sum(nz.to(tl.int64), axis=0)
    return p0, p1, pn


@triton.jit
def _tail_sums(x_ptr, n16, n, start):
    """(S0, S1, nz) of the last n - n16 (< 16) bytes, byte loads."""
    k = tl.arange(0, 16)
    b = tl.load(x_ptr + n16 + k, mask=k < n - n16, other=0).to(tl.int32)
    s0 = tl.sum(b, axis=0).to(tl.int64)
    w = tl.sum(b * k, axis=0).to(tl.int64)
    nz = tl.sum((b != 0).to(tl.int32), axis=0).to(tl.int64)
    return s0, (start + n16 + 1) * s0 + w, nz


@triton.jit
def _dp4a(a, b, USE_ASM: tl.constexpr):
    """sum over the 4 bytes k of a.byte_k * b.byte_k (unsigned). One ``dp4a`` instruction on NVIDIA GPUs; the same
    value from shifts and masks elsewhere (the interpreter, which CI uses to check this code bit for bit)."""
    if USE_ASM:
        return tl.inline_asm_elementwise("dp4a.u32.u32 $0, $1, $2, 0;", "=r,r,r", [a, b], dtype=tl.uint32,
                                         is_pure=True, pack=1)
    else:
        return ((a & 0xFF) * (b & 0xFF) + ((a >> 8) & 0xFF) * ((b >> 8) & 0xFF)
                + ((a >> 16) & 0xFF) * ((b >> 16) & 0xFF) + ((a >> 24) & 0xFF) * ((b >> 24) & 0xFF))


@triton.jit
def _word_sums(xw_ptr, o, nw, start, ROWS: tl.constexpr, USE_ASM: tl.constexpr):
    """Partial (S0, S1, nz) of a step of ROWS rows of 256 bytes starting at byte offset ``o`` (a multiple of 1024),
    reading 32-bit words (``xw_ptr``: the bytes as uint32, 16-byte aligned; ``nw``: word count, a multiple of 4).

    Per word (SWAR): S0 = dp4a(w, 0x01010101); W = dp4a(w, weights 4q..4q+3) (row-local byte weights < 256); the
    nonzero-byte flags ((w & 0x7F7F7F7F) + 0x7F7F7F7F | w) >> 7 & 0x01010101 summed as packed byte lanes (<= 64 per
    lane per row). Per row (256 bytes) the sums are widened once: S1 += (start + row offset + 1) * S0_row + W_row."""
    r = tl.arange(0, ROWS)
    q = tl.arange(0, 64)
    widx = o // 4 + r.to(tl.int64)[:, None] * 64 + q[None, :]
    w = tl.load(xw_ptr + widx, mask=widx < nw, other=0)
    ones = tl.full((ROWS, 64), 0x01010101, tl.uint32)
    wq = (q * 4 * 0x01010101 + 0x03020100).to(tl.uint32)
    s0e = _dp4a(w, ones, USE_ASM)
    we = _dp4a(w, tl.broadcast_to(wq[None, :], (ROWS, 64)), USE_ASM)
    flags = ((((w & 0x7F7F7F7F) + 0x7F7F7F7F) | w) >> 7) & 0x01010101
    s0r = tl.sum(s0e, axis=1)
    wr = tl.sum(we, axis=1)
    nzp = tl.sum(flags, axis=1)
    nzr = (nzp & 0xFF) + ((nzp >> 8) & 0xFF) + ((nzp >> 16) & 0xFF) + (nzp >> 24)
    rowoff = o + r.to(tl.int64) * 256
    s0r64 = s0r.to(tl.int64)
    p0 = tl.sum(s0r64, axis=0)
    p1 = tl.sum((start + rowoff + 1) * s0r64 + wr.to(tl.int64), axis=0)
    pn = tl.sum(nzr.to(tl.int64), axis=0)
    return p0, p1, pn


@triton.jit
def _nz_flags(w):
    """Per byte of the uint32 words ``w``: 1 if the byte is nonzero, else 0 (packed in the same byte)."""
    return ((((w & 0x7F7F7F7F) + 0x7F7F7F7F) | w) >> 7) & 0x01010101


@triton.jit
def _word_steps(xw_ptr, nfull, start, pid, nprog, STEP: tl.constexpr, USE_ASM: tl.constexpr):
    """(S0, S1, nz) of the full STEP-byte steps pid, pid + nprog, ... (< nfull) of a 16-byte aligned buffer.

    Hot loop: unmasked 16-byte loads and per word three dp4a (byte sum s0, lane-weighted sum w = sum_k k * b_k,
    nonzero count), the nonzero flags and four uint32 adds into element-wise accumulators; no reduction and no 64-bit
    math until the loop ends. Word e = 64 r + q of local iteration i starts at byte (pid + i * nprog) * STEP + 4 e, so
        S1 = sum_e (start + 1 + pid * STEP + 4 e) * A_s0[e] + nprog * STEP * sum_e A_is0[e] + sum_e A_w[e]
    with A_s0 = sum_i s0, A_is0 = sum_i i * s0, A_w = sum_i w: exact in uint32 for up to MAX_ITERS iterations
    (A_is0 <= 1020 * 2048**2 / 2 < 2**32)."""
    ROWS: tl.constexpr = STEP // 256
    loc = tl.arange(0, ROWS)[:, None] * 64 + tl.arange(0, 64)[None, :]
    ones = tl.full((ROWS, 64), 0x01010101, tl.uint32)
    lanes = tl.full((ROWS, 64), 0x03020100, tl.uint32)  # byte k of a word weighs k; 4 * e is in the fold
    a_s0 = tl.zeros((ROWS, 64), tl.uint32)
    a_is0 = tl.zeros((ROWS, 64), tl.uint32)
    a_w = tl.zeros((ROWS, 64), tl.uint32)
    a_nz = tl.zeros((ROWS, 64), tl.uint32)
    for t in range(pid, nfull, nprog):
        i = ((t - pid) // nprog).to(tl.uint32)
        w = tl.load(xw_ptr + tl.cast(t, tl.int64) * (STEP // 4) + loc)
        s0 = _dp4a(w, ones, USE_ASM)
        a_s0 += s0
        a_is0 += i * s0
        a_w += _dp4a(w, lanes, USE_ASM)
        a_nz += _dp4a(_nz_flags(w), ones, USE_ASM)
    s0_64 = a_s0.to(tl.int64)
    base = start + 1 + tl.cast(pid, tl.int64) * STEP
    p0 = tl.sum(tl.sum(s0_64, axis=1), axis=0)
    p1 = tl.sum(tl.sum((base + 4 * loc.to(tl.int64)) * s0_64 + a_w.to(tl.int64), axis=1), axis=0)
    p1 += tl.cast(nprog, tl.int64) * STEP * tl.sum(tl.sum(a_is0.to(tl.int64), axis=1), axis=0)
    pn = tl.sum(tl.sum(a_nz.to(tl.int64), axis=1), axis=0)
    return p0, p1, pn


@triton.jit
def _segment_sums(x_ptr, n, start, pid, nprog, SUB: tl.constexpr, BLOCK: tl.constexpr, WORDS: tl.constexpr,
                  USE_ASM: tl.constexpr):
    """This program's share of (S0, S1, nz) over bytes x[0:n].

    WORDS (x 16-byte aligned): full SUB*BLOCK-byte steps by the SWAR word loop; the last partial step and the
    sub-16-byte tail by program 0. Otherwise int32 per byte over masked steps, the tail by program 0."""
    n16 = (n // 16) * 16
    acc0 = tl.zeros((), tl.int64)
    acc1 = tl.zeros((), tl.int64)
    accn = tl.zeros((), tl.int64)
    if WORDS:
        xw_ptr = x_ptr.to(tl.pointer_type(tl.uint32))
        nfull = n16 // (SUB * BLOCK)
        p0, p1, pn = _word_steps(xw_ptr, nfull, start, pid, nprog, SUB * BLOCK, USE_ASM)
        acc0 += p0
        acc1 += p1
        accn += pn
        if pid == 0:
            o = tl.cast(nfull, tl.int64) * (SUB * BLOCK)
            if o < n16:
                p0, p1, pn = _word_sums(xw_ptr, o, n16 // 4, start, (SUB * BLOCK) // 256, USE_ASM)
                acc0 += p0
                acc1 += p1
                accn += pn
    else:
        nsteps = tl.cdiv(n16, SUB * BLOCK)
        for t in range(pid, nsteps, nprog):
            p0, p1, pn = _tile_sums(x_ptr, tl.cast(t, tl.int64) * (SUB * BLOCK), n16, start, SUB, BLOCK)
            acc0 += p0
            acc1 += p1
            accn += pn
    if pid == 0:
        p0, p1, pn = _tail_sums(x_ptr, n16, n, start)
        acc0 += p0
        acc1 += p1
        accn += pn
    return acc0, acc1, accn


# Scalars are not specialized: a new value of n/start/slot (say 1, or a multiple of 16) must not compile a new
# variant on the caller's path.
@triton.jit(do_not_specialize=["n", "start", "slot"])
def _hash_nz_kernel(x_ptr, n, start, state_ptr, out_ptr, slot, SUB: tl.constexpr, BLOCK: tl.constexpr,
                    WORDS: tl.constexpr, USE_ASM: tl.constexpr):
    """S0, S1, nz of bytes x[0:n] placed at logical byte offset ``start``; programs stride over SUB*BLOCK steps."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc0, acc1, accn = _segment_sums(x_ptr, n, start, pid, nprog, SUB, BLOCK, WORDS, USE_ASM)
    _publish_hash(state_ptr, out_ptr, slot, acc0, acc1, accn, tl.zeros((), tl.int64), nprog)


@triton.jit
def _hash_nz_batch_kernel(base_ptr, offs_ptr, lens_ptr, slots_ptr, state_ptr, out_ptr,
                          SUB: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr, USE_ASM: tl.constexpr):
    """One segment per grid row (axis 0); the programs of axis 1 stride over that segment's steps.

    With ALIGNED the offsets are in units of 16 bytes, so the compiler knows every segment start is 16-byte aligned
    and vectorizes the loads."""
    seg = tl.program_id(0)
    pid = tl.program_id(1)
    nprog = tl.num_programs(1)
    off = tl.load(offs_ptr + seg)
    n = tl.load(lens_ptr + seg)
    slot = tl.load(slots_ptr + seg)
    x_ptr = base_ptr + off * 16 if ALIGNED else base_ptr + off
    acc0, acc1, accn = _segment_sums(x_ptr, n, 0, pid, nprog, SUB, BLOCK, ALIGNED, USE_ASM)
    _publish_hash(state_ptr, out_ptr, slot, acc0, acc1, accn, tl.zeros((), tl.int64), nprog)


@triton.jit(do_not_specialize=["row_stride_u", "row_bytes_u", "npool", "nidx", "slot"])
def _hash_nz_gather_kernel(pool_ptr, row_stride_u, row_bytes_u, npool, idx_ptr, nidx, state_ptr, out_ptr, slot,
                           ROWS: tl.constexpr, COLS: tl.constexpr, CPR: tl.constexpr, UNIT: tl.constexpr,
                           WIDE: tl.constexpr, USE_ASM: tl.constexpr):
    """Bytes of ``pool[idx]`` in token order, never materialized. A step takes ROWS tokens; each token row is read
    as CPR chunks of COLS bytes (the last one masked). Token k starts at logical byte k * row_bytes.

    ``row_stride_u``/``row_bytes_u`` are in units of UNIT bytes. UNIT == 16 (rows 16-byte aligned, row size a
    multiple of 16) reads 32-bit words with dp4a (the compiler sees the alignment through the constant factor);
    UNIT == 1 reads bytes with int32 math per chunk. Narrow sums are widened once per token (word path) or chunk
    (byte path) into per-token int64 accumulators that are reduced once, at the end of the program."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    row_stride = row_stride_u.to(tl.int64) * UNIT
    row_bytes = row_bytes_u.to(tl.int64) * UNIT
    nsteps = tl.cdiv(nidx, ROWS)
    r = tl.arange(0, ROWS)
    acc0 = tl.zeros((ROWS,), tl.int64)
    acc1 = tl.zeros((ROWS,), tl.int64)
    accn = tl.zeros((ROWS,), tl.int64)
    bad = tl.zeros((ROWS,), tl.int64)
    for s in range(pid, nsteps, nprog):
        k = tl.cast(s, tl.int64) * ROWS + r
        live = k < nidx
        row = tl.load(idx_ptr + k, mask=live, other=0).to(tl.int64)
        row = tl.where(row < 0, row + npool, row)  # negative indices count from the end, as in torch indexing
        ok = (row >= 0) & (row < npool)
        bad += (live & ~ok).to(tl.int64)
        valid = live & ok
        o = k * row_bytes
        if UNIT == 16:
            # Word path: element-wise uint32 accumulators over the CPR chunks, reduced once per step. Word u of
            # chunk c of a token sits at token byte c * COLS + 4 u, so its weight is folded as
            #   W_token = sum_u (4 u * A_s0[u] + COLS * A_cs0[u] + A_w[u]),  A_cs0 = sum_c c * s0.
            u = tl.arange(0, COLS // 4)
            pw = pool_ptr.to(tl.pointer_type(tl.uint32))
            base = (row * row_stride_u.to(tl.int64)) * (UNIT // 4)
            ones = tl.full((ROWS, COLS // 4), 0x01010101, tl.uint32)
            lanes = tl.full((ROWS, COLS // 4), 0x03020100, tl.uint32)
            a_s0 = tl.zeros((ROWS, COLS // 4), tl.uint32)
            a_cs0 = tl.zeros((ROWS, COLS // 4), tl.uint32)
            a_w = tl.zeros((ROWS, COLS // 4), tl.uint32)
            a_nz = tl.zeros((ROWS, COLS // 4), tl.uint32)
            for c in range(CPR):
                # Mask in word units (contiguous along u, limit a multiple of 4 words): constant per 16 bytes, so
                # the loads vectorize.
                m = valid[:, None] & ((c * (COLS // 4) + u)[None, :] < row_bytes_u.to(tl.int64) * (UNIT // 4))
                w = tl.load(pw + (base + c * (COLS // 4))[:, None] + u[None, :], mask=m, other=0)
                s0e = _dp4a(w, ones, USE_ASM)
                a_s0 += s0e
                a_cs0 += c * s0e
                a_w += _dp4a(w, lanes, USE_ASM)
                a_nz += _dp4a(_nz_flags(w), ones, USE_ASM)
            s0 = tl.sum(a_s0, axis=1).to(tl.int64)
            if WIDE:  # rows > 4096 bytes: the token's weighted sum may pass 2**32
                wsum = tl.sum((4 * u).to(tl.int64)[None, :] * a_s0.to(tl.int64) + COLS * a_cs0.to(tl.int64)
                              + a_w.to(tl.int64), axis=1)
            else:
                wsum = tl.sum((4 * u).to(tl.uint32)[None, :] * a_s0 + COLS * a_cs0 + a_w, axis=1).to(tl.int64)
            acc0 += s0
            acc1 += (o + 1) * s0 + wsum
            accn += tl.sum(a_nz, axis=1).to(tl.int64)
        else:
            for c in range(CPR):
                col0 = c * COLS
                cc = tl.arange(0, COLS)
                src = row * row_stride + col0
                m = valid[:, None] & ((col0 + cc)[None, :] < row_bytes)
                b = tl.load(pool_ptr + src[:, None] + cc[None, :], mask=m, other=0).to(tl.int32)
                s0 = tl.sum(b, axis=1).to(tl.int64)
                wsum = tl.sum(b * cc[None, :], axis=1).to(tl.int64)
                acc0 += s0
                acc1 += (o + col0 + 1) * s0 + wsum
                accn += tl.sum((b != 0).to(tl.int32), axis=1).to(tl.int64)
    _publish_hash(state_ptr, out_ptr, slot, tl.sum(acc0, axis=0), tl.sum(acc1, axis=0), tl.sum(accn, axis=0),
                  tl.sum(bad, axis=0), nprog)


@triton.jit(do_not_specialize=["n", "slot"])
def _rng_kernel(x_ptr, n, state_ptr, out_ptr, slot, BLOCK: tl.constexpr):
    """min, max, first, last of integer elements x[0:n] (n >= 1), widened to int64."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ntiles = tl.cdiv(n, BLOCK)
    j = tl.arange(0, BLOCK)
    mn = tl.full((), 9223372036854775807, tl.int64)
    mx = tl.full((), -9223372036854775807 - 1, tl.int64)
    for t in range(pid, ntiles, nprog):
        o = tl.cast(t, tl.int64) * BLOCK
        m = j < n - o
        v = tl.load(x_ptr + o + j, mask=m, other=0).to(tl.int64)
        mn = tl.minimum(mn, tl.min(tl.where(m, v, 9223372036854775807), axis=0))
        mx = tl.maximum(mx, tl.max(tl.where(m, v, -9223372036854775807 - 1), axis=0))
    sp = state_ptr + slot * 8
    tl.atomic_min(sp + 4, mn)
    tl.atomic_max(sp + 5, mx)
    done = tl.atomic_add(sp + 3, 1, sem="acq_rel")
    if done == nprog - 1:
        lo = tl.atomic_xchg(sp + 4, 9223372036854775807)
        hi = tl.atomic_xchg(sp + 5, -9223372036854775807 - 1)
        tl.atomic_xchg(sp + 3, 0)
        op = out_ptr + slot * 4
        tl.store(op + 0, lo)
        tl.store(op + 1, hi)
        tl.store(op + 2, tl.load(x_ptr).to(tl.int64))
        tl.store(op + 3, tl.load(x_ptr + (n - 1)).to(tl.int64))


# ------------------------------------------------------------------------------------------------------------------
# Launchers. ``state``: int64 [slots, 8] (zeros, with min/max columns at INT64_MAX/INT64_MIN; every kernel leaves it
# that way); ``out``: int64 [slots, 4].

# Programs per launch: enough to fill the GPU (a few per SM) but bounded, so the per-slot atomics stay cheap.
_MAX_PROGRAMS = 1024


def new_state(slots: int, device: torch.device | str) -> torch.Tensor:
    """A fresh state block in its resting values."""
    import torch

    state = torch.zeros((slots, STATE_COLS), dtype=torch.int64, device=device)
    state[:, S_MIN] = INT64_MAX
    state[:, S_MAX] = INT64_MIN
    return state


# The word loop's uint32 accumulators are exact for at most this many iterations per program.
MAX_ITERS = 2048


def programs_for(ntiles: int, max_programs: int = _MAX_PROGRAMS) -> int:
    """Grid size for ``ntiles`` steps: at most ``max_programs``, but never more than MAX_ITERS steps per program."""
    return max(1, min(ntiles, max_programs), -(-ntiles // MAX_ITERS))


_ASM_BACKEND: bool | None = None


def _use_asm(x: torch.Tensor) -> bool:
    # dp4a through inline PTX on NVIDIA devices; the interpreter (CPU tensors) and other backends run the
    # shift-and-mask equivalent.
    global _ASM_BACKEND
    if x.device.type != "cuda":
        return False
    if _ASM_BACKEND is None:
        try:
            _ASM_BACKEND = triton.runtime.driver.active.get_current_target().backend == "cuda"
        except Exception:
            _ASM_BACKEND = False
    return _ASM_BACKEND


def hash_nz(x: torch.Tensor, state: torch.Tensor, out: torch.Tensor, slot: int, max_programs: int = _MAX_PROGRAMS,
            start: int = 0, words: bool | None = None) -> None:
    """Enqueue S0, S1, nz of the contiguous uint8 1-D tensor ``x`` (length >= 1) into ``out[slot, 0:4]``.

    ``start`` is the logical offset of ``x[0]`` (weights ``start + i + 1``): 0 for a whole tensor; tests use large
    values to drive S1 through 2**63 with a small input. ``words``: force the SWAR word path (needs a 16-byte
    aligned ``x``) or the byte path; default: words when aligned."""
    n = x.numel()
    grid = (programs_for(triton.cdiv(n, SUB * TILE), max_programs),)
    words = x.data_ptr() % 16 == 0 if words is None else words
    _hash_nz_kernel[grid](x, n, start, state, out, slot, SUB=SUB, BLOCK=TILE, WORDS=words, USE_ASM=_use_asm(x),
                          num_warps=8)


def hash_nz_batch(base: torch.Tensor, offs: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor, max_len: int,
                  state: torch.Tensor, out: torch.Tensor, aligned: bool, max_programs_per_segment: int = 64) -> None:
    """Enqueue one launch over segments ``base_bytes[offs[i] : offs[i] + lens[i]]`` writing ``out[slots[i]]``.

    ``offs`` are byte offsets relative to ``base``'s data pointer (may be negative), or, with ``aligned``, offsets in
    units of 16 bytes (every segment start 16-byte aligned). Every length must be >= 1."""
    nseg = offs.numel()
    per_seg = programs_for(triton.cdiv(max_len, SUB * TILE), max_programs_per_segment)
    _hash_nz_batch_kernel[(nseg, per_seg)](base, offs, lens, slots, state, out, SUB=SUB, BLOCK=TILE, ALIGNED=aligned,
                                           USE_ASM=_use_asm(base), num_warps=8)


def gather_shape(row_bytes: int, words: bool = False) -> tuple[int, int, int]:
    """(ROWS, COLS, CPR) of the gather kernel: tokens per step, bytes per chunk, chunks per token row.

    COLS <= 512 keeps a chunk's sums inside one warp; on the word path it is the largest power of two dividing the
    row size (no idle lanes: 1152-byte MLA rows -> 9 chunks of 128 bytes), else the row size rounded up to a power
    of two. ROWS (a power of two) makes a step about GATHER_LANES bytes and each chunk load at least 4096 bytes."""
    if words:
        cols = min(GATHER_COLS, row_bytes & -row_bytes)
    else:
        cols = min(GATHER_COLS, triton.next_power_of_2(max(row_bytes, 16)))
    cpr = max(1, triton.cdiv(row_bytes, cols))
    per_step = max(1, GATHER_LANES // (cpr * cols))
    # At least 4096 bytes per chunk load (16 bytes per thread of 8 warps), so every load is a full 16-byte vector.
    rows = max(1 << (per_step.bit_length() - 1), 4096 // cols)
    return rows, cols, cpr


def hash_nz_gather(pool2d: torch.Tensor, indices: torch.Tensor, state: torch.Tensor, out: torch.Tensor, slot: int,
                   max_programs: int = _MAX_PROGRAMS, words: bool | None = None) -> None:
    """Enqueue S0, S1, nz (and the count of out-of-range indices) of ``pool2d[indices]`` into ``out[slot]``.

    ``pool2d``: uint8 [rows, row_bytes] whose rows are contiguous (any row stride); ``indices``: 1-D integer tensor
    on the same device, nonempty. ``words``: use the 32-bit word path (default: when rows are 16-byte aligned and
    their size is a multiple of 16)."""
    npool, row_bytes = pool2d.shape
    row_stride = pool2d.stride(0)
    nidx = indices.numel()
    aligned = row_stride % 16 == 0 and row_bytes % 16 == 0 and pool2d.data_ptr() % 16 == 0
    unit = 16 if (aligned if words is None else words) else 1
    rows, cols, cpr = gather_shape(row_bytes, unit == 16)
    grid = (programs_for(triton.cdiv(nidx, rows), max_programs),)
    _hash_nz_gather_kernel[grid](pool2d, row_stride // unit, row_bytes // unit, npool, indices, nidx, state, out,
                                 slot, ROWS=rows, COLS=cols, CPR=cpr, UNIT=unit, WIDE=row_bytes > 4096,
                                 USE_ASM=_use_asm(pool2d), num_warps=8)


def rng_summary(x: torch.Tensor, state: torch.Tensor, out: torch.Tensor, slot: int,
                max_programs: int = _MAX_PROGRAMS) -> None:
    """Enqueue min, max, first, last of the contiguous 1-D integer tensor ``x`` (length >= 1) into ``out[slot]``."""
    n = x.numel()
    block = 1024
    grid = (programs_for(triton.cdiv(n, block), max_programs),)
    _rng_kernel[grid](x, n, state, out, slot, BLOCK=block, num_warps=4)
