"""End-to-end vLLM decode per (commit, shape) in setup_cache, many figures.

Walking commits (ASV_COMMIT, or B70BENCH_COMMIT from `b70bench revisions`): the commit is measured against its git
parent the way `b70bench compare` measures with --placement auto (both engines alive together, calls alternating,
where two fit; else one engine at a time), in blocks of fresh engines until decided or the budget is spent; the
calls a start, the budget and the smallest change to decide are decode.budget's (B70BENCH_DECODE_ROUNDS,
B70BENCH_DECODE_BUDGET_MIN and B70BENCH_MIN_EFFECT, else the stack's calibration, else its stated costs).
Each block is one sample: this commit's median seconds per output token (the plotted
figure) and its B/A against the parent (track_ratio_to_parent, what the website's verdict is read from), with the
minutes and calls it took. B70BENCH_DECODE_PAIRED=0 (the Makefile's `make bench`) measures separate starts instead,
as below.

Seconds per output/total token drive regression detection (asv only knows lower-is-better): their
samples are one figure per start (the fastest timed call of that start), so asv's interval and
b70bench's verdicts (b70bench.asv_plugin, at `asv publish`) see the spread between starts, which
on a shared host is several times the spread inside one. B70BENCH_DECODE_STARTS sets the number
of starts (default decode.DEFAULT_STARTS). Output tok/s is tracked for people to read. On the CPU
only p128n128 runs by default (a CI-sized start of the embedded tiny MiniMax-M2); GPUs get the
seeds' shapes; a stack's `shapes` win over both. B70BENCH_DECODE_SHAPES
(space-separated, e.g. "p512n512 p512n1536") overrides all. B70BENCH_STACK names the stack file (docs/stacks.md):
its model, TP, numerics, memory, environment and engine arguments reach every start, paired or not; a stack that
names a backend this environment lacks is skipped with that reason.
"""

import os

from b70bench import cachekey, decode, sides
from b70bench.decode import budget, pair
from b70bench.decode import suite as decode_suite
from b70bench.errors import UsageError
from b70bench.fingerprint import fingerprint
from b70bench.paired import report
from b70bench.stack import description, shapes
from b70bench.stack import model as decode_model

from .common import (
    _PairedFigures,
    against_base,
    design_result,
    lost_if_failed,
    paired_walk,
    samples,
    say,
    select_device,
    setup_timeout_s,
    skip_if,
    stack_and_device,
    stack_param,
    value,
    walked_commit,
    whole_from_env,
)


def _shapes():
    override = os.environ.get("B70BENCH_DECODE_SHAPES")
    try:
        stack = description.from_env()
    except UsageError:
        return shapes.walk_shapes(override, None, "cpu")
    if override or stack.shapes:  # named shapes: no device to ask
        return shapes.walk_shapes(override, stack.shapes, "cpu")
    try:
        backend = select_device().backend
    except NotImplementedError:
        backend = "cpu"
    return shapes.walk_shapes(None, None, backend)


def _starts() -> int:
    return whole_from_env("B70BENCH_DECODE_STARTS", decode.DEFAULT_STARTS, 1, "starts")


def _paired(dev) -> bool:
    return paired_walk(dev, "B70BENCH_DECODE_PAIRED")


def _walk(stack=None, backend: str = "cpu"):
    """The walk's calls a start, budget and effect for one shape (decode.budget: the variables, the stack's
    calibration, what it states by hand, the defaults)."""
    try:
        return budget.walk_budget(stack or description.from_env(), backend)
    except UsageError as err:
        raise NotImplementedError(str(err)) from None


def _paired_summary(shape: str, dev, stack) -> dict:
    """One shape of this commit against its parent (sides.against_parent) as the figures asv tracks."""
    commit = walked_commit()
    out_dir = decode_model.cache_root() / "asv-paired" / commit[:12] / shape
    res = design_result(commit, shape) or against_base(
        commit,
        out_dir,
        pair.compare_series,
        rule=_walk(stack, dev.backend).rule(),
        shape=shape,
        backend=dev.backend,
        cache_dir=sides.paired_cache_dir(),
        stack=stack,
    )
    lost_if_failed(res, f"decode {shape}")
    if report.intended_here(commit):
        report.declare_intended(res)
    b = res["sides"]["B"]
    per_block = res["block_s_per_output_token"]["B"]
    first = next(iter(res["block_records"]), {})
    prompt_len, output_len, _batch = shapes.parse_shape(shape)
    run = {
        "shape": shape,
        "model": stack.model_label(),
        "dtype": stack.vllm_dtype(),
        "tp": stack.tp,
        "max_model_len": stack.engine_spec(shape)["max_model_len"],
        "fingerprint": fingerprint(dev),
        "cache_dir": b["cache_dir"],
        "cache_keys": b["cache_keys_full"],
        "log_path": (first.get("starts") or {}).get("B", {}).get("log_path"),
    }
    withheld = b["gate"] == 1
    summary = {
        "shape": shape,
        "placement": res["placement"],
        "blocks": res["blocks"],
        "blocks_s_per_output_token": [] if withheld else per_block,
        "blocks_s_per_total_token": [] if withheld else [x * output_len / (prompt_len + output_len) for x in per_block],
        "output_tok_per_s": None if withheld or not per_block else 1.0 / res["median_b"],
        "kv_cache_tokens": b["kv_cache_tokens"],
        "gate": b["gate"],
        "ratio_to_parent": [] if withheld else res["block_ratios"],
        "ratio_se_to_parent": [] if withheld else res["block_log_ses"],
        "minutes": res["minutes"],
        "calls": res["calls_per_side"],
        "cache_key": cachekey.from_decode_record(run),
        # A design's results written before keys were compared carry none: read from the same sides' facts.
        "key_change": res.get("key_change") or cachekey.from_sides(res["sides"]),
        "stopped": res.get("stopped"),
        "min_effect": res.get("min_effect"),
    }
    say(f"{shape}: compile-cache key: {cachekey.change_line(summary['key_change'])}")
    cachekey.save({**summary["cache_key"], "key_change": summary["key_change"]}, run)
    return summary


