"""decode.pair: engines alive together, calls paired in time, blocks until decided.

Two halves. The protocol with real processes (tests/fake_live.py speaks live.py's protocol without
vLLM, importing fakevllm through a patches.overlay): calls alternate, each side runs its own series,
a failed start or a killed engine ends the block with one line and leaves no process behind.
The detector with a simulated drifting host (SimEngine, deterministic): a host that flips between
two speeds 1.6x apart every few calls, a CPU hog that slows everything by half for a stretch
mid-run, a per-process offset of ~1.5% (fresh starts of identical code differ by that much) and 8%
noise per call. Asserted: no A/A pair named over 40 seeds; an 8% slowdown named slower in every
one of 20 seeds and a 5% one in at least 18; with the budget for two blocks, 5% comes out undecided.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakedist  # noqa: E402

from b70bench import children, patches, stats  # noqa: E402
from b70bench.decode import pair  # noqa: E402
from b70bench.errors import UsageError  # noqa: E402
from b70bench.paired import placement, stopping  # noqa: E402
from b70bench.paired.blocks import SIDES, Block, Side  # noqa: E402
from b70bench.stack import description, launch

TESTS = Path(__file__).resolve().parent
REL = "fakevllm/models/minimax_m2.py"
TARGET = "dist:fakevllm==0.32.0"


class FakeLive(pair.Engine):
    module = "fake_live"


@pytest.fixture
def sides(tmp_path):
    """A fake installed vLLM and two overlays: A unpatched, B with 'q + k' -> 'k + q' (10% slower)."""
    wheel_dir = tmp_path / "wheel"
    wheel_dir.mkdir()
    site = fakedist.install(fakedist.build_wheel(wheel_dir), tmp_path / "site")
    env = patches.Env(tmp_path / "prefix", (str(site),))
    sa, sb = tmp_path / "sa", tmp_path / "sb"
    sa.mkdir()
    (sa / "series").write_text("")
    fakedist.write_patch(sb, "01-swap.patch", TARGET, fakedist.MODEL, fakedist.MODEL.replace("q + k", "k + q"), REL)
    out = {
        s: Side(s, patches.overlay.build(d, env, tmp_path / f"ov-{s}"), tmp_path / f"cache-{s}")
        for s, d in (("A", sa), ("B", sb))
    }
    base = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(site)]))
    return out, base, site


def _block(sides, tmp_path, spec=None, rounds=6):
    out, base, _site = sides
    return pair.run_block(
        0, out, spec or {}, base, tmp_path / "logs", rounds=rounds, warmup_calls=1, gap_s=0.0, engine_cls=FakeLive
    )


def test_alternate_runs_one_engine_at_a_time_and_warms_each_side_first(sides, tmp_path):
    """Placement alternate: A's start and all its calls, A stopped, then B's; block 1 starts B first (A B | B A);
    before block 0 each side had one uncounted start that only filled its cache. Nothing is left running."""
    out, base, site = sides
    blocks = [
        pair.run_block(
            i,
            out,
            {},
            base,
            tmp_path / "logs",
            placement=placement.ALTERNATE,
            rounds=6,
            warmup_calls=1,
            gap_s=0.0,
            engine_cls=FakeLive,
            warm_first=i == 0,
        )
        for i in range(2)
    ]
    assert all(b.error is None for b in blocks), [b.error for b in blocks]
    assert [c["side"] for c in blocks[0].calls] == list("AAAAAABBBBBB")
    assert [c["side"] for c in blocks[1].calls] == list("BBBBBBAAAAAA")
    assert set(blocks[0].warm_starts) == set(SIDES) and not blocks[1].warm_starts
    assert blocks[0].warm_starts["A"]["pid"] != blocks[0].starts["A"]["pid"]
    assert blocks[0].ratio() == pytest.approx(1.1, rel=0.05) and blocks[1].ratio() == pytest.approx(1.1, rel=0.05)
    assert "/ov-B/" in blocks[1].starts["B"]["module_file"] and str(site) in blocks[1].starts["A"]["module_file"]
    pids = [x["pid"] for b in blocks for x in (*b.starts.values(), *b.warm_starts.values())]
    assert len(set(pids)) == 6 and not any(children.group_members(p) for p in pids)
    assert blocks[0].to_json()["placement"] == "alternate"


def test_a_side_that_fails_its_counted_start_fails_the_alternate_block(sides, tmp_path):
    out, base, _site = sides
    b = pair.run_block(
        0,
        out,
        {"die_at_call": 2},
        base,
        tmp_path / "logs",
        placement=placement.ALTERNATE,
        rounds=6,
        warmup_calls=0,
        gap_s=0.0,
        engine_cls=FakeLive,
    )
    assert b.error and "side A" in b.error and "killed by SIGKILL" in b.error, b.error
    assert "B" not in b.starts  # B never started once A failed
    assert not children.group_members(b.starts["A"]["pid"])


def test_auto_places_together_on_the_cpu_and_alternate_on_gpus():
    assert placement.choose("auto", "cpu")[0] == placement.TOGETHER
    for backend in ("cuda", "xpu"):
        where, why = placement.choose("auto", backend)
        assert where == placement.ALTERNATE and backend in why
    assert placement.choose("together", "cuda") == (placement.TOGETHER, "--placement together")
    with pytest.raises(UsageError, match="--placement 'beside'"):
        placement.choose("beside", "cpu")


class _Recorded:
    """A target whose processes only log what happens to them, in order."""

    errors = (RuntimeError,)

    def __init__(self, backend: str):
        self.backend, self.events = backend, []

    def start(self, side, label):
        self.events.append(f"start {side}")
        events = self.events

        class H:
            def ready(self):
                events.append(f"ready {side}")
                return {"ok": True}

            def warm(self):
                pass

            def call(self):
                return {"latency_s": 1.0, "probe_s": 0.0}

            def stop(self):
                return []

        return H()


@pytest.mark.parametrize(
    ("backend", "order"),
    [
        ("cpu", ["start A", "start B", "ready A", "ready B"]),
        # vLLM on a GPU sizes its KV cache from the memory free during its start: the second side waits.
        ("cuda", ["start A", "ready A", "start B", "ready B"]),
        ("xpu", ["start A", "ready A", "start B", "ready B"]),
    ],
)
def test_together_starts_both_at_once_on_the_cpu_and_in_turn_on_accelerators(backend, order):
    target = _Recorded(backend)
    block = placement.run_block(0, target, placement.TOGETHER, rounds=4, warmup_calls=0)
    assert block.error is None and target.events == order
    assert set(block.starts) == set(SIDES)


def test_calls_alternate_and_each_side_runs_its_own_series(sides, tmp_path):
    b = _block(sides, tmp_path)
    assert b.error is None, b.error
    assert [c["side"] for c in b.calls] == list("ABBAABBAABBA")
    assert b.ratio() == pytest.approx(1.1, rel=0.03)
    # B imported its overlay's patched file; A's series is empty, so its overlay holds nothing: the installed file.
    assert "/ov-B/" in b.starts["B"]["module_file"] and str(sides[2]) in b.starts["A"]["module_file"]
    assert fakedist.model_path(sides[2]).read_text() == fakedist.MODEL  # the installed file never changed


def test_a_side_that_fails_to_start_ends_the_block_with_its_reason(sides, tmp_path):
    b = _block(sides, tmp_path, {"fail_start": "bad engine arg max_model_len=-1"})
    assert b.error and "side A" in b.error and "bad engine arg" in b.error
    assert not b.calls


def test_a_start_that_fails_names_the_cause_vllm_logged_not_its_wrapper(sides, tmp_path):
    b = _block(sides, tmp_path, {"fail_wrapped": "No available memory for the cache blocks."})
    assert b.error and b.error.startswith("side A: ValueError: No available memory for the cache blocks."), b.error


def test_an_engine_killed_mid_block_ends_it_and_nothing_is_left(sides, tmp_path):
    b = _block(sides, tmp_path, {"die_at_call": 3, "grandchild": True})
    assert b.error and "killed by SIGKILL" in b.error, b.error
    pids = [b.starts[s]["pid"] for s in "AB" if s in b.starts]
    assert pids and not any(children.group_members(p) for p in pids)  # engines and their `sleep` children


def test_an_engine_whose_grandchild_outlives_it_is_reaped(sides, tmp_path):
    b = _block(sides, tmp_path, {"grandchild": True})
    assert b.error is None
    assert not any(children.group_members(b.starts[s]["pid"]) for s in "AB")


# ---- the detector on a simulated drifting host -------------------------------------------------


class Host:
    """Two speeds 1.6x apart, flipping every few calls; a hog that slows everything 1.5x for a stretch."""

    def __init__(self, rng: random.Random, hog_from: int = 10**9, hog_to: int = 0):
        self.rng, self.calls, self.slow = rng, 0, False
        self.hog_from, self.hog_to = hog_from, hog_to

    def factor(self) -> float:
        self.calls += 1
        if self.rng.random() < 0.15:
            self.slow = not self.slow
        hog = 1.5 if self.hog_from <= self.calls < self.hog_to else 1.0
        return (1.6 if self.slow else 1.0) * hog


def sim_engine(host: Host, effect: float):
    class SimEngine:
        def __init__(self, side, spec, env, log_path, python=None):
            self.side, self.log_path = side, log_path
            self.offset = host.rng.lognormvariate(0.0, 0.015)  # this process's own speed, for its life

        def ready(self, timeout_s=None):
            return {"ready": True, "token_sha256": "ab" * 32, "pid": 0}

        def call(self):
            f = host.factor()
            lat = 0.1 * f * self.offset * (1 + effect if self.side == "B" else 1.0) * host.rng.lognormvariate(0, 0.08)
            return {"probe_s": 0.012 * f * host.rng.lognormvariate(0, 0.03), "latency_s": lat, "tokens": 128}

        def close(self):
            return []

    return SimEngine


def simulate(
    seed: int,
    effect: float,
    budget_blocks: float = 16,
    hog: bool = True,
    rounds: int = 40,
    first: int = 4,
    where: str = placement.TOGETHER,
):
    rng = random.Random(seed)
    host = Host(rng, 200, 900) if hog else Host(rng)
    engine = sim_engine(host, effect)
    now = [0.0]

    def run_one(i):
        now[0] += 60.0  # each block "takes" a minute
        dummy = {s: Side(s, None, Path("/nonexistent")) for s in SIDES}
        b = pair.run_block(
            i,
            dummy,
            {},
            {},
            Path("/nonexistent"),
            placement=where,
            rounds=rounds,
            warmup_calls=0,
            gap_s=0.0,
            engine_cls=engine,
            warm_first=i == 0 and where == placement.ALTERNATE,
        )
        b.wall_s = 60.0
        return b

    return stopping.measure(
        run_one,
        budget_s=budget_blocks * 60.0 + 1,
        level=stopping.per_look_level(0.96),
        min_effect=0.05,
        floor=0.01,
        first_blocks=first,
        out=lambda _l: None,
        clock=lambda: now[0],
    )


def test_identical_sides_are_never_named_even_with_a_hog_mid_run():
    got = [simulate(seed, 0.0) for seed in range(40)]
    assert not any(r.decision and r.decision.named for r in got), [r.text() for r in got]
    # Most of them must say so, not merely stay undecided: "no change beyond X%" with X under 5%.
    assert sum(r.decision.word == stats.NO_CHANGE for r in got if r.decision) >= 36


def test_an_8_percent_slowdown_is_named_in_every_seed_and_5_percent_in_most():
    eight = [simulate(seed, 0.08) for seed in range(100, 120)]
    assert all(r.decision.word == stats.SLOWER for r in eight), [r.text() for r in eight]
    five = [simulate(seed, 0.05) for seed in range(200, 220)]
    assert sum(r.decision.word == stats.SLOWER for r in five) >= 18, [r.text() for r in five]


def test_each_blocks_own_standard_error_decides_8_percent_at_the_first_look():
    """Four blocks: their rounds pin each block's standard error down, so the first look names 8% (the t over
    four block values, 3 degrees of freedom, needed the second look or more for most seeds), and A/A pairs
    under the hog are named no more often than the level allows (99% a look, two looks: about 2%)."""
    eight = [simulate(seed, 0.08, rounds=96) for seed in range(300, 320)]
    assert sum(r.decision.word == stats.SLOWER and r.looks == 1 for r in eight) >= 17, [r.text() for r in eight]
    assert all(r.decision.word == stats.SLOWER for r in eight), [r.text() for r in eight]
    same = [simulate(seed, 0.0, rounds=96) for seed in range(400, 440)]
    assert sum(bool(r.decision and r.decision.named) for r in same) <= 2, [r.text() for r in same]


def test_the_walks_first_look_at_three_blocks_names_9_percent_and_no_identical_pair():
    """The walk's budget (four blocks here): its first look comes at stopping.WALK_FIRST_BLOCKS."""
    first = stopping.WALK_FIRST_BLOCKS
    nine = [simulate(seed, 0.09, budget_blocks=4, rounds=96, first=first) for seed in range(800, 830)]
    assert sum(r.decision.word == stats.SLOWER and len(r.blocks) == first for r in nine) >= 28, [r.text() for r in nine]
    same = [simulate(seed, 0.0, budget_blocks=4, rounds=96, first=first) for seed in range(900, 940)]
    assert sum(bool(r.decision and r.decision.named) for r in same) <= 1, [r.text() for r in same]


