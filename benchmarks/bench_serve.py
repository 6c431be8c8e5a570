"""vLLM's OpenAI server under closed-loop load per (commit, concurrency), in setup_cache.

Each server start is one sample (b70bench.serve: the environment's own patched vLLM as an owned child, the
gate through its API, every level). B70BENCH_SERVE_STARTS sets the starts (default STARTS),
B70BENCH_SERVE_CONCURRENCY the levels (space-separated, default 1 4 16), B70BENCH_SERVE_SLO the goodput
SLOs (default DEFAULT_SLO). E2E latency, TPOT and TTFT (seconds, lower is better) get b70bench's verdicts on
the website; E2E is the one to read at 1-4 requests on a small CPU, where the API server hands tokens out in
bursts and TPOT reads ~0 (docs/serve.md). Goodput and output tok/s are tracked for people to read. A start
whose gate failed gives no speed samples.

Walking commits (ASV_COMMIT, or B70BENCH_COMMIT from `b70bench revisions`): each level is measured against the
commit's git parent the way `b70bench compare --suite serve` measures with --placement auto (both servers alive
together, levels alternating, where two fit; else one at a time), in blocks of fresh servers until decided or
B70BENCH_SERVE_BUDGET_MIN (per level, default paired.stopping.DEFAULT_BUDGET_MIN) is spent,
B70BENCH_SERVE_ROUNDS rounds a block (default serve.pair.DEFAULT_ROUNDS). Each block is one sample: this commit's
median E2E (the plotted figure) and its B/A to the parent (track_ratio_to_parent, what the website's
verdict on E2E is read from), with the minutes and levels it took. B70BENCH_SERVE_PAIRED=0 (`make bench`)
measures separate starts instead, as above. B70BENCH_STACK names the stack file (docs/stacks.md), as for decode.
"""

import os

from b70bench import serve, sides, stats
from b70bench.errors import UsageError
from b70bench.paired import report, stopping
from b70bench.serve import cli as serve_cli
from b70bench.serve import pair as serve_pair
from b70bench.serve import suite as serve_suite
from b70bench.stack import model as decode_model

from .common import (
    _PairedFigures,
    against_base,
    budget_s_from_env,
    lost_if_failed,
    paired_walk,
    samples,
    ses_samples,
    setup_timeout_s,
    skip_if,
    stack_and_device,
    stack_param,
    value,
    walked_commit,
    whole_from_env,
)

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


def _budget_s() -> float:
    return budget_s_from_env("B70BENCH_SERVE_BUDGET_MIN", stopping.DEFAULT_BUDGET_MIN, stopping.MIN_BUDGET_MIN)


def _min_effect(stack) -> float:
    """The smallest change a level must decide: the walk's variable, else the stack's min_effect, else the default."""
    try:
        stated, _why = stopping.effect_from(stack.min_effect)
    except UsageError as err:
        raise NotImplementedError(str(err)) from None
    return stated if stated is not None else stats.DEFAULT_MIN_EFFECT


def _paired_level(concurrency: int, backend: str, stack) -> dict:
    """One level of this commit against its parent (sides.against_parent with serve's pairing), as the
    figures asv tracks: per block, this commit's median E2E and its B/A to the parent."""
    commit = walked_commit()
    res = against_base(
        commit,
        decode_model.cache_root() / "asv-paired-serve" / commit[:12] / f"c{concurrency}",
        serve_pair.compare_series,
        rule=stopping.Rule.walk(
            _budget_s(),
            whole_from_env("B70BENCH_SERVE_ROUNDS", serve_pair.DEFAULT_ROUNDS, 4, "paired rounds"),
            _min_effect(stack),
        ),
        concurrency=concurrency,
        cache_dir=sides.paired_cache_dir(),
        backend=backend,
        stack=stack,
    )
    lost_if_failed(res, f"serve c={concurrency}")
    if report.intended_here(commit):
        report.declare_intended(res)
    withheld = res["sides"]["B"]["gate"] == 1
    also = {} if withheld else res.get("also") or {}
    return {
        "e2e_s_median": [] if withheld else res["block_e2e_s"]["B"],
        "ratio_to_parent": [] if withheld else res["block_ratios"],
        "ratio_se_to_parent": [] if withheld else res["block_log_ses"],
        # TPOT and TTFT of the same blocks, each with its own B/A: three verdicts per level on the website.
        **{f"{key}_median": (also.get(key) or {}).get("block_b", []) for key in serve_pair.ALSO_DECIDED},
        **{f"{key}_ratio_to_parent": (also.get(key) or {}).get("block_ratios", []) for key in serve_pair.ALSO_DECIDED},
        **{
            f"{key}_ratio_se_to_parent": (also.get(key) or {}).get("block_log_ses", [])
            for key in serve_pair.ALSO_DECIDED
        },
        "minutes": res["minutes"],
        "levels": res["levels_per_side"],
        "placement": res.get("placement"),
        "stopped": res.get("stopped"),
        "min_effect": res.get("min_effect"),
    }


