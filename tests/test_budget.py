"""decode.budget: where a decode measurement's calls a start, budget and smallest change come from (the variables,
the stack's calibration, what it states by hand, the defaults); the effect as a setting through to the verdicts;
revisions --night and --min-effect."""

from __future__ import annotations

import argparse
import math
import os
import time

import pytest

from b70bench import revisions, stats, verdicts
from b70bench.decode import budget
from b70bench.errors import UsageError
from b70bench.paired import allocation, stopping
from b70bench.stack import calibration, description

# A rig-like calibration: starts of four minutes, calls of 17 s, starts spreading 1.4% (the seeds' warm band).
RIG = dict(start_warm_s=240.0, start_cold_s=420.0, call_s=17.0, start_sd=0.01, call_sd=0.004, block_sd=0.014,
           round_sd=0.006)  # fmt: skip


def stack_with(tmp_path, text: str = "", placement: str = "alternate", **figures) -> description.Stack:
    path = tmp_path / "rig.toml"
    path.write_text('model = "embedded"\nbackend = "cpu"\n' + text)
    stack = description.load(path)
    if figures:
        cal = calibration.Calibration(
            stack_hash=stack.hash(), placement=placement, backend="cpu", shape="p128n128", starts_per_side=3,
            calls_per_start=8, blocks=3, date="2026-12-07T00:00:00+00:00", machine="host", commit="abc",
            vllm=None, **figures,
        )  # fmt: skip
        target = calibration.path_for(stack)
        calibration.save(cal, target)
        # The calibration is newer than the stack file (written after it).
        os.utime(target, ns=(time.time_ns(), path.stat().st_mtime_ns + 10**9))
    return stack


def walk(stack, where="alternate", **env):
    return budget.decide(
        stack, "cpu", level=stopping.WALK_LEVEL, first_blocks=stopping.WALK_FIRST_BLOCKS, where=where,
        **env,
    )  # fmt: skip


def test_uncalibrated_stack_keeps_the_defaults(tmp_path):
    b = walk(stack_with(tmp_path), where="together")
    assert (b.rounds, b.budget_min, b.min_effect) == (budget.DEFAULT_ROUNDS, stopping.DEFAULT_BUDGET_MIN, 0.05)
    assert b.costs is None and b.forecast is None
    assert "not calibrated" in b.calibration_lines[0]
    assert b.forecast_lines() == []


def test_hand_stated_costs_size_rounds_and_budget_as_before(tmp_path):
    b = walk(stack_with(tmp_path, "start_s = 60\ncall_s = 0.5\n"))
    assert b.rounds == 60  # half a start of calls
    first = stopping.first_look_s(60, 0.5, 63, stopping.WALK_FIRST_BLOCKS, "alternate", "cpu")
    assert b.budget_min == stopping.default_budget_min(first)


def test_calibrated_stack_takes_the_two_stage_optimum_and_names_what_its_budget_decides(tmp_path):
    stack = stack_with(tmp_path, **RIG)
    b = walk(stack)
    costs = allocation.Costs(240.0, 17.0, 0.014, 0.006, cold_s=420.0, warmup_calls=3)
    assert b.costs == costs
    assert (b.rounds, b.rounds_why) == allocation.optimal_calls(costs, "alternate", "cpu")
    assert b.rounds < 24  # calls past a few buy little where starts spread and cost this much
    # No stated effect: the budget is the first look and one doubling; the effect is what it names, rounded up.
    f = b.forecast
    assert f is not None and b.budget_min * 60 == pytest.approx(f.budget_s)
    assert b.min_effect == pytest.approx(math.ceil(f.names * 1000) / 1000)
    assert b.effect_why == "what the calibrated spread names here"
    assert any("4 times in 5" in line for line in b.forecast_lines())


def test_stated_effect_gives_the_budget_it_needs(tmp_path):
    stack = stack_with(tmp_path, "min_effect = 0.03\n", **RIG)
    b = walk(stack)
    assert (b.min_effect, b.effect_why) == (0.03, "the stack's min_effect")
    assert b.forecast.names <= 0.03
    shorter = allocation.forecast(b.costs, budget_s=(b.budget_min - 1) * 60, placement="alternate", calls=b.rounds,
                                  level=stopping.WALK_LEVEL, first_blocks=stopping.WALK_FIRST_BLOCKS)  # fmt: skip
    assert shorter.names > 0.03 * 0.98  # a minute less (rounded up to whole minutes) names no less
    assert not any(line.startswith("  short") for line in b.forecast_lines())


def test_a_night_too_short_for_the_stated_effect_says_so(tmp_path):
    # The embedded model's two engines fit this host: the walk places them together, as calibrated here.
    stack = stack_with(tmp_path, "min_effect = 0.01\n", placement="together", **RIG)
    b = budget.walk_budget(stack, "cpu", {budget.BUDGET_ENV: "30"})
    assert b.costs is not None
    assert (b.budget_min, b.budget_why) == (30.0, budget.BUDGET_ENV)
    short = [line for line in b.forecast_lines() if line.startswith("  short")]
    assert short and "not the 1% asked" in short[0]


