"""`b70bench decode`: a thin front over b70bench.decode.measure."""

from __future__ import annotations

import sys
from pathlib import Path

from b70bench import device as devmod
from b70bench import options, pytorch_json, records
from b70bench.decode import canary, suite
from b70bench.decode import hooks as hooksmod
from b70bench.fingerprint import fingerprint
from b70bench.stack import description, gate, shapes

COLUMNS = [
    "shape",
    "run",
    "cold",
    "gate",
    "canary_gate",
    "s_per_output_token",
    "output_tok_per_s",
    "total_tok_per_s",
    "ttft_s",
    "itl_s_p50",
    "itl_s_p99",
    "kv_cache_tokens",
    "cache_state",
    "error",
]


def warm_summary(recs: list[dict]) -> list[dict]:
    """Per shape: the warm runs' s_per_output_token, min, max and spread (max/min - 1)."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in recs):
        vals = [
            r["s_per_output_token"]
            for r in recs
            if r["shape"] == shape and not r["cold"] and r.get("s_per_output_token") is not None
        ]
        if vals:
            out.append(
                {
                    "shape": shape,
                    "warm_runs": len(vals),
                    "s_per_output_token_min": min(vals),
                    "s_per_output_token_max": max(vals),
                    "spread_pct": 100 * (max(vals) / min(vals) - 1),
                    "output_tok_per_s_best": 1 / min(vals),
                }
            )
    return out


def _loud(rec: dict) -> None:
    msg = rec.get("gate_message")
    if rec.get("gate") == gate.FAIL:
        bar = "!" * 78
        print(f"{bar}\n!! {rec['shape']} run {rec['run']}: {msg}\n{bar}", file=sys.stderr, flush=True)
    elif msg and (rec.get("gate") is None or rec.get("canaries_skipped")):
        print(f"note: {msg}", file=sys.stderr, flush=True)


def _canary_lines(rec: dict) -> None:
    for c in rec.get("canaries") or []:
        state = {True: "pass", False: "FAIL", None: "recorded"}[c["passed"]]
        want = f" (expects {c['expected']!r})" if c["expected"] is not None else ""
        print(f"  canary [{state}] {c['prompt']!r} -> {c['text']!r}{want}", file=sys.stderr, flush=True)


def _progress(rec: dict) -> None:
    state = "ok" if rec["ok"] else f"FAILED: {rec['error']}"
    if rec["ok"] and rec.get("s_per_output_token_median") is not None:
        # One line a start with its figure: a run cut short (a lent machine taken back) still leaves each start's.
        state += f" {rec['s_per_output_token_median'] * 1e3:.4f} ms/token median"
        state += f", start {rec['start_s']:.1f} s" if rec.get("start_s") is not None else ""
    print(
        f"[decode] {rec['shape']} {'cold' if rec['cold'] else 'warm'} run {rec['run']}: {state} "
        f"(log {rec['log_path']})",
        file=sys.stderr,
        flush=True,
    )
    _canary_lines(rec)
    _loud(rec)


def accept(recs: list[dict], gate_file: Path | None) -> int:
    """Pin the hash of this run's passing-or-unpinned gate; refuse when runs disagree among themselves."""
    hashes = {r["token_sha256"] for r in recs if r.get("token_sha256")}
    if len(hashes) != 1:
        print(f"b70bench decode: not pinning: runs produced {len(hashes)} different token hashes", file=sys.stderr)
        return 1
    rec = next(r for r in recs if r.get("token_sha256"))
    key = suite.gate_key_for(rec)
    sha = hashes.pop()
    previous = gate.accept(key, sha, gate_file, note="accepted with b70bench decode --accept-gate")
    print(f"pinned {sha} for {gate.describe(key)}" + (f" (was {previous})" if previous and previous != sha else ""))
    return 0


