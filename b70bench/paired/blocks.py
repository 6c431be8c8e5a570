"""A block: one start per side, its timed calls, its B/A and that ratio's own standard error; the decision over blocks.

On a shared host the speed changes within seconds (the 2-core VM flips between two states 1.5-1.7x apart), so
figures from separate starts minutes apart differ by more than the changes users care about. What pairing cannot
cancel is an offset per process (one start runs a percent or two faster than another of the same code for its
whole life), so the block, not the call, is the unit of a verdict: each block gives one B/A (the trimmed mean of
its rounds' log ratios) and blocks are repeated with fresh processes.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from b70bench import stats

SIDES = "AB"
# The share of a block's round log ratios dropped from each end before their mean is taken.
ROUND_TRIM = 0.1
# Fewer rounds than this and a block's own standard error is too rough to lean on (decide()).
MIN_ROUNDS_FOR_SE = 24


@dataclass
class Settings:
    """What one side sets beyond its revision: variables set or removed in its processes' environment and more
    keyword arguments for what the target starts (an engine's). Empty on both sides: the sides differ by revision."""

    env: dict = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    engine_args: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.env or self.unset or self.engine_args)

    def describe(self) -> str:
        bits = [f"{k}={v}" for k, v in sorted(self.env.items())] + [f"unset {k}" for k in self.unset]
        bits += [f"{k}={v!r}" for k, v in sorted(self.engine_args.items())]
        return ", ".join(bits) or "-"

    def to_json(self) -> dict:
        return {"env": dict(self.env), "unset": list(self.unset), "engine_args": dict(self.engine_args)}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True, default=str).encode()).hexdigest()[:10]


@dataclass
class Side:
    """What one side runs: its vLLM overlay (None: the environment as installed), its compile cache, and the
    settings it alone has."""

    name: str
    overlay: Path | None
    cache_root: Path
    settings: Settings = field(default_factory=Settings)


@dataclass
class Block:
    index: int
    calls: list[dict] = field(default_factory=list)  # side, round, probe_s, latency_s, t_s (since the side's first)
    starts: dict = field(default_factory=dict)  # side -> its start's ready message
    wall_s: float = 0.0
    error: str | None = None
    placement: str = "together"
    warm_starts: dict = field(default_factory=dict)  # alternate: side -> the uncounted start that filled its cache
    warm_s: float = 0.0  # of wall_s, the seconds the uncounted starts took
    warm_failed: bool = False  # the error came in an uncounted start: the next block warms, nothing counted is lost
    # A walk design's block (paired.chain): its calls alternate as a together block's, but its two processes were
    # started a start or more apart, the earlier one having served its other neighbour first. What differs between
    # such processes for their whole lives is not bounded by the offset floor (stats.BLOCK_OFFSET_SD, measured on
    # processes started at once), so, as an alternate block's, its rounds give it no standard error (block_ses) and
    # the interval comes from the spread between blocks.
    started_apart: bool = False

    def ratios(self, normalise: bool = False, key: str = "latency_s") -> list[float]:
        """B/A of each complete round (of the calls' `key` figure: seconds per call, or another figure they carry,
        serve's TPOT); normalise: each call over its probe. Together, a round's two calls are adjacent in time;
        alternate, round r of A's start and round r of B's (independent calls of two starts)."""
        by_round: dict[int, dict[str, dict]] = {}
        for c in self.calls:
            by_round.setdefault(c["round"], {})[c["side"]] = c
        out = []
        for r in sorted(by_round):
            pair = by_round[r]
            if len(pair) == 2 and pair["A"].get(key) and pair["B"].get(key):
                a, b = pair["A"], pair["B"]
                ra = a[key] / (a["probe_s"] if normalise else 1.0)
                rb = b[key] / (b["probe_s"] if normalise else 1.0)
                out.append(rb / ra)
        return out

    def ratio(self, normalise: bool = False, key: str = "latency_s") -> float | None:
        """This block's B/A. Together: the ROUND_TRIM-trimmed mean of its rounds' log ratios, exponentiated (the
        rounds' log ratios are nearly independent, lag-1 correlation ~0.05, with heavy tails: over the same A/A
        blocks the mean spread least, the median most; trimming keeps a few stalled calls from moving it,
        docs/timing.md). Alternate: B's median call over A's. Its rounds are not paired in time (round r of
        A's start and of B's are a start apart), so a round's B/A is two independent calls' tails at once: on
        the 2-core VM the trimmed mean of four blocks of a 5% slowdown read 0.99-1.20 where the medians'
        ratios read 1.03-1.08."""
        if self.placement == "alternate":
            a, b = (self.figure(s, key, normalise) for s in SIDES)
            return b / a if a and b else None
        rs = self.ratios(normalise, key)
        return math.exp(stats.trimmed_mean([math.log(r) for r in rs], ROUND_TRIM)) if rs else None

    def figure(self, side: str, key: str = "latency_s", normalise: bool = False) -> float | None:
        """Median of one side's calls in this block (seconds per call, or another figure the calls carry);
        normalise: each call over its host probe."""
        got = [
            c[key] / (c["probe_s"] if normalise else 1.0)
            for c in self.calls
            if c["side"] == side and c.get(key) is not None
        ]
        return statistics.median(got) if got else None

    @classmethod
    def from_json(cls, data: dict) -> Block:
        """A block as to_json wrote it (a walk's journal): its calls, starts and seconds, so its ratio, standard
        error and cost read the same in the process that resumes the measurement."""
        return cls(
            index=data["index"],
            calls=list(data.get("calls") or []),
            starts=dict(data.get("starts") or {}),
            wall_s=float(data.get("wall_s") or 0.0),
            error=data.get("error"),
            placement=data.get("placement") or "together",
            warm_starts=dict(data.get("warm_starts") or {}),
            warm_s=float(data.get("warm_s") or 0.0),
            warm_failed=bool(data.get("warm_failed")),
            started_apart=bool(data.get("started_apart")),
        )

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "placement": self.placement,
            "started_apart": self.started_apart,
            "wall_s": self.wall_s,
            "warm_s": self.warm_s,
            "error": self.error,
            "warm_failed": self.warm_failed,
            "ratio": self.ratio(),
            "ratio_normalised": self.ratio(True),
            "starts": self.starts,
            "warm_starts": self.warm_starts,
            "calls": self.calls,
        }


