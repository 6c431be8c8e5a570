"""paired.allocation against brute force: the two-stage optimum against a simulated search over calls a start, and
the forecast against the real stopping rule driven by synthetic blocks drawn from the same model.

Three stacks: the rig (start 240 s, call 17 s, starts spread 2%, rounds 1%; alternate), the 2-core CPU (start
12 s, call 0.5 s, 3% and 20%; together) and a GPU stand-in (start 85 s, call 0.3 s, 0.4% and 0.5%; both)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from b70bench import stats
from b70bench.decode import pair
from b70bench.paired import allocation as al
from b70bench.paired import placement, stopping
from b70bench.paired.blocks import MIN_ROUNDS_FOR_SE, ROUND_TRIM, Block

ALT, TOG = placement.ALTERNATE, placement.TOGETHER
RIG = al.Costs(start_s=240, call_s=17, block_sd=0.02, round_sd=0.01)
CPU = al.Costs(start_s=12, call_s=0.5, block_sd=0.03, round_sd=0.20)
GPU = al.Costs(start_s=85, call_s=0.3, block_sd=0.004, round_sd=0.005)
Z995 = NormalDist().inv_cdf(0.995)


def simulated_block_values(costs: al.Costs, where: str, grid: list[int], n: int, seed: int) -> dict[int, np.ndarray]:
    """n blocks' log B/A for each m in grid, read as the project reads a block: together the ROUND_TRIM-trimmed
    mean of its rounds' log ratios, alternate B's median call over A's (each call half a round's variance); plus
    the block's start offset. The same draws for every m (its first m rounds), so the m compare with less noise."""
    rng = np.random.default_rng(seed)
    offsets = rng.normal(0.0, costs.block_sd, n)
    top = max(grid)
    out = {}
    if where == TOG:
        rounds = rng.normal(0.0, costs.round_sd, (n, top))
        for m in grid:
            k = int(ROUND_TRIM * m)
            s = np.sort(rounds[:, :m], axis=1)[:, k : m - k]
            out[m] = s.mean(axis=1) + offsets
    else:
        a, b = (rng.normal(0.0, costs.round_sd / math.sqrt(2), (n, top)) for _ in range(2))
        for m in grid:
            out[m] = np.median(b[:, :m], axis=1) - np.median(a[:, :m], axis=1) + offsets
    return out


@pytest.mark.parametrize(
    ("costs", "where", "backend"),
    [(RIG, ALT, "cuda"), (CPU, TOG, "cpu"), (GPU, ALT, "cuda"), (GPU, TOG, "cuda")],
    ids=["rig-alternate", "cpu-together", "gpu-alternate", "gpu-together"],
)
def test_the_two_stage_optimum_costs_within_5_percent_of_the_simulated_best(costs, where, backend):
    """For each m, the seconds that bring the mean of blocks to one target variance: blocks = ceil(var(m) / target)
    from the simulated blocks' variance, each F + m c. The formula's m (unclamped) costs within 5% of the best m on a
    grid; where the default floor clamps it, the floor is given, named, and the simulated best lies below it."""
    free, _why = al.optimal_calls(costs, where, backend, floor=1)
    grid = sorted({1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 19, 22, 24, 26, 28, 31, 35, 40, 48, 56, 64, 80, 100, free})
    values = simulated_block_values(costs, where, grid, n=16000, seed=7)
    var = {m: float(np.var(v)) for m, v in values.items()}
    target = var[free] / 200  # about 200 blocks: ceil's step stays under 1%
    cost = {m: math.ceil(var[m] / target) * al.block_cost_s(costs, m, where, backend) for m in grid}
    best = min(cost, key=cost.get)
    assert cost[free] <= 1.05 * cost[best], (free, best, cost[free] / cost[best])
    m, why = al.optimal_calls(costs, where, backend)
    least = al.LEAST_ALTERNATE_CALLS if where == ALT else MIN_ROUNDS_FOR_SE
    if free < least:
        assert m == least and f"floor {least}" in why and best < least, (m, why, best)
    else:
        assert m == free and "floor" not in why
    # The model's variance matches the simulated blocks' at the chosen m (the median's pi/2 included).
    assert var[free] == pytest.approx(al.block_var(costs, free, where), rel=0.08)


