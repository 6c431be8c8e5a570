"""Where a paired measurement's budget buys precision, and what a budget decides (two-stage sampling).

Arithmetic only: nothing here starts a process. On the log scale, spreads as fractions, a block (one start a side,
`m` timed rounds, a round one call a side) reads log B/A with variance

    block_var(m) = block_sd^2 + k * round_sd^2 / m

block_sd: what more rounds cannot remove (the starts' offsets); round_sd: one round's log B/A; k: how much wider
the block's own estimator is than a mean of its rounds (together: the trimmed mean, k = 1, its 10% trim costing
normal rounds ~6%; alternate: B's median call over A's, k = pi/2, the median's variance over the mean's for normal
calls). A block costs

    block_cost_s(m) = F + m * c,  c = 2 * call_s
    F = alternate: 2 * (start_s + warmup_calls * call_s)
        together:  (2 if placement.starts_in_turn(backend) else 1) * start_s + 2 * warmup_calls * call_s

(stopping.block_s, the one cost rule), and a measurement pays once before its first block (once_s): alternate
2 * (start_s + call_s) for its uncounted start a side (one untimed call each, as placement.run_block warms), and
cold_s - start_s where side B's first start compiles a new graph. The calls a start
that buy the most precision a second are the classic two-stage optimum m* = sqrt((F / c) * (k round_sd^2 /
block_sd^2)) (optimal_calls). forecast() follows stopping.measure's schedule of looks for a budget and reads what
the project's own decision (stats.decide_blocks) would give at the last one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from b70bench import stats
from b70bench.paired import placement as placements
from b70bench.paired import stopping
from b70bench.paired.blocks import MIN_ROUNDS_FOR_SE, SIDES

# A median needs a few calls: the fewest an alternate start takes.
LEAST_ALTERNATE_CALLS = 4
# The most calls a start optimal_calls gives: four times decode.pair.DEFAULT_ROUNDS (not imported: decode.pair
# imports the paired engine, which will call this module).
MOST_CALLS = 4 * 96
# "Named 4 times in 5": the power Forecast.names is read at.
POWER = 0.8
# Alternate blocks read B's median call over A's; for normal calls a median's variance is pi/2 times a mean's.
MEDIAN_VARIANCE = math.pi / 2


@dataclass(frozen=True)
class Costs:
    """What a stack's start and call cost (seconds) and how its figures spread (log scale, fractions): start_s a
    warm start, call_s one call, block_sd the spread between blocks that no number of rounds removes, round_sd one
    round's log B/A. cold_s: side B's first start on a graph that is new (None: as warm). A calibration file is
    mapped onto these by the caller."""

    start_s: float
    call_s: float
    block_sd: float
    round_sd: float
    cold_s: float | None = None
    warmup_calls: int = 3


def _round_var(costs: Costs, placement: str) -> float:
    """One round's variance as the block's estimator sees it: k * round_sd^2 (module docstring)."""
    k = MEDIAN_VARIANCE if placement == placements.ALTERNATE else 1.0
    return k * costs.round_sd**2


def block_var(costs: Costs, m: int, placement: str = placements.TOGETHER) -> float:
    """Variance of one block's log B/A with m rounds: block_sd^2 + k * round_sd^2 / m (k: module docstring)."""
    return costs.block_sd**2 + _round_var(costs, placement) / m


def block_cost_s(costs: Costs, m: int, placement: str, backend: str = "cpu") -> float:
    """Seconds one counted block of m timed rounds takes: F + m * c (stopping.block_s, warm-ups included)."""
    return stopping.block_s(costs.start_s, costs.call_s, m + costs.warmup_calls, placement, backend)


def once_s(costs: Costs, placement: str) -> float:
    """Seconds a measurement pays once, before its first counted block: alternate's uncounted start a side (each
    with the one untimed call placement.run_block gives it), and cold_s - start_s where side B's first start
    compiles a new graph."""
    warm = len(SIDES) * stopping.start_cost_s(costs.start_s, costs.call_s, 1)
    cold = max(0.0, costs.cold_s - costs.start_s) if costs.cold_s is not None else 0.0
    return (warm if placement == placements.ALTERNATE else 0.0) + cold


def _pct(x: float) -> str:
    return f"{x * 100:.2g}%"


