"""The u4 MoE down-projection suite (`b70bench moe-down`): variants, correctness, roofline.

layout: the AutoRound/GPTQ packed weights; shapes: MiniMax M2.x dims, routing, inputs;
variants: the registry (plug-ins by entry point); suite: measure(); tune: the tiling sweep. The Triton
variants: configs (a tiling, its label), launch (grouping, repacking, launching), kernels (the @triton.jit
code), ptx (its inline PTX text).
"""

from __future__ import annotations


def unavailable_reason(device) -> str | None:
    """The reference variant runs on every device torch supports, so the suite always runs;
    individual variants report their own skip reasons per row."""
    return None


def measure(*args, **kwargs) -> list[dict]:
    from b70bench.moe.suite import measure as _measure

    return _measure(*args, **kwargs)
