"""Two servers paired in time: `b70bench compare --suite serve A B`.

A block (placement together): both sides' servers started together (each importing its own patched copy of vLLM,
patches.overlay, each on its own port), each gated through its API and warmed by one level, then `rounds` rounds
of one closed-loop level at concurrency C per side, which side goes first alternating by round; alternate: one
server at a time, `rounds` levels each (paired.placement). A side's value in a
round is its level's median end-to-end latency (E2E), with the host probe taken just before the level: not TPOT,
because on a slow host the API server hands tokens out in bursts, and a level's median TPOT then reads ~0 in one
round and several ms in the next (seen at c=16 on the 2-core VM), while E2E holds the whole request. The
block's B/A and the blocks-until-decided loop are the paired package's, as for decode: the same statistics, the
same four verdicts. Every server is stopped and reaped by PID when its block ends, however it ends.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from pathlib import Path

from b70bench import side_settings, sides
from b70bench.paired import placement as placements
from b70bench.paired import report, stopping
from b70bench.paired.blocks import MIN_ROUNDS_FOR_SE, SIDES, Block
from b70bench.serve import server, suite
from b70bench.stack import description, gate, host, launch
from b70bench.stack.description import Stack

DEFAULT_CONCURRENCY = 16
# Paired levels a side per block: enough for the block's own standard error (blocks.MIN_ROUNDS_FOR_SE). With 8, the
# blocks were combined by the t over their values, and three blocks of a ~19% slowdown at 16 requests (1.14-1.25)
# left it undecided at the walk's level.
DEFAULT_ROUNDS = MIN_ROUNDS_FOR_SE
# Figures of each paired level decided beside E2E, from the same blocks (the level's median TPOT and TTFT).
ALSO_DECIDED = ("tpot_s", "ttft_s")


class _Live:
    """One side's server as the placement drives it (paired.placement's handle): each call one closed-loop level."""

    def __init__(self, side: str, srv: server.Server, load: suite.Load):
        self.side, self.srv, self.load, self.c = side, srv, load, load.concurrency[0]
        self.offset = 1000  # prompt offset: both sides get the same prompts level for level

    def ready(self) -> dict:
        startup = self.srv.wait_healthy(self.load.startup_timeout_s)
        sha, why = suite.gate_through_api(self.srv.port, timeout_s=max(self.load.timeout_s, suite.GATE_TIMEOUT_S))
        if why:
            raise server.ServerError(f"side {self.side}: the gate's requests failed: {why}")
        return {"startup_s": startup, "token_sha256": sha, "log_path": str(self.srv.log_path), "pid": self.srv.proc.pid}

    def _level(self) -> dict:
        lv = suite.run_level(self.srv, self.load, "concurrency", self.c, self.offset)
        self.offset += lv["requests"] + self.c
        if lv["error"] or not self.srv.alive() or lv.get("e2e_s_median") is None:
            died = "" if self.srv.alive() else f"the server died during the level: {self.srv.death()}"
            raise server.ServerError(f"side {self.side}: {lv['error'] or died or 'no request completed'}")
        return lv

    def warm(self) -> None:
        self._level()

    def call(self) -> dict:
        probe = host.host_probe(reps=1)
        lv = self._level()
        return {
            "probe_s": probe,
            "latency_s": lv["e2e_s_median"],
            "tpot_s": lv["tpot_s_median"],
            "ttft_s": lv["ttft_s_median"],
            "output_tok_per_s": lv["output_tok_per_s"],
            "client_cpu_share": lv["client_cpu_share"],
        }

    def stop(self) -> list[int]:
        return self.srv.stop()


class Target:
    """serve's paired target: start(side, label) launches that side's `vllm serve` with its own overlay and cache."""

    errors = (server.ServerError,)

    def __init__(
        self,
        sides_: dict,
        load: suite.Load,
        args: list[str],
        base_env: dict,
        out_dir: Path,
        *,
        stack: Stack | None = None,
        python: str | None = None,
        server_cls=server.Server,
        backend: str = "cpu",
    ):
        self.sides, self.load, self.args, self.base_env, self.out_dir = sides_, load, args, base_env, out_dir
        self.stack, self.python, self.server_cls, self.backend = (
            stack or description.default(),
            python,
            server_cls,
            backend,
        )

    def start(self, side: str, label: str) -> _Live:
        s = self.sides[side]
        run = launch.run_env(self.stack, self.backend, role=launch.SERVER, environ=self.base_env)
        env = sides.side_env(launch.start_env(run, s.cache_root, self.stack.embedded), s, self.backend)
        args = self.args + suite.engine_flags(s.settings.engine_args)  # later flags win in vLLM's parser
        srv = self.server_cls(args, env, self.out_dir / f"{label}.log", python=self.python)
        srv.launch()
        return _Live(side, srv, self.load)


def run_block(
    index: int,
    sides_: dict,
    load: suite.Load,
    args: list[str],
    base_env: dict,
    out_dir: Path,
    *,
    placement: str = placements.TOGETHER,
    rounds: int = DEFAULT_ROUNDS,
    python: str | None = None,
    server_cls=server.Server,
    warm_first: bool = False,
) -> Block:
    """One block of levels (paired.placement.run_block over this module's Target): one warm-up level a side,
    not counted, then `rounds` levels a side."""
    target = Target(sides_, load, args, base_env, out_dir, python=python, server_cls=server_cls)
    return placements.run_block(index, target, placement, rounds=rounds, warmup_calls=1, warm_first=warm_first)


def compare_series(
    dirs: dict,
    env,
    out_dir: Path,
    rule: stopping.Rule = stopping.DEFAULT_RULE,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    shape: str = suite.DEFAULT_SHAPE,
    python: str | None = None,
    backend: str = "cpu",
    placement: str = placements.AUTO,
    cache_dir: Path | None = None,
    out=print,
    server_cls=server.Server,
    stack: Stack | None = None,
    settings: dict | None = None,
    journal: stopping.Journal | None = None,
) -> dict:
    """B against A (series directories), servers of the stack paired at one concurrency until `rule` decides or
    stops (rule.rounds None: DEFAULT_ROUNDS levels a side a block); one JSON-able dict. journal (a walk's): where
    the finished blocks are recorded and read back (paired.journal), keyed here by what this measures too."""
    stack = stack or description.default()
    rule = dataclasses.replace(rule, rounds=rule.rounds_or(DEFAULT_ROUNDS))
    min_effect, floor = rule.min_effect, rule.floor
    where, why = placements.choose(placement, backend, side_settings.placement_stack(stack, settings or {}))
    out(f"placement: {where} ({why})")
    sides_ = sides.build_sides(dirs, env, out_dir, cache_dir, settings)
    load = suite.Load.from_shape(shape, concurrency=(concurrency,), startup_timeout_s=stack.start_timeout_s)
    args = suite.server_args_for(stack, load, concurrency, "" if stack.embedded else stack.tokenizer)
    target = Target(
        sides_,
        load,
        args,
        dict(os.environ),
        out_dir,
        stack=stack,
        python=python,
        server_cls=server_cls,
        backend=backend,
    )

    if journal is not None:
        journal = journal.keyed(
            f"serve {shape} c{concurrency}", shape=shape, concurrency=concurrency, args=args, stack=stack.hash(),
            backend=backend, placement=where, rounds=rule.rounds,
            settings={s: sides_[s].settings.digest() for s in SIDES},
        )  # fmt: skip
    result = stopping.measure_target(target, where, out_dir, rule, warmup_calls=1, out=out, journal=journal)
    good = result.good
    gates = report.paired_gates(good, gate.check(gate.stack_key(stack, backend), stack.gate_file))
    e2e = {s: [b.figure(s) for b in good if b.figure(s) is not None] for s in SIDES}

    def facts(s):
        return {**gates[s], "cache_keys": []}

    return {
        "suite": "serve",
        "shape": f"{shape} c={concurrency}",
        "figure": "e2e_s",
        "figure_label": "E2E A",
        "backend": backend,
        "concurrency": concurrency,
        **report.verdict_fields(result, min_effect, where, why, stack.summary(), backend, timed="levels"),
        "median_a": statistics.median(e2e["A"]) if e2e["A"] else None,
        "median_b": statistics.median(e2e["B"]) if e2e["B"] else None,
        "block_e2e_s": e2e,
        # TPOT and TTFT from the same blocks, by the same decision (the stopping rule followed E2E).
        "also": {key: result.also(key, min_effect, floor) for key in ALSO_DECIDED},
        "series": {s: str(d) for s, d in dirs.items()},
        "settings": {s: sides_[s].settings.to_json() for s in SIDES},
        "sides": {s: facts(s) for s in SIDES},
        "block_records": [b.to_json() for b in result.blocks],
    }
