"""`b70bench`: one entry point, one subcommand per suite; a thin front over the library.

Each subcommand lives in its suite's module, which defines `register(subparsers)`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import signal
import sys

from b70bench import __version__
from b70bench.errors import UsageError

# Modules that define subcommands, in the order `--help` lists them.
SUBCOMMAND_MODULES = (
    "b70bench.info",
    "b70bench.bandwidth",
    "b70bench.allreduce",
    "b70bench.moe.cli",
    "b70bench.decode.cli",
    "b70bench.summarize",
    "b70bench.patches.cli",
    "b70bench.cachekey",
    "b70bench.revisions",
    "b70bench.serve.cli",
    "b70bench.compare",
    "b70bench.bisect",
    "b70bench.stack.cli",
    "b70bench.kernel_vs_model",
)


def add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=None,
        metavar="{xpu,cuda,cpu}",
        help="device backend (default: xpu, then cuda, then cpu; env B70BENCH_BACKEND)",
    )
    parser.add_argument(
        "--device-index", type=int, default=None, help="device index (default 0; env B70BENCH_DEVICE_INDEX)"
    )


def add_stack_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stack",
        metavar="FILE",
        default=None,
        help="the stack under test, a TOML file (docs/stacks.md; default: B70BENCH_STACK, else the embedded tiny "
        "MiniMax-M2 on the CPU's settings)",
    )


def add_json_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help="also write the records and the fingerprint to FILE ('-' for stdout only)",
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


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


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
    for name in SUBCOMMAND_MODULES:
        if _module_exists(name):
            importlib.import_module(name).register(sub)
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