def test_the_rig_is_clamped_by_the_floor_and_the_cpu_is_not():
    m, why = al.optimal_calls(RIG, ALT, "cuda")
    assert m == 4 and why == (
        "4 calls a start: a start costs 240 s against 17 s a call, and a block's B/A spreads 2% beyond its calls "
        "against 1% a round (two-stage optimum 2.6, floor 4)"
    )
    m, why = al.optimal_calls(CPU, TOG)
    assert (
        m == 26
        and "12 s against 0.5 s a call" in why
        and "3% beyond its calls against 20% a round" in why
        and "optimum 25.8)" in why
    )


def test_optimal_calls_floor_cap_and_zero_spreads():
    m, why = al.optimal_calls(CPU, TOG, floor=8, cap=20)
    assert m == 20 and why.endswith("(two-stage optimum 25.8, cap 20)")
    assert al.optimal_calls(CPU, TOG, floor=30)[0] == 30
    flat = al.Costs(start_s=10, call_s=1, block_sd=0.0, round_sd=0.05)
    m, why = al.optimal_calls(flat, TOG)
    assert m == al.MOST_CALLS == 4 * pair.DEFAULT_ROUNDS and "block_sd 0" in why and "cap" in why
    still = al.Costs(start_s=10, call_s=1, block_sd=0.02, round_sd=0.0)
    m, why = al.optimal_calls(still, ALT)
    assert m == al.LEAST_ALTERNATE_CALLS == 4 and "round_sd 0" in why and "floor" in why
    assert al.optimal_calls(still, TOG)[0] == MIN_ROUNDS_FOR_SE
    with pytest.raises(ValueError, match="floor <= cap"):
        al.optimal_calls(CPU, TOG, floor=50, cap=40)


def test_costs_follow_the_one_cost_rule():
    """A block is stopping.block_s (the rule first_look_s sums); alternate pays its warm starts once, and a cold
    start its extra seconds."""
    assert al.block_cost_s(RIG, 4, ALT, "cuda") == 2 * (240 + 7 * 17)
    assert al.block_cost_s(CPU, 26, TOG, "cpu") == 12 + 2 * 29 * 0.5
    assert al.block_cost_s(GPU, 24, TOG, "cuda") == pytest.approx(2 * 85 + 2 * 27 * 0.3)
    assert stopping.first_look_s(240, 17, 7, 4, ALT) == 7 * al.block_cost_s(RIG, 4, ALT)
    assert al.once_s(RIG, ALT) == 2 * (240 + 17) and al.once_s(CPU, TOG) == 0
    cold = al.Costs(start_s=240, call_s=17, block_sd=0.02, round_sd=0.01, cold_s=900)
    assert al.once_s(cold, ALT) == 2 * 257 + 660 and al.once_s(cold, TOG) == 660


def test_half_width_is_the_projects_own_interval():
    """At blocks whose values sit at their modelled spread the decision's own interval is the forecast's."""
    se = CPU.round_sd / math.sqrt(26)
    # Together: blocks_interval with tau at max(block_sd, the offset floor); two blocks take the two-block floor.
    got = al.half_width(CPU, 26, 8, 0.99, TOG)
    want = Z995 * math.sqrt((se**2 + 0.03**2) / 8)
    assert got == pytest.approx(want, rel=1e-9)
    two = al.half_width(GPU, 24, 2, 0.99, TOG)
    assert two == pytest.approx(Z995 * math.sqrt((0.005**2 / 24 + stats.TWO_BLOCKS_OFFSET_SD**2) / 2))
    # Alternate: the t over the block values, which paired_interval gives values of that spread.
    var = al.block_var(RIG, 4, ALT)
    logs = [math.sqrt(var), -math.sqrt(var)] * 3  # sample sd sqrt(var * 6 / 5)
    r = stats.paired_interval([math.exp(x) for x in logs], 0.99)
    assert al.half_width(RIG, 4, 6, 0.99, ALT) * math.sqrt(6 / 5) == pytest.approx(math.log(r.hi), rel=1e-9)
    assert al.half_width(RIG, 4, 1, 0.99, ALT) == math.inf


