"""Decode and serve shapes (pPnN[bB]) and engine arguments as users type them."""

from __future__ import annotations

import json
import re

from b70bench.errors import UsageError

DEFAULT_MAX_MODEL_LEN = 2048


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
