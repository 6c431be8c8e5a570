"""What a decode measurement (compare's, bisect's, a walked commit's shape) spends and decides: timed calls a start,
the budget, the smallest change it must decide, and the forecast that ties them together.

Each comes from the first of: what the run sets (compare's options; for a walk its variables, which revisions sets
for --night and --min-effect), the stack's calibration (`b70bench calibrate`: measured costs and spreads,
paired.allocation's two-stage optimum), what the stack file states by hand (start_s, call_s, min_effect), the
defaults. compare, bisect, the asv adapter, `revisions --plan` and the walk design all read decide(), so a plan prints
what the measurement then does.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from b70bench import stats
from b70bench.decode.pair import DEFAULT_ROUNDS, DEFAULT_WARMUP_CALLS
from b70bench.errors import UsageError
from b70bench.paired import allocation, stopping
from b70bench.paired import placement as placements
from b70bench.paired.blocks import MIN_ROUNDS_FOR_SE
from b70bench.stack import calibration
from b70bench.stack.description import Stack

ROUNDS_ENV, BUDGET_ENV = "B70BENCH_DECODE_ROUNDS", "B70BENCH_DECODE_BUDGET_MIN"
# Where starts are one at a time and the stack states their cost by hand (no calibration): calls for about half a
# start, at least what a block's own standard error needs.
LEAST_HAND_ROUNDS = MIN_ROUNDS_FOR_SE


@dataclass(frozen=True)
class Budget:
    """One decode measurement's calls a start, budget and smallest change to decide, and where each comes from (the
    plans print the whys)."""

    placement: str
    backend: str
    rounds: int
    rounds_why: str
    budget_min: float
    budget_why: str
    min_effect: float
    effect_why: str
    level: float
    first_blocks: int
    costs: allocation.Costs | None  # from a current calibration of this placement, else None
    calibration_lines: tuple[str, ...]
    forecast: allocation.Forecast | None

    def rule(self) -> stopping.Rule:
        """The walk's stopping rule for this measurement."""
        return stopping.Rule.walk(self.budget_min * 60, self.rounds, self.min_effect)

    def forecast_lines(self) -> list[str]:
        """What this budget decides at the calibrated spread (the plan's promise), or why nothing is forecast."""
        f = self.forecast
        if f is None:  # the calibration's line says why
            return []
        lines = [
            f"  forecast at the calibrated spread: at most {f.blocks} blocks ({f.minutes:.0f} min), the first look "
            f"~{f.first_look_minutes:.0f} min; 4 times in 5 a {f.names:.1%} slowdown is named and a no-op reads no "
            f"change beyond {f.clears:.1%}"
        ]
        if f.names > self.min_effect:
            need = allocation.budget_for(self.costs, self.min_effect, **self._shape())
            needs = f"~{math.ceil(need / 60)} min a shape" if math.isfinite(need) else "more looks than the rule takes"
            lines.append(
                f"  short: {self.budget_min:g} min names {f.names:.1%}, not the {stats._pct(self.min_effect)} asked "
                f"({self.effect_why}); that needs {needs}: expect undecided rows"
            )
        return lines

    def _shape(self) -> dict:
        return dict(placement=self.placement, backend=self.backend, calls=self.rounds, level=self.level,
                    first_blocks=self.first_blocks, floor=min(stats.DEFAULT_FLOOR, self.min_effect))  # fmt: skip


def costs_of(stack: Stack, where: str) -> tuple[allocation.Costs | None, tuple[str, ...]]:
    """The calibrated costs and spreads where the stack's calibration is current and was measured in this placement
    (a together calibration says nothing of starts one at a time), and the lines a plan prints about it."""
    cal, why = calibration.for_stack(stack)
    lines = tuple(calibration.describe_lines(cal, why))
    if cal is None or why is not None:
        return None, lines
    if cal.placement != where:
        return None, (*lines, f"  not used: calibrated {cal.placement}, measured here {where}; calibrate again")
    return allocation.Costs(
        start_s=cal.start_warm_s,
        call_s=cal.call_s,
        block_sd=cal.block_sd,
        round_sd=cal.round_sd,
        cold_s=cal.start_cold_s,
        warmup_calls=DEFAULT_WARMUP_CALLS,
    ), lines


