"""The decode suite (`b70bench decode`): real vLLM offline decode, a quality gate, compile-cache identity.

Stable API (other suites and benchmarks/bench_decode.py call it; keep it compatible):

    from b70bench.decode import measure
    recs = measure(shapes=["p512n512"], runs=3, cold=True)      # list of flat dicts, one per run

measure(shapes=None, *, model=None, batch=1, tp=1, dtype=None, max_model_len=2048, memory_fraction=None,
        env=None, env_file=None, engine_args=None, runs=3, cold=True, iterations=10, warmup=1,
        stream_iterations=1, temperature=0.0, gate_check=True, canaries=None, tokenizer=None, hooks=(), out_dir=None,
        cache_root=None, timeout_s=1200, gate_file=None, device=None, python=None, on_record=None) -> list[dict]

- shapes: "p512n512" strings (prompt, output length; "b4" suffix sets batch) or (prompt, output, batch)
  tuples; default p512n512, p512n1536, p512n2048 at max_model_len 2048. A shape longer than
  max_model_len runs at prompt+output instead, and its record's `note` says so.
- model None: the embedded tiny MiniMax-M2 checkpoint (model.py), dtype bfloat16. Else any path or name.
- memory_fraction: vLLM's gpu_memory_utilization (on the CPU: share of host RAM for the KV cache,
  default 0.2 unless VLLM_CPU_KVCACHE_SPACE is set). env / env_file: variables for the vLLM process.
  engine_args: extra LLM(...) keyword arguments. hooks: in-process patches (hooks.py).
- Every run is a fresh child process (runner.py) with its own VLLM_CACHE_ROOT. cold=True: per shape
  one run on an empty compile cache (cold=True in its record), then `runs` warm runs on the cache
  it filled. cold=False: `runs` runs on the persistent cache_root (default ~/.cache/b70bench/vllm-cache);
  a run that still found it empty says cold=True.
- temperature: sampling of the timed iterations (the gate is always greedy); 1.0 is what
  vllm.benchmarks.latency samples with.
- canaries: text canaries (canary.py): "PROMPT=>EXPECTED" strings, (prompt, expected) pairs or dicts
  with max_tokens; expected None only records the text. Greedy, in the same start, through the
  model's tokenizer (or `tokenizer`; the embedded model has a word-level one, tokenizer.py); the
  engine stays token-id only either way. A failed canary fails the gate like a hash mismatch.
- python: interpreter for the child (default: this one). on_record: called with each record as it lands.
- settle_s: before each start wait up to this long for idle CPUs (0: don't). fixed_layout: start vLLM
  with ASLR off and PYTHONHASHSEED=0. On the CPU the child gets environment.CPU_ENGINE_ENV
  (VLLM_ENABLE_V1_MULTIPROCESSING=0) unless the caller set those variables.

Record fields (units in keys): shape (p512n512b1), prompt_len, output_len, batch, tp, model, dtype,
max_model_len, run, cold, ok, error (vLLM's reason in one line), output_tok_per_s, total_tok_per_s,
s_per_output_token, s_per_total_token (from the fastest of `iterations` timed LLM.generate calls in
that start: interference on a shared machine only adds time), s_per_output_token_median,
samples_s_per_output_token, latency_s, ttft_s, itl_s_p50/p90/p99 (from streamed iterations: every
token timestamped as LLM's engine returns it), kv_cache_tokens, peak_memory_bytes, cache_dir,
cache_keys (hex keys from vLLM's compile-cache paths: the 64-hex AOT key, the 10-hex directory key),
cache_state (loaded / compiled / compiled-again: <reason>), token_sha256, gate (0 pass, 1 fail,
None unpinned), gate_message, token_gate (the hash's verdict alone), canary_gate (1 when a canary
failed, 0 when all checked ones passed, else None), canaries (prompt, expected, text, token ids,
passed), canaries_skipped (why none ran, e.g. no tokenizer), log_path, load_1min_before/after,
foreign_cpu_share (share of all cores other processes used while the calls were timed: a slow
figure with a high share was interfered with), host_probe_s_before/after (a fixed pure-Python
loop timed around the calls: the host's own speed then), settle_s, cpu_busy_share_before, aslr_off, env (the
engine-relevant variables the child got: VLLM_*, OMP_*, PYTHONHASHSEED, ...), fingerprint.
When gate == 1 every speed figure is None.
"""

from __future__ import annotations

from b70bench.decode.starts import DEFAULT_ITERATIONS, DEFAULT_STARTS, PER_START_FIGURE, per_start
from b70bench.decode.starts import summary as per_start_summary

__all__ = [
    "DEFAULT_ITERATIONS",
    "DEFAULT_STARTS",
    "PER_START_FIGURE",
    "measure",
    "per_start",
    "per_start_summary",
    "unavailable_reason",
]


def unavailable_reason(device) -> str | None:
    """None if decode can run on device, else why not (launch.unavailable_reason: it starts vLLM)."""
    from b70bench.stack import launch

    return launch.unavailable_reason(device)


def measure(*args, **kwargs) -> list[dict]:
    from b70bench.decode.suite import measure as _measure

    return _measure(*args, **kwargs)
