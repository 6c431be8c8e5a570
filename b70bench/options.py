"""Options shared by the subcommands (the fronts): each front adds the ones it takes; cli.py applies the ones also
accepted before the subcommand. A module of its own so that no front imports the entry point back."""

from __future__ import annotations

import argparse


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


def interpreter(path: str | None) -> str:
    """--python as given (relative to where the command was typed, as people type it) made absolute, since the
    walk runs asv and the benchmarks from other directories; sys.executable when not given. Not resolved: a virtual
    environment's python is a link whose target is another environment's. A path that is no interpreter is a
    UsageError naming the fix."""
    import os
    import sys

    from b70bench.errors import UsageError

    if not path:
        return sys.executable
    full = os.path.abspath(os.path.expanduser(path))
    if not (os.path.isfile(full) and os.access(full, os.X_OK)):
        raise UsageError(
            f"--python {path}: no interpreter at {full}; give the environment's python, e.g. --python .venv/bin/python"
        )
    return full