def test_more_blocks_only_while_undecided():
    easy = simulate(7, 0.30)
    assert easy.decision.word == stats.SLOWER and len(easy.blocks) == 4 and easy.looks == 1


def test_two_blocks_cannot_decide_5_percent():
    r = simulate(3, 0.05, budget_blocks=1.9)
    assert r.decision is not None and r.decision.word == stats.UNDECIDED, r.text()
    assert "budget" in r.text() and len(r.blocks) == 2


def test_the_second_block_starts_while_the_budget_is_not_spent():
    """A budget of 1.5 blocks: the first block's cost would predict an overrun, but one block decides nothing."""
    r = simulate(5, 0.30, budget_blocks=1.5, rounds=96)
    assert len(r.blocks) == 2 and r.decision.word == stats.SLOWER, r.text()
    assert len(simulate(5, 0.30, budget_blocks=0.9, rounds=96).blocks) == 1  # a spent budget still stops


def test_the_first_looks_blocks_start_while_the_budget_is_not_spent():
    """A budget of 2.5 blocks and a first look at 3: the third block starts (the budget is not spent after two)
    though it ends past the budget; no block after the first look starts without room for it."""
    r = simulate(5, 0.0, budget_blocks=2.5, rounds=96, first=3)
    assert len(r.blocks) == 3, r.text()
    assert len(simulate(5, 0.0, budget_blocks=1.9, rounds=96, first=3).blocks) == 2
    wide = simulate(11, 0.0, budget_blocks=3.5, rounds=8, first=3)  # 8 rounds a block: the first look is undecided
    assert wide.decision.word == stats.UNDECIDED and len(wide.blocks) == 3, wide.text()


