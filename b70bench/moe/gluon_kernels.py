"""The one-pair decode kernel in Gluon (Triton's explicit-layout dialect), for `-smem` tilings.

Plain Triton keeps a program's in-flight weights in registers, so before the wait for the previous
kernel (programmatic dependent launch) a program can hold one K-block at most (results/moe-down-h200.md:
two cost the residency). Here every K-block's words and scales are copied into shared memory with
cp.async at the program's start, before the wait, holding no registers; after it the program only reads
them back as they land, chunk by chunk. CUDA sm_90+ (griddepcontrol); not run by Triton's interpreter.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from b70bench.moe.kernels import _WORD_DOT_BF16, _WORD_DOT_FP16

# Triton 3.6 names the cp.async copy async_copy_global_to_shared; later versions async_load.
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _gdc(code: gl.constexpr):
    gl.inline_asm_elementwise(code, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _copy_chunk(qw_base, sc_base, rows, cols, N, c: gl.constexpr, CHUNK: gl.constexpr, BLOCK_N: gl.constexpr,
                GROUP: gl.constexpr, S: gl.constexpr):
    """Chunk c's words and row-broadcast scales into fresh shared memory (cp.async), one commit group."""
    words = gl.allocate_shared_memory(gl.int32, [CHUNK, BLOCK_N], S)
    scales = gl.allocate_shared_memory(sc_base.dtype.element_ty, [CHUNK, BLOCK_N], S)
    r = c * CHUNK + rows
    _cp_async(words, qw_base + r[:, None] * N + cols[None, :], eviction_policy="evict_first")
    _cp_async(scales, sc_base + (r * 8 // GROUP)[:, None] * N + cols[None, :])
    async_copy.commit_group()
    return words, scales


@gluon.jit
def _chunk_products(words, scales, x_pairs, rows, c: gl.constexpr, CHUNK: gl.constexpr, PENDING: gl.constexpr,
                    L: gl.constexpr, HALF: gl.constexpr):
    """Chunk c's scaled products once it has landed (PENDING later chunks may still be in flight)."""
    async_copy.wait_group(PENDING)
    q = words.load(L)
    s = scales.load(L).to(gl.float32)
    first = (c * CHUNK + rows) * 4  # word row r meets x pairs 4r .. 4r+3 (paired nibbles)
    a0, _ = gl.broadcast(gl.expand_dims(gl.load(x_pairs + first), 1), q)
    a1, _ = gl.broadcast(gl.expand_dims(gl.load(x_pairs + first + 1), 1), q)
    a2, _ = gl.broadcast(gl.expand_dims(gl.load(x_pairs + first + 2), 1), q)
    a3, _ = gl.broadcast(gl.expand_dims(gl.load(x_pairs + first + 3), 1), q)
    if HALF:
        d = gl.inline_asm_elementwise(_WORD_DOT_FP16, "=r,r,r,r,r,r", [q, a0, a1, a2, a3], dtype=gl.float32,
                                      is_pure=True, pack=1)
    else:
        d = gl.inline_asm_elementwise(_WORD_DOT_BF16, "=r,r,r,r,r,r", [q, a0, a1, a2, a3], dtype=gl.float32,
                                      is_pure=True, pack=1)
    return d * s


@gluon.jit
def _moe_down_smem(x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, rw_ptr, part_ptr, P, N, K,
                   GROUP: gl.constexpr, BLOCK_N: gl.constexpr, CHUNK: gl.constexpr, NCHUNK: gl.constexpr,
                   HALF: gl.constexpr, WARPS: gl.constexpr):
    """One pair per program over an N-tile: its words [K/8, BLOCK_N] (paired nibbles) and the matching
    row-broadcast scales land in shared memory in NCHUNK (1-4) chunks of CHUNK word rows."""
    # Each thread copies 16-byte row pieces and reads back exactly what it copied (the same layout for the
    # copy and the load), so no barrier is needed between them.
    L: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BLOCK_N // 4), BLOCK_N // 4], [WARPS, 1], [1, 0])
    S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    _gdc("griddepcontrol.launch_dependents; mov.u32 $0, 0;")
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    expert = gl.load(blk_expert_ptr + pid_m).to(gl.int64)
    rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, L))
    cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, L))
    qw_base = qw_ptr + expert * (K // 8) * N
    sc_base = sc_ptr + expert * (K // GROUP) * N
    w0, s0 = _copy_chunk(qw_base, sc_base, rows, cols, N, 0, CHUNK, BLOCK_N, GROUP, S)
    if NCHUNK > 1:
        w1, s1 = _copy_chunk(qw_base, sc_base, rows, cols, N, 1, CHUNK, BLOCK_N, GROUP, S)
    if NCHUNK > 2:
        w2, s2 = _copy_chunk(qw_base, sc_base, rows, cols, N, 2, CHUNK, BLOCK_N, GROUP, S)
    if NCHUNK > 3:
        w3, s3 = _copy_chunk(qw_base, sc_base, rows, cols, N, 3, CHUNK, BLOCK_N, GROUP, S)
    _gdc("griddepcontrol.wait; mov.u32 $0, 0;")  # the activations are the previous kernel's output
    p0 = gl.load(pair_ptr + pid_m)
    x_pairs = (x_ptr + p0.to(gl.int64) * K).to(gl.pointer_type(gl.int32))
    acc = _chunk_products(w0, s0, x_pairs, rows, 0, CHUNK, NCHUNK - 1, L, HALF)
    if NCHUNK > 1:
        acc += _chunk_products(w1, s1, x_pairs, rows, 1, CHUNK, NCHUNK - 2, L, HALF)
    if NCHUNK > 2:
        acc += _chunk_products(w2, s2, x_pairs, rows, 2, CHUNK, NCHUNK - 3, L, HALF)
    if NCHUNK > 3:
        acc += _chunk_products(w3, s3, x_pairs, rows, 3, CHUNK, NCHUNK - 4, L, HALF)
    res = gl.sum(acc, axis=0) * gl.load(rw_ptr + p0)
    gl.store(part_ptr + p0.to(gl.int64) * N + cols, res)
