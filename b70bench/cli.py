"""`b70bench`: one entry point, one subcommand per suite; a thin front over the library.

Each subcommand lives in its suite's module (a front), which defines `register(subparsers)`; the options fronts
share are in options.py, so no front imports this module back.
"""

from __future__ import annotations

import argparse
import signal
import sys

from b70bench import (
    __version__,
    allreduce,
    bandwidth,
    bisect,
    cachekey,
    compare,
    info,
    kernel_vs_model,
    revisions,
    summarize,
)
from b70bench.decode import calibrate
from b70bench.decode import cli as decode_cli
from b70bench.errors import UsageError
from b70bench.moe import cli as moe_cli
from b70bench.patches import cli as patches_cli
from b70bench.serve import cli as serve_cli
from b70bench.stack import cli as stack_cli

# The fronts, in the order `--help` lists them: each module's `register(subparsers)` adds its subcommand.
FRONTS = (
    info,
    bandwidth,
    allreduce,
    moe_cli,
    decode_cli,
    summarize,
    patches_cli,
    cachekey,
    revisions,
    serve_cli,
    compare,
    bisect,
    stack_cli,
    calibrate,
    kernel_vs_model,
)


# (flag, top-level dest, argparse keywords): options every subcommand that measures takes.
GLOBAL_OPTIONS = (
    ("--backend", "global_backend", {}),
    ("--device-index", "global_device_index", {"type": int}),
    ("--json", "global_json", {}),
)


def _apply_global_options(args: argparse.Namespace) -> None:
    for flag, dest, _ in GLOBAL_OPTIONS:
        value = getattr(args, dest)
        delattr(args, dest)
        if value is None:
            continue
        own = flag.lstrip("-").replace("-", "_")
        if not hasattr(args, own):
            raise UsageError(f"{flag} does not apply to `b70bench {args.command}`: drop it")
        if getattr(args, own) is None:
            setattr(args, own, value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="b70bench", description="Communication, kernel and end-to-end decode benchmarks for LLM inference stacks."
    )
    parser.add_argument("--version", action="version", version=f"b70bench {__version__}")
    # The same device and output options as each subcommand's, accepted before it too
    # (`b70bench --backend cpu info`); the subcommand's own, when given, wins.
    for flag, dest, kw in GLOBAL_OPTIONS:
        parser.add_argument(flag, dest=dest, default=None, help=argparse.SUPPRESS, **kw)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for front in FRONTS:
        front.register(sub)
    return parser


def _terminate(signum, _frame):
    # Unwind like Ctrl-C, so the suites' finally blocks kill and reap their child process groups
    # (vLLM engines, allreduce ranks) instead of leaving them orphaned.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        _apply_global_options(args)
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"b70bench {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"b70bench {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
