"""Sides that differ by settings: the --a-env/--b-env, --a-unset/--b-unset, --a-engine-arg/--b-engine-arg and
--a-stack/--b-stack flags of `compare` and `revisions`, and how a walk hands them to the asv adapters (one JSON
variable)."""

from __future__ import annotations

import dataclasses
import json
import os

from b70bench.errors import UsageError
from b70bench.paired.blocks import SIDES, Settings
from b70bench.stack import description, shapes

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
        p.add_argument(
            f"--{s}-stack",
            default=None,
            metavar="FILE",
            help=f"a second stack file for side {side}: what it sets differently from --stack (env, engine_args, "
            f"memory_fraction, kv_cache_gib) becomes side {side}'s settings; its model and devices are --stack's",
        )


# What a side's stack may change: what reaches the processes as variables or engine arguments. The rest decides what
# is measured (model, devices, shapes) or its gate key, so a side that changed it would not be the same measurement.
SAME_IN_BOTH = ("backend", "devices", "model", "tokenizer", "tp", "dtype", "quantization", "max_model_len",
                "server_args")  # fmt: skip


def from_stack(base: description.Stack, other: description.Stack, flag: str) -> Settings:
    """What `other` sets differently from `base`, as one side's settings: variables it sets or changes, variables
    base sets that it does not (removed), engine arguments it adds or changes, its memory share as
    gpu_memory_utilization, its CPU KV cache as VLLM_CPU_KVCACHE_SPACE."""
    for name in SAME_IN_BOTH:
        if getattr(base, name) != getattr(other, name):
            raise UsageError(
                f"{flag} {other.source}: its {name} ({getattr(other, name)!r}) differs from the stack's "
                f"({getattr(base, name)!r}); a side may change variables and engine arguments only: compare the "
                f"two models or device sets as two runs"
            )
    env_a, env_b = base.process_env({}, "cpu"), other.process_env({}, "cpu")
    env = {k: v for k, v in env_b.items() if env_a.get(k) != v}
    unset = sorted((set(env_a) - set(env_b)) | (set(other.env_unset) - set(base.env_unset)))
    kept = sorted(set(base.env_unset) - set(other.env_unset) - set(env_b))
    if kept:
        raise UsageError(
            f"{flag} {other.source}: the stack unsets {kept[0]} and it does not; a side cannot restore a variable "
            f"the stack removes: give its value in {other.source}'s env table"
        )
    engine_args = {k: v for k, v in other.engine_args.items() if base.engine_args.get(k) != v}
    gone = sorted(set(base.engine_args) - set(other.engine_args))
    if gone:
        raise UsageError(
            f"{flag} {other.source}: the stack sets engine argument {gone[0]} and it does not; a side cannot drop "
            f"one: give its value in {other.source}'s engine_args"
        )
    if other.memory_fraction != base.memory_fraction:
        if other.memory_fraction is None:
            raise UsageError(f"{flag} {other.source}: set memory_fraction (the stack sets {base.memory_fraction})")
        engine_args["gpu_memory_utilization"] = other.memory_fraction
    return Settings(env, tuple(unset), engine_args)


def from_args(args, stack: description.Stack | None = None) -> dict[str, Settings]:
    """Each side's own environment variables and engine arguments, as the flags give them: a side's stack file
    first (against `stack`, the run's), then its own flags, which win."""
    out = {}
    for s in SIDES:
        low = s.lower()
        base = Settings()
        path = getattr(args, f"{low}_stack", None)
        if path:
            base = from_stack(stack or description.default(), description.load(path), f"--{low}-stack")
        env = dict(base.env)
        for item in getattr(args, f"{low}_env") or []:
            key, sep, value = item.partition("=")
            if not sep or not key.replace("_", "").isalnum():
                raise UsageError(f"--{low}-env {item!r}: write KEY=VALUE, e.g. --b-env VLLM_MY_FLAG=1")
            env[key] = value
        flagged = tuple(getattr(args, f"{low}_unset") or ())
        both = sorted(set(env) & set(flagged) - set(base.env))
        if both:
            raise UsageError(f"--{low}-env and --{low}-unset both name {both[0]}: keep one")
        for k in flagged:
            env.pop(k, None)
        unset = tuple(dict.fromkeys([k for k in base.unset if k not in env] + list(flagged)))
        engine_args = {**base.engine_args, **shapes.parse_engine_args(getattr(args, f"{low}_engine_arg"))}
        out[s] = Settings(env, unset, engine_args)
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


def placement_stack(stack: description.Stack, settings: dict[str, Settings]) -> description.Stack:
    """The stack `auto` placement judges: a side's larger memory share (from its stack or engine argument) is the one
    two processes must fit."""
    shares = [x.engine_args.get("gpu_memory_utilization") for x in settings.values()]
    shares = [float(v) for v in shares if isinstance(v, int | float)]
    if not shares:
        return stack
    return dataclasses.replace(stack, memory_fraction=max([stack.memory_fraction or 0.0, *shares]))