def block_ses(blocks: list[Block], normalise: bool = False, key: str = "latency_s") -> list[float | None]:
    """Each block's standard error of its log B/A, from its own rounds: their winsorized spread (the block's
    ratio is their trimmed mean), widened for the rounds' lag-1 correlation pooled over the blocks. None for
    a block with fewer than MIN_ROUNDS_FOR_SE rounds, whose spread is too rough to lean on, and for an alternate
    block or a design's (started_apart): its two starts ran a start or more apart, so its rounds' spread says
    nothing of what differs between the starts (the host's state over each, each process's own offset); there the
    block's B/A is one sample, and the interval comes from the spread between blocks."""
    rounds = [
        [math.log(r) for r in b.ratios(normalise, key)] if b.placement != "alternate" and not b.started_apart else []
        for b in blocks
    ]
    enough = [x for x in rounds if len(x) >= MIN_ROUNDS_FOR_SE]
    if not enough:
        return [None] * len(blocks)
    rho = min(max(statistics.mean(stats.lag1_correlation(x) for x in enough), 0.0), 0.5)
    inflate = math.sqrt((1.0 + rho) / (1.0 - rho))
    return [
        stats.winsorized_sd(x, ROUND_TRIM) / ((1.0 - 2.0 * ROUND_TRIM) * math.sqrt(len(x))) * inflate
        if len(x) >= MIN_ROUNDS_FOR_SE
        else None
        for x in rounds
    ]


def decide(
    blocks: list[Block],
    level: float,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    floor: float = stats.DEFAULT_FLOOR,
    normalise: bool = False,
    key: str = "latency_s",
) -> tuple[stats.Ratio | None, stats.Decision | None]:
    """B/A over the blocks that completed and its verdict (stats.decide_blocks over their ratios and block_ses()).
    With each block's own standard error two blocks are enough (stats.blocks_interval gives them the two-block
    floor, where the t over two block values would be 25 times wider at 99%)."""
    good = [b for b in blocks if b.error is None and b.ratio(normalise, key) is not None]
    return stats.decide_blocks(
        [b.ratio(normalise, key) for b in good], block_ses(good, normalise, key), level, min_effect, floor
    )
