"""measure(): the moe-down suite's one measuring function; every row is checked and timed.

Per (tp, tokens): a check (fresh random activations and routing, poisoned output) against a
float64 dequantized reference and against the `reference` variant, then timing over enough
rotated weight/input sets that the weights come from device memory, not the cache.
"""

from __future__ import annotations

import math

import torch

from b70bench import bandwidth, records, timing
from b70bench.device import Device
from b70bench.errors import Unavailable, UsageError
from b70bench.fingerprint import fingerprint
from b70bench.moe import layout
from b70bench.moe import variants as varmod
from b70bench.moe.shapes import TOKENS, TPS, MoeShape, random_batch, random_weights, roofline_bytes

MB = 1e6
WORK = "down projection"  # what a row computes, unless its variant says otherwise
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 3e-3}  # ||out - ref64|| / ||ref64||
COLD_FACTOR = 8  # rotated bytes per cycle >= 8x the last-level cache: reads come from memory
MAX_SETS = 64


def rotates(dev: Device) -> bool:
    """The CPU's variants are compute-bound and slow: rotating sets there only costs time."""
    return dev.backend != "cpu"


def cache_bytes(dev: Device) -> int:
    """Last-level cache the rotation must defeat: L2 on GPUs, L3 on the CPU."""
    if dev.backend == "cuda":
        return int(torch.cuda.get_device_properties(dev.index).L2_cache_size)
    if dev.backend == "xpu":
        return int(getattr(torch.xpu.get_device_properties(dev.index), "l2_cache_size", 64 << 20) or 64 << 20)
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip().upper()
        return int(text.rstrip("KM")) << (20 if text.endswith("M") else 10)
    except (OSError, ValueError):
        return 32 << 20


def reference64(weights, batch) -> torch.Tensor:
    """The function itself: float64 dequantized weights, float64 products and sums."""
    t, topk, k = batch.x.shape
    x = batch.x.reshape(t * topk, k).double()
    out = torch.zeros((t, weights.qweight.shape[-1]), dtype=torch.float64, device=batch.x.device)
    for e, pidx, tidx, w in varmod.expert_groups(batch):
        wd = layout.dequantize(weights.qweight[e], weights.scales[e], weights.group, torch.float64)
        out.index_add_(0, tidx, (x[pidx] @ wd) * w.double())
    return out