def never_deciding(costs_s: list[float]):
    """run_one for stopping.measure: blocks that disagree (1.3 and 1/1.3), so every look is undecided; block i
    costs costs_s[min(i, last)]."""
    now = [0.0]

    def run_one(i):
        wall = costs_s[min(i, len(costs_s) - 1)]
        now[0] += wall
        r = 1.3 if i % 2 else 1 / 1.3
        calls = [{"side": s, "round": k, "latency_s": r if s == "B" else 1.0} for k in range(8) for s in "AB"]
        return Block(i, calls=calls, wall_s=wall)

    return run_one, now


@pytest.mark.parametrize("where", [ALT, TOG])
def test_the_forecasts_looks_are_stopping_measures_own(where):
    """For budgets from below the first block to past every look, an undecided measurement looks at the blocks
    the forecast says, and spends its minutes."""
    per, once = al.block_cost_s(RIG, 4, where, "cuda"), al.once_s(RIG, where)
    for budget in [100, 700, 1300, 3000, 5000, 7200, 9000, 15000, 30000, 60000]:
        run_one, now = never_deciding([per + once, per])
        seen = []
        res = stopping.measure(
            run_one, budget_s=budget, level=0.99, min_effect=0.0, floor=0.02,
            first_blocks=stopping.first_look_blocks(4, where), out=lambda _l: None, clock=lambda now=now: now[0],
            on_look=seen.append,
        )  # fmt: skip
        f = al.forecast(RIG, budget_s=budget, placement=where, backend="cuda", calls=4)
        assert list(f.looks) == seen, (budget, f.looks, seen, res.reason)
        assert f.minutes == pytest.approx(res.minutes)


def synthetic(costs, where, calls, effect, rng, per, once, jitter=0.05):
    """run_one drawing blocks from the model: a start offset N(0, block_sd) on log B/A; together each round's log
    B/A N(offset + log(1 + effect), round_sd), alternate each side's calls half that variance; each block's seconds
    its modelled cost (the first with once_s) times a 5% jitter, on a fake clock."""
    now = [0.0]
    shift = math.log1p(effect)

    def run_one(i):
        off = rng.normal(0.0, costs.block_sd)
        if where == TOG:
            b = np.exp(rng.normal(off + shift, costs.round_sd, calls))
            a = np.ones(calls)
        else:
            sd = costs.round_sd / math.sqrt(2)
            a, b = np.exp(rng.normal(0.0, sd, calls)), np.exp(rng.normal(off + shift, sd, calls))
        block = Block(i, placement=where)
        for r in range(calls):
            block.calls += [{"side": "A", "round": r, "latency_s": float(a[r])}]
            block.calls += [{"side": "B", "round": r, "latency_s": float(b[r])}]
        block.wall_s = (per + (once if i == 0 else 0.0)) * math.exp(rng.normal(0.0, jitter))
        now[0] += block.wall_s
        return block

    return run_one, now


def walks(costs, where, backend, budget_s, effect, n, seed, min_effect):
    f = al.forecast(costs, budget_s=budget_s, placement=where, backend=backend)
    per, once = al.block_cost_s(costs, f.calls, where, backend), al.once_s(costs, where)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        run_one, now = synthetic(costs, where, f.calls, effect, rng, per, once)
        out.append(
            stopping.measure(
                run_one, budget_s=budget_s, level=stopping.per_look_level(stopping.DEFAULT_LEVEL),
                min_effect=min_effect, floor=stats.DEFAULT_FLOOR,
                first_blocks=stopping.first_look_blocks(stopping.DEFAULT_FIRST_BLOCKS, where),
                out=lambda _l: None, clock=lambda now=now: now[0],
            )
        )  # fmt: skip
    return f, out


