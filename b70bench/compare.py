"""`b70bench compare A B`: two patch series measured against each other in blocks, a verdict.

A and B are commits of the project (their patches/ series) or series directories. Each side gets a
private patched copy of vLLM (patches.overlay), so the environment is never modified. The placement
(--placement: auto, together, alternate; paired.placement) decides whether both sides' processes live at
once, calls alternating, or one at a time in whole starts A B | B A | ...; blocks of fresh processes are
repeated until the verdict is decided or the budget is spent (paired.stopping). The verdict is one of
slower, faster, "no change beyond X%" (the interval rules out anything larger) or undecided (it still holds
a change of --min-effect), and says the placement, blocks, starts, calls and minutes it took. Beside it each
side's gate (token hash of fixed prompts) and compile-cache keys, from the same processes.

A thin front over b70bench.pairing (the options, their checks, the plan, one verdict); decode.pair, serve.pair
and moe.pair (--suite moe-down: A and B are kernels, not series) are the targets, the paired package the
measurement.
"""

from __future__ import annotations

import time
from pathlib import Path

from b70bench import children, pairing, records
from b70bench.errors import UsageError
from b70bench.stack import model as decode_model


def run(args) -> int:
    if not (args.a and args.b):
        raise UsageError("name two sides (commits or series directories)")
    pre = pairing.prepare(args)
    stack, backend, where, why, python = pre.stack, pre.dev.backend, pre.where, pre.why, pre.python
    if args.plan:
        print("\n".join(pairing.plan_lines(args, stack, pre.dev, where, why, pre.settings, pre.spend)))
        return 0
    out_dir = (
        Path(args.out_dir) if args.out_dir else decode_model.cache_root() / "compare" / time.strftime("%Y%m%dT%H%M%S")
    )
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so every engine is stopped and reaped on the way out.
    children.unwind_on_sigterm()
    if args.suite == "moe-down":  # two kernels, not two series: nothing of vLLM is read or patched
        from b70bench.moe import pair as moe_pair

        labels = {"A": args.a, "B": args.b}
        print(
            f"b70bench compare --suite moe-down: A = {args.a}, B = {args.b} (tp {args.tp}, {args.tokens} tokens); "
            f"on {backend}, placement {where} ({why}), budget {args.budget:g} min; logs in {out_dir}",
            flush=True,
        )
        res = moe_pair.compare_kernels(
            labels,
            out_dir,
            pairing.rule(args),
            backend=backend,
            tp=args.tp,
            tokens=args.tokens,
            placement=args.placement,
            python=python,
            out=lambda line: print(line, flush=True),
        )
        return _report(res, labels, args)
    res, labels = pairing.measure(args, pre, args.a, args.b, out_dir)
    return _report(res, labels, args)


def _report(res: dict, labels: dict, args) -> int:
    res["labels"] = labels
    if res["blocks"] == 0 and res["blocks_failed"]:
        # Nothing was measured because an engine would not run: that is the series or the settings, not the host.
        raise UsageError(f"no block completed ({res['reason']}): fix that side's series or engine settings")
    if args.json:
        records.emit_json(args.json, res)
    print()
    print("\n".join(pairing.format_result(res, labels)))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="two patch series measured against each other in blocks: ratio, verdict",
        description="Start a vLLM engine for each side (its own patched copy of vLLM; the environment is "
        "not modified), both alive with timed calls alternating (together) or one at a time (alternate), and "
        "repeat in blocks of fresh engines until the verdict is decided or the budget is spent. Verdicts: slower, "
        "faster, no change beyond X%, undecided.",
    )
    p.add_argument("a", nargs="?", help="side A: a commit (its patches/ series) or a series directory")
    p.add_argument("b", nargs="?", help="side B: the same")
    pairing.add_measure_options(p, ("decode", "serve", "moe-down"))
    p.set_defaults(func=run)