def diffs(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """max |d|, mean |d|, ||d|| / ||ref||; NaN anywhere (an unwritten poisoned element) gives NaN."""
    d = (out.double() - ref.double()).abs()
    if not torch.isfinite(d).all():
        return math.nan, math.nan, math.nan
    return float(d.max()), float(d.mean()), float(d.norm() / ref.double().norm().clamp_min(1e-300))


def run_poisoned(variant, weights, batch) -> torch.Tensor:
    t, n = batch.tokens, weights.qweight.shape[-1]
    out = torch.full((t, n), float("nan"), dtype=batch.x.dtype, device=batch.x.device)
    res = variant.prepare(weights, batch, out)()
    return res


def check(variant, reference, shape: MoeShape, weights, k: int, tokens: int, dtype, dev: Device, seed: int) -> dict:
    """Correctness on a fresh batch, never zeros, against float64 and the reference variant."""
    batch = random_batch(shape, k, tokens, dtype, dev.torch_device, seed)
    out = run_poisoned(variant, weights, batch)
    own = getattr(variant, "reference64", None)  # a variant computing more than the down projection
    ref_out = None if own else run_poisoned(reference, weights, batch)
    ref64 = own(weights, batch) if own else reference64(weights, batch)
    dev.synchronize()
    mx, mean, rel = diffs(out, ref64)
    mx_r, mean_r, _ = diffs(out, ref_out) if ref_out is not None else (None, None, None)
    ok = not math.isnan(rel) and rel <= TOLERANCE[dtype]
    return {"max_diff": mx, "mean_diff": mean, "rel_err": rel, "max_diff_ref": mx_r, "mean_diff_ref": mean_r, "ok": ok}


def rotation(
    per_call_bytes: int, hit: int, experts: int, expert_bytes: int, cache: int, budget: int
) -> tuple[int, int]:
    """(sets, weight copies): cycle through enough distinct data that each call reads memory,
    within a memory budget; sets spread over copies so their routed experts rarely repeat."""
    sets = max(1, min(MAX_SETS, math.ceil(COLD_FACTOR * cache / max(1, per_call_bytes))))
    copies = max(1, math.ceil(sets * hit / experts))
    copies = max(1, min(copies, budget // max(1, experts * expert_bytes)))
    return sets, copies


def measure(
    dev: Device,
    variant_names: list[str] | None = None,
    tokens=TOKENS,
    tps=TPS,
    dtype: torch.dtype = torch.bfloat16,
    graph: bool = False,
    shape: MoeShape | None = None,
    repeat: int = 20,
    warmup: int = 3,
    seed: int = 0,
    memory_budget: int | None = None,
    anchor_gbps: float | None = None,
    tuned: dict | None = None,
) -> list[dict]:
    """One record per (variant, tokens, tp): time, bandwidth, fraction of copy, diffs, skip reason."""
    shape = shape or MoeShape()
    shape.validate()
    if dtype not in TOLERANCE:
        raise UsageError(f"dtype {dtype} is not supported: use bf16 or fp16")
    ks = {tp: shape.k(tp) for tp in tps}  # bad shards fail before anything is measured
    if any(t < 1 for t in tokens):
        raise UsageError(f"--tokens must all be >= 1, got {list(tokens)}")
    if graph and not dev.has_graphs:
        raise UsageError(f"backend {dev.backend!r} cannot capture graphs: drop --graph")
    chosen = varmod.select(variant_names)
    for v in chosen:
        if tuned and getattr(v, "htile", False):
            v.tuned = tuned
    reference = varmod.Reference()
    anchor = anchor_gbps if anchor_gbps is not None else bandwidth.anchor_gbps(dev)
    fp = fingerprint(dev)
    cache = cache_bytes(dev)
    budget = memory_budget or (4 << 30 if dev.backend != "cpu" else 1 << 30)
    rows = []
    for tp in tps:
        k = ks[tp]
        expert_bytes = k * shape.hidden // 2
        for ntok in tokens:
            base = dict(
                variant=None,
                tp=tp,
                tokens=ntok,
                k=k,
                n=shape.hidden,
                experts=shape.experts,
                topk=shape.topk,
                dtype=str(dtype).removeprefix("torch."),
                graph=graph,
                copy_gbps=anchor,
            )
            probe = random_batch(shape, k, ntok, dtype, dev.torch_device, seed + 1000 * tp + ntok)
            nbytes = roofline_bytes(shape, k, probe, dtype)
            sets, copies = rotation(
                nbytes, probe.experts_hit, shape.experts, expert_bytes, cache if rotates(dev) else 0, budget
            )
            wsets = [random_weights(shape, k, dtype, dev.torch_device, seed + 17 * c + 1) for c in range(copies)]
            batches = [probe] + [
                random_batch(shape, k, ntok, dtype, dev.torch_device, seed + 1000 * tp + ntok + 7 * i)
                for i in range(1, sets)
            ]
            set_bytes = [roofline_bytes(shape, k, b, dtype) for b in batches]
            mean_bytes = sum(set_bytes) / len(set_bytes)
            base.update(
                experts_hit=probe.experts_hit,
                bytes=int(mean_bytes),
                rotation_sets=sets,
                weight_copies=copies,
                rotated_mb=sum(set_bytes) / MB,
                cache_mb=cache / MB,
                cold=sum(set_bytes) >= COLD_FACTOR * cache,
            )
            for i, v in enumerate(chosen):
                row = dict(base, variant=v.name, work=getattr(v, "work", WORK))
                reason = v.unavailable_reason(dev, dtype)
                if reason is None:
                    try:
                        row["config"] = v.label(wsets[0], probe) if hasattr(v, "label") else None
                        row.update(
                            check(
                                v,
                                reference,
                                shape,
                                wsets[0],
                                k,
                                ntok,
                                dtype,
                                dev,
                                seed + 100_000 + 1000 * tp + 10 * ntok + i,
                            )
                        )
                        v_bytes = mean_bytes
                        if hasattr(v, "roofline_bytes"):
                            v_bytes = sum(v.roofline_bytes(wsets[0], b) for b in batches) / len(batches)
                            row["bytes"] = int(v_bytes)
                        row.update(time_variant(dev, v, wsets, batches, graph, repeat, warmup, v_bytes, anchor))
                    except Unavailable as err:
                        reason = str(err)
                    except Exception as err:  # one variant failing on one shape must not end the others' rows
                        reason = failed(dev, err)
                row["skipped"] = reason
                rows.append(records.record("moe-down", fingerprint=fp, **row))
            del wsets, batches, probe
            dev.empty_cache()
    return rows


def failed(dev, err: Exception) -> str:
    """A row's reason for an error raised while checking or timing it, once the device has drained."""
    dev.synchronize()
    first = (str(err).splitlines() or [""])[0][:200]
    return f"failed: {type(err).__name__}: {first}"


def time_variant(dev, v, wsets, batches, graph, repeat, warmup, mean_bytes, anchor) -> dict:
    """Time variant v over the rotated weight sets and batches: timing.measure's summary, bandwidth and
    fraction of the copy anchor."""
    outs, calls = [], []
    for i, b in enumerate(batches):
        out = torch.empty((b.tokens, wsets[0].qweight.shape[-1]), dtype=b.x.dtype, device=b.x.device)
        outs.append(out)
        calls.append(v.prepare(wsets[i % len(wsets)], b, out))
    state = {"i": 0}

    def fn():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    # A sample covers whole rotation cycles; graphs replay at least 16 calls so the replay's
    # own launch is spread thin.
    number = len(calls) * (math.ceil(16 / len(calls)) if graph else 1)
    t = timing.measure(dev, fn, warmup=warmup, repeat=repeat, number=number, graph=graph)
    gbps = mean_bytes / t.median / 1e9
    return {**t.summary(), "samples_s": t.samples, "gbps": gbps, "frac_copy": gbps / anchor if anchor else None}
