"""The stopping rule: blocks until the verdict is decided or the budget is spent; the budgets' defaults.

A first look after `first_blocks` blocks; while undecided, the blocks double (as far as the budget allows) for
at most `max_looks` looks, each at a level that keeps the whole measurement at the overall level asked for
(Bonferroni: per_look_level). The decision at each look is stats.Ratio.decide, the same function the website
(verdicts.paired) and kernel-vs-model read blocks with.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from b70bench import records, stats, verdicts
from b70bench.errors import UsageError
from b70bench.paired import placement as placements
from b70bench.paired.blocks import SIDES, Block, block_ses, decide
from b70bench.paired.journal import Journal

MAX_LOOKS = 4
# `compare`'s overall level (each of its looks at per_look_level of it).
DEFAULT_LEVEL = 0.95


def per_look_level(level: float, max_looks: int = MAX_LOOKS) -> float:
    """The level each look needs for `level` overall over max_looks looks (Bonferroni)."""
    return 1.0 - (1.0 - level) / max_looks


def overall_level(look_level: float, max_looks: int = MAX_LOOKS) -> float:
    """The overall level of max_looks looks at look_level each: per_look_level's inverse."""
    return 1.0 - (1.0 - look_level) * max_looks


# The walk's (asv's) overall level: each of its looks at the level of the website's verdicts (verdicts.LEVEL),
# which are read from the same block samples.
WALK_LEVEL = overall_level(verdicts.LEVEL)
# The walk's first look: a walk spends its budget on every commit, and on a slow host four blocks of 96 rounds
# do not fit a few minutes; three, each with its own standard error, name 9% at the first look (tests/test_pair.py).
WALK_FIRST_BLOCKS = 3
DEFAULT_FIRST_BLOCKS = 4
# Alternate placement's first look: one of its blocks is one start a side, and only the blocks' spread tells how far
# starts differ (a block's own rounds cannot see the offset of its process), so the interval is t over few degrees of
# freedom at the per-look level: ~7.5 times the standard error with 4 blocks, ~4.3 with 6. On the 2-core VM four
# alternate blocks of a 5% slowdown (block ratios 1.03-1.08) left [0.87, 1.34].
ALTERNATE_FIRST_BLOCKS = 6
DEFAULT_BUDGET_MIN = 10.0


def first_look_blocks(first_blocks: int, placement: str) -> int:
    """The blocks a measurement's first look waits for, as placed (alternate needs ALTERNATE_FIRST_BLOCKS)."""
    return max(first_blocks, ALTERNATE_FIRST_BLOCKS) if placement == placements.ALTERNATE else first_blocks


def least_starts(first_blocks: int, placement: str) -> int:
    """Engine starts a decided measurement takes at least: two a block of the first look, and alternate's one
    uncounted start a side that fills its compile cache."""
    warm = len(SIDES) if placement == placements.ALTERNATE else 0
    return warm + len(SIDES) * first_look_blocks(first_blocks, placement)


def start_cost_s(start_s: float, call_s: float, calls: int) -> float:
    """Seconds one process of a side costs when it runs alone: its warm start and its `calls` calls (warm-ups
    included). A walk design's starts and an alternate block's are each one of these."""
    return start_s + calls * call_s


def block_s(start_s: float, call_s: float, calls: int, placement: str, backend: str = "cpu") -> float:
    """Seconds one counted block takes (`calls` a start, warm-ups included): alternate runs one process at a time,
    2 * start_cost_s; together starts both sides' processes at once (on `backend`'s accelerators one after the
    other: placement.starts_in_turn), then alternates their calls: (1 or 2) * start_s + 2 * calls * call_s."""
    if placement == placements.ALTERNATE:
        return len(SIDES) * start_cost_s(start_s, call_s, calls)
    starts = len(SIDES) if placements.starts_in_turn(backend) else 1
    return starts * start_s + len(SIDES) * calls * call_s


def first_look_s(
    start_s: float, call_s: float, calls: int, first_blocks: int, placement: str, backend: str = "cpu"
) -> float:
    """Seconds a first look takes on a stack whose warm start takes start_s and one call call_s (`calls` a start,
    warm-ups included): its blocks (block_s each); alternate also runs one uncounted start a side first, counted
    here as one more block."""
    blocks = first_look_blocks(first_blocks, placement)
    warm = 1 if placement == placements.ALTERNATE else 0
    return (blocks + warm) * block_s(start_s, call_s, calls, placement, backend)


