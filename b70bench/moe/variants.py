"""The variants of the u4 MoE down projection, behind one registry.

A variant is an object with `name`, `unavailable_reason(device, dtype) -> str | None` and
`prepare(weights, batch, out) -> run`, where run() computes out [T, N] (and returns it) for
that batch. A variant that computes more than the down projection (vLLM's CPU experts run the
whole expert MLP) says so in `work` and brings `reference64(weights, batch)` and
`roofline_bytes(weights, batch)` for what it computes. Everything that depends only on the
weights or the routing (sorting pairs by expert, converting weights to another packed layout)
happens in prepare and is not timed.

External packages add variants through the entry-point group `b70bench.moe_down_variants`:
each entry point loads to a variant object, or to a callable returning one or a list of them.
A plug-in that fails to load becomes a variant that is skipped with the error as its reason.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field, replace
from importlib import metadata

import torch

from b70bench.errors import Unavailable, UsageError
from b70bench.moe import layout
from b70bench.moe.configs import Config
from b70bench.moe.shapes import Batch, Weights

ENTRY_POINT_GROUP = "b70bench.moe_down_variants"


def expert_groups(batch: Batch):
    """(expert, pair indices, token indices, routing weights) per hit expert, on the device."""
    flat = batch.ids_cpu.flatten()
    topk = batch.ids_cpu.shape[1]
    dev = batch.x.device
    w = batch.weights.reshape(-1)
    out = []
    for e in flat.unique().tolist():
        pidx = (flat == e).nonzero().flatten()
        pidx_d = pidx.to(dev)
        out.append((e, pidx_d, (pidx // topk).to(dev), w[pidx_d].float().unsqueeze(1)))
    return out


class Reference:
    """Dequantize each routed expert's weights in torch, then matmul: any device, any dtype."""

    name = "reference"

    def unavailable_reason(self, device, dtype) -> str | None:
        return None

    def label(self, weights: Weights, batch: Batch) -> str:
        return "dequant+mm per expert"

    def prepare(self, weights: Weights, batch: Batch, out: torch.Tensor):
        t, topk, k = batch.x.shape
        x = batch.x.reshape(t * topk, k)
        groups = expert_groups(batch)
        acc = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        dtype = batch.x.dtype

        def run():
            acc.zero_()
            for e, pidx, tidx, w in groups:
                wd = layout.dequantize(weights.qweight[e], weights.scales[e], weights.group, dtype)
                acc.index_add_(0, tidx, (x[pidx] @ wd).float() * w)
            return out.copy_(acc)

        return run


