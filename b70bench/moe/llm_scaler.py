"""llm-scaler's u4 MoE down projection (intel/llm-scaler, `torch.ops.moe_int4_ops`), as a moe-down variant.

The op, from llm-scaler's custom_esimd_kernels_vllm extension (XPU; `moe_int4.sycl` registers it):

    moe_tiny_cutlass_nmajor_int4_down(Tensor intermediates, Tensor w2_qweight_s4, Tensor w2_scales,
                                      Tensor topk_weight, Tensor topk_idx) -> Tensor

- intermediates fp16 [T*topk, K], row t*topk + j the activation of token t's j-th route;
- w2_qweight_s4 uint8 [E, N, K/2], "N-major": one row per output channel, two k per byte, the low
  nibble the even k, each a signed 4-bit value (two's complement);
- w2_scales fp16 [E, N, K/128] (the group is fixed at 128); topk_weight fp16 [T, topk]; topk_idx int [T, topk];
- returns fp16 [T, N]: out[t, n] = sum_j topk_weight[t, j] * sum_k inter[t*topk + j, k] * q[e, n, k] * s[e, n, k/128]
  with e = topk_idx[t, j].

The suite's AutoRound/GPTQ u4 layout (b70bench.moe.layout: int32 [E, K/8, N], 8 nibbles along K,
value nibble - 8) becomes that layout once in prepare: transposed to N-major, read as bytes (on a
little-endian machine byte b of a row holds k = 2b low and 2b + 1 high), and each nibble XOR 8
(nibble - 8 as a two's-complement nibble). Registered only where llm-scaler's extension is imported;
elsewhere the variant is a skipped row naming what to install.
"""

from __future__ import annotations

import sys

import torch

from b70bench.errors import Unavailable
from b70bench.moe.shapes import Batch, Weights

NAMESPACE = "moe_int4_ops"
DOWN_OP = "moe_tiny_cutlass_nmajor_int4_down"
GROUP = 128  # hard-wired in the op


def find_op(name: str = DOWN_OP):
    """torch.ops.moe_int4_ops.<name>, or None where nobody registered it."""
    try:
        return getattr(getattr(torch.ops, NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return None


def to_nmajor_s4(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [E, K/8, N] u4 (value nibble - 8) -> uint8 [E, N, K/2] signed nibbles, low nibble = even k."""
    if sys.byteorder != "little":
        raise Unavailable("the byte view of the packed words assumes a little-endian host")
    u4 = qweight.transpose(1, 2).contiguous().view(torch.uint8)
    return torch.bitwise_xor(u4, 0x88)


class LlmScalerDown:
    """llm-scaler's down-projection op on the suite's weights, converted once at prepare."""

    name = "llm-scaler"

    def unavailable_reason(self, device, dtype) -> str | None:
        if find_op() is None:
            return (
                f"torch.ops.{NAMESPACE}.{DOWN_OP} is not registered: build intel/llm-scaler's "
                f"custom_esimd_kernels_vllm (Intel GPU) and import it before b70bench"
            )
        if dtype != torch.float16:
            return "llm-scaler's down op takes fp16 activations: use --dtype fp16"
        return None

    def label(self, weights: Weights, batch: Batch) -> str:
        return f"{NAMESPACE}.{DOWN_OP} (s4 N-major)"

    def prepare(self, weights: Weights, batch: Batch, out: torch.Tensor):
        if weights.group != GROUP:
            raise Unavailable(f"llm-scaler's down op has scale group {GROUP} built in, not {weights.group}")
        op = find_op()
        t, topk, k = batch.x.shape
        inter = batch.x.reshape(t * topk, k).contiguous()
        w = to_nmajor_s4(weights.qweight)
        s = weights.scales.transpose(1, 2).contiguous().to(torch.float16)
        tw = batch.weights.to(torch.float16)
        ids = batch.ids

        def run():
            return out.copy_(op(inter, w, s, tw, ids))

        return run
