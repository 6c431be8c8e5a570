"""Two servers paired in time: `b70bench compare --suite serve A B`.

A block: both sides' servers started together (each importing its own patched copy of vLLM, patches.overlay,
each on its own port), each gated through its API and warmed by one level, then `rounds` rounds of one
closed-loop level at concurrency C per side, which side goes first alternating by round. A side's value in a
round is its level's median end-to-end latency (E2E), with the host probe taken just before the level: not TPOT,
because on a slow host the API server hands tokens out in bursts, and a level's median TPOT then reads ~0 in one
round and several ms in the next (seen at c=16 on the 2-core VM), while E2E holds the whole request. The
block's B/A and the blocks-until-decided loop are decode's (decode.pair.Block, decode.pair.measure): the same
statistics, the same four verdicts. Every server is stopped and reaped by PID when its block ends, however it ends.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from b70bench import records
from b70bench.decode import child, pair
from b70bench.decode import model as modelmod
from b70bench.serve import server, suite

DEFAULT_CONCURRENCY = 16
# Paired levels a side per block: enough for the block's own standard error (pair.MIN_ROUNDS_FOR_SE). With 8, the
# blocks were combined by the t over their values, and three blocks of a ~19% slowdown at 16 requests (1.14-1.25)
# left it undecided at the walk's level.
DEFAULT_ROUNDS = pair.MIN_ROUNDS_FOR_SE


def side_env(base_env: dict, side: pair.Side, embedded: bool) -> dict:
    env = suite.server_env(base_env, "cpu", side.cache_root, embedded)
    if side.overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(side.overlay), env["PYTHONPATH"]])
    return env


def run_block(
    index: int,
    sides: dict,
    load: suite.Load,
    args: list[str],
    base_env: dict,
    out_dir: Path,
    *,
    rounds: int = DEFAULT_ROUNDS,
    embedded: bool = True,
    python: str | None = None,
    server_cls=server.Server,
) -> pair.Block:
    c = load.concurrency[0]
    block = pair.Block(index)
    t0 = time.monotonic()
    servers: dict[str, server.Server] = {}
    first = pair.SIDES if index % 2 == 0 else pair.SIDES[::-1]
    try:
        for s in first:
            env = side_env(base_env, sides[s], embedded)
            servers[s] = server_cls(args, env, out_dir / f"block{index:02d}-{s}.log", python=python)
            servers[s].launch()
        for s in first:
            startup = servers[s].wait_healthy(load.startup_timeout_s)
            sha, why = suite.gate_through_api(servers[s].port, timeout_s=max(load.timeout_s, suite.GATE_TIMEOUT_S))
            if why:
                raise server.ServerError(f"side {s}: the gate's requests failed: {why}")
            block.starts[s] = {
                "startup_s": startup,
                "token_sha256": sha,
                "log_path": str(servers[s].log_path),
                "pid": servers[s].proc.pid,
            }
        offset = 1000
        for s in first:  # one warm-up level each, not counted
            suite.run_level(servers[s], load, "concurrency", c, offset)
        offset += 2 * (suite.requests_for(c) + c)
        tb = time.monotonic()
        for r in range(rounds):
            for s in first if r % 2 == 0 else first[::-1]:
                probe = child.host_probe(reps=1)
                lv = suite.run_level(servers[s], load, "concurrency", c, offset)
                offset += lv["requests"] + c
                if lv["error"] or not servers[s].alive() or lv.get("e2e_s_median") is None:
                    died = "" if servers[s].alive() else f"the server died during the level: {servers[s].death()}"
                    raise server.ServerError(f"side {s}: {lv['error'] or died or 'no request completed'}")
                block.calls.append(
                    {
                        "side": s,
                        "round": r,
                        "probe_s": probe,
                        "latency_s": lv["e2e_s_median"],
                        "tpot_s": lv["tpot_s_median"],
                        "ttft_s": lv["ttft_s_median"],
                        "output_tok_per_s": lv["output_tok_per_s"],
                        "client_cpu_share": lv["client_cpu_share"],
                        "t_s": round(time.monotonic() - tb, 4),
                    }
                )
    except server.ServerError as err:
        block.error = str(err)
    finally:
        for s, srv in servers.items():
            left = srv.stop()
            if left:
                block.error = (block.error or "") + f"; side {s} left pids {left} alive"
        block.wall_s = time.monotonic() - t0
    return block


def compare_series(
    dirs: dict,
    env,
    out_dir: Path,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    shape: str = suite.DEFAULT_SHAPE,
    budget_s: float,
    level: float,
    min_effect: float,
    floor: float,
    rounds: int = DEFAULT_ROUNDS,
    first_blocks: int = 4,
    python: str | None = None,
    cache_dir: Path | None = None,
    out=print,
    server_cls=server.Server,
) -> dict:
    """B against A (series directories), servers paired in time at one concurrency; one JSON-able dict."""
    from b70bench import compare

    sides = compare.build_sides(dirs, env, out_dir, cache_dir)
    load = suite.Load.from_shape(shape, concurrency=(concurrency,))
    model = str(modelmod.ensure_embedded())
    from b70bench.decode import suite as decode_suite

    max_len = max(decode_suite.DEFAULT_MAX_MODEL_LEN, load.prompt_len + load.output_len)
    args = suite.server_args(model, max_len, concurrency, "bfloat16", [], "")
    base = dict(os.environ)

    def run_one(i: int) -> pair.Block:
        b = run_block(i, sides, load, args, base, out_dir, rounds=rounds, python=python, server_cls=server_cls)
        records.atomic_write_text(out_dir / f"block{i:02d}.json", json.dumps(b.to_json()) + "\n")
        return b

    result = pair.measure(
        run_one,
        budget_s=budget_s,
        level=pair.per_look_level(level),
        min_effect=min_effect,
        floor=floor,
        first_blocks=first_blocks,
        out=out,
    )
    good = result.good
    gate_key = compare.cpu_gate_key()
    e2e = {s: [b.figure(s) for b in good if b.figure(s) is not None] for s in pair.SIDES}

    def facts(s):
        hashes, gate_word = compare.side_gate(good, s, gate_key)
        return {"gate": gate_word, "token_sha256": hashes, "cache_keys": []}

    return {
        "suite": "serve",
        "shape": f"{shape} c={concurrency}",
        "figure": "e2e_s",
        "figure_label": "E2E A",
        "concurrency": concurrency,
        **compare.verdict_fields(result, min_effect),
        "median_a": statistics.median(e2e["A"]) if e2e["A"] else None,
        "median_b": statistics.median(e2e["B"]) if e2e["B"] else None,
        "block_e2e_s": e2e,
        "series": {s: str(d) for s, d in dirs.items()},
        "sides": {s: facts(s) for s in pair.SIDES},
        "block_records": [b.to_json() for b in result.blocks],
    }
