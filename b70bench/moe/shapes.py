"""MoE down-projection problems: model shapes, tensor-parallel shards, seeded routing, inputs.

The down projection's input is per (token, expert) pair: each of a token's top-k experts
applies its own up/gate projection first, so x is [T, topk, K] (vLLM's fused MoE keeps it
as [T * topk, K]) and the output is out[t] = sum_j w[t, j] * (x[t, j] @ W[topk_ids[t, j]]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from b70bench.errors import UsageError
from b70bench.moe import layout

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOKENS = (1, 4, 16, 64, 512)
TPS = (1, 4)


@dataclass(frozen=True)
class MoeShape:
    """A model's MoE dims; the default is MiniMax M2.x (config.json)."""

    hidden: int = 3072
    intermediate: int = 1536
    experts: int = 256
    topk: int = 8
    group: int = layout.GROUP

    def k(self, tp: int) -> int:
        """The down projection's K on one tensor-parallel rank (TP shards the intermediate dim)."""
        if tp < 1:
            raise UsageError(f"--tp must be >= 1, got {tp}")
        if self.intermediate % tp:
            raise UsageError(
                f"intermediate size {self.intermediate} does not split over TP {tp}: pick a TP that divides it"
            )
        k = self.intermediate // tp
        layout.check_k(k, self.group)
        return k

    def validate(self) -> None:
        for name in ("hidden", "intermediate", "experts", "topk", "group"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.topk > self.experts:
            raise UsageError(f"--topk {self.topk} exceeds --experts {self.experts}: pick topk <= experts")
        if self.group % layout.PACK:
            raise UsageError(f"group size {self.group} is not a multiple of {layout.PACK}")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise UsageError(f"unknown --dtype {name!r}: use one of {', '.join(DTYPES)}") from None


def routing(tokens: int, shape: MoeShape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MiniMax-style routing on the CPU: sigmoid scores plus a routing bias choose the top-k,
    the chosen unbiased scores renormalized to sum 1 are the weights. ids int64, weights fp32."""
    if tokens < 1:
        raise UsageError(f"--tokens must be >= 1, got {tokens}")
    gen = torch.Generator().manual_seed(seed)
    scores = torch.sigmoid(torch.randn(tokens, shape.experts, generator=gen))
    bias = 0.1 * torch.randn(shape.experts, generator=gen)
    ids = torch.topk(scores + bias, shape.topk, dim=-1).indices
    w = scores.gather(1, ids)
    return ids, (w / w.sum(dim=-1, keepdim=True)).float()


@dataclass
class Weights:
    qweight: torch.Tensor  # int32 [E, K/8, N]
    scales: torch.Tensor  # dtype [E, K/group, N]
    group: int


@dataclass
class Batch:
    x: torch.Tensor  # dtype [T, topk, K]
    ids: torch.Tensor  # int32 [T, topk], on the device
    ids_cpu: torch.Tensor  # int64 [T, topk]
    weights: torch.Tensor  # fp32 [T, topk], on the device

    @property
    def tokens(self) -> int:
        return self.x.shape[0]

    @property
    def experts_hit(self) -> int:
        return int(self.ids_cpu.unique().numel())


def random_weights(shape: MoeShape, k: int, dtype: torch.dtype, device: torch.device, seed: int) -> Weights:
    """Uniform random nibbles and positive scales sized so outputs are O(1), never zeros."""
    gen = torch.Generator(device=device).manual_seed(seed)
    e, n = shape.experts, shape.hidden
    qweight = torch.randint(-(2**31), 2**31, (e, k // layout.PACK, n), dtype=torch.int32, device=device, generator=gen)
    base = 1.0 / (4.6 * (k * shape.topk) ** 0.5)  # 4.6 ~ std of (nibble - 8)
    scales = (base * (0.5 + torch.rand((e, k // shape.group, n), device=device, generator=gen))).to(dtype)
    return Weights(qweight, scales, shape.group)


def random_batch(shape: MoeShape, k: int, tokens: int, dtype: torch.dtype, device: torch.device, seed: int) -> Batch:
    ids, w = routing(tokens, shape, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 7919)
    x = torch.randn((tokens, shape.topk, k), device=device, generator=gen).to(dtype)
    return Batch(x, ids.to(device=device, dtype=torch.int32), ids, w.to(device))


def roofline_bytes(shape: MoeShape, k: int, batch: Batch, dtype: torch.dtype) -> int:
    """The fewest bytes a down projection must move: packed weights and scales of the
    distinct experts hit, the per-pair activations read once, the output written once."""
    elt = torch.finfo(dtype).bits // 8
    n = shape.hidden
    hit = batch.experts_hit
    weights = hit * (k // 2) * n + hit * (k // shape.group) * n * elt
    acts = batch.tokens * shape.topk * k * elt
    out = batch.tokens * n * elt
    return weights + acts + out