def _rounds(stack: Stack, where: str, backend: str, costs) -> tuple[int, str]:
    if costs is not None:
        return allocation.optimal_calls(costs, where, backend)
    if stack.start_s and stack.call_s and where == placements.ALTERNATE:
        fit = int(stack.start_s / (2 * stack.call_s))
        return max(LEAST_HAND_ROUNDS, min(DEFAULT_ROUNDS, fit)), "calls for half the stack's start_s (not calibrated)"
    return DEFAULT_ROUNDS, "the default"


def decide(
    stack: Stack,
    backend: str,
    *,
    level: float,
    first_blocks: int,
    where: str | None = None,
    rounds: tuple[int, str] | None = None,
    budget_min: tuple[float, str] | None = None,
    min_effect: tuple[float, str] | None = None,
) -> Budget:
    """A decode measurement's calls a start, budget and effect on `stack` here: each as given (value, why), else from
    the stack's calibration, else from what it states by hand, else the default; the forecast where calibrated.
    compare and bisect give their options; the walk gives its variables (walk_budget)."""
    if where is None:
        where, _why = placements.choose(placements.AUTO, backend, stack)
    costs, lines = costs_of(stack, where)
    if rounds is None:
        rounds = _rounds(stack, where, backend, costs)
    if min_effect is None:
        stated = stopping.effect_from(stack.min_effect, {})
        min_effect = stated if stated[0] is not None else None
    floor = min(stats.DEFAULT_FLOOR, min_effect[0]) if min_effect else stats.DEFAULT_FLOOR
    shape_of = dict(placement=where, backend=backend, calls=rounds[0], level=level, first_blocks=first_blocks,
                    floor=floor)  # fmt: skip

    if budget_min is None:
        need = allocation.budget_for(costs, min_effect[0], **shape_of) if costs and min_effect else math.inf
        if math.isfinite(need):
            budget_min = (
                max(stopping.MIN_BUDGET_MIN, math.ceil(need / 60)),
                f"what names a {stats._pct(min_effect[0])} change at the calibrated spread",
            )
        elif costs is not None:
            # No stated effect, or one no budget names (every look taken): the first look and one doubling.
            first = allocation.once_s(costs, where) + stopping.first_look_blocks(
                first_blocks, where
            ) * allocation.block_cost_s(costs, rounds[0], where, backend)
            budget_min = stopping.default_budget_min(first), "the first look and one doubling at the calibrated costs"
        elif stack.start_s and stack.call_s is not None:
            calls = rounds[0] + DEFAULT_WARMUP_CALLS
            first = stopping.first_look_s(stack.start_s, stack.call_s, calls, first_blocks, where, backend)
            why = (
                f"the first look and one doubling at the stack's start {stack.start_s:g} s and call {stack.call_s:g} s"
            )
            budget_min = stopping.default_budget_min(first), why
        else:
            budget_min = stopping.DEFAULT_BUDGET_MIN, "the default"

    forecast = allocation.forecast(costs, budget_s=budget_min[0] * 60, **shape_of) if costs is not None else None
    if min_effect is None:
        if forecast is not None:
            # What this budget decides at the calibrated spread, rounded up to a tenth of a percent.
            min_effect = min(0.5, math.ceil(forecast.names * 1000) / 1000), "what the calibrated spread names here"
        else:
            min_effect = stats.DEFAULT_MIN_EFFECT, "the default"
    return Budget(where, backend, *rounds, *budget_min, *min_effect, level, first_blocks, costs, lines, forecast)


def walk_budget(stack: Stack, backend: str, environ=None) -> Budget:
    """The walk's decode measurement of one shape: its variables (ROUNDS_ENV, BUDGET_ENV, stopping.MIN_EFFECT_ENV)
    where set, else decide()'s order, at the walk's level and first look."""
    environ = os.environ if environ is None else environ
    rounds = budget = None
    text = environ.get(ROUNDS_ENV)
    if text:
        if not text.isdigit() or int(text) < 4:
            raise UsageError(f"{ROUNDS_ENV}={text!r}: set a whole number of paired rounds >= 4")
        rounds = int(text), ROUNDS_ENV
    if environ.get(BUDGET_ENV):
        minutes = stopping.budget_min_from_env(
            BUDGET_ENV, stopping.DEFAULT_BUDGET_MIN, stopping.MIN_BUDGET_MIN, environ
        )
        budget = minutes, BUDGET_ENV
    effect = stopping.effect_from(stack.min_effect, environ)
    return decide(
        stack,
        backend,
        level=stopping.WALK_LEVEL,
        first_blocks=stopping.WALK_FIRST_BLOCKS,
        rounds=rounds,
        budget_min=budget,
        min_effect=effect if effect[0] is not None else None,
    )