@pytest.mark.parametrize(
    ("costs", "where", "backend", "budget_s"),
    [(CPU, TOG, "cpu", 600.0), (RIG, ALT, "cuda", 7200.0)],
    ids=["cpu-together-10min", "rig-alternate-2h"],
)
def test_the_forecast_matches_walks_of_the_real_stopping_rule(costs, where, backend, budget_s):
    """A/A walks that can never read "no change" (min_effect 0) run undecided to the end: their minutes are the
    forecast's within 10%, and they name a change no more often than the overall level allows (5%; at most 10% of
    120 here). A slowdown of the forecast's `names` is named slower in at least 70% of walks (4 in 5 forecast);
    twice that in nearly all. With min_effect at the forecast's `clears`, most A/A walks end "no change"."""
    f, same = walks(costs, where, backend, budget_s, 0.0, 120, seed=1, min_effect=0.0)
    assert 0.02 < f.names < 0.06 and f.rules_out < f.names, f.text()
    minutes = [r.minutes for r in same if not (r.decision and r.decision.named)]
    assert sum(minutes) / len(minutes) == pytest.approx(f.minutes, rel=0.10), (f.minutes, minutes)
    assert sum(bool(r.decision and r.decision.named) for r in same) <= 12, [r.text() for r in same]
    _, slow = walks(costs, where, backend, budget_s, f.names, 120, seed=2, min_effect=0.0)
    named = sum(r.decision.word == stats.SLOWER for r in slow) / len(slow)
    assert named >= 0.7, (f.text(), named)
    _, twice = walks(costs, where, backend, budget_s, 2 * f.names, 60, seed=3, min_effect=0.0)
    assert sum(r.decision.word == stats.SLOWER for r in twice) >= 57
    # At min_effect = clears an A/A reads "no change" 4 times in 5 by the forecast; the spread a measurement
    # estimates from few blocks varies, which the forecast (at the modelled spread) leaves out: about 3 in 4 here.
    _, quiet = walks(costs, where, backend, budget_s, 0.0, 80, seed=4, min_effect=f.clears)
    assert sum(r.decision.word == stats.NO_CHANGE for r in quiet) >= 52


def test_budget_for_is_monotone_and_least():
    for costs, where, backend in ((CPU, TOG, "cpu"), (RIG, ALT, "cuda"), (GPU, ALT, "cuda")):
        budgets = [al.budget_for(costs, e, placement=where, backend=backend) for e in (0.03, 0.04, 0.05, 0.08, 0.2)]
        finite = [b for b in budgets if math.isfinite(b)]
        assert finite == sorted(finite, reverse=True) and len(finite) >= 3, budgets
        for e, b in zip((0.03, 0.04, 0.05, 0.08, 0.2), budgets, strict=True):
            if math.isfinite(b):
                assert al.smallest_effect(costs, b, placement=where, backend=backend) <= e
                assert al.smallest_effect(costs, b - 2.0, placement=where, backend=backend) > e
                assert al.forecast(costs, budget_s=b, placement=where, backend=backend).names <= e
    # Every look taken still names more than 1%: no budget does.
    assert al.budget_for(RIG, 0.01, placement=ALT, backend="cuda") == math.inf


def test_night_splits_the_hours_over_the_commits():
    f = al.night(RIG, 10, 5, placement=ALT, backend="cuda")
    assert f.budget_s == 7200 and f == al.forecast(RIG, budget_s=7200, placement=ALT, backend="cuda")
    assert f.looks == (6, 9) and f.calls == 4 and "no change beyond 3.2% and a slowdown of 2.9% is named" in f.text()
    assert f.first_look_minutes == pytest.approx((al.once_s(RIG, ALT) + 6 * 718) / 60)
    assert f.decides(0.05) and not f.decides(0.02) and not f.decides(0.03)  # names 2.9%, clears 3.2%
    assert f.rules_out < f.clears and f.rules_out < f.names
