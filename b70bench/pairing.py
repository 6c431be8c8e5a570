"""A paired measurement of two sides as the commands ask for it (`compare`, `bisect`): the options past the two
sides and their checks, what they resolve to (Prepared), the plan, one decode or serve verdict, its printout.

The measurement itself is the paired package's; the targets are decode.pair, serve.pair and moe.pair.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from b70bench import cachekey, device, options, patches, sides, stats
from b70bench import side_settings as side_flags
from b70bench.decode import budget, pair
from b70bench.errors import UsageError
from b70bench.paired import placement as placements
from b70bench.paired import report, stopping
from b70bench.paired.blocks import SIDES, Settings, Side
from b70bench.serve import server
from b70bench.stack import calibration, description, launch, shapes

ROOT = Path(__file__).resolve().parent.parent


def format_result(res: dict, labels: dict) -> list[str]:
    ms = lambda v: f"{v * 1e3:.3f} ms" if v is not None else "-"  # noqa: E731
    interval = f"[{res['lo']:.3f}, {res['hi']:.3f}]" if res["lo"] is not None else "-"
    ratio = f"{res['ratio']:.3f}" if res["ratio"] is not None else "-"
    word = "levels" if "levels_per_side" in res else "calls"
    b_gate = res.get("sides", {}).get("B", {})
    text = f"B's speed withheld: {b_gate['gate_reason']}" if b_gate.get("gate") == 1 else res["text"]
    if b_gate.get("gate") == report.INTENDED:
        text += f"; B's {b_gate['gate_reason']}"
    timed = f"{res[word + '_per_side']} {word}"
    lines = [
        f"{'shape':11} {res.get('figure_label', 's/output token A'):>17} {'B':>10}  {'B/A':>6} {'interval':17} verdict",
        f"{res['shape']:11} {ms(res['median_a']):>17} {ms(res['median_b']):>10}  {ratio:>6} {interval:17} " + text,
        f"samples: {res['blocks']} blocks ({res.get('placement', 'together')}: {res.get('placement_reason', '-')}) "
        f"of fresh A+B "
        f"{'servers' if res.get('suite') == 'serve' else 'engines'}, {res.get('starts', '-')} starts, "
        f"{timed} a side, "
        f"{res['minutes']:.1f} min, {res['looks']} look(s) at {res['level']:.2%} each",
    ]
    for key, got in (res.get("also") or {}).items():  # serve: TPOT and TTFT from the same blocks
        lo_hi = f"[{got['lo']:.3f}, {got['hi']:.3f}]" if got["lo"] is not None else "-"
        b_a = f"{got['ratio']:.3f}" if got["ratio"] is not None else "-"
        lines.append(f"{key.removesuffix('_s').upper():>11} {'':>17} {'':>10}  {b_a:>6} {lo_hi:17} {got['text']}")
    if res.get("stack"):
        st = res["stack"]
        lines.append(
            f"stack: {st['name']} ({st.get('source') or 'built in'}, {st['hash']}): {st['model']}, tp{st['tp']}, "
            f"{st['dtype']}{', ' + st['quantization'] if st.get('quantization') else ''}; device {res.get('device')}"
        )
    for s in SIDES:
        f = res["sides"][s]
        g = {0: "pass", 1: "FAIL", report.INTENDED: "tokens differ", None: "unpinned"}[f["gate"]]
        g += f" ({f['gate_reason']})" if f.get("gate_reason") else ""
        g += "; tokens vary among its starts" if f.get("varies") else ""
        lines.append(f"side {s} ({labels[s]}): gate {g}; cache keys {' | '.join(f['cache_keys']) or '-'}")
    if res.get("key_change"):
        lines.append(f"compile-cache key, B against A: {cachekey.change_line(res['key_change'])}")
    if any(res["sides"][s]["gate"] is None for s in SIDES) and res.get("suite") != "moe-down":
        lines.append(
            "gate unpinned for this stack: review, then pin with `b70bench decode --stack FILE --shapes "
            "p16n16 --runs 1 --no-cold --accept-gate` (one pin per model, TP, dtype, quantization, backend, vLLM)"
        )
    return lines


def first_look_cost_s(args, stack: description.Stack, where: str, backend: str, spend=None) -> float | None:
    """Seconds the first look takes where they are known (decode): at the calibrated costs (spend: the Prepared
    budget.Budget), else at what the stack states by hand; else None."""
    if args.suite != "decode":
        return None
    if spend is not None and spend.forecast is not None:
        return spend.forecast.first_look_minutes * 60
    if not stack.start_s or stack.call_s is None:
        return None
    calls = args.rounds + pair.DEFAULT_WARMUP_CALLS
    return stopping.first_look_s(stack.start_s, stack.call_s, calls, stopping.DEFAULT_FIRST_BLOCKS, where, backend)


def check_budget(args, stack: description.Stack, where: str, backend: str, spend=None) -> None:
    """The budget unless named: decode's from decode.budget (spend), else stopping.default_budget_min; a named one
    that cannot reach the first look is refused before anything starts."""
    cost = first_look_cost_s(args, stack, where, backend, spend)
    if args.budget is None:
        args.budget = spend.budget_min if spend is not None else stopping.default_budget_min(cost)
    elif cost and args.budget * 60 < cost:
        blocks = stopping.first_look_blocks(stopping.DEFAULT_FIRST_BLOCKS, where)
        raise UsageError(
            f"--budget {args.budget:g} min does not reach a first look: {blocks} {where} blocks of {args.rounds} "
            f"rounds take ~{cost / 60:.0f} min at the stack's {'calibrated ' if spend and spend.costs else ''}"
            f"costs: pass --budget {math.ceil(cost / 60)} or more, or fewer --rounds"
        )


def spend_lines(spend) -> list[str]:
    """A decode measurement's calls a start, the change it decides, the calibration and the forecast (a plan's)."""
    if spend is None:
        return []
    return [
        f"  calls a start: {spend.rounds} ({spend.rounds_why})",
        f"  decides a {spend.min_effect:.1%} change ({spend.effect_why})",
        *(f"  {x.strip()}" for x in spend.calibration_lines),
        *spend.forecast_lines(),
    ]


def budget_text(args) -> str:
    starts = f" or {args.max_starts} counted starts, whichever comes first" if args.max_starts else ""
    return f"{args.budget:g} min{starts}"


def plan_lines(args, stack: description.Stack, dev, where: str, why: str, settings=None, spend=None) -> list[str]:
    """What a compare would run, without building a side or starting a process: the stack, the device, the
    placement and why, each side's start and the environment it gets beyond this shell's, the budget."""
    backend = dev.backend
    lines = [
        f"plan: b70bench compare --suite {args.suite} {args.a} {args.b}",
        f"  {stack.describe()} (hash {stack.hash()})",
        f"  device: {backend}, {dev.count} visible ({dev.name})",
        f"  placement: {where} ({why})",
    ]
    if args.suite == "serve":  # what a start and a call of this stack cost here (decode's: spend_lines, below)
        lines += [f"  {line}" for line in calibration.describe_lines(*calibration.for_stack(stack))]
    if args.suite == "moe-down":
        lines.append(f"  each side: python -m b70bench.moe.live (kernel, tp {args.tp}, {args.tokens} tokens)")
    else:
        module = server.Server.module if args.suite == "serve" else pair.Engine.module
        spec = stack.engine_spec(args.shape)
        lines.append(
            f"  each side: python -m {module}: model {spec['model']}, tp {spec['tp']}, "
            f"dtype {spec['dtype'] or 'auto'}, max_model_len {spec['max_model_len']}, "
            f"memory share {spec['memory_fraction'] or 'default'}, "
            f"engine args {spec['engine_args'] or '-'}; start timeout {stack.start_timeout_s:g} s"
        )
        base = launch.run_env(stack, backend, paired=True)
        for s in SIDES:
            own = (settings or {}).get(s) or Settings()
            side = Side(s, Path(f"<out>/overlay-{s}"), sides.paired_cache_dir() / f"vllm-cache-{s}", own)
            env = sides.side_env(launch.start_env(base, side.cache_root, stack.embedded), side, backend)
            # What differs from this shell's environment (PYTHONPATH: the side's overlay, then this checkout).
            shown = {k: v for k, v in sorted(env.items()) if k != "PYTHONPATH" and os.environ.get(k) != v}
            lines.append(
                f"  side {s} environment (set by b70bench and the stack): "
                + " ".join(f"{k}={v}" for k, v in shown.items())
                + (f"; its own settings: {own.describe()}" if own else "")
            )
        if stack.env_unset:
            lines.append(f"  unset for every start: {' '.join(stack.env_unset)}")
    rounds = f"{args.rounds} timed {'levels' if args.suite == 'serve' else 'calls'}"
    warm = (
        "before the first block one uncounted start per side fills its compile cache; "
        if where == placements.ALTERNATE
        else ""
    )
    first = stopping.first_look_blocks(stopping.DEFAULT_FIRST_BLOCKS, where)
    cost = first_look_cost_s(args, stack, where, backend, spend)
    lines += spend_lines(spend)
    if cost:
        lines.append(f"  cost: the first look ~{cost / 60:.0f} min ({first} blocks; {2 * first} counted starts)")
    elif args.suite == "decode":
        lines.append("  cost: unknown (calibrate the stack, `b70bench calibrate`, for the plan to size the budget)")
    lines.append(
        f"  budget: {budget_text(args)}; a block is one counted start per side ({rounds} each); {warm}first look "
        f"after {first} blocks (each started while the budget is not spent, or fewer), then blocks double "
        f"while undecided, at most {stopping.MAX_LOOKS} looks"
    )
    return lines


@dataclass
class Prepared:
    """What every measurement of one command shares: the environment, stack, device, placement, sides' settings."""

    python: str
    env: patches.Env
    stack: description.Stack
    dev: object
    where: str
    why: str
    settings: dict
    spend: object | None = None  # decode: decode.budget.Budget (calls a start, budget, effect and their forecast)


