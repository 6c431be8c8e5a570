"""What every paired result reports, whichever target measured it; each side's gate from its starts."""

from __future__ import annotations

from collections.abc import Callable

from b70bench import stats
from b70bench.paired.blocks import SIDES, Block, block_ses
from b70bench.paired.stopping import Paired

# What a target's pin says of one start's token hash: 0 equal to the pin, 1 different, None nothing pinned.
PinCheck = Callable[[str], "int | None"]
# A side's gate beyond 0 (pass), 1 (fail: speed withheld) and None (nothing pinned): its tokens differ, and the user
# declared that numerics change intended (a kernel with other rounding, checked by the lab's own canaries): its speed
# is read, and every report says so beside it.
INTENDED = 2
# The commits a walk was told change their numerics on purpose (`revisions --numerics-intended`), for its adapters.
INTENDED_ENV = "B70BENCH_NUMERICS_INTENDED"


def declare_intended(res: dict) -> dict:
    """B's failed gate read as a declared numerics change (INTENDED): its speed is read, never silently."""
    b = (res.get("sides") or {}).get("B") or {}
    if b.get("gate") == 1:
        b["gate"] = INTENDED
        b["gate_reason"] = f"{b.get('gate_reason') or 'tokens differ'} (declared intended: speed read)"
    return res


def intended_here(commit: str | None, environ=None) -> bool:
    """Whether the walked commit is one the walk was told changes its numerics on purpose (INTENDED_ENV)."""
    import os

    named = ((environ if environ is not None else os.environ).get(INTENDED_ENV) or "").split(",")
    return bool(commit) and any(c and commit.startswith(c) for c in named)


def side_gate(blocks: list[Block], side: str, pin: PinCheck) -> tuple[list[str], int | None]:
    """(the token hashes of one side's starts, its gate against the pin): 1 if any start's tokens differ from the
    pinned hash, 0 pinned and equal, None unpinned."""
    hashes = sorted({b.starts[side].get("token_sha256") for b in blocks if side in b.starts} - {None})
    words = [pin(h) for h in hashes]
    if 1 in words:
        return hashes, 1
    return hashes, 0 if words and all(v == 0 for v in words) else None


def _outputs(blocks: list[Block], side: str) -> list[tuple]:
    """Each start's output, prompt by prompt where the start recorded its token ids (decode), else its whole hash as
    one prompt (serve)."""
    out = []
    for b in blocks:
        s = b.starts.get(side) or {}
        if s.get("gate_token_ids"):
            out.append(tuple(tuple(ids) for ids in s["gate_token_ids"]))
        elif s.get("token_sha256"):
            out.append((s["token_sha256"],))
    return out


def _first_difference(a: tuple, b: tuple) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def token_difference(blocks: list[Block]) -> str | None:
    """Where B's tokens differ from A's, in words; None where they agree. A prompt differs when no start of B
    produced what some start of A produced on it: a stack whose greedy tokens vary between starts (seen on a GPU: one
    prompt in four turned at a near tie, in both sides alike) still agrees, while a numerics change, which moves a
    prompt's tokens in every start, does not."""
    a, b = _outputs(blocks, "A"), _outputs(blocks, "B")
    if not a or not b:
        return None
    if len({len(o) for o in a + b}) > 1:  # outputs recorded differently: compare whole outputs
        return None if set(a) & set(b) else "tokens differ from A's on the gate's prompts"
    differ, at = [], []
    for p in range(len(a[0])):
        seen_a, seen_b = {o[p] for o in a}, {o[p] for o in b}
        if not seen_a & seen_b:
            differ.append(str(p + 1))
            if isinstance(a[0][p], tuple):
                at.append(min(_first_difference(x, y) for x in seen_a for y in seen_b))
    if not differ:
        return None
    if not at:  # whole hashes: which prompt moved is not known
        return "tokens differ from A's on the gate's prompts"
    return (
        f"tokens differ from A's on the gate's prompts ({', '.join(differ)} of {len(a[0])}, from token {min(at) + 1})"
    )


def varies(blocks: list[Block], side: str) -> bool:
    """Whether one side's own starts produced different tokens (the stack is not reproducible across starts)."""
    return len(set(_outputs(blocks, side))) > 1


def paired_gates(blocks: list[Block], pin: PinCheck) -> dict[str, dict]:
    """Each side's gate ({"token_sha256", "gate", "gate_reason", "varies"}). A side fails where a start's tokens differ
    from the pin (side_gate); B fails too where its tokens differ from A's (token_difference), pinned or not: both
    sides decoded the same prompts greedily on the same device in the same run, so A's tokens are the reference a
    pin would be, and a commit that changes the numerics has no speed to compare. Tokens that vary among one side's
    starts are reported, not failed: on such a stack a pin fails by chance, and the sides are compared prompt by
    prompt over all their starts."""
    out = {}
    for side in SIDES:
        hashes, word = side_gate(blocks, side, pin)
        reason = "tokens differ from the pinned hash" if word == 1 else None
        out[side] = {"token_sha256": hashes, "gate": word, "gate_reason": reason, "varies": varies(blocks, side)}
    moved = token_difference(blocks)
    if moved:
        out["B"].update(gate=1, gate_reason=moved)
    return out


def verdict_fields(
    result: Paired,
    min_effect: float,
    placement: str,
    placement_reason: str,
    stack: dict | None,
    backend: str,
    timed: str = "calls",
) -> dict:
    """B/A, interval, verdict, and what produced it: the stack (its summary) and backend, the placement, blocks,
    starts, the calls (serve: levels) a side timed, minutes."""
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
        "stack": stack,
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
        "stopped": result.stopped,
        "lost": result.lost,
        "block_ratios": [b.ratio() for b in good],
        "block_log_ses": block_ses(good),
    }
