"""`b70bench moe-down`: a thin front over b70bench.moe.suite.measure (and the tiling sweep)."""

from __future__ import annotations

from b70bench import device as devmod
from b70bench import options, records
from b70bench.fingerprint import fingerprint
from b70bench.moe import configs, shapes

COLUMNS = [
    "variant",
    "tp",
    "tokens",
    "experts_hit",
    "bytes",
    "time_us",
    "time_us_iqr",
    "gbps",
    "frac_copy",
    "max_diff",
    "mean_diff",
    "max_diff_ref",
    "mean_diff_ref",
    "ok",
    "work",
    "config",
    "skipped",
]


def run(args) -> int:
    from b70bench.moe import suite, tune

    dev = devmod.select(args.backend, args.device_index)
    dtype = shapes.parse_dtype(args.dtype)
    shape = shapes.MoeShape(args.hidden, args.intermediate, args.experts, args.topk, args.group)
    cpu = dev.backend == "cpu"
    tokens = args.tokens or ((1, 4) if cpu else shapes.TOKENS)
    tps = args.tp or ((4,) if cpu else shapes.TPS)
    repeat = args.repeat or (5 if cpu else 20)
    if args.tune:
        tilings = [tune.parse_tiling(t) for t in args.tilings] if args.tilings else None
        rows = tune.sweep(
            dev, shape, tps, tokens, dtype, graph=args.graph, repeat=repeat, seconds=args.tune_seconds, tilings=tilings
        )
        print(records.format_table(rows, tune.COLUMNS))
    else:
        rows = suite.measure(
            dev,
            args.variants,
            tokens=tokens,
            tps=tps,
            dtype=dtype,
            graph=args.graph,
            shape=shape,
            repeat=repeat,
            seed=args.seed,
            tuned=configs.load_tuned(args.tuned) if args.tuned else None,
        )
        anchor = rows[0]["copy_gbps"] if rows else None
        print(
            f"moe-down on {dev.name} ({dev.backend}), {args.dtype}, {'graph replay' if args.graph else 'eager'}, "
            f"copy anchor {anchor:.0f} GB/s"
            if anchor
            else ""
        )
        print(records.format_table(rows, COLUMNS))
    if args.json:
        records.write_json(args.json, rows, fingerprint=fingerprint(dev))
    return 1 if any(r.get("ok") is False for r in rows) else 0


def register(sub) -> None:
    p = sub.add_parser(
        "moe-down",
        help="u4 MoE down projection: variants, correctness, roofline",
        description="Time each u4 (AutoRound/GPTQ symmetric int4) MoE down-projection variant "
        "on MiniMax M2.x shapes, check it against a float64 reference and state its "
        "bandwidth as a fraction of the copy anchor measured in the same run.",
    )
    options.add_device_args(p)
    p.add_argument(
        "--variants", nargs="+", metavar="NAME", help="variants to run (default: all registered, plug-ins included)"
    )
    p.add_argument("--tokens", type=int, nargs="+", help="tokens per step (default 1 4 16 64 512; CPU: 1 4)")
    p.add_argument(
        "--tp", type=int, nargs="+", help="tensor-parallel degrees, K = intermediate/TP (default 1 4; CPU: 4)"
    )
    p.add_argument("--dtype", default="bf16", help="activation and scale dtype: bf16 (default) or fp16")
    p.add_argument("--graph", action="store_true", help="time CUDA/XPU graph replays (no host launch gaps)")
    p.add_argument("--hidden", type=int, default=3072, help="N, the model's hidden size (MiniMax M2.x: 3072)")
    p.add_argument("--intermediate", type=int, default=1536, help="MoE intermediate size before TP (1536)")
    p.add_argument("--experts", type=int, default=256, help="routed experts (256)")
    p.add_argument("--topk", type=int, default=8, help="experts per token (8)")
    p.add_argument("--group", type=int, default=128, help="scale group size along K (128)")
    p.add_argument("--repeat", type=int, default=None, help="timed samples per row (default 20; CPU 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, activations and routing")
    p.add_argument("--tune", action="store_true", help="sweep Triton tilings instead (fastest first per shape)")
    p.add_argument(
        "--tuned",
        metavar="FILE",
        help="triton-htile takes the fastest correct tiling per shape from this sweep JSON "
        "(default: the device's table in b70bench/moe/policies/, else the untuned default)",
    )
    p.add_argument(
        "--tilings",
        nargs="+",
        metavar="TILING",
        help="with --tune: sweep only these tilings, each a label, e.g. "
        "m1n32k512s1w4st1sum-packed-paired-pf-pdl-early (as the sweep prints them; flags in the order "
        f"{configs.flag_order()}; m2...+m1...: a mixed tiling, 2-pair "
        "blocks of an expert's pairs of pairs, the odd pairs with the 1-pair tiling), or by field "
        "name: block_m=1,block_n=32,packed=1,... or the JSON object a sweep row stores as its "
        "`tiling`; block_m 0 = from the routing",
    )
    p.add_argument("--tune-seconds", type=float, default=1e9, help="stop starting new tilings after this long")
    options.add_json_arg(p)
    p.set_defaults(func=run)
