"""Sides that differ by settings: the --a-env/--b-env, --a-unset/--b-unset and --a-engine-arg/--b-engine-arg flags
of `compare` and `revisions`, and how a walk hands them to the asv adapters (one JSON variable)."""

from __future__ import annotations

import json
import os

from b70bench.errors import UsageError
from b70bench.paired.blocks import SIDES, Settings
from b70bench.stack import shapes

ENV_VAR = "B70BENCH_SIDE_SETTINGS"  # a walk's settings per side, for the adapters in asv's processes


def add_flags(p) -> None:
    for s in "ab":
        side = s.upper()
        for flag, metavar, what in (
            ("env", "KEY=VALUE", f"a variable set in side {side}'s processes only (repeat): a flag A/B on a revision"),
            ("unset", "KEY", f"a variable removed from side {side}'s processes"),
            ("engine-arg", "KEY=VALUE", f"one more LLM(...) argument for side {side}, JSON value (serve: its flag)"),
        ):
            p.add_argument(f"--{s}-{flag}", action="append", metavar=metavar, help=what)


def from_args(args) -> dict[str, Settings]:
    """Each side's own environment variables and engine arguments, as the flags give them."""
    out = {}
    for s in SIDES:
        low = s.lower()
        env = {}
        for item in getattr(args, f"{low}_env") or []:
            key, sep, value = item.partition("=")
            if not sep or not key.replace("_", "").isalnum():
                raise UsageError(f"--{low}-env {item!r}: write KEY=VALUE, e.g. --b-env VLLM_MY_FLAG=1")
            env[key] = value
        unset = tuple(getattr(args, f"{low}_unset") or ())
        both = sorted(set(env) & set(unset))
        if both:
            raise UsageError(f"--{low}-env and --{low}-unset both name {both[0]}: keep one")
        out[s] = Settings(env, unset, shapes.parse_engine_args(getattr(args, f"{low}_engine_arg")))
    return out


def describe(settings: dict[str, Settings]) -> str:
    """What differs, in one phrase: "B: VLLM_X=1 against A: -"."""
    return f"B: {settings['B'].describe()} against A: {settings['A'].describe()}"


def to_env(settings: dict[str, Settings]) -> str | None:
    """The variable's value for a walk whose sides differ by settings; None where neither side has any."""
    if not any(settings.values()):
        return None
    return json.dumps({s: settings[s].to_json() for s in SIDES}, sort_keys=True)


def from_env() -> dict[str, Settings] | None:
    """The walk's settings per side (ENV_VAR), None where it sets none; a bad value is refused in one line."""
    text = os.environ.get(ENV_VAR)
    if not text:
        return None
    try:
        raw = json.loads(text)
        return {s: Settings(dict(raw[s]["env"]), tuple(raw[s]["unset"]), dict(raw[s]["engine_args"])) for s in SIDES}
    except (ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{ENV_VAR} is not what `b70bench revisions` writes ({err}): unset it") from None
