"""Which suites exist and whether each can run on a device (used by `b70bench info`)."""

from __future__ import annotations

import importlib
import importlib.util

# suite name -> module that defines unavailable_reason(device) -> str | None
SUITES = {
    "copy": "b70bench.bandwidth",
    "allreduce": "b70bench.allreduce",
    "moe-down": "b70bench.moe",
    "decode": "b70bench.decode",
    "serve": "b70bench.serve",
    "cache-key": "b70bench.cachekey",
}


def installed() -> list[str]:
    """Suites whose module is part of this build."""
    return [name for name, mod in SUITES.items() if importlib.util.find_spec(mod) is not None]


def availability(device) -> dict[str, str | None]:
    """suite -> None if it can run on device, else the reason it cannot."""
    out = {}
    for name in installed():
        mod = importlib.import_module(SUITES[name])
        try:
            out[name] = mod.unavailable_reason(device)
        except Exception as err:  # a broken optional dependency must not hide the other suites
            out[name] = f"{type(err).__name__}: {err}"
    return out