class TorchInt4:
    """PyTorch's own int4 weight-only matmul (tinygemm layout), one call per routed expert."""

    name = "torch-int4"
    inner_k_tiles = 8

    def _ops(self, device):
        if device.backend == "cpu":
            return (
                getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None),
                getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None),
            )
        return (
            getattr(torch.ops.aten, "_convert_weight_to_int4pack", None),
            getattr(torch.ops.aten, "_weight_int4pack_mm", None),
        )

    def unavailable_reason(self, device, dtype) -> str | None:
        convert, mm = self._ops(device)
        if convert is None or mm is None:
            return f"torch {torch.__version__} has no int4pack matmul for {device.backend}"
        if device.backend == "cuda":
            if dtype != torch.bfloat16:
                return "torch's CUDA int4 matmul takes bf16 activations only: use --dtype bf16"
            if torch.cuda.get_device_capability(device.index) < (8, 0):
                return "torch's CUDA int4 matmul needs compute capability 8.0 or newer"
        return None

    def label(self, weights: Weights, batch: Batch) -> str:
        return "aten int4pack_mm per expert"

    def _convert(self, device, nib_kn: torch.Tensor, k: int):
        convert, _ = self._ops(device)
        nib_nk = nib_kn.t().contiguous()
        if device.backend == "cpu":
            return convert(nib_nk, 2)
        tiles = self.inner_k_tiles
        while tiles > 2 and k % (tiles * 16):
            tiles //= 2
        packed_u8 = ((nib_nk[:, ::2] << 4) | nib_nk[:, 1::2]).to(torch.uint8)  # even k in the high nibble
        return convert(packed_u8, tiles)

    def prepare(self, weights: Weights, batch: Batch, out: torch.Tensor):
        from b70bench.device import Device

        dev = out.device
        device = Device(dev.type, dev.index or 0)
        _, mm = self._ops(device)
        t, topk, k = batch.x.shape
        x = batch.x.reshape(t * topk, k)
        dtype = batch.x.dtype
        experts = []
        try:
            for e, pidx, tidx, w in expert_groups(batch):
                packed = self._convert(device, layout.unpack_nibbles(weights.qweight[e]), k)
                s = weights.scales[e].to(dtype)
                sz = torch.stack([s, torch.zeros_like(s)], dim=-1).contiguous()
                experts.append((packed, sz, pidx, tidx, w))
        except RuntimeError as err:
            raise Unavailable(f"torch int4pack conversion failed: {str(err).splitlines()[0]}") from None
        acc = torch.empty(out.shape, dtype=torch.float32, device=dev)
        group = weights.group

        def run():
            acc.zero_()
            for packed, sz, pidx, tidx, w in experts:
                acc.index_add_(0, tidx, mm(x[pidx], packed, group, sz).float() * w)
            return out.copy_(acc)

        return run


def triton_reason(device) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton, or pytorch-triton-xpu on Intel GPUs)"
    if device.backend == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton compiles for GPUs; on the CPU only its interpreter runs (set TRITON_INTERPRET=1, slow)"
    return None


