"""Device busy time a decode token against wall time a token, for a stack's model (the stand-in's, vllm_gpu.sh
stage standin-profile):

    PYTHONPATH=$SITE:$ROOT python3 scripts/device/standin_profile.py STACK.toml [--shape p512n64] [--json FILE]

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so torch.profiler sees its kernels, CUDA-graph
replays included. Each figure is a difference of two generate calls on the same prompt (n tokens and 1 token), so
the prefill and the call's fixed cost drop out: wall a token, unprofiled (the least of --calls calls each), and the
device's busy time a token (the union of kernel, copy and set intervals, b70bench.stack.busy) under the profiler.
busy / wall near 1: a step waits on the device; well below: on the host, which then hides device work.
"""

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vLLM is imported: it reads it once

from b70bench.stack import busy, description, seeded_loader, shapes  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stack")
    ap.add_argument("--shape", default="p512n64", help="prompt and output tokens of the timed calls")
    ap.add_argument("--calls", type=int, default=3, help="unprofiled calls of each length (the least is kept)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    stack = description.load(args.stack)
    prompt_len, n, batch = shapes.parse_shape(args.shape)
    if n < 2:
        print("the shape needs 2 or more output tokens (p512n64)", file=sys.stderr)
        return 2
    os.environ.update(stack.process_env({}, "cuda"))
    spec = stack.engine_spec(args.shape)
    if seeded_loader.wanted(spec["engine_args"]):
        seeded_loader.register()  # the engine is in this process: no plug-in needed

    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=spec["model"], skip_tokenizer_init=True, seed=0, enable_prefix_caching=False,
                  max_model_len=spec["max_model_len"], tensor_parallel_size=spec["tp"])  # fmt: skip
    if spec["dtype"]:
        kwargs["dtype"] = spec["dtype"]
    if spec["memory_fraction"] is not None:
        kwargs["gpu_memory_utilization"] = spec["memory_fraction"]
    kwargs.update(spec["engine_args"])
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    cfg = llm.llm_engine.vllm_config
    vocab = getattr(llm.llm_engine.model_config.hf_config, "vocab_size", None)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in shapes.bench_prompts(prompt_len, batch, vocab)]

    def call(tokens: int) -> float:
        sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    call(n), call(1)  # warm-up: the first call of a start is slower
    wall = {k: min(call(k) for _ in range(args.calls)) for k in (n, 1)}
    prof = {}
    for k in (n, 1):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            t = call(k)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            p.export_chrome_trace(path)
            with open(path) as f:
                prof[k] = {**busy.summary(json.load(f)), "wall_s": t}
    per = n - 1
    out = {
        "stack": stack.name,
        "shape": args.shape,
        "start_s": start_s,
        "async_scheduling": getattr(cfg.scheduler_config, "async_scheduling", None),
        "cudagraph_mode": str(getattr(cfg.compilation_config, "cudagraph_mode", None)),
        "wall_ms_per_token": 1e3 * (wall[n] - wall[1]) / per,
        "profiled_wall_ms_per_token": 1e3 * (prof[n]["wall_s"] - prof[1]["wall_s"]) / per,
        "busy_ms_per_token": 1e-3 * (prof[n]["busy_us"] - prof[1]["busy_us"]) / per,
        "kernel_sum_ms_per_token": 1e-3 * (prof[n]["sum_us"] - prof[1]["sum_us"]) / per,
        "device_events_per_token": (prof[n]["events"] - prof[1]["events"]) / per,
        "raw": {"wall_s": wall, "profiled": prof},
    }
    if out["device_events_per_token"] <= 0:
        print("the profiler saw no device work: its kernels were not traced here (no figure)", file=sys.stderr)
        out["busy_ms_per_token"] = None
    else:
        out["busy_over_wall"] = out["busy_ms_per_token"] / out["wall_ms_per_token"]
    print(
        f"{stack.name} {args.shape}: wall {out['wall_ms_per_token']:.3f} ms a token (unprofiled), "
        f"{out['profiled_wall_ms_per_token']:.3f} profiled; device busy "
        + (
            f"{out['busy_ms_per_token']:.3f} ms a token ({out['busy_over_wall']:.2f} of the wall), "
            if out["busy_ms_per_token"] is not None
            else "unknown, "
        )
        + f"{out['device_events_per_token']:.0f} device events a token; async scheduling "
        f"{out['async_scheduling']}, CUDA graphs {out['cudagraph_mode']}; start {start_s:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
