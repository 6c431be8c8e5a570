"""vLLM's OpenAI server under closed-loop load per (commit, concurrency), in setup_cache.

Each server start is one sample (b70bench.serve: the environment's own patched vLLM as an owned child, the
gate through its API, every level). B70BENCH_SERVE_STARTS sets the starts (default STARTS),
B70BENCH_SERVE_CONCURRENCY the levels (space-separated, default 1 4 16), B70BENCH_SERVE_SLO the goodput
SLOs (default DEFAULT_SLO). E2E latency, TPOT and TTFT (seconds, lower is better) get b70bench's verdicts on
the website; E2E is the one to read at 1-4 requests on a small CPU, where the API server hands tokens out in
bursts and TPOT reads ~0 (docs/serve.md). Goodput and output tok/s are tracked for people to read. A start
whose gate failed gives no speed samples.
"""

import math
import os

from b70bench import decode
from b70bench.serve import cli as serve_cli
from b70bench.serve import suite as serve_suite

from .common import select_device, skip_if

STARTS = 2
# Goodput SLOs on the CPU default: about 3x the tiny model's batch-1 TTFT and TPOT here.
DEFAULT_SLO = "ttft_ms=1000,tpot_ms=20"


def _concurrency():
    text = os.environ.get("B70BENCH_SERVE_CONCURRENCY")
    if not text:
        return list(serve_suite.DEFAULT_CONCURRENCY)
    try:
        values = [int(x) for x in text.split()]
    except ValueError:
        values = []
    return values if values and min(values) >= 1 else [f"B70BENCH_SERVE_CONCURRENCY={text!r}: whole numbers >= 1"]


def _starts() -> int:
    text = os.environ.get("B70BENCH_SERVE_STARTS", str(STARTS))
    if not text.isdigit() or int(text) < 1:
        raise NotImplementedError(f"B70BENCH_SERVE_STARTS={text!r}: set a whole number of starts >= 1")
    return int(text)


def _samples(values):
    return {"samples": values, "number": 1} if values else math.nan


class Serve:
    param_names = ["concurrency"]
    params = [_concurrency()]
    timeout = 3600
    version = 1

    def setup_cache(self):
        dev = select_device()
        skip_if(decode.unavailable_reason(dev))
        levels = self.params[0]
        if not all(isinstance(c, int) for c in levels):
            raise NotImplementedError(str(levels[0]))
        load = serve_suite.Load.from_shape(
            serve_suite.DEFAULT_SHAPE,
            concurrency=tuple(levels),
            slo=serve_cli.parse_slo(os.environ.get("B70BENCH_SERVE_SLO", DEFAULT_SLO)),
        )
        starts = serve_cli.measure(load, starts=_starts(), device=dev)
        kept = [s for s in starts if s.get("gate") != 1]
        out = {}
        for c in levels:
            done = [lv for s in kept for lv in s["levels"] if lv.get("concurrency") == c and lv.get("completed")]
            out[c] = {key: [lv[key] for lv in done if lv.get(key) is not None] for key in serve_cli.LEVEL_KEYS}
        out["startup_s"] = [x for s in starts for x in s["startup_s"][:1]]
        return out

    setup_cache.timeout = 3600

    def setup(self, cache, concurrency):
        if concurrency not in cache:
            raise NotImplementedError(f"concurrency {concurrency} was not measured")

    def track_tpot_s(self, cache, concurrency):
        """Median time per output token after the first, per start (vLLM's TPOT)."""
        return _samples(cache[concurrency]["tpot_s_median"])

    track_tpot_s.unit = "seconds"

    def track_e2e_s(self, cache, concurrency):
        """Median request latency, first byte sent to last token received, per start (vLLM's E2EL)."""
        return _samples(cache[concurrency]["e2e_s_median"])

    track_e2e_s.unit = "seconds"

    def track_ttft_s(self, cache, concurrency):
        return _samples(cache[concurrency]["ttft_s_median"])

    track_ttft_s.unit = "seconds"

    def track_goodput_request_per_s(self, cache, concurrency):
        """Requests per second that met B70BENCH_SERVE_SLO, per start."""
        return _samples(cache[concurrency]["goodput_request_per_s"])

    track_goodput_request_per_s.unit = "request/s"

    def track_output_tok_per_s(self, cache, concurrency):
        return _samples(cache[concurrency]["output_tok_per_s"])

    track_output_tok_per_s.unit = "tok/s"

    def track_startup_s(self, cache, concurrency):
        """Seconds from the server's launch to a healthy /health (the same for every level of a start)."""
        return _samples(cache["startup_s"])

    track_startup_s.unit = "seconds"