def sm_count(device) -> int:
    """Streaming multiprocessors (CUDA) or subslices (XPU) of the device; 8 elsewhere."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "xpu":
        return getattr(torch.xpu.get_device_properties(device), "gpu_subslice_count", 32)
    return 8


@dataclass
class TritonVariant:
    """The fused dequant + grouped GEMM (b70bench.moe.kernels, launched by b70bench.moe.launch), with a tiling
    policy.

    `triton`: one program per (expert block, N-tile of 128; 64 for dot blocks), whole K, a
    second kernel sums the top-k partials. `triton-htile`: finer tiles along N. Decode (1-2 pairs
    per expert): one pair per block; one token 32-wide N-tiles of 4 warps, K-blocks of up to 512
    (16-wide, 2 warps, no prefetch where K needs several; the same 32x512 tiles for 2-4 tokens there;
    with PDL and K <= 512, 32x256 tiles of 2 warps dequantizing their first block before the wait);
    more tokens 64-wide tiles of 2 warps, 128 deep, and where those share experts, 2-pair blocks of
    an expert's pairs of pairs (a mixed tiling); the next K-block prefetched, packed 16x2
    dequant on paired nibbles, second-kernel sum, and on CUDA sm_90+ programmatic dependent launch
    (pdl, early); dot blocks: 32-wide N-tiles, split-K until the grid fills the
    device several times over, the top-k/split sum done in-kernel by the last arrival.
    `config` pins one tiling (the tuning sweep uses it); `tuned` maps (K, N, tokens) to the
    sweep's fastest correct tiling (`b70bench moe-down --tuned tune.json`).
    """

    name: str
    htile: bool = False
    config: object = None
    overrides: dict = field(default_factory=dict)
    tuned: dict = field(default_factory=dict)  # (K, N, tokens) -> configs.Config, from a sweep

    def unavailable_reason(self, device, dtype) -> str | None:
        return triton_reason(device)

    def choose(self, k: int, n: int, batch: Batch, group: int):
        from b70bench.moe import launch

        if self.config is not None:
            return self.config
        key = (k, n, batch.tokens)
        if key in self.tuned:
            return self.tuned[key]
        bm = launch.auto_block_m(batch.ids_cpu)
        if bm >= launch.DOT_MIN_M and group < launch.DOT_K:
            # A tensor-core dot needs a K-block of DOT_K within one scale group: smaller groups take 2-pair blocks.
            bm = 2
        dot = bm >= launch.DOT_MIN_M
        if not self.htile:
            bn = 64 if dot else 128
            cfg = Config(block_m=bm, block_n=bn, block_k=launch.fit_block_k(k, 1, group, bm, bn) or 8)
            return replace(cfg, **self.overrides)
        if not dot:
            # Decode: bound by the bytes each SM has in flight (ncu: < 1 wave, 12-37% of DRAM throughput)
            # and by the launch and top-k sum around the kernel. H200 sweeps (docs/moe-down.md): one token
            # takes K-blocks of up to 512 per load, 32-wide tiles of 4 warps, or
            # where K needs several such blocks (TP1) 16-wide tiles of 2 warps without the prefetch;
            # 2-4 tokens over several blocks the same 32x512x4 tiles; more tokens (or a short K) 64-wide
            # tiles of 2 warps looping over 128-deep blocks (mixed with 2-pair blocks, below). All but the
            # 16-wide tiles and the 2-pair blocks hold the next block's words in registers (pf); all use
            # the packed dequant on paired nibbles and, on Hopper+, programmatic dependent launch (pdl: the
            # sum kernel under the main kernel; early: the main kernel under the previous one).
            packed = batch.x.dtype in (torch.float16, torch.bfloat16)
            prefetch = True
            pdl = launch.pdl_reason(batch.x.device) is None
            if batch.tokens == 1 and k <= 512 and pdl and packed:
                # The split's K in two 256-deep blocks, both requested before the wait and the first also
                # dequantized there (-dq): after the wait little more than the products is left. Faster than
                # 32x512x4 -pf at TP4; no gain at TP1 (more K than the registers hold before the wait) nor at
                # 4-16 tokens.
                cfg = Config(
                    block_m=1,
                    block_n=32,
                    block_k=256,
                    num_warps=2,
                    num_stages=1,
                    packed=True,
                    paired=True,
                    prefetch=True,
                    pdl=True,
                    early=True,
                    dequant_early=True,
                )
                return replace(cfg, **self.overrides)
            if batch.tokens == 1 and k > 512 and pdl and packed and group <= 512:
                # 32-wide 4-warp tiles with -2r use 64 registers, leaving more SM slots than the grid needs;
                # capped at the grid's share (-oN) and on N-tile-major weights (-tiled) they beat the 16-wide
                # tiles (uncapped they are slower; capped but not tiled, about even).
                programs = batch.experts_hit * -(-n // 32)
                cfg = Config(
                    block_m=1,
                    block_n=32,
                    block_k=512,
                    num_warps=4,
                    num_stages=1,
                    packed=True,
                    paired=True,
                    tiled=n % 32 == 0,
                    pdl=True,
                    early=True,
                    two_rows=True,
                    programs_per_sm=-(-programs // sm_count(batch.x.device)),
                )
                return replace(cfg, **self.overrides)
            if batch.tokens == 1 and k > 512:
                bn, bk, warps, prefetch = 16, 512, 2, False
            elif batch.tokens == 1 or (batch.tokens <= 4 and k > 512):
                bn, bk, warps = 32, min(512, 1 << max(7, (k - 1).bit_length())), 4
            else:
                bn, bk, warps = 64, 128, 2
            # -2r (two word rows of a scale group per 16-bit sum, ~12% fewer instructions per word) where the
            # products bound the time: TP1 2-4 tokens. Not for one token (fewer registers, more programs per SM)
            # nor TP4 at 4 tokens.
            two_rows = packed and bk >= group and batch.tokens > 1 and k > 512
            cfg = Config(
                block_m=1,
                block_n=bn,
                block_k=bk,
                num_warps=warps,
                num_stages=1,
                fused_reduce=False,
                packed=packed,
                paired=packed,
                prefetch=prefetch,
                pdl=pdl,
                early=pdl,
                two_rows=two_rows,
            )
            if batch.tokens > 4 and batch.ids_cpu.numel() >= 1.5 * batch.experts_hit:
                # Where experts are shared (16 tokens: 128 pairs on ~74 experts) the products bound the
                # time, not the bytes: an expert's pairs of pairs share one dequantization in 2-pair blocks,
                # the odd pairs keep this tiling in a second launch running at the same time (with PDL).
                # At 4 tokens (few shared experts) mixing was slower. Both launches take -2r.
                one = replace(cfg, two_rows=packed and bk >= group)
                cfg = replace(one, block_m=2, prefetch=False, odd_pairs=one)
            return replace(cfg, **self.overrides)
        bn = 32
        n_blocks = sum(-(-c // bm) for c in torch.bincount(batch.ids_cpu.flatten()).tolist() if c)
        target = 4 * sm_count(batch.x.device)
        split, bk = 1, launch.fit_block_k(k, 1, group, bm, bn) or 8
        for s in (2, 3, 4, 6, 8):  # split K only until the grid fills the device 4x over
            if n_blocks * -(-n // bn) * split >= target:
                break
            fit = launch.fit_block_k(k, s, group, bm, bn)
            if fit and fit >= min(group, launch.DOT_K):  # a split that leaves whole groups per program
                split, bk = s, fit
        cfg = Config(block_m=bm, block_n=bn, block_k=bk, split_k=split, fused_reduce=True)
        return replace(cfg, **self.overrides)

    def label(self, weights: Weights, batch: Batch) -> str:
        return self.choose(batch.x.shape[-1], weights.qweight.shape[-1], batch, weights.group).label()

    def prepare(self, weights: Weights, batch: Batch, out: torch.Tensor):
        from b70bench.moe import launch

        cfg = self.choose(batch.x.shape[-1], weights.qweight.shape[-1], batch, weights.group)
        return launch.prepare(cfg, weights.qweight, weights.scales, weights.group, batch, out)


class Broken:
    """A plug-in that could not be loaded: listed, never run."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def unavailable_reason(self, device, dtype) -> str | None:
        return self.reason

    def label(self, weights: Weights, batch: Batch) -> str:
        return "plug-in"

    def prepare(self, weights, batch, out):
        raise Unavailable(self.reason)


