"""decode as a paired target: one vLLM engine per side kept alive and timed call by call (decode/live.py).

Each side is a fresh engine process importing its own patched vLLM (patches.overlay). The placement
(paired.placement) decides whether both live at once, their calls alternating A B, B A, ... a few hundred
milliseconds apart so they see the same host, or one at a time; the blocks, the stopping rule and the verdict are
the paired package's. Every call records the host probe taken just before it (host.host_probe), so a reader can
check the host state of every sample and the analysis can compare pairing, conditioning and normalising.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from b70bench import cachekey, patches, side_settings, sides
from b70bench.paired import chain, report, stopping
from b70bench.paired import placement as placements
from b70bench.paired.blocks import SIDES, Block, Side
from b70bench.paired.live import EngineError, EngineHandle
from b70bench.stack import description, gate, launch, logs
from b70bench.stack.description import Stack
from b70bench.stack.live import StackProcess

# Rounds per block. A round's log B/A spreads ~20% (the host moves within a second) and the rounds, not the
# per-process offset (~1%), set a block's spread: doubling 48 rounds costs ~15 s on top of the two starts
# (~25-30 s) and takes a block's spread from ~3.6% to ~2.6%, so 8 blocks fit in 10 minutes and resolve 5%.
DEFAULT_ROUNDS = 96
DEFAULT_WARMUP_CALLS = 3
# Pause before each timed call, for the other engine's OpenMP threads to stop spinning (KMP_BLOCKTIME; the
# engines get 5 ms, environment.PAIRED_CPU_ENGINE_ENV).
DEFAULT_GAP_S = 0.02


class Engine(StackProcess):
    """One side's decode engine (decode/live.py)."""

    module = "b70bench.decode.live"


class Target:
    """decode's paired target: start(side, label) launches that side's engine with its own overlay and cache."""

    errors = (EngineError,)

    def __init__(
        self,
        sides_: dict[str, Side],
        spec: dict,
        base_env: dict,
        out_dir: Path,
        *,
        stack: Stack | None = None,
        backend: str = "cpu",
        gap_s: float = DEFAULT_GAP_S,
        python: str | None = None,
        engine_cls=None,
    ):
        self.sides, self.spec, self.base_env, self.out_dir = sides_, spec, base_env, out_dir
        self.stack, self.backend = stack or description.default(), backend
        self.gap_s, self.python = gap_s, python
        self.engine_cls = engine_cls or Engine

    def start(self, side: str, label: str) -> EngineHandle:
        s = self.sides[side]
        env = sides.side_env(launch.start_env(self.base_env, s.cache_root, self.stack.embedded), s, self.backend)
        spec = self.spec
        if s.settings.engine_args:
            spec = {**spec, "engine_args": {**(spec.get("engine_args") or {}), **s.settings.engine_args}}
        engine = self.engine_cls(side, spec, env, self.out_dir / f"{label}.log", self.python)
        return EngineHandle(engine, self.gap_s, self.stack.start_timeout_s)


def run_block(
    index: int,
    sides_: dict[str, Side],
    spec: dict,
    base_env: dict,
    out_dir: Path,
    *,
    placement: str = placements.TOGETHER,
    rounds: int = DEFAULT_ROUNDS,
    warmup_calls: int = DEFAULT_WARMUP_CALLS,
    gap_s: float = DEFAULT_GAP_S,
    python: str | None = None,
    engine_cls=Engine,
    warm_first: bool = False,
) -> Block:
    """One block of decode calls (paired.placement.run_block over this module's Target)."""
    target = Target(sides_, spec, base_env, out_dir, gap_s=gap_s, python=python, engine_cls=engine_cls)
    return placements.run_block(
        index, target, placement, rounds=rounds, warmup_calls=warmup_calls, warm_first=warm_first
    )


DEFAULT_SHAPE = "p128n128"


def series_target(dirs, env, out_dir, cache_dir, settings, spec, stack: Stack, shape, backend, python, engine_cls):
    """The engines' target over series directories (one side each, its overlay and compile cache): what
    compare_series pairs and design_series walks."""
    sides_ = sides.build_sides(dirs, env, out_dir, cache_dir, settings)
    spec = dict(spec) if spec is not None else stack.engine_spec(shape)
    run = launch.run_env(stack, backend, paired=True)
    return Target(sides_, spec, run, out_dir, stack=stack, backend=backend, python=python, engine_cls=engine_cls)


def compare_series(
    dirs: dict[str, Path],
    env: patches.Env,
    out_dir: Path,
    rule: stopping.Rule = stopping.DEFAULT_RULE,
    *,
    shape: str = DEFAULT_SHAPE,
    python: str | None = None,
    backend: str = "cpu",
    placement: str = placements.AUTO,
    out=print,
    engine_cls=Engine,
    stack: Stack | None = None,
    spec: dict | None = None,
    cache_dir: Path | None = None,
    settings: dict | None = None,
    journal: stopping.Journal | None = None,
) -> dict:
    """Measure B against A (series directories) in blocks until `rule` decides or stops; returns the result as one
    JSON-able dict. rule.rounds None: DEFAULT_ROUNDS. journal (a walk's): where the finished blocks are recorded and
    read back (paired.journal), keyed here by what this measures too.

    cache_dir: where each side's vLLM compile cache lives (default: out_dir). A persistent one makes every start
    after the first of a graph warm: vLLM on the CPU recompiles at each start, but inductor's generated C++ is
    cached under the compile-cache key, and most commits leave the graph unchanged."""
    stack = stack or description.default()
    rule = dataclasses.replace(rule, rounds=rule.rounds_or(DEFAULT_ROUNDS))
    where, why = placements.choose(placement, backend, side_settings.placement_stack(stack, settings or {}))
    out(f"placement: {where} ({why})")
    target = series_target(dirs, env, out_dir, cache_dir, settings, spec, stack, shape, backend, python, engine_cls)
    sides_, spec = target.sides, target.spec
    tokens = spec.get("batch", 1) * spec.get("output_len", 1)

    if journal is not None:
        journal = journal.keyed(
            f"decode {shape}", shape=shape, spec=spec, stack=stack.hash(), backend=backend, placement=where,
            rounds=rule.rounds, warmup_calls=DEFAULT_WARMUP_CALLS,
            settings={s: sides_[s].settings.digest() for s in SIDES},
        )  # fmt: skip
    result = stopping.measure_target(
        target, where, out_dir, rule, warmup_calls=DEFAULT_WARMUP_CALLS, out=out, journal=journal
    )
    res = to_result(result, dirs, shape, tokens, rule.min_effect, where, why, backend, stack)
    return {**res, "settings": {s: sides_[s].settings.to_json() for s in SIDES}}