def run(args) -> int:
    env = dict(kv.split("=", 1) for kv in args.env or [] if "=" in kv)
    canaries = (canary.load(args.canaries) if args.canaries else []) + [canary.parse(c) for c in args.canary or []]
    out_dir = args.out_dir
    if out_dir is None and args.json and args.json != "-":
        out_dir = str(Path(args.json).with_suffix("")) + "-logs"  # the logs stay next to the results
    stack = description.load(args.stack) if args.stack else description.from_env()
    dev = devmod.select(args.backend or stack.backend, args.device_index)
    stack.check_devices(dev.backend, dev.count)
    kw = suite.stack_kwargs(stack)
    # A flag given on the command line wins over the stack's value.
    for key in ("model", "tp", "dtype", "max_model_len", "memory_fraction", "tokenizer", "timeout"):
        if getattr(args, key) is not None:
            kw["timeout_s" if key == "timeout" else key] = getattr(args, key)
    kw["engine_args"] = {**kw["engine_args"], **shapes.parse_engine_args(args.engine_arg)}
    kw["gate_file"] = args.gate_file or kw["gate_file"]
    recs = suite.measure(
        args.shapes or list(stack.shapes or ()) or None,
        batch=args.batch,
        env=env,
        env_file=args.env_file,
        runs=args.runs,
        cold=not args.no_cold,
        iterations=args.iterations,
        canaries=canaries,
        hooks=[hooksmod.resolve(h) for h in args.hook or []],
        out_dir=out_dir,
        device=dev,
        fixed_layout=args.fixed_layout,
        on_record=_progress,
        **kw,
    )
    print(records.format_table(recs, COLUMNS))
    summary = warm_summary(recs)
    if summary:
        print()
        print(records.format_table(summary, list(summary[0])))
    for rec in recs:
        _loud(rec)
    if args.json:
        records.write_json(args.json, recs, fingerprint=fingerprint(dev), warm_summary=summary)
    if args.pytorch_json:
        pytorch_json.write(args.pytorch_json, pytorch_json.from_decode(recs))
    if args.accept_gate:
        return accept([r for r in recs if r["ok"]], kw["gate_file"])
    return 1 if any(not r["ok"] or r.get("gate") == gate.FAIL for r in recs) else 0


def register(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="end-to-end vLLM decode with a token-hash quality gate",
        description="Offline vLLM decode, one fresh process per run: tok/s, s per token, TTFT, "
        "inter-token latency, KV cache, compile-cache key and state, quality gate.",
    )
    options.add_device_args(p)
    p.add_argument(
        "--shapes",
        nargs="+",
        metavar="pPnN[bB]",
        help=f"prompt/output lengths (default {' '.join(suite.DEFAULT_SHAPES)})",
    )
    options.add_stack_arg(p)
    p.add_argument("--model", default=None, help="model path or name in place of the stack's")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tp", type=int, default=None, help="tensor parallel size (default: the stack's)")
    p.add_argument(
        "--dtype", default=None, help="vLLM dtype (default: the stack's; bfloat16 for the embedded model, else auto)"
    )
    p.add_argument("--max-model-len", type=int, default=None, help="default: the stack's, else 2048")
    p.add_argument(
        "--memory-fraction",
        type=float,
        default=None,
        help="gpu_memory_utilization (CPU: share of RAM for KV cache, default 0.2)",
    )
    p.add_argument("--env-file", default=None, help="KEY=VALUE lines for the vLLM process (the lab's env file)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="one more variable for the vLLM process")
    p.add_argument("--engine-arg", action="append", metavar="KEY=VALUE", help="extra LLM(...) argument (JSON value)")
    p.add_argument("--runs", type=int, default=3, help="warm runs per shape (default 3)")
    p.add_argument("--no-cold", action="store_true", help="skip the cold run; use the persistent compile cache")
    p.add_argument("--iterations", type=int, default=10, help="timed generate calls per run (fastest reported)")
    p.add_argument(
        "--hook",
        action="append",
        metavar="NAME",
        help=f"in-process patch for the run ({', '.join(hooksmod.KNOWN)} or module:function)",
    )
    p.add_argument(
        "--canary",
        action="append",
        metavar="PROMPT=>EXPECTED",
        help="text canary: greedy continuation of PROMPT must contain EXPECTED (fails the gate "
        "otherwise); PROMPT alone records the text. Needs a tokenizer (the embedded model has one)",
    )
    p.add_argument(
        "--canaries",
        default=None,
        metavar="FILE",
        help='canaries file: JSON [{"prompt", "expected", "max_tokens"}] or PROMPT=>EXPECTED lines',
    )
    p.add_argument("--tokenizer", default=None, help="tokenizer path for the canaries (default: the model's)")
    p.add_argument(
        "--fixed-layout",
        action="store_true",
        help="start vLLM with ASLR off and PYTHONHASHSEED=0 (same memory layout every start)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per run before it is killed (default: 1200, or the stack's start timeout if longer)",
    )
    p.add_argument("--out-dir", default=None, help="where vLLM logs go (default: next to --json, else ~/.cache)")
    p.add_argument(
        "--gate-file",
        default=None,
        help="pinned hashes (default: the stack's, gates.json beside its file; the embedded model's ship with it)",
    )
    p.add_argument(
        "--accept-gate",
        action="store_true",
        help="after reviewing the output, pin this run's token hash for its model/backend/vLLM",
    )
    options.add_json_arg(p)
    p.add_argument(
        "--pytorch-json",
        metavar="FILE",
        default=None,
        help="also write vLLM's benchmark-database records (as `vllm bench` with SAVE_TO_PYTORCH_BENCHMARK_FORMAT)",
    )
    p.set_defaults(func=run)
