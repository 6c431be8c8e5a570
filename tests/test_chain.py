"""A walk as one design (b70bench.paired.chain) with fake engines: the pass order, which starts feed which pair's
blocks, more passes only where undecided, a failed start, resume in the middle of a pass, and the starts it saves."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from b70bench import patches, stats
from b70bench.paired import chain, stopping
from b70bench.paired.stopping import per_look_level

LEVEL = per_look_level(0.95)
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import fakedist  # noqa: E402

MODEL_FILE = "fakevllm/models/minimax_m2.py"
TARGET = "dist:fakevllm==0.32.0"


@pytest.fixture
def fake_vllm(tmp_path):
    """A fake installed vLLM and an empty series (the installed vLLM as it is): (env, site, empty)."""
    (tmp_path / "wheel").mkdir()
    site = fakedist.install(fakedist.build_wheel(tmp_path / "wheel"), tmp_path / "site")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "series").write_text("")
    return patches.Env(tmp_path / "prefix", (str(site),)), site, empty


def stand_in_engines(monkeypatch, site):
    """(engines that stand in for vLLM from tests/fake_live.py, an engine class that fails if it is ever started:
    what a design replayed from its journal must never do)."""
    from b70bench.decode import pair

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(site)]))

    class FakeLive(pair.Engine):
        module = "fake_live"

    class NoStart(pair.Engine):
        def __init__(self, *a, **kw):
            raise AssertionError("a start the journal holds was started again")

    return FakeLive, NoStart


class Handle:
    def __init__(self, target, side: str, label: str):
        self.target, self.side, self.label = target, side, label
        self.n = 0

    def ready(self) -> dict:
        return {"pid": len(self.target.started), "token_sha256": "same", "label": self.label}

    def warm(self) -> None:
        self.target.warmed.append(self.label)

    def call(self) -> dict:
        self.n += 1
        return {"latency_s": self.target.latency(self.side, self.label, self.n), "probe_s": 1.0}

    def stop(self) -> list[int]:
        self.target.alive.remove(self.label)
        return []


class Fake:
    """Sides c0..cN whose calls take `speed[side]` seconds, times the host's drift (`drift`: a climb a start) and
    a small wobble; `noisy` sides move by `swing` between their starts; `fail` labels fail to start; `kill_at` stops
    the whole run (as a SIGKILL of the walk would) at that start; `hog` = (first, last, slowdown): every call of the
    starts numbered first..last (counting warm starts) is `slowdown` times slower, as a CPU hog beside them makes it."""

    errors = (RuntimeError,)
    backend = "cpu"

    def __init__(self, speed: dict, noisy=(), swing=0.3, fail=(), kill_at=None, hog=None, drift=0.002):
        self.speed, self.noisy, self.swing, self.fail, self.kill_at = speed, set(noisy), swing, set(fail), kill_at
        self.hog, self.drift = hog, drift
        self.started: list[str] = []
        self.warmed: list[str] = []  # the label of each warm-up call, in order
        self.alive: list[str] = []  # labels of the engines started and not yet stopped
        self.most_alive = 0

    def start(self, side: str, label: str) -> Handle:
        if self.kill_at is not None and len(self.started) == self.kill_at:
            raise KeyboardInterrupt
        self.started.append(label)
        if label in self.fail:
            raise RuntimeError(f"engine for {label} killed by SIGKILL before answering")
        self.alive.append(label)
        self.most_alive = max(self.most_alive, len(self.alive))
        return Handle(self, side, label)

    def latency(self, side: str, label: str, n: int) -> float:
        drift = 1.0 + self.drift * len(self.started)  # the host slows as the run goes on
        wobble = 1.0 + 0.002 * ((n * 7) % 5 - 2)
        swing = 1.0
        if side in self.noisy:
            swing = 1.0 + self.swing if len(self.started) % 2 else 1.0 - self.swing
        if self.hog and self.hog[0] <= len(self.started) <= self.hog[1]:
            swing *= self.hog[2]
        return self.speed[side] * drift * wobble * swing


def run(target, keys, **kw):
    args = dict(rounds=8, warmup_calls=1, budget_s=3600.0, level=LEVEL, min_effect=0.05, floor=0.02, out=lambda _: None)
    return chain.measure(target, keys, **{**args, **kw})


def test_passes_go_forward_then_back_and_each_pair_gets_the_adjacent_starts():
    keys = ["c0", "c1", "c2", "c3"]
    fake = Fake({k: 1.0 for k in keys})
    design = run(fake, keys, first_passes=2, max_looks=1)
    assert fake.started == [
        "warm-c0", "warm-c1", "warm-c2", "warm-c3",
        "pass00-c0", "pass00-c1", "pass00-c2", "pass00-c3",
        "pass01-c3", "pass01-c2", "pass01-c1", "pass01-c0",
    ]  # fmt: skip
    blocks = design.pairs["c2"].blocks
    assert [(b.starts["A"]["label"], b.starts["B"]["label"]) for b in blocks] == [
        ("pass00-c1", "pass00-c2"),
        ("pass01-c1", "pass01-c2"),
    ]
    assert design.all_starts == 12 and design.counted_starts == 8 and design.passes == 2


def test_a_slowdown_is_named_at_its_commit_only_with_fewer_starts_than_pairs_would_take():
    keys = [f"c{i}" for i in range(7)]
    speed = {k: 1.0 if i < 3 else 1.08 for i, k in enumerate(keys)}  # c3 is 8% slower than c2
    fake = Fake(speed)
    design = run(fake, keys)
    words = {k: design.pairs[k].decision.word for k in keys[1:]}
    assert words == {"c1": stats.NO_CHANGE, "c2": stats.NO_CHANGE, "c3": stats.SLOWER, "c4": stats.NO_CHANGE,
                     "c5": stats.NO_CHANGE, "c6": stats.NO_CHANGE}  # fmt: skip
    assert 1.07 < design.pairs["c3"].ratio.ratio < 1.09
    # Six walked commits: 7 warm + 6 passes x 7 = 49 starts; the per-pair design's first look is 6 x (2 + 12) = 84.
    assert design.all_starts == chain.least_starts(6) == 49
    assert design.all_starts <= 0.6 * 6 * (2 + 2 * chain.ALTERNATE_FIRST_BLOCKS)


def test_a_host_that_slows_start_by_start_is_cancelled_by_the_back_pass():
    """A host that slows 5% a start (a machine heating up, a neighbour's job growing): each forward block reads B
    a few percent slower than A and each back block as much faster, so only the two orders together leave the no-ops
    at 1 (forward passes alone named every one of them slower, 1.027)."""
    keys = [f"c{i}" for i in range(5)]
    design = run(Fake({k: 1.0 for k in keys}, drift=0.05), keys)
    forward = [b.ratio() for b in design.pairs["c2"].blocks[::2]]
    back = [b.ratio() for b in design.pairs["c2"].blocks[1::2]]
    assert min(forward) > 1.01 and max(back) < 0.99, (forward, back)  # the drift is there, block by block
    assert {k: design.pairs[k].decision.word for k in keys[1:]} == {k: stats.NO_CHANGE for k in keys[1:]}
    assert all(0.99 < design.pairs[k].ratio.ratio < 1.01 for k in keys[1:])


@pytest.mark.parametrize("first, last", [(9, 22), (14, 30), (30, 44), (20, 26)])
def test_a_hog_over_a_stretch_of_starts_names_no_noop_and_still_names_the_slowdown(first, last):
    """Drift injected as users meet it: a hog beside the engines for 7-17 whole starts (calls 1.3x slower), over the
    forward pass, across the turn, over the back pass. A pair whose block has one start under the hog and one not
    reads 1.3x off for that block; forward and back passes put it on both sides, so such pairs come out undecided at
    the first look and get more passes: the no-ops end "no change", the 8% slowdown is named at its size."""
    keys = [f"c{i}" for i in range(7)]
    speed = {k: 1.0 if i < 3 else 1.08 for i, k in enumerate(keys)}
    design = run(Fake(speed, hog=(first, last, 1.3)), keys)
    words = {k: design.pairs[k].decision.word for k in keys[1:]}
    assert words == {k: stats.SLOWER if k == "c3" else stats.NO_CHANGE for k in keys[1:]}, words
    assert 1.06 < design.pairs["c3"].ratio.ratio < 1.10
    assert design.all_starts > chain.least_starts(6)  # the hog's edges cost more passes, not a wrong word


class PairOf:
    """The per-pair walk's target over the same fake host: side A a commit's parent, side B the commit."""

    errors, backend = Fake.errors, Fake.backend

    def __init__(self, fake: Fake, parent: str, commit: str):
        self.fake, self.names = fake, {"A": parent, "B": commit}

    def start(self, side: str, label: str) -> Handle:
        return self.fake.start(self.names[side], f"{self.names[side]}-{label}")


@pytest.mark.parametrize("hog, share", [(None, 0.6), ((20, 60, 1.3), 0.75)])
def test_the_design_and_the_per_pair_walk_on_one_host_give_the_same_words_the_design_in_fewer_starts(
    tmp_path, hog, share
):
    """Six commits, one of them 8% slower, on one simulated host (its drift, and a hog over 40 starts): the per-pair
    walk as `revisions` runs it where two engines do not fit (alternate, a warm start a side, six blocks at the first
    look) and the design, by the same rule and level. Same words; the design takes at most 60% of the per-pair
    walk's starts, 75% with the hog, whose edges make undecided pairs that the design re-measures over whole runs of
    commits (its passes cover the shortest run of commits holding them, one start each)."""
    from b70bench.paired import placement, stopping

    keys = [f"c{i}" for i in range(7)]
    speed = {k: 1.0 if i < 3 else 1.08 for i, k in enumerate(keys)}
    pair_host = Fake(speed, hog=hog)
    per_pair = {}
    for parent, commit in zip(keys, keys[1:], strict=False):
        res = stopping.measure_target(
            PairOf(pair_host, parent, commit),
            placement.ALTERNATE,
            tmp_path,
            stopping.Rule(
                rounds=8,
                budget_s=3600.0,
                level=LEVEL,
                min_effect=0.05,
                floor=0.02,
                first_blocks=stopping.WALK_FIRST_BLOCKS,
            ),
            warmup_calls=1,
            out=lambda _: None,
        )
        per_pair[commit] = res.decision.word
    design_host = Fake(speed, hog=hog)
    design = run(design_host, keys)
    words = {k: design.pairs[k].decision.word for k in keys[1:]}
    assert per_pair == words == {k: stats.SLOWER if k == "c3" else stats.NO_CHANGE for k in keys[1:]}
    starts = (len(design_host.started), len(pair_host.started))
    assert starts[0] <= share * starts[1], starts


def test_only_undecided_pairs_get_more_passes_over_the_shortest_run_covering_them():
    keys = ["c0", "c1", "c2", "c3", "c4"]
    fake = Fake({k: 1.0 for k in keys}, noisy={"c3"}, swing=0.08)
    design = run(fake, keys, max_looks=2)
    first = len(keys) * (1 + chain.ALTERNATE_FIRST_BLOCKS)
    later = fake.started[first:]
    assert later and {label.split("-")[1] for label in later} == {"c2", "c3", "c4"}  # c3's two pairs, nothing else
    assert len(later) == 3 * chain.ALTERNATE_FIRST_BLOCKS  # the blocks of the undecided pairs doubled
    assert len(design.pairs["c1"].blocks) == chain.ALTERNATE_FIRST_BLOCKS
    assert len(design.pairs["c3"].blocks) == len(design.pairs["c4"].blocks) == 2 * chain.ALTERNATE_FIRST_BLOCKS
    for k in ("c3", "c4"):
        assert design.pairs[k].decision.word == stats.UNDECIDED
        assert design.pairs[k].reason == "2 looks taken, the most allowed"


def test_the_first_look_runs_whole_past_the_budget_and_later_passes_keep_to_it():
    # Each start costs 100 s of the fake clock; two of the first look's passes would spend the budget, yet a pair
    # is read from the whole first look (two blocks of a design are not a verdict), and then no pass fits.
    keys = ["c0", "c1", "c2", "c3"]
    fake = Fake({k: 1.0 for k in keys}, noisy={"c2"}, swing=0.08)
    design = run(fake, keys, first_passes=3, budget_s=700.0, clock=lambda: 100.0 * len(fake.started))
    assert design.passes == 3 and len(fake.started) == 4 + 3 * 4
    assert all(len(design.pairs[k].blocks) == 3 for k in keys[1:])
    assert design.pairs["c2"].decision.word == stats.UNDECIDED
    assert design.pairs["c2"].reason == "the budget (11.7 min) allows no further pass"
    # A budget with room for one more pass gets it: the undecided pairs' run of commits (c1 c2 c3), 3 starts.
    fake = Fake({k: 1.0 for k in keys}, noisy={"c2"}, swing=0.08)
    design = run(fake, keys, first_passes=3, budget_s=1900.0, clock=lambda: 100.0 * len(fake.started))
    assert len(fake.started) == 4 + 3 * 4 + 3


def test_the_next_pass_is_costed_at_the_latest_pass_not_the_cold_first_one():
    starts = [chain.Start("c0", 0, 0, wall_s=300.0), chain.Start("c1", 0, 1, wall_s=300.0)]
    starts += [chain.Start("c0", 1, 0, wall_s=60.0), chain.Start("c1", 1, 1, wall_s=80.0)]
    assert chain._pass_cost(starts, 3) == pytest.approx(210.0)
    assert chain._pass_cost([chain.Start("c0", chain.WARM, 0, wall_s=50.0)], 2) == 0.0


def test_a_failed_start_loses_its_two_pairs_with_the_cause_and_the_rest_are_decided():
    keys = ["c0", "c1", "c2", "c3"]
    fake = Fake({k: 1.0 for k in keys}, fail={"pass01-c2"})
    design = run(fake, keys)
    for k in ("c2", "c3"):
        assert design.pairs[k].lost
        assert design.pairs[k].reason == (
            "pass 2: c2's start failed: engine for pass01-c2 killed by SIGKILL before answering"
        )
    assert not design.pairs["c1"].lost and design.pairs["c1"].decision.word == stats.NO_CHANGE
    assert "pass02-c2" not in fake.started and "pass02-c3" not in fake.started  # no more passes for lost pairs


def test_a_run_killed_in_the_middle_of_a_pass_resumes_at_the_next_start():
    keys = ["c0", "c1", "c2", "c3"]
    speed = {"c0": 1.0, "c1": 1.0, "c2": 1.1, "c3": 1.1}
    whole = run(Fake(speed), keys)
    recorded: list[chain.Start] = []
    with pytest.raises(KeyboardInterrupt):
        run(Fake(speed, kill_at=10), keys, record=recorded.append)  # 4 warm, pass 1, 2 starts of pass 2
    assert [(s.pass_index, s.position) for s in recorded][-2:] == [(1, 0), (1, 1)]
    again = Fake(speed)
    resumed = run(again, keys, done=[chain.Start.from_json(s.to_json()) for s in recorded])
    assert again.started[0] == "pass01-c1"  # the third start of the second pass (backward: c3 c2 c1 c0)
    assert len(recorded) + len(again.started) == len(whole.starts)
    assert {k: p.decision.word for k, p in resumed.pairs.items()} == {
        k: p.decision.word for k, p in whole.pairs.items()
    }


TOGETHER = dict(placement="together", first_passes=stopping.first_look_blocks(3, "together"), rounds=24)


def test_together_keeps_two_engines_alive_and_each_start_serves_both_neighbours():
    keys = ["c0", "c1", "c2", "c3"]
    fake = Fake({k: 1.0 for k in keys})
    design = run(fake, keys, **{**TOGETHER, "first_passes": 2, "max_looks": 1})
    assert fake.started == [
        "pass00-c0", "pass00-c1", "pass00-c2", "pass00-c3",
        "pass01-c3", "pass01-c2", "pass01-c1", "pass01-c0",
    ]  # fmt: skip
    assert fake.most_alive == 2 and fake.alive == []  # no warm starts; every engine stopped
    blocks = design.pairs["c2"].blocks
    assert [(b.starts["A"]["label"], b.starts["B"]["label"], b.placement) for b in blocks] == [
        ("pass00-c1", "pass00-c2", "together"),
        ("pass01-c1", "pass01-c2", "together"),
    ]
    # c2's start of the first pass: its rounds with c1, then with c3, each round's calls one after the other.
    c2 = next(s for s in design.starts if s.side == "c2" and s.pass_index == 0)
    assert [c["with"] for c in c2.calls] == ["c1"] * 24 + ["c3"] * 24
    first = blocks[0]
    assert [c["round"] for c in first.calls if c["side"] == "A"] == list(range(24))
    assert len(first.ratios()) == 24 and design.all_starts == 8
    # Before each pair's rounds both engines are warmed in turns (the earlier one sat idle through the later one's
    # start): an engine in the middle of a pass twice, the pass's ends once.
    assert fake.warmed[:2] == ["pass00-c1", "pass00-c0"]  # one warm-up each, in the turn before round 0's
    assert {fake.warmed.count(f"pass00-{k}") for k in ("c1", "c2")} == {2}
    assert {fake.warmed.count(f"pass00-{k}") for k in ("c0", "c3")} == {1}


def test_a_designs_blocks_lean_on_no_standard_error_of_their_rounds():
    """A pair's two processes in a design were started a start or more apart: as an alternate block's, their rounds
    say nothing of the offset between them, so the interval comes from the blocks' spread (t over block values)."""
    from b70bench.paired.blocks import block_ses

    keys = ["c0", "c1", "c2"]
    design = run(Fake({k: 1.0 for k in keys}), keys, **{**TOGETHER, "max_looks": 1})
    blocks = design.pairs["c1"].blocks
    assert blocks and all(b.started_apart and b.placement == "together" for b in blocks)
    assert block_ses(blocks) == [None] * len(blocks)


def test_together_names_the_slowdown_in_under_60_percent_of_the_per_pair_walks_starts():
    keys = [f"c{i}" for i in range(7)]
    speed = {k: 1.0 if i < 3 else 1.08 for i, k in enumerate(keys)}
    design = run(Fake(speed, drift=0.01), keys, **TOGETHER)
    words = {k: design.pairs[k].decision.word for k in keys[1:]}
    assert words == {k: stats.SLOWER if k == "c3" else stats.NO_CHANGE for k in keys[1:]}, words
    assert 1.07 < design.pairs["c3"].ratio.ratio < 1.09
    # 7 commits x 3 passes = 21 starts; the per-pair walk together: 6 pairs x 3 blocks x 2 starts = 36.
    per_pair = 6 * stopping.least_starts(3, "together")
    assert design.all_starts == chain.least_starts(6, 3, warm=False) == 21 and per_pair == 36
    assert design.all_starts <= 0.6 * per_pair


def test_together_a_pass_cut_short_runs_again_whole_and_whole_passes_replay():
    keys = ["c0", "c1", "c2", "c3"]
    speed = {"c0": 1.0, "c1": 1.0, "c2": 1.1, "c3": 1.1}
    recorded: list[chain.Start] = []
    with pytest.raises(KeyboardInterrupt):
        run(Fake(speed, kill_at=6), keys, record=recorded.append, **TOGETHER)  # pass 1, 2 starts of pass 2
    assert [(s.pass_index, s.position) for s in recorded] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    again = Fake(speed)
    resumed = run(again, keys, done=[chain.Start.from_json(s.to_json()) for s in recorded], **TOGETHER)
    assert again.started[:4] == ["pass01-c3", "pass01-c2", "pass01-c1", "pass01-c0"]  # pass 2 whole, pass 1 not
    assert resumed.pairs["c2"].decision.word == stats.SLOWER and again.alive == []


def test_together_a_failed_start_loses_its_pairs_and_the_pass_goes_on():
    keys = ["c0", "c1", "c2", "c3"]
    fake = Fake({k: 1.0 for k in keys}, fail={"pass00-c2"})
    design = run(fake, keys, **TOGETHER)
    assert design.pairs["c2"].lost and design.pairs["c3"].lost and "pass00-c2" not in fake.alive
    assert "c2's start failed" in design.pairs["c2"].reason
    assert design.pairs["c1"].decision.word == stats.NO_CHANGE and fake.alive == []


def test_the_plan_counts_of_a_design():
    assert chain.least_starts(6) == 49 and chain.most_starts(6) == 7 * (1 + 6 * 8)
    assert chain.covering(["a", "b", "c", "d", "e"], [1, 3]) == ["b", "c", "d", "e"]
    assert chain.pass_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_a_design_of_series_names_the_slow_commit_and_resumes_from_its_journal(tmp_path, monkeypatch, fake_vllm):
    """decode.pair.design_series with engines that stand in for vLLM (tests/fake_live.py, 10% slower where the
    model file holds the swap): the commit that adds the swap is slower by its size, the others no change; run again
    with the same journal, it starts nothing and decides the same."""
    from b70bench.decode import pair

    env, site, empty = fake_vllm
    slow = tmp_path / "slow"
    model = fakedist.MODEL
    fakedist.write_patch(slow, "01-swap.patch", TARGET, model, model.replace("q + k", "k + q"), MODEL_FILE)
    FakeLive, NoStart = stand_in_engines(monkeypatch, site)

    dirs = {"c0": empty, "c1": empty, "c2": slow, "c3": slow}
    # The rule's level is overall: the design looks at per_look_level(0.95), LEVEL.
    kw = dict(spec={"output_len": 128}, out=lambda _: None, journal=tmp_path / "journal.jsonl")
    rule = stopping.Rule(rounds=6, budget_s=600.0, level=0.95)
    res = pair.design_series(dirs, env, tmp_path / "out", rule, engine_cls=FakeLive, **kw)
    assert {k: r["verdict"] for k, r in res.items()} == {"c1": "no change", "c2": "slower", "c3": "no change"}
    assert 1.09 < res["c2"]["ratio"] < 1.11 and res["c2"]["parent"] == "c1"
    # Placed together (auto on the CPU): no warm starts, the rule's four first blocks as passes over four commits.
    assert res["c2"]["placement"] == "together" and "two engines alive" in res["c2"]["placement_reason"]
    assert res["c2"]["design"]["starts"] == chain.least_starts(3, 4, warm=False) == 16
    again = pair.design_series(dirs, env, tmp_path / "out2", rule, engine_cls=NoStart, **kw)
    assert {k: (r["verdict"], r["ratio"]) for k, r in again.items()} == {
        k: (r["verdict"], r["ratio"]) for k, r in res.items()
    }


def test_the_plan_of_a_design_beside_the_per_pair_walk(tmp_path, monkeypatch):
    """revisions --design --plan: the starts of a design over ten commits on a rig stack, at least and at most, beside
    the per-pair walk's (14 a commit at least), and the minutes at the stack's stated costs."""
    from b70bench import walkdesign
    from b70bench.stack import description

    for name in ("B70BENCH_DECODE_SHAPES", "B70BENCH_DECODE_BUDGET_MIN", "B70BENCH_DECODE_ROUNDS"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "m27").mkdir()
    rig = tmp_path / "rig.toml"
    rig.write_text('model = "./m27"\ntp = 4\nbackend = "xpu"\nmemory_fraction = 0.9\nshapes = ["p512n1536"]\n'
                   "start_s = 300\ncall_s = 17\n")  # fmt: skip
    lines = walkdesign.plan_lines(description.load(rig), 10)
    assert lines[0].startswith("design: 11 commits (the base and 10 walked), one engine at a time"), lines
    assert "shapes p512n1536" in lines[0] and "a first look of 6 passes, run whole" in lines[0]
    assert lines[1] == (
        "  starts a shape: at least 77, at most 539; per pair (alternate here): at least 140, at most 980 "
        "(55% at least)"
    )
    assert lines[2].startswith("  minutes a shape at the stack's start 300 s and call 17 s: at least ")
    assert "past the budget" not in lines[2]  # the default budget (the per-pair first look and a doubling) holds it
    # A budget set by hand that the first look cannot keep to: said, with the budget that would.
    monkeypatch.setenv("B70BENCH_DECODE_BUDGET_MIN", "30")
    over = walkdesign.plan_lines(description.load(rig), 10)[2]
    assert over.endswith("(the first look runs past the budget: set B70BENCH_DECODE_BUDGET_MIN=98 a commit or more)")
    monkeypatch.delenv("B70BENCH_DECODE_BUDGET_MIN")
    # The CPU default, where two engines fit: placed together, no warm starts, the walk's three blocks as passes.
    cpu = walkdesign.plan_lines(description.default(), 6)
    assert "two engines alive" in cpu[0] and "a first look of 3 passes, run whole" in cpu[0], cpu
    assert cpu[1] == (
        "  starts a shape: at least 21, at most 168; per pair (together here): at least 36, at most 288 (58% at least)"
    )


def test_a_commit_whose_series_does_not_apply_is_left_out_of_the_design(tmp_path, fake_vllm):
    """A broken commit in the range is left out (its child is measured against the commit before it, as a per-pair
    walk skips a broken parent); a broken base is refused in one line."""
    from b70bench import walkdesign
    from b70bench.errors import UsageError

    env, _site, empty = fake_vllm
    stale = tmp_path / "stale"
    fakedist.write_patch(stale, "03-stale.patch", TARGET, "absent\n", "present\n", MODEL_FILE)
    said = []
    kept = walkdesign.usable({"c0": empty, "c1": stale, "c2": empty}, env, said.append)
    assert list(kept) == ["c0", "c2"] and said and said[0].startswith("  c1: left out of the design (")
    with pytest.raises(UsageError, match="the design's base c1 cannot be used"):
        walkdesign.usable({"c1": stale, "c2": empty}, env, said.append)


def test_a_design_bisect_over_git_commits_finds_the_slow_one_and_resumes(tmp_path, monkeypatch, fake_vllm):
    """bisect --design's measurement (walkdesign.measure_chain) over a git history of patch sets, with engines that
    stand in for vLLM: eight commits, the sixth adds the 10% swap; two designs (five commits, then three) find it,
    and the same search run again starts nothing (every start replayed from the journal)."""
    from gitrepo import git

    from b70bench import bisect, walkdesign
    from b70bench.stack import description

    env, site, _empty = fake_vllm
    FakeLive, NoStart = stand_in_engines(monkeypatch, site)

    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / "patches").mkdir()
    (repo / "patches" / "series").write_text("")
    model = fakedist.MODEL
    for i in range(9):
        if i == 6:
            fakedist.write_patch(repo / "patches", "01-swap.patch", TARGET, model, model.replace("q + k", "k + q"),
                                 MODEL_FILE)  # fmt: skip
        (repo / "f").write_text(str(i))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"c{i}")
    revs = [git(repo, "rev-parse", f"HEAD~{8 - i}").strip() for i in range(9)]
    rule = stopping.Rule(rounds=6, budget_s=600.0, level=0.95)
    (tmp_path / "m").mkdir()  # a stack with no gate pin: the embedded one's pin is of vLLM's tokens, not the fake's
    (tmp_path / "s.toml").write_text('model = "./m"\nbackend = "cpu"\n')
    stack = description.load(tmp_path / "s.toml")

    def designs(engine_cls, calls):
        def measure_chain(commits):
            calls.append(commits)
            return walkdesign.measure_chain(
                repo, commits, stack, env, sys.executable, rule, "p128n128", tmp_path / "journal",
                out=lambda _: None, tag="test", engine_cls=engine_cls, spec={"output_len": 128},
            )  # fmt: skip

        return measure_chain

    calls = []
    res = bisect.search_design(revs, designs(FakeLive, calls), out=lambda _: None)
    assert res["outcome"] == bisect.FOUND and res["found"] == revs[6] and res["parent"] == revs[5], res["said"]
    assert [[revs.index(c) for c in got] for got in calls] == [[0, 2, 4, 6, 8], [4, 5, 6]]
    # Together (auto on the CPU): the rule's four first blocks as passes, no warm starts.
    assert res["starts"] == chain.least_starts(4, 4, warm=False) + chain.least_starts(2, 4, warm=False) == 32
    again = bisect.search_design(revs, designs(NoStart, []), out=lambda _: None)
    assert again["found"] == revs[6] and [s["ratio"] for s in again["steps"]] == [s["ratio"] for s in res["steps"]]
