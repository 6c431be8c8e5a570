"""Triton kernels for the u4 MoE down projection (imported only when a Triton variant runs).

Only @triton.jit code and the constexpr globals it reads live here: the options they take are the fields
of b70bench.moe.configs.Config, the host side (grouping pairs into blocks, repacking weights, launching) is
b70bench.moe.launch, and the inline PTX text is built by b70bench.moe.ptx.

Expert-major: pairs (token, expert slot) are sorted by expert and cut into blocks of
BLOCK_M pairs of one expert; one program per (block, N-tile, K-split) streams that expert's
packed weights once for all its pairs. Each program writes routing-weighted fp32 partials
[SPLIT_K, T*topk, N]; the sum over a token's experts and K-splits is either a second
kernel (`_moe_sum`) or done in-kernel by the last program to finish a (token, N-tile),
found with an atomic counter (FUSED_REDUCE), which saves a launch.

Below 32 pairs per block the nibbles are never interleaved back into K order. Word row r of a K-block holds
k = k0 + 8r + j in nibble j, so the block is eight [BLOCK_K/8, BLOCK_N] weight planes in the
loaded tile's own layout, each multiplied by the activations at the matching stride-8
columns. The register tile is used as loaded: no shared-memory round trip, no barrier
between K-blocks. Decode (1-2 pairs per block) accumulates elementwise products into a
[BLOCK_M, BLOCK_K/8, BLOCK_N] fp32 tile and reduces it over the word rows once, at the end.
Blocks of 16 pairs take one tensor-core dot per nibble plane. Blocks of 32+ pairs (prefill)
do interleave: one dot over the whole K-block, which at that size is cheaper than the eight
K=16 plane dots it replaces (each goes through shared memory; 2-2.4x slower at 512 tokens).
"""

from __future__ import annotations

import triton
import triton.language as tl

from b70bench.moe import ptx
from b70bench.moe.layout import PACK

# Globals a @triton.jit function reads must be constexpr objects (the interpreter is laxer).
PACK_C = tl.constexpr(PACK)
# fp32 2**23: OR-ing a nibble field (bits < 23) into its mantissa gives 2**23 + field exactly.
MAGIC_BITS = tl.constexpr(0x4B000000)
MAGIC = tl.constexpr(8388608.0)
# _moe_down_vec's LAUNCH: the tiling's only launch, or (with PDL and EARLY) the first or the second of a mixed
# tiling's two launches, which run at the same time.
LAUNCH_ALONE = tl.constexpr(0)
LAUNCH_FIRST = tl.constexpr(1)
LAUNCH_SECOND = tl.constexpr(2)


@triton.jit
def _nibble_bits(src, J: tl.constexpr, ASM: tl.constexpr):
    """src's bits of nibble J % 4 (of 0..15) with fp32 2**23's exponent OR-ed in. One LOP3
    ((a & b) | c, LUT 0xEA) on the GPU; some ptxas versions (Triton 3.6's) emit two for the
    plain expression, which the interpreter path keeps."""
    if ASM:
        if J % 4 == 0:
            bits = tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x0000000F, 0x4B000000, 0xEA;", "=r,r", [src],
                                             dtype=tl.int32, is_pure=True, pack=1)
        elif J % 4 == 1:
            bits = tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x000000F0, 0x4B000000, 0xEA;", "=r,r", [src],
                                             dtype=tl.int32, is_pure=True, pack=1)
        elif J % 4 == 2:
            bits = tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x00000F00, 0x4B000000, 0xEA;", "=r,r", [src],
                                             dtype=tl.int32, is_pure=True, pack=1)
        else:
            bits = tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x0000F000, 0x4B000000, 0xEA;", "=r,r", [src],
                                             dtype=tl.int32, is_pure=True, pack=1)
    else:
        bits = (src & (15 << (4 * (J % 4)))) | MAGIC_BITS
    return bits


@triton.jit
def _plane(q, q_hi, J: tl.constexpr, ASM: tl.constexpr):
    """Nibble J of every word as exact fp32 (value - 8), in q's layout. Per element: one
    LOP3 (mask | exponent), one FFMA; no int->float conversion (a slower instruction)."""
    if J < 4:
        src = q
    else:
        src = q_hi
    # Shift amounts and factors stay constexpr expressions: a local name would not be constexpr
    # in Triton 3.9 without an annotation, which older Tritons may not take.
    f = _nibble_bits(src, J, ASM).to(tl.float32, bitcast=True)  # 2**23 + nibble * 16**(J%4)
    # f * 16**-s is exact and so is the sum (a small integer): one FFMA once contracted; no
    # tl.fma, whose scalar broadcasting older Tritons lack.
    return f * (1.0 / (1 << (4 * (J % 4)))) - (MAGIC / (1 << (4 * (J % 4))) + 8.0)


