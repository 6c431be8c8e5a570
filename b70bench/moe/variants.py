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


def default_tiling(k: int, n: int, batch: Batch, group: int, htile: bool) -> Config:
    """The untuned tiling for a shape no table covers.

    Dot blocks (16+ pairs per expert; `triton-htile` only): 32-wide N-tiles, K split until the grid fills
    the device 4x over, the top-k/split sum fused. Decode, `triton`: 128-wide N-tiles (64 for dot blocks),
    whole-group K-blocks. Decode, `triton-htile`: up to 4 tokens 32-wide tiles of 4 warps over K-blocks of up
    to 512, more tokens 64-wide tiles of 2 warps over 128; packed and paired where activations are 16-bit, the
    next K-block prefetched, programmatic dependent launch where the device has it; where hit experts take
    1.5+ pairs each, an expert's pairs of pairs in 2-pair blocks and the odd pairs in a second launch."""
    from b70bench.moe import launch

    bm = launch.auto_block_m(batch.ids_cpu)
    if bm >= launch.DOT_MIN_M and group < launch.DOT_K:
        # A tensor-core dot needs a K-block of DOT_K within one scale group: smaller groups take 2-pair blocks.
        bm = 2
    dot = bm >= launch.DOT_MIN_M
    if not htile:
        bn = 64 if dot else 128
        return Config(block_m=bm, block_n=bn, block_k=launch.fit_block_k(k, 1, group, bm, bn) or 8)
    if not dot:
        packed = batch.x.dtype in (torch.float16, torch.bfloat16)
        pdl = launch.pdl_reason(batch.x.device) is None
        wide = batch.tokens > 4
        bk = 128 if wide else min(512, 1 << max(7, (k - 1).bit_length()))
        cfg = Config(
            block_m=1,
            block_n=64 if wide else 32,
            block_k=bk,
            num_warps=2 if wide else 4,
            num_stages=1,
            packed=packed,
            paired=packed,
            prefetch=True,
            pdl=pdl,
            early=pdl,
        )
        if wide and batch.ids_cpu.numel() >= 1.5 * batch.experts_hit:
            cfg = replace(cfg, block_m=2, prefetch=False, odd_pairs=cfg)
        return cfg
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
    return Config(block_m=bm, block_n=bn, block_k=bk, split_k=split, fused_reduce=True)


@dataclass
class TritonVariant:
    """The fused dequant + grouped GEMM (b70bench.moe.kernels, launched by b70bench.moe.launch) with a tiling
    per shape (`choose`).

    `triton`: the untuned default, one program per (expert block, 128-wide N-tile), whole K, a second
    kernel summing the top-k partials. `triton-htile`: the device's tuned table where it has one
    (b70bench/moe/policies/, measured in docs/moe-down.md), else finer-tiled defaults (`default_tiling`).
    `config` pins one tiling (the tuning sweep uses it); `tuned` maps (K, N, tokens) to a sweep's fastest
    correct tiling (`b70bench moe-down --tuned tune.json`) ahead of the table.
    """

    name: str
    htile: bool = False
    config: object = None
    tuned: dict = field(default_factory=dict)  # (K, N, tokens) -> configs.Config, from a sweep

    def unavailable_reason(self, device, dtype) -> str | None:
        return triton_reason(device)

    def choose(self, k: int, n: int, batch: Batch, group: int):
        """This shape's tiling: the pinned `config`, else the `--tuned` file's, else (`triton-htile`) the
        device's shipped table (b70bench.moe.policies), else the untuned default."""
        from b70bench.moe import policies

        if self.config is not None:
            return self.config
        key = (k, n, batch.tokens)
        if key in self.tuned:
            return self.tuned[key]
        if self.htile:
            table = policies.for_device(batch.x.device, batch.x.dtype)
            if key in table:
                return table[key]
        return default_tiling(k, n, batch, group, self.htile)

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
