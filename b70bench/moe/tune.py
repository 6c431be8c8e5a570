"""A small sweep of Triton tilings per shape, each checked and timed like a suite row."""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import asdict

from b70bench import copy, records
from b70bench.errors import Unavailable
from b70bench.fingerprint import fingerprint
from b70bench.moe import suite
from b70bench.moe import variants as varmod
from b70bench.moe.shapes import random_batch, random_weights, roofline_bytes

COLUMNS = ["tp", "tokens", "config", "programs", "time_us", "time_us_iqr", "gbps", "frac_copy", "rel_err", "ok"]


def configs(k: int, group: int, auto_bm: int) -> list:
    from b70bench.moe.kernels import Config, fit_block_k

    out = []
    for bm, fused, bn, split in itertools.product(sorted({auto_bm, 16}), (True, False), (32, 64, 128),
                                                  (1, 2, 4, 8)):
        bk = fit_block_k(k, split, group, bm, bn)
        if bk:
            out.append(Config(block_m=bm, block_n=bn, block_k=bk, split_k=split, fused_reduce=fused))
    return out


def sweep(dev, shape, tps, tokens, dtype, graph: bool = True, repeat: int = 10, seed: int = 0,
          seconds: float = 1e9) -> list[dict]:
    """Every tiling in configs() per (tp, tokens), until `seconds` have passed (compiles dominate)."""
    from b70bench.moe import kernels

    per_shape = seconds / max(1, len(tps) * len(tokens))
    reason = varmod.triton_reason(dev)
    if reason:
        raise Unavailable(reason)
    anchor = copy.anchor_gbps(dev)
    fp = fingerprint(dev)
    cache = suite.cache_bytes(dev)
    ref = varmod.Reference()
    rows = []
    for tp in tps:
        k = shape.k(tp)
        for ntok in tokens:
            probe = random_batch(shape, k, ntok, dtype, dev.torch_device, seed + ntok)
            nbytes = roofline_bytes(shape, k, probe, dtype)
            sets, copies = suite.rotation(nbytes, probe.experts_hit, shape.experts, k * shape.hidden // 2, cache,
                                          4 << 30)
            wsets = [random_weights(shape, k, dtype, dev.torch_device, seed + c + 1) for c in range(copies)]
            batches = [probe] + [random_batch(shape, k, ntok, dtype, dev.torch_device, seed + ntok + 7 * i)
                                 for i in range(1, sets)]
            mean_bytes = sum(roofline_bytes(shape, k, b, dtype) for b in batches) / len(batches)
            deadline = time.monotonic() + per_shape
            for cfg in configs(k, shape.group, kernels.auto_block_m(probe.ids_cpu)):
                if time.monotonic() > deadline:
                    break
                v = varmod.TritonVariant("triton-tune", config=cfg)
                blocks = kernels.group_pairs(probe.ids_cpu, cfg.block_m)[1].numel()
                row = dict(tp=tp, tokens=ntok, k=k, n=shape.hidden, config=cfg.label(), tiling=asdict(cfg),
                           experts_hit=probe.experts_hit,
                           programs=blocks * -(-shape.hidden // cfg.block_n) * cfg.split_k, graph=graph)
                row.update(suite.check(v, ref, shape, wsets[0], k, ntok, dtype, dev, seed + 31 * ntok))
                row.update(suite._time(dev, v, wsets, batches, graph, repeat, 3, mean_bytes, anchor))
                rows.append(records.record("moe-down-tune", fingerprint=fp, **row))
            del wsets, batches
            dev.empty_cache()
    rows.sort(key=lambda r: (r["tp"], r["tokens"], r["time_us"]))
    return rows


def load_tuned(path) -> dict:
    """(K, N, tokens) -> the fastest correct Config of a sweep's JSON (`--tune --json FILE`)."""
    from b70bench.errors import UsageError
    from b70bench.moe.kernels import Config

    try:
        with open(path) as f:
            rows = json.load(f)["records"]
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot read tuned tilings from {path}: {err}; write them with --tune --json FILE") from None
    best = {}
    for r in rows:
        if not r.get("ok") or r.get("time_us") is None:
            continue
        key = (r.get("k") or shape_k(r), r.get("n") or 3072, r["tokens"])
        if key not in best or r["time_us"] < best[key]["time_us"]:
            best[key] = r
    return {key: Config(**r["tiling"]) if "tiling" in r else parse_label(r["config"]) for key, r in best.items()}


LABEL = re.compile(r"m(\d+)n(\d+)k(\d+)s(\d+)w(\d+)st(\d+)(sum|fused)$")


def parse_label(label: str):
    """Config from its label, e.g. m1n64k128s4w4st3sum (older sweep files carry only this)."""
    from b70bench.moe.kernels import Config

    m = LABEL.match(label)
    if not m:
        raise ValueError(f"not a tiling label: {label!r}")
    bm, bn, bk, split, warps, stages = map(int, m.groups()[:6])
    return Config(bm, bn, bk, split, warps, stages, m.group(7) == "fused")


def shape_k(row: dict) -> int:
    """K of an older sweep row without one: MiniMax's intermediate 1536 over its TP."""
    return 1536 // row["tp"]