def test_a_costly_first_block_does_not_cut_the_first_look_short():
    """The first block pays a new graph's compile (here three times a warm block): the first look's blocks still
    start while the budget is not spent, so a budget of 2.2 warm blocks after it gets three blocks, not two."""
    now, blocks = [0.0], []

    def run_one(i):
        now[0] += 180.0 if i == 0 else 60.0
        rng = random.Random(i)
        calls = [
            {"side": side, "round": r, "latency_s": 1.0 + rng.uniform(-0.01, 0.01), "probe_s": 1.0, "t_s": r}
            for r in range(16)
            for side in SIDES
        ]
        b = Block(i, calls=calls, wall_s=180.0 if i == 0 else 60.0)
        blocks.append(b)
        return b

    stopping.measure(
        run_one,
        budget_s=180.0 + 2.2 * 60,
        level=stopping.per_look_level(0.96),
        min_effect=0.05,
        floor=0.01,
        first_blocks=stopping.WALK_FIRST_BLOCKS,
        out=lambda _l: None,
        clock=lambda: now[0],
    )
    assert len(blocks) == 3


def test_two_blocks_name_a_large_slowdown_and_no_identical_pair():
    """A slow host's walk fits two blocks in its budget: their own standard errors (with the two-block floor
    between them) still name a 30% slowdown, and A/A pairs under the hog stay unnamed."""
    big = [simulate(seed, 0.30, budget_blocks=1.9, rounds=96) for seed in range(600, 620)]
    assert all(r.decision.word == stats.SLOWER and len(r.blocks) == 2 for r in big), [r.text() for r in big]
    same = [simulate(seed, 0.0, budget_blocks=1.9, rounds=96) for seed in range(700, 740)]
    assert not any(r.decision.named for r in same), [r.text() for r in same]


