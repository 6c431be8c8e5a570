"""End-to-end vLLM decode: one run per (commit, shape) in setup_cache, many tracked figures from it.

Seconds per output/total token drive regression detection (asv only knows lower-is-better);
output tok/s is tracked for people to read. On the CPU only p128n128 runs by default (a CI-sized
start of the embedded tiny MiniMax-M2); GPUs get the seeds' shapes. B70BENCH_DECODE_SHAPES
(space-separated, e.g. "p512n512 p512n1536") overrides; B70BENCH_DECODE_MODEL picks a model.
"""

import math
import os

from b70bench import cachekey, decode

from .common import select_device, skip_if

CPU_SHAPES = ["p128n128b1"]
GPU_SHAPES = ["p512n512b1", "p512n1536b1", "p512n2048b1"]


def _shapes():
    if os.environ.get("B70BENCH_DECODE_SHAPES"):
        return os.environ["B70BENCH_DECODE_SHAPES"].split()
    try:
        return CPU_SHAPES if select_device().backend == "cpu" else GPU_SHAPES
    except NotImplementedError:
        return CPU_SHAPES


def fastest_half(samples):
    """The faster half of a run's timed calls. Interference on a shared machine only adds time, so
    asv's median of these (about the run's 25th percentile) is stable where the plain median is not."""
    return sorted(samples)[: max(1, (len(samples) + 1) // 2)]


def _seconds(samples):
    return {"samples": fastest_half(samples), "number": 1} if samples else math.nan


def _figure(rec, key):
    value = rec.get(key)
    return math.nan if value is None else value


class Decode:
    """Warm run (persistent compile cache), iterations timed inside one vLLM start."""

    param_names = ["shape"]
    params = [_shapes()]
    timeout = 3600
    # 2: CPU runs use the in-process engine (decode.suite.CPU_ENGINE_ENV); 3: and preload tcmalloc and Intel
    # OpenMP (decode.suite.cpu_preload). Older figures are not comparable.
    version = 3

    def setup_cache(self):
        dev = select_device()
        skip_if(decode.unavailable_reason(dev))
        recs = decode.measure(self.params[0], model=os.environ.get("B70BENCH_DECODE_MODEL") or None, runs=1,
                              cold=False, iterations=10, device=dev)
        # The compile-cache key comes from the same start: one vLLM start per commit and shape.
        out = {}
        for r in recs:
            out[r["shape"]] = dict(r, cache_key=cachekey.from_decode_record(r))
            cachekey.save(out[r["shape"]]["cache_key"], r)
        return out

    setup_cache.timeout = 3600

    def setup(self, cache, shape):
        if shape not in cache:
            raise NotImplementedError(f"{shape} was not measured")

    def track_s_per_output_token(self, cache, shape):
        return _seconds(cache[shape]["samples_s_per_output_token"])

    track_s_per_output_token.unit = "seconds"

    def track_s_per_total_token(self, cache, shape):
        rec = cache[shape]
        tokens = rec["prompt_len"] + rec["output_len"]
        return _seconds([s * rec["output_len"] / tokens for s in rec["samples_s_per_output_token"]])

    track_s_per_total_token.unit = "seconds"

    def track_output_tok_per_s(self, cache, shape):
        return _figure(cache[shape], "output_tok_per_s")

    track_output_tok_per_s.unit = "tok/s"

    def track_kv_cache_tokens(self, cache, shape):
        return _figure(cache[shape], "kv_cache_tokens")

    track_kv_cache_tokens.unit = "tokens"

    def track_gate(self, cache, shape):
        """0 pass, 1 fail (also a failed run); NaN while no hash is pinned for this stack."""
        return _figure(cache[shape], "gate")

    track_gate.unit = "fail"

    def track_aot_key_differs_from_pin(self, cache, shape):
        """0: vLLM chose the pinned AOT graph for this machine and config; 1: another (an upward step)."""
        return _figure(cache[shape]["cache_key"], "aot_differs")

    track_aot_key_differs_from_pin.unit = "changed"

    def track_piecewise_key_differs_from_pin(self, cache, shape):
        """The same for the 10-hex piecewise key; NaN where vLLM writes none (the CPU)."""
        return _figure(cache[shape]["cache_key"], "piecewise_differs")

    track_piecewise_key_differs_from_pin.unit = "changed"