def default_budget_min(first_look: float | None) -> float:
    """The budget a measurement gets unless one is named: DEFAULT_BUDGET_MIN, or where the stack states what a start
    and a call cost (first_look: first_look_s's seconds), room for the first look and one doubling of its blocks
    (what an undecided first look asks)."""
    if not first_look:
        return DEFAULT_BUDGET_MIN
    return max(DEFAULT_BUDGET_MIN, math.ceil(2 * first_look / 60))


# One together block of the CPU default (two starts on a warm cache, 96 rounds) takes about a minute on the 2-core
# VM; a verdict needs two blocks at least.
MIN_BUDGET_MIN = 2.0


def budget_min_from_env(name: str, default_min: float, least_min: float = MIN_BUDGET_MIN, environ=None) -> float:
    """A paired measurement's budget in minutes from environment variable `name` (of environ, default this process's),
    default_min when unset; a value that is not a number of at least least_min minutes is a UsageError naming the
    fix."""
    text = (os.environ if environ is None else environ).get(name)
    if not text:
        return default_min
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= least_min:
        raise UsageError(f"{name}={text!r}: set {least_min:g} or more minutes per commit")
    return value


# The smallest change a walk must decide, for this walk only (revisions --min-effect sets it for asv's processes).
MIN_EFFECT_ENV = "B70BENCH_MIN_EFFECT"


def effect_from(stated: float | None, environ=None) -> tuple[float | None, str | None]:
    """The smallest change a measurement must decide where one is set, and where it comes from: MIN_EFFECT_ENV, else
    `stated` (the stack's min_effect); (None, None) where neither is (the caller's default then applies)."""
    environ = os.environ if environ is None else environ
    text = environ.get(MIN_EFFECT_ENV)
    if text:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0 < value < 1:
            raise UsageError(f"{MIN_EFFECT_ENV}={text!r}: set a fraction in (0, 1), e.g. 0.02 for 2%")
        return value, MIN_EFFECT_ENV
    if stated is not None:
        return stated, "the stack's min_effect"
    return None, None


@dataclass(frozen=True)
class Rule:
    """How one paired measurement runs and when it stops, whatever its target: rounds a block (None: the target's
    own default), the budget, the overall level and the decision's thresholds, the blocks of the first look, and the
    counted-start cap (two starts a block). compare, bisect, the walk's adapters and revisions --design each build
    one; every target's compare_series and measure_target take it."""

    rounds: int | None = None
    budget_s: float = DEFAULT_BUDGET_MIN * 60
    level: float = DEFAULT_LEVEL
    min_effect: float = stats.DEFAULT_MIN_EFFECT
    floor: float = stats.DEFAULT_FLOOR
    first_blocks: int = DEFAULT_FIRST_BLOCKS
    max_blocks: int | None = None

    @classmethod
    def walk(cls, budget_s: float, rounds: int | None = None, min_effect: float = stats.DEFAULT_MIN_EFFECT) -> Rule:
        """A walk's rule (asv's adapters, revisions --design): its level and first look, this budget and effect."""
        return cls(
            rounds=rounds, budget_s=budget_s, level=WALK_LEVEL, min_effect=min_effect, first_blocks=WALK_FIRST_BLOCKS
        )

    def rounds_or(self, default: int) -> int:
        return self.rounds if self.rounds is not None else default


# compare's rule, each target's rounds (frozen: safe as a default argument).
DEFAULT_RULE = Rule()


# Why a measurement stopped, one word each (the page says it beside an undecided verdict, so a person can tell "too
# noisy" from "too short"), and the code asv stores it under (a figure is a number).
DECIDED, BUDGET, START_CAP, LOOKS, FAILED = "decided", "budget spent", "start cap", "looks spent", "failed blocks"
STOPS = {DECIDED: 0, BUDGET: 1, START_CAP: 2, LOOKS: 3, FAILED: 4}