def test_pinned_cores_are_read_once_and_a_bad_value_names_the_fix():
    cores = sorted(os.sched_getaffinity(0))
    assert launch.engine_cpus({"B70BENCH_PAIR_CPUS": "none"}) is None
    assert launch.engine_cpus({}) == launch.engine_cpus({"B70BENCH_PAIR_CPUS": "last"}) == str(cores[-1])
    listed = ",".join(map(str, reversed(cores)))  # sorted and deduplicated, whatever order it came in
    assert launch.engine_cpus({"B70BENCH_PAIR_CPUS": f" {listed},{cores[0]} "}) == ",".join(map(str, cores))
    with pytest.raises(UsageError, match="set last, none or core numbers"):
        launch.engine_cpus({"B70BENCH_PAIR_CPUS": "lastt"})
    with pytest.raises(UsageError, match="may run on cores"):
        launch.engine_cpus({"B70BENCH_PAIR_CPUS": str(max(cores) + 64)})


def test_alternate_starts_stay_quiet_on_identical_sides_and_name_large_slowdowns():
    """One engine at a time on the drifting host (it flips between speeds within seconds): nothing cancels the
    host inside a block, and each block's B/A, its two starts' median calls, lands on whichever speed held most of
    each start. Identical sides are named no more often than the level allows (4% overall: 2 of 50), with or
    without a hog mid-run; without one, 20% is named in most seeds within 16 blocks and 10% in some (together names
    8% in all: alternate is for stacks of which two processes do not fit)."""
    alt = dict(rounds=96, where=placement.ALTERNATE, first=stopping.ALTERNATE_FIRST_BLOCKS)
    for hog in (True, False):
        same = [simulate(seed, 0.0, hog=hog, **alt) for seed in range(1000, 1050)]
        assert sum(bool(r.decision and r.decision.named) for r in same) <= 2, [r.text() for r in same]
    ten = [simulate(seed, 0.10, hog=False, **alt) for seed in range(1100, 1120)]
    assert sum(r.decision.word == stats.SLOWER for r in ten) >= 5, [r.text() for r in ten]
    assert all(r.starts == 2 * len(r.blocks) + 2 for r in ten)  # the two warm starts are counted as starts taken
    twenty = [simulate(seed, 0.20, hog=False, **alt) for seed in range(1200, 1220)]
    assert sum(r.decision.word == stats.SLOWER for r in twenty) >= 12, [r.text() for r in twenty]
    assert not any(r.decision.word == stats.FASTER for r in ten + twenty)