def prepare(args) -> Prepared:
    """The checked options (defaults filled in args) and what they resolve to; bad input refused in one line before
    anything is built or started."""
    python = args.python = options.interpreter(args.python)
    prefix = Path(args.prefix) if args.prefix else patches.env_prefix(python)
    env = patches.Env(prefix, (args.site_dir,) if args.site_dir else None)
    if args.suite == "serve":
        from b70bench.serve import pair as serve_pair

        default_rounds = serve_pair.DEFAULT_ROUNDS
        if args.concurrency < 1:
            raise UsageError(
                f"--concurrency {args.concurrency}: give 1 or more (default {serve_pair.DEFAULT_CONCURRENCY})"
            )
    elif args.suite == "moe-down":
        from b70bench.moe import pair as moe_pair

        default_rounds = moe_pair.DEFAULT_ROUNDS
    else:
        default_rounds = pair.DEFAULT_ROUNDS
    if args.rounds is not None and args.rounds < 4:
        raise UsageError(
            f"--rounds {args.rounds} is too few: a block's median needs 4 or more (default {default_rounds})"
        )
    if args.budget is not None and args.budget < stopping.MIN_BUDGET_MIN:
        raise UsageError(
            f"--budget {args.budget:g} min is too small to decide anything: a verdict needs two blocks, each of two "
            f"starts and {args.rounds or default_rounds} paired rounds (about a minute on a 2-core CPU): pass --budget "
            f"{stopping.MIN_BUDGET_MIN:g} or more (default {stopping.DEFAULT_BUDGET_MIN:g})"
        )
    if not 0.5 <= args.level < 1:
        raise UsageError(f"--level {args.level} is outside [0.5, 1): pass e.g. 0.95")
    if args.min_effect is not None and not 0 < args.min_effect < 1:
        raise UsageError(f"--min-effect {args.min_effect} is outside (0, 1): pass e.g. 0.05 for 5%")
    stack = description.load(args.stack) if args.stack else description.from_env()
    # The stack's first shape unless one is named: a rig's stack says what its calls cost.
    args.shape = args.shape or (stack.shapes[0] if stack.shapes else pair.DEFAULT_SHAPE)
    shapes.parse_shape(args.shape)
    settings = side_settings(args, stack)
    if args.max_starts is not None and args.max_starts < 4:
        raise UsageError(
            f"--max-starts {args.max_starts}: a verdict needs two blocks of two counted starts: pass 4 or more"
        )
    dev = device.select(args.backend or stack.backend, None)
    backend = dev.backend
    stack.check_devices(backend, dev.count)
    judged = side_flags.placement_stack(stack, settings)
    where, why = placements.choose(args.placement, backend, None if args.suite == "moe-down" else judged)
    spend = None
    if args.suite == "decode":
        given = lambda value, flag: None if value is None else (value, flag)  # noqa: E731
        spend = budget.decide(
            stack,
            backend,
            level=args.level,
            first_blocks=stopping.DEFAULT_FIRST_BLOCKS,
            where=where,
            rounds=given(args.rounds, "--rounds"),
            budget_min=given(args.budget, "--budget"),
            min_effect=given(args.min_effect, "--min-effect"),
        )
        args.rounds, args.min_effect = spend.rounds, spend.min_effect
    else:
        args.rounds = default_rounds if args.rounds is None else args.rounds
        if args.min_effect is None:
            stated, _why = stopping.effect_from(stack.min_effect, {})
            args.min_effect = stated if stated is not None else stats.DEFAULT_MIN_EFFECT
    check_budget(args, stack, where, backend, spend)
    return Prepared(python, env, stack, dev, where, why, settings, spend)