@dataclass
class Paired:
    """The blocks of one paired measurement and what they decided."""

    blocks: list[Block]
    ratio: object | None  # stats.Ratio over the blocks' B/A, None below two blocks
    decision: object | None  # stats.Decision
    level: float
    looks: int
    wall_s: float
    reason: str | None = None  # why it stopped undecided (budget spent, a side failed, ...)
    lost: bool = False  # ended by a failure, not by its budget or a decision: `reason` is the cause
    stopped: str | None = None  # STOPS: why no further block was taken

    @property
    def good(self) -> list[Block]:
        return [b for b in self.blocks if b.error is None and b.ratio() is not None]

    @property
    def calls_per_side(self) -> int:
        return sum(len(b.ratios()) for b in self.good)

    @property
    def starts(self) -> int:
        """Engine starts taken, counted ones and those that filled a compile cache, good blocks or not."""
        return sum(len(b.starts) + len(b.warm_starts) for b in self.blocks)

    @property
    def minutes(self) -> float:
        return self.wall_s / 60.0

    def also(self, key: str, min_effect: float, floor: float) -> dict:
        """Another figure the calls carry (serve's TPOT, TTFT) read from the same blocks at the same level by the
        same decision; the stopping rule itself followed the primary figure only."""
        good = [b for b in self.good if b.ratio(key=key) is not None]
        ratio, decision = decide(good, self.level, min_effect, floor, key=key)
        return {
            "ratio": ratio.ratio if ratio else None,
            "lo": ratio.lo if ratio else None,
            "hi": ratio.hi if ratio else None,
            "verdict": decision.word if decision else stats.UNDECIDED,
            "text": decision.text if decision else "undecided: fewer than two blocks carry it",
            "blocks": len(good),
            "block_ratios": [b.ratio(key=key) for b in good],
            "block_log_ses": block_ses(good, key=key),
            "block_b": [b.figure("B", key) for b in good],  # B's median per block (the walked commit's figure)
        }

    def text(self) -> str:
        if self.decision is None:
            return f"undecided: {self.reason}"
        return self.decision.text + (f" ({self.reason})" if self.reason and self.decision.word == "undecided" else "")