class Serve(_PairedFigures):
    param_names = ["concurrency", "stack"]
    params = [_concurrency(), [stack_param()]]
    timeout = 3600
    # 2: walking commits, one sample per paired block against the parent (samples per start before). 3: the stack
    # (name@backend) a parameter. 4: TPOT and TTFT paired too (track_tpot_ratio_to_parent, track_ttft_...).
    version = 4

    def setup_cache(self):
        stack, dev = stack_and_device()
        skip_if(serve.unavailable_reason(dev))
        levels = self.params[0]
        if not all(isinstance(c, int) for c in levels):
            raise NotImplementedError(str(levels[0]))
        if paired_walk(dev, "B70BENCH_SERVE_PAIRED"):
            return {c: _paired_level(c, dev.backend, stack) for c in levels}
        load = serve_suite.Load.from_shape(
            serve_suite.DEFAULT_SHAPE,
            concurrency=tuple(levels),
            slo=serve_cli.parse_slo(os.environ.get("B70BENCH_SERVE_SLO", DEFAULT_SLO)),
            startup_timeout_s=stack.start_timeout_s,
        )
        starts = serve_cli.measure(load, starts=_starts(), stack=stack, device=dev)
        kept = [s for s in starts if s.get("gate") != 1]
        out = {}
        for c in levels:
            done = [lv for s in kept for lv in s["levels"] if lv.get("concurrency") == c and lv.get("completed")]
            out[c] = {key: [lv[key] for lv in done if lv.get(key) is not None] for key in serve_cli.LEVEL_KEYS}
        out["startup_s"] = [x for s in starts for x in s["startup_s"][:1]]
        return out

    setup_cache.timeout = setup_timeout_s(lambda _st: _budget_s(), len(params[0]), _starts)

    def setup(self, cache, concurrency, stack=None):
        if concurrency not in cache:
            raise NotImplementedError(f"concurrency {concurrency} was not measured")

    def track_tpot_s(self, cache, concurrency, stack=None):
        """Median time per output token after the first, per start (vLLM's TPOT)."""
        return samples(cache[concurrency].get("tpot_s_median"))

    track_tpot_s.unit = "seconds"

    def track_e2e_s(self, cache, concurrency, stack=None):
        """Median request latency, first byte sent to last token received, per start (vLLM's E2EL)."""
        return samples(cache[concurrency]["e2e_s_median"])

    track_e2e_s.unit = "seconds"

    def track_ttft_s(self, cache, concurrency, stack=None):
        return samples(cache[concurrency].get("ttft_s_median"))

    track_ttft_s.unit = "seconds"

    def track_goodput_request_per_s(self, cache, concurrency, stack=None):
        """Requests per second that met B70BENCH_SERVE_SLO, per start."""
        return samples(cache[concurrency].get("goodput_request_per_s"))

    track_goodput_request_per_s.unit = "request/s"

    def track_output_tok_per_s(self, cache, concurrency, stack=None):
        return samples(cache[concurrency].get("output_tok_per_s"))

    track_output_tok_per_s.unit = "tok/s"

    def track_startup_s(self, cache, concurrency, stack=None):
        """Seconds from the server's launch to a healthy /health (the same for every level of a start)."""
        return samples(cache.get("startup_s"))

    track_startup_s.unit = "seconds"

    def track_tpot_ratio_to_parent(self, cache, concurrency, stack=None):
        """Walking commits: this level's median TPOT over the parent's, per block (the same blocks as E2E's)."""
        return samples(cache[concurrency].get("tpot_s_ratio_to_parent"))

    track_tpot_ratio_to_parent.unit = "ratio"

    def track_tpot_ratio_se_to_parent(self, cache, concurrency, stack=None):
        return ses_samples(cache[concurrency].get("tpot_s_ratio_se_to_parent"))

    track_tpot_ratio_se_to_parent.unit = "log ratio"

    def track_ttft_ratio_to_parent(self, cache, concurrency, stack=None):
        """Walking commits: this level's median TTFT over the parent's, per block (the same blocks as E2E's)."""
        return samples(cache[concurrency].get("ttft_s_ratio_to_parent"))

    track_ttft_ratio_to_parent.unit = "ratio"

    def track_ttft_ratio_se_to_parent(self, cache, concurrency, stack=None):
        return ses_samples(cache[concurrency].get("ttft_s_ratio_se_to_parent"))

    track_ttft_ratio_se_to_parent.unit = "log ratio"

    def track_levels(self, cache, concurrency, stack=None):
        """Paired levels per side that decided the verdict (track_calls in results before 2026-12-04)."""
        return value(cache[concurrency], "levels")

    track_levels.unit = "levels"