def measure(args, pre: Prepared, a: str, b: str, out_dir: Path, say=True) -> tuple[dict, dict]:
    """One decode or serve verdict of B against A (commits or series directories) with the checked options:
    (the result, each side's label). say: print the header line and the blocks as they finish."""
    from b70bench.serve import pair as serve_pair

    command = getattr(args, "command", None) or "compare"
    with tempfile.TemporaryDirectory(prefix="b70bench-compare-") as tmp:
        dirs, labels = {}, {}
        for side, spec in zip(SIDES, (a, b), strict=True):
            dirs[side], labels[side] = sides.resolve_side(Path(args.repo).resolve(), spec, Path(tmp) / side / "patches")
        for s in SIDES:
            if pre.settings[s]:
                labels[s] += f" with {pre.settings[s].describe()}"
        if say:
            print(
                f"b70bench {command}: A = {labels['A']} (patch set {patches.load(dirs['A']).hash}), "
                f"B = {labels['B']} (patch set {patches.load(dirs['B']).hash}); {pre.stack.describe()}; on "
                f"{pre.dev.backend}, placement {pre.where} ({pre.why}), budget {budget_text(args)}; logs in {out_dir}",
                flush=True,
            )
        common = dict(
            shape=args.shape,
            python=pre.python,
            cache_dir=sides.paired_cache_dir(),
            backend=pre.dev.backend,
            placement=args.placement,
            stack=pre.stack,
            settings=pre.settings,
            out=(lambda line: print(line, flush=True)) if say else (lambda _line: None),
        )
        with patches.env_lock(pre.env, f"b70bench {command} (overlays read the installed vLLM)"):
            if args.suite == "serve":
                res = serve_pair.compare_series(
                    dirs, pre.env, out_dir, rule(args), concurrency=args.concurrency, **common
                )
            else:
                res = pair.compare_series(dirs, pre.env, out_dir, rule(args), **common)
    if getattr(args, "numerics_intended", False):
        report.declare_intended(res)
    return res, labels