def test_b_whose_tokens_differ_from_a_is_withheld_pinned_or_not(tmp_path):
    """A numerics change beside its parent: B's gate fails on A's tokens alone, with no pin; equal tokens stay
    unpinned (None), and a pin still checks both sides against the reviewed hash."""
    from b70bench.paired.blocks import Block
    from b70bench.paired.report import paired_gates
    from b70bench.stack import gate

    def blocks(a: str, b: str) -> list[Block]:
        return [Block(i, starts={"A": {"token_sha256": a}, "B": {"token_sha256": b}}) for i in range(3)]

    key = {"gate_version": gate.GATE_VERSION, "model": "m", "backend": "cpu:x", "vllm": "0", "dtype": "bf16", "tp": 1}
    pins = tmp_path / "gates.json"
    same = paired_gates(blocks("aa", "aa"), gate.check(key, pins))
    assert same["A"]["gate"] is None and same["B"]["gate"] is None and same["B"]["gate_reason"] is None
    moved = paired_gates(blocks("aa", "bb"), gate.check(key, pins))
    assert moved["A"]["gate"] is None and moved["B"]["gate"] == 1
    assert moved["B"]["gate_reason"] == "tokens differ from A's on the gate's prompts"
    gate.accept({**key, "quantization": None}, "aa", pins)
    pinned = paired_gates(blocks("aa", "bb"), gate.check({**key, "quantization": None}, pins))
    assert pinned["A"]["gate"] == 0 and pinned["B"]["gate"] == 1
    assert paired_gates(blocks("bb", "bb"), gate.check({**key, "quantization": None}, pins))["A"]["gate"] == 1


