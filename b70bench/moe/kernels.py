"""Triton kernels for the u4 MoE down projection (imported only when a Triton variant runs).

Expert-major: pairs (token, expert slot) are sorted by expert and cut into blocks of
BLOCK_M pairs of one expert; one program per (block, N-tile, K-split) streams that expert's
packed weights once for all its pairs. Each program writes routing-weighted fp32 partials
[SPLIT_K, T*topk, N]; the sum over a token's experts and K-splits is either a second
kernel (`_moe_sum`) or done in-kernel by the last program to finish a (token, N-tile),
found with an atomic counter (FUSED_REDUCE), which saves a launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from b70bench.moe.layout import PACK

# Globals a @triton.jit function reads must be constexpr objects (the interpreter is laxer).
PACK_C = tl.constexpr(PACK)


@triton.jit
def _moe_down(x_ptr, qw_ptr, sc_ptr, pair_ptr, blk_expert_ptr, rw_ptr, part_ptr, out_ptr, cnt_ptr,
              P, N, K, n_tiles,
              TOPK: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, USE_DOT: tl.constexpr,
              FUSED_REDUCE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    expert = tl.load(blk_expert_ptr + pid_m).to(tl.int64)
    pairs = tl.load(pair_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_ok = pairs < P
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    shifts = tl.arange(0, PACK_C) * 4
    k_per = K // SPLIT_K
    k_lo = pid_k * k_per
    qw_base = qw_ptr + expert * (K // PACK_C) * N
    sc_base = sc_ptr + expert * (K // GROUP) * N
    x_rows = x_ptr + pairs.to(tl.int64)[:, None] * K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_per, BLOCK_K):
        k0 = k_lo + kk
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None], other=0.0)
        rows = k0 // PACK_C + tl.arange(0, BLOCK_K // PACK_C)
        q = tl.load(qw_base + rows[:, None] * N + offs_n[None, :], mask=n_ok[None, :], other=0)
        nib = (q[:, None, :] >> shifts[None, :, None]) & 0xF  # [BLOCK_K/8, 8, BLOCK_N], k = 8 row + i
        # Small integers, exact in fp16/bf16; through fp32 because Triton's interpreter
        # bit-casts int32 -> bf16 instead of converting (the GPU needs the fp32 step anyway).
        w = tl.reshape(nib - 8, (BLOCK_K, BLOCK_N)).to(tl.float32).to(x.dtype)
        # BLOCK_K divides GROUP, so one scale row serves the whole block; scaling after the
        # product costs BLOCK_M*BLOCK_N multiplies instead of BLOCK_K*BLOCK_N.
        s = tl.load(sc_base + (k0 // GROUP) * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        if USE_DOT:
            acc += tl.dot(x, w) * s[None, :]
        else:
            acc += tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1) * s[None, :]
    rw = tl.load(rw_ptr + pairs, mask=m_ok, other=0.0)
    acc = acc * rw[:, None]
    ok = m_ok[:, None] & n_ok[None, :]
    tl.store(part_ptr + pid_k * P * N + pairs.to(tl.int64)[:, None] * N + offs_n[None, :], acc, mask=ok)
    if FUSED_REDUCE:
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
        tl.store(cnt, tl.zeros_like(arrived), mask=last)  # ready for the next launch (graph replays too)


@triton.jit
def _moe_sum(part_ptr, out_ptr, P, N, TOPK: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s_i in tl.static_range(SPLIT_K):
        for j in tl.static_range(TOPK):
            acc += tl.load(part_ptr + s_i * P * N + (t * TOPK + j) * N + offs, mask=ok, other=0.0)
    tl.store(out_ptr + t * N + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class Config:
    """One tiling. block_m 0 means: pick from the mean pairs per hit expert."""

    block_m: int = 0
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    fused_reduce: bool = False

    def label(self) -> str:
        red = "fused" if self.fused_reduce else "sum"
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}"
                f"w{self.num_warps}st{self.num_stages}{red}")


DOT_MIN_M = 16  # tl.dot needs 16 rows; fewer pairs per block use a broadcast product instead
NO_DOT_ELEMS = 8192  # bound on BLOCK_M*BLOCK_K*BLOCK_N of the broadcast product (registers)


def auto_block_m(ids_cpu: torch.Tensor) -> int:
    """Pairs per hit expert, rounded up to a power of two. One or two pairs (decode) take the
    broadcast product; more are padded to 16+ rows for tensor-core dots, which cost no bytes."""
    flat = ids_cpu.flatten()
    mean = flat.numel() / max(1, flat.unique().numel())
    if mean <= 1:
        return 1
    if mean <= 2:
        return 2
    bm = DOT_MIN_M
    while bm < mean and bm < 64:
        bm *= 2
    return bm


def fit_block_k(k: int, split: int, group: int, block_m: int, block_n: int) -> int | None:
    """The largest K-block (<= the group) that tiles each K-split and keeps the broadcast
    product within registers; None if there is none."""
    for bk in (128, 64, 32, 16):
        if bk > group or group % bk or k % split or (k // split) % bk:
            continue
        if block_m < DOT_MIN_M and block_m * bk * block_n > NO_DOT_ELEMS:
            continue
        return bk
    return None


def group_pairs(ids_cpu: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair ids (t * topk + j) sorted by expert, padded per expert to whole blocks with the
    out-of-range id P, and the expert of each block. Done once per routing, like vLLM's
    moe_align_block_size, whose result the up/gate and down projections share."""
    flat = ids_cpu.flatten()
    p = flat.numel()
    order = torch.argsort(flat, stable=True)
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    pair_ids, block_expert, start = [], [], 0
    for e, c in zip(experts.tolist(), counts.tolist(), strict=True):
        nb = -(-c // block_m)
        ids = torch.full((nb * block_m,), p, dtype=torch.int32)
        ids[:c] = order[start:start + c].to(torch.int32)
        pair_ids.append(ids)
        block_expert += [e] * nb
        start += c
    return torch.cat(pair_ids), torch.tensor(block_expert, dtype=torch.int32)


def check_config(cfg: Config, k: int, group: int) -> None:
    if group % cfg.block_k or cfg.block_k % PACK:
        raise ValueError(f"block_k {cfg.block_k} must divide the group {group} and be a multiple of {PACK}")
    if k % cfg.split_k or (k // cfg.split_k) % cfg.block_k:
        raise ValueError(f"K={k} does not split into {cfg.split_k} parts of whole {cfg.block_k}-blocks")


def prepare(cfg: Config, qweight, scales, group: int, batch, out: torch.Tensor):
    """A no-argument callable computing out [T, N] for this batch; all metadata made here."""
    t, topk, k = batch.x.shape
    n = qweight.shape[-1]
    p = t * topk
    bm = cfg.block_m or auto_block_m(batch.ids_cpu)
    check_config(cfg, k, group)
    pair_ids, block_expert = group_pairs(batch.ids_cpu, bm)
    dev = batch.x.device
    pair_ids, block_expert = pair_ids.to(dev), block_expert.to(dev)
    x = batch.x.reshape(p, k)
    rw = batch.weights.reshape(p).float().contiguous()
    part = torch.full((cfg.split_k, p, n), float("nan"), dtype=torch.float32, device=dev)
    n_tiles = triton.cdiv(n, cfg.block_n)
    cnt = torch.zeros((t, n_tiles), dtype=torch.int32, device=dev)
    grid = (block_expert.numel(), n_tiles, cfg.split_k)
    use_dot = bm >= DOT_MIN_M
    sum_block = 256
    sum_grid = (t, triton.cdiv(n, sum_block))

    def run():
        _moe_down[grid](x, qweight, scales, pair_ids, block_expert, rw, part, out, cnt, p, n, k, n_tiles,
                        TOPK=topk, GROUP=group, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                        SPLIT_K=cfg.split_k, USE_DOT=use_dot, FUSED_REDUCE=cfg.fused_reduce,
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if not cfg.fused_reduce:
            _moe_sum[sum_grid](part, out, p, n, TOPK=topk, SPLIT_K=cfg.split_k, BLOCK=sum_block, num_warps=4)
        return out

    return run
