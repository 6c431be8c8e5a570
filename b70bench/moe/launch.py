"""The host side of the Triton u4 MoE down projection: grouping pairs into expert blocks, repacking weights,
residency, checking a tiling against a shape, and launching the kernels (b70bench.moe.kernels).

prepare() does everything that depends only on the weights or the routing (sorting pairs by expert, the
paired-nibble and N-tile-major layouts, the -oN pad) once, and returns the call that is timed: the main
kernel's launch (two for a mixed tiling, which with PDL run at the same time) and, unless the reduction is
fused, the sum kernel's.
"""

from __future__ import annotations

import os
import weakref

import torch
import triton

from b70bench.moe import kernels, ptx
from b70bench.moe.configs import Config
from b70bench.moe.layout import PACK

DOT_MIN_M = 16  # tl.dot needs 16 rows; fewer pairs per block use the elementwise product instead
# From 32 pairs per block one interleaved dot per K-block beats eight per-plane dots (H200 graph replay, bf16:
# 512 tokens, BLOCK_M 32: 736 vs 1763 us at TP1, 240 vs 480 us at TP4); at 16 the planes won (64 tokens: 224
# vs 302 us at TP1, 67 vs 92 us at TP4; docs/moe-down.md).
WIDE_MIN_M = 32
DOT_K = 16 * PACK  # a dot's K is the block's word rows: 16 of them at least
# Budget of the elementwise path's tiles by fp32_tile_regs; ptxas used ~1.5x this estimate in
# total (94 for m1n128k128w4, 168 for m2n128k128w4; sm_90, Triton 3.9), no spills.
REGS_PER_THREAD = 96