@triton.jit
def _x_pair_adjacent(x_row, cols, ok, J: tl.constexpr):
    """x at columns 8r+2J and 8r+2J+1 as one 32-bit load: the pairing of pair_nibbles' words."""
    return tl.load(x_row.to(tl.pointer_type(tl.int32)) + cols // 2 + J, mask=ok, other=0)


@triton.jit
def _x_pair(x_row, cols, ok, J: tl.constexpr):
    """x at columns 8r+J (low half) and 8r+J+4 (high half) of each word row r as one 32-bit
    register: the pairing one LOP3 yields from a word (nibbles J and J+4 are 16 bits apart)."""
    lo = tl.load(x_row + cols + J, mask=ok, other=0.0).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi = tl.load(x_row + cols + (J + 4), mask=ok, other=0.0).to(tl.int16, bitcast=True).to(tl.int32)
    return lo | (hi << 16)


_WORD_DOT_BF16 = tl.constexpr(ptx.word_dot(False, 1))
_WORD_DOT_FP16 = tl.constexpr(ptx.word_dot(True, 1))
# -2r: two words of one scale group (rows half a group apart) through the same 16x2 accumulator before the
# one fp32 halves-sum: per two words one shl/and/add, one scale and one fp32 accumulation instead of two each
# (20 -> 17.5 SASS instructions per word). The 16-bit sum runs over 8 products instead of 4.
_WORD_DOT2_BF16 = tl.constexpr(ptx.word_dot(False, 2))
_WORD_DOT2_FP16 = tl.constexpr(ptx.word_dot(True, 2))
# Split of _WORD_DOT_* for -dq: the dequantization (four 16x2 registers of nibble - 8 per word, $0-$3 from the
# word $4) runs before the wait, on weights only; the products ($0 from the registers $1-$4 and x pairs $5-$8)
# after it, on the activations.
_DEQUANT_BF16 = tl.constexpr(ptx.dequant_word(False))
_DEQUANT_FP16 = tl.constexpr(ptx.dequant_word(True))
_DQ_DOT_BF16 = tl.constexpr(ptx.dequantized_dot(False))
_DQ_DOT_FP16 = tl.constexpr(ptx.dequantized_dot(True))


@triton.jit
def _unpair(xp, HALF: tl.constexpr, HIGH: tl.constexpr):
    """One half of an x pair back to fp32 (the interpreter path)."""
    bits = (xp >> 16) & 0xFFFF if HIGH else xp & 0xFFFF
    if HALF:
        return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return (bits << 16).to(tl.float32, bitcast=True)


@triton.jit
def _spread(xp0, xp1, xp2, xp3, like):
    """A word row's four x pairs ([rows]) broadcast to the words' shape [rows, BLOCK_N]."""
    a1, _ = tl.broadcast(xp0[:, None], like)
    a2, _ = tl.broadcast(xp1[:, None], like)
    a3, _ = tl.broadcast(xp2[:, None], like)
    a4, _ = tl.broadcast(xp3[:, None], like)
    return a1, a2, a3, a4


@triton.jit
def _word_dot(q, xp0, xp1, xp2, xp3, HALF: tl.constexpr, ASM: tl.constexpr):
    """sum over a word's eight nibbles of (nibble - 8) * x, [rows, BLOCK_N] fp32; xp* are the
    row's x pairs (_x_pair, [rows]). On the GPU in packed 16-bit arithmetic; the interpreter
    computes the same sum in fp32 (it runs no PTX)."""
    a1, a2, a3, a4 = _spread(xp0, xp1, xp2, xp3, q)
    if ASM:
        if HALF:
            res = tl.inline_asm_elementwise(_WORD_DOT_FP16, "=r,r,r,r,r,r", [q, a1, a2, a3, a4],
                                            dtype=tl.float32, is_pure=True, pack=1)
        else:
            res = tl.inline_asm_elementwise(_WORD_DOT_BF16, "=r,r,r,r,r,r", [q, a1, a2, a3, a4],
                                            dtype=tl.float32, is_pure=True, pack=1)
    else:
        res = _pair_term(q, a1, 0, HALF) + _pair_term(q, a2, 1, HALF)
        res += _pair_term(q, a3, 2, HALF) + _pair_term(q, a4, 3, HALF)
    return res


@triton.jit
def _pair_term(q, xp, J: tl.constexpr, HALF: tl.constexpr):
    lo = (((q >> (4 * J)) & 15) - 8).to(tl.float32) * _unpair(xp, HALF, False)
    return lo + (((q >> (4 * J + 16)) & 15) - 8).to(tl.float32) * _unpair(xp, HALF, True)


@triton.jit
def _dequant(q, HALF: tl.constexpr, ASM: tl.constexpr):
    """A word's eight nibbles - 8 as four 32-bit registers of two 16-bit values: register J holds
    nibbles J and J+4, the halves x pair J meets. The interpreter keeps them as int16 halves.
    The asm is marked impure as measured (docs/moe-down.md); what keeps it before the wait is the branch
    in _moe_down_vec, not this."""
    if ASM:
        if HALF:
            w = tl.inline_asm_elementwise(_DEQUANT_FP16, "=r,=r,=r,=r,r", [q],
                                          dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)
        else:
            w = tl.inline_asm_elementwise(_DEQUANT_BF16, "=r,=r,=r,=r,r", [q],
                                          dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)
        w0, w1, w2, w3 = w
    else:
        w0 = (((q >> 16) & 15) - 8) << 16 | ((q & 15) - 8) & 0xFFFF
        w1 = (((q >> 20) & 15) - 8) << 16 | (((q >> 4) & 15) - 8) & 0xFFFF
        w2 = (((q >> 24) & 15) - 8) << 16 | (((q >> 8) & 15) - 8) & 0xFFFF
        w3 = (((q >> 28) & 15) - 8) << 16 | (((q >> 12) & 15) - 8) & 0xFFFF
    return w0, w1, w2, w3


@triton.jit
def _dq_term(w, xp, HALF: tl.constexpr):
    lo = ((w << 16) >> 16).to(tl.float32) * _unpair(xp, HALF, False)
    return lo + (w >> 16).to(tl.float32) * _unpair(xp, HALF, True)


@triton.jit
def _dq_dot(w0, w1, w2, w3, xp0, xp1, xp2, xp3, HALF: tl.constexpr, ASM: tl.constexpr):
    """_word_dot on dequantized words (_dequant): four 16x2 FMAs and the halves' fp32 sum."""
    a1, a2, a3, a4 = _spread(xp0, xp1, xp2, xp3, w0)
    if ASM:
        if HALF:
            res = tl.inline_asm_elementwise(_DQ_DOT_FP16, "=r,r,r,r,r,r,r,r,r", [w0, w1, w2, w3, a1, a2, a3, a4],
                                            dtype=tl.float32, is_pure=True, pack=1)
        else:
            res = tl.inline_asm_elementwise(_DQ_DOT_BF16, "=r,r,r,r,r,r,r,r,r", [w0, w1, w2, w3, a1, a2, a3, a4],
                                            dtype=tl.float32, is_pure=True, pack=1)
    else:
        res = _dq_term(w0, a1, HALF) + _dq_term(w1, a2, HALF) + _dq_term(w2, a3, HALF) + _dq_term(w3, a4, HALF)
    return res


@triton.jit
def _word_dot2(qa, qb, xa0, xa1, xa2, xa3, xb0, xb1, xb2, xb3, HALF: tl.constexpr, ASM: tl.constexpr):
    """_word_dot of two words (qa with the xa pairs, qb with the xb pairs) summed, [rows, BLOCK_N] fp32 (-2r)."""
    if ASM:
        a1, a2, a3, a4 = _spread(xa0, xa1, xa2, xa3, qa)
        b1, b2, b3, b4 = _spread(xb0, xb1, xb2, xb3, qa)
        if HALF:
            res = tl.inline_asm_elementwise(_WORD_DOT2_FP16, "=r,r,r,r,r,r,r,r,r,r,r",
                                            [qa, qb, a1, a2, a3, a4, b1, b2, b3, b4], dtype=tl.float32,
                                            is_pure=True, pack=1)
        else:
            res = tl.inline_asm_elementwise(_WORD_DOT2_BF16, "=r,r,r,r,r,r,r,r,r,r,r",
                                            [qa, qb, a1, a2, a3, a4, b1, b2, b3, b4], dtype=tl.float32,
                                            is_pure=True, pack=1)
    else:
        res = _word_dot(qa, xa0, xa1, xa2, xa3, HALF, ASM) + _word_dot(qb, xb0, xb1, xb2, xb3, HALF, ASM)
    return res


@triton.jit
def _first_rows(BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """-2r: a K-block's word rows in the first half of their scale group (GROUP/16 of its GROUP/8 rows);
    row r + GROUP/16 is its partner, same group, same scale."""
    i = tl.arange(0, BLOCK_K // (2 * PACK_C))
    return (i // (GROUP // (2 * PACK_C))) * (GROUP // PACK_C) + i % (GROUP // (2 * PACK_C))


@triton.jit
def _two_row_weights(qw_base, sc_base, k0, k_end, rows, w_cols, n_ok, w_stride, GROUP: tl.constexpr):
    """_block_weights for -2r: the first rows' words and scales, and their partners' words."""
    qa, s = _block_weights(qw_base, sc_base, k0, k_end, rows, w_cols, n_ok, w_stride, GROUP)
    partner = rows + GROUP // (2 * PACK_C)
    ok = ((k0 + partner * PACK_C) < k_end)[:, None] & n_ok[None, :]
    return qa, _load_words(qw_base, k0, partner, w_cols, ok, w_stride), s


@triton.jit
def _two_row_products(qa, qb, s, x_row, p, k0, k_end, rows, P, GROUP: tl.constexpr, HALF: tl.constexpr,
                      ASM: tl.constexpr):
    """_block_products for -2r (paired words): both rows' scaled products, [BLOCK_K/16, BLOCK_N] fp32."""
    cols = k0 + rows * PACK_C
    ok = (cols < k_end) & ((rows * 0 + p) < P)
    cols_b = cols + GROUP // 2
    # A masked word is 0, whose nibbles dequantize to -8: its x must be masked to 0 with it.
    ok_b = (cols_b < k_end) & ((rows * 0 + p) < P)
    return _word_dot2(qa, qb, _x_pair_adjacent(x_row, cols, ok, 0), _x_pair_adjacent(x_row, cols, ok, 1),
                      _x_pair_adjacent(x_row, cols, ok, 2), _x_pair_adjacent(x_row, cols, ok, 3),
                      _x_pair_adjacent(x_row, cols_b, ok_b, 0), _x_pair_adjacent(x_row, cols_b, ok_b, 1),
                      _x_pair_adjacent(x_row, cols_b, ok_b, 2), _x_pair_adjacent(x_row, cols_b, ok_b, 3),
                      HALF, ASM) * s


@triton.jit
def _reduce_tokens(pairs, m_ok, offs_n, n_ok, pid_n, part_ptr, out_ptr, cnt_ptr, P, N, n_tiles,
                   TOPK: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The last program to store a partial of a (token, N-tile) sums that token's top-k x
    split partials into out and re-arms the counter (for the next launch or graph replay)."""
    # Every thread's partial store must be visible before this program's arrival counts.
    tl.debug_barrier()
    tok = pairs // TOPK
    cnt = cnt_ptr + tok * n_tiles + pid_n
    arrived = tl.atomic_add(cnt, 1, mask=m_ok, sem="acq_rel", scope="gpu")
    last = m_ok & (arrived == TOPK * SPLIT_K - 1)
    tl.debug_barrier()
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    lok = last[:, None] & n_ok[None, :]
    tok_rows = tok.to(tl.int64)[:, None] * TOPK
    for s_i in tl.static_range(SPLIT_K):
        for j in tl.static_range(TOPK):
            # .cg reads from L2: other SMs wrote these partials, this SM's L1 may be stale.
            total += tl.load(part_ptr + s_i * P * N + (tok_rows + j) * N + offs_n[None, :], mask=lok,
                             other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + tok.to(tl.int64)[:, None] * N + offs_n[None, :], total.to(out_ptr.dtype.element_ty),
             mask=lok)
    tl.store(cnt, tl.zeros_like(arrived), mask=last)


@triton.jit
def _finish_rows(acc, pairs, m_ok, offs_n, n_ok, pid_n, pid_k, rw_ptr, part_ptr, out_ptr, cnt_ptr, P, N, n_tiles,
                 TOPK: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 FUSED_REDUCE: tl.constexpr):
    """A dot block's epilogue: routing-weighted fp32 partials out, then (FUSED_REDUCE) the token sum."""
    acc = acc * tl.load(rw_ptr + pairs, mask=m_ok, other=0.0)[:, None]
    ok = m_ok[:, None] & n_ok[None, :]
    tl.store(part_ptr + pid_k * P * N + pairs.to(tl.int64)[:, None] * N + offs_n[None, :], acc, mask=ok)
    if FUSED_REDUCE:
        _reduce_tokens(pairs, m_ok, offs_n, n_ok, pid_n, part_ptr, out_ptr, cnt_ptr, P, N, n_tiles,
                       TOPK, SPLIT_K, BLOCK_M, BLOCK_N)


@triton.jit
def _scales(sc_base, k0, rows, offs_n, ok, N, GROUP: tl.constexpr):
    """fp32 scales of each word row's group, [BLOCK_K/8, BLOCK_N]: the words' own shape and
    layout, so applying them needs no layout conversion (a [BLOCK_N] row would go through
    shared memory); the repeated rows are L1 hits. `ok`: the [rows, BLOCK_N] mask."""
    return tl.load(sc_base + ((k0 + rows * PACK_C) // GROUP)[:, None] * N + offs_n[None, :],
                   mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _load_words(qw_base, k0, rows, offs_n, ok, N):
    # Streamed once: first out of the caches (x and the partials stay).
    return tl.load(qw_base + (k0 // PACK_C + rows)[:, None] * N + offs_n[None, :], mask=ok,
                   other=0, eviction_policy="evict_first")


@triton.jit
def _block_weights(qw_base, sc_base, k0, k_end, rows, w_cols, n_ok, w_stride, GROUP: tl.constexpr):
    """A decode K-block's words and fp32 scales, [BLOCK_K/8, BLOCK_N] each; rows at or past
    k_end are masked (a K-block deeper than the split, or the one after the last)."""
    ok = ((k0 + rows * PACK_C) < k_end)[:, None] & n_ok[None, :]
    return (_load_words(qw_base, k0, rows, w_cols, ok, w_stride),
            _scales(sc_base, k0, rows, w_cols, ok, w_stride, GROUP))


@triton.jit
def _block_products(q, s, x_row, p, k0, k_end, rows, P, PACKED: tl.constexpr, PAIRED: tl.constexpr,
                    HALF: tl.constexpr, ASM: tl.constexpr):
    """One pair's scaled products over a decode K-block, [BLOCK_K/8, BLOCK_N] fp32 in q's layout."""
    cols = k0 + rows * PACK_C  # column 8r of this block: word row r's nibble 0
    # A vector mask (rows * 0 + p): Triton's interpreter rejects a scalar mask on a vector load.
    ok = (cols < k_end) & ((rows * 0 + p) < P)
    if PACKED and PAIRED:  # words from pair_nibbles: each x pair is one 32-bit load
        blk = _word_dot(q, _x_pair_adjacent(x_row, cols, ok, 0), _x_pair_adjacent(x_row, cols, ok, 1),
                        _x_pair_adjacent(x_row, cols, ok, 2), _x_pair_adjacent(x_row, cols, ok, 3), HALF, ASM)
    elif PACKED:
        blk = _word_dot(q, _x_pair(x_row, cols, ok, 0), _x_pair(x_row, cols, ok, 1), _x_pair(x_row, cols, ok, 2),
                        _x_pair(x_row, cols, ok, 3), HALF, ASM)
    else:
        q_hi = q >> 16
        blk = tl.zeros(q.shape, dtype=tl.float32)
        for j in tl.static_range(PACK_C):
            blk += tl.load(x_row + cols + j, mask=ok, other=0.0).to(tl.float32)[:, None] * _plane(q, q_hi, j, ASM)
    return blk * s


@triton.jit
def _dq_products(w0, w1, w2, w3, s, x_row, p, k0, k_end, rows, P, HALF: tl.constexpr, ASM: tl.constexpr):
    """_block_products for a K-block dequantized before the wait (-dq; paired words)."""
    cols = k0 + rows * PACK_C
    ok = (cols < k_end) & ((rows * 0 + p) < P)
    return _dq_dot(w0, w1, w2, w3, _x_pair_adjacent(x_row, cols, ok, 0), _x_pair_adjacent(x_row, cols, ok, 1),
                   _x_pair_adjacent(x_row, cols, ok, 2), _x_pair_adjacent(x_row, cols, ok, 3), HALF, ASM) * s


@triton.jit
def _wait_for_activations(PDL: tl.constexpr, EARLY: tl.constexpr, ASM: tl.constexpr, LAUNCH: tl.constexpr):
    """Launched early (-early), wait for the previous kernel's output (the activations) here; the first launch of
    a concurrent mixed tiling (LAUNCH_FIRST) then lets the second launch start."""
    if EARLY and ASM and LAUNCH != LAUNCH_SECOND:
        tl.extra.cuda.gdc_wait()
    if PDL and ASM and LAUNCH == LAUNCH_FIRST:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _moe_down_vec(x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, rw_ptr, part_ptr, out_ptr, cnt_ptr,
                  P, N, K, n_tiles,
                  TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FUSED_REDUCE: tl.constexpr, ASM: tl.constexpr,
                  STAGES: tl.constexpr, PACKED: tl.constexpr, HALF: tl.constexpr, TILED: tl.constexpr,
                  PAIRED: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
                  LAUNCH: tl.constexpr = 0, DQ: tl.constexpr = False, TWO_ROWS: tl.constexpr = False,
                  PAD: tl.constexpr = 0, PAD_ASM: tl.constexpr = ""):
    """Decode: 1 or 2 pairs per block. Each pair accumulates scaled products in a
    [BLOCK_K/8, BLOCK_N] fp32 tile laid out like the loaded words (2D, so every op keeps the
    load's layout); the word rows are summed once, after the K loop.

    LAUNCH (with PDL and EARLY): LAUNCH_ALONE, or LAUNCH_FIRST and LAUNCH_SECOND, the two launches of a
    mixed tiling, run at the same time. The first lets the next launch start only after its own wait, when
    the activations are ready; the second, launched under it, so reads them without a wait, and waits for
    the first grid before it ends, so that whatever waits for it (the sum kernel) also waits for both."""
    if PAD > 0 and ASM:
        # -oN: PAD bytes of shared memory held so that at most N programs share an SM (residency_pad).
        tl.inline_asm_elementwise(PAD_ASM, "=r,r", [P], dtype=tl.int32, is_pure=False, pack=1)
    if PDL and ASM and LAUNCH != LAUNCH_FIRST:
        # What follows may launch now (the sum kernel; with FUSED_REDUCE the next kernel, if it is
        # launched for it); it waits (gdc_wait) for this whole grid before reading what it wrote.
        tl.extra.cuda.gdc_launch_dependents()
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    expert = tl.load(blk_expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = tl.arange(0, BLOCK_K // PACK_C)
    k_per = K // SPLIT_K
    k_lo = pid_k * k_per
    k_end = k_lo + k_per
    if TILED:
        # Weights and scales repacked N-tile-major (tile_weights): this program's words are one
        # contiguous run, read front to back, not BLOCK_N-wide pieces of rows N words apart.
        tile = expert * n_tiles + pid_n
        qw_base = qw_ptr + tile * (K // PACK_C) * BLOCK_N
        sc_base = sc_ptr + tile * (K // GROUP) * BLOCK_N
        w_cols = tl.arange(0, BLOCK_N)
        w_stride = BLOCK_N
    else:
        qw_base = qw_ptr + expert * (K // PACK_C) * N
        sc_base = sc_ptr + expert * (K // GROUP) * N
        w_cols = offs_n
        w_stride = N
    p0 = tl.load(pair_ptr + pid_m * BLOCK_M)
    x0 = x_ptr + p0.to(tl.int64) * K
    acc0 = tl.zeros((BLOCK_K // PACK_C, BLOCK_N), dtype=tl.float32)
    if BLOCK_M == 2:
        p1 = tl.load(pair_ptr + pid_m * BLOCK_M + 1)
        x1 = x_ptr + p1.to(tl.int64) * K
        acc1 = tl.zeros((BLOCK_K // PACK_C, BLOCK_N), dtype=tl.float32)
    # A K-block deeper than the split (BLOCK_K > k_per, e.g. 512 for TP4's 384) is one masked
    # iteration: the whole split's loads are issued at once, which a loop of dependent K-blocks
    # cannot do (decode rows are bound by the bytes each SM has in flight; docs/moe-down.md).
    if TWO_ROWS:
        # -2r (paired words, K-blocks of whole groups): as the branch below, over pairs of word rows of one scale
        # group, so its accumulators (half_acc*) hold half the rows.
        first = _first_rows(BLOCK_K, GROUP)
        half_acc0 = tl.zeros((BLOCK_K // (2 * PACK_C), BLOCK_N), dtype=tl.float32)
        if BLOCK_M == 2:
            half_acc1 = tl.zeros((BLOCK_K // (2 * PACK_C), BLOCK_N), dtype=tl.float32)
        qa, qb, s = _two_row_weights(qw_base, sc_base, k_lo, k_end, first, w_cols, n_ok, w_stride, GROUP)
        _wait_for_activations(PDL, EARLY, ASM, LAUNCH)
        for kk in range(0, k_per, BLOCK_K):
            k0 = k_lo + kk
            if PREFETCH:
                qa_next, qb_next, s_next = _two_row_weights(qw_base, sc_base, k0 + BLOCK_K, k_end, first, w_cols,
                                                            n_ok, w_stride, GROUP)
            half_acc0 += _two_row_products(qa, qb, s, x0, p0, k0, k_end, first, P, GROUP, HALF, ASM)
            if BLOCK_M == 2:
                half_acc1 += _two_row_products(qa, qb, s, x1, p1, k0, k_end, first, P, GROUP, HALF, ASM)
            if PREFETCH:
                qa, qb, s = qa_next, qb_next, s_next
            else:
                qa, qb, s = _two_row_weights(qw_base, sc_base, k0 + BLOCK_K, k_end, first, w_cols, n_ok, w_stride,
                                             GROUP)
    elif DQ:
        # -dq: the first K-block is also dequantized before the wait, so that after it only the products
        # remain of it (the part that needs the activations). Later K-blocks as below.
        q, s = _block_weights(qw_base, sc_base, k_lo, k_end, rows, w_cols, n_ok, w_stride, GROUP)
        if PREFETCH:  # the second K-block's words are in flight before the wait too
            q_next, s_next = _block_weights(qw_base, sc_base, k_lo + BLOCK_K, k_end, rows, w_cols, n_ok, w_stride,
                                            GROUP)
        w0, w1, w2, w3 = _dequant(q, HALF, ASM)
        if EARLY and ASM and LAUNCH != LAUNCH_SECOND:
            # ptxas sinks pure arithmetic past the wait (it shortens live ranges); a branch on a value made
            # from every dequantized register keeps them before it. Both arms wait.
            v = tl.max(tl.max(w0 | w1 | w2 | w3, axis=1), axis=0)
            if v == 0x12345:
                tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                          is_pure=False, pack=1)
            else:
                tl.extra.cuda.gdc_wait()
        if PDL and ASM and LAUNCH == LAUNCH_FIRST:
            tl.extra.cuda.gdc_launch_dependents()
        acc0 += _dq_products(w0, w1, w2, w3, s, x0, p0, k_lo, k_end, rows, P, HALF, ASM)
        if BLOCK_M == 2:
            acc1 += _dq_products(w0, w1, w2, w3, s, x1, p1, k_lo, k_end, rows, P, HALF, ASM)
        if PREFETCH:
            q, s = q_next, s_next
        for kk in range(BLOCK_K, k_per, BLOCK_K):
            k0 = k_lo + kk
            if PREFETCH:
                q_next, s_next = _block_weights(qw_base, sc_base, k0 + BLOCK_K, k_end, rows, w_cols, n_ok,
                                                w_stride, GROUP)
            else:
                q, s = _block_weights(qw_base, sc_base, k0, k_end, rows, w_cols, n_ok, w_stride, GROUP)
            if BLOCK_M == 2:
                # Dequantized once for both pairs (_word_dot would dequantize per pair). Not for one pair:
                # holding a whole dequantized K-block costs registers (167 instead of 128 for 32x256x2 -pf).
                w0, w1, w2, w3 = _dequant(q, HALF, ASM)
                acc0 += _dq_products(w0, w1, w2, w3, s, x0, p0, k0, k_end, rows, P, HALF, ASM)
                acc1 += _dq_products(w0, w1, w2, w3, s, x1, p1, k0, k_end, rows, P, HALF, ASM)
            else:
                acc0 += _block_products(q, s, x0, p0, k0, k_end, rows, P, PACKED, PAIRED, HALF, ASM)
            if PREFETCH:
                q, s = q_next, s_next
    elif EARLY or PREFETCH:
        # The first K-block is loaded before the loop so that, launched early (programmatic
        # dependent launch), its weights stream in while the previous kernel finishes: weights and
        # the routing (made before the up/gate projection) are not the previous kernel's output;
        # the activations and the partials are, so they wait. PREFETCH holds the next K-block's
        # words in registers while this one's products are computed.
        q, s = _block_weights(qw_base, sc_base, k_lo, k_end, rows, w_cols, n_ok, w_stride, GROUP)
        _wait_for_activations(PDL, EARLY, ASM, LAUNCH)
        for kk in range(0, k_per, BLOCK_K):
            k0 = k_lo + kk
            if PREFETCH:
                q_next, s_next = _block_weights(qw_base, sc_base, k0 + BLOCK_K, k_end, rows, w_cols, n_ok,
                                                w_stride, GROUP)
            acc0 += _block_products(q, s, x0, p0, k0, k_end, rows, P, PACKED, PAIRED, HALF, ASM)
            if BLOCK_M == 2:
                acc1 += _block_products(q, s, x1, p1, k0, k_end, rows, P, PACKED, PAIRED, HALF, ASM)
            if PREFETCH:
                q, s = q_next, s_next
            else:  # the K-block after the last is all masked: no memory traffic
                q, s = _block_weights(qw_base, sc_base, k0 + BLOCK_K, k_end, rows, w_cols, n_ok, w_stride, GROUP)
    else:
        # STAGES > 1 asks Triton to pipeline the loop (cp.async into shared memory).
        for kk in tl.range(0, k_per, BLOCK_K, num_stages=STAGES):
            k0 = k_lo + kk
            q, s = _block_weights(qw_base, sc_base, k0, k_end, rows, w_cols, n_ok, w_stride, GROUP)
            acc0 += _block_products(q, s, x0, p0, k0, k_end, rows, P, PACKED, PAIRED, HALF, ASM)
            if BLOCK_M == 2:
                acc1 += _block_products(q, s, x1, p1, k0, k_end, rows, P, PACKED, PAIRED, HALF, ASM)
    part = part_ptr + pid_k * P * N + offs_n
    if TWO_ROWS:
        col0 = tl.sum(half_acc0, axis=0)
        if BLOCK_M == 2:
            col1 = tl.sum(half_acc1, axis=0)
    else:
        col0 = tl.sum(acc0, axis=0)
        if BLOCK_M == 2:
            col1 = tl.sum(acc1, axis=0)
    res0 = col0 * tl.load(rw_ptr + p0, mask=p0 < P, other=0.0)
    tl.store(part + p0.to(tl.int64) * N, res0, mask=n_ok & ((offs_n * 0 + p0) < P))
    if BLOCK_M == 2:
        res1 = col1 * tl.load(rw_ptr + p1, mask=p1 < P, other=0.0)
        tl.store(part + p1.to(tl.int64) * N, res1, mask=n_ok & ((offs_n * 0 + p1) < P))
    if LAUNCH == LAUNCH_SECOND and ASM:
        tl.extra.cuda.gdc_wait()
    if FUSED_REDUCE:
        pairs = tl.load(pair_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        _reduce_tokens(pairs, pairs < P, offs_n, n_ok, pid_n, part_ptr, out_ptr, cnt_ptr, P, N, n_tiles,
                       TOPK, SPLIT_K, BLOCK_M, BLOCK_N)


@triton.jit
def _dot_block(x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, P, N, K, GROUP: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """What a dot program works on: its block's pairs (and which are real), its N-tile, its K
    split, and the base pointers of its expert's words, scales and the pairs' activations."""
    expert = tl.load(blk_expert_ptr + tl.program_id(0)).to(tl.int64)
    pairs = tl.load(pair_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_per = K // SPLIT_K
    return (pairs, pairs < P, offs_n, offs_n < N, tl.program_id(2) * k_per, k_per,
            qw_ptr + expert * (K // PACK_C) * N, sc_ptr + expert * (K // GROUP) * N,
            x_ptr + pairs.to(tl.int64)[:, None] * K)


@triton.jit
def _group_scales(sc_base, k0, offs_n, n_ok, N, GROUP: tl.constexpr):
    """The one scale row of a K-block within one group, [1, BLOCK_N] fp32, for a dot's result."""
    return tl.load(sc_base + (k0 // GROUP) * N + offs_n[None, :], mask=n_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _moe_down_dot(x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, rw_ptr, part_ptr, out_ptr, cnt_ptr,
                  P, N, K, n_tiles,
                  TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FUSED_REDUCE: tl.constexpr, ASM: tl.constexpr):
    """16-31 pairs per block: eight tensor-core dots per K-block, one per nibble plane
    (K = BLOCK_K/8 word rows each), BLOCK_K within one scale group."""
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    pairs, m_ok, offs_n, n_ok, k_lo, k_per, qw_base, sc_base, x_rows = _dot_block(
        x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, P, N, K, GROUP, BLOCK_M, BLOCK_N, SPLIT_K)
    rows = tl.arange(0, BLOCK_K // PACK_C)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_per, BLOCK_K):
        k0 = k_lo + kk
        q = _load_words(qw_base, k0, rows, offs_n, n_ok[None, :], N)
        q_hi = q >> 16
        s = _group_scales(sc_base, k0, offs_n, n_ok, N, GROUP)
        x_k = x_rows + (k0 + rows * PACK_C)[None, :]
        blk = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for j in tl.static_range(PACK_C):
            xj = tl.load(x_k + j, mask=m_ok[:, None], other=0.0)
            # Small integers, exact in fp16/bf16.
            blk = tl.dot(xj, _plane(q, q_hi, j, ASM).to(xj.dtype), blk)
        acc += blk * s
    _finish_rows(acc, pairs, m_ok, offs_n, n_ok, pid_n, pid_k, rw_ptr, part_ptr, out_ptr, cnt_ptr, P, N, n_tiles,
                 TOPK, SPLIT_K, BLOCK_M, BLOCK_N, FUSED_REDUCE)


@triton.jit
def _moe_down_wide(x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, rw_ptr, part_ptr, out_ptr, cnt_ptr,
                   P, N, K, n_tiles,
                   TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FUSED_REDUCE: tl.constexpr, ASM: tl.constexpr):
    """32+ pairs per block (prefill): the words are unpacked into K order (a layout conversion
    through shared memory, once per K-block) for one BLOCK_K-deep dot, BLOCK_K within one scale
    group. ASM is unused (same signature as the other kernels)."""
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    pairs, m_ok, offs_n, n_ok, k_lo, k_per, qw_base, sc_base, x_rows = _dot_block(
        x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, P, N, K, GROUP, BLOCK_M, BLOCK_N, SPLIT_K)
    rows = tl.arange(0, BLOCK_K // PACK_C)
    shifts = tl.arange(0, PACK_C) * 4
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_per, BLOCK_K):
        k0 = k_lo + kk
        x = tl.load(x_rows + (k0 + tl.arange(0, BLOCK_K))[None, :], mask=m_ok[:, None], other=0.0)
        q = _load_words(qw_base, k0, rows, offs_n, n_ok[None, :], N)
        nib = (q[:, None, :] >> shifts[None, :, None]) & 0xF  # [BLOCK_K/8, 8, BLOCK_N]: k = k0 + 8r + j
        # Small integers, exact in fp16/bf16; through fp32 because Triton's interpreter bit-casts
        # int32 -> bf16 instead of converting.
        w = tl.reshape(nib - 8, (BLOCK_K, BLOCK_N)).to(tl.float32).to(x.dtype)
        s = _group_scales(sc_base, k0, offs_n, n_ok, N, GROUP)
        acc += tl.dot(x, w) * s
    _finish_rows(acc, pairs, m_ok, offs_n, n_ok, pid_n, pid_k, rw_ptr, part_ptr, out_ptr, cnt_ptr, P, N, n_tiles,
                 TOPK, SPLIT_K, BLOCK_M, BLOCK_N, FUSED_REDUCE)


@triton.jit
def _moe_sum(part_ptr, out_ptr, P, N, TOPK: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
             PDL: tl.constexpr = False):
    if PDL:
        # Launched under the main kernel (programmatic dependent launch). Whatever follows may
        # launch at once: it waits for this grid, which waits for the main kernel, so in a graph
        # of calls the next call's weights stream in while this one sums (faster than waiting
        # first: docs/moe-down.md).
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s_i in tl.static_range(SPLIT_K):
        for j in tl.static_range(TOPK):
            acc += tl.load(part_ptr + s_i * P * N + (t * TOPK + j) * N + offs, mask=ok, other=0.0)
    tl.store(out_ptr + t * N + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)

