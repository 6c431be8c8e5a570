"""The pinned key per machine and config, and the 0/1 figure against it."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from b70bench import state
from b70bench.errors import UsageError

PINS_ENV = "B70BENCH_CACHE_KEY_PINS"


def default_pins_path() -> Path:
    if os.environ.get(PINS_ENV):
        return Path(os.environ[PINS_ENV])
    return state.pins_path()


def pin_id(machine: str | None, config: str) -> str:
    return f"{machine or platform.node()}|{config}"


def read_pins(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        raise UsageError(
            f"pins file {path} is not JSON: fix or delete it (b70bench writes it atomically, so it was edited by hand)"
        ) from None
    return data.get("pins", {})


def write_pin(path: Path, ident: str, keys: dict, **extra) -> None:
    from b70bench.records import atomic_write_text

    pins = read_pins(path)
    pins[ident] = {**keys, **extra}
    atomic_write_text(path, json.dumps({"pins": pins}, indent=2, sort_keys=True) + "\n")


def differs(keys: dict, pinned: dict | None) -> dict[str, int | None]:
    """kind -> 1 if the key differs from the pinned one, 0 if equal, None if either is missing."""
    out = {}
    for kind in ("aot", "piecewise"):
        have, want = keys.get(kind), (pinned or {}).get(kind)
        out[kind] = None if have is None or want is None else int(have != want)
    return out