def _per_sample(summary: dict, figure: str) -> list:
    """One value per paired block (a walk, blocks_<figure>) or per separate start (starts_<figure>)."""
    return summary[f"blocks_{figure}"] if "blocks" in summary else summary[f"starts_{figure}"]


class Decode(_PairedFigures):
    """Warm run (persistent compile cache), iterations timed inside one vLLM start."""

    param_names = ["shape", "stack"]
    params = [_shapes(), [stack_param()]]
    timeout = 3600
    # 2: CPU runs use the in-process engine (decode.environment.CPU_ENGINE_ENV); 3: and preload tcmalloc and Intel
    # OpenMP (decode.environment.cpu_preload); 4: one sample per start; 5: one sample per paired block.
    # 6: the stack (name@backend) a parameter. Older figures are not comparable.
    version = 6

    def setup_cache(self):
        stack, dev = stack_and_device()
        skip_if(decode.unavailable_reason(dev))
        if _paired(dev):
            return {shape: _paired_summary(shape, dev, stack) for shape in self.params[0]}
        recs = decode.measure(
            self.params[0],
            **decode_suite.stack_kwargs(stack),
            runs=_starts(),
            cold=False,
            iterations=decode.DEFAULT_ITERATIONS,
            device=dev,
        )
        # Gate and compile-cache key come from the same starts as the speed.
        out = {}
        for shape in dict.fromkeys(r["shape"] for r in recs):
            starts = [r for r in recs if r["shape"] == shape]
            summary = decode.per_start_summary(starts)
            summary["cache_key"] = cachekey.from_decode_record(starts[0])
            cachekey.save(summary["cache_key"], starts[0])
            out[shape] = summary
        return out

    setup_cache.timeout = setup_timeout_s(
        lambda st: _walk(st, st.backend or "cpu").budget_min * 60, len(params[0]), _starts
    )

    def setup(self, cache, shape, stack=None):
        if shape not in cache:
            raise NotImplementedError(f"{shape} was not measured")

    def track_s_per_output_token(self, cache, shape, stack=None):
        return samples(_per_sample(cache[shape], "s_per_output_token"))

    track_s_per_output_token.unit = "seconds"

    def track_s_per_total_token(self, cache, shape, stack=None):
        return samples(_per_sample(cache[shape], "s_per_total_token"))

    track_s_per_total_token.unit = "seconds"

    def track_calls(self, cache, shape, stack=None):
        """Timed calls per side that decided the verdict."""
        return value(cache[shape], "calls")

    track_calls.unit = "calls"

    def track_output_tok_per_s(self, cache, shape, stack=None):
        return value(cache[shape], "output_tok_per_s")

    track_output_tok_per_s.unit = "tok/s"

    def track_kv_cache_tokens(self, cache, shape, stack=None):
        return value(cache[shape], "kv_cache_tokens")

    track_kv_cache_tokens.unit = "tokens"

    def track_gate(self, cache, shape, stack=None):
        """0 pass, 1 fail (also a failed run: speed withheld), 2 tokens differ from the parent's as the walk was told
        they would (revisions --numerics-intended: speed read, marked); NaN while no hash is pinned for this stack."""
        return value(cache[shape], "gate")

    track_gate.unit = "fail"

    def track_aot_key_differs_from_parent(self, cache, shape, stack=None):
        """Walking commits: 1 where this commit's AOT graph key differs from its parent's, read from the same paired
        measurement's engines (each move named at its own commit), else 0; NaN where nothing was paired."""
        return value(cache[shape].get("key_change") or {}, "aot_differs_from_parent")

    track_aot_key_differs_from_parent.unit = "changed"

    def track_piecewise_key_differs_from_parent(self, cache, shape, stack=None):
        """The same for the 10-hex piecewise key; NaN where vLLM writes none (the CPU)."""
        return value(cache[shape].get("key_change") or {}, "piecewise_differs_from_parent")

    track_piecewise_key_differs_from_parent.unit = "changed"

    def track_aot_key_differs_from_known_good(self, cache, shape, stack=None):
        """0: vLLM chose the known-good AOT graph pinned for this machine and config (`b70bench cache-key pin`);
        1: another. Once the key has moved, every later commit reads 1: the parent figure names each move."""
        return value(cache[shape]["cache_key"], "aot_differs")

    track_aot_key_differs_from_known_good.unit = "changed"

    def track_piecewise_key_differs_from_known_good(self, cache, shape, stack=None):
        """The same for the 10-hex piecewise key; NaN where vLLM writes none (the CPU)."""
        return value(cache[shape]["cache_key"], "piecewise_differs")

    track_piecewise_key_differs_from_known_good.unit = "changed"
