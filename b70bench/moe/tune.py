"""A small sweep of Triton tilings per shape, each checked and timed like a suite row."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, replace

from b70bench import bandwidth, records
from b70bench.errors import Unavailable
from b70bench.fingerprint import fingerprint
from b70bench.moe import suite
from b70bench.moe import variants as varmod
from b70bench.moe.configs import Config, flag_order, from_fields, parse_fields, parse_label
from b70bench.moe.shapes import random_batch, random_weights, roofline_bytes

COLUMNS = [
    "tp",
    "tokens",
    "config",
    "programs",
    "time_us",
    "time_us_iqr",
    "gbps",
    "frac_copy",
    "rel_err",
    "ok",
    "skipped",
]


def configs(
    k: int, group: int, auto_bm: int, n: int = 3072, blocks: dict | None = None, sms: int = 132, pdl: bool = False
) -> list:
    """Candidate tilings, the likeliest first (the sweep stops at its deadline). Decode shapes
    start with the families the H200 sweeps found fastest (docs/moe-down.md: one pair per block, narrow
    tiles, deep K-blocks or prefetched 128-deep ones, packed dequant on paired nibbles, and with
    `pdl` (Hopper+) programmatic dependent launch), then a scored grid: about 2-8 programs per SM
    first, the in-kernel reduction before the second launch. `blocks` maps block_m to the number
    of expert blocks of the probe routing."""
    import math

    from b70bench.moe.launch import DOT_MIN_M, fit_block_k

    bms = [auto_bm] + ([1] if auto_bm == 2 else []) + ([DOT_MIN_M] if auto_bm < DOT_MIN_M else [])
    seeds = []
    if auto_bm < DOT_MIN_M:
        deep = min(512, 1 << max(7, (k - 1).bit_length()))
        for bn, bk, warps in ((32, deep, 4), (16, deep, 2), (64, 128, 2), (32, 256, 2), (32, deep, 2), (64, 128, 4)):
            for pf in (True, False):
                seeds.append(
                    Config(
                        block_m=1,
                        block_n=bn,
                        block_k=bk,
                        num_warps=warps,
                        num_stages=1,
                        packed=True,
                        paired=True,
                        prefetch=pf,
                        pdl=pdl,
                        early=pdl,
                    )
                )
        for bn, bk, warps in ((32, deep, 4), (64, 128, 2)):  # two rows of a group per 16-bit sum
            if bk >= group:
                seeds.append(
                    Config(
                        block_m=1,
                        block_n=bn,
                        block_k=bk,
                        num_warps=warps,
                        num_stages=1,
                        packed=True,
                        paired=True,
                        prefetch=True,
                        pdl=pdl,
                        early=pdl,
                        two_rows=True,
                    )
                )
        if pdl and auto_bm == 1 and deep >= group:  # -2r capped at the grid's share of SM slots
            programs = (blocks or {}).get(1, 8) * -(-n // 32)
            for tiled in (True, False):
                seeds.append(
                    Config(
                        block_m=1,
                        block_n=32,
                        block_k=deep,
                        num_warps=4,
                        num_stages=1,
                        packed=True,
                        paired=True,
                        tiled=tiled,
                        pdl=True,
                        early=True,
                        two_rows=True,
                        programs_per_sm=-(-programs // sms),
                    )
                )
        if pdl:  # both 256-deep blocks of a short split before the wait, the first dequantized there
            seeds.append(
                Config(
                    block_m=1,
                    block_n=32,
                    block_k=256,
                    num_warps=2,
                    num_stages=1,
                    packed=True,
                    paired=True,
                    prefetch=True,
                    pdl=True,
                    early=True,
                    dequant_early=True,
                )
            )
    if auto_bm == 2:  # shared experts: mixed tilings (2-pair blocks of pairs of pairs + these odd pairs)
        one = Config(
            block_m=1,
            block_n=64,
            block_k=128,
            num_warps=2,
            num_stages=1,
            packed=True,
            paired=True,
            prefetch=True,
            pdl=pdl,
            early=pdl,
        )
        for bn, bk in ((64, 128), (32, 256)):
            seeds.append(replace(one, block_m=2, block_n=bn, block_k=bk, prefetch=False, odd_pairs=one))
        if group <= 128:  # both launches with -2r
            two = replace(one, two_rows=True)
            seeds.insert(len(seeds) - 2, replace(two, block_m=2, prefetch=False, odd_pairs=two))
    cands = []
    for bm, bn, warps, split, fused, packed, stages in itertools.product(
        bms, (128, 64, 256), (4, 8), (1, 2, 3, 4, 6, 8), (True, False), (True, False), (3, 1, 4)
    ):
        if bm >= DOT_MIN_M and (bn > 128 or warps != 4 or packed or stages != 3):
            continue
        bk = fit_block_k(k, split, group, bm, bn, warps)
        if not bk or (split > 1 and bk < min(group, 128)):
            continue
        programs = (blocks or {}).get(bm, 8) * -(-n // bn) * split
        per_sm = programs / sms
        score = abs(math.log2(max(per_sm, 1e-3) / 4)) + (0 if fused else 0.75) + (1.5 if bm >= DOT_MIN_M else 0)
        score += 0.5 * (bm != auto_bm) + 0.25 * (warps != 4) + 0.25 * (bn == 256)
        # Decode blocks: packed 16x2 dequant and cp.async pipelining (stages 3) first, then the fp32 planes
        # and unpipelined loops that earlier sweeps found best (docs/moe-down.md).
        if bm < DOT_MIN_M:
            score += 0.6 * (not packed) + {3: 0, 1: 0.4, 4: 0.7}[stages]
        cands.append(
            (
                score,
                Config(
                    block_m=bm,
                    block_n=bn,
                    block_k=bk,
                    split_k=split,
                    num_warps=warps,
                    num_stages=stages,
                    fused_reduce=fused,
                    packed=packed,
                ),
            )
        )
    cands.sort(key=lambda c: c[0])
    return seeds + [c for _, c in cands if c not in seeds]


def sweep(
    dev,
    shape,
    tps,
    tokens,
    dtype,
    graph: bool = True,
    repeat: int = 10,
    seed: int = 0,
    seconds: float = 1e9,
    tilings: list | None = None,
) -> list[dict]:
    """Every tiling in configs() (or `tilings`, where a block_m of 0 takes the routing's own) per
    (tp, tokens), until `seconds` have passed (compiles dominate). A tiling that does not fit a
    shape is a row with the reason, not an error."""
    from b70bench.moe import launch

    per_shape = seconds / max(1, len(tps) * len(tokens))
    reason = varmod.triton_reason(dev)
    if reason:
        raise Unavailable(reason)
    anchor = bandwidth.anchor_gbps(dev)
    fp = fingerprint(dev)
    cache = suite.cache_bytes(dev)
    ref = varmod.Reference()
    rows = []
    for tp in tps:
        k = shape.k(tp)
        for ntok in tokens:
            probe = random_batch(shape, k, ntok, dtype, dev.torch_device, seed + ntok)
            nbytes = roofline_bytes(shape, k, probe, dtype)
            sets, copies = suite.rotation(
                nbytes, probe.experts_hit, shape.experts, k * shape.hidden // 2, cache, 4 << 30
            )
            wsets = [random_weights(shape, k, dtype, dev.torch_device, seed + c + 1) for c in range(copies)]
            batches = [probe] + [
                random_batch(shape, k, ntok, dtype, dev.torch_device, seed + ntok + 7 * i) for i in range(1, sets)
            ]
            mean_bytes = sum(roofline_bytes(shape, k, b, dtype) for b in batches) / len(batches)
            deadline = time.monotonic() + per_shape
            auto = launch.auto_block_m(probe.ids_cpu)
            blocks = {bm: launch.group_pairs(probe.ids_cpu, bm)[1].numel() for bm in {1, 2, auto, 16}}
            sms = varmod.sm_count(dev.torch_device)
            pdl = launch.pdl_reason(dev.torch_device) is None
            cands = (
                configs(k, shape.group, auto, shape.hidden, blocks, sms, pdl)
                if tilings is None
                else [replace(t, block_m=t.block_m or auto) for t in tilings]
            )
            for cfg in cands:
                if time.monotonic() > deadline:
                    break
                try:
                    launch.check_config(cfg, k, shape.group)
                except ValueError as err:
                    rows.append(
                        records.record(
                            "moe-down-tune",
                            fingerprint=fp,
                            tp=tp,
                            tokens=ntok,
                            k=k,
                            config=cfg.label(),
                            skipped=str(err),
                        )
                    )
                    continue
                v = varmod.TritonVariant("triton-tune", config=cfg)
                if cfg.block_m not in blocks:
                    blocks[cfg.block_m] = launch.group_pairs(probe.ids_cpu, cfg.block_m)[1].numel()
                row = dict(
                    tp=tp,
                    tokens=ntok,
                    k=k,
                    n=shape.hidden,
                    config=cfg.label(),
                    tiling=asdict(cfg),
                    experts_hit=probe.experts_hit,
                    programs=blocks[cfg.block_m] * -(-shape.hidden // cfg.block_n) * cfg.split_k,
                    graph=graph,
                )
                try:
                    row.update(suite.check(v, ref, shape, wsets[0], k, ntok, dtype, dev, seed + 31 * ntok))
                    row.update(suite.time_variant(dev, v, wsets, batches, graph, repeat, 3, mean_bytes, anchor))
                except Exception as err:  # one tiling that fails to compile or launch must not end the sweep
                    row["skipped"] = suite.failed(dev, err)
                rows.append(records.record("moe-down-tune", fingerprint=fp, **row))
            del wsets, batches
            dev.empty_cache()
    rows.sort(key=lambda r: (r["tp"], r["tokens"], r.get("time_us") is None, r.get("time_us") or 0))
    return rows


def parse_tiling(text: str):
    """--tilings' argument: a tiling label, `key=value,key=value` (Config's field names), or the JSON object a
    sweep stores for a tiling (a row's `tiling`); a clear error naming the expected form otherwise."""
    from b70bench.errors import UsageError

    text = text.strip()
    try:
        if text.startswith("{"):
            try:
                values = json.loads(text)
            except ValueError as err:
                raise ValueError(f"{text!r} is not a JSON object: {err}") from None
            return from_fields(values)
        if "=" in text:
            return parse_fields(text)
    except ValueError as err:
        raise UsageError(f"--tilings: {err}") from None
    try:
        return parse_label(text)
    except ValueError:
        raise UsageError(
            f"--tilings: {text!r} is not a tiling label; write it as the sweep prints it, "
            f"e.g. m1n32k512s1w4st1sum-packed-paired-pf-pdl-early, flags in the order {flag_order()}; "
            "a mixed tiling joins a 2-pair and a 1-pair label with +; or by field names: "
            "key=value,key=value or a JSON object"
        ) from None
