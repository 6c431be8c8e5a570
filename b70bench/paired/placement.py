"""How a block runs the two sides of a target: together or alternate; and which one `auto` picks.

together   both sides' processes alive at once, timed calls alternating A B, B A, ... within the block: the two
           calls of a round see the same seconds of the host, so their ratio cancels what the host did. Needs
           the memory for two processes of the stack at once.
alternate  one process alive at a time: the block starts A, runs its calls, stops it, then B (B first in every
           other block), so the starts run A B | B A | A B ... and adjacent starts pair into the block's B/A.
           Before the first block each side gets one uncounted start that fills its compile cache (a cold start
           after a rebuild is not comparable). For a stack of which two processes do not fit, e.g. a model that
           fills its GPUs; host drift between the two starts is not cancelled, so more blocks are needed.

A target (the Target protocol) is what a side runs: decode.pair's engines answering timed calls, serve.pair's
servers answering load levels, moe.pair's kernel processes.
"""

from __future__ import annotations

import time
from typing import Protocol

from b70bench.errors import UsageError
from b70bench.paired.blocks import SIDES, Block

TOGETHER, ALTERNATE, AUTO = "together", "alternate", "auto"
PLACEMENTS = (AUTO, TOGETHER, ALTERNATE)
# How asv stores a walk's placement (a figure is a number): bench_decode/bench_serve write it, the website reads it.
CODES = {TOGETHER: 0, ALTERNATE: 1}


class Handle(Protocol):
    """One started process of a side."""

    def ready(self) -> dict:
        """Wait for the start; its facts (gate hash, log, pid)."""

    def warm(self) -> None:
        """One untimed call."""

    def call(self) -> dict:
        """One timed call: {"latency_s", "probe_s", ...}."""

    def stop(self) -> list[int]:
        """Stop and reap the process group; the pids that survived (none)."""


class Target(Protocol):
    """What a side runs. errors: the exceptions that fail one side (its block then fails with that line); backend:
    where its processes run ("cpu", "cuda", "xpu"), which decides whether together starts them in turn."""

    errors: tuple[type[BaseException], ...]
    backend: str

    def start(self, side: str, label: str) -> Handle: ...


class Fits(Protocol):
    """What `auto` asks of what a side runs (a stack: stack.description.Stack): whether two of its processes fit at
    once on this backend, and why. The engine knows no stack beyond this."""

    def two_fit(self, backend: str) -> tuple[bool, str]: ...


def choose(requested: str, backend: str, stack: Fits | None = None) -> tuple[str, str]:
    """(placement, why): `auto` is together where two processes of the stack fit at once (Stack.two_fit: on the CPU
    the memory for two; on a GPU or XPU memory shares of the same devices that add up to one at most), alternate
    otherwise. Without a stack (moe-down's kernel processes): together on the CPU, alternate elsewhere."""
    if requested not in PLACEMENTS:
        raise UsageError(f"--placement {requested!r}: pass one of {', '.join(PLACEMENTS)}")
    if requested != AUTO:
        return requested, f"--placement {requested}"
    if stack is None:
        if backend == "cpu":
            return TOGETHER, "auto: on the CPU both sides' processes fit at once, and together cancels drift"
        return ALTERNATE, f"auto: on {backend} the sides' processes would share each device; one at a time"
    fits, why = stack.two_fit(backend)
    return (TOGETHER if fits else ALTERNATE), f"auto: {why}"


def starts_in_turn(backend: str) -> bool:
    """Together on a GPU or XPU starts the second side once the first is ready: vLLM sizes its KV cache there from
    the device memory free during its start, so an engine starting beside another counts the other's memory as
    used (a cache of a fraction of its share, or no cache at all and a failed start). On the CPU the KV cache is a
    fixed size and both sides start at once."""
    return backend != "cpu"


def turn(order, rnd: int):
    """The order two processes alive together are called in round `rnd` (warm-ups and timed rounds alike): as given
    in even rounds, reversed in odd ones, so whatever the first slot of a round gets falls on both alike."""
    return order if rnd % 2 == 0 else order[::-1]


def _timed(handle, side: str, rnd: int, t0: float) -> dict:
    got = handle.call()
    return {**got, "side": side, "round": rnd, "t_s": round(time.monotonic() - t0, 4)}


def _stop(block: Block, side: str, handle) -> None:
    left = handle.stop()
    if left:
        block.error = (block.error or "") + f"; side {side} left pids {left} alive"


def run_block(
    index: int, target: Target, placement: str, *, rounds: int, warmup_calls: int, warm_first: bool = False
) -> Block:
    """One block of `rounds` timed calls a side; whichever way it ends, every process of it is stopped and reaped.

    Which side starts (and is called) first alternates between blocks, so whatever the first slot gets falls on
    both sides alike. warm_first (alternate): before the block, one uncounted start of each side."""
    block = Block(index, placement=placement)
    t0 = time.monotonic()
    order = SIDES if index % 2 == 0 else SIDES[::-1]
    handles: dict[str, Handle] = {}
    try:
        if placement == TOGETHER:
            in_turn = starts_in_turn(target.backend)
            for s in order:
                handles[s] = target.start(s, f"block{index:02d}-{s}")
                if in_turn:
                    block.starts[s] = handles[s].ready()
            for s in order:
                if s not in block.starts:
                    block.starts[s] = handles[s].ready()
            for i in range(warmup_calls):
                for s in turn(order, i):
                    handles[s].warm()
            tb = time.monotonic()
            for r in range(rounds):
                for s in turn(order, r):
                    block.calls.append(_timed(handles[s], s, r, tb))
        elif placement == ALTERNATE:
            if warm_first:
                block.warm_failed = True  # until both warm starts are done
                for s in order:
                    handles[s] = target.start(s, f"warm-{s}")
                    block.warm_starts[s] = handles[s].ready()
                    handles[s].warm()
                    _stop(block, s, handles.pop(s))
                block.warm_failed = False
                block.warm_s = time.monotonic() - t0
            for s in order:
                handles[s] = target.start(s, f"block{index:02d}-{s}")
                block.starts[s] = handles[s].ready()
                for _ in range(warmup_calls):
                    handles[s].warm()
                tb = time.monotonic()
                for r in range(rounds):
                    block.calls.append(_timed(handles[s], s, r, tb))
                _stop(block, s, handles.pop(s))
        else:
            raise UsageError(f"placement {placement!r}: choose() one of {', '.join(PLACEMENTS)} first")
    except target.errors as err:
        block.error = str(err)
    finally:
        for s, h in handles.items():
            _stop(block, s, h)
        block.wall_s = time.monotonic() - t0
    return block