def test_tokens_that_vary_between_starts_are_compared_prompt_by_prompt(tmp_path):
    """A stack whose greedy tokens turn at a near tie between starts (both sides alike) passes and is reported as
    varying; a numerics change that moves one prompt in every start of B fails, naming the prompt and the token."""
    from b70bench.paired.blocks import Block
    from b70bench.paired.report import paired_gates
    from b70bench.stack import gate

    base = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    turned = [base[0], base[1], [9, 10, 99, 98]]  # prompt 3 turns at its third token in some starts
    moved = [base[0], [5, 6, 7, 0], base[2]]  # prompt 2's last token moved in every start

    def blocks(a_outs, b_outs):
        return [Block(i, starts={"A": {"token_sha256": f"a{i}", "gate_token_ids": a},
                                 "B": {"token_sha256": f"b{i}", "gate_token_ids": b}})
                for i, (a, b) in enumerate(zip(a_outs, b_outs, strict=True))]  # fmt: skip

    key = {"model": "m", "backend": "cpu:x", "vllm": "0", "dtype": "bf16", "tp": 1}
    vary = paired_gates(blocks([base, turned, base], [turned, base, turned]), gate.check(key, tmp_path / "gates.json"))
    assert vary["B"]["gate"] is None and vary["B"]["gate_reason"] is None
    assert vary["A"]["varies"] and vary["B"]["varies"]
    change = paired_gates(blocks([base, turned, base], [moved, moved, moved]), gate.check(key, tmp_path / "gates.json"))
    assert change["B"]["gate"] == 1 and not change["B"]["varies"]
    assert change["B"]["gate_reason"] == "tokens differ from A's on the gate's prompts (2 of 3, from token 4)"
    both = paired_gates(blocks([base] * 3, [turned] * 3), gate.check(key, tmp_path / "gates.json"))
    assert both["B"]["gate_reason"] == "tokens differ from A's on the gate's prompts (3 of 3, from token 3)"


def test_sides_differ_by_settings_on_one_revision(tmp_path):
    """A flag A/B on one commit: B's own variables and engine arguments reach B's engine only (A's unset removes a
    variable from A alone); `compare` refuses a malformed setting in one line."""
    from b70bench import pairing
    from b70bench.paired.blocks import Settings
    from b70bench.sides import side_env

    started = {}

    class Recorder:
        def __init__(self, side, spec, env, log_path, python=None):
            started[side] = (spec, env)
            raise RuntimeError("recorded")

    sides_ = {
        "A": Side("A", None, tmp_path / "a", Settings(unset=("VLLM_FLAG",))),
        "B": Side("B", None, tmp_path / "b", Settings({"VLLM_FLAG": "1"}, (), {"enforce_eager": True})),
    }
    target = pair.Target(sides_, {"engine_args": {"seed": 0}}, {"VLLM_FLAG": "0", "PATH": "/bin"}, tmp_path,
                         engine_cls=Recorder)  # fmt: skip
    for s in SIDES:
        with pytest.raises(RuntimeError, match="recorded"):
            target.start(s, f"{s}0")
    assert "VLLM_FLAG" not in started["A"][1] and started["B"][1]["VLLM_FLAG"] == "1"
    assert started["A"][0]["engine_args"] == {"seed": 0}
    assert started["B"][0]["engine_args"] == {"seed": 0, "enforce_eager": True}
    assert side_env({"X": "1"}, sides_["B"], "cuda")["VLLM_FLAG"] == "1"
    assert sides_["B"].settings.describe() == "VLLM_FLAG=1, enforce_eager=True"

    def args(**kw):
        base = dict(a_env=None, b_env=None, a_unset=None, b_unset=None, a_engine_arg=None, b_engine_arg=None)
        return SimpleNamespace(suite="decode", **{**base, **kw})

    stack = description.default()
    got = pairing.side_settings(args(b_env=["VLLM_FLAG=1"], a_unset=["VLLM_FLAG"]), stack)
    assert got["B"].env == {"VLLM_FLAG": "1"} and got["A"].unset == ("VLLM_FLAG",) and not got["A"].env
    for bad, words in (
        (args(b_env=["VLLM_FLAG"]), "--b-env 'VLLM_FLAG': write KEY=VALUE"),
        (args(b_env=["X=1"], b_unset=["X"]), "both name X"),
        (SimpleNamespace(**{**vars(args(b_env=["X=1"])), "suite": "moe-down"}), "moe-down sides are kernels"),
    ):
        with pytest.raises(UsageError, match=words):
            pairing.side_settings(bad, stack)