def design_series(
    dirs: dict[str, Path],
    env: patches.Env,
    out_dir: Path,
    rule: stopping.Rule,
    *,
    shape: str = DEFAULT_SHAPE,
    python: str | None = None,
    backend: str = "cpu",
    out=print,
    engine_cls=Engine,
    stack: Stack | None = None,
    cache_dir: Path | None = None,
    journal: Path | None = None,
    spec: dict | None = None,
    placement: str = placements.AUTO,
) -> dict[str, dict]:
    """A walk's commits measured as one design (paired.chain) by `rule` (its budget, overall level, thresholds and
    rounds; None: DEFAULT_ROUNDS), placed as `placement` places a pair (auto: together where two engines of the
    stack fit): dirs maps each commit to its series, in walk order, the first the base. Returns
    {commit: its result against the commit before it}, each as compare_series' result (to_result) with "commit",
    "parent" and the design's cost. journal: where each start is recorded, and read back when the same design runs
    again (resume)."""
    stack = stack or description.default()
    keys = list(dirs)
    target = series_target(dirs, env, out_dir, cache_dir, None, spec, stack, shape, backend, python, engine_cls)
    spec = target.spec
    where, placed = placements.choose(placement, backend, stack)
    design = chain.measure(
        target,
        keys,
        rounds=rule.rounds_or(DEFAULT_ROUNDS),
        warmup_calls=DEFAULT_WARMUP_CALLS,
        budget_s=rule.budget_s,
        level=stopping.per_look_level(rule.level),
        min_effect=rule.min_effect,
        floor=rule.floor,
        first_passes=stopping.first_look_blocks(rule.first_blocks, where),
        placement=where,
        done=chain.read_journal(journal),
        record=chain.journal_writer(journal),
        out=out,
    )
    tokens = spec.get("batch", 1) * spec.get("output_len", 1)
    why = f"one design: each commit started once a pass, {chain.alive_text(where)} ({placed})"
    cost = {"commits": len(keys) - 1, "starts": design.all_starts, "passes": design.passes,
            "minutes": design.wall_s / 60.0}  # fmt: skip
    results = {}
    for parent, child in zip(keys, keys[1:], strict=False):
        res = to_result(design.pairs[child], {"A": dirs[parent], "B": dirs[child]}, shape, tokens, rule.min_effect,
                        where, why, backend, stack)  # fmt: skip
        results[child] = {**res, "commit": child, "parent": parent, "skipped_parents": [], "design": cost}
    return results


def _side_facts(blocks: list[Block], side: str, its_gate: dict) -> dict:
    """Gate (report.paired_gates) and compile-cache keys of one side, from its engines' start messages and logs."""
    keys, first = set(), None
    for b in blocks:
        log = Path(b.starts.get(side, {}).get("log_path") or "/nonexistent")
        if log.is_file():
            parsed = logs.parse(log.read_text(errors="replace"))
            keys.update(parsed["cache_keys"])
            first = first or parsed
    return {
        # The first engine's log as decode records carry it (cachekey.from_decode_record reads these).
        "cache_dir": (first or {}).get("cache_dir"),
        "cache_keys_full": sorted(keys),
        "kv_cache_tokens": (first or {}).get("kv_cache_tokens"),
        **its_gate,
        "cache_keys": sorted(k[:12] for k in keys),
    }


def to_result(
    result: stopping.Paired,
    dirs: dict,
    shape: str,
    tokens: int,
    min_effect: float,
    where: str,
    why: str,
    backend: str,
    stack: Stack | None = None,
) -> dict:
    """A decode compare's JSON-able result: the verdict and what it took, per-block figures, each side's gate."""
    good = result.good
    stack = stack or description.default()
    gates = report.paired_gates(good, gate.check(gate.stack_key(stack, backend), stack.gate_file))
    per_token = {s: [b.figure(s) / tokens for b in good if b.figure(s) is not None] for s in SIDES}
    facts = {s: _side_facts(good, s, gates[s]) for s in SIDES}
    return {
        "shape": shape,
        "figure": "s_per_output_token",
        "backend": backend,
        **report.verdict_fields(result, min_effect, where, why, stack.summary(), backend),
        "block_ratios_normalised": [b.ratio(True) for b in good],
        "median_a": statistics.median(per_token["A"]) if per_token["A"] else None,
        "median_b": statistics.median(per_token["B"]) if per_token["B"] else None,
        "block_s_per_output_token": per_token,
        "series": {s: str(d) for s, d in dirs.items()},
        "sides": facts,
        # B's compile-cache keys against A's (the parent's in a walk), read from these same engines.
        "key_change": cachekey.from_sides(facts),
        "block_records": [b.to_json() for b in result.blocks],
    }