def optimal_calls(
    costs: Costs, placement: str, backend: str = "cpu", floor: int | None = None, cap: int | None = None
) -> tuple[int, str]:
    """(timed calls a start, why): the two-stage optimum m* = sqrt((F / c) * (k round_sd^2 / block_sd^2)), the m
    that minimises cost times variance, block_cost_s(m) * block_var(m); of floor(m*) and ceil(m*) the one of lower
    cost per precision, clamped to [floor, cap]. floor default: alternate LEAST_ALTERNATE_CALLS (a median needs a
    few calls), together MIN_ROUNDS_FOR_SE (fewer rounds give a block no standard error of its own); cap default
    MOST_CALLS. block_sd 0: the cap (every call buys precision); round_sd 0: the floor (calls buy none)."""
    if floor is None:
        floor = LEAST_ALTERNATE_CALLS if placement == placements.ALTERNATE else MIN_ROUNDS_FOR_SE
    cap = MOST_CALLS if cap is None else cap
    if not 1 <= floor <= cap:
        raise ValueError(f"calls a start: need 1 <= floor <= cap (have floor {floor}, cap {cap})")
    if costs.round_sd == 0:
        return floor, f"{floor} calls a start (the floor): calls do not spread (round_sd 0), so more buy nothing"
    if costs.block_sd == 0:
        return cap, (
            f"{cap} calls a start (the cap): starts do not spread (block_sd 0), so every call buys precision and "
            "only the cap stops them"
        )
    fixed = block_cost_s(costs, 0, placement, backend)
    per_round = block_cost_s(costs, 1, placement, backend) - fixed
    best = math.sqrt(fixed / per_round * _round_var(costs, placement) / costs.block_sd**2)

    def cost_per_precision(m: int) -> float:
        return block_cost_s(costs, m, placement, backend) * block_var(costs, m, placement)

    m = min({max(1, math.floor(best)), math.ceil(best)}, key=cost_per_precision)
    clamp = f", floor {floor}" if m < floor else f", cap {cap}" if m > cap else ""
    m = min(max(m, floor), cap)
    return m, (
        f"{m} calls a start: a start costs {costs.start_s:.3g} s against {costs.call_s:.3g} s a call, and a block's "
        f"B/A spreads {_pct(costs.block_sd)} beyond its calls against {_pct(costs.round_sd)} a round (two-stage "
        f"optimum {best:.1f}{clamp})"
    )


def half_width(costs: Costs, m: int, blocks: int, level: float, placement: str) -> float:
    """The half-width (log scale) of the interval stats.decide_blocks gives `blocks` blocks of m rounds at `level`,
    their spread as modelled. Together blocks of MIN_ROUNDS_FOR_SE rounds or more carry their own standard error,
    se^2 = round_sd^2 / m, and get stats.blocks_interval: z * sqrt(1 / sum of weights), each weight
    1 / (se^2 + tau^2), tau^2 = max(block_sd^2, BLOCK_OFFSET_SD^2) (two blocks: TWO_BLOCKS_OFFSET_SD). Alternate and
    shorter blocks get the t over the block values (stats.paired_interval): t at (1 + level) / 2 with blocks - 1
    degrees of freedom times sqrt(block_var / blocks). Fewer than two blocks: infinite."""
    if blocks < 2:
        return math.inf
    se = math.sqrt(_round_var(costs, placement) / m)
    if placement != placements.ALTERNATE and m >= MIN_ROUNDS_FOR_SE and se > 0:
        # The blocks at their expected spread (all at 0: the estimate of tau^2 then falls to its floor, set to
        # block_sd where that is above the project's).
        offset = max(costs.block_sd, stats.BLOCK_OFFSET_SD)
        ratio = stats.blocks_interval([0.0] * blocks, [se] * blocks, level, offset_sd=offset)
        return math.log(ratio.hi)
    return stats.t_quantile((1.0 + level) / 2.0, blocks - 1) * math.sqrt(block_var(costs, m, placement) / blocks)