def test_a_second_stack_file_is_a_side(tmp_path):
    """--b-stack: what B's stack sets differently (a flag set, a flag gone, an engine argument, its memory share)
    becomes B's settings, the side's own flags win; a stack with another model or TP is refused in one line; `auto`
    judges the larger memory share."""
    from b70bench import side_settings
    from b70bench.paired.blocks import Settings

    (tmp_path / "m").mkdir()
    a = tmp_path / "a.toml"
    a.write_text('model = "./m"\nbackend = "cuda"\nmemory_fraction = 0.4\n'
                 '[env]\nVLLM_RMS_HELPER = "1"\nKEEP = "x"\n[engine_args]\nenforce_eager = true\n')  # fmt: skip
    b = tmp_path / "b.toml"
    b.write_text('model = "./m"\nbackend = "cuda"\nmemory_fraction = 0.95\nshapes = ["p512n1536"]\n'
                 '[env]\nKEEP = "x"\nVLLM_ROPE_HELPER = "1"\n'
                 '[engine_args]\nenforce_eager = true\nmax_num_seqs = 4\n')  # fmt: skip
    stack = description.load(a)
    got = side_settings.from_stack(stack, description.load(b), "--b-stack")
    assert got == Settings({"VLLM_ROPE_HELPER": "1"}, ("VLLM_RMS_HELPER",),
                           {"max_num_seqs": 4, "gpu_memory_utilization": 0.95})  # fmt: skip
    flags = dict(a_env=None, b_env=["VLLM_RMS_HELPER=2"], a_unset=None, b_unset=["VLLM_ROPE_HELPER"], a_stack=None,
                 a_engine_arg=None, b_engine_arg=["max_num_seqs=8"], b_stack=str(b))  # fmt: skip
    sides_ = side_settings.from_args(SimpleNamespace(**flags), stack)
    assert not sides_["A"] and sides_["B"] == Settings(
        {"VLLM_RMS_HELPER": "2"}, ("VLLM_ROPE_HELPER",), {"max_num_seqs": 8, "gpu_memory_utilization": 0.95}
    )
    assert stack.two_fit("cuda")[0] and not side_settings.placement_stack(stack, sides_).two_fit("cuda")[0]
    for text, words in (
        ('model = "./m"\nbackend = "cuda"\ntp = 2\n', "its tp \\(2\\) differs from the stack's \\(1\\)"),
        ('model = "./m"\nbackend = "cuda"\nmemory_fraction = 0.4\n[engine_args]\nseed = 1\n',
         "sets engine argument enforce_eager and it does not"),
    ):  # fmt: skip
        b.write_text(text)
        with pytest.raises(UsageError, match=words):
            side_settings.from_args(SimpleNamespace(**flags), stack)


def test_a_side_with_settings_gets_a_compile_cache_of_its_own(tmp_path):
    """vLLM keys its compile cache by source and its own variables: a flag read by a model file is in neither, so a
    graph compiled with the flag on would be loaded with it off. Sides with settings get caches of their own."""
    from b70bench import sides
    from b70bench.paired.blocks import Settings

    series = tmp_path / "s"
    series.mkdir()
    (series / "series").write_text("")
    on = {"A": Settings(), "B": Settings({"VLLM_FLAG": "1"})}
    made = sides.build_sides({"A": series, "B": series}, patches.Env(), tmp_path / "out", tmp_path / "c", on)
    plain = sides.build_sides({"A": series, "B": series}, patches.Env(), tmp_path / "out2", tmp_path / "c")
    assert made["A"].cache_root == plain["A"].cache_root == tmp_path / "c" / "vllm-cache-A"
    assert made["B"].cache_root != plain["B"].cache_root and made["B"].cache_root.name.startswith("vllm-cache-B-")


