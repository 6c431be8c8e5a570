"""moe-down as a paired target: two kernels (variants, or one variant at two pinned tilings), each side a process
of its own with its own compile cache (moe/live.py), measured against each other in blocks.

`b70bench compare --suite moe-down A B` with A and B as `variant` or `variant@tiling-label` (b70bench moe-down
--tune prints labels): the same placements, blocks, stopping rule and verdicts as decode and serve, on a target that
needs no vLLM, so the measurement engine runs on any device moe-down runs on.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from pathlib import Path

from b70bench.paired import placement as placements
from b70bench.paired import report, stopping
from b70bench.paired.blocks import SIDES
from b70bench.paired.live import EngineError, EngineHandle, LiveProcess

DEFAULT_ROUNDS = 48
DEFAULT_TOKENS = 1
DEFAULT_TP = 4


class KernelEngine(LiveProcess):
    module = "b70bench.moe.live"


class Target:
    """Each side's spec (variant[@tiling], tp, tokens, backend) in a process with TRITON_CACHE_DIR of its own."""

    errors = (EngineError,)

    def __init__(self, specs: dict[str, dict], out_dir: Path, *, python: str | None = None, engine_cls=KernelEngine):
        self.specs, self.out_dir, self.python, self.engine_cls = specs, out_dir, python, engine_cls
        (self.backend,) = {spec["backend"] for spec in specs.values()}  # both sides run on one backend

    def start(self, side: str, label: str) -> EngineHandle:
        env = dict(os.environ, TRITON_CACHE_DIR=str(self.out_dir / f"triton-cache-{side}"), PYTHONUNBUFFERED="1")
        engine = self.engine_cls(side, self.specs[side], env, self.out_dir / f"{label}.log", self.python)
        return EngineHandle(engine, gap_s=0.0)  # no pause: it is for CPU engines' OpenMP threads to settle


def compare_kernels(
    kernels: dict[str, str],
    out_dir: Path,
    rule: stopping.Rule = stopping.DEFAULT_RULE,
    *,
    backend: str,
    tp: int = DEFAULT_TP,
    tokens: int = DEFAULT_TOKENS,
    placement: str = placements.AUTO,
    number: int = 20,
    repeat: int = 5,
    python: str | None = None,
    out=print,
    engine_cls=KernelEngine,
) -> dict:
    """B's kernel against A's, in blocks until `rule` decides or stops (rule.rounds None: DEFAULT_ROUNDS); one
    JSON-able dict like decode's and serve's."""
    rule = dataclasses.replace(rule, rounds=rule.rounds_or(DEFAULT_ROUNDS))
    min_effect = rule.min_effect
    where, why = placements.choose(placement, backend)
    out(f"placement: {where} ({why})")
    out_dir.mkdir(parents=True, exist_ok=True)
    # A call: `repeat` device-timed samples of `number` launches (graph replays where the device has graphs).
    specs = {
        s: {"variant": kernels[s], "tp": tp, "tokens": tokens, "backend": backend, "number": number, "repeat": repeat}
        for s in SIDES
    }
    target = Target(specs, out_dir, python=python, engine_cls=engine_cls)

    result = stopping.measure_target(target, where, out_dir, rule, warmup_calls=2, out=out)
    good = result.good
    per_launch = {s: [b.figure(s) for b in good if b.figure(s) is not None] for s in SIDES}
    first = next(iter(good), None)
    return {
        "suite": "moe-down",
        "shape": f"tp{tp} tokens{tokens}",
        "figure": "s_per_launch",
        "figure_label": "s/launch A",
        "backend": backend,
        **report.verdict_fields(result, min_effect, where, why, None, backend),
        "median_a": statistics.median(per_launch["A"]) if per_launch["A"] else None,
        "median_b": statistics.median(per_launch["B"]) if per_launch["B"] else None,
        "block_s_per_launch": per_launch,
        "series": dict(kernels),
        "sides": {
            s: {
                "gate": None,
                "token_sha256": [],
                "cache_keys": [],
                "label": (first.starts.get(s) or {}).get("label") if first else None,
                "rel_err": (first.starts.get(s) or {}).get("rel_err") if first else None,
            }
            for s in SIDES
        },
        "block_records": [b.to_json() for b in result.blocks],
    }