def schedule(budget_s: float, once: float, per_block: float, first: int, max_looks: int) -> tuple[list[int], float]:
    """(blocks at each look, seconds spent) of a measurement that stays undecided, stopping.measure's rule at fixed
    block costs: the first look's blocks each start while the budget is not yet spent; then, while looks are
    left, the blocks double as far as blocks of the last one's cost fit the budget."""
    n, spent, last, looks, target, cut = 0, 0.0, 0.0, [], first, False
    while True:
        while n < target:
            n += 1
            last = per_block + (once if n == 1 else 0.0)
            spent += last
            over = spent >= budget_s if not looks else spent + last > budget_s
            if over and n < target:
                cut = True
                break
        looks.append(n)
        room = int((budget_s - spent) // last) if last > 0 else 0
        if cut or len(looks) >= max_looks or room < 1:
            return looks, spent
        target = min(2 * n, n + room)


@dataclass(frozen=True)
class Forecast:
    """What a budget buys one paired measurement, its blocks' spread as modelled.

    calls (why): timed calls a start; looks: blocks at each look of a measurement that stays undecided to the end
    (stopping.measure's schedule); minutes: what that takes (the most the measurement spends), first_look_minutes:
    what its first look takes (the least); level: each look's (per_look_level). half: the last look's interval
    half-width, log scale; se: the standard error of its block mean, sqrt(block_var / blocks).

    rules_out = exp(half) - 1: the change the last interval rules out where an A/A's estimate lands on 1 exactly
    ("no change beyond X" is reachable only where X <= min_effect). clears = exp(half + z_0.9 * se) - 1: the
    smallest min_effect an A/A reads "no change beyond" 4 times in 5 at the last look (its interval's far end,
    |estimate| + half, stays within it with probability 0.8). names = exp(max(half, log(1 + floor)) + z_0.8 * se) - 1:
    the smallest slowdown named slower 4 times in 5 at the last look (its estimate then lands above both the
    interval's half and the floor with probability 0.8). Earlier looks only add to either."""

    budget_s: float
    placement: str
    calls: int
    why: str
    looks: tuple[int, ...]
    minutes: float
    first_look_minutes: float
    level: float
    half: float
    se: float
    rules_out: float
    clears: float
    names: float
    min_effect: float

    @property
    def blocks(self) -> int:
        return self.looks[-1]

    def decides(self, min_effect: float | None = None) -> bool:
        """Whether the budget decides at min_effect (default: the forecast's) both ways, each 4 times in 5: a
        change of min_effect is named (names <= min_effect) and an A/A reads "no change beyond min_effect" (clears
        <= min_effect)."""
        e = self.min_effect if min_effect is None else min_effect
        return self.names <= e and self.clears <= e

    def text(self) -> str:
        looks = ", ".join(str(n) for n in self.looks)
        return (
            f"{self.budget_s / 60:.0f} min: {self.calls} calls a start, {self.placement} blocks at looks {looks} "
            f"({self.first_look_minutes:.0f} min to the first, {self.minutes:.0f} undecided to the end); 4 times in "
            f"5 an A/A reads no change beyond {_pct(self.clears)} and a slowdown of {_pct(self.names)} is named"
        )


def forecast(
    costs: Costs,
    *,
    budget_s: float,
    placement: str,
    backend: str = "cpu",
    calls: int | None = None,
    level: float = stopping.DEFAULT_LEVEL,
    first_blocks: int = stopping.DEFAULT_FIRST_BLOCKS,
    max_looks: int = stopping.MAX_LOOKS,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    floor: float = stats.DEFAULT_FLOOR,
) -> Forecast:
    """What `budget_s` seconds decide for one measurement placed `placement`: calls a start (optimal_calls unless
    given), the blocks stopping.measure takes (first look first_look_blocks(first_blocks, placement), then
    doubling while the budget allows, at most max_looks looks, each at per_look_level(level)) and what the last
    look's interval rules out and names (Forecast). `level` is the overall level, as Rule.level."""
    why = f"{calls} calls a start, as given"
    if calls is None:
        calls, why = optimal_calls(costs, placement, backend)
    per = block_cost_s(costs, calls, placement, backend)
    once = once_s(costs, placement)
    first = stopping.first_look_blocks(first_blocks, placement)
    looks, spent = schedule(budget_s, once, per, first, max_looks)
    first_s = once + looks[0] * per
    look_level = stopping.per_look_level(level, max_looks)
    k = looks[-1]
    half = half_width(costs, calls, k, look_level, placement)
    se = math.sqrt(block_var(costs, calls, placement) / k)
    z = NormalDist().inv_cdf
    clears = math.expm1(half + z((1.0 + POWER) / 2.0) * se)  # |estimate| below z_0.9 se 4 times in 5
    names = math.expm1(max(half, math.log1p(floor)) + z(POWER) * se)
    return Forecast(
        budget_s, placement, calls, why, tuple(looks), spent / 60, first_s / 60, look_level, half, se,
        math.expm1(half), clears, names, min_effect,
    )  # fmt: skip


def smallest_effect(costs: Costs, budget_s: float, **kw) -> float:
    """The smallest slowdown `budget_s` names 4 times in 5: forecast(...).names (keywords: forecast's)."""
    return forecast(costs, budget_s=budget_s, **kw).names


def budget_for(costs: Costs, effect: float, *, placement: str, tolerance_s: float = 1.0, **kw) -> float:
    """The least budget (seconds, to tolerance_s) whose forecast names `effect` 4 times in 5, by bisection: more
    budget never takes fewer blocks at the last look, so names falls with the budget. math.inf where no budget
    does: every look taken (the blocks of max_looks looks) still names less (keywords: forecast's)."""
    calls = kw.get("calls") or optimal_calls(costs, placement, kw.get("backend", "cpu"))[0]
    kw = {**kw, "placement": placement, "calls": calls}
    first = stopping.first_look_blocks(kw.get("first_blocks", stopping.DEFAULT_FIRST_BLOCKS), placement)
    most = first * 2 ** (kw.get("max_looks", stopping.MAX_LOOKS) - 1)
    per = block_cost_s(costs, calls, placement, kw.get("backend", "cpu"))
    lo, hi = 0.0, once_s(costs, placement) + (most + 1) * per
    if smallest_effect(costs, hi, **kw) > effect:
        return math.inf
    while hi - lo > tolerance_s:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if smallest_effect(costs, mid, **kw) <= effect else (mid, hi)
    return hi


def night(costs: Costs, hours: float, commits: int, **kw) -> Forecast:
    """One commit's forecast when a walk of `commits` commits has `hours`: budget_s = hours * 3600 / commits, the
    whole night split evenly with nothing kept back (builds, the walk's own bookkeeping: a caller that knows those
    subtracts them from `hours` first). Keywords: forecast's."""
    return forecast(costs, budget_s=hours * 3600 / commits, **kw)
