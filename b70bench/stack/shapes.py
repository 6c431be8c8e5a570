"""Decode and serve shapes (pPnN[bB]) and engine arguments as users type them."""

from __future__ import annotations

import json
import re

from b70bench.errors import UsageError

DEFAULT_MAX_MODEL_LEN = 2048
# The decode walk's shapes where neither B70BENCH_DECODE_SHAPES nor the stack names any: one short shape on the CPU
# (a together block in about a minute on two cores), the seeds' shapes on a GPU or XPU.
WALK_SHAPES_CPU = ("p128n128b1",)
WALK_SHAPES_DEVICE = ("p512n512b1", "p512n1536b1", "p512n2048b1")


def walk_shapes(override: str | None, stack_shapes, backend: str) -> list[str]:
    """The decode walk's shapes: B70BENCH_DECODE_SHAPES (override), else the stack's, else the backend's default."""
    if override:
        return override.split()
    if stack_shapes:
        return list(stack_shapes)
    return list(WALK_SHAPES_CPU if backend == "cpu" else WALK_SHAPES_DEVICE)


_SHAPE = re.compile(r"^p(\d+)n(\d+)(?:b(\d+))?$")


def parse_shape(text: str, batch: int = 1) -> tuple[int, int, int]:
    m = _SHAPE.match(text.strip().lower())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise UsageError(f"bad shape {text!r}: write prompt and output lengths as p512n512 (optionally b4 for batch 4)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or batch)


def shape_name(prompt_len: int, output_len: int, batch: int) -> str:
    return f"p{prompt_len}n{output_len}b{batch}"


def parse_engine_args(items: list[str] | None) -> dict:
    """KEY=VALUE pairs for LLM(...); values are JSON where they parse (numbers, true, lists), else strings."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"bad engine arg {item!r}: write KEY=VALUE, e.g. --engine-arg enforce_eager=true")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            out[key.replace("-", "_")] = value
    return out


def bench_prompts(prompt_len: int, batch: int, vocab_size: int | None, seed: int = 0) -> list[list[int]]:
    """The benchmark's prompts for a shape: seeded token ids, the same for decode's engines and serve's servers."""
    import numpy as np

    high = min(10000, vocab_size) if vocab_size else 10000
    rng = np.random.Generator(np.random.PCG64(seed))
    return [rng.integers(0, high, size=prompt_len).tolist() for _ in range(batch)]