def test_the_rule_takes_at_most_max_looks_looks():
    """Each look is at the per-look level that keeps an A/A pair's false-alarm rate at the overall level only for
    MAX_LOOKS looks: blocks that never agree, with budget for hundreds more, stop after exactly that many looks."""
    now = [0.0]

    def run_one(i):
        now[0] += 60.0
        rng = random.Random(i)
        b_over_a = 1.3 if i % 2 else 1 / 1.3  # blocks that disagree: every interval stays wide
        calls = [
            {
                "side": s,
                "round": r,
                "latency_s": (b_over_a if s == "B" else 1.0) * (1 + rng.uniform(-0.01, 0.01)),
                "probe_s": 1.0,
                "t_s": r,
            }  # fmt: skip
            for r in range(16)
            for s in SIDES
        ]
        return Block(i, calls=calls, wall_s=60.0)

    res = stopping.measure(
        run_one, budget_s=60.0 * 500, level=0.99, min_effect=0.05, floor=0.02, first_blocks=3,
        out=lambda _l: None, clock=lambda: now[0],
    )  # fmt: skip
    assert res.decision is None or res.decision.word == stats.UNDECIDED
    assert (
        res.looks == stopping.MAX_LOOKS
        and "looks taken" in res.reason
        and len(res.blocks) == 3 * 2 ** (stopping.MAX_LOOKS - 1)
    )
    assert res.stopped == stopping.LOOKS
    # The same blocks, cut short: by the budget, by the start cap; blocks that agree stop decided.
    short = stopping.measure(
        run_one, budget_s=60.0 * 4, level=0.99, min_effect=0.05, floor=0.02, first_blocks=3,
        out=lambda _l: None, clock=lambda: now[0],
    )  # fmt: skip
    assert short.stopped == stopping.BUDGET and short.decision.word == stats.UNDECIDED, short.reason
    capped = stopping.measure(
        run_one, budget_s=60.0 * 500, level=0.99, min_effect=0.05, floor=0.02, first_blocks=3, max_blocks=4,
        out=lambda _l: None, clock=lambda: now[0],
    )  # fmt: skip
    assert capped.stopped == stopping.START_CAP and len(capped.blocks) == 4, capped.reason

    def agree(i):
        now[0] += 60.0
        calls = [{"side": s, "round": r, "latency_s": 1.2 if s == "B" else 1.0, "probe_s": 1.0, "t_s": r}
                 for r in range(16) for s in SIDES]  # fmt: skip
        return Block(i, calls=calls, wall_s=60.0)

    decided = stopping.measure(
        agree, budget_s=60.0 * 500, level=0.99, min_effect=0.05, floor=0.02, first_blocks=3,
        out=lambda _l: None, clock=lambda: now[0],
    )  # fmt: skip
    assert decided.stopped == stopping.DECIDED and decided.decision.word == stats.SLOWER


def test_a_lost_counted_block_ends_the_measurement_and_a_lost_warm_start_does_not():
    """A counted start killed (block 3 of a decidable pair) ends the measurement as lost, with that block's cause;
    a failed uncounted warm start loses nothing counted, so the next block warms and the verdict comes."""
    ran = []

    def run(fail_at: int, warm: bool):
        def run_one(i):
            ran.append(i)
            b = stopping.Block(i, placement=placement.ALTERNATE)
            if i == fail_at:
                b.error, b.warm_failed = "side B: Worker proc VllmWorker-1 died unexpectedly (exit code: -9)", warm
                return b
            for r in range(8):
                b.calls += [{"side": "A", "round": r, "latency_s": 1.0 + 0.01 * (r % 3), "probe_s": 1.0}]
                b.calls += [{"side": "B", "round": r, "latency_s": 1.3 + 0.01 * (r % 3), "probe_s": 1.0}]
            return b

        return stopping.measure(run_one, budget_s=1e6, level=0.99, min_effect=0.05, floor=0.01, out=lambda _l: None)

    lost = run(2, warm=False)
    assert lost.lost and lost.decision is None and ran == [0, 1, 2], (lost.reason, ran)
    assert lost.reason == "block 3 failed: side B: Worker proc VllmWorker-1 died unexpectedly (exit code: -9)"
    assert lost.stopped == stopping.FAILED
    ran.clear()
    warmed = run(0, warm=True)
    assert not warmed.lost and warmed.decision.word == stats.SLOWER and len(warmed.blocks) > 1, warmed.text()


def test_a_first_look_costs_one_start_a_block_together_two_in_turn_and_alternate_its_warm_starts():
    start, call, calls = 60.0, 0.5, 100
    blocks = stopping.first_look_blocks(3, placement.TOGETHER)
    together = stopping.first_look_s(start, call, calls, 3, placement.TOGETHER)
    assert together == blocks * (start + 2 * calls * call)
    in_turn = stopping.first_look_s(start, call, calls, 3, placement.TOGETHER, backend="cuda")
    assert in_turn - together == blocks * start
    alt_blocks = stopping.first_look_blocks(3, placement.ALTERNATE)
    alternate = stopping.first_look_s(start, call, calls, 3, placement.ALTERNATE)
    assert alternate == 2 * stopping.start_cost_s(start, call, calls) * (alt_blocks + 1) == 2 * 110 * (alt_blocks + 1)
