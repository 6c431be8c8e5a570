"""`triton-htile`'s tuned tilings as data: one JSON table per device in this folder, named by the device as
vLLM names its fused-MoE configs (`device_name=NVIDIA_H200.json`), in the format `moe-down --tune --json` writes
and read by the same loader as `--tuned FILE`: per (K, N, tokens) the fastest correct tiling of the sweeps on
that device. The measurements behind each table are in docs/moe-down.md. A device without a table, or
activations the table was not measured with, gets the untuned default (`variants.default_tiling`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

FOLDER = Path(__file__).resolve().parent


def device_name(device: torch.device) -> str | None:
    """The name torch reports for a GPU; None for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "xpu":
        return torch.xpu.get_device_name(device)
    return None


def table_path(name: str) -> Path:
    return FOLDER / f"device_name={name.replace(' ', '_')}.json"


@functools.cache
def load(path: Path) -> tuple[frozenset, dict]:
    """(activation dtype names, (K, N, tokens) -> Config) of one table."""
    from b70bench.moe import configs

    with open(path) as f:
        activations = frozenset(json.load(f).get("activations", ()))
    return activations, configs.load_tuned(path)


def for_device(device: torch.device, dtype: torch.dtype) -> dict:
    """(K, N, tokens) -> Config for this device and activation dtype; {} where no table applies."""
    name = device_name(device)
    if name is None or not table_path(name).is_file():
        return {}
    activations, table = load(table_path(name))
    return table if str(dtype).removeprefix("torch.") in activations else {}