def measure(
    run_one,
    *,
    budget_s: float,
    level: float,
    min_effect: float,
    floor: float,
    first_blocks: int = DEFAULT_FIRST_BLOCKS,
    max_looks: int = MAX_LOOKS,
    max_blocks: int | None = None,
    out=print,
    clock=time.monotonic,
    done: list[Block] | tuple = (),
    looked: list[int] | tuple = (),
    on_look=None,
) -> Paired:
    """Blocks until decided: `first_blocks`, each started while the budget is not yet spent (a budget spent sooner
    brings the first look at the blocks taken), then double while undecided and the next block fits
    the budget; never more than max_blocks (the counted-start budget: two starts a block).

    run_one(index) -> Block runs one block. `level` is each look's; at most max_looks looks are taken,
    so an A/A pair is called different with at most max_looks * (1 - level) (per_look_level()).

    done, looked: what an earlier run of the same measurement finished (paired.journal): its blocks, which this run
    goes on from (the next block is number len(done) + 1; the budget counts their seconds), and the block counts at
    which it looked (those looks count against max_looks; where the last saw exactly `done`, those blocks are read
    again before any block runs, not counted as a look of their own). on_look(blocks): told of each look taken.
    """

    per_look = level
    blocks: list[Block] = list(done)
    # The budget is the measurement's, not this process's: blocks journaled by a killed run spent it too.
    t0 = clock() - sum(b.wall_s for b in blocks)
    cap = max_blocks if max_blocks is not None else 10**9
    target, looks, reason, stopped = min(first_blocks, cap), len(looked), None, None
    ratio = decision = None
    resumed_after_look = bool(looked)
    while True:
        if resumed_after_look:
            # A killed run looked at looked[-1] blocks and went on (or was about to): continue from that look.
            resumed_after_look = False
            seen = looked[-1]
            if seen == len(blocks):
                ratio, decision = decide(blocks, per_look, min_effect, floor)
        else:
            while len(blocks) < target:
                b = run_one(len(blocks))
                blocks.append(b)
                ok = [x for x in blocks if x.error is None]
                out(
                    f"block {b.index + 1}: "
                    + (
                        f"B/A {b.ratio():.3f} over {len(b.ratios())} rounds"
                        if b.error is None
                        else f"failed: {b.error}"
                    )
                    + f" ({b.wall_s:.0f} s, {(clock() - t0) / 60:.1f} of {budget_s / 60:.1f} min)"
                )
                if b.error is not None and not b.warm_failed:
                    # A counted start or call lost (an engine killed, out of memory, a start timeout): the figures
                    # would rest on whatever blocks happened to survive, so the measurement ends here with the cause;
                    # a walk records it as failed and measures the commit again when it resumes. A failed uncounted
                    # start loses nothing counted: the next block warms.
                    reason = f"block {b.index + 1} failed: {b.error}"
                    return Paired(blocks, None, None, per_look, looks, clock() - t0, reason, lost=True, stopped=FAILED)
                if b.error is not None and not ok and len(blocks) >= 2:
                    reason = f"every block failed; the last: {b.error}"
                    return Paired(blocks, None, None, per_look, looks, clock() - t0, reason, lost=True, stopped=FAILED)
                spent = clock() - t0
                # The blocks of the first look are the fewest a verdict is read from, so each starts whenever the
                # budget is not yet spent (the budget then runs over by one block at most), never cut short by a
                # prediction: the first block pays the new graph's compile, so its cost predicted too few blocks on
                # a slow host, and two blocks whose process pairs disagree by a few percent leave even a 9% slowdown
                # undecided. Later blocks start only where the next (costing about what the last one did) still
                # fits.
                per_block = b.wall_s
                over = spent >= budget_s if looks == 0 else spent + per_block > budget_s
                if over and len(blocks) < target:
                    reason = f"the budget ({budget_s / 60:.1f} min) ran out after {len(blocks)} blocks"
                    stopped = BUDGET
                    break
            looks += 1
            if on_look is not None:
                on_look(len(blocks))
            seen = len(blocks)
            ratio, decision = decide(blocks, per_look, min_effect, floor)
        if decision is not None and decision.word != stats.UNDECIDED:
            reason, stopped = None, DECIDED
            break
        spent = clock() - t0
        per_block = blocks[-1].wall_s if blocks else 0.0
        room = int((budget_s - spent) // per_block) if per_block > 0 else 0
        if len(blocks) >= cap and not reason:
            reason, stopped = f"the start budget ({2 * cap} counted starts) is spent", START_CAP
        if reason or looks >= max_looks or room < 1:
            if not reason:
                reason, stopped = (
                    (f"the budget ({budget_s / 60:.1f} min) allows no further block", BUDGET)
                    if room < 1
                    else (f"{looks} looks taken (the most the level allows)", LOOKS)
                )
            break
        # Double the blocks the last look saw, as far as the budget allows (blocks run since that look, by a run
        # that was killed, are already in `blocks` and their seconds in `spent`).
        target = min(cap, 2 * seen, len(blocks) + room)
    lost = ratio is None and not [b for b in blocks if b.error is None]
    if ratio is None and reason is None:
        reason = "fewer than two blocks completed"
    if lost:
        stopped = FAILED
    return Paired(blocks, ratio, decision, per_look, looks, clock() - t0, reason, lost=lost, stopped=stopped)


def measure_target(
    target: placements.Target,
    placement: str,
    out_dir: Path,
    rule: Rule,
    *,
    warmup_calls: int,
    out=print,
    journal: Journal | None = None,
) -> Paired:
    """The one run of a paired measurement: measure() over blocks of `target` placed as `placement` by `rule` (its
    rounds set; the first alternate block warms each side first), each block's calls written to out_dir/blockNN.json
    for a reader to check (scripts/pair_analysis.py reads them). rule.level is the overall level; each look takes
    per_look_level(rule.level).

    journal (a walk's: paired.journal): each finished block and look recorded as it ends, and what an earlier run
    of the same measurement recorded read back and gone on from."""
    if rule.rounds is None:
        raise ValueError("measure_target needs rule.rounds: the target's compare_series sets its default")
    first_blocks = first_look_blocks(rule.first_blocks, placement)
    done, looked = journal.read() if journal is not None else ([], [])
    if journal is not None:
        journal.begin(done, rule.budget_s, placement)
    spent = [sum(b.wall_s for b in done)]
    if done:
        out(
            f"{len(done)} blocks kept from an earlier run ({spent[0] / 60:.1f} min, {journal.path}); going on at "
            f"block {len(done) + 1}" + (", after a warm start a side" if placement == placements.ALTERNATE else "")
        )

    # Alternate: each side's compile cache is filled by an uncounted start before the first counted one, in this
    # process too when blocks were kept from an earlier one (its engines are gone; a start after a reboot or another
    # walk's commit is not warm). A block whose warm starts failed (a start out of memory) leaves that to the next.
    warmed = placement != placements.ALTERNATE

    def run_one(i: int) -> Block:
        nonlocal warmed
        b = placements.run_block(
            i, target, placement, rounds=rule.rounds, warmup_calls=warmup_calls, warm_first=not warmed
        )
        warmed = warmed or len(b.warm_starts) == len(SIDES)
        records.atomic_write_text(out_dir / f"block{i:02d}.json", json.dumps(b.to_json()) + "\n")
        spent[0] += b.wall_s
        if journal is not None:
            journal.block(b, spent[0])
        return b

    return measure(
        run_one,
        budget_s=rule.budget_s,
        level=per_look_level(rule.level),
        min_effect=rule.min_effect,
        floor=rule.floor,
        first_blocks=first_blocks,
        max_blocks=rule.max_blocks,
        out=out,
        done=done,
        looked=looked,
        on_look=journal.look if journal is not None else None,
    )
