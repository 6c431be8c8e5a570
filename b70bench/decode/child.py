"""One vLLM run in a fresh process: `python -m b70bench.decode.child SPEC.json`.

Started by runner.py in its own process group. Starts the offline `LLM` engine, decodes the
quality-gate prompts greedily (and any text canaries, canary.py), times `iterations` batches of
the benchmark shape with `LLM.generate` (the call `vllm.benchmarks.latency` times), then
streams `stream_iterations` more through the engine step by step to see when each token arrives
(TTFT and inter-token latency). Prints exactly one line starting with RESULT_PREFIX, JSON, and exits.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

from b70bench.stack.host import Interference, host_probe, peak_memory
from b70bench.stack.shapes import bench_prompts

RESULT_PREFIX = "B70BENCH_DECODE_RESULT "


def stream_once(llm, prompts: list[list[int]], output_len: int, tag: str, temperature: float = 0.0) -> dict:
    """One batch through the engine step by step; a timestamp for every token as it arrives."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    t0 = time.perf_counter()
    arrivals: dict[str, list[float]] = {}
    for i, p in enumerate(prompts):
        sp = SamplingParams(
            temperature=temperature,
            max_tokens=output_len,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        rid = f"{tag}-{i}"
        arrivals[rid] = []
        engine.add_request(rid, TokensPrompt(prompt_token_ids=p), sp)
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.request_id in arrivals:
                arrivals[out.request_id].extend([now] * len(out.outputs[0].token_ids))
    total = time.perf_counter() - t0
    ttft = [a[0] - t0 for a in arrivals.values() if a]
    itl = [b - a for seq in arrivals.values() for a, b in zip(seq, seq[1:], strict=False)]
    return {
        "total_s": total,
        "ttft_s": max(ttft) if ttft else None,
        "itl_s": itl,
        "tokens": sum(len(a) for a in arrivals.values()),
    }


def start(spec: dict):
    """Start the engine, run the gate (and canaries) and the warm-up; returns (llm, result, prompts, params)."""
    t_start = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from b70bench.stack import gate

    kwargs = dict(
        model=spec["model"],
        skip_tokenizer_init=True,
        seed=0,
        enable_prefix_caching=False,
        max_model_len=spec["max_model_len"],
        tensor_parallel_size=spec.get("tp", 1),
    )
    if spec.get("dtype"):
        kwargs["dtype"] = spec["dtype"]
    if spec.get("memory_fraction") is not None:
        kwargs["gpu_memory_utilization"] = spec["memory_fraction"]
    kwargs.update(spec.get("engine_args") or {})
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t_start
    vocab = getattr(llm.llm_engine.model_config.hf_config, "vocab_size", None)

    result: dict = {"ok": True, "start_s": start_s, "engine_args": {k: str(v) for k, v in kwargs.items()}}
    if spec.get("gate", True):
        gsp = SamplingParams(temperature=0.0, max_tokens=gate.OUTPUT_LEN, ignore_eos=True, detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in gate.prompts(vocab)], gsp, use_tqdm=False)
        ids = [list(o.outputs[0].token_ids) for o in outs]
        result["gate_token_ids"] = ids
        result["token_sha256"] = gate.token_sha256(ids)
    if spec.get("canaries"):
        from b70bench.decode import canary

        trust = bool((spec.get("engine_args") or {}).get("trust_remote_code"))
        result["canaries"], result["canaries_skipped"] = canary.run_in_engine(
            llm, spec["canaries"], spec.get("tokenizer") or spec["model"], trust
        )

    prompts = bench_prompts(spec["prompt_len"], spec["batch"], vocab)
    tprompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    # Greedy by default; temperature 1.0 reproduces vllm.benchmarks.latency's sampling cost exactly.
    temperature = float(spec.get("temperature", 0.0))
    sp = SamplingParams(temperature=temperature, max_tokens=spec["output_len"], ignore_eos=True, detokenize=False)
    for _ in range(spec.get("warmup", 1)):
        llm.generate(tprompts, sp, use_tqdm=False)
    result["ready_s"] = time.perf_counter() - t_start
    return llm, result, tprompts, sp


def run(spec: dict) -> dict:
    llm, result, tprompts, sp = start(spec)
    prompts = [p["prompt_token_ids"] for p in tprompts]
    temperature = sp.temperature
    latencies, foreign = [], []
    generated = 0
    probe = Interference()
    host = [host_probe()]
    for _ in range(spec.get("iterations", 5)):
        probe.start()
        t0 = time.perf_counter()
        outs = llm.generate(tprompts, sp, use_tqdm=False)
        latencies.append(time.perf_counter() - t0)
        foreign.append(probe.share())
        generated = sum(len(o.outputs[0].token_ids) for o in outs)
    host.append(host_probe())
    result["host_probe_s"] = host
    result["latencies_s"] = latencies
    result["foreign_cpu_share"] = foreign
    result["generated_tokens"] = generated
    streams = [
        stream_once(llm, prompts, spec["output_len"], f"stream{i}", temperature)
        for i in range(spec.get("stream_iterations", 1))
    ]
    result["stream_total_s"] = [s["total_s"] for s in streams]
    result["ttft_s"] = [s["ttft_s"] for s in streams]
    result["itl_s"] = [x for s in streams for x in s["itl_s"]]
    result["peak_memory_bytes"], result["peak_memory_scope"] = peak_memory()
    return result


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        result = run(spec)
        code = 0
    except BaseException as err:  # the one line must come out whatever vLLM raised
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(err).__name__}: {err}".splitlines()[0][:400]}
        code = 1
    sys.stderr.flush()
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
