"""The AutoRound/GPTQ symmetric u4 weight layout, as MiniMax M2.x checkpoints store it.

qweight int32 [E, K/8, N]: bits 4i..4i+3 of qweight[e, r, n] hold the weight for k = 8r + i.
scales [E, K/group, N] (fp16/bf16): one scale per group of `group` consecutive k.
Dequantized weight: W[e, k, n] = (nibble - 8) * scales[e, k // group, n]; zero points are
not stored (symmetric "u4"). The down projection computes y = x @ W[e] with x [.., K].
"""

from __future__ import annotations

import torch

from b70bench.errors import UsageError

PACK = 8  # nibbles per int32
GROUP = 128
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_k(k: int, group: int = GROUP) -> None:
    """K must split into whole int32 words and whole scale groups."""
    if k <= 0 or k % PACK:
        raise UsageError(
            f"K={k} is not a positive multiple of {PACK} (8 nibbles per int32): "
            f"pick an intermediate size / TP that divides by {PACK}"
        )
    if k % group:
        raise UsageError(
            f"K={k} is not a multiple of the scale group {group}: "
            f"pick an intermediate size / TP that divides by {group}"
        )


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Integers 0..15 of shape [..., K, N] -> int32 [..., K/8, N], 8 nibbles along K."""
    if q.dtype not in (torch.int32, torch.int64, torch.uint8, torch.int16, torch.int8):
        raise UsageError(f"nibbles must be an integer tensor, got {q.dtype}: round and cast first")
    k = q.shape[-2]
    if k % PACK:
        raise UsageError(f"K={k} is not a multiple of {PACK}: pad K to a multiple of {PACK}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
        raise UsageError("nibbles must lie in 0..15: quantize before packing")
    q = q.to(torch.int64).reshape(*q.shape[:-2], k // PACK, PACK, q.shape[-1])
    shifts = (torch.arange(PACK, device=q.device, dtype=torch.int64) * 4).view(PACK, 1)
    words = (q << shifts).sum(dim=-2)
    # int32 words with the top nibble >= 8 are negative: wrap the unsigned value explicitly.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_nibbles(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [..., K/8, N] -> int32 nibbles 0..15 of shape [..., K, N]."""
    if qweight.dtype != torch.int32:
        raise UsageError(f"qweight must be int32 (8 nibbles per word), got {qweight.dtype}")
    shifts = (torch.arange(PACK, device=qweight.device, dtype=torch.int32) * 4).view(PACK, 1)
    nib = (qweight.unsqueeze(-2) >> shifts) & 0xF  # arithmetic shift; the mask drops the sign bits
    return nib.reshape(*qweight.shape[:-2], qweight.shape[-2] * PACK, qweight.shape[-1])


def check_layout(qweight: torch.Tensor, scales: torch.Tensor, group: int = GROUP) -> tuple[int, int, int]:
    """(E, K, N) of a valid packed weight; UsageError naming the mismatch otherwise."""
    if qweight.dtype != torch.int32:
        raise UsageError(f"qweight must be int32 (8 nibbles per word), got {qweight.dtype}")
    if scales.dtype not in SCALE_DTYPES:
        raise UsageError(f"scales must be fp16, bf16 or fp32, got {scales.dtype}")
    if qweight.dim() != 3 or scales.dim() != 3:
        raise UsageError(
            f"qweight and scales must be [E, K/8, N] and [E, K/{group}, N], "
            f"got {tuple(qweight.shape)} and {tuple(scales.shape)}"
        )
    e, k8, n = qweight.shape
    k = k8 * PACK
    check_k(k, group)
    if tuple(scales.shape) != (e, k // group, n):
        raise UsageError(
            f"scales shape {tuple(scales.shape)} does not match qweight {tuple(qweight.shape)}: "
            f"expected {(e, k // group, n)} for group {group}"
        )
    return e, k, n


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, group: int = GROUP, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """[..., K/8, N] int32 + [..., K/group, N] scales -> [..., K, N] in dtype (default: the scales')."""
    dtype = dtype or scales.dtype
    # fp32 products rounded once to fp16/bf16 equal the half-precision products, and the CPU
    # computes them about twice as fast.
    work = torch.float64 if dtype == torch.float64 else torch.float32
    nib = unpack_nibbles(qweight)
    s = scales.to(work).repeat_interleave(group, dim=-2)
    return ((nib - 8).to(work) * s).to(dtype)


def quantize(w: torch.Tensor, group: int = GROUP, scale_dtype: torch.dtype = torch.bfloat16):
    """Float weights [..., K, N] -> (qweight, scales): symmetric round-to-nearest per group along K.

    scale = max|w| / 7 over each group, so the value range -7..7 maps to nibbles 1..15
    (nibble 0, value -8, is never produced, as in GPTQ's symmetric mode).
    """
    if not w.is_floating_point():
        raise UsageError(f"weights to quantize must be floating point, got {w.dtype}")
    if scale_dtype not in SCALE_DTYPES:
        raise UsageError(f"scale dtype must be fp16, bf16 or fp32, got {scale_dtype}")
    *lead, k, n = w.shape
    check_k(k, group)
    g = w.float().reshape(*lead, k // group, group, n)
    scales = (g.abs().amax(dim=-2) / 7).clamp_min(1e-8).to(scale_dtype)
    q = torch.round(g / scales.float().unsqueeze(-2)).clamp(-8, 7) + 8
    return pack_nibbles(q.to(torch.int32).reshape(*lead, k, n)), scales