def test_variables_win_over_the_calibration(tmp_path):
    stack = stack_with(tmp_path, **RIG)
    env = {budget.ROUNDS_ENV: "12", budget.BUDGET_ENV: "45", stopping.MIN_EFFECT_ENV: "0.025"}
    b = budget.walk_budget(stack, "cpu", env)
    assert (b.rounds, b.budget_min, b.min_effect) == (12, 45.0, 0.025)
    assert b.rule() == stopping.Rule.walk(45 * 60, 12, 0.025)
    with pytest.raises(UsageError, match=stopping.MIN_EFFECT_ENV):
        budget.walk_budget(stack, "cpu", {stopping.MIN_EFFECT_ENV: "5"})


def test_stale_or_other_placement_calibration_is_not_used(tmp_path):
    stack = stack_with(tmp_path, **RIG)
    later = calibration.path_for(stack).stat().st_mtime_ns + 10**9
    os.utime(stack.source, ns=(later, later))
    b = walk(description.load(stack.source))
    assert b.costs is None and any("older than the stack file" in line for line in b.calibration_lines)

    (tmp_path / "t").mkdir()
    b = walk(stack_with(tmp_path / "t", placement="together", **RIG), where="alternate")
    assert b.costs is None and any("calibrated together" in line for line in b.calibration_lines)


def test_stack_min_effect_is_a_setting_not_part_of_what_is_measured(tmp_path):
    a = stack_with(tmp_path)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "rig.toml").write_text('model = "embedded"\nbackend = "cpu"\nmin_effect = 0.02\n')
    b = description.load(tmp_path / "e" / "rig.toml")
    assert b.min_effect == 0.02 and a.hash() == b.hash()
    (tmp_path / "bad.toml").write_text("min_effect = 2\n")
    with pytest.raises(UsageError, match="min_effect = 2"):
        description.load(tmp_path / "bad.toml")


def test_floor_never_exceeds_the_effect():
    # A resolved 1.5% slowdown: below the default floor (2%) it reads "no change beyond 2.5%" at 5%; at a 1% setting
    # it is named, never left undecided however long it sampled.
    r = stats.Ratio(1.015, 1.005, 1.025, 0.95, 8, 8)
    assert r.decide(0.05, 0.02).word == stats.NO_CHANGE
    assert r.decide(0.01, 0.02).word == stats.SLOWER
    # At a 2% setting the same interval holds a 2% change: undecided, not "no change beyond 2.5%".
    assert stats.Ratio(1.012, 0.999, 1.025, 0.95, 8, 8).decide(0.02, 0.02).word == stats.UNDECIDED


def test_each_commit_is_decided_at_its_own_measurement_effect():
    # As the CPU case (1.020 [0.997, 1.045] read "no change beyond 4.5%" at 5%): 1.015 [1.006, 1.025] reads
    # "no change beyond 2.5%" at the page's 5%, undecided where its walk measured at 2%.
    blocks = tuple(1.015 * math.exp(x) for x in (-0.012, -0.008, -0.004, 0.0, 0.0, 0.004, 0.008, 0.012))
    base = verdicts.Point(1, "c1", blocks)
    at_two = verdicts.Point(1, "c1", blocks, min_effect=0.02)
    assert verdicts.paired([base], level=0.95)[0].verdict == stats.NO_CHANGE
    got = verdicts.paired([at_two], level=0.95)[0]
    assert got.verdict == stats.UNDECIDED and "2% change" in got.text


def _night_args(hours, effect=None):
    return argparse.Namespace(night=hours, min_effect=effect)


def test_night_spreads_hours_over_commits_and_walks_decode_alone(tmp_path, monkeypatch):
    # night() sets the walk's variables in this process, as revisions does for asv's: undone after the test.
    for k in (budget.BUDGET_ENV, stopping.MIN_EFFECT_ENV):
        monkeypatch.setenv(k, "")
    monkeypatch.delenv("B70BENCH_DECODE_SHAPES", raising=False)
    stack = stack_with(tmp_path, 'shapes = ["p512n256"]\n')
    inputs = {}
    args = revisions.night(_night_args(10, 0.03), [], stack, 10, inputs)
    assert args == ["--bench", revisions.NIGHT_SUITES]
    assert os.environ[budget.BUDGET_ENV] == "60.00" and os.environ[stopping.MIN_EFFECT_ENV] == "0.03"
    assert inputs == {"min_effect": 0.03, "night_h": 10}
    # Suites named by hand stay; a second budget is refused; a night too short for a verdict is refused.
    assert revisions.night(_night_args(None), ["--bench", "Serve"], stack, 10, {}) == ["--bench", "Serve"]
    with pytest.raises(UsageError, match="both set a decode budget"):
        revisions.night(_night_args(10), [], stack, 10, {})
    monkeypatch.delenv(budget.BUDGET_ENV)
    with pytest.raises(UsageError, match="decides nothing"):
        revisions.night(_night_args(0.2), [], stack, 10, {})
    with pytest.raises(UsageError, match="--min-effect 3"):
        revisions.night(_night_args(None, 3.0), [], stack, 10, {})
