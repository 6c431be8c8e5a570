"""One moe-down kernel kept alive in its own process and timed on demand: `python -m b70bench.moe.live SPEC FD`.

The paired measurement's kernel target (moe.pair): the same protocol as decode.live, without vLLM. SPEC names the
variant, optionally a pinned tiling label (`variant@label`, Triton variants), the shard (tp), tokens, dtype and
backend; the process builds seeded weights and routing, prepares the kernel (compiling it into this process's
TRITON_CACHE_DIR), checks it once against the float64 reference and answers, one JSON line each on FD:

    first line -> {"ready": true, "pid", "label", "rel_err"} or {"ok": false, "error"}
    call       -> the host probe, then `repeat` device-timed samples of `number` launches (graph replays where the
                  device has graphs): {"probe_s", "latency_s"} (the median seconds per launch)
    stop       -> exits
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def start(spec: dict):
    import torch

    from b70bench import device, timing
    from b70bench.moe import configs, suite
    from b70bench.moe import variants as varmod
    from b70bench.moe.shapes import MoeShape, random_batch, random_weights
    from b70bench.stack.host import host_probe

    dev = device.select(spec.get("backend"), None)
    dtype = getattr(torch, spec.get("dtype", "bfloat16"))
    shape = MoeShape()
    k = shape.k(int(spec.get("tp", 4)))
    name, _, tiling = spec["variant"].partition("@")
    (v,) = varmod.select([name])
    if tiling:
        v.config = configs.parse_label(tiling)
    why = v.unavailable_reason(dev, dtype)
    if why:
        raise RuntimeError(f"{name} cannot run here: {why}")
    seed = int(spec.get("seed", 0))
    weights = random_weights(shape, k, dtype, dev.torch_device, seed)
    batch = random_batch(shape, k, int(spec.get("tokens", 1)), dtype, dev.torch_device, seed)
    out = torch.empty((batch.tokens, shape.hidden), dtype=dtype, device=dev.torch_device)
    fn = v.prepare(weights, batch, out)
    fn()
    dev.synchronize()
    ref = suite.reference64(weights, batch)
    rel = float((out.double() - ref).norm() / ref.norm())
    graph = dev.has_graphs and spec.get("graph", True)
    number, repeat = int(spec.get("number", 20)), int(spec.get("repeat", 5))
    call = dev.capture(fn, number=number, warmup=3).replay if graph else None

    def timed() -> dict:
        probe = host_probe(reps=1)
        if graph:
            samples = [dev.elapsed(call, 1) / number for _ in range(repeat)]
        else:
            samples = timing.measure(dev, fn, warmup=1, repeat=repeat, number=number).samples
        return {"probe_s": probe, "latency_s": sorted(samples)[len(samples) // 2]}

    label = v.label(weights, batch) if hasattr(v, "label") else name
    return timed, {"ready": True, "pid": os.getpid(), "label": label, "rel_err": rel, "token_sha256": None}


def main(argv) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    out = os.fdopen(int(argv[2]), "w", buffering=1)

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        timed, ready = start(spec)
    except Exception as err:  # the parent reads one line and fails this side with it
        traceback.print_exc()
        reply({"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"})
        return 1
    reply(ready)
    # Stdin closes when the parent dies, however it died: the loop ends and the process exits with it.
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "call":
            reply(timed())
        elif cmd == "stop":
            reply({"stopped": True})
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