def builtins() -> list:
    from b70bench.moe.llm_scaler import LlmScalerDown
    from b70bench.moe.vllm_experts import VllmExperts

    return [
        Reference(),
        TritonVariant("triton"),
        TritonVariant("triton-htile", htile=True),
        TorchInt4(),
        LlmScalerDown(),
        VllmExperts(),
    ]


def _entry_points():
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def plugins() -> list:
    """Variants from installed packages; one that raises while loading is kept as Broken."""
    found = []
    for ep in _entry_points():
        try:
            obj = ep.load()
            if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "prepare")):
                obj = obj()
            objs = obj if isinstance(obj, list | tuple) else [obj]
            for v in objs:
                for attr in ("name", "prepare", "unavailable_reason"):
                    if not hasattr(v, attr):
                        raise TypeError(f"{v!r} has no {attr!r}: not a moe-down variant")
            found.extend(objs)
        except Exception as err:  # a broken plug-in must not stop the built-in variants
            found.append(Broken(ep.name, f"plug-in {ep.value!r} failed to load: {type(err).__name__}: {err}"))
    return found


def registry() -> dict:
    """name -> variant, built-ins first; a plug-in may not shadow an earlier name."""
    reg = {}
    for v in builtins() + plugins():
        if v.name in reg:
            v = Broken(f"{v.name}@plugin", f"plug-in variant name {v.name!r} is already taken: rename it")
        reg[v.name] = v
    return reg


def select(names: list[str] | None) -> list:
    reg = registry()
    if not names:
        return list(reg.values())
    unknown = [n for n in names if n not in reg]
    if unknown:
        raise UsageError(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(reg)}")
    return [reg[n] for n in names]
