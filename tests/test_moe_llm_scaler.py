"""The llm-scaler variant on the CPU, through a stand-in op registered with torch.library.

The stand-in computes the op's documented function from the documented layout (uint8 [E, N, K/2],
low nibble the even k, signed two's-complement nibbles, fp16 scales [E, N, K/128]) with its own
decoding, independent of b70bench.moe.layout: so the variant's conversion of the suite's u4 words
and its plumbing are checked against the suite's float64 reference like every variant.
"""

from __future__ import annotations

import pytest
import torch

from b70bench import device as devmod
from b70bench.moe import llm_scaler, shapes, suite, variants

SMALL = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)


def _stand_in(inter, w_s4, scales, topk_weight, topk_idx):
    low = (w_s4 & 0xF).to(torch.int16)
    high = (w_s4 >> 4).to(torch.int16)
    nib = torch.stack([low, high], dim=-1).flatten(-2)  # [E, N, K]: low nibble first = even k
    q = torch.where(nib >= 8, nib - 16, nib).double()  # two's complement
    w = q * scales.double().repeat_interleave(128, dim=-1)  # [E, N, K]
    t, topk = topk_idx.shape
    out = torch.zeros(t, w.shape[1], dtype=torch.float64)
    for ti in range(t):
        for j in range(topk):
            out[ti] += topk_weight[ti, j].double() * (w[int(topk_idx[ti, j])] @ inter[ti * topk + j].double())
    return out.to(torch.float16)


@pytest.fixture(scope="module")
def stand_in_op():
    if llm_scaler.find_op() is not None:
        pytest.skip("a real torch.ops.moe_int4_ops is registered here")
    lib = torch.library.Library(llm_scaler.NAMESPACE, "FRAGMENT")
    lib.define(
        f"{llm_scaler.DOWN_OP}(Tensor intermediates, Tensor w2_qweight_s4, Tensor w2_scales, "
        "Tensor topk_weight, Tensor topk_idx) -> Tensor"
    )
    lib.impl(llm_scaler.DOWN_OP, _stand_in, "CPU")
    yield lib
    lib._destroy()


def test_unregistered_op_is_a_skip_naming_what_to_install():
    if llm_scaler.find_op() is not None:
        pytest.skip("a real torch.ops.moe_int4_ops is registered here")
    reason = llm_scaler.LlmScalerDown().unavailable_reason(devmod.Device("cpu"), torch.float16)
    assert "not registered" in reason and "llm-scaler" in reason


def test_conversion_puts_each_signed_nibble_where_the_op_reads_it():
    k, n = 256, 3
    nib = torch.randint(0, 16, (1, k, n), dtype=torch.int32)
    from b70bench.moe import layout

    s4 = llm_scaler.to_nmajor_s4(layout.pack_nibbles(nib))
    assert s4.shape == (1, n, k // 2) and s4.dtype == torch.uint8
    for kk, nn in [(0, 0), (1, 0), (7, 2), (8, 1), (255, 2)]:
        byte = int(s4[0, nn, kk // 2])
        got = (byte >> 4) if kk % 2 else (byte & 0xF)
        assert (got - 16 if got >= 8 else got) == int(nib[0, kk, nn]) - 8


def test_llm_scaler_variant_matches_float64_through_the_stand_in(stand_in_op):
    assert variants.registry()["llm-scaler"].unavailable_reason(devmod.Device("cpu"), torch.float16) is None
    rows = suite.measure(
        devmod.Device("cpu"),
        ["llm-scaler", "reference"],
        tokens=(1, 5),
        tps=(1,),
        shape=SMALL,
        dtype=torch.float16,
        repeat=2,
        warmup=1,
        anchor_gbps=10.0,
    )
    mine = [r for r in rows if r["variant"] == "llm-scaler"]
    assert len(mine) == 2 and all(r["ok"] and r["skipped"] is None for r in mine), mine
    assert all("moe_tiny_cutlass_nmajor_int4_down" in r["config"] for r in mine)


def test_llm_scaler_variant_refuses_bf16(stand_in_op):
    rows = suite.measure(
        devmod.Device("cpu"),
        ["llm-scaler"],
        tokens=(1,),
        tps=(1,),
        shape=SMALL,
        dtype=torch.bfloat16,
        repeat=2,
        warmup=1,
        anchor_gbps=10.0,
    )
    assert "fp16" in rows[0]["skipped"]