def fp32_tile_regs(block_m: int, block_k: int, block_n: int, num_warps: int) -> float:
    """Registers per thread of the elementwise path's tiles: acc and the K-block's sum
    (BLOCK_M x BLOCK_K/8 x BLOCK_N each), plus the loaded words and their high halves."""
    return (2 * block_m + 2) * (block_k // PACK) * block_n / (32 * num_warps)


def uses_dot(block_m: int, block_k: int, group: int) -> bool:
    return block_m >= DOT_MIN_M and DOT_K <= block_k <= group


def auto_block_m(ids_cpu: torch.Tensor) -> int:
    """Pairs per hit expert, rounded up to a power of two. One or two pairs (decode) take the
    elementwise product; more are padded to 16+ rows for tensor-core dots, which cost no bytes."""
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


def fit_block_k(
    k: int, split: int, group: int, block_m: int, block_n: int, num_warps: int = 4, largest: int = 256
) -> int | None:
    """The largest K-block (a power of two words deep, <= `largest`) that tiles each K-split;
    the dot path keeps it within one scale group, the elementwise path within its register
    budget. None if there is none."""
    if k % split:
        return None
    for bk in (512, 256, 128, 64, 32, 16, 8):
        if bk > largest or (k // split) % bk:
            continue
        if block_m >= DOT_MIN_M:
            if bk > group or group % bk or bk < DOT_K:
                continue
        elif fp32_tile_regs(block_m, bk, block_n, num_warps) > REGS_PER_THREAD:
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
        ids[:c] = order[start : start + c].to(torch.int32)
        pair_ids.append(ids)
        block_expert += [e] * nb
        start += c
    return torch.cat(pair_ids), torch.tensor(block_expert, dtype=torch.int32)


def mixed_blocks(ids_cpu: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """group_pairs for a mixed tiling: (pair ids, block experts) of the 2-pair blocks, each two real
    pairs of one expert, and of the 1-pair blocks, an expert's odd pair out. Every pair once."""
    pairs, experts = group_pairs(ids_cpu, 1)
    pairs, experts = pairs.tolist(), experts.tolist()
    two, two_e, one, one_e = [], [], [], []
    i = 0
    while i < len(pairs):
        if i + 1 < len(pairs) and experts[i + 1] == experts[i]:
            two += pairs[i : i + 2]
            two_e.append(experts[i])
            i += 2
        else:
            one.append(pairs[i])
            one_e.append(experts[i])
            i += 1
    as_ids = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return (as_ids(two), as_ids(two_e)), (as_ids(one), as_ids(one_e))


def check_mixed(cfg: Config, block_m: int, k: int, group: int) -> None:
    """A mixed tiling's two launches share the weights' layout, the partials and the sum kernel's launch."""
    one = cfg.odd_pairs
    check_config(one, k, group)
    if block_m != 2 or one.block_m != 1 or one.odd_pairs is not None:
        raise ValueError(
            f"a mixed tiling is a 2-pair tiling + a 1-pair tiling (m2...+m1...), not block_m {block_m} + {one.block_m}"
        )
    same = ("split_k", "packed", "paired", "pdl", "early")
    if (
        any(getattr(cfg, f) != getattr(one, f) for f in same)
        or cfg.tiled
        or one.tiled
        or cfg.fused_reduce
        or one.fused_reduce
    ):
        raise ValueError(
            "the two tilings of a mixed tiling must agree on split-K, -packed, -paired, -pdl and -early, "
            "and use the sum reduction without -tiled"
        )


def check_config(cfg: Config, k: int, group: int) -> None:
    if cfg.block_k % PACK or (cfg.block_k // PACK) & (cfg.block_k // PACK - 1):
        raise ValueError(f"block_k {cfg.block_k} must be {PACK} x a power of two")
    if cfg.block_k > group and cfg.block_k % group or cfg.block_k < group and group % cfg.block_k:
        raise ValueError(f"block_k {cfg.block_k} and the group {group} must divide one another")
    if k % cfg.split_k or (k // cfg.split_k) % PACK:
        raise ValueError(f"K={k} does not split into {cfg.split_k} parts of whole {PACK}-row words")
    if (k // cfg.split_k) % cfg.block_k and cfg.block_m >= DOT_MIN_M:
        # The decode kernel masks the rows past its split, so its K-blocks need not tile it.
        raise ValueError(f"K={k} does not split into {cfg.split_k} parts of whole {cfg.block_k}-blocks")


_DERIVED: dict[int, dict] = {}  # id(tensor) -> {key: derived layout}, dropped with the tensor


def _derived(w: torch.Tensor, key, make) -> torch.Tensor:
    """A layout made from w once and kept while w lives: chosen at load time, like any repacking
    kernel's, so it is not part of a call's time."""
    # Keyed by id, not by the tensor: a WeakKeyDictionary compares tensors with ==, which is elementwise.
    if id(w) not in _DERIVED:
        _DERIVED[id(w)] = {}
        weakref.finalize(w, _DERIVED.pop, id(w), None)
    per = _DERIVED[id(w)]
    if key not in per:
        per[key] = make()
    return per[key]


def tile_weights(w: torch.Tensor, block_n: int) -> torch.Tensor:
    """[E, R, N] -> [E, N/block_n, R, block_n] contiguous (packed words or scales)."""
    e, r, n = w.shape
    if n % block_n:
        raise ValueError(f"a tiled layout needs N={n} to be a multiple of block_n {block_n}")
    return _derived(
        w, ("tiled", block_n), lambda: w.reshape(e, r, n // block_n, block_n).permute(0, 2, 1, 3).contiguous()
    )


PAIRED_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble p of a paired word holds k = 8r + PAIRED_ORDER[p]


def pair_nibbles(qweight: torch.Tensor) -> torch.Tensor:
    """Words whose nibbles i and i+4 (the two halves one LOP3 extracts) hold k = 8r+2i and 8r+2i+1,
    so the packed path's x pair is one aligned 32-bit load instead of two 16-bit loads and a pack."""

    def make():
        out = torch.zeros_like(qweight)
        for p, k in enumerate(PAIRED_ORDER):
            out |= ((qweight >> (4 * k)) & 15) << (4 * p)
        return out

    return _derived(qweight, "paired", make)


RESERVED_SMEM = 1024  # shared memory the CUDA runtime reserves per program (sm_80+)
REGISTERS_PER_SM = 65536  # sm_70 to sm_90
STATIC_SMEM_MAX = 48 * 1024  # ptxas: 'uses too much shared data' above it


def residency_pad(device: torch.device, per_sm: int, own_smem: int) -> int:
    """Bytes of shared memory a program holds, besides its own `own_smem`, so that per_sm programs fit on an
    SM and per_sm + 1 do not (-oN). Registers cap the programs per SM too, at a step of 8 registers per
    thread; this cap is exact."""
    if device.type != "cuda":
        raise ValueError(f"-o{per_sm} pads CUDA programs with PTX shared memory; this is {device.type}")
    per_program = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor // per_sm
    # A program takes pad + own + the reserve (H200, cuOccupancyMaxActiveBlocksPerMultiprocessor: 12 programs
    # of 17152 + 256 bytes per SM); cuobjdump counts the reserve in the static size, the runtime adds it.
    pad = (per_program - RESERVED_SMEM - own_smem) // 128 * 128
    if pad < 0:
        raise ValueError(
            f"-o{per_sm}: a program already holds {own_smem + RESERVED_SMEM} bytes of shared memory, "
            f"more than 1/{per_sm} of an SM's; ask for fewer programs per SM"
        )
    if pad + RESERVED_SMEM > STATIC_SMEM_MAX:
        raise ValueError(
            f"-o{per_sm}: the pad would be {pad} bytes, more than the {STATIC_SMEM_MAX} bytes of static "
            "shared memory a kernel may declare; ask for more programs per SM"
        )
    return pad


def pdl_reason(device: torch.device) -> str | None:
    """Why programmatic dependent launch (pdl, early) cannot run on this device, or None."""
    if device.type != "cuda":
        return f"programmatic dependent launch is CUDA's (sm_90+); this is {device.type}"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return "programmatic dependent launch needs compute capability 9.0+ (Hopper)"
    return None


def prepare(cfg: Config, qweight, scales, group: int, batch, out: torch.Tensor):
    """A no-argument callable computing out [T, N] for this batch; all metadata made here."""
    t, topk, k = batch.x.shape
    n = qweight.shape[-1]
    p = t * topk
    bm = cfg.block_m or auto_block_m(batch.ids_cpu)
    check_config(cfg, k, group)
    dev = batch.x.device
    if cfg.odd_pairs is not None:
        check_mixed(cfg, bm, k, group)
        (pair_ids, block_expert), odd_pairs = mixed_blocks(batch.ids_cpu)
        odd_pairs = tuple(v.to(dev) for v in odd_pairs)
    else:
        pair_ids, block_expert = group_pairs(batch.ids_cpu, bm)
    pair_ids, block_expert = pair_ids.to(dev), block_expert.to(dev)
    x = batch.x.reshape(p, k)
    rw = batch.weights.reshape(p).float().contiguous()
    part = torch.full((cfg.split_k, p, n), float("nan"), dtype=torch.float32, device=dev)
    n_tiles = triton.cdiv(n, cfg.block_n)
    cnt = torch.zeros((t, n_tiles), dtype=torch.int32, device=dev)
    if uses_dot(bm, cfg.block_k, group):
        kernel = kernels._moe_down_wide if bm >= WIDE_MIN_M else kernels._moe_down_dot
    elif bm <= 2:
        kernel = kernels._moe_down_vec
    else:
        raise ValueError(f"block_m {bm}: 1 or 2 pairs per block, or 16+ with a {DOT_K}-deep K-block in one group")
    if (
        cfg.tiled
        or cfg.packed
        or cfg.paired
        or cfg.prefetch
        or cfg.pdl
        or cfg.early
        or cfg.dequant_early
        or cfg.two_rows
        or cfg.programs_per_sm
    ) and kernel is not kernels._moe_down_vec:
        raise ValueError(
            f"block_m {bm}: the packed, paired, tiled, -o, pf, pdl, early, dq and 2r options are for "
            "decode blocks (1-2 pairs) only"
        )
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter runs no inline PTX
    if (cfg.pdl or cfg.early) and not interpreted and pdl_reason(batch.x.device):
        raise ValueError(f"pdl/early: {pdl_reason(batch.x.device)}")
    sum_block = 256
    sum_grid = (t, triton.cdiv(n, sum_block))

    def options(c: Config, block_m: int, launch: int) -> dict:
        opts = dict(
            TOPK=topk,
            GROUP=group,
            BLOCK_M=block_m,
            BLOCK_N=c.block_n,
            BLOCK_K=c.block_k,
            SPLIT_K=c.split_k,
            FUSED_REDUCE=c.fused_reduce,
            ASM=not interpreted,
            num_warps=c.num_warps,
            num_stages=c.num_stages,
        )
        if c.maxnreg and not interpreted:
            opts["maxnreg"] = c.maxnreg
        if c.programs_per_sm and not interpreted:
            # ptxas sizes its registers by the residency the shared memory leaves (95 instead of 64 for
            # m1n16k512w2-2r at -o12: 10 programs per SM, not 12): keep it to what N programs can hold.
            fit = REGISTERS_PER_SM // (c.programs_per_sm * c.num_warps * 32) // 8 * 8
            opts["maxnreg"] = min(c.maxnreg or fit, fit)
        if kernel is kernels._moe_down_vec:
            opts.update(
                STAGES=c.num_stages,
                PACKED=c.packed,
                HALF=x.dtype == torch.float16,
                TILED=c.tiled,
                PAIRED=c.paired,
                PREFETCH=c.prefetch,
                PDL=c.pdl,
                EARLY=c.early,
                LAUNCH=launch,
                DQ=c.dequant_early,
                TWO_ROWS=c.two_rows,
            )
            if c.early and not interpreted:
                opts["launch_pdl"] = True
        return opts

    if kernel is kernels._moe_down_vec:
        if cfg.paired and not cfg.packed:
            raise ValueError("paired nibbles serve the packed path: add -packed")
        for c in (cfg, cfg.odd_pairs or cfg):
            if c.dequant_early and not c.paired:
                raise ValueError("-dq dequantizes paired packed words: add -packed-paired")
            if c.two_rows and (not c.paired or c.dequant_early or c.block_k < group):
                raise ValueError(
                    f"-2r pairs the word rows of one scale group: it needs -packed-paired, no -dq, and "
                    f"K-blocks of whole groups (block_k {c.block_k} >= group {group})"
                )
        if cfg.paired:
            qweight = pair_nibbles(qweight)
        if cfg.tiled:
            qweight, scales = tile_weights(qweight, cfg.block_n), tile_weights(scales, cfg.block_n)
        if cfg.packed and x.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"packed dequant needs fp16 or bf16 activations, not {x.dtype}")

    sum_pdl = {"PDL": True, "launch_pdl": True} if cfg.pdl and not cfg.fused_reduce and not interpreted else {}

    # A mixed tiling's two launches run at the same time where both have blocks: the single pairs fill the SMs
    # the 2-pair blocks' last wave leaves idle (faster than one after the other: docs/moe-down.md).
    concurrent = bool(
        cfg.odd_pairs and cfg.pdl and cfg.early and not interpreted and pair_ids.numel() and odd_pairs[0].numel()
    )
    alone = kernels.LAUNCH_ALONE.value
    parts = [(pair_ids, block_expert, cfg, bm, kernels.LAUNCH_FIRST.value if concurrent else alone)]
    if cfg.odd_pairs:
        parts.append((*odd_pairs, cfg.odd_pairs, 1, kernels.LAUNCH_SECOND.value if concurrent else alone))
    launches = [
        (ids, experts, triton.cdiv(n, c.block_n), options(c, m, launch)) for ids, experts, c, m, launch in parts
    ]
    for (ids, experts, tiles, opts), (_, _, c, _, _) in zip(launches, parts, strict=True):
        if c.programs_per_sm and not interpreted and experts.numel():
            # The pad depends on the shared memory Triton's own code takes: compile once without it.
            own = kernel.warmup(
                x, qweight, scales, ids, experts, rw, part, out, cnt, p, n, k, tiles, grid=(1,), **opts
            ).metadata.shared
            pad = residency_pad(dev, c.programs_per_sm, own)
            opts.update(PAD=pad, PAD_ASM=ptx.pad(pad))

    def run():
        for ids, experts, tiles, opts in launches:
            if experts.numel():
                kernel[(experts.numel(), tiles, cfg.split_k)](
                    x, qweight, scales, ids, experts, rw, part, out, cnt, p, n, k, tiles, **opts
                )
        if not cfg.fused_reduce:
            kernels._moe_sum[sum_grid](
                part, out, p, n, TOPK=topk, SPLIT_K=cfg.split_k, BLOCK=sum_block, num_warps=4, **sum_pdl
            )
        return out

    return run