def rule(args) -> stopping.Rule:
    """The stopping rule compare's and bisect's checked options ask for (every suite's)."""
    return stopping.Rule(
        rounds=args.rounds,
        budget_s=args.budget * 60,
        level=args.level,
        min_effect=args.min_effect,
        floor=args.floor,
        max_blocks=None if args.max_starts is None else args.max_starts // 2,
    )


def side_settings(args, stack: description.Stack) -> dict[str, Settings]:
    """Each side's own settings (b70bench.side_settings); moe-down's sides are kernels and take none."""
    out = side_flags.from_args(args, stack)
    if args.suite == "moe-down" and any(out.values()):
        raise UsageError(
            "--a-env, --b-unset, --b-engine-arg, --b-stack and the like set a vLLM side; moe-down sides are kernels"
        )
    return out


def serve_rounds() -> int:
    from b70bench.serve import pair as serve_pair

    return serve_pair.DEFAULT_ROUNDS


def add_measure_options(p, suites: tuple[str, ...]) -> None:
    """compare's options past its two sides, shared with bisect (whose verdicts are compare's)."""
    from b70bench.options import add_json_arg, add_stack_arg

    p.add_argument("--python", default=None, metavar="PATH", help="interpreter of the environment (default: this one)")
    p.add_argument(
        "--shape",
        default=None,
        metavar="pPnN[bB]",
        help=f"decode shape (default: the stack's first, else {pair.DEFAULT_SHAPE})",
    )
    side_flags.add_flags(p)
    p.add_argument(
        "--numerics-intended",
        action="store_true",
        help="B's numerics change on purpose (a kernel with other rounding, checked by your own canaries): where its "
        "tokens differ from A's, its speed is read and marked as such instead of withheld",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MIN",
        help="machine minutes at most; blocks double while undecided (default: room for the first look and one "
        f"doubling at the stack's start_s and call_s, at least {stopping.DEFAULT_BUDGET_MIN:g})",
    )
    p.add_argument(
        "--max-starts",
        type=int,
        default=None,
        metavar="N",
        help="counted starts at most (two a block; alternate adds one uncounted start a side first); with --budget, "
        "whichever comes first",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the stack, device, placement and why, each side's start and environment, the budget; run nothing",
    )
    add_stack_arg(p)
    p.add_argument(
        "--suite",
        choices=suites,
        default="decode",
        help="decode: offline calls (default); serve: each side's `vllm serve`, closed-loop levels; moe-down: A and "
        "B are kernels, `variant` or `variant@tiling-label`, each timed in a process of its own (no vLLM)",
    )
    if "moe-down" in suites:
        p.add_argument("--tp", type=int, default=4, help="moe-down: the shard's tensor-parallel size (default 4)")
        p.add_argument("--tokens", type=int, default=1, help="moe-down: tokens per call (default 1)")
    p.add_argument("--concurrency", type=int, default=16, help="serve: requests in flight per level (default 16)")
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"paired rounds per block (default {pair.DEFAULT_ROUNDS} for decode, {serve_rounds()} for serve)",
    )
    p.add_argument(
        "--level",
        type=float,
        default=stopping.DEFAULT_LEVEL,
        help=f"overall interval level (default {stopping.DEFAULT_LEVEL})",
    )
    p.add_argument(
        "--placement",
        choices=placements.PLACEMENTS,
        default=placements.AUTO,
        help="together: both sides' processes alive, calls alternating; alternate: one at a time, whole starts "
        "A B | B A | ..., each side's first start only fills its compile cache; auto (default): together on the "
        "CPU, alternate on a GPU or XPU",
    )
    p.add_argument(
        "--backend",
        choices=("cpu", "cuda", "xpu"),
        default=None,
        help="device the sides run on (default: B70BENCH_BACKEND, else xpu, then cuda, then cpu)",
    )
    p.add_argument(
        "--min-effect",
        type=float,
        default=None,
        help="the change you would act on: undecided, never 'no change', while the interval holds it (default: the "
        "stack's min_effect, else what its calibration names in the budget, else 0.05)",
    )
    p.add_argument(
        "--floor",
        type=float,
        default=stats.DEFAULT_FLOOR,
        help=f"smallest change named slower/faster even when the interval excludes 1 (default {stats.DEFAULT_FLOOR})",
    )
    p.add_argument("--repo", default=str(ROOT), help="repository whose commits carry patches/ (default: this checkout)")
    p.add_argument("--out-dir", default=None, help="vLLM logs and caches (default ~/.cache/b70bench/compare/STAMP)")
    p.add_argument("--site-dir", default=None, help=argparse.SUPPRESS)  # tests: a pip --target install
    p.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    add_json_arg(p)
