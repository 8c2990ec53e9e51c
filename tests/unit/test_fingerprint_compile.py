"""The Triton kernels compile for an H100/H200-class GPU (sm_90) without a GPU, and the hot loops take the shape
the throughput figures depend on: 16-byte vector loads, dp4a on the word paths, 64-bit atomics for the result slot.

The interpreter tests check the arithmetic; this checks what the interpreter cannot: lowering (inline PTX, pointer
casts, scalar atomics, int64 constants) and vectorization. Skipped where triton or its CUDA backend is missing.
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiled-mode check (TRITON_INTERPRET is set)", allow_module_level=True)

D16 = [["tt.divisibility", 16]]


def _ptx(fn, signature: dict, constexprs: dict, aligned_args: tuple) -> str:
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except Exception as e:  # pragma: no cover - other triton layouts
        pytest.skip(f"triton compiler API unavailable: {e}")
    names = list(signature)
    attrs = {(names.index(a),): D16 for a in aligned_args}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    except Exception as e:
        if "ptxas" in str(e).lower() or "backend" in str(e).lower():
            pytest.skip(f"no CUDA toolchain for triton here: {e}")
        raise
    return k.asm["ptx"]


@pytest.fixture(scope="module")
def tk():
    from cptrace_otel.fingerprint import triton_kernels

    return triton_kernels


HASH_SIG = {"x_ptr": "*u8", "n": "i32", "start": "i64", "state_ptr": "*i64", "out_ptr": "*i64", "slot": "i32",
            "SUB": "constexpr", "BLOCK": "constexpr", "WORDS": "constexpr", "USE_ASM": "constexpr"}


@pytest.mark.parametrize("n_type", ["i32", "i64"])
def test_contiguous_kernel_word_path(tk, n_type) -> None:
    ptx = _ptx(tk._hash_nz_kernel, dict(HASH_SIG, n=n_type),
               {"SUB": tk.SUB, "BLOCK": tk.TILE, "WORDS": True, "USE_ASM": True},
               ("x_ptr", "state_ptr", "out_ptr"))
    assert "ld.global.v4.b32" in ptx and "dp4a.u32.u32" in ptx
    assert "atom.global.gpu.acq_rel.add.u64" in ptx


def test_contiguous_kernel_byte_path(tk) -> None:
    ptx = _ptx(tk._hash_nz_kernel, HASH_SIG, {"SUB": tk.SUB, "BLOCK": tk.TILE, "WORDS": False, "USE_ASM": True},
               ("x_ptr",))
    assert "atom.global.gpu.acq_rel.add.u64" in ptx


@pytest.mark.parametrize("aligned", [True, False])
def test_batched_kernel(tk, aligned) -> None:
    sig = {"base_ptr": "*u8", "offs_ptr": "*i64", "lens_ptr": "*i64", "slots_ptr": "*i64", "state_ptr": "*i64",
           "out_ptr": "*i64", "SUB": "constexpr", "BLOCK": "constexpr", "ALIGNED": "constexpr",
           "USE_ASM": "constexpr"}
    ptx = _ptx(tk._hash_nz_batch_kernel, sig, {"SUB": tk.SUB, "BLOCK": tk.TILE, "ALIGNED": aligned, "USE_ASM": True},
               ("base_ptr", "offs_ptr", "lens_ptr", "slots_ptr", "state_ptr", "out_ptr"))
    if aligned:
        assert "ld.global.v4.b32" in ptx and "dp4a.u32.u32" in ptx


@pytest.mark.parametrize("row_bytes,unit", [(1152, 16), (64, 16), (5008, 16), (14, 1), (5000, 1)])
def test_gather_kernel(tk, row_bytes, unit) -> None:
    rows, cols, cpr = tk.gather_shape(row_bytes, unit == 16)
    sig = {"pool_ptr": "*u8", "row_stride_u": "i32", "row_bytes_u": "i32", "npool": "i32", "idx_ptr": "*i64",
           "nidx": "i32", "state_ptr": "*i64", "out_ptr": "*i64", "slot": "i32", "ROWS": "constexpr",
           "COLS": "constexpr", "CPR": "constexpr", "UNIT": "constexpr", "WIDE": "constexpr", "USE_ASM": "constexpr"}
    ptx = _ptx(tk._hash_nz_gather_kernel, sig,
               {"ROWS": rows, "COLS": cols, "CPR": cpr, "UNIT": unit, "WIDE": row_bytes > 4096, "USE_ASM": True},
               ("pool_ptr", "idx_ptr", "state_ptr", "out_ptr"))
    if unit == 16:
        assert "ld.global.v4.b32" in ptx and "dp4a.u32.u32" in ptx


@pytest.mark.parametrize("elem", ["*i64", "*i32", "*i16", "*i8", "*u8"])
def test_rng_kernel(tk, elem) -> None:
    sig = {"x_ptr": elem, "n": "i32", "state_ptr": "*i64", "out_ptr": "*i64", "slot": "i32", "BLOCK": "constexpr"}
    ptx = _ptx(tk._rng_kernel, sig, {"BLOCK": 1024}, ("x_ptr", "state_ptr", "out_ptr"))
    assert "atom.global.gpu.acq_rel.min.s64" in ptx and "atom.global.gpu.acq_rel.max.s64" in ptx
